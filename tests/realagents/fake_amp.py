"""A fake Amp *server* for the real Amp CLI (stdlib only, runs in threads of the test process).

Amp's CLI runs no model: its agent loop is server-side, behind two JSON-RPC WebSockets per
thread, and the CLI is the thread's *executor* (it runs the tools the server leases to it) and
an *observer* (it prints what the server says happened). So the stand-in for the model is a
stand-in for ampcode.com. What the CLI needs of it was measured on
``@sourcegraph/amp@0.0.1790142911-g7618fb`` (``shared/amp/README.md``); the tool call's schema
is the zod definitions in the CLI's bundle (``tool_lease``, ``executor_tool_lease_ack``,
``executor_tool_result``, the thread's ``tool_use`` / ``tool_result`` blocks):

- ``POST /api/internal?<method>``: ``{"ok": true, "result": ...}`` for ``getUserInfo``,
  ``loadPlugins`` (a list), ``loadSkills``, ``getThreadTail`` (``thread-not-found`` for a thread
  we do not hold: ``threads continue`` of it exits 1), ``archiveThread``, everything else ``{}``;
- ``POST /api/thread-actors``: a new thread, or the credentials of a known one;
- ``GET /actors/gateway/threadActor/websocket/?...rvt-key=<T-id>``: a RivetKit raw WebSocket
  (subprotocol ``rivet``) carrying JSON-RPC 2.0 text frames; the text ``ping`` is answered
  ``pong``. The server talks first (``agent_state idle``); ``executor_connect`` is answered and
  followed by ``executor_connected``; every other request is acked ``{}``.

A turn starts at ``client_append_user_msg``. What it does is decided by the user text (the last
of these words in it): ``quick`` (a short answer at once, also the default), ``stream`` (a
``delta`` every 200 ms for 60 s, the assistant message only at its end), ``shell`` (a ``Bash``
call running :data:`TOOL_COMMAND`, which writes :data:`TOOL_MARKER` into the CLI's cwd: leased
to the executor, its result logged, then a short answer), ``longshell`` (a ``Bash`` call
running :data:`fake_model.SHELL_COMMAND`, 29.7 s, to be cancelled while it runs; after its
result the answer streams as ``stream`` does, so the turn is still running when the CLI's
``client_cancel`` comes even if the CLI reported the command's death by the cancel's signal
first).

A turn ends early on ``client_cancel`` (the CLI's word on SIGINT/SIGTERM), when the thread's
last connection closes (a killed CLI; the real server's agent loop may go on without it, which
nobody here can see), or when a *steering* message arrives: ``client_append_user_msg`` with
``steer: true`` while a turn runs joins that turn (its ``message_added`` is broadcast) and the
turn answers :data:`STEERED_PREFIX` + its text, ``end_turn``. A message without ``steer`` while
a turn runs waits (``queued_message_added``) and starts the next turn when this one ends.

Everything is logged: each turn as a :class:`Turn`, each WebSocket request as a :class:`Call`.
Only 127.0.0.1 is served (or the listener a test made in its network namespace).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import re
import secrets
import socket
import string
import struct
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs
import trio

from realagents.fake_model import SHELL_COMMAND
from realagents.local_http import LocalServer, ServedFake

__all__ = [
    "AFTER_TOOL_TEXT",
    "QUICK_TEXT",
    "STEERED_PREFIX",
    "TOOL_COMMAND",
    "TOOL_MARKER",
    "Call",
    "FakeAmp",
    "Turn",
]

STREAM_INTERVAL_S = 0.2
STREAM_DURATION_S = 60.0
QUICK_TEXT = "Quick answer from the fake Amp server."
AFTER_TOOL_TEXT = "The command finished with exit code"
STEERED_PREFIX = "Steered: "
#: The file the ``shell`` scenario's command writes in the CLI's working directory.
TOOL_MARKER = "amp-tool-ran.txt"
TOOL_COMMAND = f"echo amp-tool-output > {TOOL_MARKER} && cat {TOOL_MARKER}"
LONG_TOOL_COMMAND = SHELL_COMMAND
SCENARIOS = ("quick", "stream", "shell", "longshell")
_SCENARIO_RE = re.compile(r"\b(" + "|".join(SCENARIOS) + r")\b")
#: What ``inference_tools`` lists (the CLI's ``system/init`` shows it): names the executor
#: registers (``executor_tools_register``); its shell tool is ``shell_command``, not ``Bash``.
TOOLS = ["shell_command", "Read", "edit_file", "create_file", "Grep", "glob"]
SHELL_TOOL = "shell_command"
USER = {
    "id": "user_fake",
    "email": "fake@example.com",
    "displayName": "Fake",
    "username": "fake",
    "features": [],
    "team": None,
}
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_ALNUM = string.ascii_letters + string.digits
#: Largest WebSocket frame we accept from the CLI (its biggest are tool results).
_MAX_FRAME = 16 * 1024 * 1024


def _id22() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(22))


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def scenario_of(text: str) -> str:
    found = _SCENARIO_RE.findall(text.lower())
    return found[-1] if found else "quick"


@attrs.define
class Turn:
    """One turn the fake ran (or is running) for a thread."""

    id: int
    thread: str
    user_text: str
    scenario: str
    started_at: float  # time.monotonic()
    tokens_sent: int = 0
    tool_call: dict[str, Any] | None = None  # {"toolCallId", "toolName", "args"}
    tool_acked_at: float | None = None  # executor_tool_lease_ack
    tool_result: dict[str, Any] | None = None  # the ``run`` of executor_tool_result
    tool_result_at: float | None = None
    steered_with: list[str] = attrs.field(factory=list)
    cancelled_at: float | None = None  # client_cancel came
    abandoned_at: float | None = None  # every connection of the thread closed
    ended_at: float | None = None
    outcome: str | None = None  # completed, steered, cancelled, abandoned

    @property
    def running(self) -> bool:
        return self.ended_at is None


@attrs.define
class Call:
    """One JSON-RPC message the CLI sent on a thread's socket."""

    at: float
    thread: str
    conn: int
    method: str
    params: dict[str, Any]


class FakeAmp(ServedFake):
    """The server: ``with FakeAmp(listener) as amp:``; ``amp.base_url`` goes into ``AMP_URL``."""

    def __init__(self, listener: socket.socket | None = None) -> None:
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._threads: dict[str, _Thread] = {}
        self.turns: list[Turn] = []
        self.calls: list[Call] = []
        self.http: list[tuple[str, dict[str, Any]]] = []  # (path, params) of every POST
        self._conn_ids = 0
        self._serve(_Server(listener, self))

    def _hang_up(self) -> None:
        for thread in self._threads.values():
            for conn in list(thread.conns):
                conn.ws.shut()

    # -- what tests look at ----------------------------------------------------------------

    def forget(self, thread_id: str) -> None:
        """Lose a thread, as a server that no longer has it: ``threads continue`` fails."""
        with self._cond:
            self._threads.pop(thread_id, None)

    def thread_ids(self) -> list[str]:
        with self._cond:
            return list(self._threads)

    def messages(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread's messages as the server holds them (what the agent "remembers")."""
        with self._cond:
            thread = self._threads.get(thread_id)
            return [dict(m) for m in thread.messages] if thread else []

    def find_turns(self, predicate: Callable[[Turn], bool]) -> list[Turn]:
        with self._cond:
            return [attrs.evolve(t) for t in self.turns if predicate(t)]

    def find_calls(self, method: str) -> list[Call]:
        with self._cond:
            return [c for c in self.calls if c.method == method]

    def wait_for_sync(self, predicate: Callable[[Turn], bool], timeout: float) -> Turn:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for turn in self.turns:
                    if predicate(turn):
                        return attrs.evolve(turn)
                left = deadline - time.monotonic()
                if left <= 0 or self._closing.is_set():
                    raise TimeoutError(f"no matching turn on the fake Amp server:\n{self._text()}")
                self._cond.wait(left)

    async def wait_for(self, predicate: Callable[[Turn], bool], timeout: float = 60.0) -> Turn:
        """The first turn matching ``predicate`` (waits for it, on a worker thread)."""
        return await trio.to_thread.run_sync(
            self.wait_for_sync, predicate, timeout, abandon_on_cancel=True
        )

    def describe(self) -> str:
        with self._cond:
            return self._text()

    def _text(self) -> str:
        lines = [
            f"turn {t.id} {t.thread} {t.scenario} {t.user_text[:40]!r} tokens={t.tokens_sent}"
            f" outcome={t.outcome} steered={t.steered_with} tool={bool(t.tool_call)}"
            f" result={t.tool_result}"
            for t in self.turns
        ]
        lines += [f"call {c.conn} {c.method}" for c in self.calls[-30:]]
        return "\n".join(lines)

    # -- shared state (any server thread, under the condition) -------------------------------

    def _update(self, turn: Turn, **fields: Any) -> None:
        with self._cond:
            for key, value in fields.items():
                setattr(turn, key, value)
            self._cond.notify_all()

    def _thread(self, thread_id: str | None, *, create: bool) -> _Thread | None:
        with self._cond:
            if thread_id is not None and thread_id in self._threads:
                return self._threads[thread_id]
            if not create:
                return None
            thread = _Thread(self, thread_id or f"T-{uuid.uuid4()}")
            self._threads[thread.tid] = thread
            return thread

    # -- HTTP ---------------------------------------------------------------------------------

    def handle_http(self, handler: _Handler) -> None:
        url = urlsplit(handler.path)
        if handler.headers.get("Upgrade", "").lower() == "websocket":
            self._websocket(handler, url.query)
            return
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if handler.headers.get("Content-Encoding") == "gzip":
            import gzip

            raw = gzip.decompress(raw)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        params = body.get("params") if isinstance(body.get("params"), dict) else {}
        with self._cond:
            self.http.append((handler.path, params or body))
            self._cond.notify_all()
        if url.path == "/api/internal":
            method = url.query.split("&")[0]
            handler.reply(200, self._internal(method, params or {}))
        elif url.path == "/api/thread-actors" and handler.command == "POST":
            thread_id = body.get("threadId")
            thread = self._thread(thread_id, create=thread_id is None)
            if thread is None:
                handler.reply(404, {"error": "Thread not found", "code": "THREAD_NOT_FOUND"})
                return
            handler.reply(
                200,
                {
                    "threadId": thread.tid,
                    "wsToken": f"ws-{thread.tid}",
                    "ownerUserId": USER["id"],
                    "threadVersion": 1,
                    "usesDtw": True,
                    "usesThreadActors": True,
                    "executorType": "local-client",
                    "agentMode": "medium",
                },
            )
        else:
            handler.reply(404, {"error": f"fake Amp: no {url.path}"})

    def _internal(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "getUserInfo":
            return {"ok": True, "result": USER}
        if method == "loadPlugins":
            return {"ok": True, "result": []}
        if method == "loadSkills":
            return {"ok": True, "result": {"sources": []}}
        if method == "getThreadTail":
            thread = self._thread(params.get("thread"), create=False)
            if thread is None:
                return {"ok": False, "error": {"code": "thread-not-found", "message": "not found"}}
            data = {
                "id": thread.tid,
                "v": 1,
                "created": thread.created,
                "messages": [],
                "agentMode": "medium",
                "meta": {"usesDtw": True, "usesThreadActors": True},
                "archived": thread.archived,
            }
            tail = {"thread": {"data": data}, "messages": [], "hasMoreBefore": False}
            return {"ok": True, "result": tail}
        if method == "archiveThread":
            # What the CLI asks at the end of a run that started a thread, unless it runs with
            # --no-archive-after-execute: an archived thread "cannot be continued".
            thread = self._thread(params.get("thread"), create=False)
            if thread is not None:
                thread.archived = params.get("archived", True) is True
        return {"ok": True, "result": {}}

    # -- WebSocket ------------------------------------------------------------------------------

    def _websocket(self, handler: _Handler, query: str) -> None:
        thread_id = (parse_qs(query).get("rvt-key") or [None])[0]
        thread = self._thread(thread_id, create=False)
        if thread is None:
            handler.reply(404, {"error": "no such thread actor"})
            return
        key = handler.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
        handler.send_response(101)
        handler.send_header("Upgrade", "websocket")
        handler.send_header("Connection", "Upgrade")
        handler.send_header("Sec-WebSocket-Accept", accept)
        handler.send_header("Sec-WebSocket-Protocol", "rivet")
        handler.end_headers()
        handler.wfile.flush()
        handler.close_connection = True
        with self._cond:
            self._conn_ids += 1
            conn = _Conn(self, thread, self._conn_ids, _WebSocket(handler.connection))
            thread.conns.add(conn)
        try:
            conn.serve()
        finally:
            thread.disconnected(conn)


class _Thread:
    """One thread: its messages, its sockets, its running turn and queued messages."""

    def __init__(self, server: FakeAmp, tid: str) -> None:
        self.server = server
        self.tid = tid
        self.created = int(time.time() * 1000)
        self.messages: list[dict[str, Any]] = []
        self.seq = 0
        self.conns: set[_Conn] = set()
        self.running: _Running | None = None
        self.queued: list[dict[str, Any]] = []
        self.archived = False

    def broadcast(self, method: str, params: dict[str, Any]) -> None:
        with self.server._cond:
            conns = list(self.conns)
        for conn in conns:
            conn.notify(method, params)

    def add_message(self, message: dict[str, Any]) -> None:
        with self.server._cond:
            self.messages.append(message)
            self.seq += 1
            seq = self.seq
        self.broadcast("message_added", {"message": message, "seq": seq})

    def append_user(self, params: dict[str, Any]) -> None:
        content = params.get("content") if isinstance(params.get("content"), list) else []
        message = {
            "threadId": self.tid,
            "role": "user",
            "content": content,
            "agentMode": params.get("agentMode") or "medium",
            "messageId": params.get("messageId") or f"M-{_id22()}",
            "createdAt": _now_iso(),
            "meta": {"sentAt": int(time.time() * 1000)},
        }
        text = " ".join(b.get("text", "") for b in content if isinstance(b, dict))
        with self.server._cond:
            running = self.running
            if running is not None and params.get("steer") is not True:
                self.queued.append(message)
        if running is None:
            self.start(message, text)
        elif params.get("steer") is True:
            self.add_message(message)  # it joins the running turn, which then answers it
            running.steer(text)
        else:
            queued = {"steer": False, "queuedMessage": message}
            self.broadcast("queued_message_added", {"message": queued, "seq": self.seq})

    def start(self, message: dict[str, Any], text: str) -> None:
        self.add_message(message)
        server = self.server
        with server._cond:
            turn = Turn(len(server.turns) + 1, self.tid, text, scenario_of(text), time.monotonic())
            server.turns.append(turn)
            self.running = _Running(self, turn)
            server._cond.notify_all()
        threading.Thread(target=self.running.run, daemon=True).start()

    def turn_over(self) -> None:
        with self.server._cond:
            self.running = None
            follow = self.queued.pop(0) if self.queued else None
        if follow is not None:
            text = " ".join(b.get("text", "") for b in follow["content"] if isinstance(b, dict))
            self.start(follow, text)

    def disconnected(self, conn: _Conn) -> None:
        with self.server._cond:
            self.conns.discard(conn)
            running = self.running if not self.conns else None
        if running is not None:
            running.abandon()


class _Running:
    """The fake agent loop of one turn, on its own thread."""

    def __init__(self, thread: _Thread, turn: Turn) -> None:
        self.thread = thread
        self.turn = turn
        self.server = thread.server
        self.stop = threading.Event()  # cancelled, abandoned or steered
        self.tool_done = threading.Event()
        self.steering: list[str] = []

    # from the connections' threads

    def steer(self, text: str) -> None:
        self.steering.append(text)
        self.server._update(self.turn, steered_with=[*self.turn.steered_with, text])
        self.stop.set()

    def cancel(self) -> None:
        if self.turn.cancelled_at is None:
            self.server._update(self.turn, cancelled_at=time.monotonic())
        self.stop.set()
        self.tool_done.set()

    def abandon(self) -> None:
        if self.turn.abandoned_at is None:
            self.server._update(self.turn, abandoned_at=time.monotonic())
        self.stop.set()
        self.tool_done.set()

    def tool_result(self, tool_call_id: str, run: Any) -> None:
        call = self.turn.tool_call
        if call is None or call["toolCallId"] != tool_call_id:
            return
        self.server._update(
            self.turn,
            tool_result=run if isinstance(run, dict) else {"run": run},
            tool_result_at=time.monotonic(),
        )
        self.tool_done.set()

    def interrupted(self) -> bool:
        return self.turn.cancelled_at is not None or self.turn.abandoned_at is not None

    # the loop

    def run(self) -> None:
        thread, turn = self.thread, self.turn
        message_id = f"M-{_id22()}"
        thread.broadcast(
            "inference_tools", {"messageId": message_id, "agentMode": "medium", "tools": TOOLS}
        )
        self.state("working", message_id)
        text = ""
        if turn.scenario == "stream":
            text = self.stream(message_id)
        elif turn.scenario in ("shell", "longshell"):
            message_id = self.tool_round(message_id)
            if turn.scenario == "longshell" and not self.interrupted():
                text = self.stream(message_id)
        if self.interrupted():
            if text:
                self.assistant(message_id, text, "cancelled")
            thread.broadcast("cancelled", {"messageId": message_id})
            outcome = "cancelled" if turn.cancelled_at is not None else "abandoned"
        else:
            if self.steering:
                text = STEERED_PREFIX + " | ".join(self.steering)
                outcome = "steered"
            elif turn.scenario == "shell":
                run = turn.tool_result or {}
                result = run.get("result") if isinstance(run.get("result"), dict) else {}
                text = f"{AFTER_TOOL_TEXT} {result.get('exitCode')}."
                outcome = "completed"
            else:
                text = text + QUICK_TEXT if text else QUICK_TEXT
                outcome = "completed"
            self.assistant(message_id, text, "complete")
        self.state("idle", None)
        self.server._update(turn, ended_at=time.monotonic(), outcome=outcome)
        thread.turn_over()

    def stream(self, message_id: str) -> str:
        """A ``delta`` every STREAM_INTERVAL_S until the turn stops or STREAM_DURATION_S
        pass; the text streamed."""
        thread, turn = self.thread, self.turn
        self.state("streaming", message_id)
        text = ""
        end = time.monotonic() + STREAM_DURATION_S
        while time.monotonic() < end and not self.stop.wait(STREAM_INTERVAL_S):
            text += f"token{turn.tokens_sent + 1} "
            self.server._update(turn, tokens_sent=turn.tokens_sent + 1)
            thread.broadcast(
                "delta",
                {
                    "messageId": message_id,
                    "role": "assistant",
                    "contentMode": "snapshot",
                    "blocks": [{"type": "text", "text": text}],
                    "state": "generating",
                },
            )
        return text

    def tool_round(self, message_id: str) -> str:
        """A shell call leased to the executor, its result added to the thread; the id of the
        message that answers it."""
        command = TOOL_COMMAND if self.turn.scenario == "shell" else LONG_TOOL_COMMAND
        call_id = f"TU-{_id22()}"
        args = {"command": command}
        block = {"type": "tool_use", "id": call_id, "name": SHELL_TOOL, "complete": True}
        block["input"] = args
        self.server._update(
            self.turn, tool_call={"toolCallId": call_id, "toolName": SHELL_TOOL, "args": args}
        )
        self.thread.add_message(self.message(message_id, [block], "complete"))
        self.state("running_tools", message_id)
        lease = {
            "toolCallId": call_id,
            "toolName": SHELL_TOOL,
            "args": args,
            "messageId": message_id,
        }
        with self.server._cond:
            executors = [c for c in self.thread.conns if c.executor]
        for conn in executors:
            conn.notify("tool_lease", lease)
        self.tool_done.wait()
        if self.interrupted():
            return message_id
        run = self.turn.tool_result or {"status": "error", "error": {"message": "no result"}}
        result_block = {"type": "tool_result", "toolUseID": call_id, "run": run}
        self.thread.add_message(
            {
                "threadId": self.thread.tid,
                "role": "user",
                "content": [result_block],
                "messageId": f"M-{_id22()}",
                "createdAt": _now_iso(),
            }
        )
        answer = f"M-{_id22()}"
        self.state("working", answer)
        return answer

    def state(self, state: str, message_id: str | None) -> None:
        params: dict[str, Any] = {"state": state, "agentMode": "medium"}
        if message_id is not None:
            params["messageId"] = message_id
        self.thread.broadcast("agent_state", params)

    def message(self, message_id: str, content: list[Any], state: str) -> dict[str, Any]:
        return {
            "threadId": self.thread.tid,
            "role": "assistant",
            "content": content,
            "state": {"type": state},
            "usage": {
                "model": "fake-model",
                "maxInputTokens": 200000,
                "inputTokens": 10,
                "outputTokens": 5,
                "cacheCreationInputTokens": None,
                "cacheReadInputTokens": None,
                "totalInputTokens": 10,
            },
            "messageId": message_id,
            "createdAt": _now_iso(),
        }

    def assistant(self, message_id: str, text: str, state: str) -> None:
        self.thread.add_message(self.message(message_id, [{"type": "text", "text": text}], state))


class _Conn:
    """One of the CLI's two sockets on a thread: the executor's or the observer's."""

    def __init__(self, server: FakeAmp, thread: _Thread, cid: int, ws: _WebSocket) -> None:
        self.server = server
        self.thread = thread
        self.cid = cid
        self.ws = ws
        self.executor = False

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.ws.send_text(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}))

    def reply(self, request_id: Any, result: Any) -> None:
        self.ws.send_text(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}))

    def serve(self) -> None:
        # The actor talks first: an observer counts as ready only on the first server frame.
        self.notify("agent_state", {"state": "idle", "agentMode": "medium"})
        while not self.server._closing.is_set():
            text = self.ws.receive_text()
            if text is None:
                return
            if text == "ping":
                self.ws.send_text("pong")
                continue
            try:
                message = json.loads(text)
            except ValueError:
                continue
            for one in message if isinstance(message, list) else [message]:
                if isinstance(one, dict):
                    self.handle(one)

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if not isinstance(method, str):
            return  # a response of the CLI's
        request_id = message.get("id")
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        thread = self.thread
        with self.server._cond:
            self.server.calls.append(Call(time.monotonic(), thread.tid, self.cid, method, params))
            running = thread.running
            self.server._cond.notify_all()
        if method == "executor_connect":
            self.executor = True
            self.reply(request_id, {})
            connected = {
                "executorId": params.get("clientId", "executor"),
                "registeredToolCount": 0,
                "guidanceInventory": [],
            }
            self.notify("executor_connected", connected)
            return
        if request_id is not None:
            self.reply(request_id, {})
        if method == "client_append_user_msg":
            thread.append_user(params)
        elif method == "client_cancel" and running is not None:
            running.cancel()
        elif method == "executor_tool_lease_ack" and running is not None:
            self.server._update(running.turn, tool_acked_at=time.monotonic())
        elif method == "executor_tool_result" and running is not None:
            running.tool_result(str(params.get("toolCallId")), params.get("run"))


class _WebSocket:
    """Server side of RFC 6455 over a connected socket: text frames, ping/pong, close."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.closed = False

    def _read(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def receive_text(self) -> str | None:
        """The next text message (fragments joined), or None once the peer is gone."""
        parts: list[bytes] = []
        while True:
            head = self._read(2)
            if head is None:
                return None
            fin, opcode = head[0] & 0x80, head[0] & 0x0F
            length = head[1] & 0x7F
            if length == 126:
                extra = self._read(2)
                length = struct.unpack(">H", extra)[0] if extra else 0
            elif length == 127:
                extra = self._read(8)
                length = struct.unpack(">Q", extra)[0] if extra else 0
            if length > _MAX_FRAME:
                return None
            mask = self._read(4) if head[1] & 0x80 else b"\0\0\0\0"
            payload = self._read(length) if length else b""
            if mask is None or payload is None:
                return None
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x8:  # close: echo it and stop
                self._send(data[:2], 0x8)
                return None
            if opcode == 0x9:
                self._send(data, 0xA)
                continue
            if opcode == 0xA:
                continue
            parts.append(data)
            if fin:
                return b"".join(parts).decode("utf-8", "replace")

    def send_text(self, text: str) -> None:
        self._send(text.encode(), 0x1)

    def _send(self, data: bytes, opcode: int) -> None:
        n = len(data)
        if n < 126:
            head = bytes([0x80 | opcode, n])
        elif n < 65536:
            head = bytes([0x80 | opcode, 126]) + struct.pack(">H", n)
        else:
            head = bytes([0x80 | opcode, 127]) + struct.pack(">Q", n)
        with self.lock:
            if self.closed:
                return
            try:
                self.sock.sendall(head + data)
            except OSError:
                self.closed = True

    def shut(self) -> None:
        with self.lock:
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(LocalServer):
    def __init__(self, listener: socket.socket | None, amp: FakeAmp) -> None:
        self.amp = amp
        super().__init__(listener, _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        self.server.amp.handle_http(self)

    do_GET = do_POST

    def reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass
