"""Tests for protocols.acp.AcpClient: golden transcripts replayed against a fresh machine.

Each ``tests/golden/acp/*.json`` file is one conversation::

    {"description": "...",
     "steps": [
        {"call": "start", "args": {"cwd": "/w"}, "send": [...], "events": [...]},
        {"agent": {...one decoded message...}, "send": [...], "events": [...]},
        {"call": "respond_permission", "args": {...}, "raises": "UnknownPermission", "match": "..."},
        {"check": {"pending_permissions": [...], "agent_session_id": "..."}}
     ]}

``call`` is one of the machine's methods (``start``, ``prompt``, ``cancel``,
``respond_permission``, ``cancel_permissions``) with keyword ``args``; ``agent`` is fed to
``receive``. ``send`` is compared exactly with the messages the step produced and ``events``
with its events, each written as ``{"kind": <universal kind>, fields...}`` or
``{"control": <class name>, fields...}`` with *every* field (the stamp fields ``session_id``,
``seq`` and ``timestamp`` are left out: machines must leave them at their defaults, which is
checked too). A call with ``raises`` must raise that exception (``match``: a substring of its
message). ``check`` compares machine properties.

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
from protocols.acp import AcpClient

GOLDEN_DIR = TESTS / "golden" / "acp"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))

CHECKS = {
    "pending_permissions",
    "agent_session_id",
    "agent_info",
    "agent_capabilities",
    "can_steer",
    "modes",
}


def check_jsonrpc(message: dict[str, Any], where: str) -> None:
    """What we send must be JSON-RPC 2.0."""
    assert message.get("jsonrpc") == "2.0", where


def replay(path: Path) -> None:
    golden.replay(path, AcpClient(), checks=CHECKS, check_sent=check_jsonrpc)


def test_golden_files_exist() -> None:
    assert len(GOLDEN_FILES) >= 15


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_transcript(path: Path) -> None:
    replay(path)


# --- Machine-level checks the transcript format does not express ------------------------


def established(*, capabilities: dict[str, Any] | None = None) -> AcpClient:
    client = AcpClient()
    client.start(cwd="/w")
    result: dict[str, Any] = {"protocolVersion": 1}
    if capabilities is not None:
        result["agentCapabilities"] = capabilities
    client.receive({"jsonrpc": "2.0", "id": 0, "result": result})
    step = client.receive({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "sess-1"}})
    assert [type(e).__name__ for e in step.events] == ["SessionEstablished"]
    return client


def permission_request(request_id: Any, option: str = "ok") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "session/request_permission",
        "params": {
            "sessionId": "sess-1",
            "toolCall": {"toolCallId": f"call-{request_id!r}"},
            "options": [{"optionId": option, "name": option, "kind": "allow_once"}],
        },
    }


def test_load_session_capability_must_be_true_not_truthy() -> None:
    client = AcpClient()
    client.start(cwd="/w", resume="sess-old")
    step = client.receive(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": "yes"}},
        }
    )
    assert [m["method"] for m in step.send] == ["session/new"]


def test_capabilities_and_info_are_kept() -> None:
    client = established(capabilities={"loadSession": False, "promptCapabilities": {"image": True}})
    assert client.agent_capabilities == {
        "loadSession": False,
        "promptCapabilities": {"image": True},
    }
    assert client.agent_info == {}


def test_machine_is_registered_as_acp() -> None:
    from protocols import PROTOCOLS, new_machine

    assert PROTOCOLS["acp"] is AcpClient
    assert isinstance(new_machine("acp"), AcpClient)
    with pytest.raises(ValueError, match="unknown protocol"):
        new_machine("nope")


def test_every_session_update_kind_in_the_goldens() -> None:
    """The all-updates transcript really contains every kind the brief lists."""
    transcript = json.loads((GOLDEN_DIR / "prompt_turn_all_updates.json").read_text())
    kinds = {
        step["agent"]["params"]["update"].get("sessionUpdate")
        for step in transcript["steps"]
        if "agent" in step and step["agent"].get("method") == "session/update"
    }
    assert kinds >= {
        "agent_message_chunk",
        "user_message_chunk",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "plan",
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "usage_update",
        "notice",
        "compaction_update",
        "compaction_summary_chunk",
    }


# --- Robustness: no message from the agent crashes the machine ----------------------------

methods = st.sampled_from(
    ["session/update", "session/request_permission", "$/cancel_request", "fs/read_text_file", "x"]
) | st.text(max_size=5)
update_params = st.fixed_dictionaries(
    {"sessionId": st.sampled_from(["sess-1", "other"]) | json_scalars},
    optional={
        "update": st.fixed_dictionaries(
            {
                "sessionUpdate": st.sampled_from(
                    [
                        "agent_message_chunk",
                        "tool_call",
                        "tool_call_update",
                        "plan",
                        "usage_update",
                        "?",
                    ]
                )
                | json_scalars
            },
            optional={
                "content": json_values,
                "toolCallId": json_values,
                "status": json_values,
                "entries": json_values,
                "kind": json_values,
                "title": json_values,
            },
        )
        | json_values
    },
)
agent_messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.just("2.0") | json_scalars,
        "id": st.integers(0, 4) | st.text(max_size=2) | json_values,
        "method": methods | json_values,
        "params": update_params
        | st.fixed_dictionaries({"requestId": st.integers(0, 4)})
        | json_values,
        "result": json_values,
        "error": json_values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(agent_messages, max_size=6), resume=st.sampled_from([None, "old"]))
def test_receive_never_raises(messages: list[dict[str, Any]], resume: str | None) -> None:
    """During the handshake, in a turn, with permissions held: any message is survivable."""
    for phase in range(3):
        client = AcpClient()
        client.start(cwd="/w", resume=resume)
        if phase >= 1:
            client.receive({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}})
            client.receive({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "sess-1"}})
            client.prompt("t1", "go")
        if phase >= 2:
            client.receive(permission_request(3))
        for message in messages:
            step = client.receive(copy.deepcopy(message))
            for event in step.events:
                event_to_dict(event)
        # Whatever happened, the machine can still answer what it holds.
        client.cancel()
        client.cancel_permissions()
        assert client.pending_permissions == []


# --- Bugs found while writing these tests (left failing on purpose) -----------------------


def test_permission_ids_that_differ_only_in_type_are_both_answered() -> None:
    """The agent's ids 1 and "1" are different JSON-RPC requests; both must be answered.

    ACP: the client MUST answer every pending session/request_permission on cancel, or the
    agent (Gemini) blocks forever. Holding them under ``str(id)`` makes the second overwrite
    the first, so the request with integer id 1 is never answered.
    """
    client = established()
    client.prompt("t1", "go")
    client.receive(permission_request(1))
    client.receive(permission_request("1"))
    client.cancel()
    step = client.cancel_permissions()
    answered = sorted((type(m["id"]).__name__, m["id"]) for m in step.send)
    assert answered == [("int", 1), ("str", "1")]


def test_boolean_protocol_version_is_not_version_1() -> None:
    """``"protocolVersion": true`` is not the integer 1 (``True == 1`` in Python)."""
    client = AcpClient()
    client.start(cwd="/w")
    step = client.receive({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": True}})
    assert step.send == []
    assert [type(e).__name__ for e in step.events] == ["StartFailed"]


def test_update_without_session_id_before_the_session_exists_is_unparsed() -> None:
    """Before session/new is answered ``self._session_id`` is None, so an update that has no
    sessionId at all "matches" it and is emitted as a message, while the same update after
    the handshake is agent.unparsed (see unparsed.json)."""
    client = AcpClient()
    client.start(cwd="/w")
    message = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "who am I?"},
            }
        },
    }
    step = client.receive(copy.deepcopy(message))
    assert [event_to_dict(e) for e in step.events] == [{"kind": "agent.unparsed", "raw": message}]
