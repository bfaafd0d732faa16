"""Tier 3: the whole supervisor against a scripted fake ``codex app-server`` subprocess.

Real processes, real pipes, the real clock; no autojump. Here is what is Codex's own: a stop
that cleans the turn's background terminals, a stale turn id, an interrupt sent before
``turn/started``, a wire without ``jsonrpc``. What every protocol's agent does when a cancel is obeyed, ignored, or meets a pending
permission is the contract, ``test_cancel_contract_process.py``. Bounds are generous; exact timing is
the virtual-time tests' job. What the fake decided (an interrupt rejected, a thread resumed)
reaches us as its stderr lines, ``agent.stderr`` events.
"""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import psutil
import pytest

from fakes.fake_codex import LATE_STARTED_S
from helpers import Recorder, process_session
from paths import TESTS
from protocols import events as ev
from supervisor import AgentSpec, Session

pytestmark = pytest.mark.real_process

GRACE = 1.0
BOUND = 30.0  # a stuck test fails instead of hanging the suite
FAKE_CODEX = TESTS / "fakes" / "fake_codex.py"
CLEANED = {"background_terminals": "cleaned"}


def codex_spec(state_dir: Path) -> AgentSpec:
    return AgentSpec(
        name="codex",
        protocol="codex",
        command=[sys.executable, str(FAKE_CODEX), "app-server", "--state-dir", str(state_dir)],
        grace_s=GRACE,
        kill_timeout_s=0.5,
    )


def tree_of_this_test() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == [], f"still alive: {alive}"


def codex_session(tmp_path: Path) -> AbstractAsyncContextManager[tuple[Session, Recorder]]:
    return process_session(codex_spec(tmp_path), str(tmp_path))


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def interrupt_accepted(event: ev.Event) -> bool:
    return isinstance(event, ev.AgentStderr) and event.line.endswith(" accepted")


def stderr_lines(rec: Recorder) -> list[str]:
    return [e.line for e in rec.of_kind("agent.stderr") if isinstance(e, ev.AgentStderr)]


async def second_prompt_completes(session: Session, rec: Recorder) -> None:
    turn = await session.prompt("again words=3")
    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.outcome, ended.stop_reason) == ("completed", "completed"), ended


async def terminal_pid(rec: Recorder) -> psutil.Process:
    tool = await rec.wait_kind("tool.call", tool_call_id="term_1")
    assert isinstance(tool, ev.ToolCall)
    return psutil.Process(int(tool.raw["processId"]))


async def test_cooperative_cancel_cleans_background_terminals(tmp_path: Path) -> None:
    async with codex_session(tmp_path) as (session, rec):
        turn = await session.prompt("terminal words=10000")
        terminal = await terminal_pid(rec)
        await rec.wait_for(is_delta, count=2)
        server = tree_of_this_test()
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id)
        assert receipt.escalation == ["interrupt"]
        assert receipt.stop_reason == "interrupted"
        assert receipt.details == CLEANED
        assert receipt.elapsed_ms < GRACE * 1000
        # turn/interrupt left the terminal running; the clean, not a kill, stopped it.
        assert_all_gone([terminal])
        assert all(p.is_running() for p in server if p.pid != terminal.pid)
        await second_prompt_completes(session, rec)


async def test_stale_turn_id_is_retried_against_the_running_turn(tmp_path: Path) -> None:
    async with codex_session(tmp_path) as (session, rec):
        await session.prompt("stale words=10000")
        await rec.wait_for(is_delta, count=2)
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled" and receipt.escalation == ["interrupt"]
        assert receipt.elapsed_ms < GRACE * 1000
        await rec.wait_for(interrupt_accepted)
        decisions = [
            line for line in stderr_lines(rec) if line.startswith("fake-codex: interrupt ")
        ]
        assert decisions == [
            "fake-codex: interrupt phantom_2 rejected: stale, turn_2 is running",
            "fake-codex: interrupt turn_2 accepted",
        ]
        await second_prompt_completes(session, rec)


async def test_interrupt_before_turn_started_is_retried(tmp_path: Path) -> None:
    async with codex_session(tmp_path) as (session, rec):
        # The fake starts the turn only after it has rejected an interrupt: whether ours goes
        # out with the turn/start reply or after it, it comes before turn/started.
        await session.prompt("late-started words=10000")
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled" and receipt.escalation == ["interrupt"]
        assert receipt.elapsed_ms >= LATE_STARTED_S * 1000  # it waited for turn/started
        assert receipt.elapsed_ms < GRACE * 1000
        await rec.wait_for(interrupt_accepted)
        decisions = [
            line for line in stderr_lines(rec) if line.startswith("fake-codex: interrupt ")
        ]
        assert decisions == [
            "fake-codex: interrupt turn_2 rejected: no active turn to interrupt",
            "fake-codex: interrupt turn_2 accepted",
        ]
        await second_prompt_completes(session, rec)


async def test_normal_turn_and_no_jsonrpc_on_the_wire(tmp_path: Path) -> None:
    async with codex_session(tmp_path) as (session, rec):
        await second_prompt_completes(session, rec)
        deltas = [e for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta)]
        assert [e.text for e in deltas] == ["w0 ", "w1 ", "w2 "]
        assert not any("jsonrpc" in line for line in stderr_lines(rec))
        assert session.state == "ready"
