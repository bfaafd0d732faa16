"""The stall watchdog: a running turn the agent says nothing about for ``stall_s`` is cancelled
through the ladder, ``reason: "stalled"``.

Tier 2 (virtual time, in-memory agents: every deadline exact) and, at the end, tier 3 (the demo
agent as a real process, on the real clock, generous bounds). "Nothing" means no turn event:
stderr goes on in the silent fakes and does not count; a pending permission waits on a person,
not on the agent; a tool call in progress is judged by ``tool_stall_s`` only.

The tier-2 tests script the agent as an application's tests would (``supervisor.testing``),
but where they need the ACP fake's own knobs (a flood of stderr, a tool call in some turns only).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

import helpers
from helpers import KILLED, Recorder
from protocols import events as ev
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.config import DEFAULT_STALL_S, DEFAULT_TOOL_STALL_S
from supervisor.supervisor import AnySession
from supervisor.testing import FakeAgent, record
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import event_from_json, event_json

GRACE = 2.0
STALL = 10.0


#: Virtual seconds a tier-2 test may take: a wait that would never end fails instead (at once).
VIRTUAL_BOUND = 3_000.0


@asynccontextmanager
async def running(
    behaviour: AcpBehaviour | None = None, **changes: object
) -> AsyncIterator[tuple[Session, AcpLauncher, Recorder]]:
    spec = AgentSpec(
        name="fake", protocol="acp", command=["fake-agent"], grace_s=GRACE, stall_s=STALL
    )
    with trio.fail_after(VIRTUAL_BOUND):
        async with helpers.running(AcpLauncher(behaviour), spec.with_options(**changes)) as it:
            yield it


#: An answer that outlasts any test here.
LONG = "word " * 1000


@asynccontextmanager
async def fake_running(**options: object) -> AsyncIterator[tuple[AnySession, FakeAgent, Recorder]]:
    """A session of an ACP ``FakeAgent`` with this file's grace and watchdog (``options``
    override them)."""
    options = {"grace_s": GRACE, "stall_s": STALL, **options}
    agent = FakeAgent("acp", **options)  # type: ignore[arg-type]
    with trio.fail_after(VIRTUAL_BOUND):
        async with helpers.fake_session(agent) as (session, rec):
            yield session, agent, rec


def methods(agent: FakeAgent) -> list[str]:
    return [m.get("method", "<response>") for m in agent.received]


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


async def ended(rec: Recorder, turn_id: str) -> ev.TurnEnded:
    event = await rec.wait_kind("turn.ended", turn_id=turn_id)
    assert isinstance(event, ev.TurnEnded)
    return event


async def stalled(rec: Recorder) -> ev.TurnStalled:
    event = await rec.wait_kind("turn.stalled")
    assert isinstance(event, ev.TurnStalled)
    return event


async def completes(session: AnySession, rec: Recorder, text: str = "words=2") -> None:
    turn = await session.prompt(text)
    assert (await ended(rec, turn.id)).outcome == "completed"


async def test_a_silent_turn_is_cancelled_at_stall_s_with_reason_stalled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_running(reply=[LONG, "a b"], silent_after=2) as (session, agent, rec):
        turn = await session.prompt("go")
        await rec.wait_for(is_delta, count=2)
        last_word = trio.current_time()
        end = await ended(rec, turn.id)
        assert trio.current_time() - last_word == pytest.approx(STALL)  # the agent stops at once
        stall = await stalled(rec)
        assert (stall.turn_id, stall.silent_s, stall.stall_s, stall.tool_calls) == (
            turn.id,
            pytest.approx(STALL),
            STALL,
            [],
        )
        # The agent logged all along: stderr is not something said about the turn.
        assert len(rec.of_kind("agent.stderr")) >= STALL - 1
        [cancelling] = [
            e for e in rec.events if isinstance(e, ev.SessionState) and e.state == "cancelling"
        ]
        assert stall.seq < cancelling.seq < end.seq
        assert (cancelling.detail or "").startswith("stalled: nothing from the agent for 10.0 s")
        assert (end.outcome, end.reason, end.stop_reason) == ("cancelled", "stalled", "cancelled")
        assert end.receipt is not None
        assert end.receipt["reason"] == "stalled" and end.receipt["escalation"] == ["interrupt"]
        assert end.receipt["elapsed_ms"] == 0.0
        assert methods(agent).count("session/cancel") == 1 and agent.starts == 1
        # A cancel naming the turn later gets that receipt; the session goes on.
        again = await session.cancel(turn_id=turn.id)
        assert (again.outcome, again.reason) == ("cancelled", "stalled")
        assert again.summary().startswith("Stalled: cancelled in ")
        await completes(session, rec)  # two words: said whole
        assert len(rec.of_kind("turn.stalled")) == 1


async def test_a_steady_stream_is_never_stalled(autojump_clock: trio.testing.MockClock) -> None:
    """A word just inside the limit, 200 times: the watchdog's deadline moves on each time."""
    async with fake_running(reply="w " * 200, word_delay=STALL * 0.99) as (session, _, rec):
        t0 = trio.current_time()
        await completes(session, rec, "hello")
        assert trio.current_time() - t0 == pytest.approx(200 * STALL * 0.99)
        assert rec.of_kind("turn.stalled") == []


async def test_the_silence_is_counted_from_the_last_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_running(reply=LONG, word_delay=9.0, silent_after=3) as (session, _, rec):
        t0 = trio.current_time()
        turn = await session.prompt("go")  # words at 0, 9 and 18, then nothing
        stall = await stalled(rec)
        assert trio.current_time() - t0 == 18 + STALL
        assert stall.silent_s == STALL
        assert (await ended(rec, turn.id)).reason == "stalled"


async def test_what_the_agent_said_by_the_deadline_is_read_before_it_is_judged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each word comes exactly ``stall_s`` after the last: its post and the watchdog's alarm
    wake in the same pass of the run loop, in either order (trio shuffles a pass), as on a
    loaded machine the alarm and a pump holding what the agent wrote in time do. What is in
    the inbox when the deadline is seen is read first: no turn is stalled."""
    async with running(AcpBehaviour(words=4, word_interval=STALL)) as (session, _, rec):
        for _ in range(8):
            await completes(session, rec, "hello")
            await completes(session, rec, "tool=3")  # the tool's start, too, comes at STALL
        assert rec.of_kind("turn.stalled") == []


async def test_a_tool_call_in_progress_is_not_a_stall(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without ``tool_stall_s`` a running tool may be silent for as long as it runs; once it
    is done, ``stall_s`` applies again, from its completion."""
    assert DEFAULT_TOOL_STALL_S is None
    async with fake_running(tool_s=100, silent_after=2, word_delay=0.5) as (session, _, rec):
        t0 = trio.current_time()
        # The tool from 0 to 100 (silent), w0 at 100, w1 at 100.5, then nothing.
        turn = await session.prompt("go")
        done = await rec.wait_kind("tool.update", tool_call_id="call_tool", status="completed")
        assert trio.current_time() - t0 == 100.0
        assert rec.of_kind("turn.stalled") == [] and session.state == "running"
        stall = await stalled(rec)
        assert trio.current_time() - t0 == 100.5 + STALL
        assert stall.seq > done.seq and stall.tool_calls == [] and stall.stall_s == STALL
        assert (await ended(rec, turn.id)).reason == "stalled"


async def test_tool_stall_s_stops_a_silent_tool_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A limit for tools shorter than ``stall_s``: the deadline moves earlier when it starts."""
    async with fake_running(tool_s=1000, tool_stall_s=5.0) as (session, _, rec):
        t0 = trio.current_time()
        turn = await session.prompt("go")  # the tool starts at once
        stall = await stalled(rec)
        assert trio.current_time() - t0 == 5.0
        assert (stall.stall_s, stall.silent_s, stall.tool_calls) == (5.0, 5.0, ["call_tool"])
        end = await ended(rec, turn.id)
        assert (end.outcome, end.reason) == ("cancelled", "stalled")


async def test_an_agent_flooding_stderr_while_silent_is_still_stalled(
    mock_clock: trio.testing.MockClock,
) -> None:
    """The actor is never idle (the inbox always holds the agent's stderr), so the deadline is
    read on the clock, not waited for. Virtual time runs at 100x real time here: the bounds
    allow for a busy machine."""
    mock_clock.rate = 100.0
    async with running() as (session, _, rec):
        t0 = trio.current_time()
        turn = await session.prompt("silent-after=1 flood")
        stall = await stalled(rec)
        assert STALL <= trio.current_time() - t0 < 3 * STALL
        assert STALL <= stall.silent_s < 3 * STALL
        assert len(rec.of_kind("agent.stderr")) > 100
        assert (await ended(rec, turn.id)).reason == "stalled"


async def test_a_pending_permission_is_not_a_stall(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The turn waits on a person: no limit, however long; the answer starts the count again."""
    async with fake_running(permission=True, silent_after=1) as (session, _, rec):
        turn = await session.prompt("go")
        request = await rec.wait_kind("permission.requested")
        assert isinstance(request, ev.PermissionRequested)
        await trio.sleep(100 * STALL)  # on virtual time: nobody answers for 1000 s
        assert rec.of_kind("turn.stalled") == [] and session.state == "running"
        await session.respond_permission(request.request_id, "allow")
        answered = trio.current_time()  # the agent says its first word at once, then nothing
        stall = await stalled(rec)
        assert trio.current_time() - answered == STALL
        end = await ended(rec, turn.id)
        assert (end.outcome, end.reason) == ("cancelled", "stalled")
        assert end.receipt is not None and "permissions_cancelled" not in end.receipt["escalation"]
        assert stall.silent_s == STALL


async def test_a_stalled_agent_that_ignores_the_interrupt_is_killed_and_resumed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_running(reply=[LONG, "done"], silent_after=1, on_cancel="ignore") as (
        session,
        agent,
        rec,
    ):
        t0 = trio.current_time()
        turn = await session.prompt("go")  # one word at 0, then nothing
        await stalled(rec)
        assert trio.current_time() - t0 == STALL
        end = await ended(rec, turn.id)
        assert trio.current_time() - t0 == STALL + GRACE
        assert (end.outcome, end.reason) == ("killed", "stalled")
        assert end.receipt is not None
        assert end.receipt["escalation"] == KILLED
        assert end.receipt["resumed"] is True and end.receipt["reason"] == "stalled"
        assert session.state == "ready" and agent.starts == 2
        assert agent.processes[1].resumed == session.agent_session_id
        await completes(session, rec, "again")
        assert agent.processes[1].prompts == ["again"]


async def test_prompts_queued_behind_a_stalled_turn_still_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The user queued them behind the turn and did not give up on it: the watchdog did."""
    async with fake_running(reply=[LONG, "done"], silent_after=1) as (session, _, rec):
        turn = await session.prompt("go")
        queued = await session.prompt("next")
        assert queued.queued
        end = await ended(rec, turn.id)
        assert end.reason == "stalled"
        assert end.receipt is not None and end.receipt["dropped_prompts"] == []
        after = await ended(rec, queued.id)
        assert (after.outcome, after.reason) == ("completed", None)


async def test_a_cancel_during_a_stall_cancel_joins_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Same receipt as the watchdog's cancel; a caller's cancel drops the queue, as ever."""
    async with fake_running(reply=[LONG, "done"], silent_after=1, on_cancel="ignore") as (
        session,
        _,
        rec,
    ):
        turn = await session.prompt("go")
        queued = await session.prompt("next")
        await stalled(rec)
        await trio.sleep(GRACE / 2)
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == GRACE / 2  # the grace left, no more
        end = await ended(rec, turn.id)
        assert end.receipt is not None
        assert end.receipt["reason"] == receipt.reason == "stalled"
        assert end.receipt["elapsed_ms"] == receipt.elapsed_ms == GRACE * 1000
        assert (receipt.turn_id, receipt.outcome) == (turn.id, "killed")
        assert [p.turn_id for p in receipt.dropped_prompts] == [queued.id]
        dropped = await ended(rec, queued.id)
        assert (dropped.stop_reason, dropped.reason) == ("dropped", "user")
        assert len(rec.of_kind("turn.stalled")) == 1


async def test_a_caller_cancel_says_user(autojump_clock: trio.testing.MockClock) -> None:
    async with fake_running(reply=LONG) as (session, _, rec):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        assert receipt.reason == "user" and (await ended(rec, turn.id)).reason == "user"
        mine = await session.prompt("hello")
        await rec.wait_for(lambda e: isinstance(e, ev.MessageDelta) and e.turn_id == mine.id)
        assert (await session.cancel(reason="deadline")).reason == "deadline"
        assert (await ended(rec, mine.id)).reason == "deadline"


async def test_a_subscriber_holding_the_agent_back_is_not_the_agent_s_silence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A full subscriber that asked for backpressure stops the actor reading the agent: the
    agent has things to say and blocks on its pipe. The watchdog does not count that time."""
    async with fake_running(reply="w " * 200, word_delay=0.01) as (session, _, rec):
        subscription = await session.open_subscription(max_buffer=16, stall_s=100 * STALL)
        try:
            turn = await session.prompt("hello")
            await trio.sleep(10 * STALL)  # the subscriber reads nothing for 100 s
            assert session.state == "running"
            outcome = None
            async for event in subscription:
                if isinstance(event, ev.TurnEnded) and event.turn_id == turn.id:
                    outcome = event.outcome
                    break
            assert outcome == "completed"
        finally:
            subscription.close()
        await ended(rec, turn.id)
        assert rec.of_kind("turn.stalled") == []


async def test_a_watchdog_left_off_never_stalls(autojump_clock: trio.testing.MockClock) -> None:
    async with fake_running(silent_after=1, stall_s=None) as (session, _, rec):
        turn = await session.prompt("go")
        await trio.sleep(2 * DEFAULT_STALL_S)
        assert session.state == "running" and rec.of_kind("turn.stalled") == []
        assert (await session.cancel()).reason == "user"
        assert (await ended(rec, turn.id)).outcome == "cancelled"


def test_the_stall_is_on_the_wire() -> None:
    stall = ev.TurnStalled(
        turn_id="t1", silent_s=300.0, stall_s=300.0, tool_calls=["c1"], session_id="s1", seq=7
    )
    assert ev.EVENT_TYPES["turn.stalled"] is ev.TurnStalled
    assert event_from_json(event_json(stall)) == stall
    end = ev.TurnEnded(turn_id="t1", outcome="killed", reason="stalled", session_id="s1", seq=8)
    assert event_from_json(event_json(end)) == end


# -- tier 3: the demo agent, a real process, on the real clock ----------------------------------

REAL_STALL = 0.5
BOUND = 30.0  # generous: a stuck test fails instead of hanging the suite
SHM = "/dev/shm"


@asynccontextmanager
async def demo_session(
    state_dir: str, stall_s: float = REAL_STALL
) -> AsyncIterator[tuple[Session, Recorder]]:
    """The demo agent with a watchdog of ``stall_s``, its state in memory where the host has
    a tmpfs. It saves its session between a turn's last word and its answer, and a save on
    a disk busy with writes took 0.6 s here (under ``dd``) and over 1.5 s in CI (a turn's
    three words came, then nothing until the watchdog stopped it): silence the watchdog
    rightly stops, and not what these tests are about."""
    with contextlib.ExitStack() as stack:
        if os.path.isdir(SHM) and os.access(SHM, os.W_OK):
            state_dir = stack.enter_context(tempfile.TemporaryDirectory(dir=SHM))
        async with _demo_session(state_dir, stall_s) as it:
            yield it


@asynccontextmanager
async def _demo_session(state_dir: str, stall_s: float) -> AsyncIterator[tuple[Session, Recorder]]:
    spec = AgentSpec.from_config("demo").with_args("--delay", "0.02", "--state-dir", state_dir)
    spec = spec.with_options(grace_s=1.0, kill_timeout_s=0.5, stall_s=stall_s)
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}) as sup:
            session = await sup.start_session("demo", cwd="/")
            async with record(session) as recorder:
                yield session, recorder
                recorder.check_invariants()


@pytest.mark.real_process
@pytest.mark.parametrize("ignores_cancel", [False, True], ids=["cooperative", "ignores-cancel"])
async def test_a_real_agent_gone_silent_is_stopped(tmp_path: object, ignores_cancel: bool) -> None:
    """The demo agent says three words, then nothing (logging to stderr every 0.1 s that it
    waits): cancelled at ``stall_s``, or killed a grace later and resumed; the next prompt
    works."""
    async with demo_session(str(tmp_path)) as (session, rec):
        turn = await session.prompt("hang ignore-cancel" if ignores_cancel else "hang")
        end = await ended(rec, turn.id)
        stall = await stalled(rec)
        [*_, last_word] = [e for e in rec.events if is_delta(e) and e.seq < stall.seq]
        waited = [
            e
            for e in rec.events
            if isinstance(e, ev.AgentStderr)
            and "waiting for the model" in e.line
            and last_word.seq < e.seq < stall.seq
        ]
        assert len(waited) >= 2, "stderr went on while the turn was silent"
        assert REAL_STALL <= stall.timestamp - last_word.timestamp < REAL_STALL + 5.0
        assert REAL_STALL <= stall.silent_s < REAL_STALL + 5.0
        assert end.reason == "stalled" and end.receipt is not None
        if ignores_cancel:
            assert end.outcome == "killed" and end.receipt["resumed"] is True
            assert end.receipt["escalation"][:3] == ["interrupt", "grace_expired", "sigterm"]
        else:
            assert (end.outcome, end.receipt["escalation"]) == ("cancelled", ["interrupt"])
        await completes(session, rec, "again words=3")


@pytest.mark.real_process
async def test_a_real_tool_call_longer_than_stall_s_is_spared(tmp_path: object) -> None:
    """Only the tool's silence is longer than ``stall_s``; its limit is wider than the other
    test's, for the turn's other silences on 2 loaded cores (its start, its end)."""
    stall_s = 1.5
    async with demo_session(str(tmp_path), stall_s=stall_s) as (session, rec):
        turn_at = time.time()
        turn = await session.prompt(f"tool={2 * stall_s} words=3")
        end = await ended(rec, turn.id)
        timeline = [(e.seq, e.kind, round(e.timestamp - turn_at, 3)) for e in rec.events]
        assert rec.of_kind("turn.stalled") == [] and end.outcome == "completed", timeline
        [call] = rec.of_kind("tool.call")
        [done] = [e for e in rec.events if isinstance(e, ev.ToolUpdate) and e.status == "completed"]
        # The tool ran 2 x stall_s; the events are stamped when the supervisor reads them, so
        # under load the call's stamp can be late by more than the completion's: 1.5 x is proof.
        assert done.timestamp - call.timestamp >= 1.5 * stall_s
