"""Universal events: what every agent protocol is translated into.

Protocol machines create these with the stamp fields left at their defaults; the session actor
stamps ``session_id``, a contiguous per-session ``seq`` and a timestamp with ``attrs.evolve``
before anyone sees them. One small frozen class per kind, like wsproto's ``events``; the wire
name of each is its ``kind``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final, TypeVar

import attrs
from attrs import field, frozen

__all__ = [
    "AgentExited",
    "AgentStderr",
    "AgentUnparsed",
    "ErrorEvent",
    "Event",
    "MessageDelta",
    "PermissionOption",
    "PermissionRequested",
    "PermissionResolved",
    "Plan",
    "SessionInfo",
    "SessionHeld",
    "SessionRecycled",
    "SessionRewound",
    "SessionState",
    "StreamGap",
    "TerminalOutput",
    "ThoughtDelta",
    "ToolCall",
    "ToolUpdate",
    "TurnEnded",
    "TurnStalled",
    "TurnStarted",
    "TurnSteered",
    "EVENT_TYPES",
    "PREVIEW_CHARS",
    "new_message_delta",
    "new_session_state",
    "new_turn_ended",
    "preview",
    "quick_constructor",
]


@frozen(kw_only=True)
class Event:
    """Base of every universal event: the stamp the session actor fills in."""

    kind: ClassVar[str] = "event"
    session_id: str = ""
    seq: int = 0
    timestamp: float = 0.0


@frozen(kw_only=True)
class SessionState(Event):
    """The session moved to ``state`` (starting, ready, running, cancelling, stopped, failed)."""

    kind: ClassVar[str] = "session.state"
    state: str
    detail: str | None = None


@frozen(kw_only=True)
class SessionRecycled(Event):
    """The agent failed ``failed_turns`` turns in a row and is being restarted, the session to
    be resumed (the ``session.state`` that follows says how that went)."""

    kind: ClassVar[str] = "session.recycled"
    reason: str
    failed_turns: int


@frozen(kw_only=True)
class SessionHeld(Event):
    """New turns are held (``held``: why; ``paused``: an operator paused the supervisor), or
    released (``held`` null). While held, prompts are accepted and queued, and start in order
    once released; the running turn goes on. ``deadline_s``: seconds after this event at which
    a turn still running is stopped (``reason: "paused"``); null: it finishes by itself.
    ``queued``: the prompts waiting then."""

    kind: ClassVar[str] = "session.held"
    held: str | None
    deadline_s: float | None = None
    queued: int = 0


@frozen(kw_only=True)
class TurnStarted(Event):
    """A turn started with the prompt ``text``: whole, or (``text_bytes`` set) its first
    :data:`PREVIEW_CHARS` characters, the prompt being ``text_bytes`` bytes long (the agent got
    it whole; a session keeps thousands of events, and a prompt may be megabytes).

    ``context`` is ``"injected"`` when the agent got the conversation so far, ``context_bytes``
    of it, in front of the prompt: its session could not be resumed after a respawn or a
    restart, and a fresh one knows nothing of what was said (``text`` is still the prompt
    alone)."""

    kind: ClassVar[str] = "turn.started"
    turn_id: str
    text: str
    text_bytes: int | None = None
    context: str | None = None
    context_bytes: int | None = None


@frozen(kw_only=True)
class TurnSteered(Event):
    """A person steered: ``text`` joined turn ``turn_id`` (``mode`` ``injected``), or starts it
    (``started``; ``interrupted``: after ``interrupted_turn_id`` was cancelled to make way)."""

    kind: ClassVar[str] = "turn.steered"
    turn_id: str
    mode: str
    #: the steer's text, or its preview (``text_bytes`` set): as :class:`TurnStarted`'s
    text: str
    interrupted_turn_id: str | None = None
    text_bytes: int | None = None


@frozen(kw_only=True)
class MessageDelta(Event):
    """A chunk of a message; ``role`` is ``user`` when an agent echoes the prompt back."""

    kind: ClassVar[str] = "message.delta"
    turn_id: str | None
    text: str
    role: str = "assistant"


@frozen(kw_only=True)
class ThoughtDelta(Event):
    kind: ClassVar[str] = "thought.delta"
    turn_id: str | None
    text: str


@frozen(kw_only=True)
class ToolCall(Event):
    kind: ClassVar[str] = "tool.call"
    turn_id: str | None
    tool_call_id: str
    title: str = ""
    tool_kind: str | None = None
    status: str | None = None
    raw: dict[str, Any] = field(factory=dict)


@frozen(kw_only=True)
class ToolUpdate(Event):
    kind: ClassVar[str] = "tool.update"
    turn_id: str | None
    tool_call_id: str
    status: str | None = None
    raw: dict[str, Any] = field(factory=dict)


@frozen(kw_only=True)
class Plan(Event):
    kind: ClassVar[str] = "plan"
    turn_id: str | None
    entries: list[dict[str, Any]] = field(factory=list)


@frozen
class PermissionOption:
    option_id: str
    name: str
    option_kind: str


@frozen(kw_only=True)
class PermissionRequested(Event):
    """The agent waits for a person's decision; answer with ``respond_permission``."""

    kind: ClassVar[str] = "permission.requested"
    turn_id: str | None
    request_id: str
    tool_call: dict[str, Any] = field(factory=dict)
    options: list[PermissionOption] = field(factory=list)


@frozen(kw_only=True)
class PermissionResolved(Event):
    """A permission request is no longer pending.

    ``outcome`` is ``selected`` or ``cancelled``; ``by`` says who ended it: ``client`` (a person
    answered), ``supervisor`` (a cancel answered it) or ``agent`` (the agent withdrew it).
    """

    kind: ClassVar[str] = "permission.resolved"
    turn_id: str | None
    request_id: str
    outcome: str
    option_id: str | None = None
    by: str = "client"


@frozen(kw_only=True)
class TurnStalled(Event):
    """The stall watchdog: nothing came from the agent for the running turn in ``silent_s``
    (its limit: ``stall_s``; ``tool_stall_s`` while the ``tool_calls`` listed were in progress).
    The turn is being cancelled, ``reason: "stalled"``; its ``turn.ended`` follows."""

    kind: ClassVar[str] = "turn.stalled"
    turn_id: str
    silent_s: float
    stall_s: float
    tool_calls: list[str] = field(factory=list)


@frozen(kw_only=True)
class TurnEnded(Event):
    """Exactly one per turn. ``outcome``: completed, cancelled, killed or failed. ``reason``:
    why a stopped turn was stopped (the receipt's: ``user``, ``stalled``, ...), else None."""

    kind: ClassVar[str] = "turn.ended"
    turn_id: str
    outcome: str
    stop_reason: str | None = None
    error: str | None = None
    receipt: dict[str, Any] | None = None
    reason: str | None = None
    #: what the turn changed in the session's working directory (``{"path", "change"}``, see
    #: ``design/checkpoints.md``); None: not known
    changes: list[dict[str, Any]] | None = None


@frozen(kw_only=True)
class SessionRewound(Event):
    """The working directory was put back as it was when ``turn_id`` started: the paths
    ``restored``, and those ``not_restored`` (``{"path", "why"}``)."""

    kind: ClassVar[str] = "session.rewound"
    turn_id: str
    restored: list[str] = field(factory=list)
    not_restored: list[dict[str, str]] = field(factory=list)


@frozen(kw_only=True)
class SessionInfo(Event):
    """Session metadata an agent reports (modes, commands, usage, ...), passed through as is."""

    kind: ClassVar[str] = "session.info"
    info_kind: str
    data: dict[str, Any] = field(factory=dict)


@frozen(kw_only=True)
class AgentStderr(Event):
    kind: ClassVar[str] = "agent.stderr"
    line: str


@frozen(kw_only=True)
class AgentExited(Event):
    """The agent process is gone; ``expected`` is false when nobody asked it to go, ``killed``
    true when the supervisor killed its tree (the kill ladder, a stop's, or what was left once
    its shim died), false when it ended by itself (Amp ends its run on the SIGINT that stops
    its turn)."""

    kind: ClassVar[str] = "agent.exited"
    exit_code: int | None
    signal: int | None = None
    expected: bool = False
    killed: bool = False


@frozen(kw_only=True)
class ErrorEvent(Event):
    """Something went wrong that did not end the session (a bad line, a stray response)."""

    kind: ClassVar[str] = "error"
    code: str
    message: str


@frozen(kw_only=True)
class StreamGap(Event):
    """Events ``from_seq`` to ``to_seq`` are lost for good (``cause``: why, e.g. the node's
    history no longer reached back to them): never a silent jump in ``seq``. It takes the seq
    of the last one lost (``to_seq``), so the stream goes on contiguous after it."""

    kind: ClassVar[str] = "stream.gap"
    from_seq: int
    to_seq: int
    cause: str


@frozen(kw_only=True)
class TerminalOutput(Event):
    """Bytes a terminal agent wrote to its terminal, as read: ``data`` is their base64, for a
    terminal view to draw (``protocols/terminal.py``)."""

    kind: ClassVar[str] = "terminal.output"
    data: str


@frozen(kw_only=True)
class AgentUnparsed(Event):
    """An agent message we do not understand: passed on, never a crash."""

    kind: ClassVar[str] = "agent.unparsed"
    raw: Any = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        SessionState,
        SessionHeld,
        SessionRecycled,
        TurnStarted,
        TurnSteered,
        MessageDelta,
        ThoughtDelta,
        ToolCall,
        ToolUpdate,
        Plan,
        PermissionRequested,
        PermissionResolved,
        TurnStalled,
        TurnEnded,
        SessionRewound,
        SessionInfo,
        AgentStderr,
        AgentExited,
        ErrorEvent,
        StreamGap,
        TerminalOutput,
        AgentUnparsed,
    )
}


T = TypeVar("T", bound=attrs.AttrsInstance)


#: How much of a prompt's or a steer's text an event carries. The agent gets the text whole;
#: an event that carries a longer one carries its first this many characters and its size
#: (``text_bytes``): a session keeps thousands of events, each subscriber a buffer of them,
#: and a pasted file may be megabytes.
PREVIEW_CHARS: Final = 16_000


def preview(text: str) -> tuple[str, int | None]:
    """``text`` as an event carries it: itself and None, or its first :data:`PREVIEW_CHARS`
    characters and its whole size in UTF-8 bytes."""
    if len(text) <= PREVIEW_CHARS:
        return text, None
    return text[:PREVIEW_CHARS], len(text.encode("utf-8", "surrogatepass"))


def quick_constructor(cls: type[T]) -> Callable[..., T]:
    """A function that makes what ``cls(**fields)`` makes (each field given, or its default),
    for instances made where every microsecond counts (a stream's deltas by the thousand, a
    cancel's events and receipt on its cold path): attrs' frozen ``__init__`` sets each slot
    through ``object.__setattr__``, which looks the name up every time; this sets it through
    the slot's own descriptor, for ~60 % of the cost. A factory default is called when its
    field is not given, as attrs' would be. Only for a class whose ``__init__`` does nothing
    else (no validator, converter, factory taking ``self``, or hook). Compiled once.

    A frozen ``__init__`` costs ~0.6 us more a field than a plain one on a cancel's cold path
    (measured: ``design/actor.md``, "A quiet session's cancel, step by step"). So the
    messages a cancel makes and nobody else sees (a call, a line, a control event, the ladder's
    job) are plain ``@define`` classes that point here; the events and receipts, which
    subscribers and callers share, stay frozen and are made by this."""
    names: dict[str, Any] = {"new": object.__new__, "cls": cls, "omitted": _OMITTED}
    parameters, body = [], ["    self = new(cls)"]
    for index, attribute in enumerate(attrs.fields(cls)):
        default = attribute.default
        factory = isinstance(default, attrs.Factory)  # type: ignore[arg-type]
        if (
            attribute.validator is not None
            or attribute.converter is not None
            or (factory and default.takes_self)
            or not attribute.init
            or not attribute.name.isidentifier()
        ):
            raise TypeError(f"{cls.__name__}.{attribute.name}: made by attrs' __init__ only")
        name = attribute.name
        if default is attrs.NOTHING:
            parameters.append(name)
        elif factory:
            names[f"factory{index}"] = default.factory
            parameters.append(f"{name}=omitted")
            body.append(f"    if {name} is omitted:\n        {name} = factory{index}()")
        else:
            names[f"default{index}"] = default
            parameters.append(f"{name}=default{index}")
        owner = next(c for c in cls.__mro__ if name in c.__dict__)
        names[f"set{index}"] = owner.__dict__[name].__set__
        body.append(f"    set{index}(self, {name})")
    if any(hasattr(cls, hook) for hook in ("__attrs_pre_init__", "__attrs_post_init__")):
        raise TypeError(f"{cls.__name__}: made by attrs' __init__ only")
    source = f"def make(*, {', '.join(parameters)}):\n" + "\n".join([*body, "    return self\n"])
    exec(compile(source, f"<quick constructor {cls.__name__}>", "exec"), names)  # noqa: S102
    make: Callable[..., T] = names["make"]
    return make


#: A factory default's field not given to a :func:`quick_constructor` (None may be a value).
_OMITTED: Any = object()


#: ``MessageDelta(...)``, as a stream makes it: :func:`quick_constructor`.
new_message_delta: Callable[..., MessageDelta] = quick_constructor(MessageDelta)
#: ``SessionState(...)`` and ``TurnEnded(...)``, as a cancel makes them: :func:`quick_constructor`.
new_session_state: Callable[..., SessionState] = quick_constructor(SessionState)
new_turn_ended: Callable[..., TurnEnded] = quick_constructor(TurnEnded)
