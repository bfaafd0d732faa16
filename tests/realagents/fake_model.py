"""A scripted fake model server for the real agent CLIs (stdlib only, runs in a thread).

It speaks the four wire formats the agents call (``shared/real-agents.md``):

- ``POST /v1/responses`` (OpenAI Responses SSE): codex-acp, Codex app-server;
- ``POST /v1/messages`` (Anthropic Messages SSE): claude-agent-acp, Claude Code;
- ``POST /v1/chat/completions`` (OpenAI chat completions SSE): OpenCode, Qwen Code, aider;
- ``POST /v1beta/models/M:streamGenerateContent?alt=sse`` and ``:generateContent``: Gemini CLI.

What it answers is decided by the newest user text of the request (the last of the words below
that appears in it), so a test steers the model by its prompt:

- ``quick``: a short answer at once;
- ``stream``: a token every 200 ms for 60 s (to a request that does not stream, all of them at
  the end), only when the request carries tools (side requests such as titles or routers stay
  fast), or names :data:`AGENT_LOOP_MODEL`;
- ``shell``: a tool call running :data:`SHELL_COMMAND` (long-running, harmless);
- ``briefshell``: the same call running :data:`BRIEF_SHELL_COMMAND`, which ends by itself within
  seconds (exit 124): for a turn that must get past its tool call (a steer that waits for it);
- ``editshell``: a tool call running :data:`EDIT_SHELL_COMMAND`, which edits, creates and
  deletes files in the working directory, then waits as ``shell`` does (a turn to stop once
  its edits are made); ``editbrief``: :data:`EDIT_BRIEF_COMMAND`, the same edits and no wait;
- ``permission``: a tool call running :data:`PERMISSION_COMMAND`, which each agent's
  configuration leaves needing approval (Codex: ``sandbox_permissions: require_escalated``).
- ``mcpcall``: a call, with no arguments, of the offered tool whose name ends with
  :data:`MCP_TOOL` (the tests' own MCP server's, ``tests/fakes/mcp_server.py``, as the agent
  names it: ``mcp__SERVER__marker_ping``); a short text saying so when no such tool is offered.
- ``background`` (Anthropic Messages only): a ``Bash`` call with ``run_in_background: true``
  running :data:`BACKGROUND_COMMAND`; ``bgagent``: an ``Agent`` call (``Task`` on CLIs that
  name it so) with ``run_in_background: true`` whose prompt is ``stream``, so the sub-agent
  streams tokens. The result of either call (the CLI answers at once, the task runs on) is
  answered with the ``stream`` token stream: the turn keeps running while the task does.
- ``subagent`` (OpenAI Responses, Codex only): a ``spawn_agent`` call whose task is ``stream``
  (the child streams), then ``wait_agent``; ``setgoal``: a ``create_goal`` call, then the
  ``stream`` token stream (:meth:`_Writer.codex_call`). A trailing ``agent_message`` item (a
  Codex sub-agent's task) counts as the newest user text. ``goalrun`` and ``goalstream``: a
  ``create_goal`` call, then a short answer, so the turn completes with the goal active and
  Codex starts goal turns by itself (their newest user text is Codex's own
  :data:`GOAL_CONTINUATION`): under ``goalrun`` the model answers the first goal turns
  shortly and in goal turn :data:`GOAL_RUN_TURNS` calls ``update_goal {status: "complete"}``;
  under ``goalstream`` every goal turn is the ``stream`` token stream.

When the newest message of the conversation is a tool result, the model logs it
(:attr:`Exchange.tool_result`) and answers with a short text: so a test can tell whether a tool
ever ran to completion and was reported back.

Every request is logged as an :class:`Exchange`, and so is the moment a streaming client went
away: while it waits between tokens, the server polls the socket, so ``disconnected_at`` is
when the agent really stopped listening, not when the next write failed.
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

from realagents.local_http import LocalServer, ServedFake

__all__ = [
    "BACKGROUND_COMMAND",
    "BRIEF_SHELL_COMMAND",
    "EDIT_BRIEF_COMMAND",
    "EDIT_SHELL_COMMAND",
    "AGENT_LOOP_MODEL",
    "MCP_TOOL",
    "PERMISSION_COMMAND",
    "SHELL_COMMAND",
    "Exchange",
    "FakeModel",
]

#: Long enough to outlive every bound of a test, short enough to end by itself if anything
#: leaks; ``timeout`` (not a bare ``sleep``, which Claude Code refuses to run in the
#: foreground) keeps it bounded.
SHELL_COMMAND = "timeout 29.7 tail -f /dev/null"
#: The command of the ``briefshell`` scenario: over by itself in a few seconds (exit 124), so a
#: turn gets past it; distinct from the others, so psutil can tell it apart.
BRIEF_SHELL_COMMAND = "timeout 3.1 tail -f /dev/null"
#: What the ``editshell`` and ``editbrief`` commands do to the working directory (the checkpoint
#: tests, ``tests/real/test_real_checkpoints.py``, lay it out): append to ``edit-me.txt``,
#: create ``created.txt``, delete ``doomed.txt``, and append to ``build.log``, which the
#: directory's ``.gitignore`` ignores.
EDITS = (
    "printf 'edited by the turn\\n' >> edit-me.txt"
    " && printf 'made by the turn\\n' > created.txt"
    " && rm doomed.txt"
    " && printf 'logged by the turn\\n' >> build.log"
)
#: ``editshell``'s command: the edits, then a wait distinct from the others' (psutil tells them
#: apart) that outlives every bound of a test.
EDIT_SHELL_COMMAND = f"{EDITS} && timeout 28.7 tail -f /dev/null"
#: ``editbrief``'s command: the edits, and done.
EDIT_BRIEF_COMMAND = f"{EDITS} && echo edits-done"
#: The command of the permission scenario: distinct, so the agents' allow rules for
#: :data:`SHELL_COMMAND` do not cover it and psutil can tell the two apart.
PERMISSION_COMMAND = "touch permission-command-ran && timeout 29.3 tail -f /dev/null"
#: The command of the ``background`` scenario (Claude Code's ``run_in_background``): distinct
#: from the others, so psutil can tell it apart.
BACKGROUND_COMMAND = "timeout 28.9 tail -f /dev/null"

#: What starts the newest user text of a goal turn Codex 0.171 starts by itself.
GOAL_CONTINUATION = '<codex_internal_context source="goal">'
#: The goal turn in which ``goalrun``'s model marks its goal complete.
GOAL_RUN_TURNS = 2

#: A chat-completions request naming this model counts as one of an agent's turns, as if it
#: carried tools: aider offers the model no tools (it reads edits out of the text), and its side
#: requests (summaries, commit messages) go to its weak model, named otherwise.
AGENT_LOOP_MODEL = "fake-agent-loop"

STREAM_INTERVAL_S = 0.2
STREAM_DURATION_S = 60.0
QUICK_TEXT = "Quick answer from the fake model."
AFTER_TOOL_TEXT = "The command finished."
SCENARIOS = (
    "quick",
    "stream",
    "shell",
    "briefshell",
    "editshell",
    "editbrief",
    "permission",
    "mcpcall",
)
#: The tool of the tests' MCP server (``tests/fakes/mcp_server.py``) the ``mcpcall`` scenario calls.
MCP_TOOL = "marker_ping"
NO_MCP_TOOL_TEXT = "No MCP tool was offered."
#: A deferred MCP tool's name as an agent's prompt lists it (Qwen Code: ``mcp__marker__...``).
_DEFERRED_MCP_TOOL = re.compile(r"mcp__[A-Za-z0-9_-]*" + MCP_TOOL)
#: Claude Code only (``messages``): its background tasks (see the module docstring).
CLAUDE_BACKGROUND_SCENARIOS = ("background", "bgagent")
#: Codex only (``responses``): a sub-agent, a goal (see :meth:`_Writer.codex_call`).
CODEX_SCENARIOS = ("subagent", "setgoal", "goalrun", "goalstream")
_SCENARIO_RE = re.compile(
    r"\b(" + "|".join(SCENARIOS + CLAUDE_BACKGROUND_SCENARIOS + CODEX_SCENARIOS) + r")\b"
)


@attrs.define
class Exchange:
    """One request to the fake model, and what became of it."""

    id: int
    api: str  # responses | messages | chat | gemini | gemini-json | other
    method: str
    path: str
    started_at: float  # time.monotonic()
    scenario: str | None = None
    has_tools: bool = False  # it carried tools, or named AGENT_LOOP_MODEL: an agent's turn
    stream: bool = False
    user_text: str = ""
    tool_result: dict[str, Any] | None = None  # {"call_id", "output"} when a tool result came in
    tool_call: dict[str, Any] | None = None  # the call we answered with
    tokens_sent: int = 0
    ended_at: float | None = None
    disconnected_at: float | None = None  # the client went away before we were done
    error: str | None = None
    body: Any = None
    goal_turn: bool = False  # a goal turn's request (Codex's GOAL_CONTINUATION)

    @property
    def slow_tokens(self) -> bool:
        """A request we answer with the slow tokens: streamed, or (a request that does not
        stream) held until the last is made, ``tokens_sent`` counting them."""
        return self.scenario == "stream" and self.has_tools and self.api != "gemini-json"

    @property
    def streaming_tokens(self) -> bool:
        """A request we answered with the slow token stream."""
        return self.slow_tokens and self.stream


class FakeModel(ServedFake):
    """The server. ``with FakeModel() as model:``; ``model.base_url`` is ``http://127.0.0.1:P``.

    ``listener`` is an already listening TCP socket to serve on (one created inside the agents'
    network namespace, see :mod:`tests.realagents.netns`); without it, one is bound on
    127.0.0.1 with a free port.
    """

    def __init__(self, listener: socket.socket | None = None, *, keep_bodies: bool = False) -> None:
        self.keep_bodies = keep_bodies
        self.exchanges: list[Exchange] = []
        self._cond = threading.Condition()
        self._ids = 0
        self._closing = threading.Event()
        self._serve(_Server(listener, self))

    # -- the log -----------------------------------------------------------------------------

    def _new_exchange(self, **fields: Any) -> Exchange:
        with self._cond:
            self._ids += 1
            exchange = Exchange(id=self._ids, started_at=time.monotonic(), **fields)
            self.exchanges.append(exchange)
            self._cond.notify_all()
            return exchange

    def _update(self, exchange: Exchange, **fields: Any) -> None:
        with self._cond:
            for key, value in fields.items():
                setattr(exchange, key, value)
            self._cond.notify_all()

    def snapshot(self) -> list[Exchange]:
        with self._cond:
            return [attrs.evolve(e) for e in self.exchanges]

    def find(self, predicate: Callable[[Exchange], bool]) -> list[Exchange]:
        with self._cond:
            return [attrs.evolve(e) for e in self.exchanges if predicate(e)]

    def wait_for_sync(self, predicate: Callable[[Exchange], bool], timeout: float) -> Exchange:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for exchange in self.exchanges:
                    if predicate(exchange):
                        return attrs.evolve(exchange)
                left = deadline - time.monotonic()
                if left <= 0 or self._closing.is_set():
                    raise TimeoutError("no matching exchange with the fake model")
                self._cond.wait(left)

    async def wait_for(
        self, predicate: Callable[[Exchange], bool], timeout: float = 60.0
    ) -> Exchange:
        """The first exchange matching ``predicate`` (waits for it, on a worker thread)."""
        return await trio.to_thread.run_sync(
            self.wait_for_sync, predicate, timeout, abandon_on_cancel=True
        )

    def describe(self) -> str:
        """The log in a few lines, for assertion messages."""
        lines = []
        for e in self.snapshot():
            end = "open" if e.ended_at is None else f"{e.ended_at - e.started_at:.2f}s"
            gone = "" if e.disconnected_at is None else " DISCONNECTED"
            result = " tool_result" if e.tool_result else ""
            call = f" tool_call={e.tool_call['name']}" if e.tool_call else ""
            lines.append(
                f"#{e.id} {e.api} {e.path} scenario={e.scenario} tools={e.has_tools}"
                f" stream={e.stream} tokens={e.tokens_sent} {end}{gone}{result}{call}"
                f"{' error=' + e.error if e.error else ''}"
            )
        return "\n".join(lines)

    # -- request handling (server threads) ---------------------------------------------------

    def handle(self, handler: _Handler) -> None:
        url = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = _read_chunked(handler.rfile)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        path = url.path
        if handler.command == "POST" and path.endswith("/responses"):
            api = "responses"
        elif handler.command == "POST" and path.endswith("/messages"):
            api = "messages"
        elif handler.command == "POST" and path.endswith("/chat/completions"):
            api = "chat"
        elif handler.command == "POST" and ":streamGenerateContent" in path:
            api = "gemini"
        elif handler.command == "POST" and ":generateContent" in path:
            api = "gemini-json"
        else:
            api = "other"
        exchange = self._new_exchange(
            api=api,
            method=handler.command,
            path=handler.path,
            body=body if self.keep_bodies else None,
        )
        if api == "other":
            self._other(handler, exchange, path)
            return
        if not isinstance(body, dict):
            body = {}
        reader = _READERS[api]
        has_tools, user_text, tool_result = reader(body)
        stream = api == "gemini" or bool(body.get("stream"))
        scenario = _scenario(user_text)
        after_tool = tool_result is not None and scenario is None
        if after_tool and self._started_in_background(tool_result):
            # Claude Code answered a background call at once; its task runs on, so does the turn.
            after_tool, scenario = False, "stream"
        codex_next = self._codex_follow_up(tool_result) if after_tool else None
        if codex_next is not None:
            after_tool, scenario = False, codex_next
        goal_turn = api == "responses" and tool_result is None and GOAL_CONTINUATION in user_text
        if goal_turn and scenario is None:
            scenario = self._goal_turn_answer()
        self._update(
            exchange,
            has_tools=has_tools,
            stream=stream,
            user_text=user_text[-500:],
            tool_result=tool_result,
            scenario="tool_result" if after_tool else scenario,
            goal_turn=goal_turn,
        )
        writer = _Writer(handler, exchange, self, body)
        try:
            if api == "gemini-json":
                writer.gemini_json(body)
            elif after_tool or not has_tools:
                writer.answer(api, AFTER_TOOL_TEXT if after_tool else QUICK_TEXT, stream)
            elif scenario == "stream":
                writer.stream_tokens(api, stream)
            elif scenario in ("shell", "briefshell", "editshell", "editbrief", "permission"):
                writer.tool_call(api, scenario, stream)
            elif scenario == "mcpcall":
                writer.mcp_call(api, stream)
            elif scenario in CLAUDE_BACKGROUND_SCENARIOS and api == "messages":
                writer.background_call(scenario, body, stream)
            elif scenario in (*CODEX_SCENARIOS, "wait_agent", "update_goal") and api == "responses":
                writer.codex_call(scenario, stream)
            else:
                writer.answer(api, QUICK_TEXT, stream)
        except _ClientGone:
            pass
        except OSError as exc:
            self._update(exchange, error=f"{type(exc).__name__}: {exc}")
            writer.gone()
        finally:
            self._update(exchange, ended_at=time.monotonic())

    def _started_in_background(self, tool_result: dict[str, Any] | None) -> bool:
        """Whether ``tool_result`` answers a call of ours with ``run_in_background``."""
        call_id = (tool_result or {}).get("call_id")
        with self._cond:
            return any(
                e.tool_call is not None
                and e.tool_call.get("call_id") == call_id
                and e.tool_call["args"].get("run_in_background") is True
                for e in self.exchanges
            )

    def _codex_follow_up(self, tool_result: dict[str, Any] | None) -> str | None:
        """What answers the result of a Codex call of ours: ``spawn_agent`` → ``wait_agent``
        (the root waits on its child), ``setgoal``'s ``create_goal`` → the ``stream`` token
        stream, ``goalrun``'s and ``goalstream``'s → a short answer."""
        call_id = (tool_result or {}).get("call_id")
        with self._cond:
            calls = [
                (e.tool_call["name"], e.scenario)
                for e in self.exchanges
                if e.tool_call is not None and e.tool_call.get("call_id") == call_id
            ]
        if calls and calls[0] in (("create_goal", "goalrun"), ("create_goal", "goalstream")):
            return "quick"
        return {"spawn_agent": "wait_agent", "create_goal": "stream"}.get(
            calls[0][0] if calls else ""
        )

    def _goal_turn_answer(self) -> str:
        """A goal turn's answer, by the scenario that created the goal (see the module
        docstring): ``quick``, ``update_goal`` or ``stream``."""
        with self._cond:
            created = [
                i for i, e in enumerate(self.exchanges) if e.scenario in ("goalrun", "goalstream")
            ]
            if not created:
                return "quick"
            scenario = self.exchanges[created[-1]].scenario
            # This request is the newest exchange; it is not marked a goal turn yet.
            turns = 1 + sum(e.goal_turn for e in self.exchanges[created[-1] :])
        if scenario == "goalstream":
            return "stream"
        return "update_goal" if turns == GOAL_RUN_TURNS else "quick"

    def _other(self, handler: _Handler, exchange: Exchange, path: str) -> None:
        """Endpoints nobody scripted: an empty model list for GETs of models, 404 otherwise."""
        if handler.command == "GET" and path.rstrip("/").endswith("/models"):
            payload: dict[str, Any] = {"object": "list", "data": [], "models": []}
            status = 200
        else:
            payload = {"error": {"type": "not_found", "message": f"fake model: no {path}"}}
            status = 404
        data = json.dumps(payload).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:
            pass
        self._update(exchange, ended_at=time.monotonic())

    @property
    def closing(self) -> bool:
        return self._closing.is_set()


class _ClientGone(Exception):
    pass


class _Server(LocalServer):
    def __init__(self, listener: socket.socket | None, model: FakeModel) -> None:
        self.model = model
        super().__init__(listener, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        self.server.model.handle(self)

    do_GET = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _read_chunked(rfile: Any) -> bytes:
    data = b""
    while True:
        size = int(rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            rfile.readline()
            return data
        data += rfile.read(size)
        rfile.readline()


# -- reading requests -------------------------------------------------------------------------


def _scenario(text: str) -> str | None:
    found = _SCENARIO_RE.findall(text.lower())
    return found[-1] if found else None


def _texts(content: Any, *, skip_reminders: bool = True) -> str:
    """The plain text of a message content: a string or a list of typed parts."""
    if isinstance(content, str):
        return content
    parts = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    if skip_reminders and text.lstrip().startswith("<system-reminder>"):
                        continue
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
    return "\n".join(parts)


def _read_messages(body: dict[str, Any]) -> tuple[bool, str, dict[str, Any] | None]:
    """Anthropic Messages: the newest user message; a tool_result block in it is a result."""
    has_tools = bool(body.get("tools"))
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    if not messages or messages[-1].get("role") != "user":
        return has_tools, "", None
    content = messages[-1].get("content")
    result = None
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                result = {
                    "call_id": block.get("tool_use_id"),
                    "output": _texts(block.get("content"), skip_reminders=False),
                    "is_error": block.get("is_error", False),
                }
    # After a cancel, Claude sends the aborted tool's result together with the next prompt.
    return has_tools, _texts(content), result


def _read_chat(body: dict[str, Any]) -> tuple[bool, str, dict[str, Any] | None]:
    """OpenAI chat completions: a trailing ``tool`` message is a result."""
    has_tools = bool(body.get("tools")) or body.get("model") == AGENT_LOOP_MODEL
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    if not messages:
        return has_tools, "", None
    last = messages[-1]
    if last.get("role") == "tool":
        return (
            has_tools,
            "",
            {"call_id": last.get("tool_call_id"), "output": _texts(last.get("content"))},
        )
    for message in reversed(messages):
        if message.get("role") == "user":
            return has_tools, _texts(message.get("content")), None
    return has_tools, "", None


def _read_responses(body: dict[str, Any]) -> tuple[bool, str, dict[str, Any] | None]:
    """OpenAI Responses: a trailing ``function_call_output`` item is a result."""
    has_tools = bool(body.get("tools"))
    items = body.get("input")
    if isinstance(items, str):
        return has_tools, items, None
    items = [i for i in items or [] if isinstance(i, dict)]
    if not items:
        return has_tools, "", None
    # Codex appends context of its own after a create_goal result (``goal_objective`` in the
    # ``agent`` namespace, no call id): not the result of any call.
    while len(items) > 1 and items[-1].get("namespace") == "agent" and not items[-1].get("call_id"):
        items.pop()
    last = items[-1]
    if last.get("type") in ("function_call_output", "custom_tool_call_output"):
        output = last.get("output")
        return (
            has_tools,
            "",
            {
                "call_id": last.get("call_id"),
                "output": output if isinstance(output, str) else json.dumps(output),
            },
        )
    if last.get("type") == "agent_message":
        # A Codex sub-agent's task (multi_agent_v2): plain and "encrypted" parts, in clear here.
        parts = [p for p in last.get("content") or [] if isinstance(p, dict)]
        text = "\n".join(str(p.get("text") or p.get("encrypted_content") or "") for p in parts)
        return has_tools, text, None
    for item in reversed(items):
        if item.get("role") == "user":
            return has_tools, _texts(item.get("content")), None
    return has_tools, "", None


def _read_gemini(body: dict[str, Any]) -> tuple[bool, str, dict[str, Any] | None]:
    """Gemini: a ``functionResponse`` part in the trailing user content is a result."""
    has_tools = bool(body.get("tools"))
    contents = [c for c in body.get("contents") or [] if isinstance(c, dict)]
    if not contents or contents[-1].get("role", "user") != "user":
        return has_tools, "", None
    parts = [p for p in contents[-1].get("parts") or [] if isinstance(p, dict)]
    for part in parts:
        response = part.get("functionResponse")
        if isinstance(response, dict):
            return (
                has_tools,
                "",
                {
                    "call_id": response.get("id") or response.get("name"),
                    "output": json.dumps(response.get("response")),
                },
            )
    return has_tools, _texts(parts), None


_READERS: dict[str, Callable[[dict[str, Any]], tuple[bool, str, dict[str, Any] | None]]] = {
    "messages": _read_messages,
    "chat": _read_chat,
    "responses": _read_responses,
    "gemini": _read_gemini,
    "gemini-json": _read_gemini,
}


# -- writing answers ---------------------------------------------------------------------------


class _Writer:
    """Writes one answer in the request's wire format, noticing when the client goes away."""

    def __init__(
        self, handler: _Handler, exchange: Exchange, model: FakeModel, body: dict[str, Any]
    ) -> None:
        self.h = handler
        self.exchange = exchange
        self.model = model
        #: the names of the tools the request offers (OpenAI's ``function.name``, or ``name``)
        self.tool_names = {
            str((t.get("function") or t).get("name"))
            for t in body.get("tools") or []
            if isinstance(t, dict) and isinstance(t.get("function") or t, dict)
        }
        # Gemini's ``tools``: ``[{"functionDeclarations": [{"name", ...}]}]``
        self.tool_names |= {
            str(d.get("name"))
            for t in body.get("tools") or []
            if isinstance(t, dict)
            for d in t.get("functionDeclarations") or []
            if isinstance(d, dict)
        }
        self.body = body
        self.chunked = False
        self.sock: socket.socket = handler.connection

    # transport

    def gone(self) -> None:
        if self.exchange.disconnected_at is None:
            self.model._update(self.exchange, disconnected_at=time.monotonic())
        self.h.close_connection = True
        raise _ClientGone

    def start_sse(self) -> None:
        self.h.send_response(200)
        self.h.send_header("Content-Type", "text/event-stream")
        self.h.send_header("Cache-Control", "no-cache")
        self.h.send_header("Transfer-Encoding", "chunked")
        self.h.send_header("Connection", "close")
        self.h.end_headers()
        self.h.close_connection = True
        self.chunked = True
        self.flush()

    def write(self, data: bytes) -> None:
        if self.client_gone():
            self.gone()
        try:
            if self.chunked:
                self.h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self.h.wfile.write(data)
            self.flush()
        except OSError:
            self.gone()

    def flush(self) -> None:
        try:
            self.h.wfile.flush()
        except OSError:
            self.gone()

    def end_sse(self) -> None:
        if self.chunked:
            try:
                self.h.wfile.write(b"0\r\n\r\n")
                self.flush()
            except OSError:
                self.gone()

    def client_gone(self) -> bool:
        """Readable with nothing to read (EOF) or an error: the client closed its end."""
        try:
            readable, _, errored = select.select([self.sock], [], [self.sock], 0)
            if errored:
                return True
            if readable:
                return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
        return False

    def wait(self, seconds: float) -> None:
        """Sleep between tokens, but notice at once when the client hangs up."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.model.closing:
                self.gone()
            try:
                readable, _, _ = select.select([self.sock], [], [], min(left, 0.05))
            except OSError:
                self.gone()
            if readable and self.client_gone():
                self.gone()

    def event(self, data: Any, name: str | None = None) -> None:
        payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        head = f"event: {name}\n" if name else ""
        self.write(f"{head}data: {payload}\n\n".encode())

    def json_response(self, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.h.send_response(200)
        self.h.send_header("Content-Type", "application/json")
        self.h.send_header("Content-Length", str(len(data)))
        self.h.end_headers()
        self.h.wfile.write(data)
        self.flush()

    # scenarios

    def answer(self, api: str, text: str, stream: bool) -> None:
        self.text_turn(api, iter([text]), stream)

    def stream_tokens(self, api: str, stream: bool) -> None:
        def tokens() -> Iterator[str]:
            end = time.monotonic() + STREAM_DURATION_S
            n = 0
            while time.monotonic() < end:
                n += 1
                yield f"token{n} "
                self.wait(STREAM_INTERVAL_S)

        # not streamed, the tokens still count as made: the answer is under way
        self.text_turn(api, tokens() if stream else self.counted(tokens()), stream)

    def tool_call(self, api: str, scenario: str, stream: bool) -> None:
        command = {
            "shell": SHELL_COMMAND,
            "briefshell": BRIEF_SHELL_COMMAND,
            "editshell": EDIT_SHELL_COMMAND,
            "editbrief": EDIT_BRIEF_COMMAND,
        }.get(scenario, PERMISSION_COMMAND)
        call_id = f"call_{self.exchange.id}"
        if api == "responses":
            name = "exec_command"
            args: dict[str, Any] = {"cmd": command, "yield_time_ms": 30000}
            # Codex runs a plain command in its sandbox, which needs bubblewrap (not on every
            # machine); an escalated one runs outside it, after an approval. So both ask.
            args["sandbox_permissions"] = "require_escalated"
            args["justification"] = "The test asks for an approval."
        elif api == "messages":
            name = "Bash"
            args = {"command": command, "description": "Wait on /dev/null", "timeout": 60000}
        elif api == "chat" and "run_shell_command" in self.tool_names:
            # Qwen Code (a Gemini CLI fork) keeps Gemini's shell tool on chat completions
            name = "run_shell_command"
            args = {"command": command, "description": "Wait on /dev/null", "is_background": False}
        elif api == "chat":
            name = "bash"
            args = {"command": command, "description": "Wait on /dev/null", "timeout": 60000}
        else:
            name = "run_shell_command"
            args = {"command": command, "description": "Wait on /dev/null"}
        self.model._update(
            self.exchange, tool_call={"name": name, "args": args, "call_id": call_id}
        )
        _TOOL_WRITERS[api](self, call_id, name, args, stream)

    def mcp_call(self, api: str, stream: bool) -> None:
        """Call the offered tool named ``...marker_ping`` (see ``mcpcall``). Codex offers its
        MCP tools only through ``tool_search`` (always deferred in 0.171): the model searches
        first, then calls the tool in the namespace the search output names. Qwen Code defers
        them too, naming them in its prompt, and runs one through its ``tool_call`` tool."""
        names = sorted(name for name in self.tool_names if name.endswith(MCP_TOOL))
        call_id = f"call_{self.exchange.id}"
        if names:
            self.model._update(
                self.exchange, tool_call={"name": names[0], "args": {}, "call_id": call_id}
            )
            _TOOL_WRITERS[api](self, call_id, names[0], {}, stream)
            return
        deferred = sorted(set(_DEFERRED_MCP_TOOL.findall(json.dumps(self.body))))
        if api == "chat" and "tool_call" in self.tool_names and deferred:
            args: dict[str, Any] = {"name": deferred[0], "arguments": {}}
            self.model._update(
                self.exchange, tool_call={"name": deferred[0], "args": args, "call_id": call_id}
            )
            _TOOL_WRITERS[api](self, call_id, "tool_call", args, stream)
            return
        if api == "responses":
            found = _searched_tool(self.body, MCP_TOOL)
            if found is not None:
                namespace, name = found
                self.model._update(
                    self.exchange,
                    tool_call={"name": f"{namespace}{name}", "args": {}, "call_id": call_id},
                )
                _responses_tool(self, call_id, name, {}, stream, namespace or None)
                return
            if any(
                isinstance(t, dict) and t.get("type") == "tool_search"
                for t in self.body.get("tools") or []
            ):
                _responses_search(self, call_id, MCP_TOOL)
                return
        self.answer(api, NO_MCP_TOOL_TEXT, stream)

    def codex_call(self, scenario: str, stream: bool) -> None:
        """Codex 0.171 app-server tools: ``subagent`` spawns a child whose task is ``stream``
        (``spawn_agent`` in the ``collaboration`` namespace, ``[features] multi_agent_v2``);
        its result is answered with ``wait_agent`` (the root waits on the child for up to 60 s);
        ``setgoal``, ``goalrun`` and ``goalstream`` create an active thread goal
        (``create_goal``); ``update_goal`` marks it complete."""
        namespace: str | None = "collaboration"
        args: dict[str, Any]
        if scenario == "subagent":
            name = "spawn_agent"
            args = {"task_name": "streamer", "message": "stream", "fork_turns": "none"}
        elif scenario == "wait_agent":
            name, args = "wait_agent", {"timeout_ms": 60000}
        elif scenario == "update_goal":
            name, namespace, args = "update_goal", None, {"status": "complete"}
        else:
            name, namespace = "create_goal", None
            args = {"objective": "Keep streaming until the person stops you."}
        call_id = f"call_{self.exchange.id}"
        self.model._update(
            self.exchange, tool_call={"name": name, "args": args, "call_id": call_id}
        )
        _responses_tool(self, call_id, name, args, stream, namespace)

    def background_call(self, scenario: str, body: dict[str, Any], stream: bool) -> None:
        """Claude Code's background tasks: a background ``Bash``, or a background sub-agent
        (``Agent``, ``Task`` on CLIs that name it so) that streams tokens."""
        args: dict[str, Any]
        if scenario == "background":
            name = "Bash"
            args = {"command": BACKGROUND_COMMAND, "description": "Wait on /dev/null"}
        else:
            tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
            name = "Task" if "Task" in tools and "Agent" not in tools else "Agent"
            args = {
                "description": "Stream tokens",
                "prompt": "stream",
                "subagent_type": "general-purpose",
            }
        args["run_in_background"] = True
        call_id = f"call_{self.exchange.id}"
        self.model._update(
            self.exchange, tool_call={"name": name, "args": args, "call_id": call_id}
        )
        _messages_tool(self, call_id, name, args, stream)

    def gemini_json(self, body: dict[str, Any]) -> None:
        """The non-streaming call Gemini uses for routing and other side questions."""
        config = body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        if schema:
            text = json.dumps(_from_schema(schema))
        else:
            text = QUICK_TEXT
        self.json_response(_gemini_chunk([{"text": text}], "STOP"))

    # text turns per API

    def text_turn(self, api: str, tokens: Iterator[str], stream: bool) -> None:
        if not stream:
            text = "".join(tokens)
            self.json_response(_FULL_TEXT[api](text))
            return
        self.start_sse()
        _TEXT_WRITERS[api](self, tokens)
        self.end_sse()

    def count(self) -> None:
        self.model._update(self.exchange, tokens_sent=self.exchange.tokens_sent + 1)

    def counted(self, tokens: Iterator[str]) -> Iterator[str]:
        for token in tokens:
            self.count()
            yield token


def _usage_responses() -> dict[str, Any]:
    return {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }


def _responses_text(w: _Writer, tokens: Iterator[str]) -> None:
    rid, mid = f"resp_{w.exchange.id}", f"msg_{w.exchange.id}"
    w.event(
        {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
        "response.created",
    )
    item = {
        "type": "message",
        "id": mid,
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    w.event(
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        "response.output_item.added",
    )
    part = {"type": "output_text", "text": "", "annotations": []}
    w.event(
        {
            "type": "response.content_part.added",
            "item_id": mid,
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
        "response.content_part.added",
    )
    text = ""
    for token in tokens:
        text += token
        w.event(
            {
                "type": "response.output_text.delta",
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "delta": token,
            },
            "response.output_text.delta",
        )
        w.count()
    w.event(
        {
            "type": "response.output_text.done",
            "item_id": mid,
            "output_index": 0,
            "content_index": 0,
            "text": text,
        },
        "response.output_text.done",
    )
    done = {
        **item,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    w.event(
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        "response.output_item.done",
    )
    w.event(
        {
            "type": "response.completed",
            "response": {"id": rid, "status": "completed", "usage": _usage_responses()},
        },
        "response.completed",
    )


def _responses_tool(
    w: _Writer,
    call_id: str,
    name: str,
    args: dict[str, Any],
    stream: bool,
    namespace: str | None = None,
) -> None:
    rid = f"resp_{w.exchange.id}"
    item = {
        "type": "function_call",
        "id": f"fc_{w.exchange.id}",
        "call_id": call_id,
        "name": name,
        "arguments": "",
    }
    if namespace is not None:
        item["namespace"] = namespace
    w.start_sse()
    w.event(
        {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
        "response.created",
    )
    w.event(
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        "response.output_item.added",
    )
    done = {**item, "arguments": json.dumps(args), "status": "completed"}
    w.event(
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        "response.output_item.done",
    )
    w.event(
        {
            "type": "response.completed",
            "response": {"id": rid, "status": "completed", "usage": _usage_responses()},
        },
        "response.completed",
    )
    w.end_sse()


def _searched_tool(body: dict[str, Any], suffix: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a tool ending with ``suffix`` that a ``tool_search_output`` in
    the request's input (or a ``namespace`` tool it offers) holds."""
    holders = [i for i in body.get("input") or [] if isinstance(i, dict)]
    holders = [i for i in holders if i.get("type") == "tool_search_output"]
    holders.append({"tools": body.get("tools") or []})
    for holder in holders:
        for tool in holder.get("tools") or []:
            if not isinstance(tool, dict):
                continue
            inner = tool.get("tools") if tool.get("type") == "namespace" else [tool]
            for item in inner or []:
                name = item.get("name") if isinstance(item, dict) else None
                if isinstance(name, str) and name.endswith(suffix):
                    namespace = tool.get("name") if tool.get("type") == "namespace" else ""
                    return str(namespace or ""), name
    return None


def _responses_search(w: _Writer, call_id: str, query: str) -> None:
    """A ``tool_search_call`` item (``execution: client``: Codex runs the search itself)."""
    rid = f"resp_{w.exchange.id}"
    item = {
        "type": "tool_search_call",
        "id": f"ts_{w.exchange.id}",
        "call_id": call_id,
        "execution": "client",
        "status": "completed",
        "arguments": {"query": query, "limit": 8},
    }
    w.model._update(w.exchange, tool_call={"name": "tool_search", "args": item["arguments"]})
    w.start_sse()
    w.event(
        {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
        "response.created",
    )
    w.event(
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        "response.output_item.added",
    )
    w.event(
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        "response.output_item.done",
    )
    w.event(
        {
            "type": "response.completed",
            "response": {"id": rid, "status": "completed", "usage": _usage_responses()},
        },
        "response.completed",
    )
    w.end_sse()


def _messages_start(w: _Writer) -> None:
    message: dict[str, Any] = {
        "id": f"msg_{w.exchange.id}",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    w.event({"type": "message_start", "message": message}, "message_start")


def _messages_end(w: _Writer, stop_reason: str) -> None:
    w.event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        "message_delta",
    )
    w.event({"type": "message_stop"}, "message_stop")


def _messages_text(w: _Writer, tokens: Iterator[str]) -> None:
    _messages_start(w)
    w.event(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        "content_block_start",
    )
    w.event({"type": "ping"}, "ping")
    for token in tokens:
        w.event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": token},
            },
            "content_block_delta",
        )
        w.count()
    w.event({"type": "content_block_stop", "index": 0}, "content_block_stop")
    _messages_end(w, "end_turn")


def _messages_tool(w: _Writer, call_id: str, name: str, args: dict[str, Any], stream: bool) -> None:
    tool_id = f"toolu_{w.exchange.id:04d}"
    w.model._update(w.exchange, tool_call={**(w.exchange.tool_call or {}), "call_id": tool_id})
    if not stream:
        w.json_response(
            {
                "id": f"msg_{w.exchange.id}",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [{"type": "tool_use", "id": tool_id, "name": name, "input": args}],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 5},
            }
        )
        return
    w.start_sse()
    _messages_start(w)
    block = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
    w.event(
        {"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start"
    )
    delta = {"type": "input_json_delta", "partial_json": json.dumps(args)}
    w.event({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")
    w.event({"type": "content_block_stop", "index": 0}, "content_block_stop")
    _messages_end(w, "tool_use")
    w.end_sse()


def _chat_chunk(
    w: _Writer, delta: dict[str, Any], finish: str | None = None, usage: bool = False
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": f"chatcmpl-{w.exchange.id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    return chunk


def _chat_text(w: _Writer, tokens: Iterator[str]) -> None:
    w.event(_chat_chunk(w, {"role": "assistant", "content": ""}))
    for token in tokens:
        w.event(_chat_chunk(w, {"content": token}))
        w.count()
    w.event(_chat_chunk(w, {}, "stop", usage=True))
    w.event("[DONE]")


def _chat_tool(w: _Writer, call_id: str, name: str, args: dict[str, Any], stream: bool) -> None:
    call = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    if not stream:
        w.json_response(
            {
                "id": f"chatcmpl-{w.exchange.id}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "fake-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )
        return
    w.start_sse()
    w.event(_chat_chunk(w, {"role": "assistant", "content": None, "tool_calls": [call]}))
    w.event(_chat_chunk(w, {}, "tool_calls", usage=True))
    w.event("[DONE]")
    w.end_sse()


def _gemini_chunk(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "gemini-2.5-flash",
    }


def _gemini_text(w: _Writer, tokens: Iterator[str]) -> None:
    for token in tokens:
        w.event(_gemini_chunk([{"text": token}]))
        w.count()
    w.event(_gemini_chunk([{"text": ""}], "STOP"))


def _gemini_tool(w: _Writer, call_id: str, name: str, args: dict[str, Any], stream: bool) -> None:
    parts = [{"functionCall": {"name": name, "args": args, "id": call_id}}]
    if not stream:
        w.json_response(_gemini_chunk(parts, "STOP"))
        return
    w.start_sse()
    w.event(_gemini_chunk(parts, "STOP"))
    w.end_sse()


_TEXT_WRITERS: dict[str, Callable[[_Writer, Iterator[str]], None]] = {
    "responses": _responses_text,
    "messages": _messages_text,
    "chat": _chat_text,
    "gemini": _gemini_text,
}
_TOOL_WRITERS: dict[str, Callable[[_Writer, str, str, dict[str, Any], bool], None]] = {
    "responses": _responses_tool,
    "messages": _messages_tool,
    "chat": _chat_tool,
    "gemini": _gemini_tool,
}


def _full_messages(text: str) -> dict[str, Any]:
    return {
        "id": "msg_full",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def _full_chat(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-full",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "fake-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _full_responses(text: str) -> dict[str, Any]:
    return {
        "id": "resp_full",
        "object": "response",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_full",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": _usage_responses(),
    }


def _full_gemini(text: str) -> dict[str, Any]:
    return _gemini_chunk([{"text": text}], "STOP")


_FULL_TEXT: dict[str, Callable[[str], dict[str, Any]]] = {
    "messages": _full_messages,
    "chat": _full_chat,
    "responses": _full_responses,
    "gemini": _full_gemini,
    "gemini-json": _full_gemini,
}


def _from_schema(schema: Any) -> Any:
    """A small value valid for a JSON schema (Gemini's router wants numbers >= 1)."""
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: _from_schema(sub) for name, sub in props.items()}
    if kind == "array":
        return [_from_schema(schema.get("items") or {})] if schema.get("minItems") else []
    if kind in ("integer", "number"):
        low = schema.get("minimum", 1)
        return max(1, int(low) if kind == "integer" else low)
    if kind == "boolean":
        return False
    return "fake"
