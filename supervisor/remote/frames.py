"""What a node sends, judged at the door, as the gateway judges what clients send
(``supervisor/wire/requests.py``) and the framing what agents write (``protocols/framing.py``,
whose limits and helpers this uses).

A node runs on a host the front does not control: a broken or compromised one, or a transport
that writes into the stream, can send anything. Every frame is decoded here (size, UTF-8,
JSON, depth) and its envelope checked (an event, or an answer to a request) before anything of
the front acts on it; what each action's result must hold is checked where the result is used,
with :func:`text_field` and its kind. What is not the protocol raises
:class:`NodeProtocolError`, which the link turns into the end of that link (``protocol_error``,
``supervisor/remote/link.py``): never an exception anywhere else. Sans-IO.
"""

from __future__ import annotations

import reprlib
from typing import Any, Final

from protocols.framing import Message, decode_line, is_text
from supervisor.core.pause import PAUSED
from supervisor.core.states import State

__all__ = [
    "MAX_MESSAGE_BYTES",
    "NodeProtocolError",
    "as_is",
    "check_event",
    "check_held",
    "check_response",
    "check_state",
    "read_frame",
    "text_field",
]

#: Frames from a node: an event is small, but a replay or a tool's output may be large.
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024


class NodeProtocolError(ValueError):
    """The node sent what is not the protocol; the message says what (never the payload
    itself, which may be megabytes, beyond a short excerpt)."""


def read_frame(frame: str | bytes) -> dict[str, Any]:
    """One WebSocket message of the node as a JSON object. Decoded as an agent's line is
    (:func:`~protocols.framing.decode_line`): at most :data:`MAX_MESSAGE_BYTES`, UTF-8, JSON,
    an object, nested at most :data:`~protocols.framing.MAX_NESTING` deep."""
    # A text frame's str is what wsproto decoded as UTF-8 (it has no lone surrogate); one
    # that does anyway stays bytes the decoder refuses, instead of raising here.
    line = frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame
    decoded = decode_line(line, MAX_MESSAGE_BYTES)
    if isinstance(decoded, Message):
        return decoded.payload
    if decoded is None:
        raise NodeProtocolError("an empty frame")
    raise NodeProtocolError(
        f"a frame that is not a message ({decoded.kind}: {decoded.detail};"
        f" it began {decoded.excerpt[:60]!r})"
    )


def check_event(message: dict[str, Any]) -> None:
    """The envelope of an event (or a subscription notice): ``event`` a string,
    ``session_id`` text, ``seq`` a whole number or null, ``data`` an object. What ``data``
    holds for its kind is checked by the session the event is for."""
    kind = message["event"]
    if not isinstance(kind, str) or not is_text(kind):
        raise NodeProtocolError(f"an event whose 'event' is not a string ({_brief(kind)})")
    session_id = message.get("session_id")
    if not isinstance(session_id, str) or not is_text(session_id):
        raise NodeProtocolError(f"a {kind} event whose 'session_id' is not text")
    seq = message.get("seq")
    if seq is not None and (seq.__class__ is not int or seq < 0):
        raise NodeProtocolError(f"a {kind} event whose 'seq' is not a whole number")
    if not isinstance(message.get("data"), dict):
        raise NodeProtocolError(f"a {kind} event whose 'data' is not an object")


def check_response(message: dict[str, Any]) -> str:
    """The envelope of an answer, and its request's id: ``id`` a string (the front's own
    ids are), ``ok`` a boolean, then ``result`` an object, or ``error`` an object with a
    string ``code`` and ``message``."""
    request_id = message.get("id")
    if not isinstance(request_id, str):
        raise NodeProtocolError("a message that is neither an event nor an answer with an id")
    ok = message.get("ok")
    if ok is True:
        if not isinstance(message.get("result"), dict):
            raise NodeProtocolError("an answer with 'ok' but no 'result' object")
    elif ok is False:
        error = message.get("error")
        if not (
            isinstance(error, dict)
            and isinstance(error.get("code"), str)
            and isinstance(error.get("message"), str)
            and is_text(error["code"])
            and is_text(error["message"])
        ):
            raise NodeProtocolError("an error answer without a text 'code' and 'message'")
    else:
        raise NodeProtocolError("an answer whose 'ok' is not a boolean")
    return request_id


def as_is(result: dict[str, Any]) -> dict[str, Any]:
    """A result taken as it is: an action whose result is not used, or read field by field
    with a default for anything missing or of another type."""
    return result


def text_field(result: dict[str, Any], key: str) -> str:
    """``result[key]``, a non-empty string UTF-8 can carry (an id the front hands on)."""
    value = result.get(key)
    if not isinstance(value, str) or not value or not is_text(value):
        raise NodeProtocolError(f"without a text {key!r} ({_brief(value)})")
    return value


#: The words a session's state is (``supervisor/core/states.py``).
_STATES: Final = frozenset(state.value for state in State)


def check_state(value: object, what: str) -> str:
    """``value``, a session's state as the node says it (a start's answer, a
    ``session.state`` event): one of the state words, or the node is broken. The front hands
    it on as it is, to every client's ``session.list`` and event stream (a browser's page, an
    editor's list), so nothing else may pass for one."""
    if not isinstance(value, str) or value not in _STATES:
        raise NodeProtocolError(f"{what} is not a session state ({_brief(value)})")
    return value


#: The words a held session says why with (``supervisor/core/pause.py``).
_HELD: Final = frozenset({PAUSED})


def check_held(value: object, what: str) -> str | None:
    """``value``, why the node's session holds new turns (a prompt's or a steer's answer,
    the subscribe answer, a ``session.held`` event): None or one of the words, as
    :func:`check_state` checks a state, and for the same reason."""
    if value is not None and (not isinstance(value, str) or value not in _HELD):
        raise NodeProtocolError(f"{what} is not a reason to hold ({_brief(value)})")
    return value


def _brief(value: Any) -> str:
    """What a value that should not be there is, for a message: its type, a short repr (of a
    large value too: ``reprlib`` shortens as it goes)."""
    return f"{type(value).__name__} {reprlib.repr(value)[:60]}"
