"""The gateway's wire protocol (design brief section 7), without I/O.

A request is one JSON text frame ``{"id", "action", "payload"}``; :func:`decode_request` turns it
into a typed :class:`Request` or a :class:`RequestError` that already knows the error code and
the id to answer (when one could be read). It never raises: every byte sequence a client can send
gets an answer, and the connection stays usable.
"""

from __future__ import annotations

import json
from typing import Any, Final

from attrs import field, frozen

__all__ = [
    "ACTIONS",
    "MAX_FRAME_BYTES",
    "Request",
    "RequestError",
    "decode_request",
    "error_response",
    "ok_response",
]

#: A request is a few hundred bytes; a prompt may paste a file. 1 MiB is generous for both and
#: keeps one connection's memory small. Larger frames get ``too_large`` (up to the transport's
#: hard limit, beyond which the WebSocket is closed with 1009).
MAX_FRAME_BYTES: Final = 1024 * 1024
#: Longest id we echo back: ids are correlation tokens, not payloads.
MAX_ID_CHARS: Final = 128


@frozen
class _Field:
    name: str
    types: tuple[type, ...]
    required: bool = True


def _str(name: str, required: bool = True) -> _Field:
    return _Field(name, (str,), required)


#: action -> payload fields. Unknown payload keys are ignored (extend compatibly).
ACTIONS: Final[dict[str, tuple[_Field, ...]]] = {
    "agents.list": (),
    "session.start": (
        _str("agent"),
        _str("cwd", required=False),
        _str("host", required=False),  # a [hosts.NAME] the agent may run on
        _Field("spec", (dict,), required=False),  # the agent's definition: nodes only
    ),
    "session.list": (),
    "session.subscribe": (_str("session_id"), _Field("since_seq", (int,), required=False)),
    "session.unsubscribe": (_str("session_id"),),
    "agent.prompt": (_str("session_id"), _str("text")),
    "agent.steer": (_str("session_id"), _str("text")),
    "agent.cancel": (
        _str("session_id"),
        _str("task_id", required=False),
        _str("reason", required=False),
    ),
    "permission.respond": (
        _str("session_id"),
        _str("request_id"),
        _str("option_id", required=False),
        _Field("cancelled", (bool,), required=False),
    ),
    "session.stop": (_str("session_id"),),
}


@frozen
class Request:
    id: str | int
    action: str
    payload: dict[str, Any] = field(factory=dict)


@frozen
class RequestError:
    """A request we cannot serve; ``id`` is None when the frame had no usable id."""

    id: str | int | None
    code: str
    message: str


def decode_request(frame: str | bytes) -> Request | RequestError:
    if len(frame) > MAX_FRAME_BYTES:
        return RequestError(None, "too_large", f"frame exceeds {MAX_FRAME_BYTES} bytes")
    try:
        message = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        return RequestError(None, "bad_request", f"invalid JSON: {exc}")
    if not isinstance(message, dict):
        return RequestError(None, "bad_request", "a request must be a JSON object")
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return RequestError(None, "bad_request", "'id' must be a string or an integer")
    if isinstance(request_id, str) and len(request_id) > MAX_ID_CHARS:
        return RequestError(None, "bad_request", f"'id' is longer than {MAX_ID_CHARS} chars")
    action = message.get("action")
    if not isinstance(action, str):
        return RequestError(request_id, "bad_request", "'action' must be a string")
    fields = ACTIONS.get(action)
    if fields is None:
        known = ", ".join(sorted(ACTIONS))
        return RequestError(request_id, "unknown_action", f"unknown action {action!r} ({known})")
    payload = message.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        return RequestError(request_id, "bad_request", "'payload' must be an object")
    for spec in fields:
        value = payload.get(spec.name)
        if value is None:
            if spec.required:
                return RequestError(request_id, "bad_request", f"payload needs {spec.name!r}")
            continue
        if isinstance(value, bool) and bool not in spec.types:
            value_ok = False
        else:
            value_ok = isinstance(value, spec.types)
        if not value_ok:
            wanted = " or ".join(t.__name__ for t in spec.types)
            return RequestError(
                request_id, "bad_request", f"payload {spec.name!r} must be {wanted}"
            )
    if action == "permission.respond":
        has_option = payload.get("option_id") is not None
        if has_option == bool(payload.get("cancelled")):
            return RequestError(
                request_id, "bad_request", "give exactly one of 'option_id' or 'cancelled': true"
            )
    clean = {spec.name: payload[spec.name] for spec in fields if payload.get(spec.name) is not None}
    return Request(request_id, action, clean)


def ok_response(request_id: str | int, result: dict[str, Any]) -> dict[str, Any]:
    return {"id": request_id, "ok": True, "result": result}


def error_response(request_id: str | int | None, code: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": {"code": code, "message": message}}
