"""The errors a caller of the supervisor can get, each with its stable wire ``code``."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["AgentNotRunning", "BadRequest", "SessionNotFound", "SupervisorError"]


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
