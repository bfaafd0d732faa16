"""Codex sub-agents (child threads) and goals on cancel, through the session actor on virtual time.

The actor runs against ``supervisor/testing/_codex.py``: cooperative children confirm and the receipt
lists them at exactly the time the last one stopped; a child that never answers means a kill at
exactly cancel time + grace; an active goal is paused before the interrupt, so the server does
not start its next goal turn by itself; the goal turns the server starts after a turn completes
are part of that turn (one ``turn.ended``), and a cancel during one pauses the goal and
interrupts it. The machine alone is ``tests/machines/test_codex_children.py``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio
import trio.testing

import helpers
from helpers import KILLED, Recorder
from protocols import events as ev
from supervisor import AgentSpec, Session
from supervisor.testing._codex import CodexBehaviour, CodexLauncher

GRACE = 2.0


# --- tier 2: the actor, on virtual time -----------------------------------------------------


def codex_spec() -> AgentSpec:
    return AgentSpec(name="codex", protocol="codex", command=["codex", "app-server"], grace_s=GRACE)


def running_session(
    behaviour: CodexBehaviour | None = None,
) -> AbstractAsyncContextManager[tuple[Session, CodexLauncher, Recorder]]:
    return helpers.running(CodexLauncher(behaviour), codex_spec(), catch_up=True)


def child_started(event: ev.Event) -> bool:
    return (
        isinstance(event, ev.SessionInfo)
        and event.info_kind == "turn/started"
        and (event.data.get("threadId") != "thr_1")
    )


def interrupts(launcher: CodexLauncher) -> list[dict[str, Any]]:
    return [m["params"] for m in launcher.sent("turn/interrupt")]


async def test_cooperative_children_confirm_and_are_listed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The root stops after 0.05 s, its children after 0.2 s: the receipt comes at exactly
    0.2 s and lists both, confirmed, in the order interrupted (root first, then children)."""
    behaviour = CodexBehaviour(words=100, stop_delay=0.05)
    async with running_session(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello children=2 child-stop-delay=0.2")
        await rec.wait_for(child_started, count=2)
        server = launcher.servers[0]
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(0.2)
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id)
        assert receipt.escalation == ["interrupt"]
        children = server.children
        child_turns = [
            e.data["turn"]["id"]
            for e in rec.events
            if child_started(e) and isinstance(e, ev.SessionInfo)
        ]
        assert receipt.details == {
            "background_terminals": "cleaned",
            "children": [
                {"thread_id": c, "turn_id": t, "confirmed": True, "status": "interrupted"}
                for c, t in zip(children, child_turns, strict=True)
            ],
        }
        assert [p["threadId"] for p in interrupts(launcher)] == ["thr_1", *children]
        assert server.child_active == {}
        # Child output carried our turn id while the turn ran.
        child_deltas = [
            e
            for e in rec.of_kind("message.delta")
            if isinstance(e, ev.MessageDelta) and e.text.startswith("c")
        ]
        assert child_deltas and all(e.turn_id == turn.id for e in child_deltas)
        assert len(launcher.links) == 1 and session.state == "ready"


async def test_child_that_never_answers_means_kill_at_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = CodexBehaviour(words=1000, stop_delay=0.05)
    async with running_session(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello children=1 child-wedged")
        await rec.wait_for(child_started)
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(GRACE)
        assert receipt.outcome == "killed"
        assert receipt.escalation == KILLED
        ended = [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]
        assert [(e.turn_id, e.outcome) for e in ended] == [(turn.id, "killed")]
        # The killed server's machine still says which child never confirmed.
        [child] = receipt.details["children"]
        assert child["confirmed"] is False and child["thread_id"] and child["turn_id"]
        # One interrupt for the root and one for the child, never repeated while they hung.
        assert len(interrupts(launcher)) == 2
        # The respawned server resumed the thread and asked for its goal.
        assert launcher.sent("thread/goal/get", generation=2)
        assert session.state == "ready"


async def test_refusing_child_listed_unconfirmed(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = CodexBehaviour(words=1000, stop_delay=0.05)
    async with running_session(behaviour) as (session, launcher, rec):
        await session.prompt("hello children=1 child-refuse")
        await rec.wait_for(child_started)
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.05)
        assert receipt.outcome == "cancelled"
        [child] = receipt.details["children"]
        assert child["confirmed"] is False and "no longer accepting" in child["error"]


async def test_active_goal_paused_before_the_interrupt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    behaviour = CodexBehaviour(words=100, stop_delay=0.05)
    async with running_session(behaviour) as (session, launcher, rec):
        await session.prompt("hello goal")
        await rec.wait_kind("session.info", info_kind="thread/goal/updated")
        server = launcher.servers[0]
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert trio.current_time() - t0 == pytest.approx(0.05)
        assert receipt.outcome == "cancelled"
        assert receipt.details == {"background_terminals": "cleaned", "goal": "paused"}
        ours = [m.get("method") for kind, _, m in launcher.log if kind == "to_agent"]
        assert ours.index("thread/goal/set") < ours.index("turn/interrupt")
        [pause] = launcher.sent("thread/goal/set")
        assert pause["params"] == {"threadId": "thr_1", "status": "paused", "origin": "user"}
        assert server.goal is not None and server.goal["status"] == "paused"
        # Left paused: the server starts no goal turn by itself afterwards.
        await trio.sleep(5)
        assert server.goal_turns == 0 and server.goal["status"] == "paused"
        assert not [e for e in rec.of_kind("error") if isinstance(e, ev.ErrorEvent)]


def our_turns_started(rec: Recorder) -> list[str]:
    """Codex turn ids of every ``turn/started`` on our thread, in order."""
    return [
        e.data["turn"]["id"]
        for e in rec.of_kind("session.info")
        if isinstance(e, ev.SessionInfo)
        and e.info_kind == "turn/started"
        and e.data.get("threadId") == "thr_1"
    ]


@pytest.mark.parametrize("late", [False, True], ids=["complete_in_turn", "complete_after_turn"])
async def test_goal_turns_are_part_of_the_turn(
    autojump_clock: trio.testing.MockClock, late: bool
) -> None:
    """The goal the turn creates keeps Codex going: after the person's turn completes the
    server starts goal turns by itself until the model marks the goal complete (during the
    second goal turn, or just after its ``turn/completed``). All of it is the person's turn:
    one ``turn.ended``, after the last goal turn, every delta with our turn id, no error."""
    behaviour = CodexBehaviour(words=3, word_interval=0.1)
    async with running_session(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello goal" + (" goal-late" if late else ""))
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason) == ("completed", "completed")
        server = launcher.servers[0]
        assert server.goal_turns == 2 and server.goal is not None
        assert server.goal["status"] == "complete"
        assert len(our_turns_started(rec)) == 3
        # Everything the three Codex turns said came before the end, with our turn id.
        before = rec.events[: rec.events.index(ended)]
        deltas = [e for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta)]
        assert len(deltas) == 9 and all(e.turn_id == turn.id for e in deltas)
        assert all(e in before for e in deltas)
        assert not rec.of_kind("error")
        assert launcher.sent("thread/goal/set") == []
        # Nothing follows; the session takes the next prompt and it ends by itself.
        await trio.sleep(5)
        assert server.goal_turns == 2 and len(rec.of_kind("turn.ended")) == 1
        assert session.state == "ready"
        second = await session.prompt("quick words=1")
        await rec.wait_kind("turn.ended", turn_id=second.id)
        assert server.goal_turns == 2 and not rec.of_kind("error")


async def test_cancel_during_a_goal_turn(autojump_clock: trio.testing.MockClock) -> None:
    """A cancel while a goal turn the server started runs: the goal is paused first, then that
    goal turn (now ours) is interrupted; the receipt says cancelled, goal paused, and how many
    goal turns ran; nothing starts afterwards."""
    behaviour = CodexBehaviour(words=20, word_interval=0.1, stop_delay=0.05)
    async with running_session(behaviour) as (session, launcher, rec):
        turn = await session.prompt("hello goal goal-turns=5")

        def goal_turn_started(event: ev.Event) -> bool:
            return (
                isinstance(event, ev.SessionInfo)
                and event.info_kind == "turn/started"
                and event.data["turn"]["id"] != our_turns_started(rec)[0]
            )

        await rec.wait_for(goal_turn_started)
        await trio.sleep(0.5)  # it streams
        server = launcher.servers[0]
        goal_turn = our_turns_started(rec)[1]
        assert server.active is not None and server.active.real_id == goal_turn
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.05)
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id)
        assert receipt.stop_reason == "interrupted" and receipt.escalation == ["interrupt"]
        assert receipt.details == {
            "background_terminals": "cleaned",
            "goal": "paused",
            "goal_turns": 1,
        }
        ours = [
            (m.get("method"), m.get("params", {}).get("turnId"))
            for kind, _, m in launcher.log
            if kind == "to_agent" and m.get("method") in ("thread/goal/set", "turn/interrupt")
        ]
        assert ours == [("thread/goal/set", None), ("turn/interrupt", goal_turn)]
        deltas = [e for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta)]
        assert len(deltas) > 20 and all(e.turn_id == turn.id for e in deltas)
        await trio.sleep(5)
        assert server.goal_turns == 1 and server.goal is not None
        assert server.goal["status"] == "paused"
        assert len(our_turns_started(rec)) == 2 and len(rec.of_kind("turn.ended")) == 1
        assert not rec.of_kind("error") and session.state == "ready"


async def test_children_and_goal_together(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = CodexBehaviour(words=100, stop_delay=0.05)
    async with running_session(behaviour) as (session, launcher, rec):
        await session.prompt("hello goal children=1 child-stop-delay=0.1")
        await rec.wait_for(child_started)
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled"
        assert receipt.details["goal"] == "paused"
        assert [c["confirmed"] for c in receipt.details["children"]] == [True]
        ours = [
            (m.get("method"), m.get("params", {}).get("threadId"))
            for kind, _, m in launcher.log
            if kind == "to_agent" and m.get("method") in ("thread/goal/set", "turn/interrupt")
        ]
        child = launcher.servers[0].children[0]
        assert ours == [
            ("thread/goal/set", "thr_1"),
            ("turn/interrupt", "thr_1"),
            ("turn/interrupt", child),
        ]
