"""The WebSocket text frames that carry the wire's messages (RFC 6455 5.2), built without I/O.

On the gateway's WebSockets an event travels as one unfragmented, unmasked text frame. The
frame is built once, by the session's fan-out (``supervisor/runtime/fanout.py``), for every
gateway subscriber at once: the framing lives with the wire, not the gateway, because the
fan-out builds it; a connection's writer only sends it (``supervisor/gateway/websocket.py``).
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["frame_payload", "text_frame", "text_frames"]


def text_frame(payload: bytes) -> bytes:
    """One complete text message as a server sends it: FIN, opcode 1, no mask (RFC 6455 5.2)."""
    return _text_header(len(payload)) + payload


def _text_header(size: int) -> bytes:
    """The header of a text frame of ``size`` bytes, its length in the fewest bytes."""
    if size < 126:
        return bytes((0x81, size))
    if size < 65536:
        return struct.pack("!BBH", 0x81, 126, size)
    return struct.pack("!BBQ", 0x81, 127, size)


class _Headers(dict[int, bytes]):
    """Text frame headers by payload size, each built once: most events are of a few sizes."""

    def __missing__(self, size: int) -> bytes:
        header = _text_header(size)
        if size < _CACHED_HEADERS:
            self[size] = header
        return header


#: Headers of payloads up to this size are kept (a few hundred bytes each at most in all).
_CACHED_HEADERS = 4096
_HEADERS = _Headers()


def text_frames(payloads: list[bytes]) -> list[bytes]:
    """:func:`text_frame` of each payload, for a batch: headers looked up, frames built in C."""
    return list(map(bytes.__add__, map(_HEADERS.__getitem__, map(len, payloads)), payloads))


#: A text frame's header size by the 7-bit length field of its second byte (RFC 6455 5.2).
_HEADER_SIZES: Final = {126: 4, 127: 10}


def frame_payload(frame: bytes) -> bytes:
    """The payload of a :func:`text_frame` (the event's JSON)."""
    return frame[_HEADER_SIZES.get(frame[1], 2) :]
