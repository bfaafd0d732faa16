"""The gateway: WebSocket (``/ws``), the web UI (``/``) and a small HTTP API on one port.

HTTP is parsed by h11; a request to ``/ws`` that asks for an upgrade is handed, with the bytes
already read, to :class:`~supervisor.gateway.websocket.ServerWebSocket` (wsproto). Every route needs
the token (``Authorization: Bearer T`` or ``?token=T``, compared in constant time), and a browser
``Origin`` must be this server's own, so a page on another site cannot drive local agents. See
``design/gateway.md`` for the fan-out.
"""

from __future__ import annotations

import hmac
import importlib.resources
import logging
import re
import secrets
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from http import HTTPStatus
from typing import Any, Final, assert_never
from urllib.parse import quote, unquote, unquote_plus, urlsplit

import h11
import trio
from attrs import define, field, frozen

from protocols import PROTOCOLS
from supervisor.config import AgentSpec
from supervisor.errors import AgentNotRunning, BadRequest, SupervisorError
from supervisor.gateway.websocket import (
    CLOSE_GOING_AWAY,
    HandshakeFailed,
    ServerWebSocket,
    WebSocketClosed,
)
from supervisor.runtime.session import Subscription
from supervisor.supervisor import AnySession, Supervisor
from supervisor.wire.codec import dumps, receipt_to_wire, steer_to_wire
from supervisor.wire.frames import text_frame
from supervisor.wire.requests import (
    HARD_FRAME_BYTES,
    Cancel,
    ListAgents,
    ListSessions,
    Prompt,
    Request,
    RequestError,
    RespondPermission,
    SetMode,
    StartSession,
    Steer,
    StopSession,
    Subscribe,
    Unsubscribe,
    decode_abort,
    decode_request,
    error_response,
    ok_response,
    session_of,
)

__all__ = ["Gateway", "LIMITS", "GatewayLimits"]

log = logging.getLogger(__name__)


@define
class GatewayLimits:
    """Per-server bounds, each a guard against one runaway client (``design/gateway.md``,
    "Limits", says what each protects)."""

    #: TCP connections at once. When full, a new one takes the place of the oldest that has
    #: not shown the token yet, else of the oldest idle keep-alive; one serving a request or a
    #: WebSocket is never closed for it (then the new one gets 503).
    max_connections: int = 256
    #: requests a connection may have in flight (a cancel waits for the turn to end)
    max_pending: int = 64
    #: responses queued for one client's socket before its requests are no longer read
    outgoing_buffer: int = 1024
    #: events a subscription may fall behind before it holds the agent back (see stall)
    subscription_buffer: int = 4096
    #: a subscriber whose buffer is full holds the session's agent back (its output is not
    #: read) rather than being cut off and losing what the history no longer holds; one that
    #: takes nothing at all for this long is cut off (``subscription.lagged``, then since_seq).
    #: So a stalled client delays the others by at most this much, once per stall.
    subscriber_stall_s: float = 5.0
    #: events taken from one subscription for one socket write (several frames, one write)
    batch_events: int = 256
    #: events of all subscriptions in one socket write (beyond a response's own barrier): a
    #: connection subscribed to many flooding sessions writes in bounded pieces, so a response
    #: queued meanwhile waits behind one piece, not one batch of every subscription;
    #: subscriptions take turns being first
    write_events: int = 1024
    #: flow control above TCP (None: off): at most about this many bytes of events written and
    #: not yet read by the client. The writer pings after each quarter of it, and while four
    #: pings are unanswered (a client answers a ping once it has read what came before) it
    #: writes only answers to requests (and the events their barriers need), no more events. For
    #: a node's gateway, whose one client (a front's link) sits behind pipes and an SSH
    #: channel that buffer megabytes TCP knows nothing of: without it a quiet session's
    #: receipt queues behind all of that (``design/remote.md``, "Flow control")
    flight_bytes: int | None = None
    #: the transport's hard frame limit; frames between MAX_FRAME_BYTES and this get too_large
    hard_frame_bytes: int = HARD_FRAME_BYTES
    #: an HTTP request head (nginx's default in all), and a body for the small API. h11 parses
    #: a head whole before its token is checked, in time that grows with its bytes
    max_head_bytes: int = 32 * 1024
    #: lines of an HTTP request head (Apache's ``LimitRequestFields``). A head is parsed whole
    #: before its token can be checked, on the one thread every session shares, and 64 KiB of
    #: short header lines cost milliseconds: a few hundred such heads released at once held
    #: everyone's requests, cancels too, for seconds. Counted as the bytes come, before h11
    #: parses them; a head with more is refused (431) unparsed.
    max_head_fields: int = 100
    max_body_bytes: int = 64 * 1024
    #: from the moment a connection waits for a request (it opened, or had its last answer)
    #: until that request's head and body are all in, TLS handshake included: a client that
    #: sends slowly (slowloris), or a head and then no body, holds its slot this long at most.
    #: The same bound applies to writing an HTTP answer to a client that reads nothing.
    request_timeout_s: float = 10.0
    #: kernel send buffer per connection (None: the OS autotunes, up to several MB); a
    #: smaller one bounds memory per client and makes a stalled reader felt sooner
    send_buffer_bytes: int | None = None


LIMITS: Final = GatewayLimits()
#: A session actor answers a subscribe ahead of any agent output; this only bounds a shield.
_SUBSCRIBE_BOUND_S: Final = 10.0

_HTTP_STATUS = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "session_not_found": 404,
    "not_found": 404,
    "agent_not_running": 409,
    "too_large": 413,
    "overloaded": 429,
    "internal": 500,
    "capacity": 503,
}


@define(eq=False)
class _Slot:
    """One TCP connection's place among ``max_connections``."""

    scope: trio.CancelScope = field(factory=trio.CancelScope)
    #: ``new`` (no request has shown the token yet), ``busy`` (serving an authenticated
    #: request, or a WebSocket) or ``idle`` (an authenticated keep-alive between requests)
    state: str = "new"


@define
class _HeadWatch:
    """What is looked at of one request head as its bytes come, before h11 parses it: its
    lines (``max_head_fields``: the newlines up to the blank line that ends it, found across
    reads) and, once it has ended, whether it holds a credential anywhere (:meth:`shows`)."""

    limit: int
    #: the most of a head that is kept (beyond it h11 refuses the head anyway)
    most: int
    lines: int = 0
    ended: bool = False
    tail: bytes = b""  # the last two bytes seen: a blank line may span two reads
    #: the head's bytes so far (up to ``most``), for :meth:`shows`
    head: bytearray = field(factory=bytearray)

    def feed(self, data: bytes) -> bool:
        """Count ``data``'s lines; False once the head has more than ``limit``."""
        if self.ended:
            return True
        window = self.tail + data
        end = _HEAD_END.search(window)
        if end is None:
            self.lines += data.count(b"\n")
            self.tail = window[-2:]
            taken = len(data)
        else:
            self.ended = True
            taken = max(0, end.end() - len(self.tail))
            self.lines += data.count(b"\n", 0, taken)
        if len(self.head) < self.most:
            self.head += data[: min(taken, self.most - len(self.head))]
        return self.lines <= self.limit + 2  # the request line and the blank line are free

    def shows(self, credentials: tuple[bytes, ...]) -> bool:
        """Whether the whole head holds one of ``credentials`` anywhere (one search in C each):
        a head without any cannot pass the token check, and is refused before it is parsed."""
        return any(credential in self.head for credential in credentials)


#: The blank line that ends an HTTP head (h11 also takes bare LF line ends)
_HEAD_END: Final = re.compile(rb"\n\r?\n")


@frozen
class _Incoming:
    """An authenticated HTTP request, read whole."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    upgrade: bool = False


class Gateway:
    """The server. ``ssl_context`` serves HTTPS and WSS (``--tls-cert``/``--tls-key``);
    ``allow_hosts`` are more names clients may reach it by (the ``Host`` check: a DNS-rebinding
    guard), ``NAME`` (this port) or ``NAME:PORT``.

    ``client_scope``: a hook for an embedding program, called for each WebSocket client once
    it has shown the token and completed the handshake; the async context manager it returns
    is entered before the client's first request is read and exited when the client is gone
    (it closed, broke, or the server stopped). A node counts its drivers with it
    (``supervisor/node/daemon.py``). An exception it raises on entry refuses the client
    (the connection closes)."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 8765,
        limits: GatewayLimits = LIMITS,
        ssl_context: ssl.SSLContext | None = None,
        allow_hosts: Sequence[str] = (),
        accept_specs: bool = False,
        client_scope: Callable[[], AbstractAsyncContextManager[object]] | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.client_scope = client_scope
        #: ``session.start`` may carry the agent's definition (``spec``): a node's gateway,
        #: driven by a front that already runs commands on this host (``supervisor/remote/``)
        self.accept_specs = accept_specs
        self.token = token or secrets.token_urlsafe(24)
        self.host = host
        self.port = port
        self.limits = limits
        self.ssl_context = ssl_context
        self.allow_hosts = [name.lower() for name in allow_hosts]
        self._slots: dict[_Slot, None] = {}  # every open connection, oldest first
        #: unexpected failures of connections that never showed the token, since the last
        #: line that told of them (``_unauthenticated_failure``), and when that was
        self._quiet_failures = 0
        self._quiet_logged_at = -_QUIET_LOG_S
        self._clients: set[_Client] = set()  # the WebSocket ones
        self._allowed_hosts: set[str] = set()
        self._allowed_origins: set[str] = set()
        self._accepting = trio.CancelScope()

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    @property
    def url(self) -> str:
        host = _url_host(self.host)
        if self.host in _WILDCARDS and self.allow_hosts:
            host = _PORT.sub("", self.allow_hosts[0])  # the name a certificate was made for
        return f"{self.scheme}://{host}:{self.port}/?token={quote(self.token, safe='')}"

    @property
    def connections(self) -> int:
        return len(self._slots)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status.started`` gets the URL once accepting."""
        sockets = await trio.open_tcp_listeners(self.port, host=self.host)
        sockname = sockets[0].socket.getsockname()
        self.port = int(sockname[1])
        listeners: list[trio.abc.Listener[Any]] = list(sockets)
        if self.ssl_context is not None:
            # The handshake happens on the first read, inside the request's deadline.
            listeners = [
                trio.SSLListener(listener, self.ssl_context, https_compatible=True)
                for listener in sockets
            ]
        await self.serve_listeners(listeners, task_status=task_status)

    async def serve_listeners(
        self,
        listeners: list[trio.abc.Listener[Any]],
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve on listeners made elsewhere (a node's Unix socket), with ``port`` as given."""
        self._allowed_hosts = self._host_names()
        self._allowed_origins = {f"{self.scheme}://{name}" for name in self._allowed_hosts}
        async with trio.open_nursery() as nursery:
            await nursery.start(self._accept, listeners, nursery)
            task_status.started(self.url)

    async def _accept(
        self,
        listeners: list[trio.abc.Listener[Any]],
        connections: trio.Nursery,
        *,
        task_status: trio.TaskStatus[list[trio.abc.Listener[Any]]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with self._accepting:
            await trio.serve_listeners(
                self._handle_stream,
                listeners,
                handler_nursery=connections,
                task_status=task_status,
            )

    def stop_accepting(self) -> None:
        """Close the listening sockets; the connections already open go on (a graceful stop
        lets their clients see their turns end)."""
        self._accepting.cancel()

    def _host_names(self) -> set[str]:
        """The ``Host`` values we answer to: ``NAME:PORT`` for our own names and the allowed
        ones, and the bare name too on the scheme's default port (browsers leave it out)."""
        default_port = 443 if self.ssl_context is not None else 80
        names = {self.host, "127.0.0.1", "localhost", "[::1]", _url_host(self.host)}
        allowed: set[str] = set()
        for name in (*names, *self.allow_hosts):
            name = name.lower()
            if _PORT.search(name):
                allowed.add(name)
                continue
            allowed.add(f"{name}:{self.port}")
            if self.port == default_port:
                allowed.add(name)
        return allowed

    # -- authorization -------------------------------------------------------------------------

    def _token_ok(self, headers: dict[str, str], query: str) -> bool:
        provided = None
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            provided = auth[7:].strip()
        else:
            provided = _query_token(query, longest=max(1024, 3 * len(self.token)))
        if provided is None:
            return False
        return hmac.compare_digest(provided.encode(), self.token.encode())

    def _origin_ok(self, headers: dict[str, str]) -> bool:
        """Same-origin only for browsers; DNS-rebinding guard on Host for everyone."""
        host = headers.get("host")
        if host is not None and host.lower() not in self._allowed_hosts:
            return False
        origin = headers.get("origin")
        if origin is None:
            return True  # not a browser (or a same-origin GET): the token decides
        return origin.lower() in self._allowed_origins

    @property
    def _page_cookie(self) -> tuple[str, str]:
        """The cookie that lets a browser reload the page (and only the page: it opens no API)
        once the page has dropped the token from its URL: a key derived from the token, not
        the token; named per port (cookies are per host, not per port)."""
        key = hmac.new(self.token.encode(), b"agent-supervisor page", "sha256").hexdigest()
        return f"agent-supervisor-page-{self.port}", key

    def _credentials(self) -> tuple[bytes, ...]:
        """What a head that may pass the token check holds somewhere: the token as it is, or as
        ``quote`` writes it in a URL (as ``serve`` prints it), or the page's cookie key. (A
        client that percent-encodes characters a URL needs not encode sends the token in its
        ``Authorization`` header instead.)"""
        _, key = self._page_cookie
        return (self.token.encode(), quote(self.token, safe="").encode(), key.encode())

    def _page_cookie_ok(self, headers: dict[str, str]) -> bool:
        """The page's cookie among the head's: one search in C, the others never split (this
        runs before the token is checked)."""
        name, key = self._page_cookie
        found = re.search(rf"(?:^|[;\s]){re.escape(name)}=([^;\s]*)", headers.get("cookie", ""))
        return found is not None and hmac.compare_digest(found.group(1).encode(), key.encode())

    def _check(self, headers: dict[str, str], query: str) -> str | None:
        if not self._origin_ok(headers):
            return "forbidden"
        if not self._token_ok(headers, query):
            return "unauthorized"
        return None

    # -- one TCP connection ---------------------------------------------------------------------

    def _admit(self) -> _Slot | None:
        """A slot for a new connection, closing another if all are taken (see
        ``GatewayLimits.max_connections``); None if every one is serving an authenticated
        client."""
        if len(self._slots) >= self.limits.max_connections:
            victim = next((slot for slot in self._slots if slot.state == "new"), None)
            if victim is None:
                victim = next((slot for slot in self._slots if slot.state == "idle"), None)
            if victim is None:
                return None
            victim.scope.cancel()
            del self._slots[victim]
        slot = _Slot()
        self._slots[slot] = None
        return slot

    async def _handle_stream(self, stream: trio.abc.Stream) -> None:
        slot = self._admit()
        if slot is None:
            with trio.move_on_after(1):
                await stream.send_all(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n"
                    b"connection: close\r\n\r\n"
                )
            await trio.aclose_forcefully(stream)
            return
        try:
            with slot.scope:
                self._set_send_buffer(stream)
                await self._serve_http(stream, slot)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, WebSocketClosed):
            pass  # the peer went away (or failed its TLS handshake): nothing to report
        except* Exception as group:
            if slot.state == "new":
                self._unauthenticated_failure(group)
            else:
                log.error("gateway connection failed", exc_info=group)
        finally:
            self._slots.pop(slot, None)
            await trio.aclose_forcefully(stream)

    def _unauthenticated_failure(self, group: BaseExceptionGroup[Exception]) -> None:
        """A connection that never showed the token failed unexpectedly: logged one line at a
        time, at most every ``_QUIET_LOG_S`` with how many came since, never a traceback each.
        Anyone may open connections, and a log line per request is an error log anyone can
        fill (and, on a stderr pipe nobody reads, a gateway anyone can block)."""
        self._quiet_failures += 1
        now = time.monotonic()
        if now - self._quiet_logged_at < _QUIET_LOG_S:
            return
        log.warning(
            "gateway: %d connection(s) that never showed the token failed (the last: %r)",
            self._quiet_failures,
            group.exceptions[0] if len(group.exceptions) == 1 else group,
        )
        self._quiet_failures = 0
        self._quiet_logged_at = now

    def _set_send_buffer(self, stream: trio.abc.Stream) -> None:
        if self.limits.send_buffer_bytes is None:
            return
        transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        if isinstance(transport, trio.SocketStream):
            transport.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)

    async def _serve_http(self, stream: trio.abc.Stream, slot: _Slot) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        raw = bytearray()  # the first request's bytes, replayed to the WebSocket handshake
        first = True
        while True:
            # One deadline for the whole request: head and body (and the TLS handshake).
            request: _Incoming | None = None  # (never the last one again, once it is too slow)
            with trio.move_on_after(self.limits.request_timeout_s):
                request = await self._read_request(conn, stream, raw if first else None, slot)
            if request is None:
                return  # closed, refused (and answered), or too slow
            if request.upgrade:
                await self._websocket(stream, conn, bytes(raw))
                return
            status, content_type, payload, extra = await self._route(request)
            with trio.move_on_after(self.limits.request_timeout_s) as writing:
                await self._respond(conn, stream, status, payload, content_type, extra)
            if writing.cancelled_caught:
                return  # it reads nothing
            first = False
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return
            slot.state = "idle"

    async def _read_request(
        self, conn: h11.Connection, stream: trio.abc.Stream, raw: bytearray | None, slot: _Slot
    ) -> _Incoming | None:
        """The next request, once its head showed the token and its body is in; None when
        there is none to serve (what was wrong is answered, and the connection closes).

        The token is checked on the head, before any body is read, and a refused client is
        closed at once: without the token there is nothing to hold a connection open with."""
        if raw is not None and isinstance(stream, trio.SSLStream):
            await stream.do_handshake()
        lines = _HeadWatch(self.limits.max_head_fields, self.limits.max_head_bytes)
        event = await self._next_event(conn, stream, raw, lines)
        if not isinstance(event, h11.Request):
            return None  # closed, or malformed (answered)
        # Before the token is checked, no more work than the head's size asks: the target is
        # split, not parsed, and the query only searched for the token.
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
        target = event.target.decode("latin-1")
        split = _split_target(target)
        if split is None:
            error = _json_error("bad_request", "malformed request target")
            await self._respond(conn, stream, 400, error, close=True)
            return None
        path, query = split
        denied = self._check(headers, query)
        method = event.method.decode()
        if denied == "unauthorized" and method == "GET" and path in _PAGE_PATHS:
            if self._page_cookie_ok(headers):
                denied = None  # a reload of the page, which dropped the token from its URL
        if denied is not None:
            await self._refuse(conn, stream, path, denied)
            return None
        slot.state = "busy"
        if headers.get("upgrade", "").lower() == "websocket":
            if raw is not None and path == "/ws":
                return _Incoming(method, target, headers, b"", upgrade=True)
            message = "upgrade only at /ws, as the first request"
            await self._respond(conn, stream, 400, _json_error("bad_request", message), close=True)
            return None
        body = await self._read_body(conn, stream)
        if body is None:
            message = "request body too large"
            await self._respond(conn, stream, 413, _json_error("too_large", message), close=True)
            return None
        return _Incoming(method, target, headers, body)

    async def _refuse(
        self, conn: h11.Connection, stream: trio.abc.Stream, path: str, denied: str
    ) -> None:
        if path in _PAGE_PATHS and denied == "unauthorized":
            page = _page(
                "Token needed",
                "Open the URL that <code>agent-supervisor serve</code> printed"
                " (it ends in <code>?token=...</code>).",
            )
            await self._respond(conn, stream, 401, page, "text/html; charset=utf-8", close=True)
            return
        error = _json_error(denied, _DENIED[denied])
        await self._respond(conn, stream, _HTTP_STATUS[denied], error, close=True)

    async def _next_event(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        raw: bytearray | None,
        head: _HeadWatch | None = None,
    ) -> h11.Event | None:
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                error = _json_error("bad_request", "malformed HTTP")
                await self._respond(conn, stream, 400, error, close=True)
                return None
            if event is not h11.NEED_DATA:
                assert not isinstance(event, type)
                return event
            data = await stream.receive_some(65536)
            if raw is not None and len(raw) <= self.limits.max_head_bytes:
                raw += data
            data = bytes(data) if isinstance(data, bytearray) else data
            if head is not None and not head.ended:
                if not head.feed(data):
                    message = f"a request head has at most {self.limits.max_head_fields} lines"
                    error = _json_error("bad_request", message)
                    await self._respond(conn, stream, 431, error, close=True)
                    return None
                if head.ended and not head.shows(self._credentials()):
                    # No token in it, in any form, nor the page's cookie: refused unparsed (h11
                    # takes ~1.4 ms per 64 KiB of head, on the one thread everyone shares).
                    line = bytes(head.head.split(b"\n", 1)[0]).split(b" ")
                    target = line[1].decode("latin-1") if len(line) > 1 else ""
                    path = (_split_target(target) or ("", ""))[0]
                    await self._refuse(conn, stream, path, "unauthorized")
                    return None
            conn.receive_data(data)

    async def _read_body(self, conn: h11.Connection, stream: trio.abc.Stream) -> bytes | None:
        body = bytearray()
        while True:
            event = await self._next_event(conn, stream, None)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.limits.max_body_bytes:
                    return None
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            else:
                return None

    async def _respond(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        extra: list[tuple[str, str]] | None = None,
        *,
        close: bool = False,
    ) -> None:
        headers = [
            ("content-type", content_type),
            ("content-length", str(len(body))),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
            *(extra or []),
        ]
        if close:
            headers.append(("connection", "close"))
        try:
            reason = HTTPStatus(status).phrase.encode() if status in _STATUSES else b""
            data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
            data += conn.send(h11.Data(data=body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            return
        if data:
            await stream.send_all(data)

    # -- HTTP routes -----------------------------------------------------------------------------

    async def _route(self, request: _Incoming) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        """An authenticated request's answer: (status, content type, body, extra headers)."""
        method, body = request.method, request.body
        path = (_split_target(request.target) or ("", ""))[0]
        if method == "GET" and path in _PAGE_PATHS:
            name, key = self._page_cookie
            secure = "; Secure" if self.ssl_context is not None else ""
            cookie = f"{name}={key}; Path=/; HttpOnly; SameSite=Strict{secure}"
            return (
                200,
                "text/html; charset=utf-8",
                _static("index.html"),
                [("content-security-policy", _CSP), ("set-cookie", cookie)],
            )
        if method == "GET" and path == "/v1/sessions":
            return 200, "application/json", _json(self._sessions_result()), []
        if method == "GET" and path == "/v1/agents":
            return 200, "application/json", _json(self._agents_result()), []
        segments = [unquote(s) for s in path.split("/")]
        if (
            method == "POST"
            and len(segments) == 5
            and segments[1:3] == ["v1", "sessions"]
            and segments[4] == "abort"
        ):
            return await self._http_abort(segments[3], body)
        if path in (*_PAGE_PATHS, "/v1/sessions", "/v1/agents") or path.endswith("/abort"):
            return (
                405,
                "application/json",
                _json_error("bad_request", f"{method} not allowed on {path}"),
                [],
            )
        return 404, "application/json", _json_error("not_found", f"no route {path}"), []

    async def _http_abort(
        self, session_id: str, body: bytes
    ) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        call = decode_abort(session_id, body)
        try:
            if isinstance(call, RequestError):
                raise BadRequest(call.message)
            session = self.supervisor.get(call.session_id)
            receipt = await session.cancel(turn_id=call.task_id, reason=call.reason)
        except SupervisorError as exc:
            return (
                _HTTP_STATUS.get(exc.code, 500),
                "application/json",
                _json_error(exc.code, str(exc)),
                [],
            )
        return 200, "application/json", _json({**receipt_to_wire(receipt), "success": True}), []

    def _sessions_result(self) -> dict[str, Any]:
        return {
            "sessions": [
                {
                    "session_id": s.session_id,
                    "agent": s.agent,
                    "state": s.state,
                    "turn_id": s.turn_id,
                    "recycles": s.recycles,
                    "recycle_reason": s.recycle_reason,
                    **({"host": s.host} if s.host is not None else {}),
                    **({"cwd": s.cwd} if s.cwd is not None else {}),
                }
                for s in self.supervisor.list()
            ]
        }

    def _agents_result(self) -> dict[str, Any]:
        return {
            "agents": [
                {
                    "name": name,
                    "protocol": a.protocol,
                    "description": a.description,
                    # what its protocol takes in a prompt besides text, before a session runs
                    # (an ACP agent's own comes with its session's subscribe)
                    "prompt_carries": sorted(_static_carries(a)),
                }
                for name, a in self.supervisor.agents.items()
            ]
        }

    # -- WebSocket -----------------------------------------------------------------------------

    async def _websocket(self, stream: trio.abc.Stream, conn: h11.Connection, raw: bytes) -> None:
        """An upgrade request, its token already checked: the handshake, then the client."""
        websocket = ServerWebSocket(stream, max_message_bytes=self.limits.hard_frame_bytes)
        try:
            await websocket.accept(raw)
        except HandshakeFailed as exc:
            await self._respond(conn, stream, 400, _json_error("bad_request", str(exc)), close=True)
            return
        client = _Client(self, websocket)
        scope = self.client_scope() if self.client_scope is not None else nullcontext()
        async with scope:
            self._clients.add(client)
            try:
                await client.run()
            finally:
                self._clients.discard(client)

    async def close_connections(self, timeout: float = 2.0) -> None:
        """Stop accepting, and tell every WebSocket client goodbye: what is buffered for it is
        sent, then a close frame (1001, going away). Bounded; what is left after it, the
        caller cancels."""
        self.stop_accepting()
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for client in list(self._clients):
                    nursery.start_soon(client.leave)


#: Flow-control pings per ``flight_bytes``: finer steps keep the pipe fuller for the same bound.
_FLIGHT_PINGS: Final = 4

#: Where each subscription of a connection stood when a response was queued: (session id, its
#: subscription, :attr:`Subscription.offered` then). The response goes out after those events.
_Barrier = tuple[tuple[str, Subscription, int], ...]


class _Client:
    """One WebSocket client: requests served concurrently; one writer task sends responses and
    the events of every subscription, in causal order, several frames per socket write."""

    def __init__(self, gateway: Gateway, websocket: ServerWebSocket) -> None:
        self.gateway = gateway
        self.supervisor = gateway.supervisor
        self.websocket = websocket
        self.limits = gateway.limits
        # frames of responses and notices, in order, each behind its barrier
        self._responses: deque[tuple[bytes, _Barrier]] = deque()
        self._subscriptions: dict[str, Subscription] = {}  # session id -> its events, in order
        self._wake = trio.lowlevel.ParkingLot()  # the writer waits here for work
        self._ready = False  # there is work: a response, or events a subscription announced
        self._drained = trio.lowlevel.ParkingLot()  # the reader waits here for the writer
        self._reader_parked = False  # (then no pong can be read: the writer must not wait)
        self._unacked = 0  # bytes written since the last flow-control ping
        self._marks: deque[int] = deque()  # flow-control pings not answered yet
        #: pings not answered yet, each with where every subscription stood when it went: once
        #: answered, the client holds those events (``Subscription.acknowledge``)
        self._acks: deque[tuple[int, list[tuple[Subscription, int]]]] = deque()
        self._first = 0  # the subscription that goes first in the next write
        self._pending = 0
        self._nursery: trio.Nursery | None = None
        self._leaving = False  # the server shuts down: send what is buffered, then close
        self._left = trio.Event()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._writer)
            if self.limits.flight_bytes is not None:
                nursery.start_soon(self._acknowledger)
            try:
                while True:
                    message = await self.websocket.get_message()
                    while len(self._responses) >= self.limits.outgoing_buffer:
                        # It does not read its answers: wait (and let the writer go on
                        # without flow-control pongs, which only this task could read).
                        self._reader_parked = True
                        self.websocket.pong_lot.unpark_all()
                        try:
                            await self._drained.park()
                        finally:
                            self._reader_parked = False
                    self._on_frame(message)
            except WebSocketClosed:
                pass
            finally:
                self._left.set()
                # Requests in flight are abandoned, not undone: a cancel goes on in its session.
                nursery.cancel_scope.cancel()
                for subscription in self._subscriptions.values():
                    subscription.close()
                self._subscriptions.clear()

    async def leave(self) -> None:
        """Send what is buffered (a shutdown's last ``turn.ended``, say), then close."""
        self._leaving = True
        self._notify()
        if self.limits.flight_bytes is not None:
            self.websocket.pong_lot.unpark_all()  # a goodbye is not paced: it is bounded
        await self._left.wait()

    def _on_frame(self, frame: str | bytes) -> None:
        assert self._nursery is not None
        decoded = decode_request(frame)
        if isinstance(decoded, RequestError):
            self._send(error_response(decoded.id, decoded.code, decoded.message))
            return
        if self._pending >= self.limits.max_pending:
            self._send(
                error_response(
                    decoded.id,
                    "overloaded",
                    f"more than {self.limits.max_pending} requests in flight",
                )
            )
            return
        self._pending += 1
        self._nursery.start_soon(self._serve, decoded)

    def _send(self, message: dict[str, Any], session_id: str | None = None) -> None:
        """Queue a response or notice for the writer, behind every event of ``session_id``
        (the session the request named) already buffered for this connection (bounded: the
        reader waits when full). A cancel's answer is queued once its session has emitted the
        turn's ``turn.ended``: the wire keeps that order. Other sessions' events are no
        barrier: a quiet session's receipt does not wait behind a flooding one's backlog."""
        subscription = self._subscriptions.get(session_id) if session_id is not None else None
        barrier: _Barrier = (
            ((session_id, subscription, subscription.offered),)
            if session_id is not None and subscription is not None
            else ()
        )
        self._responses.append((text_frame(_json(message)), barrier))
        self._notify()
        if self.limits.flight_bytes is not None:
            self.websocket.pong_lot.unpark_all()  # a writer held by flow control sends answers

    def _notify(self) -> None:
        self._ready = True
        self._wake.unpark_all()

    async def _writer(self) -> None:
        # It waits to be told (a response, or a session announcing a batch of events) even
        # when events are already buffered: under a flood a session announces every few dozen
        # events, or when it goes idle, and they go out in one socket write, not one each.
        try:
            while True:
                while not self._ready:
                    await self._wake.park()
                self._ready = False
                if self._window_full():
                    # Flow control: only answers go now (a receipt must not wait for the
                    # client to read a whole allowance of other sessions' events); events
                    # wait for a pong. A new answer wakes us too (``_send``).
                    frames = self._collect(events=False)
                    if frames:
                        await self.websocket.send_frames(frames)
                        await self._count_flight(frames)
                    self._ready = True
                    await self.websocket.pong_lot.park()
                    continue
                frames = self._collect()
                if frames:
                    await self.websocket.send_frames(frames)
                    await self._count_flight(frames, idle=not self._ready)
                if self._leaving and not self._ready:
                    await self.websocket.close(CLOSE_GOING_AWAY, "the server is shutting down")
                    self._left.set()
                    return
        except WebSocketClosed:
            # Nothing more can be sent: the connection is over (the reader may be waiting for
            # us to drain its answers, so it would not notice by itself).
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()

    def _window_full(self) -> bool:
        """Flow control (``GatewayLimits.flight_bytes``): a ping goes after each quarter of the
        allowance; with four unanswered, the client has not read a whole allowance yet. Never
        while the reader waits for us to drain its answers (it reads no pong meanwhile), nor
        once the server says goodbye (what is buffered goes, within the shutdown's bound)."""
        websocket = self.websocket
        while self._marks and websocket.pongs_seen >= self._marks[0]:
            self._marks.popleft()
        return (
            len(self._marks) >= _FLIGHT_PINGS
            and not self._reader_parked
            and not self._leaving
            and not websocket.closed
        )

    async def _count_flight(self, frames: list[bytes], *, idle: bool = False) -> None:
        """A flow-control ping after each quarter of ``flight_bytes``, and (``idle``: nothing
        more to write now) one that only acknowledges the events written, so a node's session
        held back for its front's acknowledgement (``design/remote.md``) is never left
        waiting for events of a write too small to be paced."""
        flight = self.limits.flight_bytes
        if flight is None:
            return
        self._unacked += sum(len(frame) for frame in frames)
        paced = self._unacked >= flight // _FLIGHT_PINGS
        if not paced and not (idle and self._unacked):
            return
        self._unacked = 0
        number = await self.websocket.ping()
        if paced:
            self._marks.append(number)
        positions = [(sub, sub.last_seq) for sub in self._subscriptions.values()]
        self._acks.append((number, positions))

    async def _acknowledger(self) -> None:
        """Each pong: the client holds every event written before its ping."""
        websocket = self.websocket
        while not websocket.closed:
            acks = self._acks
            while acks and websocket.pongs_seen >= acks[0][0]:
                for subscription, seq in acks.popleft()[1]:
                    subscription.acknowledge(seq)
            await websocket.pong_lot.park()

    def _collect(self, *, events: bool = True) -> list[bytes]:
        """What to send next, in causal order: each queued response after the events of its
        session its barrier names, then (``events``) up to ``batch_events`` events of each
        subscription.
        A barrier more than a batch away is reached over several writes; meanwhile a response
        of another session goes ahead of it (a response of the same session cannot: its mark
        is at least as far), so one session's backlog holds up no other session's answers."""
        frames: list[bytes] = []
        batch = self.limits.batch_events
        sent: dict[Subscription, int] = {}  # events taken per subscription for this write
        waiting: deque[tuple[bytes, _Barrier]] = deque()
        answered = 0
        while self._responses:
            frame, barrier = self._responses.popleft()
            reached = True
            for session_id, subscription, mark in barrier:
                behind = mark - subscription.taken
                if behind > 0:
                    done = sent.get(subscription, 0)
                    done += self._take(subscription, min(behind, batch - done), frames)
                    sent[subscription] = done
                if subscription.pending:
                    if subscription.taken < mark:
                        reached = False  # this write's batch is used up: the rest goes next
                elif subscription.ended:
                    self._finish(session_id, subscription, frames)
                # (Nothing pending short of the mark: the subscriber closed, its events are gone.)
            if reached:
                frames.append(frame)
                answered += 1
            else:
                waiting.append((frame, barrier))
        self._responses = waiting
        if answered:
            self._drained.unpark_all()
        if waiting:
            self._ready = True
        if not events:
            return frames
        ended: list[str] = []
        room = self.limits.write_events
        subscriptions = list(self._subscriptions.items())
        first = self._first % len(subscriptions) if subscriptions else 0
        self._first = first + 1
        for session_id, subscription in subscriptions[first:] + subscriptions[:first]:
            room -= self._take(subscription, min(room, batch - sent.get(subscription, 0)), frames)
            if subscription.pending:
                self._ready = True  # more than one batch: go on after this write
            elif subscription.ended:
                ended.append(session_id)
        for session_id in ended:
            self._finish(session_id, self._subscriptions[session_id], frames)
        return frames

    def _take(self, subscription: Subscription, limit: int, frames: list[bytes]) -> int:
        """Append the frames of up to ``limit`` buffered events; how many there were."""
        if limit <= 0:
            return 0
        # Each event was serialized and framed once, by its session, for every subscriber.
        taken = subscription.take_frames(limit)
        frames.extend(taken)
        return len(taken)

    def _finish(self, session_id: str, subscription: Subscription, frames: list[bytes]) -> None:
        """A subscription the session ended, all its events taken: say so, and forget it."""
        if self._subscriptions.get(session_id) is not subscription:
            return  # already finished, or replaced by a newer subscribe
        del self._subscriptions[session_id]
        subscription.close()
        notice = "subscription.lagged" if subscription.lagged else "subscription.closed"
        message = {
            "event": notice,
            "session_id": session_id,
            "seq": None,
            "data": {"last_seq": subscription.last_seq},
        }
        frames.append(text_frame(_json(message)))

    async def _serve(self, request: Request) -> None:
        try:
            result = await self._dispatch(request)
        except SupervisorError as exc:
            response = error_response(request.id, exc.code, str(exc))
        except Exception as exc:
            # The action, the error and the size, never the payload: a prompt may be megabytes,
            # and it is the user's. The traceback only at debug level.
            error = _brief(exc)
            log.error(
                "gateway request %s failed (%d bytes): %s", request.action, request.size, error
            )
            log.debug("gateway request %s failed", request.action, exc_info=True)
            response = error_response(request.id, "internal", error)
        else:
            if result is None:
                return  # already answered (subscribe answers before its events)
            response = ok_response(request.id, result)
        finally:
            self._pending -= 1
        self._send(response, session_of(request.call))

    async def _dispatch(self, request: Request) -> dict[str, Any] | None:
        call = request.call
        sup = self.supervisor
        match call:
            case ListAgents():
                return self.gateway._agents_result()
            case ListSessions():
                return self.gateway._sessions_result()
            case StartSession():
                if call.max_sessions is not None and not self.gateway.accept_specs:
                    raise BadRequest("'max_sessions' is for nodes (agent-supervisor node)")
                session = await sup.start_session(
                    self._agent(call),
                    cwd=call.cwd,
                    host=call.host,
                    mcp_servers=call.mcp_servers,
                    at_most=call.max_sessions,
                )
                host = {"host": session.host} if session.host is not None else {}
                return {"session_id": session.id, "state": session.state, **host}
            case Subscribe():
                await self._subscribe(request, sup.get(call.session_id), call.since_seq)
                return None
            case Unsubscribe():
                self._unsubscribe(sup.get(call.session_id).id)
                return {}
            case Prompt():
                turn = await sup.get(call.session_id).prompt(call.text, call.parts)
                return {"turn_id": turn.id, "queued": turn.queued}
            case SetMode():
                await sup.get(call.session_id).set_mode(call.mode_id)
                return {}
            case Steer():
                return steer_to_wire(await sup.get(call.session_id).steer(call.text))
            case Cancel():
                session = sup.get(call.session_id)
                receipt = await session.cancel(turn_id=call.task_id, reason=call.reason)
                return {**receipt_to_wire(receipt), "success": True}
            case RespondPermission():
                await sup.get(call.session_id).respond_permission(
                    call.request_id, call.option_id, cancelled=call.cancelled
                )
                return {}
            case StopSession():
                status = await sup.stop_session(sup.get(call.session_id).id)
                return {"exit_code": status.code if status is not None else None}
            case _:
                assert_never(call)

    def _agent(self, call: StartSession) -> str | AgentSpec:
        if call.spec is None:
            return call.agent
        if not self.gateway.accept_specs:
            raise BadRequest("'spec' is for nodes (agent-supervisor node): name a configured agent")
        from supervisor.remote.handshake import spec_from_wire

        try:
            return spec_from_wire(call.agent, dict(call.spec))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    async def _subscribe(
        self, request: Request, session: AnySession, since_seq: int | None
    ) -> None:
        self._unsubscribe(session.id)
        # Shielded (the actor answers a subscribe at once, ahead of agent output): if this
        # connection went away meanwhile, the subscription is closed here, not left to hold
        # the agent back until it stalls.
        with trio.move_on_after(_SUBSCRIBE_BOUND_S) as bound:
            bound.shield = True
            subscription = await session.open_subscription(
                since_seq=since_seq,
                max_buffer=self.limits.subscription_buffer,
                stall_s=self.limits.subscriber_stall_s,
                wire=True,
            )
        if bound.cancelled_caught:
            raise AgentNotRunning(f"session {session.id} did not answer a subscribe")
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except trio.Cancelled:
            subscription.close()
            raise
        self._unsubscribe(session.id)  # two subscribes to one session at once: the last wins
        # The answer first, then the events: its barrier does not name this subscription, and
        # the writer sends no subscription's events while a response waits for its barrier.
        # What the session takes now: a client (the ACP front door, a front's mirror of a
        # node's session) learns it here, where it also learns where the stream stands.
        result = {
            "last_seq": subscription.head_seq,
            "gap": subscription.gap,
            "prompt_carries": sorted(session.prompt_carries),
            "modes": session.modes,
        }
        self._send(ok_response(request.id, result))
        self._subscriptions[session.id] = subscription
        subscription.set_listener(self._notify)

    def _unsubscribe(self, session_id: str) -> None:
        subscription = self._subscriptions.pop(session_id, None)
        if subscription is not None:
            subscription.close()


_STATUSES = {status.value for status in HTTPStatus}


def _split_target(target: str) -> tuple[str, str] | None:
    """(path, query) of a request target; None if it is none (a 400). The usual form (``/p?q``)
    is split at its ``?``; an absolute URL (``http://h/p?q``, which HTTP/1.1 servers must take)
    by ``urlsplit``, which refuses some (an unclosed ``[`` in its host)."""
    if target.startswith("/"):
        path, _, query = target.partition("?")
        return path, query.partition("#")[0]
    try:
        parts = urlsplit(target)
    except ValueError:
        return None
    if not parts.scheme:
        return None
    return parts.path or "/", parts.query


def _query_token(query: str, *, longest: int) -> str | None:
    """The first ``token=`` value of a query, decoded as ``parse_qs`` would; nothing else of the
    query is looked at before the token is checked: two searches in C, and a value longer than
    ``longest`` is no token and never decoded."""
    if query.startswith("token="):
        at = 6
    else:
        at = query.find("&token=")
        if at < 0:
            return None
        at += 7
    end = query.find("&", at)
    value = query[at:] if end < 0 else query[at:end]
    if not value or len(value) > longest:
        return None
    return unquote_plus(value)


#: how often a connection that never showed the token may put a line in the log
_QUIET_LOG_S: Final = 60.0

_DENIED = {
    "unauthorized": "a valid token is required (Authorization: Bearer T, or ?token=T)",
    "forbidden": "requests from another origin (or for another host) are refused",
}

#: The page is self-contained: its own script and style, and a WebSocket back to us.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline';"
    " connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none';"
    " frame-ancestors 'none'"
)


def _static_carries(spec: AgentSpec) -> frozenset[str]:
    protocol = PROTOCOLS.get(spec.protocol)
    if spec.hosts or protocol is None:
        return frozenset()  # a host's session says what it takes when subscribed
    return protocol.prompt_carries


def _json(value: Any) -> bytes:
    return dumps(value)


def _json_error(code: str, message: str) -> bytes:
    return _json({"ok": False, "error": {"code": code, "message": message}})


def _page(title: str, text: str) -> bytes:
    return f"<!doctype html><meta charset=utf-8><title>{title}</title><p>{text}</p>".encode()


def _static(name: str) -> bytes:
    return importlib.resources.files("supervisor.gateway").joinpath("static", name).read_bytes()


def _brief(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:200] + "…"


#: The web UI's page.
_PAGE_PATHS: Final = ("/", "/index.html")
#: Addresses that bind every interface: the URL names loopback (or the first allowed host).
_WILDCARDS: Final = ("", "0.0.0.0", "::")
#: ``NAME:PORT`` or ``[V6]:PORT``: a host value that carries its port.
_PORT: Final = re.compile(r"(?<=[^:]):\d+$|(?<=\]):\d+$")


def _url_host(host: str) -> str:
    if host == "::":
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    if host in _WILDCARDS:
        return "127.0.0.1"
    return host


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1", "[::1]") or host.startswith("127.")
