"""Tier 2: steering a running turn (virtual time, in-memory agents).

``session.steer(text)`` goes the best way the agent has: ``injected`` into the running turn
where the agent steers natively (ACP ``_session/steering`` here; each protocol's own way is in
its machine's tests), ``interrupted`` (the turn cancelled through the whole ladder, the text
first after it) where it cannot, ``started`` when no turn runs. ``turn.steered`` tells every
subscriber, and queued prompts keep their place behind the steered text.

The agents are scripted as an application's tests would (``supervisor.testing.FakeAgent``),
but where a test needs what only the project's own fakes do (a steer never answered, a
``turn/start`` reply held back, a crash in one turn).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
import trio
import trio.testing

import helpers
from helpers import Recorder
from protocols import events as ev
from supervisor import AgentSpec, CancelReceipt, Session
from supervisor.errors import BadRequest
from supervisor.steering import SteerResult
from supervisor.supervisor import AnySession
from supervisor.testing import FakeAgent
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.testing._codex import CodexBehaviour, CodexLauncher


def running(
    behaviour: AcpBehaviour, **changes: object
) -> AbstractAsyncContextManager[tuple[Session, AcpLauncher, Recorder]]:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    return helpers.running(AcpLauncher(behaviour), spec.with_options(**changes), catch_up=True)


def fake(
    protocol: str = "acp", **options: object
) -> AbstractAsyncContextManager[tuple[AnySession, Recorder]]:
    """A session of a ``FakeAgent`` (a grace of 2 s unless told), caught up on the way out."""
    options.setdefault("grace_s", 2.0)
    agent = FakeAgent(protocol, **options)  # type: ignore[arg-type]
    return helpers.fake_session(agent, catch_up=True)


#: Forty words, four seconds.
WORDS_40 = "word " * 40


async def running_turn(session: AnySession, rec: Recorder, text: str = "go") -> str:
    turn = await session.prompt(text)
    await rec.wait_kind("message.delta", turn_id=turn.id)
    return turn.id


def texts(rec: Recorder, turn_id: str) -> str:
    return "".join(
        e.text
        for e in rec.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta) and e.turn_id == turn_id
    )


async def test_an_agent_that_steers_takes_the_text_into_the_running_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply="a b c d e", steer="inject", grace_s=2.0)
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        first = await running_turn(session, rec)
        result = await session.steer("use tabs, not spaces")
        assert (result.mode, result.turn_id, result.receipt) == ("injected", first, None)
        steered = await rec.wait_kind("turn.steered")
        assert isinstance(steered, ev.TurnSteered)
        assert (steered.turn_id, steered.mode, steered.text) == (
            first,
            "injected",
            "use tabs, not spaces",
        )
        ended = await rec.wait_kind("turn.ended", turn_id=first)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        assert "steered:use tabs, not spaces" in texts(rec, first)
        assert agent.steers == ["use tabs, not spaces"]
        # No cancel, no second turn: one turn took both texts.
        assert [e.turn_id for e in rec.of_kind("turn.started")] == [first]


async def test_an_agent_that_cannot_steer_makes_way_through_the_ladder(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply=WORDS_40, grace_s=2.0)
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        first = await running_turn(session, rec)
        queued = await session.prompt("afterwards")
        assert queued.queued
        result = await session.steer("stop that, do this")
        assert result.mode == "interrupted" and result.receipt is not None
        assert result.receipt.turn_id == first and result.receipt.outcome == "cancelled"
        assert result.receipt.reason == "steer" and result.receipt.dropped_prompts == []
        # Terminate-then-respond: the old turn has ended, the steered one runs.
        assert session.turn_id == result.turn_id
        ended = [await rec.wait_kind("turn.ended", turn_id=first)]
        started = await rec.wait_kind("turn.started", turn_id=result.turn_id)
        assert isinstance(started, ev.TurnStarted) and started.text == "stop that, do this"
        steered = await rec.wait_kind("turn.steered")
        assert isinstance(steered, ev.TurnSteered)
        assert (steered.mode, steered.interrupted_turn_id) == ("interrupted", first)
        assert ended[0].seq < steered.seq < started.seq
        # The queued prompt kept its place, behind the steered text.
        await rec.wait_kind("turn.ended", turn_id=result.turn_id)
        await rec.wait_kind("turn.started", turn_id=queued.id)
        assert agent.prompts == ["go", "stop that, do this", "afterwards"]
        await session.cancel()


async def test_a_steer_with_no_turn_running_starts_one_ahead_of_the_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply="a b", steer="inject")
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        result = await session.steer("hello")
        assert result.mode == "started" and result.receipt is None
        started = await rec.wait_kind("turn.started", turn_id=result.turn_id)
        steered = await rec.wait_kind("turn.steered", turn_id=result.turn_id)
        assert steered.seq < started.seq
        await rec.wait_kind("turn.ended", turn_id=result.turn_id)
        assert agent.prompts == ["hello"]


async def test_a_steer_the_agent_refuses_falls_back_to_the_ladder(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply=WORDS_40, steer="refuse", grace_s=2.0)
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        first = await running_turn(session, rec)
        result = await session.steer("instead")
        assert result.mode == "interrupted" and result.receipt is not None
        assert result.receipt.turn_id == first
        assert result.detail is not None and "cannot steer now" in result.detail
        await rec.wait_kind("message.delta", turn_id=result.turn_id)
        assert agent.prompts == ["go", "instead"]
        await session.cancel()


async def test_a_steer_the_agent_never_answers_is_bounded_by_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = AcpBehaviour(words=400, word_interval=0.1, steering=True, steer_answer="silent")
    async with running(behaviour) as (session, launcher, rec):
        first = await running_turn(session, rec)
        start = trio.current_time()
        result = await session.steer("instead")
        # grace_s (2 s) for the answer, then the ladder (the fake obeys the cancel at once).
        assert trio.current_time() - start == pytest.approx(2.0, abs=0.05)
        assert result.mode == "interrupted" and result.receipt is not None
        assert result.receipt.turn_id == first
        assert result.detail is not None and "did not answer" in result.detail
        await session.cancel()


async def test_a_steer_while_a_turn_is_being_cancelled_starts_right_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake(reply=WORDS_40, on_cancel=0.5) as (session, rec):
        first = await running_turn(session, rec)
        async with trio.open_nursery() as nursery:
            receipts = []

            async def cancel() -> None:
                receipts.append(await session.cancel())

            nursery.start_soon(cancel)
            await rec.wait_kind("session.state", state="cancelling")
            result = await session.steer("then this")
        assert result.mode == "interrupted"
        assert result.receipt == receipts[0] and result.receipt.turn_id == first
        await rec.wait_kind("turn.started", turn_id=result.turn_id)
        await session.cancel()


async def test_a_wedged_agent_is_killed_and_the_steered_text_runs_on_the_respawned_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply=WORDS_40, on_cancel="ignore", grace_s=2.0)
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        first = await running_turn(session, rec)
        result = await session.steer("after the kill")
        assert result.mode == "interrupted" and result.receipt is not None
        assert result.receipt.outcome == "killed"
        assert "grace_expired" in result.receipt.escalation
        assert result.receipt.resumed is True
        assert agent.starts == 2 and session.turn_id == result.turn_id
        await rec.wait_kind("message.delta", turn_id=result.turn_id)
        assert agent.processes[1].prompts == ["after the kill"]
        assert first != result.turn_id
        await session.cancel()


async def test_steer_refuses_empty_text(autojump_clock: trio.testing.MockClock) -> None:
    async with fake(reply=WORDS_40) as (session, rec):
        with pytest.raises(BadRequest):
            await session.steer("   ")


# -- Codex app-server: ``turn/steer`` ------------------------------------------------------------


def codex_running(
    behaviour: CodexBehaviour,
) -> AbstractAsyncContextManager[tuple[Session, CodexLauncher, Recorder]]:
    spec = AgentSpec(name="codex", protocol="codex", command=["codex", "app-server"], grace_s=2.0)
    return helpers.running(CodexLauncher(behaviour), spec, catch_up=True)


async def test_codex_takes_the_text_into_the_running_turn_with_turn_steer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("codex", reply="a b c d e", grace_s=2.0)
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        first = await running_turn(session, rec)
        result = await session.steer("and add tests")
        assert (result.mode, result.turn_id) == ("injected", first)
        [steer] = [m for m in agent.received if m.get("method") == "turn/steer"]
        assert steer["params"]["input"] == [{"type": "text", "text": "and add tests"}]
        assert steer["params"]["expectedTurnId"].startswith("turn_")
        ended = await rec.wait_kind("turn.ended", turn_id=first)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        assert "steered:and add tests" in texts(rec, first)
        assert agent.steers == ["and add tests"]


async def test_codex_steer_before_the_turn_is_named_waits_for_its_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = CodexBehaviour(words=5, word_interval=0.1, reply_delay=0.5)
    async with codex_running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("go")
        result = await session.steer("early")
        assert (result.mode, result.turn_id) == ("injected", turn.id)
        [steer] = launcher.sent("turn/steer")
        assert steer["params"]["expectedTurnId"] == "turn_2"
        await rec.wait_kind("turn.ended", turn_id=turn.id)


async def test_codex_steer_as_the_turn_ends_starts_the_next_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One word: the turn is over on the server by the time turn/steer reaches it.
    agent = FakeAgent("codex", reply="done", word_delay=0.0, grace_s=2.0)
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        first = await running_turn(session, rec)
        result = await session.steer("one more thing")
        # Either the session heard of the turn's end first, or Codex answered "no active
        # turn to steer": both ways the text starts the next turn.
        assert result.mode == "started" and result.turn_id != first
        await rec.wait_kind("turn.ended", turn_id=result.turn_id)
        assert agent.prompts == ["go", "one more thing"]


# -- Amp: ``"steer": true`` ------------------------------------------------------------------------


async def test_amp_takes_the_text_into_the_running_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("amp", reply="word " * 10, grace_s=2.0)
    async with helpers.fake_session(agent, catch_up=True) as (session, rec):
        first = await running_turn(session, rec)
        result = await session.steer("go left")
        assert (result.mode, result.turn_id) == ("injected", first)
        [line] = [m for m in agent.received if m.get("steer")]
        assert line["message"]["content"] == [{"type": "text", "text": "go left"}]
        echo = await rec.wait_for(
            lambda e: isinstance(e, ev.MessageDelta) and e.role == "user" and e.text == "go left"
        )
        assert echo.turn_id == first
        ended = await rec.wait_kind("turn.ended", turn_id=first)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        assert agent.steers == ["go left"]


async def test_steer_refuses_text_utf8_cannot_carry(autojump_clock: trio.testing.MockClock) -> None:
    async with fake(reply=WORDS_40) as (session, rec):
        first = await running_turn(session, rec)
        with pytest.raises(BadRequest, match="steer text"):
            await session.steer("broken \ud800 paste")
        assert session.turn_id == first and rec.of_kind("turn.steered") == []
        await session.cancel()


async def test_steers_while_the_agent_restarts_start_in_the_order_they_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No turn runs and the session is not ready (the agent crashed and is respawning): each
    steer goes first in the queue, after the steers before it."""
    async with running(AcpBehaviour(words=3, word_interval=0.1, start_delay=0.0)) as (
        session,
        launcher,
        rec,
    ):
        await session.prompt("crash")
        await rec.wait_kind("turn.ended")
        assert session.state != "ready"  # respawning
        first = await session.steer("A first")
        second = await session.steer("B second")
        await session.prompt("P third")
        assert (first.mode, second.mode) == ("started", "started")
        await rec.wait_kind("turn.ended", count=4)
        started = [e.text for e in rec.of_kind("turn.started")]
        assert started[-3:] == ["A first", "B second", "P third"]


async def stop_after_a_steer(
    session: AnySession, rec: Recorder, turn_id: str, text: str
) -> CancelReceipt:
    """A steer, and once it is in hand (sent to the agent, or its cancel under way) a Stop: the
    steer's text is dropped with the turn, as a queued prompt is; its caller hears so."""
    async with trio.open_nursery() as nursery:
        results: list[SteerResult] = []

        async def steer() -> None:
            results.append(await session.steer(text))

        nursery.start_soon(steer)
        await trio.testing.wait_all_tasks_blocked()  # the steer handled, nothing left to run
        assert not results  # still waiting for the agent, or for the turn to make way
        receipt = await session.cancel(reason="user")
    [result] = results
    assert receipt.turn_id == turn_id
    assert [p.text for p in receipt.dropped_prompts] == [text]
    assert result.turn_id == receipt.dropped_prompts[0].turn_id
    assert result.detail is not None and "dropped" in result.detail
    await rec.catch_up()
    assert session.turn_id is None and session.state == "ready"
    assert [e.turn_id for e in rec.of_kind("turn.started")] == [turn_id]
    [dropped] = [e for e in rec.of_kind("turn.ended") if e.turn_id == result.turn_id]
    assert isinstance(dropped, ev.TurnEnded) and dropped.stop_reason == "dropped"
    return receipt


async def test_a_stop_after_a_steer_stops_the_steered_text_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The agent cannot steer: the steer interrupts the turn (its cancel under way, the text
    to start once it has ended); the user's Stop then drops the text, as it drops the queue."""
    async with fake(reply="word " * 400, on_cancel=1.0) as (session, rec):
        turn_id = await running_turn(session, rec)
        receipt = await stop_after_a_steer(session, rec, turn_id, "do this instead")
        assert receipt.outcome == "cancelled"  # (the steer's own cancel, which the Stop joined)


async def test_a_stop_drops_a_steer_the_agent_has_not_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = AcpBehaviour(words=400, word_interval=0.1, steering=True, steer_answer="silent")
    async with running(behaviour) as (session, launcher, rec):
        turn_id = await running_turn(session, rec)
        await stop_after_a_steer(session, rec, turn_id, "not now")
        await trio.sleep(5.0)  # past the steer's own deadline: nothing of it comes back
        assert [e.turn_id for e in rec.of_kind("turn.started")] == [turn_id]
