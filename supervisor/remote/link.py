"""The front's link to one host's node: the transport, the bridge, the WebSocket, reconnection.

One link per host. A connection is one transport process (``ssh ... -- agent-supervisor node
--bridge``): it starts the node if none runs, writes the hello line, then relays; over its
stdio the front speaks the gateway's WebSocket protocol to the node, as any client would
(``Host: 127.0.0.1:PORT``, the node's token). Events from the node are handed to their
:class:`~supervisor.remote.session.RemoteSession` by the reader task itself, in wire order,
before the next frame is read: a response is only ever seen after the events the node sent
before it (so a cancel's ``turn.ended`` is published on the front before its receipt returns).

When a connection drops (the transport died, the network went away), the link reconnects with
backoff for as long as the node would keep its sessions (``detach_s``, and a margin), then
resubscribes every session from the last ``seq`` it had; only then does it serve requests
again. A node that answers with another ``instance`` was restarted: its sessions are gone, and
they fail with that cause. A host unreachable for longer than the node waits fails them too.

Everything the node sends is judged at the door (``supervisor/remote/frames.py``): a frame that
is not the protocol, or an answer without what its action gives, ends that link as a
``protocol_error`` and fails its sessions, naming the host; nothing of it leaves the link's
own tasks. Every request has a deadline (``request_timeout_s``, plus what the agent may rightly
take for the calls that wait for it: see the callers).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import signal
import subprocess
from collections.abc import Callable
from typing import Any, Final, Generic, Protocol, TypeVar, cast

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from supervisor.errors import (
    AgentNotRunning,
    BadRequest,
    Busy,
    CheckpointFailed,
    Conflict,
    SessionNotFound,
    SupervisorError,
)
from supervisor.remote.errors import HostCapacity, HostUnreachable, LinkLost, NodeRetired
from supervisor.remote.frames import (
    MAX_MESSAGE_BYTES,
    NodeProtocolError,
    as_is,
    check_event,
    check_response,
    read_frame,
)
from supervisor.remote.handshake import MAX_HELLO_BYTES, Hello, package_version, wire
from supervisor.remote.hosts import HostSpec
from supervisor.runtime.reply import Reply
from supervisor.wire.requests import HARD_FRAME_BYTES

__all__ = ["Connection", "LinkedSession", "LogThrottle", "NodeLink", "classify_transport_failure"]

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Messages the WebSocket's reader may parse ahead of the link's reader, and the bytes it reads
#: at once: with trio-websocket's defaults (1 message, 4 KiB) every event costs two task
#: switches and the front mirrored ~24,000 events/s at 67 % of a core. The node's flow control
#: counts what is read here as read (the pong goes once the ping is parsed), so this adds at
#: most this many messages to what the front holds.
MESSAGE_QUEUE: Final = 64
RECEIVE_BYTES: Final = 65536
#: Kept of the transport's stderr, to name the cause when it fails.
_STDERR_TAIL_BYTES: Final = 8192
#: Between reconnection attempts: from this, doubling, to the maximum.
RECONNECT_FIRST_S: Final = 0.05
RECONNECT_MAX_S: Final = 2.0
#: A link keeps trying this much longer than the node keeps its sessions undriven: the two
#: clocks start apart (the node's when it notices the drop, ours when we do).
DETACH_MARGIN_S: Final = 5.0
#: Bounds the transport's exit after its stdout closed, and its kill.
_EXIT_BOUND_S: Final = 2.0
#: A link is pinged (a WebSocket ping, answered by the node's gateway) this often, and is
#: dead when the pong is this late: a partition that leaves the TCP connection open (the
#: network gone, a peer suspended) is noticed within twice this, then the link reconnects.
#: SSH's own ServerAliveInterval is off by default.
KEEPALIVE_S: Final = 10.0
#: While a request that must not wait for the keepalive (a cancel) waits for its answer, the
#: link is pinged this often and is dead when a pong is this late. A node answers a ping
#: whatever its sessions do; a round trip over SSH on a LAN is ~1 ms, over a slow VPN ~300 ms.
WATCH_INTERVAL_S: Final = 0.5
WATCH_TIMEOUT_S: Final = 2.0
#: The WebSocket's close codes that say a frame broke the protocol (1002 protocol error, 1003
#: unacceptable data, 1007 text that is not UTF-8, 1009 too big): the link's reader ends on
#: them as on a frame it refused itself. The node closes with one only for a frame of ours it
#: could not take, and the front sends none such (``Connection.request`` refuses a request
#: larger than the node's gateway takes): from either side, it is not a link to go on with.
PROTOCOL_CLOSE_CODES: Final = frozenset({1002, 1003, 1007, 1009})
#: A host whose node keeps breaking the protocol (each new session there, each link recovered,
#: reaches it again) is logged once in this long, the next line counting those left out: a
#: broken or hostile node cannot fill the front's log.
BAD_INPUT_LOG_S: Final = 60.0


class LinkedSession(Protocol):
    """What a link asks of the sessions it carries (``RemoteSession`` is one): its id in the
    node, its events handed over in wire order, a subscription from the last seq it has, and
    its end with a cause."""

    node_id: str

    async def subscribe_on(self, conn: Connection) -> None: ...

    def on_node_message(self, message: dict[str, Any]) -> None: ...

    def fail(self, cause: str, *, gone: bool = False) -> None: ...


#: the sessions a link carries (``RemoteSession`` on a front)
S = TypeVar("S", bound=LinkedSession)


class Connection:
    """One live transport process and the WebSocket over its stdio."""

    def __init__(
        self,
        websocket: WebSocketConnection,
        hello: Hello,
        process: trio.Process,
        host: HostSpec,
        *,
        on_fault: Callable[[HostUnreachable, BaseException | None], None] | None = None,
        max_request_bytes: float = math.inf,
    ) -> None:
        self.websocket = websocket
        self.hello = hello
        self.process = process
        self.host = host
        self.closed = trio.Event()
        #: resubscribed after a reconnect: requests may go
        self.ready = trio.Event()
        #: why the connection was given up, when the node broke the protocol (see ``fault``)
        self.failure: str | None = None
        self._on_fault = on_fault
        #: the largest request the node's gateway takes (it closes the link on a larger one)
        self._max_request_bytes = max_request_bytes
        self._ids = itertools.count(1)
        self._waiting: dict[str, Reply[dict[str, Any]]] = {}
        #: requests given up at their deadline whose late answer must still be acted on
        self._late: dict[str, Callable[[dict[str, Any]], None]] = {}
        #: the connection's own tasks (its reader, its keepalive, a request's watch)
        self.nursery: trio.Nursery | None = None
        #: the last ping's round trip, in seconds (None: none answered yet): its metric
        self.rtt_s: float | None = None

    async def request(
        self,
        action: str,
        payload: dict[str, Any],
        read: Callable[[dict[str, Any]], T],
        *,
        timeout: float | None = None,
        watch: bool = False,
        on_late: Callable[[dict[str, Any]], None] | None = None,
    ) -> T:
        """One request; what ``read`` makes of its ``result``, or raises the node's error
        (:class:`NodeError`), :class:`LinkLost` when the connection ends before the answer,
        :class:`HostUnreachable` (``timeout``) when no answer comes within ``timeout`` (default
        the host's ``request_timeout_s``; whether the node acted is unknown: ``on_late`` gets
        its answer if it comes), or ``protocol_error`` when the node breaks the protocol
        meanwhile or ``read`` finds the result wanting (:class:`NodeProtocolError`): the
        connection is then given up (:meth:`fault`). ``watch``: ping the node while waiting
        (``WATCH_INTERVAL_S``), and give the connection up (closed, LinkLost) when a pong is
        later than ``WATCH_TIMEOUT_S``."""
        if self.failure is not None:
            raise self.failure_error()
        if self.closed.is_set():
            raise LinkLost("the link to the node is down")
        request_id = f"f{next(self._ids)}"
        data = json.dumps({"id": request_id, "action": action, "payload": payload})
        if len(data) > self._max_request_bytes:  # (ASCII: json.dumps escapes the rest)
            raise BadRequest(
                f"{action} is {len(data)} bytes: the node on {self.host.name} takes at most"
                f" {self._max_request_bytes:.0f}"
            )
        if timeout is None:
            timeout = self.host.request_timeout_s
        reply: Reply[dict[str, Any]] = Reply()
        self._waiting[request_id] = reply
        try:
            if watch and self.nursery is not None:
                self.nursery.start_soon(self._watch, WATCH_INTERVAL_S, WATCH_TIMEOUT_S, reply)
            try:
                # Not under the deadline: a frame cut off halfway would garble the stream. A
                # node that reads nothing answers no ping either: the keepalive ends this.
                await self.websocket.send_message(data)
            except ConnectionClosed as exc:  # (the reader may not have seen why yet)
                raise self._ended(exc) from None
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.close()
                raise LinkLost("the link to the node dropped") from None
            with trio.move_on_after(timeout) as deadline:
                response = await reply.wait()
        finally:
            self._waiting.pop(request_id, None)
            if not reply.done:
                reply.fail(LinkLost("abandoned"))  # (ends its watch)
        if deadline.cancelled_caught:
            if on_late is not None and not self.closed.is_set():
                self._late[request_id] = on_late
            raise HostUnreachable(
                self.host.name,
                "timeout",
                f"the node did not answer {action} in {timeout:g} s (whether it acted is unknown)",
            )
        if not response["ok"]:
            error = response["error"]
            raise node_error(error["code"], error["message"])
        try:
            return read(response["result"])
        except NodeProtocolError as exc:
            raise self.fault(f"an answer to {action} {exc}") from None

    def spawn_request(self, action: str, payload: dict[str, Any]) -> None:
        """``request`` in the connection's own tasks, its outcome left (what is done on the
        node's behalf when nobody here waits: the stop of a session started too late)."""
        if self.nursery is not None and not self.closed.is_set():
            self.nursery.start_soon(self._request_quietly, action, payload)

    async def _request_quietly(self, action: str, payload: dict[str, Any]) -> None:
        try:
            await self.request(action, payload, as_is)
        except SupervisorError as exc:
            log.info("host %s: %s went unanswered: %s", self.host.name, action, exc)

    async def read(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        """Hand every event to ``on_event`` (synchronously, in order) and every response to
        its request, until the connection ends; each frame judged at the door first
        (``supervisor/remote/frames.py``). A frame that is not the protocol (or an event
        ``on_event`` cannot read: it raises :class:`NodeProtocolError`) ends the connection
        as a :meth:`fault`; nothing raises out of here."""
        try:
            while True:
                message = read_frame(await self.websocket.get_message())
                if "event" in message:
                    check_event(message)
                    on_event(message)
                    continue
                request_id = check_response(message)
                waiter = self._waiting.pop(request_id, None)
                if waiter is not None:
                    waiter.resolve(message)
                else:  # given up at its deadline (or never ours): only a few are acted on
                    late = self._late.pop(request_id, None)
                    if late is not None:
                        late(message)
        except ConnectionClosed as exc:
            self._ended(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except NodeProtocolError as exc:
            self.fault(str(exc))
        except Exception as exc:  # a frame that passed the door and still broke something
            self.fault(f"a frame this front could not handle ({type(exc).__name__}: {exc})", exc)
        finally:
            self.close()

    def _ended(self, closed: ConnectionClosed) -> SupervisorError:
        """The WebSocket is closed: for a frame that broke the protocol (its close code says
        so) a :meth:`fault`, else a drop (:class:`LinkLost`). The error, to raise."""
        reason = closed.reason
        if reason is not None and reason.code in PROTOCOL_CLOSE_CODES:
            return self.fault(
                f"a frame its WebSocket refused ({reason.code} {reason.name}: {reason.reason})"
            )
        self.close()
        if self.failure is not None:
            return self.failure_error()
        return LinkLost("the link to the node dropped")

    def fault(self, what: str, exc: BaseException | None = None) -> HostUnreachable:
        """The node sent ``what``, which is not the protocol: the connection is given up, its
        waiting requests fail with ``protocol_error``, and ``on_fault`` is told (the link fails
        its sessions and does not reconnect: ``design/remote.md``). The error, to raise."""
        if self.failure is None:
            self.failure = (
                f"the node sent {what}: the link to it is given up, and its sessions here fail"
            )
            self.close()
            if self._on_fault is not None:
                self._on_fault(self.failure_error(), exc)
        return self.failure_error()

    def failure_error(self) -> HostUnreachable:
        """The :meth:`fault` as an error, new for each caller (one exception raised in many
        tasks would share its traceback)."""
        assert self.failure is not None
        return HostUnreachable(self.host.name, "protocol_error", self.failure)

    async def keepalive(self) -> None:
        await self._watch(KEEPALIVE_S, KEEPALIVE_S)

    async def _watch(
        self, interval: float, timeout: float, reply: Reply[dict[str, Any]] | None = None
    ) -> None:
        """Ping every ``interval`` (until ``reply`` is answered); a pong later than
        ``timeout`` closes the connection."""
        while not self.closed.is_set() and (reply is None or not reply.done):
            with trio.move_on_after(timeout) as late:
                sent = trio.current_time()
                try:
                    await self.websocket.ping()
                except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                    self.close()
                    return
                self.rtt_s = trio.current_time() - sent
            if late.cancelled_caught:
                log.warning(
                    "node pid %d: no pong in %g s: the link is given up", self.hello.pid, timeout
                )
                self.close()
                return
            await trio.sleep(interval)  # the next ping's time, not a wait for state

    def close(self) -> None:
        self.closed.set()
        for waiter in self._waiting.values():
            if self.failure is not None:
                waiter.fail(self.failure_error())
            else:
                waiter.fail(LinkLost("the link to the node dropped before it answered"))
        self._waiting.clear()
        self._late.clear()


class NodeError(SupervisorError):
    """The node answered ``ok: false`` with a code that has no class here."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.node_code = code


_NODE_ERRORS: Final[dict[str, type[SupervisorError]]] = {
    "session_not_found": SessionNotFound,
    "agent_not_running": AgentNotRunning,
    "bad_request": BadRequest,
    "busy": Busy,
    "conflict": Conflict,
    "checkpoint_failed": CheckpointFailed,
    "capacity": HostCapacity,
    "node_retired": NodeRetired,
}


def node_error(code: str, message: str) -> SupervisorError:
    """The node's error as the front raises it: same code, the node's words."""
    cls = _NODE_ERRORS.get(code)
    return cls(message) if cls is not None else NodeError(code, message)


class NodeLink(Generic[S]):
    """The front's link to one host's node (see the module docstring)."""

    def __init__(
        self,
        host: HostSpec,
        nursery: trio.Nursery,
        on_forget: Callable[[S], None] | None = None,
    ) -> None:
        self.host = host
        self._nursery = nursery
        self._on_forget = on_forget
        #: the sessions this front placed on the host, by the node's session id
        self.sessions: dict[str, S] = {}
        self._conn: Connection | None = None
        self._lock = trio.Lock()
        self._changed = trio.Event()
        self._maintaining = False
        self._closing = False
        #: the node we talk to (a new one means the old one and its sessions are gone)
        self.instance: str | None = None
        self.node_pid: int | None = None
        self.last_error: HostUnreachable | None = None
        #: connections opened so far (the first, then one per reconnect)
        self.connects = 0
        #: how the node's protocol errors are logged
        self._bad_input = LogThrottle(BAD_INPUT_LOG_S)
        #: the node sessions a protocol error failed here, by node instance: nobody drives them
        #: any more, and a connection that reaches that node again stops them first
        self._abandoned: dict[str, set[str]] = {}

    @property
    def process(self) -> trio.Process | None:
        """The live transport process (tests kill it to drop the link)."""
        return self._conn.process if self._conn is not None else None

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and conn.ready.is_set() and not conn.closed.is_set()

    @property
    def rtt_s(self) -> float | None:
        """The live connection's last ping round trip (None: down, or none answered yet)."""
        return self._conn.rtt_s if self.connected and self._conn is not None else None

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def connection(self, deadline: float | None = None) -> Connection:
        """A live, resumed connection: the one there is, else a new one (the first, or after
        the link went idle), else the one the reconnection brings, waiting until
        ``deadline`` (default: ``connect_timeout_s`` from now)."""
        if deadline is None:
            deadline = trio.current_time() + self.host.connect_timeout_s
        while True:
            conn = self._conn
            if conn is not None and conn.ready.is_set() and not conn.closed.is_set():
                return conn
            if self._closing:
                raise HostUnreachable(self.host.name, "closed", "the supervisor is closing")
            if not self._maintaining:
                async with self._lock:
                    if not self._maintaining and not self.connected:
                        conn = await self._open(deadline)
                        conn.ready.set()
                        self._set(conn)
                        self._maintaining = True
                        self._nursery.start_soon(self._maintain, conn)
                continue
            changed = self._changed
            with trio.move_on_at(deadline):
                await changed.wait()
                continue
            raise self.last_error or HostUnreachable(
                self.host.name, "timeout", "the link is down and did not come back in time"
            )

    def _set(self, conn: Connection) -> None:
        if self.instance is not None and conn.hello.instance != self.instance:
            self._node_replaced(conn.hello)
        self.instance = conn.hello.instance
        self.node_pid = conn.hello.pid
        self._conn = conn
        self.connects += 1
        for node_id in self._abandoned.pop(conn.hello.instance, ()):
            conn.spawn_request("session.stop", {"session_id": node_id})
        self._poke()

    async def _maintain(self, conn: Connection | None) -> None:
        """Reconnect whenever the connection drops, while sessions live on the host (None:
        connect first, for sessions being recovered)."""
        try:
            if conn is None:
                conn = await self._reconnect()
                if conn is None:
                    return
            while True:
                await conn.closed.wait()
                self._poke()
                if self._closing:
                    return
                if conn.failure is not None:
                    # The node broke the protocol: its sessions failed (_faulted), none is
                    # resumed; a new session on the host connects anew.
                    self._fail_all(str(conn.failure_error()))
                    return
                if not self.sessions:
                    return  # idle: the next request connects anew
                log.warning("link to %s dropped; reconnecting", self.host.name)
                reconnected = await self._reconnect()
                if reconnected is None:
                    return
                conn = reconnected
        except Exception as exc:  # a bug of ours: it ends this link, never the supervisor
            log.exception("link to %s failed", self.host.name)
            self._fail_all(f"the link to {self.host.name} failed: {type(exc).__name__}: {exc}")
        finally:
            self._maintaining = False
            self._poke()

    async def _reconnect(self) -> Connection | None:
        dropped_at = trio.current_time()
        give_up = dropped_at + self.host.detach_s + DETACH_MARGIN_S
        delay = RECONNECT_FIRST_S
        while not self._closing:
            try:
                async with self._lock:
                    conn = await self._open(
                        min(give_up, trio.current_time() + self.host.connect_timeout_s)
                    )
            except HostUnreachable as exc:
                self.last_error = exc
                self._poke()
                if exc.cause == "protocol_error":
                    self._fail_all(str(exc))  # (another try reaches the same node)
                    return None
                if exc.cause == "version_mismatch" or trio.current_time() >= give_up:
                    self._fail_all(
                        f"host {self.host.name} unreachable for"
                        f" {trio.current_time() - dropped_at:.0f} s (its node stops undriven"
                        f" sessions after {self.host.detach_s:g} s): {exc}",
                        gone=exc.cause != "version_mismatch",
                    )
                    return None
                await trio.sleep(delay)  # backoff between attempts, not a wait for state
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            self._set(conn)
            await self._resume(conn)
            conn.ready.set()
            self._poke()
            log.info("link to %s is back (connection %d)", self.host.name, self.connects)
            return conn
        return None

    async def _resume(self, conn: Connection) -> None:
        """Resubscribe every session from the last seq it had."""
        for session in list(self.sessions.values()):
            try:
                await session.subscribe_on(conn)
            except LinkLost:
                return  # dropped again: the maintainer goes round once more
            except SessionNotFound:
                session.fail(f"the node on {self.host.name} no longer has this session", gone=True)
            except SupervisorError as exc:
                session.fail(f"resubscribing on {self.host.name} failed: {exc}")

    def _node_replaced(self, hello: Hello) -> None:
        self._fail_all(
            f"the node on {self.host.name} (pid {self.node_pid}) is gone, and its sessions with"
            f" it (their trees die with their node); a new node (pid {hello.pid}) answers now",
            gone=True,
        )

    def _fail_all(self, cause: str, *, gone: bool = False) -> None:
        """Every session of the link fails with ``cause``; ``gone``: nothing of them runs
        anywhere any more (``RemoteSession.fail``)."""
        for session in list(self.sessions.values()):
            session.fail(cause, gone=gone)

    def _faulted(self, error: HostUnreachable, exc: BaseException | None) -> None:
        """A connection's node broke the protocol (``Connection.fault``): every session of
        the link fails with that cause, at once (a request that waited is answered with it
        too); the link does not reconnect (``design/remote.md``, "A node that breaks the
        protocol"), and stops them in that node if it reaches it again (``_set``)."""
        self.last_error = error
        self._bad_input.log(logging.WARNING, "%s", error, exc_info=exc)
        if self.instance is not None and self.sessions:
            self._abandoned.setdefault(self.instance, set()).update(self.sessions)
        self._fail_all(str(error))
        self._poke()

    def start_soon(self, function: Any, *args: Any) -> None:
        """Run a task of a session's for as long as the link (a resubscription)."""
        self._nursery.start_soon(function, *args)

    def forget(self, session: S) -> None:
        if self.sessions.get(session.node_id) is session:
            del self.sessions[session.node_id]
            if self._on_forget is not None:
                self._on_forget(session)

    def recover(self, instance: str | None, node_pid: int | None) -> None:
        """Reach the node again for the sessions registered (a front's crash left them to
        us): in the background, as a reconnection, so requests wait for the resubscription.
        ``instance``: the node they ran in (another one answering means it is gone)."""
        self.instance = instance
        self.node_pid = node_pid
        if not self._maintaining:
            self._maintaining = True
            self._nursery.start_soon(self._maintain, None)

    def _on_event(self, message: dict[str, Any]) -> None:
        session = self.sessions.get(str(message.get("session_id")))
        if session is not None:
            session.on_node_message(message)

    async def aclose(self) -> None:
        self._closing = True
        conn = self._conn
        if conn is not None:
            conn.close()  # its task ends the transport process
        self._poke()

    # -- one connection --------------------------------------------------------------------

    async def _open(self, deadline: float) -> Connection:
        conn: Connection = await self._nursery.start(self._run_connection, deadline)
        return conn

    async def _run_connection(
        self, deadline: float, *, task_status: trio.TaskStatus[Connection]
    ) -> None:
        argv = self.host.bridge_argv(instance=self.instance)
        try:
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C is for the front, not ssh
            )
        except OSError as exc:
            raise HostUnreachable(
                self.host.name, "transport_failed", f"cannot run {argv[0]!r}: {exc.strerror}"
            ) from None
        assert process.stdin is not None and process.stdout is not None
        assert process.stderr is not None
        tail = _Tail()
        conn: Connection | None = None
        failure: HostUnreachable | None = None
        try:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(tail.pump, process.stderr)
                    try:
                        websocket, hello = await self._handshake(nursery, process, tail, deadline)
                    except HostUnreachable as exc:  # (raised below: not from a nursery's body)
                        failure = exc
                        nursery.cancel_scope.cancel()
                    else:
                        conn = Connection(
                            websocket,
                            hello,
                            process,
                            self.host,
                            on_fault=self._faulted,
                            max_request_bytes=HARD_FRAME_BYTES,  # the node closes past it
                        )
                        conn.nursery = nursery
                        nursery.start_soon(conn.read, self._on_event)
                        nursery.start_soon(conn.keepalive)
                        task_status.started(conn)
                        await conn.closed.wait()
                        nursery.cancel_scope.cancel()
            except* Exception as group:
                # trio-websocket's own tasks run in this nursery: what they raise (a handshake
                # answered with what is not HTTP, a frame its parser chokes on) ends this
                # connection, and nothing beyond it.
                what = _describe(group)
                if conn is None:
                    failure = HostUnreachable(
                        self.host.name,
                        "protocol_error",
                        f"the node's WebSocket handshake failed ({what})",
                    )
                else:
                    conn.fault(f"what its WebSocket could not take ({what})", group)
        finally:
            if conn is not None:
                conn.close()
            with trio.CancelScope(shield=True):
                await _end_process(process)
        if failure is not None:
            raise failure

    async def _handshake(
        self, nursery: trio.Nursery, process: trio.Process, tail: _Tail, deadline: float
    ) -> tuple[WebSocketConnection, Hello]:
        """The bridge's hello, the version check, then the WebSocket over the process."""
        assert process.stdout is not None
        argv = self.host.bridge_argv(instance=self.instance)
        name = self.host.name
        with trio.move_on_at(deadline):
            hello, rest = await _read_hello(process.stdout)
            if hello is None:
                with trio.move_on_after(_EXIT_BOUND_S):
                    await process.wait()
                    await tail.done.wait()
                raise classify_transport_failure(name, process.returncode, tail.text(), argv)
            _check_version(name, hello)
            try:
                websocket = await wrap_client_stream(
                    nursery,
                    cast(trio.SocketStream, _ProcessStream(process, rest)),
                    f"127.0.0.1:{hello.port}",
                    f"/ws?token={hello.token}",
                    max_message_size=MAX_MESSAGE_BYTES,
                    message_queue_size=MESSAGE_QUEUE,
                    receive_buffer_size=RECEIVE_BYTES,
                )
            except (HandshakeError, ConnectionClosed) as exc:
                raise HostUnreachable(
                    name, "node_failed", f"the node refused the WebSocket: {exc!r}"
                ) from None
            return websocket, hello
        raise HostUnreachable(
            name,
            "timeout",
            f"no answer from the node in {self.host.connect_timeout_s:g} s"
            f" ({' '.join(argv)}){_said(tail.text())}",
        )


def _describe(group: BaseExceptionGroup[Exception]) -> str:
    """The errors of a group, briefly: their types and words."""
    errors: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        else:
            errors.append(error)
    return "; ".join(f"{type(e).__name__}: {e}"[:200] for e in errors)


class LogThrottle:
    """At most one line per ``interval`` seconds; the next one says how many were left out
    meanwhile. For input a peer can repeat at will: one line, not one per bad frame."""

    def __init__(self, interval: float, logger: logging.Logger = log) -> None:
        self.interval = interval
        self._log = logger
        self._next = -math.inf
        self._held = 0

    def log(
        self, level: int, message: str, *args: object, exc_info: BaseException | None = None
    ) -> None:
        now = trio.current_time()
        if now < self._next:
            self._held += 1
            return
        if self._held:
            message += " (and %d more like it since the line before, not logged)"
            args = (*args, self._held)
        self._log.log(level, message, *args, exc_info=exc_info)
        self._next = now + self.interval
        self._held = 0


def _check_version(host: str, hello: Hello) -> None:
    """Same wire, or ``version_mismatch`` naming both; the package versions may differ."""
    ours = wire()
    if hello.wire != ours:
        raise HostUnreachable(
            host,
            "version_mismatch",
            f"its agent-supervisor is {hello.version} (wire {hello.wire}), this one is"
            f" {package_version()} (wire {ours}): they do not speak the same wire; install a"
            f" version of wire {ours} there (or here, one of wire {hello.wire})",
        )
    if hello.version != package_version():
        log.info(
            "host %s: node %s (pid %d) is agent-supervisor %s, this front %s (wire %d both)",
            host,
            hello.instance,
            hello.pid,
            hello.version,
            package_version(),
            ours,
        )


async def _end_process(process: trio.Process) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            await trio.aclose_forcefully(stream)
    if process.returncode is None:
        with trio.move_on_after(_EXIT_BOUND_S):
            await process.wait()  # its stdin closed: ssh ends the session and exits
    if process.returncode is None:
        process.send_signal(signal.SIGKILL)
        with trio.move_on_after(_EXIT_BOUND_S):
            await process.wait()


async def _read_hello(stdout: trio.abc.ReceiveStream) -> tuple[Hello | None, bytes]:
    """The hello line, and what came after it; (None, b"") if the transport ended first.
    Lines before it (a login banner on stdout) are skipped."""
    buffer = b""
    while len(buffer) < MAX_HELLO_BYTES:
        data = await stdout.receive_some(MAX_HELLO_BYTES)
        if not data:
            return None, b""
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            hello = Hello.parse(line)
            if hello is not None:
                return hello, buffer
    return None, b""


#: What OpenSSH and a shell say, mapped to a cause (checked in order).
_CAUSES: Final = (
    (
        "host_key_mismatch",
        re.compile(
            r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key verification failed|"
            r"No \S+ host key is known|host key for .* has changed",
            re.I,
        ),
        "the host's key is not the one known (Host key verification failed): check the"
        " host, then its known_hosts entry",
    ),
    (
        "auth_refused",
        re.compile(r"Permission denied \(|Too many authentication failures", re.I),
        "authentication refused (Permission denied): check the key and the user",
    ),
    (
        # docker exec, kubectl exec: the target itself is missing (before "not found" below,
        # which kubectl's 'pods "x" not found' would match)
        "no_container",
        re.compile(
            r"No such container|Error from server \(NotFound\)|container \S+ is not running",
            re.I,
        ),
        "the container or pod is not there, or not running: check its name and its state",
    ),
    (
        "not_installed",
        re.compile(
            r"agent-supervisor: (command )?not found|No module named|not found|"
            r"No such file or directory|command terminated with exit code 12[67]",
            re.I,
        ),
        "agent-supervisor is not installed there (or not at the configured command)",
    ),
)


def classify_transport_failure(
    host: str, returncode: int | None, stderr: str, argv: list[str]
) -> HostUnreachable:
    """Name the cause of a transport that ended before the node said hello."""
    said = stderr.strip()
    if returncode == 3 and "agent-supervisor node:" in said:
        return HostUnreachable(host, "node_failed", f"the node did not start: {said}")
    for cause, pattern, text in _CAUSES:
        if pattern.search(said) or (cause == "not_installed" and returncode == 127):
            return HostUnreachable(host, cause, f"{text}{_said(said)}")
    status = f"exit {returncode}" if returncode is not None else "no exit status"
    return HostUnreachable(
        host,
        "transport_failed",
        f"the transport ended before the node answered ({status}: {' '.join(argv)}){_said(said)}",
    )


def _said(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return f" [it said: {' | '.join(lines[-4:])}]" if lines else ""


class _Tail:
    """The last bytes of a stream (the transport's stderr)."""

    def __init__(self) -> None:
        self._data = bytearray()
        self.done = trio.Event()

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        try:
            while data := await stream.receive_some(4096):
                self._data += data
                if len(self._data) > _STDERR_TAIL_BYTES:
                    del self._data[: len(self._data) - _STDERR_TAIL_BYTES]
                log.debug("transport: %s", data.decode(errors="replace").rstrip())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.done.set()

    def text(self) -> str:
        return self._data.decode(errors="replace")


class _ProcessStream(trio.abc.Stream):
    """A process's stdin and stdout as one byte stream, after what was read ahead of it."""

    def __init__(self, process: trio.Process, prefix: bytes) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._send = process.stdin
        self._receive = process.stdout
        self._prefix = prefix

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._send.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._send.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self._receive.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()
