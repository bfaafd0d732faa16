"""Claude Code background tasks on cancel, through the session actor on virtual time.

The actor runs against ``supervisor/testing/_claude.py`` with prompts that start background tasks
(``tasks=N``): a cooperative CLI's receipt lists every task confirmed at exactly the time the
last answer (result or stop_task) came; a CLI that never answers a ``stop_task`` is killed at
exactly cancel time + grace. The machine alone is ``tests/machines/test_claude_tasks.py``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio
import trio.testing

import helpers
from helpers import Recorder
from paths import TESTS
from protocols import events as ev
from protocols.claude import CLAUDE_COMMAND
from supervisor import AgentSpec, Session
from supervisor.testing._claude import ClaudeBehaviour, ClaudeLauncher

GOLDEN_DIR = TESTS / "golden" / "claude" / "tasks"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
GRACE = 2.0


# --- tier 2: the actor, on virtual time -----------------------------------------------------


def claude_spec() -> AgentSpec:
    return AgentSpec(name="claude", protocol="claude", command=CLAUDE_COMMAND, grace_s=GRACE)


def running(
    behaviour: ClaudeBehaviour | None = None,
) -> AbstractAsyncContextManager[tuple[Session, ClaudeLauncher, Recorder]]:
    return helpers.running(ClaudeLauncher(behaviour), claude_spec(), catch_up=True)


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def sent_requests(launcher: ClaudeLauncher) -> list[dict[str, Any]]:
    return [
        m["request"]
        for kind, _, m in launcher.log
        if kind == "to_agent" and m.get("type") == "control_request"
    ]


async def test_cancel_stops_every_task_and_lists_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Interrupt first, then one stop_task per task at once; the receipt waits for the last
    stop_task answer (0.3 s) after the result (0.05 s) and lists both tasks confirmed."""
    behaviour = ClaudeBehaviour(words=100, stop_delay=0.05)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello tasks=2 task-stop-delay=0.3")
        await rec.wait_kind("session.info", info_kind="task_started", count=2)
        await rec.wait_for(is_delta, count=2)
        cli = launcher.clis[0]
        ids = list(cli.tasks)
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(0.3)
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id)
        assert receipt.escalation == ["interrupt"]
        assert receipt.details == {
            "tasks": [{"task_id": i, "confirmed": True, "status": "stopped"} for i in ids]
        }
        subtypes = [r["subtype"] for r in sent_requests(launcher)]
        assert subtypes == ["initialize", "interrupt", "stop_task", "stop_task"]
        assert [r.get("task_id") for r in sent_requests(launcher)[2:]] == ids
        assert cli.running_tasks() == []
        assert len(launcher.links) == 1 and session.state == "ready"


async def test_tasks_killed_by_the_interrupt_still_confirmed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Sub-agents, as 2.1.332 treats them when the host declares no perTaskStopAffordance: the
    interrupt ends them itself before acknowledging, and stop_task answers success for a task
    that is gone (``real_background_agent.json``)."""
    behaviour = ClaudeBehaviour(words=100, stop_delay=0.05)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello tasks=1 interrupt-kills-tasks")
        await rec.wait_kind("session.info", info_kind="task_started")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.05)
        [task] = receipt.details["tasks"]
        assert task["confirmed"] is True and task["status"] == "stopped"
        assert task["task_id"].startswith("a") and len(task["task_id"]) == 17
        assert launcher.clis[0].running_tasks() == []


async def test_refused_stop_listed_unconfirmed(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = ClaudeBehaviour(words=100, stop_delay=0.05)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello tasks=1 task-refuse")
        await rec.wait_kind("session.info", info_kind="task_started")
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled"
        [task] = receipt.details["tasks"]
        assert task["confirmed"] is False and "not supported" in task["error"]


async def test_unanswered_stop_task_means_kill_at_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = ClaudeBehaviour(words=100, stop_delay=0.05)
    async with running(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello tasks=1 task-deaf")
        await rec.wait_kind("session.info", info_kind="task_started")
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(GRACE)
        assert receipt.outcome == "killed"
        assert receipt.escalation[:2] == ["interrupt", "grace_expired"]
        # The killed receipt still says which task never confirmed its stop.
        [task_id] = launcher.clis[0].tasks
        assert receipt.details["tasks"] == [{"task_id": task_id, "confirmed": False}]
        ended = [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]
        assert [(e.turn_id, e.outcome) for e in ended] == [(turn.id, "killed")]
        assert session.state == "ready"


async def test_turn_without_tasks_is_unchanged(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = ClaudeBehaviour(words=100, stop_delay=0.05)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        assert receipt.details == {}
        assert [r["subtype"] for r in sent_requests(launcher)] == ["initialize", "interrupt"]
