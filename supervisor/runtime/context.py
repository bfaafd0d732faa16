"""The conversation so far, as an agent whose session could not be resumed reads it.

A respawn after a kill, or a stored session started again after a restart, may get the agent a
fresh session instead of its own (``resumed`` False, or an agent that offers no resume): the
agent then knows nothing of what was said. The session core notices (``SessionCore.
context_due``) and asks its shell for the conversation so far before the next prompt
(``SessionIO.conversation``); this module is what the shell answers with. The conversation is
what the session's history in memory says (the prompts of its ``turn.started``, the steers
taken into a turn, the agent's ``message.delta`` answers), after what the store kept of it
for a session started again from the store (``SessionStore.conversation``). It is bounded in
bytes (the agent's ``context_bytes``), the newest kept, the oldest left out first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec
from attrs import frozen

__all__ = ["Said", "context_text", "newest", "said_in"]


@frozen
class Said:
    """One message of the conversation: ``user`` (a prompt, a steer) or ``assistant``."""

    role: str
    text: str


#: What the agent reads first. It says why (so that an agent does not take the conversation for
#: a new request) and that the prompt follows it.
PREAMBLE: Final = (
    "The conversation so far, for context (your earlier session of it could not be resumed,"
    " so it is given here{dropped}):\n\n"
)
#: Said in the preamble when the oldest messages did not fit.
DROPPED: Final = "; its oldest part is left out"
#: Between the conversation and the new prompt.
ENDING: Final = "\n\n(End of the conversation so far. The new message follows.)\n\n"
_NAMES: Final = {"user": "User", "assistant": "Assistant"}
#: A message cut to fewer bytes than this says too little to be worth its place: left out.
_MIN_PIECE: Final = 64
#: The frame around the messages, counted with the longest preamble.
_FRAME_BYTES: Final = len((PREAMBLE.format(dropped=DROPPED) + ENDING).encode())


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _tail(text: str, size: int) -> str:
    """The end of ``text``, at most ``size`` bytes of it (a character cut in two left out)."""
    return text.encode("utf-8", "surrogatepass")[-size:].decode("utf-8", "ignore")


def context_text(said: Sequence[Said], limit: int) -> str:
    """The conversation as the agent reads it in front of the next prompt: at most ``limit``
    bytes of UTF-8 in all, preamble included; the newest messages whole, the oldest that fits
    only in part keeping its end, older ones left out (and the preamble says so). "" when
    nothing was said or nothing fits."""
    room = limit - _FRAME_BYTES
    kept: list[str] = []
    dropped = False
    for message in reversed(said):
        if not message.text:
            continue
        name = _NAMES.get(message.role, message.role)
        piece = f"{name}: {message.text}"
        size = _size(piece) + 2  # and the blank line after it
        if size <= room:
            kept.append(piece)
            room -= size
            continue
        dropped = True
        head = f"{name}: …"
        if room - _size(head) - 2 >= _MIN_PIECE:
            kept.append(head + _tail(message.text, room - _size(head) - 2))
        break
    if not kept:
        return ""
    preamble = PREAMBLE.format(dropped=DROPPED if dropped else "")
    return preamble + "\n\n".join(reversed(kept)) + ENDING


def newest(said: Sequence[Said], limit: int) -> list[Said]:
    """The newest messages of ``said`` that :func:`context_text` may use with ``limit``: the
    rest never reaches the agent, and need not be kept."""
    total = 0
    for index in range(len(said) - 1, -1, -1):
        total += _size(said[index].text)
        if total > limit:
            return list(said[index:])  # the one that crosses it may be given in part
    return list(said)


class _Data(msgspec.Struct):
    turn_id: str | None = None
    text: str = ""
    role: str = "assistant"
    mode: str | None = None
    text_bytes: int | None = None


class _Event(msgspec.Struct):
    event: str
    data: _Data


_DECODE: Final = msgspec.json.Decoder(_Event).decode
#: How the wire JSON of the events read here begins (``supervisor/wire/codec.py``): the others,
#: most of a history, are passed over without being decoded.
_DELTA: Final = b'{"event":"message.delta"'
_STARTED: Final = b'{"event":"turn.started"'
_STEERED: Final = b'{"event":"turn.steered"'


def said_in(payloads: Iterable[bytes]) -> list[Said]:
    """The conversation a session's history holds (its events' wire JSON, in order): each
    prompt (``turn.started``), each steer taken into the running turn (``turn.steered``
    ``injected``; one that starts a turn is that turn's prompt), and the agent's answers (its
    ``message.delta`` texts joined, per turn; a steer in between splits one). A prompt the
    event carries as a preview is given as one."""
    said: list[tuple[str, list[str]]] = []
    answering: str | None = None  # the turn whose answer the last message is
    for payload in payloads:
        if payload.startswith(_DELTA):
            data = _DECODE(payload).data
            if data.role != "assistant" or not data.text:
                continue
            if answering is not None and answering == data.turn_id and said:
                said[-1][1].append(data.text)
            else:
                said.append(("assistant", [data.text]))
                answering = data.turn_id
        elif payload.startswith(_STARTED) or payload.startswith(_STEERED):
            data = _DECODE(payload).data
            if payload.startswith(_STEERED) and data.mode != "injected":
                continue
            text = data.text + (" […]" if data.text_bytes is not None else "")
            said.append(("user", [text]))
            answering = None
    return [Said(role, "".join(parts)) for role, parts in said]
