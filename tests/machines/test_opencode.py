"""Tests for protocols.opencode.OpenCodeClient: golden transcripts replayed against a fresh machine.

The transcript format is the ACP one (see ``tests/machines/test_acp.py``; its ``event_to_dict`` and
``step_to_dict`` are reused). What differs is the wire: the machine sends HTTP request
envelopes ``{"http": {"id", "method", "path", "json"?}}`` and is fed ``{"http_response": ...}``,
``{"sse": event}`` and ``{"transport": "ready"}``. The ``sse`` payloads of most transcripts were
captured from the real ``opencode serve`` 1.18.33 driven by a fake model (``streamed_turn``,
``abort``, ``abort_before_busy``, ``permission_once``, ``cancel_with_permission``,
``error_after_idle``); the others are written by hand in the same shapes.

Also here: the server-sent-events decoder of ``supervisor/agents/http_link.py`` (sans-IO as well).

Tier 1: plain pytest, no trio, no I/O beyond reading the golden files.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_strategies import json_values_of

import golden
from golden import event_to_dict
from paths import TESTS
from protocols.framing import FramingError, Message
from protocols.machine import Step, TurnFinished
from protocols.opencode import OpenCodeClient
from supervisor.agents.http_link import SseDecoder

GOLDEN_DIR = TESTS / "golden" / "opencode"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))

CHECKS = {"pending_permissions", "agent_session_id", "server_info"}
METHODS = {"GET", "POST"}
SID = "ses_1"


def check_envelope(message: dict[str, Any], where: str) -> None:
    """Every message is one HTTP request the link can run: never the blocking /message."""
    assert set(message) == {"http"}, where
    request = message["http"]
    assert set(request) <= {"id", "method", "path", "json"}, where
    assert isinstance(request["id"], int) and request["method"] in METHODS, where
    assert request["path"].startswith("/") and not request["path"].endswith("/message"), where


def replay(path: Path) -> None:
    golden.replay(path, OpenCodeClient(), checks=CHECKS, check_sent=check_envelope)


def test_golden_files_exist() -> None:
    assert len(GOLDEN_FILES) >= 14


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_transcript(path: Path) -> None:
    replay(path)


# --- Machine-level checks the transcript format does not express ------------------------


def busy(session: str = SID) -> dict[str, Any]:
    return {
        "sse": {
            "type": "session.status",
            "properties": {"sessionID": session, "status": {"type": "busy"}},
        }
    }


def idle(session: str = SID) -> dict[str, Any]:
    return {"sse": {"type": "session.idle", "properties": {"sessionID": session}}}


def aborted(session: str = SID) -> dict[str, Any]:
    error = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
    return {"sse": {"type": "session.error", "properties": {"sessionID": session, "error": error}}}


def established(*, resume: str | None = None) -> OpenCodeClient:
    client = OpenCodeClient()
    assert client.start(cwd="/w", resume=resume).send == []
    [request] = client.receive({"transport": "ready", "url": "http://127.0.0.1:1"}).send
    step = client.receive(
        {"http_response": {"id": request["http"]["id"], "status": 200, "json": {"id": SID}}}
    )
    assert [type(e).__name__ for e in step.events] == ["SessionEstablished"]
    return client


def status_answer(check: dict[str, Any], *, running: bool) -> dict[str, Any]:
    """The answer to ``GET /session/status``: our session busy, or not listed (idle)."""
    body = {SID: {"type": "busy"}} if running else {}
    return {"http_response": {"id": check["http"]["id"], "status": 200, "json": body}}


def finished(step: Step) -> list[TurnFinished]:
    return [e for e in step.events if isinstance(e, TurnFinished)]


def test_machine_is_registered_as_opencode_over_http() -> None:
    from protocols import PROTOCOLS, new_machine
    from supervisor.agents.http_link import HttpLink
    from supervisor.agents.process_link import LINK_TYPES
    from supervisor.config import KNOWN_PROTOCOLS

    assert PROTOCOLS["opencode"] is OpenCodeClient
    assert isinstance(new_machine("opencode"), OpenCodeClient)
    assert "opencode" in KNOWN_PROTOCOLS
    assert OpenCodeClient.transport == "http" and LINK_TYPES["http"] is HttpLink


def test_command_listens_on_a_free_loopback_port_unless_configured() -> None:
    assert OpenCodeClient.command(["opencode", "serve"], None) == [
        "opencode",
        "serve",
        "--port",
        "0",
        "--hostname",
        "127.0.0.1",
    ]
    configured = ["opencode", "serve", "--port=4096", "--hostname", "::1"]
    assert OpenCodeClient.command(configured, "ses_1") == configured


def test_every_process_gets_a_server_password_of_its_own() -> None:
    """The spawn-environment hook: OpenCode's server takes its password and user name from the
    environment; protocols that need no secret add nothing."""
    from protocols import PROTOCOLS
    from protocols.opencode import SERVER_USERNAME

    assert OpenCodeClient.environment("s3cret") == {
        "OPENCODE_SERVER_USERNAME": SERVER_USERNAME,
        "OPENCODE_SERVER_PASSWORD": "s3cret",
    }
    assert SERVER_USERNAME == "opencode"  # the server's default, so a client without it agrees
    assert PROTOCOLS["acp"].environment("s3cret") == {}


def test_the_abort_reply_never_ends_a_turn() -> None:
    """Edge cases 24 and 28: 200 true comes for idle sessions too; only the stream decides."""
    client = established()
    client.prompt("t1", "go")
    client.receive(busy())
    [abort] = client.cancel().send
    assert abort["http"]["path"] == f"/session/{SID}/abort"
    assert (
        finished(
            client.receive(
                {"http_response": {"id": abort["http"]["id"], "status": 200, "json": True}}
            )
        )
        == []
    )
    assert finished(client.receive(aborted())) == []
    [end] = finished(client.receive(idle()))
    assert (end.turn_id, end.interrupted, end.stop_reason) == ("t1", True, "aborted")


def test_idles_before_busy_are_not_this_turns() -> None:
    client = established()
    client.prompt("t1", "go")
    for message in (idle(), idle(), aborted(), idle(), busy("ses_other"), idle("ses_other")):
        step = client.receive(message)
        assert finished(step) == [] and step.send == []
    client.receive(busy())
    step = client.receive(idle())
    assert finished(step) == []  # neither a reply, a finish nor an error: the server is asked
    [check] = step.send
    assert check["http"] == {"id": check["http"]["id"], "method": "GET", "path": "/session/status"}
    assert client.receive(idle()) == Step()  # the duplicate, while the question is out
    [end] = finished(client.receive(status_answer(check, running=False)))
    assert (end.turn_id, end.stop_reason, end.error) == (
        "t1",
        "error",
        "the turn ended without a reply",
    )
    assert finished(client.receive(idle())) == []  # the turn is over


def test_a_busy_answer_older_than_a_late_error_is_asked_again() -> None:
    """A prompt failing inside the server: busy, the idle, and only then ``session.error``.
    The status answer comes on its own connection: one the server made before it published the
    error can arrive after it, and says busy. The machine asks again; idle, the turn failed."""
    client = established()
    client.prompt("t1", "go")
    client.receive(busy())
    [check] = client.receive(idle()).send
    failed = {"name": "UnknownError", "data": {"message": "boom"}}
    late = {"sse": {"type": "session.error", "properties": {"sessionID": SID, "error": failed}}}
    assert finished(client.receive(late)) == []
    step = client.receive(status_answer(check, running=True))
    assert finished(step) == []
    [again] = step.send
    assert again["http"]["path"] == "/session/status" and again["http"]["id"] != check["http"]["id"]
    [end] = finished(client.receive(status_answer(again, running=False)))
    assert (end.turn_id, end.stop_reason, end.error) == ("t1", "error", "UnknownError: boom")


def _turn_ending_at_status(client: OpenCodeClient, turn_id: str, *, error: str | None) -> Step:
    """A turn that goes busy and idle with nothing said, the server's status then idle (and,
    with ``error``, the prompt's failure published after the idle): what its end steps hold."""
    client.receive(busy())
    [check] = client.receive(idle()).send
    if error is not None:
        failed = {"name": error, "data": {"message": "All fibers interrupted without error"}}
        late = {"sse": {"type": "session.error", "properties": {"sessionID": SID, "error": failed}}}
        client.receive(late)
    return client.receive(status_answer(check, running=False))


def _early_abort(client: OpenCodeClient) -> None:
    """t1 cancelled so early that the loop said nothing: it ends ``idle``, no reply."""
    client.prompt("t1", "go")
    assert client.cancel().send == []  # held until busy
    [abort] = client.receive(busy()).send
    client.receive({"http_response": {"id": abort["http"]["id"], "status": 200, "json": True}})
    [check] = client.receive(idle()).send
    [end] = finished(client.receive(status_answer(check, running=False)))
    assert (end.turn_id, end.stop_reason, end.error) == ("t1", "idle", None)


def test_a_prompt_failing_after_an_early_abort_asks_for_a_restart() -> None:
    """opencode serve 1.18.33: an abort that lands before the loop's first model request leaves
    the model lookup interrupted, and every later prompt fails ``UnknownError``. The first one
    that does asks for a restart, ahead of its own end, so the actor restarts the server at
    once rather than after ``max_failed_turns`` failures."""
    client = established()
    _early_abort(client)
    client.prompt("t2", "again")
    step = _turn_ending_at_status(client, "t2", error="UnknownError")
    kinds = [type(e).__name__ for e in step.events]
    assert kinds == ["RestartWanted", "TurnFinished"], kinds
    assert "after an abort that landed before its first model request" in step.events[0].reason


def test_only_a_failure_right_after_an_early_abort_asks_for_a_restart() -> None:
    client = established()
    _early_abort(client)
    client.prompt("t2", "again")
    step = _turn_ending_at_status(client, "t2", error="ProviderError")  # another failure
    assert [type(e).__name__ for e in step.events] == ["TurnFinished"]
    client.prompt("t3", "and again")
    step = _turn_ending_at_status(client, "t3", error="UnknownError")  # not right after it
    assert [type(e).__name__ for e in step.events] == ["TurnFinished"]
    # An abort the loop heard (MessageAbortedError) left nothing broken.
    client.prompt("t4", "go")
    client.receive(busy())
    client.cancel()
    client.receive(aborted())
    client.receive(idle())
    client.prompt("t5", "again")
    step = _turn_ending_at_status(client, "t5", error="UnknownError")
    assert [type(e).__name__ for e in step.events] == ["TurnFinished"]


def test_a_busy_answer_with_no_error_meanwhile_keeps_the_turn_running() -> None:
    """The same answer with nothing new on the stream: the idle was a leftover."""
    client = established()
    client.prompt("t1", "go")
    client.receive(busy())
    [check] = client.receive(idle()).send
    assert client.receive(status_answer(check, running=True)) == Step()


def test_cancel_before_busy_is_sent_once_at_busy() -> None:
    client = established()
    client.prompt("t1", "go")
    assert client.cancel().send == [] and client.cancel().send == []
    [abort] = client.receive(busy()).send
    assert abort["http"]["path"].endswith("/abort")
    assert client.receive(busy()).send == [] and client.cancel().send == []


def test_prompt_is_prompt_async_never_the_blocking_route() -> None:
    client = established()
    [request] = client.prompt("t1", "hello").send
    assert request["http"] == {
        "id": request["http"]["id"],
        "method": "POST",
        "path": f"/session/{SID}/prompt_async",
        "json": {"parts": [{"type": "text", "text": "hello"}]},
    }
    with pytest.raises(RuntimeError, match="turn t1"):
        client.prompt("t2", "again")


def test_ids_in_paths_are_quoted() -> None:
    client = OpenCodeClient()
    client.start(cwd="/w", resume="a/b c")
    [request] = client.receive({"transport": "ready"}).send
    assert request["http"]["path"] == "/session/a%2Fb%20c"


def test_memory_of_parts_is_bounded() -> None:
    from protocols import opencode

    client = established()
    client.prompt("t1", "go")
    for index in range(opencode._KEPT + 50):
        part = {"id": f"prt_{index}", "messageID": f"msg_{index}", "type": "text", "text": "x"}
        client.receive(
            {
                "sse": {
                    "type": "message.part.updated",
                    "properties": {"sessionID": SID, "part": part},
                }
            }
        )
    assert len(client._parts) == opencode._KEPT and len(client._messages) == opencode._KEPT


# --- Robustness: nothing from the server crashes the machine -----------------------------

json_scalars = st.none() | st.booleans() | st.integers(-3, 600) | st.text(max_size=5)
json_values = json_values_of(json_scalars)
event_types = st.sampled_from(
    [
        "session.status",
        "session.idle",
        "session.error",
        "session.created",
        "session.updated",
        "message.updated",
        "message.part.updated",
        "message.part.delta",
        "permission.asked",
        "permission.replied",
        "todo.updated",
        "server.connected",
    ]
) | st.text(max_size=5)
sessions = st.sampled_from([SID, "ses_other", "ses_child"]) | json_scalars
properties = (
    st.fixed_dictionaries(
        {},
        optional={
            "sessionID": sessions,
            "status": st.fixed_dictionaries(
                {"type": st.sampled_from(["busy", "idle", "retry"]) | json_scalars}
            )
            | json_values,
            "error": st.fixed_dictionaries(
                {"name": st.sampled_from(["MessageAbortedError", "APIError"]) | json_scalars},
                optional={"data": json_values},
            )
            | json_values,
            "info": st.fixed_dictionaries(
                {"id": st.sampled_from(["msg_1", "msg_2", SID, "ses_child"]) | json_scalars},
                optional={
                    "role": st.sampled_from(["user", "assistant"]) | json_scalars,
                    "parentID": sessions,
                    "finish": st.sampled_from(["stop", "tool-calls"]) | json_scalars,
                    "error": json_values,
                    "time": json_values,
                },
            )
            | json_values,
            "part": st.fixed_dictionaries(
                {
                    "id": st.sampled_from(["prt_1", "prt_2"]) | json_scalars,
                    "messageID": st.sampled_from(["msg_1", "msg_2"]) | json_scalars,
                    "type": st.sampled_from(["text", "reasoning", "tool", "step-finish", "?"])
                    | json_scalars,
                },
                optional={
                    "text": json_values,
                    "state": json_values,
                    "callID": json_values,
                    "tool": json_values,
                },
            )
            | json_values,
            "partID": st.sampled_from(["prt_1", "prt_2"]) | json_scalars,
            "messageID": st.sampled_from(["msg_1", "msg_2"]) | json_scalars,
            "field": st.just("text") | json_scalars,
            "delta": json_values,
            "id": st.sampled_from(["per_1", "per_2"]) | json_scalars,
            "requestID": st.sampled_from(["per_1", "per_2"]) | json_scalars,
            "reply": st.sampled_from(["once", "reject"]) | json_scalars,
            "todos": json_values,
            "tool": json_values,
            "metadata": json_values,
            "patterns": json_values,
        },
    )
    | json_values
)
server_messages = (
    st.fixed_dictionaries(
        {
            "sse": st.fixed_dictionaries(
                {}, optional={"type": event_types, "properties": properties}
            )
            | json_values
        }
    )
    | st.fixed_dictionaries(
        {
            "http_response": st.fixed_dictionaries(
                {},
                optional={
                    "id": st.integers(0, 6) | json_scalars,
                    "status": st.sampled_from([0, 200, 204, 404, 500]) | json_scalars,
                    "json": json_values,
                    "error": json_values,
                },
            )
            | json_values
        }
    )
    | st.fixed_dictionaries(
        {}, optional={"transport": st.just("ready") | json_scalars, "url": json_values}
    )
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(server_messages, max_size=10), resume=st.sampled_from([None, "ses_old"]))
def test_receive_never_raises(messages: list[dict[str, Any]], resume: str | None) -> None:
    """During the handshake, in a turn, cancelling, with permissions held: anything survives."""
    for phase in range(4):
        client = OpenCodeClient()
        client.start(cwd="/w", resume=resume)
        if phase >= 1:
            client = established(resume=None)
            client.prompt("t1", "go")
        if phase >= 2:
            client.receive(busy())
            ask = {"id": "per_1", "sessionID": SID, "permission": "bash", "tool": {"callID": "c"}}
            client.receive({"sse": {"type": "permission.asked", "properties": ask}})
        if phase >= 3:
            client.cancel()
        for message in messages:
            step = client.receive(copy.deepcopy(message))
            for event in step.events:
                event_to_dict(event)
            for sent in step.send:
                check_envelope(sent, "fuzz")
        client.cancel()
        client.cancel_permissions()
        assert client.pending_permissions == []


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_one_abort_and_one_end_per_turn(data: st.DataObject) -> None:
    """Whatever the order of busy, idles, errors, replies and answers to the status check: at
    most one abort is sent for a turn, it is never sent before the turn was seen busy, at most one
    status check is out at a time, and the turn finishes at most once."""
    client = established()
    client.prompt("t1", "go")
    seen_busy = False
    aborts = 0
    ends = 0
    checks: list[dict[str, Any]] = []
    for _ in range(data.draw(st.integers(0, 14))):
        action = data.draw(
            st.sampled_from(
                [
                    *("cancel", "busy", "idle", "status_idle", "aborted", "error", "reply"),
                    *("checked", "other"),
                ]
            )
        )
        if action == "checked" and checks:
            step = client.receive(status_answer(checks.pop(), running=data.draw(st.booleans())))
        elif action == "cancel":
            step = client.cancel()
        elif action == "busy":
            step = client.receive(busy())
            seen_busy = True
        elif action == "idle":
            step = client.receive(idle())
        elif action == "status_idle":
            step = client.receive(
                {
                    "sse": {
                        "type": "session.status",
                        "properties": {"sessionID": SID, "status": {"type": "idle"}},
                    }
                }
            )
        elif action == "aborted":
            step = client.receive(aborted())
        elif action == "error":
            error = {"name": "APIError", "data": {"message": "x"}}
            step = client.receive(
                {"sse": {"type": "session.error", "properties": {"sessionID": SID, "error": error}}}
            )
        elif action == "reply":
            request_id = data.draw(st.integers(1, 4))
            checks = [c for c in checks if c["http"]["id"] != request_id]  # a check answered oddly
            step = client.receive(
                {"http_response": {"id": request_id, "status": 200, "json": True}}
            )
        else:
            step = client.receive(idle("ses_other"))
        for message in step.send:
            if message["http"]["path"].endswith("/abort"):
                aborts += 1
                assert seen_busy, "abort sent before the turn ran"
            if message["http"]["path"] == "/session/status":
                checks.append(message)
                assert len(checks) == 1, "a second status check while one is out"
        ends += len(finished(step))
        if ends:
            break
    assert aborts <= 1 and ends <= 1


# --- The event-stream decoder of the HTTP link -------------------------------------------------


def test_sse_decoder_splits_events_in_any_chunking() -> None:
    stream = (
        b": keep-alive\n"
        b'data: {"type":"server.connected","properties":{}}\n\n'
        b'event: message\r\nid: 7\r\ndata:{"a":\r\ndata: 1}\r\n\r\n'
        b"retry: 10\n\n"
        b"data: [1]\n\ndata: nope\n\ndata: \xff\n\n"
    )
    expected = [
        Message({"type": "server.connected", "properties": {}}),
        Message({"a": 1}),
    ]
    for size in (1, 2, 3, 7, len(stream)):
        decoder = SseDecoder()
        frames = []
        for start in range(0, len(stream), size):
            frames.extend(decoder.feed(stream[start : start + size]))
        assert frames[:2] == expected, size
        assert [f.kind for f in frames[2:] if isinstance(f, FramingError)] == [
            "not_an_object",
            "invalid_json",
            "invalid_utf8",
        ]
        assert len(frames) == 5


@pytest.mark.parametrize("depth", [300, 981, 5_000])
def test_sse_decoder_refuses_an_event_nested_too_deep(depth: int) -> None:
    # As an agent's stdout line is: what decodes but nests past the limit, and what nests
    # past the decoder's recursion, are both refused, and the stream goes on.
    deep = b'{"type":"x","properties":' + b"[" * depth + b"]" * depth + b"}"
    frames = SseDecoder().feed(b"data: " + deep + b'\n\ndata: {"type":"ok"}\n\n')
    assert [f.kind if isinstance(f, FramingError) else f for f in frames] == [
        "too_deep",
        Message({"type": "ok"}),
    ]


def test_sse_decoder_drops_an_oversize_event_with_bounded_memory() -> None:
    decoder = SseDecoder(max_event_bytes=100)
    frames = decoder.feed(b'data: {"x": "' + b"y" * 50)
    for _ in range(100):
        frames += decoder.feed(b"z" * 1000)
        assert decoder.buffered_bytes <= 100 + 1000 + 8 * 200
    frames += decoder.feed(b'"}\ndata: more\n\ndata: {"ok": true}\n\n')
    [oversize, ok] = frames
    assert isinstance(oversize, FramingError) and oversize.kind == "oversize"
    assert oversize.size > 100_000 and oversize.excerpt.startswith('data: {"x": "yyy')
    assert ok == Message({"ok": True})


def test_sse_decoder_counts_many_small_lines_against_the_bound() -> None:
    decoder = SseDecoder(max_event_bytes=50)
    frames = decoder.feed(b"data: 0123456789\n" * 20 + b"\n" + b"data: {}\n\n")
    assert [type(f).__name__ for f in frames] == ["FramingError", "Message"]
