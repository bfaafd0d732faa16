"""Claude Code's headless stream-json protocol, client side, as a sans-IO machine.

``claude -p --input-format stream-json --output-format stream-json ...`` reads and writes one JSON
object per line, without JSON-RPC (``shared/protocols.md`` section 3). What this machine relies
on, each checked against Claude Code 2.1.332 on a fake model server:

- We write ``{"type":"user",...}`` messages and ``control_request`` envelopes; the CLI writes
  ``system``, ``stream_event``, ``assistant``, ``user``, ``result`` and its own
  ``control_request`` / ``control_cancel_request``, and answers ours with ``control_response``.
- ``initialize`` is answered within ~0.4 s of the start, before any user message; ``system/init``
  (the session id) only comes once a user message is read, and again for every user message.
- A turn ends with exactly one ``result``. The ``control_response`` to ``interrupt`` is only an
  acknowledgement, written before the interrupted turn's ``result`` (``error_during_execution``,
  ``is_error: true``, ``terminal_reason: aborted_streaming`` or ``aborted_tools``).
- An interrupt while idle is acknowledged and produces no ``result``; it does not carry over into
  the next turn. An interrupt written before the turn's ``system/init`` stops the turn on 2.1.332;
  older CLIs dropped it (claude-agent-sdk-typescript#429).
- On an interrupt the CLI withdraws a pending ``can_use_tool`` with ``control_cancel_request``
  and expects no answer.
- ``--resume <id>`` keeps the session id. An unknown id makes the CLI write a ``result``
  (``error_during_execution``, ``errors: ["No conversation found with session ID: ..."]``)
  *instead of* answering ``initialize``, and exit 1.

Decisions:

- **Established on the ``initialize`` answer**, not at once and not at ``system/init``. Waiting
  for ``system/init`` would deadlock (it needs a prompt first); establishing at once would let a
  CLI that exits at start-up (a bad flag, a lost ``--resume`` session) look like a mid-session
  crash, which the actor answers with a respawn, forever. The ``initialize`` answer proves the CLI
  is up and speaks the control protocol, and costs nothing: the CLI would not read a prompt
  sooner. An error answer still establishes (the CLI works without ``initialize``), with a detail.
- **``resumed=True`` means the CLI accepted ``--resume <id>``**: it loaded the conversation and
  answered ``initialize``. It refuses an unknown id before that, which is
  ``StartFailed(resume_failed=True)``: the actor starts the CLI again without the flag, and the
  receipt says the session could not be resumed. The next
  ``system/init`` confirms the id; a different one is reported as an ``error`` event
  (``resume_mismatch``) and adopted, since the CLI now writes its transcript there.
- ``agent_session_id`` is the id of the latest ``system/init``, or the id we resumed until one
  arrives (so a process killed before its first ``system/init`` still resumes the right
  conversation), or None for a fresh CLI that has not said yet.
- A turn's end is its first ``result``. A ``result`` while no turn runs (a background task's
  extra turn) becomes ``session.info`` (``info_kind="result"``) and ends nothing, as does
  ``system/session_state_changed``.
- ``interrupted`` is True for ``terminal_reason`` ``aborted_streaming``/``aborted_tools`` (even
  with ``is_error``); False for ``completed``, or a ``success`` when no ``terminal_reason`` is
  given, both only without ``is_error`` (an API error can come as ``success``/``completed`` with
  ``is_error``: a failed turn, never one that completed); None otherwise. ``error`` (the
  ``errors``, else the ``result`` text, or Amp's ``error``) is set for any other ``is_error`` or
  non-``success`` result, except an ``error_during_execution`` without ``terminal_reason`` after
  our interrupt: older CLIs report an interrupt that way (edge case 15), so it is left to the
  actor, which knows it asked.
- One ``interrupt`` per turn, never while idle, never awaited, and never a signal (SIGINT is
  unreliable in stream-json mode, edge case 20). If it went out before this turn's
  ``system/init``, it is sent once more when that arrives and the turn still runs (for CLIs that
  drop early interrupts; harmless otherwise: a late one is acknowledged and ignored), and the
  ``TurnFinished`` says so in ``details``.
- Permissions: ``can_use_tool`` offers ``allow`` and ``deny``. ``allow`` echoes the original
  input as ``updatedInput``; ``deny`` says "Denied by user"; a person's *cancelled* answer denies
  without ending the turn; :meth:`cancel_permissions` (part of every cancel) denies with
  ``interrupt: true``. A ``control_cancel_request`` withdraws one: ``permission.resolved`` by
  ``agent``, and it is never answered afterwards.
  Permissions still pending at a ``result`` stay pending (a background subagent may still
  be asking); the CLI withdraws them or a person answers them.
- We register no hooks or SDK MCP servers, so any other CLI request is answered with an error.

Background tasks (sub-agents, background shells, monitors). Checked against 2.1.332 in this
stream-json mode on a fake model (``tests/real/test_real_claude_tasks.py``); the field lists are the
Agent SDK's ``sdk.d.ts`` (``SDKTaskStartedMessage``, ``SDKTaskUpdatedMessage``,
``SDKTaskNotificationMessage``, ``SDKControlStopTaskRequest``):

- A ``Bash`` call with ``run_in_background: true`` or an ``Agent`` call (sub-agent, background by
  default) starts a task: ``system/task_started`` with ``task_id``, ``run_id``, ``tool_use_id``,
  ``task_type`` (``local_bash``, id ``b`` + 8 of ``[0-9a-z]``; ``local_agent``, id ``a`` + 16 hex
  digits, also ``subagent_type``, ``spawn_depth``, ``prompt``) and ``is_backgrounded``; the CLI
  answers the call at once and the turn goes on. ``system/background_tasks_changed`` lists the
  running background tasks after each change; sub-agents may also write ``task_progress``. A
  foreground ``Agent`` (``run_in_background: false``) is a task too (``is_backgrounded: false``).
- A task ends with ``system/task_updated`` (``patch.status`` ``killed``/``completed``/``failed``,
  ``patch.end_time``), then ``system/task_notification`` (``status`` ``stopped``/``completed``/
  ``failed``, ``output_file``, ``summary``). Either ends it here; the messages stay
  ``session.info`` events. A task belongs to the turn it started in; the ones started while no
  turn runs (a background task's own extra turn) are not stopped by a later cancel.
- The ``interrupt`` (we declare no ``perTaskStopAffordance`` in ``initialize``) kills the turn's
  sub-agents itself, before it even acknowledges; it leaves **background shells running**: their
  processes (in their own session, out of reach of a kill of the CLI's process group) outlive the
  turn, and the CLI then does not exit on stdin EOF while they run (waited 15 s; SIGTERM ends
  both; SIGKILL orphans the shells to PID 1).
- ``stop_task {task_id}`` kills a running shell, answered in 5-15 ms: ``task_updated`` ``killed``,
  ``task_notification`` ``stopped``, ``background_tasks_changed``, then success ``{}``. A task
  that is gone or unknown is answered success ``{}`` as well. (The CLI's bridge contexts answer
  ``stop_task is not supported in this context (callback not registered)``; not this mode.)

Steering (measured on 2.1.332, ``tests/real/test_real_claude_steer.py``): a further ``user`` line
with a ``uuid`` and a ``priority``, written mid-turn. The CLI says ``command_lifecycle``
``queued`` for that uuid within ~2 ms (that is our ``SteerAnswered``, ``injected``). The
priority depends on what the turn is doing:

- while the model streams (no tool call of the turn's main thread is waiting for its result):
  ``"now"``. The CLI aborts the model's stream at once, writes a ``result`` for the old prompt
  (``success``, ``terminal_reason`` ``aborted_streaming``: a handover, not an interrupt) and runs
  the steered text next, ending with a ``result`` whose ``user_message_uuids`` names it;
- while a tool call runs or waits for its permission: ``"next"``. The steer joins the running
  cycle: the request after the tool's result carries it (in a ``<system-reminder>`` of the tool
  result), and the one ``result`` names both uuids. Not ``"now"``: a ``now`` steer withdraws a
  pending ``can_use_tool`` (the tool never runs), and while a Bash runs it marks the turn
  aborted-for-the-steer, after which an ``interrupt`` (even with ``cancel_queued``, even twice)
  no longer stops the Bash: the turn would end only when the command does (measured: a 12 s
  command ran to its end, the cancel's grace expired and the ladder killed the CLI). A ``next``
  steer leaves the interrupt working: the Bash is killed at once and the result comes in ~20 ms.

So while a steer of this turn is not named by a ``result`` yet, a ``result`` hands over and ends
nothing (``session.info``); the turn ends at the one that names every steer (a CLI that lists no
uuids: at the first one that is not a handover). A cancel with steers of the turn asks
``cancel_queued``, so they stop with the turn instead of running as a turn of their own after it:
2.1.332 honours it (``system/init`` ``capabilities`` lists ``interrupt_cancel_queued_v1``): it
answers ``{"still_queued": [], "cancelled": [uuid]}``, says ``command_lifecycle`` ``cancelled``
for the steer, and runs nothing after the interrupted ``result``.

So a cancel sends the ``interrupt`` first, then ``{"subtype": "stop_task", "task_id": ...}`` for
every task of this turn still running, all in the same step; a task that starts while the cancel
is in progress is stopped at its ``task_started``. One ``stop_task`` per task, never repeated.
The ``stop_task`` is what ends a background shell; for a sub-agent it confirms the interrupt's
kill. The turn's ``TurnFinished`` is held after its ``result`` until every ``stop_task`` is
answered (success: ``confirmed: true``; error: ``confirmed: false`` with the CLI's words);
``details`` then carries ``tasks``: ``[{task_id, confirmed, status?, error?}]`` (``status`` from
the task's ``task_notification`` or ``task_updated``; measured ``stopped`` for both kinds).
While it is held, output still carries the turn's id and a further ``result`` is
``session.info``. The actor's grace timer bounds the wait; a CLI killed first still gets its
``tasks`` into the receipt (``details_at_kill``: the unanswered ones unconfirmed). Measured
(2 shared cores, 5 runs): cancel to receipt 25-230 ms with a sub-agent, 65-120 ms with a
background shell (its ``task_notification`` 20-70 ms after the cancel).
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

import attrs
from attrs import define, field

from protocols import events as ev
from protocols.content import Part
from protocols.machine import (
    NOT_RESUMABLE,
    AgentProtocol,
    InterruptAnswered,
    SessionEstablished,
    StartFailed,
    SteerAnswered,
    Step,
    TurnFinished,
    argv_resumable,
    session_changed,
)
from protocols.mcp import McpServer
from protocols.permissions import DeskPermissions, Held, PermissionDesk
from protocols.tools import ToolVocabulary

__all__ = [
    "CLAUDE_COMMAND",
    "INTERRUPTED_REASONS",
    "PERMISSION_OPTIONS",
    "ClaudeClient",
    "claude_mcp_config",
]

#: The command line the Python SDK builds (``subprocess_cli.py``), plus partial messages for
#: live deltas and ``stdio`` so permission prompts come to us as ``can_use_tool``.
CLAUDE_COMMAND: Final = (
    "claude",
    "-p",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
    "--include-partial-messages",
    "--permission-prompt-tool",
    "stdio",
)

#: ``terminal_reason`` values that mean "stopped because asked" (SDK ``ResultMessage`` docs).
INTERRUPTED_REASONS: Final = frozenset({"aborted_streaming", "aborted_tools"})

ALLOW: Final = "allow"
DENY: Final = "deny"
PERMISSION_OPTIONS: Final = (
    ev.PermissionOption(option_id=ALLOW, name="Allow", option_kind="allow_once"),
    ev.PermissionOption(option_id=DENY, name="Deny", option_kind="reject_once"),
)
DENY_MESSAGE: Final = "Denied by user"
CANCELLED_MESSAGE: Final = "The user dismissed the permission request"
INTERRUPT_MESSAGE: Final = "The user stopped the turn"

#: Anthropic stream events that carry nothing a subscriber needs (the content deltas do).
_QUIET_STREAM_EVENTS: Final = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
    }
)
#: Content deltas that are not text: tool input arrives whole in the ``assistant`` message.
_QUIET_DELTAS: Final = frozenset({"input_json_delta", "signature_delta", "citations_delta"})
#: Top-level message types that describe the session, passed on as ``session.info``.
_INFO_TYPES: Final = frozenset({"auth_status", "rate_limit_event", "tool_use_summary"})
#: Content blocks of an ``assistant`` message that start a tool call.
_TOOL_BLOCKS: Final = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
#: Claude Code's built-in tools as ACP tool kinds, for UIs that draw them differently.
_TOOL_KINDS: Final = {
    "Bash": "execute",
    "BashOutput": "execute",
    "KillShell": "execute",
    "Read": "read",
    "NotebookRead": "read",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "edit",
    "NotebookEdit": "edit",
    "Glob": "search",
    "Grep": "search",
    "LS": "search",
    "WebFetch": "fetch",
    "WebSearch": "fetch",
    "Task": "think",
    "Agent": "think",  # the sub-agent tool's name in 2.1.332 (init lists it as "Task")
    "TodoWrite": "think",
    "ExitPlanMode": "switch_mode",
}
_TOOLS: Final = ToolVocabulary(kinds=_TOOL_KINDS)
#: Longest error text taken from a ``result`` (its ``errors`` can hold diagnostics).
_ERROR_CHARS: Final = 500


def _random_hex() -> str:
    return secrets.token_hex(4)


def _random_uuid() -> str:
    return str(uuid.uuid4())


#: ``task_notification`` / ``task_updated`` statuses after which a task no longer runs.
_TASK_ENDED: Final = frozenset({"completed", "failed", "stopped", "killed"})


@define
class _TaskStop:
    """One ``stop_task`` our cancel sent, and what came of it."""

    task_id: str
    confirmed: bool | None = None  # None: not answered yet
    status: str | None = None
    error: str | None = None

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": self.task_id, "confirmed": self.confirmed is True}
        if self.status is not None:
            out["status"] = self.status
        if self.error is not None:
            out["error"] = self.error
        return out


@define
class ClaudeClient(DeskPermissions[Any], AgentProtocol):
    """Our side of one ``claude -p --input-format stream-json`` process."""

    name: ClassVar[str] = "claude"
    prompt_carries: ClassVar[frozenset[str]] = frozenset({"image"})

    #: the random part of our request ids (``req_<n>_<hex>``, as the SDKs write them);
    #: tests pass a constant
    _new_hex: Callable[[], str] = field(default=_random_hex, kw_only=True)
    #: a steer's user-message uuid; tests pass a counter
    _new_uuid: Callable[[], str] = field(default=_random_uuid, kw_only=True)
    _phase: str = "idle"  # idle, initializing, ready, failed
    _resume: str | None = None
    #: a resume was asked with an id no command line can carry: this is a fresh session
    _unresumable: bool = False
    _init_session_id: str | None = None
    _request_count: int = 0
    _requests: dict[str, str] = field(factory=dict)  # our control requests: id -> subtype
    #: our interrupts not answered yet: request id -> the turn they stop
    _interrupting: dict[str, str] = field(factory=dict)
    _turn_id: str | None = None
    _interrupt_sent: bool = False
    _init_in_turn: bool = False  # a system/init arrived since this turn's user message
    _resend_on_init: bool = False
    _interrupt_resent: bool = False
    #: pending ``can_use_tool`` requests; the ticket is the tool input, echoed back as
    #: ``updatedInput`` when allowed
    _desk: PermissionDesk[Any] = field(factory=PermissionDesk)
    #: running tasks (``task_started`` not yet ended) -> the turn they started in
    _tasks: dict[str, str | None] = field(factory=dict)
    #: this turn's ``stop_task`` requests, by task id, in the order sent
    _stops: dict[str, _TaskStop] = field(factory=dict)
    _stop_requests: dict[str, str] = field(factory=dict)  # our request id -> task id
    _stopping_tasks: bool = False  # this turn's cancel stops its tasks (not Amp's signal)
    #: the turn's result came; held until every stop_task is answered
    _finishing: TurnFinished | None = None
    # Text that arrived as partial deltas is not emitted again from the whole message.
    _streaming: dict[str | None, str] = field(factory=dict)  # parent_tool_use_id -> message id
    _streamed: set[str] = field(factory=set)
    initialize_response: dict[str, Any] = field(factory=dict)
    #: this turn's steers not named by a ``result`` yet: uuid -> steer id
    _steers: dict[str, int] = field(factory=dict)
    #: steer uuids whose SteerAnswered is still owed
    _unanswered: set[str] = field(factory=set)
    #: tool calls of this turn's main thread (``tool_use`` blocks) with no ``tool_result`` yet
    _open_tools: set[str] = field(factory=set)

    @classmethod
    def command(
        cls, base: Sequence[str], resume: str | None, *, mcp_servers: Sequence[McpServer] = ()
    ) -> list[str]:
        """``--mcp-config JSON`` adds the servers to those Claude Code finds itself (its
        settings, ``.mcp.json``); a configured ``--strict-mcp-config`` makes them the only
        ones. Then ``--resume``: an option, so it also ends ``--mcp-config``'s value list."""
        argv = list(base)
        if mcp_servers:
            argv += ["--mcp-config", json.dumps(claude_mcp_config(mcp_servers))]
        if resume is not None and argv_resumable(resume):  # else a fresh start (start())
            argv += ["--resume", resume]
        return argv

    # -- calls from the actor -------------------------------------------------------------

    def start(
        self, *, cwd: str, resume: str | None = None, mcp_servers: Sequence[McpServer] = ()
    ) -> Step:
        # cwd: the launcher starts the CLI there; the protocol has no field for it.
        if self._phase != "idle":
            raise RuntimeError("start() called twice")
        self._phase = "initializing"
        self._unresumable = resume is not None and not argv_resumable(resume)
        self._resume = None if self._unresumable else resume
        return Step(send=[self._request({"subtype": "initialize", "hooks": None})])

    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        if self._phase != "ready" or self._turn_id is not None:
            raise RuntimeError(f"prompt() while {self._phase} with turn {self._turn_id}")
        self._turn_id = turn_id
        self._interrupt_sent = False
        self._init_in_turn = False
        self._resend_on_init = False
        self._interrupt_resent = False
        self._stops = {}
        self._stopping_tasks = False
        self._steers = {}
        self._unanswered = set()
        self._open_tools = set()
        return Step(
            send=[
                {
                    "type": "user",
                    "message": {"role": "user", "content": _content(text, parts)},
                    "parent_tool_use_id": None,
                    "session_id": self.agent_session_id or "default",
                }
            ]
        )

    def cancel(self) -> Step:
        # No turn, no interrupt: an idle interrupt gets no result, so nothing would end.
        if self._turn_id is None or self._interrupt_sent or self._finishing is not None:
            return Step()
        self._interrupt_sent = True
        self._resend_on_init = not self._init_in_turn
        self._stopping_tasks = True
        interrupt: dict[str, Any] = {"subtype": "interrupt"}
        if self._steers:
            interrupt["cancel_queued"] = True  # steers stop with the turn, never run after it
        step = Step(send=[self._request(interrupt)])
        # The turn first, so it starts no more tasks; then every task it started, at once.
        for task_id, turn_id in list(self._tasks.items()):
            if turn_id == self._turn_id:
                step.extend(self._stop_task(task_id))
        return step

    @property
    def can_steer(self) -> bool:
        return True

    def steer(self, turn_id: str, steer_id: int, text: str) -> Step:
        if self._turn_id != turn_id or self._finishing is not None:
            raise RuntimeError(f"steer() of turn {turn_id} while {self._turn_id} runs")
        message_uuid = self._new_uuid()
        self._steers[message_uuid] = steer_id
        self._unanswered.add(message_uuid)
        return Step(
            send=[
                {
                    "type": "user",
                    "message": {"role": "user", "content": text},
                    "parent_tool_use_id": None,
                    "session_id": self.agent_session_id or "default",
                    "uuid": message_uuid,
                    # A tool call waits for its result: join the cycle at its end (see above).
                    "priority": "next" if self._open_tools else "now",
                }
            ]
        )

    def _answer_steer(self, message_uuid: str, injected: bool, detail: str | None = None) -> Step:
        if message_uuid not in self._unanswered or self._turn_id is None:
            return Step()
        self._unanswered.discard(message_uuid)
        steer_id = self._steers[message_uuid]
        if not injected:
            del self._steers[message_uuid]
        return Step(events=[SteerAnswered(steer_id, self._turn_id, injected, detail=detail)])

    def _on_command_lifecycle(self, message: dict[str, Any]) -> Step:
        step = Step(events=[ev.SessionInfo(info_kind="command_lifecycle", data=message)])
        command = message.get("command_uuid")
        state = message.get("state")
        if isinstance(command, str) and command in self._unanswered:
            if state in ("queued", "started", "completed"):
                step.extend(self._answer_steer(command, True))
            elif state == "cancelled":
                step.extend(self._answer_steer(command, False, "the CLI cancelled the steer"))
        return step

    @property
    def running_tasks(self) -> dict[str, str | None]:
        """Tasks started and not ended, with the turn each started in."""
        return dict(self._tasks)

    @property
    def agent_session_id(self) -> str | None:
        return self._init_session_id or self._resume

    def details_at_kill(self) -> dict[str, Any]:
        """The running turn's ``stop_task`` requests, for a receipt whose CLI is killed before
        the turn ended: those never answered are ``confirmed: false``."""
        if self._turn_id is None or not self._stops:
            return {}
        return {"tasks": [stop.detail() for stop in self._stops.values()]}

    # -- messages from the CLI ------------------------------------------------------------

    def receive(self, message: dict[str, Any]) -> Step:
        kind = message.get("type")
        if kind == "stream_event":
            return self._on_stream_event(message)
        if kind == "assistant":
            return self._on_assistant(message)
        if kind == "user":
            return self._on_user(message)
        if kind == "result":
            return self._on_result(message)
        if kind == "system":
            return self._on_system(message)
        if kind == "control_request":
            return self._on_control_request(message)
        if kind == "control_cancel_request":
            return self._on_control_cancel(message)
        if kind == "control_response":
            return self._on_control_response(message)
        if kind == "tool_progress":
            return self._on_tool_progress(message)
        if kind == "command_lifecycle":
            return self._on_command_lifecycle(message)
        if isinstance(kind, str) and kind in _INFO_TYPES:
            return Step(events=[ev.SessionInfo(info_kind=kind, data=message)])
        return _unparsed(message)

    # -- control envelopes ----------------------------------------------------------------

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        self._request_count += 1
        request_id = f"req_{self._request_count}_{self._new_hex()}"
        self._requests[request_id] = str(request["subtype"])
        if request["subtype"] == "interrupt" and self._turn_id is not None:
            self._interrupting[request_id] = self._turn_id
        return {"type": "control_request", "request_id": request_id, "request": request}

    def _on_control_response(self, message: dict[str, Any]) -> Step:
        response = message.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("request_id"), str):
            return _unparsed(message)
        request_id = response["request_id"]
        subtype = self._requests.pop(request_id, None)
        if subtype is None:
            return Step(
                events=[
                    ev.ErrorEvent(
                        code="protocol_error",
                        message=f"control_response to unknown request id {request_id!r}",
                    )
                ]
            )
        failed = response.get("subtype") == "error"
        interrupted = self._interrupting.pop(request_id, None)
        if subtype == "initialize":
            return self._on_initialized(response, failed)
        if subtype == "stop_task":
            return self._on_task_stopped(request_id, response, failed)
        if failed:
            return Step(
                events=[
                    ev.ErrorEvent(
                        code="control_error",
                        message=f"{subtype} request failed: {response.get('error')}",
                    )
                ]
            )
        # An acknowledgement (for interrupt: a receipt); the turn ends only with its result.
        if interrupted is not None:
            return Step(events=[InterruptAnswered(interrupted)])
        return Step()

    def _on_initialized(self, response: dict[str, Any], failed: bool) -> Step:
        if self._phase != "initializing":
            return Step()
        detail = None
        if failed:
            detail = (
                f"initialize failed ({response.get('error')}); continuing, since the CLI"
                " takes messages without it"
            )
        else:
            body = response.get("response")
            self.initialize_response = body if isinstance(body, dict) else {}
        self._phase = "ready"
        resumed = None if self._resume is None else True
        if self._unresumable:
            resumed, detail = False, NOT_RESUMABLE
        # A fresh CLI names its session only in system/init, after the first prompt.
        return Step(events=[SessionEstablished(self._resume or "", resumed, detail)])

    def _on_control_request(self, message: dict[str, Any]) -> Step:
        request_id = message.get("request_id")
        request = message.get("request")
        if not isinstance(request_id, str) or not isinstance(request, dict):
            return _unparsed(message)
        subtype = request.get("subtype")
        if subtype == "can_use_tool":
            return self._on_can_use_tool(request_id, request)
        reply = {
            "type": "control_response",
            "response": {
                "subtype": "error",
                "request_id": request_id,
                "error": f"Unsupported control request: {subtype}",
            },
        }
        return Step(send=[reply])

    def _on_can_use_tool(self, request_id: str, request: dict[str, Any]) -> Step:
        if request_id in self._desk:
            return Step(
                events=[
                    ev.ErrorEvent(
                        code="protocol_error",
                        message=f"can_use_tool request id {request_id!r} is already pending",
                    )
                ]
            )
        tool_input = request.get("input", {})
        tool_name = request.get("tool_name")
        tool_call = {
            "toolCallId": _opt_str(request.get("tool_use_id")) or "",
            "title": _opt_str(request.get("display_name")) or _opt_str(tool_name) or "",
            "kind": _TOOLS.kind(tool_name, None),
            "rawInput": tool_input,
            "claude": request,
        }
        requested = self._desk.hold(
            request_id, self._turn_id, PERMISSION_OPTIONS, tool_call, tool_input
        )
        return Step(events=[requested])

    def _answer_permission(self, held: Held[Any], option_id: str | None, *, by: str) -> Step:
        answer: dict[str, Any]
        if option_id == ALLOW:
            answer = {"behavior": "allow", "updatedInput": held.ticket}
        elif option_id == DENY:
            answer = {"behavior": "deny", "message": DENY_MESSAGE}
        elif by == "supervisor":
            # Part of a cancel: the deny also ends the turn, should the interrupt be lost.
            answer = {"behavior": "deny", "message": INTERRUPT_MESSAGE, "interrupt": True}
        else:
            answer = {"behavior": "deny", "message": CANCELLED_MESSAGE}
        reply = {
            "type": "control_response",
            "response": {
                "subtype": "success",
                "request_id": held.request_id,
                "response": answer,
            },
        }
        return Step(send=[reply], events=[PermissionDesk.resolved(held, option_id, by=by)])

    def _on_control_cancel(self, message: dict[str, Any]) -> Step:
        request_id = message.get("request_id")
        if not isinstance(request_id, str):
            return _unparsed(message)
        held = self._desk.pop(request_id)
        if held is None:
            return Step()  # one we already answered (a cancel races the CLI's withdrawal)
        return Step(events=[PermissionDesk.resolved(held, None, by="agent")])

    # -- session and turn -----------------------------------------------------------------

    def _on_system(self, message: dict[str, Any]) -> Step:
        subtype = message.get("subtype")
        if not isinstance(subtype, str):
            return _unparsed(message)
        if subtype == "init":
            return self._on_init(message)
        step = Step(events=[ev.SessionInfo(info_kind=subtype, data=message)])
        task_id = message.get("task_id")
        if not isinstance(task_id, str):
            return step
        if subtype == "task_started":
            return step.extend(self._on_task_started(task_id))
        status: Any = None
        if subtype == "task_notification":
            status = message.get("status")
        elif subtype == "task_updated":
            patch = message.get("patch")
            status = patch.get("status") if isinstance(patch, dict) else None
        if isinstance(status, str) and status in _TASK_ENDED:
            self._tasks.pop(task_id, None)
            stop = self._stops.get(task_id)
            if stop is not None:
                stop.status = status
        return step

    # -- background tasks -----------------------------------------------------------------

    def _on_task_started(self, task_id: str) -> Step:
        self._tasks[task_id] = self._turn_id
        if self._turn_id is not None and self._stopping_tasks:
            return self._stop_task(task_id)  # started while we stop the turn
        return Step()

    def _stop_task(self, task_id: str) -> Step:
        if task_id in self._stops:
            return Step()
        self._stops[task_id] = _TaskStop(task_id)
        message = self._request({"subtype": "stop_task", "task_id": task_id})
        self._stop_requests[message["request_id"]] = task_id
        return Step(send=[message])

    def _on_task_stopped(self, request_id: str, response: dict[str, Any], failed: bool) -> Step:
        task_id = self._stop_requests.pop(request_id, None)
        stop = self._stops.get(task_id) if task_id is not None else None
        if stop is None or stop.confirmed is not None:
            return Step()  # a late answer for an earlier turn's stop
        stop.confirmed = not failed
        if failed:
            stop.error = str(response.get("error"))
        return self._release()

    def _release(self) -> Step:
        """End the turn once its result came and every stop_task is answered."""
        finished = self._finishing
        if finished is None or any(stop.confirmed is None for stop in self._stops.values()):
            return Step()
        self._finishing = None
        self._turn_id = None
        if self._stops:
            details = {**finished.details, "tasks": [s.detail() for s in self._stops.values()]}
            finished = attrs.evolve(finished, details=details)
        return Step(events=[finished])

    def _on_init(self, message: dict[str, Any]) -> Step:
        session_id = message.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            return _unparsed(message)
        step = Step(events=[ev.SessionInfo(info_kind="init", data=message)])
        changed = session_changed(
            self._init_session_id or self._resume,
            self._init_session_id is not None,
            session_id,
            agent="the CLI",
            kind="session",
        )
        if changed is not None:
            step.events.append(changed)
        self._init_session_id = session_id
        if self._turn_id is not None and self._finishing is None:
            self._init_in_turn = True
            if self._resend_on_init and not self._interrupt_resent:
                # The interrupt went out before the CLI had started the turn, where older
                # CLIs drop it (claude-agent-sdk-typescript#429): say it once more.
                self._interrupt_resent = True
                step.send.append(self._request({"subtype": "interrupt"}))
        return step

    def _on_result(self, message: dict[str, Any]) -> Step:
        if self._phase == "initializing":
            # The CLI gave up before the session existed (e.g. --resume of an unknown id).
            self._phase = "failed"
            return Step(
                events=[
                    StartFailed(
                        f"the CLI stopped at start: {_describe(message)}",
                        resume_failed=self._resume is not None,
                    )
                ]
            )
        turn_id = self._turn_id
        if turn_id is None or self._finishing is not None:
            # A later result for the same prompt (a background task's turn): not a turn end.
            return Step(events=[ev.SessionInfo(info_kind="result", data=message)])
        answers = Step()
        if self._steers and not self._interrupt_sent:
            answers, ends = self._steered_result(message)
            if not ends:
                return answers
        self._streaming.clear()
        self._streamed.clear()
        subtype = _opt_str(message.get("subtype"))
        reason = _opt_str(message.get("terminal_reason"))
        is_error = message.get("is_error") is True
        interrupted: bool | None = None
        if reason in INTERRUPTED_REASONS:
            interrupted = True
        elif not is_error and (reason == "completed" or (reason is None and subtype == "success")):
            # Finished by itself, and well: with an error it did not complete, whatever raced it.
            interrupted = False
        error = None
        if interrupted is not True and (is_error or subtype not in ("success", None)):
            reported_interrupt = (
                self._interrupt_sent and reason is None and subtype == "error_during_execution"
            )
            if not reported_interrupt:
                error = _describe(message)
        details: dict[str, Any] = {"interrupt_resent": True} if self._interrupt_resent else {}
        self._finishing = TurnFinished(turn_id, reason or subtype, interrupted, error, details)
        return answers.extend(self._release())

    def _steered_result(self, message: dict[str, Any]) -> tuple[Step, bool]:
        """A ``result`` in a steered turn: the steered text's own (it ends the turn: True) or
        the old prompt's, handing over to it (a ``session.info``; the turn goes on). The step
        answers the steers it names that had no ``command_lifecycle`` yet."""
        named = message.get("user_message_uuids")
        if not isinstance(named, list):
            single = message.get("user_message_uuid")
            named = [single] if isinstance(single, str) else None
        step = Step()
        if named is None:
            # A CLI that names nothing: only a stop that is not an error hands over.
            reason = message.get("terminal_reason")
            if message.get("is_error") is True or reason not in INTERRUPTED_REASONS:
                self._steers.clear()
                return step, True
            for message_uuid in list(self._unanswered):
                step.extend(self._answer_steer(message_uuid, True))
            self._steers.clear()  # the next result is the steered text's
        else:
            for message_uuid in named:
                if isinstance(message_uuid, str) and message_uuid in self._steers:
                    step.extend(self._answer_steer(message_uuid, True))
                    del self._steers[message_uuid]
            if not self._steers:
                return step, True  # every steer is answered by this result: it ends the turn
        self._streaming.clear()
        self._streamed.clear()
        step.events.append(ev.SessionInfo(info_kind="result", data=message))
        return step, False

    # -- content --------------------------------------------------------------------------

    def _on_stream_event(self, message: dict[str, Any]) -> Step:
        event = message.get("event")
        if not isinstance(event, dict):
            return _unparsed(message)
        parent = message.get("parent_tool_use_id")
        parent = parent if isinstance(parent, str) else None
        kind = event.get("type")
        if kind == "message_start":
            body = event.get("message")
            message_id = body.get("id") if isinstance(body, dict) else None
            if isinstance(message_id, str):
                self._streaming[parent] = message_id
            else:
                self._streaming.pop(parent, None)
            return Step()
        if kind == "content_block_delta":
            delta = event.get("delta")
            delta_kind = delta.get("type") if isinstance(delta, dict) else None
            out: ev.Event
            if delta_kind == "text_delta" and isinstance(delta, dict):
                text = delta.get("text")
                if not isinstance(text, str):
                    return _unparsed(message)
                out = ev.MessageDelta(turn_id=self._turn_id, text=text)
            elif delta_kind == "thinking_delta" and isinstance(delta, dict):
                thinking = delta.get("thinking")
                if not isinstance(thinking, str):
                    return _unparsed(message)
                out = ev.ThoughtDelta(turn_id=self._turn_id, text=thinking)
            elif isinstance(delta_kind, str) and delta_kind in _QUIET_DELTAS:
                return Step()
            else:
                return _unparsed(message)
            if parent in self._streaming:
                self._streamed.add(self._streaming[parent])
            return Step(events=[out])
        if isinstance(kind, str) and kind in _QUIET_STREAM_EVENTS:  # (a list: unhashable)
            return Step()
        return _unparsed(message)

    def _on_assistant(self, message: dict[str, Any]) -> Step:
        body = message.get("message")
        if not isinstance(body, dict):
            return _unparsed(message)
        content = _blocks(body.get("content"))
        if content is None:
            return _unparsed(message)
        message_id = body.get("id")
        streamed = isinstance(message_id, str) and message_id in self._streamed
        turn = self._turn_id
        step = Step()
        for block in content:
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                if not streamed:
                    step.events.append(ev.MessageDelta(turn_id=turn, text=block["text"]))
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                if not streamed:
                    step.events.append(ev.ThoughtDelta(turn_id=turn, text=block["thinking"]))
            elif isinstance(kind, str) and kind in _TOOL_BLOCKS:
                name = block.get("name")
                if kind == "tool_use" and message.get("parent_tool_use_id") is None:
                    self._open_tools.add(str(block.get("id", "")))
                step.events.append(
                    ev.ToolCall(
                        turn_id=turn,
                        tool_call_id=str(block.get("id", "")),
                        title=name if isinstance(name, str) else "",
                        tool_kind=_TOOLS.kind(name, None),
                        status="pending",
                        raw=block,
                    )
                )
        return step

    def _on_user(self, message: dict[str, Any]) -> Step:
        """Tool results, and what the CLI adds on the user's side ("[Request interrupted]")."""
        body = message.get("message")
        if not isinstance(body, dict):
            return _unparsed(message)
        content = _blocks(body.get("content"))
        if content is None:
            return _unparsed(message)
        turn = self._turn_id
        step = Step()
        for block in content:
            kind = block.get("type")
            if kind == "tool_result":
                self._open_tools.discard(str(block.get("tool_use_id", "")))
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

    def _on_tool_progress(self, message: dict[str, Any]) -> Step:
        tool_use_id = message.get("tool_use_id")
        if not isinstance(tool_use_id, str):
            return _unparsed(message)
        return Step(
            events=[
                ev.ToolUpdate(
                    turn_id=self._turn_id,
                    tool_call_id=tool_use_id,
                    status="in_progress",
                    raw=message,
                )
            ]
        )


def _unparsed(message: dict[str, Any]) -> Step:
    return Step(events=[ev.AgentUnparsed(raw=message)])


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _blocks(content: Any) -> list[dict[str, Any]] | None:
    """A message's content blocks (a plain string is one text block); None if malformed."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return None


def _describe(result: dict[str, Any]) -> str:
    """What went wrong in a ``result``, for a person: its cause, then the CLI's words."""
    cause = _opt_str(result.get("terminal_reason")) or _opt_str(result.get("subtype")) or "error"
    errors = result.get("errors")
    words = [e for e in errors if isinstance(e, str)] if isinstance(errors, list) else []
    if not words:
        # Claude Code puts the text in ``result``; Amp's error form in ``error``.
        words = [result[key] for key in ("result", "error") if isinstance(result.get(key), str)][:1]
    text = f"{cause}: {'; '.join(words)}" if words else cause
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


def claude_mcp_config(servers: Sequence[McpServer]) -> dict[str, Any]:
    """The ``{"mcpServers": {NAME: ...}}`` document ``--mcp-config`` reads: ``stdio``
    (``command``, ``args``, ``env``), ``http`` and ``sse`` (``url``, ``headers``)."""
    entries: dict[str, Any] = {}
    for server in servers:
        if server.transport == "stdio":
            entries[server.name] = {
                "type": "stdio",
                "command": server.command,
                "args": list(server.args),
                "env": server.env_dict,
            }
        else:
            entries[server.name] = {
                "type": server.transport,
                "url": server.url,
                "headers": server.headers_dict,
            }
    return {"mcpServers": entries}


def _content(text: str, parts: Sequence[Part]) -> str | list[dict[str, Any]]:
    """The user message's content: the text, or (images in it) the Messages API's blocks, an
    image as a base64 ``source``; links and text resources as text."""
    if not parts:
        return text
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if part.needs == "image":
            source = {"type": "base64", "media_type": part.mime_type, "data": part.data}
            blocks.append({"type": "image", "source": source})
        else:
            blocks.append({"type": "text", "text": part.as_text()})
    return blocks
