"""The wire form of events: each class's compiled wire function writes exactly what the
converter's generic hook writes (the definition), byte for byte, for every event class."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from attrs import field, frozen

from protocols import events as ev
from supervisor.wire import (
    dumps,
    event_from_json,
    event_json,
    event_to_wire,
    event_to_wire_by_converter,
)

STAMP: dict[str, Any] = {"session_id": "s-9f2c", "seq": 41, "timestamp": 1796137847.4069664}
RAW_TOOL = {
    "sessionUpdate": "tool_call",
    "toolCallId": "call_7",
    "title": "Read README.md",
    "kind": "read",
    "status": "pending",
    "locations": [{"path": "/work/README.md", "line": None}],
    "rawInput": {"path": "/work/README.md", "limit": 2000, "nested": {"deep": [1, 2.5, True]}},
}
OPTIONS = [
    ev.PermissionOption(option_id="allow", name="Allow once", option_kind="allow_once"),
    ev.PermissionOption(option_id="reject", name="Reject", option_kind="reject_once"),
]

#: Each class with its required fields only (the defaults), and with every field given,
#: optional ones as None where they may be and as values elsewhere, nested values included.
SAMPLES: list[ev.Event] = [
    ev.SessionState(state="ready"),
    ev.SessionState(state="failed", detail="the agent exited 3 times without a turn"),
    ev.SessionRecycled(reason="3 turns failed in a row", failed_turns=3),
    ev.TurnStarted(turn_id="t1", text="fix the failing test"),
    ev.TurnSteered(turn_id="t2", mode="started", text="use pytest"),
    ev.TurnSteered(turn_id="t3", mode="interrupted", text="stop", interrupted_turn_id="t2"),
    ev.MessageDelta(turn_id="t1", text="w0 "),
    ev.MessageDelta(turn_id=None, text='héllo \u2028 "quoted"\n', role="user"),
    ev.ThoughtDelta(turn_id="t1", text="thinking"),
    ev.ThoughtDelta(turn_id=None, text=""),
    ev.ToolCall(turn_id="t1", tool_call_id="call_7"),
    ev.ToolCall(
        turn_id="t1",
        tool_call_id="call_7",
        title="Read README.md",
        tool_kind="read",
        status="pending",
        raw=RAW_TOOL,
    ),
    ev.ToolUpdate(turn_id=None, tool_call_id="call_7"),
    ev.ToolUpdate(turn_id="t1", tool_call_id="call_7", status="completed", raw=RAW_TOOL),
    ev.Plan(turn_id="t1"),
    ev.Plan(
        turn_id="t1",
        entries=[{"content": "read", "priority": "high", "status": "pending"}, {}],
    ),
    ev.PermissionRequested(turn_id="t1", request_id="p1"),
    ev.PermissionRequested(
        turn_id=None, request_id="p1", tool_call={"toolCallId": "call_7"}, options=OPTIONS
    ),
    ev.PermissionResolved(turn_id="t1", request_id="p1", outcome="cancelled"),
    ev.PermissionResolved(
        turn_id=None, request_id="p1", outcome="selected", option_id="allow", by="supervisor"
    ),
    ev.TurnStalled(turn_id="t1", silent_s=30.0, stall_s=30.0),
    ev.TurnStalled(turn_id="t1", silent_s=601.5, stall_s=600, tool_calls=["call_7", "call_8"]),
    ev.TurnEnded(turn_id="t1", outcome="completed"),
    ev.TurnEnded(
        turn_id="t1",
        outcome="killed",
        stop_reason="cancelled",
        error="the agent ignored the interrupt",
        receipt={"outcome": "killed", "escalation": ["interrupt", "kill"], "host": None},
        reason="user",
    ),
    ev.SessionInfo(info_kind="available_commands_update"),
    ev.SessionInfo(info_kind="usage_update", data={"used": 1234, "size": 200000, "cost": None}),
    ev.AgentStderr(line="warning: \udcff not UTF-8"),
    ev.AgentExited(exit_code=None),
    ev.AgentExited(exit_code=137, signal=9, expected=True),
    ev.ErrorEvent(code="agent_invalid_json", message="agent wrote a bad line"),
    ev.StreamGap(from_seq=3, to_seq=9, cause="the node's history no longer reached back"),
    ev.AgentUnparsed(),
    ev.AgentUnparsed(raw={"jsonrpc": "2.0", "method": "x/unknown", "params": [1, None]}),
    ev.AgentUnparsed(raw=[1, "two", 3.0]),
]


def stamped(event: ev.Event) -> ev.Event:
    return attrs.evolve(event, **STAMP)


@frozen(kw_only=True)
class _Nested:
    name: str
    weight: float | None = None


@frozen(kw_only=True)
class FutureEvent(ev.Event):
    """A kind this module does not define: converted fields (a list of attrs, a list of
    strings, a tuple), optional JSON and anything at all."""

    kind = "future.event"
    turn_id: str | None
    parts: list[_Nested] = field(factory=list)
    names: list[str] = field(factory=list)
    pair: tuple[int, str] = (0, "")
    extra: dict[str, Any] | None = None
    anything: Any = None


def test_every_event_class_has_samples() -> None:
    assert {type(event) for event in SAMPLES} == set(ev.EVENT_TYPES.values())


@pytest.mark.parametrize("event", [stamped(e) for e in SAMPLES] + SAMPLES, ids=repr)
def test_the_compiled_wire_form_is_the_converters(event: ev.Event) -> None:
    expected = event_to_wire_by_converter(event)
    wire = event_to_wire(event)
    assert wire == expected
    assert list(wire) == list(expected) and list(wire["data"]) == list(expected["data"])
    assert event_json(event) == dumps(expected)  # the same bytes: the same order, same escapes


@pytest.mark.parametrize("event", [stamped(e) for e in SAMPLES], ids=repr)
def test_the_wire_form_turns_back_into_the_event(event: ev.Event) -> None:
    assert event_from_json(event_json(event)) == event


def test_an_event_class_defined_elsewhere_is_compiled_the_same_way() -> None:
    event = FutureEvent(
        turn_id=None,
        parts=[_Nested(name="a"), _Nested(name="b", weight=0.5)],
        names=["x", "y"],
        pair=(7, "seven"),
        extra={"k": [1, {"v": None}]},
        anything=ev.PermissionOption(option_id="o", name="n", option_kind="k"),
        **STAMP,
    )
    expected = event_to_wire_by_converter(event)
    assert expected["data"]["parts"] == [
        {"name": "a", "weight": None},
        {"name": "b", "weight": 0.5},
    ]
    assert event_to_wire(event) == expected
    assert event_json(event) == dumps(expected)
    default = FutureEvent(turn_id="t1")
    assert event_json(default) == dumps(event_to_wire_by_converter(default))


def test_a_value_msgspec_refuses_is_written_by_the_standard_library() -> None:
    """A lone surrogate an agent sent: escaped, as dumps does; never an error."""
    event = stamped(ev.MessageDelta(turn_id="t1", text="half a pair: \ud800"))
    payload = event_json(event)
    assert payload == dumps(event_to_wire_by_converter(event))
    assert b"\\ud800" in payload
