"""ACP v1, agent side, as a sans-IO machine: the supervisor as an ACP agent to an editor.

``protocols/acp.py`` drives ACP agents; this is the other end. An editor (the *client*) sends
us JSON-RPC; :meth:`AcpAgentSide.receive` answers what it can itself (``initialize``, errors)
and turns the rest into :data:`Action` objects for the I/O layer (start a session, prompt,
cancel, ...). The I/O layer feeds back what happened: a session opened, a prompt accepted, and
every universal event of the sessions (:meth:`AcpAgentSide.event`), which become
``session/update`` notifications, ``session/request_permission`` requests and, once a turn has
really ended, the ``session/prompt`` response with its stop reason.

What the protocol asks of an agent, and how this machine keeps it:

- the prompt response comes only once the turn is over: its ``turn.ended``, or the agent's
  process gone during a cancel (a turn whose tree was killed has ended; the session is
  respawned and resumed after the client heard back, and a prompt sent meanwhile waits);
- ``stopReason`` is honest: ``cancelled`` for a turn cancelled or killed, the agent's own reason
  for a turn that completed (``end_turn`` when it gave none we can name), and a failed turn is
  a JSON-RPC error (ACP has no stop reason for failure);
- a permission request the client still holds when it stops being pending (a cancel answered it,
  the agent withdrew it, another client answered it) is withdrawn with ``$/cancel_request``; its
  late answer is then ignored;
- steering (``_session/steering``, advertised as ``_meta.steering.supported``): the same shape
  claude-agent-acp offers and ``protocols/acp.py`` consumes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from attrs import define, field, frozen

from protocols import events as ev
from protocols.content import Part, parts_from_acp, parts_text
from protocols.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    IncomingNotification,
    IncomingRequest,
    IncomingResponse,
    JsonRpcPeer,
    RequestId,
)
from protocols.tools import TOOL_KINDS, TOOL_STATUSES

__all__ = [
    "ACP_PROTOCOL_VERSION",
    "AGENT_CONFIG_ID",
    "Action",
    "AcpAgentSide",
    "CancelRequested",
    "CloseSession",
    "ListSessions",
    "NewSession",
    "OpenSession",
    "Output",
    "PermissionAnswered",
    "PromptRequested",
    "SetAgent",
    "SetMode",
    "SteerRequested",
    "agent_config_option",
]

ACP_PROTOCOL_VERSION: Final = 1
#: The session config option an editor picks the agent behind with.
AGENT_CONFIG_ID: Final = "agent"
STEER_METHOD: Final = "_session/steering"
#: ACP v1 ``StopReason`` values; any other word from an agent becomes ``end_turn``.
STOP_REASONS: Final = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal"})
PLAN_PRIORITIES: Final = frozenset({"high", "medium", "low"})
PLAN_STATUSES: Final = frozenset({"pending", "in_progress", "completed"})
PERMISSION_KINDS: Final = frozenset({"allow_once", "allow_always", "reject_once", "reject_always"})
#: Session info an agent reports that goes to the client as it is: ACP v1 update kinds that
#: describe the session (a ``config_option_update`` of the agent behind would contradict the
#: options *we* advertise, so it is not passed on; its modes are offered as they are, so its
#: ``current_mode_update`` is).
PASSED_UPDATES: Final = frozenset(
    {"available_commands_update", "session_info_update", "usage_update", "current_mode_update"}
)
#: Turn outcomes remembered for a prompt whose acceptance had not been told yet.
_ENDED_KEPT: Final = 64
#: ``_meta`` key under which our own details travel.
META_KEY: Final = "agentSupervisor"


# -- actions: what the I/O layer must do ----------------------------------------------------


@frozen
class NewSession:
    rpc_id: RequestId
    cwd: str
    mcp_servers: list[dict[str, Any]]


@frozen
class OpenSession:
    """``session/load`` (``replay``: the history is sent as updates first) or ``session/resume``."""

    rpc_id: RequestId
    session_id: str
    cwd: str
    mcp_servers: list[dict[str, Any]]
    replay: bool


@frozen
class ListSessions:
    rpc_id: RequestId
    cwd: str | None
    cursor: str | None


@frozen
class CloseSession:
    rpc_id: RequestId
    session_id: str


@frozen
class SetAgent:
    """``session/set_config_option`` of :data:`AGENT_CONFIG_ID`: another agent behind."""

    rpc_id: RequestId
    session_id: str
    agent: str


@frozen
class SetMode:
    """``session/set_mode``: the agent behind offers modes (its own, passed on)."""

    rpc_id: RequestId
    session_id: str
    mode_id: str


@frozen
class PromptRequested:
    """``parts``: the prompt's content when it is more than text (``protocols.content``),
    else empty; ``text`` is the whole of it as text either way."""

    rpc_id: RequestId
    session_id: str
    text: str
    parts: tuple[Part, ...] = ()


@frozen
class CancelRequested:
    session_id: str


@frozen
class SteerRequested:
    rpc_id: RequestId
    session_id: str
    text: str


@frozen
class PermissionAnswered:
    """The client answered a permission request: an option, or ``None`` (cancelled)."""

    session_id: str
    request_id: str
    option_id: str | None


Action = (
    NewSession
    | OpenSession
    | ListSessions
    | CloseSession
    | SetAgent
    | SetMode
    | PromptRequested
    | CancelRequested
    | SteerRequested
    | PermissionAnswered
)


@define
class Output:
    """Messages to write to the client, in order, and actions for the I/O layer."""

    send: list[dict[str, Any]] = field(factory=list)
    actions: list[Action] = field(factory=list)

    def extend(self, other: Output) -> None:
        self.send.extend(other.send)
        self.actions.extend(other.actions)


def agent_config_option(current: str, agents: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The ``select`` config option listing the configured agents (name, description)."""
    return {
        "id": AGENT_CONFIG_ID,
        "name": "Agent",
        "description": "The agent behind the supervisor (changing it starts a new session of it)",
        "category": "model",
        "type": "select",
        "currentValue": current,
        "options": [
            {"value": name, "name": name, **({"description": text} if text else {})}
            for name, text in agents
        ],
    }


@frozen
class _Permission:
    """A ``session/request_permission`` we sent, waiting for the client."""

    session_id: str
    request_id: str  # the universal one, what the session is answered with
    option_ids: frozenset[str]


@define
class _SessionView:
    """What the machine keeps of one ACP session."""

    #: prompts accepted by the session: turn id -> the ``session/prompt`` to answer
    turns: dict[str, RequestId] = field(factory=dict)
    #: prompts sent to the session, not accepted yet: their texts as events show them (a
    #: ``TurnStarted`` of one of these is ours, not a prompt from another client to echo)
    pending_texts: list[str] = field(factory=list)
    #: turns that ended before their acceptance was told: turn id -> the ended event
    ended: dict[str, ev.TurnEnded] = field(factory=dict)
    running_turn: str | None = None
    cancelling: bool = False  # a cancel is under way (ours, or anyone's on a shared session)
    restarting: bool = False  # the agent died unasked: the next ``ready`` is told
    resuming: bool = False  # started to resume an earlier session: a refusal is told
    #: client-held permission requests: universal request id -> our JSON-RPC id
    permissions: dict[str, RequestId] = field(factory=dict)
    #: the session was ready here once (``session_ready``): a view of an id never ready is
    #: dropped again when it holds nothing, so ids a client makes up cost no memory
    known: bool = False

    def holds_nothing(self) -> bool:
        return not (self.turns or self.pending_texts or self.running_turn or self.permissions)


@define
class AcpAgentSide:
    """Our side of one ACP connection, where we are the agent."""

    agent_info: dict[str, Any]
    #: what ``promptCapabilities`` we advertise: what the agent behind takes (``image``,
    #: ``audio``), and embedded resources, which we carry as such or inline as text
    prompt_capabilities: dict[str, Any] = field(
        factory=lambda: {"image": False, "audio": False, "embeddedContext": True}
    )
    mcp_capabilities: dict[str, Any] = field(factory=lambda: {"http": False, "sse": False})
    steering: bool = True
    _rpc: JsonRpcPeer[_Permission | None] = field(factory=lambda: JsonRpcPeer(with_version=True))
    _sessions: dict[str, _SessionView] = field(factory=dict)
    initialized: bool = False
    client_capabilities: dict[str, Any] = field(factory=dict)
    client_info: dict[str, Any] = field(factory=dict)

    # -- from the client --------------------------------------------------------------------

    def receive(self, message: Any) -> Output:
        if not isinstance(message, dict):
            return Output(send=[self._rpc.respond_error(None, INVALID_REQUEST, "not an object")])
        incoming = self._rpc.receive(message)
        if isinstance(incoming, IncomingRequest):
            return self._on_request(incoming)
        if isinstance(incoming, IncomingNotification):
            return self._on_notification(incoming)
        if isinstance(incoming, IncomingResponse):
            return self._on_response(incoming)
        # A response to a request we withdrew (a late permission answer), a stray, or junk: a
        # notification-like message gets no reply; a request we cannot read gets an error.
        if "id" in message and (
            "method" in message or ("result" not in message and "error" not in message)
        ):
            # A request it cannot read, or an object with an id that is neither a request nor
            # a response (JSON-RPC 2.0: an invalid request): its id, if that can be read, so
            # that a client waiting on it hears why.
            rid = message["id"]
            echo = rid if isinstance(rid, int | str) and not isinstance(rid, bool) else None
            why = "bad request" if message.get("jsonrpc") == "2.0" else 'bad request: not "2.0"'
            return Output(send=[self._rpc.respond_error(echo, INVALID_REQUEST, why)])
        return Output()

    def _on_request(self, request: IncomingRequest) -> Output:
        params = request.params if isinstance(request.params, dict) else {}
        method = request.method
        rid = request.id
        if method == "initialize":
            return Output(send=[self._initialize(rid, params)])
        if method == "authenticate":
            # ``authMethods`` is empty (an agent behind that needs a login logs in by its own
            # means), and the method must be one advertised: none is.
            why = f"no authentication method {params.get('methodId')!r}: none is advertised"
            return self._invalid(rid, why)
        if method == "session/new":
            cwd, mcp = _cwd(params), _mcp(params)
            if cwd is None:
                return self._invalid(rid, "cwd must be an absolute path")
            if isinstance(mcp, str):
                return self._invalid(rid, mcp)
            return Output(actions=[NewSession(rid, cwd, mcp)])
        if method in ("session/load", "session/resume"):
            session_id, cwd, mcp = params.get("sessionId"), _cwd(params), _mcp(params)
            if not isinstance(session_id, str) or cwd is None:
                return self._invalid(rid, "needs a sessionId and an absolute cwd")
            if isinstance(mcp, str):
                return self._invalid(rid, mcp)
            replay = method == "session/load"
            return Output(actions=[OpenSession(rid, session_id, cwd, mcp, replay)])
        if method == "session/list":
            cwd = params.get("cwd")
            cursor = params.get("cursor")
            if not isinstance(cursor, str | None):
                return self._invalid(rid, "cursor must be a string")
            return Output(
                actions=[
                    ListSessions(
                        rid,
                        cwd if isinstance(cwd, str) else None,
                        cursor if isinstance(cursor, str) else None,
                    )
                ]
            )
        session_id = params.get("sessionId")
        if not isinstance(session_id, str):
            if method in (
                "session/close",
                "session/prompt",
                "session/set_config_option",
                "session/set_mode",
            ):
                return self._invalid(rid, "needs a sessionId")
            return Output(send=[self._not_found(rid, method)])
        if method == "session/close":
            return Output(actions=[CloseSession(rid, session_id)])
        if method == "session/set_mode":
            mode_id = params.get("modeId")
            if not isinstance(mode_id, str) or not mode_id:
                return self._invalid(rid, "needs a modeId")
            return Output(actions=[SetMode(rid, session_id, mode_id)])
        if method == "session/set_config_option":
            value = params.get("value")
            if params.get("configId") != AGENT_CONFIG_ID or not isinstance(value, str):
                return self._invalid(rid, f"the only config option is {AGENT_CONFIG_ID!r}")
            return Output(actions=[SetAgent(rid, session_id, value)])
        if method == "session/prompt":
            parts = parts_from_acp(params.get("prompt"))
            if isinstance(parts, str):
                return self._invalid(rid, parts)
            text = parts_text(parts)
            if not text.strip():
                return self._invalid(rid, "the prompt is empty")
            only_text = all(part.kind == "text" for part in parts)
            self._view(session_id).pending_texts.append(_shown(text))
            return Output(
                actions=[PromptRequested(rid, session_id, text, () if only_text else parts)]
            )
        if method == STEER_METHOD and self.steering:
            steer = prompt_text(params.get("prompt"))
            if isinstance(steer, _Refused):
                return self._invalid(rid, steer.why)
            view = self._view(session_id)
            if _idle_behavior(params) == "promptRequired" and view.running_turn is None:
                return Output(send=[self._rpc.respond(rid, {"outcome": "promptRequired"})])
            return Output(actions=[SteerRequested(rid, session_id, steer)])
        return Output(send=[self._not_found(rid, method)])

    def _initialize(self, rid: RequestId, params: dict[str, Any]) -> dict[str, Any]:
        self.initialized = True
        capabilities = params.get("clientCapabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        info = params.get("clientInfo")
        self.client_info = info if isinstance(info, dict) else {}
        result: dict[str, Any] = {
            # We speak 1; a client asking for another gets 1 and decides (the spec's rule).
            "protocolVersion": ACP_PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": dict(self.prompt_capabilities),
                "mcpCapabilities": dict(self.mcp_capabilities),
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
            },
            "authMethods": [],
            "agentInfo": dict(self.agent_info),
        }
        if self.steering:
            result["_meta"] = {"steering": {"supported": True}}
        return self._rpc.respond(rid, result)

    def _on_notification(self, note: IncomingNotification) -> Output:
        params = note.params if isinstance(note.params, dict) else {}
        if note.method == "session/cancel":
            session_id = params.get("sessionId")
            if not isinstance(session_id, str):
                return Output()
            view = self._sessions.get(session_id)
            if view is None or (
                view.running_turn is None and not view.turns and not view.pending_texts
            ):
                return Output()  # nothing of ours runs: a cancel after the end is a no-op
            view.cancelling = True
            return Output(actions=[CancelRequested(session_id)])
        # ``$/cancel_request`` of one of the client's requests: each is answered once its work
        # ends (a prompt's once its turn is over), so there is nothing to cut short; others
        # (unknown notifications) are ignored as the spec asks.
        return Output()

    def _on_response(self, response: IncomingResponse[_Permission | None]) -> Output:
        held = response.context
        if held is None:
            return Output()
        view = self._view(held.session_id)
        if view.permissions.pop(held.request_id, None) is None:
            return Output()  # withdrawn meanwhile
        option_id: str | None = None
        result = response.result if isinstance(response.result, dict) else {}
        outcome = result.get("outcome") if isinstance(result.get("outcome"), dict) else {}
        assert isinstance(outcome, dict)
        if response.error is None and outcome.get("outcome") == "selected":
            chosen = outcome.get("optionId")
            if isinstance(chosen, str) and chosen in held.option_ids:
                option_id = chosen
        return Output(actions=[PermissionAnswered(held.session_id, held.request_id, option_id)])

    # -- from the I/O layer -----------------------------------------------------------------

    def session_opened(
        self,
        rpc_id: RequestId,
        session_id: str,
        *,
        config_options: list[dict[str, Any]],
        new: bool,
        replay: Sequence[tuple[str, str]] = (),
        modes: Mapping[str, Any] | None = None,
    ) -> Output:
        """The session behind ``session_id`` takes prompts: answer ``session/new`` (``new``),
        or ``session/load`` after replaying its history (``role``, ``text``) as updates, or
        ``session/resume``; ``modes``: the agent's own (``SessionModeState``), offered on."""
        self._view(session_id).known = True
        out = Output()
        for role, text in replay:
            kind = "user_message_chunk" if role == "user" else "agent_message_chunk"
            out.send.append(self._update(session_id, {"sessionUpdate": kind, **_text(text)}))
        result: dict[str, Any] = {"configOptions": config_options}
        if modes is not None:
            result["modes"] = dict(modes)
        if new:
            result["sessionId"] = session_id
        out.send.append(self._rpc.respond(rpc_id, result))
        return out

    def session_ended(
        self, session_id: str, *, error: str | None = None, forget: bool = True
    ) -> Output:
        """The session behind ``session_id`` is gone (closed, replaced by another agent's, or
        lost): each prompt still waiting is answered (``cancelled``, or ``error``), each
        permission request the client holds withdrawn; ``forget``: the ACP session too."""
        view = self._view(session_id)
        out = Output()
        for rpc_id in view.turns.values():
            out.send.append(self._ended_answer(rpc_id, error))
        for rpc_id in view.permissions.values():
            self._rpc.forget(rpc_id)
            out.send.append(self._rpc.notify("$/cancel_request", {"requestId": rpc_id}))
        view.turns.clear()
        view.permissions.clear()
        view.ended.clear()
        view.running_turn = None
        view.cancelling = False
        if forget:
            self._sessions.pop(session_id, None)
        return out

    def turn_abandoned(
        self,
        rpc_id: RequestId,
        session_id: str,
        text: str,
        turn_id: str,
        *,
        error: str | None = None,
    ) -> Output:
        """A prompt accepted by a session that was gone by then (closed, replaced)."""
        view = self._view(session_id)
        if _shown(text) in view.pending_texts:
            view.pending_texts.remove(_shown(text))
        view.turns.pop(turn_id, None)
        view.ended.pop(turn_id, None)
        return Output(send=[self._ended_answer(rpc_id, error)])

    def expect_resume(self, session_id: str) -> None:
        """The session was started to resume an earlier one: a ``ready`` with a reason (the
        agent refused the resume and started afresh) is told to the client."""
        self._view(session_id).resuming = True

    def _ended_answer(self, rpc_id: RequestId, error: str | None) -> dict[str, Any]:
        if error is not None:
            return self._rpc.respond_error(rpc_id, INTERNAL_ERROR, error)
        meta = {META_KEY: {"outcome": "cancelled", "reason": "session_closed"}}
        return self._rpc.respond(rpc_id, {"stopReason": "cancelled", "_meta": meta})

    def respond(self, rpc_id: RequestId, result: dict[str, Any]) -> Output:
        return Output(send=[self._rpc.respond(rpc_id, result)])

    def fail(
        self, rpc_id: RequestId, message: str, *, code: int = INTERNAL_ERROR, data: Any = None
    ) -> Output:
        return Output(send=[self._rpc.respond_error(rpc_id, code, message, data)])

    def prompt_failed(
        self,
        rpc_id: RequestId,
        session_id: str,
        text: str,
        message: str,
        *,
        code: int = INTERNAL_ERROR,
    ) -> Output:
        """The session refused the prompt (stopped, failed, too many queued; ``INVALID_PARAMS``:
        content the agent behind cannot take)."""
        view = self._view(session_id)
        if _shown(text) in view.pending_texts:
            view.pending_texts.remove(_shown(text))
        if not view.known and view.holds_nothing():
            del self._sessions[session_id]  # a session never ready here (made up, say)
        return self.fail(rpc_id, message, code=code)

    def prompt_accepted(
        self, rpc_id: RequestId, session_id: str, text: str, turn_id: str
    ) -> Output:
        """The session took the prompt as turn ``turn_id``; its response waits for its end."""
        view = self._view(session_id)
        if _shown(text) in view.pending_texts:
            view.pending_texts.remove(_shown(text))
        ended = view.ended.pop(turn_id, None)
        if ended is not None:
            return Output(send=[self._prompt_answer(rpc_id, ended)])
        view.turns[turn_id] = rpc_id
        return Output()

    def steer_answered(self, rpc_id: RequestId, session_id: str, mode: str) -> Output:
        """What became of a ``_session/steering``: ``injected`` joined the running turn; any
        other way started a turn the client did not prompt (its events still come)."""
        outcome = "injected" if mode == "injected" else "startedNewTurn"
        return Output(send=[self._rpc.respond(rpc_id, {"outcome": outcome})])

    def notice(self, session_id: str, text: str, kind: str) -> Output:
        """Something the person should see (an agent restarted, a session not resumed)."""
        return Output(send=[self._notice(session_id, text, kind)])

    def event(self, session_id: str, event: ev.Event) -> Output:
        """One universal event of the session behind ``session_id``."""
        view = self._view(session_id)
        out = Output()
        if isinstance(event, ev.MessageDelta):
            kind = "user_message_chunk" if event.role == "user" else "agent_message_chunk"
            if event.text:
                out.send.append(
                    self._update(session_id, {"sessionUpdate": kind, **_text(event.text)})
                )
        elif isinstance(event, ev.ThoughtDelta):
            if event.text:
                update = {"sessionUpdate": "agent_thought_chunk", **_text(event.text)}
                out.send.append(self._update(session_id, update))
        elif isinstance(event, ev.ToolCall):
            out.send.append(self._update(session_id, _tool_call(event)))
        elif isinstance(event, ev.ToolUpdate):
            out.send.append(self._update(session_id, _tool_update(event)))
        elif isinstance(event, ev.Plan):
            update = {"sessionUpdate": "plan", "entries": _plan_entries(event.entries)}
            out.send.append(self._update(session_id, update))
        elif isinstance(event, ev.PermissionRequested):
            out.send.append(self._ask_permission(session_id, view, event))
        elif isinstance(event, ev.PermissionResolved):
            rpc_id = view.permissions.pop(event.request_id, None)
            if rpc_id is not None:
                self._rpc.forget(rpc_id)
                out.send.append(self._rpc.notify("$/cancel_request", {"requestId": rpc_id}))
        elif isinstance(event, ev.TurnStarted):
            view.running_turn = event.turn_id
            view.cancelling = False
            if event.text in view.pending_texts or event.turn_id in view.turns:
                pass  # ours: the client has it already
            else:  # another client's prompt on a shared session
                update = {"sessionUpdate": "user_message_chunk", **_text(event.text)}
                out.send.append(self._update(session_id, update))
        elif isinstance(event, ev.TurnSteered):
            update = {"sessionUpdate": "user_message_chunk", **_text(event.text)}
            out.send.append(self._update(session_id, update))
        elif isinstance(event, ev.TurnEnded):
            out.extend(self._turn_ended(session_id, view, event))
        elif isinstance(event, ev.SessionState):
            out.extend(self._state(session_id, view, event))
        elif isinstance(event, ev.AgentExited):
            out.extend(self._agent_exited(session_id, view, event))
        elif isinstance(event, ev.SessionRecycled):
            text = f"the agent is being restarted ({event.reason}); the session will be resumed"
            out.send.append(self._notice(session_id, text, "recycled"))
        elif isinstance(event, ev.TurnStalled):
            text = f"the agent said nothing for {event.silent_s:.0f} s: stopping the turn"
            out.send.append(self._notice(session_id, text, "stalled"))
        elif isinstance(event, ev.SessionHeld):
            if event.held is not None:
                text = f"the supervisor is {event.held}: prompts wait until it is resumed"
            else:
                text = "the supervisor is resumed: waiting prompts start in order"
            out.send.append(self._notice(session_id, text, event.held or "resumed"))
        elif isinstance(event, ev.ErrorEvent) and event.code == "resume_failed":
            text = f"the agent could not resume its session, it starts afresh: {event.message}"
            out.send.append(self._notice(session_id, text, "resume_failed"))
        elif isinstance(event, ev.SessionInfo):
            if (
                event.info_kind in PASSED_UPDATES
                and event.data.get("sessionUpdate") == event.info_kind
            ):
                passed = _passable_update(event.data)
                if passed is not None:
                    out.send.append(self._update(session_id, passed))
        return out

    # -- turns ------------------------------------------------------------------------------

    def _turn_ended(self, session_id: str, view: _SessionView, event: ev.TurnEnded) -> Output:
        out = Output()
        if view.running_turn == event.turn_id:
            view.running_turn = None
            view.cancelling = False
        receipt = event.receipt or {}
        if (
            receipt.get("resumed") is False
            and "respawned" in receipt.get("escalation", ())
            and receipt.get("session_failed") is None
        ):
            # The stop had to kill the agent, and the one started in its place could not
            # resume the session: the conversation so far is gone on the agent's side.
            text = (
                "the agent was restarted to stop the turn and could not resume its session:"
                " it starts afresh, without this conversation"
            )
            out.send.append(self._notice(session_id, text, "resume_failed"))
        rpc_id = view.turns.pop(event.turn_id, None)
        if rpc_id is not None:
            out.send.append(self._prompt_answer(rpc_id, event))
            return out
        if view.pending_texts:  # a prompt of ours whose acceptance is not told yet
            view.ended[event.turn_id] = event
            while len(view.ended) > _ENDED_KEPT:
                view.ended.pop(next(iter(view.ended)))
        return out

    def _agent_exited(self, session_id: str, view: _SessionView, event: ev.AgentExited) -> Output:
        out = Output()
        turn = view.running_turn
        if view.cancelling and turn is not None and (event.killed or not event.expected):
            # The tree of a turn being cancelled is dead: the turn is over. The client hears
            # now; the session is respawned and resumed behind its back (turn.ended follows).
            # An agent that ends its process as its way of stopping (Amp) is another matter:
            # its turn's own end says how it went, once the next process runs.
            rpc_id = view.turns.pop(turn, None)
            view.running_turn = None
            view.cancelling = False
            if rpc_id is not None:
                outcome = "killed" if event.killed else "cancelled"  # else: it crashed
                meta = {META_KEY: {"outcome": outcome, "turnId": turn}}
                answer = {"stopReason": "cancelled", "_meta": meta}
                out.send.append(self._rpc.respond(rpc_id, answer))
        if not event.expected:
            view.restarting = True
            how = f"exit code {event.exit_code}" if event.exit_code is not None else "a signal"
            if event.signal is not None:
                how = f"signal {event.signal}"
            text = f"the agent exited unexpectedly ({how}): restarting it and resuming the session"
            out.send.append(self._notice(session_id, text, "agent_exited"))
        return out

    def _state(self, session_id: str, view: _SessionView, event: ev.SessionState) -> Output:
        if event.state == "cancelling":
            view.cancelling = True
        if event.state == "ready" and view.resuming:
            view.resuming = False
            if event.detail:
                text = f"the agent could not resume its session, it starts afresh: {event.detail}"
                return Output(send=[self._notice(session_id, text, "resume_failed")])
        if event.state == "ready" and view.restarting:
            view.restarting = False
            text = "the agent is back" + (
                f" ({event.detail})" if event.detail else ", session resumed"
            )
            return Output(send=[self._notice(session_id, text, "agent_restarted")])
        if event.state == "failed":
            out = Output()
            for turn_id, rpc_id in list(view.turns.items()):
                del view.turns[turn_id]
                out.send.append(
                    self._rpc.respond_error(
                        rpc_id, INTERNAL_ERROR, f"the session failed: {event.detail}"
                    )
                )
            out.send.append(
                self._notice(session_id, f"the session failed: {event.detail}", "failed")
            )
            return out
        if event.state == "stopped":
            out = Output()
            for turn_id, rpc_id in list(view.turns.items()):
                del view.turns[turn_id]
                out.send.append(self._rpc.respond(rpc_id, {"stopReason": "cancelled"}))
            return out
        return Output()

    def _prompt_answer(self, rpc_id: RequestId, event: ev.TurnEnded) -> dict[str, Any]:
        meta: dict[str, Any] = {"outcome": event.outcome, "turnId": event.turn_id}
        if event.reason is not None:
            meta["reason"] = event.reason
        if event.receipt is not None:
            meta["receipt"] = event.receipt
        if event.outcome in ("cancelled", "killed"):
            return self._rpc.respond(rpc_id, {"stopReason": "cancelled", "_meta": {META_KEY: meta}})
        if event.outcome == "failed":
            why = event.error or "the agent ended the turn with an error"
            return self._rpc.respond_error(rpc_id, INTERNAL_ERROR, f"the turn failed: {why}", meta)
        reason = event.stop_reason if event.stop_reason in STOP_REASONS else "end_turn"
        if event.stop_reason == "cancelled":
            reason = "cancelled"
        return self._rpc.respond(rpc_id, {"stopReason": reason, "_meta": {META_KEY: meta}})

    # -- permissions ------------------------------------------------------------------------

    def _ask_permission(
        self, session_id: str, view: _SessionView, event: ev.PermissionRequested
    ) -> dict[str, Any]:
        options = [
            {
                "optionId": option.option_id,
                "name": option.name or option.option_id,
                "kind": _permission_kind(option),
            }
            for option in event.options
        ]
        held = _Permission(
            session_id, event.request_id, frozenset(o.option_id for o in event.options)
        )
        tool = event.tool_call
        tool_call: dict[str, Any] = {
            "toolCallId": str(tool.get("toolCallId") or event.request_id),
        }
        tool_call.update(_tool_members(tool, ("title", "content", "locations", "rawInput")))
        if tool.get("kind") in TOOL_KINDS:
            tool_call["kind"] = tool["kind"]
        if tool.get("status") in TOOL_STATUSES:
            tool_call["status"] = tool["status"]
        if "title" not in tool_call:
            title = tool.get("name") or tool.get("command") or tool.get("tool_name")
            if isinstance(title, str):
                tool_call["title"] = title
        params = {"sessionId": session_id, "toolCall": tool_call, "options": options}
        rpc_id, message = self._rpc.request("session/request_permission", params, held)
        view.permissions[event.request_id] = rpc_id
        return message

    # -- helpers ----------------------------------------------------------------------------

    def _view(self, session_id: str) -> _SessionView:
        view = self._sessions.get(session_id)
        if view is None:
            view = self._sessions[session_id] = _SessionView()
        return view

    def _update(self, session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        return self._rpc.notify("session/update", {"sessionId": session_id, "update": update})

    def _notice(self, session_id: str, text: str, kind: str) -> dict[str, Any]:
        update = {
            "sessionUpdate": "agent_message_chunk",
            **_text(f"\n\n[agent-supervisor] {text}\n\n"),
            "_meta": {META_KEY: {"notice": kind}},
        }
        return self._update(session_id, update)

    def _invalid(self, rid: RequestId, why: str) -> Output:
        return Output(send=[self._rpc.respond_error(rid, INVALID_PARAMS, why)])

    def _not_found(self, rid: RequestId, method: str) -> dict[str, Any]:
        return self._rpc.respond_error(rid, METHOD_NOT_FOUND, f"Method not found: {method}")


# -- content ---------------------------------------------------------------------------------


@frozen
class _Refused:
    why: str


def prompt_text(blocks: Any) -> str | _Refused:
    """A steer's content blocks as one text (a steer joins a running turn as text, for every
    agent that can take one): text, links and embedded text resources; anything that needs
    more (an image, a blob) is refused."""
    parts = parts_from_acp(blocks)
    if isinstance(parts, str):
        return _Refused(parts)
    for part in parts:
        if part.needs is not None:
            return _Refused(f"a steer is text: content of type {part.kind!r} cannot join a turn")
    text = parts_text(parts)
    if not text.strip():
        return _Refused("the prompt is empty")
    return text


def _text(text: str) -> dict[str, Any]:
    return {"content": {"type": "text", "text": text}}


def _cwd(params: Mapping[str, Any]) -> str | None:
    cwd = params.get("cwd")
    return cwd if isinstance(cwd, str) and cwd.startswith("/") else None


def _mcp(params: Mapping[str, Any]) -> list[dict[str, Any]] | str:
    """The client's ``mcpServers`` (absent: none), or why they cannot be read: never dropped
    silently, since the session would run without servers its client believes it has."""
    servers = params.get("mcpServers", [])
    if not isinstance(servers, list):
        return "mcpServers must be a list"
    for index, server in enumerate(servers):
        if not isinstance(server, dict):
            return f"mcpServers[{index}] must be an object"
    return servers


def _idle_behavior(params: Mapping[str, Any]) -> str | None:
    meta = params.get("_meta")
    steering = meta.get("steering") if isinstance(meta, dict) else None
    behavior = steering.get("idleBehavior") if isinstance(steering, dict) else None
    return behavior if isinstance(behavior, str) else None


def _permission_kind(option: ev.PermissionOption) -> str:
    if option.option_kind in PERMISSION_KINDS:
        return option.option_kind
    words = f"{option.option_id} {option.name}".lower()
    allow = any(w in words for w in ("allow", "accept", "approve", "yes"))
    return ("allow" if allow else "reject") + ("_always" if "always" in words else "_once")


#: Members of an ACP agent's own tool call objects that go on as they are.
_TOOL_PASSED = ("content", "locations", "rawInput", "rawOutput")


# What an agent behind says goes to the editor only in the shape the schema gives it: an agent
# that misbehaves must not make the editor's parser fail (what does not fit is left out, as the
# schema's own readers skip what they cannot read).


def _objects(value: Any, key: str) -> list[dict[str, Any]] | None:
    """The objects of a list whose ``key`` is a string; None if ``value`` is not a list."""
    if not isinstance(value, list):
        return None
    return [item for item in value if isinstance(item, dict) and isinstance(item.get(key), str)]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tool_members(tool: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The members ``keys`` of an agent's tool call that have the schema's shape."""
    members: dict[str, Any] = {}
    for key in keys:
        value = tool.get(key)
        if value is None:
            continue
        if key == "title":
            if isinstance(value, str):
                members[key] = value
        elif key == "content":
            content = _objects(value, "type")
            if content is not None:
                members[key] = content
        elif key == "locations":
            locations = _objects(value, "path")
            if locations is not None:
                members[key] = locations
        else:  # rawInput, rawOutput: any JSON
            members[key] = value
    return members


def _passable_update(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """A session update of :data:`PASSED_UPDATES` in the schema's shape, or None."""
    update = dict(data)
    kind = update.get("sessionUpdate")
    if kind == "available_commands_update":
        commands = _objects(update.get("availableCommands"), "name")
        if commands is None:
            return None
        update["availableCommands"] = [c for c in commands if isinstance(c.get("description"), str)]
    elif kind == "session_info_update":
        for key in ("title", "updatedAt"):
            if key in update and not isinstance(update[key], str | None):
                del update[key]
    elif kind == "usage_update":
        if not (_count(update.get("used")) and _count(update.get("size"))):
            return None
        if "cost" in update and not isinstance(update["cost"], dict | None):
            del update["cost"]
    elif kind == "current_mode_update":
        if not isinstance(update.get("currentModeId"), str):
            return None
    if "_meta" in update and not isinstance(update["_meta"], dict | None):
        del update["_meta"]
    return update


def _acp_raw(raw: Mapping[str, Any]) -> bool:
    return raw.get("sessionUpdate") in ("tool_call", "tool_call_update")


def _tool_call(event: ev.ToolCall) -> dict[str, Any]:
    update: dict[str, Any] = {
        "sessionUpdate": "tool_call",
        "toolCallId": event.tool_call_id,
        "title": event.title or event.tool_kind or "tool",
    }
    if event.tool_kind in TOOL_KINDS:
        update["kind"] = event.tool_kind
    if event.status in TOOL_STATUSES:
        update["status"] = event.status
    if _acp_raw(event.raw):
        update.update(_tool_members(event.raw, _TOOL_PASSED))
    return update


def _tool_update(event: ev.ToolUpdate) -> dict[str, Any]:
    update: dict[str, Any] = {"sessionUpdate": "tool_call_update", "toolCallId": event.tool_call_id}
    if event.status in TOOL_STATUSES:
        update["status"] = event.status
    if _acp_raw(event.raw):
        update.update(_tool_members(event.raw, ("title", *_TOOL_PASSED)))
        if event.raw.get("kind") in TOOL_KINDS:
            update["kind"] = event.raw["kind"]
    return update


def _plan_entries(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plan entries in ACP's shape, whatever words the agent behind used."""
    out = []
    for entry in entries:
        content = entry.get("content") or entry.get("step") or entry.get("text") or ""
        priority = entry.get("priority")
        status = entry.get("status")
        if status == "inProgress":
            status = "in_progress"
        out.append(
            {
                "content": str(content),
                "priority": priority if priority in PLAN_PRIORITIES else "medium",
                "status": status if status in PLAN_STATUSES else "pending",
            }
        )
    return out


def _shown(text: str) -> str:
    """A prompt's text as the session's events show it (``turn.started`` previews a long
    one): what a ``TurnStarted`` of it is matched by."""
    return ev.preview(text)[0]
