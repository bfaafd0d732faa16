"""Tier 2: the session actor driving the OpenCode machine, on virtual time.

What is OpenCode's own, against an in-memory ``opencode serve``
(``supervisor/testing/_opencode.py``, shapes from the real server), with exact virtual times:
the abort's answer is never the end, an abort is held until the turn runs, duplicate and
leftover idles end nothing (edge cases 24 and 28), a permission the abort dropped first, a
natural end that overtakes the abort, and a prompt whose error comes after its idle fails,
never completes. What every protocol does when cancelled is the contract,
``test_cancel_contract.py``.
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
from supervisor.testing._opencode import OpenCodeBehaviour, OpenCodeLauncher

GRACE = 2.0


def opencode_spec() -> AgentSpec:
    return AgentSpec(
        name="opencode", protocol="opencode", command=["opencode", "serve"], grace_s=GRACE
    )


def running(
    behaviour: OpenCodeBehaviour | None = None,
) -> AbstractAsyncContextManager[tuple[Session, OpenCodeLauncher, Recorder]]:
    return helpers.running(OpenCodeLauncher(behaviour), opencode_spec())


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def deltas(rec: Recorder, turn_id: str) -> list[str]:
    return [
        e.text
        for e in rec.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta) and e.turn_id == turn_id
    ]


def ended(rec: Recorder) -> list[tuple[str, str, str | None]]:
    return [
        (e.turn_id, e.outcome, e.stop_reason)
        for e in rec.of_kind("turn.ended")
        if isinstance(e, ev.TurnEnded)
    ]


async def test_turn_completes_with_one_turn_ended(autojump_clock: trio.testing.MockClock) -> None:
    async with running(OpenCodeBehaviour(words=5, word_interval=0.1)) as (session, launcher, rec):
        t0 = trio.current_time()
        turn = await session.prompt("hello")
        end = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(end, ev.TurnEnded)
        assert (end.outcome, end.stop_reason, end.receipt) == ("completed", "stop", None)
        assert trio.current_time() - t0 == pytest.approx(0.5)
        assert deltas(rec, turn.id) == [f"w{i} " for i in range(5)]
        assert [(r.method, r.path) for r in launcher.requests] == [
            ("POST", "/session"),
            ("POST", "/session/ses_1/prompt_async"),
        ]
        assert session.state == "ready"


async def test_cancel_before_busy_sends_the_abort_when_the_turn_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = OpenCodeBehaviour(words=100, stop_delay=0.05, busy_delay=0.5)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello")
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        # An abort before the loop runs would be a no-op and the prompt would run on.
        [abort] = launcher.sent("/abort")
        assert abort.at == pytest.approx(t0 + 0.5)
        assert trio.current_time() - t0 == pytest.approx(0.55)
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "aborted")
        assert deltas(rec, turn.id) == ["w0 "]  # what ran between busy and the stop


async def test_duplicate_idles_end_each_turn_once(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = OpenCodeBehaviour(words=3, word_interval=0.1, duplicate_idles=True)
    async with running(behaviour) as (session, _, rec):
        first = await session.prompt("one")
        second = await session.prompt("two busy-delay=0.2")
        assert second.queued
        await rec.wait_kind("turn.ended", turn_id=second.id)
        await rec.catch_up()
        assert ended(rec) == [(first.id, "completed", "stop"), (second.id, "completed", "stop")]
        assert deltas(rec, second.id) == ["w0 ", "w1 ", "w2 "]


async def test_leftover_idle_of_an_abort_does_not_end_the_next_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Edge case 28: the abort's second idle pair arrives after the next prompt went out and
    before that turn runs; ending the new turn there would lose all of it."""
    behaviour = OpenCodeBehaviour(words=100, stop_delay=0.0, second_idle=0.05)
    async with running(behaviour) as (session, launcher, rec):
        first = await session.prompt("one")
        await rec.wait_for(is_delta, count=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)
            await rec.wait_kind("session.state", state="cancelling")
            second = await session.prompt("two words=4 busy-delay=0.1")
            assert second.queued
        t1 = trio.current_time()  # the first turn ended and the second prompt went out
        end = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(end, ev.TurnEnded) and end.outcome == "completed"
        assert trio.current_time() - t1 == pytest.approx(0.1 + 4 * 0.1)
        assert deltas(rec, second.id) == ["w0 ", "w1 ", "w2 ", "w3 "]
        assert ended(rec) == [(first.id, "cancelled", "aborted"), (second.id, "completed", "stop")]
        [prompt] = launcher.sent("/prompt_async")[1:]
        assert prompt.at == t1  # the leftover pair (at t1 + 0.05) came after it


async def test_pending_permission_dropped_by_the_abort_first_is_no_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The abort and the ``reject`` go out together; when the abort has dropped the request
    first, the reject finds it gone (404). The turn ends ``aborted``, the request was resolved
    once on our side, and the 404 of our own withdrawal is no error event."""
    behaviour = OpenCodeBehaviour(words=100, stop_delay=0.0, permission=True, abort_first=True)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        assert isinstance(requested, ev.PermissionRequested) and requested.turn_id == turn.id
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "aborted"), receipt
        assert receipt.escalation == ["interrupt", "permissions_cancelled"]
        second = await session.prompt("again words=1")
        await rec.wait_kind("turn.ended", turn_id=second.id)
        assert launcher.replies_gone == [requested.request_id]
        resolved = [
            e for e in rec.of_kind("permission.resolved") if isinstance(e, ev.PermissionResolved)
        ]
        assert [(e.outcome, e.by) for e in resolved] == [("cancelled", "supervisor")]
        assert rec.of_kind("error") == []


async def test_permission_answered_once_by_a_person(autojump_clock: trio.testing.MockClock) -> None:
    async with running(OpenCodeBehaviour(words=3, permission=True)) as (session, launcher, rec):
        turn = await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        assert isinstance(requested, ev.PermissionRequested)
        await session.respond_permission(requested.request_id, "once")
        end = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(end, ev.TurnEnded) and end.outcome == "completed"
        [resolved] = rec.of_kind("permission.resolved")
        assert isinstance(resolved, ev.PermissionResolved)
        assert (resolved.option_id, resolved.by) == ("once", "client")
        updates = [e for e in rec.of_kind("tool.update") if isinstance(e, ev.ToolUpdate)]
        assert [u.status for u in updates] == ["completed"]
        assert [r.json for r in launcher.sent("/reply")] == [{"reply": "once"}]


async def test_natural_end_overtaking_the_abort_reports_completed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = OpenCodeBehaviour(words=3, word_interval=0.1, stop_delay=1.0)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        await rec.catch_up()
        # It finished by itself first ("stop"): the receipt says so.
        assert (receipt.outcome, receipt.stop_reason) == ("completed", "stop")
        second = await session.prompt("again words=2")
        await rec.wait_kind("turn.ended", turn_id=second.id)
        # The abort reached an idle server (its idle pair is a leftover): it ended nothing.
        assert len(launcher.sent("/abort")) == 1
        assert deltas(rec, second.id) == ["w0 ", "w1 "]
        assert ended(rec)[0] == (turn.id, "completed", "stop")


async def test_error_after_the_idle_fails_the_turn(autojump_clock: trio.testing.MockClock) -> None:
    """The review's case: a prompt that fails inside OpenCode goes busy and idle, and only then
    comes its ``session.error``. The idle alone cannot say how the turn ended, so the machine asks
    ``GET /session/status``; the turn ends ``failed`` with the error, never ``completed``, and the
    session takes the next prompt."""
    async with running(OpenCodeBehaviour(words=2)) as (session, launcher, rec):
        turn = await session.prompt("fail-late")
        end = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(end, ev.TurnEnded)
        assert (end.outcome, end.stop_reason) == ("failed", "error")
        assert end.error == "UnknownError: Error: All fibers interrupted without error"
        assert launcher.sent("/session/status") != []
        second = await session.prompt("again")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        await rec.catch_up()
        assert rec.of_kind("error") == []  # the error was the turn's, not a stray one
        assert ended(rec) == [(turn.id, "failed", "error"), (second.id, "completed", "stop")]


async def test_error_after_the_idle_of_a_cancelled_turn_is_never_completed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancel while the machine asks whether the failed loop still runs: the abort goes out,
    and the receipt names the error instead of a clean end."""
    async with running(OpenCodeBehaviour(words=2, busy_delay=0.1)) as (session, launcher, rec):
        turn = await session.prompt("fail-late")
        await rec.wait_kind("session.state", state="running")
        receipt = await session.cancel()
        await rec.catch_up()
        assert (receipt.turn_id, receipt.outcome, receipt.stop_reason) == (
            turn.id,
            "cancelled",
            "error",
        )
        [end] = [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]
        assert end.outcome != "completed" and end.error is not None
        assert "UnknownError" in end.error
        assert len(launcher.sent("/abort")) == 1


async def test_leftover_idle_after_busy_is_asked_about_and_ends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Edge case 28, the harder order: the abort's second idle pair overtakes the next turn's
    ``busy``. The new turn's reply is open with no error, which the stream alone cannot tell from
    a failed loop; the server says the loop runs, so the turn goes on to its own end."""
    behaviour = OpenCodeBehaviour(words=100, stop_delay=0.0, second_idle=0.15)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("one")
        await rec.wait_for(is_delta, count=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)
            await rec.wait_kind("session.state", state="cancelling")
            second = await session.prompt("two words=4 busy-delay=0.1")
        t1 = trio.current_time()  # the first turn ended and the second prompt went out
        end = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(end, ev.TurnEnded) and (end.outcome, end.stop_reason) == (
            "completed",
            "stop",
        )
        assert trio.current_time() - t1 == pytest.approx(0.1 + 4 * 0.1)
        assert deltas(rec, second.id) == ["w0 ", "w1 ", "w2 ", "w3 "]
        checks = launcher.sent("/session/status")
        assert checks and all(c.at == pytest.approx(t1 + 0.15) for c in checks)
