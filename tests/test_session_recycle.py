"""Tier 2: an agent that fails turn after turn is recycled (virtual time, in-memory agents).

A failed turn is the agent's answer; ``max_failed_turns`` (default 3) of them in a row is an
agent stuck in a bad state (opencode after an early abort failed every prompt until restarted).
Then the agent is restarted and its session resumed, in an event and in ``session.list``, and
the next prompt works. A turn that succeeds, or one we cancelled, starts the count again.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import trio
import trio.testing

import helpers
from fakes.memory_agent import Behaviour, MemoryLauncher
from helpers import Recorder
from protocols import events as ev
from supervisor import AgentSpec, Session
from supervisor.config import DEFAULT_MAX_FAILED_TURNS, ConfigError, parse_agents


def running(
    behaviour: Behaviour | None = None, **changes: object
) -> AbstractAsyncContextManager[tuple[Session, MemoryLauncher, Recorder]]:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    return helpers.running(
        MemoryLauncher(behaviour or Behaviour(words=2)), spec.with_options(**changes)
    )


async def outcome(session: Session, rec: Recorder, text: str) -> ev.TurnEnded:
    turn = await session.prompt(text)
    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    return ended


async def test_three_failed_turns_in_a_row_recycle_the_agent_and_resume(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert DEFAULT_MAX_FAILED_TURNS == 3
    async with running() as (session, launcher, rec):
        assert (await outcome(session, rec, "hello")).outcome == "completed"
        for _ in range(2):
            failed = await outcome(session, rec, "fail")
            assert (failed.outcome, failed.error) == (
                "failed",
                "model backend unavailable (code -32603)",
            )
        assert rec.of_kind("session.recycled") == [] and len(launcher.agents) == 1
        third = await outcome(session, rec, "fail")
        assert third.outcome == "failed"
        recycled = await rec.wait_kind("session.recycled")
        assert isinstance(recycled, ev.SessionRecycled)
        assert recycled.failed_turns == 3 and "model backend unavailable" in recycled.reason
        assert recycled.seq > third.seq  # the turn has ended first
        # The agent was restarted with its session to resume, and the next prompt works.
        await session.wait_ready()
        assert len(launcher.agents) == 2
        first_session = launcher.resumes[1]
        assert first_session is not None and first_session == launcher.agents[0].session_id
        assert (await outcome(session, rec, "again")).outcome == "completed"
        assert len(rec.of_kind("session.recycled")) == 1
        summary = session.summary()
        assert summary.recycles == 1 and summary.recycle_reason == recycled.reason
        await rec.catch_up()
        states = [e for e in rec.of_kind("session.state") if isinstance(e, ev.SessionState)]
        [recycling] = [e for e in states if (e.detail or "").startswith("recycling the agent")]
        after = [e.state for e in states if e.seq > recycling.seq]
        assert recycling.state == "starting" and after[:2] == ["starting", "ready"], after


async def test_a_success_or_a_cancel_starts_the_count_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(Behaviour(words=50, word_interval=0.1)) as (session, launcher, rec):
        for text in ("fail", "fail", "words=1", "fail", "fail"):
            await outcome(session, rec, text)
        turn = await session.prompt("words=50")  # a turn we stop is not a failure
        await rec.wait_for(lambda e: e.kind == "message.delta" and e.turn_id == turn.id)
        assert (await session.cancel()).outcome == "cancelled"
        await outcome(session, rec, "fail")
        await outcome(session, rec, "fail")
        assert rec.of_kind("session.recycled") == [] and len(launcher.agents) == 1
        assert session.summary().recycles == 0


async def test_prompts_queued_behind_the_recycle_run_on_the_new_agent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_failed_turns=2) as (session, launcher, rec):
        await outcome(session, rec, "fail")
        turn = await session.prompt("fail")
        queued = await session.prompt("words=3")
        assert queued.queued
        ended = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        assert len(launcher.agents) == 2 and launcher.agents[1].turns == ["words=3"]
        assert [e.turn_id for e in rec.of_kind("turn.ended")][-2:] == [turn.id, queued.id]


async def test_zero_never_recycles(autojump_clock: trio.testing.MockClock) -> None:
    async with running(max_failed_turns=0) as (session, launcher, rec):
        for _ in range(5):
            assert (await outcome(session, rec, "fail")).outcome == "failed"
        assert len(launcher.agents) == 1 and rec.of_kind("session.recycled") == []


def test_max_failed_turns_is_configurable_and_checked() -> None:
    table = {"protocol": "acp", "command": ["x"]}
    assert parse_agents({"agents": {"a": table}})["a"].max_failed_turns == 3
    spec = parse_agents({"agents": {"a": {**table, "max_failed_turns": 5}}})["a"]
    assert spec.max_failed_turns == 5
    for bad in (-1, 1.5, True, "3"):
        try:
            parse_agents({"agents": {"a": {**table, "max_failed_turns": bad}}})
        except ConfigError as exc:
            assert "max_failed_turns" in str(exc)
        else:
            raise AssertionError(f"accepted {bad!r}")
