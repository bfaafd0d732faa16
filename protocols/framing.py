"""Newline-delimited JSON framing for agent stdio, without I/O.

Every agent we drive speaks one JSON object per line on stdout: ACP is JSON-RPC 2.0
per line, and the Codex app-server and Claude Code's ``stream-json`` do the same.
This module turns bytes into frames and frames into bytes; reading the pipe is
somebody else's job, so tests feed bytes and compare frames.

A misbehaving agent (a stray ``print``, a crash dump, a runaway line) must not take
the supervisor down with it: bad lines become `FramingError` frames, the decoder
keeps going with the next line, and its memory stays bounded however long the
line is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, Final, Literal, TypeAlias

import msgspec
from attrs import define, field, frozen, validators

__all__ = [
    "EXCERPT_CHARS",
    "MAX_LINE_BYTES",
    "MAX_NESTING",
    "Frame",
    "FramingError",
    "FramingErrorKind",
    "LineDecoder",
    "Message",
    "RawLine",
    "Decoded",
    "decode_line",
    "decode_lines",
    "encode_message",
    "is_text",
    "nesting_depth",
    "too_deep",
]

# The longest line we accept, excluding its b"\n" (or b"\r\n") terminator.
#
# Real lines get big: an ACP `session/prompt` or `fs/read_text_file` reply carries
# whole file contents inline, and a tool result with a large diff or file embedded
# is a few MB. Precedents disagree wildly:
#   - the Claude Agent SDK for Python defaults `max_buffer_size` to 1 MiB and fails
#     the session on a longer line, which users hit with large tool results;
#   - Node's `readline` (used by most TypeScript agents and ACP clients) has no limit
#     at all and will buffer a line until the process runs out of memory.
# We sit in between: 16 MiB is generous enough that no legitimate message we have
# seen comes near it, and it still bounds the memory one misbehaving agent can make
# us hold (one line, plus one incoming chunk).
MAX_LINE_BYTES: Final[int] = 16 * 1024 * 1024

# The deepest nesting of arrays and objects we accept in a line. JSON that decodes can still
# be too deep to handle: msgspec and the standard library recurse, against the one recursion
# limit (1,000 frames) the caller's own stack already uses part of. A line nested ~980 deep
# decoded in the pump and then failed to encode in the fan-out, whose stack is deeper,
# which crashed its session; a node's envelope or the gateway's adds levels again. Agents'
# real messages nest a few dozen levels at most (a JSON Schema, a tool's structured
# result), so a line deeper than this is refused at the door like any other bad line, and
# everything past the door has the rest of the limit to spare.
MAX_NESTING: Final[int] = 256

# How much of a bad line a FramingError quotes: enough to recognise a stack trace or
# a stray log line, small enough to log and to keep while discarding an oversize line.
EXCERPT_CHARS: Final[int] = 200
# A UTF-8 character (or a U+FFFD standing in for an invalid sequence) takes at most
# 4 bytes, so the first EXCERPT_CHARS characters always lie within these bytes.
_EXCERPT_BYTES: Final[int] = 4 * EXCERPT_CHARS

_CR: Final[int] = 0x0D

FramingErrorKind: TypeAlias = Literal[
    "oversize", "invalid_utf8", "invalid_json", "not_an_object", "too_deep"
]
_KINDS: Final = frozenset({"oversize", "invalid_utf8", "invalid_json", "not_an_object", "too_deep"})


@define  # made on a cancel's cold path: see protocols.events.quick_constructor
class Message:
    """One line that decoded to a JSON object; the payload is what `json.loads` returned."""

    payload: dict[str, Any]


@frozen
class FramingError:
    """One line that could not become a `Message`.

    It is a frame, not an exception: the agent wrote garbage, but the stream goes on
    and the caller decides whether garbage is fatal.
    """

    kind: FramingErrorKind = field(validator=validators.in_(_KINDS))
    # Human readable, for logs.
    detail: str
    # At most the first EXCERPT_CHARS characters of the line, decoded with U+FFFD for
    # invalid UTF-8, so the log shows what the agent actually wrote.
    excerpt: str
    # Byte length of the line without its terminator; for "oversize" it counts the
    # bytes that were discarded unseen.
    size: int = field(validator=validators.ge(0))


Frame: TypeAlias = Message | FramingError
#: A complete line not yet decoded (terminator and trailing ``\r`` removed, never blank), or
#: the error of one that could not be kept: what :meth:`LineDecoder.feed_lines` returns, so
#: that the decoding (:func:`decode_line`) can be done, and paced, by whoever consumes them.
RawLine: TypeAlias = bytes | FramingError

#: msgspec's decoder: ~0.5 us a line where ``json.loads`` takes ~2; integers of any size stay
#: exact. On any error the line is decoded again by the standard library, which says what kind
#: of error it is (and accepts what it accepts: NaN and Infinity literals).
_FAST_DECODE: Final = msgspec.json.Decoder().decode
_FAST_ENCODE: Final = msgspec.json.Encoder().encode


class LineDecoder:
    """Split a byte stream into lines and decode each line as one JSON object.

    Feed it whatever the pipe returned, in any chunking; the frames come out the same.
    Lines end with b"\\n", a trailing b"\\r" is dropped, and blank lines (only ASCII
    whitespace) are skipped, since agents and shells sometimes emit them.

    Memory: ``buffered_bytes`` never exceeds ``max_line_bytes + 1`` while a line is
    being collected, and ``4 * EXCERPT_CHARS`` while an oversize line is being skipped.
    Never raises on bad input.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be positive, got {max_line_bytes}")
        self._max = max_line_bytes
        # The start of the current line. Never contains b"\n": we search only the
        # incoming chunk, so nothing is ever scanned twice.
        self._partial = bytearray()
        # While skipping an oversize line, _partial is empty and these describe what
        # went by: its length so far, its first bytes (for the excerpt), and whether
        # its last byte so far was b"\r" (which does not count if b"\n" follows).
        self._skipping = False
        self._skipped = 0
        self._skipped_head = bytearray()
        self._skipped_ends_cr = False
        self._ended = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the line in progress, so tests can check the memory bound."""
        return len(self._partial) + len(self._skipped_head)

    def feed(self, data: bytes) -> list[Frame]:
        """Take the next chunk of the stream and return the frames it completed, in order."""
        return self._decoded(self.feed_lines(data))

    def end_of_input(self) -> list[Frame]:
        """The stream ended: decode the final line even without its newline.

        Agents sometimes omit the last newline before exiting, and that last line is
        often the one that explains why they exited.
        """
        return self._decoded(self.end_lines())

    def feed_lines(self, data: bytes) -> list[RawLine]:
        """Like :meth:`feed`, with the lines left undecoded (:func:`decode_line` them): the
        splitting is a few C loops per chunk, the decoding is the per-line cost."""
        if self._ended:
            if data:
                raise RuntimeError("LineDecoder.feed() called with data after end_of_input()")
            return []
        if not self._skipping and b"\r" not in data:
            # The common case, in C: split the chunk at once. Only a line too long, or a
            # b"\r" (to strip before a b"\n", to keep elsewhere), takes the line-by-line path.
            parts = data.split(b"\n")
            if len(parts) == 1:
                self._hold(data, 0)
                return []
            tail = parts.pop()
            if self._partial:
                # The held start of the line already counts against the limit; it may end
                # with the b"\r" of a b"\r\n" split across two reads.
                self._partial += parts[0]
                if self._partial.endswith(b"\r"):
                    del self._partial[-1]
                parts[0] = bytes(self._partial)
                self._partial.clear()
            if len(max(parts, key=len)) <= self._max:
                if tail:  # (most reads end with a line's end: nothing to hold)
                    self._hold(tail, 0)
                if b"" in parts or any(map(bytes.isspace, parts)):
                    return [line for line in parts if line and not line.isspace()]
                return parts  # type: ignore[return-value]  # list is invariant: bytes only
            lines: list[RawLine] = [
                _oversize(line, len(line), self._max) if len(line) > self._max else line
                for line in parts
                if len(line) > self._max or (line and not line.isspace())
            ]
            self._hold(tail, 0)
            return lines
        lines = []
        start = 0
        newline = data.find(b"\n")
        while newline != -1:
            line = self._finish_line(data, start, newline)
            if line is not None:
                lines.append(line)
            start = newline + 1
            newline = data.find(b"\n", start)
        self._hold(data, start)
        return lines

    def end_lines(self) -> list[RawLine]:
        """Like :meth:`end_of_input`, undecoded."""
        if self._ended:
            return []
        self._ended = True
        if self._skipping:
            return [self._stop_skipping()]
        if not self._partial:
            return []
        line = bytes(self._partial)
        self._partial = bytearray()
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self._max:
            return [_oversize(line, len(line), self._max)]
        return [line] if line and not line.isspace() else []

    def _decoded(self, lines: list[RawLine]) -> list[Frame]:
        frames: list[Frame] = []
        for line in lines:
            frame = line if isinstance(line, FramingError) else decode_line(line, self._max)
            if frame is not None:
                frames.append(frame)
        return frames

    def _finish_line(self, data: bytes, start: int, end: int) -> RawLine | None:
        """The line in progress ends at data[end] == b"\\n"; None for a blank line."""
        if not self._skipping and len(self._partial) + (end - start) <= self._max + 1:
            if self._partial:
                self._partial += data[start:end]
                if self._partial.endswith(b"\r"):
                    del self._partial[-1]
                line = bytes(self._partial)
                self._partial.clear()
            else:
                if end > start and data[end - 1] == _CR:
                    end -= 1
                line = data[start:end]
            if len(line) > self._max:
                return _oversize(line, len(line), self._max)
            return line if line and not line.isspace() else None
        self._skip(data, start, end)
        return self._stop_skipping()

    def _hold(self, data: bytes, start: int) -> None:
        """Keep data[start:], which has no newline, for the line in progress."""
        if start == len(data):
            return
        if not self._skipping and len(self._partial) + (len(data) - start) <= self._max + 1:
            self._partial += data[start:]
            return
        self._skip(data, start, len(data))

    def _skip(self, data: bytes, start: int, end: int) -> None:
        """Count data[start:end] as part of an oversize line instead of storing it."""
        if not self._skipping:
            # The line just became too long: let go of what we held for it.
            self._skipping = True
            self._skipped = len(self._partial)
            self._skipped_head = self._partial[:_EXCERPT_BYTES]
            self._skipped_ends_cr = self._partial.endswith(b"\r")
            self._partial = bytearray()
        self._skipped += end - start
        room = _EXCERPT_BYTES - len(self._skipped_head)
        if room > 0:
            self._skipped_head += data[start : min(end, start + room)]
        if end > start:
            self._skipped_ends_cr = data[end - 1] == _CR

    def _stop_skipping(self) -> FramingError:
        """The oversize line ended: report it once."""
        size = self._skipped - (1 if self._skipped_ends_cr else 0)
        head = bytes(self._skipped_head[:size])
        self._skipping = False
        self._skipped = 0
        self._skipped_head = bytearray()
        self._skipped_ends_cr = False
        return _oversize(head, size, self._max)


def _oversize(head: bytes, size: int, limit: int) -> FramingError:
    return FramingError(
        kind="oversize",
        detail=f"line of {size} bytes exceeds the limit of {limit} bytes",
        excerpt=_excerpt(head),
        size=size,
    )


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """How deep lists and dicts nest in a decoded JSON ``value`` (0: a scalar), counted up to
    ``limit + 1`` at most (then it stops looking). Without recursion, so a value too deep for
    Python's recursion limit is measured all the same; one look per container, so a megabyte
    that is one string costs nothing and one of many small objects a fraction of its decode."""
    if value.__class__ is not dict and value.__class__ is not list:
        return 0
    deepest = 1
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
        for item in container.values() if container.__class__ is dict else container:
            if item.__class__ is dict or item.__class__ is list:
                stack.append((item, depth + 1))
    return deepest


def too_deep(line: bytes, payload: Any) -> FramingError | None:
    """The refusal of a line (decoded: ``payload``) nested deeper than :data:`MAX_NESTING`;
    None for any other. A line's brackets bound its depth, so most are cleared by two
    ``count`` calls and never walked."""
    if line.count(b"[") + line.count(b"{") <= MAX_NESTING:
        return None
    if nesting_depth(payload) <= MAX_NESTING:
        return None
    return _nested_too_deep(line)


def _nested_too_deep(line: bytes) -> FramingError:
    return FramingError(
        kind="too_deep",
        detail=f"JSON nested deeper than the limit of {MAX_NESTING} levels",
        excerpt=_excerpt(line),
        size=len(line),
    )


def decode_line(line: bytes, max_line_bytes: int = MAX_LINE_BYTES) -> Frame | None:
    """Turn one complete line (terminator removed) into a frame; None for a blank line."""
    if len(line) > max_line_bytes:
        return _oversize(line, len(line), max_line_bytes)
    try:
        payload = _FAST_DECODE(line)
    except (msgspec.DecodeError, RecursionError):
        return _decode_slowly(line)
    if not isinstance(payload, dict):
        return _decode_slowly(line)
    return too_deep(line, payload) or Message(payload)


#: One line of a run decoded by :func:`decode_lines`: a message's payload, or why the line
#: could not be one.
Decoded: TypeAlias = dict[str, Any] | FramingError


_DICT_ONLY: Final[frozenset[type]] = frozenset({dict})


def decode_lines(
    lines: Sequence[RawLine],
    max_line_bytes: int = MAX_LINE_BYTES,
    hot: msgspec.json.Decoder[Any] | None = None,
) -> list[Any]:
    """Decode a run of lines at once: what :func:`decode_line` makes of each, in order (the
    payload itself for a message, no :class:`Message` around it; blank lines left out), for a
    fraction of its cost per line: one call for the run, one msgspec decode per line.

    ``hot``: a machine's typed decoder (:attr:`~protocols.machine.AgentProtocol.hot_decoder`);
    a line it accepts is that typed message instead of a dict (it stands for exactly the dict
    the line would be), and any other line is decoded as without it."""
    try:
        if max(map(len, lines), default=0) <= max_line_bytes:  # type: ignore[arg-type]
            if hot is not None and len(lines) > 1:
                # A flood's run, typed; a line of another kind raises (line by line, below).
                # One line alone is decoded as a dict: a failed typed decode is an exception,
                # and one line is most often not a stream's (an answer, a permission request).
                return list(map(hot.decode, lines))  # type: ignore[arg-type]
            # No line of the run can nest deeper than its most brackets of each kind together.
            if (
                max(map(bytes.count, lines, repeat(b"[")))  # type: ignore[arg-type]
                + max(map(bytes.count, lines, repeat(b"{")))  # type: ignore[arg-type]
                > MAX_NESTING
            ):
                return _decode_each(lines, max_line_bytes, hot)
            payloads = list(map(_FAST_DECODE, lines))  # type: ignore[arg-type]
            if set(map(type, payloads)) <= _DICT_ONLY:
                return payloads  # every line an object: the whole run decoded in C
    except (msgspec.DecodeError, RecursionError, TypeError):
        pass  # a bad line, a FramingError among them, a run of several kinds: line by line
    return _decode_each(lines, max_line_bytes, hot)


def _decode_each(
    lines: Sequence[RawLine], max_line_bytes: int, hot: msgspec.json.Decoder[Any] | None
) -> list[Any]:
    """:func:`decode_lines`, a line at a time (a bad line, a FramingError, a mixed run)."""
    decoded: list[Any] = []
    append = decoded.append
    for line in lines:
        if hot is not None and line.__class__ is bytes and len(line) <= max_line_bytes:
            try:
                append(hot.decode(line))
                continue
            except (msgspec.DecodeError, RecursionError):
                pass  # not the hot message (or not JSON): decoded as below
        if line.__class__ is bytes and len(line) <= max_line_bytes:
            try:
                payload = _FAST_DECODE(line)
            except (msgspec.DecodeError, RecursionError):
                payload = None
            if payload.__class__ is dict:
                append(too_deep(line, payload) or payload)
                continue
        frame = line if isinstance(line, FramingError) else decode_line(line, max_line_bytes)
        if isinstance(frame, Message):
            append(frame.payload)
        elif frame is not None:
            append(frame)
    return decoded


def _decode_slowly(line: bytes) -> Frame | None:
    """The standard library's verdict on a line the fast decoder refused: what it accepts
    (NaN), or the precise kind of error."""
    if not line or line.isspace():
        return None
    try:
        # Decode explicitly: json.loads(bytes) would guess UTF-16/32 from NUL bytes.
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return FramingError(
            kind="invalid_utf8",
            detail=f"invalid UTF-8 at byte {exc.start}: {exc.reason}",
            excerpt=_excerpt(line),
            size=len(line),
        )
    try:
        payload = json.loads(text)
    except RecursionError:  # nested past what the decoder could follow from here
        return _nested_too_deep(line)
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        return FramingError(
            kind="invalid_json",
            detail=f"invalid JSON: {exc}",
            excerpt=_excerpt(line),
            size=len(line),
        )
    if not isinstance(payload, dict):
        return FramingError(
            kind="not_an_object",
            detail=f"expected a JSON object, got {_json_type_name(payload)}",
            excerpt=_excerpt(line),
            size=len(line),
        )
    return too_deep(line, payload) or Message(payload)


def is_text(value: str) -> bool:
    """Whether a UTF-8 line can carry ``value``: JSON can hold a lone surrogate (``"\\ud800"``,
    what a browser's ``JSON.stringify`` sends for broken pasted text, or an agent's escape),
    UTF-8 cannot."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_message(message: Mapping[str, Any]) -> bytes:
    """Serialise one message as a single line: compact UTF-8 JSON plus b"\\n".

    JSON escapes control characters inside strings and no UTF-8 multi-byte sequence
    contains the byte 0x0A, so the only b"\\n" is the terminator.

    Whatever JSON the agent sent us can be sent back: its request ids, session ids and tool
    input are echoed in our answers, and a message that cannot be written would leave the
    agent waiting for it (or, raised in the actor, end the session). So a lone surrogate,
    which the agent's ``\\ud800`` escape decodes to and UTF-8 has no form for, is written
    as that same escape, and a number JSON has no form for (NaN, an infinity: the
    agent's ``NaN`` literal, or ``1e400``) as ``null``, as JavaScript's ``JSON.stringify``
    writes it, which every parser reads. A value that is not JSON at all (an object of
    ours) still raises ``TypeError``: that is a bug, not input.

    msgspec writes a message in ~0.2 us where the standard library takes ~2.7 (an interrupt
    is one of these); it writes non-finite numbers as ``null`` itself.
    """
    payload = message if isinstance(message, dict) else dict(message)
    try:
        data = _FAST_ENCODE(payload)
    except UnicodeEncodeError:  # a lone surrogate: escaped, as the agent wrote it
        try:
            data = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode("ascii")
        except ValueError:  # a non-finite number besides
            data = json.dumps(_finite(payload), separators=(",", ":"), allow_nan=False).encode(
                "ascii"
            )
    return data + b"\n"


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (a rare message: recursion is
    fine, the value came through :data:`MAX_NESTING` or from us)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _excerpt(line: bytes) -> str:
    return line[:_EXCERPT_BYTES].decode("utf-8", errors="replace")[:EXCERPT_CHARS]


def _json_type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return type(value).__name__
