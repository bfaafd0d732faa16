"""Test helpers: record a session's events and check the invariants every test relies on."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import trio

from protocols import events as ev
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.agents.containment import choose_blocking
from supervisor.testing._memory import MemoryLauncher

L = TypeVar("L", bound=MemoryLauncher[Any, Any])


class Recorder:
    """Every event of a session, from seq 1, gathered by a background task."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.events: list[ev.Event] = []
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
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
        return await self.wait_for(
            lambda e: e.kind == kind and all(getattr(e, k) == v for k, v in fields.items()),
            count=count,
        )

    async def catch_up(self) -> None:
        """Wait until every event the session has emitted so far has been recorded."""
        target = self.session.last_seq
        await self.wait_for(lambda e: e.seq >= target)

    def of_kind(self, kind: str) -> list[ev.Event]:
        return [event for event in self.events if event.kind == kind]

    def check_invariants(self) -> None:
        """Contiguous seq from 1; exactly one turn.ended for every turn that was announced."""
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
async def running(
    launcher: L, spec: AgentSpec, *, catch_up: bool = False
) -> AsyncIterator[tuple[Session, L, Recorder]]:
    """A session of ``spec`` on an in-memory ``launcher`` (tier 2), recorded from its start.

    On the way out the recorded events must keep the invariants (all of them, with
    ``catch_up``; otherwise those recorded so far), and the fake must have seen no violation of
    its protocol.
    """
    async with open_supervisor(agents={spec.name: spec}, launcher=launcher) as sup:
        session = await sup.start_session(spec.name, cwd="/")
        recorder = Recorder(session)
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            yield session, launcher, recorder
            if catch_up:
                await recorder.catch_up()
            recorder.check_invariants()
            nursery.cancel_scope.cancel()
    assert launcher.violations == []


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``; in strict mode (``AGENT_SUPERVISOR_STRICT_SKIPS=1``, CI) fail."""
    if os.environ.get("AGENT_SUPERVISOR_STRICT_SKIPS") == "1":
        pytest.fail(f"{reason}; AGENT_SUPERVISOR_STRICT_SKIPS=1, so this fails instead")
    pytest.skip(reason)


def require_cgroups() -> None:
    """Skip (or fail, in strict mode) where agents cannot get a cgroup of their own."""
    found = choose_blocking("auto")
    if found.kind != "cgroup":
        skip_or_fail(f"no cgroup containment here: {found.detail}")
