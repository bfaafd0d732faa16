"""The seam between the session actor and every agent protocol.

A protocol machine is a plain object: the actor feeds it decoded messages and calls (``start``,
``prompt``, ``cancel``, ``respond_permission``) and gets back a :class:`Step`: the messages to
write to the agent and the events that happened. Universal events (``protocols.events``) go to
subscribers; *control* events (below) tell the actor where the conversation stands. Nothing here
knows about time, processes or trio, so each protocol is tested with lists of dicts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

import msgspec
from attrs import define, field, frozen

from protocols import events as ev
from protocols.content import Part
from protocols.events import Event
from protocols.framing import is_text
from protocols.mcp import MCP_TRANSPORTS, McpServer, check_transports

__all__ = [
    "AgentExiting",
    "AgentProtocol",
    "Control",
    "InterruptAnswered",
    "ModeSet",
    "Output",
    "PartialStep",
    "ProtocolError",
    "RestartWanted",
    "SessionEstablished",
    "StartFailed",
    "SteerAnswered",
    "Step",
    "TurnFinished",
    "NOT_RESUMABLE",
    "UnknownPermission",
    "argv_resumable",
    "check_answer",
    "session_changed",
]


class ProtocolError(Exception):
    """The agent broke its protocol in a way that ends the connection."""


class UnknownPermission(LookupError):
    """``respond_permission`` named a request that is not pending (or an option not offered)."""


def argv_resumable(session_id: str) -> bool:
    """True if the agent's own ``session_id`` can be given back to it on a command line
    (``claude --resume ID``, ``amp threads continue ID``): the agent announced it, so it is
    checked as any input is. Not empty, not read as an option (a leading ``-``: ``--help``),
    and no NUL or lone surrogate, which no argv can carry."""
    return (
        bool(session_id)
        and not session_id.startswith("-")
        and "\0" not in session_id
        and (is_text(session_id))
    )


#: The detail of a fresh start where a resume was asked with an id no command line can carry.
NOT_RESUMABLE = "the agent's session id cannot be passed on its command line: a fresh session"


def check_answer(request_id: str, offered: Collection[str] | None, option_id: str | None) -> None:
    """Refuse an answer to a request that is not pending (``offered`` is None) or with an option
    it did not offer; ``option_id=None`` (cancelled) is always a valid answer."""
    if offered is None:
        raise UnknownPermission(f"no pending permission request {request_id!r}")
    if option_id is not None and option_id not in offered:
        raise UnknownPermission(
            f"option {option_id!r} was not offered for {request_id!r}"
            f" (offered: {', '.join(sorted(offered))})"
        )


def session_changed(
    expected: str | None, confirmed: bool, got: str, *, agent: str, kind: str
) -> ev.ErrorEvent | None:
    """The agent names session ``got`` where we expected ``expected``: ``resume_mismatch`` if
    we asked it to resume ``expected`` and it runs another (not ``confirmed`` yet), else
    ``agent_session_changed``. None when it is the one expected (or we expected none)."""
    if expected is None or got == expected:
        return None
    if not confirmed:
        return ev.ErrorEvent(
            code="resume_mismatch",
            message=f"asked {agent} to resume {kind} {expected!r} but it runs {got!r}",
        )
    return ev.ErrorEvent(
        code="agent_session_changed",
        message=f"{agent} switched from {kind} {expected!r} to {got!r}",
    )


class Control:
    """Base of the control events: for the actor, never shown to subscribers as is. (Not an
    attrs class: a frozen base would make :class:`TurnFinished` frozen too.)"""

    __slots__ = ()


@frozen
class SessionEstablished(Control):
    """The handshake is done and prompts may be sent.

    ``resumed`` is ``None`` when no resume was asked for, ``True`` when the agent restored the
    session we named, ``False`` when it could not and this is a fresh session.
    """

    agent_session_id: str | None
    resumed: bool | None = None
    detail: str | None = None


@frozen
class StartFailed(Control):
    """The handshake failed. ``resume_failed``: only the resume was refused (the session is
    gone on the agent's side); the actor then starts a fresh process without ``resume``."""

    message: str
    resume_failed: bool = False


@define  # made on a cancel's cold path: see protocols.events.quick_constructor
class TurnFinished(Control):
    """The agent says the turn is over: the only thing that ends a turn short of a kill.

    ``interrupted`` is the agent's own word on why: ``True`` (it stopped because we asked),
    ``False`` (it finished by itself: Codex ``completed``, Claude ``terminal_reason=completed``)
    or ``None`` when the protocol cannot tell (ACP agents answer a cancelled turn ``end_turn``).
    """

    turn_id: str
    stop_reason: str | None
    interrupted: bool | None = None
    error: str | None = None
    #: protocol facts worth a line in the receipt (e.g. background terminals cleaned)
    details: dict[str, Any] = field(factory=dict)


@frozen
class InterruptAnswered(Control):
    """The agent answered the interrupt of turn ``turn_id``: it has it. Only where the
    protocol's interrupt is a request with an answer (Codex's ``turn/interrupt``, Claude's
    ``interrupt`` control request, OpenCode's abort); ACP's ``session/cancel`` is a
    notification and Amp's a signal, so their delivery is never known. Not the turn's end,
    which :class:`TurnFinished` alone says."""

    turn_id: str


@frozen
class ModeSet(Control):
    """The agent's answer to :meth:`AgentProtocol.set_mode`: ``error`` None when it took it."""

    mode_id: str
    error: str | None = None


@frozen
class SteerAnswered(Control):
    """The agent's answer to :meth:`AgentProtocol.steer` number ``steer_id``.

    ``injected``: the text joined the running turn ``turn_id``. Otherwise ``detail`` says why
    not: the agent refused, or (``no_turn``) no turn was running any more when it got there;
    either way the text has not reached the model, and the actor decides what becomes of it.
    """

    steer_id: int
    turn_id: str
    injected: bool
    no_turn: bool = False
    detail: str | None = None


@frozen
class AgentExiting(Control):
    """The agent's process is about to end by itself, and that is how the protocol works: Amp's
    run ends on the signal that stops its turn (and after any ``result``). Emitted before the
    :class:`TurnFinished` of the same stop, or on its own.

    The actor then lets the process go instead of treating its exit as a crash: no prompt is
    written to it, and a cancelled turn that ends meanwhile is answered only once the process is
    gone and a new one runs (terminate-then-respond). The exit is bounded by the grace timer;
    a process that outlives it meets the kill ladder.
    """

    reason: str


@frozen
class RestartWanted(Control):
    """The agent's process is in a state only a restart clears, and the machine can tell (an
    ``opencode serve`` whose early abort left its model lookup interrupted fails every prompt
    after it). The actor restarts it, its session resumed, once the running turn is over,
    rather than letting prompt after prompt fail first. Emitted before the
    :class:`TurnFinished` that showed it."""

    reason: str


Output = Event | Control


@define
class Step:
    """What one call into a machine produced, in order.

    ``signals`` are delivered to the agent process after ``send`` is queued: the interrupt of
    protocols that have no in-band one (Amp is stopped with SIGINT).
    """

    send: list[dict[str, Any]] = field(factory=list)
    events: list[Output] = field(factory=list)
    signals: list[int] = field(factory=list)

    def extend(self, other: Step) -> Step:
        self.send.extend(other.send)
        self.events.extend(other.events)
        self.signals.extend(other.signals)
        return self


class PartialStep(Exception):
    """:meth:`AgentProtocol.receive_many` failed on the message at ``failed`` (its index in
    the run): ``step`` is what the messages before it produced, ``consumed`` how many they
    were (``failed - start``). The cause is chained. The caller acts on ``step`` and then on
    the failure, exactly as if the messages had come one at a time."""

    def __init__(self, step: Step, consumed: int, failed: int) -> None:
        super().__init__(f"protocol machine failed on message {failed} of a run")
        self.step = step
        self.consumed = consumed
        self.failed = failed


def _acts(step: Step) -> bool:
    """The step asks the caller for more than showing events: something to send or signal,
    or a control event it must react to before the next message (a finished turn starts the
    next one)."""
    return bool(step.send or step.signals) or any(isinstance(e, Control) for e in step.events)


class AgentProtocol(ABC):
    """One conversation with one agent process. A fresh instance per process."""

    #: the ``protocol`` value in agent configuration
    name: ClassVar[str]
    #: how messages reach the agent: ``stdio`` (a JSON object per line on stdin/stdout), or
    #: ``http`` (the agent is a local HTTP server; messages are request/response envelopes)
    transport: ClassVar[str] = "stdio"
    #: the kinds of MCP server (``protocols.mcp``) this protocol can hand its agent
    mcp_transports: ClassVar[frozenset[str]] = frozenset(MCP_TRANSPORTS)
    #: what its agents take in a prompt natively besides text (``protocols.content``'s carry
    #: words); the rest is written as text or refused (``content.refusal``)
    prompt_carries: ClassVar[frozenset[str]] = frozenset()

    @property
    def carries(self) -> frozenset[str]:
        """What this agent takes in a prompt natively: the protocol's, or (ACP) what the
        agent advertised once it is initialized."""
        return self.prompt_carries

    @classmethod
    def configured(cls, settings: object | None) -> AgentProtocol:
        """A machine for one process of an agent whose configuration holds ``settings`` for
        this protocol (a terminal agent's prompt pattern, say), or None. The protocols that
        take none keep this default."""
        return cls()

    @classmethod
    def check_mcp_servers(cls, servers: Sequence[McpServer]) -> None:
        """Raise :class:`~protocols.mcp.McpUnsupported` for a server this protocol cannot give
        its agent, before anything starts (ACP checks the agent's own word again later)."""
        check_transports(servers, cls.mcp_transports, f"protocol {cls.name!r}")

    @classmethod
    def command(
        cls, base: Sequence[str], resume: str | None, *, mcp_servers: Sequence[McpServer] = ()
    ) -> list[str]:
        """The argv to start the agent with; protocols that resume by flag add it here
        (Claude Code's ``--resume <session_id>``), and those that take MCP servers by flag add
        them (``resume`` is None for a first start)."""
        return list(base)

    @classmethod
    def environment(
        cls,
        secret: str,
        *,
        mcp_servers: Sequence[McpServer] = (),
        configured: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Variables to add to the agent's environment, over the ``configured`` ones.

        ``secret`` is a fresh random token for this one process; its link knows it too and
        nothing else does (an HTTP server's password: OpenCode's ``OPENCODE_SERVER_PASSWORD``).
        It must never reach an event, a log line or a receipt. Protocols that take MCP servers
        in the environment add them here (OpenCode's ``OPENCODE_CONFIG_CONTENT``). None by
        default."""
        return {}

    @abstractmethod
    def start(
        self, *, cwd: str, resume: str | None = None, mcp_servers: Sequence[McpServer] = ()
    ) -> Step:
        """Begin the handshake; ``resume`` is the agent session id to restore, if any.
        ``mcp_servers``: for protocols that hand them over in the handshake (ACP); the others
        took them in :meth:`command` or :meth:`environment`."""

    @property
    def hot_decoder(self) -> msgspec.json.Decoder[Any] | None:
        """A decoder of this protocol's most frequent message in a typed form (a msgspec
        ``Struct`` that forbids unknown fields, so a line decodes as one only if it has exactly
        that shape), or None. Lines of a run that match it reach :meth:`receive_many` in that
        form instead of as dicts: a typed decode costs a fraction of a dict's (no dict, no key
        per field), and the machine reads the few fields it needs as attributes. Never given
        to :meth:`receive`."""
        return None

    @abstractmethod
    def receive(self, message: dict[str, Any]) -> Step:
        """Feed one decoded message from the agent."""

    def receive_many(self, messages: Sequence[dict[str, Any]], start: int = 0) -> tuple[Step, int]:
        """Feed a run of messages, ``messages[start:]``, and say how many were consumed: at
        least one, and no more once a message's step sends something, signals or holds a
        control event (the caller must act on it before the next message is read).

        What comes out is what :meth:`receive` of each, one at a time, would have produced,
        in order. Where a message raises, :class:`PartialStep` carries what those before it
        produced. This default loops over :meth:`receive`; protocols whose streams are long
        runs of one kind of notification (ACP's ``session/update``) do better."""
        step = Step()
        at = start
        end = len(messages)
        while at < end:
            try:
                one = self.receive(messages[at])
            except Exception as exc:
                raise PartialStep(step, at - start, at) from exc
            at += 1
            step.extend(one)
            if _acts(one):
                break
        return step, at - start

    @abstractmethod
    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        """Start a turn. Only called when established and no turn is running. ``parts``: the
        prompt's content in order when it is more than ``text`` (an image, a resource), each
        written in the protocol's own form where :attr:`carries` says it can be, else as its
        text; empty: ``text`` is the whole prompt."""

    @abstractmethod
    def cancel(self) -> Step:
        """Interrupt the running turn, now or as soon as the agent has identified it.

        Must not wait for any reply: the actor races its grace timer against
        :class:`TurnFinished`.
        """

    @property
    def modes(self) -> dict[str, Any] | None:
        """The session's modes as the agent gave them (ACP's ``SessionModeState``:
        ``currentModeId`` and ``availableModes``), or None: the agent has none (every protocol
        but ACP, and ACP agents that advertise none)."""
        return None

    def set_mode(self, mode_id: str) -> Step:
        """Ask the agent to switch the session to ``mode_id`` (one of :attr:`modes`).
        Answered with exactly one :class:`ModeSet`, in this step or a later one (unless the
        process dies first). Only called when established and :attr:`modes` is not None."""
        raise NotImplementedError(f"{self.name} has no session modes")

    @property
    def can_steer(self) -> bool:
        """Whether text can join the running turn natively (:meth:`steer`). False by default:
        the actor then interrupts the turn and starts the text as the next one."""
        return False

    def steer(self, turn_id: str, steer_id: int, text: str) -> Step:
        """Add ``text`` to the running turn ``turn_id``, natively. Only called while that turn
        runs and :attr:`can_steer` is true. Answered with exactly one :class:`SteerAnswered`
        for ``steer_id``, in this step or a later one (unless the process dies first)."""
        raise NotImplementedError(f"{self.name} cannot steer a running turn")

    def abandon_steer(self, steer_id: int) -> Step:
        """The actor gave up waiting for the answer to steer ``steer_id`` (it makes way for
        the text through the ladder instead): withdraw the request where the protocol can."""
        return Step()

    def input(self, data: str) -> Step:
        """Write ``data`` to the agent as a person's keys (a terminal agent's own menu). Only
        protocols with a terminal take it."""
        raise NotImplementedError(f"{self.name} has no terminal to type into")

    def resize(self, cols: int, rows: int) -> Step:
        """Make the agent's terminal ``cols`` x ``rows``. Only protocols with a terminal."""
        raise NotImplementedError(f"{self.name} has no terminal to resize")

    def close(self) -> Step:
        """The session is being stopped: what to tell the agent before its stdin closes (ACP
        ``session/close`` where advertised). Nothing by default."""
        return Step()

    @abstractmethod
    def respond_permission(self, request_id: str, option_id: str | None) -> Step:
        """Answer a pending permission request; ``option_id=None`` answers it cancelled.

        Raises :class:`UnknownPermission` for a request that is not pending or an option that
        was not offered.
        """

    @abstractmethod
    def cancel_permissions(self) -> Step:
        """Answer every pending permission request as cancelled (part of every cancel)."""

    @property
    @abstractmethod
    def pending_permissions(self) -> list[str]:
        """Request ids of the permission requests waiting for an answer."""

    @property
    @abstractmethod
    def agent_session_id(self) -> str | None:
        """What to pass as ``resume`` to the next process's machine after a kill."""

    def number_requests(self, tag: str) -> None:
        """Give every permission request id this machine makes the suffix ``tag``: the session
        tags the machines of its respawned agents, whose JSON-RPC ids start again, so that a
        client's late answer to a request of the last process can never answer one of this
        one. Protocols whose agents make unique ids themselves keep this default."""
        return None

    def details_at_kill(self) -> dict[str, Any]:
        """Receipt details of a cancel the agent never finished, read when the actor kills the
        process (or it dies) before :class:`TurnFinished`: what the cancel asked of sub-agents
        or background tasks and never heard back about, marked unconfirmed. The machine is
        discarded right after; protocols with nothing to report keep this default."""
        return {}
