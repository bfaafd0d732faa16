"""Tests for protocols.claude.ClaudeClient: golden transcripts replayed against a fresh machine.

The transcript format is the ACP one (see ``tests/machines/test_acp.py``; its ``event_to_dict`` and
``step_to_dict`` are reused so the formats cannot drift apart): each
``tests/golden/claude/*.json`` file is one conversation of ``call``/``agent``/``check`` steps
with the exact ``send`` and ``events`` each produced. The machine is built with a constant
request-id nonce (``0a0b0c0d``), so our ids read ``req_<n>_0a0b0c0d``. What differs is the wire:
stream-json has no JSON-RPC, so everything we send must be a ``user`` message or a control
envelope (checked on every step). Agent messages are trimmed from Claude Code 2.1.332 output.

Tier 1: plain pytest, no trio, no I/O beyond reading the golden files.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_strategies import json_scalars, json_values

import golden
from golden import event_to_dict
from paths import TESTS
from protocols import PROTOCOLS, new_machine
from protocols.claude import CLAUDE_COMMAND, ClaudeClient
from protocols.machine import SessionEstablished, TurnFinished

GOLDEN_DIR = TESTS / "golden" / "claude"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
NONCE = "0a0b0c0d"

CHECKS = {"pending_permissions", "agent_session_id", "initialize_response", "can_steer"}
OUR_REQUEST_ID = re.compile(r"^req_[1-9][0-9]*_[0-9a-f]{8}$")


def machine() -> ClaudeClient:
    steers = itertools.count(1)
    return ClaudeClient(
        new_hex=lambda: NONCE, new_uuid=lambda: f"00000000-0000-4000-8000-{next(steers):012d}"
    )


def check_wire(message: dict[str, Any], where: str) -> None:
    """What we write is stream-json: a user message or a control envelope, never JSON-RPC."""
    assert json.loads(json.dumps(message)) == message, where
    assert "jsonrpc" not in message and "id" not in message, where
    kind = message.get("type")
    if kind == "user":
        keys = {"type", "message", "parent_tool_use_id", "session_id"}
        if "priority" in message:  # a steer: its uuid names it in every later line about it
            keys |= {"uuid", "priority"}
            assert message["priority"] in ("now", "next"), where
        assert set(message) == keys, where
        assert message["message"]["role"] == "user", where
        assert isinstance(message["session_id"], str), where
    elif kind == "control_request":
        assert set(message) == {"type", "request_id", "request"}, where
        assert OUR_REQUEST_ID.match(message["request_id"]), where
        assert message["request"]["subtype"] in ("initialize", "interrupt"), where
    elif kind == "control_response":
        assert set(message) == {"type", "response"}, where
        response = message["response"]
        assert response["subtype"] in ("success", "error"), where
        assert isinstance(response["request_id"], str), where
        assert ("response" in response) == (response["subtype"] == "success"), where
    else:
        raise AssertionError(f"{where}: we sent a {kind!r} message")


def replay(path: Path) -> None:
    # The interrupt is in-band; SIGINT is unreliable in stream-json mode (edge case 20).
    golden.replay(path, machine(), checks=CHECKS, check_sent=check_wire)


def test_golden_files_exist() -> None:
    assert len(GOLDEN_FILES) >= 15


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_transcript(path: Path) -> None:
    replay(path)


# --- Machine-level checks the transcript format does not express ------------------------


def test_registered_as_claude() -> None:
    assert PROTOCOLS["claude"] is ClaudeClient
    assert isinstance(new_machine("claude"), ClaudeClient)


def test_command_without_resume_is_the_configured_one() -> None:
    base = list(CLAUDE_COMMAND)
    assert ClaudeClient.command(base, None) == base
    assert ClaudeClient.command(tuple(base), None) == base
    assert base == list(CLAUDE_COMMAND)  # not mutated


def test_command_with_resume_adds_the_flag() -> None:
    base = ("claude", "-p", "--input-format", "stream-json")
    assert ClaudeClient.command(base, "e3bec06a") == [*base, "--resume", "e3bec06a"]


@pytest.mark.parametrize("announced", ["--help", "-p", "", "a\0b", "a\ud800b"])
def test_an_id_no_command_line_can_carry_is_not_resumed_and_says_so(announced: str) -> None:
    # The CLI announced it: given back as ``--resume ID``, "--help" would be read as a flag,
    # and a NUL or lone surrogate failed the exec, failing the session for good.
    base = ("claude", "-p")
    assert ClaudeClient.command(base, announced) == list(base)
    client = machine()
    client.start(cwd="/w", resume=announced)
    step = client.receive(
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": f"req_1_{NONCE}", "response": {}},
        }
    )
    [established] = step.events
    assert isinstance(established, SessionEstablished)
    assert established.resumed is False and "fresh session" in (established.detail or "")
    assert client.agent_session_id is None


def test_default_request_ids_look_like_the_sdks() -> None:
    """``req_<n>_<8 hex>`` with n counting from 1 and fresh randomness per request."""
    client = ClaudeClient()
    [initialize] = client.start(cwd="/w").send
    client.receive(
        {
            "type": "control_response",
            "response": {
                "subtype": "success",
                "request_id": initialize["request_id"],
                "response": {},
            },
        }
    )
    client.prompt("t1", "go")
    [interrupt] = client.cancel().send
    ids = [initialize["request_id"], interrupt["request_id"]]
    assert all(OUR_REQUEST_ID.match(i) for i in ids)
    assert [i.split("_")[1] for i in ids] == ["1", "2"]


def established(resume: str | None = None) -> ClaudeClient:
    client = machine()
    client.start(cwd="/w", resume=resume)
    step = client.receive(
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": f"req_1_{NONCE}", "response": {}},
        }
    )
    assert [type(e) for e in step.events] == [SessionEstablished]
    return client


def init(session_id: str = "sess-1") -> dict[str, Any]:
    return {"type": "system", "subtype": "init", "session_id": session_id}


def test_agent_session_id_follows_init() -> None:
    client = established()
    assert client.agent_session_id is None
    client.prompt("t1", "go")
    client.receive(init("sess-1"))
    assert client.agent_session_id == "sess-1"
    # What the actor passes as ``resume`` after a kill, before the new CLI said anything:
    resumed = established(resume=client.agent_session_id)
    assert resumed.agent_session_id == "sess-1"


def test_long_errors_are_cut() -> None:
    client = established()
    client.prompt("t1", "go")
    step = client.receive(
        {
            "type": "result",
            "subtype": "error_during_execution",
            "is_error": True,
            "errors": ["x" * 5000],
        }
    )
    [finished] = step.events
    assert isinstance(finished, TurnFinished) and finished.error is not None
    assert len(finished.error) == 500 and finished.error.endswith("…")


def test_interrupt_resent_at_most_once_per_turn() -> None:
    client = established()
    client.prompt("t1", "go")
    sent = client.cancel().send
    for _ in range(3):
        sent += client.receive(init()).send
        sent += client.cancel().send
    assert [m["request"]["subtype"] for m in sent] == ["interrupt", "interrupt"]


def test_respond_after_withdrawal_sends_nothing_at_all() -> None:
    """A withdrawn can_use_tool is never answered, not even by a cancel (edge case 18)."""
    client = established()
    client.prompt("t1", "go")
    client.receive(
        {
            "type": "control_request",
            "request_id": "p1",
            "request": {"subtype": "can_use_tool", "tool_name": "Bash", "input": {}},
        }
    )
    client.receive({"type": "control_cancel_request", "request_id": "p1"})
    assert client.pending_permissions == []
    assert client.cancel_permissions().send == []


# --- Robustness: no message from the CLI crashes the machine ------------------------------

types = (
    st.sampled_from(
        [
            "system",
            "assistant",
            "user",
            "stream_event",
            "result",
            "control_request",
            "control_cancel_request",
            "control_response",
            "tool_progress",
            "auth_status",
        ]
    )
    | json_scalars
)
blocks = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["text", "thinking", "tool_use", "tool_result", "x"])
            | json_scalars
        },
        optional={
            "text": json_values,
            "thinking": json_values,
            "id": json_values,
            "name": json_values,
            "tool_use_id": json_values,
            "is_error": json_values,
        },
    )
    | json_values,
    max_size=3,
)
cli_messages = st.fixed_dictionaries(
    {"type": types},
    optional={
        "subtype": st.sampled_from(["init", "success", "error", "can_use_tool", "status"])
        | json_scalars,
        "session_id": st.sampled_from(["sess-1", "sess-2"]) | json_scalars,
        "request_id": st.sampled_from([f"req_1_{NONCE}", f"req_2_{NONCE}", "p1"]) | json_values,
        "request": st.fixed_dictionaries(
            {"subtype": st.sampled_from(["can_use_tool", "hook_callback"]) | json_scalars},
            optional={"input": json_values, "tool_name": json_values, "tool_use_id": json_values},
        )
        | json_values,
        "response": st.fixed_dictionaries(
            {"request_id": st.sampled_from([f"req_1_{NONCE}", f"req_2_{NONCE}"]) | json_values},
            optional={
                "subtype": st.sampled_from(["success", "error"]) | json_scalars,
                "response": json_values,
                "error": json_values,
            },
        )
        | json_values,
        "message": st.fixed_dictionaries({}, optional={"id": json_values, "content": blocks})
        | json_values,
        "event": st.fixed_dictionaries(
            {
                "type": st.sampled_from(["message_start", "content_block_delta", "ping"])
                | json_scalars
            },
            optional={"delta": json_values, "message": json_values},
        )
        | json_values,
        "parent_tool_use_id": json_values,
        "terminal_reason": st.sampled_from(["completed", "aborted_tools"]) | json_scalars,
        "is_error": json_values,
        "errors": json_values,
        "tool_use_id": json_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(cli_messages, max_size=6), resume=st.sampled_from([None, "old"]))
def test_receive_never_raises(messages: list[dict[str, Any]], resume: str | None) -> None:
    """During the handshake, in a turn, with a permission held: any message is survivable."""
    for phase in range(3):
        client = machine()
        client.start(cwd="/w", resume=resume)
        if phase >= 1:
            client.receive(
                {
                    "type": "control_response",
                    "response": {"subtype": "success", "request_id": f"req_1_{NONCE}"},
                }
            )
            client.prompt("t1", "go")
        if phase >= 2:
            client.receive(
                {
                    "type": "control_request",
                    "request_id": "p1",
                    "request": {"subtype": "can_use_tool", "tool_name": "Bash", "input": {}},
                }
            )
        for message in messages:
            step = client.receive(copy.deepcopy(message))
            for event in step.events:
                event_to_dict(event)
            for sent in step.send:
                check_wire(sent, repr(message))
        # Whatever happened, the machine can still answer what it holds.
        for sent in client.cancel().send + client.cancel_permissions().send:
            check_wire(sent, "after")
        assert client.pending_permissions == []


@pytest.mark.parametrize(
    ("message", "kinds"),
    [
        ({"type": "stream_event", "event": {"type": ["x"]}}, ["agent.unparsed"]),
        (
            {
                "type": "stream_event",
                "event": {"type": "content_block_delta", "delta": {"type": {}}},
            },
            ["agent.unparsed"],
        ),
        # a block of no kind we know is left out, as any unknown block is
        ({"type": "assistant", "message": {"id": "m", "content": [{"type": ["x"]}]}}, []),
    ],
)
def test_an_unhashable_type_is_read_as_unknown_not_an_error(
    message: dict[str, Any], kinds: list[str]
) -> None:
    # A set lookup of a list raised TypeError: the session logged a traceback for each.
    client = established()
    client.prompt("t1", "go")
    step = client.receive(message)
    assert [e.kind for e in step.events] == kinds
