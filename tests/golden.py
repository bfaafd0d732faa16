"""Golden transcripts: one replay for every protocol machine's tier-1 files.

A transcript is ``{"description", "steps"}``; a step is a ``call`` on the machine (with
``args``), a message from the ``agent``, or a ``check`` of machine properties. Calls and agent
messages list exactly what the machine must ``send`` and which ``events`` it must produce (every
field, stamps left at their defaults) and, optionally, the ``signals`` it must ask for (names,
``["SIGINT"]``: Amp's interrupt); a call may instead ``raises`` an exception (``match``).
Each protocol's test module passes its machine, the properties it may check, and a check for
every message the machine sends (the protocol's wire rules).
"""

from __future__ import annotations

import copy
import json
import signal
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import attrs
import pytest

from protocols import events as ev
from protocols.content import Part
from protocols.machine import AgentProtocol, Control, Step, UnknownPermission
from protocols.mcp import mcp_servers_from_acp

CALLS = {
    "start",
    "prompt",
    "cancel",
    "steer",
    "abandon_steer",
    "close",
    "respond_permission",
    "cancel_permissions",
    "set_mode",
}
EXCEPTIONS: dict[str, type[Exception]] = {
    "UnknownPermission": UnknownPermission,
    "RuntimeError": RuntimeError,
}
STAMP_DEFAULTS = {"session_id": "", "seq": 0, "timestamp": 0.0}


def event_to_dict(event: Any) -> dict[str, Any]:
    """A machine output as written in the golden files."""
    if isinstance(event, Control):
        return {"control": type(event).__name__, **attrs.asdict(event)}
    assert isinstance(event, ev.Event), f"not an event: {event!r}"
    fields = attrs.asdict(event)
    stamp = {key: fields.pop(key) for key in STAMP_DEFAULTS}
    assert stamp == STAMP_DEFAULTS, f"a machine stamped {event!r}"
    assert ev.EVENT_TYPES.get(event.kind) is type(event), f"{event.kind} is not registered"
    return {"kind": event.kind, **fields}


def step_to_dict(step: Step) -> dict[str, Any]:
    assert isinstance(step, Step)
    return {"send": step.send, "events": [event_to_dict(e) for e in step.events]}


def validate_step(step: dict[str, Any], where: str, checks: Collection[str]) -> None:
    """Typos in a golden file must fail loudly rather than check nothing."""
    actions = [key for key in ("call", "agent", "check") if key in step]
    assert len(actions) == 1, f"{where}: exactly one of call/agent/check: {step}"
    allowed = {"note"}
    if "check" in step:
        allowed |= {"check"}
        assert set(step["check"]) <= set(checks), f"{where}: unknown check {step['check']}"
    elif "raises" in step:
        allowed |= {"call", "args", "raises", "match"}
        assert "call" in step, f"{where}: only calls can raise"
        assert step["raises"] in EXCEPTIONS, f"{where}: unknown exception {step['raises']}"
    else:
        allowed |= {"call", "args", "agent", "send", "events", "signals"}
        assert "send" in step and "events" in step, f"{where}: send and events are required"
    if "call" in step:
        assert step["call"] in CALLS, f"{where}: unknown call {step['call']}"
    assert set(step) <= allowed, f"{where}: unexpected keys {set(step) - allowed}"


def run_step(client: AgentProtocol, step: dict[str, Any]) -> Step:
    if "agent" in step:
        return client.receive(copy.deepcopy(step["agent"]))
    method = getattr(client, step["call"])
    args = dict(step.get("args", {}))
    if "mcp_servers" in args:  # written in their ACP form, as a client sends them
        args["mcp_servers"] = mcp_servers_from_acp(args["mcp_servers"])
    if "parts" in args:  # a prompt's content parts, their fields as written
        args["parts"] = tuple(Part(**part) for part in args["parts"])
    result: Step = method(**args)
    return result


def replay(
    path: Path,
    client: AgentProtocol,
    *,
    checks: Collection[str],
    check_sent: Callable[[dict[str, Any], str], None],
    signals_allowed: bool = False,
) -> None:
    """Replay one transcript against a fresh ``client``; any difference fails."""
    transcript = json.loads(path.read_text())
    assert set(transcript) <= {"description", "steps"}
    assert transcript.get("description")
    for index, step in enumerate(transcript["steps"]):
        where = f"{path.name} step {index}"
        validate_step(step, where, checks)
        if "check" in step:
            for name, expected in step["check"].items():
                assert getattr(client, name) == expected, f"{where}: {name}"
            continue
        if "raises" in step:
            with pytest.raises(EXCEPTIONS[step["raises"]]) as info:
                run_step(client, step)
            assert step.get("match", "") in str(info.value), where
            continue
        result = run_step(client, step)
        got = step_to_dict(result)
        expected = {"send": step["send"], "events": step["events"]}
        what = json.dumps(step.get("agent") or step.get("call"))[:300]
        assert got == expected, f"{where}: {what}"
        signals = [signal.Signals(s).name for s in result.signals]
        if "signals" in step:
            assert signals == step["signals"], where
        elif not signals_allowed:
            assert signals == [], where
        for message in got["send"]:
            assert json.loads(json.dumps(message)) == message, where
            check_sent(message, where)
