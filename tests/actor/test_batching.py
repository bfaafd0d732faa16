"""Streaming in batches: every batched layer does exactly what one line at a time did.

A run of agent lines is split (``LineDecoder.feed_lines``), decoded (``decode_lines``), fed to
the machine (``receive_many``), encoded (``events_json``) and framed (``text_frames``) a run
at a time. Each is checked here against its one-at-a-time counterpart over inputs that take
every branch: bad lines, oversize lines, ``\\r\\n`` split across reads, machines that fail on
one message, controls in the middle of a run, every event class on the wire.
"""

from __future__ import annotations

import json
import random
from typing import Any

import attrs
import msgspec
import pytest
import trio
import trio.testing

import helpers
from protocols import events as ev
from protocols.acp import AcpClient, TextChunk
from protocols.framing import (
    FramingError,
    LineDecoder,
    Message,
    RawLine,
    decode_line,
    decode_lines,
    encode_message,
)
from protocols.machine import PartialStep, Step, TurnFinished
from supervisor import AgentSpec
from supervisor.agents.link import AgentLines
from supervisor.receipt import CancelReceipt, DroppedPrompt, new_cancel_receipt
from supervisor.runtime.fanout import Fanout, Subscription
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import (
    converter,
    dumps,
    event_json,
    event_to_wire,
    events_json,
    receipt_to_wire,
)
from supervisor.wire.frames import frame_payload, text_frame, text_frames

# -- framing -------------------------------------------------------------------------------------


def _reference_lines(stream: bytes, limit: int) -> list[Any]:
    """The framing rules, spelled out: a line ends at b"\\n" (or the stream's end), one
    trailing b"\\r" is dropped, a line over the limit is an oversize error of its size, and
    blank lines are skipped."""
    out: list[Any] = []
    for line in stream.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > limit:
            out.append(("oversize", len(line)))
        elif line and not line.isspace():
            out.append(line)
    return out


def _chunks(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _summary(lines: list[RawLine]) -> list[Any]:
    return [line if isinstance(line, bytes) else (line.kind, line.size) for line in lines]


@pytest.mark.parametrize("seed", range(60))
def test_feed_lines_in_any_chunking_matches_line_by_line(seed: int) -> None:
    rng = random.Random(seed)
    pieces = [
        b'{"a":1}',
        b'{"b":"x y"}\r',  # a \r\n line
        b"",  # blank
        b"   ",  # whitespace only
        b"x" * 40,  # oversize at the limit below
        b" " * 45,  # oversize and blank: still oversize
        b"not json",
        b'{"c":[1,2,3]}',
        b"\r",
    ]
    stream = b"\n".join(rng.choice(pieces) for _ in range(rng.randint(1, 20)))
    if rng.random() < 0.5:
        stream += b"\n"
    limit = 32
    expected = _reference_lines(stream, limit)
    decoder = LineDecoder(max_line_bytes=limit)
    got: list[RawLine] = []
    for chunk in _chunks(stream, rng) if len(stream) > 1 else [stream]:
        got += decoder.feed_lines(chunk)
    got += decoder.end_lines()
    assert _summary(got) == expected


def test_feed_lines_fast_path_returns_lines_in_one_split() -> None:
    decoder = LineDecoder()
    assert decoder.feed_lines(b'{"a":1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert decoder.feed_lines(b":3}\n\n  \n") == [b'{"c":3}']
    assert decoder.buffered_bytes == 0
    # a \r\n split across two reads: the \r held with the line, stripped at its \n
    assert decoder.feed_lines(b'{"d":4}\r') == []
    assert decoder.feed_lines(b"\n") == [b'{"d":4}']


def test_decode_lines_matches_decode_line() -> None:
    oversize = FramingError(kind="oversize", detail="too long", excerpt="x", size=99)
    lines: list[RawLine] = [
        b'{"jsonrpc":"2.0","method":"m","params":{"n":1}}',
        b"[1,2]",
        b'{"x":NaN}',  # only the standard library takes it
        b"\xff\xfe",
        b"{broken",
        oversize,
        b'{"big":' + b"1" * 30 + b"}",  # over the limit given below
        b'{"ok":"\xc3\xa9"}',
        b'"just a string"',
    ]
    expected = []
    for line in lines:
        frame = line if isinstance(line, FramingError) else decode_line(line, 32)
        if frame is not None:
            expected.append(frame.payload if isinstance(frame, Message) else frame)
    got = decode_lines(lines, 32)
    assert len(got) == len(expected) == len(lines)
    for a, b in zip(got, expected, strict=True):
        if isinstance(b, dict):
            assert a == b and type(a) is dict
        else:
            assert isinstance(a, FramingError) and attrs.asdict(a) == attrs.asdict(b)
    # the whole run in C: every line an object
    good = [b'{"a":1}', b'{"b":[2]}']
    assert decode_lines(good) == [{"a": 1}, {"b": [2]}]


def _lines_of(messages: list[Any]) -> list[RawLine]:
    return [json.dumps(m, separators=(",", ":")).encode() for m in messages]


def _hot_lines() -> list[RawLine]:
    """Text chunks, and lines that only look like one (a field more or less, another type of
    content, a duplicate key, another key order or spacing), among the lines of a turn."""
    chunk = _chunk("s1", "a word ")
    extra = json.loads(json.dumps(chunk))
    extra["params"]["update"]["content"]["annotations"] = {"priority": 1}
    meta = {**chunk, "params": {**chunk["params"], "_meta": {"x": 1}}}
    spaced = json.dumps(chunk, indent=1).replace("\n", " ").encode()
    return [
        *_lines_of(
            [chunk, extra, meta, {**chunk, "id": 3}, _chunk("s1", "t", "agent_thought_chunk")]
        ),
        spaced,
        b'{"params":{"update":{"content":{"text":"reordered","type":"text"},'
        b'"sessionUpdate":"agent_message_chunk"},"sessionId":"s1"},'
        b'"method":"session/update","jsonrpc":"2.0"}',
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"image","type":"text",'
        b'"text":"dup"}}}}',
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":7}}}}',
        *_lines_of(_turn_messages("s1")),
        b"{broken",
        FramingError(kind="oversize", detail="too long", excerpt="x", size=99),
        b"",
    ]


def test_decode_lines_with_a_hot_decoder_is_decode_lines_with_chunks_typed() -> None:
    """What decode_lines makes of each line, with a text chunk of a run typed (exactly the
    dict its line is, as attributes) and every other line as it was; a run of chunks alone
    stays one call in C; a line alone is a dict, as without the hot decoder."""
    hot = AcpClient().hot_decoder
    assert hot is not None
    lines = _hot_lines()
    plain = decode_lines(lines)
    typed = decode_lines(lines, hot=hot)
    assert len(typed) == len(plain)
    kinds = []
    for a, b in zip(typed, plain, strict=True):
        if isinstance(a, TextChunk):
            assert msgspec.to_builtins(a) == b and type(b) is dict
        elif isinstance(b, FramingError):
            assert isinstance(a, FramingError) and attrs.asdict(a) == attrs.asdict(b)
        else:
            assert a == b and type(a) is dict
        kinds.append(type(a).__name__)
    # the plain chunk, the spaced and reordered ones, and the turn's three plain chunks only
    assert [i for i, kind in enumerate(kinds) if kind == "TextChunk"] == [0, 5, 6, 9, 23, 26, 28]
    assert lines[-1] == b""  # the one line decode_lines drops: last, so the others pair up
    for line in lines[:-1]:  # a line alone in its run: what it is without the hot decoder
        (got,) = decode_lines([line], hot=hot)
        (alone,) = decode_lines([line])
        assert type(got) is type(alone) and not isinstance(got, TextChunk)
        assert (attrs.asdict(got) if isinstance(got, FramingError) else got) == (
            attrs.asdict(alone) if isinstance(alone, FramingError) else alone
        )
    assert decode_lines([b""], hot=hot) == []
    chunks = _lines_of([_chunk("s1", f"w{i} ") for i in range(5)])
    assert [c.params.update.content.text for c in decode_lines(chunks, hot=hot)] == [
        f"w{i} " for i in range(5)
    ]


def test_acp_receive_many_takes_typed_chunks_as_the_dicts_they_are() -> None:
    """Fed typed chunks, the machine makes what it makes of their dicts: in a turn, in the
    history a ``session/load`` replays (dropped), for another session (unparsed, the raw
    message a dict)."""
    hot = AcpClient().hot_decoder
    assert hot is not None
    messages = [
        *_turn_messages("s1"),
        _chunk("other-session", "not ours"),
    ]
    results = []
    for typed in (False, True):
        machine, session_id = _established_acp()
        machine.prompt("t1", "hi")
        decoded = decode_lines(_lines_of(messages), hot=hot if typed else None)
        results.append(_in_runs(machine, decoded))
    (plain, plain_used), (typed_step, typed_used) = results
    assert typed_step.events == plain.events and typed_step.send == plain.send
    assert typed_used == plain_used
    unparsed = [e for e in typed_step.events if isinstance(e, ev.AgentUnparsed)]
    assert unparsed[-1].raw == _chunk("other-session", "not ours")
    assert type(unparsed[-1].raw) is dict

    machine = AcpClient()
    machine.start(cwd="/", resume="s1")
    capabilities = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}
    machine.receive({"jsonrpc": "2.0", "id": 0, "result": capabilities})
    replay = decode_lines(_lines_of([_chunk("s1", "old"), _chunk("s1", "words")]), hot=hot)
    assert all(isinstance(m, TextChunk) for m in replay)
    assert machine.receive_many(replay) == (Step(), 2)


def test_a_machine_with_its_own_receive_gets_no_typed_messages() -> None:
    assert AcpClient().hot_decoder is not None
    assert _Scripted().hot_decoder is None  # its receive_many is the default: dicts only


# -- the machines' batch entry ------------------------------------------------------------------


def _established_acp() -> tuple[AcpClient, str]:
    machine = AcpClient()
    machine.start(cwd="/")
    machine.receive(
        {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1, "agentCapabilities": {}}}
    )
    machine.receive({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s1"}})
    return machine, "s1"


def _update(session_id: str, update: dict[str, Any]) -> dict[str, Any]:
    params = {"sessionId": session_id, "update": update}
    return {"jsonrpc": "2.0", "method": "session/update", "params": params}


def _chunk(session_id: str, text: str, kind: str = "agent_message_chunk") -> dict[str, Any]:
    return _update(session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})


def _turn_messages(session_id: str) -> list[dict[str, Any]]:
    """A turn's worth of what an ACP agent sends, every kind of update and a few surprises."""
    return [
        _chunk(session_id, "Hello "),
        _chunk(session_id, "thinking", "agent_thought_chunk"),
        _chunk(session_id, "me", "user_message_chunk"),
        _update(session_id, {"sessionUpdate": "agent_message_chunk", "content": {"type": "image"}}),
        _update(session_id, {"sessionUpdate": "agent_message_chunk"}),
        _update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "ls"}),
        _update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "c1"}),
        _update(session_id, {"sessionUpdate": "plan", "entries": [{"content": "a"}, 3]}),
        _update(session_id, {"sessionUpdate": "current_mode_update", "currentModeId": "x"}),
        _update(session_id, {"sessionUpdate": "brand_new_kind"}),
        _update("other-session", {"sessionUpdate": "agent_message_chunk"}),
        {"jsonrpc": "2.0", "method": "session/update", "params": "not a dict"},
        {"method": "session/update", "params": {}},  # no jsonrpc member
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "session/request_permission",
            "params": {"options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}]},
        },
        _chunk(session_id, "after the permission "),
        {"jsonrpc": "2.0", "id": 99, "method": "fs/read_text_file", "params": {}},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 7}},
        _chunk(session_id, "last words"),
        {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}},
        _chunk(session_id, "a late word"),
    ]


def _one_at_a_time(machine: AcpClient, messages: list[dict[str, Any]]) -> Step:
    step = Step()
    for message in messages:
        step.extend(machine.receive(message))
    return step


def _in_runs(machine: Any, messages: list[dict[str, Any]]) -> tuple[Step, list[int]]:
    step = Step()
    used: list[int] = []
    at = 0
    while at < len(messages):
        one, consumed = machine.receive_many(messages, at)
        assert consumed >= 1
        used.append(consumed)
        step.extend(one)
        at += consumed
    return step, used


def test_acp_receive_many_matches_receive_one_at_a_time() -> None:
    results = []
    for feed in (_one_at_a_time, lambda m, msgs: _in_runs(m, msgs)[0]):
        machine, session_id = _established_acp()
        machine.prompt("t1", "hi")
        results.append((feed(machine, _turn_messages(session_id)), machine.pending_permissions))
    (one, pending_one), (runs, pending_runs) = results
    assert runs.events == one.events and runs.send == one.send
    assert pending_runs == pending_one
    assert any(isinstance(e, TurnFinished) for e in runs.events)


def test_acp_receive_many_takes_a_run_of_updates_at_once_and_stops_at_the_rest() -> None:
    machine, session_id = _established_acp()
    machine.prompt("t1", "hi")
    messages = _turn_messages(session_id)
    _, used = _in_runs(machine, messages)
    # the first thirteen are session/update notifications (the 13th lacks "jsonrpc": alone)
    assert used[0] == 12
    assert sum(used) == len(messages)


def test_acp_receive_many_failure_keeps_what_came_before(monkeypatch: pytest.MonkeyPatch) -> None:
    machine, session_id = _established_acp()
    machine.prompt("t1", "hi")
    original = AcpClient._update_event

    def failing(self: AcpClient, params: dict[str, Any], raw: dict[str, Any]) -> ev.Event | None:
        if raw.get("boom"):
            raise RuntimeError("a bug")
        return original(self, params, raw)

    monkeypatch.setattr(AcpClient, "_update_event", failing)
    thought = _chunk(session_id, "b", "agent_thought_chunk")
    messages = [_chunk(session_id, "a"), {**thought, "boom": True}, _chunk(session_id, "c")]
    with pytest.raises(PartialStep) as caught:
        machine.receive_many(messages, 0)
    assert (caught.value.consumed, caught.value.failed) == (1, 1)
    assert [e.text for e in caught.value.step.events] == ["a"]  # type: ignore[union-attr]
    assert isinstance(caught.value.__cause__, RuntimeError)
    step, consumed = machine.receive_many(messages, 2)
    assert consumed == 1 and [e.text for e in step.events] == ["c"]  # type: ignore[union-attr]


class _Scripted(AcpClient):
    """An ACP machine whose ``receive`` is its own: the default ``receive_many`` runs."""

    def receive(self, message: dict[str, Any]) -> Step:
        if message.get("boom"):
            raise RuntimeError("a bug")
        return super().receive(message)


def test_default_receive_many_stops_after_a_control_and_wraps_a_failure() -> None:
    machine = _Scripted()
    machine.start(cwd="/")
    machine.receive(
        {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1, "agentCapabilities": {}}}
    )
    machine.receive({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s1"}})
    machine.prompt("t1", "hi")
    messages = [
        _chunk("s1", "a"),
        _chunk("s1", "b"),
        {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}},
        _chunk("s1", "late"),
        {**_chunk("s1", "x"), "boom": True},
    ]
    step, consumed = machine.receive_many(messages)
    assert consumed == 3  # up to and with the TurnFinished, not past it
    assert [type(e).__name__ for e in step.events] == [
        "MessageDelta",
        "MessageDelta",
        "TurnFinished",
    ]
    with pytest.raises(PartialStep) as caught:
        machine.receive_many(messages, 3)
    assert (caught.value.consumed, caught.value.failed) == (1, 4)
    assert len(caught.value.step.events) == 1
    with pytest.raises(PartialStep) as first:
        machine.receive_many(messages, 4)
    assert (first.value.consumed, first.value.failed) == (0, 4)


def test_receive_many_stops_after_a_message_that_sends() -> None:
    machine, session_id = _established_acp()
    machine.prompt("t1", "hi")
    unknown = {"jsonrpc": "2.0", "id": 5, "method": "terminal/create", "params": {}}
    messages = [unknown, _chunk(session_id, "a")]
    step, consumed = machine.receive_many(messages)
    assert consumed == 1 and step.send and step.send[0]["error"]["code"] == -32601


# -- the wire ----------------------------------------------------------------------------------


def _every_event() -> list[ev.Event]:
    stamp = {"session_id": "sess-1", "seq": 41, "timestamp": 1796139896.3816621}
    option = ev.PermissionOption(option_id="allow", name="Allow", option_kind="allow_once")
    return [
        ev.SessionState(state="running", **stamp),
        ev.SessionState(state="failed", detail="it died: \u00e9\U0001f600", **stamp),
        ev.SessionRecycled(reason="3 failed turns", failed_turns=3, **stamp),
        ev.SessionHeld(held="paused", deadline_s=29.5, queued=2, **stamp),
        ev.SessionHeld(held=None),
        ev.TurnStarted(turn_id="t1", text="hello\nworld", **stamp),
        ev.TurnSteered(turn_id="t1", mode="interrupted", text="go", interrupted_turn_id="t0"),
        ev.TurnSteered(turn_id="t1", mode="injected", text="go", **stamp),
        ev.MessageDelta(turn_id="t1", text="w0 ", **stamp),
        ev.MessageDelta(turn_id=None, text="", role="user"),
        ev.ThoughtDelta(turn_id="t1", text='"quoted"', **stamp),
        ev.ToolCall(turn_id="t1", tool_call_id="c1", title="ls", raw={"a": [1, {"b": None}]}),
        ev.ToolCall(
            turn_id=None, tool_call_id="c2", title="", tool_kind="read", status="pending", raw={}
        ),
        ev.ToolUpdate(turn_id="t1", tool_call_id="c1", status="completed", raw={"x": 1.5}),
        ev.ToolUpdate(turn_id="t1", tool_call_id="c1", status=None, raw={}, **stamp),
        ev.Plan(turn_id="t1", entries=[{"content": "a", "status": "done"}], **stamp),
        ev.Plan(turn_id=None, entries=[]),
        ev.PermissionRequested(
            turn_id="t1", request_id="r1", tool_call={"title": "rm"}, options=[option], **stamp
        ),
        ev.PermissionRequested(turn_id=None, request_id="r2", tool_call={}, options=[]),
        ev.PermissionResolved(
            turn_id="t1", request_id="r1", outcome="selected", option_id="allow", by="client"
        ),
        ev.PermissionResolved(turn_id=None, request_id="r1", outcome="cancelled", by="agent"),
        ev.TurnStalled(turn_id="t1", silent_s=30.0, stall_s=30.0, tool_calls=["c1", "c2"]),
        ev.TurnEnded(turn_id="t1", outcome="completed", stop_reason="end_turn", **stamp),
        ev.TurnEnded(
            turn_id="t1",
            outcome="killed",
            error="boom",
            receipt={"outcome": "killed", "escalation": ["interrupt", "sigterm"], "n": 2**70},
            reason="user",
        ),
        ev.SessionInfo(info_kind="usage_update", data={"used": 10, "size": 100}, **stamp),
        ev.AgentStderr(line="warning: \x00 control", **stamp),
        ev.AgentExited(exit_code=None, signal=9, expected=False),
        ev.AgentExited(exit_code=0, signal=None, expected=True, **stamp),
        ev.ErrorEvent(code="agent_invalid_json", message="bad line", **stamp),
        ev.StreamGap(from_seq=3, to_seq=9, cause="history", **stamp),
        ev.TerminalOutput(data="G1szMm1vaw==", **stamp),
        ev.SessionRewound(turn_id="t1", restored=["a.py"], not_restored=[], **stamp),
        ev.AgentUnparsed(raw={"jsonrpc": "2.0", "method": "x", "params": [1, "two", None]}),
        ev.AgentUnparsed(raw=None, **stamp),
    ]


def test_every_event_class_is_covered() -> None:
    assert {type(e) for e in _every_event()} == set(ev.EVENT_TYPES.values())


@pytest.mark.parametrize("event", _every_event(), ids=lambda e: e.kind)
def test_quick_constructor_makes_what_the_class_makes(event: ev.Event) -> None:
    """Every field given, or the defaults (a factory's called anew each time): the same event,
    still frozen."""
    cls = type(event)
    fields = {a.name: getattr(event, a.name) for a in attrs.fields(cls)}
    make = ev.quick_constructor(cls)
    made = make(**fields)
    assert type(made) is cls and made == event
    required = {a.name: fields[a.name] for a in attrs.fields(cls) if a.default is attrs.NOTHING}
    assert make(**required) == cls(**required)
    with pytest.raises(AttributeError):
        made.seq = 1  # type: ignore[misc]  # still frozen


def test_quick_constructor_calls_factories_and_refuses_what_it_cannot_do() -> None:
    fresh = new_cancel_receipt(session_id="s1", turn_id="t1", outcome="cancelled")
    assert fresh == CancelReceipt(session_id="s1", turn_id="t1", outcome="cancelled")
    other = new_cancel_receipt(session_id="s1", turn_id="t1", outcome="cancelled")
    assert fresh.escalation is not other.escalation and fresh.details is not other.details
    given = {"a": [1]}
    assert (
        new_cancel_receipt(session_id="s", turn_id=None, outcome="killed", details=given).details
        is given
    )
    with pytest.raises(TypeError):
        new_cancel_receipt(session_id="s1", turn_id="t1")  # outcome is required, as for the class

    @attrs.frozen
    class TakesSelf:
        size: int = 1
        box: list[int] = attrs.field(
            default=attrs.Factory(lambda self: [self.size], takes_self=True)
        )

    @attrs.frozen
    class Checked:
        size: int = attrs.field(default=1, validator=attrs.validators.instance_of(int))

    for cls in (TakesSelf, Checked):
        with pytest.raises(TypeError):
            ev.quick_constructor(cls)


def test_new_message_delta_is_message_delta() -> None:
    assert ev.new_message_delta(turn_id="t1", text="a") == ev.MessageDelta(turn_id="t1", text="a")
    with pytest.raises(TypeError):
        ev.new_message_delta(text="a")  # turn_id is required, as for the class


@pytest.mark.parametrize("event", _every_event(), ids=lambda e: e.kind)
def test_compiled_encoder_writes_what_event_to_wire_writes(event: ev.Event) -> None:
    expected = dumps(event_to_wire(event))
    assert event_json(event) == expected
    assert events_json([event]) == [expected]


def test_events_json_of_runs_matches_each_alone() -> None:
    every = _every_event()
    assert events_json(every) == [dumps(event_to_wire(e)) for e in every]
    deltas = [ev.MessageDelta(turn_id="t", text=f"w{i}", seq=i) for i in range(5)]
    assert events_json(deltas) == [dumps(event_to_wire(e)) for e in deltas]
    # one msgspec refuses (a lone surrogate an agent sent): the standard library writes it
    odd = [*deltas, ev.MessageDelta(turn_id="t", text="\ud800", seq=9)]
    assert events_json(odd) == [dumps(event_to_wire(e)) for e in odd]
    assert json.loads(events_json(odd)[-1])["data"]["text"] == "\ud800"
    assert events_json([]) == []


def test_text_frames_match_text_frame_at_every_length_boundary() -> None:
    payloads = [b"x" * n for n in (0, 1, 125, 126, 127, 4095, 4096, 65535, 65536, 70000)]
    assert text_frames(payloads) == [text_frame(p) for p in payloads]
    assert text_frames(payloads) == [text_frame(p) for p in payloads]  # cached headers too
    assert [frame_payload(frame) for frame in text_frames(payloads)] == payloads


# -- the session: a run of lines in one inbox item ----------------------------------------------


def _spec() -> AgentSpec:
    return AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)


async def _events_for(lines_per_item: list[list[bytes]]) -> list[tuple[str, Any, int]]:
    """Start a turn on an in-memory ACP agent, post these lines as its stdout (one inbox item
    per inner list), end the turn, and return every event's kind, data and seq."""
    behaviour = AcpBehaviour(words=1, word_interval=10.0)
    async with helpers.running(AcpLauncher(behaviour), _spec()) as (session, launcher, rec):
        turn = await session.prompt("hello")
        await rec.wait_kind("message.delta")
        link = launcher.links[-1]
        session_id = link.agent.session_id  # type: ignore[attr-defined]
        for lines in lines_per_item:
            text = [line.replace(b"SESSION", session_id.encode()) for line in lines]
            await link.inbox.send(AgentLines(link.generation, text))
        await rec.wait_kind("turn.ended", turn_id=turn.id)
        await rec.catch_up()
        seqs = [e.seq for e in rec.events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # contiguous, in order
        return [
            (e.kind, event_to_wire(e)["data"], e.seq)
            for e in rec.events
            if e.kind not in ("session.state",)
        ]


def _session_lines() -> list[bytes]:
    chunk = _chunk("SESSION", "")
    lines = []
    for index in range(30):
        message = json.loads(json.dumps(chunk))
        message["params"]["update"]["content"]["text"] = f"word{index} "
        if index == 7:
            message["boom"] = True  # the machine fails on this one (see the test)
            message["params"]["update"]["sessionUpdate"] = "agent_thought_chunk"
        lines.append(encode_message(message).rstrip(b"\n"))
    lines.insert(3, b"this is not json")
    lines.insert(12, encode_message(_update("SESSION", {"sessionUpdate": "tool_call"}))[:-1])
    lines.append(encode_message({"jsonrpc": "2.0", "method": "x/unknown"})[:-1])
    # a text chunk (typed when decoded) of another session, on which the machine fails too
    lines.insert(20, encode_message(_chunk("another-session", "explode"))[:-1])
    return lines


async def test_session_handles_a_run_of_lines_as_it_handles_them_one_by_one(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = AcpClient._update_event

    def failing(self: AcpClient, params: dict[str, Any], raw: dict[str, Any]) -> ev.Event | None:
        if raw.get("boom") or params.get("sessionId") == "another-session":
            raise RuntimeError("a bug in the machine")
        return original(self, params, raw)

    monkeypatch.setattr(AcpClient, "_update_event", failing)
    lines = _session_lines()
    batched = await _events_for([lines])
    one_by_one = await _events_for([[line] for line in lines])
    assert [(kind, data) for kind, data, _ in batched] == [
        (kind, data) for kind, data, _ in one_by_one
    ]
    kinds = [kind for kind, _, _ in batched]
    assert kinds.count("agent.unparsed") == 3  # the failing messages, and the unknown method
    assert "error" in kinds  # the bad line
    texts = [data["text"] for kind, data, _ in batched if kind in ("message.delta",)]
    assert texts[1:] == [f"word{i} " for i in range(30) if i != 7]
    unparsed = [data for kind, data, _ in batched if kind == "agent.unparsed"]
    assert unparsed[0]["raw"]["boom"] is True
    assert unparsed[1]["raw"] == _chunk("another-session", "explode")  # as a dict, typed or not


# -- the fan-out -----------------------------------------------------------------------------------


def _fanout_state(publish_in_runs: bool, hold: bool) -> list[Any]:
    fanout = Fanout(history_size=8, hold_unacknowledged=hold)
    subscriptions = [
        fanout.subscribe(None, head_seq=0, max_buffer=5),  # cut off (lagged) mid-run
        fanout.subscribe(None, head_seq=0, max_buffer=100, wire=True),
        fanout.subscribe(None, head_seq=0, max_buffer=40, stall_s=1.0),  # holds the agent back
    ]
    heard: list[int] = []
    subscriptions[1].set_listener(lambda: heard.append(subscriptions[1].pending))
    events: list[ev.Event] = [
        ev.MessageDelta(turn_id="t", text=f"w{i}", session_id="s", seq=i + 1, timestamp=1.0)
        for i in range(70)
    ]
    if publish_in_runs:
        for start in range(0, 70, 23):
            fanout.publish_many(events[start : start + 23])
    else:
        for event in events:
            fanout.publish(event)
    fanout.flush()
    if hold:
        fanout.acknowledge(30)
    return [
        list(fanout.history),
        fanout.head_seq,
        fanout.must_wait(),
        [(s.lagged, s.ended, s.pending) for s in subscriptions],
        subscriptions[1].take_frames(100),
        [e.seq for e in subscriptions[2].take(100)],
        heard[-1:],
    ]


@pytest.mark.parametrize("hold", [False, True])
def test_publish_many_leaves_the_fanout_as_publish_one_at_a_time_does(hold: bool) -> None:
    runs, one_by_one = _fanout_state(True, hold), _fanout_state(False, hold)
    assert runs == one_by_one
    assert runs[3][0] == (True, True, 5) and runs[2] is True
    assert len(runs[0]) == (16 if hold else 8)  # unacknowledged kept up to twice the size


def test_acp_receive_many_drops_the_history_a_load_replays() -> None:
    machine = AcpClient()
    machine.start(cwd="/", resume="s1")
    capabilities = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}
    machine.receive({"jsonrpc": "2.0", "id": 0, "result": capabilities})
    replay = [_chunk("s1", "old words"), _chunk("s1", "more", "agent_thought_chunk")]
    step, consumed = machine.receive_many(replay)
    assert consumed == 2 and step.events == [] and step.send == []
    step, _ = machine.receive_many([{"jsonrpc": "2.0", "id": 1, "result": {}}])
    assert type(step.events[0]).__name__ == "SessionEstablished"
    step, consumed = machine.receive_many([_chunk("s1", "new")])
    assert [e.text for e in step.events] == ["new"]  # type: ignore[union-attr]


def test_compiled_receipt_encoder_writes_what_the_converter_writes() -> None:
    dropped = [DroppedPrompt(turn_id="t2", text="next"), DroppedPrompt(turn_id="t3", text="")]
    receipts = [
        CancelReceipt(session_id="s", turn_id=None, outcome="no_active_turn"),
        CancelReceipt(
            session_id="s",
            turn_id="t1",
            outcome="killed",
            escalation=["interrupt", "grace_expired", "sigkill", "respawned", "resumed"],
            stop_reason="cancelled",
            dropped_prompts=dropped,
            resumed=True,
            elapsed_ms=2001.5,
            grace_s=2.0,
            reason="user",
            details={"children": [1, {"pid": 2}]},
            survivors=[{"pid": 7, "command": "sleep"}],
        ),
        CancelReceipt(session_id="s", turn_id="t1", outcome="unreachable", host="box"),
        CancelReceipt(
            session_id="s",
            turn_id="t2",
            outcome="cancelled",
            changes=[{"path": "a.py", "change": "added"}],
            restored={"restored": ["a.py"], "not_restored": []},
        ),
    ]
    for receipt in receipts:
        expected = converter.unstructure(receipt)
        for absent in ("host", "changes", "restored"):  # None: left out of the wire form
            if expected[absent] is None:
                del expected[absent]
        wire = receipt_to_wire(receipt)
        assert wire == expected and list(wire) == list(expected)
        assert wire["escalation"] is not receipt.escalation  # a copy, as the converter's


def _stamped(seq: int) -> ev.Event:
    if seq % 3 == 0:
        return ev.SessionState(session_id="s", seq=seq, timestamp=2.0, state="ready")
    return ev.MessageDelta(turn_id="t", text=f"w{seq}", session_id="s", seq=seq, timestamp=1.0)


def test_history_serialized_late_is_what_serialized_at_once_would_be() -> None:
    """With no wire subscriber the newest events wait as objects; whenever they are serialized
    (the history read, the session's own wait, the cap reached, a payload given as is, a wire
    subscriber joining), the history holds the same bytes, in the same order, as when each was
    serialized as it came, and replays the same events."""
    rng = random.Random(7)
    total = 600
    events = [_stamped(seq) for seq in range(1, total + 1)]
    eager = Fanout(history_size=120)
    eager.subscribe(None, head_seq=0, max_buffer=total, wire=True)  # forces bytes at once
    lazy = Fanout(history_size=120)
    objects = lazy.subscribe(None, head_seq=0, max_buffer=total)
    wire: Subscription | None = None
    ways = {"payload": 0, "many": 0, "one": 0, "own_wait": 0, "read": 0, "capped": 0}
    index = 0
    while index < total:
        run = events[index : index + rng.choice([1, 1, 1, 2, 3, 7, 30, 70])]
        index += len(run)
        had_waiting = bool(lazy._unserialized)
        way = rng.choice(["payload", "many", "one"])
        if way == "payload":
            for event in run:  # a remote session's events: their bytes as they came
                payload = event_json(event)
                eager.publish(event, payload)
                lazy.publish(event, payload)
        elif way == "many":
            eager.publish_many(run)
            lazy.publish_many(run)
        else:
            for event in run:
                eager.publish(event)
                lazy.publish(event)
        if had_waiting and not lazy._unserialized and way != "payload":
            ways["capped"] += 1
        if had_waiting:
            ways[way] += 1
        assert len(lazy._unserialized) < 64  # the cap holds
        then = rng.random()
        if then < 0.15:
            lazy.serialize()  # the session's own wait
            ways["own_wait"] += 1
        elif then < 0.3:
            assert list(lazy.history) == list(eager.history)
            ways["read"] += 1
        if index > 500 and wire is None:
            wire = lazy.subscribe(None, head_seq=lazy.head_seq, max_buffer=total, wire=True)
        elif wire is not None:
            assert not lazy._unserialized  # from then on each is serialized as it comes
    assert all(ways.values()), ways  # every way was taken with objects waiting
    assert list(lazy.history) == list(eager.history)
    assert lazy.head_seq == eager.head_seq == total
    assert [e.seq for e in objects.take(total)] == list(range(1, total + 1))
    assert wire is not None and all(isinstance(item, bytes) for item in wire.take_frames(total))
    replay = lazy.subscribe(total - 50, head_seq=lazy.head_seq, max_buffer=10)
    assert replay.take(100) == events[total - 50 :]


def test_every_wire_subscriber_is_given_the_same_frames() -> None:
    """An event is framed once for all the wire subscribers (a gateway connection each): they
    hold the very same bytes, the text frames of the history's JSON, however it was published;
    a replay is framed from the history; a wire subscriber that asks for objects gets them."""
    fanout = Fanout(history_size=100)
    objects = fanout.subscribe(None, head_seq=0, max_buffer=100)
    wires = [fanout.subscribe(None, head_seq=0, max_buffer=100, wire=True) for _ in range(3)]
    events = [_stamped(seq) for seq in range(1, 31)]
    fanout.publish_many(events[:20])
    for event in events[20:25]:
        fanout.publish(event)
    for event in events[25:]:
        fanout.publish(event, event_json(event))  # a remote session's: its bytes as they came
    taken = [wire.take_frames(100) for wire in wires]
    assert taken[0] == text_frames(list(fanout.history))
    for frames in taken[1:]:
        assert all(mine is first for mine, first in zip(frames, taken[0], strict=True))
    assert objects.take(100) == events
    replay = fanout.subscribe(10, head_seq=30, max_buffer=5, wire=True)
    assert replay.take_frames(100) == taken[0][10:]
    replay = fanout.subscribe(10, head_seq=30, max_buffer=5, wire=True)
    assert replay.take(100) == events[10:]
    assert objects.take_frames(100) == []
    fanout.publish(_stamped(31))
    assert objects.take_frames(1) == replay.take_frames(1) == [text_frame(fanout.history[-1])]


def test_a_session_with_no_wire_subscriber_keeps_few_objects() -> None:
    """Serialized late, never lost: at most 63 wait, and :meth:`Fanout.serialize` empties them."""
    fanout = Fanout(history_size=1000)
    for seq in range(1, 200):
        fanout.publish(_stamped(seq))
        assert len(fanout._unserialized) < 64
    fanout.serialize()
    assert not fanout._unserialized
    assert [json.loads(b)["seq"] for b in fanout.history] == list(range(1, 200))


def test_a_receipt_changed_by_its_caller_leaves_its_turn_ended_alone() -> None:
    """``turn.ended`` carries the receipt's wire form; the caller's receipt is its own: what it
    does to ``details`` or ``survivors``, at any depth, is not in the event or the history."""
    receipt = CancelReceipt(
        session_id="s1",
        turn_id="t1",
        outcome="killed",
        details={"children": [{"thread_id": "a", "confirmed": True}]},
        survivors=[{"pid": 7, "command": "sleep"}],
    )
    wired = receipt_to_wire(receipt)
    plain = CancelReceipt(session_id="s1", turn_id="t2", outcome="cancelled")
    plain_wired = receipt_to_wire(plain)
    receipt.details["note"] = "mine"
    receipt.details["children"][0]["confirmed"] = False
    receipt.survivors[0]["pid"] = 8
    plain.details["note"] = "mine"
    plain.survivors.append({"pid": 9})
    assert wired["details"] == {"children": [{"thread_id": "a", "confirmed": True}]}
    assert wired["survivors"] == [{"pid": 7, "command": "sleep"}]
    assert plain_wired["details"] == {} and plain_wired["survivors"] == []
