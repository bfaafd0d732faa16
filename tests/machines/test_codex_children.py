"""Codex sub-agents (child threads) and goals on cancel: the machine alone.

The golden transcripts for this live with the others in ``tests/golden/codex/``
(``children_cancel``, ``children_refused``, ``goal_pause``, ``goal_resume``, ``goal_continue``,
``goal_continue_races``, and ``children_cancel_real`` / ``goal_pause_real``, recorded from the
real 0.171.0 app-server by ``test_real_codex_children.py``) and are replayed by
``test_codex.py`` (and checked against the 0.171.0 schema by ``test_schemas.py``). Here: the
machine's state and invariants under any order of child-thread events. The actor is
``tests/actor/test_codex_children_session.py``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.codex import CodexClient
from protocols.machine import Step, TurnFinished

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
