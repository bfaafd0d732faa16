"""Test helpers: a session on one of the kit's in-memory launchers, recorded and checked."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import trio

from supervisor import AgentSpec, Session, open_supervisor
from supervisor.agents.containment import choose_blocking
from supervisor.store.backend import StoredSession
from supervisor.supervisor import AnySession
from supervisor.testing import FakeAgent, Recorder, open_test_supervisor, record
from supervisor.testing._memory import MemoryLauncher

L = TypeVar("L", bound=MemoryLauncher[Any, Any])

#: A killed turn's escalation: the grace ran out, the tree was killed, the agent started again
#: and its session resumed; ``KILLED_HARD`` when SIGTERM was not enough.
KILLED = ["interrupt", "grace_expired", "sigterm", "respawned", "resumed"]
KILLED_HARD = ["interrupt", "grace_expired", "sigterm", "sigkill", "respawned", "resumed"]


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
        async with record(session) as recorder:
            yield session, launcher, recorder
            if catch_up:
                await recorder.catch_up()
            recorder.check_invariants()
    assert launcher.violations == []


@asynccontextmanager
async def fake_session(
    fake: FakeAgent, *, catch_up: bool = False
) -> AsyncIterator[tuple[AnySession, Recorder]]:
    """A session of ``fake`` (the public kit's way), recorded from its start, checked as
    :func:`running` checks its sessions on the way out."""
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as recorder:
            yield session, recorder
            if catch_up:
                await recorder.catch_up()
            recorder.check_invariants()
    assert fake.violations == []


@asynccontextmanager
async def process_session(
    spec: AgentSpec, cwd: str, *, bound: float = 30.0
) -> AsyncIterator[tuple[Session, Recorder]]:
    """A session of ``spec`` on real processes (tier 3), recorded from its start, within
    ``bound`` seconds (a stuck test fails instead of hanging the suite). On the way out every
    event is in and the recorded events keep the invariants."""
    with trio.fail_after(bound):
        async with open_supervisor(agents={spec.name: spec}) as sup:
            session = await sup.start_session(spec.name, cwd=cwd)
            async with record(session) as recorder:
                yield session, recorder
                await recorder.catch_up()
                recorder.check_invariants()


async def run_turn(session: AnySession, text: str) -> None:
    """Prompt ``session`` and return once a turn has ended (subscribed before the prompt, so
    the end cannot be missed)."""
    async with session.subscribe() as events:
        await session.prompt(text)
        async for event in events:
            if event.kind == "turn.ended":
                break


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


def stored_row(
    id: str = "s1", *, created: float = 1.0, last_active: float = 2.0, state: str = "ready"
) -> StoredSession:
    """A session's row as a store keeps it, for tests that write rows to a backend."""
    return StoredSession(
        id=id,
        agent="claude",
        protocol="claude",
        host=None,
        cwd="/tmp",
        mcp_servers="[]",
        agent_session_id=None,
        created=created,
        last_active=last_active,
        state=state,
    )
