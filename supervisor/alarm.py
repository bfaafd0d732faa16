"""A session's alarm clock: a child task that wakes the actor once its next deadline passes,
so the actor's own waits need no cancel scope.

The actor's deadlines (the grace window of a cancel, the start timeout, a steer's answer, an
exit that should come, the stall watchdog) were the deadline of its inbox receive: a
``move_on_at`` per wait. That scope is ~300 bytecodes to enter and leave, and a cancel paid it
twice on its own path (leaving the watchdog's wait it woke from, then the grace window's wait
for the agent's answer). The alarm sleeps for the actor instead:

- the actor says when it next must act (:meth:`Alarm.set`, any number of times, no await);
- moving that later costs nothing: the alarm wakes at its old time, finds nothing due, and
  sleeps on; moving it earlier wakes the alarm only if it would otherwise sleep past it;
- the alarm never sleeps longer than :data:`HEARTBEAT_S` while a deadline is set, so a
  deadline further away than that (a cancel's 3 s grace) never needs it woken: a cancel's
  path arms nothing;
- when a deadline passes, the alarm marks itself :attr:`~Alarm.rang` and wakes the actor
  (``wake``), which looks at its deadlines the next time round its loop. A spurious look is
  harmless: every deadline handler checks the clock itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

__all__ = ["HEARTBEAT_S", "Alarm"]

#: The longest the alarm sleeps while a deadline is set: it wakes this often during a turn
#: (the stall watchdog's deadline is set then), one cancel scope a second, instead of one a
#: wait; and a new deadline at least this far away is met without waking it.
HEARTBEAT_S = 1.0


class Alarm:
    """One actor's alarm: :meth:`set` from the actor, :meth:`run` as a child task."""

    __slots__ = ("_due", "_lot", "_looks_at", "_wake", "rang")

    def __init__(self, wake: Callable[[], object]) -> None:
        self._wake = wake
        self._due = math.inf  # when the actor must next act
        self._looks_at = math.inf  # when the alarm task next looks at the clock (inf: never)
        self._lot = trio.lowlevel.ParkingLot()
        #: a deadline passed since the actor last looked (the actor clears it)
        self.rang = False

    def set(self, deadline: float) -> None:
        """Ring once ``deadline`` (trio time) has passed; ``inf``: never. Replaces the last."""
        self._due = deadline
        if deadline < self._looks_at:
            self._lot.unpark_all()  # it would sleep past it (or sleeps for good): look again

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            if self._due <= now:
                self._due = math.inf
                self.rang = True
                self._wake()
            if self._due == math.inf:
                self._looks_at = math.inf
                await self._lot.park()
                continue
            self._looks_at = min(self._due, now + HEARTBEAT_S)
            with trio.move_on_at(self._looks_at):
                await self._lot.park()
