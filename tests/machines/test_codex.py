"""Tests for protocols.codex.CodexClient: golden transcripts replayed against a fresh machine.

The transcript format is the ACP one (see ``tests/machines/test_acp.py``; its ``event_to_dict`` and
``step_to_dict`` are reused so the two formats cannot drift apart): each
``tests/golden/codex/*.json`` file is one conversation of ``call``/``agent``/``check`` steps
with the exact ``send`` and ``events`` each produced. What differs is the wire: Codex omits
``"jsonrpc"``, so nothing we send may carry it (checked on every step), while the server's
messages are accepted with or without it.

Tier 1: plain pytest, no trio, no I/O beyond reading the golden files.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_strategies import json_scalars, json_values

import golden
from golden import event_to_dict
from paths import TESTS
from protocols.codex import CodexClient
from protocols.machine import Step

GOLDEN_DIR = TESTS / "golden" / "codex"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))

CHECKS = {"pending_permissions", "agent_session_id", "server_info"}


def check_no_jsonrpc(message: dict[str, Any], where: str) -> None:
    """Codex neither sends nor expects "jsonrpc" (jsonrpc_lite.rs)."""
    assert "jsonrpc" not in message, where


def replay(path: Path) -> None:
    golden.replay(path, CodexClient(), checks=CHECKS, check_sent=check_no_jsonrpc)


def test_golden_files_exist() -> None:
    assert len(GOLDEN_FILES) >= 20


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_transcript(path: Path) -> None:
    replay(path)


# --- Machine-level checks the transcript format does not express ------------------------


def established(*, resume: str | None = None) -> CodexClient:
    client = CodexClient()
    client.start(cwd="/w", resume=resume)
    client.receive({"id": 0, "result": {}})
    step = client.receive({"id": 1, "result": {"thread": {"id": "thr_1"}}})
    assert [type(e).__name__ for e in step.events] == ["SessionEstablished"]
    return client


def test_machine_is_registered_as_codex() -> None:
    from protocols import PROTOCOLS, new_machine
    from supervisor.config import KNOWN_PROTOCOLS

    assert PROTOCOLS["codex"] is CodexClient
    assert isinstance(new_machine("codex"), CodexClient)
    assert "codex" in KNOWN_PROTOCOLS
    assert CodexClient.command(["codex", "app-server"], "thr_1") == ["codex", "app-server"]


def test_resume_reply_without_a_thread_keeps_the_asked_thread() -> None:
    client = CodexClient()
    client.start(cwd="/w", resume="thr_old")
    client.receive({"id": 0, "result": {}})
    step = client.receive({"id": 1, "result": {}})
    assert [event_to_dict(e) for e in step.events] == [
        {
            "control": "SessionEstablished",
            "agent_session_id": "thr_old",
            "resumed": True,
            "detail": None,
        }
    ]


def test_every_info_notification_is_session_info() -> None:
    from protocols.codex import _INFO_NOTIFICATIONS

    client = established()
    for method in sorted(_INFO_NOTIFICATIONS - {"turn/started"}):
        step = client.receive({"method": method, "params": {"threadId": "thr_1", "x": 1}})
        [event] = [event_to_dict(e) for e in step.events]
        assert event == {
            "kind": "session.info",
            "info_kind": method,
            "data": {"threadId": "thr_1", "x": 1},
        }, method


# --- Robustness: no message from the server crashes the machine ---------------------------

methods = st.sampled_from(
    [
        "turn/started",
        "turn/completed",
        "item/started",
        "item/completed",
        "item/agentMessage/delta",
        "item/reasoning/textDelta",
        "item/commandExecution/outputDelta",
        "turn/plan/updated",
        "error",
        "serverRequest/resolved",
        "thread/status/changed",
        "item/commandExecution/requestApproval",
        "item/permissions/requestApproval",
        "execCommandApproval",
        "item/tool/requestUserInput",
        "mcpServer/elicitation/request",
    ]
) | st.text(max_size=5)
turn_ids = st.sampled_from(["turn_1", "turn_0", "x"]) | json_scalars
params = (
    st.fixed_dictionaries(
        {},
        optional={
            "threadId": st.sampled_from(["thr_1", "thr_2"]) | json_scalars,
            "turnId": turn_ids,
            "turn": st.fixed_dictionaries(
                {"id": turn_ids},
                optional={
                    "status": st.sampled_from(["completed", "interrupted", "failed"])
                    | json_scalars,
                    "error": json_values,
                },
            )
            | json_values,
            "item": st.fixed_dictionaries(
                {
                    "id": st.text(max_size=3) | json_scalars,
                    "type": st.sampled_from(
                        [
                            "commandExecution",
                            "fileChange",
                            "agentMessage",
                            "mcpToolCall",
                            "contextCompaction",
                            "?",
                        ]
                    )
                    | json_scalars,
                },
                optional={
                    "status": json_values,
                    "command": json_values,
                    "changes": json_values,
                    "server": json_values,
                    "tool": json_values,
                },
            )
            | json_values,
            "delta": json_values,
            "itemId": json_values,
            "plan": json_values,
            "error": json_values,
            "requestId": st.integers(0, 4) | st.text(max_size=2),
            "permissions": json_values,
            "availableDecisions": json_values,
            "command": json_values,
        },
    )
    | json_values
)
server_messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.just("2.0") | json_scalars,
        "id": st.integers(0, 6) | st.text(max_size=2) | json_values,
        "method": methods | json_values,
        "params": params,
        "result": st.fixed_dictionaries({"turn": st.fixed_dictionaries({"id": turn_ids})})
        | json_values,
        "error": st.fixed_dictionaries(
            {
                "code": st.just(-32600),
                "message": st.sampled_from(
                    [
                        "no active turn to interrupt",
                        "expected active turn id turn_1 but found turn_0",
                    ]
                ),
            }
        )
        | json_values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(server_messages, max_size=8), resume=st.sampled_from([None, "thr_old"]))
def test_receive_never_raises(messages: list[dict[str, Any]], resume: str | None) -> None:
    """During the handshake, in a turn, cancelling, with approvals held: anything survives."""
    for phase in range(4):
        client = CodexClient()
        client.start(cwd="/w", resume=resume)
        if phase >= 1:
            client.receive({"id": 0, "result": {}})
            client.receive({"id": 1, "result": {"thread": {"id": "thr_1"}}})
            client.prompt("t1", "go")
        if phase >= 2:
            client.receive(
                {
                    "id": 3,
                    "method": "item/commandExecution/requestApproval",
                    "params": {"threadId": "thr_1", "itemId": "c"},
                }
            )
        if phase >= 3:
            client.receive({"id": 2, "result": {"turn": {"id": "turn_1"}}})
            client.cancel()
        for message in messages:
            step = client.receive(copy.deepcopy(message))
            for event in step.events:
                event_to_dict(event)
            for sent in step.send:
                assert "jsonrpc" not in sent
                json.dumps(sent, allow_nan=False)
        client.cancel()
        client.cancel_permissions()
        assert client.pending_permissions == []


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_never_a_second_interrupt_for_a_live_one(data: st.DataObject) -> None:
    """Edge case 9: an interrupt the server accepted (or has not answered) is never repeated,
    at most two retries follow rejections, and the turn finishes at most once."""
    client = established()
    outstanding: dict[int, str] = {}  # our request id -> Codex turn id, not answered yet
    accepted: set[str] = set()
    interrupts = 0
    finished = 0
    cleans: list[int] = []

    def feed(step: Step) -> None:
        nonlocal interrupts, finished
        for message in step.send:
            assert "jsonrpc" not in message
            if message.get("method") == "turn/interrupt":
                codex_id = message["params"]["turnId"]
                assert codex_id not in outstanding.values(), f"second live interrupt for {codex_id}"
                assert codex_id not in accepted, (
                    f"interrupt repeated after it was accepted: {codex_id}"
                )
                outstanding[message["id"]] = codex_id
                interrupts += 1
            elif message.get("method") == "thread/backgroundTerminals/clean":
                cleans.append(message["id"])
        finished += sum(1 for e in step.events if type(e).__name__ == "TurnFinished")

    [turn_start] = client.prompt("t1", "go").send
    ids = st.sampled_from(["turn_1", "turn_0", "turn_9"])
    for _ in range(data.draw(st.integers(0, 14))):
        action = data.draw(
            st.sampled_from(
                [
                    "cancel",
                    "reply",
                    "started",
                    "completed",
                    "stale",
                    "none",
                    "accept",
                    "clean",
                    "approval",
                ]
            )
        )
        if action == "cancel":
            feed(client.cancel())
        elif action == "reply":
            feed(client.receive({"id": turn_start["id"], "result": {"turn": {"id": "turn_1"}}}))
        elif action == "started":
            feed(
                client.receive(
                    {
                        "method": "turn/started",
                        "params": {"threadId": "thr_1", "turn": {"id": data.draw(ids)}},
                    }
                )
            )
        elif action == "completed":
            status = data.draw(st.sampled_from(["completed", "interrupted", "failed"]))
            feed(
                client.receive(
                    {
                        "method": "turn/completed",
                        "params": {
                            "threadId": "thr_1",
                            "turn": {"id": data.draw(ids), "status": status},
                        },
                    }
                )
            )
        elif action in ("stale", "none", "accept") and outstanding:
            rpc_id = data.draw(st.sampled_from(sorted(outstanding)))
            codex_id = outstanding.pop(rpc_id)
            if action == "accept":
                accepted.add(codex_id)
                feed(client.receive({"id": rpc_id, "result": {}}))
            else:
                text = (
                    f"expected active turn id {codex_id} but found {data.draw(ids)}"
                    if action == "stale"
                    else "no active turn to interrupt"
                )
                feed(client.receive({"id": rpc_id, "error": {"code": -32600, "message": text}}))
        elif action == "clean" and cleans:
            feed(client.receive({"id": cleans.pop(), "result": {}}))
        elif action == "approval":
            feed(
                client.receive(
                    {
                        "id": 0,
                        "method": "item/fileChange/requestApproval",
                        "params": {"threadId": "thr_1", "itemId": "p"},
                    }
                )
            )
            feed(client.cancel_permissions())
    assert interrupts <= 3
    assert finished <= 1


def test_an_error_naming_a_turn_by_a_list_is_told_not_raised() -> None:
    # ``named in turn.aliases`` of a list raised TypeError: the session logged a traceback.
    client = established()
    [turn_start] = client.prompt("t1", "go").send
    client.receive({"id": turn_start["id"], "result": {"turn": {"id": "turn_1"}}})
    note = {"method": "error", "params": {"turnId": [1], "error": {"message": "boom"}}}
    step = client.receive(note)
    assert [e.kind for e in step.events] == ["error"]
