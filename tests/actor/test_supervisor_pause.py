"""Tier 2: pause all, resume all (``Supervisor.pause``/``resume``), on virtual time with
in-memory agents.

While paused, no new turn starts in any session: every prompt is accepted and queued, its
caller told (``held: "paused"``); the running turns go on by themselves, or are stopped through
the ladder at the deadline (``reason: "paused"``); sessions started meanwhile are held too.
The resume runs what each session held, in order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
import trio.testing

from helpers import KILLED
from protocols import events as ev
from supervisor.errors import BadRequest
from supervisor.supervisor import AnySession, Supervisor
from supervisor.testing import FakeAgent, Recorder, open_test_supervisor, record

#: Ten words, ten virtual seconds.
TEN_WORDS = "word " * 10


@asynccontextmanager
async def supervisor(**agents: FakeAgent) -> AsyncIterator[Supervisor]:
    with trio.fail_after(3_000):  # virtual: a wait that would never end fails at once
        async with open_test_supervisor(agents=agents) as sup:
            yield sup


@asynccontextmanager
async def recorded(*sessions: AnySession) -> AsyncIterator[list[Recorder]]:
    async with AsyncExitStack() as stack:
        recorders = [await stack.enter_async_context(record(s)) for s in sessions]
        yield recorders
        for recorder in recorders:
            await recorder.catch_up()
            recorder.check_invariants()


def started(rec: Recorder) -> list[str]:
    return [e.turn_id for e in rec.events if isinstance(e, ev.TurnStarted)]


async def test_a_pause_holds_new_prompts_in_every_session_and_tells_each_caller(
    autojump_clock: trio.testing.MockClock,
) -> None:
    acp, codex = FakeAgent("acp"), FakeAgent("codex")
    async with supervisor(acp=acp, codex=codex) as sup:
        one, two = await sup.start_session("acp"), await sup.start_session("codex")
        async with recorded(one, two) as (rec_one, rec_two):
            status = await sup.pause()
            assert status.paused and status.deadline_s is None
            assert status.held == ("s1", "s2") and status.running == () and status.pending == ()
            handles = [await one.prompt("a"), await two.prompt("b"), await one.prompt("c")]
            assert [(h.id, h.queued, h.held) for h in handles] == [
                ("t1", True, "paused"),
                ("t1", True, "paused"),
                ("t2", True, "paused"),
            ]
            await trio.sleep(60)  # virtual: a minute in which nothing may start
            assert acp.prompts == [] and codex.prompts == []
            assert started(rec_one) == [] and started(rec_two) == []
            for rec in (rec_one, rec_two):
                [held] = rec.of_kind("session.held")
                assert isinstance(held, ev.SessionHeld) and held.held == "paused"
            assert [s.held for s in sup.list()] == ["paused", "paused"]
            assert one.state == "ready" and one.held == "paused"
            await sup.resume()
            await rec_one.wait_kind("turn.ended", turn_id="t2")
            await rec_two.wait_kind("turn.ended", turn_id="t1")
    assert acp.prompts == ["a", "c"] and codex.prompts == ["b"]


async def test_the_running_turn_finishes_by_itself_and_the_next_waits_for_the_resume(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply=TEN_WORDS, word_delay=1.0)
    async with supervisor(acp=agent) as sup:
        session = await sup.start_session("acp")
        async with recorded(session) as (rec,):
            first = await session.prompt("long")
            await rec.wait_kind("message.delta", turn_id=first.id)
            status = await sup.pause()
            assert status.running == ("s1",)
            waiting = await session.prompt("next")
            assert waiting.held == "paused"
            ended = await rec.wait_kind("turn.ended", turn_id=first.id)
            assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
            assert ended.reason is None
            await trio.sleep(60)  # virtual: nothing starts after it
            assert started(rec) == ["t1"] and session.state == "ready"
            assert sup.pause_status().running == ()
            resumed_at = trio.current_time()
            await sup.resume()
            begun = await rec.wait_kind("turn.started", turn_id=waiting.id)
            assert trio.current_time() == resumed_at  # at once
            assert isinstance(begun, ev.TurnStarted) and begun.text == "next"
            await rec.wait_kind("turn.ended", turn_id=waiting.id)
    assert agent.prompts == ["long", "next"]


async def test_at_the_deadline_a_turn_still_running_is_stopped_through_the_ladder(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wedged = FakeAgent("acp", reply="word " * 1000, word_delay=1.0, on_cancel="ignore", grace_s=3)
    async with supervisor(acp=wedged) as sup:
        session = await sup.start_session("acp")
        async with recorded(session) as (rec,):
            turn = await session.prompt("forever")
            await rec.wait_kind("message.delta", turn_id=turn.id)
            paused_at = trio.current_time()
            status = await sup.pause(deadline_s=30)
            assert status.deadline_s == 30.0 and status.running == ("s1",)
            [held] = rec.of_kind("session.held")
            assert isinstance(held, ev.SessionHeld) and held.deadline_s == 30.0
            queued = await session.prompt("after the upgrade")
            ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded) and ended.outcome == "killed"
            assert ended.reason == "paused" and ended.receipt is not None
            assert ended.receipt["reason"] == "paused" and ended.receipt["escalation"] == KILLED
            assert ended.receipt["dropped_prompts"] == []  # the held prompt is kept
            # the interrupt went out at the deadline; the kill came a grace later
            assert ended.receipt["elapsed_ms"] == pytest.approx(3000.0)
            assert trio.current_time() == pytest.approx(paused_at + 30 + 3)
            assert wedged.kills == 1 and wedged.starts == 2
            await trio.sleep(60)
            assert started(rec) == ["t1"] and session.held == "paused"
            await sup.resume()
            await rec.wait_kind("turn.started", turn_id=queued.id)
            await session.cancel()
    assert wedged.prompts == ["forever", "after the upgrade"]


async def test_a_cooperative_turn_cancelled_at_the_deadline_says_paused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("codex", reply="word " * 1000, word_delay=1.0)
    async with supervisor(codex=agent) as sup:
        session = await sup.start_session("codex")
        async with recorded(session) as (rec,):
            turn = await session.prompt("long")
            await rec.wait_kind("message.delta", turn_id=turn.id)
            await sup.pause(deadline_s=5)
            ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded) and ended.outcome == "cancelled"
            assert ended.reason == "paused" and ended.receipt is not None
            assert ended.receipt["escalation"] == ["interrupt"]
            assert session.state == "ready" and session.turn_id is None


async def test_the_resume_runs_each_sessions_prompts_in_order_one_turn_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply="ok ok", word_delay=1.0)
    async with supervisor(acp=agent) as sup:
        session = await sup.start_session("acp")
        async with recorded(session) as (rec,):
            await sup.pause()
            handles = [await session.prompt(text) for text in ("one", "two", "three")]
            await sup.resume()
            for handle in handles:
                await rec.wait_kind("turn.ended", turn_id=handle.id)
            [_, released] = rec.of_kind("session.held")
            assert isinstance(released, ev.SessionHeld) and released.held is None
            assert released.queued == 3
            turns = [e for e in rec.events if e.kind in ("turn.started", "turn.ended")]
            assert [(e.kind, getattr(e, "turn_id", None)) for e in turns] == [
                ("turn.started", "t1"),
                ("turn.ended", "t1"),
                ("turn.started", "t2"),
                ("turn.ended", "t2"),
                ("turn.started", "t3"),
                ("turn.ended", "t3"),
            ]
    assert agent.prompts == ["one", "two", "three"]


async def test_pause_and_resume_are_idempotent(autojump_clock: trio.testing.MockClock) -> None:
    async with supervisor(acp=FakeAgent("acp")) as sup:
        session = await sup.start_session("acp")
        async with recorded(session) as (rec,):
            await sup.pause()
            again = await sup.pause()
            assert again.paused and again.held == ("s1",)
            await sup.pause(deadline_s=20)  # a deadline brought forward is said
            later = await sup.pause(deadline_s=90)  # pushed back: not taken
            assert later.deadline_s == pytest.approx(20.0)
            await sup.resume()
            status = await sup.resume()
            assert not status.paused and status.held == () and status.deadline_s is None
            held = [e for e in rec.events if isinstance(e, ev.SessionHeld)]
            assert [(e.held, e.deadline_s) for e in held] == [
                ("paused", None),
                ("paused", 20.0),
                (None, None),
            ]
            with pytest.raises(BadRequest, match="deadline_s"):
                await sup.pause(deadline_s=-1)
            assert not sup.pause_status().paused


async def test_a_session_started_during_a_pause_starts_held(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", start_delay=2.0)
    async with supervisor(acp=agent) as sup:
        await sup.pause(deadline_s=100)
        session = await sup.start_session("acp")
        assert session.held == "paused" and session.state == "ready"
        async with recorded(session) as (rec,):
            first = await rec.wait_for(lambda e: e.seq == 1)
            assert isinstance(first, ev.SessionHeld)  # said first, before it started
            handle = await session.prompt("hello")
            assert handle.queued and handle.held == "paused"
            assert sup.pause_status().held == ("s1",)
            await trio.sleep(200)  # past the deadline: it has nothing running to stop
            assert agent.prompts == [] and rec.of_kind("turn.ended") == []
            await sup.resume()
            await rec.wait_kind("turn.ended", turn_id=handle.id)
    assert agent.prompts == ["hello"]


async def test_a_steer_joins_the_running_turn_during_a_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("codex", reply=TEN_WORDS, word_delay=1.0)  # Codex steers natively
    async with supervisor(codex=agent) as sup:
        session = await sup.start_session("codex")
        async with recorded(session) as (rec,):
            turn = await session.prompt("work")
            await rec.wait_kind("message.delta", turn_id=turn.id)
            await sup.pause()
            result = await session.steer("and add tests")
            assert (result.mode, result.turn_id, result.held) == ("injected", turn.id, None)
            await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert agent.steers == ["and add tests"]


async def test_a_stop_of_a_paused_session_and_the_pause_status_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with supervisor(acp=FakeAgent("acp")) as sup:
        kept = await sup.start_session("acp")
        gone = await sup.start_session("acp")
        await sup.pause()
        await gone.prompt("never")
        await sup.stop_session(gone.id)
        status = await sup.resume()
        assert status.held == () and kept.held is None
