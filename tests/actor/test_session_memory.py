"""Tier 2: ``max_memory_mb`` (virtual time, in-memory agents; the tree's memory is sampled).

Above the limit the running turn is stopped through the normal ladder with ``reason:
"memory_limit"`` (receipt and ``turn.ended``), an ``error`` event says why, and the agent is
restarted with its session resumed (``session.recycled``); the next prompt works. With no turn
running the agent is restarted at once; one over it after every restart fails the session instead of looping. The
last test is a real process tree, sampled with psutil on the real clock.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import AbstractAsyncContextManager

import trio
import trio.testing

import helpers
from helpers import Recorder
from protocols import events as ev
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.runtime.session import MEMORY_SAMPLE_S
from supervisor.testing._acp import AcpBehaviour, AcpLauncher


def running(
    behaviour: AcpBehaviour, **changes: object
) -> AbstractAsyncContextManager[tuple[Session, AcpLauncher, Recorder]]:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=2.0)
    return helpers.running(AcpLauncher(behaviour), spec.with_options(**changes), catch_up=True)


async def test_over_the_limit_the_turn_stops_and_the_agent_restarts_resumed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(words=400, word_interval=0.1), max_memory_mb=500.0) as (
        session,
        launcher,
        rec,
    ):
        turn = await session.prompt("go")
        await rec.wait_kind("message.delta", turn_id=turn.id)
        await trio.sleep(MEMORY_SAMPLE_S * 2)
        assert rec.of_kind("turn.ended") == []  # 10 MB: well under the limit
        launcher.agents[0].memory_mb = 700.0
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.reason) == ("cancelled", "memory_limit")
        assert ended.receipt is not None and ended.receipt["reason"] == "memory_limit"
        [error] = [e for e in rec.of_kind("error") if isinstance(e, ev.ErrorEvent)]
        assert error.code == "memory_limit" and "700 MB" in error.message
        recycled = await rec.wait_kind("session.recycled")
        assert isinstance(recycled, ev.SessionRecycled) and "memory_limit" in recycled.reason
        assert error.seq < ended.seq < recycled.seq
        await session.wait_ready()
        assert len(launcher.agents) == 2
        assert launcher.resumes[1] == launcher.agents[0].session_id
        again = await session.prompt("words=2")
        done = await rec.wait_kind("turn.ended", turn_id=again.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        assert session.summary().recycles == 1


async def test_an_idle_agent_over_the_limit_is_restarted_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(words=2), max_memory_mb=100.0) as (session, launcher, rec):
        launcher.agents[0].memory_mb = 150.0
        await rec.wait_kind("session.recycled")
        await session.wait_ready()
        assert len(launcher.agents) == 2 and rec.of_kind("turn.ended") == []


async def test_without_a_limit_nothing_is_sampled(autojump_clock: trio.testing.MockClock) -> None:
    async with running(AcpBehaviour(words=2)) as (session, launcher, rec):
        launcher.agents[0].memory_mb = 10_000.0
        await trio.sleep(MEMORY_SAMPLE_S * 5)
        assert rec.of_kind("session.recycled") == [] and len(launcher.agents) == 1


GROWER = (
    "import sys, time\n"
    "blob = bytearray(int(sys.argv[1]) * 1024 * 1024)\n"  # resident once written
    "for i in range(0, len(blob), 4096): blob[i] = 1\n"
    "time.sleep(600)\n"
)


async def test_a_real_tree_over_the_limit_is_seen_and_restarted() -> None:
    """Real processes, the real clock: the demo agent with a child of its own holding 200 MB
    (started by the agent's command line, so in its tree), under a 100 MB limit: the tree is
    sampled (psutil) and the agent restarted, the session resumed; the next prompt works."""
    demo = AgentSpec.from_config("demo")
    hog = f"{sys.executable} -c {shlex.quote(GROWER)} 200"
    command = ["/bin/sh", "-c", f'{hog} & exec "$@"', "sh", *demo.command]
    spec = demo.with_options(name="demo", command=command, max_memory_mb=100.0)
    with trio.fail_after(60):
        async with open_supervisor(agents={"demo": spec}) as sup:
            session = await sup.start_session("demo", cwd=".")
            async with session.subscribe() as events:
                async for event in events:
                    if isinstance(event, ev.ErrorEvent) and event.code == "memory_limit":
                        assert "max_memory_mb 100" in event.message
                    if isinstance(event, ev.SessionRecycled):
                        assert "memory_limit" in event.reason
                        break
                await session.wait_ready()
                assert session.summary().recycles >= 1


async def test_an_agent_over_the_limit_after_every_restart_fails_the_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=2))
    launcher.memory_mb = 900.0  # every agent it starts holds this much
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"], max_memory_mb=100.0)
    async with helpers.running(launcher, spec, catch_up=True) as (session, _, rec):
        failed = await rec.wait_kind("session.state", state="failed")
        assert isinstance(failed, ev.SessionState) and failed.detail is not None
        assert "after 3 restarts in a row" in failed.detail
        assert len(rec.of_kind("session.recycled")) == 3 and len(launcher.agents) == 4
