"""ACP (Agent Client Protocol) v1, client side, as a sans-IO machine.

Facts this follows (``shared/protocols.md`` section 1): ``initialize`` negotiates protocol
version 1; ``session/new`` or, when the agent advertises ``loadSession``, ``session/load``
(the agent replays history as ``session/update`` before it answers); a turn is one
``session/prompt`` request and ends only with its response; ``session/cancel`` is a
notification that gets no reply; every pending ``session/request_permission`` must be answered
``cancelled`` on cancel; the agent may withdraw a request it sent us with ``$/cancel_request``.
We advertise neither ``fs`` nor ``terminal``, and answer those methods "method not found".

Resuming prefers ``session/resume`` (``sessionCapabilities.resume``: no history replayed, so a
respawn is faster and sends no duplicate events) over ``session/load``; a refused resume falls
back to ``session/load`` where advertised, else a fresh ``session/new``. Stopping sends
``session/close`` where ``sessionCapabilities.close`` is advertised. A request we abandon (a
steer the agent did not answer in time) is withdrawn with ``$/cancel_request``, as the agent
withdraws its own permission requests (answered -32800, ``permission.resolved`` by ``agent``).

Steering (``_session/steering``, the extension claude-agent-acp and codex-acp 2.x implement, as
agreed for ACP RFD #1261): only with an agent whose ``initialize`` result carries
``_meta.steering.supported: true``. We always ask with ``idleBehavior: "promptRequired"``, so an
agent whose turn has just ended answers ``promptRequired`` instead of starting a turn we would
not know about; ``injected`` means the text joined the running ``session/prompt``, which still
ends that turn with its one response.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import msgspec
from attrs import define, field, frozen

from protocols import events as ev
from protocols.content import Part, to_acp
from protocols.jsonrpc import (
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
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
    ModeSet,
    Output,
    PartialStep,
    SessionEstablished,
    StartFailed,
    SteerAnswered,
    Step,
    TurnFinished,
)
from protocols.mcp import McpServer, McpUnsupported, check_transports, mcp_server_to_acp
from protocols.permissions import DeskPermissions, Held, PermissionDesk

__all__ = ["ACP_PROTOCOL_VERSION", "AcpClient", "CLIENT_INFO", "TextChunk"]

ACP_PROTOCOL_VERSION = 1
CLIENT_INFO = {"name": "agent-supervisor", "version": "0.1.0"}
STEER_METHOD = "_session/steering"

#: ``session/update`` kinds that describe the session rather than the turn's content.
_INFO_UPDATES = frozenset(
    {
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "usage_update",
        "notice",
        "compaction_update",
        "compaction_summary_chunk",
    }
)


@frozen
class _ModeSent:
    """What a ``session/set_mode`` request asked; handed back with its response."""

    mode_id: str


@frozen
class _SteerSent:
    """What a ``_session/steering`` request was about; handed back with its response."""

    turn_id: str
    steer_id: int


class _TextContent(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: Literal["text"]
    text: str


class _ChunkUpdate(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    sessionUpdate: Literal["agent_message_chunk"]  # noqa: N815  # the wire's name
    content: _TextContent


class _ChunkParams(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    sessionId: str  # noqa: N815
    update: _ChunkUpdate


class TextChunk(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A ``session/update`` notification carrying one text chunk of the answer, nothing else:
    most lines of any stream, typed (:attr:`AcpClient.hot_decoder`). It stands for exactly
    the dict its line decodes to (every field required, none other allowed)."""

    jsonrpc: Literal["2.0"]
    method: Literal["session/update"]
    params: _ChunkParams


_TEXT_CHUNKS: msgspec.json.Decoder[TextChunk] = msgspec.json.Decoder(TextChunk)


@define
class AcpClient(DeskPermissions[RequestId], AgentProtocol):
    """Our side of one ACP connection."""

    name: ClassVar[str] = "acp"

    #: a request's context: the turn a ``session/prompt`` runs, or a steer
    _rpc: JsonRpcPeer[str | _SteerSent | _ModeSent | None] = field(
        factory=lambda: JsonRpcPeer(with_version=True)
    )
    _phase: str = "idle"  # idle, initializing, opening, ready, failed
    _cwd: str = "."
    _resume: str | None = None
    #: ``mcpServers`` of every ``session/new``, ``load`` and ``resume`` (ACP form)
    _mcp_servers: tuple[McpServer, ...] = ()
    _session_id: str | None = None
    _can_load: bool = False
    _can_resume: bool = False
    _can_close: bool = False
    #: our ``_session/steering`` requests waiting for an answer: steer id -> request id
    _steer_requests: dict[int, RequestId] = field(factory=dict)
    _turn_id: str | None = None
    _prompt_rpc_id: RequestId | None = None
    _cancel_sent: bool = False
    _load_error: str | None = None
    #: pending ``session/request_permission`` requests; the ticket is the JSON-RPC id
    _desk: PermissionDesk[RequestId] = field(factory=PermissionDesk)
    _steering: bool = False
    agent_info: dict[str, Any] = field(factory=dict)
    agent_capabilities: dict[str, Any] = field(factory=dict)
    #: the session's modes (``SessionModeState``) from the last ``session/new|load|resume``
    _modes: dict[str, Any] | None = None

    # -- calls from the actor -------------------------------------------------------------

    def start(
        self, *, cwd: str, resume: str | None = None, mcp_servers: Sequence[McpServer] = ()
    ) -> Step:
        if self._phase != "idle":
            raise RuntimeError("start() called twice")
        self._phase = "initializing"
        self._cwd = cwd
        self._resume = resume
        self._mcp_servers = tuple(mcp_servers)
        _, message = self._rpc.request(
            "initialize",
            {
                "protocolVersion": ACP_PROTOCOL_VERSION,
                # Omitted capabilities mean "unsupported": no fs, no terminal (yet).
                "clientCapabilities": {
                    "fs": {"readTextFile": False, "writeTextFile": False},
                    "terminal": False,
                },
                "clientInfo": CLIENT_INFO,
            },
            None,
        )
        return Step(send=[message])

    @property
    def carries(self) -> frozenset[str]:
        """Links always (every ACP agent takes them); images, audio and embedded resources as
        the agent's ``promptCapabilities`` advertise them."""
        caps = self.agent_capabilities.get("promptCapabilities")
        caps = caps if isinstance(caps, dict) else {}
        words = {"resource_link"}
        words.update(word for word in ("image", "audio") if caps.get(word) is True)
        if caps.get("embeddedContext") is True:
            words.add("resource")
        return frozenset(words)

    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        if self._phase != "ready" or self._turn_id is not None:
            raise RuntimeError(f"prompt() while {self._phase} with turn {self._turn_id}")
        self._turn_id = turn_id
        self._cancel_sent = False
        carries = self.carries
        blocks = [to_acp(part, carries) for part in parts] or [{"type": "text", "text": text}]
        request_id, message = self._rpc.request(
            "session/prompt", {"sessionId": self._session_id, "prompt": blocks}, turn_id
        )
        self._prompt_rpc_id = request_id
        return Step(send=[message])

    def cancel(self) -> Step:
        if self._turn_id is None or self._cancel_sent:
            return Step()
        self._cancel_sent = True
        return Step(send=[self._rpc.notify("session/cancel", {"sessionId": self._session_id})])

    @property
    def modes(self) -> dict[str, Any] | None:
        return self._modes

    def set_mode(self, mode_id: str) -> Step:
        if self._phase != "ready" or self._modes is None:
            raise RuntimeError(f"set_mode() while {self._phase} with modes {self._modes}")
        params = {"sessionId": self._session_id, "modeId": mode_id}
        _, message = self._rpc.request("session/set_mode", params, _ModeSent(mode_id))
        return Step(send=[message])

    def _on_mode_set(
        self, sent: _ModeSent, response: IncomingResponse[str | _SteerSent | _ModeSent | None]
    ) -> Step:
        if response.error is not None:
            return Step(events=[ModeSet(sent.mode_id, response.error.describe())])
        if self._modes is not None:
            self._modes = {**self._modes, "currentModeId": sent.mode_id}
        update = {"sessionUpdate": "current_mode_update", "currentModeId": sent.mode_id}
        info = ev.SessionInfo(info_kind="current_mode_update", data=update)
        return Step(events=[ModeSet(sent.mode_id), info])

    @property
    def can_steer(self) -> bool:
        return self._steering

    def steer(self, turn_id: str, steer_id: int, text: str) -> Step:
        if not self._steering or self._turn_id != turn_id:
            raise RuntimeError(f"steer() of turn {turn_id} while {self._turn_id} runs")
        request_id, message = self._rpc.request(
            STEER_METHOD,
            {
                "sessionId": self._session_id,
                "prompt": [{"type": "text", "text": text}],
                "_meta": {"steering": {"idleBehavior": "promptRequired"}},
            },
            _SteerSent(turn_id, steer_id),
        )
        self._steer_requests[steer_id] = request_id
        return Step(send=[message])

    def abandon_steer(self, steer_id: int) -> Step:
        request_id = self._steer_requests.pop(steer_id, None)
        if request_id is None:
            return Step()
        # A late answer still comes back with its context, and is then ignored by the actor.
        return Step(send=[self._rpc.notify("$/cancel_request", {"requestId": request_id})])

    def close(self) -> Step:
        if not self._can_close or self._session_id is None or self._phase != "ready":
            return Step()
        _, message = self._rpc.request("session/close", {"sessionId": self._session_id}, None)
        return Step(send=[message])

    def number_requests(self, tag: str) -> None:
        self._desk.tag = tag  # JSON-RPC ids start again with each process

    @property
    def agent_session_id(self) -> str | None:
        return self._session_id

    # -- messages from the agent ----------------------------------------------------------

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

    def _on_response(self, response: IncomingResponse[str | _SteerSent | _ModeSent | None]) -> Step:
        if response.method == "session/prompt" and isinstance(response.context, str):
            return self._on_prompt_answered(response)  # a turn's end (a cancel's answer): first
        if isinstance(response.context, _ModeSent):
            return self._on_mode_set(response.context, response)
        if isinstance(response.context, _SteerSent):
            self._steer_requests.pop(response.context.steer_id, None)
            return self._on_steered(response.context, response)
        if response.method == "initialize":
            return self._on_initialized(response)
        if response.method in ("session/new", "session/load", "session/resume"):
            return self._on_session_opened(response)
        if response.method == "session/prompt":
            return self._on_prompt_answered(response)
        return Step()

    def _on_steered(
        self, sent: _SteerSent, response: IncomingResponse[str | _SteerSent | _ModeSent | None]
    ) -> Step:
        if response.error is not None:
            answer = SteerAnswered(
                sent.steer_id, sent.turn_id, False, detail=response.error.describe()
            )
            return Step(events=[answer])
        result = response.result if isinstance(response.result, dict) else {}
        outcome = result.get("outcome")
        if outcome == "injected":
            return Step(events=[SteerAnswered(sent.steer_id, sent.turn_id, True)])
        if outcome == "promptRequired":
            answer = SteerAnswered(sent.steer_id, sent.turn_id, False, no_turn=True)
            return Step(events=[answer, ev.SessionInfo(info_kind="steering", data=result)])
        # ``startedNewTurn`` (an agent that ignored ``promptRequired``) or a new word: the text
        # went somewhere we cannot follow; said as is, and not taken as having joined the turn.
        detail = f"agent answered the steer with {outcome!r}"
        answer = SteerAnswered(sent.steer_id, sent.turn_id, False, detail=detail)
        return Step(events=[answer, ev.SessionInfo(info_kind="steering", data=result)])

    def _on_initialized(
        self, response: IncomingResponse[str | _SteerSent | _ModeSent | None]
    ) -> Step:
        if response.error is not None:
            return self._fail(f"initialize failed: {response.error.describe()}")
        result = response.result if isinstance(response.result, dict) else {}
        version = result.get("protocolVersion")
        if type(version) is not int or version != ACP_PROTOCOL_VERSION:
            return self._fail(
                f"agent speaks ACP protocol version {version!r}; we speak {ACP_PROTOCOL_VERSION}"
            )
        capabilities = result.get("agentCapabilities")
        self.agent_capabilities = capabilities if isinstance(capabilities, dict) else {}
        info = result.get("agentInfo")
        self.agent_info = info if isinstance(info, dict) else {}
        self._can_load = self.agent_capabilities.get("loadSession") is True
        sessions = self.agent_capabilities.get("sessionCapabilities")
        sessions = sessions if isinstance(sessions, dict) else {}
        self._can_resume = isinstance(sessions.get("resume"), dict)
        self._can_close = isinstance(sessions.get("close"), dict)
        meta = result.get("_meta")
        steering = meta.get("steering") if isinstance(meta, dict) else None
        self._steering = isinstance(steering, dict) and steering.get("supported") is True
        try:
            check_transports(self._mcp_servers, self.mcp_kinds, _agent_name(self.agent_info))
        except McpUnsupported as exc:
            return self._fail(f"{exc}: its mcpCapabilities do not advertise it")
        self._phase = "opening"
        if self._resume is not None and self._can_resume:
            return self._open("session/resume", {"sessionId": self._resume})
        if self._resume is not None and self._can_load:
            return self._open("session/load", {"sessionId": self._resume})
        return self._open("session/new", {})

    @property
    def mcp_kinds(self) -> frozenset[str]:
        """The MCP servers the agent takes: ``stdio`` always (every ACP agent must), ``http``
        and ``sse`` only where its ``initialize`` result's ``mcpCapabilities`` says so."""
        capabilities = self.agent_capabilities.get("mcpCapabilities")
        capabilities = capabilities if isinstance(capabilities, dict) else {}
        return frozenset({"stdio"} | {k for k in ("http", "sse") if capabilities.get(k) is True})

    def _open(self, method: str, extra: dict[str, Any]) -> Step:
        servers = [mcp_server_to_acp(server) for server in self._mcp_servers]
        params = {**extra, "cwd": self._cwd, "mcpServers": servers}
        _, message = self._rpc.request(method, params, None)
        return Step(send=[message])

    def _on_session_opened(
        self, response: IncomingResponse[str | _SteerSent | _ModeSent | None]
    ) -> Step:
        if response.error is None and isinstance(response.result, dict):
            self._modes = _mode_state(response.result.get("modes"))
        if response.method == "session/resume":
            if response.error is not None:
                self._load_error = f"session/resume failed: {response.error.describe()}"
                if self._can_load:
                    return self._open("session/load", {"sessionId": self._resume})
                return self._open("session/new", {})
            self._session_id = self._resume
            return self._established(resumed=True)
        if response.method == "session/load":
            if response.error is not None:
                # The agent lost the session: a fresh one, and the receipt will say so.
                load_error = f"session/load failed: {response.error.describe()}"
                self._load_error = (
                    f"{self._load_error}; {load_error}" if self._load_error else load_error
                )
                return self._open("session/new", {})
            self._session_id = self._resume
            return self._established(resumed=True)
        if response.error is not None:
            return self._fail(f"session/new failed: {response.error.describe()}")
        result = response.result if isinstance(response.result, dict) else {}
        session_id = result.get("sessionId")
        if not isinstance(session_id, str):
            return self._fail("session/new answered without a sessionId")
        self._session_id = session_id
        if self._resume is None:
            return self._established(resumed=None)
        detail = self._load_error or "agent does not advertise loadSession"
        return self._established(resumed=False, detail=detail)

    def _established(self, *, resumed: bool | None, detail: str | None = None) -> Step:
        self._phase = "ready"
        assert self._session_id is not None
        step = Step(events=[SessionEstablished(self._session_id, resumed, detail)])
        if self._modes is not None:
            # The mode the (re)started session is in, for whoever shows it (a respawned agent
            # may not be in the one it was asked for before).
            update = {
                "sessionUpdate": "current_mode_update",
                "currentModeId": self._modes["currentModeId"],
            }
            step.events.append(ev.SessionInfo(info_kind="current_mode_update", data=update))
        return step

    def _fail(self, message: str) -> Step:
        self._phase = "failed"
        return Step(events=[StartFailed(message)])

    def _on_prompt_answered(
        self, response: IncomingResponse[str | _SteerSent | _ModeSent | None]
    ) -> Step:
        turn_id = response.context
        if not isinstance(turn_id, str) or turn_id != self._turn_id:
            return Step()
        self._turn_id = None
        self._prompt_rpc_id = None
        if response.error is not None:
            if response.error.code == REQUEST_CANCELLED:
                return Step(events=[TurnFinished(turn_id, "cancelled", interrupted=True)])
            return Step(events=[TurnFinished(turn_id, None, error=response.error.describe())])
        result = response.result if isinstance(response.result, dict) else {}
        stop_reason = result.get("stopReason")
        if not isinstance(stop_reason, str):
            stop_reason = None
        # ``end_turn`` after a cancel is ambiguous (opencode answers a cancelled turn that
        # way), so only ``cancelled`` is taken as the agent's word.
        interrupted = True if stop_reason == "cancelled" else None
        return Step(events=[TurnFinished(turn_id, stop_reason, interrupted=interrupted)])

    def _on_notification(self, note: IncomingNotification, raw: dict[str, Any]) -> Step:
        params = note.params if isinstance(note.params, dict) else {}
        if note.method == "session/update":
            return self._on_update(params, raw)
        if note.method == "$/cancel_request":
            return self._on_cancel_request(params)
        return Step(events=[ev.AgentUnparsed(raw=raw)])

    def _on_cancel_request(self, params: dict[str, Any]) -> Step:
        wanted = params.get("requestId")
        for held in self._desk.take_where(
            lambda held: held.ticket == wanted and type(held.ticket) is type(wanted)
        ):
            reply = self._rpc.respond_error(held.ticket, REQUEST_CANCELLED, "Request cancelled")
            return Step(send=[reply], events=[PermissionDesk.resolved(held, None, by="agent")])
        return Step()

    def receive_many(self, messages: Sequence[dict[str, Any]], start: int = 0) -> tuple[Step, int]:
        """A run of ``session/update`` notifications (a streamed answer: one chunk a line)
        becomes its events in one pass, without classifying each as JSON-RPC; the first
        message of any other kind ends the run, and is fed to :meth:`receive` alone when it
        opens one. A subclass that changes :meth:`receive` gets the default, which calls it."""
        if type(self).receive is not AcpClient.receive:
            return super().receive_many(messages, start)  # (hot_decoder is None then)
        events: list[Output] = []
        append = events.append
        update_event = self._update_event
        new_delta = ev.new_message_delta  # MessageDelta(...), cheaper
        # Nothing in a run of updates changes these (only responses do, and they end a run).
        session_id = self._session_id if self._phase != "opening" else None
        turn_id = self._turn_id
        end = len(messages)
        for at in range(start, end):  # noqa: B007  # at is read after the loop
            message: Any = messages[at]
            if message.__class__ is TextChunk:  # typed by hot_decoder: read as attributes
                chunk = message.params
                if chunk.sessionId == session_id:  # (session_id None: opening, see below)
                    append(new_delta(turn_id=turn_id, text=chunk.update.content.text))
                    continue
                message = msgspec.to_builtins(message)  # the dict it stands for
            if (
                message.get("method") != "session/update"
                or message.get("jsonrpc") != "2.0"
                or "id" in message
            ):
                break
            params = message.get("params")
            # A text chunk of the answer, most of any stream: what _update_event makes of it,
            # read straight off the dicts. Anything else about it and _update_event decides.
            if params.__class__ is dict and session_id is not None:
                update = params.get("update")
                if (
                    update.__class__ is dict
                    and update.get("sessionUpdate") == "agent_message_chunk"
                    and params.get("sessionId") == session_id
                ):
                    content = update.get("content")
                    if content.__class__ is dict:
                        text = content.get("text")
                        if text.__class__ is str and content.get("type") == "text":
                            append(new_delta(turn_id=turn_id, text=text))
                            continue
            try:
                event = update_event(params if isinstance(params, dict) else {}, message)
            except Exception as exc:
                raise PartialStep(Step(events=events), at - start, at) from exc
            if event is not None:
                append(event)
        else:
            at = end
        if at > start or at >= end:
            return Step(events=events), at - start
        try:
            return self.receive(messages[start]), 1
        except Exception as exc:
            raise PartialStep(Step(), 0, start) from exc

    @property
    def hot_decoder(self) -> msgspec.json.Decoder[Any] | None:
        """:class:`TextChunk` lines, typed (none for a subclass that changes :meth:`receive`:
        the default :meth:`receive_many` it gets hands every message to it)."""
        return _TEXT_CHUNKS if type(self).receive is AcpClient.receive else None

    def _on_update(self, params: dict[str, Any], raw: dict[str, Any]) -> Step:
        event = self._update_event(params, raw)
        return Step() if event is None else Step(events=[event])

    def _update_event(self, params: dict[str, Any], raw: dict[str, Any]) -> ev.Event | None:
        """The event one ``session/update`` is, or None (history a ``session/load`` replays:
        the subscribers saw it live)."""
        if self._phase == "opening":
            return None
        update = params.get("update")
        session_id = params.get("sessionId")
        if (
            not isinstance(update, dict)
            or not isinstance(session_id, str)
            or session_id != self._session_id
        ):
            return ev.AgentUnparsed(raw=raw)
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":  # most of a stream: first, and returned at once
            return ev.MessageDelta(turn_id=self._turn_id, text=_content_text(update.get("content")))
        turn = self._turn_id
        event: ev.Event
        if kind == "user_message_chunk":
            event = ev.MessageDelta(
                turn_id=turn, text=_content_text(update.get("content")), role="user"
            )
        elif kind == "agent_thought_chunk":
            event = ev.ThoughtDelta(turn_id=turn, text=_content_text(update.get("content")))
        elif kind == "tool_call":
            event = ev.ToolCall(
                turn_id=turn,
                tool_call_id=str(update.get("toolCallId", "")),
                title=str(update.get("title", "")),
                tool_kind=_opt_str(update.get("kind")),
                status=_opt_str(update.get("status")),
                raw=update,
            )
        elif kind == "tool_call_update":
            event = ev.ToolUpdate(
                turn_id=turn,
                tool_call_id=str(update.get("toolCallId", "")),
                status=_opt_str(update.get("status")),
                raw=update,
            )
        elif kind == "plan":
            entries = update.get("entries")
            event = ev.Plan(
                turn_id=turn,
                entries=[e for e in entries if isinstance(e, dict)]
                if isinstance(entries, list)
                else [],
            )
        elif isinstance(kind, str) and kind in _INFO_UPDATES:
            mode = update.get("currentModeId")
            if kind == "current_mode_update" and self._modes is not None and isinstance(mode, str):
                self._modes = {**self._modes, "currentModeId": mode}  # the agent switched
            event = ev.SessionInfo(info_kind=kind, data=update)
        else:
            event = ev.AgentUnparsed(raw=raw)
        return event

    def _on_request(self, request: IncomingRequest) -> Step:
        if request.method == "session/request_permission":
            params = request.params if isinstance(request.params, dict) else {}
            options = _permission_options(params.get("options"))
            tool_call = params.get("toolCall")
            requested = self._desk.hold(
                self._desk.unique_id(str(request.id)),
                self._turn_id,
                options,
                tool_call if isinstance(tool_call, dict) else {},
                request.id,
            )
            return Step(events=[requested])
        reply = self._rpc.respond_error(
            request.id, METHOD_NOT_FOUND, f"Method not found: {request.method}"
        )
        return Step(send=[reply])

    def _answer_permission(self, held: Held[RequestId], option_id: str | None, *, by: str) -> Step:
        if option_id is None:
            outcome: dict[str, Any] = {"outcome": "cancelled"}
        else:
            outcome = {"outcome": "selected", "optionId": option_id}
        reply = self._rpc.respond(held.ticket, {"outcome": outcome})
        return Step(send=[reply], events=[PermissionDesk.resolved(held, option_id, by=by)])


def _agent_name(info: dict[str, Any]) -> str:
    name = info.get("name")
    return f"ACP agent {name!r}" if isinstance(name, str) and name else "the ACP agent"


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _content_text(content: Any) -> str:
    """The text of a ContentBlock; other blocks become a short placeholder like ``[image]``."""
    if isinstance(content, dict):
        text = content.get("text")
        if text.__class__ is str and content.get("type") == "text":
            return text
        if content.get("type") == "text" and isinstance(content.get("text"), str):
            return str(content["text"])
        return f"[{content.get('type', 'content')}]"
    return ""


def _permission_options(raw: Any) -> list[ev.PermissionOption]:
    options = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and isinstance(item.get("optionId"), str):
            options.append(
                ev.PermissionOption(
                    option_id=item["optionId"],
                    name=str(item.get("name", item["optionId"])),
                    option_kind=str(item.get("kind", "")),
                )
            )
    return options


def _mode_state(modes: Any) -> dict[str, Any] | None:
    """A ``SessionModeState`` we can offer on: a current mode id and the modes, each with an
    id and a name; anything else is no modes."""
    if not isinstance(modes, dict) or not isinstance(modes.get("currentModeId"), str):
        return None
    available = modes.get("availableModes")
    if not isinstance(available, list) or not available:
        return None
    kept = [
        {k: m[k] for k in ("id", "name", "description") if isinstance(m.get(k), str)}
        for m in available
        if isinstance(m, dict) and isinstance(m.get("id"), str) and isinstance(m.get("name"), str)
    ]
    if not kept:
        return None
    return {"currentModeId": modes["currentModeId"], "availableModes": kept}
