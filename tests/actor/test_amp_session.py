"""Amp under the session actor, on virtual time, with the in-memory Amp (``supervisor/testing/_amp.py``):
a cooperative stop ends Amp's process, and the receipt waits for its exit and the respawn that
continues the thread; an exit that never comes, many cancels in a row, an error result that
ends the run, a thread the server lost. What every protocol does when cancelled is the
contract, ``test_cancel_contract.py``.
"""

from __future__ import annotations

import signal

import pytest
import trio
import trio.testing

from helpers import KILLED, running
from protocols import events as ev
from protocols.amp import AMP_COMMAND
from supervisor import AgentSpec


def memory_spec(grace_s: float = 2.0) -> AgentSpec:
    return AgentSpec(name="amp", protocol="amp", command=list(AMP_COMMAND), grace_s=grace_s)


async def test_cancel_answers_once_the_exit_is_reaped_and_the_thread_continues(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """SIGINT; Amp writes its "User cancelled" result after 0.05 s and exits 0.03 s later. The
    receipt says ``cancelled`` at exactly 0.08 s: after the exit and the respawn, with the
    session ready and ``threads continue`` running. A prompt sent at once goes to it."""
    from supervisor.testing._amp import AmpBehaviour, AmpLauncher

    launcher = AmpLauncher(AmpBehaviour(words=1000, stop_delay=0.05, exit_delay=0.03))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        first = await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.08)
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "cancelled")
        assert receipt.escalation == ["interrupt", "respawned", "resumed"]
        assert receipt.resumed is True and receipt.turn_id == first.id
        assert session.state == "ready"
        assert launcher.links[0].signals == [signal.SIGINT]
        assert not launcher.links[0].alive and launcher.links[1].alive
        assert launcher.resumes == [None, "T-1"]
        await rec.catch_up()  # what was published before the receipt
        exited = rec.of_kind("agent.exited")
        assert [(e.exit_code, e.expected) for e in exited if isinstance(e, ev.AgentExited)] == [
            (0, True)
        ]
        # The turn's end reached subscribers before the receipt was answered.
        ended = await rec.wait_kind("turn.ended", turn_id=first.id)
        assert isinstance(ended, ev.TurnEnded) and ended.receipt is not None
        second = await session.prompt("again words=2")
        assert not second.queued
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
        # It went to the new process, not the one that was exiting.
        assert [m["message"]["content"][0]["text"] for m in launcher.links[1].sent] == [
            "again words=2"
        ]
        await rec.catch_up()
        assert rec.of_kind("error") == []


async def test_no_prompt_reaches_the_exiting_process(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A prompt that comes while the cancelled Amp is still exiting waits for the next one."""
    from supervisor.testing._amp import AmpBehaviour, AmpLauncher

    launcher = AmpLauncher(AmpBehaviour(words=1000, stop_delay=0.05, exit_delay=0.5))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)
            await rec.wait_for(lambda e: isinstance(e, ev.SessionState) and "exiting" in str(e))
            queued = await session.prompt("again words=2")
            assert queued.queued
        done = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
        assert len(launcher.links[0].sent) == 1 and len(launcher.links[1].sent) == 1


async def test_an_exit_that_never_comes_meets_the_grace_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Amp says it stopped (its result) but its process hangs on: the receipt still waits for
    it to be gone, so the grace timer kills it; the turn was stopped, the process killed."""
    from supervisor.testing._amp import AmpBehaviour, AmpLauncher

    launcher = AmpLauncher(AmpBehaviour(words=1000, stop_delay=0.05, exit_delay=3600))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(2.0)
        assert receipt.outcome == "killed"
        assert receipt.escalation == KILLED
        assert session.state == "ready"


async def test_cancel_after_cancel_keeps_the_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every Amp cancel is an exit: many in a row are not a crash loop."""
    from supervisor.testing._amp import AmpBehaviour, AmpLauncher

    launcher = AmpLauncher(AmpBehaviour(words=1000, stop_delay=0.01, exit_delay=0.01))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        for n in range(8):
            turn = await session.prompt(f"hello {n}")
            await rec.wait_kind("message.delta", turn_id=turn.id, role="assistant")
            receipt = await session.cancel()
            assert (receipt.outcome, receipt.resumed) == ("cancelled", True), receipt
        assert launcher.resumes == [None] + ["T-1"] * 8
        assert session.state == "ready"


async def test_error_result_fails_the_turn_and_the_next_prompt_waits_for_the_respawn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Amp's error ``result`` ends its run: the turn fails with Amp's words, the process exits
    0, and a prompt sent right after the turn ended runs in the continued thread (no "agent
    exited unexpectedly")."""
    from supervisor.testing._amp import AmpBehaviour, AmpLauncher

    launcher = AmpLauncher(AmpBehaviour(words=2, word_interval=0.1, exit_delay=0.2))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        failing = await session.prompt("fail-turn")
        ended = await rec.wait_kind("turn.ended", turn_id=failing.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.error) == (
            "failed",
            "error_during_execution: Upstream provider error: 529 overloaded",
        )
        assert session.state == "starting"
        second = await session.prompt("again words=2")
        assert second.queued
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
        assert launcher.resumes == [None, "T-1"]
        await rec.catch_up()
        exited = [e for e in rec.of_kind("agent.exited") if isinstance(e, ev.AgentExited)]
        assert [(e.exit_code, e.expected) for e in exited] == [(0, True)]


async def test_lost_thread_is_a_resume_failure_and_the_session_goes_on_fresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``threads continue`` of a thread the server lost exits 1 at once: an error event says
    the resume failed, and the session goes on in a fresh thread, never hanging."""
    from supervisor.testing._amp import AmpBehaviour, AmpLauncher

    launcher = AmpLauncher(AmpBehaviour(words=1000, stop_delay=0.05))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        launcher.threads.clear()  # the server lost the thread
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled"
        failure = await rec.wait_kind("error", code="resume_failed")
        assert isinstance(failure, ev.ErrorEvent) and "exit 1" in failure.message
        await session.wait_ready()
        turn = await session.prompt("again words=2")
        done = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(done, ev.TurnEnded)
        assert done.outcome in ("completed", "failed"), done  # failed: it met the dying one
        assert launcher.resumes[:3] == [None, "T-1", None]
