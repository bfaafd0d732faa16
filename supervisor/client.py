"""A Python client for the gateway (trio-websocket), used by the CLI, tests and benchmarks.

```python
async with connect("http://127.0.0.1:8765/?token=T") as client:
    session_id = (await client.start_session("demo"))["session_id"]
    async with client.subscribe(session_id) as events:
        turn = await client.prompt(session_id, "hello")
        receipt = await client.cancel(session_id)   # after the turn has ended
        async for event in events: ...               # {"event", "session_id", "seq", "data"}
```
Requests may run concurrently on one connection; responses are matched by id. One task reads
the socket and hands each frame on in wire order, and the gateway sends a response only after
the events it followed: when ``cancel()`` returns, the turn's ``turn.ended`` is already in
``events``.
"""

from __future__ import annotations

import itertools
import json
import math
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from protocols import events as ev
from protocols.mcp import McpServer, mcp_server_to_acp
from supervisor.wire.codec import known_event

__all__ = [
    "CONNECT_ERRORS",
    "GatewayClient",
    "GatewayError",
    "connect",
    "not_connected",
    "websocket_url",
]

#: The gateway's notices a client keeps until taken (they come every 10 s at most).
_NOTICES_KEPT = 64


class GatewayError(Exception):
    """The gateway answered ``ok: false``; ``code`` is the stable error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


#: What :func:`connect` raises when the gateway cannot be had: none listens, or it answered no
#: (``ConnectionRejected`` is a ``HandshakeError``), or it hung up; :func:`not_connected` says it.
CONNECT_ERRORS = (OSError, HandshakeError, ConnectionClosed)


def not_connected(url: str, exc: BaseException) -> str:
    """The one line a command prints when ``exc`` (one of :data:`CONNECT_ERRORS`) kept it
    from the gateway at ``url`` (never its token)."""
    where = urlsplit(url).netloc or url
    if isinstance(exc, ConnectionRejected):
        if exc.status_code == 401:  # (its body is the gateway's JSON: the status says it all)
            return f"{where} refused the token (HTTP 401)"
        body = (exc.body or b"").decode("utf-8", errors="replace").strip()
        return f"{where} refused the connection (HTTP {exc.status_code}): {body}"
    # trio-websocket's HandshakeError says nothing itself; its cause says why.
    why = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
    return f"cannot connect to {where}: {why} (is `agent-supervisor serve` running there?)"


def websocket_url(url: str, token: str | None = None) -> str:
    """``http://host:port/?token=T`` (what ``serve`` prints) to ``ws://host:port/ws?token=T``."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    query = parse_qs(parts.query)
    if token is None and query.get("token"):
        token = query["token"][0]
    path = parts.path if parts.path.endswith("/ws") else "/ws"
    suffix = f"?{urlencode({'token': token})}" if token else ""
    return f"{scheme}://{parts.netloc}{path}{suffix}"


class GatewayClient:
    def __init__(self, websocket: WebSocketConnection) -> None:
        self.websocket = websocket
        self._ids = itertools.count(1)
        self._waiting: dict[str, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._events: dict[str, trio.MemorySendChannel[dict[str, Any]]] = {}
        #: the last ``session.subscribe`` answer of each session (``last_seq``: the newest
        #: event then, so a replay from ``since_seq`` is over once that one has come)
        self.subscribed: dict[str, dict[str, Any]] = {}
        self.closed = trio.Event()
        #: the gateway's own notices, of no session (``store.error``, ``store.recovered``),
        #: the newest kept (:meth:`next_notice`)
        self.notices: deque[dict[str, Any]] = deque(maxlen=_NOTICES_KEPT)
        self._noticed = trio.Event()

    async def _read(self) -> None:
        try:
            while True:
                message = json.loads(await self.websocket.get_message())
                if "event" in message:
                    if message.get("session_id") is None:
                        self.notices.append(message)
                        self._noticed.set()
                        self._noticed = trio.Event()
                        continue
                    channel = self._events.get(message.get("session_id"))
                    if channel is not None:
                        channel.send_nowait(message)
                else:
                    waiter = self._waiting.pop(str(message.get("id")), None)
                    if waiter is not None:
                        waiter.send_nowait(message)
        except ConnectionClosed:
            pass
        finally:
            self.closed.set()
            self._noticed.set()  # a next_notice() waiting hears of the close
            for channel in [*self._waiting.values(), *self._events.values()]:
                channel.close()

    async def next_notice(self) -> dict[str, Any]:
        """The oldest notice of the gateway's not taken yet, waiting for one if none is."""
        while not self.notices:
            if self.closed.is_set():
                raise GatewayError("connection_closed", "the gateway closed the connection")
            await self._noticed.wait()
        return self.notices.popleft()

    async def request(self, action: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request and wait for its response; raises :class:`GatewayError`."""
        request_id = f"c{next(self._ids)}"
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[request_id] = send
        message = {"id": request_id, "action": action, "payload": payload or {}}
        await self.websocket.send_message(json.dumps(message))
        try:
            response = await receive.receive()
        except trio.EndOfChannel:
            raise GatewayError("connection_closed", "the gateway closed the connection") from None
        finally:
            self._waiting.pop(request_id, None)
        if not response.get("ok"):
            error = response.get("error") or {}
            raise GatewayError(str(error.get("code")), str(error.get("message")))
        result: dict[str, Any] = response["result"]
        return result

    async def agents(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = (await self.request("agents.list"))["agents"]
        return result

    async def start_session(
        self,
        agent: str,
        cwd: str | None = None,
        *,
        host: str | None = None,
        mcp_servers: Sequence[McpServer | Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """``{"session_id", "state", "host"?}``; ``host``: one of the agent's ``hosts``;
        ``mcp_servers``: for this session, on top of the agent's own (ACP ``McpServer``
        objects, or :class:`~protocols.mcp.McpServer`)."""
        payload: dict[str, Any] = (
            {"agent": agent} | ({"cwd": cwd} if cwd else {}) | ({"host": host} if host else {})
        )
        if mcp_servers:
            payload["mcp_servers"] = [
                mcp_server_to_acp(s) if isinstance(s, McpServer) else dict(s) for s in mcp_servers
            ]
        return await self.request("session.start", payload)

    async def sessions(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = (await self.request("session.list"))["sessions"]
        return result

    async def prompt(
        self, session_id: str, text: str, *, content: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """``content``: the prompt as ACP content blocks when it is more than text (images,
        resources); ``text`` is then what events show of it."""
        payload: dict[str, Any] = {"session_id": session_id, "text": text}
        if content:
            payload["content"] = content
        return await self.request("agent.prompt", payload)

    async def set_mode(self, session_id: str, mode_id: str) -> None:
        await self.request("agent.set_mode", {"session_id": session_id, "mode_id": mode_id})

    async def input(self, session_id: str, data: str) -> None:
        """Keys for a terminal agent's terminal, as typed."""
        await self.request("session.input", {"session_id": session_id, "data": data})

    async def resize(self, session_id: str, cols: int, rows: int) -> None:
        await self.request("session.resize", {"session_id": session_id, "cols": cols, "rows": rows})

    async def steer(self, session_id: str, text: str) -> dict[str, Any]:
        """``{"mode", "turn_id", "receipt"?}``: see :class:`supervisor.steering.SteerResult`."""
        return await self.request("agent.steer", {"session_id": session_id, "text": text})

    async def cancel(
        self, session_id: str, *, task_id: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"session_id": session_id}
        if task_id is not None:
            payload["task_id"] = task_id
        if reason is not None:
            payload["reason"] = reason
        return await self.request("agent.cancel", payload)

    async def respond_permission(
        self, session_id: str, request_id: str, option_id: str | None = None
    ) -> None:
        payload: dict[str, Any] = {"session_id": session_id, "request_id": request_id}
        if option_id is None:
            payload["cancelled"] = True
        else:
            payload["option_id"] = option_id
        await self.request("permission.respond", payload)

    async def stop(self, session_id: str) -> dict[str, Any]:
        return await self.request("session.stop", {"session_id": session_id})

    async def receipts(
        self, *, limit: int | None = None, since_seq: int | None = None
    ) -> dict[str, Any]:
        """The gateway's last stops, oldest first: ``{"receipts", "kept", "last_seq"}``
        (``supervisor/stops.py``); ``since_seq``: only those after it."""
        payload: dict[str, Any] = {}
        if limit is not None:
            payload["limit"] = limit
        if since_seq is not None:
            payload["since_seq"] = since_seq
        return await self.request("receipts.list", payload)

    async def search(self, query: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Stored texts (prompts, steers, answers) of every session holding ``query``'s words,
        the best first: ``[{"session_id", "turn_id", "seq", "kind", "snippet", "time",
        "agent"}]`` (``session.search``; a gateway without a store answers ``bad_request``)."""
        payload: dict[str, Any] = {"query": query}
        if limit is not None:
            payload["limit"] = limit
        hits: list[dict[str, Any]] = (await self.request("session.search", payload))["hits"]
        return hits

    async def pause(self, deadline_s: float | None = None) -> dict[str, Any]:
        """Pause all: no new turn starts in any session until :meth:`resume`; turns still
        running ``deadline_s`` from now are cancelled. ``{"paused", "deadline_s", "held",
        "running", "pending"}``: see :class:`supervisor.pausing.PauseStatus`."""
        payload = {"deadline_s": deadline_s} if deadline_s is not None else {}
        return await self.request("gateway.pause", payload)

    async def resume(self) -> dict[str, Any]:
        """Resume all: every session starts what it held, in order."""
        return await self.request("gateway.resume")

    @asynccontextmanager
    async def subscribe(
        self, session_id: str, *, since_seq: int | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[dict[str, Any]]]:
        """Events of one session (wire dicts), in order, replayed after ``since_seq``.

        One subscription per session per client: the gateway keeps one per connection, so a
        second would take the first's events and end it on leaving. A second while the first
        is open raises :class:`GatewayError` (``bad_request``); connect again for another."""
        if session_id in self._events:
            raise GatewayError(
                "bad_request",
                f"this client is subscribed to {session_id} already (one subscription per"
                " session per connection: connect again for another)",
            )
        send, receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._events[session_id] = send
        payload: dict[str, Any] = {"session_id": session_id}
        if since_seq is not None:
            payload["since_seq"] = since_seq
        try:
            self.subscribed[session_id] = await self.request("session.subscribe", payload)
            yield receive
        finally:
            if self._events.get(session_id) is send:
                del self._events[session_id]
            send.close()
            if not self.closed.is_set():
                with trio.move_on_after(2) as scope:
                    scope.shield = True
                    try:
                        await self.request("session.unsubscribe", {"session_id": session_id})
                    except (GatewayError, ConnectionClosed):
                        pass

    async def events(
        self,
        session_id: str,
        channel: trio.MemoryReceiveChannel[dict[str, Any]],
        *,
        after_seq: int | None = None,
    ) -> AsyncIterator[ev.Event]:
        """The events of a :meth:`subscribe` channel as event objects, each once, in order,
        after ``after_seq``: a subscription cut off for falling behind is renewed from the
        last one given; kinds this version does not know are skipped. Ends with the
        subscription, or when it cannot be renewed."""
        async for message in channel:
            kind = message.get("event")
            if kind == "subscription.lagged":
                payload: dict[str, Any] = {"session_id": session_id}
                if after_seq is not None:
                    payload["since_seq"] = after_seq
                try:
                    await self.request("session.subscribe", payload)
                except (GatewayError, ConnectionClosed):
                    return
                continue
            if kind == "subscription.closed":
                return
            event = known_event(message)
            if event is None or (after_seq is not None and event.seq <= after_seq):
                continue
            after_seq = event.seq
            yield event


@asynccontextmanager
async def connect(
    url: str, *, token: str | None = None, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[GatewayClient]:
    """Connect to a gateway URL (the ``ready`` line's, or a ``ws://.../ws`` one); an
    ``https``/``wss`` one with ``ssl_context`` (default: the system's trusted CAs)."""
    async with open_websocket_url(
        websocket_url(url, token), ssl_context=ssl_context, max_message_size=64 * 1024 * 1024
    ) as websocket:
        client = GatewayClient(websocket)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
