"""A scripted fake ``opencode serve``: HTTP routes and a server-sent event stream, for tier-3 tests.

Run as ``python fake_opencode.py serve --port 0 --hostname 127.0.0.1 --state-dir DIR``. Like the
real server 1.18.33 (shapes in ``tests/golden/opencode``) it prints a warning when it has no
password, then ``opencode server listening on http://HOST:PORT`` on stdout, and serves:

- ``GET /event``: ``server.connected`` first, then every event, chunked, with a heartbeat;
- ``POST /session``; ``GET /session/{id}`` (404 ``NotFoundError`` for one it does not have; the
  sessions are files in ``--state-dir``, so a respawned server finds them); ``GET
  /session/status`` (``{}``, or each running turn's session ``{"type": "busy"}``);
- ``POST /session/{id}/prompt_async`` (204 at once; ``session.status busy`` when it runs);
- ``POST /session/{id}/abort`` (``200 true`` whatever happens; an idle session's abort emits an
  idle pair; a running turn's emits ``session.error`` MessageAbortedError, an idle pair, the
  late updates and a second idle pair);
- ``POST /permission/{id}/reply`` (404 ``PermissionNotFoundError`` when gone; ``reject`` ends
  the turn with ``finish: "tool-calls"``).

With ``OPENCODE_SERVER_PASSWORD`` in its environment (the supervisor sets one per process) every
route, the event stream too, wants HTTP basic auth as ``OPENCODE_SERVER_USERNAME`` (default
``opencode``) and answers 401 otherwise, as the real server does; without it, it warns that the
server is unsecured.

Words in the prompt script one turn:

``words=N``        stream N words (default 20), ``interval=S`` apart (default 0.05)
``wedged``         answer the abort ``true`` and go on: the stream never goes idle (edge case 25)
``grandchild``     start a sleeping child in its own session (it must not outlive a kill)
``permission``     ask a bash permission before the second word
``leftover``       after an abort, the second idle pair comes 50 ms late (edge case 28)
``garbage``        put an event that is not JSON on the stream
``crash``          exit with status 3 after the second word
``fail-late``      fail inside the server: busy, the idle pair, then ``session.error``
                   ``UnknownError`` and no reply (the real ``prompt_async``'s order); the status
                   says busy until the error is out

``--drop-stream-once S`` ends the first event stream after S seconds while the server goes on.

Fault modes (for ``tests/faults``): ``--ignore-sigterm`` ignores SIGTERM from the start; prompt
words ``flood`` (no pause between words, bounded by the slowest subscriber), ``mute`` (ignore
the abort, and after the third word close stdout and go silent on the event stream, heartbeats
too: a hung server), ``crash-on-abort`` (exit 3 when the abort arrives), ``busy-delay=S`` (the
turn goes busy S seconds after ``prompt_async``).

What it decides is logged to stderr (the supervisor turns that into ``agent.stderr`` events).
Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import math
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HEARTBEAT_S = 10.0
DEFAULT_WORDS = 20
DEFAULT_INTERVAL = 0.05
LEFTOVER_S = 0.05
CRASH_AFTER_WORDS = 3
#: A flood waits while a subscriber has this many events queued (bounded memory).
FLOOD_BACKLOG = 256
#: The event stream's socket send buffer, fixed (as a pipe's 64 KiB is): left to TCP's
#: autotuning it grows to megabytes on loopback, and a flood then lies that far ahead of the
#: abort's events, bounded by nothing but how fast a loaded machine lets the client read.
STREAM_SNDBUF = 64 * 1024
ABORTED = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
FAILED = {
    "name": "UnknownError",
    "data": {"message": "Error: All fibers interrupted without error"},
}


def log(text: str) -> None:
    print(f"fake-opencode: {text}", file=sys.stderr, flush=True)


class Bus:
    """Every subscriber of ``GET /event`` gets every event, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[queue.Queue[bytes]] = []
        self._counter = 0
        self.muted = threading.Event()

    def backlog(self) -> int:
        with self._lock:
            return max((q.qsize() for q in self._subscribers), default=0)

    def subscribe(self) -> queue.Queue[bytes]:
        q: queue.Queue[bytes] = queue.Queue()
        with self._lock:
            self._subscribers.append(q)
        return q

    def unsubscribe(self, q: queue.Queue[bytes]) -> None:
        with self._lock:
            if q in self._subscribers:
                self._subscribers.remove(q)

    def publish(self, kind: str, properties: dict[str, Any]) -> None:
        if self.muted.is_set():
            return
        with self._lock:
            self._counter += 1
            event = {"id": f"evt_{self._counter:06d}", "type": kind, "properties": properties}
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            for q in self._subscribers:
                q.put(data)

    def publish_raw(self, data: bytes) -> None:
        with self._lock:
            for q in self._subscribers:
                q.put(data)


class Turn:
    def __init__(self, session: str, text: str) -> None:
        self.session = session
        self.text = text
        self.words = DEFAULT_WORDS
        self.interval = DEFAULT_INTERVAL
        self.busy_delay = 0.0
        for token in text.split():
            key, _, value = token.partition("=")
            if key == "words":
                self.words = int(value)
            elif key == "interval":
                self.interval = float(value)
            elif key == "busy-delay":
                self.busy_delay = float(value)
            elif key == "flood":
                self.interval = 0.0
        self.flags = set(text.split())
        self.stop = threading.Event()
        self.aborted = False


class FakeServer:
    def __init__(self, state_dir: Path, drop_stream_once: float | None = None) -> None:
        self.state_dir = state_dir
        self.drop_stream_once = drop_stream_once
        self.bus = Bus()
        self.lock = threading.Lock()
        self.active: dict[str, Turn] = {}
        self.pending: dict[str, queue.Queue[str]] = {}
        self.children: list[subprocess.Popen[bytes]] = []

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{secrets.token_hex(6)}"

    # -- routes ------------------------------------------------------------------------------

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.split("?")[0].strip("/").split("/")
        if method == "POST" and parts == ["session"]:
            session = self.new_id("ses")
            (self.state_dir / f"{session}.json").write_text(json.dumps({"id": session}))
            self.bus.publish("session.created", {"sessionID": session, "info": {"id": session}})
            return 200, {"id": session, "title": "New session"}
        if method == "GET" and parts == ["session", "status"]:
            with self.lock:
                return 200, {session: {"type": "busy"} for session in self.active}
        if method == "GET" and len(parts) == 2 and parts[0] == "session":
            if not (self.state_dir / f"{parts[1]}.json").is_file():
                return 404, {
                    "name": "NotFoundError",
                    "data": {"message": f"Session not found: {parts[1]}"},
                }
            log(f"resumed {parts[1]}")
            return 200, {"id": parts[1]}
        if method == "POST" and len(parts) == 3 and parts[0] == "session":
            if parts[2] == "prompt_async":
                text = "".join(p.get("text", "") for p in (body or {}).get("parts", []))
                turn = Turn(parts[1], text)
                threading.Thread(target=self.run_turn, args=(turn,), daemon=True).start()
                return 204, None
            if parts[2] == "abort":
                self.abort(parts[1])
                return 200, True
        if method == "POST" and len(parts) == 3 and parts[0] == "permission":
            with self.lock:
                answer = self.pending.pop(parts[1], None)
            reply = str((body or {}).get("reply"))
            log(f"permission {parts[1]} reply {reply}" + ("" if answer else ": not found"))
            if answer is None:
                return 404, {
                    "_tag": "PermissionNotFoundError",
                    "message": f"Permission request not found: {parts[1]}",
                }
            answer.put(reply)
            return 200, True
        return 404, {"name": "NotFoundError", "data": {"message": f"no route {method} {path}"}}

    def abort(self, session: str) -> None:
        with self.lock:
            turn = self.active.get(session)
        if turn is None:
            log(f"abort {session}: idle")
            self.idle_pair(session)
        elif "crash-on-abort" in turn.flags:
            log(f"abort {session}: crashing as asked")
            os._exit(3)
        elif "wedged" in turn.flags or "mute" in turn.flags:
            log(f"abort {session}: ignored (wedged)")
        else:
            log(f"abort {session}: stopping")
            turn.aborted = True
            turn.stop.set()

    # -- a turn ------------------------------------------------------------------------------

    def status(self, session: str, kind: str) -> None:
        self.bus.publish("session.status", {"sessionID": session, "status": {"type": kind}})

    def idle_pair(self, session: str) -> None:
        self.status(session, "idle")
        self.bus.publish("session.idle", {"sessionID": session})

    def run_turn(self, turn: Turn) -> None:
        session, publish = turn.session, self.bus.publish
        user, assistant, part = self.new_id("msg"), self.new_id("msg"), self.new_id("prt")
        publish(
            "message.updated",
            {"sessionID": session, "info": {"id": user, "role": "user", "sessionID": session}},
        )
        publish(
            "message.part.updated",
            {
                "sessionID": session,
                "part": {
                    "id": self.new_id("prt"),
                    "messageID": user,
                    "sessionID": session,
                    "type": "text",
                    "text": turn.text,
                },
            },
        )
        with self.lock:
            self.active[session] = turn
        if turn.busy_delay:
            time.sleep(turn.busy_delay)
        self.status(session, "busy")
        if "fail-late" in turn.flags:
            log(f"failing {session} after its idle")
            self.idle_pair(session)
            publish("session.error", {"sessionID": session, "error": FAILED})
            with self.lock:
                self.active.pop(session, None)
            return
        info = {
            "id": assistant,
            "parentID": user,
            "role": "assistant",
            "sessionID": session,
            "time": {"created": 1},
        }
        publish("message.updated", {"sessionID": session, "info": info})
        publish(
            "message.part.updated",
            {
                "sessionID": session,
                "part": {
                    "id": part,
                    "messageID": assistant,
                    "sessionID": session,
                    "type": "text",
                    "text": "",
                },
            },
        )
        if "grandchild" in turn.flags:
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
            )
            self.children.append(child)
            log(f"grandchild {child.pid}")
        if "garbage" in turn.flags:
            self.bus.publish_raw(b"data: {this is not json\n\n")
        said, rejected = "", False
        for index in range(turn.words):
            if turn.stop.is_set():
                break
            if "permission" in turn.flags and index == 1:
                reply = self.ask_permission(turn, assistant)
                if reply == "reject":
                    rejected = True
                    break
                if reply == "":
                    break  # aborted while waiting
            if "crash" in turn.flags and index == 2:
                log("crashing")
                os._exit(3)
            if "flood" in turn.flags:
                while self.bus.backlog() > FLOOD_BACKLOG and not turn.stop.is_set():
                    time.sleep(0.001)
            word = f"w{index} "
            said += word
            publish(
                "message.part.delta",
                {
                    "sessionID": session,
                    "messageID": assistant,
                    "partID": part,
                    "field": "text",
                    "delta": word,
                },
            )
            if "mute" in turn.flags and index + 1 == CRASH_AFTER_WORDS:
                self.bus.muted.set()
                sys.stdout.flush()
                os.close(1)
                log("stdout closed and event stream silent; staying alive")
                threading.Event().wait()
            turn.stop.wait(turn.interval)
        with self.lock:
            self.active.pop(session, None)
        final = {
            "id": part,
            "messageID": assistant,
            "sessionID": session,
            "type": "text",
            "text": said,
        }
        if turn.aborted:
            publish("session.error", {"sessionID": session, "error": ABORTED})
            self.idle_pair(session)
            publish("message.part.updated", {"sessionID": session, "part": final})
            publish(
                "message.updated",
                {
                    "sessionID": session,
                    "info": {**info, "time": {"created": 1, "completed": 2}, "error": ABORTED},
                },
            )
            if "leftover" in turn.flags:
                time.sleep(LEFTOVER_S)
            self.idle_pair(session)
            return
        finish = "tool-calls" if rejected else "stop"
        publish("message.part.updated", {"sessionID": session, "part": final})
        publish(
            "message.updated",
            {
                "sessionID": session,
                "info": {**info, "time": {"created": 1, "completed": 2}, "finish": finish},
            },
        )
        self.idle_pair(session)

    def ask_permission(self, turn: Turn, message: str) -> str:
        request, call = self.new_id("per"), self.new_id("call")
        answer: queue.Queue[str] = queue.Queue()
        with self.lock:
            self.pending[request] = answer
        command = "rm -rf build"
        tool = {
            "id": self.new_id("prt"),
            "messageID": message,
            "sessionID": turn.session,
            "type": "tool",
            "tool": "bash",
            "callID": call,
        }
        self.bus.publish(
            "message.part.updated",
            {
                "sessionID": turn.session,
                "part": {**tool, "state": {"status": "running", "input": {"command": command}}},
            },
        )
        self.bus.publish(
            "permission.asked",
            {
                "id": request,
                "sessionID": turn.session,
                "permission": "bash",
                "patterns": [command],
                "metadata": {"command": command},
                "always": ["rm *"],
                "tool": {"messageID": message, "callID": call},
            },
        )
        while not turn.stop.is_set():
            try:
                reply = answer.get(timeout=0.02)
                break
            except queue.Empty:
                continue
        else:
            return ""  # aborted: the request stays orphaned, like the real server's
        self.bus.publish(
            "permission.replied", {"sessionID": turn.session, "requestID": request, "reply": reply}
        )
        status = "error" if reply == "reject" else "completed"
        self.bus.publish(
            "message.part.updated",
            {
                "sessionID": turn.session,
                "part": {**tool, "state": {"status": status, "input": {"command": command}}},
            },
        )
        return reply


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if not self.authorized("GET"):
            return
        if self.path.split("?")[0] == "/event":
            self.stream()
        else:
            self.answer("GET")

    def do_POST(self) -> None:
        if self.authorized("POST"):
            self.answer("POST")

    def authorized(self, method: str) -> bool:
        """Like the real server's ``ServerAuth``: with ``OPENCODE_SERVER_PASSWORD`` set, HTTP basic
        auth with ``OPENCODE_SERVER_USERNAME`` (default ``opencode``) on every route, or 401."""
        password = os.environ.get("OPENCODE_SERVER_PASSWORD")
        if not password:
            return True
        username = os.environ.get("OPENCODE_SERVER_USERNAME") or "opencode"
        expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        if hmac.compare_digest(self.headers.get("Authorization", ""), expected):
            return True
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        log(f"refused {method} {self.path.split('?')[0]}: no valid credentials")
        data = json.dumps({"name": "UnauthorizedError", "message": "Authentication required"})
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="Secure Area"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())
        return False

    def answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        status, payload = self.server.fake.route(method, self.path, body)
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def stream(self) -> None:
        fake = self.server.fake
        bus = fake.bus
        events = bus.subscribe()
        deadline = math.inf
        flag = fake.state_dir / "stream-dropped"
        if fake.drop_stream_once is not None and not flag.exists():
            flag.touch()
            deadline = time.monotonic() + fake.drop_stream_once
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.chunk(b'data: {"id":"evt_0","type":"server.connected","properties":{}}\n\n')
            while True:
                wait = min(HEARTBEAT_S, deadline - time.monotonic())
                if wait <= 0:
                    log("dropping the event stream")
                    self.wfile.write(b"0\r\n\r\n")  # the end of the chunked body
                    return
                try:
                    data = events.get(timeout=wait)
                except queue.Empty:
                    if time.monotonic() >= deadline or bus.muted.is_set():
                        continue
                    data = b'data: {"type":"server.heartbeat","properties":{}}\n\n'
                self.chunk(data)
        except OSError:
            pass  # the client went away
        finally:
            bus.unsubscribe(events)
            self.close_connection = True

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], fake: FakeServer) -> None:
        self.fake = fake
        super().__init__(address, Handler)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--port", type=int, default=4096)
    parser.add_argument("--hostname", default="127.0.0.1")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument(
        "--chatter", action="store_true", help="print lines that are not JSON on stdout"
    )
    parser.add_argument(
        "--drop-stream-once",
        type=float,
        metavar="S",
        help="end the first event stream after S seconds and go on serving",
    )
    parser.add_argument("--ignore-sigterm", action="store_true")
    options = parser.parse_args()
    if options.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    options.state_dir.mkdir(parents=True, exist_ok=True)
    fake = FakeServer(options.state_dir, options.drop_stream_once)
    server = Server((options.hostname, options.port), fake)
    time.sleep(options.startup_delay)
    if not os.environ.get("OPENCODE_SERVER_PASSWORD"):
        print("Warning: OPENCODE_SERVER_PASSWORD is not set; server is unsecured.", flush=True)
    if options.chatter:
        print("{not json at all", flush=True)
    host, port = server.server_address[:2]
    print(f"opencode server listening on http://{host}:{port}", flush=True)
    if options.chatter:
        print("INFO  later chatter on stdout", flush=True)
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
