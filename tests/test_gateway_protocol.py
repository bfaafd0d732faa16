"""The gateway's request decoder: every input gets a typed request or a coded error."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.gateway.protocol import (
    ACTIONS,
    MAX_FRAME_BYTES,
    Request,
    RequestError,
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
        assert result.action in ACTIONS
        for spec in ACTIONS[result.action]:
            value = result.payload.get(spec.name)
            if spec.required:
                assert value is not None
            if value is not None:
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


def test_unknown_payload_keys_are_ignored() -> None:
    result = decode_request(
        '{"id": "a", "action": "agent.prompt", "payload": {"session_id": "s1", "text": "hi", "extra": 1}}'
    )
    assert result == Request("a", "agent.prompt", {"session_id": "s1", "text": "hi"})


def test_permission_respond_needs_exactly_one_answer() -> None:
    both = decode_request(
        '{"id": 1, "action": "permission.respond", "payload": {"session_id": "s", "request_id": "r", "option_id": "o", "cancelled": true}}'
    )
    assert isinstance(both, RequestError) and both.code == "bad_request"
    cancelled = decode_request(
        '{"id": 1, "action": "permission.respond", "payload": {"session_id": "s", "request_id": "r", "cancelled": true}}'
    )
    assert isinstance(cancelled, Request)
