"""Tier 2: session modes (virtual time, an in-memory ACP agent).

An ACP agent that offers modes in ``session/new`` has them on ``Session.modes``;
``Session.set_mode`` sends ``session/set_mode`` and returns once the agent answered; an unknown
mode, an agent without modes, a refusal and an agent that dies before it answers each fail the
call, saying why, and the session goes on.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
import trio
import trio.testing

import helpers
from helpers import Recorder
from protocols import events as ev
from supervisor import AgentSpec, Session
from supervisor.errors import AgentNotRunning, BadRequest
from supervisor.testing._acp import AcpBehaviour, AcpLauncher


def running(
    behaviour: AcpBehaviour,
) -> AbstractAsyncContextManager[tuple[Session, AcpLauncher, Recorder]]:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    return helpers.running(AcpLauncher(behaviour), spec, catch_up=True)


def mode_updates(rec: Recorder) -> list[str]:
    return [
        e.data["currentModeId"]
        for e in rec.of_kind("session.info")
        if isinstance(e, ev.SessionInfo) and e.info_kind == "current_mode_update"
    ]


async def test_the_agents_modes_are_offered_and_one_is_set(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(modes=True)) as (session, launcher, rec):
        assert session.modes is not None
        assert session.modes["currentModeId"] == "ask"
        assert [m["id"] for m in session.modes["availableModes"]] == ["ask", "code"]
        await session.set_mode("code")
        assert session.modes["currentModeId"] == "code"
        assert launcher.sent_methods().count("session/set_mode") == 1
        await rec.wait_for(
            lambda e: isinstance(e, ev.SessionInfo) and e.data.get("currentModeId") == "code"
        )
        assert mode_updates(rec) == ["ask", "code"]
        turn = await session.prompt("go words=2")  # the session goes on
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"


async def test_an_unknown_mode_or_an_agent_without_modes_is_refused_before_anything_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(modes=True)) as (session, launcher, _):
        with pytest.raises(BadRequest, match=r"unknown mode 'plan' \(known: ask, code\)"):
            await session.set_mode("plan")
        assert "session/set_mode" not in launcher.sent_methods()
    async with running(AcpBehaviour()) as (session, launcher, _):
        assert session.modes is None
        with pytest.raises(BadRequest, match="offers no session modes"):
            await session.set_mode("code")
        assert "session/set_mode" not in launcher.sent_methods()


async def test_a_refused_mode_fails_the_call_with_the_agents_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(modes=True, mode_answer="refuse")) as (session, _, _):
        with pytest.raises(BadRequest, match="refused mode 'code': not in this session"):
            await session.set_mode("code")
        assert session.modes is not None and session.modes["currentModeId"] == "ask"


async def test_an_agent_that_dies_before_it_answers_fails_the_call_and_is_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(modes=True, mode_answer="exit")) as (session, launcher, rec):
        with trio.fail_after(30), pytest.raises(AgentNotRunning, match="before it took the mode"):
            await session.set_mode("code")
        await rec.wait_for(lambda e: isinstance(e, ev.SessionState) and e.state == "ready", count=2)
        assert len(launcher.agents) == 2
        assert session.modes is not None and session.modes["currentModeId"] == "ask"
        # Each (re)started session told the mode it is in.
        await rec.wait_for(
            lambda e: isinstance(e, ev.SessionInfo) and e.info_kind == "current_mode_update",
            count=2,
        )
        assert mode_updates(rec) == ["ask", "ask"]


async def test_a_mode_asked_for_while_the_agent_restarts_is_told_to_wait_not_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=1000, modes=True, stop_delay=None, kill_time=1.0))
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    async with helpers.running(launcher, spec) as (session, _, rec):
        await session.prompt("hello")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)
            await trio.sleep(2.5)  # killed, being respawned
            with pytest.raises(AgentNotRunning, match="not up yet"):
                await session.set_mode("code")
        await session.set_mode("code")  # once it is up again
        assert session.modes is not None and session.modes["currentModeId"] == "code"
