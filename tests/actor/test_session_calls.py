"""Tier 2: a call that finds the session's actor parked is handled in its caller's step.

The actor parks between two pieces of work: waiting for its inbox, for its share of the
ingest allowance, or for a full subscriber's room. A call then runs the actor's own handler at
once, in the caller's task, so a cancel's interrupt goes out in the step that asked for it.
What must not change: the answers, their order, and every deadline the call sets.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio
import trio.testing

import helpers
from helpers import Recorder
from supervisor import AgentNotRunning, AgentSpec, BadRequest, Session, open_supervisor
from supervisor.agents.link import AgentLines
from supervisor.core.turns import EndedTurns
from supervisor.supervisor import Supervisor
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.testing._memory import MemoryLink

GRACE = 2.0


def running(
    behaviour: AcpBehaviour,
) -> AbstractAsyncContextManager[tuple[Session, AcpLauncher, Recorder]]:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=GRACE)
    return helpers.running(AcpLauncher(behaviour), spec)


def record_senders(link: MemoryLink) -> list[tuple[str, trio.lowlevel.Task]]:
    """Each message the session sends from now on, with the task that sent it."""
    senders: list[tuple[str, trio.lowlevel.Task]] = []
    send = link.send

    def recording(message: dict[str, Any]) -> None:
        senders.append((message.get("method", ""), trio.lowlevel.current_task()))
        send(message)

    link.send = recording  # type: ignore[method-assign]
    return senders


async def test_a_cancel_to_a_quiet_turn_goes_out_in_the_callers_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(silent_after=1)) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        await trio.testing.wait_all_tasks_blocked()  # the actor waits for its inbox
        senders = record_senders(launcher.links[-1])
        receipt = await session.cancel()
        assert senders[0] == ("session/cancel", trio.lowlevel.current_task())
        assert receipt.outcome == "cancelled" and receipt.escalation == ["interrupt"]
        assert session.state == "ready"
        await rec.catch_up()


async def test_a_cancels_interrupt_is_written_as_its_callers_last_act(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Everything the caller's step records (the state, the subscribers' event) is done before
    the interrupt reaches the agent, and the write is still the caller's: the kernel runs a
    woken pipe reader on its writer's core once the writer sleeps, so nothing may follow it."""
    async with running(AcpBehaviour(silent_after=1)) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        async with session.subscribe() as events:
            await trio.testing.wait_all_tasks_blocked()  # the actor waits for its inbox
            link = launcher.links[-1]
            written: list[tuple[str, int, trio.lowlevel.Task]] = []
            deliver = link.deliver

            def watching(message: dict[str, Any]) -> None:
                if message.get("method") == "session/cancel":
                    written.append((session.state, events.pending, trio.lowlevel.current_task()))
                deliver(message)

            link.deliver = watching  # type: ignore[method-assign]
            receipt = await session.cancel()
            assert written == [("cancelling", 1, trio.lowlevel.current_task())]
            assert [e.kind for e in events.take(10)][:1] == ["session.state"]
        assert receipt.outcome == "cancelled"
        assert link.held is None  # released: nothing is left held after the step
        await rec.catch_up()


async def test_a_send_that_fails_while_writes_are_held_still_fails_the_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Held writes change when a message is written, not whether sending it can fail: a
    prompt the link refuses is refused in the caller's step, and no turn is announced (the
    agent is then recycled: ``test_session_recycle.py``)."""
    async with running(AcpBehaviour(silent_after=1)) as (session, launcher, rec):
        await trio.testing.wait_all_tasks_blocked()
        link = launcher.links[-1]
        send = link.send

        def refusing(message: dict[str, Any]) -> None:
            if message.get("method") == "session/prompt":
                raise RuntimeError("cannot encode the prompt")
            send(message)

        link.send = refusing  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="cannot encode"):
            await session.prompt("hello")
        assert link.held is None
        await rec.catch_up()
        assert not rec.of_kind("turn.started")
        await session.wait_ready()  # recycled: the machine had been told of the prompt
        assert session.state == "ready"


async def test_a_cancel_the_agent_ignores_still_escalates_at_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Handled in the caller's step, the cancel's grace deadline is armed all the same."""
    async with running(AcpBehaviour(silent_after=1, stop_delay=None)) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        await trio.testing.wait_all_tasks_blocked()
        senders = record_senders(launcher.links[-1])
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert senders[0] == ("session/cancel", trio.lowlevel.current_task())
        assert receipt.outcome == "killed"
        assert receipt.escalation[:2] == ["interrupt", "grace_expired"]
        assert receipt.elapsed_ms == pytest.approx(GRACE * 1000)
        assert trio.current_time() - t0 == pytest.approx(GRACE)
        assert session.state == "ready"
        await rec.catch_up()


async def test_a_cancel_to_a_flooding_session_goes_out_in_the_callers_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A flooding session's actor waits for its share of agent output: the cancel does not."""
    async with running(AcpBehaviour(words=20_000, flood=True, stop_delay=0.05)) as (
        session,
        launcher,
        rec,
    ):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        senders = record_senders(launcher.links[-1])
        receipt = await session.cancel()
        assert senders[0] == ("session/cancel", trio.lowlevel.current_task())
        assert receipt.outcome == "cancelled"
        assert session.state == "ready"
        await rec.catch_up()


async def test_calls_handled_at_once_one_after_another_keep_their_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two prompts from two tasks, each handled at once in its own caller's step (the actor
    stays parked between them), then a cancel: the first prompt starts, the second queues, and
    the cancel drops the queued one and stops the first, as if each had gone by the mailbox."""
    async with running(AcpBehaviour(silent_after=1)) as (session, launcher, rec):
        await session.prompt("warm up")
        await rec.wait_kind("message.delta")
        await session.cancel()
        await trio.testing.wait_all_tasks_blocked()
        senders = record_senders(launcher.links[-1])
        handles: list[Any] = []
        callers: list[trio.lowlevel.Task] = []

        async def prompt(text: str) -> None:
            callers.append(trio.lowlevel.current_task())
            handles.append(await session.prompt(text))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(prompt, "first")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(prompt, "second")
        first, second = handles
        assert (first.queued, second.queued) == (False, True)
        assert senders == [("session/prompt", callers[0])]  # sent in the first caller's step
        receipt = await session.cancel()
        assert receipt.turn_id == first.id
        assert [d.turn_id for d in receipt.dropped_prompts] == [second.id]
        assert session.state == "ready"
        await rec.catch_up()


async def test_a_subscription_made_at_once_sees_what_follows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(words=3)) as (session, _, rec):
        await trio.testing.wait_all_tasks_blocked()
        async with session.subscribe() as events:
            turn = await session.prompt("hello")
            kinds = []
            async for event in events:
                kinds.append(event.kind)
                if event.kind == "turn.ended":
                    break
        assert "turn.started" in kinds and kinds.count("message.delta") == 3
        assert getattr(event, "turn_id", None) == turn.id
        await rec.catch_up()


async def test_an_error_in_the_pumps_step_is_raised_in_the_actor(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug met while handling a cancel's answer in the pump's step crashes the session, as
    it would have in the actor's own step (its callers answered, logged once), never the pump
    or the supervisor around it. Here it strikes after the turn was taken off the session and
    before its receipt was given: the cancel is answered all the same."""
    launcher = AcpLauncher(AcpBehaviour(silent_after=1))
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=GRACE)
    async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
        session = await _crash_on_a_cancel(sup, monkeypatch)
        assert session.state == "failed"
        other = await sup.start_session("fake", cwd="/")  # the supervisor goes on
        monkeypatch.undo()
        await other.prompt("hello")
        assert (await other.cancel()).outcome == "cancelled"
    _assert_crashed_once(caplog, session)


async def _crash_on_a_cancel(sup: Supervisor, monkeypatch: pytest.MonkeyPatch) -> Session:
    """A session of ``fake`` whose cancel meets a bug in the pump's step, after the turn was
    taken off the session and before its receipt was given; the cancel is answered all the
    same (not left waiting for a receipt never made)."""

    def broken(self: EndedTurns, turn_id: str, receipt: Any) -> None:
        raise RuntimeError("boom while ending the turn")

    session = await sup.start_session("fake", cwd="/")
    async with session.subscribe() as events:
        await session.prompt("hello")
        async for event in events:
            if event.kind == "message.delta":
                break
    await trio.testing.wait_all_tasks_blocked()
    monkeypatch.setattr(EndedTurns, "remember", broken)
    with pytest.raises(AgentNotRunning, match="failed: the session crashed"):
        await session.cancel()
    return session


def _assert_crashed_once(caplog: pytest.LogCaptureFixture, session: Session) -> None:
    assert [r.message for r in caplog.records if "crashed" in r.message] == [
        f"session {session.id} crashed"
    ]
    assert "boom while ending the turn" in caplog.text


async def test_one_line_of_output_taken_at_once_is_what_a_batch_makes_of_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Urgent output of one line is decoded and fed to the machine in the pump's own step,
    not made a batch first: a bad line is the same ``error`` event, a message the same
    machine output, and the session has handled each before the offer returns."""
    async with running(AcpBehaviour(silent_after=1, stop_delay=None)) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)  # ignored: cancelling until the grace ends
            await rec.wait_kind("session.state", state="cancelling")
            await trio.testing.wait_all_tasks_blocked()  # the actor waits for its inbox
            link = launcher.links[-1]
            assert link.take_now is not None
            before = session.last_seq
            bad = AgentLines(link.generation, [b"{not json"])
            assert link.take_now(bad)
            assert session.last_seq == before + 1  # handled there and then
            stray = {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": "not-this-session", "update": {"sessionUpdate": "x"}},
            }
            await trio.testing.wait_all_tasks_blocked()
            assert link.take_now(AgentLines(link.generation, [json.dumps(stray).encode()]))
            assert session.last_seq == before + 2
            await rec.catch_up()
            error, unparsed = rec.events[-2:]
            assert error.kind == "error" and getattr(error, "code", "").startswith("agent_")
            assert unparsed.kind == "agent.unparsed" and getattr(unparsed, "raw", None) == stray
            # Handed something it has not seen, the actor comes first: the offer is declined
            # (posted after it, the line is handled after it, in order).
            await trio.testing.wait_all_tasks_blocked()
            link.inbox.send_nowait(AgentLines(link.generation, [b"{first"]))
            assert not link.take_now(AgentLines(link.generation, [b"{second"]))
            link.inbox.send_nowait(AgentLines(link.generation, [b"{second"]))
            await trio.testing.wait_all_tasks_blocked()
            await rec.catch_up()
            excerpts = [getattr(e, "message", "") for e in rec.events[-2:]]
            assert "{first" in excerpts[0] and "{second" in excerpts[1]
            assert link.take_now(AgentLines(link.generation, [b"{third"]))  # seen: at once again
            assert session.state == "cancelling"
    assert rec.of_kind("turn.ended")


@pytest.mark.parametrize(
    "options",
    [
        {"since_seq": "3"},
        {"since_seq": 2.5},
        {"since_seq": -1},
        {"since_seq": True},
        {"max_buffer": 0},
        {"max_buffer": "10"},
        {"stall_s": 0},
        {"stall_s": "1"},
        {"stall_s": math.inf},
    ],
)
async def test_a_subscription_asked_for_wrongly_is_told_so(
    autojump_clock: trio.testing.MockClock, options: dict[str, Any]
) -> None:
    async with running(AcpBehaviour(words=3)) as (session, _, _rec):
        with pytest.raises(BadRequest, match=next(iter(options))):
            await session.open_subscription(**options)
        async with session.subscribe(since_seq=0):  # the session is fine
            pass


@pytest.mark.parametrize("request_id", [None, 5, b"1000"])
async def test_a_permission_answer_for_a_request_id_not_a_string_is_told_so(
    autojump_clock: trio.testing.MockClock, request_id: Any
) -> None:
    async with running(AcpBehaviour(words=3)) as (session, _, _rec):
        with pytest.raises(BadRequest, match="request_id must be a string"):
            await session.respond_permission(request_id, "allow")


async def test_a_subscription_from_beyond_the_newest_event_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A seq this session never reached comes from another session's stream (local ids
    start again at s1 after a restart): refused, not answered with a silent stream."""
    async with running(AcpBehaviour(words=3)) as (session, _, rec):
        await rec.catch_up()
        head = session.last_seq
        with pytest.raises(BadRequest, match="beyond"):
            await session.open_subscription(since_seq=head + 1)
        async with session.subscribe(since_seq=head) as subscription:  # up to date: fine
            assert not subscription.gap


async def test_a_crash_still_being_cleaned_up_when_the_supervisor_closes_is_only_logged(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The crashed actor kills its agent in a shielded finally; the supervisor closed
    meanwhile cancels it, so the crash comes out with that Cancelled, in a group that is not
    an ``Exception``. It was raised out of ``open_supervisor`` to its caller: it is logged,
    as any crash, and the supervisor closes cleanly."""
    # Its kill takes a while: the supervisor closes while the crashed actor waits for it.
    launcher = AcpLauncher(AcpBehaviour(silent_after=1, kill_time=5.0, close_time=5.0))
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=GRACE)
    async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
        session = await _crash_on_a_cancel(sup, monkeypatch)
    _assert_crashed_once(caplog, session)
