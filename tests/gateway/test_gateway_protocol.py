"""The gateway's request decoder: every input gets a typed call or a coded error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.content import Part
from supervisor.wire.requests import (
    ACTIONS,
    MAX_FRAME_BYTES,
    MAX_PROMPT_FRAME_BYTES,
    Cancel,
    ListSessions,
    Prompt,
    Request,
    RequestError,
    RespondPermission,
    decode_abort,
    decode_request,
)

CODES = {"bad_request", "unknown_action", "too_large"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_arbitrary_frames_never_raise(frame: bytes | str) -> None:
    result = decode_request(frame)
    assert isinstance(result, Request | RequestError)
    if isinstance(result, RequestError):
        assert result.code in CODES


@settings(max_examples=500, deadline=None)
@given(
    request_id=st.one_of(
        st.text(max_size=10), st.integers(), st.none(), st.booleans(), json_values
    ),
    action=st.one_of(st.sampled_from(sorted(ACTIONS)), st.text(max_size=12), json_values),
    payload=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {},
            optional={
                "session_id": json_values | st.text(max_size=5),
                "text": json_values | st.text(max_size=5),
                "agent": st.text(max_size=5),
                "since_seq": json_values,
                "option_id": json_values,
                "cancelled": json_values,
                "request_id": st.text(max_size=5),
            },
        ),
    ),
)
def test_structured_requests_are_typed_or_refused(
    request_id: Any, action: Any, payload: Any
) -> None:
    result = decode_request(json.dumps({"id": request_id, "action": action, "payload": payload}))
    if isinstance(result, Request):
        assert result.action == action and type(result.call).action == action
        for spec in ACTIONS[result.action]:
            if not hasattr(result.call, spec.name):
                continue  # read into another form (content: parts)
            value = getattr(result.call, spec.name)
            if spec.required:
                assert value is not None and value == payload[spec.name]
            if value is not None and spec.types != (list,):
                assert isinstance(value, spec.types) and (
                    bool in spec.types or not isinstance(value, bool)
                )
    else:
        assert result.code in CODES
        valid_id = isinstance(request_id, str | int) and not isinstance(request_id, bool)
        if result.id is not None:
            assert valid_id and result.id == request_id


def test_oversize_frame_is_too_large() -> None:
    result = decode_request("x" * (MAX_FRAME_BYTES + 1))
    assert isinstance(result, RequestError) and result.code == "too_large"


def test_the_frame_limit_counts_utf8_bytes_not_characters() -> None:
    emoji = "\U0001f600"  # four bytes in UTF-8
    frame = json.dumps(
        {
            "id": "c1",
            "action": "agent.prompt",
            "payload": {"session_id": "s1", "text": emoji * 300_000},
        },
        ensure_ascii=False,
    )
    assert len(frame) < MAX_FRAME_BYTES < len(frame.encode())
    result = decode_request(frame)
    # Too large (only a prompt's content may be bigger), and answered with its id.
    assert isinstance(result, RequestError) and (result.id, result.code) == ("c1", "too_large")
    assert result.message.startswith(f"frame exceeds {MAX_FRAME_BYTES} bytes")
    fits = decode_request(frame.replace(emoji * 300_000, emoji * 200_000))
    assert isinstance(fits, Request) and fits.size == len(frame.encode()) - 400_000


def test_only_a_prompt_with_content_may_exceed_the_frame_limit() -> None:
    def prompt(**payload: object) -> str:
        return json.dumps({"id": "c2", "action": "agent.prompt", "payload": payload})

    image = {"type": "image", "data": "A" * (2 * MAX_FRAME_BYTES), "mimeType": "image/png"}
    taken = decode_request(prompt(session_id="s1", content=[image]))
    assert isinstance(taken, Request) and isinstance(taken.call, Prompt)
    assert taken.call.parts == (Part("image", data=image["data"], mime_type="image/png"),)
    assert taken.call.text == "[image image/png]"  # what events show of it
    for frame in (
        prompt(session_id="s1", text="x" * (2 * MAX_FRAME_BYTES)),  # a big text: no content
        json.dumps({"id": "c2", "action": "session.list", "payload": {"x": image}}),
        # Beyond the content limit, nothing is parsed: the id is read from the frame's start.
        prompt(session_id="s1", content=[{**image, "data": "A" * MAX_PROMPT_FRAME_BYTES}]),
    ):
        refused = decode_request(frame)
        assert isinstance(refused, RequestError) and (refused.id, refused.code) == (
            "c2",
            "too_large",
        )
    missing = decode_request(prompt(session_id="s1"))
    assert (
        isinstance(missing, RequestError) and missing.message == "payload needs 'text' or 'content'"
    )


@pytest.mark.parametrize(
    ("action", "payload", "field"),
    [
        ("agent.prompt", {"session_id": "s1", "text": "a\ud800b"}, "text"),
        ("agent.prompt", {"session_id": "s\udfff", "text": "hi"}, "session_id"),
        ("session.start", {"agent": "demo", "cwd": "/tmp/caf\udce9"}, "cwd"),
        ("session.start", {"agent": "de\ud83dmo"}, "agent"),
        ("agent.cancel", {"session_id": "s1", "reason": "\udc80"}, "reason"),
        ("agent.cancel", {"session_id": "s1", "task_id": "t\ud800"}, "task_id"),
        (
            "permission.respond",
            {"session_id": "s1", "request_id": "\ud800", "cancelled": True},
            "request_id",
        ),
        (
            "permission.respond",
            {"session_id": "s1", "request_id": "r", "option_id": "\ud800"},
            "option_id",
        ),
        ("session.subscribe", {"session_id": "\ud800"}, "session_id"),
        ("session.stop", {"session_id": "\ud800"}, "session_id"),
    ],
)
def test_a_string_utf8_cannot_carry_is_bad_request(
    action: str, payload: dict[str, Any], field: str
) -> None:
    # json.dumps writes a lone surrogate as the escape a browser's JSON.stringify sends.
    result = decode_request(json.dumps({"id": 3, "action": action, "payload": payload}))
    assert isinstance(result, RequestError)
    assert (result.id, result.code) == (3, "bad_request") and f"'{field}'" in result.message


def test_an_id_utf8_cannot_carry_is_bad_request_without_echoing_it() -> None:
    result = decode_request(json.dumps({"id": "c\ud800", "action": "session.list"}))
    assert result == RequestError(None, "bad_request", "'id' is not valid Unicode text")


def test_unknown_payload_keys_are_ignored() -> None:
    result = decode_request(
        '{"id": "a", "action": "agent.prompt", "payload": {"session_id": "s1", "text": "hi", "extra": 1}}'
    )
    assert result == Request("a", Prompt("s1", "hi"))


def test_permission_respond_needs_exactly_one_answer() -> None:
    both = decode_request(
        '{"id": 1, "action": "permission.respond", "payload": {"session_id": "s", "request_id": "r", "option_id": "o", "cancelled": true}}'
    )
    assert isinstance(both, RequestError) and both.code == "bad_request"
    cancelled = decode_request(
        '{"id": 1, "action": "permission.respond", "payload": {"session_id": "s", "request_id": "r", "cancelled": true}}'
    )
    assert isinstance(cancelled, Request)
    assert cancelled.call == RespondPermission(session_id="s", request_id="r", cancelled=True)


def test_content_the_decoder_cannot_read_is_bad_request_with_the_reason() -> None:
    frame = json.dumps(
        {
            "id": 4,
            "action": "agent.prompt",
            "payload": {"session_id": "s1", "content": [{"type": "image", "mimeType": "x"}]},
        }
    )
    assert decode_request(frame) == RequestError(
        4, "bad_request", "content: an image block needs its data (base64) and mimeType"
    )


def test_each_action_has_its_call() -> None:
    calls = {}
    for action in ACTIONS:
        payload: dict[str, object] = {s.name: "x" for s in ACTIONS[action] if s.required}
        if action == "agent.prompt":
            payload["text"] = "x"
        if action == "permission.respond":
            payload["cancelled"] = True
        if action == "session.resize":
            payload.update(cols=80, rows=24)
        result = decode_request(json.dumps({"id": 1, "action": action, "payload": payload}))
        assert isinstance(result, Request), (action, result)
        calls[action] = type(result.call)
    assert all(call.action == action for action, call in calls.items())
    assert len(set(calls.values())) == len(ACTIONS)
    assert calls["session.list"] is ListSessions


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", Cancel(session_id="s1", reason="http")),
        (b"  ", Cancel(session_id="s1", reason="http")),
        (b'{"reason": "r", "task_id": "t2"}', Cancel(session_id="s1", task_id="t2", reason="r")),
        (b"[", RequestError(None, "bad_request", "body must be JSON")),
        (b"[1]", RequestError(None, "bad_request", "body must be a JSON object")),
        (b'{"reason": 1}', RequestError(None, "bad_request", "'reason' must be a string")),
        (b'{"task_id": []}', RequestError(None, "bad_request", "'task_id' must be a string")),
    ],
)
def test_an_abort_body_is_the_cancel_agent_cancel_makes(
    body: bytes, expected: Cancel | RequestError
) -> None:
    assert decode_abort("s1", body) == expected


def test_an_abort_reason_utf8_cannot_carry_is_bad_request() -> None:
    refused = decode_abort("s1", json.dumps({"reason": "\ud800"}).encode())
    assert isinstance(refused, RequestError) and refused.code == "bad_request"
    assert refused.message.startswith("'reason' is not valid Unicode text")


def test_invalid_json_is_answered_with_the_id_it_starts_with() -> None:
    """A frame JSON cannot read (cut short, a number of 5,000 digits) is still answered with
    the id it starts with, so the client's call waiting for it ends."""
    for frame in (
        '{"id": "c7", "action": "agents.list", "payload": {',
        '{"id": 7, "x": ' + "9" * 5000,
    ):
        result = decode_request(frame)
        assert isinstance(result, RequestError) and result.code == "bad_request"
        assert result.id == ("c7" if "c7" in frame else 7), result
    result = decode_request("[not json")
    assert isinstance(result, RequestError) and result.id is None
