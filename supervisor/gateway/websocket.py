"""The server side of one WebSocket, on wsproto, shaped for the gateway's fan-out.

The gateway's HTTP layer (h11) has already read the upgrade request; :class:`ServerWebSocket`
completes the handshake from those bytes and then serves one reader (:meth:`get_message`) and one
writer (:meth:`send_frames`). The writer sends *several* messages with one transport write: under
a flood a subscriber's queued events go out in one ``send_all`` instead of one per event. An
event's frame is built once, by its session's fan-out (``supervisor/wire/frames.py``), and the
same bytes go to every subscriber. The frames on the wire are exactly what trio-websocket sends
(unfragmented, unmasked text frames; no extensions are negotiated); only the number of writes
differs.
"""

from __future__ import annotations

from typing import Final

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.handshake import WEBSOCKET_VERSION
from wsproto.utilities import RemoteProtocolError

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_TOO_BIG",
    "HandshakeFailed",
    "ServerWebSocket",
    "WebSocketClosed",
]

#: RFC 6455 section 7.4.1: "the message is too big to process".
CLOSE_TOO_BIG: Final = 1009
#: RFC 6455 section 7.4.1: "an endpoint is going away, such as a server going down".
CLOSE_GOING_AWAY: Final = 1001
_RECEIVE_BYTES: Final = 65536
#: Fragments of a message kept apart before they are joined into one piece: each is a Python
#: object of ~50 bytes beside its data, so a message sent as 2-byte fragments would take 25
#: times its size (16 MiB of it, 450 MB) if they were all kept until the last one.
_LOOSE_PARTS: Final = 256
#: Frames read from one read's bytes before the other tasks get a turn: a read of 64 KiB is up
#: to ~9,000 tiny frames (1-byte fragments, pings), ~70 ms of wsproto's parsing, and every
#: other client's request (a cancel is several hops) would wait that long per hop.
_FRAMES_PER_TURN: Final = 256


class WebSocketClosed(Exception):
    """The connection is closed (by the peer, by us, or the transport broke)."""


class HandshakeFailed(Exception):
    """The upgrade request was not a valid WebSocket handshake: the HTTP ``status`` and
    ``headers`` to refuse it with (426 and the version we speak for another version, RFC 6455
    section 4.4)."""

    def __init__(
        self, message: str, status: int = 400, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


def _wire_size(data: str | bytes) -> int:
    """A fragment's size in bytes (a text fragment's UTF-8 bytes, not its characters)."""
    if isinstance(data, bytes) or data.isascii():
        return len(data)
    return len(data.encode("utf-8", "surrogatepass"))


class ServerWebSocket:
    """One accepted WebSocket. One task reads, one task writes; control frames (pong, close)
    share the transport with the writer under a lock, so a frame is never interleaved."""

    def __init__(self, stream: trio.abc.Stream, *, max_message_bytes: int) -> None:
        self._stream = stream
        self._max = max_message_bytes
        self._ws = WSConnection(ConnectionType.SERVER)
        self._send_lock = trio.Lock()
        self._parts: list[str | bytes] = []  # the message so far: joined pieces, then loose parts
        self._loose = 0  # parts at the end of ``_parts`` not joined yet
        self._size = 0
        self._messages: list[str | bytes] = []
        self.closed = False
        #: why it closed (a WebSocket close code), once it has
        self.close_code: int | None = None
        #: pings we sent (numbered 1, 2, ...) and the highest one the peer answered: a peer
        #: answers a ping once it has read everything sent before it (flow control)
        self.pings_sent = 0
        self.pongs_seen = 0
        #: woken by each pong, and when the connection closes
        self.pong_lot = trio.lowlevel.ParkingLot()

    async def accept(self, request: bytes) -> None:
        """Complete the handshake for an upgrade request already read (its raw bytes)."""
        try:
            self._ws.receive_data(request)
            events = list(self._ws.events())
        except RemoteProtocolError as exc:
            hint = exc.event_hint
            if isinstance(hint, RejectConnection) and hint.status_code == 426:
                # A version other than 13 (wsproto's message would say the header is missing).
                versions = tuple((k.decode(), v.decode()) for k, v in hint.headers)
                ours = WEBSOCKET_VERSION.decode()
                message = f"unsupported WebSocket version: this server speaks {ours}"
                raise HandshakeFailed(message, 426, versions) from None
            raise HandshakeFailed(str(exc)) from None
        if not any(isinstance(event, Request) for event in events):
            raise HandshakeFailed("incomplete upgrade request")
        await self._send(self._ws.send(AcceptConnection()))

    async def get_message(self) -> str | bytes:
        """The next complete message; raises :class:`WebSocketClosed` when the peer is gone."""
        while not self._messages:
            if self.closed:
                raise WebSocketClosed(self.close_code)
            try:
                data = await self._stream.receive_some(_RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            await self._receive(data)
        return self._messages.pop(0)

    async def send_frames(self, frames: list[bytes]) -> None:
        """Send complete frames (``supervisor/wire/frames.py``) with one transport write."""
        await self._send(b"".join(frames) if len(frames) > 1 else frames[0], data_frames=True)

    async def ping(self) -> int:
        """Send a numbered ping; its number (``pongs_seen`` reaches it when answered)."""
        self.pings_sent += 1
        number = self.pings_sent
        await self._send(self._ws.send(Ping(payload=str(number).encode())), data_frames=True)
        return number

    async def close(self, code: int, reason: str = "") -> None:
        """Start the close handshake; nothing more is sent after it."""
        data = self._close(code, reason)
        if data:
            await self._send(data)

    async def _receive(self, data: bytes | bytearray) -> None:
        self._ws.receive_data(bytes(data) if data else None)
        reply = b""
        for count, event in enumerate(self._ws.events(), 1):
            if count % _FRAMES_PER_TURN == 0:
                await trio.lowlevel.checkpoint()
            if isinstance(event, Message):
                self._parts.append(event.data)
                self._size += _wire_size(event.data)
                self._loose += 1
                if self._loose >= _LOOSE_PARTS:
                    self._join_loose()
                if self._size > self._max:
                    reply += self._close(CLOSE_TOO_BIG, "message too big")
                    break
                if event.message_finished:
                    if isinstance(event, TextMessage):
                        message: str | bytes = "".join(p for p in self._parts if isinstance(p, str))
                    else:
                        assert isinstance(event, BytesMessage)
                        message = b"".join(p for p in self._parts if isinstance(p, bytes))
                    self._messages.append(message)
                    self._parts = []
                    self._size = 0
                    self._loose = 0
            elif isinstance(event, Ping):
                if self._ws.state is ConnectionState.OPEN:
                    reply += self._ws.send(event.response())
            elif isinstance(event, Pong):
                try:
                    number = int(bytes(event.payload))
                except ValueError:
                    continue  # not ours (an unsolicited pong)
                if self.pongs_seen < number <= self.pings_sent:
                    self.pongs_seen = number
                    self.pong_lot.unpark_all()
            elif isinstance(event, CloseConnection):
                # The peer closed (answer it), or sent something invalid (close with its code).
                if self._ws.state is ConnectionState.REMOTE_CLOSING:
                    reply += self._ws.send(event.response())
                    self.closed = True
                    self.close_code = event.code
                    self.pong_lot.unpark_all()
                else:
                    reply += self._close(event.code, event.reason or "")
                break
        if reply:
            await self._send(reply)

    def _join_loose(self) -> None:
        """Join the loose parts at the end of the message into one piece (never the pieces
        already joined: each byte is copied about twice in all, however many fragments)."""
        loose = self._parts[-self._loose :]
        piece: str | bytes = (
            "".join(p for p in loose if isinstance(p, str))
            if isinstance(loose[0], str)
            else b"".join(p for p in loose if isinstance(p, bytes))
        )
        self._parts[-self._loose :] = [piece]
        self._loose = 0

    def _close(self, code: int, reason: str) -> bytes:
        self.closed = True
        self.pong_lot.unpark_all()
        self.close_code = code
        if self._ws.state is ConnectionState.OPEN:
            return self._ws.send(CloseConnection(code=code, reason=reason))
        return b""

    async def _send(self, data: bytes, *, data_frames: bool = False) -> None:
        async with self._send_lock:
            if data_frames and self.closed:
                raise WebSocketClosed(self.close_code)  # nothing may follow a close frame
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.closed = True
                self.pong_lot.unpark_all()
                raise WebSocketClosed(self.close_code) from None
