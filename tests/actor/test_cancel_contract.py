"""Tier 2: the cancel contract, each case run against every protocol, on virtual time.

What ``docs/stopping.md`` promises of a cancel (design: ``design/actor.md``, the cancel ladder),
stated once and checked on each protocol's in-memory agent (``supervisor.testing.FakeAgent``),
so every time is exact. Where a protocol legitimately differs (Amp's interrupt ends its process,
so every Amp cancel respawns it; what a respawn that cannot resume says), the difference is a
row of :data:`WIRES`, not a copy of the test. What only one protocol does (Codex's background
terminals and stale turn ids, Claude's lost results, OpenCode's leftover idles, Amp's exit) is
in that protocol's own file.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from fnmatch import fnmatch
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import helpers
from helpers import KILLED, KILLED_HARD, Recorder
from protocols import events as ev
from supervisor import BadRequest
from supervisor.supervisor import AnySession
from supervisor.testing import FakeAgent, FakeProcess
from supervisor.wire.codec import receipt_to_wire

GRACE = 2.0
#: A started agent's handshake takes this long: a respawn's is in its receipt.
START_DELAY = 0.25
KILL_TIMEOUT = 0.5
#: An answer that outlasts any case: 1000 words, 100 s.
LONG = "word " * 1000
#: The answer to the prompt after a cancel: it must come whole, and nothing before it.
NEXT = "one two"
#: Virtual seconds a case may take (LONG is 100 s); waiting longer is waiting for ever.
BOUND = 300.0
EXITED = ["interrupt", "respawned", "resumed"]  # the process ended during the cancel


# -- where the protocols differ ------------------------------------------------------------


@attrs.frozen
class Permission:
    """A protocol's permission request, and how a cancel answers it."""

    options: list[str]
    title: str
    #: the receipt's stop_reason when the agent ignores the interrupt: the answer ends the turn
    stop_reason: str
    #: what a message written to the agent answers to its request of this id (None: not one)
    answer: Callable[[dict[str, Any], str], object]
    #: that answer, when a cancel withdraws the request
    withdrawn: object


@attrs.frozen
class NotResumed:
    """How a respawned agent that cannot go on with its session says so."""

    #: what the session's state says
    said: str
    #: the new process was asked to resume, and refused (False: it said up front it cannot)
    asked: bool = True


@attrs.frozen
class Wire:
    """How one protocol takes what the contract does to it."""

    #: the stop_reason of a turn the agent stopped as asked, and of one it ended by itself
    cancelled: str
    completed: str
    #: the receipt's details of a stop (what the protocol did beyond the ladder)
    details: dict[str, str]
    #: its interrupt, as :func:`written` lists it
    interrupt: str
    #: the agent's session a started process was asked to go on with, as its wire says it
    resumed: Callable[[FakeProcess], object]
    #: the interrupt ends the process (Amp's SIGINT ends its run): every cancel respawns it
    cancel_respawns: bool = False
    #: a started process is ready once its handshake is answered, ``start_delay`` after its
    #: start; without one (Amp) it is ready as it starts, and no respawn time is in a receipt
    handshake: bool = True
    permission: Permission | None = None
    not_resumed: NotResumed | None = None


def param(method: str, key: str) -> Callable[[FakeProcess], object]:
    """The ``key`` param of the first ``method`` request a process received."""
    return lambda process: next(
        (m["params"][key] for m in process.received if m.get("method") == method), None
    )


def launched_with(process: FakeProcess) -> object:
    """What the process was started to go on with, on its command line."""
    return process.resumed


def opencode_resumed(process: FakeProcess) -> object:
    """``GET /session/{id}``: the new server is asked whether it still has the session."""
    asked = [
        m["http"]["path"] for m in process.received if m.get("http", {}).get("method") == "GET"
    ]
    return next((p.split("/")[2] for p in asked if p.count("/") == 2), None)


def jsonrpc_answer(message: dict[str, Any], request: str) -> object:
    if "method" in message or str(message.get("id")) != request:
        return None
    return message.get("result", message.get("error"))


def claude_answer(message: dict[str, Any], request: str) -> object:
    response = message.get("response", {}) if message.get("type") == "control_response" else {}
    return response.get("response") if response.get("request_id") == request else None


def opencode_answer(message: dict[str, Any], request: str) -> object:
    http = message.get("http", {})
    return http.get("json") if http.get("path") == f"/permission/{request}/reply" else None


WIRES: dict[str, Wire] = {
    "acp": Wire(
        cancelled="cancelled",
        completed="end_turn",
        details={},
        interrupt="session/cancel",
        resumed=param("session/load", "sessionId"),
        permission=Permission(
            options=["allow", "reject"],
            title="rm -rf build",
            stop_reason="cancelled",
            answer=jsonrpc_answer,
            withdrawn={"outcome": {"outcome": "cancelled"}},
        ),
        not_resumed=NotResumed("agent does not advertise loadSession", asked=False),
    ),
    "codex": Wire(
        cancelled="interrupted",
        completed="completed",
        details={"background_terminals": "cleaned"},
        interrupt="turn/interrupt",
        resumed=param("thread/resume", "threadId"),
        permission=Permission(
            options=["accept", "acceptForSession", "decline", "cancel"],
            title="rm -rf build",
            stop_reason="interrupted",
            answer=jsonrpc_answer,  # its requests count from 0, as ours do: separate spaces
            withdrawn={"decision": "cancel"},
        ),
        not_resumed=NotResumed("thread/resume failed: no rollout found for thread id"),
    ),
    "claude": Wire(
        cancelled="aborted_streaming",
        completed="completed",
        details={},
        interrupt="control_request interrupt",
        resumed=launched_with,  # --resume <id>
        permission=Permission(
            options=["allow", "deny"],
            title="Bash",
            stop_reason="aborted_tools",
            answer=claude_answer,
            withdrawn={
                "behavior": "deny",
                "message": "The user stopped the turn",
                "interrupt": True,
            },
        ),
        not_resumed=NotResumed("No conversation found with session ID: sess-1"),
    ),
    "opencode": Wire(
        cancelled="aborted",
        completed="stop",
        details={},
        interrupt="POST /session/*/abort",
        resumed=opencode_resumed,
        permission=Permission(
            options=["once", "always", "reject"],
            title="rm -rf build",
            stop_reason="permission_rejected",  # the server ignores the abort; the reject ends it
            answer=opencode_answer,
            withdrawn={"reply": "reject"},
        ),
        not_resumed=NotResumed("Session not found: ses_1"),
    ),
    "amp": Wire(
        cancelled="cancelled",
        completed="end_turn",
        details={},
        interrupt="SIGINT",
        resumed=launched_with,  # threads continue <id>
        cancel_respawns=True,
        handshake=False,
        # No permission: Amp's stream-json has no permission protocol. No not_resumed: Amp has
        # no handshake in which to refuse a thread, so its receipt says resumed and the exit of
        # the continued process then starts a fresh one (test_amp_session.py's lost thread).
    ),
}
PROTOCOLS = list(WIRES)
WITH_PERMISSIONS = [p for p in PROTOCOLS if WIRES[p].permission is not None]
REFUSING_RESUME = [p for p in PROTOCOLS if WIRES[p].not_resumed is not None]


# -- the cases' own tools ------------------------------------------------------------------


@asynccontextmanager
async def session_of(fake: FakeAgent) -> AsyncIterator[tuple[AnySession, Recorder]]:
    """A session of ``fake``, recorded; on the way out every event is in, the invariants kept
    (:func:`helpers.fake_session`). Bounded: a case waiting for what never comes fails."""
    with trio.fail_after(BOUND):
        async with helpers.fake_session(fake, catch_up=True) as (session, rec):
            yield session, rec


def agent(protocol: str, **options: Any) -> FakeAgent:
    options.setdefault("grace_s", GRACE)
    options.setdefault("kill_timeout_s", KILL_TIMEOUT)
    return FakeAgent(protocol, **options)


def interrupts(fake: FakeAgent) -> int:
    """How many interrupts reached the agent."""
    return sum(1 for item in written(fake) if fnmatch(item, WIRES[fake.protocol].interrupt))


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def turn_ends(rec: Recorder) -> list[ev.TurnEnded]:
    return [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]


def texts(rec: Recorder, turn_id: str | None = None) -> list[str]:
    """What the agent said (of one turn, or of all), delta by delta (Amp's echo of the
    user's own prompt is not the agent's)."""
    return [
        e.text
        for e in rec.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta)
        and e.role == "assistant"
        and (turn_id is None or e.turn_id == turn_id)
    ]


def shape(message: dict[str, Any]) -> str:
    """What kind of message the supervisor wrote to an agent, on any protocol's wire."""
    if "http" in message:
        return f"{message['http']['method']} {message['http']['path']}"
    if "method" in message:
        return str(message["method"])
    if message.get("type") == "control_request":
        return f"control_request {message['request']['subtype']}"
    return str(message.get("type", "<response>"))


def written(fake: FakeAgent) -> list[str]:
    """Every message the supervisor wrote to the agent, then every signal it sent it (Amp's
    interrupt): what, not when."""
    return [shape(m) for m in fake.received] + [
        signal.Signals(number).name for process in fake.processes for number in process.signals
    ]


async def next_prompt_completes(
    session: AnySession, rec: Recorder, fake: FakeAgent, *, context: bool = False
) -> None:
    """The next prompt goes to the newest process and ends with exactly its own words, and
    nothing else is said meanwhile (a resumed session's replayed history is not news). With
    ``context``, the agent's session is a fresh one: the prompt comes after the conversation
    so far."""
    await rec.catch_up()
    said = len(texts(rec))
    turn = await session.prompt("again")
    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
    await rec.catch_up()
    assert texts(rec)[said:] == texts(rec, turn.id) == ["one ", "two"]
    sent = fake.processes[-1].prompts[-1]
    if context:
        assert sent.startswith("The conversation so far") and "User: hello" in sent, sent
        assert sent.endswith("\n\nagain"), sent
    else:
        assert sent == "again"


# -- a cancel the agent obeys --------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("on_cancel, elapsed_ms", [("stop", 0.0), (0.05, 50.0), (1.5, 1500.0)])
async def test_a_cooperative_cancel_is_answered_when_the_agent_stops(
    protocol: str, on_cancel: str | float, elapsed_ms: float, autojump_clock: trio.testing.MockClock
) -> None:
    wire = WIRES[protocol]
    fake = agent(protocol, reply=[LONG, NEXT], on_cancel=on_cancel)
    async with session_of(fake) as (session, rec):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta, count=3)
        t0 = trio.current_time()
        receipt = await session.cancel(reason="user")
        assert trio.current_time() - t0 == pytest.approx(elapsed_ms / 1000)
        assert (receipt.outcome, receipt.turn_id, receipt.reason) == ("cancelled", turn.id, "user")
        assert receipt.escalation == (EXITED if wire.cancel_respawns else ["interrupt"])
        assert receipt.resumed is (True if wire.cancel_respawns else None)
        assert receipt.stop_reason == wire.cancelled
        assert receipt.elapsed_ms == elapsed_ms
        assert receipt.details == wire.details
        assert session.state == "ready"  # terminate-then-respond
        await rec.catch_up()
        [ended] = turn_ends(rec)
        assert (ended.outcome, ended.error) == ("cancelled", None)
        assert ended.receipt == receipt_to_wire(receipt)
        assert interrupts(fake) == 1
        assert (fake.starts, fake.kills) == (2 if wire.cancel_respawns else 1, 0)
        await next_prompt_completes(session, rec, fake)


# -- an agent that ignores it ----------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["sigterm", "sigkill"])
async def test_an_agent_ignoring_the_interrupt_is_killed_at_grace_and_resumed(
    protocol: str, ignores_sigterm: bool, autojump_clock: trio.testing.MockClock
) -> None:
    """Killed at exactly grace (+ ``kill_timeout_s`` if SIGTERM is ignored too) + the new
    process's handshake; the new process resumes the agent's session and takes the next
    prompt, its history not replayed as new events."""
    wire = WIRES[protocol]
    fake = agent(
        protocol,
        reply=[LONG, NEXT],
        on_cancel="ignore",
        ignores_sigterm=ignores_sigterm,
        start_delay=START_DELAY,
    )
    async with session_of(fake) as (session, rec):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta, count=2)
        agent_session = session.agent_session_id
        assert agent_session is not None
        t0 = trio.current_time()
        receipt = await session.cancel()
        expected = GRACE + (KILL_TIMEOUT if ignores_sigterm else 0.0)
        expected += START_DELAY if wire.handshake else 0.0
        assert trio.current_time() - t0 == pytest.approx(expected)
        assert receipt.elapsed_ms == round(expected * 1000, 3)
        assert (receipt.outcome, receipt.turn_id, receipt.stop_reason) == (
            "killed",
            turn.id,
            "killed",
        )
        assert receipt.escalation == (KILLED_HARD if ignores_sigterm else KILLED)
        assert receipt.resumed is True and session.state == "ready"
        first, second = fake.processes
        assert first.killed == (["sigterm", "sigkill"] if ignores_sigterm else ["sigterm"])
        assert wire.resumed(second) == agent_session
        assert interrupts(fake) == 1  # never repeated while the agent hung
        await rec.catch_up()
        assert [(e.turn_id, e.outcome) for e in turn_ends(rec)] == [(turn.id, "killed")]
        await next_prompt_completes(session, rec, fake)
        assert session.agent_session_id == agent_session
        assert rec.of_kind("error") == []


@pytest.mark.parametrize("protocol", REFUSING_RESUME)
async def test_a_respawn_that_cannot_resume_says_so_and_goes_on_fresh(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    wire = WIRES[protocol]
    assert wire.not_resumed is not None
    fake = agent(protocol, reply=[LONG, NEXT], on_cancel="ignore", resumes=False)
    async with session_of(fake) as (session, rec):
        await session.prompt("hello")
        await rec.wait_for(is_delta)
        agent_session = session.agent_session_id
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.resumed) == ("killed", False)
        assert receipt.escalation == ["interrupt", "grace_expired", "sigterm", "respawned"]
        assert "fresh session" in receipt.summary()
        assert session.state == "ready"
        asked = [wire.resumed(process) for process in fake.processes[1:]]
        assert (agent_session in asked) is wire.not_resumed.asked
        await rec.catch_up()
        said = [
            e.detail or "" for e in rec.of_kind("session.state") if isinstance(e, ev.SessionState)
        ]
        assert any(wire.not_resumed.said in line for line in said), said
        await next_prompt_completes(session, rec, fake, context=True)
        assert session.agent_session_id not in (None, agent_session)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_an_agent_crashing_on_the_interrupt_ends_the_turn_cancelled(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Its exit ends the turn; the receipt waits for the respawn (and its handshake)."""
    wire = WIRES[protocol]
    fake = agent(protocol, reply=[LONG, NEXT], on_cancel="crash", start_delay=START_DELAY)
    async with session_of(fake) as (session, rec):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta)
        agent_session = session.agent_session_id
        t0 = trio.current_time()
        receipt = await session.cancel()
        expected = START_DELAY if wire.handshake else 0.0
        assert trio.current_time() - t0 == pytest.approx(expected)
        assert receipt.elapsed_ms == expected * 1000
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id)
        assert (receipt.stop_reason, receipt.escalation) == ("agent_exited", EXITED)
        assert receipt.resumed is True and session.state == "ready"
        assert fake.kills == 0 and wire.resumed(fake.processes[1]) == agent_session
        await next_prompt_completes(session, rec, fake)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_crash_mid_turn_fails_the_turn_and_the_session_resumes(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    wire = WIRES[protocol]
    fake = agent(protocol, reply=["a b c d", NEXT], crash_after=2)
    async with session_of(fake) as (session, rec):
        turn = await session.prompt("hello")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed", ended
        assert ended.error is not None and "exit 3" in ended.error
        exited = [e for e in rec.of_kind("agent.exited") if isinstance(e, ev.AgentExited)]
        assert [(e.exit_code, e.expected) for e in exited] == [(3, False)]
        agent_session = session.agent_session_id
        await session.wait_ready()
        assert fake.starts == 2 and wire.resumed(fake.processes[1]) == agent_session
        await next_prompt_completes(session, rec, fake)


# -- permissions, queues, several cancels ----------------------------------------------------


@pytest.mark.parametrize("protocol", WITH_PERMISSIONS)
async def test_a_pending_permission_is_answered_cancelled_and_ends_the_turn_at_once(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    """The agent ignores the interrupt while it waits on the permission (as Gemini does): the
    answer, which goes out with the interrupt, is what ends the turn, at once."""
    permission = WIRES[protocol].permission
    assert permission is not None
    fake = agent(protocol, reply=[LONG, NEXT], permission=True, on_cancel="ignore")
    async with session_of(fake) as (session, rec):
        turn = await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        assert isinstance(requested, ev.PermissionRequested) and requested.turn_id == turn.id
        assert [o.option_id for o in requested.options] == permission.options
        assert requested.tool_call["title"] == permission.title
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() == t0
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", permission.stop_reason)
        assert receipt.escalation == ["interrupt", "permissions_cancelled"]
        assert receipt.details == WIRES[protocol].details
        assert session.state == "ready" and fake.kills == 0
        # The interrupt first, then the one answer to the request.
        sent = fake.processes[0].received
        answers = [(i, permission.answer(m, requested.request_id)) for i, m in enumerate(sent)]
        [(answered, answer)] = [(i, a) for i, a in answers if a is not None]
        assert answer == permission.withdrawn
        [interrupted] = [
            i for i, m in enumerate(sent) if fnmatch(shape(m), WIRES[protocol].interrupt)
        ]
        assert interrupted < answered, sent
        await rec.catch_up()
        [resolved] = rec.of_kind("permission.resolved")
        assert isinstance(resolved, ev.PermissionResolved)
        assert (resolved.request_id, resolved.outcome, resolved.by) == (
            requested.request_id,
            "cancelled",
            "supervisor",
        )
        assert resolved.seq < rec.of_kind("turn.ended")[0].seq
        again = await session.prompt("again")  # it asks again, and is let go on this time
        asked = await rec.wait_kind("permission.requested", count=2)
        assert isinstance(asked, ev.PermissionRequested) and asked.turn_id == again.id
        await session.respond_permission(asked.request_id, permission.options[0])
        done = await rec.wait_kind("turn.ended", turn_id=again.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        assert texts(rec, again.id) == ["one ", "two"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_concurrent_cancels_share_one_receipt_and_one_interrupt(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Three cancels at once write to the agent what one does, and get one receipt; a later
    cancel naming the turn gets it again, one naming none finds no turn."""
    one = agent(protocol, reply=LONG, on_cancel=0.2)
    async with session_of(one) as (session, rec):
        await session.prompt("hello")
        await rec.wait_for(is_delta)
        await session.cancel()
    fake = agent(protocol, reply=[LONG, NEXT], on_cancel=0.2)
    async with session_of(fake) as (session, rec):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta)
        receipts = []

        async def cancel() -> None:
            receipts.append(await session.cancel())

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(cancel)
        assert len(receipts) == 3 and receipts[0] == receipts[1] == receipts[2]
        assert (receipts[0].outcome, receipts[0].elapsed_ms) == ("cancelled", 200.0)
        assert interrupts(fake) == 1
        assert written(fake) == written(one)
        await rec.catch_up()
        assert len(rec.of_kind("turn.ended")) == 1
        assert await session.cancel(turn_id=turn.id) == receipts[0]
        assert (await session.cancel()).outcome == "no_active_turn"
        await next_prompt_completes(session, rec, fake)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_queued_prompts_are_dropped_and_listed(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    fake = agent(protocol, reply=[LONG, NEXT])
    async with session_of(fake) as (session, rec):
        first = await session.prompt("one")
        second = await session.prompt("two")
        third = await session.prompt("three")
        assert (first.queued, second.queued, third.queued) == (False, True, True)
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        assert [(d.turn_id, d.text) for d in receipt.dropped_prompts] == [
            (second.id, "two"),
            (third.id, "three"),
        ]
        assert session.state == "ready" and session.turn_id is None
        await rec.catch_up()
        ended = {e.turn_id: e for e in turn_ends(rec)}
        assert ended[first.id].outcome == "cancelled"
        assert [ended[t.id].stop_reason for t in (second, third)] == ["dropped", "dropped"]
        started = {e.turn_id for e in rec.of_kind("turn.started") if isinstance(e, ev.TurnStarted)}
        assert started == {first.id}
        assert fake.prompts == ["one"]
        await next_prompt_completes(session, rec, fake)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("on_cancel", ["stop", "ignore"])
async def test_a_prompt_sent_while_cancelling_runs_after_the_cancel(
    protocol: str, on_cancel: str, autojump_clock: trio.testing.MockClock
) -> None:
    """It is not dropped (it came after the cancel); it runs on the agent that is there once
    the cancel is done: the same one, or the respawned one."""
    fake = agent(protocol, reply=[LONG, NEXT], on_cancel=on_cancel)
    async with session_of(fake) as (session, rec):
        first = await session.prompt("one")
        await rec.wait_for(is_delta)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)
            await rec.wait_kind("session.state", state="cancelling")
            later = await session.prompt("again")
            assert later.queued
        ended = await rec.wait_kind("turn.ended", turn_id=later.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        assert texts(rec, later.id) == ["one ", "two"]
        stopped = await rec.wait_kind("turn.ended", turn_id=first.id)
        assert isinstance(stopped, ev.TurnEnded)
        assert stopped.outcome == ("killed" if on_cancel == "ignore" else "cancelled")
        assert fake.processes[-1].prompts == (["again"] if fake.starts > 1 else ["one", "again"])


# -- no turn, an ended turn ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_cancel_with_no_turn_answers_at_once_and_sends_nothing(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    fake = agent(protocol, reply=NEXT)
    async with session_of(fake) as (session, rec):
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() == t0
        assert (receipt.outcome, receipt.turn_id, receipt.escalation) == (
            "no_active_turn",
            None,
            [],
        )
        await next_prompt_completes(session, rec, fake)
        assert (await session.cancel()).outcome == "no_active_turn"  # the turn just ended
        assert interrupts(fake) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_cancel_naming_an_ended_turn_says_completed_and_touches_no_newer_one(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    """The honest answer to a Stop that raced the turn's end; a newer turn runs on."""
    wire = WIRES[protocol]
    fake = agent(protocol, reply=["w0 w1 w2 w3 w4", NEXT])
    async with session_of(fake) as (session, rec):
        first = await session.prompt("hello")
        ended = await rec.wait_kind("turn.ended", turn_id=first.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason, ended.receipt) == (
            "completed",
            wire.completed,
            None,
        )
        assert texts(rec, first.id) == ["w0 ", "w1 ", "w2 ", "w3 ", "w4"]
        assert session.state == "ready"
        receipt = await session.cancel(turn_id=first.id)
        assert (receipt.outcome, receipt.turn_id) == ("completed", first.id)
        assert (receipt.stop_reason, receipt.escalation) == (wire.completed, [])
        second = await session.prompt("again")
        await rec.wait_kind("turn.started", turn_id=second.id)
        again = await session.cancel(turn_id=first.id)
        assert (again.outcome, again.turn_id) == ("completed", first.id)
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        assert texts(rec, second.id) == ["one ", "two"]
        with pytest.raises(BadRequest):
            await session.cancel(turn_id="t99")
        assert interrupts(fake) == 0


# -- what every cancelled turn's events keep ------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("on_cancel", ["stop", 0.5, "ignore", "crash"])
async def test_turn_ended_is_in_the_subscription_before_the_receipt(
    protocol: str, on_cancel: str | float, autojump_clock: trio.testing.MockClock
) -> None:
    """By the time ``cancel()`` returns, the turn's ``turn.ended``, carrying that receipt, is
    already in a subscriber's buffer: a client acting on the receipt never sees the turn open."""
    fake = agent(protocol, reply=LONG, on_cancel=on_cancel)
    async with session_of(fake) as (session, rec):
        async with session.subscribe(max_buffer=100_000) as subscription:
            turn = await session.prompt("hello")
            await rec.wait_for(is_delta, count=2)
            receipt = await session.cancel()
            buffered = subscription.take(100_000)  # what is there now, without waiting
        ends = [e for e in buffered if isinstance(e, ev.TurnEnded) and e.turn_id == turn.id]
        assert [e.receipt for e in ends] == [receipt_to_wire(receipt)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_every_turn_ends_once_and_seq_is_contiguous(
    protocol: str, autojump_clock: trio.testing.MockClock
) -> None:
    """A history with every way a turn ends: by itself, killed, dropped from the queue, after
    the respawn, cancelled by name while queued, and a cancel of nothing."""
    fake = agent(protocol, reply=["a b", LONG, NEXT, LONG], on_cancel="ignore")
    async with session_of(fake) as (session, rec):
        turns = [await session.prompt("completes")]
        await rec.wait_kind("turn.ended", turn_id=turns[0].id)
        turns.append(await session.prompt("killed"))
        turns.append(await session.prompt("dropped"))
        await rec.wait_for(is_delta, count=3)
        await session.cancel()
        turns.append(await session.prompt("after the respawn"))
        await rec.wait_kind("turn.ended", turn_id=turns[-1].id)
        turns.append(await session.prompt("runs"))
        turns.append(await session.prompt("dropped by name"))
        await rec.wait_kind("turn.started", turn_id=turns[-2].id)
        assert (await session.cancel(turn_id=turns[-1].id)).outcome == "cancelled"
        await session.cancel()
        assert (await session.cancel()).outcome == "no_active_turn"
        await rec.catch_up()
        rec.check_invariants()
        ends = [(e.turn_id, e.outcome, e.stop_reason) for e in turn_ends(rec)]
        assert sorted(turn_id for turn_id, _, _ in ends) == sorted(t.id for t in turns)
        outcomes = {turn_id: (outcome, reason) for turn_id, outcome, reason in ends}
        assert [outcomes[t.id][0] for t in turns] == [
            "completed",
            "killed",
            "cancelled",
            "completed",
            "killed",
            "cancelled",
        ]
        assert outcomes[turns[2].id][1] == outcomes[turns[5].id][1] == "dropped"
