"""Amp's ``--execute --stream-json --stream-json-input`` mode, as a sans-IO machine.

Amp writes Claude-Code-like JSONL but is a different protocol: its agent loop runs on Amp's
server, the CLI only relays it (and runs the tools the server leases to it). What this machine
relies on, each checked on ``@sourcegraph/amp@0.0.1790142911-g7618fb`` against the tests' fake
Amp server (``tests/realagents/fake_amp.py``, ``tests/real/test_real_amp.py``):

- We write ``{"type":"user","message":{"role":"user","content":[blocks]}}``, plus
  ``"steer": true`` to steer (below). ``content`` must be a list. There is no control message:
  nothing else goes to stdin, and nothing is answered.
- The CLI writes ``system/init`` once per process, after the first user message (its
  ``session_id`` is the thread, ``T-<uuid>``); then per turn a ``user`` line echoing the prompt,
  ``assistant`` lines, and ``user`` lines with ``tool_result`` blocks. Assistant text comes as
  **whole messages only** (no deltas on stdout): each text block is the turn's next
  ``message.delta``.
- **A turn ends with an ``assistant`` line whose ``message.stop_reason`` is ``end_turn``**:
  ``tool_use`` (the message asks for tools) and ``null`` (not complete) go on. There is **no
  ``result`` per turn** while stdin is open.
- A ``result`` ends the CLI's whole run: ``success`` only at stdin EOF with the agent idle, or
  ``error_during_execution`` (its text in ``error``, not ``result``) on an error, or on SIGINT or
  SIGTERM (``"error": "User cancelled (SIGINT/SIGTERM)"``), after which the process exits 0. So
  every ``result`` is an :class:`AgentExiting`.
- **No in-band interrupt**: the cancel is SIGINT to the agent's tree (``Step.signals``). Amp
  answers it in ~30-300 ms with that ``result`` and exits; the partial message is never printed.
  So the cancel step announces the exit (:class:`AgentExiting`) and the actor waits for it,
  then starts ``amp threads continue <T-id> ...`` (:meth:`AmpClient.command`) before it answers
  the cancel. The turn ends ``cancelled`` (stop reason ``cancelled``) at the ``result``; an
  ``end_turn`` that beat the signal makes it ``completed``. An Amp that does not answer the
  signal meets the grace timer and the kill ladder like any other agent.
- ``threads continue`` replays no history on stdout; an unknown thread makes it exit 1 at start
  with ``Thread ... does not exist.`` on stderr, and nothing on stdout. There is no handshake in
  which to refuse, so the session is established as soon as the process runs and
  ``resumed=True`` means we asked Amp to continue the thread and it started; a resumed process
  that dies before it says anything is the actor's sign that the thread is gone
  (``resume_failed``; the session goes on in a fresh thread).
- **Steering**: a user line with ``"steer": true`` written while a turn runs goes to the server
  at once (``client_append_user_msg`` with ``steer``) and joins the running turn there; the CLI
  echoes it as a ``user`` line of that turn. :meth:`AmpClient.steer` makes the line. (Without
  ``steer``, a line written mid-turn is queued by the server and becomes the next turn.)
- **No permission protocol** in stream-json mode: a tool that needs approval fails the run
  ("...require user approval, which is not supported in stream JSON mode").
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from attrs import define

from protocols import events as ev
from protocols.content import Part
from protocols.machine import (
    NOT_RESUMABLE,
    AgentExiting,
    AgentProtocol,
    Output,
    SessionEstablished,
    SteerAnswered,
    Step,
    TurnFinished,
    argv_resumable,
    check_answer,
    session_changed,
)
from protocols.mcp import McpServer

__all__ = ["AMP_COMMAND", "AmpClient", "amp_mcp_config"]

#: The command line (after the ``amp`` executable): stream JSON both ways, and keep a new
#: thread when the run ends (by default ``--execute`` archives it at exit, and an archived
#: thread "cannot be continued", which is how every cancel ends).
AMP_COMMAND: Final = (
    "amp",
    "--execute",
    "--stream-json",
    "--stream-json-input",
    "--no-archive-after-execute",
)

#: What the cancel's exit is announced as.
EXIT_ON_SIGNAL: Final = "SIGINT ends Amp's run"
EXIT_ON_RESULT: Final = "Amp's run ended (result)"
#: Amp's tools (``executor_tools_register``) as ACP tool kinds, for UIs that draw them.
_TOOL_KINDS: Final = {
    "Bash": "execute",
    "shell_command": "execute",
    "async_shell_command": "execute",
    "shell_command_status": "execute",
    "shell_command_kill": "execute",
    "Read": "read",
    "read_mcp_resource": "read",
    "edit_file": "edit",
    "create_file": "edit",
    "apply_patch": "edit",
    "Grep": "search",
    "glob": "search",
    "find_thread": "search",
    "read_web_page": "fetch",
    "web_search": "fetch",
    "Task": "think",
}
#: Longest error text taken from a ``result``.
_ERROR_CHARS: Final = 500


@define
class AmpClient(AgentProtocol):
    """Our side of one ``amp --execute --stream-json --stream-json-input`` process."""

    name: ClassVar[str] = "amp"
    #: ``amp.mcpServers`` entries take a ``command`` or a ``url``; no transport to choose SSE
    mcp_transports: ClassVar[frozenset[str]] = frozenset({"stdio", "http"})

    _phase: str = "idle"  # idle, ready, exiting
    _resume: str | None = None
    _thread_id: str | None = None  # the latest system/init's session_id
    _turn_id: str | None = None
    _interrupt_sent: bool = False

    @classmethod
    def command(
        cls, base: Sequence[str], resume: str | None, *, mcp_servers: Sequence[McpServer] = ()
    ) -> list[str]:
        """``amp --execute ...`` becomes ``amp threads continue T-... --execute ...``.

        The subcommand goes just before ``--execute`` (``-x``), which this mode needs, so a
        wrapper and its own options stay in front (``nsenter --net=... -- amp --execute``,
        ``node amp.js --execute``); without it, before the first option after the program.
        MCP servers go last, as ``--mcp-config JSON`` (merged with Amp's own settings).
        """
        argv = list(base)
        if mcp_servers:
            argv += ["--mcp-config", json.dumps(amp_mcp_config(mcp_servers))]
        if resume is None or not argv_resumable(resume):  # (start() says it is a fresh one)
            return argv
        flags = [i for i, arg in enumerate(argv) if i > 0 and arg in ("--execute", "-x")]
        options = [i for i, arg in enumerate(argv) if i > 0 and arg.startswith("-")]
        at = flags[0] if flags else options[0] if options else len(argv)
        return [*argv[:at], "threads", "continue", resume, *argv[at:]]

    # -- calls from the actor -------------------------------------------------------------

    def start(
        self, *, cwd: str, resume: str | None = None, mcp_servers: Sequence[McpServer] = ()
    ) -> Step:
        # cwd: the launcher starts the CLI there; the protocol has no field for it.
        if self._phase != "idle":
            raise RuntimeError("start() called twice")
        self._phase = "ready"
        if resume is not None and not argv_resumable(resume):
            return Step(events=[SessionEstablished(None, resumed=False, detail=NOT_RESUMABLE)])
        self._resume = resume
        return Step(
            events=[SessionEstablished(resume, resumed=True if resume is not None else None)]
        )

    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        # Text only (``prompt_carries`` is empty): the session refused any part that needs
        # more, so ``text`` says all of it.
        if self._phase != "ready" or self._turn_id is not None:
            raise RuntimeError(f"prompt() while {self._phase} with turn {self._turn_id}")
        self._turn_id = turn_id
        self._interrupt_sent = False
        return Step(send=[_user_line(text)])

    @property
    def can_steer(self) -> bool:
        return self._phase == "ready" and not self._interrupt_sent

    def steer(self, turn_id: str, steer_id: int, text: str) -> Step:
        """The line that adds ``text`` to the running turn (Amp's ``"steer": true``). Amp has
        no answer to it: the line written is the steer taken (tier 4: its server takes it into
        the running turn, and the CLI echoes it as the turn's user message)."""
        if (
            self._turn_id is None
            or self._turn_id != turn_id
            or self._interrupt_sent
            or self._phase != "ready"
        ):
            raise RuntimeError(f"steer() while {self._phase} with turn {self._turn_id}")
        return Step(
            send=[{**_user_line(text), "steer": True}],
            events=[SteerAnswered(steer_id, turn_id, True)],
        )

    def cancel(self) -> Step:
        if self._turn_id is None or self._interrupt_sent:
            return Step()
        self._interrupt_sent = True
        return Step(signals=[signal.SIGINT], events=self._exiting(EXIT_ON_SIGNAL))

    def respond_permission(self, request_id: str, option_id: str | None) -> Step:
        check_answer(request_id, None, option_id)  # Amp asks nothing in this mode
        return Step()

    def cancel_permissions(self) -> Step:
        return Step()

    @property
    def pending_permissions(self) -> list[str]:
        return []

    @property
    def agent_session_id(self) -> str | None:
        return self._thread_id or self._resume

    # -- what the CLI writes ----------------------------------------------------------------

    def receive(self, message: dict[str, Any]) -> Step:
        kind = message.get("type")
        if kind == "assistant":
            return self._on_assistant(message)
        if kind == "user":
            return self._on_user(message)
        if kind == "result":
            return self._on_result(message)
        if kind == "system":
            return self._on_system(message)
        return _unparsed(message)

    def _exiting(self, reason: str) -> list[Output]:
        """The :class:`AgentExiting` of this process, once."""
        if self._phase == "exiting":
            return []
        self._phase = "exiting"
        return [AgentExiting(reason)]

    def _on_system(self, message: dict[str, Any]) -> Step:
        subtype = message.get("subtype")
        if not isinstance(subtype, str):
            return _unparsed(message)
        if subtype != "init":
            return Step(events=[ev.SessionInfo(info_kind=subtype, data=message)])
        thread = message.get("session_id")
        if not isinstance(thread, str) or not thread:
            return _unparsed(message)
        step = Step(events=[ev.SessionInfo(info_kind="init", data=message)])
        changed = session_changed(
            self._thread_id or self._resume,
            self._thread_id is not None,
            thread,
            agent="Amp",
            kind="thread",
        )
        if changed is not None:
            step.events.append(changed)
        self._thread_id = thread
        return step

    def _on_assistant(self, message: dict[str, Any]) -> Step:
        body = message.get("message")
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(content, list):
            return _unparsed(message)
        turn = self._turn_id
        step = Step()
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                step.events.append(ev.MessageDelta(turn_id=turn, text=block["text"]))
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                step.events.append(ev.ThoughtDelta(turn_id=turn, text=block["thinking"]))
            elif kind == "tool_use":
                name = block.get("name")
                step.events.append(
                    ev.ToolCall(
                        turn_id=turn,
                        tool_call_id=str(block.get("id", "")),
                        title=name if isinstance(name, str) else "",
                        tool_kind=_TOOL_KINDS.get(name) if isinstance(name, str) else None,
                        status="pending",
                        raw=block,
                    )
                )
        if body.get("stop_reason") == "end_turn" and turn is not None:
            self._turn_id = None
            step.events.append(TurnFinished(turn, "end_turn", interrupted=False))
        return step

    def _on_user(self, message: dict[str, Any]) -> Step:
        """The prompt's (or a steering line's) echo, and tool results."""
        body = message.get("message")
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, list):
            return _unparsed(message)
        turn = self._turn_id
        step = Step()
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_result":
                step.events.append(
                    ev.ToolUpdate(
                        turn_id=turn,
                        tool_call_id=str(block.get("tool_use_id", "")),
                        status="failed" if block.get("is_error") is True else "completed",
                        raw=block,
                    )
                )
            elif kind == "text" and isinstance(block.get("text"), str):
                step.events.append(ev.MessageDelta(turn_id=turn, text=block["text"], role="user"))
        return step

    def _on_result(self, message: dict[str, Any]) -> Step:
        step = Step(events=self._exiting(EXIT_ON_RESULT))
        turn = self._turn_id
        if turn is None:
            step.events.append(ev.SessionInfo(info_kind="result", data=message))
            return step
        self._turn_id = None
        subtype = message.get("subtype") if isinstance(message.get("subtype"), str) else None
        if message.get("is_error") is not True and subtype == "success":
            # Only at stdin EOF, which the actor does not do mid-turn: the end_turn was missed.
            step.events.append(TurnFinished(turn, "end_turn", interrupted=False))
        elif self._interrupt_sent:
            # Amp's word for our SIGINT ("User cancelled (SIGINT/SIGTERM)").
            step.events.append(TurnFinished(turn, "cancelled", interrupted=True))
        elif _error_text(message).startswith("User cancelled"):
            # Someone else signalled it (a person at a terminal): stopped, not failed.
            step.events.append(TurnFinished(turn, "cancelled", interrupted=True))
        else:
            step.events.append(
                TurnFinished(turn, subtype or "error", interrupted=None, error=_describe(message))
            )
        return step


def _user_line(text: str) -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    return {"type": "user", "message": {"role": "user", "content": content}}


def _unparsed(message: dict[str, Any]) -> Step:
    return Step(events=[ev.AgentUnparsed(raw=message)])


def _error_text(result: dict[str, Any]) -> str:
    for key in ("error", "result"):
        value = result.get(key)
        if isinstance(value, str):
            return value
    return ""


def _describe(result: dict[str, Any]) -> str:
    """What went wrong in a ``result``, for a person: its subtype, then Amp's words."""
    cause = result.get("subtype") if isinstance(result.get("subtype"), str) else "error"
    words = _error_text(result)
    text = f"{cause}: {words}" if words else str(cause)
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


def amp_mcp_config(servers: Sequence[McpServer]) -> dict[str, Any]:
    """``--mcp-config``'s JSON, shaped like the ``amp.mcpServers`` setting: ``NAME ->
    {command, args, env}`` for a program, ``{url, headers}`` for a remote server."""
    entries: dict[str, Any] = {}
    for server in servers:
        if server.transport == "stdio":
            entries[server.name] = {
                "command": server.command,
                "args": list(server.args),
                "env": server.env_dict,
            }
        else:
            entries[server.name] = {"url": server.url, "headers": server.headers_dict}
    return entries
