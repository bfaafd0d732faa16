"""Codex app-server (``codex app-server``, protocol "v2"), client side, as a sans-IO machine.

Facts this follows (``shared/protocols.md`` section 2 and edge cases 8-14, ``shared/real-agents.md``
for Codex 0.171.0):

- JSON-RPC without the ``"jsonrpc"`` member, one object per line; the server numbers its own
  requests from 0, so its ids collide with ours (``JsonRpcPeer`` keeps the two spaces apart).
- ``initialize`` (we opt into ``experimentalApi`` for ``thread/backgroundTerminals/clean``), its
  reply, the ``initialized`` notification, then ``thread/start`` or ``thread/resume``.
- A turn is ``turn/start``; its *reply* names the Codex turn (the turn is then identified) and
  only ``turn/completed`` for that turn ends it. ``turn/started`` comes later, when it runs.
  ``status: "failed"`` ends it with its ``error``, or else with the words of the last ``error``
  notification about it that Codex will not retry (``willRetry: false``, sent before
  ``turn/completed``); one that comes after is an ``error`` event and changes nothing.
- ``turn/interrupt`` is a request whose ``{}`` is held back until the turn aborts, and may never
  come (openai/codex#36926): nothing here waits on it, and we send one per turn. It is rejected
  at once with -32600 when the id is stale (``expected active turn id X but found Y``: we retry
  once against ``Y``) or nothing runs yet (``no active turn to interrupt`` before ``turn/started``:
  we retry once when ``turn/started`` comes; after the turn ended its own ``turn/completed``
  decides).
- ``turn/interrupt`` does not stop background terminals: after a turn we interrupted ends
  ``interrupted`` we send ``thread/backgroundTerminals/clean`` and hold the turn's end until it
  is answered (the actor's grace timer bounds that wait like any other).
- Approvals are server→client requests answered ``{"decision": ...}``; the server retracts them
  at turn transitions with ``serverRequest/resolved``. Requests we do not serve are answered
  -32601 so the server never waits on us. An MCP elicitation that asks only for a yes or no
  (a ``form`` whose schema requires nothing: how Codex asks before a call of an MCP server's
  tool, ``_meta.codex_approval_kind: "mcp_tool_call"``) is a permission request (accept or
  decline; cancelled: ``cancel``); any other elicitation (a form to fill, a URL) is declined.

Sub-agents (child threads) and goals, shapes from the 0.171.0 schema bundle
(``codex_app_server_protocol.v2.schemas.json``: ``Thread``, ``ThreadItem``, ``ThreadGoal*``),
checked against the real 0.171.0 app-server (``tests/real/test_real_codex_children.py``, whose
docstring has the measurements):

- A thread is one of **ours** (a descendant of our thread) when a ``subAgentActivity`` item on
  one of our threads names it as ``agentThreadId`` (what the real server sends when the model
  calls ``spawn_agent``, ``[features] multi_agent_v2``), when one of its turns has a
  ``rootTurnId`` of ours (the real server sets it on a child's ``turn/started``), when its
  ``thread/started`` names a known thread as ``thread.parentThreadId`` (or ``thread.source.
  subAgent.thread_spawn.parent_thread_id``; the real server sent no ``thread/started`` for a
  child), or when a ``collabAgentToolCall`` item whose ``senderThreadId`` is ours lists it in
  ``receiverThreadIds``. Its running turn is tracked from its own ``turn/started`` and
  ``turn/completed`` (``{threadId, turn: {id, status}}``), which the server forwards to us.
  Known children are kept for the whole connection, so a child spawned in an earlier turn that
  is still running is stopped too.
- **Interrupting the root does not stop a child** (measured: the child went on streaming from
  the model); ``turn/interrupt`` on the child's thread and turn does, in ~8 ms.
- Child thread notifications are surfaced like the root's, with **our** turn id (as Claude's
  subagent messages are): deltas, tool calls, plans; a child's ``turn/started``,
  ``turn/completed`` and ``thread/started`` become ``session.info`` (their ``data`` names the
  thread). Other threads' notifications stay ``agent.unparsed``.
- A cancel sends, in this order and in one step: ``thread/goal/set {threadId, status:
  "paused", origin: "user"}`` when our thread's goal is ``active`` (an interrupted turn leaves
  the goal active; 0.171.0 starts no goal turn right after the interrupt, but does as soon as
  the person's next turn completes, and goes on by itself: the stop looks ignored); the root
  ``turn/interrupt`` (the rules above); then one ``turn/interrupt`` per running child turn, at
  once. A child turn that starts while the cancel is in progress is interrupted when its
  ``turn/started`` arrives; no child turn is interrupted twice.
- The root ``TurnFinished`` is held until every interrupted child turn has confirmed (its
  ``turn/completed``) or refused (an error reply), the goal pause is answered, and background
  terminals are cleaned; ``details`` then carries ``children`` (``[{thread_id, turn_id,
  confirmed, status?, error?}]``) and ``goal`` (``"paused"`` or ``"not paused: ..."``) when
  those steps were taken. The actor's grace timer bounds the wait: a child that never answers
  means a kill of the whole app-server tree.
- Our thread's goal status comes from ``thread/goal/updated`` / ``thread/goal/cleared``, and,
  after a ``thread/resume``, from one ``thread/goal/get``. A goal we paused is **left paused**:
  the person stopped the work; resuming it is theirs to ask for (``thread/goal/set`` ``active``).

Goal turns are part of the person's turn. When a Codex turn *completes* while our thread's goal
is ``active`` (the model's ``create_goal`` makes it so mid-turn), 0.171.0 starts the next goal
turn by itself ~10 ms later (``turn/started`` with a new id, items, ``turn/completed``) and goes
on until the goal is no longer active. So:

- a ``completed`` Codex turn with the goal ``active`` (or our pause still unanswered) does not
  end our turn: its ``TurnFinished`` is **held**;
- the next ``turn/started`` on our thread while we hold is **adopted**: it becomes our turn's
  Codex id (its deltas and items carry our turn id; a cancel interrupts it, the goal paused
  first as above; a goal turn that starts after our cancel is interrupted at once), and the
  ids before it count as finished (late duplicates and stale-id rejections of them are
  ignored);
- our turn ends when a Codex turn completes and the goal is not ``active``, or when, while we
  hold, the goal leaves ``active`` (``complete``, ``paused``, ``blocked``, ``budgetLimited``,
  ``usageLimited``: ``thread/goal/updated`` before or after ``turn/completed``; ``thread/goal/
  cleared``), or our cancel's pause is answered. The end has the last Codex turn's status;
  ``details`` has ``goal_turns`` (how many were adopted, when any) and ``goal`` (the pause's
  outcome, else the goal status that released us, ``cleared`` when cleared). A cancel that
  finds the turn held (nothing runs) sends only the pause; its answer ends the turn with
  ``interrupted=True`` (the goal's work stopped because we asked; ``None`` if the pause was
  refused: we cannot tell);
- an ``interrupted`` or ``failed`` Codex turn ends our turn at once, as always (0.171.0 starts
  no goal turn after an interrupted one).

The server starts no goal turn when the goal stops being active (budget used up, the model's
``update_goal``); it then sends ``thread/goal/updated`` with the new status, which releases us.
If nothing at all arrives, the turn stays open until the person cancels: that is honest, the
goal is still running as far as Codex said. A goal set ``active`` by someone else while no turn
of ours runs makes Codex start turns outside any turn of ours; those are not adopted.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
from attrs import define, field, frozen

from protocols import events as ev
from protocols.content import Part, data_url
from protocols.jsonrpc import (
    METHOD_NOT_FOUND,
    IncomingNotification,
    IncomingRequest,
    IncomingResponse,
    InvalidMessage,
    JsonRpcPeer,
    RequestId,
    UnknownResponse,
)
from protocols.machine import (
    AgentProtocol,
    InterruptAnswered,
    SessionEstablished,
    StartFailed,
    SteerAnswered,
    Step,
    TurnFinished,
)
from protocols.mcp import McpServer, McpUnsupported, check_transports
from protocols.permissions import DeskPermissions, Held, PermissionDesk
from protocols.tools import ToolVocabulary

__all__ = ["CLIENT_INFO", "CodexClient", "codex_mcp_table"]

CLIENT_INFO = {"name": "agent-supervisor", "title": "agent-supervisor", "version": "0.1.0"}

#: ``turn/interrupt`` against a turn that is not the active one (turn_processor.rs). The
#: ``turn/steer`` variant wraps both ids in backticks; accept either.
_STALE_TURN = re.compile(
    r"expected active turn id `?(?P<sent>[^`\s]+)`? but found `?(?P<found>[^`\s]+)`?"
)
_NO_ACTIVE_TURN = "no active turn to interrupt"
#: ``turn/steer`` after the turn ended (``turn_steer_inner``, like the interrupt's)
_NO_ACTIVE_TURN_TO_STEER = "no active turn to steer"

#: The decisions an approval can be answered with; they are also the permission option ids.
_DECISIONS = ("accept", "acceptForSession", "decline", "cancel")
_OPTIONS = {
    "accept": ev.PermissionOption(option_id="accept", name="Accept", option_kind="allow_once"),
    "acceptForSession": ev.PermissionOption(
        option_id="acceptForSession", name="Accept for this session", option_kind="allow_always"
    ),
    "decline": ev.PermissionOption(
        option_id="decline", name="Decline (the turn goes on)", option_kind="reject_once"
    ),
    "cancel": ev.PermissionOption(
        option_id="cancel", name="Decline and stop the turn", option_kind="reject_once"
    ),
}
#: The legacy v1 methods spell the same decisions as ``ReviewDecision`` (snake_case).
_LEGACY_DECISIONS = {
    "accept": "approved",
    "acceptForSession": "approved_for_session",
    "decline": "denied",
    "cancel": "abort",
}
#: Approval request methods and how each is answered.
_APPROVALS = {
    "item/commandExecution/requestApproval": "decision",
    "item/fileChange/requestApproval": "decision",
    "item/permissions/requestApproval": "permissions",
    "execCommandApproval": "legacy",
    "applyPatchApproval": "legacy",
}
#: An MCP server's question for the user (Codex asks this way before an MCP tool call, too).
ELICITATION = "mcpServer/elicitation/request"
#: What each approval is about, as an ACP tool kind.
_APPROVAL_KINDS = {
    "item/commandExecution/requestApproval": "execute",
    "execCommandApproval": "execute",
    "item/fileChange/requestApproval": "edit",
    "applyPatchApproval": "edit",
    "item/permissions/requestApproval": "other",
}
#: ``GrantedPermissionProfile``: the parts of a permission request that can be granted.
_GRANTABLE = ("fileSystem", "network")

#: Notifications about the thread or the session rather than the turn's content.
_INFO_NOTIFICATIONS = frozenset(
    {
        "thread/started",
        "thread/status/changed",
        "thread/tokenUsage/updated",
        "thread/name/updated",
        "thread/compacted",
        "thread/closed",
        "thread/archived",
        "thread/unarchived",
        "turn/started",
        "turn/diff/updated",
        "thread/goal/updated",
        "thread/goal/cleared",
        "model/rerouted",
        "account/updated",
        "account/rateLimits/updated",
        "mcpServer/startupStatus/updated",
        "skills/changed",
        "configWarning",
        "deprecationNotice",
        # The rest of 0.171.0's ServerNotification.json: known, passed on as they are.
        "thread/readState/changed",
        "thread/deleted",
        "thread/reverted",
        "thread/section/changed",
        "thread/attachment/updated",
        "thread/prediction/updated",
        "thread/queue/changed",
        "project/changed",
        "thread/project/updated",
        "thread/environment/connected",
        "thread/environment/disconnected",
        "thread/settings/updated",
        "hook/started",
        "hook/completed",
        "item/autoApprovalReview/started",
        "item/autoApprovalReview/completed",
        "autoApprovalReview/strictReviewRequired",
        "item/plan/delta",
        "command/exec/outputDelta",
        "process/outputDelta",
        "process/exited",
        "thread/search/partial",
        "item/commandExecution/terminalInteraction",
        "item/fileChange/patchUpdated",
        "mcpServer/oauthLogin/completed",
        "mcpServer/event/stream/notification",
        "account/gatewayOAuth/changed",
        "account/login/completed",
        "app/list/updated",
        "remoteControl/status/changed",
        "externalAgentConfig/import/progress",
        "externalAgentConfig/import/completed",
        "fs/changed",
        "model/verification",
        "modelProvider/authRecoveryStarted",
        "modelProvider/authRecoveryCompleted",
        "turn/moderationMetadata",
        "model/safetyBuffering/updated",
        "warning",
        "guardianWarning",
        "fuzzyFileSearch/sessionUpdated",
        "fuzzyFileSearch/sessionCompleted",
        "windows/worldWritableWarning",
        "windowsSandbox/setupCompleted",
    }
)
_MESSAGE_DELTAS = frozenset({"item/agentMessage/delta"})
_THOUGHT_DELTAS = frozenset({"item/reasoning/summaryTextDelta", "item/reasoning/textDelta"})
_TOOL_PROGRESS = frozenset(
    {
        "item/commandExecution/outputDelta",
        "item/fileChange/outputDelta",
        "item/mcpToolCall/progress",
    }
)
#: Items whose content reaches subscribers otherwise: as deltas, or as the prompt itself.
_CONTENT_ITEMS = frozenset({"agentMessage", "reasoning", "userMessage", "hookPrompt", "plan"})
#: Items that describe the session rather than a tool run.
_INFO_ITEMS = frozenset(
    {"contextCompaction", "enteredReviewMode", "exitedReviewMode", "subAgentActivity"}
)
#: Item types as ACP tool kinds (``read``, ``edit``, ``execute``, ``fetch``, ``other``, ...).
_TOOL_KINDS = {
    "commandExecution": "execute",
    "fileChange": "edit",
    "webSearch": "fetch",
    "imageView": "read",
    "sleep": "think",
}
#: Codex item and plan statuses in the universal (ACP) vocabulary. A ``declined`` item did not
#: run: ``failed`` (its raw item still says ``declined``).
_STATUSES = {
    "pending": "pending",
    "inProgress": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "declined": "failed",
}
_TOOLS = ToolVocabulary(kinds=_TOOL_KINDS, statuses=_STATUSES)
#: ``turn/completed`` ids of our finished turns kept to tell a late duplicate from a stranger.
_FINISHED_KEPT = 16
#: ``turn/completed`` notifications kept while our turn waits for its ``turn/start`` reply.
_EARLY_ENDS_KEPT = 4


@frozen
class _Sent:
    """What one of our requests was about; handed back with its response."""

    turn_id: str | None = None
    codex_turn_id: str | None = None
    #: the child thread a ``turn/interrupt`` went to (None: our own thread)
    child_thread: str | None = None
    #: the steer a ``turn/steer`` carries
    steer_id: int | None = None


@define
class _ChildStop:
    """One child turn our cancel interrupted, and what came of it."""

    thread_id: str
    turn_id: str
    confirmed: bool | None = None  # None: no answer yet
    status: str | None = None
    error: str | None = None

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_id": self.thread_id,
            "turn_id": self.turn_id,
            "confirmed": self.confirmed is True,
        }
        if self.status is not None:
            out["status"] = self.status
        if self.error is not None:
            out["error"] = self.error
        return out


@define
class _Turn:
    """Our running turn and what Codex has told us about it."""

    turn_id: str
    #: from the ``turn/start`` reply; until then the turn is not identified
    codex_id: str | None = None
    #: ids a stale-id rejection named as the one really running (edge case 8)
    aliases: set[str] = field(factory=set)
    #: ``turn/started`` ids seen while this turn was ours
    started: set[str] = field(factory=set)
    cancel_wanted: bool = False
    stale_retried: bool = False
    not_active_retried: bool = False
    #: interrupt this id again when its ``turn/started`` arrives
    retry_on_started: str | None = None
    #: ``turn/completed`` seen before the ``turn/start`` reply named our turn
    early_ends: dict[str, dict[str, Any]] = field(factory=dict)
    #: the root turn is over, held until background terminals are cleaned, the goal pause is
    #: answered and every interrupted child turn has confirmed or refused
    finishing: TurnFinished | None = None
    cleaning: bool = False
    #: child turns interrupted by our cancel, in the order sent
    child_stops: dict[tuple[str, str], _ChildStop] = field(factory=dict)
    #: None (no pause sent), "pending", then the outcome for the receipt
    goal_pause: str | None = None
    #: our last Codex turn completed while our thread's goal was active: its end, held until
    #: the goal leaves ``active`` or the server's next goal turn is adopted
    goal_held: TurnFinished | None = None
    #: whether the turn was ever held for a goal (the receipt then says what became of it)
    goal_waited: bool = False
    #: the last ``error`` notification about this turn that Codex will not retry
    reported_error: str | None = None
    #: goal turns the server started by itself and we adopted as part of this turn
    goal_turns: int = 0
    #: steers waiting for the ``turn/start`` reply to name the turn (``expectedTurnId``)
    steers: list[tuple[int, str]] = field(factory=list)

    def owns(self, codex_id: Any) -> bool:
        return isinstance(codex_id, str) and (codex_id == self.codex_id or codex_id in self.aliases)


@frozen
class _Approval:
    """What answering a server→client approval request takes (its desk ticket)."""

    rpc_id: RequestId
    answer: str  # "decision", "legacy", "permissions" (see _APPROVALS) or "elicitation"
    requested: dict[str, Any]


@define
class CodexClient(DeskPermissions[_Approval], AgentProtocol):
    """Our side of one ``codex app-server`` connection, driving one thread."""

    name: ClassVar[str] = "codex"
    prompt_carries: ClassVar[frozenset[str]] = frozenset({"image"})
    #: ``[mcp_servers.NAME]`` takes a ``command`` or a streamable-HTTP ``url``; no SSE
    mcp_transports: ClassVar[frozenset[str]] = frozenset({"stdio", "http"})

    @classmethod
    def check_mcp_servers(cls, servers: Sequence[McpServer]) -> None:
        check_transports(
            servers, cls.mcp_transports, "Codex", "its mcp_servers take a command or a url"
        )
        for server in servers:
            if not _MCP_NAME.fullmatch(server.name):
                raise McpUnsupported(
                    f"Codex cannot take MCP server name {server.name!r}: its mcp_servers"
                    " names are letters, digits, '_' and '-'"
                )

    @classmethod
    def command(
        cls, base: Sequence[str], resume: str | None, *, mcp_servers: Sequence[McpServer] = ()
    ) -> list[str]:
        """One ``-c mcp_servers.NAME={...}`` override per server (a TOML inline table, so
        nothing of the user's ``config.toml`` is replaced but that one server)."""
        argv = list(base)
        for server in mcp_servers:
            argv += ["-c", f"mcp_servers.{server.name}={codex_mcp_table(server)}"]
        return argv

    _rpc: JsonRpcPeer[_Sent] = field(factory=lambda: JsonRpcPeer(with_version=False))
    _phase: str = "idle"  # idle, initializing, opening, ready, failed
    _cwd: str = "."
    _resume: str | None = None
    _resume_error: str | None = None
    _thread_id: str | None = None
    _turn: _Turn | None = None
    _finished: deque[str] = field(factory=lambda: deque(maxlen=_FINISHED_KEPT))
    _desk: PermissionDesk[_Approval] = field(factory=PermissionDesk)
    #: descendant threads (sub-agents) -> the turn each is running, or None when idle
    _children: dict[str, str | None] = field(factory=dict)
    #: our thread's goal status (``ThreadGoalStatus``), None when it has none or we don't know
    _goal: str | None = None
    server_info: dict[str, Any] = field(factory=dict)

    # -- calls from the actor -------------------------------------------------------------

    def start(
        self, *, cwd: str, resume: str | None = None, mcp_servers: Sequence[McpServer] = ()
    ) -> Step:
        if self._phase != "idle":
            raise RuntimeError("start() called twice")
        self._phase = "initializing"
        self._cwd = cwd
        self._resume = resume
        _, message = self._rpc.request(
            "initialize",
            {"clientInfo": CLIENT_INFO, "capabilities": {"experimentalApi": True}},
            _Sent(),
        )
        return Step(send=[message])

    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        if self._phase != "ready" or self._turn is not None:
            turn = self._turn.turn_id if self._turn else None
            raise RuntimeError(f"prompt() while {self._phase} with turn {turn}")
        self._turn = _Turn(turn_id)
        _, message = self._rpc.request(
            "turn/start",
            {"threadId": self._thread_id, "input": _input(text, parts)},
            _Sent(turn_id),
        )
        return Step(send=[message])

    def cancel(self) -> Step:
        turn = self._turn
        if turn is None or turn.cancel_wanted or turn.finishing is not None:
            return Step()
        turn.cancel_wanted = True
        # The goal first, or Codex starts its next goal turn as soon as this one ends.
        step = self._pause_goal(turn)
        if turn.goal_held is None and turn.codex_id is not None:
            # Else sent as soon as the turn/start reply names it; while we hold the turn for
            # its goal nothing runs: the next goal turn is interrupted when it starts.
            step.extend(self._interrupt(turn, turn.codex_id))
        # The root first, so it starts no more children; then every running child at once.
        for thread_id, child_turn in list(self._children.items()):
            if child_turn is not None:
                step.extend(self._interrupt_child(turn, thread_id, child_turn))
        return step

    @property
    def can_steer(self) -> bool:
        return True  # ``turn/steer``; a server without it answers -32601 and the actor interrupts

    def steer(self, turn_id: str, steer_id: int, text: str) -> Step:
        turn = self._turn
        if turn is None or turn.turn_id != turn_id:
            raise RuntimeError(f"steer() of turn {turn_id} while another runs")
        if turn.codex_id is None:
            turn.steers.append((steer_id, text))  # sent once the turn/start reply names it
            return Step()
        return self._steer(turn, turn.codex_id, steer_id, text)

    def _steer(self, turn: _Turn, codex_id: str, steer_id: int, text: str) -> Step:
        _, message = self._rpc.request(
            "turn/steer",
            {
                "threadId": self._thread_id,
                "expectedTurnId": codex_id,
                "input": [{"type": "text", "text": text}],
            },
            _Sent(turn.turn_id, codex_id, steer_id=steer_id),
        )
        return Step(send=[message])

    def _on_steered(self, response: IncomingResponse[_Sent]) -> Step:
        sent = response.context
        assert sent.turn_id is not None and sent.steer_id is not None
        if response.error is None:
            return Step(events=[SteerAnswered(sent.steer_id, sent.turn_id, True)])
        message = response.error.message
        no_turn = _NO_ACTIVE_TURN_TO_STEER in message or _STALE_TURN.search(message) is not None
        answer = SteerAnswered(
            sent.steer_id, sent.turn_id, False, no_turn=no_turn, detail=response.error.describe()
        )
        return Step(events=[answer])

    def number_requests(self, tag: str) -> None:
        self._desk.tag = tag  # JSON-RPC ids start again with each process

    @property
    def children(self) -> dict[str, str | None]:
        """Known descendant threads and the turn each runs (None: idle)."""
        return dict(self._children)

    @property
    def goal(self) -> str | None:
        """Our thread's goal status as last reported, or None."""
        return self._goal

    @property
    def agent_session_id(self) -> str | None:
        if self._thread_id is not None:
            return self._thread_id
        # Killed while still resuming: the next process should try the same thread again.
        return self._resume if self._resume_error is None else None

    def details_at_kill(self) -> dict[str, Any]:
        """What our cancel had asked of child threads and the goal, for a receipt whose server
        is killed before the turn ended: children that never answered are
        ``confirmed: false``, a pause never answered is ``not paused``."""
        turn = self._turn
        if turn is None or not turn.cancel_wanted:
            return {}
        details = dict(turn.finishing.details) if turn.finishing is not None else {}
        if turn.child_stops:
            details["children"] = [stop.detail() for stop in turn.child_stops.values()]
        if turn.goal_turns:
            details["goal_turns"] = turn.goal_turns
        if turn.goal_pause == "pending":
            details["goal"] = "not paused: no answer before the server was killed"
        elif turn.goal_pause is not None:
            details["goal"] = turn.goal_pause
        return details

    # -- messages from the server ---------------------------------------------------------

    def receive(self, message: dict[str, Any]) -> Step:
        incoming = self._rpc.receive(message)
        if isinstance(incoming, IncomingResponse):
            return self._on_response(incoming)
        if isinstance(incoming, IncomingNotification):
            return self._on_notification(incoming, message)
        if isinstance(incoming, IncomingRequest):
            return self._on_request(incoming)
        if isinstance(incoming, UnknownResponse):
            return Step(
                events=[
                    ev.ErrorEvent(
                        code="protocol_error",
                        message=f"response to unknown request id {incoming.id!r}",
                    )
                ]
            )
        assert isinstance(incoming, InvalidMessage)
        return Step(events=[ev.AgentUnparsed(raw=message)])

    def _on_response(self, response: IncomingResponse[_Sent]) -> Step:
        if response.method == "initialize":
            return self._on_initialized(response)
        if response.method in ("thread/start", "thread/resume"):
            return self._on_thread_opened(response)
        if response.method == "turn/start":
            return self._on_turn_identified(response)
        if response.method == "turn/steer":
            return self._on_steered(response)
        if response.method == "turn/interrupt":
            if response.context.child_thread is not None:
                return self._on_child_interrupt_answered(response)
            return self._on_interrupt_answered(response)
        if response.method == "thread/backgroundTerminals/clean":
            return self._on_terminals_cleaned(response)
        if response.method == "thread/goal/set":
            return self._on_goal_paused(response)
        if response.method == "thread/goal/get":
            return self._on_goal_read(response)
        return Step()

    # -- handshake ------------------------------------------------------------------------

    def _on_initialized(self, response: IncomingResponse[_Sent]) -> Step:
        if response.error is not None:
            return self._fail(f"initialize failed: {response.error.describe()}")
        self.server_info = response.result if isinstance(response.result, dict) else {}
        self._phase = "opening"
        step = Step(send=[self._rpc.notify("initialized")])
        if self._resume is not None:
            return step.extend(self._open("thread/resume", {"threadId": self._resume}))
        return step.extend(self._open("thread/start", {"cwd": self._cwd}))

    def _open(self, method: str, params: dict[str, Any]) -> Step:
        _, message = self._rpc.request(method, params, _Sent())
        return Step(send=[message])

    def _on_thread_opened(self, response: IncomingResponse[_Sent]) -> Step:
        thread_id = _thread_id_of(response.result)
        if response.method == "thread/resume":
            if response.error is not None:
                # The rollout is gone: a fresh thread, and the receipt will say so.
                self._resume_error = f"thread/resume failed: {response.error.describe()}"
                return self._open("thread/start", {"cwd": self._cwd})
            self._thread_id = thread_id or self._resume
            step = self._established(resumed=True)
            # A resumed thread may have an active goal: a cancel must know to pause it.
            _, message = self._rpc.request(
                "thread/goal/get", {"threadId": self._thread_id}, _Sent()
            )
            step.send.append(message)
            return step
        if response.error is not None:
            return self._fail(f"thread/start failed: {response.error.describe()}")
        if thread_id is None:
            return self._fail("thread/start answered without a thread id")
        self._thread_id = thread_id
        if self._resume is None:
            return self._established(resumed=None)
        return self._established(resumed=False, detail=self._resume_error)

    def _established(self, *, resumed: bool | None, detail: str | None = None) -> Step:
        self._phase = "ready"
        assert self._thread_id is not None
        return Step(events=[SessionEstablished(self._thread_id, resumed, detail)])

    def _fail(self, message: str) -> Step:
        self._phase = "failed"
        return Step(events=[StartFailed(message)])

    # -- turns ----------------------------------------------------------------------------

    def _on_turn_identified(self, response: IncomingResponse[_Sent]) -> Step:
        turn = self._turn
        if turn is None or turn.turn_id != response.context.turn_id:
            return Step()
        if response.error is not None:
            return self._finish(
                turn, TurnFinished(turn.turn_id, None, error=response.error.describe())
            )
        result = response.result if isinstance(response.result, dict) else {}
        codex_turn = result.get("turn")
        codex_id = codex_turn.get("id") if isinstance(codex_turn, dict) else None
        if not isinstance(codex_id, str):
            return self._finish(
                turn,
                TurnFinished(turn.turn_id, None, error="turn/start answered without a turn id"),
            )
        turn.codex_id = codex_id
        step = Step()
        steers, turn.steers = turn.steers, []
        early = turn.early_ends.pop(codex_id, None)
        if early is not None:
            # Over before we could steer it: the steers did not reach the model.
            for steer_id, _ in steers:
                step.events.append(SteerAnswered(steer_id, turn.turn_id, False, no_turn=True))
            return step.extend(self._on_our_turn_completed(turn, early))
        if turn.cancel_wanted:
            step.extend(self._interrupt(turn, codex_id))
        for steer_id, text in steers:
            step.extend(self._steer(turn, codex_id, steer_id, text))
        return step

    def _interrupt(self, turn: _Turn, codex_id: str) -> Step:
        _, message = self._rpc.request(
            "turn/interrupt",
            {"threadId": self._thread_id, "turnId": codex_id},
            _Sent(turn.turn_id, codex_id),
        )
        return Step(send=[message])

    def _on_interrupt_answered(self, response: IncomingResponse[_Sent]) -> Step:
        """``{}`` says the interrupt reached the turn (it comes as the turn aborts, possibly
        long after it ended); a rejection may retry."""
        turn = self._turn
        sent = response.context
        if response.error is None:
            if turn is None or turn.turn_id != sent.turn_id:
                return Step()
            return Step(events=[InterruptAnswered(turn.turn_id)])
        if turn is None or turn.turn_id != sent.turn_id or turn.finishing is not None:
            return Step()
        if sent.codex_turn_id is not None and sent.codex_turn_id in self._finished:
            # A goal turn we interrupted ended and the next was adopted (and interrupted).
            return Step()
        error = response.error
        stale = _STALE_TURN.search(error.message)
        if stale is not None:
            found = stale.group("found")
            if turn.stale_retried or turn.owns(found):
                return Step(events=[_interrupt_failed(error.describe())])
            turn.stale_retried = True
            turn.aliases.add(found)
            return self._interrupt(turn, found)
        if _NO_ACTIVE_TURN in error.message:
            # Before turn/started nothing runs yet and the turn would run on (real-agents.md);
            # after our turn completed its turn/completed has already decided.
            if turn.not_active_retried or sent.codex_turn_id is None:
                return Step()
            turn.not_active_retried = True
            if sent.codex_turn_id in turn.started:
                return self._interrupt(turn, sent.codex_turn_id)
            turn.retry_on_started = sent.codex_turn_id
            return Step()
        return Step(events=[_interrupt_failed(error.describe())])

    def _on_turn_started(self, params: dict[str, Any]) -> Step:
        step = Step(events=[ev.SessionInfo(info_kind="turn/started", data=params)])
        turn = self._turn
        codex_turn = params.get("turn")
        codex_id = codex_turn.get("id") if isinstance(codex_turn, dict) else None
        if turn is None or not isinstance(codex_id, str):
            return step
        if (
            turn.goal_held is not None
            and not turn.owns(codex_id)
            and codex_id not in self._finished
        ):
            return step.extend(self._adopt_goal_turn(turn, codex_id))
        turn.started.add(codex_id)
        if turn.retry_on_started == codex_id and turn.finishing is None:
            turn.retry_on_started = None
            step.extend(self._interrupt(turn, codex_id))
        return step

    def _on_turn_completed(self, params: dict[str, Any], raw: dict[str, Any]) -> Step:
        codex_turn = params.get("turn")
        if not isinstance(codex_turn, dict) or not isinstance(codex_turn.get("id"), str):
            return Step(events=[ev.AgentUnparsed(raw=raw)])
        codex_id: str = codex_turn["id"]
        turn = self._turn
        if (
            turn is not None
            and (turn.finishing is not None or turn.goal_held is not None)
            and turn.owns(codex_id)
        ):
            return Step()  # a duplicate while the terminals are cleaned or the goal decides
        if turn is not None and turn.finishing is None:
            if turn.codex_id is None:
                # Our turn/start reply is still on its way; this may be its turn.
                if len(turn.early_ends) < _EARLY_ENDS_KEPT:
                    turn.early_ends[codex_id] = codex_turn
                return Step()
            if turn.owns(codex_id):
                return self._on_our_turn_completed(turn, codex_turn)
        if codex_id in self._finished:
            return Step()  # a late duplicate, or a stale id we retried against, ending too
        return Step(
            events=[
                ev.ErrorEvent(
                    code="protocol_error",
                    message=f"turn/completed for turn {codex_id!r}, which is not the running turn",
                )
            ]
        )

    def _on_our_turn_completed(self, turn: _Turn, codex_turn: dict[str, Any]) -> Step:
        status = codex_turn.get("status")
        if not isinstance(status, str):
            status = None
        # Only the agent's own words: "completed" after our interrupt means it won the race
        # (edge case 12), and is reported as such.
        interrupted = {"interrupted": True, "completed": False}.get(status or "")
        error = None
        if status == "failed":
            error = _describe_error(codex_turn.get("error")) or turn.reported_error or "turn failed"
        finished = TurnFinished(turn.turn_id, status, interrupted=interrupted, error=error)
        if status == "completed" and (self._goal == "active" or turn.goal_pause == "pending"):
            # Codex goes on with the goal by itself: its next turn is still this one.
            turn.goal_held = finished
            turn.goal_waited = True
            return self._settle_goal(turn)
        step = Step()
        if status == "interrupted" and turn.cancel_wanted:
            # The interrupt leaves background terminals running (edge case 13).
            turn.cleaning = True
            _, message = self._rpc.request(
                "thread/backgroundTerminals/clean",
                {"threadId": self._thread_id},
                _Sent(turn.turn_id),
            )
            step.send.append(message)
        return step.extend(self._finish(turn, finished))

    def _on_terminals_cleaned(self, response: IncomingResponse[_Sent]) -> Step:
        turn = self._turn
        if (
            turn is None
            or turn.finishing is None
            or not turn.cleaning
            or turn.turn_id != response.context.turn_id
        ):
            return Step()
        if response.error is None:
            outcome = "cleaned"
        else:
            outcome = f"not cleaned: {response.error.describe()}"
        turn.cleaning = False
        details = {**turn.finishing.details, "background_terminals": outcome}
        turn.finishing = attrs.evolve(turn.finishing, details=details)
        return self._release(turn)

    def _finish(self, turn: _Turn, finished: TurnFinished) -> Step:
        """Our turn is over: end it now, or once what the cancel started has answered."""
        turn.finishing = finished
        return self._release(turn)

    def _release(self, turn: _Turn) -> Step:
        finished = turn.finishing
        if finished is None or turn.cleaning or turn.goal_pause == "pending":
            return Step()
        if any(stop.confirmed is None for stop in turn.child_stops.values()):
            return Step()
        details = dict(finished.details)
        if turn.child_stops:
            details["children"] = [stop.detail() for stop in turn.child_stops.values()]
        if turn.goal_turns:
            details["goal_turns"] = turn.goal_turns
        if turn.goal_pause is not None:
            details["goal"] = turn.goal_pause
        elif turn.goal_waited:
            details["goal"] = self._goal or "cleared"
        return self._end(turn, attrs.evolve(finished, details=details))

    # -- goals ----------------------------------------------------------------------------

    def _pause_goal(self, turn: _Turn) -> Step:
        """``thread/goal/set paused`` once per turn, when our thread's goal is active."""
        if self._goal != "active" or turn.goal_pause is not None or self._thread_id is None:
            return Step()
        turn.goal_pause = "pending"
        _, message = self._rpc.request(
            "thread/goal/set",
            {"threadId": self._thread_id, "status": "paused", "origin": "user"},
            _Sent(turn.turn_id),
        )
        return Step(send=[message])

    def _adopt_goal_turn(self, turn: _Turn, codex_id: str) -> Step:
        """The server started its next goal turn while we hold ours: it is part of our turn
        (its items carry our turn id, a cancel interrupts it)."""
        for finished in (turn.codex_id, *sorted(turn.aliases)):
            if finished is not None:
                self._finished.append(finished)
        turn.codex_id = codex_id
        turn.aliases.clear()
        turn.started = {codex_id}
        turn.stale_retried = turn.not_active_retried = False
        turn.retry_on_started = None
        turn.goal_held = None
        turn.goal_turns += 1
        if turn.cancel_wanted:
            return self._interrupt(turn, codex_id)
        return Step()

    def _settle_goal(self, turn: _Turn) -> Step:
        """End a turn held for its goal once no goal turn can follow: the goal left ``active``
        (complete, paused, budget-limited, cleared), or our cancel's pause was answered."""
        held = turn.goal_held
        if held is None or turn.finishing is not None:
            return Step()
        pause_answered = turn.goal_pause not in (None, "pending")
        if self._goal == "active" and not (turn.cancel_wanted and pause_answered):
            return Step()
        turn.goal_held = None
        if turn.cancel_wanted:
            # What stopped was the goal's work: our pause did it, or (refused) we cannot tell.
            interrupted = {"active": None, "paused": True}.get(self._goal or "", False)
            held = attrs.evolve(held, interrupted=interrupted)
        return self._finish(turn, held)

    def _on_goal_paused(self, response: IncomingResponse[_Sent]) -> Step:
        if response.error is None:
            status = _goal_status(response.result)
            self._goal = status or "paused"
            outcome = self._goal
        else:
            outcome = f"not paused: {response.error.describe()}"
        turn = self._turn
        if turn is None or turn.turn_id != response.context.turn_id or turn.goal_pause != "pending":
            return Step()
        turn.goal_pause = outcome
        if turn.goal_held is not None:
            return self._settle_goal(turn)
        return self._release(turn)

    def _on_goal_read(self, response: IncomingResponse[_Sent]) -> Step:
        # An error (goals disabled, no such thread) leaves it unknown: nothing to pause.
        if response.error is None and isinstance(response.result, dict):
            self._goal = _goal_status(response.result)
        return Step()

    def _on_goal_notification(self, method: str, params: dict[str, Any]) -> Step:
        step = Step(events=[ev.SessionInfo(info_kind=method, data=params)])
        turn = self._turn
        if method == "thread/goal/cleared":
            self._goal = None
        else:
            status = _goal_status(params)
            if status is None:
                return step
            self._goal = status
            if turn is not None and turn.cancel_wanted:
                # A goal that became active while we stop the turn is paused too.
                step.extend(self._pause_goal(turn))
        if turn is not None:
            step.extend(self._settle_goal(turn))
        return step

    # -- child threads (sub-agents) -------------------------------------------------------

    def _ours(self, thread_id: Any) -> bool:
        return isinstance(thread_id, str) and (
            thread_id == self._thread_id or thread_id in self._children
        )

    def _adopt(self, thread_id: Any) -> None:
        if isinstance(thread_id, str) and thread_id != self._thread_id:
            self._children.setdefault(thread_id, None)

    def _on_thread_started(self, params: dict[str, Any]) -> Step:
        thread = params.get("thread")
        if isinstance(thread, dict) and self._thread_id is not None:
            if self._ours(_parent_thread_of(thread)):
                self._adopt(thread.get("id"))
        return Step(events=[ev.SessionInfo(info_kind="thread/started", data=params)])

    def _descends_from_ours(self, codex_turn: Any) -> bool:
        """A turn whose ``rootTurnId`` (the first turn of its chain of work) is one of ours,
        running or finished, runs on a descendant thread (0.171.0 sends no ``thread/started``
        for a sub-agent's thread)."""
        root = codex_turn.get("rootTurnId") if isinstance(codex_turn, dict) else None
        if not isinstance(root, str) or root == codex_turn.get("id"):
            return False
        return (self._turn is not None and self._turn.owns(root)) or root in self._finished

    def _adopt_from_item(self, item: dict[str, Any], thread_id: Any) -> None:
        """Children named by a multi-agent item on one of our threads."""
        if item["type"] == "collabAgentToolCall":
            receivers = item.get("receiverThreadIds")
            if self._ours(item.get("senderThreadId")) and isinstance(receivers, list):
                for receiver in receivers:
                    self._adopt(receiver)
        elif item["type"] == "subAgentActivity" and self._ours(thread_id):
            self._adopt(item.get("agentThreadId"))

    def _on_child_turn(self, method: str, thread_id: str, params: dict[str, Any]) -> Step:
        step = Step(events=[ev.SessionInfo(info_kind=method, data=params)])
        codex_turn = params.get("turn")
        codex_id = codex_turn.get("id") if isinstance(codex_turn, dict) else None
        if not isinstance(codex_turn, dict) or not isinstance(codex_id, str):
            return step
        turn = self._turn
        if method == "turn/started":
            self._children[thread_id] = codex_id
            if turn is not None and turn.cancel_wanted:
                step.extend(self._interrupt_child(turn, thread_id, codex_id))
            return step
        if self._children.get(thread_id) == codex_id:
            self._children[thread_id] = None
        stop = turn.child_stops.get((thread_id, codex_id)) if turn is not None else None
        if turn is None or stop is None or stop.confirmed is True:
            return step
        status = codex_turn.get("status")
        stop.confirmed = True
        stop.status = status if isinstance(status, str) else None
        stop.error = None
        return step.extend(self._release(turn))

    def _interrupt_child(self, turn: _Turn, thread_id: str, codex_id: str) -> Step:
        """One ``turn/interrupt`` per child turn, never repeated."""
        if (thread_id, codex_id) in turn.child_stops:
            return Step()
        turn.child_stops[(thread_id, codex_id)] = _ChildStop(thread_id, codex_id)
        _, message = self._rpc.request(
            "turn/interrupt",
            {"threadId": thread_id, "turnId": codex_id},
            _Sent(turn.turn_id, codex_id, thread_id),
        )
        return Step(send=[message])

    def _on_child_interrupt_answered(self, response: IncomingResponse[_Sent]) -> Step:
        """``{}`` comes with the child's abort, whose ``turn/completed`` confirms; an error is
        a refusal (the turn had ended, or the child cannot be interrupted)."""
        turn = self._turn
        sent = response.context
        if response.error is None or turn is None or turn.turn_id != sent.turn_id:
            return Step()
        assert sent.child_thread is not None and sent.codex_turn_id is not None
        stop = turn.child_stops.get((sent.child_thread, sent.codex_turn_id))
        if stop is None or stop.confirmed is not None:
            return Step()
        stop.confirmed = False
        stop.error = response.error.describe()
        step = Step()
        stale = _STALE_TURN.search(response.error.message)
        if stale is not None and sent.child_thread in self._children:
            # The child runs another turn now: that one is stopped too (once, like any).
            found = stale.group("found")
            self._children[sent.child_thread] = found
            step.extend(self._interrupt_child(turn, sent.child_thread, found))
        return step.extend(self._release(turn))

    def _end(self, turn: _Turn, finished: TurnFinished) -> Step:
        self._turn = None
        for codex_id in (turn.codex_id, *sorted(turn.aliases)):
            if codex_id is not None:
                self._finished.append(codex_id)
        # Steers still waiting for the turn's id never went out.
        unsent = [SteerAnswered(i, turn.turn_id, False, no_turn=True) for i, _ in turn.steers]
        turn.steers = []
        return Step(events=[*unsent, finished])

    # -- notifications --------------------------------------------------------------------

    def _on_notification(self, note: IncomingNotification, raw: dict[str, Any]) -> Step:
        params: Any = {} if note.params is None else note.params
        if not isinstance(params, dict):
            return Step(events=[ev.AgentUnparsed(raw=raw)])
        method = note.method
        if method == "serverRequest/resolved":
            # Request ids are per connection: a retraction is ours whatever its thread.
            return self._on_request_resolved(params)
        if method == "thread/started":
            return self._on_thread_started(params)
        thread_id = params.get("threadId")
        if method == "turn/started" and self._descends_from_ours(params.get("turn")):
            self._adopt(thread_id)
        child = isinstance(thread_id, str) and thread_id in self._children
        if (
            self._thread_id is not None
            and isinstance(thread_id, str)
            and thread_id != self._thread_id
            and not child
        ):
            return Step(events=[ev.AgentUnparsed(raw=raw)])
        turn_id = self._turn.turn_id if self._turn is not None else None
        event: ev.Event
        if child and method in ("turn/started", "turn/completed"):
            assert isinstance(thread_id, str)
            return self._on_child_turn(method, thread_id, params)
        if method in ("thread/goal/updated", "thread/goal/cleared"):
            if child:  # a sub-agent's own goal is not ours to pause
                return Step(events=[ev.SessionInfo(info_kind=method, data=params)])
            return self._on_goal_notification(method, params)
        if method == "turn/completed":
            return self._on_turn_completed(params, raw)
        if method == "turn/started":
            return self._on_turn_started(params)
        if method in ("item/started", "item/completed"):
            return self._on_item(method, params, raw, turn_id)
        if method == "item/reasoning/summaryPartAdded":
            return Step()  # a section boundary without text
        if method in _MESSAGE_DELTAS or method in _THOUGHT_DELTAS:
            delta = params.get("delta")
            if not isinstance(delta, str):
                return Step(events=[ev.AgentUnparsed(raw=raw)])
            if method in _MESSAGE_DELTAS:
                event = ev.MessageDelta(turn_id=turn_id, text=delta)
            else:
                event = ev.ThoughtDelta(turn_id=turn_id, text=delta)
        elif method in _TOOL_PROGRESS and isinstance(params.get("itemId"), str):
            event = ev.ToolUpdate(turn_id=turn_id, tool_call_id=params["itemId"], raw=params)
        elif method == "turn/plan/updated":
            event = ev.Plan(turn_id=turn_id, entries=_plan_entries(params.get("plan")))
        elif method == "error":
            code = "agent_retrying" if params.get("willRetry") is True else "agent_error"
            message = _describe_error(params.get("error")) or "error"
            event = ev.ErrorEvent(code=code, message=message)
            turn = self._turn
            if code == "agent_error" and not child and turn is not None:
                named = params.get("turnId")
                if (
                    named is None
                    or named == turn.codex_id
                    or (
                        isinstance(named, str) and named in turn.aliases  # (a list: unhashable)
                    )
                ):
                    turn.reported_error = message  # the words, should turn/completed lack them
        elif method in _INFO_NOTIFICATIONS:
            event = ev.SessionInfo(info_kind=method, data=params)
        else:
            event = ev.AgentUnparsed(raw=raw)
        return Step(events=[event])

    def _on_item(
        self, method: str, params: dict[str, Any], raw: dict[str, Any], turn_id: str | None
    ) -> Step:
        item = params.get("item")
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("id"), str)
            or not isinstance(item.get("type"), str)
        ):
            return Step(events=[ev.AgentUnparsed(raw=raw)])
        kind: str = item["type"]
        self._adopt_from_item(item, params.get("threadId"))
        if kind in _CONTENT_ITEMS:
            return Step()
        if kind in _INFO_ITEMS:
            return Step(events=[ev.SessionInfo(info_kind=kind, data=params)])
        started = method == "item/started"
        status = _status(item.get("status"), "in_progress" if started else "completed")
        event: ev.Event
        if started:
            event = ev.ToolCall(
                turn_id=turn_id,
                tool_call_id=item["id"],
                title=_item_title(item),
                tool_kind=_TOOLS.kind(kind),
                status=status,
                raw=item,
            )
        else:
            event = ev.ToolUpdate(turn_id=turn_id, tool_call_id=item["id"], status=status, raw=item)
        return Step(events=[event])

    # -- server requests ------------------------------------------------------------------

    def _on_request(self, request: IncomingRequest) -> Step:
        answer = _APPROVALS.get(request.method)
        params = request.params if isinstance(request.params, dict) else {}
        if answer is not None:
            return self._hold_approval(request, answer, params)
        if request.method == ELICITATION:
            if _yes_or_no(params):
                return self._hold_approval(request, "elicitation", params)
            return Step(
                send=[self._rpc.respond(request.id, {"action": "decline", "content": None})]
            )
        reply = self._rpc.respond_error(
            request.id, METHOD_NOT_FOUND, f"Method not found: {request.method}"
        )
        return Step(send=[reply])

    def _hold_approval(self, request: IncomingRequest, answer: str, params: dict[str, Any]) -> Step:
        if answer == "permissions":
            offered = ["accept", "acceptForSession", "decline"]
        elif answer == "elicitation":
            offered = ["accept", "decline"]
        else:
            offered = _offered_decisions(params.get("availableDecisions"))
        turn_id = self._turn.turn_id if self._turn is not None else None
        requested = params.get("permissions")
        tool_call_id = params.get("itemId", params.get("callId"))
        announced = self._desk.hold(
            self._desk.unique_id(str(request.id)),
            turn_id,
            [_OPTIONS[decision] for decision in offered],
            {
                "toolCallId": tool_call_id if isinstance(tool_call_id, str) else None,
                "title": _approval_title(request.method, params),
                "kind": _APPROVAL_KINDS.get(request.method, "other"),
                "method": request.method,
                "params": params,
            },
            _Approval(request.id, answer, requested if isinstance(requested, dict) else {}),
        )
        return Step(events=[announced])

    def _answer_permission(self, held: Held[_Approval], option_id: str | None, *, by: str) -> Step:
        approval = held.ticket
        decision = option_id or "cancel"
        result: dict[str, Any]
        if approval.answer == "legacy":
            result = {"decision": _LEGACY_DECISIONS[decision]}
        elif approval.answer == "elicitation":
            # ``cancel`` (ours: cancelled) dismisses it; only an accept carries content.
            result = {"action": decision, "content": {} if decision == "accept" else None}
        elif approval.answer == "permissions":
            # Only the granted subset matters; an empty profile denies everything.
            granted = {}
            if decision in ("accept", "acceptForSession"):
                granted = {k: v for k, v in approval.requested.items() if k in _GRANTABLE}
            scope = "session" if decision == "acceptForSession" else "turn"
            result = {"permissions": granted, "scope": scope}
        else:
            result = {"decision": decision}
        resolved = PermissionDesk.resolved(held, option_id, by=by)
        return Step(send=[self._rpc.respond(approval.rpc_id, result)], events=[resolved])

    def _on_request_resolved(self, params: dict[str, Any]) -> Step:
        """The server withdrew a request (turn transition) or confirms one we answered."""
        wanted = params.get("requestId")
        for held in self._desk.take_where(
            lambda held: held.ticket.rpc_id == wanted and type(held.ticket.rpc_id) is type(wanted)
        ):
            return Step(events=[PermissionDesk.resolved(held, None, by="agent")])
        return Step()


def _thread_id_of(result: Any) -> str | None:
    thread = result.get("thread") if isinstance(result, dict) else None
    thread_id = thread.get("id") if isinstance(thread, dict) else None
    return thread_id if isinstance(thread_id, str) else None


def _parent_thread_of(thread: dict[str, Any]) -> Any:
    """``Thread.parentThreadId``, else ``source.subAgent.thread_spawn.parent_thread_id``."""
    parent = thread.get("parentThreadId")
    if isinstance(parent, str):
        return parent
    source = thread.get("source")
    sub_agent = source.get("subAgent") if isinstance(source, dict) else None
    spawn = sub_agent.get("thread_spawn") if isinstance(sub_agent, dict) else None
    return spawn.get("parent_thread_id") if isinstance(spawn, dict) else None


def _goal_status(holder: Any) -> str | None:
    """The ``status`` of ``holder["goal"]`` (``ThreadGoal``), or None (no goal)."""
    goal = holder.get("goal") if isinstance(holder, dict) else None
    status = goal.get("status") if isinstance(goal, dict) else None
    return status if isinstance(status, str) else None


def _interrupt_failed(description: str) -> ev.ErrorEvent:
    return ev.ErrorEvent(code="interrupt_failed", message=f"turn/interrupt failed: {description}")


def _describe_error(error: Any) -> str | None:
    """``TurnError`` ``{message, codexErrorInfo?, additionalDetails?}`` as one line."""
    if not isinstance(error, dict):
        return error if isinstance(error, str) else None
    message = error.get("message")
    text = message if isinstance(message, str) else "error"
    info = error.get("codexErrorInfo")
    if isinstance(info, dict) and len(info) == 1:
        info = next(iter(info))  # {"httpConnectionFailed": {"httpStatusCode": 502}}
    if isinstance(info, str):
        text += f" ({info})"
    return text


def _status(value: Any, default: str) -> str:
    status = _TOOLS.status(value, default)
    assert status is not None
    return status


def _plan_entries(plan: Any) -> list[dict[str, Any]]:
    """``[{step, status}]`` as ACP plan entries ``[{content, status}]``."""
    entries = []
    for entry in plan if isinstance(plan, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("step"), str):
            entries.append(
                {"content": entry["step"], "status": _status(entry.get("status"), "pending")}
            )
    return entries


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
        return " ".join(value)
    return None


def _item_title(item: dict[str, Any]) -> str:
    kind = str(item["type"])
    if kind == "fileChange":
        changes = item.get("changes")
        paths = [
            c["path"]
            for c in (changes if isinstance(changes, list) else [])
            if isinstance(c, dict) and isinstance(c.get("path"), str)
        ]
        return "Edit " + ", ".join(paths) if paths else kind
    if kind == "mcpToolCall" and isinstance(item.get("server"), str):
        return f"{item['server']}/{item.get('tool', '')}"
    for key in ("command", "tool", "query", "path"):
        text = _text(item.get(key))
        if text:
            return text
    return kind


def _yes_or_no(params: dict[str, Any]) -> bool:
    """An elicitation answered by accepting or declining alone: a form requiring nothing."""
    schema = params.get("requestedSchema")
    return (
        params.get("mode") == "form"
        and isinstance(schema, dict)
        and not schema.get("required")
        and not schema.get("properties")
    )


def _approval_title(method: str, params: dict[str, Any]) -> str:
    for key in ("command", "reason", "message"):
        text = _text(params.get(key))
        if text:
            return text
    return method


def _offered_decisions(available: Any) -> list[str]:
    """``availableDecisions`` when the server lists them (objects are amendments we don't
    offer), else the four plain decisions."""
    if isinstance(available, list):
        offered = [d for d in _DECISIONS if d in available]
        if offered:
            return offered
    return list(_DECISIONS)


#: Names Codex accepts for ``[mcp_servers.NAME]`` (and that need no quoting in a dotted key).
_MCP_NAME = re.compile(r"[A-Za-z0-9_-]+")


def codex_mcp_table(server: McpServer) -> str:
    """One server as a TOML inline table of Codex's ``[mcp_servers.NAME]``: ``command``,
    ``args``, ``env`` for stdio; ``url`` and ``http_headers`` for streamable HTTP."""
    if server.transport == "stdio":
        entries = {"command": server.command, "args": list(server.args), "env": server.env_dict}
    else:
        entries = {"url": server.url, "http_headers": server.headers_dict}
    return _toml_value(entries)


def _toml_value(value: Any) -> str:
    # A JSON string is a TOML basic string (same escapes; DEL must be escaped in TOML, not in
    # JSON; \uXXXX surrogate pairs are JSON only, hence no ASCII-only output), and a quoted
    # key is a key.
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{_toml_value(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


def _input(text: str, parts: Sequence[Part]) -> list[dict[str, Any]]:
    """``turn/start``'s input items: text, and an image as a ``data:`` URL (its
    ``ImageUserInput``); links and text resources as text."""
    if not parts:
        return [{"type": "text", "text": text}]
    items: list[dict[str, Any]] = []
    for part in parts:
        if part.needs == "image":
            items.append({"type": "image", "url": data_url(part)})
        else:
            items.append({"type": "text", "text": part.as_text()})
    return items
