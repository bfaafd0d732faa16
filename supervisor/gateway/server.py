"""The gateway: WebSocket (``/ws``), the web UI (``/``) and a small HTTP API on one port.

:class:`Gateway` listens, admits each TCP connection among ``max_connections`` (making room by
closing one that has not shown the token, or an idle keep-alive) and composes the rest: its
HTTP side (:mod:`~supervisor.gateway.http`, with :mod:`~supervisor.gateway.auth`'s checks)
serves the connection, and hands back a request for ``/ws`` that asks for an upgrade; the
WebSocket handshake (:mod:`~supervisor.gateway.websocket`, wsproto) then makes it a
:class:`~supervisor.gateway.connection.Connection`, whose calls
:class:`~supervisor.gateway.actions.Actions` runs. ``design/gateway.md`` says why each piece is
as it is.
"""

from __future__ import annotations

import errno
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Final
from urllib.parse import quote

import trio

from supervisor.gateway.actions import Actions
from supervisor.gateway.auth import WILDCARDS, Auth, host_names, strip_port, url_host
from supervisor.gateway.connection import Connection
from supervisor.gateway.http import Http, Upgrade, json_error, respond
from supervisor.gateway.limits import LIMITS, GatewayLimits, Slot
from supervisor.gateway.websocket import HandshakeFailed, ServerWebSocket, WebSocketClosed
from supervisor.store.writer import StoreFault, StoreNotice
from supervisor.supervisor import Supervisor

__all__ = ["CannotListen", "Gateway"]

log = logging.getLogger(__name__)

#: how often a connection that never showed the token may put a line in the log
_QUIET_LOG_S: Final = 60.0


class CannotListen(Exception):
    """The address or port cannot be bound (taken, or not this machine's): one line naming
    it and the system's reason; ``port_taken`` if another process holds the port."""

    def __init__(self, message: str, *, port_taken: bool) -> None:
        super().__init__(message)
        self.port_taken = port_taken


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
        self.token = token or secrets.token_urlsafe(24)
        self.host = host
        self.port = port
        self.limits = limits
        self.ssl_context = ssl_context
        self.allow_hosts = [name.lower() for name in allow_hosts]
        #: what each call does; ``accept_specs``: ``session.start`` may carry the agent's
        #: definition (``spec``), for a node's gateway (``supervisor/remote/``)
        self.actions = Actions(supervisor, accept_specs=accept_specs)
        #: the HTTP side, once the port is known (``serve_listeners``): the Host and Origin
        #: checks and the page's cookie name it
        self._http: Http | None = None
        self._slots: dict[Slot, None] = {}  # every open connection, oldest first
        #: unexpected failures of connections that never showed the token, since the last
        #: line that told of them (``_unauthenticated_failure``), and when that was
        self._quiet_failures = 0
        self._quiet_logged_at = -_QUIET_LOG_S
        self._clients: set[Connection] = set()  # the WebSocket ones
        self._accepting = trio.CancelScope()

    @property
    def accept_specs(self) -> bool:
        return self.actions.accept_specs

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    @property
    def url(self) -> str:
        host = url_host(self.host)
        if self.host in WILDCARDS and self.allow_hosts:
            host = strip_port(self.allow_hosts[0])  # the name a certificate was made for
        return f"{self.scheme}://{host}:{self.port}/?token={quote(self.token, safe='')}"

    @property
    def connections(self) -> int:
        return len(self._slots)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status.started`` gets the URL once accepting."""
        try:
            sockets = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as exc:  # socket.gaierror included: a host name that does not resolve
            reason = exc.strerror or str(exc)
            raise CannotListen(
                f"cannot listen on {self.host}:{self.port}: {reason}",
                port_taken=exc.errno == errno.EADDRINUSE,
            ) from exc
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
        tls = self.ssl_context is not None
        hosts = host_names(self.host, self.port, self.allow_hosts, tls=tls)
        auth = Auth(self.token, port=self.port, hosts=hosts, scheme=self.scheme)
        self._http = Http(self.limits, auth, self.actions, tls=tls)
        store = self.supervisor.store
        unwatch = store.watch(self._store_notice) if store is not None else None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._accept, listeners, nursery)
                task_status.started(self.url)
        finally:
            if unwatch is not None:
                unwatch()

    def _store_notice(self, notice: StoreNotice) -> None:
        """Writes to the store fail, or go through again: every client is told (the sessions
        go on; ``design/store.md``, "Bounded")."""
        message = store_message(notice)
        for client in self._clients:
            client.notice(message)

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

    async def close_connections(self, timeout: float = 2.0) -> None:
        """Stop accepting, and tell every WebSocket client goodbye: what is buffered for it is
        sent, then a close frame (1001, going away). Bounded; what is left after it, the
        caller cancels."""
        self.stop_accepting()
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for client in list(self._clients):
                    nursery.start_soon(client.leave)

    # -- one TCP connection ---------------------------------------------------------------------

    def _admit(self) -> Slot | None:
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
        slot = Slot()
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
                assert self._http is not None  # (set before the first connection is accepted)
                upgrade = await self._http.serve(stream, slot)
                if upgrade is not None:
                    await self._websocket(stream, upgrade)
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

    # -- WebSocket -----------------------------------------------------------------------------

    async def _websocket(self, stream: trio.abc.Stream, upgrade: Upgrade) -> None:
        """An upgrade request, its token already checked: the handshake, then the client."""
        websocket = ServerWebSocket(stream, max_message_bytes=self.limits.hard_frame_bytes)
        try:
            await websocket.accept(upgrade.raw)
        except HandshakeFailed as exc:
            error = json_error("bad_request", str(exc))
            extra = list(exc.headers)
            await respond(upgrade.conn, stream, exc.status, error, extra=extra, close=True)
            return
        client = Connection(websocket, self.limits, self.actions)
        scope = self.client_scope() if self.client_scope is not None else nullcontext()
        async with scope:
            self._clients.add(client)
            store = self.supervisor.store
            if store is not None and store.fault is not None:
                client.notice(store_message(store.fault))  # failing since before it came
            try:
                await client.run()
            finally:
                self._clients.discard(client)


def store_message(notice: StoreNotice) -> dict[str, Any]:
    """The wire's ``store.error`` (writes fail and are tried again: what waits, of which
    sessions' seqs) or ``store.recovered``: the gateway's own notices, of no session."""
    if isinstance(notice, StoreFault):
        return {
            "event": "store.error",
            "session_id": None,
            "seq": None,
            "data": {
                "where": notice.where,
                "error": notice.error,
                "since": notice.since,
                "retrying": True,
                "waiting": notice.waiting,
                "held": notice.held,
                "sessions": [
                    {"session_id": sid, "from_seq": low, "to_seq": high}
                    for sid, (low, high) in notice.sessions.items()
                ],
            },
        }
    return {
        "event": "store.recovered",
        "session_id": None,
        "seq": None,
        "data": {"where": notice.where, "failed_s": round(notice.failed_s, 3)},
    }
