"""The actors' alarm clock: one task per supervisor that wakes each actor once its next
deadline passes, so the actors' own waits need no cancel scope.

An actor's deadlines (the grace window of a cancel, the start timeout, a steer's answer, an
exit that should come, the stall watchdog) were the deadline of its inbox receive: a
``move_on_at`` per wait. That scope is ~300 bytecodes to enter and leave, and a cancel paid it
twice on its own path (leaving the watchdog's wait it woke from, then the grace window's wait
for the agent's answer). The clock keeps every actor's next deadline instead:

- an actor says when it next must act (:meth:`Alarm.set`, any number of times, no await).
  Moving it later costs nothing: the clock wakes at the old time, finds it not due, and files
  it again at the new one; moving it earlier files one more entry (the old one is skipped);
- the clock never sleeps longer than :data:`HEARTBEAT_S` while any deadline is set, so a
  deadline further away than that (a cancel's 3 s grace) never wakes it: a cancel's path arms
  nothing;
- when a deadline passes, the actor's alarm is marked :attr:`~Alarm.rang` and the actor woken
  (``wake``); it looks at its deadlines the next time round its loop. A spurious look is
  harmless: every deadline handler checks the clock itself.

One clock for all the sessions of a supervisor, not a task each: with 10,000 sessions a task
each was 5 KB more per session and a third of the burst spent in the garbage collector (scale
bench), and while sessions stream it is one wake-up a second, not one per session.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from itertools import count

import trio

__all__ = ["HEARTBEAT_S", "Alarm", "AlarmClock"]

#: The longest the clock sleeps while a deadline is set: it wakes this often while any turn
#: runs (the stall watchdog's deadline is set then), and a deadline at least this far away is
#: met without waking it.
HEARTBEAT_S = 1.0


class Alarm:
    """One actor's alarm: :meth:`set` from the actor; its clock rings it."""

    __slots__ = ("_due", "_filed", "_wake", "clock", "rang")

    def __init__(self, clock: AlarmClock, wake: Callable[[], object]) -> None:
        self.clock = clock
        self._wake = wake
        self._due = math.inf  # when the actor must next act
        self._filed = math.inf  # the deadline of this alarm's live entry in the clock
        #: a deadline passed since the actor last looked (the actor clears it)
        self.rang = False

    def set(self, deadline: float) -> None:
        """Ring once ``deadline`` (trio time) has passed; ``inf``: never. Replaces the last."""
        self._due = deadline
        if deadline < self._filed:
            self._filed = deadline
            self.clock._file(self, deadline)

    def close(self) -> None:
        """Never ring again: the actor is done (what the clock still holds of this alarm is
        skipped when its time comes, and holds nothing of the actor)."""
        self._due = self._filed = math.inf
        self._wake = _nothing


def _nothing() -> None:
    pass


class AlarmClock:
    """The clock of many alarms: :meth:`alarm` for each actor, :meth:`run` as a task."""

    def __init__(self) -> None:
        self._entries: list[tuple[float, int, Alarm]] = []  # a heap
        self._order = count()  # ties in filing order (alarms do not compare)
        self._looks_at = math.inf  # when the task next looks at the clock (inf: never)
        self._lot = trio.lowlevel.ParkingLot()

    def alarm(self, wake: Callable[[], object]) -> Alarm:
        return Alarm(self, wake)

    def _file(self, alarm: Alarm, deadline: float) -> None:
        heapq.heappush(self._entries, (deadline, next(self._order), alarm))
        if deadline < self._looks_at:
            self._lot.unpark_all()  # it would sleep past it (or sleeps for good): look again

    def _ring_due(self, now: float) -> None:
        entries = self._entries
        while entries and entries[0][0] <= now:
            deadline, _, alarm = heapq.heappop(entries)
            if deadline != alarm._filed:
                continue  # replaced by an earlier one, already popped
            alarm._filed = math.inf
            if alarm._due <= now:
                alarm._due = math.inf
                alarm.rang = True
                alarm._wake()
            elif alarm._due != math.inf:
                alarm.set(alarm._due)  # moved later meanwhile: filed at the new time

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            self._ring_due(now)
            if not self._entries:
                self._looks_at = math.inf
                await self._lot.park()
                continue
            self._looks_at = min(self._entries[0][0], now + HEARTBEAT_S)
            with trio.move_on_at(self._looks_at):
                await self._lot.park()
