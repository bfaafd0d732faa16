"""Tests for protocols.jsonrpc.JsonRpcPeer: message shapes and the classification of input.

Tier 1: plain pytest and hypothesis, no trio, no I/O.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REQUEST_CANCELLED,
    IncomingNotification,
    IncomingRequest,
    IncomingResponse,
    InvalidMessage,
    JsonRpcPeer,
    RpcError,
    UnknownResponse,
)

# --- Constants -----------------------------------------------------------------------


def test_error_codes() -> None:
    assert (PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR) == (
        -32700,
        -32600,
        -32601,
        -32602,
        -32603,
    )
    assert REQUEST_CANCELLED == -32800


# --- What we send ----------------------------------------------------------------------


def test_request_ids_increment_from_zero() -> None:
    peer: JsonRpcPeer[str] = JsonRpcPeer()
    first = peer.request("initialize", {"protocolVersion": 1}, "ctx-a")
    second = peer.request("session/new", {"cwd": "/w"}, "ctx-b")
    third = peer.request("session/prompt", {}, "ctx-c")
    assert [first[0], second[0], third[0]] == [0, 1, 2]
    assert first[1] == {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1},
    }
    assert second[1] == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session/new",
        "params": {"cwd": "/w"},
    }
    # empty params are still sent; only None is left out
    assert third[1] == {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {}}
    assert all(peer.is_pending(i) for i in (0, 1, 2))
    assert not peer.is_pending(3)


def test_request_without_params_omits_the_member() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    _, message = peer.request("ping", None, None)
    assert message == {"jsonrpc": "2.0", "id": 0, "method": "ping"}


def test_ids_keep_incrementing_after_answers() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("a", None, None)
    peer.receive({"jsonrpc": "2.0", "id": 0, "result": None})
    request_id, _ = peer.request("b", None, None)
    assert request_id == 1


def test_notify_has_no_id() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    message = peer.notify("session/cancel", {"sessionId": "s"})
    assert message == {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}}
    assert peer.notify("ping") == {"jsonrpc": "2.0", "method": "ping"}
    # a notification is not numbered and nothing waits for it
    request_id, _ = peer.request("x", None, None)
    assert request_id == 0


def test_respond_shapes() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    assert peer.respond(5, {"outcome": {"outcome": "cancelled"}}) == {
        "jsonrpc": "2.0",
        "id": 5,
        "result": {"outcome": {"outcome": "cancelled"}},
    }
    assert peer.respond("abc", None) == {"jsonrpc": "2.0", "id": "abc", "result": None}
    assert peer.respond_error(7, REQUEST_CANCELLED, "Request cancelled") == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32800, "message": "Request cancelled"},
    }
    assert peer.respond_error("x", METHOD_NOT_FOUND, "nope", data={"method": "m"}) == {
        "jsonrpc": "2.0",
        "id": "x",
        "error": {"code": -32601, "message": "nope", "data": {"method": "m"}},
    }
    # an error for a request whose id could not be read (JSON-RPC 2.0: id null)
    assert peer.respond_error(None, PARSE_ERROR, "Parse error") == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error"},
    }
    # answering does not touch our own pending table
    assert not peer.is_pending(5)


def test_without_version_member() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer(with_version=False)
    assert peer.request("turn/interrupt", {"threadId": "t"}, None) == (
        0,
        {"id": 0, "method": "turn/interrupt", "params": {"threadId": "t"}},
    )
    assert peer.notify("initialized") == {"method": "initialized"}
    assert peer.respond(3, {}) == {"id": 3, "result": {}}
    assert peer.respond_error(3, INVALID_REQUEST, "bad") == {
        "id": 3,
        "error": {"code": -32600, "message": "bad"},
    }
    # and it accepts messages without the member (Codex app-server)
    assert peer.receive({"id": 0, "result": {}}) == IncomingResponse(0, "turn/interrupt", None, {})
    assert peer.receive({"method": "turn/started", "params": {}}) == IncomingNotification(
        "turn/started", {}
    )


def test_messages_are_fresh_dicts() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    first = peer.notify("a")
    first["extra"] = 1
    assert peer.notify("a") == {"jsonrpc": "2.0", "method": "a"}


# --- What we receive ---------------------------------------------------------------------


def test_receive_request() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    message = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "session/request_permission",
        "params": {"a": 1},
    }
    assert peer.receive(message) == IncomingRequest(5, "session/request_permission", {"a": 1})
    assert peer.receive({"jsonrpc": "2.0", "id": "s-1", "method": "m"}) == IncomingRequest(
        "s-1", "m", None
    )


def test_receive_request_with_an_id_we_are_waiting_for_is_still_a_request() -> None:
    """The agent numbers its own requests from 0 as well: the id spaces are independent."""
    peer: JsonRpcPeer[str] = JsonRpcPeer()
    peer.request("initialize", {}, "ctx")
    assert peer.receive({"jsonrpc": "2.0", "id": 0, "method": "fs/read_text_file"}) == (
        IncomingRequest(0, "fs/read_text_file", None)
    )
    assert peer.is_pending(0)
    response = peer.receive({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}})
    assert response == IncomingResponse(0, "initialize", "ctx", result={"protocolVersion": 1})


def test_receive_notification() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    assert peer.receive({"jsonrpc": "2.0", "method": "session/update", "params": [1]}) == (
        IncomingNotification("session/update", [1])
    )
    assert peer.receive({"jsonrpc": "2.0", "method": "$/cancel_request"}) == (
        IncomingNotification("$/cancel_request", None)
    )


def test_receive_response_matched_with_context() -> None:
    peer: JsonRpcPeer[dict[str, str]] = JsonRpcPeer()
    context = {"turn": "t1"}
    peer.request("session/prompt", {}, context)
    response = peer.receive({"jsonrpc": "2.0", "id": 0, "result": {"stopReason": "end_turn"}})
    assert isinstance(response, IncomingResponse)
    assert response.id == 0
    assert response.method == "session/prompt"
    assert response.context is context
    assert response.result == {"stopReason": "end_turn"}
    assert response.error is None
    assert not peer.is_pending(0)


def test_receive_null_result() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("session/load", {}, None)
    assert peer.receive({"jsonrpc": "2.0", "id": 0, "result": None}) == IncomingResponse(
        0, "session/load", None, result=None, error=None
    )


def test_receive_error_response() -> None:
    peer: JsonRpcPeer[str] = JsonRpcPeer()
    peer.request("session/prompt", {}, "t1")
    response = peer.receive(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "error": {"code": -32800, "message": "Request cancelled", "data": [1]},
        }
    )
    assert response == IncomingResponse(
        0, "session/prompt", "t1", result=None, error=RpcError(-32800, "Request cancelled", [1])
    )
    assert RpcError(-32800, "Request cancelled").describe() == "Request cancelled (code -32800)"


@pytest.mark.parametrize(
    ("raw_error", "expected"),
    [
        ({"code": -1, "message": "m"}, RpcError(-1, "m")),
        ({"code": "x", "message": "m"}, RpcError(INTERNAL_ERROR, "m")),
        ({"code": True, "message": "m"}, RpcError(INTERNAL_ERROR, "m")),
        ({"code": 1.5, "message": "m"}, RpcError(INTERNAL_ERROR, "m")),
        ({"code": -2}, RpcError(-2, "{'code': -2}")),
        ({"message": 3}, RpcError(INTERNAL_ERROR, "{'message': 3}")),
        ("boom", RpcError(INTERNAL_ERROR, "'boom'")),
        ([1, 2], RpcError(INTERNAL_ERROR, "[1, 2]")),
        (7, RpcError(INTERNAL_ERROR, "7")),
    ],
)
def test_malformed_error_objects_are_still_errors(raw_error: Any, expected: RpcError) -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("m", None, None)
    response = peer.receive({"jsonrpc": "2.0", "id": 0, "error": raw_error})
    assert isinstance(response, IncomingResponse)
    assert response.error == expected


def test_null_error_with_result_is_a_result() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("m", None, None)
    response = peer.receive({"jsonrpc": "2.0", "id": 0, "error": None, "result": {"ok": 1}})
    assert response == IncomingResponse(0, "m", None, result={"ok": 1})


def test_unknown_id() -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    message = {"jsonrpc": "2.0", "id": 42, "result": {}}
    assert peer.receive(message) == UnknownResponse(42, message)


def test_id_type_must_match() -> None:
    """We sent the integer 0; the string "0" is another id."""
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("m", None, None)
    message = {"jsonrpc": "2.0", "id": "0", "result": {}}
    assert peer.receive(message) == UnknownResponse("0", message)
    assert peer.is_pending(0)


def test_duplicate_response_is_unknown_the_second_time() -> None:
    peer: JsonRpcPeer[str] = JsonRpcPeer()
    peer.request("session/prompt", {}, "t1")
    message = {"jsonrpc": "2.0", "id": 0, "result": {"stopReason": "end_turn"}}
    assert isinstance(peer.receive(dict(message)), IncomingResponse)
    assert peer.receive(dict(message)) == UnknownResponse(0, message)


@pytest.mark.parametrize("bad_id", [True, False])
def test_bool_ids_are_rejected(bad_id: bool) -> None:
    """``True == 1`` in Python: a bool must not match our request 1 (or 0)."""
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("a", None, None)
    peer.request("b", None, None)
    response = {"jsonrpc": "2.0", "id": bad_id, "result": {}}
    assert peer.receive(response) == UnknownResponse(bad_id, response)
    assert peer.is_pending(0) and peer.is_pending(1)
    request = {"jsonrpc": "2.0", "id": bad_id, "method": "m"}
    incoming = peer.receive(request)
    assert isinstance(incoming, InvalidMessage)
    assert incoming.raw == request


@pytest.mark.parametrize("bad_id", [None, 1.0, [0], {"a": 0}])
def test_other_non_id_values(bad_id: Any) -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("a", None, None)
    response = {"jsonrpc": "2.0", "id": bad_id, "result": {}}
    assert peer.receive(response) == UnknownResponse(bad_id, response)
    assert peer.is_pending(0)
    assert isinstance(peer.receive({"jsonrpc": "2.0", "id": bad_id, "method": "m"}), InvalidMessage)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"id": 0, "result": {}}, "jsonrpc"),
        ({"jsonrpc": "1.0", "id": 0, "result": {}}, "jsonrpc"),
        ({"jsonrpc": 2.0, "method": "m"}, "jsonrpc"),
        ({"jsonrpc": "2.0", "method": 5}, "method"),
        ({"jsonrpc": "2.0", "method": ["m"], "id": 0}, "method"),
        ({"jsonrpc": "2.0"}, "neither"),
        ({"jsonrpc": "2.0", "id": 0}, "neither"),
        ({"jsonrpc": "2.0", "result": {}}, "neither"),
        ({"jsonrpc": "2.0", "params": {}}, "neither"),
        ({}, "jsonrpc"),
    ],
)
def test_invalid_messages(message: dict[str, Any], reason: str) -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    peer.request("m", None, None)
    incoming = peer.receive(message)
    assert isinstance(incoming, InvalidMessage)
    assert reason in incoming.reason
    assert incoming.raw is message
    assert peer.is_pending(0), "an invalid message must not consume a pending request"


def test_forget() -> None:
    peer: JsonRpcPeer[str] = JsonRpcPeer()
    peer.request("session/prompt", {}, "t1")
    peer.request("session/prompt", {}, "t2")
    peer.forget(0)
    peer.forget(0)  # twice is fine
    peer.forget(99)  # never sent is fine
    assert not peer.is_pending(0)
    assert peer.is_pending(1)
    late = {"jsonrpc": "2.0", "id": 0, "result": {"stopReason": "cancelled"}}
    assert peer.receive(late) == UnknownResponse(0, late)
    assert isinstance(peer.receive({"jsonrpc": "2.0", "id": 1, "result": {}}), IncomingResponse)


# --- Properties ------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
# Mostly the keys that matter, so the interesting branches are reached.
keys = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"]) | st.text(
    max_size=4
)
interesting_values = (
    st.just("2.0")
    | st.integers(-1, 3)
    | st.sampled_from(["m", "0", "session/update"])
    | json_values
)
messages = st.dictionaries(keys, interesting_values, max_size=6)
INCOMING_TYPES = (
    IncomingRequest,
    IncomingNotification,
    IncomingResponse,
    UnknownResponse,
    InvalidMessage,
)


@settings(max_examples=250, deadline=None)
@given(batch=st.lists(messages, max_size=4), with_version=st.booleans())
def test_receive_never_raises(batch: list[dict[str, Any]], with_version: bool) -> None:
    peer: JsonRpcPeer[int] = JsonRpcPeer(with_version=with_version)
    for n in range(3):
        peer.request(f"m{n}", None, n)
    for message in batch:
        before = copy.deepcopy(message)
        incoming = peer.receive(message)
        assert isinstance(incoming, INCOMING_TYPES)
        assert message == before, "receive() must not modify the message"
        if isinstance(incoming, IncomingResponse):
            # only ever one of ours, with its own method and context, and only once
            assert incoming.method == f"m{incoming.context}"
            assert incoming.id == incoming.context
            assert not peer.is_pending(incoming.id)


@settings(max_examples=100, deadline=None)
@given(result=json_values, ids=st.lists(st.integers(0, 5), max_size=8))
def test_each_request_is_answered_at_most_once(result: Any, ids: list[int]) -> None:
    peer: JsonRpcPeer[str] = JsonRpcPeer()
    for n in range(6):
        peer.request("m", None, f"ctx{n}")
    seen: set[int] = set()
    for response_id in ids:
        incoming = peer.receive({"jsonrpc": "2.0", "id": response_id, "result": result})
        if response_id in seen:
            assert isinstance(incoming, UnknownResponse)
        else:
            assert incoming == IncomingResponse(
                response_id, "m", f"ctx{response_id}", result=result
            )
            seen.add(response_id)


@given(params=json_values)
def test_sent_messages_are_json(params: Any) -> None:
    peer: JsonRpcPeer[None] = JsonRpcPeer()
    _, request = peer.request("m", params, None)
    for message in (request, peer.notify("n", params), peer.respond(1, params)):
        assert json.loads(json.dumps(message)) == message
