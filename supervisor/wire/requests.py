"""The gateway's wire protocol (``design/gateway.md``, "The wire protocol"), without I/O.

A request is one JSON text frame ``{"id", "action", "payload"}``; :func:`decode_request` turns it
into a :class:`Request` carrying its action's *call* (:class:`Prompt`, :class:`Cancel`, ...: one
small frozen class per action, its fields typed; an ACP ``content`` is read as parts and
``mcp_servers`` as :class:`~protocols.mcp.McpServer` objects, here and only here), or a
:class:`RequestError` that already knows the error code and the id to answer (when one could be
read). It never raises: every byte sequence a client can send gets an answer, and the connection
stays usable. The gateway dispatches on the call's type and reads no payload itself; its HTTP
abort route is decoded here too (:func:`decode_abort`), into the same :class:`Cancel`, and its
receipts route's query (:func:`decode_receipts_query`), into the same :class:`ListReceipts`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final
from urllib.parse import parse_qsl

from attrs import field, frozen

from protocols.content import Part, parts_from_acp, parts_text
from protocols.framing import is_text
from protocols.mcp import McpServer, mcp_servers_from_acp
from supervisor.errors import BadRequest, check_text

__all__ = [
    "ACTIONS",
    "HARD_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_PROMPT_FRAME_BYTES",
    "Call",
    "Cancel",
    "Diff",
    "ListAgents",
    "ListReceipts",
    "ListSessions",
    "PauseAll",
    "PauseSession",
    "Prompt",
    "Request",
    "RequestError",
    "RespondPermission",
    "ResumeAll",
    "ResumeSession",
    "Rewind",
    "SearchSessions",
    "SetMode",
    "Input",
    "Resize",
    "StartSession",
    "Steer",
    "StopSession",
    "Subscribe",
    "Unsubscribe",
    "decode_abort",
    "decode_receipts_query",
    "decode_request",
    "error_response",
    "frame_bytes",
    "ok_response",
    "session_of",
]

#: A request is a few hundred bytes; a prompt may paste a file. 1 MiB is generous for both and
#: keeps one connection's memory small. Larger frames get ``too_large`` (up to the transport's
#: hard limit, beyond which the WebSocket is closed with 1009).
MAX_FRAME_BYTES: Final = 1024 * 1024
#: An ``agent.prompt`` with ``content`` (a pasted screenshot is a few MB of base64) may be up to
#: this big; any other request larger than :data:`MAX_FRAME_BYTES` is still ``too_large``.
MAX_PROMPT_FRAME_BYTES: Final = 8 * MAX_FRAME_BYTES
#: The transport's hard frame limit: frames between :data:`MAX_FRAME_BYTES` and this get
#: ``too_large``; beyond it the WebSocket is closed (a front checks what it sends a node
#: against it, ``supervisor/remote/link.py``).
HARD_FRAME_BYTES: Final = 16 * MAX_FRAME_BYTES
#: Longest id we echo back: ids are correlation tokens, not payloads.
MAX_ID_CHARS: Final = 128
#: Hits a ``session.search`` answers when it names no ``limit``: a screenful.
SEARCH_LIMIT: Final = 20
#: Hits a ``session.search`` may ask for at most: each costs the store a read of its event's
#: run (its time) on the store's one thread, which the sessions' writes share.
MAX_SEARCH_LIMIT: Final = 200
#: Longest query: words to find, not a document (the backends look for every word).
MAX_QUERY_CHARS: Final = 1000


@frozen
class _Field:
    name: str
    types: tuple[type, ...]
    required: bool = True


def _str(name: str, required: bool = True) -> _Field:
    return _Field(name, (str,), required)


#: action -> payload fields. Unknown payload keys are ignored (extend compatibly).
ACTIONS: Final[dict[str, tuple[_Field, ...]]] = {
    "agents.list": (),
    "session.start": (
        _str("agent"),
        _str("cwd", required=False),
        _str("host", required=False),  # a [hosts.NAME] the agent may run on
        _Field("spec", (dict,), required=False),  # the agent's definition: nodes only
        # ACP ``McpServer`` objects, on top of the agent's own (``protocols/mcp.py``)
        _Field("mcp_servers", (list,), required=False),
        # nodes only: refuse with ``capacity`` unless fewer sessions than this are live there
        _Field("max_sessions", (int,), required=False),
        # run in a new git worktree of the cwd's repository (``design/worktrees.md``)
        _Field("worktree", (bool,), required=False),
        # nodes only: a front's stored session started again (``supervisor/remote/revival.py``)
        _Field("revive", (dict,), required=False),
    ),
    "session.list": (),
    # the receipts of the last turns stopped in any session (``supervisor/stops.py``)
    "receipts.list": (
        _Field("limit", (int,), required=False),
        _Field("since_seq", (int,), required=False),
    ),
    # words to find across every stored transcript (``supervisor/store/``)
    "session.search": (_str("query"), _Field("limit", (int,), required=False)),
    "session.subscribe": (_str("session_id"), _Field("since_seq", (int,), required=False)),
    "session.unsubscribe": (_str("session_id"),),
    "agent.prompt": (
        _str("session_id"),
        _str("text", required=False),  # what events show of it; from ``content`` if absent
        # the prompt's content when it is more than text: ACP ``ContentBlock`` objects (text,
        # image, audio, resource_link, resource), in order (``protocols/content.py``)
        _Field("content", (list,), required=False),
    ),
    "agent.set_mode": (_str("session_id"), _str("mode_id")),
    # a terminal agent's (``protocol = "terminal"``): keys as typed, and its size
    "session.input": (_str("session_id"), _str("data")),
    "session.resize": (
        _str("session_id"),
        _Field("cols", (int,)),
        _Field("rows", (int,)),
    ),
    "agent.steer": (_str("session_id"), _str("text")),
    "agent.cancel": (
        _str("session_id"),
        _str("task_id", required=False),
        _str("reason", required=False),
        _Field("rewind", (bool,), required=False),
    ),
    "permission.respond": (
        _str("session_id"),
        _str("request_id"),
        _str("option_id", required=False),
        _Field("cancelled", (bool,), required=False),
    ),
    "session.stop": (_str("session_id"),),
    # the working directory back as it was when a turn started (``design/checkpoints.md``)
    "session.rewind": (
        _str("session_id"),
        _str("turn_id"),
        # also when it undoes what other sessions in the directory changed (``conflict``)
        _Field("force", (bool,), required=False),
    ),
    # what an ended turn did to one path, as a unified diff (``design/checkpoints.md``)
    "session.diff": (_str("session_id"), _str("turn_id"), _str("path")),
    # the operator's pause of every session (``supervisor/pausing.py``)
    "gateway.pause": (_Field("deadline_s", (int, float), required=False),),
    "gateway.resume": (),
    # nodes only: one session's, as a front passes its pause on (``supervisor/remote/``)
    "session.pause": (_str("session_id"), _Field("deadline_s", (int, float), required=False)),
    "session.resume": (_str("session_id"),),
}


# -- the calls: one per action --------------------------------------------------------------


@frozen
class ListAgents:
    action: ClassVar[str] = "agents.list"


@frozen
class ListSessions:
    action: ClassVar[str] = "session.list"


@frozen(kw_only=True)
class ListReceipts:
    action: ClassVar[str] = "receipts.list"

    #: the newest this many (None: all that are kept)
    limit: int | None = None
    #: only those after this ``seq`` (None: from the oldest kept)
    since_seq: int | None = None


@frozen(kw_only=True)
class StartSession:
    action: ClassVar[str] = "session.start"

    agent: str
    cwd: str | None = None
    #: a ``[hosts.NAME]`` the agent may run on
    host: str | None = None
    #: ACP ``McpServer`` objects, on top of the agent's own
    mcp_servers: tuple[McpServer, ...] = ()
    #: the agent's definition (nodes only), as the wire has it: whether a gateway takes one at
    #: all is its own to say (``Gateway(accept_specs=)``), before what it holds is judged
    spec: Mapping[str, Any] | None = None
    #: nodes only: refuse with ``capacity`` unless fewer sessions than this are live there
    max_sessions: int | None = None
    #: run in a new git worktree of ``cwd``'s repository; None: as the agent's ``worktree``
    worktree: bool | None = None
    #: nodes only: the session goes on from a stored one of the front's (the agent's own
    #: session id to resume, its last seq and turns, what was said: ``remote/revival.py``)
    revive: Mapping[str, Any] | None = None


@frozen
class SearchSessions:
    """Stored texts (prompts, steers, answers) of every session that hold ``query``'s words."""

    action: ClassVar[str] = "session.search"

    query: str
    limit: int = SEARCH_LIMIT


@frozen
class Subscribe:
    action: ClassVar[str] = "session.subscribe"

    session_id: str
    since_seq: int | None = None


@frozen
class Unsubscribe:
    action: ClassVar[str] = "session.unsubscribe"

    session_id: str


@frozen
class Prompt:
    action: ClassVar[str] = "agent.prompt"

    session_id: str
    #: what events show of the prompt: the payload's ``text``, else the text of ``parts``
    text: str
    #: the prompt's ``content`` when it is more than text, in order (empty: text only)
    parts: tuple[Part, ...] = ()


@frozen
class SetMode:
    action: ClassVar[str] = "agent.set_mode"

    session_id: str
    mode_id: str


@frozen
class Input:
    action: ClassVar[str] = "session.input"

    session_id: str
    data: str


@frozen
class Resize:
    action: ClassVar[str] = "session.resize"

    session_id: str
    cols: int
    rows: int


@frozen
class Steer:
    action: ClassVar[str] = "agent.steer"

    session_id: str
    text: str


@frozen(kw_only=True)
class Cancel:
    action: ClassVar[str] = "agent.cancel"

    session_id: str
    #: the turn meant (the wire's ``task_id``); None: whichever runs
    task_id: str | None = None
    reason: str | None = None
    #: then rewind the working directory to the turn's start (``design/checkpoints.md``)
    rewind: bool = False


@frozen(kw_only=True)
class RespondPermission:
    action: ClassVar[str] = "permission.respond"

    session_id: str
    request_id: str
    #: exactly one of an option and ``cancelled``
    option_id: str | None = None
    cancelled: bool = False


@frozen
class Rewind:
    action: ClassVar[str] = "session.rewind"

    session_id: str
    turn_id: str
    force: bool = False


@frozen
class Diff:
    action: ClassVar[str] = "session.diff"

    session_id: str
    turn_id: str
    #: relative to the session's working directory, as ``changes`` names it
    path: str


@frozen
class StopSession:
    action: ClassVar[str] = "session.stop"

    session_id: str


@frozen
class PauseAll:
    """No new turn starts in any session until :class:`ResumeAll`; turns still running
    ``deadline_s`` seconds from now are cancelled (None: they finish by themselves)."""

    action: ClassVar[str] = "gateway.pause"

    deadline_s: float | None = None


@frozen
class ResumeAll:
    action: ClassVar[str] = "gateway.resume"


@frozen
class PauseSession:
    """One session's pause (a node's gateway only: a front passes its pause on)."""

    action: ClassVar[str] = "session.pause"

    session_id: str
    deadline_s: float | None = None


@frozen
class ResumeSession:
    action: ClassVar[str] = "session.resume"

    session_id: str


Call = (
    ListAgents
    | ListSessions
    | ListReceipts
    | SearchSessions
    | StartSession
    | Subscribe
    | Unsubscribe
    | Prompt
    | SetMode
    | Input
    | Resize
    | Steer
    | Cancel
    | RespondPermission
    | StopSession
    | Rewind
    | Diff
    | PauseAll
    | ResumeAll
    | PauseSession
    | ResumeSession
)


def session_of(call: Call) -> str | None:
    """The session a call names (its answer's order follows that session's events)."""
    session_id = getattr(call, "session_id", None)
    return session_id if isinstance(session_id, str) else None


@frozen
class Request:
    id: str | int
    call: Call
    #: the frame's size in bytes (what a log line says of a request, instead of its payload)
    size: int = field(default=0, eq=False)

    @property
    def action(self) -> str:
        return self.call.action


@frozen
class RequestError:
    """A request we cannot serve; ``id`` is None when the frame had no usable id."""

    id: str | int | None
    code: str
    message: str


def frame_bytes(frame: str | bytes) -> int:
    """A frame's size on the wire: a text frame's UTF-8 bytes, not its characters (up to four
    bytes each)."""
    if isinstance(frame, bytes) or frame.isascii():
        return len(frame)
    return len(frame.encode("utf-8", "surrogatepass"))


#: ``{"id": "c1", ...`` or ``{"id": 7, ...``: an id that leads the frame (clients write it
#: first), read without parsing a frame too large to parse.
_LEADING_ID: Final = re.compile(r'\s*\{\s*"id"\s*:\s*(?:"([\w.:-]{1,128})"|(-?\d{1,18}))\s*[,}]')


def _leading_id(frame: str | bytes) -> str | int | None:
    head = frame[:256]
    text = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
    match = _LEADING_ID.match(text)
    if match is None:
        return None
    return match.group(1) if match.group(1) is not None else int(match.group(2))


def decode_request(frame: str | bytes) -> Request | RequestError:
    # Characters first (never more than the bytes), then the bytes.
    size = len(frame) if len(frame) > MAX_PROMPT_FRAME_BYTES else frame_bytes(frame)
    if size > MAX_PROMPT_FRAME_BYTES:
        message = f"frame exceeds {MAX_PROMPT_FRAME_BYTES} bytes"
        return RequestError(_leading_id(frame), "too_large", message)
    checked = _decode(frame)
    if size > MAX_FRAME_BYTES and (
        not isinstance(checked, _Checked)
        or checked.action != "agent.prompt"
        or "content" not in checked.payload
    ):
        # Only a prompt's content may be this big (a request not even read is no better).
        request_id = checked.id if checked.id is not None else _leading_id(frame)
        message = f"frame exceeds {MAX_FRAME_BYTES} bytes (a prompt with content may have"
        return RequestError(request_id, "too_large", f"{message} {MAX_PROMPT_FRAME_BYTES})")
    if isinstance(checked, RequestError):
        return checked
    call = _call(checked.action, checked.payload)
    if isinstance(call, str):
        return RequestError(checked.id, "bad_request", call)
    return Request(checked.id, call, size=size)


@frozen
class _Checked:
    """A request whose envelope and payload fields have the types :data:`ACTIONS` names."""

    id: str | int
    action: str
    payload: dict[str, Any]


def _decode(frame: str | bytes) -> _Checked | RequestError:
    try:
        message = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        # Its id, when the frame starts with one, so the client's waiting call is answered.
        return RequestError(_leading_id(frame), "bad_request", f"invalid JSON: {exc}")
    if not isinstance(message, dict):
        return RequestError(None, "bad_request", "a request must be a JSON object")
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return RequestError(None, "bad_request", "'id' must be a string or an integer")
    if isinstance(request_id, str) and len(request_id) > MAX_ID_CHARS:
        return RequestError(None, "bad_request", f"'id' is longer than {MAX_ID_CHARS} chars")
    if isinstance(request_id, str) and not is_text(request_id):
        return RequestError(None, "bad_request", "'id' is not valid Unicode text")
    action = message.get("action")
    if not isinstance(action, str):
        return RequestError(request_id, "bad_request", "'action' must be a string")
    fields = ACTIONS.get(action)
    if fields is None:
        known = ", ".join(sorted(ACTIONS))
        return RequestError(request_id, "unknown_action", f"unknown action {action!r} ({known})")
    payload = message.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        return RequestError(request_id, "bad_request", "'payload' must be an object")
    for spec in fields:
        value = payload.get(spec.name)
        if value is None:
            if spec.required:
                return RequestError(request_id, "bad_request", f"payload needs {spec.name!r}")
            continue
        if isinstance(value, bool) and bool not in spec.types:
            value_ok = False
        else:
            value_ok = isinstance(value, spec.types)
        if not value_ok:
            wanted = " or ".join(t.__name__ for t in spec.types)
            return RequestError(
                request_id, "bad_request", f"payload {spec.name!r} must be {wanted}"
            )
        if isinstance(value, str) and not is_text(value):
            return RequestError(
                request_id,
                "bad_request",
                f"payload {spec.name!r} is not valid Unicode text: it holds a lone surrogate"
                " (\\ud800-\\udfff), which UTF-8, so no agent, can carry",
            )
    if action == "agent.prompt" and payload.get("text") is None and not payload.get("content"):
        return RequestError(request_id, "bad_request", "payload needs 'text' or 'content'")
    if action == "permission.respond":
        has_option = payload.get("option_id") is not None
        if has_option == bool(payload.get("cancelled")):
            return RequestError(
                request_id, "bad_request", "give exactly one of 'option_id' or 'cancelled': true"
            )
    clean = {spec.name: payload[spec.name] for spec in fields if payload.get(spec.name) is not None}
    return _Checked(request_id, action, clean)


def _call(action: str, p: dict[str, Any]) -> Call | str:
    """A checked payload (its fields of the types :data:`ACTIONS` names, the absent ones left
    out) as its action's call, or why it cannot be one: ACP content blocks and MCP servers are
    read here, once (their errors are ``bad_request`` with the reason)."""
    match action:
        case "agents.list":
            return ListAgents()
        case "session.list":
            return ListSessions()
        case "receipts.list":
            return _receipts(p.get("limit"), p.get("since_seq"))
        case "session.start":
            try:
                servers = mcp_servers_from_acp(p.get("mcp_servers", []))
            except ValueError as exc:
                return f"mcp_servers{exc}"
            return StartSession(
                agent=p["agent"],
                cwd=p.get("cwd"),
                host=p.get("host"),
                mcp_servers=servers,
                spec=p.get("spec"),
                max_sessions=p.get("max_sessions"),
                worktree=p.get("worktree"),
                revive=p.get("revive"),
            )
        case "session.search":
            return _search(p["query"], p.get("limit", SEARCH_LIMIT))
        case "session.subscribe":
            return Subscribe(p["session_id"], p.get("since_seq"))
        case "session.unsubscribe":
            return Unsubscribe(p["session_id"])
        case "agent.prompt":
            parts: tuple[Part, ...] = ()
            if "content" in p:
                read = parts_from_acp(p["content"])
                if isinstance(read, str):
                    return f"content: {read}"
                parts = read
            return Prompt(p["session_id"], p.get("text") or parts_text(parts), parts)
        case "agent.set_mode":
            return SetMode(p["session_id"], p["mode_id"])
        case "agent.steer":
            return Steer(p["session_id"], p["text"])
        case "session.input":
            return Input(p["session_id"], p["data"])
        case "session.resize":
            return Resize(p["session_id"], p["cols"], p["rows"])
        case "agent.cancel":
            return Cancel(
                session_id=p["session_id"],
                task_id=p.get("task_id"),
                reason=p.get("reason"),
                rewind=bool(p.get("rewind")),
            )
        case "permission.respond":
            return RespondPermission(
                session_id=p["session_id"],
                request_id=p["request_id"],
                option_id=p.get("option_id"),
                cancelled=bool(p.get("cancelled")),
            )
        case "session.stop":
            return StopSession(p["session_id"])
        case "session.rewind":
            return Rewind(p["session_id"], p["turn_id"], bool(p.get("force")))
        case "session.diff":
            return Diff(p["session_id"], p["turn_id"], p["path"])
        case "gateway.pause" | "session.pause":
            deadline: float | None = None
            if "deadline_s" in p:
                try:
                    deadline = float(p["deadline_s"])
                except OverflowError:  # an integer too big for a float
                    deadline = math.inf
                if not (math.isfinite(deadline) and deadline >= 0):
                    return "payload 'deadline_s' must be a number of seconds >= 0"
            if action == "gateway.pause":
                return PauseAll(deadline)
            return PauseSession(p["session_id"], deadline)
        case "gateway.resume":
            return ResumeAll()
        case "session.resume":
            return ResumeSession(p["session_id"])
    raise AssertionError(f"no call for action {action}")  # ACTIONS and this match agree


def _search(query: str, limit: int) -> SearchSessions | str:
    if not query.strip():
        return "'query' must hold a word to find"
    if len(query) > MAX_QUERY_CHARS:
        return f"'query' is longer than {MAX_QUERY_CHARS} characters"
    if not 1 <= limit <= MAX_SEARCH_LIMIT:
        return f"'limit' must be from 1 to {MAX_SEARCH_LIMIT}"
    return SearchSessions(query, limit)


def _receipts(limit: int | None, since_seq: int | None) -> ListReceipts | str:
    if limit is not None and limit < 0:
        return "'limit' must not be negative"
    if since_seq is not None and since_seq < 0:
        return "'since_seq' must not be negative"
    return ListReceipts(limit=limit, since_seq=since_seq)


def decode_receipts_query(query: str) -> ListReceipts | RequestError:
    """``GET /v1/receipts``'s query (``limit`` and ``since_seq``, both optional) as the
    :class:`ListReceipts` that ``receipts.list`` makes; anything else in it is ignored, as
    unknown payload keys are (the token may be there)."""
    values: dict[str, int] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in ("limit", "since_seq"):
            if not value.isascii() or not value.isdigit() or len(value) > _MOST_DIGITS:
                return RequestError(None, "bad_request", f"'{name}' must be a whole number")
            values[name] = int(value)
    call = _receipts(values.get("limit"), values.get("since_seq"))
    return RequestError(None, "bad_request", call) if isinstance(call, str) else call


#: The most digits a number of a query may have (a count of receipts needs few).
_MOST_DIGITS: Final = 18


#: What an HTTP abort cancels for when its body names no reason.
ABORT_REASON: Final = "http"


def decode_abort(session_id: str, body: bytes) -> Cancel | RequestError:
    """``POST /v1/sessions/{id}/abort``'s body (optional: ``{"reason", "task_id"}``) as the
    :class:`Cancel` that ``agent.cancel`` makes. As that action, a body it cannot take is
    refused, not half read (a cancel with another reason, or of another turn, than was
    asked); the error has no id (an HTTP answer needs none)."""
    reason: str = ABORT_REASON
    task_id: str | None = None
    if body.strip():
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # (a deeply nested body)
            return RequestError(None, "bad_request", "body must be JSON")
        problem = None
        if not isinstance(payload, dict):
            problem = "body must be a JSON object"
        else:
            for key in ("reason", "task_id"):
                if payload.get(key) is not None and not isinstance(payload[key], str):
                    problem = f"'{key}' must be a string"
            if isinstance(payload.get("reason"), str):
                reason = payload["reason"]
            if isinstance(payload.get("task_id"), str):
                task_id = payload["task_id"]
        if problem is not None:
            return RequestError(None, "bad_request", problem)
    try:
        check_text("'reason'", reason)
        if task_id is not None:
            check_text("'task_id'", task_id)
    except BadRequest as exc:
        return RequestError(None, exc.code, str(exc))
    return Cancel(session_id=session_id, task_id=task_id, reason=reason)


def ok_response(request_id: str | int, result: dict[str, Any]) -> dict[str, Any]:
    return {"id": request_id, "ok": True, "result": result}


def error_response(request_id: str | int | None, code: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": {"code": code, "message": message}}
