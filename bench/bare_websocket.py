"""RFC 6455 by hand: the little of it the throughput benchmark needs on both ends.

No WebSocket library on either side of the floor, and a receiver that does as little as it can
per frame: parse the 2-10 byte header, look at the first bytes of the payload, skip the rest.
Only what the benchmark uses: unfragmented text frames, no extensions, no ping/pong.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct

__all__ = [
    "FrameScanner",
    "accept_key",
    "client_handshake",
    "masked_text_frame",
    "parse_request_key",
    "server_handshake",
    "text_frame",
    "unmask",
]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3


def accept_key(key: bytes) -> bytes:
    return base64.b64encode(hashlib.sha1(key + _GUID).digest())


def client_handshake(host: str, target: str) -> tuple[bytes, bytes]:
    """The upgrade request for ``target`` (path and query) and the accept value to expect."""
    key = base64.b64encode(os.urandom(16))
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    return request, accept_key(key)


def parse_request_key(request: bytes) -> bytes:
    """The ``Sec-WebSocket-Key`` of an upgrade request (its head, up to the blank line)."""
    for header in request.split(b"\r\n")[1:]:
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"sec-websocket-key":
            return value.strip()
    raise ValueError("not a WebSocket upgrade request")


def server_handshake(request: bytes) -> bytes:
    """The ``101 Switching Protocols`` answer to an upgrade request."""
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept_key(parse_request_key(request)) + b"\r\n\r\n"
    )


def text_frame(payload: bytes) -> bytes:
    """A server's text message: FIN, opcode 1, no mask (section 5.2)."""
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


def masked_text_frame(payload: bytes) -> bytes:
    """A client's text message: masked, as section 5.3 requires of every client frame."""
    mask = os.urandom(4)
    body = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
    size = len(payload)
    if size < 126:
        head = bytes((0x81, 0x80 | size))
    elif size < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
    return head + mask + body


class FrameScanner:
    """Splits a byte stream into frames: yields each one's payload bounds, copies nothing.

    ``feed`` appends bytes; ``frames()`` returns ``(start, end)`` of every complete payload in
    :attr:`buffer` (valid until the next ``feed``), masked or not. Unmasking, if needed, is the
    caller's: the receivers only read server frames, which are never masked.
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self._done = 0  # bytes of the buffer already handed out as frames

    def feed(self, data: bytes) -> None:
        if self._done:
            del self.buffer[: self._done]
            self._done = 0
        self.buffer += data

    def frames(self) -> list[tuple[int, int]]:
        buffer, at, size, found = self.buffer, self._done, len(self.buffer), []
        while size - at >= 2:
            length = buffer[at + 1] & 0x7F
            head = 2
            if length == 126:
                if size - at < 4:
                    break
                length, head = (buffer[at + 2] << 8) | buffer[at + 3], 4
            elif length == 127:
                if size - at < 10:
                    break
                length, head = int.from_bytes(buffer[at + 2 : at + 10], "big"), 10
            if buffer[at + 1] & 0x80:
                head += 4
            end = at + head + length
            if end > size:
                break
            found.append((at + head, end))
            at = end
        self._done = at
        return found


def unmask(buffer: bytes | bytearray, start: int, end: int) -> bytes:
    """The payload ``buffer[start:end]`` of a masked frame (its key is the 4 bytes before it)."""
    mask = buffer[start - 4 : start]
    return bytes(byte ^ mask[i % 4] for i, byte in enumerate(buffer[start:end]))
