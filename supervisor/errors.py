"""The errors a caller of the supervisor can get, each with its stable wire ``code``."""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AgentNotRunning",
    "AtCapacity",
    "BadRequest",
    "Busy",
    "CheckpointFailed",
    "SessionNotFound",
    "SupervisorError",
    "check_text",
]


class SupervisorError(Exception):
    """Base of the errors the API raises on purpose; ``code`` is what the wire says."""

    code: ClassVar[str] = "internal"


class SessionNotFound(SupervisorError, LookupError):
    code: ClassVar[str] = "session_not_found"


class AgentNotRunning(SupervisorError):
    """The session is stopped or failed: it takes no more prompts or cancels."""

    code: ClassVar[str] = "agent_not_running"


class BadRequest(SupervisorError, ValueError):
    code: ClassVar[str] = "bad_request"


class Busy(SupervisorError):
    """The session is doing something the call must not overlap (a rewind while a turn runs)."""

    code: ClassVar[str] = "busy"


class CheckpointFailed(SupervisorError):
    """A checkpoint of the working directory could not be taken or restored (why is said)."""

    code: ClassVar[str] = "checkpoint_failed"


class AtCapacity(SupervisorError):
    """A limit on sessions (the supervisor's ``max_sessions``, or an agent's) is reached."""

    code: ClassVar[str] = "capacity"


def check_text(what: str, value: str) -> None:
    """Raise :class:`BadRequest` unless ``value`` can be encoded as UTF-8.

    JSON can carry a lone surrogate (``"\\ud800"``: what a browser's ``JSON.stringify`` sends
    for broken pasted text), and so can a path of a non-UTF-8 file name (``os.fsdecode``), but
    an agent's protocol, being UTF-8 JSON, cannot: checked before anything is done with it.
    """
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string, not {type(value).__name__}")
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"{what} is not valid Unicode text: a lone surrogate"
            f" (U+{ord(value[exc.start]):04X}) at index {exc.start}"
        ) from None
