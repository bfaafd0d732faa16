"""Tier 2: the session actor driving Claude Code's stream-json protocol, on virtual time.

What is Claude Code's own, against an in-memory CLI (``supervisor/testing/_claude.py``): its
command line and ``--resume``, an interrupt acknowledged that proves nothing (the ``result``
alone ends a turn), a resume the CLI refuses by exiting, an interrupt lost before
``system/init``, permissions withdrawn by the CLI or denied with ``interrupt``, background
results, API errors. What every protocol does when cancelled is the contract,
``test_cancel_contract.py``. Kills and respawns take no virtual time here.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
import trio
import trio.testing

import helpers
from helpers import KILLED, Recorder
from protocols import events as ev
from protocols.claude import CLAUDE_COMMAND
from supervisor import AgentNotRunning, AgentSpec, BadRequest, Session, open_supervisor
from supervisor.testing._claude import ClaudeBehaviour, ClaudeLauncher

GRACE = 2.0


def claude_spec(**changes: object) -> AgentSpec:
    spec = AgentSpec(name="claude", protocol="claude", command=CLAUDE_COMMAND, grace_s=GRACE)
    return spec.with_options(**changes) if changes else spec


def running(
    behaviour: ClaudeBehaviour | None = None, **spec_changes: object
) -> AbstractAsyncContextManager[tuple[Session, ClaudeLauncher, Recorder]]:
    launcher = ClaudeLauncher(behaviour)
    return helpers.running(launcher, claude_spec(**spec_changes), catch_up=True)


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def interrupts(launcher: ClaudeLauncher) -> int:
    return launcher.sent_subtypes().count("interrupt")


async def test_turn_completes_with_one_turn_ended(autojump_clock: trio.testing.MockClock) -> None:
    async with running(ClaudeBehaviour(words=5, word_interval=0.1)) as (session, launcher, rec):
        assert launcher.sent_subtypes() == ["initialize"]
        turn = await session.prompt("hello")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason, ended.receipt) == ("completed", "completed", None)
        # Streamed deltas only: the whole assistant message is not repeated.
        assert [e.text for e in rec.of_kind("message.delta")] == [f"w{i} " for i in range(5)]
        assert session.state == "ready"
        assert launcher.argvs == [list(CLAUDE_COMMAND)]


async def test_lost_result_is_killed_at_grace_and_resumed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The CLI acknowledges the interrupt and stops, but never writes the ``result``: only the
    result ends a turn, so the grace runs out, and the CLI is killed and started again with
    ``--resume``."""
    mode = "lost-result"
    async with running(ClaudeBehaviour(words=1000)) as (session, launcher, rec):
        turn = await session.prompt(f"hello {mode}")
        await rec.wait_for(is_delta, count=2)
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(GRACE)
        assert (receipt.outcome, receipt.escalation) == ("killed", KILLED)
        assert receipt.resumed is True
        assert receipt.elapsed_ms == pytest.approx(GRACE * 1000)
        assert session.state == "ready"
        # The interrupt was acknowledged, which proves nothing: only the result ends a turn.
        acks = [
            m
            for kind, gen, m in launcher.log
            if kind == "from_agent"
            and gen == 1
            and m.get("type") == "control_response"
            and m["response"].get("response") == {"still_queued": []}
        ]
        assert len(acks) == 1
        # The new CLI was started with --resume and the id the first one gave in system/init.
        first_id = launcher.clis[0].session_id
        assert first_id is not None
        assert launcher.resumes == [None, first_id]
        assert launcher.argvs[1] == [*CLAUDE_COMMAND, "--resume", first_id]
        ended = [
            (e.turn_id, e.outcome) for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)
        ]
        assert ended == [(turn.id, "killed")]
        # The resumed CLI continues the same conversation and takes the next prompt.
        second = await session.prompt("again words=2 interval=0.01")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        assert launcher.clis[1].session_id == first_id
        assert launcher.store.sessions[first_id] == [f"hello {mode}", "again words=2 interval=0.01"]
        assert not [
            e
            for e in rec.of_kind("error")
            if isinstance(e, ev.ErrorEvent) and e.code == "resume_mismatch"
        ]


async def test_kill_before_the_cli_named_its_session_starts_fresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No system/init yet, so nothing to resume: a fresh CLI, and the receipt says so (None)."""
    behaviour = ClaudeBehaviour(words=1000, init_delay=1000.0)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        receipt = await session.cancel()
        assert receipt.outcome == "killed"
        assert receipt.resumed is False  # nothing to resume: a fresh session, said so
        assert receipt.escalation == ["interrupt", "grace_expired", "sigterm", "respawned"]
        assert launcher.resumes == [None, None]
        assert session.state == "ready"


async def test_resume_refused_is_an_exit_at_start_and_the_cli_starts_afresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The CLI lost the conversation: it refuses --resume before answering initialize.

    The machine reports StartFailed(resume_failed=True); the actor starts the CLI once more,
    without --resume: three CLIs in all, and an error event says why. (The receipt and the
    fresh session are the contract's, ``test_cancel_contract.py``.)
    """
    behaviour = ClaudeBehaviour(words=1000, stop_delay=None, resumes=False)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        await rec.catch_up()
        assert (receipt.outcome, receipt.resumed) == ("killed", False)
        [refused] = [
            e
            for e in rec.of_kind("error")
            if isinstance(e, ev.ErrorEvent) and e.code == "resume_failed"
        ]
        assert "No conversation found with session ID: sess-1" in refused.message
        # the killed CLI, the refused resume, the fresh one
        assert launcher.resumes == [None, "sess-1", None]


async def test_deny_with_interrupt_stops_a_cli_that_ignores_interrupts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The deny part of a cancel ends the turn by itself when the interrupt is not heard."""
    behaviour = ClaudeBehaviour(words=100, stop_delay=0.0, permission=True, deaf=True)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_kind("permission.requested")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() == t0
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "aborted_tools")
        assert launcher.clis[0].late_answers == []


async def test_permission_answered_by_client(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = ClaudeBehaviour(words=3, permission=True)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        assert isinstance(requested, ev.PermissionRequested)
        with pytest.raises(BadRequest):
            await session.respond_permission(requested.request_id, "maybe")
        await session.respond_permission(requested.request_id, "allow")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        updates = [e for e in rec.of_kind("tool.update") if isinstance(e, ev.ToolUpdate)]
        assert [u.status for u in updates] == ["completed"]
        with pytest.raises(BadRequest):
            await session.respond_permission(requested.request_id, "allow")


async def test_permission_withdrawn_by_the_cli(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = ClaudeBehaviour(words=3, permission=True, withdraw_after=0.5)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        resolved = await rec.wait_kind("permission.resolved")
        assert isinstance(requested, ev.PermissionRequested)
        assert isinstance(resolved, ev.PermissionResolved)
        assert (resolved.request_id, resolved.outcome, resolved.by) == (
            requested.request_id,
            "cancelled",
            "agent",
        )
        with pytest.raises(BadRequest):  # a dead prompt cannot be answered (edge case 18)
            await session.respond_permission(requested.request_id, "allow")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        assert launcher.clis[0].late_answers == []


async def test_interrupt_lost_before_init_is_sent_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Edge case 16: a CLI that drops an interrupt arriving before system/init still stops."""
    behaviour = ClaudeBehaviour(
        words=100, stop_delay=0.05, drop_early_interrupt=True, init_delay=0.3
    )
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.35)
        assert receipt.outcome == "cancelled"
        assert receipt.details == {"interrupt_resent": True}
        assert interrupts(launcher) == 2
        assert launcher.clis[0].dropped_interrupts == 1


async def test_exactly_one_turn_end_with_background_results(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(ClaudeBehaviour(words=2, word_interval=0.01)) as (session, launcher, rec):
        first = await session.prompt("hello background")
        await rec.wait_kind("turn.ended", turn_id=first.id)
        extra = await rec.wait_kind("session.info", info_kind="result")
        assert isinstance(extra, ev.SessionInfo) and extra.data["result"] == "background done"
        second = await session.prompt("again")
        ended = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        assert len(rec.of_kind("turn.ended")) == 2


async def test_start_timeout_when_initialize_is_never_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = ClaudeLauncher(ClaudeBehaviour(start_delay=1000.0))
    spec = claude_spec(start_timeout_s=5.0)
    async with open_supervisor(agents={"claude": spec}, launcher=launcher) as sup:
        t0 = trio.current_time()
        with pytest.raises(AgentNotRunning, match="handshake"):
            await sup.start_session("claude", cwd="/")
        assert trio.current_time() - t0 == pytest.approx(5.0)


async def test_api_error_result_fails_the_turn(autojump_clock: trio.testing.MockClock) -> None:
    """A ``result`` with ``is_error`` (an API error the CLI reports as success/completed) ends the
    turn ``failed`` with the CLI's words, never ``completed``; the session goes on."""
    async with running(ClaudeBehaviour(words=2, word_interval=0.1)) as (session, _, rec):
        turn = await session.prompt("fail-turn")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.error) == ("failed", "completed: API Error: 500 internal")
        second = await session.prompt("again")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"


async def test_cancel_racing_an_api_error_is_never_completed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The CLI ends the turn on its API error before our interrupt takes effect: the receipt may
    not say ``completed`` (the agent did not finish by itself, it failed), and the turn's end
    carries the error."""
    behaviour = ClaudeBehaviour(words=3, word_interval=0.1, stop_delay=1.0)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("fail-turn")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        await rec.catch_up()
        assert interrupts(launcher) == 1
        assert (receipt.turn_id, receipt.outcome) == (turn.id, "cancelled"), receipt
        [ended] = [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]
        assert ended.outcome != "completed"
        assert ended.error == "completed: API Error: 500 internal"
