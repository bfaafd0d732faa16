"""Tier 3: the whole supervisor against a scripted fake ``claude`` CLI, as subprocesses, real clock.

``fakes/fake_claude.py`` speaks stream-json like Claude Code 2.1.332. Here is what is Claude's
own: a lost result (the interrupt acknowledged, the result never written), a permission
allowed, an idle cancel that sends nothing, an interrupt the CLI drops before ``system/init``.
What every protocol's agent does when a cancel is obeyed, ignored, or meets a pending
permission is the contract, ``test_cancel_contract_process.py``. Bounds are generous (shared, slow machines); exact timing is the virtual-time
tests' job.
"""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import psutil
import pytest

from helpers import KILLED, Recorder, process_session
from paths import TESTS
from protocols import events as ev
from protocols.claude import CLAUDE_COMMAND
from supervisor import AgentSpec, Session

pytestmark = pytest.mark.real_process

FAKE_CLAUDE = TESTS / "fakes" / "fake_claude.py"
GRACE = 1.0
BOUND = 30.0  # a stuck test fails instead of hanging the suite


def fake_claude(state_dir: Path, *args: str) -> AgentSpec:
    command = [
        sys.executable,
        str(FAKE_CLAUDE),
        *CLAUDE_COMMAND[1:],
        "--state-dir",
        str(state_dir),
        *args,
    ]
    return AgentSpec(
        name="claude", protocol="claude", command=command, grace_s=GRACE, kill_timeout_s=0.5
    )


def claude_session(
    state_dir: Path, *args: str
) -> AbstractAsyncContextManager[tuple[Session, Recorder]]:
    return process_session(fake_claude(state_dir, *args), str(state_dir))


def tree_of_this_test() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == [], f"still alive: {alive}"


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def inits(rec: Recorder) -> list[dict[str, object]]:
    return [
        e.data
        for e in rec.of_kind("session.info")
        if isinstance(e, ev.SessionInfo) and e.info_kind == "init"
    ]


def got(rec: Recorder, subtype: str) -> int:
    """How many ``subtype`` control requests the fake CLI says it received."""
    return sum(
        1
        for e in rec.of_kind("agent.stderr")
        if isinstance(e, ev.AgentStderr) and e.line == f"fake_claude: got {subtype}"
    )


async def second_prompt_completes(session: Session, rec: Recorder) -> None:
    turn = await session.prompt("again words=3")
    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.outcome, ended.stop_reason) == ("completed", "completed"), ended


async def test_lost_result_killed_and_resumed(tmp_path: Path) -> None:
    """The interrupt is acknowledged but no result comes: killed at grace, tree gone, resumed."""
    async with claude_session(tmp_path) as (session, rec):
        await session.prompt("hello wedged child")
        tool = await rec.wait_kind("tool.call")
        assert isinstance(tool, ev.ToolCall)
        helper = psutil.Process(tool.raw["input"]["pid"])
        assert helper.is_running() and _sid(helper.pid) == helper.pid  # its own session
        await rec.wait_for(is_delta)
        before = tree_of_this_test()
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.escalation) == ("killed", KILLED)
        assert receipt.resumed is True
        assert receipt.elapsed_ms >= GRACE * 1000
        assert_all_gone([*before, helper])
        await second_prompt_completes(session, rec)
        first, second = inits(rec)[0], inits(rec)[-1]
        assert second["session_id"] == first["session_id"]
        argv = second["argv"]
        assert isinstance(argv, list) and argv[-2:] == ["--resume", first["session_id"]]
        assert first["pid"] != second["pid"]


async def test_permission_allowed_runs_the_tool(tmp_path: Path) -> None:
    async with claude_session(tmp_path) as (session, rec):
        turn = await session.prompt("permission words=3")
        requested = await rec.wait_kind("permission.requested")
        assert isinstance(requested, ev.PermissionRequested)
        await session.respond_permission(requested.request_id, "allow")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        updates = [e for e in rec.of_kind("tool.update") if isinstance(e, ev.ToolUpdate)]
        assert [u.status for u in updates] == ["completed"]


async def test_idle_cancel_sends_no_interrupt(tmp_path: Path) -> None:
    async with claude_session(tmp_path) as (session, rec):
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.escalation) == ("no_active_turn", [])
        await second_prompt_completes(session, rec)
        receipt = await session.cancel()
        assert receipt.outcome == "no_active_turn"
        await session.stop()  # the CLI's stderr is complete once it has exited
        await rec.catch_up()
        assert got(rec, "initialize") == 1
        assert got(rec, "interrupt") == 0


async def test_interrupt_dropped_before_init_is_sent_again(tmp_path: Path) -> None:
    """Edge case 16 with a CLI that loses it: the second interrupt stops the turn in time."""
    args = ("--drop-early-interrupt", "--init-delay", "0.5")
    async with claude_session(tmp_path, *args) as (session, rec):
        await session.prompt("hello")
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled"
        assert receipt.details == {"interrupt_resent": True}
        assert receipt.elapsed_ms < GRACE * 1000
        await second_prompt_completes(session, rec)
        await rec.catch_up()
        assert got(rec, "interrupt") == 2


def _sid(pid: int) -> int:
    import os

    return os.getsid(pid)
