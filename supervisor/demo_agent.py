"""Built-in demo agent: a real ACP v1 agent that needs no keys and no network.

Run it as ``python -m supervisor.demo_agent [options]``. It speaks
newline-delimited JSON-RPC 2.0 on stdin/stdout and logs only to stderr.

The reply to each prompt is a friendly sentence streamed word by word. Words in
the prompt text ("directives") make a single turn misbehave, so a test can
break one turn and check that the next one works:

``permission``
    Ask ``session/request_permission`` before a pretend tool call.
``crash``
    Exit with code 3 after three words.
``grandchildren``
    Leak background processes (a plain child, a grandchild in its own
    session, a child that ignores SIGTERM) and report their pids.
``garbage``
    Write non-JSON-RPC lines to stdout before the reply.
``huge``
    Write one 50 MiB line to stdout before the reply.
``flood``
    Stream the words with no delay.
``mute``
    After three words, close stdout but keep running (a hung agent).
``hang``
    After three words, say nothing more, as if the model never answered, while
    logging to stderr that it waits: a stalled turn (only a cancel ends it).
``tool=S``
    Run a pretend tool for S seconds before the reply: a tool call in progress,
    silent meanwhile, then its completion.
``write=NAME``
    Write the file NAME (a plain name: letters, digits, ``.``, ``-``, ``_``) in the session's
    working directory before the reply, holding the prompt's text: a turn that edits a file,
    for checkpoints and rewind. May be given more than once.
``fail``
    Answer the prompt with a JSON-RPC error after the reply.
``slow`` / ``fast``
    Use a delay of 0.3 s / 0.005 s per word.
``ignore-cancel``
    Ignore ``session/cancel`` for this turn.
``mcp``
    Reply with the session's MCP servers instead of the sentence: for each, whether it
    started, its ``serverInfo``, its tools, and the text its first tool answered (called with
    no arguments).
``words=N``, ``delay=S``, ``stop-delay=S``
    Per-turn overrides of the matching command-line options.

The command-line switches (see ``--help``) apply to every turn.

MCP: it takes stdio servers only (``mcpCapabilities`` says ``http`` and ``sse`` are not
supported) and really starts them at ``session/new`` and ``session/load``: it runs each command
with its args and env, does the MCP ``initialize`` handshake and lists its tools. A server that
fails to start is reported in the ``mcp`` reply and on stderr; the session opens anyway, as
real agents do.

Steering: it advertises ``_meta.steering.supported`` (unless ``--no-steering``) and answers
``_session/steering`` like claude-agent-acp: ``injected`` while a prompt runs (the reply then
says "Steered: <text>." and streams on), ``promptRequired`` when idle.

Sessions are kept in ``--state-dir`` (one JSON file each) for ``session/load`` after a
restart. The files are written in a worker thread, never by the loop that reads stdin: a disk
that takes its time holds up a file, never a ``session/cancel``. A turn, a new session and a
mode are answered once their file is on disk, so a kill right after the answer loses nothing.

This module is standalone on purpose: it imports only the standard library
and trio, never other modules of the ``supervisor`` package.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import trio

PROTOCOL_VERSION = 1
AGENT_NAME = "demo-agent"
AGENT_VERSION = "0.1"

# JSON-RPC 2.0 error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800

DEMO_SENTENCE = (
    "Hello! I am the demo agent of agent-supervisor. I need no keys and no "
    "network: I stream this friendly sentence word by word so that you can "
    "watch a turn run and stop it at any moment. Press Ctrl-C or send "
    "session/cancel and the supervisor ends the turn at once, cleanly and "
    "honestly."
)
DEMO_WORDS: tuple[str, ...] = tuple(DEMO_SENTENCE.split())

HUGE_LINE_BYTES = 50 * 1024 * 1024
HUGE_CHUNK_BYTES = 1024 * 1024
CRASH_AFTER_WORDS = 3
#: How the supervisor ends the conversation so far that it gives an agent whose session could
#: not be resumed, in front of the new message (``supervisor/runtime/context.py``'s
#: ``ENDING``): the directives are the new message's, never the earlier ones'.
CONTEXT_END = "\n\n(End of the conversation so far. The new message follows.)\n\n"
SLOW_DELAY = 0.3
FAST_DELAY = 0.005
HANG_LOG_INTERVAL = 0.1  # a hung turn's "still waiting" lines on stderr
#: The MCP revision we ask for; servers answer with the one they speak.
MCP_PROTOCOL_VERSION = "2025-06-18"
#: For an MCP server to start and answer ``initialize`` and ``tools/list`` (Codex waits 10 s,
#: Claude Code 30 s; an interpreter on a loaded machine can take seconds to start).
MCP_START_TIMEOUT = 20.0

PERMISSION_OPTIONS: list[dict[str, str]] = [
    {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
]
ALLOW_OPTION_IDS = frozenset({"allow-once", "allow-always", "allow_once", "allow_always"})

GARBAGE_LINES: tuple[bytes, ...] = (
    b"demo-agent: this line is plain text, not JSON\n",
    b"\xff\xfe\xfd this line is not even UTF-8 \xc3\x28\n",
    b'[1, 2, "a JSON array is not a JSON-RPC message"]\n',
    b'{"hello": "a JSON object that is not JSON-RPC"}\n',
    # JSON that decodes, nested too deep for whatever walks it next (refused at the door)
    b'{"deep": ' + b"[" * 981 + b"]" * 981 + b"}\n",
)

_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_STRIP_PUNCT = "\"'`.,;:!?()[]{}<>"

# Code of the leaked processes that the ``grandchildren`` directive spawns.
# Each one prints its pid once it is set up, then points stdout at /dev/null
# so that it holds no pipe of ours, then sleeps until it is killed.
_READY_AND_SLEEP = (
    "sys.stdout.write(str(os.getpid()) + '\\n')\n"
    "sys.stdout.flush()\n"
    "os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
    "while True:\n"
    "    time.sleep(1)\n"
)
_CHILD_PLAIN_CODE = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n" + _READY_AND_SLEEP
)
_CHILD_IGNORES_SIGTERM_CODE = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n" + _READY_AND_SLEEP
)
_GRANDCHILD_SETSID_CODE = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "os.setsid()\n" + _READY_AND_SLEEP
)
# The intermediate child starts the setsid grandchild with our pipe as its
# stdout (the grandchild reports its own pid), lets go of the pipe, reaps the
# grandchild if it dies, and then sleeps.
_INTERMEDIATE_CODE = (
    "import os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "p = subprocess.Popen([sys.executable, '-c', sys.argv[1]],"
    " stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
    "p.wait()\n"
    "while True:\n"
    "    time.sleep(1)\n"
)


def log(message: str) -> None:
    """Write one diagnostic line to stderr (never to stdout)."""
    try:
        sys.stderr.write(f"demo-agent: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class RpcError(Exception):
    """A JSON-RPC error to send back as the answer to a request."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Options:
    """Settings from the command line; they apply to every turn."""

    words: int = 40
    delay: float = 0.05
    stop_delay: float = 0.0
    ignore_cancel: bool = False
    ignore_sigterm: bool = False
    permission_watches_cancel: bool = False
    steering: bool = True
    #: advertise images, audio and embedded resources in prompts, and say what came
    content: bool = False
    #: offer session modes (``ask``, ``code``) and say in each turn's thought which one runs
    modes: bool = False
    #: advertise no ``loadSession``, as an agent that cannot resume its sessions: a respawn
    #: or a restart gets a fresh session (and the supervisor gives it the conversation so far)
    no_load: bool = False
    state_dir: str = field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "agent-supervisor-demo")
    )


@dataclass
class TurnPlan:
    """Per-turn behaviour chosen by the directives in the prompt text."""

    words: int
    delay: float
    stop_delay: float
    ignore_cancel: bool
    permission: bool = False
    crash: bool = False
    grandchildren: bool = False
    garbage: bool = False
    huge: bool = False
    flood: bool = False
    fail: bool = False
    mute: bool = False
    hang: bool = False
    tool: float | None = None
    mcp: bool = False
    #: files to write in the working directory (``write=NAME``)
    writes: list[str] = field(default_factory=list)


#: what ``write=NAME`` takes: a file right in the working directory, never a path out of it
_WRITE_NAME = re.compile(r"[a-z0-9_-][a-z0-9._-]{0,99}")


def _non_negative_float(text: str) -> float | None:
    """Parse a finite float >= 0, or return None."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def _recalled(earlier: str) -> str:
    """The sentence that shows the earlier conversation reached the agent: what the person
    said last in it."""
    last = earlier.rpartition("\n\nUser: ")[2].split("\n\n", 1)[0].strip()
    if len(last) > 80:
        last = last[:77] + "..."
    return f'(Given the earlier conversation: you last said "{last}".) '


def parse_directives(text: str, options: Options) -> TurnPlan:
    """Read the directives in a prompt's text and build the turn's plan."""
    plan = TurnPlan(
        words=options.words,
        delay=options.delay,
        stop_delay=options.stop_delay,
        ignore_cancel=options.ignore_cancel,
    )
    for raw in text.split():
        token = raw.strip(_STRIP_PUNCT).lower()
        key, sep, value = token.partition("=")
        key = key.replace("_", "-")
        if sep:
            if key == "words" and value.isdigit():
                plan.words = int(value)
            elif key == "write" and _WRITE_NAME.fullmatch(value):
                plan.writes.append(value)
            elif key in ("delay", "stop-delay", "tool"):
                number = _non_negative_float(value)
                if number is not None:
                    if key == "delay":
                        plan.delay = number
                    elif key == "tool":
                        plan.tool = number
                    else:
                        plan.stop_delay = number
            continue
        if key == "permission":
            plan.permission = True
        elif key == "crash":
            plan.crash = True
        elif key == "grandchildren":
            plan.grandchildren = True
        elif key == "garbage":
            plan.garbage = True
        elif key == "huge":
            plan.huge = True
        elif key == "flood":
            plan.flood = True
        elif key == "fail":
            plan.fail = True
        elif key == "mute":
            plan.mute = True
        elif key == "hang":
            plan.hang = True
        elif key == "mcp":
            plan.mcp = True
        elif key == "slow":
            plan.delay = SLOW_DELAY
        elif key == "fast":
            plan.delay = FAST_DELAY
        elif key == "ignore-cancel":
            plan.ignore_cancel = True
    return plan


@dataclass
class HistoryEntry:
    """One message of a session's history."""

    role: str  # "user" or "agent"
    text: str


class Turn:
    """A running prompt turn: its request id, cancel scope and state."""

    def __init__(self, request_id: Any, session: Session, plan: TurnPlan, text: str) -> None:
        self.request_id = request_id
        self.session = session
        self.plan = plan
        self.text = text
        #: what came in the prompt besides text, described (``--content``)
        self.received: list[str] = []
        self.scope = trio.CancelScope()
        self.cancel_requested = False
        self.outcome_cancelled = False
        self.open_tool_calls: list[str] = []
        self.pending_requests: list[int] = []
        self.reply_parts: list[str] = []
        self.done = trio.Event()
        #: steered texts not said yet (the stream says each at its next word)
        self.steers: list[str] = []
        #: said first: what the earlier conversation given with the prompt held
        self.recalled: str | None = None
        #: what a steer finds: ``speaking`` (its words stream: the text joins them),
        #: ``stuck`` (waiting on a model that does not answer: it cannot take it), or
        #: ``ending`` (its words are all said: the text must start a turn of its own)
        self.stage = "speaking"


class McpLink:
    """One stdio MCP server this agent started: newline-delimited JSON-RPC on its pipes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.status = "starting"
        self.server_info = ""
        self.tools: list[str] = []
        self.process: trio.Process | None = None
        self._buffer = bytearray()
        self._next_id = 1

    async def start(self, command: str, args: list[str], env: dict[str, str]) -> None:
        """Start the server and do the handshake; never raises: ``status`` says how it went."""
        try:
            with trio.fail_after(MCP_START_TIMEOUT):
                self.process = await trio.lowlevel.open_process(
                    [command, *args],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env={**os.environ, **env},
                )
                info = await self.request(
                    "initialize",
                    {
                        "protocolVersion": MCP_PROTOCOL_VERSION,
                        "capabilities": {},
                        "clientInfo": {"name": AGENT_NAME, "version": AGENT_VERSION},
                    },
                )
                server = info.get("serverInfo") if isinstance(info, dict) else None
                if isinstance(server, dict):
                    self.server_info = f"{server.get('name')} {server.get('version')}"
                await self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})
                listed = await self.request("tools/list", {})
                tools = listed.get("tools") if isinstance(listed, dict) else None
                self.tools = [
                    str(t.get("name")) for t in tools or [] if isinstance(t, dict) and "name" in t
                ]
            self.status = "connected"
        except trio.TooSlowError:
            self.status = f"failed: no answer within {MCP_START_TIMEOUT:g} s"
        except (OSError, RpcError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.status = f"failed: {exc}"
        log(f"MCP server {self.name}: {self.status}")

    async def call_first_tool(self) -> str:
        """The text the first tool answers when called with no arguments."""
        if self.status != "connected" or not self.tools:
            return "no tool called"
        try:
            with trio.fail_after(MCP_START_TIMEOUT):
                result = await self.request("tools/call", {"name": self.tools[0], "arguments": {}})
        except (trio.TooSlowError, OSError, RpcError, trio.BrokenResourceError) as exc:
            return f"{self.tools[0]} failed: {exc or 'no answer'}"
        content = result.get("content") if isinstance(result, dict) else None
        texts = [c.get("text", "") for c in content or [] if isinstance(c, dict)]
        return f"{self.tools[0]} said {' '.join(str(t) for t in texts)!r}"

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        request_id = self._next_id
        self._next_id += 1
        await self._write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:  # the server's own requests and notifications are not for this demo
            message = await self._read()
            if message.get("id") == request_id and "method" not in message:
                error = message.get("error")
                if isinstance(error, dict):
                    raise RpcError(int(error.get("code", 0)), str(error.get("message")))
                return message.get("result")

    async def _write(self, message: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        await self.process.stdin.send_all(_encode(message))

    async def _read(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        while b"\n" not in self._buffer:
            data = await self.process.stdout.receive_some(65536)
            if not data:
                raise OSError("the server closed its stdout")
            self._buffer += data
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            message = json.loads(line)
        except ValueError:
            return {}
        return message if isinstance(message, dict) else {}

    async def close(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            with trio.CancelScope(shield=True):
                await self.process.stdin.aclose()  # stdio servers exit on EOF
            self.process = None

    def summary(self) -> str:
        detail = f" ({self.server_info}; tools: {', '.join(self.tools) or 'none'})"
        return f"{self.name} {self.status}{detail if self.status == 'connected' else ''}"


@dataclass
class Session:
    """A session: its id, cwd and history of prompts and replies."""

    session_id: str
    cwd: str
    history: list[HistoryEntry] = field(default_factory=list)
    turn: Turn | None = None
    mcp: list[McpLink] = field(default_factory=list)
    mode: str = "ask"  # --modes


@dataclass
class _StateWrites:
    """One session's state writes: one at a time, in order; the newest snapshot written."""

    lock: trio.Lock = field(default_factory=trio.Lock)
    written: int = 0


@dataclass
class _Pending:
    """An agent→client request waiting for its answer."""

    event: trio.Event = field(default_factory=trio.Event)
    message: dict[str, Any] | None = None


def _encode(message: dict[str, Any]) -> bytes:
    """Serialise a message as one ASCII JSON line."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def _received(prompt: list[Any]) -> list[str]:
    """The prompt's blocks other than text, each in a few words: what ``--content`` says it
    got (a test reads it back)."""
    said: list[str] = []
    for block in prompt:
        kind = block.get("type")
        if kind in ("image", "audio"):
            size = len(base64.b64decode(block.get("data") or "", validate=False))
            said.append(f"{kind} {block.get('mimeType')} {size} bytes")
        elif kind == "resource_link":
            said.append(f"link {block.get('name')} {block.get('uri')}")
        elif kind == "resource":
            resource = block.get("resource") or {}
            body = "text" if isinstance(resource.get("text"), str) else "blob"
            said.append(f"resource {resource.get('uri')} ({body})")
    return said


def _text_of(prompt: Any) -> str:
    """Concatenate the text blocks of a prompt's ContentBlock list."""
    if not isinstance(prompt, list):
        raise RpcError(INVALID_PARAMS, "Invalid params: prompt must be a list of content blocks")
    parts: list[str] = []
    for block in prompt:
        if not isinstance(block, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: each content block must be an object")
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "".join(parts)


class DemoAgent:
    """The ACP agent: reads requests, runs turns and writes replies."""

    def __init__(
        self, options: Options, stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream
    ) -> None:
        self.options = options
        self.stdin = stdin
        self.stdout = stdout
        self.write_lock = trio.Lock()
        self.sessions: dict[str, Session] = {}
        self.pending: dict[int, _Pending] = {}
        self.next_request_id = 0
        self.next_tool_call = 1
        self.turns: set[Turn] = set()
        self.stdout_broken = False
        self._nursery: trio.Nursery | None = None
        #: where state writes run: outlives the turns' nursery, so what was asked is written
        self._saves: trio.Nursery | None = None
        self._save_count = 0
        self._state_writes: dict[str, _StateWrites] = {}

    # ----------------------------------------------------------- output

    async def write_chunks(self, chunks: Sequence[bytes]) -> None:
        """Write whole lines to stdout, one writer at a time, never cut short."""
        async with self.write_lock:
            if self.stdout_broken:
                return
            with trio.CancelScope(shield=True):
                try:
                    for chunk in chunks:
                        await self.stdout.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self.stdout_broken = True
                    log(f"stdout is gone ({exc!r}); shutting down")
                    self._shutdown()

    async def send(self, message: dict[str, Any]) -> None:
        """Write one JSON-RPC message (adds the "jsonrpc" field)."""
        await self.write_chunks([_encode({"jsonrpc": "2.0", **message})])

    async def respond(self, request_id: Any, result: Any) -> None:
        """Answer a request with a result."""
        await self.send({"id": request_id, "result": result})

    async def respond_error(self, request_id: Any, code: int, message: str) -> None:
        """Answer a request with an error."""
        await self.send({"id": request_id, "error": {"code": code, "message": message}})

    async def update(self, session_id: str, update: dict[str, Any]) -> None:
        """Send a session/update notification."""
        await self.send(
            {"method": "session/update", "params": {"sessionId": session_id, "update": update}}
        )

    async def request(self, turn: Turn, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send an agent→client request and wait for the client's answer."""
        request_id = self.next_request_id
        self.next_request_id += 1
        pending = _Pending()
        self.pending[request_id] = pending
        turn.pending_requests.append(request_id)
        try:
            await self.send({"id": request_id, "method": method, "params": params})
            if self.stdout_broken:
                self._abandon_pending()
            await pending.event.wait()
        finally:
            if pending.event.is_set():
                turn.pending_requests.remove(request_id)
                self.pending.pop(request_id, None)
        assert pending.message is not None
        return pending.message

    # ----------------------------------------------------------- state

    def _state_path(self, session_id: str) -> str:
        return os.path.join(self.options.state_dir, f"{session_id}.json")

    def save(self, session: Session) -> None:
        """Have the session's state as it is now written, without waiting for the disk.

        The snapshot is taken here; the file is written in a worker thread, so the read loop
        goes on reading (a ``session/cancel`` included) while a busy disk takes its time.
        Writes of one session go in order, and one overtaken by a newer snapshot is skipped."""
        assert self._saves is not None
        self._saves.start_soon(self._write_state, *self._snapshot(session))

    async def saved(self, session: Session) -> None:
        """Write the session's state as it is now, and return once it is on disk: for what is
        answered only once it would survive the process (a turn's end, a new session)."""
        await self._write_state(*self._snapshot(session))

    def _snapshot(self, session: Session) -> tuple[str, int, str]:
        self._save_count += 1
        data = {
            "sessionId": session.session_id,
            "cwd": session.cwd,
            "history": [{"role": e.role, "text": e.text} for e in session.history],
            "mode": session.mode,
        }
        return session.session_id, self._save_count, json.dumps(data)

    async def _write_state(self, session_id: str, number: int, text: str) -> None:
        writes = self._state_writes.setdefault(session_id, _StateWrites())
        # Shielded: a write asked for is made, also by a task cancelled on the way out.
        with trio.CancelScope(shield=True):
            async with writes.lock:  # FIFO: in the order they were asked
                if number <= writes.written:
                    return  # a newer snapshot is on disk already
                await trio.to_thread.run_sync(self._write_file, session_id, text)
                writes.written = number

    def _write_file(self, session_id: str, text: str) -> None:
        """Write one state file (atomic replace); in a worker thread."""
        try:
            os.makedirs(self.options.state_dir, exist_ok=True)
            path = self._state_path(session_id)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            log(f"could not save session {session_id}: {exc}")

    def load(self, session_id: str, cwd: str) -> Session | None:
        """Read a persisted session, or return None if there is none."""
        try:
            with open(self._state_path(session_id), encoding="utf-8") as fh:
                data = json.load(fh)
            history = [
                HistoryEntry(role=str(e["role"]), text=str(e["text"])) for e in data["history"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log(f"no usable saved state for session {session_id}: {exc!r}")
            return None
        mode = data.get("mode") if data.get("mode") in ("ask", "code") else "ask"
        return Session(session_id=session_id, cwd=cwd, history=history, mode=mode)

    # ----------------------------------------------------------- input

    async def run(self) -> None:
        """Serve until stdin closes or stdout breaks; then finish the state writes asked for."""
        async with trio.open_nursery() as saves:
            self._saves = saves
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._read_loop()
                await self._finish_turns()
                nursery.cancel_scope.cancel()

    def _shutdown(self) -> None:
        """Stop everything now (stdout broke)."""
        self._abandon_pending()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _abandon_pending(self) -> None:
        """Answer our own pending requests as cancelled, so no turn waits on them."""
        for request_id, pending in list(self.pending.items()):
            if not pending.event.is_set():
                pending.message = {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": REQUEST_CANCELLED, "message": "agent shutting down"},
                }
                pending.event.set()

    async def _finish_turns(self) -> None:
        """On stdin EOF: cancel every running turn and let it answer."""
        for turn in list(self.turns):
            turn.cancel_requested = True
            turn.scope.cancel()
        self._abandon_pending()
        with trio.move_on_after(2):
            for turn in list(self.turns):
                await turn.done.wait()
        if self.turns:
            # A write to a client that no longer reads can block for ever.
            log("turns did not finish after stdin closed; exiting anyway")
            _restore_blocking()
            os._exit(0)

    async def _read_loop(self) -> None:
        buffer = bytearray()
        while True:
            try:
                data = await self.stdin.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log(f"stdin read failed: {exc!r}")
                data = b""
            if not data:
                if buffer.strip():
                    await self._handle_line(bytes(buffer))
                log("stdin closed; exiting")
                return
            start = len(buffer)
            buffer += data
            search_from = start
            while True:
                newline = buffer.find(b"\n", search_from)
                if newline < 0:
                    break
                line = bytes(buffer[:newline])
                del buffer[: newline + 1]
                search_from = 0
                await self._handle_line(line)

    async def _handle_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            log(f"parse error: {exc}")
            await self.respond_error(None, PARSE_ERROR, f"Parse error: {exc}")
            return
        if not isinstance(message, dict):
            await self.respond_error(
                None, INVALID_REQUEST, "Invalid Request: expected a JSON object"
            )
            return
        has_id = "id" in message
        request_id = message.get("id")
        if message.get("jsonrpc") != "2.0":
            if has_id:
                await self.respond_error(
                    request_id, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"'
                )
            else:
                log(f"dropping message without jsonrpc 2.0: {line[:200]!r}")
            return
        method = message.get("method")
        if method is None:
            if has_id and ("result" in message or "error" in message):
                self._handle_response(message)
            else:
                await self.respond_error(
                    request_id if has_id else None, INVALID_REQUEST, "Invalid Request"
                )
            return
        if not isinstance(method, str):
            if has_id:
                await self.respond_error(request_id, INVALID_REQUEST, "Invalid Request: bad method")
            return
        params = message.get("params")
        if params is None:
            params = {}
        if has_id:
            await self._handle_request(request_id, method, params)
        else:
            await self._handle_notification(method, params)

    def _handle_response(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        pending = self.pending.get(request_id) if isinstance(request_id, int) else None
        if pending is None or pending.event.is_set():
            log(f"ignoring response to unknown request id {request_id!r}")
            return
        pending.message = message
        pending.event.set()

    async def _handle_notification(self, method: str, params: Any) -> None:
        if method == "session/cancel":
            self._cancel(params)
        else:
            log(f"ignoring notification {method}")

    async def _handle_request(self, request_id: Any, method: str, params: Any) -> None:
        try:
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "Invalid params: params must be an object")
            if method == "initialize":
                await self.respond(request_id, self._initialize(params))
            elif method == "session/new":
                result, session = await self._session_new(params)
                assert self._saves is not None
                self._saves.start_soon(self._answer_once_saved, request_id, result, session)
            elif method == "session/load":
                await self._session_load(request_id, params)
            elif method == "session/prompt":
                self._session_prompt(request_id, params)
            elif method == "_session/steering" and self.options.steering:
                await self.respond(request_id, self._steer(params))
            elif method == "session/set_mode" and self.options.modes:
                session = self._set_mode(params)
                assert self._saves is not None
                self._saves.start_soon(self._answer_once_saved, request_id, {}, session)
            else:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        except RpcError as exc:
            await self.respond_error(request_id, exc.code, exc.message)

    # ----------------------------------------------------------- methods

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        if asked != PROTOCOL_VERSION:
            log(f"client asked for protocol version {asked!r}; answering {PROTOCOL_VERSION}")
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": not self.options.no_load,
                "promptCapabilities": {
                    "image": self.options.content,
                    "audio": self.options.content,
                    "embeddedContext": self.options.content,
                },
                "mcpCapabilities": {"http": False, "sse": False},
            },
            "agentInfo": {"name": AGENT_NAME, "version": AGENT_VERSION},
            "authMethods": [],
            **({"_meta": {"steering": {"supported": True}}} if self.options.steering else {}),
        }

    def _steer(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions.get(self._session_id(params))
        if session is None:
            raise RpcError(INVALID_PARAMS, "Invalid params: unknown session")
        text = _text_of(params.get("prompt"))
        if not text:
            raise RpcError(INVALID_PARAMS, "Invalid params: steer params require a prompt")
        if session.turn is None or session.turn.stage == "ending":
            return {"outcome": "promptRequired", "reason": "noRunningTurn"}
        if session.turn.stage == "stuck":
            raise RpcError(INTERNAL_ERROR, "the turn waits on the model: it cannot take a steer")
        log(f"steered in {session.session_id}: {text[:80]!r}")
        session.turn.steers.append(text)
        session.history.append(HistoryEntry("user", text))
        return {"outcome": "injected"}

    @staticmethod
    def _cwd(params: dict[str, Any]) -> str:
        cwd = params.get("cwd")
        if not isinstance(cwd, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: cwd must be a string")
        return cwd

    @staticmethod
    def _mcp_servers(params: dict[str, Any]) -> list[dict[str, Any]]:
        servers = params.get("mcpServers", [])
        if not isinstance(servers, list) or not all(isinstance(s, dict) for s in servers):
            raise RpcError(INVALID_PARAMS, "Invalid params: mcpServers must be a list of objects")
        for server in servers:
            if server.get("type", "stdio") != "stdio":
                raise RpcError(
                    INVALID_PARAMS,
                    f"Invalid params: MCP server {server.get('name')!r} is"
                    f" {server.get('type')}; this agent takes stdio servers only",
                )
            env = server.get("env", [])
            if (
                not isinstance(server.get("name"), str)
                or not isinstance(server.get("command"), str)
                or not isinstance(server.get("args", []), list)
                or not isinstance(env, list)
                or not all(isinstance(e, dict) for e in env)
            ):
                raise RpcError(INVALID_PARAMS, "Invalid params: a malformed stdio MCP server")
        return servers

    async def _connect_mcp(self, session: Session, servers: list[dict[str, Any]]) -> None:
        """Start every server of ``session`` (again, after a load), at once."""
        for link in session.mcp:
            await link.close()
        session.mcp = [McpLink(str(server["name"])) for server in servers]
        async with trio.open_nursery() as nursery:
            for link, server in zip(session.mcp, servers, strict=True):
                env = {str(e.get("name")): str(e.get("value")) for e in server.get("env", [])}
                args = [str(a) for a in server.get("args", [])]
                nursery.start_soon(link.start, str(server["command"]), args, env)
        assert self._nursery is not None
        for link in session.mcp:
            if link.process is not None:
                self._nursery.start_soon(link.process.wait)  # reap it when it exits

    def _session_id(self, params: dict[str, Any]) -> str:
        session_id = params.get("sessionId")
        if not isinstance(session_id, str) or not _SESSION_ID_RE.match(session_id):
            raise RpcError(INVALID_PARAMS, f"Invalid params: bad sessionId {session_id!r}")
        return session_id

    async def _answer_once_saved(self, request_id: Any, result: Any, session: Session) -> None:
        """Answer once the session's state is on disk, without holding up the read loop."""
        await self.saved(session)
        await self.respond(request_id, result)

    async def _session_new(self, params: dict[str, Any]) -> tuple[dict[str, Any], Session]:
        cwd = self._cwd(params)
        servers = self._mcp_servers(params)
        session = Session(session_id=f"demo-{secrets.token_hex(8)}", cwd=cwd)
        await self._connect_mcp(session, servers)
        self.sessions[session.session_id] = session
        log(f"new session {session.session_id}")
        return {"sessionId": session.session_id, **self._modes(session)}, session

    def _modes(self, session: Session) -> dict[str, Any]:
        if not self.options.modes:
            return {}
        available = [
            {"id": "ask", "name": "Ask", "description": "Answer, change nothing"},
            {"id": "code", "name": "Code"},
        ]
        return {"modes": {"currentModeId": session.mode, "availableModes": available}}

    def _set_mode(self, params: dict[str, Any]) -> Session:
        session = self.sessions.get(self._session_id(params))
        if session is None:
            raise RpcError(INVALID_PARAMS, "Invalid params: unknown session")
        mode = params.get("modeId")
        if mode not in ("ask", "code"):
            raise RpcError(INVALID_PARAMS, f"Invalid params: no mode {mode!r}")
        session.mode = mode
        log(f"session {session.session_id} in mode {mode}")
        return session

    async def _session_load(self, request_id: Any, params: dict[str, Any]) -> None:
        cwd = self._cwd(params)
        servers = self._mcp_servers(params)
        session_id = self._session_id(params)
        session = self.sessions.get(session_id) or self.load(session_id, cwd)
        if session is None:
            raise RpcError(INVALID_PARAMS, f"Invalid params: unknown session {session_id}")
        session.cwd = cwd
        await self._connect_mcp(session, servers)
        self.sessions[session_id] = session
        log(f"loading session {session_id}: replaying {len(session.history)} messages")
        for entry in list(session.history):
            kind = "user_message_chunk" if entry.role == "user" else "agent_message_chunk"
            await self.update(
                session_id,
                {"sessionUpdate": kind, "content": {"type": "text", "text": entry.text}},
            )
        await self.respond(request_id, self._modes(session))

    def _session_prompt(self, request_id: Any, params: dict[str, Any]) -> None:
        session_id = params.get("sessionId")
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise RpcError(INVALID_PARAMS, f"Invalid params: unknown session {session_id!r}")
        text = _text_of(params.get("prompt"))
        received = _received(params["prompt"])
        if not self.options.content:
            for block in params["prompt"]:
                if block.get("type") in ("image", "audio", "resource"):
                    raise RpcError(
                        INVALID_PARAMS,
                        f"Invalid params: {block.get('type')} content is not advertised",
                    )
        if session.turn is not None:
            raise RpcError(
                INVALID_PARAMS,
                f"Invalid params: a prompt is already running in session {session.session_id}",
            )
        # Register the turn now, before reading the next line, so that a
        # session/cancel sent right after the prompt finds it.
        earlier, _, own = text.rpartition(CONTEXT_END)
        turn = Turn(request_id, session, parse_directives(own, self.options), text)
        turn.received = received
        if earlier:
            turn.recalled = _recalled(earlier)
        session.turn = turn
        self.turns.add(turn)
        session.history.append(HistoryEntry("user", text))
        self.save(session)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_turn, turn)

    def _cancel(self, params: Any) -> None:
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        turn = session.turn if session is not None else None
        if turn is None:
            log(f"session/cancel for {session_id!r} while idle: ignored")
            return
        if turn.plan.ignore_cancel:
            log(f"session/cancel for {session_id} ignored as asked (--ignore-cancel)")
            return
        if turn.cancel_requested:
            return
        turn.cancel_requested = True
        if turn.plan.stop_delay > 0:
            log(f"session/cancel for {session_id}: stopping in {turn.plan.stop_delay} s")
            assert self._nursery is not None
            self._nursery.start_soon(self._cancel_later, turn)
        else:
            log(f"session/cancel for {session_id}: stopping now")
            turn.scope.cancel()

    async def _cancel_later(self, turn: Turn) -> None:
        await trio.sleep(turn.plan.stop_delay)
        turn.scope.cancel()

    # ----------------------------------------------------------- turns

    async def _run_turn(self, turn: Turn) -> None:
        session_id = turn.session.session_id
        log(f"turn started in {session_id} (request id {turn.request_id!r})")
        try:
            with turn.scope:
                await self._turn_body(turn)
            cancelled = (
                turn.cancel_requested or turn.outcome_cancelled or turn.scope.cancelled_caught
            )
            # Pending updates go out before the prompt's answer.
            for call_id in turn.open_tool_calls:
                await self.update(
                    session_id,
                    {
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": call_id,
                        "status": "failed",
                    },
                )
            for request_id in list(turn.pending_requests):
                pending = self.pending.pop(request_id, None)
                if pending is not None and not pending.event.is_set():
                    await self.send(
                        {"method": "$/cancel_request", "params": {"requestId": request_id}}
                    )
            if turn.reply_parts:
                turn.session.history.append(HistoryEntry("agent", "".join(turn.reply_parts)))
            await self.saved(turn.session)  # what the answer ends would survive a kill now
            turn.session.turn = None
            if turn.plan.fail and not cancelled:
                await self.respond_error(turn.request_id, INTERNAL_ERROR, "demo failure as asked")
                stop = "error"
            else:
                stop = "cancelled" if cancelled else "end_turn"
                await self.respond(turn.request_id, {"stopReason": stop})
            log(f"turn ended in {session_id}: {stop}")
        finally:
            if turn.session.turn is turn:
                turn.session.turn = None
            self.turns.discard(turn)
            turn.done.set()

    async def _turn_body(self, turn: Turn) -> None:
        plan = turn.plan
        sid = turn.session.session_id
        shown = turn.text if len(turn.text) <= 200 else turn.text[:200] + "..."
        if self.options.modes:
            shown = f"[mode {turn.session.mode}] {shown}"
        if turn.received:
            said = "received: " + "; ".join(turn.received) + "\n"
            await self.update(
                sid,
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": said}},
            )
        await self.update(
            sid,
            {
                "sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": f"Thinking about: {shown}"},
            },
        )
        await self._plan(sid, "in_progress")
        if plan.garbage:
            await self.write_chunks(list(GARBAGE_LINES))
        if plan.huge:
            await self._write_huge()
        if plan.grandchildren:
            await self._spawn_grandchildren(turn)
        if plan.permission:
            if not await self._ask_permission(turn):
                turn.stage = "ending"  # refused: nothing more is said
                return
        if plan.writes:
            await trio.to_thread.run_sync(_write_files, turn.session.cwd, plan.writes, turn.text)
        if plan.tool is not None:
            await self._run_tool(turn, plan.tool)
        await self._stream(turn)

    async def _stream(self, turn: Turn) -> None:
        plan = turn.plan
        words = DEMO_WORDS
        count = plan.words
        if plan.mcp:
            parts = []
            for link in turn.session.mcp:
                parts.append(f"{link.summary()}, {await link.call_first_tool()}.")
            words = tuple(f"MCP servers: {' '.join(parts) or 'none.'}".split())
            count = len(words)
        for index in range(count):
            if plan.flood:
                await trio.sleep(0)
            else:
                await trio.sleep(plan.delay)
            word = words[index % len(words)] + " "
            if turn.recalled is not None:
                word, turn.recalled = turn.recalled + word, None
            while turn.steers:
                word = f"Steered: {turn.steers.pop(0)}. " + word
            await self.update(
                turn.session.session_id,
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": word}},
            )
            turn.reply_parts.append(word)
            if (plan.crash or plan.mute or plan.hang) and index + 1 >= CRASH_AFTER_WORDS:
                break
        # No word is said from here on: a steer that came now would never be.
        turn.stage = "stuck" if plan.hang or plan.mute else "ending"
        if not (plan.crash or plan.hang or plan.mute):
            await self._plan(turn.session.session_id, "completed")  # (a plan a turn ends with)
        if plan.crash:
            _crash()
        if plan.hang:
            while True:  # until the turn is cancelled
                log("waiting for the model to answer")
                await trio.sleep(HANG_LOG_INTERVAL)
        if plan.mute:
            log("closing stdout and hanging, as asked")
            await self.stdout.aclose()
            os.close(1)
            await trio.sleep_forever()

    async def _plan(self, session_id: str, reply: str) -> None:
        """The turn's plan: the prompt read, the reply in the status ``reply``."""
        await self.update(
            session_id,
            {
                "sessionUpdate": "plan",
                "entries": [
                    {"content": "Read the prompt", "priority": "high", "status": "completed"},
                    {
                        "content": "Stream a friendly reply word by word",
                        "priority": "medium",
                        "status": reply,
                    },
                ],
            },
        )

    async def _run_tool(self, turn: Turn, seconds: float) -> None:
        """A pretend tool that runs ``seconds`` and says nothing meanwhile."""
        sid = turn.session.session_id
        call_id = f"call_{self.next_tool_call}"
        self.next_tool_call += 1
        await self.update(
            sid,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": f"Run `sleep {seconds:g}`",
                "kind": "execute",
                "status": "in_progress",
                "rawInput": {"command": f"sleep {seconds:g}"},
            },
        )
        turn.open_tool_calls.append(call_id)
        await trio.sleep(seconds)
        turn.open_tool_calls.remove(call_id)
        await self.update(
            sid,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "status": "completed",
                "rawOutput": {"stdout": "", "exitCode": 0},
            },
        )

    async def _write_huge(self) -> None:
        """Write one JSON line of about 50 MiB, in 1 MiB chunks."""
        head = b'{"jsonrpc":"2.0","method":"_demo/huge","params":{"data":"'
        chunk = b"x" * HUGE_CHUNK_BYTES
        count = HUGE_LINE_BYTES // HUGE_CHUNK_BYTES
        await self.write_chunks([head, *([chunk] * count), b'"}}\n'])

    async def _ask_permission(self, turn: Turn) -> bool:
        """Run the pretend tool behind a permission request; False ends the turn."""
        sid = turn.session.session_id
        call_id = f"call_{self.next_tool_call}"
        self.next_tool_call += 1
        tool_call = {
            "toolCallId": call_id,
            "title": "Run `echo hello`",
            "kind": "execute",
            "status": "pending",
            "rawInput": {"command": "echo hello"},
        }
        await self.update(sid, {"sessionUpdate": "tool_call", **tool_call})
        turn.open_tool_calls.append(call_id)
        params = {"sessionId": sid, "toolCall": tool_call, "options": PERMISSION_OPTIONS}
        if self.options.permission_watches_cancel:
            answer = await self.request(turn, "session/request_permission", params)
        else:
            # Like Gemini: wait for the answer without watching the cancel.
            with trio.CancelScope(shield=True):
                answer = await self.request(turn, "session/request_permission", params)
        outcome = _permission_outcome(answer)
        log(f"permission answer for {call_id}: {outcome}")
        if outcome == "cancelled":
            turn.outcome_cancelled = True
            return False
        await trio.lowlevel.checkpoint_if_cancelled()
        if outcome == "allow":
            update = {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "status": "completed",
                "content": [{"type": "content", "content": {"type": "text", "text": "hello"}}],
                "rawOutput": {"stdout": "hello\n", "exitCode": 0},
            }
        else:
            update = {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "status": "failed",
                "content": [
                    {
                        "type": "content",
                        "content": {"type": "text", "text": "The user rejected the tool call."},
                    }
                ],
            }
        turn.open_tool_calls.remove(call_id)
        await self.update(sid, update)
        return True

    async def _spawn_grandchildren(self, turn: Turn) -> None:
        """Leak background processes on purpose and report their pids."""
        sid = turn.session.session_id
        call_id = f"call_{self.next_tool_call}"
        self.next_tool_call += 1
        with trio.CancelScope(shield=True):
            with trio.fail_after(20):
                child = await self._spawn_reporting([sys.executable, "-c", _CHILD_PLAIN_CODE])
                middle = await self._spawn_reporting(
                    [sys.executable, "-c", _INTERMEDIATE_CODE, _GRANDCHILD_SETSID_CODE]
                )
                stubborn = await self._spawn_reporting(
                    [sys.executable, "-c", _CHILD_IGNORES_SIGTERM_CODE]
                )
        child_pid, middle_pid, stubborn_pid = child[1], middle[0].pid, stubborn[1]
        grandchild_pid = middle[1]
        pids = [child_pid, middle_pid, grandchild_pid, stubborn_pid]
        log(f"leaked background processes {pids}")
        await self.update(
            sid,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": "Start background processes",
                "kind": "execute",
                "status": "completed",
                "rawInput": {"command": "spawn leaked background processes"},
                "rawOutput": {
                    "pids": pids,
                    "child": child_pid,
                    "intermediate": middle_pid,
                    "setsidGrandchild": grandchild_pid,
                    "ignoresSigterm": stubborn_pid,
                },
                "content": [
                    {
                        "type": "content",
                        "content": {
                            "type": "text",
                            "text": "Started background processes (left running on purpose): "
                            + ", ".join(str(p) for p in pids),
                        },
                    }
                ],
            },
        )

    async def _spawn_reporting(self, argv: list[str]) -> tuple[trio.Process, int]:
        """Start a process that prints a pid line once it is ready; reap it later."""
        proc = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        data = b""
        while b"\n" not in data:
            more = await proc.stdout.receive_some(256)
            if not more:
                break
            data += more
        await proc.stdout.aclose()
        try:
            reported = int(data.split(b"\n", 1)[0])
        except ValueError:
            reported = proc.pid
        assert self._nursery is not None
        self._nursery.start_soon(proc.wait)  # reap it when it dies
        return proc, reported


def _write_files(cwd: str, names: list[str], text: str) -> None:
    """``write=NAME``: each file holds the prompt's text (run in a worker thread)."""
    for name in names:
        with open(os.path.join(cwd, name), "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        log(f"wrote {name} in {cwd}")


def _permission_outcome(answer: dict[str, Any]) -> str:
    """Map the client's answer to "allow", "reject" or "cancelled"."""
    error = answer.get("error")
    if error is not None:
        code = error.get("code") if isinstance(error, dict) else None
        return "cancelled" if code == REQUEST_CANCELLED else "reject"
    result = answer.get("result")
    outcome = result.get("outcome") if isinstance(result, dict) else None
    if not isinstance(outcome, dict):
        return "reject"
    if outcome.get("outcome") == "cancelled":
        return "cancelled"
    if outcome.get("outcome") == "selected" and outcome.get("optionId") in ALLOW_OPTION_IDS:
        return "allow"
    return "reject"


def _restore_blocking() -> None:
    """Undo O_NONBLOCK that FdStream set on the shared stdin/stdout descriptions."""
    for fd in (0, 1):
        try:
            os.set_blocking(fd, True)
        except OSError:
            pass


def _crash() -> NoReturn:
    log("crashing as asked")
    os._exit(3)


def _on_sigterm(signum: int, frame: object) -> None:
    os.write(2, b"demo-agent: SIGTERM received; exiting\n")
    os._exit(143)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Parse the command line into Options."""
    defaults = Options()
    parser = argparse.ArgumentParser(
        prog="python -m supervisor.demo_agent",
        description="Demo ACP v1 agent on stdio (no keys, no network). "
        "Prompt directives: permission crash grandchildren garbage huge flood fail mute "
        "hang mcp slow fast ignore-cancel words=N delay=S stop-delay=S tool=S write=NAME.",
    )
    parser.add_argument(
        "--words", type=int, default=defaults.words, help="words per reply (default 40)"
    )
    parser.add_argument(
        "--delay", type=float, default=defaults.delay, help="seconds between words (default 0.05)"
    )
    parser.add_argument(
        "--stop-delay",
        type=float,
        default=defaults.stop_delay,
        help="seconds to keep streaming after session/cancel (default 0)",
    )
    parser.add_argument(
        "--ignore-cancel",
        action="store_true",
        help="ignore session/cancel; turns end with end_turn",
    )
    parser.add_argument(
        "--ignore-sigterm", action="store_true", help="ignore SIGTERM from the start"
    )
    parser.add_argument(
        "--permission-watches-cancel",
        action="store_true",
        help="let session/cancel end a turn that waits for a permission answer",
    )
    parser.add_argument(
        "--no-steering",
        action="store_true",
        help="do not advertise or answer _session/steering (the supervisor then interrupts)",
    )
    parser.add_argument(
        "--content",
        action="store_true",
        help="take images, audio and embedded resources in prompts (and say what came)",
    )
    parser.add_argument(
        "--modes",
        action="store_true",
        help="offer session modes ask and code (session/set_mode); thoughts name the mode",
    )
    parser.add_argument(
        "--no-load",
        action="store_true",
        help="advertise no loadSession, as an agent that cannot resume its sessions",
    )
    parser.add_argument(
        "--state-dir",
        default=defaults.state_dir,
        help="where sessions are saved (default $TMPDIR/agent-supervisor-demo)",
    )
    ns = parser.parse_args(argv)
    if ns.words < 0 or ns.delay < 0 or ns.stop_delay < 0:
        parser.error("--words, --delay and --stop-delay must not be negative")
    return Options(
        words=ns.words,
        delay=ns.delay,
        stop_delay=ns.stop_delay,
        ignore_cancel=ns.ignore_cancel,
        ignore_sigterm=ns.ignore_sigterm,
        permission_watches_cancel=ns.permission_watches_cancel,
        steering=not ns.no_steering,
        content=ns.content,
        modes=ns.modes,
        no_load=ns.no_load,
        state_dir=ns.state_dir,
    )


async def amain(options: Options) -> None:
    """Serve ACP on this process's stdin and stdout."""
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    try:
        await DemoAgent(options, stdin, stdout).run()
    finally:
        with trio.CancelScope(shield=True):
            await stdin.aclose()
            await stdout.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    options = parse_args(argv)
    if options.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _on_sigterm)
    log(f"started (pid {os.getpid()}, state dir {options.state_dir})")
    try:
        trio.run(amain, options)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        _restore_blocking()
    return 0


if __name__ == "__main__":
    sys.exit(main())
