"""``Recorder``: every event of a session, kept for a test to wait on and look through."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from protocols import events as ev
from supervisor.supervisor import AnySession

__all__ = ["Recorder", "record"]


class Recorder:
    """Every event of a session, from seq 1, gathered by a background task (:meth:`run`).

    :func:`record` runs one for the length of a block; a test that has a nursery of its own
    can ``await nursery.start(recorder.run)``.
    """

    def __init__(self, session: AnySession) -> None:
        self.session = session
        #: the events so far, in order
        self.events: list[ev.Event] = []
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Record until cancelled; started once the subscription is open."""
        async with self.session.subscribe(since_seq=0) as subscription:
            task_status.started()
            async for event in subscription:
                self.events.append(event)
                self._changed.set()
                self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[ev.Event], bool], *, count: int = 1) -> ev.Event:
        """The ``count``-th event matching ``predicate`` (waits for it)."""
        while True:
            matches = [event for event in self.events if predicate(event)]
            if len(matches) >= count:
                return matches[count - 1]
            await self._changed.wait()

    async def wait_kind(self, kind: str, *, count: int = 1, **fields: object) -> ev.Event:
        """The ``count``-th event of ``kind`` (``"turn.ended"``) whose attributes equal
        ``fields`` (``turn_id=turn.id``); waits for it."""
        return await self.wait_for(
            lambda e: e.kind == kind and all(getattr(e, k) == v for k, v in fields.items()),
            count=count,
        )

    async def catch_up(self) -> None:
        """Wait until every event the session has emitted so far has been recorded."""
        target = self.session.last_seq
        await self.wait_for(lambda e: e.seq >= target)

    def of_kind(self, kind: str) -> list[ev.Event]:
        """The events of ``kind`` so far."""
        return [event for event in self.events if event.kind == kind]

    def check_invariants(self) -> None:
        """Assert what every session's events keep: seq contiguous from 1, and exactly one
        ``turn.ended`` for every turn (one for each ``turn.started``, too)."""
        seqs = [event.seq for event in self.events]
        assert seqs == list(range(1, len(seqs) + 1)), f"seq not contiguous: {seqs}"
        ended: dict[str, int] = {}
        for event in self.events:
            if isinstance(event, ev.TurnEnded):
                ended[event.turn_id] = ended.get(event.turn_id, 0) + 1
        assert all(n == 1 for n in ended.values()), f"turn.ended counts: {ended}"
        for event in self.events:
            if isinstance(event, ev.TurnStarted):
                assert ended.get(event.turn_id) == 1, f"turn {event.turn_id} never ended"


@asynccontextmanager
async def record(session: AnySession) -> AsyncIterator[Recorder]:
    """A :class:`Recorder` of ``session`` for the length of the block (from its first event,
    as far as the session's history reaches)."""
    recorder = Recorder(session)
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        yield recorder
        nursery.cancel_scope.cancel()
