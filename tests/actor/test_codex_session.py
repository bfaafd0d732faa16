"""Tier 2: the session actor driving the Codex machine, on virtual time.

What is Codex's own, against an in-memory ``codex app-server`` (``supervisor/testing/_codex.py``),
with exact virtual times: the background-terminal clean a stop waits for, an interrupt held
until the turn is named or started, a stale turn id, approvals the server retracts, a failed
turn. What every protocol does when cancelled is the contract, ``test_cancel_contract.py``.
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
from supervisor.testing._codex import CodexBehaviour, CodexLauncher

GRACE = 2.0
CLEANED = {"background_terminals": "cleaned"}


def codex_spec() -> AgentSpec:
    return AgentSpec(name="codex", protocol="codex", command=["codex", "app-server"], grace_s=GRACE)


def running(
    behaviour: CodexBehaviour | None = None,
) -> AbstractAsyncContextManager[tuple[Session, CodexLauncher, Recorder]]:
    return helpers.running(CodexLauncher(behaviour), codex_spec())


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def interrupted_ids(launcher: CodexLauncher) -> list[str]:
    return [m["params"]["turnId"] for m in launcher.sent("turn/interrupt")]


async def test_turn_completes_with_one_turn_ended(autojump_clock: trio.testing.MockClock) -> None:
    async with running(CodexBehaviour(words=5, word_interval=0.1)) as (session, launcher, rec):
        turn = await session.prompt("hello")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason, ended.receipt) == ("completed", "completed", None)
        deltas = [e for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta)]
        assert [e.text for e in deltas] == [f"w{i} " for i in range(5)]
        assert all(e.turn_id == turn.id for e in deltas)
        assert launcher.sent_methods() == [
            "initialize",
            "initialized",
            "thread/start",
            "turn/start",
        ]
        assert session.state == "ready"


async def test_turn_end_waits_for_background_terminal_clean(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = CodexBehaviour(words=100, stop_delay=0.05, clean_delay=0.3)
    async with running(behaviour) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_for(is_delta)
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.35)
        await rec.catch_up()
        assert receipt.outcome == "cancelled" and receipt.details == CLEANED


async def test_cancel_before_turn_identified(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = CodexBehaviour(words=100, stop_delay=0.05, reply_delay=0.5)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        # The interrupt could only go out once the turn/start reply named the turn.
        assert trio.current_time() - t0 == pytest.approx(0.55)
        assert receipt.outcome == "cancelled" and receipt.stop_reason == "interrupted"
        assert len(launcher.sent("turn/interrupt")) == 1
        order = [
            ("reply" if "result" in m and "turn" in m["result"] else m.get("method"))
            for _, _, m in launcher.log
        ]
        assert order.index("reply") < order.index("turn/interrupt")


async def test_interrupt_before_turn_started_is_retried_at_turn_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = CodexBehaviour(words=100, stop_delay=0.05, started_delay=0.3)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(0.35)
        assert receipt.outcome == "cancelled" and receipt.escalation == ["interrupt"]
        # Rejected "no active turn to interrupt", then sent again when turn/started came.
        assert interrupted_ids(launcher) == ["turn_2", "turn_2"]
        assert len(rec.of_kind("message.delta")) <= 1  # what ran between turn/started and the stop


async def test_stale_turn_id_retried_once_against_the_running_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(CodexBehaviour(words=100, stop_delay=0.05, stale=True)) as (
        session,
        launcher,
        rec,
    ):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta, count=2)
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(0.05)
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id)
        assert interrupted_ids(launcher) == ["phantom_2", "turn_2"]
        assert receipt.details == CLEANED
        assert rec.of_kind("error") == []


async def test_cancel_retracts_approval_when_server_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = CodexBehaviour(words=100, stop_delay=0.0, permission=True)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_kind("permission.requested")
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled" and session.state == "ready"
        assert launcher.servers[0].answers == {}
        second = await session.prompt("again words=1")
        await rec.wait_kind("turn.ended", turn_id=second.id)


async def test_approval_accepted_by_client(autojump_clock: trio.testing.MockClock) -> None:
    async with running(CodexBehaviour(words=3, permission=True)) as (session, _, rec):
        turn = await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        assert isinstance(requested, ev.PermissionRequested)
        await session.respond_permission(requested.request_id, "accept")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        updates = [e for e in rec.of_kind("tool.update") if isinstance(e, ev.ToolUpdate)]
        assert [(u.tool_call_id, u.status) for u in updates] == [("call_1", "completed")]
        [resolved] = rec.of_kind("permission.resolved")
        assert isinstance(resolved, ev.PermissionResolved)
        assert (resolved.option_id, resolved.by) == ("accept", "client")


async def test_interrupt_overtaken_by_natural_completion_reports_completed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = CodexBehaviour(words=3, word_interval=0.1, stop_delay=1.0)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        await rec.catch_up()
        # The server finished by itself first: the receipt says so, and nothing is cleaned.
        assert receipt.outcome == "completed" and receipt.stop_reason == "completed"
        assert receipt.details == {}
        assert launcher.sent("thread/backgroundTerminals/clean") == []


async def test_failed_turn_is_failed_with_its_error(autojump_clock: trio.testing.MockClock) -> None:
    """``turn/completed`` ``failed``, after Codex's own ``error`` notification (the real order):
    the turn ends ``failed`` with the error, never ``completed``; the notification is an event of
    its own; the session goes on."""
    async with running(CodexBehaviour(words=2, word_interval=0.1)) as (session, _, rec):
        turn = await session.prompt("fail-turn")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason) == ("failed", "failed"), ended
        words = "We're currently experiencing high demand, which may cause temporary errors."
        assert ended.error == f"{words} (internalServerError)"
        second = await session.prompt("again")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        errors = [e for e in rec.of_kind("error") if isinstance(e, ev.ErrorEvent)]
        assert [(e.code, e.message) for e in errors] == [("agent_error", ended.error)]
