"""Tier 2: an agent that fails turn after turn is recycled (virtual time, in-memory agents).

A failed turn is the agent's answer; ``max_failed_turns`` (default 3) of them in a row is an
agent stuck in a bad state (opencode after an early abort failed every prompt until restarted).
Then the agent is restarted and its session resumed, in an event and in ``session.list``, and
the next prompt works. A turn that succeeds, or one we cancelled, starts the count again.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio
import trio.testing

import helpers
from helpers import Recorder
from protocols import events as ev
from supervisor import AgentSpec, Session
from supervisor.config import DEFAULT_MAX_FAILED_TURNS, ConfigError, parse_agents
from supervisor.testing._acp import AcpBehaviour, AcpLauncher


def running(
    behaviour: AcpBehaviour | None = None, **changes: object
) -> AbstractAsyncContextManager[tuple[Session, AcpLauncher, Recorder]]:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    return helpers.running(
        AcpLauncher(behaviour or AcpBehaviour(words=2)), spec.with_options(**changes)
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
    async with running(AcpBehaviour(words=50, word_interval=0.1)) as (session, launcher, rec):
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


def refuse_prompts(launcher: AcpLauncher, texts: set[str]) -> None:
    """The link of the agent now running raises when handed a prompt of ``texts`` (a link bug:
    a real one encodes every prompt a session accepts), after the machine was told of it."""
    link = launcher.links[-1]
    send = link.send

    def refusing(message: dict[str, Any]) -> None:
        prompt = message.get("params", {}).get("prompt") or [{}]
        if message.get("method") == "session/prompt" and prompt[0].get("text") in texts:
            raise RuntimeError("the link could not write the prompt")
        send(message)

    link.send = refusing  # type: ignore[method-assign]


async def test_a_prompt_the_agent_could_not_be_handed_recycles_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The machine was told of a turn the agent never got: the caller hears the error, no
    turn is announced, and the agent is restarted and its session resumed, so the next
    prompt is the agent's and the machine's alike."""
    async with running() as (session, launcher, rec):
        await session.wait_ready()
        refuse_prompts(launcher, {"lost"})
        with pytest.raises(RuntimeError, match="could not write"):
            await session.prompt("lost")
        with trio.fail_after(60):  # virtual time: a session left stuck fails at once
            recycled = await rec.wait_kind("session.recycled")
        assert isinstance(recycled, ev.SessionRecycled)
        assert "could not be handed" in recycled.reason
        await session.wait_ready()
        assert len(launcher.agents) == 2
        assert (await outcome(session, rec, "again")).outcome == "completed"
        await rec.catch_up()
        assert [e.kind for e in rec.events].count("turn.started") == 1
        assert session.summary().recycles == 1


async def test_a_queued_prompt_that_could_not_be_handed_ends_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its caller was answered when it was queued: the prompt gets its one ``turn.ended``,
    failed and saying why, the agent is recycled, and what is queued after it runs."""
    async with running(AcpBehaviour(words=3, word_interval=0.1)) as (session, launcher, rec):
        await session.wait_ready()
        refuse_prompts(launcher, {"lost"})
        first = await session.prompt("words=3")
        lost = await session.prompt("lost")
        after = await session.prompt("words=2")
        assert lost.queued and after.queued
        with trio.fail_after(60):  # virtual time: a prompt left unanswered fails at once
            ended = await rec.wait_kind("turn.ended", turn_id=lost.id)
        assert isinstance(ended, ev.TurnEnded)
        assert ended.outcome == "failed" and "could not be handed" in (ended.error or "")
        done = await rec.wait_kind("turn.ended", turn_id=after.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        assert len(launcher.agents) == 2 and launcher.agents[1].turns == ["words=2"]
        assert (await session.cancel(turn_id=lost.id)).outcome == "failed"
        await rec.catch_up()
        assert [e.turn_id for e in rec.of_kind("turn.ended")] == [first.id, lost.id, after.id]
        rec.check_invariants()


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
