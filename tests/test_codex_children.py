"""Codex sub-agents (child threads) and goals on cancel: tier 1 (machine) and tier 2 (actor).

The golden transcripts for this live with the others in ``tests/golden/codex/``
(``children_cancel``, ``children_refused``, ``goal_pause``, ``goal_resume``, ``goal_continue``,
``goal_continue_races``, and
``children_cancel_real`` / ``goal_pause_real``, recorded from the real 0.171.0 app-server by
``test_real_codex_children.py``) and are replayed by ``test_codex.py`` (and checked against
the 0.171.0 schema by ``test_schemas.py``). Here:
the machine's state and invariants under any order of child-thread events, and the unchanged
session actor against ``fakes/memory_codex.py`` on virtual time: cooperative children confirm
and the receipt lists them at exactly the time the last one stopped; a child that never
answers means a kill at exactly cancel time + grace; an active goal is paused before the
interrupt, so the server does not start its next goal turn by itself; the goal turns the server
starts after a turn completes are part of that turn (one ``turn.ended``), and a cancel during
one pauses the goal and interrupts it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.memory_codex import CodexBehaviour, MemoryCodexLauncher
from helpers import Recorder
from protocols import events as ev
from protocols.codex import CodexClient
from protocols.machine import Step, TurnFinished
from supervisor import AgentSpec, Session, open_supervisor

GRACE = 2.0


# --- tier 1: the machine ------------------------------------------------------------------


def established() -> CodexClient:
    client = CodexClient()
    client.start(cwd="/w")
    client.receive({"id": 0, "result": {}})
    client.receive({"id": 1, "result": {"thread": {"id": "thr_1"}}})
    return client


def identified(client: CodexClient) -> None:
    [start] = client.prompt("t1", "go").send
    client.receive({"id": start["id"], "result": {"turn": {"id": "turn_1"}}})
    client.receive(
        {"method": "turn/started", "params": {"threadId": "thr_1", "turn": {"id": "turn_1"}}}
    )


def spawned(child: str, parent: str = "thr_1") -> dict[str, Any]:
    return {
        "method": "thread/started",
        "params": {"thread": {"id": child, "parentThreadId": parent}},
    }


def turn_note(method: str, thread: str, turn: str, status: str = "inProgress") -> dict[str, Any]:
    return {
        "method": method,
        "params": {"threadId": thread, "turn": {"id": turn, "status": status}},
    }


def test_children_from_collab_items_and_activity() -> None:
    client = established()
    identified(client)
    item = {
        "type": "collabAgentToolCall",
        "id": "c1",
        "tool": "spawnAgent",
        "status": "completed",
        "senderThreadId": "thr_1",
        "receiverThreadIds": ["thr_a", "thr_1"],
        "agentsStates": {},
    }
    client.receive(
        {
            "method": "item/completed",
            "params": {"threadId": "thr_1", "turnId": "turn_1", "item": item},
        }
    )
    # Someone else's collab call names no child of ours.
    foreign = {**item, "id": "c2", "senderThreadId": "thr_z", "receiverThreadIds": ["thr_q"]}
    client.receive(
        {
            "method": "item/completed",
            "params": {"threadId": "thr_1", "turnId": "turn_1", "item": foreign},
        }
    )
    activity = {
        "type": "subAgentActivity",
        "id": "s1",
        "kind": "started",
        "agentPath": "/root/b",
        "agentThreadId": "thr_b",
    }
    step = client.receive(
        {
            "method": "item/started",
            "params": {"threadId": "thr_1", "turnId": "turn_1", "item": activity},
        }
    )
    assert [e.kind for e in step.events] == ["session.info"]
    assert client.children == {"thr_a": None, "thr_b": None}


def test_child_adopted_from_its_turns_root_turn_id() -> None:
    """0.171.0 sends no ``thread/started`` for a sub-agent; a turn whose ``rootTurnId`` is our
    turn (running or finished) runs on a descendant thread. Our own thread's turns (a goal
    continuation carries the original turn as its root) and strangers' are not children."""
    client = established()
    identified(client)

    def started(thread: str, turn: str, root: str) -> dict[str, Any]:
        note = turn_note("turn/started", thread, turn)
        note["params"]["turn"]["rootTurnId"] = root
        return note

    step = client.receive(started("thr_g", "tg", "turn_1"))
    assert [e.kind for e in step.events] == ["session.info"]
    [unparsed] = client.receive(started("thr_x", "tx", "turn_elsewhere")).events
    assert unparsed.kind == "agent.unparsed"
    client.receive(started("thr_1", "turn_1", "turn_1"))
    assert client.children == {"thr_g": "tg"}
    sent = client.cancel().send
    assert [m["params"] for m in sent] == [
        {"threadId": "thr_1", "turnId": "turn_1"},
        {"threadId": "thr_g", "turnId": "tg"},
    ]
    client.receive(turn_note("turn/completed", "thr_g", "tg", "interrupted"))
    client.receive(turn_note("turn/completed", "thr_1", "turn_1", "interrupted"))
    client.receive({"id": 5, "result": {}})
    # A child turn of a finished turn of ours (a follow-up task) is still one of ours.
    client.receive(started("thr_h", "th", "turn_1"))
    assert client.children == {"thr_g": None, "thr_h": "th"}


def test_child_spawned_before_our_thread_is_known_is_not_adopted() -> None:
    client = CodexClient()
    client.start(cwd="/w")
    client.receive(spawned("thr_c", parent="thr_1"))
    assert client.children == {}


def test_idle_children_are_not_interrupted_and_no_details() -> None:
    client = established()
    identified(client)
    client.receive(spawned("thr_c"))
    client.receive(turn_note("turn/started", "thr_c", "tc"))
    client.receive(turn_note("turn/completed", "thr_c", "tc", "completed"))
    [interrupt] = client.cancel().send
    assert interrupt["params"] == {"threadId": "thr_1", "turnId": "turn_1"}
    client.receive(turn_note("turn/completed", "thr_1", "turn_1", "interrupted"))
    [finished] = client.receive({"id": 4, "result": {}}).events
    assert isinstance(finished, TurnFinished)
    assert finished.details == {"background_terminals": "cleaned"}


def test_child_of_an_earlier_turn_still_running_is_stopped() -> None:
    client = established()
    identified(client)
    client.receive(spawned("thr_c"))
    client.receive(turn_note("turn/started", "thr_c", "tc"))
    client.receive(turn_note("turn/completed", "thr_1", "turn_1", "completed"))
    [start] = client.prompt("t2", "again").send
    client.receive({"id": start["id"], "result": {"turn": {"id": "turn_2"}}})
    sent = client.cancel().send
    assert [m["params"] for m in sent] == [
        {"threadId": "thr_1", "turnId": "turn_2"},
        {"threadId": "thr_c", "turnId": "tc"},
    ]


def test_cancel_before_identified_stops_children_at_once_and_root_later() -> None:
    client = established()
    identified(client)
    client.receive(spawned("thr_c"))
    client.receive(turn_note("turn/started", "thr_c", "tc"))
    client.receive(turn_note("turn/completed", "thr_1", "turn_1", "completed"))
    [start] = client.prompt("t2", "again").send
    [child] = client.cancel().send
    assert child["params"] == {"threadId": "thr_c", "turnId": "tc"}
    [root] = client.receive({"id": start["id"], "result": {"turn": {"id": "turn_2"}}}).send
    assert root["params"] == {"threadId": "thr_1", "turnId": "turn_2"}


# Any order of child spawns, child turns, cancels, the root's end and every answer.
ACTIONS = [
    "spawn",
    "child_started",
    "child_completed",
    "cancel",
    "root_completed",
    "answer_ok",
    "answer_error",
    "clean",
    "goal_active",
    "goal_answer",
    "goal_turn",
    "goal_done",
]


@settings(max_examples=400, deadline=None)
@given(script=st.lists(st.sampled_from(ACTIONS), max_size=18), data=st.data())
def test_child_interrupts_once_root_first_one_turn_end(
    script: list[str], data: st.DataObject
) -> None:
    """Each child turn is interrupted at most once and only after a cancel; in the cancel's own
    step the goal pause and the root interrupt come first; the turn ends at most once, never
    while anything the cancel sent is unanswered or a goal turn may follow, and always once
    everything has answered and no goal turn can follow (goal turns the server starts while
    the goal is active are part of the turn)."""
    client = established()
    identified(client)
    interrupted: list[tuple[str, str]] = []
    outstanding: dict[int, dict[str, Any]] = {}  # our requests not answered yet
    finished: list[TurnFinished] = []
    children: list[str] = []
    running: dict[str, str] = {}
    counter = 0
    cancelled = root_done = pause_answered = False
    root = "turn_1"  # the Codex turn our turn runs now (goal turns replace it)
    root_status = ""
    goal: str | None = None
    goal_turns = 0

    def feed(step: Step, *, cancel_step: bool = False) -> None:
        methods = [m.get("method") for m in step.send]
        for message in step.send:
            assert "jsonrpc" not in message
            if (
                message.get("method") == "turn/interrupt"
                and message["params"]["threadId"] != "thr_1"
            ):
                key = (message["params"]["threadId"], message["params"]["turnId"])
                assert key not in interrupted, f"child turn interrupted twice: {key}"
                assert cancelled and not finished
                interrupted.append(key)
            if "id" in message and "method" in message:
                outstanding[message["id"]] = message
        if cancel_step and "thread/goal/set" in methods:
            assert methods.index("thread/goal/set") == 0
        if cancel_step and step.send:
            roots = [
                i
                for i, m in enumerate(step.send)
                if m.get("method") == "turn/interrupt" and m["params"]["threadId"] == "thr_1"
            ]
            if roots:
                assert all(
                    m["params"]["turnId"] == root for i, m in enumerate(step.send) if i in roots
                )
                assert all(
                    i < roots[0]
                    for i, m in enumerate(step.send)
                    if m.get("method") == "thread/goal/set"
                )
                assert roots[0] <= 1
        for event in step.events:
            if isinstance(event, TurnFinished):
                assert root_done
                pending = [
                    m
                    for m in outstanding.values()
                    if m.get("method") in ("thread/goal/set", "thread/backgroundTerminals/clean")
                    or (
                        m.get("method") == "turn/interrupt"
                        and m["params"]["threadId"] != "thr_1"
                        and (m["params"]["threadId"], m["params"]["turnId"]) in running.items()
                    )
                ]
                assert pending == [], f"ended with {pending} unanswered"
                held = root_status == "completed" and goal == "active"
                assert not held or pause_answered, "ended while a goal turn may follow"
                assert event.details.get("goal_turns", 0) == goal_turns
                finished.append(event)

    for action in script:
        if action == "spawn":
            counter += 1
            children.append(f"thr_c{counter}")
            feed(client.receive(spawned(children[-1])))
        elif action == "child_started" and children:
            child = data.draw(st.sampled_from(children))
            if child not in running:
                counter += 1
                running[child] = f"tc{counter}"
                feed(client.receive(turn_note("turn/started", child, running[child])))
        elif action == "child_completed" and running:
            child = data.draw(st.sampled_from(sorted(running)))
            turn = running.pop(child)
            feed(client.receive(turn_note("turn/completed", child, turn, "interrupted")))
            # Its {} (if interrupted) comes with the abort, before turn/completed.
            for rpc_id, message in list(outstanding.items()):
                if message.get("method") == "turn/interrupt" and message["params"] == {
                    "threadId": child,
                    "turnId": turn,
                }:
                    del outstanding[rpc_id]
                    feed(client.receive({"id": rpc_id, "result": {}}))
        elif action == "cancel":
            cancelled = True
            feed(client.cancel(), cancel_step=True)
        elif action == "root_completed" and not root_done:
            root_done = True
            root_status = "interrupted" if cancelled else "completed"
            feed(client.receive(turn_note("turn/completed", "thr_1", root, root_status)))
        elif (
            action == "goal_turn"
            and root_done
            and root_status == "completed"
            and goal == "active"
            and not finished
        ):
            # Codex starts its next goal turn by itself: ours goes on.
            root_done, root_status = False, ""
            goal_turns += 1
            root = f"turn_g{goal_turns}"
            feed(client.receive(turn_note("turn/started", "thr_1", root)))
        elif action == "goal_done" and goal == "active":
            goal = "complete"
            feed(
                client.receive(
                    {
                        "method": "thread/goal/updated",
                        "params": {"threadId": "thr_1", "goal": {"status": "complete"}},
                    }
                )
            )
        elif action in ("answer_ok", "answer_error", "clean", "goal_answer"):
            # A child's {} comes only with its abort (see child_completed); errors any time.
            candidates = sorted(
                rpc_id
                for rpc_id, message in outstanding.items()
                if action == "answer_error"
                or message.get("method") != "turn/interrupt"
                or message["params"]["threadId"] == "thr_1"
            )
            if not candidates:
                continue
            rpc_id = data.draw(st.sampled_from(candidates))
            message = outstanding.pop(rpc_id)
            if message.get("method") == "thread/goal/set":
                pause_answered = True
            if action == "answer_error":
                reply: dict[str, Any] = {
                    "id": rpc_id,
                    "error": {"code": -32600, "message": "no active turn to interrupt"},
                }
            elif message.get("method") == "thread/goal/set":
                reply = {"id": rpc_id, "result": {"goal": {"status": "paused"}}}
                goal = "paused"
            else:
                reply = {"id": rpc_id, "result": {}}
            feed(client.receive(reply))
        elif action == "goal_active":
            goal = "active"
            feed(
                client.receive(
                    {
                        "method": "thread/goal/updated",
                        "params": {"threadId": "thr_1", "goal": {"status": "active"}},
                    }
                )
            )
    assert len(finished) <= 1
    if finished and interrupted:
        listed = [(c["thread_id"], c["turn_id"]) for c in finished[0].details["children"]]
        assert listed == interrupted
    # Liveness: once the root ended and everything it waits on has answered, it is over.
    waiting = [
        m
        for m in outstanding.values()
        if m.get("method") in ("thread/goal/set", "thread/backgroundTerminals/clean")
        or (m.get("method") == "turn/interrupt" and m["params"]["threadId"] != "thr_1")
    ]
    can_follow = root_status == "completed" and goal == "active" and not pause_answered
    if root_done and not waiting and not can_follow:
        assert len(finished) == 1, "everything answered, yet the turn did not end"


# --- tier 2: the actor, on virtual time -----------------------------------------------------


def codex_spec() -> AgentSpec:
    return AgentSpec(name="codex", protocol="codex", command=["codex", "app-server"], grace_s=GRACE)


@asynccontextmanager
async def running_session(
    behaviour: CodexBehaviour | None = None,
) -> AsyncIterator[tuple[Session, MemoryCodexLauncher, Recorder]]:
    launcher = MemoryCodexLauncher(behaviour)
    async with open_supervisor(agents={"codex": codex_spec()}, launcher=launcher) as sup:
        session = await sup.start_session("codex", cwd="/")
        recorder = Recorder(session)
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            yield session, launcher, recorder
            await recorder.catch_up()
            recorder.check_invariants()
            nursery.cancel_scope.cancel()
    assert launcher.violations == []


def child_started(event: ev.Event) -> bool:
    return (
        isinstance(event, ev.SessionInfo)
        and event.info_kind == "turn/started"
        and (event.data.get("threadId") != "thr_1")
    )


def interrupts(launcher: MemoryCodexLauncher) -> list[dict[str, Any]]:
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
        assert receipt.escalation == [
            "interrupt",
            "grace_expired",
            "sigterm",
            "respawned",
            "resumed",
        ]
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
