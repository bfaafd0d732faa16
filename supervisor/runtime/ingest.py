"""How much agent output the whole supervisor handles per pass of trio's run loop, and who goes
first: what keeps a stop instant while other sessions flood.

Every step of a cancel (the caller's call reaching the actor, the agent's answer reaching its
reader, the reader's post reaching the actor, the receipt reaching the caller) waits for one
pass of trio's run loop, and a pass runs one step of *every* runnable task. Left alone, K
flooding sessions make every pass K times longer (measured: ~9 ms a pass at K = 300, a cancel
spanning 7 of them), so the quiet session's stop pays for everybody's flood. This module bounds
the pass instead: the actors of all sessions share one :class:`IngestGate`, an allowance of
``per_pass`` work units (a line of agent output is one, plus one per 8 KiB) made whole again
at the start of every pass. A session that finds it spent parks (and costs nothing) until the
gate grants it a share; its inbox fills, its reader stops reading, and its agent blocks on a
full pipe: the flood is pushed back onto the agents, not queued in the supervisor.

Who goes first: sessions that want little (an answer, a few deltas: ``light``) before those
draining a backlog (``heavy``), each queue first-come first-served, heavy ones served ``quantum``
units at a time (round robin). Work that must never wait (a session that is being cancelled,
starting, or stopping: "a cancel waits for no one") does not ask: it is charged, and runs.

The per-pass bound is what the fairness benchmark (``bench/fairness.py``) shows: the interrupt
and the receipt take the same few passes whatever K is, and each pass stays around a
millisecond. Throughput is not what is bounded: one flooding session alone gets the whole
allowance every pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import outcome
import trio

__all__ = ["IngestGate", "Unlimited", "cost_of"]

#: Work units per pass for all sessions together. A unit is one agent line through decoding,
#: the protocol machine and the fan-out: 5-10 us here, so a pass stays near 1-2 ms.
PER_PASS = 64
#: The share a heavy session gets per grant: a few sessions each pass, every one in turn.
QUANTUM = 16
#: A session wanting at most this much is light: it goes before the heavy ones.
LIGHT = 8
#: A line costs one unit, plus one per this many bytes (a 1 MB tool result is not one delta).
BYTES_PER_UNIT = 8192


def cost_of(size: int) -> int:
    """Work units for a line of ``size`` bytes."""
    return 1 + size // BYTES_PER_UNIT


class _Ticket:
    """One parked session waiting for a grant."""

    __slots__ = ("done", "task", "want")

    def __init__(self, task: trio.lowlevel.Task, want: int) -> None:
        self.task = task
        self.want = want
        self.done = False


class IngestGate:
    """The allowance shared by the sessions of one supervisor; :meth:`run` keeps it (a task
    for as long as the sessions run)."""

    def __init__(self, per_pass: int = PER_PASS, quantum: int = QUANTUM) -> None:
        self.per_pass = per_pass
        self.quantum = quantum
        self._allowance = per_pass
        self._light: deque[_Ticket] = deque()
        self._heavy: deque[_Ticket] = deque()
        self._parked: dict[trio.lowlevel.Task, _Ticket] = {}
        self._refill = trio.lowlevel.ParkingLot()  # the pass-keeping task, while nobody waits
        #: passes in which the gate refilled with sessions waiting (a diagnostic)
        self.refills = 0

    def take(self, want: int) -> int:
        """Units the caller may spend now, without waiting (0: wait with :meth:`acquire`)."""
        if self._allowance <= 0 or want <= 0:
            return 0
        granted = min(want, self._allowance)
        self._allowance -= granted
        return granted

    def charge(self, units: int) -> None:
        """Work that may not wait was done: it counts against this pass all the same."""
        self._allowance -= units

    async def acquire(self, want: int) -> int:
        """Park until granted; returns the units granted (0 if :meth:`wake` came first)."""
        task = trio.lowlevel.current_task()
        ticket = _Ticket(task, want)
        (self._light if want <= LIGHT else self._heavy).append(ticket)
        self._parked[task] = ticket
        self._refill.unpark()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            ticket.done = True
            self._parked.pop(task, None)
            return trio.lowlevel.Abort.SUCCEEDED

        granted: int = await trio.lowlevel.wait_task_rescheduled(abort)
        return granted

    def wake(self, task: trio.lowlevel.Task) -> None:
        """A parked session has a call to serve: reschedule it now, with nothing granted
        (a no-op for a task that is not parked here)."""
        ticket = self._parked.pop(task, None)
        if ticket is not None and not ticket.done:
            ticket.done = True
            trio.lowlevel.reschedule(task, outcome.Value(0))

    async def run(self) -> None:
        """The refill, for as long as this runs: at the start of every pass of the run loop
        (an instrument's ``after_io_wait``, before the pass takes its runnable tasks) the
        allowance is whole again and shared out among those waiting, so a session granted runs
        in that same pass. This task only keeps the loop from sleeping while sessions wait (a
        checkpoint a pass). A refill *task* that granted in its own step had the session run a
        pass later, and a lone flooding session got its grant and the rest of the allowance in
        alternate passes: ~31 lines a pass, not 64."""
        refill = _Refill(self)
        trio.lowlevel.add_instrument(refill)
        try:
            while True:
                if self._light or self._heavy:
                    await trio.lowlevel.checkpoint()  # one pass: they are granted before it
                else:
                    await self._refill.park()
        finally:
            trio.lowlevel.remove_instrument(refill)

    def _refill_now(self, timeout: float = 0.0) -> None:
        """A new pass: the whole allowance again, shared out among those waiting (the run
        loop's ``after_io_wait``; ``timeout`` is that of its wait)."""
        self._allowance = self.per_pass
        if self._light or self._heavy:
            self.refills += 1
            self._grant(self._light, lambda want: want)
            self._grant(self._heavy, lambda want: min(want, self.quantum))

    def _grant(self, queue: deque[_Ticket], share: Callable[[int], int]) -> None:
        while queue and self._allowance > 0:
            ticket = queue.popleft()
            if ticket.done:
                continue
            granted = min(share(ticket.want), self._allowance)
            self._allowance -= granted
            ticket.done = True
            self._parked.pop(ticket.task, None)
            trio.lowlevel.reschedule(ticket.task, outcome.Value(granted))


class _Refill(trio.abc.Instrument):
    """Calls the gate's refill between two passes of the run loop."""

    def __init__(self, gate: IngestGate) -> None:
        #: the hook is the gate's own method: one call a pass, not two
        self.after_io_wait = gate._refill_now  # type: ignore[method-assign]


class Unlimited(IngestGate):
    """No sharing: every session takes what it wants (a session outside any supervisor)."""

    def __init__(self) -> None:
        super().__init__(per_pass=1 << 62)

    def take(self, want: int) -> int:
        return want

    def charge(self, units: int) -> None:
        pass
