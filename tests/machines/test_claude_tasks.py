"""Claude Code background tasks on cancel: the machine alone (goldens, properties).

It replays ``tests/golden/claude/tasks/*.json`` the way ``test_claude.py`` replays its own
goldens (same step format, same machine with the constant nonce), with one difference in the
wire check: a cancel may now also send ``stop_task`` control requests. ``real_background_shell``
and ``real_background_agent`` are Claude Code 2.1.332's own wire, recorded by
``test_real_claude_tasks.py`` (trimmed as their descriptions say); the others are written in the
same shapes (task ids as 2.1.332 makes them: ``b`` and eight of ``[0-9a-z]`` for a shell, ``a``
and 16 hex digits for a sub-agent) to reach the cases a real run does not: a task that ends by
itself, a refused ``stop_task``, a task started during the cancel or while no turn runs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_claude import CHECKS, NONCE, OUR_REQUEST_ID, machine

import golden
from paths import TESTS
from protocols.amp import AmpClient
from protocols.claude import ClaudeClient
from protocols.machine import Step, TurnFinished

GOLDEN_DIR = TESTS / "golden" / "claude" / "tasks"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
GRACE = 2.0


def check_wire(message: dict[str, Any], where: str) -> None:
    """Stream-json as ``test_claude.check_wire`` has it, plus ``stop_task`` requests."""
    assert json.loads(json.dumps(message)) == message, where
    kind = message.get("type")
    if kind == "control_request":
        assert set(message) == {"type", "request_id", "request"}, where
        assert OUR_REQUEST_ID.match(message["request_id"]), where
        request = message["request"]
        assert request["subtype"] in ("initialize", "interrupt", "stop_task"), where
        if request["subtype"] == "stop_task":
            # SDKControlStopTaskRequest: exactly {subtype, task_id}.
            assert set(request) == {"subtype", "task_id"}, where
            assert isinstance(request["task_id"], str), where
    elif kind == "user":
        assert set(message) == {"type", "message", "parent_tool_use_id", "session_id"}, where
    elif kind == "control_response":
        assert set(message) == {"type", "response"}, where
    else:
        raise AssertionError(f"{where}: we sent a {kind!r} message")


def replay(path: Path) -> None:
    golden.replay(path, machine(), checks=CHECKS, check_sent=check_wire)


def test_golden_files_exist() -> None:
    assert len(GOLDEN_FILES) >= 2


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_transcript(path: Path) -> None:
    replay(path)


# --- machine-level checks ---------------------------------------------------------------


def ack(n: int, *, error: str | None = None) -> dict[str, Any]:
    if error is not None:
        response = {"subtype": "error", "request_id": f"req_{n}_{NONCE}", "error": error}
    else:
        response = {"subtype": "success", "request_id": f"req_{n}_{NONCE}", "response": {}}
    return {"type": "control_response", "response": response}


def started(task_id: str) -> dict[str, Any]:
    return {
        "type": "system",
        "subtype": "task_started",
        "task_id": task_id,
        "description": task_id,
        "task_type": "local_bash",
        "session_id": "s",
    }


def running_turn(client: ClaudeClient, turn: str = "t1") -> None:
    client.prompt(turn, "go")
    client.receive({"type": "system", "subtype": "init", "session_id": "s"})


def established() -> ClaudeClient:
    client = machine()
    client.start(cwd="/w")
    client.receive(ack(1))
    return client


def test_tasks_end_by_notification_or_update() -> None:
    client = established()
    running_turn(client)
    for task_id in ("b1", "b2", "b3", "b4"):
        client.receive(started(task_id))
    client.receive(
        {"type": "system", "subtype": "task_notification", "task_id": "b1", "status": "failed"}
    )
    client.receive(
        {
            "type": "system",
            "subtype": "task_updated",
            "task_id": "b2",
            "patch": {"status": "killed"},
        }
    )
    client.receive(
        {
            "type": "system",
            "subtype": "task_updated",
            "task_id": "b3",
            "patch": {"status": "running"},
        }
    )
    assert client.running_tasks == {"b3": "t1", "b4": "t1"}
    stops = [m["request"] for m in client.cancel().send[1:]]
    assert stops == [
        {"subtype": "stop_task", "task_id": "b3"},
        {"subtype": "stop_task", "task_id": "b4"},
    ]


def test_no_tasks_no_details_and_no_stop() -> None:
    client = established()
    running_turn(client)
    assert [m["request"]["subtype"] for m in client.cancel().send] == ["interrupt"]
    [finished] = client.receive(
        {
            "type": "result",
            "subtype": "error_during_execution",
            "is_error": True,
            "terminal_reason": "aborted_streaming",
        }
    ).events
    assert isinstance(finished, TurnFinished) and finished.details == {}


def test_amp_cancel_is_a_signal_and_never_stops_tasks() -> None:
    """Amp writes Claude-like task lines but has no control protocol: no stop_task, ever."""
    client = AmpClient()
    client.start(cwd="/w")
    client.prompt("t1", "go")
    client.receive(started("b1"))
    step = client.cancel()
    assert step.send == [] and step.signals
    assert client.receive(started("b2")).send == []


# Every order of: the result, the interrupt's answer, task starts and ends, stop_task answers.
actions = st.lists(
    st.sampled_from(
        ["start", "end", "cancel", "result", "answer_ok", "answer_error", "init", "late_result"]
    ),
    max_size=16,
)


@settings(max_examples=300, deadline=None)
@given(script=actions, data=st.data())
def test_one_stop_per_task_interrupt_first_one_turn_end(
    script: list[str], data: st.DataObject
) -> None:
    """Any order of task starts and ends, cancels, results and answers: each task is stopped
    at most once, never before the interrupt nor after the turn's end; the turn ends once, not
    while a stop_task is unanswered, and does end once the result came and all are answered."""
    client = established()
    running_turn(client)
    sent: list[dict[str, Any]] = []
    finished: list[TurnFinished] = []
    pending: list[str] = []  # our stop_task request ids not answered yet
    counter = 0
    result_seen = False

    def feed(step: Step) -> None:
        for message in step.send:
            check_wire(message, "property")
            sent.append(message)
            if message["request"]["subtype"] == "stop_task":
                assert not finished, "stop_task after the turn ended"
                pending.append(message["request_id"])
        for event in step.events:
            if isinstance(event, TurnFinished):
                assert pending == [], "the turn ended with a stop_task unanswered"
                finished.append(event)

    for action in script:
        if action == "start":
            counter += 1
            feed(client.receive(started(f"b{counter}")))
        elif action == "end" and counter:
            task = f"b{data.draw(st.integers(1, counter))}"
            feed(
                client.receive(
                    {
                        "type": "system",
                        "subtype": "task_notification",
                        "task_id": task,
                        "status": "stopped",
                    }
                )
            )
        elif action == "cancel":
            feed(client.cancel())
        elif action in ("result", "late_result"):
            result_seen = True
            feed(
                client.receive(
                    {
                        "type": "result",
                        "subtype": "success",
                        "is_error": False,
                        "terminal_reason": "completed",
                    }
                )
            )
        elif action.startswith("answer") and pending:
            request_id = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
            error = "no" if action == "answer_error" else None
            feed(client.receive(ack(int(request_id.split("_")[1]), error=error)))
        elif action == "init":
            feed(client.receive({"type": "system", "subtype": "init", "session_id": "s"}))
    requests = [m["request"] for m in sent]
    stopped = [r["task_id"] for r in requests if r["subtype"] == "stop_task"]
    assert len(stopped) == len(set(stopped)), "a task was stopped twice"
    if stopped:
        assert requests[0]["subtype"] == "interrupt", "a stop_task before the interrupt"
    assert len(finished) <= 1
    if finished and stopped:
        assert [t["task_id"] for t in finished[0].details["tasks"]] == stopped
    if result_seen and not pending:
        assert len(finished) == 1, "the result came and every stop was answered"


def test_details_at_kill_only_for_a_running_cancel() -> None:
    """Nothing before a cancel, nothing once the turn ended; unanswered stops unconfirmed."""
    client = established()
    running_turn(client)
    client.receive(started("b1"))
    client.receive(started("b2"))
    assert client.details_at_kill() == {}
    client.cancel()
    client.receive(ack(3))  # b1's stop_task answered
    assert client.details_at_kill() == {
        "tasks": [{"task_id": "b1", "confirmed": True}, {"task_id": "b2", "confirmed": False}]
    }
    client.receive(ack(4))
    client.receive(
        {"type": "result", "subtype": "success", "is_error": False, "terminal_reason": "completed"}
    )
    assert client.details_at_kill() == {}


def test_copy_is_not_mutated() -> None:
    message = started("b1")
    before = copy.deepcopy(message)
    client = established()
    running_turn(client)
    client.receive(message)
    assert message == before
