"""What a caller may ask of a session, checked once, for sessions here and on other hosts.

A caller's mistake is told as such (:class:`~supervisor.errors.BadRequest`, naming what is
wrong) before the session or its node sees the call; what only the session can judge (a part
its agent cannot take, a turn it does not know) it judges itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from protocols.content import Part, parts_text
from supervisor.errors import BadRequest, check_text

__all__ = [
    "check_mode",
    "check_permission_answer",
    "check_prompt",
    "check_steer",
    "check_subscription",
]


def check_prompt(text: object, parts: Sequence[Part]) -> tuple[Part, ...]:
    """A prompt's text, and its content when it is more than text; the parts as a tuple."""
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("prompt text must be a non-empty string")
    check_text("prompt text", text)  # the agent's protocol could not carry it
    checked = tuple(parts)
    if checked:
        if not all(isinstance(part, Part) for part in checked):
            raise BadRequest("prompt parts must be protocols.content.Part")
        check_text("prompt content", parts_text(checked))
    return checked


def check_steer(text: object) -> None:
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("steer text must be a non-empty string")
    check_text("steer text", text)


def check_mode(mode_id: object) -> None:
    if not isinstance(mode_id, str) or not mode_id:
        raise BadRequest("mode_id must be a non-empty string")
    check_text("mode_id", mode_id)


def check_permission_answer(request_id: str, option_id: str | None, cancelled: bool) -> None:
    if (option_id is None) == (not cancelled):
        raise BadRequest("give exactly one of option_id or cancelled=True")
    check_text("request_id", request_id)
    if option_id is not None:
        check_text("option_id", option_id)


def check_subscription(
    since_seq: object, max_buffer: object, stall_s: object, max_buffer_bytes: object = None
) -> None:
    if since_seq is not None and (type(since_seq) is not int or since_seq < 0):
        raise BadRequest(f"since_seq must be a whole number >= 0 (or left out), not {since_seq!r}")
    if type(max_buffer) is not int or max_buffer < 1:
        raise BadRequest(f"max_buffer must be a whole number >= 1, not {max_buffer!r}")
    if max_buffer_bytes is not None and (type(max_buffer_bytes) is not int or max_buffer_bytes < 1):
        raise BadRequest(
            f"max_buffer_bytes must be a whole number >= 1 (or left out), not {max_buffer_bytes!r}"
        )
    if stall_s is not None and (
        isinstance(stall_s, bool)
        or not isinstance(stall_s, int | float)
        or not 0 < stall_s < math.inf
    ):
        raise BadRequest(f"stall_s must be a number of seconds > 0 (or left out), not {stall_s!r}")
