"""Amp through the real supervisor: a scripted fake CLI (``tests/fakes/fake_amp.py``) as a
subprocess, real clock: the stop ends its run with what it started, the thread continues in
the next one; a thread the server lost goes on fresh. What every agent does when cancelled is
the contract, ``test_cancel_contract_process.py``.
"""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import psutil
import pytest

from helpers import Recorder, process_session
from paths import TESTS
from protocols import events as ev
from protocols.amp import AMP_COMMAND
from supervisor import AgentSpec, Session

pytestmark = pytest.mark.real_process

FAKE_AMP = TESTS / "fakes" / "fake_amp.py"
BASE = list(AMP_COMMAND)


def amp_spec(tmp_path: Path, *extra: str) -> AgentSpec:
    command = [sys.executable, str(FAKE_AMP), *BASE[1:], "--state-dir", str(tmp_path), *extra]
    return AgentSpec(name="amp", protocol="amp", command=command, grace_s=1.0, kill_timeout_s=0.5)


def amp_session(tmp_path: Path) -> AbstractAsyncContextManager[tuple[Session, Recorder]]:
    return process_session(amp_spec(tmp_path), str(tmp_path))


async def test_a_cancel_ends_the_run_with_its_shell_helper_and_the_thread_continues(
    tmp_path: Path,
) -> None:
    """SIGINT ends Amp's whole run: the receipt comes once it and the shell helper it left in a
    session of its own are gone, and the next CLI continues the thread."""
    async with amp_session(tmp_path) as (session, rec):
        await session.prompt("shell words=1000")
        tool = await rec.wait_kind("tool.call")
        assert isinstance(tool, ev.ToolCall)
        helper = psutil.Process(tool.raw["input"]["pid"])
        await rec.wait_kind("message.delta", role="assistant")
        init = await rec.wait_kind("session.info", info_kind="init")
        assert isinstance(init, ev.SessionInfo)
        tree = psutil.Process().children(recursive=True)
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.escalation) == (
            "cancelled",
            ["interrupt", "respawned", "resumed"],
        )
        _, alive = psutil.wait_procs([*tree, helper], timeout=5)
        assert alive == []  # the shell helper in its own session too
        second = await session.prompt("again words=3")
        ended = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
        await rec.catch_up()
        continuing = [
            e.line
            for e in rec.of_kind("agent.stderr")
            if isinstance(e, ev.AgentStderr) and "continuing" in e.line
        ]
        assert continuing and init.data["session_id"] in continuing[-1]


async def test_lost_thread_goes_on_fresh(tmp_path: Path) -> None:
    async with amp_session(tmp_path) as (session, rec):
        await session.prompt("hello words=1000")
        await rec.wait_kind("message.delta", role="assistant")
        for thread_file in tmp_path.glob("T-*"):
            thread_file.unlink()  # Amp lost the thread
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled"
        # Amp has no handshake in which to refuse the thread: the continued CLI dies at
        # start, maybe under the next prompt (which then fails with its words), and the
        # session goes on in a fresh thread.
        failure = await rec.wait_kind("error", code="resume_failed")
        assert isinstance(failure, ev.ErrorEvent) and "does not exist" in failure.message
        outcomes = []
        for _ in range(3):
            await session.wait_ready()
            turn = await session.prompt("again words=2")
            ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded)
            outcomes.append(ended.outcome)
            if ended.outcome == "completed":
                break
            assert ended.error is not None and "does not exist" in ended.error
        assert outcomes[-1] == "completed"
