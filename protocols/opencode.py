"""OpenCode server (``opencode serve``), client side, as a sans-IO machine.

The agent is a local HTTP server, so the messages are envelopes the HTTP link turns into real
requests (``supervisor/agents/http_link.py``):

- we send ``{"http": {"id": N, "method": "POST", "path": "/session", "json": {...}}}``;
- we receive ``{"http_response": {"id": N, "status": 204, "json": ...}}`` (status 0 and an
  ``error`` text when the request never got an answer), ``{"sse": {...}}`` for every event of
  ``GET /event``, and ``{"transport": "ready", "url": ...}`` once the server listens and the
  event stream is open: nothing is sent before that, so no event can be missed (edge case 24).

Facts this follows (``shared/protocols.md`` section 4 and edge cases 24-29), each checked
against the real ``opencode serve`` 1.18.33 driven by a fake model (shapes in
``tests/golden/opencode``):

- ``POST /session`` creates a session; ``GET /session/{id}`` is 200 for a stored one and 404
  (``NotFoundError``) otherwise: that is how a respawned server resumes.
- A turn is ``POST /session/{id}/prompt_async`` (204 at once; never the blocking ``/message``).
  It ends only on the event stream: ``session.status {type: "idle"}`` and ``session.idle``,
  which come in pairs and, after an abort, twice (a second pair <1-20 ms later). An abort of an
  idle session also answers ``true`` and emits an idle pair. So an idle ends the turn only once
  the turn was seen ``busy``. Nothing but ``busy`` marks a turn active: part and message updates
  of an aborted turn keep arriving after its first idle.
- A failed turn is never ``completed``. Errors the loop handles (the model's) come before the
  idle, as ``session.error`` and on the assistant message. A prompt that fails outside them comes
  as ``busy``, the idle pair, and only then ``session.error`` ``UnknownError``: ``prompt_async``
  publishes the failure once the loop is idle (read from the binary; seen after an abort that
  landed before the first model request, which leaves the server's model lookup interrupted, so
  every later prompt fails). An idle of the new turn can also be a leftover of an earlier abort
  that overtook its ``busy`` (edge cases 24 and 28). So an idle ends the turn at once only when
  the stream already says how it ended (``MessageAbortedError``, another error, a reject, a
  natural ``finish``; our abort alone is not enough, a prompt that fails as it starts looks the
  same); otherwise (no reply yet, a reply still open, a ``tool-calls`` finish) the machine asks
  ``GET /session/status`` (``{}`` when idle, ``{id: {type: "busy"}}``). Busy (or ``retry``):
  the idle was a leftover, the turn runs on (asked again if another idle came meanwhile). Idle:
  the loop is over, and by the answer the error published after the idle has come; the turn ends
  failed with it, or failed "without a reply" when it said nothing at all. Without an answer the
  stream decides alone: an open message with neither an error nor our abort is a leftover.
- ``POST /session/{id}/abort`` answers ``200 true`` whatever happened; the answer is never taken
  as the turn's end. The abort shows on the stream as ``session.error`` with
  ``MessageAbortedError`` before the idle, or, when the abort lands before the model answered,
  only as the assistant message's ``error`` (``message.updated``): either marks the turn
  interrupted. An abort sent before the turn runs is a no-op and the prompt then runs to its
  end, so a cancel before ``busy`` is held and sent when ``busy`` comes. The abort is per
  session, not per turn: one still in flight when the stream ends the turn (a ``reject`` can end
  it first) would stop the next turn, so the turn is over only once its abort is answered too.
- Streamed content: ``message.part.updated`` announces a part (``text``, ``reasoning``,
  ``tool``, ``step-start`` ...) and ``message.part.delta`` extends it (``field: "text"``, no part
  type: we remember it). The user's own prompt comes back as a part of a ``user`` message and is
  not repeated. A text part's final update repeats the whole text; only what the deltas did not
  already say is emitted.
- ``permission.asked`` ``{id, sessionID, permission, patterns, metadata, always, tool}``; the
  answer is ``POST /permission/{id}/reply {"reply": "once"|"always"|"reject"}`` (404
  ``PermissionNotFoundError`` when it is gone); ``permission.replied {sessionID, requestID,
  reply}`` follows. A ``reject`` ends the turn (``finish: "tool-calls"``, no error). A request
  left pending when the turn dies gets no ``permission.replied`` (edge case 27): we resolve it
  ourselves. On a cancel the abort and the ``reject`` go out together and either may land
  first (both seen on the real server, ``tests/real/test_real_opencode_serve.py``): the reject first
  ends the turn ``permission_rejected``; the abort first ends it ``aborted`` and the reject is
  still answered ``200`` (its ``permission.replied`` after the idle). Had the abort already
  dropped the request, the reject would get 404: no error, as withdrawing it was the point.
- Events carry ``sessionID``; those of other sessions are ignored, except permission requests of
  the sub-agent sessions our session started (``session.created`` with our ``parentID``), which
  would otherwise hold our turn forever.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final
from urllib.parse import quote

from attrs import define, field, frozen

from protocols import events as ev
from protocols.content import Part, data_url
from protocols.machine import (
    AgentProtocol,
    InterruptAnswered,
    RestartWanted,
    SessionEstablished,
    StartFailed,
    Step,
    TurnFinished,
)
from protocols.mcp import McpServer, McpUnsupported
from protocols.permissions import DeskPermissions, Held, PermissionDesk
from protocols.tools import ToolVocabulary

__all__ = [
    "CONFIG_CONTENT_VAR",
    "SERVER_USERNAME",
    "OpenCodeClient",
    "opencode_config_content",
    "opencode_mcp_config",
]

#: ``opencode serve`` 1.18.33 asks every request for HTTP basic auth once
#: ``OPENCODE_SERVER_PASSWORD`` is set (401 ``WWW-Authenticate: Basic realm="Secure Area"``
#: otherwise); the user name is ``OPENCODE_SERVER_USERNAME``, ``opencode`` by default. Read from
#: the binary's ``ServerAuth`` module: the same check guards ``GET /event``.
SERVER_USERNAME = "opencode"

#: The permission answers; they are also the option ids offered to a person.
_OPTIONS = {
    "once": ev.PermissionOption(option_id="once", name="Allow once", option_kind="allow_once"),
    "always": ev.PermissionOption(
        option_id="always", name="Always allow", option_kind="allow_always"
    ),
    "reject": ev.PermissionOption(option_id="reject", name="Reject", option_kind="reject_once"),
}
#: What a cancelled permission request is answered (``opencode acp`` does the same).
_CANCELLED_REPLY = "reject"
#: ``error.name`` of the error an abort produces.
_ABORTED = "MessageAbortedError"
#: ``error.name`` of a prompt that failed outside the loop: after an early abort, every one.
_POISONED_ERROR = "UnknownError"
#: A turn whose last assistant message finished with one of these ended by itself. After
#: ``tool-calls`` the loop would have gone on: it was stopped (a rejected permission).
_NATURAL_FINISHES = frozenset({"stop", "length", "content-filter", "other"})
#: Session events passed to subscribers as ``session.info``.
_INFO_EVENTS = frozenset(
    {
        "session.created",
        "session.updated",
        "session.deleted",
        "session.diff",
        "session.compacted",
        "command.executed",
    }
)
#: Session events with nothing for subscribers.
_QUIET_EVENTS = frozenset({"message.removed", "message.part.removed"})
#: Part types that only structure a message.
_QUIET_PARTS = frozenset({"step-start", "snapshot"})
#: Part types passed on as ``session.info`` (``part/<type>``).
_INFO_PARTS = frozenset({"step-finish", "patch", "file", "agent", "subtask", "retry", "compaction"})
#: OpenCode tools (and permission kinds) as ACP tool kinds.
_TOOL_KINDS = {
    "bash": "execute",
    "edit": "edit",
    "write": "edit",
    "patch": "edit",
    "multiedit": "edit",
    "apply_patch": "edit",
    "read": "read",
    "list": "search",
    "glob": "search",
    "grep": "search",
    "codesearch": "search",
    "websearch": "fetch",
    "webfetch": "fetch",
    "task": "think",
    "todowrite": "think",
    "todoread": "think",
    "external_directory": "other",
}
#: Tool part states in the universal (ACP) vocabulary.
_STATUSES = {
    "pending": "pending",
    "running": "in_progress",
    "completed": "completed",
    "error": "failed",
}
_TOOLS = ToolVocabulary(kinds=_TOOL_KINDS, statuses=_STATUSES)
#: Parts, messages and tool calls remembered, to tell a late update from a new one. Late
#: updates of an aborted turn come within milliseconds; thousands is plenty and bounded.
_KEPT = 4096


@frozen
class _Sent:
    """What one of our requests was about; handed back with its response."""

    purpose: str  # get_session, create_session, prompt, abort, reply, status
    turn_id: str | None = None
    request_id: str | None = None
    #: who answered the permission request (``client`` or ``supervisor``), for a reply
    by: str | None = None


@define
class _Turn:
    """Our running turn and what the event stream has told us about it."""

    turn_id: str
    #: ``session.status busy`` seen since the prompt went out: the next idle ends the turn
    active: bool = False
    cancel_wanted: bool = False
    abort_sent: bool = False
    #: ``MessageAbortedError`` seen for this turn
    aborted: bool = False
    error: str | None = None
    #: ``finish`` of the turn's latest assistant message
    finish: str | None = None
    #: an assistant message of this turn, or a permission request of it, was seen
    replied: bool = False
    #: the turn's latest assistant message is still being written
    open_message: bool = False
    #: an idle came that the stream alone could not judge: ``GET /session/status`` is asked
    checking: bool = False
    #: another idle came while that question was out (the real end may be among them)
    idle_while_checking: bool = False
    #: an error came while that question was out: a "busy" may be older than it (see
    #: ``_on_checked``)
    error_while_checking: bool = False
    #: one of its permission requests was answered ``reject``
    rejected: bool = False
    #: our abort got its HTTP answer (or failed): it can no longer land on a later turn
    abort_answered: bool = False


@frozen
class _Message:
    role: str | None
    turn_id: str | None


@define
class _Part:
    kind: str
    turn_id: str | None
    emitted: int = 0  # characters of text already passed on


def _remember(table: dict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    while len(table) > _KEPT:
        del table[next(iter(table))]


@define
class OpenCodeClient(DeskPermissions[None], AgentProtocol):
    """Our side of one ``opencode serve`` process, driving one session."""

    name: ClassVar[str] = "opencode"
    prompt_carries: ClassVar[frozenset[str]] = frozenset({"image"})
    transport: ClassVar[str] = "http"

    _next_id: int = 0
    _requests: dict[int, _Sent] = field(factory=dict)
    _phase: str = "idle"  # idle, connecting, opening, ready, failed
    _resume: str | None = None
    _resume_error: str | None = None
    _session_id: str | None = None
    _children: set[str] = field(factory=set)
    _turn: _Turn | None = None
    #: a turn that is over on the stream, held until its abort is answered
    _held_end: tuple[_Turn, TurnFinished] | None = None
    #: the last turn ended on our abort before it said anything (see ``_poisoned``)
    _aborted_early: bool = False
    #: pending ``permission.asked`` requests (answered by id: no ticket needed)
    _desk: PermissionDesk[None] = field(factory=PermissionDesk)
    _messages: dict[str, _Message] = field(factory=dict)
    _parts: dict[str, _Part] = field(factory=dict)
    _tools: dict[str, str | None] = field(factory=dict)  # callID -> last status
    server_info: dict[str, Any] = field(factory=dict)

    @classmethod
    def command(
        cls, base: Sequence[str], resume: str | None, *, mcp_servers: Sequence[McpServer] = ()
    ) -> list[str]:
        """``opencode serve`` on a free port of the loopback interface, unless configured."""
        argv = list(base)
        if not any(arg == "--port" or arg.startswith("--port=") for arg in argv):
            argv += ["--port", "0"]
        if not any(arg == "--hostname" or arg.startswith("--hostname=") for arg in argv):
            argv += ["--hostname", "127.0.0.1"]
        return argv

    @classmethod
    def environment(
        cls,
        secret: str,
        *,
        mcp_servers: Sequence[McpServer] = (),
        configured: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """A server password of its own for every process: without one the server answers any
        local process (it warns "server is unsecured"). The link sends it as basic auth.

        MCP servers go in ``OPENCODE_CONFIG_CONTENT`` (a config document OpenCode merges over
        its global and project ones), merged into one the agent's ``env`` already sets."""
        env = {"OPENCODE_SERVER_USERNAME": SERVER_USERNAME, "OPENCODE_SERVER_PASSWORD": secret}
        if mcp_servers:
            existing = (configured or {}).get(CONFIG_CONTENT_VAR)
            env[CONFIG_CONTENT_VAR] = opencode_config_content(mcp_servers, existing)
        return env

    # -- calls from the actor -------------------------------------------------------------

    def start(
        self, *, cwd: str, resume: str | None = None, mcp_servers: Sequence[McpServer] = ()
    ) -> Step:
        if self._phase != "idle":
            raise RuntimeError("start() called twice")
        # The server's directory is its working directory, where the process was started.
        self._phase = "connecting"
        self._resume = resume
        return Step()  # nothing until the event stream is open

    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        if self._phase != "ready" or self._turn is not None:
            turn = self._turn.turn_id if self._turn else None
            raise RuntimeError(f"prompt() while {self._phase} with turn {turn}")
        assert self._session_id is not None
        self._turn = _Turn(turn_id)
        body = {"parts": _parts(text, parts)}
        sent = _Sent("prompt", turn_id)
        return Step(send=[self._request("POST", self._path("prompt_async"), sent, body)])

    def cancel(self) -> Step:
        turn = self._turn
        if turn is None or turn.cancel_wanted:
            return Step()
        turn.cancel_wanted = True
        if not turn.active:
            return Step()  # an abort before the loop runs is a no-op: sent at "busy"
        return self._abort(turn)

    @property
    def agent_session_id(self) -> str | None:
        if self._session_id is not None:
            return self._session_id
        # Killed while still resuming: the next process should try the same session again.
        return self._resume if self._resume_error is None else None

    # -- requests ---------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, sent: _Sent, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        request_id = self._next_id
        self._next_id += 1
        self._requests[request_id] = sent
        request: dict[str, Any] = {"id": request_id, "method": method, "path": path}
        if body is not None:
            request["json"] = body
        return {"http": request}

    def _path(self, *rest: str, session_id: str | None = None) -> str:
        session = session_id if session_id is not None else self._session_id
        assert session is not None
        return "/".join(["/session", quote(session, safe=""), *rest])

    def _abort(self, turn: _Turn) -> Step:
        turn.abort_sent = True
        sent = _Sent("abort", turn.turn_id)
        return Step(send=[self._request("POST", self._path("abort"), sent)])

    def _answer_permission(self, held: Held[None], option_id: str | None, *, by: str) -> Step:
        request_id = held.request_id
        reply = option_id or _CANCELLED_REPLY
        turn = self._turn
        if reply == "reject" and turn is not None and held.turn_id == turn.turn_id:
            turn.rejected = True
        message = self._request(
            "POST",
            f"/permission/{quote(request_id, safe='')}/reply",
            _Sent("reply", held.turn_id, request_id, by),
            {"reply": reply},
        )
        resolved = ev.PermissionResolved(
            turn_id=held.turn_id,
            request_id=request_id,
            outcome="cancelled" if option_id is None else "selected",
            option_id=option_id,
            by=by,
        )
        return Step(send=[message], events=[resolved])

    # -- messages from the link -------------------------------------------------------------

    def receive(self, message: dict[str, Any]) -> Step:
        if isinstance(message.get("sse"), dict):
            return self._on_event(message["sse"])
        if isinstance(message.get("http_response"), dict):
            return self._on_response(message["http_response"])
        if message.get("transport") == "ready":
            return self._on_ready(message)
        return Step(events=[ev.AgentUnparsed(raw=message)])

    def _on_ready(self, message: dict[str, Any]) -> Step:
        if self._phase != "connecting":
            return Step()
        self._phase = "opening"
        url = message.get("url")
        if isinstance(url, str):
            self.server_info["url"] = url
        if self._resume is not None:
            sent = _Sent("get_session")
            return Step(send=[self._request("GET", self._path(session_id=self._resume), sent)])
        return self._create_session()

    def _create_session(self) -> Step:
        return Step(send=[self._request("POST", "/session", _Sent("create_session"), {})])

    def _on_response(self, response: dict[str, Any]) -> Step:
        request_id = response.get("id")
        sent = self._requests.pop(request_id, None) if isinstance(request_id, int) else None
        if sent is None:
            return Step(
                events=[
                    ev.ErrorEvent(
                        code="protocol_error",
                        message=f"response to unknown request id {request_id!r}",
                    )
                ]
            )
        status = response.get("status")
        ok = isinstance(status, int) and 200 <= status < 300
        body = response.get("json")
        if sent.purpose == "get_session":
            return self._on_session_found(body if ok else None, response)
        if sent.purpose == "create_session":
            return self._on_session_created(body if ok else None, response)
        if sent.purpose == "prompt":
            turn = self._turn
            if ok or turn is None or turn.turn_id != sent.turn_id:
                return Step()
            error = f"prompt_async failed: {_describe_response(response)}"
            if turn.active:  # it runs after all (a lost answer): the stream decides
                return Step(events=[ev.ErrorEvent(code="agent_error", message=error)])
            return self._finish(turn, TurnFinished(turn.turn_id, "error", error=error))
        if sent.purpose == "status":
            return self._on_checked(sent.turn_id, body if ok else None)
        if sent.purpose == "abort":
            step = self._abort_answered(sent.turn_id)
            if ok:
                # "true" proves nothing of the turn (edge case 24): the stream decides. It
                # does say the server has the abort: its delivery, first.
                if sent.turn_id is not None:
                    step.events.insert(0, InterruptAnswered(sent.turn_id))
                return step
            step.events.insert(
                0,
                ev.ErrorEvent(
                    code="interrupt_failed",
                    message=f"abort failed: {_describe_response(response)}",
                ),
            )
            return step
        # A permission reply. 404: it was resolved already (the turn died, or someone else
        # answered); we have resolved it on our side, so only say that the reply was lost.
        if ok:
            return Step()
        if status == 404 and sent.by == "supervisor":
            # Our own withdrawal (a cancel) racing the abort, which had dropped the request
            # already: gone is what the reply wanted, nothing was lost.
            return Step()
        code = "permission_not_found" if status == 404 else "permission_reply_failed"
        return Step(
            events=[
                ev.ErrorEvent(
                    code=code,
                    message=f"reply to permission request {sent.request_id}"
                    f" failed: {_describe_response(response)}",
                )
            ]
        )

    # -- handshake ------------------------------------------------------------------------

    def _on_session_found(self, body: Any, response: dict[str, Any]) -> Step:
        assert self._resume is not None
        if isinstance(body, dict):
            session_id = body.get("id")
            self._session_id = session_id if isinstance(session_id, str) else self._resume
            return self._established(resumed=True)
        # The session is gone (404 NotFoundError): a fresh one, and the receipt will say so.
        self._resume_error = f"session {self._resume} not resumed: {_describe_response(response)}"
        return self._create_session()

    def _on_session_created(self, body: Any, response: dict[str, Any]) -> Step:
        session_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(session_id, str):
            self._phase = "failed"
            if isinstance(body, dict):
                reason = "POST /session answered without a session id"
            else:
                reason = f"POST /session failed: {_describe_response(response)}"
            return Step(events=[StartFailed(reason)])
        self._session_id = session_id
        if self._resume is None:
            return self._established(resumed=None)
        return self._established(resumed=False, detail=self._resume_error)

    def _established(self, *, resumed: bool | None, detail: str | None = None) -> Step:
        self._phase = "ready"
        assert self._session_id is not None
        return Step(events=[SessionEstablished(self._session_id, resumed, detail)])

    # -- the event stream -----------------------------------------------------------------

    def _on_event(self, event: dict[str, Any]) -> Step:
        kind = event.get("type")
        props = event.get("properties")
        if not isinstance(kind, str) or not isinstance(props, dict):
            return Step(events=[ev.AgentUnparsed(raw=event)])
        if self._phase != "ready":
            return Step()  # before our session exists nothing is about it
        session = _session_of(props)
        if kind in ("session.created", "session.updated"):
            self._note_child(props)
        if session != self._session_id:
            if session in self._children and kind == "permission.asked":
                return self._on_permission_asked(props, event)
            if session in self._children and kind == "permission.replied":
                return self._on_permission_replied(props)
            return Step()  # global events and other sessions
        if kind == "session.status":
            return self._on_status(props, event)
        if kind == "session.idle":
            return self._on_idle()
        if kind == "session.error":
            return self._on_session_error(props)
        if kind == "message.updated":
            return self._on_message(props, event)
        if kind == "message.part.updated":
            return self._on_part(props, event)
        if kind == "message.part.delta":
            return self._on_delta(props, event)
        if kind == "permission.asked":
            return self._on_permission_asked(props, event)
        if kind == "permission.replied":
            return self._on_permission_replied(props)
        if kind == "todo.updated":
            return Step(events=[ev.Plan(turn_id=self._turn_id, entries=_plan(props.get("todos")))])
        if kind in _INFO_EVENTS:
            return Step(events=[ev.SessionInfo(info_kind=kind, data=props)])
        if kind in _QUIET_EVENTS:
            return Step()
        return Step(events=[ev.AgentUnparsed(raw=event)])

    @property
    def _turn_id(self) -> str | None:
        return self._turn.turn_id if self._turn is not None else None

    def _note_child(self, props: dict[str, Any]) -> None:
        info = props.get("info")
        if not isinstance(info, dict):
            return
        child, parent = info.get("id"), info.get("parentID")
        if isinstance(child, str) and (parent == self._session_id or parent in self._children):
            self._children.add(child)

    def _on_status(self, props: dict[str, Any], event: dict[str, Any]) -> Step:
        status = props.get("status")
        kind = status.get("type") if isinstance(status, dict) else None
        if kind == "idle":
            return self._on_idle()
        if kind not in ("busy", "retry"):
            return Step(events=[ev.AgentUnparsed(raw=event)])
        assert isinstance(status, dict)
        step = Step()
        turn = self._turn
        if turn is not None and not turn.active:
            turn.active = True
            if turn.cancel_wanted and not turn.abort_sent:
                step.extend(self._abort(turn))
        if kind == "retry":
            message = status.get("message")
            text = message if isinstance(message, str) else "retrying"
            attempt = status.get("attempt")
            if isinstance(attempt, int):
                text += f" (attempt {attempt})"
            step.events.append(ev.ErrorEvent(code="agent_retrying", message=text))
        return step

    def _on_idle(self) -> Step:
        turn = self._turn
        if turn is None or not turn.active:
            return Step()  # the second of a pair, a duplicate, or a leftover (edge case 28)
        if turn.checking:
            turn.idle_while_checking = True
            return Step()
        if _judged(turn):
            return self._finish(turn, _verdict(turn))
        # No word on how it ended: a failed prompt's error comes after the idle, and a leftover
        # idle of an earlier abort looks the same. The server knows whether the loop still runs;
        # by its answer the error that followed the idle has come too.
        return self._ask_status(turn)

    def _ask_status(self, turn: _Turn) -> Step:
        turn.checking, turn.idle_while_checking, turn.error_while_checking = True, False, False
        sent = _Sent("status", turn.turn_id)
        return Step(send=[self._request("GET", "/session/status", sent)])

    def _on_checked(self, turn_id: str | None, body: Any) -> Step:
        turn = self._turn
        if turn is None or turn.turn_id != turn_id or not turn.checking:
            return Step()
        turn.checking = False
        if isinstance(body, dict):
            status = body.get(self._session_id)
            if not (isinstance(status, dict) and status.get("type") in ("busy", "retry")):
                return self._finish(turn, _verdict(turn))  # idle: the turn is over
            if turn.idle_while_checking:
                # The real end may have come after the server answered: ask once more.
                return self._on_idle()
            if turn.error_while_checking:
                # The answer comes on its own connection, the error on the event stream: a
                # "busy" made before a failed prompt's error was published (after its idle)
                # can arrive after it. Whether the loop still runs, only a new answer says.
                return self._ask_status(turn)
            return Step()  # a leftover idle: the turn runs on
        # No answer: judge by the stream alone. An open message with neither an error nor our
        # abort means the loop still runs (it completes its message before it goes idle).
        if turn.open_message and not (turn.abort_sent or turn.aborted or turn.error):
            return Step()
        return self._finish(turn, _verdict(turn))

    def _finish(self, turn: _Turn, finished: TurnFinished) -> Step:
        step = self._orphans(turn.turn_id)
        self._turn = None
        step.events.extend(self._poisoned(turn, finished))
        if turn.abort_sent and not turn.abort_answered:
            # The abort is per session, not per turn: still in flight, it would stop the next
            # turn (a reject can end this one first). The turn is over once it is answered.
            self._held_end = (turn, finished)
            return step
        step.events.append(finished)
        return step

    def _poisoned(self, turn: _Turn, finished: TurnFinished) -> list[RestartWanted]:
        """An abort that landed before the loop said anything (the turn ended ``idle``, with no
        reply) may have interrupted the server's model lookup for good: every later prompt then
        fails with ``UnknownError``. The first such failure asks for a restart at once."""
        if turn.abort_sent and not turn.replied and not turn.aborted and finished.error is None:
            self._aborted_early = True
            return []
        early, self._aborted_early = self._aborted_early, False
        if early and (finished.error or "").startswith(_POISONED_ERROR):
            return [
                RestartWanted(
                    f"opencode serve failed a prompt ({finished.error}) after an abort that"
                    " landed before its first model request: only a restart clears that"
                )
            ]
        return []

    def _abort_answered(self, turn_id: str | None) -> Step:
        held = self._held_end
        if held is not None and held[0].turn_id == turn_id:
            self._held_end = None
            return Step(events=[held[1]])
        if self._turn is not None and self._turn.turn_id == turn_id:
            self._turn.abort_answered = True
        return Step()

    def _orphans(self, turn_id: str) -> Step:
        """Requests of a turn that is over get no ``permission.replied`` (edge case 27)."""
        orphans = self._desk.take_where(lambda held: held.turn_id == turn_id)
        return Step(events=[PermissionDesk.resolved(held, None, by="agent") for held in orphans])

    def _on_session_error(self, props: dict[str, Any]) -> Step:
        error = props.get("error")
        name = error.get("name") if isinstance(error, dict) else None
        turn = self._turn
        if turn is not None and turn.active:
            # The loop publishes its error before it goes idle: the idle ends the turn.
            turn.error_while_checking = turn.checking
            if name == _ABORTED:
                turn.aborted = True
            elif turn.error is None:
                turn.error = _describe_error(error)
            return self._orphans(turn.turn_id)
        if name == _ABORTED:
            return Step()  # an abort that landed after the turn's own end
        description = _describe_error(error)
        if turn is None:
            return Step(events=[ev.ErrorEvent(code="agent_error", message=description)])
        # The prompt failed before its loop ran: no busy, and no idle will come.
        return self._finish(turn, TurnFinished(turn.turn_id, "error", error=description))

    def _message(self, message_id: str, role: Any) -> _Message:
        """The message, registered with the running turn the first time it is seen."""
        known = self._messages.get(message_id)
        if known is None or (known.role is None and isinstance(role, str)):
            turn_id = known.turn_id if known is not None else self._turn_id
            known = _Message(role if isinstance(role, str) else None, turn_id)
            _remember(self._messages, message_id, known)
        return known

    def _on_message(self, props: dict[str, Any], event: dict[str, Any]) -> Step:
        info = props.get("info")
        if not isinstance(info, dict) or not isinstance(info.get("id"), str):
            return Step(events=[ev.AgentUnparsed(raw=event)])
        message = self._message(info["id"], info.get("role"))
        if message.role != "assistant":
            return Step()
        times = info.get("time")
        completed = isinstance(times, dict) and times.get("completed") is not None
        turn = self._turn
        if turn is not None and message.turn_id == turn.turn_id:
            # Late updates of an earlier turn's messages say nothing about this one.
            turn.replied = True
            turn.open_message = not completed
            if isinstance(info.get("finish"), str):
                turn.finish = info["finish"]
            error = info.get("error")
            if isinstance(error, dict):
                if error.get("name") == _ABORTED:
                    turn.aborted = True
                elif turn.error is None:
                    turn.error = _describe_error(error)
        if not completed:
            return Step()
        return Step(events=[ev.SessionInfo(info_kind="message.updated", data=info)])

    def _on_part(self, props: dict[str, Any], event: dict[str, Any]) -> Step:
        part = props.get("part")
        if (
            not isinstance(part, dict)
            or not isinstance(part.get("id"), str)
            or not isinstance(part.get("type"), str)
            or not isinstance(part.get("messageID"), str)
        ):
            return Step(events=[ev.AgentUnparsed(raw=event)])
        message = self._message(part["messageID"], None)
        if message.role == "user":
            return Step()  # the prompt itself: subscribers have it from turn.started
        kind: str = part["type"]
        turn_id = message.turn_id
        if kind in ("text", "reasoning"):
            return self._on_text_part(part, kind, turn_id)
        if kind == "tool":
            return self._on_tool_part(part, turn_id)
        if kind in _QUIET_PARTS:
            return Step()
        if kind in _INFO_PARTS:
            return Step(events=[ev.SessionInfo(info_kind=f"part/{kind}", data=part)])
        return Step(events=[ev.AgentUnparsed(raw=event)])

    def _on_text_part(self, part: dict[str, Any], kind: str, turn_id: str | None) -> Step:
        known = self._parts.get(part["id"])
        if known is None:
            known = _Part(kind, turn_id)
            _remember(self._parts, part["id"], known)
        text = part.get("text")
        if part.get("synthetic") or part.get("ignored") or not isinstance(text, str):
            return Step()
        if len(text) <= known.emitted:
            return Step()  # the final update repeats what the deltas said
        rest = text[known.emitted :]
        known.emitted = len(text)
        return Step(events=[_text_event(kind, known.turn_id, rest)])

    def _on_tool_part(self, part: dict[str, Any], turn_id: str | None) -> Step:
        call_id = part.get("callID")
        if not isinstance(call_id, str):
            call_id = part["id"]
        state = part.get("state")
        if not isinstance(state, dict):
            state = {}
        status = _status(state.get("status"))
        if call_id in self._tools:
            self._tools[call_id] = status
            update = ev.ToolUpdate(turn_id=turn_id, tool_call_id=call_id, status=status, raw=part)
            return Step(events=[update])
        _remember(self._tools, call_id, status)
        tool = part.get("tool") if isinstance(part.get("tool"), str) else "tool"
        return Step(
            events=[
                ev.ToolCall(
                    turn_id=turn_id,
                    tool_call_id=call_id,
                    title=_tool_title(str(tool), state),
                    tool_kind=_TOOLS.kind(str(tool)),
                    status=status,
                    raw=part,
                )
            ]
        )

    def _on_delta(self, props: dict[str, Any], event: dict[str, Any]) -> Step:
        part_id, message_id = props.get("partID"), props.get("messageID")
        delta = props.get("delta")
        if not (
            isinstance(part_id, str) and isinstance(message_id, str) and isinstance(delta, str)
        ):
            return Step(events=[ev.AgentUnparsed(raw=event)])
        message = self._message(message_id, None)
        if message.role == "user" or props.get("field", "text") != "text":
            return Step()
        known = self._parts.get(part_id)
        if known is None:  # a delta before its part: text is all it can be
            known = _Part("text", message.turn_id)
            _remember(self._parts, part_id, known)
        if known.kind not in ("text", "reasoning"):
            return Step()
        known.emitted += len(delta)
        return Step(events=[_text_event(known.kind, known.turn_id, delta)])

    # -- permissions ----------------------------------------------------------------------

    def _on_permission_asked(self, props: dict[str, Any], event: dict[str, Any]) -> Step:
        request_id = props.get("id")
        if not isinstance(request_id, str):
            return Step(events=[ev.AgentUnparsed(raw=event)])
        if request_id in self._desk:
            return Step()
        turn_id = self._turn_id
        if self._turn is not None:
            self._turn.replied = True  # a tool call of the turn's reply
        tool = props.get("tool")
        call_id = tool.get("callID") if isinstance(tool, dict) else None
        permission = props.get("permission")
        permission = permission if isinstance(permission, str) else "permission"
        tool_call: dict[str, Any] = {
            "toolCallId": call_id if isinstance(call_id, str) else None,
            "title": _permission_title(permission, props),
            "kind": _TOOLS.kind(permission),
            **{
                key: props[key]
                for key in ("permission", "patterns", "always", "metadata", "sessionID")
                if key in props
            },
        }
        requested = self._desk.hold(request_id, turn_id, list(_OPTIONS.values()), tool_call, None)
        return Step(events=[requested])

    def _on_permission_replied(self, props: dict[str, Any]) -> Step:
        request_id = props.get("requestID", props.get("permissionID"))
        reply = props.get("reply", props.get("response"))
        if not isinstance(request_id, str) or request_id not in self._desk:
            return Step()  # our own answer coming back, or one we resolved already
        held = self._desk.take(request_id)
        turn = self._turn
        if reply == "reject" and turn is not None and held.turn_id == turn.turn_id:
            turn.rejected = True
        option_id = reply if isinstance(reply, str) else None
        return Step(events=[PermissionDesk.resolved(held, option_id, by="agent")])


def _judged(turn: _Turn) -> bool:
    """Whether the stream alone says how the turn ended, at its idle: no error can follow. Our
    abort alone is not enough: a prompt that fails as it starts says so after the idle."""
    if turn.aborted or turn.error is not None:
        return True
    return not turn.open_message and (turn.rejected or turn.finish in _NATURAL_FINISHES)


def _verdict(turn: _Turn) -> TurnFinished:
    """How the turn ended, from all the stream said about it, once it is over."""
    if turn.aborted:
        return TurnFinished(turn.turn_id, "aborted", True)
    if turn.error is not None:
        return TurnFinished(turn.turn_id, "error", error=turn.error)
    if turn.rejected and turn.finish not in _NATURAL_FINISHES:
        return TurnFinished(turn.turn_id, "permission_rejected", True)
    if turn.finish in _NATURAL_FINISHES and not turn.open_message:
        return TurnFinished(turn.turn_id, turn.finish, False)
    if turn.abort_sent:
        return TurnFinished(turn.turn_id, turn.finish or "idle")  # stopped, with no word of it
    if not turn.replied:
        return TurnFinished(turn.turn_id, "error", error="the turn ended without a reply")
    if turn.open_message:
        return TurnFinished(turn.turn_id, "error", error="the turn ended with its reply unfinished")
    return TurnFinished(turn.turn_id, turn.finish or "idle")


def _session_of(props: dict[str, Any]) -> str | None:
    """The session an event is about: ``sessionID``, or inside its ``info`` or ``part``."""
    session = props.get("sessionID")
    if isinstance(session, str):
        return session
    for key in ("info", "part"):
        inner = props.get(key)
        if isinstance(inner, dict) and isinstance(inner.get("sessionID"), str):
            return str(inner["sessionID"])
    return None


def _status(value: Any) -> str | None:
    return _TOOLS.status(value)


def _text_event(kind: str, turn_id: str | None, text: str) -> ev.Event:
    if kind == "reasoning":
        return ev.ThoughtDelta(turn_id=turn_id, text=text)
    return ev.MessageDelta(turn_id=turn_id, text=text)


def _describe_error(error: Any) -> str:
    """``{name, data: {message}}`` as one line."""
    if not isinstance(error, dict):
        return error if isinstance(error, str) else "error"
    name = error.get("name") if isinstance(error.get("name"), str) else "error"
    data = error.get("data")
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, str):
        message = error.get("message") if isinstance(error.get("message"), str) else None
    return f"{name}: {message}" if message else str(name)


def _describe_response(response: dict[str, Any]) -> str:
    status = response.get("status")
    if status == 0 or not isinstance(status, int):
        error = response.get("error")
        return error if isinstance(error, str) else "no response"
    body = response.get("json")
    detail = None
    if isinstance(body, dict):
        detail = body.get("message")
        if not isinstance(detail, str):
            detail = _describe_error(body) if "name" in body else None
    return f"HTTP {status}: {detail}" if detail else f"HTTP {status}"


def _tool_title(tool: str, state: dict[str, Any]) -> str:
    title = state.get("title")
    if isinstance(title, str) and title:
        return title
    tool_input = state.get("input")
    if isinstance(tool_input, dict):
        for key in ("command", "description", "filePath", "pattern", "url"):
            value = tool_input.get(key)
            if isinstance(value, str) and value:
                return value
    return tool


def _permission_title(permission: str, props: dict[str, Any]) -> str:
    metadata = props.get("metadata")
    if isinstance(metadata, dict):
        for key in ("command", "filepath", "filePath", "url"):
            value = metadata.get(key)
            if isinstance(value, str) and value:
                return value
    patterns = props.get("patterns")
    if isinstance(patterns, list) and patterns and all(isinstance(p, str) for p in patterns):
        return ", ".join(patterns)
    return permission


def _plan(todos: Any) -> list[dict[str, Any]]:
    """``todo.updated`` ``[{content, status, priority, id}]`` as ACP plan entries."""
    entries = []
    for todo in todos if isinstance(todos, list) else []:
        if isinstance(todo, dict) and isinstance(todo.get("content"), str):
            status = todo.get("status")
            entry: dict[str, Any] = {
                "content": todo["content"],
                "status": status if isinstance(status, str) else "pending",
            }
            if isinstance(todo.get("priority"), str):
                entry["priority"] = todo["priority"]
            entries.append(entry)
    return entries


#: The variable OpenCode reads one more config document from, over the global and project ones.
CONFIG_CONTENT_VAR: Final = "OPENCODE_CONFIG_CONTENT"


def opencode_mcp_config(servers: Sequence[McpServer]) -> dict[str, Any]:
    """The config's ``mcp`` table: ``local`` (``command`` is the argv, ``environment``) or
    ``remote`` (``url``, ``headers``; OpenCode tries streamable HTTP, then SSE)."""
    entries: dict[str, Any] = {}
    for server in servers:
        if server.transport == "stdio":
            assert server.command is not None
            entries[server.name] = {
                "type": "local",
                "command": [server.command, *server.args],
                "environment": server.env_dict,
                "enabled": True,
            }
        else:
            entries[server.name] = {
                "type": "remote",
                "url": server.url,
                "headers": server.headers_dict,
                "enabled": True,
            }
    return entries


def opencode_config_content(servers: Sequence[McpServer], existing: str | None = None) -> str:
    """``OPENCODE_CONFIG_CONTENT`` with the servers in its ``mcp`` table, over ``existing`` (the
    agent's configured value, kept: :class:`McpUnsupported` if it is not a JSON object)."""
    document: dict[str, Any] = {}
    if existing:
        try:
            loaded = json.loads(existing)
        except ValueError:
            loaded = None
        if not isinstance(loaded, dict):
            raise McpUnsupported(
                f"{CONFIG_CONTENT_VAR} in the agent's env is not a JSON object: cannot add"
                " MCP servers to it"
            )
        document = loaded
    mcp = document.get("mcp")
    document["mcp"] = {**(mcp if isinstance(mcp, dict) else {}), **opencode_mcp_config(servers)}
    return json.dumps(document)


def _parts(text: str, parts: Sequence[Part]) -> list[dict[str, Any]]:
    """The prompt's parts in OpenCode's form: text, and an image as a ``file`` part (its
    ``mime`` and a ``data:`` URL); links and text resources as text."""
    if not parts:
        return [{"type": "text", "text": text}]
    out: list[dict[str, Any]] = []
    for part in parts:
        if part.needs == "image":
            file: dict[str, Any] = {"type": "file", "mime": part.mime_type, "url": data_url(part)}
            name = (part.uri or "").rsplit("/", 1)[-1]
            if name:
                file["filename"] = name
            out.append(file)
        else:
            out.append({"type": "text", "text": part.as_text()})
    return out
