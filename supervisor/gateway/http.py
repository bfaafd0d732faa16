"""The gateway's HTTP side (``design/gateway.md``): every connection starts here. Requests are
read with h11, their token checked on the head before any body is read (a refused one closes its
connection), then routed: the page, ``/v1/sessions``, ``/v1/agents``, ``/v1/receipts``,
``/metrics``, and an abort; a first request for ``/ws`` that asks for an upgrade is handed back,
for the WebSocket handshake.
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Iterable
from http import HTTPStatus
from typing import Final
from urllib.parse import unquote, urlsplit

import h11
import trio
from attrs import define, field, frozen

from supervisor.errors import SupervisorError
from supervisor.gateway.actions import Actions
from supervisor.gateway.auth import Auth
from supervisor.gateway.limits import GatewayLimits, Slot
from supervisor.wire.codec import dumps
from supervisor.wire.requests import RequestError, decode_abort, decode_receipts_query

__all__ = ["Http", "Upgrade", "json_error", "respond"]

_HTTP_STATUS: Final = {
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


@define
class _HeadWatch:
    """What is looked at of one request head as its bytes come, before h11 parses it: its
    lines (``max_head_fields``: the newlines up to the blank line that ends it, found across
    reads), its size (``max_head_bytes``) and, once it has ended, whether it holds a credential
    anywhere (:meth:`shows`)."""

    limit: int
    #: the most bytes a head may have (and the most of it that is kept)
    most: int
    lines: int = 0
    #: the head's bytes so far: h11 checks its own bound only while a head is incomplete, so
    #: a head that comes whole in one read (up to 64 KiB) would pass it
    size: int = 0
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
        self.size += taken
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


@frozen
class Upgrade:
    """A connection's first request, for ``/ws``, asking for a WebSocket, its token checked:
    the h11 connection that read it, and its bytes as they came (wsproto reads the handshake
    from them)."""

    conn: h11.Connection
    raw: bytes


class Http:
    """The HTTP side of one gateway: ``auth`` checks each request's head, ``actions`` answers
    the API routes; ``tls``: the page's cookie is ``Secure``."""

    def __init__(
        self, limits: GatewayLimits, auth: Auth, actions: Actions, *, tls: bool = False
    ) -> None:
        self.limits = limits
        self.auth = auth
        self.actions = actions
        self.tls = tls

    async def serve(self, stream: trio.abc.Stream, slot: Slot) -> Upgrade | None:
        """Serve a connection's requests, with keep-alive, until it closes, is refused, is too
        slow, or its first request asks for a WebSocket: then that request, its token
        checked, is returned for the handshake."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        raw = bytearray()  # the first request's bytes, replayed to the WebSocket handshake
        first = True
        while True:
            # One deadline for the whole request: head and body (and the TLS handshake).
            request: _Incoming | None = None  # (never the last one again, once it is too slow)
            with trio.move_on_after(self.limits.request_timeout_s):
                request = await self._read_request(conn, stream, raw if first else None, slot)
            if request is None:
                return None  # closed, refused (and answered), or too slow
            if request.upgrade:
                return Upgrade(conn, bytes(raw))
            status, content_type, payload, extra = await self._route(request)
            with trio.move_on_after(self.limits.request_timeout_s) as writing:
                await respond(
                    conn,
                    stream,
                    status,
                    payload,
                    content_type,
                    extra,
                    head=request.method == "HEAD",
                )
            if writing.cancelled_caught:
                return None  # it reads nothing
            first = False
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return None
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return None
            slot.state = "idle"

    async def _read_request(
        self, conn: h11.Connection, stream: trio.abc.Stream, raw: bytearray | None, slot: Slot
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
        if event.http_version not in _VERSIONS:
            message = "only HTTP/1.1 (and 1.0) is served here"
            await respond(conn, stream, 505, json_error("bad_request", message), close=True)
            return None
        # Before the token is checked, no more work than the head's size asks: the target is
        # split, not parsed, and the query only searched for the token.
        headers, repeated = _fields(event.headers)
        target = event.target.decode("latin-1")
        split = _split_target(target)
        if "host" in repeated:
            # RFC 9112 3.2: a request with more than one Host is answered 400. Which one a proxy
            # in front routed by is unknown, so neither is checked against the allowed hosts.
            error = json_error("bad_request", "more than one Host header")
            await respond(conn, stream, 400, error, close=True)
            return None
        if "transfer-encoding" in headers and "content-length" in headers:
            # RFC 9112 6.1: the mark of request smuggling. A proxy in front may have framed the
            # body by the other field, so what follows it here may be another client's request
            # (h11 would take the chunks and keep the connection for it): refused, and closed.
            message = "both Transfer-Encoding and Content-Length"
            await respond(conn, stream, 400, json_error("bad_request", message), close=True)
            return None
        if split is None:
            error = json_error("bad_request", "malformed request target")
            await respond(conn, stream, 400, error, close=True)
            return None
        path, query = split
        denied = self.auth.check(headers, query, repeated)
        method = event.method.decode()
        if (
            denied == "unauthorized"
            and method == "GET"
            and (path in _PAGE_PATHS or path in _ASSETS)
        ):
            if self.auth.page_cookie_ok(headers):
                # a reload of the page, which dropped the token from its URL, or the files it
                # loads (a script element sends no token, only the cookie)
                denied = None
        if denied is not None:
            await self._refuse(conn, stream, path, denied, head=method == "HEAD")
            return None
        slot.state = "busy"
        if headers.get("upgrade", "").lower() == "websocket":
            if raw is not None and path == "/ws" and event.http_version == b"1.1":
                return _Incoming(method, target, headers, b"", upgrade=True)
            # (RFC 6455 4.1: an upgrade is an HTTP/1.1 request; wsproto takes a 1.0 one)
            message = "upgrade only at /ws, as the first request, in HTTP/1.1"
            await respond(conn, stream, 400, json_error("bad_request", message), close=True)
            return None
        if conn.they_are_waiting_for_100_continue:
            # (curl sends Expect for a large body, then waits a second for this before it does)
            await stream.send_all(
                conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
            )
        body = await self._read_body(conn, stream)
        if body is None:
            message = "request body too large"
            await respond(conn, stream, 413, json_error("too_large", message), close=True)
            return None
        return _Incoming(method, target, headers, body)

    async def _refuse(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        path: str,
        denied: str,
        *,
        head: bool = False,
    ) -> None:
        if path in _PAGE_PATHS and denied == "unauthorized":
            page = _page(
                "Token needed",
                "Open the URL that <code>agent-supervisor serve</code> printed"
                " (it ends in <code>?token=...</code>).",
            )
            await respond(
                conn, stream, 401, page, "text/html; charset=utf-8", close=True, head=head
            )
            return
        error = json_error(denied, _DENIED[denied])
        await respond(conn, stream, _HTTP_STATUS[denied], error, close=True, head=head)

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
                error = json_error("bad_request", "malformed HTTP")
                await respond(conn, stream, 400, error, close=True)
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
                    error = json_error("bad_request", message)
                    await respond(conn, stream, 431, error, close=True)
                    return None
                if head.size > head.most:
                    message = f"a request head has at most {head.most} bytes"
                    await respond(conn, stream, 431, json_error("bad_request", message), close=True)
                    return None
                if head.ended and not head.shows(self.auth.credentials):
                    # No token in it, in any form, nor the page's cookie: refused unparsed (h11
                    # takes ~1.4 ms per 64 KiB of head, on the one thread everyone shares).
                    line = bytes(head.head.split(b"\n", 1)[0]).split(b" ")
                    target = line[1].decode("latin-1") if len(line) > 1 else ""
                    path = (_split_target(target) or ("", ""))[0]
                    head_only = line[0] == b"HEAD"
                    await self._refuse(conn, stream, path, "unauthorized", head=head_only)
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

    # -- HTTP routes -----------------------------------------------------------------------------

    async def _route(self, request: _Incoming) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        """An authenticated request's answer: (status, content type, body, extra headers)."""
        # HEAD is GET without the body (``respond`` leaves it out): RFC 9110 9.3.2.
        method = "GET" if request.method == "HEAD" else request.method
        body = request.body
        path = (_split_target(request.target) or ("", ""))[0]
        if method == "GET" and path in _PAGE_PATHS:
            secure = "; Secure" if self.tls else ""
            name, key = self.auth.cookie_name, self.auth.cookie_key
            cookie = f"{name}={key}; Path=/; HttpOnly; SameSite=Strict{secure}"
            return (
                200,
                "text/html; charset=utf-8",
                _static("index.html"),
                [("content-security-policy", _CSP), ("set-cookie", cookie)],
            )
        if method == "GET" and path in _ASSETS:
            return self._asset(path)
        if method == "GET" and path == "/v1/sessions":
            return 200, "application/json", dumps(self.actions.sessions()), []
        if method == "GET" and path == "/v1/agents":
            return 200, "application/json", dumps(self.actions.agents()), []
        if method == "GET" and path == "/v1/receipts":
            return self._receipts(request.target)
        if method == "GET" and path == "/metrics":
            return self._metrics()
        segments = [unquote(s) for s in path.split("/")]
        if (
            method == "POST"
            and len(segments) == 5
            and segments[1:3] == ["v1", "sessions"]
            and segments[4] == "abort"
        ):
            return await self._abort(segments[3], body)
        if path in (*_PAGE_PATHS, *_GET_PATHS) or path.endswith("/abort"):
            return (
                405,
                "application/json",
                json_error("bad_request", f"{method} not allowed on {path}"),
                [],
            )
        return 404, "application/json", json_error("not_found", f"no route {path}"), []

    def _asset(self, path: str) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        """One of the page's own files (``_ASSETS``); a 404 that says how to get it when
        ``make install`` has not put it there."""
        try:
            payload = _static(path.removeprefix("/static/"))
        except FileNotFoundError:
            message = f"{path} is not installed (make install puts xterm.js there)"
            return 404, "application/json", json_error("not_found", message), []
        return 200, _ASSETS[path], payload, []

    def _receipts(self, target: str) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        """``GET /v1/receipts``: ``receipts.list``'s result, its query read as that action's
        payload is."""
        call = decode_receipts_query((_split_target(target) or ("", ""))[1])
        if isinstance(call, RequestError):
            return 400, "application/json", json_error(call.code, call.message), []
        return 200, "application/json", dumps(self.actions.receipts(call)), []

    def _metrics(self) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        """``GET /metrics``: the supervisor's metrics in the Prometheus text format (read from
        its sessions as the request is answered: ``supervisor/observe/metrics.py``)."""
        metrics = self.actions.supervisor.metrics
        if metrics is None:
            message = "this supervisor keeps no metrics (open_supervisor(metrics=Metrics()))"
            return 404, "application/json", json_error("not_found", message), []
        return 200, metrics.content_type, metrics.render(), []

    async def _abort(
        self, session_id: str, body: bytes
    ) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        """``POST /v1/sessions/{id}/abort``: ``agent.cancel``'s receipt, its body read as that
        action's payload is."""
        call = decode_abort(session_id, body)
        if isinstance(call, RequestError):
            return (
                _HTTP_STATUS[call.code],
                "application/json",
                json_error(call.code, call.message),
                [],
            )
        try:
            result = await self.actions.cancel(call)
        except SupervisorError as exc:
            return (
                _HTTP_STATUS.get(exc.code, 500),
                "application/json",
                json_error(exc.code, str(exc)),
                [],
            )
        return 200, "application/json", dumps(result), []


async def respond(
    conn: h11.Connection,
    stream: trio.abc.Stream,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[str, str]] | None = None,
    *,
    close: bool = False,
    head: bool = False,
) -> None:
    """Answer one request (``close``: and say the connection closes; ``head``: a HEAD
    request's, its body's length said and the body left out, as h11 requires); nothing is
    sent once h11 holds the connection unusable."""
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
    data = b""
    try:
        reason = HTTPStatus(status).phrase.encode() if status in _STATUSES else b""
        data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
        if not head:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
    except h11.LocalProtocolError:
        if not (head and close):
            return
        # A HEAD refused before h11 read it (no token): h11 waits for the body it was told
        # of; the head goes out as it is, and the connection closes.
    if data:
        await stream.send_all(data)


def _fields(fields: Iterable[tuple[bytes, bytes]]) -> tuple[dict[str, str], frozenset[str]]:
    """A head's fields by name, and the names that came more than once (where one only is
    meant, as ``Origin``, a second is refused, never silently taken over the first)."""
    headers: dict[str, str] = {}
    repeated: set[str] = set()
    for name, value in fields:
        key = name.decode().lower()
        if key in headers:
            repeated.add(key)
        headers[key] = value.decode("latin-1")
    return headers, frozenset(repeated)


_STATUSES: Final = {status.value for status in HTTPStatus}


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


_DENIED: Final = {
    "unauthorized": "a valid token is required (Authorization: Bearer T, or ?token=T)",
    "forbidden": "requests from another origin (or for another host) are refused",
}

#: The page is self-contained: its own script and style, the files it loads from us
#: (``_ASSETS``), and a WebSocket back to us.
_CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline';"
    " connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none';"
    " frame-ancestors 'none'"
)


def json_error(code: str, message: str) -> bytes:
    return dumps({"ok": False, "error": {"code": code, "message": message}})


def _page(title: str, text: str) -> bytes:
    return f"<!doctype html><meta charset=utf-8><title>{title}</title><p>{text}</p>".encode()


def _static(name: str) -> bytes:
    return importlib.resources.files("supervisor.gateway").joinpath("static", name).read_bytes()


#: The HTTP versions served; h11 reads any ``HTTP/d.d`` (and would answer it in 1.1).
_VERSIONS: Final = (b"1.1", b"1.0")

#: The web UI's page.
_PAGE_PATHS: Final = ("/", "/index.html")
#: The files the page loads, by path, with their content types: xterm.js, its fit addon, its
#: stylesheet and their licenses (``scripts/vendor-xterm.sh`` puts them in ``static/xterm/``).
_ASSETS: Final = {
    "/static/xterm/xterm.js": "text/javascript; charset=utf-8",
    "/static/xterm/xterm.css": "text/css; charset=utf-8",
    "/static/xterm/addon-fit.js": "text/javascript; charset=utf-8",
    "/static/xterm/LICENSE": "text/plain; charset=utf-8",
    "/static/xterm/LICENSE.addon-fit": "text/plain; charset=utf-8",
}
#: The routes only ``GET`` reaches.
_GET_PATHS: Final = ("/v1/sessions", "/v1/agents", "/v1/receipts", "/metrics", *_ASSETS)
