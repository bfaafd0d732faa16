"""The session actor: one task owns one agent session and everything about it.

Callers talk to it only through its mailbox; each call carries its own reply slot, answered
exactly once. The actor never awaits the agent: messages to the agent are queued on the link,
everything from the agent arrives in the inbox, slow work (spawning, killing, closing) runs in
child tasks that post their result back. So a cancel is always served at once, and agent output
keeps flowing while it is in progress. The grace timer is the deadline of the inbox receive.

States: ``starting -> ready -> running -> cancelling -> ready``, plus ``stopped`` and ``failed``.
See ``design/actor.md`` for the cancel procedure step by step.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import msgspec
import trio
from attrs import define, field, frozen

from protocols import PROTOCOLS, new_machine
from protocols import events as ev
from protocols.content import Part, parts_text, refusal
from protocols.framing import Frame, FramingError, Message, decode_line, decode_lines
from protocols.machine import (
    AgentExiting,
    AgentProtocol,
    Control,
    ModeSet,
    PartialStep,
    SessionEstablished,
    StartFailed,
    SteerAnswered,
    Step,
    TurnFinished,
    UnknownPermission,
)
from supervisor.agents.link import (
    AgentFrame,
    AgentGone,
    AgentLines,
    AgentLink,
    AgentStderrLines,
    Launcher,
)
from supervisor.agents.process import KillError, tree_clock
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus
from supervisor.errors import AgentNotRunning, BadRequest, SupervisorError, check_text
from supervisor.receipt import (
    REASON_MEMORY_LIMIT,
    REASON_STALLED,
    REASON_STEER,
    REASON_USER,
    CancelReceipt,
    DroppedPrompt,
    new_cancel_receipt,
)
from supervisor.runtime.alarm import AlarmClock
from supervisor.runtime.fanout import Fanout, Subscription
from supervisor.runtime.ingest import BYTES_PER_UNIT, IngestGate, Unlimited, cost_of
from supervisor.runtime.reply import Reply
from supervisor.steering import SteerMode, SteerResult
from supervisor.wire.codec import receipt_to_wire

__all__ = ["Session", "SessionSummary", "Subscription", "TurnHandle"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Events kept for ``since_seq`` replay. At ~100 bytes each this bounds a session to ~1 MB.
DEFAULT_HISTORY = 10_000
#: Prompts that may wait behind the running turn; more is a client bug, not a workload.
DEFAULT_MAX_QUEUED = 32
#: Events a subscriber may fall behind before it is cut off (it resubscribes with since_seq).
DEFAULT_SUBSCRIBER_BUFFER = 4096
#: Items buffered between the pumps and the actor: backpressure on a flooding agent. A reader
#: posts one item per read (up to 64 KiB of lines), so this bounds a session to ~1 MB of agent
#: output held in memory, however fast the agent writes.
_INBOX_SIZE = 16
#: Scheduling turns the inbox must stay empty before the actor counts as idle and subscribers'
#: writers are told of new events: a pump, or an in-memory agent, yields once or twice between
#: two posts, and that is not idle. Costs a few microseconds after the last event of a burst.
_IDLE_TURNS = 3
#: An agent that exits unexpectedly this many times without finishing a turn in between is
#: not respawned again: the session fails with its last words instead of looping.
MAX_EXITS_WITHOUT_TURN = 5
#: Turns remembered so a late cancel naming one gets an honest answer.
_ENDED_TURNS_KEPT = 64
#: How often the tree's memory is sampled when ``max_memory_mb`` is set (a psutil scan in a
#: worker thread: ~1 ms for a small tree). A tree that grows 1 GB/s overshoots by ~2 GB before
#: it is seen; agents grow over minutes (Claude Code users report ~3 GB per session).
MEMORY_SAMPLE_S = 2.0
#: Restarts for memory with no turn ended by itself in between before the session fails: an
#: agent over its limit right after every restart needs more than the limit allows.
MAX_MEMORY_RESTARTS = 3
#: What the agent says about a running turn: any of these keeps the stall watchdog away
#: (``design/actor.md``, "The stall watchdog"). Not ``agent.stderr`` (a wedged agent may log on),
#: nor ``session.info`` or ``agent.unparsed`` (metadata and keep-alives flow from agents whose
#: model call hangs).
_TURN_EVENTS: frozenset[type[ev.Event]] = frozenset(
    {
        ev.MessageDelta,
        ev.ThoughtDelta,
        ev.ToolCall,
        ev.ToolUpdate,
        ev.Plan,
        ev.PermissionRequested,
        ev.PermissionResolved,
    }
)
#: Of those, the stream itself: heard, and nothing else changes for the watchdog.
_STREAM_EVENTS: frozenset[type[ev.Event]] = frozenset({ev.MessageDelta, ev.ThoughtDelta, ev.Plan})


@functools.cache
def _is_control(kind: type) -> bool:
    """Whether a machine's output of this class is a :class:`Control` (told in C once known)."""
    return issubclass(kind, Control)


#: The states in which agent output is urgent (:meth:`Session._urgent`): it waits for no share.
_URGENT_STATES = frozenset({"cancelling", "starting"})

#: Tool call statuses that end a call (ACP's words, which every machine maps to).
_TOOL_DONE = frozenset({"completed", "failed"})


@frozen
class TurnHandle:
    """A prompt accepted by the session: ``queued`` when it waits behind another turn."""

    id: str
    queued: bool


@frozen
class SessionSummary:
    session_id: str
    agent: str
    state: str
    turn_id: str | None
    #: times the agent was restarted after failing ``max_failed_turns`` turns in a row
    recycles: int = 0
    #: why, the last time
    recycle_reason: str | None = None
    #: the ``[hosts.NAME]`` it runs on (``supervisor/remote/``); None: this machine
    host: str | None = None
    #: the agent's working directory (None: not known here)
    cwd: str | None = None


# -- mailbox calls ---------------------------------------------------------------------------


@frozen
class _Prompt:
    text: str
    parts: tuple[Part, ...]
    reply: Reply[TurnHandle]


@define  # not frozen: a frozen init costs ~0.6 us more a field on a cancel's cold path
class _Cancel:
    turn_id: str | None
    reason: str | None
    reply: Reply[CancelReceipt]


@frozen
class _Steer:
    text: str
    reply: Reply[SteerResult]


@frozen
class _SetMode:
    mode_id: str
    reply: Reply[None]


@frozen
class _RespondPermission:
    request_id: str
    option_id: str | None
    reply: Reply[None]


@frozen
class _Subscribe:
    since_seq: int | None
    max_buffer: int
    reply: Reply[Subscription]
    stall_s: float | None = None
    wire: bool = False


@frozen
class _WaitReady:
    reply: Reply[None]


@frozen
class _Stop:
    reply: Reply[ExitStatus | None]


_Call = _Prompt | _Cancel | _Steer | _RespondPermission | _SetMode | _Subscribe | _WaitReady | _Stop


# -- inbox items from the session's own child tasks ------------------------------------------


@frozen
class _Wake:
    """Posted after a mailbox call so an idle actor looks at its mailbox."""


_WAKE = _Wake()


@frozen
class _Spawned:
    generation: int
    link: AgentLink


@frozen
class _SpawnFailed:
    generation: int
    message: str


@frozen
class _KillDone:
    generation: int
    steps: list[str]
    #: members that outlived SIGKILL: nothing may be started on top of them
    survivors: list[dict[str, Any]] = field(factory=list)


@frozen
class _Closed:
    status: ExitStatus | None
    steps: list[str]
    survivors: list[dict[str, Any]] = field(factory=list)


@frozen
class _MemoryOver:
    """The agent's tree holds more memory than ``max_memory_mb`` allows (a sampler's word)."""

    generation: int
    used_mb: float


@frozen
class _Swept:
    """The cancelled turn's leftover processes are gone (``killed`` had to be killed)."""

    generation: int
    killed: list[dict[str, Any]]
    survivors: list[dict[str, Any]] = field(factory=list)


# -- state owned by the actor ----------------------------------------------------------------


@define
class _NativeSteer:
    """A steer sent to the agent, waiting for its answer (``SteerAnswered``) until ``deadline``."""

    text: str
    reply: Reply[SteerResult]
    deadline: float


@frozen
class _SteerNext:
    """A steer that starts the next turn (``turn_id``) once the running one has ended."""

    turn_id: str
    text: str
    reply: Reply[SteerResult]
    mode: SteerMode
    detail: str | None = None


@define
class _CancelJob:
    """One cancel of one turn; every concurrent cancel of that turn waits on it."""

    turn_id: str
    started_at: float
    reason: str | None
    grace_s: float
    escalation: list[str] = field(factory=list)
    dropped: list[DroppedPrompt] = field(factory=list)
    waiters: list[Reply[CancelReceipt]] = field(factory=list)
    deadline: float | None = None
    outcome: str | None = None  # set once the turn is over
    stop_reason: str | None = None
    error: str | None = None
    resumed: bool | None = None
    details: dict[str, Any] = field(factory=dict)
    survivors: list[dict[str, Any]] = field(factory=list)
    session_failed: str | None = None
    queue_kept: bool = False  # the watchdog's cancel leaves the queue; a caller's joining drops it


@define
class _Turn:
    id: str
    text: str
    started_at: float
    started_clock: float  # tree_clock(): tells this turn's processes from the agent's own
    cancel: _CancelJob | None = None
    ran_tools: bool = False  # a tool.call was seen: only then can processes be left behind
    #: steers the agent has not answered yet, by steer id
    steers: dict[int, _NativeSteer] = field(factory=dict)
    #: steers that start the next turns, in order, once this one is over
    then: list[_SteerNext] = field(factory=list)
    # The stall watchdog (only while no cancel runs): when the agent last said something about
    # the turn (``heard``: it did since, the clock not read yet), the tool calls it reported in
    # progress, and the deadline the actor's receive honours (inf: none). The deadline is not
    # moved by every event, only checked when it passes: it then moves to heard_at + the
    # limit, or the turn is stalled.
    heard_at: float = 0.0
    heard: bool = False
    tools: set[str] | None = None
    stall_at: float = math.inf


class _PostBox:
    """The send end of the actor's inbox, as every link and helper task posts to it. It notes
    that something was posted: with :attr:`posted` false (the actor set it so when it found
    the inbox empty, before it waited), the actor has been handed nothing it has not seen, so
    agent output may be handled at once in its pump's step, in order (``Session._take_now``)."""

    __slots__ = ("_channel", "posted")

    def __init__(self, channel: trio.MemorySendChannel[Any]) -> None:
        self._channel = channel
        self.posted = True

    def send_nowait(self, value: Any) -> None:
        self.posted = True
        self._channel.send_nowait(value)

    async def send(self, value: Any) -> None:
        self.posted = True
        await self._channel.send(value)


class Session:
    """One agent session. Create it through :class:`supervisor.Supervisor`."""

    #: where it runs: this machine (a remote one is a ``supervisor.remote.RemoteSession``)
    host: str | None = None

    def __init__(
        self,
        session_id: str,
        spec: AgentSpec,
        *,
        cwd: str,
        launcher: Launcher,
        history_size: int = DEFAULT_HISTORY,
        max_queued: int = DEFAULT_MAX_QUEUED,
        gate: IngestGate | None = None,
        alarms: AlarmClock | None = None,
        resume: str | None = None,
        hold_unacknowledged: bool = False,
    ) -> None:
        self.id = session_id
        self.spec = spec
        self.cwd = cwd
        self._launcher = launcher
        self._max_queued = max_queued
        #: the agent-output allowance this session shares with the others (``ingest.py``)
        self._gate = gate if gate is not None else Unlimited()
        self._task: trio.lowlevel.Task | None = None  # the actor's, once it runs
        #: wakes the actor when its next deadline passes (its waits have no cancel scope):
        #: on its supervisor's clock, or on one of its own
        self._own_clock = alarms is None
        self._alarm = (alarms if alarms is not None else AlarmClock()).alarm(self._wake_actor)
        #: calls, in order; unbounded, never awaited: the actor drains it before every inbox
        #: item (a deque, not a channel: draining an empty one raises nothing)
        self._mailbox: deque[_Call] = deque()
        self._mailbox_open = True
        #: Where the actor waits with nothing half done, so that a call is handled at once in
        #: its caller's step (see ``_ask``): ``"inbox"``, ``"share"`` (for its share of the
        #: ingest allowance or a full subscriber's room); ``""``: it runs, or waits elsewhere.
        self._parked = ""
        #: The alarm rang: inbox items left to take before its deadlines are acted on
        #: (``_posted_by_now``); -1: not counted yet.
        self._late = -1
        #: The run's clock, read straight (``trio.current_time`` looks it up in two calls more:
        #: on a cancel's path, run cold, each call costs): set when the actor starts.
        self._now: Callable[[], float] = trio.current_time
        #: What handling agent output in its pump's step raised (``_take_now``): the actor's.
        self._raise_in_actor: Exception | None = None
        #: The cancel job of a turn being ended, until its waiters have their receipt.
        self._ending: _CancelJob | None = None
        inbox_send, self._inbox = trio.open_memory_channel[Any](_INBOX_SIZE)
        self._inbox_send = _PostBox(inbox_send)
        # Everything below is owned by the actor task.
        self._state = "starting"
        self._nursery: trio.Nursery | None = None
        self._machine: AgentProtocol | None = None
        self._link: AgentLink | None = None
        self._generation = 0
        self._live_generation: int | None = None  # frames from any other one are dropped
        #: the agent's own session id to resume at the next spawn (``resume``: at the first)
        self._resume_from: str | None = resume
        self._turn: _Turn | None = None
        self._queue: deque[tuple[str, str]] = deque()
        #: the queued turns a steer starts (at the queue's front: later steers go after them)
        self._steered: set[str] = set()
        #: ``set_mode`` calls waiting for the agent's answer (``ModeSet``), in the order sent
        self._mode_replies: deque[Reply[None]] = deque()
        #: the content parts of queued prompts that have more than text, by turn id
        self._parts: dict[str, tuple[Part, ...]] = {}
        #: what the agent takes in a prompt natively (``AgentProtocol.carries``): the
        #: protocol's, then what the agent itself said once it was up (ACP)
        protocol = PROTOCOLS.get(spec.protocol)
        self._carries: frozenset[str] = (
            protocol.prompt_carries if protocol is not None else frozenset()
        )
        self._turn_counter = 0
        self._steer_counter = 0
        #: why the agent is to be restarted once the running turn is over (its memory)
        self._recycle_for: str | None = None
        self._memory_restarts = 0  # for its memory, since the last turn that ended by itself
        self._failing = False  # the session is failing: nothing more may start
        self._ended: dict[str, CancelReceipt] = {}
        self._seq = 0
        # The history and the subscribers; a node's sessions keep what their front has not
        # acknowledged, holding the agent back rather than drop it (design/remote.md).
        self._fanout = Fanout(history_size, hold_unacknowledged=hold_unacknowledged)
        self._ready_waiters: list[Reply[None]] = []
        self._stop_waiters: list[Reply[ExitStatus | None]] = []
        self._stop_interrupted = False  # the stop interrupted the running turn
        #: why no new prompt or steer is taken (the supervisor is shutting down); None: they are
        self.closing: str | None = None
        #: kills of agent trees begun (``_kill_live_link``) and not yet done (``_KillDone``)
        self._kills_in_flight = 0
        #: a stop that came while such a kill ran ends with that kill: the steps and survivors
        #: of the kills it waits for (``_kill_done``); None: no stop waits for a kill
        self._stop_after_kill: tuple[list[str], list[dict[str, Any]]] | None = None
        #: a receipt of a turn that ended as the session failed, and its waiters: answered
        #: once the agent that failed to start again is gone (``_kill_done``)
        self._held: tuple[_CancelJob, CancelReceipt] | None = None
        self._stopping = False
        self._start_deadline: float | None = None
        #: the live agent said its process ends (``AgentExiting``): why, and until when we wait
        self._exiting: str | None = None
        self._exit_deadline: float | None = None
        self._establishing = False  # between spawn and SessionEstablished
        self._respawn_after_kill = False  # the kill in flight is for a fresh start
        self._resume_refused: str | None = None  # why the last resume was refused
        self._exits_without_turn = 0  # unexpected exits since a turn last finished
        self._spawned_resume: str | None = None  # the resume the live process was started with
        self._heard_from_live = False  # the live process has written at least one frame
        self._failed_in_a_row = 0  # turns the live agent ended with an error, in a row
        self._recycles = 0
        self._recycle_reason: str | None = None
        self._watchdog = bool(spec.stall_s or spec.tool_stall_s)
        self._done = False
        self._failure: str | None = None  # why the session failed, for later callers
        self.exit_status: ExitStatus | None = None
        # Agent output being worked through (one read's worth), in the actor's own pace.
        self._batch: list[Any] | None = None  # raw lines, frames, or stderr lines
        self._batch_kind = ""  # "lines", "frames" or "stderr"
        self._batch_generation = 0
        self._batch_at = 0
        self._credit = 0  # a share the gate granted, not spent yet
        #: called (from the actor, must not block) when the session is stopped or failed
        self.on_ended: Callable[[], None] | None = None

    # -- public API (any task) ---------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def untouched(self) -> bool:
        """Nobody has used it yet: no subscriber, no prompt ever (its starter's own wait
        aside)."""
        return self._turn_counter == 0 and not self._fanout.subscribed

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the newest event (0 before the first)."""
        return self._seq

    @property
    def turn_id(self) -> str | None:
        return self._turn.id if self._turn is not None else None

    @property
    def agent_session_id(self) -> str | None:
        """The agent's own id of the session (ACP sessionId, Codex thread, Claude session):
        what ``resume=`` takes to go on with it in another process, later."""
        machine = self._machine
        if machine is not None and machine.agent_session_id is not None:
            return machine.agent_session_id
        return self._resume_from

    def summary(self) -> SessionSummary:
        return SessionSummary(
            self.id,
            self.spec.name,
            self._state,
            self.turn_id,
            recycles=self._recycles,
            recycle_reason=self._recycle_reason,
            cwd=self.cwd,
        )

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> TurnHandle:
        """Queue a prompt; returns once the session accepted it (not when the turn ends).

        ``parts``: its content when it is more than text (images, resources, in order;
        ``protocols.content``); ``text`` is then what events and receipts show of it. A part
        the agent cannot take is refused here (:class:`BadRequest`), before anything is sent."""
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("prompt text must be a non-empty string")
        self._check_open()
        check_text("prompt text", text)  # the agent's protocol could not carry it
        parts = tuple(parts)
        if parts:
            if not all(isinstance(part, Part) for part in parts):
                raise BadRequest("prompt parts must be protocols.content.Part")
            check_text("prompt content", parts_text(parts))
        return await self._call(lambda reply: _Prompt(text, parts, reply))

    @property
    def modes(self) -> dict[str, Any] | None:
        """The session's modes as the agent gives them (ACP's ``SessionModeState``), or None
        (the agent has none, or is not running)."""
        return self._machine.modes if self._machine is not None else None

    async def set_mode(self, mode_id: str) -> None:
        """Switch the agent's session to mode ``mode_id`` (one of :attr:`modes`); returns once
        the agent took it (:class:`BadRequest` with its reason if it refused)."""
        if not isinstance(mode_id, str) or not mode_id:
            raise BadRequest("mode_id must be a non-empty string")
        check_text("mode_id", mode_id)
        return await self._call(lambda reply: _SetMode(mode_id, reply))

    @property
    def prompt_carries(self) -> frozenset[str]:
        """What the agent takes in a prompt besides text (``protocols.content``'s words): its
        protocol's, or what the agent advertised when it last started (ACP)."""
        return self._carries

    async def cancel(
        self, *, turn_id: str | None = None, reason: str | None = None
    ) -> CancelReceipt:
        """Stop the current turn (or ``turn_id``); returns only once that turn has ended.
        ``reason`` goes into the receipt (``user`` when not given)."""
        reply: Reply[CancelReceipt] = Reply()
        call = _Cancel(turn_id, REASON_USER if reason is None else reason, reply)
        return await self._ask(call, reply)

    async def steer(self, text: str) -> SteerResult:
        """Redirect the running turn with ``text``: joined to it natively where the agent can
        (``injected``), else the turn is cancelled and ``text`` starts the next one
        (``interrupted``, with the receipt); with no turn running it starts one now
        (``started``), ahead of queued prompts. Returns once the text is on its way: for
        ``interrupted``, once the old turn has ended (terminate-then-respond)."""
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("steer text must be a non-empty string")
        self._check_open()
        check_text("steer text", text)  # the agent's protocol could not carry it
        return await self._call(lambda reply: _Steer(text, reply))

    async def respond_permission(
        self, request_id: str, option_id: str | None = None, *, cancelled: bool = False
    ) -> None:
        if (option_id is None) == (not cancelled):
            raise BadRequest("give exactly one of option_id or cancelled=True")
        check_text("request_id", request_id)
        if option_id is not None:
            check_text("option_id", option_id)
        await self._call(lambda reply: _RespondPermission(request_id, option_id, reply))

    @asynccontextmanager
    async def subscribe(
        self,
        *,
        since_seq: int | None = None,
        max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        stall_s: float | None = None,
    ) -> AsyncIterator[Subscription]:
        """Events from now on (or replayed after ``since_seq``), in order, until you leave.

        A subscriber a full buffer behind is cut off (``lagged``); with ``stall_s`` it holds
        the agent back instead (its output is not read meanwhile) and is cut off only once it
        has taken nothing for ``stall_s`` (see ``supervisor/runtime/fanout.py``)."""
        subscription = await self.open_subscription(
            since_seq=since_seq, max_buffer=max_buffer, stall_s=stall_s
        )
        try:
            yield subscription
        finally:
            subscription.close()

    async def open_subscription(
        self,
        *,
        since_seq: int | None = None,
        max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        stall_s: float | None = None,
        wire: bool = False,
    ) -> Subscription:
        """Like :meth:`subscribe`, for callers that manage the lifetime (call ``close()``).
        ``wire=True``: the subscriber takes the events' JSON (``take_wire``), as the gateway
        sends it, instead of event objects."""
        _check_subscription(since_seq, max_buffer, stall_s)
        subscription: Subscription = await self._call(
            lambda reply: _Subscribe(since_seq, max_buffer, reply, stall_s, wire)
        )
        return subscription

    async def wait_ready(self) -> None:
        """Return once the agent is up and the session takes prompts; raise if it failed."""
        await self._call(_WaitReady)

    async def stop(self) -> ExitStatus | None:
        """End the session: the turn is stopped, the agent exits (or is killed)."""
        if self._done or not self._mailbox_open:  # over, or ending: nothing more to ask
            return self.exit_status
        return await self._call(_Stop)

    def _check_open(self) -> None:
        """No new turn once the owner is shutting down (its turns are being cancelled, and a
        turn started now would be cut off without its end)."""
        if self.closing is not None:
            raise AgentNotRunning(f"session {self.id} takes no new prompts: {self.closing}")

    async def _call(self, make: Callable[[Reply[T]], _Call]) -> T:
        """Post the call ``make`` builds around its answer's slot, and wait for its answer."""
        reply: Reply[T] = Reply()
        return await self._ask(make(reply), reply)

    async def _ask(self, call: _Call, reply: Reply[T]) -> T:
        """Post a call and wait for its answer (``reply``, the call's own).

        A call that finds the actor parked (:attr:`_parked`) and the mailbox empty is handled
        at once, in the caller's own step: the actor's own handler, run while the actor runs
        nothing and holds nothing half done (trio runs one task at a time, and the actor parks
        only between two pieces of work), in the order the mailbox would have given it. So a
        cancel's interrupt goes out in the step that asked for it, not a pass of the run loop
        later, and under load a pass is what every other session's traffic makes long."""
        if not self._mailbox_open:
            raise AgentNotRunning(f"session {self.id} is {self._state}")
        parked = self._parked
        if parked and not self._mailbox:
            # What the call sends the agent is written as this step's last act: the kernel
            # wakes a pipe's reader on its writer's core, to run once the writer sleeps, so
            # work done after a write delays the agent's read by as long (design/actor.md).
            link = self._link if self._live_generation is not None else None
            if link is not None:
                link.hold_writes()
            try:
                self._handle(call)
                if parked == "inbox":
                    self._done_aside()  # it need not wake for this call
                else:
                    self._wake_actor()  # a cancel, a stop: it must not go on waiting for a share
            finally:
                if link is not None:
                    link.release_writes()
        else:
            self._mailbox.append(call)
            self._wake_actor()
        return await reply.wait()

    def _wake_actor(self) -> None:
        """Something came for the actor (a call, a deadline passed): wake it wherever it waits."""
        try:
            self._inbox_send.send_nowait(_WAKE)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # a full inbox means the actor is awake and checks its mailbox next
        self._fanout.wake()  # or held back by a subscriber: it serves the mailbox at once
        if self._task is not None:
            self._gate.wake(self._task)  # or waiting for its share of agent output: at once too

    # -- the actor -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The actor task: runs until the session is stopped (or the caller is cancelled)."""
        self._task = trio.lowlevel.current_task()
        self._now = trio.lowlevel.current_clock().current_time
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._own_clock:
                    nursery.start_soon(self._alarm.clock.run)
                self._spawn()
                task_status.started()
                try:
                    await self._loop()
                except Exception as exc:
                    self._crashed(exc)
                    raise  # for the supervisor to log: one broken session, not all of them
                finally:
                    self._close_mailbox()
                    with trio.CancelScope(shield=True):
                        await self._kill_link_on_exit()
                    nursery.cancel_scope.cancel()
        finally:
            self._done = True
            if self._state not in ("stopped", "failed"):
                self._state = "stopped"
            self._fanout.close()
            self._alarm.close()

    def _crashed(self, exc: Exception) -> None:
        """A bug stopped the actor: the session is failed, and says so, not just stopped."""
        self._failure = f"the session crashed: {exc!r}"
        try:
            self._set_state("failed", self._failure)
        except Exception:  # the bug may be in telling subscribers: the state at least
            self._state = "failed"

    async def _loop(self) -> None:
        while not self._done:
            self._serve_mailbox()
            if self._done:
                return
            if self._alarm.rang:  # a deadline passed (the watchdog's too)
                if self._late < 0:  # first look: what the agent said before it goes first
                    self._late = await self._posted_by_now()
                    continue  # calls that came meanwhile first, as always
                if (self._late == 0 and self._batch is None) or self._holding():
                    self._alarm.rang = False
                    self._late = -1
                    self._on_deadline()
                    continue
            if self._batch is not None:
                if self._holding():
                    await self._hold_back()  # as below: a full subscriber first
                else:
                    await self._work_through_batch()
                continue
            if self._holding():
                # A subscriber asked for backpressure and its buffer is full (or, in a node,
                # the history holds all its front has not acknowledged it may): read no agent
                # output (the agent blocks on its pipe) until it makes room, a call comes in,
                # or it stalls and is cut off. Never while cancelling or stopping: a cancel
                # waits for no one, and a stop must hear the agent go.
                await self._hold_back()
                continue
            self._alarm.set(self._next_deadline())
            item = await self._receive()
            if self._late > 0:
                self._late -= 1
            if self._raise_in_actor is not None:
                raise self._raise_in_actor
            # Calls that came while we waited go before what woke us: a second cancel posted
            # as the agent's answer to the first came in joins it, and shares its receipt.
            self._serve_mailbox()
            if not self._done:
                self._on_inbox(item)

    async def _receive(self) -> Any:
        """The next inbox item. Batching writers (the gateway's) hear of new events when the
        actor is about to wait, so under a flood they send several per socket write: an inbox
        empty for just a moment (the agent's pump is between two posts) does not count."""
        await trio.lowlevel.checkpoint_if_cancelled()
        # Cancelling, the actor waits for the agent's answer at once: spinning here would take
        # the CPU the agent needs to answer (the kernel wakes a pipe's reader on its writer's
        # core), and subscribers hear of the "cancelling" event without a batch to wait for.
        self._parked = "inbox"  # from here to the return, each wait is between two items
        try:
            for _ in range(0 if self._state == "cancelling" else _IDLE_TURNS):
                try:
                    item = self._inbox.receive_nowait()
                except trio.WouldBlock:
                    await trio.lowlevel.checkpoint()  # a turn for the pumps
                    continue
                await trio.lowlevel.cancel_shielded_checkpoint()  # what receive() does
                return item
            self._fanout.flush()
            self._fanout.serialize()  # its own wait: what foreign steps published, if any
            try:
                item = self._inbox.receive_nowait()
            except trio.WouldBlock:
                self._inbox_send.posted = False  # empty, and nothing posted since (_take_now)
                return await self._inbox.receive()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return item
        finally:
            self._parked = ""

    async def _posted_by_now(self) -> int:
        """How many items the inbox holds once the pumps had a few scheduling turns: what the
        agent said by now. A deadline passed; on a loaded loop the alarm's wake-up and a pump
        holding what the agent wrote before it run in the same pass, in either order, so
        those items are taken before the deadline is acted on (``design/actor.md``). Only
        those: an agent that writes on and on cannot put a deadline off."""
        for _ in range(_IDLE_TURNS):
            await trio.lowlevel.checkpoint()
        stats = self._inbox.statistics()
        return stats.current_buffer_used + stats.tasks_waiting_send

    def _holding(self) -> bool:
        return self._state == "running" and not self._stopping and self._fanout.must_wait()

    async def _hold_back(self) -> None:
        """Read no agent output until a full subscriber makes room. The agent is not silent
        meanwhile, we are not listening: the stall watchdog does not count the wait."""
        held_at = self._now()
        turn = self._turn
        if turn is not None and turn.heard:
            turn.heard, turn.heard_at = False, held_at
        self._parked = "share"
        try:
            await self._fanout.wait_for_room()
        finally:
            self._parked = ""
        if turn is not None and turn is self._turn:
            turn.heard_at += self._now() - held_at

    def _serve_mailbox(self) -> None:
        mailbox = self._mailbox
        while mailbox:
            self._handle(mailbox.popleft())

    def _handle(self, call: _Call) -> None:
        try:
            self._on_call(call)
        except SupervisorError as exc:  # the caller's mistake: answered, not logged
            call.reply.fail(exc)
        except Exception as exc:  # a bug must answer the caller, not kill the session
            # The call's kind, not its payload (a prompt may be megabytes, and the user's).
            log.exception("session %s: error handling %s", self.id, type(call).__name__)
            call.reply.fail(exc)

    def _close_mailbox(self) -> None:
        self._mailbox_open = False
        why = f": {self._failure}" if self._state == "failed" and self._failure else ""
        while self._mailbox:
            call = self._mailbox.popleft()
            if isinstance(call, _Stop):
                call.reply.resolve(self.exit_status)  # what it asked for is done
            else:
                call.reply.fail(AgentNotRunning(f"session {self.id} is {self._state}{why}"))
        exc = AgentNotRunning(f"session {self.id} is {self._state}{why}")
        for waiter in self._ready_waiters:
            waiter.fail(exc)
        self._ready_waiters.clear()
        while self._mode_replies:
            self._mode_replies.popleft().fail(exc)
        if self._held is not None:  # the actor ends before that kill is done: answered now
            held, receipt = self._held
            for cancel_waiter in held.waiters:
                cancel_waiter.resolve(receipt)
        for job in (self._turn.cancel if self._turn is not None else None, self._ending):
            if job is not None:
                for cancel_waiter in job.waiters:
                    cancel_waiter.fail(exc)  # no-op for one already answered

    def _next_deadline(self) -> float:
        """When the actor must next act though nothing comes (inf: never): a cancel's grace,
        the start's timeout, a steer's answer, an exit that should come, or the stall
        watchdog's limit, once the time the agent was last heard from is written down."""
        deadline = math.inf
        turn = self._turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                if job.deadline is not None:
                    deadline = job.deadline
            elif turn.stall_at != math.inf:
                if turn.heard:
                    turn.heard = False
                    turn.heard_at = self._now()
                deadline = turn.stall_at
            if turn.steers:
                deadline = min(deadline, *(s.deadline for s in turn.steers.values()))
        if self._start_deadline is not None:
            deadline = min(deadline, self._start_deadline)
        if self._exit_deadline is not None:
            deadline = min(deadline, self._exit_deadline)
        return deadline

    def _on_deadline(self) -> None:
        now = self._now()
        if self._start_deadline is not None and now >= self._start_deadline:
            self._start_deadline = None
            self._start_failed(
                f"agent did not finish its handshake in {self.spec.start_timeout_s} s"
            )
        turn = self._turn
        if turn is not None and turn.cancel is not None and turn.cancel.deadline is not None:
            if now >= turn.cancel.deadline:
                self._grace_expired(turn, turn.cancel)
        if turn is not None and turn is self._turn:
            for steer_id, pending in list(turn.steers.items()):
                if now >= pending.deadline and steer_id in turn.steers:
                    self._steer_timed_out(turn, steer_id)
        if self._exit_deadline is not None and now >= self._exit_deadline:
            self._exit_overdue()
        turn = self._turn
        if turn is not None and turn.cancel is None and now >= turn.stall_at:
            self._stall_check()

    # -- mailbox calls ------------------------------------------------------------------------

    def _on_call(self, call: _Call) -> None:
        if call.__class__ is _Cancel:  # first: a stop is what must never wait
            if self._state in ("stopped", "failed"):
                call.reply.fail(AgentNotRunning(f"session {self.id} is {self._state}"))
            else:
                self._cancel(call)  # stopping: answered once the turn has ended with the agent
            return
        if isinstance(call, _Subscribe):
            if call.since_seq is not None and call.since_seq > self._seq:
                # Not this session's history: the one followed before a restart, say (local
                # ids start again at s1). Said, never a silent stream from elsewhere.
                raise BadRequest(
                    f"since_seq {call.since_seq} is beyond session {self.id}'s newest event"
                    f" ({self._seq}): not the session those events came from"
                )
            call.reply.resolve(
                self._fanout.subscribe(
                    call.since_seq,
                    head_seq=self._seq,
                    max_buffer=call.max_buffer,
                    stall_s=call.stall_s,
                    wire=call.wire,
                )
            )
        elif isinstance(call, _WaitReady):
            if self._state in ("stopped", "failed"):
                why = f": {self._failure}" if self._failure else ""  # the spawn error, say
                call.reply.fail(AgentNotRunning(f"session {self.id} is {self._state}{why}"))
            elif self._state == "starting" or (self._stopping and self._state != "stopped"):
                self._ready_waiters.append(call.reply)
            else:
                call.reply.resolve(None)
        elif isinstance(call, _Stop):
            self._stop(call.reply)  # joins a stop under way; ends a failed session's actor
        elif self._state in ("stopped", "failed"):
            call.reply.fail(AgentNotRunning(f"session {self.id} is {self._state}"))
        elif self._stopping:
            call.reply.fail(AgentNotRunning(f"session {self.id} is stopping"))
        elif isinstance(call, _Prompt):
            call.reply.resolve(self._accept_prompt(call.text, call.parts))
        elif isinstance(call, _Steer):
            self._steer(call)
        elif isinstance(call, _RespondPermission):
            self._respond_permission(call)
        elif isinstance(call, _SetMode):
            self._set_mode(call)

    def _set_mode(self, call: _SetMode) -> None:
        machine = self._machine
        if machine is None or self._state == "starting" or self._establishing:
            # Its agent is (re)starting: what modes it offers is known once it is up.
            raise AgentNotRunning(
                f"session {self.id} is {self._state}: its agent is not up yet (try again once"
                " it is ready)"
            )
        modes = machine.modes
        if modes is None:
            raise BadRequest(f"agent {self.spec.name!r} offers no session modes")
        known = [m.get("id") for m in modes.get("availableModes", [])]
        if call.mode_id not in known:
            raise BadRequest(f"unknown mode {call.mode_id!r} (known: {', '.join(map(str, known))})")
        step = machine.set_mode(call.mode_id)
        self._mode_replies.append(call.reply)
        self._apply(step)

    def _mode_set(self, answer: ModeSet) -> None:
        if not self._mode_replies:
            return
        reply = self._mode_replies.popleft()
        if answer.error is None:
            reply.resolve(None)
        else:
            reply.fail(BadRequest(f"the agent refused mode {answer.mode_id!r}: {answer.error}"))

    def _accept_prompt(self, text: str, parts: tuple[Part, ...] = ()) -> TurnHandle:
        if len(self._queue) >= self._max_queued:
            raise BadRequest(f"too many queued prompts (at most {self._max_queued})")
        why = refusal(parts, self._carries, f"agent {self.spec.name!r}")
        if why is not None:
            raise BadRequest(why)
        self._turn_counter += 1
        turn_id = f"t{self._turn_counter}"
        if parts:
            self._parts[turn_id] = parts
        if self._state == "ready" and self._turn is None:
            self._start_turn(turn_id, text)
            return TurnHandle(turn_id, queued=False)
        self._queue.append((turn_id, text))
        return TurnHandle(turn_id, queued=True)

    def _start_turn(self, turn_id: str, text: str) -> None:
        assert self._machine is not None
        parts = self._parts.pop(turn_id, ())
        # A part the agent restarted since cannot take any more is written as its text.
        step = (
            self._machine.prompt(turn_id, text, parts)
            if parts
            else self._machine.prompt(turn_id, text)
        )
        # The prompt is handed to the agent first: if that fails, no turn was announced (and
        # the session is not left ``running`` a turn the agent never got).
        try:
            self._deliver(step)
        except Exception:
            # The machine now holds a turn the agent never got: the two no longer agree. The
            # one state both agree on again is a fresh agent, the session resumed.
            self._recycle("a prompt could not be handed to the agent")
            raise
        now = self._now()
        self._turn = turn = _Turn(turn_id, text, now, tree_clock(), heard_at=now)
        if self.spec.stall_s:
            turn.stall_at = now + self.spec.stall_s
        self._set_state("running")
        self._emit(ev.TurnStarted(turn_id=turn_id, text=text))
        self._apply_events(step)

    def _start_next(self) -> None:
        if self._state == "ready" and self._turn is None and self._queue:
            turn_id, text = self._queue.popleft()
            self._steered.discard(turn_id)
            try:
                self._start_turn(turn_id, text)
            except Exception as exc:  # its caller was answered when it queued: tell everyone
                log.exception(
                    "session %s: prompt %s could not be handed to the agent", self.id, turn_id
                )
                failed = CancelReceipt(session_id=self.id, turn_id=turn_id, outcome="failed")
                self._remember(turn_id, failed)  # a cancel naming it later learns how it ended
                self._emit(
                    ev.TurnEnded(
                        turn_id=turn_id,
                        outcome="failed",
                        error=f"the prompt could not be handed to the agent: {exc!r}",
                    )
                )

    def _cancel(self, call: _Cancel) -> None:
        turn = self._turn
        now = self._now()
        if call.turn_id is not None and (turn is None or turn.id != call.turn_id):
            call.reply.resolve(self._cancel_other_turn(call))
            return
        if turn is None:
            dropped = self._drop_queue(call.reason)
            call.reply.resolve(
                CancelReceipt(
                    session_id=self.id,
                    turn_id=None,
                    outcome="no_active_turn",
                    dropped_prompts=dropped,
                    reason=call.reason,
                )
            )
            return
        steers = self._drop_steers(turn, call.reason) if turn.steers or turn.then else []
        if turn.cancel is not None:
            job = turn.cancel
            job.dropped.extend(steers)
            job.waiters.append(call.reply)  # concurrent cancels share one receipt
            # What was queued since the job began (the watchdog's job kept the queue; a kill
            # takes long enough for the next prompt to come) is what this caller stops too.
            job.queue_kept = False
            job.dropped.extend(self._drop_queue(call.reason))
            return
        if self._stopping:
            # The stop already interrupted the turn and closes the agent: the receipt says
            # what that took, once the turn has ended with it (_closed).
            job = _CancelJob(turn.id, now, call.reason, self.spec.grace_s, waiters=[call.reply])
            if self._stop_interrupted:
                job.escalation.append("interrupt")
            job.dropped.extend(steers)
            turn.cancel = job
            return
        self._begin_cancel(turn, now, call.reason, [call.reply])
        if steers and turn.cancel is not None:
            turn.cancel.dropped[:0] = steers

    def _drop_steers(self, turn: _Turn, reason: str | None) -> list[DroppedPrompt]:
        """A caller stops the turn: the steers it has not taken yet (waiting for the agent's
        answer, or to start once the turn has made way) are dropped with it, as queued prompts
        are, each its turn id and its one ``turn.ended``; their callers hear it at once."""
        pending: list[tuple[str | None, _NativeSteer | _SteerNext]] = [
            (None, steer) for steer in turn.steers.values()
        ]
        pending += [(steer.turn_id, steer) for steer in turn.then]
        turn.steers.clear()
        turn.then = []
        dropped = []
        for turn_id, steer in pending:
            if turn_id is None:
                self._turn_counter += 1
                turn_id = f"t{self._turn_counter}"
            self._emit(
                ev.TurnSteered(
                    turn_id=turn_id,
                    mode="interrupted",
                    text=steer.text,
                    interrupted_turn_id=turn.id,
                )
            )
            prompt = DroppedPrompt(turn_id, steer.text)
            self._drop(prompt, reason)
            dropped.append(prompt)
            steer.reply.resolve(
                SteerResult(
                    session_id=self.id,
                    mode="interrupted",
                    turn_id=turn_id,
                    detail="dropped: the turn it steered was stopped, and the text with it",
                )
            )
        return dropped

    def _begin_cancel(
        self,
        turn: _Turn,
        now: float,
        reason: str | None,
        waiters: list[Reply[CancelReceipt]],
        *,
        keep_queue: bool = False,
        detail: str | None = None,
    ) -> None:
        """A cancel of the running turn, for a caller (``waiters``) or the watchdog (none)."""
        assert self._machine is not None
        # At once and without awaiting any reply: interrupt, answer permissions, drop queue.
        job = _CancelJob(turn.id, now, reason, self.spec.grace_s, ["interrupt"], waiters=waiters)
        job.queue_kept = keep_queue
        turn.cancel = job
        step = self._machine.cancel()
        if self._machine.pending_permissions:
            step.extend(self._machine.cancel_permissions())
            job.escalation.append("permissions_cancelled")
        job.deadline = now + job.grace_s
        self._deliver(step)  # first (in a caller's step, written at its end: see _ask)
        if not keep_queue and self._queue:
            job.dropped = self._drop_queue(reason)
        self._set_state("cancelling", detail)
        if step.events:
            self._apply_events(step)
        if job.grace_s <= 0 and turn.cancel is job and self._turn is turn:
            # No grace: no answer to the interrupt can come in time, so the kill does not race
            # one. (At the deadline's first look the actor reads what came before it: on a
            # loaded machine an answer already in the pipe would be read first and spared.)
            self._grace_expired(turn, job)

    # -- steering ------------------------------------------------------------------------------

    def _steer(self, call: _Steer) -> None:
        turn = self._turn
        if turn is None:
            self._steer_starts(call.text, call.reply, "started")
            return
        if turn.cancel is not None:
            # Already on its way out: the text starts the next turn once it has ended.
            self._steer_after(turn, call.text, call.reply, "interrupted")
            return
        machine = self._machine
        if machine is not None and machine.can_steer and self._live_generation is not None:
            self._steer_counter += 1
            steer_id = self._steer_counter
            deadline = self._now() + self.spec.grace_s
            turn.steers[steer_id] = _NativeSteer(call.text, call.reply, deadline)
            self._apply(machine.steer(turn.id, steer_id, call.text))
            return
        self._steer_interrupts(turn, call.text, call.reply)

    def _steer_starts(
        self, text: str, reply: Reply[SteerResult], mode: SteerMode, detail: str | None = None
    ) -> None:
        """The text starts a turn: now if the session is ready, else first in the queue (after
        the steers queued before it: they go first, in the order they came)."""
        self._turn_counter += 1
        turn_id = f"t{self._turn_counter}"
        ahead = 0
        for queued_id, _ in self._queue:
            if queued_id not in self._steered:
                break
            ahead += 1
        self._queue.insert(ahead, (turn_id, text))
        self._steered.add(turn_id)
        self._emit(ev.TurnSteered(turn_id=turn_id, mode=mode, text=text))
        reply.resolve(SteerResult(session_id=self.id, mode=mode, turn_id=turn_id, detail=detail))
        self._start_next()

    def _steer_after(
        self,
        turn: _Turn,
        text: str,
        reply: Reply[SteerResult],
        mode: SteerMode,
        detail: str | None = None,
    ) -> None:
        """The text starts the turn after ``turn``, once that has ended (:meth:`_end_turn`)."""
        self._turn_counter += 1
        turn.then.append(_SteerNext(f"t{self._turn_counter}", text, reply, mode, detail))

    def _steer_interrupts(
        self, turn: _Turn, text: str, reply: Reply[SteerResult], detail: str | None = None
    ) -> None:
        """The agent cannot take the text into its turn: the turn makes way, the whole ladder,
        and the text goes first once it is over."""
        self._begin_cancel(turn, self._now(), REASON_STEER, [], keep_queue=True)
        self._steer_after(turn, text, reply, "interrupted", detail)

    def _steer_answered(self, answer: SteerAnswered) -> None:
        turn = self._turn
        if turn is None or turn.id != answer.turn_id:
            return  # its turn ended first, and the text went to the next one then
        pending = turn.steers.pop(answer.steer_id, None)
        if pending is None:
            return
        if answer.injected:
            self._emit(ev.TurnSteered(turn_id=turn.id, mode="injected", text=pending.text))
            pending.reply.resolve(SteerResult(session_id=self.id, mode="injected", turn_id=turn.id))
        elif turn.cancel is not None:
            self._steer_after(turn, pending.text, pending.reply, "interrupted", answer.detail)
        elif answer.no_turn:
            # The agent's turn is over and ours ends with its answer, which is on its way: the
            # text starts the turn after it.
            self._steer_after(turn, pending.text, pending.reply, "started", answer.detail)
        else:
            self._steer_interrupts(turn, pending.text, pending.reply, answer.detail)

    def _steer_timed_out(self, turn: _Turn, steer_id: int) -> None:
        pending = turn.steers.pop(steer_id)
        detail = f"the agent did not answer the steer in {self.spec.grace_s:g} s"
        if self._machine is not None and self._live_generation is not None:
            self._deliver(self._machine.abandon_steer(steer_id))
        if turn.cancel is not None:
            self._steer_after(turn, pending.text, pending.reply, "interrupted", detail)
        else:
            self._steer_interrupts(turn, pending.text, pending.reply, detail)

    def _cancel_other_turn(self, call: _Cancel) -> CancelReceipt:
        """A cancel naming a turn that is not running: queued, ended, or unknown."""
        assert call.turn_id is not None
        for index, (turn_id, text) in enumerate(self._queue):
            if turn_id == call.turn_id:
                del self._queue[index]
                self._steered.discard(turn_id)
                return self._drop(DroppedPrompt(turn_id, text), call.reason)
        ended = self._ended.get(call.turn_id)
        if ended is None:
            raise BadRequest(f"unknown turn {call.turn_id!r} in session {self.id}")
        return ended

    def _drop_queue(self, reason: str | None) -> list[DroppedPrompt]:
        if not self._queue:
            return []
        dropped = [DroppedPrompt(turn_id, text) for turn_id, text in self._queue]
        self._queue.clear()
        self._steered.clear()
        for prompt in dropped:
            self._drop(prompt, reason)
        return dropped

    def _drop(self, prompt: DroppedPrompt, reason: str | None) -> CancelReceipt:
        """A queued prompt that will never run: its own receipt, its one ``turn.ended``."""
        self._parts.pop(prompt.turn_id, None)
        receipt = CancelReceipt(
            session_id=self.id,
            turn_id=prompt.turn_id,
            outcome="cancelled",
            stop_reason="dropped",
            dropped_prompts=[prompt],
            reason=reason,
        )
        self._remember(prompt.turn_id, receipt)
        self._emit(
            ev.TurnEnded(
                turn_id=prompt.turn_id,
                outcome="cancelled",
                stop_reason="dropped",
                receipt=receipt_to_wire(receipt),
                reason=reason,
            )
        )
        return receipt

    def _respond_permission(self, call: _RespondPermission) -> None:
        if self._machine is None:
            raise BadRequest(f"no pending permission request {call.request_id!r}")
        try:
            step = self._machine.respond_permission(call.request_id, call.option_id)
        except UnknownPermission as exc:
            raise BadRequest(str(exc)) from None
        self._apply(step)
        call.reply.resolve(None)

    def _stop(self, reply: Reply[ExitStatus | None]) -> None:
        if self._state == "stopped":
            reply.resolve(self.exit_status)
            return
        self._stop_waiters.append(reply)
        if self._stopping:
            return
        self._stopping = True
        if self._state == "failed":
            # Nothing runs any more but maybe the kill of its last agent: once that is done,
            # the actor ends (and its owner forgets the session).
            if not self._kills_in_flight:
                self._end_failed()
            return
        self._start_deadline = None
        self._exit_deadline = None
        self._drop_queue("session_stopped")
        turn = self._turn
        if turn is not None:
            # The turn ends with the agent: when the close (and maybe the ladder) is done.
            machine = self._machine
            if machine is not None and self._live_generation is not None:
                step = machine.cancel()
                self._stop_interrupted = True
                if machine.pending_permissions:  # answered, and the clients told, as a cancel
                    step.extend(machine.cancel_permissions())
                self._apply(step)
            if turn.cancel is not None:
                turn.cancel.deadline = None
        if self._machine is not None and self._live_generation is not None:
            self._apply(self._machine.close())  # before its stdin closes (ACP session/close)
        link = self._link
        self._live_generation = None
        self._link = None
        self._drop_machine()
        if link is None and self._kills_in_flight:
            # The agent's tree is being killed (a cancel's ladder, a recycle): the stop ends,
            # and its turn with it, once that kill is done, with what it took (_kill_done).
            self._stop_after_kill = ([], [])
            return
        assert self._nursery is not None
        self._nursery.start_soon(self._close_task, link)

    # -- inbox ---------------------------------------------------------------------------------

    def _on_inbox(self, item: Any) -> None:
        if isinstance(item, _Wake):
            return
        if isinstance(item, AgentLines):
            self._start_batch(item.generation, "lines", item.lines)
        elif isinstance(item, AgentStderrLines):
            self._start_batch(item.generation, "stderr", item.lines)
        elif isinstance(item, AgentFrame):
            self._start_batch(item.generation, "frames", [item.frame])
        elif isinstance(item, AgentGone):
            if item.generation == self._live_generation:
                self._agent_gone(item)
        elif isinstance(item, _Spawned):
            self._spawned(item)
        elif isinstance(item, _SpawnFailed):
            if item.generation == self._generation and not self._stopping:
                self._start_failed(item.message)
        elif isinstance(item, _KillDone):
            self._kill_done(item)
        elif isinstance(item, _Closed):
            self._closed(item)
        elif isinstance(item, _Swept):
            self._swept(item)
        elif isinstance(item, _MemoryOver):
            self._memory_over(item)

    # -- agent output, a share at a time --------------------------------------------------------

    def _start_batch(self, generation: int, kind: str, lines: list[Any]) -> None:
        if generation == self._live_generation and lines:
            self._batch, self._batch_kind = lines, kind
            self._batch_generation, self._batch_at = generation, 0

    def _urgent(self) -> bool:
        """Work that waits for no share: a cancel in progress, a start, a stop."""
        return self._state in _URGENT_STATES or self._establishing or self._stopping

    def _take_now(self, item: AgentLines | AgentFrame) -> bool:
        """Offered by the live link's pump each item of agent output before it posts it:
        urgent output (a cancel's answer, a start's, a stop's) is handled at once, in the
        pump's own step, when the actor waits for its inbox with nothing before it; what the
        actor's next step would have done with it, a pass of the run loop sooner (as a call
        to a parked actor is, ``_ask``). Under load that pass is long. Else False: the pump
        posts it. Output that may wait for its share always goes through the inbox."""
        if (
            self._parked != "inbox"
            or self._mailbox
            or self._batch is not None
            or self._alarm.rang
            or item.generation != self._live_generation
            # not urgent (_urgent, spelled out: this is a cancel's cold path)
            or not (self._state in _URGENT_STATES or self._establishing or self._stopping)
            or self._inbox_send.posted  # it has something before this, or may have
        ):
            return False
        link = self._link  # its writes held to the step's end, as a call's are (_ask)
        if link is not None:
            link.hold_writes()
        try:
            try:
                if item.__class__ is AgentLines and len(item.lines) == 1:
                    # One line (an answer, as a cancel's is): what the batch would do with it,
                    # without making it one. Here it runs cold, and every layer costs.
                    line = item.lines[0]
                    if isinstance(line, FramingError):
                        self._gate.charge(1)
                        self._on_frame(line)
                    else:
                        self._gate.charge(1 + len(line) // BYTES_PER_UNIT)  # (cost_of)
                        frame = decode_line(line)
                        if frame is not None:
                            self._on_frame(frame)
                else:
                    self._on_inbox(item)
                    lines = self._batch
                    if lines is not None:
                        self._work_through(lines, len(lines) - self._batch_at, True)
            except Exception as exc:  # raised in the actor, as if it had handled the item
                self._raise_in_actor = exc
                self._wake_actor()
                return True
            if self._batch is not None:
                self._wake_actor()  # left for the actor (the agent was replaced meanwhile, say)
            else:
                self._done_aside()
            return True
        finally:
            if link is not None:
                link.release_writes()

    def _done_aside(self) -> None:
        """After the actor's work was done in another task's step while it waits for its
        inbox: what it would do before waiting again, its deadlines rearmed and the
        subscribers' writers told of the new events."""
        self._alarm.set(self._next_deadline())
        self._fanout.flush()

    async def _work_through_batch(self) -> None:
        """Handle as much of the current batch as the gate allows now (all of it when the work
        is urgent), waiting for a share when there is none left this pass."""
        lines = self._batch
        assert lines is not None
        if self._batch_generation != self._live_generation:
            self._batch = None  # a killed predecessor's: dropped like its frames always were
            return
        want = len(lines) - self._batch_at
        urgent = self._urgent()
        if urgent:
            allowed = want
        elif self._credit:
            allowed, self._credit = self._credit, 0
        else:
            allowed = self._gate.take(want)
        if not allowed:
            # Granted or woken, the mailbox comes first (a call may have come meanwhile): the
            # share is kept for after it.
            self._parked = "share"
            try:
                self._credit = await self._gate.acquire(want)
            finally:
                self._parked = ""
            return
        self._work_through(lines, allowed, urgent)

    def _work_through(self, lines: list[Any], allowed: int, urgent: bool) -> None:
        """Handle the batch's next ``allowed`` units (``urgent``: charged, never asked for)."""
        kind = self._batch_kind
        if kind == "lines":
            spent = self._work_through_lines(lines, allowed)
        elif kind == "frames":
            spent = self._one_by_one(lines, allowed, self._on_frame)
        else:
            spent = self._one_by_one(lines, allowed, self._on_stderr_line)
        # What was done, against what was taken: a big line may take more than the share; a
        # batch that ended early gives the rest back.
        self._gate.charge(spent if urgent else spent - allowed)
        if self._batch is lines and self._batch_at >= len(lines):
            self._batch = None

    def _on_stderr_line(self, line: str) -> None:
        self._emit(ev.AgentStderr(line=line))

    def _on_line(self, line: bytes | FramingError) -> None:
        frame = line if isinstance(line, FramingError) else decode_line(line)
        if frame is not None:
            self._on_frame(frame)

    def _one_by_one(self, lines: list[Any], allowed: int, handle: Callable[[Any], None]) -> int:
        """Handle items of the batch from ``_batch_at`` on, one at a time, as many as
        ``allowed`` units pay for (the first always); returns the units spent."""
        spent = 0
        while self._batch is lines and self._batch_at < len(lines):
            if self._batch_generation != self._live_generation or self._done:
                break
            line = lines[self._batch_at]
            cost = cost_of(len(line)) if isinstance(line, (bytes, str)) else 1
            if spent and spent + cost > allowed:
                break
            self._batch_at += 1
            spent += cost
            handle(line)
        return spent

    def _work_through_lines(self, lines: list[Any], allowed: int) -> int:
        """Handle the agent's lines from ``_batch_at`` on, as many as ``allowed`` units pay for
        (the first always), a run at a time: decoded in one call, fed to the machine in one
        call (:meth:`~protocols.machine.AgentProtocol.receive_many`) up to whatever it must
        react to, and what that produced emitted at once. The same frames, events and order as
        a line at a time. Returns the units spent."""
        start = self._batch_at
        take, spent = _share(lines, start, allowed)
        machine = self._machine
        hot = machine.hot_decoder if machine is not None else None
        decoded = decode_lines(lines[start : start + take], hot=hot)
        if len(decoded) != take:  # a blank line (never from a LineDecoder): one at a time
            return self._one_by_one(lines, allowed, self._on_line)
        self._heard_from_live = True
        generation = self._live_generation
        if FramingError not in set(map(type, decoded)):  # all messages: told in C
            done = self._feed_run(decoded, 0, take, lines, generation)
        else:
            done = 0
            while done < take:
                item = decoded[done]
                if isinstance(item, FramingError):
                    self._on_frame(item)
                    done += 1
                else:
                    end = done + 1
                    while end < take and not isinstance(decoded[end], FramingError):
                        end += 1
                    done = self._feed_run(decoded, done, end, lines, generation)
                    if done < end:
                        break
                if not self._still_reading(lines, generation):
                    break
        self._batch_at = start + done
        return spent if done == take else _share(lines, start, allowed, count=done)[1]

    def _feed_run(
        self, payloads: list[Any], at: int, end: int, lines: list[Any], generation: int | None
    ) -> int:
        """Feed ``payloads[at:end]`` (messages) to the machine, acting on each step it hands
        back, until the run is done or the batch may not go on; the index reached."""
        run = payloads[at:end] if at or end < len(payloads) else payloads
        done = 0
        count = len(run)
        while done < count:
            machine = self._machine
            assert machine is not None
            try:
                step, used = machine.receive_many(run, done)
            except PartialStep as failure:
                self._apply(failure.step)
                message = _as_raw(run[failure.failed])
                log.error(
                    "session %s: protocol machine failed on %r",
                    self.id,
                    message,
                    exc_info=failure.__cause__,
                )
                self._emit(ev.AgentUnparsed(raw=message))
                used = failure.consumed + 1
            except Exception:  # a machine without the PartialStep contract: one message
                log.exception("session %s: protocol machine failed on %r", self.id, run[done])
                self._emit(ev.AgentUnparsed(raw=_as_raw(run[done])))
                used = 1
            else:
                self._apply(step)
            done += used
            if not self._still_reading(lines, generation):
                break
        return at + done

    def _still_reading(self, lines: list[Any], generation: int | None) -> bool:
        """The batch goes on: it is still the current one, its agent the live one."""
        return self._batch is lines and self._live_generation == generation and not self._done

    def _on_frame(self, frame: Frame) -> None:
        self._heard_from_live = True
        if isinstance(frame, FramingError):
            self._emit(
                ev.ErrorEvent(
                    code=f"agent_{frame.kind}",
                    message=f"agent wrote a bad line ({frame.detail}, {frame.size} bytes):"
                    f" {frame.excerpt!r}",
                )
            )
            return
        assert isinstance(frame, Message) and self._machine is not None
        try:
            step = self._machine.receive(frame.payload)
        except Exception:
            log.exception("session %s: protocol machine failed on %r", self.id, frame.payload)
            self._emit(ev.AgentUnparsed(raw=frame.payload))
            return
        if step.send or step.signals:  # (what _apply does: a cancel's answer comes this way)
            self._deliver(step)
        self._apply_events(step)

    def _apply(self, step: Step) -> None:
        """Send what the machine wants sent, then act on what it says happened."""
        self._deliver(step)
        self._apply_events(step)

    def _deliver(self, step: Step) -> None:
        if self._link is not None and self._live_generation is not None:
            for message in step.send:
                self._link.send(message)
            for signum in step.signals:
                self._link.signal(signum)

    def _apply_events(self, step: Step) -> None:
        events = step.events
        if not events:
            return
        if len(events) == 1 and isinstance(events[0], Control):  # a cancel's answer, say
            self._on_control(events[0])
            return
        if not any(map(_is_control, set(map(type, events)))):
            self._emit_many(events)  # type: ignore[arg-type]  # no Control among them
            return
        plain: list[ev.Event] = []
        for output in events:
            if isinstance(output, Control):
                if plain:
                    self._emit_many(plain)
                    plain = []
                self._on_control(output)
            else:
                plain.append(output)
        if plain:
            self._emit_many(plain)

    def _on_control(self, control: Control) -> None:
        if isinstance(control, TurnFinished):  # first: a cancel's answer is one
            self._turn_finished(control)
        elif isinstance(control, SessionEstablished):
            self._established(control)
        elif isinstance(control, StartFailed):
            if control.resume_failed and self._resume_from is not None:
                self._start_fresh(control.message)
            else:
                self._start_failed(control.message)
        elif isinstance(control, SteerAnswered):
            self._steer_answered(control)
        elif isinstance(control, ModeSet):
            self._mode_set(control)
        elif isinstance(control, AgentExiting):
            self._agent_exiting(control)

    # -- the stall watchdog ----------------------------------------------------------------------

    def _heard(self, turn: _Turn, event: ev.Event) -> None:
        """The agent said something about the running turn (one of ``_TURN_EVENTS``): it is
        not silent, and what it says of its tool calls decides which limit applies."""
        if isinstance(event, ev.ToolCall):
            turn.ran_tools = True
        if not self._watchdog:
            return
        if type(event) in _STREAM_EVENTS or (
            isinstance(event, ev.ToolUpdate) and event.status is None
        ):
            # The stream (a tool's output too): no clock, no deadline moved, the hot path. The
            # time is read once before the actor's next receive (``_next_deadline``), the deadline
            # looked at when it passes.
            turn.heard = True
            return
        turn.heard_at = self._now()
        turn.heard = False
        if isinstance(event, ev.ToolCall | ev.ToolUpdate):
            if event.turn_id is not None and event.turn_id != turn.id:
                return  # a late word about an earlier turn's tool
            if event.status in _TOOL_DONE:
                if not turn.tools or event.tool_call_id not in turn.tools:
                    return  # nothing changes
                turn.tools.discard(event.tool_call_id)
            else:  # started, or said to be in progress
                if turn.tools is None:
                    turn.tools = set()
                turn.tools.add(event.tool_call_id)
        if turn.cancel is None:
            turn.stall_at = self._stall_due(turn)  # the limit may have changed (or ended)

    def _stall_due(self, turn: _Turn) -> float:
        """When the running turn is stalled if the agent says nothing more (inf: never)."""
        if self._state != "running" or self._stopping or self._machine is None:
            return math.inf
        if self._machine.pending_permissions:
            return math.inf  # it waits on a person, not on the agent; the answer re-arms
        limit = self.spec.tool_stall_s if turn.tools else self.spec.stall_s
        return turn.heard_at + limit if limit else math.inf

    def _stall_check(self) -> None:
        """The watchdog's deadline passed: the turn is stalled, or the deadline moves on."""
        turn = self._turn
        if turn is None or turn.cancel is not None:
            return
        now = self._now()
        if turn.heard:
            turn.heard, turn.heard_at = False, now
        turn.stall_at = self._stall_due(turn)
        if turn.stall_at > now:
            return  # heard from since (or waiting on a person, or a tool runs): not yet
        turn.stall_at = math.inf
        limit = self.spec.tool_stall_s if turn.tools else self.spec.stall_s
        assert limit
        silent = now - turn.heard_at
        self._emit(
            ev.TurnStalled(
                turn_id=turn.id,
                silent_s=round(silent, 3),
                stall_s=limit,
                tool_calls=sorted(turn.tools or ()),
            )
        )
        # The same ladder as a caller's cancel; queued prompts stay: the user queued them
        # behind this turn, and it is not the user who gave up on it.
        self._begin_cancel(
            turn,
            now,
            REASON_STALLED,
            [],
            keep_queue=True,
            detail=f"stalled: nothing from the agent for {silent:.1f} s (stall_s {limit:g}):"
            " cancelling the turn",
        )

    # -- turn endings --------------------------------------------------------------------------

    def _turn_finished(self, finished: TurnFinished) -> None:
        turn = self._turn
        if turn is None or turn.id != finished.turn_id:
            return
        self._exits_without_turn = 0
        job = turn.cancel
        if job is None:
            self._memory_restarts = 0
            # Nobody here asked it to stop; but a person may have stopped it inside the agent
            # (Codex's "decline and stop the turn"), and then the agent says so.
            if finished.error is not None:
                outcome_ = "failed"
            elif finished.interrupted is True:
                outcome_ = "cancelled"
            else:
                outcome_ = "completed"
            self._end_turn(turn, outcome_, finished.stop_reason, error=finished.error)
            self._failed_in_a_row = self._failed_in_a_row + 1 if outcome_ == "failed" else 0
            limit = self.spec.max_failed_turns
            if limit and self._failed_in_a_row >= limit:
                self._recycle_failing(finished.error or "failed")
                return
            if self._exiting is not None:
                # Its process ends with the turn (Amp after an error): the next prompt waits
                # for the next process.
                self._set_state("starting", f"the agent is exiting ({self._exiting})")
                return
            self._set_state("ready")
            self._start_next()
            return
        self._failed_in_a_row = 0
        # We asked it to stop. Agents answer a cancelled turn with end_turn (opencode), so
        # only the agent's own positive "I finished by myself" makes it "completed".
        finished_itself = finished.interrupted is False and finished.error is None
        job.outcome = "completed" if finished_itself else "cancelled"
        job.stop_reason = finished.stop_reason
        job.details.update(finished.details)
        if finished.error is not None and job.stop_reason is None:
            job.stop_reason = "error"
        job.error = finished.error
        if self._exiting is not None:
            # The turn is over but its process is not (Amp ends its run on the SIGINT that
            # stopped it): the receipt waits until it is gone and a new one runs, within the
            # grace timer, which stays set. The exit takes the process's tree with it.
            self._set_state("cancelling", f"the agent is exiting ({self._exiting})")
            return
        if self._link is not None and self._link.leader_exited:
            # Its shim died (killed, OOM) before the answer was taken: the tree is loose, and
            # being killed. The receipt waits for the exit report, which says what that took
            # (_agent_gone), and for the respawn; the grace timer stays set.
            return
        job.deadline = None
        if job.outcome == "cancelled" and turn.ran_tools and self._link is not None:
            # The agent says it stopped; its tools may not have (codex-acp leaves a running
            # shell command behind). Nothing the turn started may outlive the receipt. (Only
            # after a tool call: the sweep scans /proc, ~1-2 ms, too dear for every cancel.)
            assert self._nursery is not None and self._live_generation is not None
            self._nursery.start_soon(self._sweep_task, self._link, turn.started_clock)
            return
        self._finish_cancelled_turn(turn, job)

    def _agent_exiting(self, exiting: AgentExiting) -> None:
        """The live agent says its process ends now, by design: let it, and respawn."""
        if self._stopping or self._exiting is not None or self._live_generation is None:
            return
        self._exiting = exiting.reason
        self._exit_deadline = self._now() + self.spec.grace_s
        if self._turn is None and self._state == "ready":
            self._set_state("starting", f"the agent is exiting ({exiting.reason})")

    def _exit_overdue(self) -> None:
        """The agent said it would exit and still runs a grace later: kill it, then respawn
        (a cancel in progress has its own grace timer, which kills it first)."""
        self._exit_deadline = None
        if self._exiting is None or self._link is None:
            return
        detail = f"the agent said it would exit ({self._exiting}) but still runs: killing it"
        turn = self._turn
        if turn is not None and turn.cancel is not None:
            self._grace_expired(turn, turn.cancel)
            return
        if turn is not None:
            self._end_turn(turn, "failed", None, error=detail)
        self._set_state("starting", detail)
        self._kill_live_link()

    def _finish_cancelled_turn(self, turn: _Turn, job: _CancelJob) -> None:
        self._end_turn(turn, job.outcome or "cancelled", job.stop_reason, error=job.error)
        if self._recycle_for is not None:
            # Stopped for its memory: the agent ended the turn but still holds it.
            self._recycle(self._recycle_for)
            return
        self._set_state("ready")
        if self._queue:
            self._start_next()

    def _swept(self, swept: _Swept) -> None:
        turn = self._turn
        if swept.generation != self._live_generation or turn is None or turn.cancel is None:
            return  # the agent died meanwhile: the respawn path ends the turn
        if swept.killed:
            turn.cancel.escalation.append("tools_killed")
            turn.cancel.details["tool_processes_killed"] = swept.killed
        if swept.survivors:
            # The agent is fine; tools of its turn outlived SIGKILL: say so, never hide it.
            turn.cancel.survivors.extend(swept.survivors)
            self._emit(ev.ErrorEvent(code="kill_failed", message=_survivors_text(swept.survivors)))
        self._finish_cancelled_turn(turn, turn.cancel)

    def _end_turn(
        self,
        turn: _Turn,
        outcome_: str,
        stop_reason: str | None,
        *,
        error: str | None = None,
        hold: bool = False,
    ) -> None:
        """The one place a running turn ends: one ``turn.ended``, waiters answered (``hold``:
        once the kill under way is done, see ``_held``)."""
        receipt: CancelReceipt | None = None
        job = turn.cancel
        if job is not None:
            job.outcome = outcome_
            receipt = self._receipt(job)
            self._ending = job  # no longer the turn's: should a bug stop us, still answered
        else:
            # A turn nobody cancelled: a later cancel naming it learns how it really ended.
            self._remember(
                turn.id,
                CancelReceipt(
                    session_id=self.id,
                    turn_id=turn.id,
                    outcome="failed" if outcome_ == "failed" else "completed",
                    stop_reason=stop_reason,
                ),
            )
        self._turn = None
        self._seq = seq = self._seq + 1  # made stamped, as _emit would stamp it
        self._fanout.publish(
            ev.new_turn_ended(
                session_id=self.id,
                seq=seq,
                timestamp=time.time(),
                turn_id=turn.id,
                outcome=outcome_,
                stop_reason=stop_reason,
                error=error,
                receipt=receipt_to_wire(receipt) if receipt is not None else None,
                reason=job.reason if job is not None else None,
            )
        )
        if job is not None and receipt is not None:
            self._remember(turn.id, receipt)
            if hold:
                self._held = (job, receipt)
            else:
                for waiter in job.waiters:
                    waiter.resolve(receipt)
                self._ending = None
        if turn.steers or turn.then:
            self._steers_after_turn(turn, receipt)

    def _steers_after_turn(self, turn: _Turn, receipt: CancelReceipt | None) -> None:
        """The turn is over: steers it did not take go first in the queue, in order; they
        start as soon as the session is ready (the callers hear back now: terminate-then-
        respond holds, the turn they steered has ended)."""
        if not turn.steers and not turn.then:
            return
        unanswered = [
            _SteerNext("", pending.text, pending.reply, "started")
            for pending in turn.steers.values()
        ]
        turn.steers.clear()
        following = [*turn.then, *unanswered]
        turn.then = []
        if not following:
            return
        if self._stopping or self._failing:
            error = AgentNotRunning(f"session {self.id} is {self._state}")
            for steer in following:
                steer.reply.fail(error)
            return
        queued = []
        for steer in following:
            turn_id = steer.turn_id
            if not turn_id:
                self._turn_counter += 1
                turn_id = f"t{self._turn_counter}"
            queued.append((turn_id, steer.text))
            interrupted = steer.mode == "interrupted"
            self._emit(
                ev.TurnSteered(
                    turn_id=turn_id,
                    mode=steer.mode,
                    text=steer.text,
                    interrupted_turn_id=turn.id if interrupted else None,
                )
            )
            steer.reply.resolve(
                SteerResult(
                    session_id=self.id,
                    mode=steer.mode,
                    turn_id=turn_id,
                    receipt=receipt if interrupted else None,
                    detail=steer.detail,
                )
            )
        self._queue.extendleft(reversed(queued))
        self._steered.update(turn_id for turn_id, _ in queued)

    def _receipt(self, job: _CancelJob) -> CancelReceipt:
        return new_cancel_receipt(
            session_id=self.id,
            turn_id=job.turn_id,
            outcome=job.outcome or "cancelled",
            escalation=list(job.escalation),
            stop_reason=job.stop_reason,
            dropped_prompts=list(job.dropped),
            resumed=job.resumed,
            # To the microsecond, not by round(x, 3): that converts through decimal strings,
            # 1 us in a loop and 12-15 us on a cancel's cold path, measured.
            elapsed_ms=int((self._now() - job.started_at) * 1_000_000 + 0.5) / 1000,
            grace_s=job.grace_s,
            reason=job.reason,
            details=dict(job.details),
            survivors=list(job.survivors),
            session_failed=job.session_failed,
        )

    def _remember(self, turn_id: str, receipt: CancelReceipt) -> None:
        self._ended[turn_id] = receipt
        while len(self._ended) > _ENDED_TURNS_KEPT:
            del self._ended[next(iter(self._ended))]

    def _grace_expired(self, turn: _Turn, job: _CancelJob) -> None:
        """The agent did not end the turn in time: kill its tree, then respawn and resume."""
        job.deadline = None
        job.escalation.append("grace_expired")
        job.outcome = "killed"
        job.stop_reason = "killed"
        self._set_state("cancelling", f"no turn end after {job.grace_s:g} s grace: killing")
        self._kill_live_link()

    def _kill_live_link(self, *, respawn: bool = False) -> None:
        """Detach the live agent and kill its tree in a child task; then maybe respawn."""
        link = self._link
        if self._machine is not None and self._machine.agent_session_id is not None:
            self._resume_from = self._machine.agent_session_id
        self._respawn_after_kill = respawn
        self._live_generation = None
        self._link = None
        self._drop_machine()
        assert self._nursery is not None
        self._kills_in_flight += 1
        if link is None:
            self._nursery.start_soon(self._post, _KillDone(self._generation, []))
        else:
            self._nursery.start_soon(self._kill_task, link)

    def _drop_machine(self) -> None:
        """Forget the dead process's machine, keeping for the receipt what its unfinished
        cancel had asked of sub-agents or tasks (they never confirmed)."""
        machine, self._machine = self._machine, None
        self._exiting = self._exit_deadline = None  # whatever it said, it is gone now
        while self._mode_replies:  # never answered: the process that was to answer is gone
            self._mode_replies.popleft().fail(
                AgentNotRunning(f"the agent of session {self.id} exited before it took the mode")
            )
        turn = self._turn
        if machine is None or turn is None or turn.cancel is None:
            return
        for key, value in machine.details_at_kill().items():
            turn.cancel.details.setdefault(key, value)

    def _kill_done(self, done: _KillDone) -> None:
        self._kills_in_flight -= 1
        if self._state == "failed":
            if self._held is not None and not self._kills_in_flight:
                job, receipt = self._held
                self._held = None
                self._ending = None
                for waiter in job.waiters:
                    waiter.resolve(receipt)
            if self._stopping and not self._kills_in_flight:
                self._end_failed()
            return
        if self._stopping:
            waiting = self._stop_after_kill
            if waiting is not None:
                steps, survivors = waiting
                steps += done.steps
                survivors += done.survivors
                if not self._kills_in_flight:
                    self._stop_after_kill = None
                    self._closed(_Closed(None, steps, survivors))
            return
        turn = self._turn
        if turn is not None and turn.cancel is not None and not self._respawn_after_kill:
            turn.cancel.escalation.extend(done.steps)
        self._emit(ev.AgentExited(exit_code=None, expected=True, killed=True))
        if done.survivors:
            self._tree_survived(done.survivors)
            return
        if self._respawn_after_kill:
            self._respawn_after_kill = False
            self._spawn()  # a fresh start after a refused resume: the state stays as it is
        else:
            self._respawn()

    def _agent_gone(self, gone: AgentGone) -> None:
        """The agent exited without being asked to (or its shim died and we killed its tree),
        or as it said it would (``AgentExiting``)."""
        status = gone.status
        link = self._link
        tail = link.stderr_tail[-5:] if link is not None else []
        exiting = self._exiting
        self._resume_from = self._machine.agent_session_id if self._machine else self._resume_from
        self._live_generation = None
        self._link = None
        self._drop_machine()
        self._emit(
            ev.AgentExited(
                exit_code=status.code,
                signal=status.signal,
                expected=exiting is not None,
                killed="containment_lost" in gone.steps,
            )
        )
        if "containment_lost" in gone.steps:
            detail = (
                f"containment lost: the agent's shim died ({status.description});"
                " the supervisor killed the agent's tree itself"
            )
        elif exiting is not None:
            detail = f"the agent exited as it said it would ({exiting}; {status.description})"
        else:
            detail = f"agent exited unexpectedly ({status.description})"
        if tail:
            detail += ": " + " | ".join(tail)
        turn = self._turn
        if turn is not None and turn.cancel is not None:
            turn.cancel.escalation.extend(gone.steps)
        if gone.survivors:
            if turn is not None and turn.cancel is not None:
                turn.cancel.outcome = "killed"
                turn.cancel.stop_reason = "killed"
            self._tree_survived(gone.survivors, detail)
            return
        if self._establishing:
            # It died before the handshake finished: respawning would only loop.
            self._start_failed(detail)
            return
        self._exits_without_turn += 1
        if self._exits_without_turn >= MAX_EXITS_WITHOUT_TURN:
            self._start_failed(
                f"the agent exited {self._exits_without_turn} times in a row: {detail}"
            )
            return
        resumed_process_was_mute = (
            self._spawned_resume is not None and not self._heard_from_live and exiting is None
        )
        turn = self._turn
        if turn is not None:
            job = turn.cancel
            if job is None:
                self._end_turn(turn, "failed", None, error=detail)
            else:
                # It died while stopping (or we killed it, containment lost): the turn has
                # ended; the receipt waits for the respawn so the session is ready when the
                # caller hears back.
                job.deadline = None
                killed = "sigkill" in gone.steps
                if killed or exiting is None or job.outcome is None:
                    job.outcome = "killed" if killed else "cancelled"
                    job.stop_reason = "killed" if killed else "agent_exited"
                # else: it ended the turn (TurnFinished) before exiting; that said how
                self._set_state("cancelling", detail)
        if resumed_process_was_mute:
            # Protocols without a handshake (Amp) cannot refuse a resume; a resumed process
            # that dies before saying anything is how they say it. Go on fresh.
            self._resume_refused = detail
            self._resume_from = None
            self._emit(ev.ErrorEvent(code="resume_failed", message=detail))
        self._respawn()

    def _recycle_failing(self, last_error: str) -> None:
        """The agent failed turn after turn: restart it (an agent can get stuck in a state
        only a restart clears)."""
        self._recycle(f"{self._failed_in_a_row} turns failed in a row; the last: {last_error}")

    def _recycle(self, reason: str) -> None:
        """Restart the agent and resume the session; queued prompts wait for the new one."""
        failed, self._failed_in_a_row = self._failed_in_a_row, 0
        self._recycle_for = None
        self._recycles += 1
        self._recycle_reason = reason
        self._emit(ev.SessionRecycled(reason=reason, failed_turns=failed))
        self._set_state("starting", f"recycling the agent: {reason}")
        self._kill_live_link()  # then respawned, resuming the agent's session

    def _memory_over(self, over: _MemoryOver) -> None:
        """The tree went over ``max_memory_mb``: stop the turn through the ladder
        (``reason: "memory_limit"``), then restart the agent and resume the session."""
        if (
            over.generation != self._live_generation
            or self._stopping
            or self._recycle_for is not None
            or self._state not in ("ready", "running", "cancelling")
        ):
            return
        reason = (
            f"memory_limit: the agent's processes hold {over.used_mb:.0f} MB"
            f" (max_memory_mb {self.spec.max_memory_mb:g})"
        )
        self._emit(ev.ErrorEvent(code=REASON_MEMORY_LIMIT, message=reason))
        self._memory_restarts += 1
        if self._memory_restarts > MAX_MEMORY_RESTARTS:
            # Over the limit again and again with no turn done in between: a restart does not
            # help (the limit is below what the agent needs); fail instead of looping.
            self._start_failed(
                f"{reason}, after {MAX_MEMORY_RESTARTS} restarts in a row", code="memory_limit"
            )
            return
        self._recycle_for = reason
        turn = self._turn
        if turn is None:
            self._recycle(reason)
        elif turn.cancel is None:
            self._begin_cancel(
                turn,
                self._now(),
                REASON_MEMORY_LIMIT,
                [],
                keep_queue=True,
                detail=f"{reason}: stopping the turn, then restarting the agent",
            )
        # else: a cancel is on its way; the agent is restarted once it is over

    async def _memory_watch(self, link: AgentLink, generation: int, limit: float) -> None:
        """Sample the tree's memory every MEMORY_SAMPLE_S while the process lives."""
        while True:
            await trio.sleep(MEMORY_SAMPLE_S)
            used = await link.memory_mb()
            if used is None:
                return  # gone (or a link that cannot tell)
            if used > limit:
                await self._post(_MemoryOver(generation, used))

    def _tree_survived(self, survivors: list[dict[str, Any]], detail: str | None = None) -> None:
        """Members of the agent's tree outlived SIGKILL: the session fails, honestly, instead of
        starting a new agent beside them (it could collide with them: same files, ports)."""
        message = _survivors_text(survivors)
        if detail is not None:
            message = f"{detail}; {message}"
        turn = self._turn
        if turn is not None and turn.cancel is not None:
            turn.cancel.survivors.extend(survivors)
            turn.cancel.deadline = None
            turn.cancel.resumed = None
        self._start_failed(message, code="kill_failed")

    # -- the agent process ---------------------------------------------------------------------

    def _spawn(self) -> None:
        self._establishing = True
        self._spawned_resume = self._resume_from
        self._heard_from_live = False
        self._generation += 1
        self._start_deadline = self._now() + self.spec.start_timeout_s
        assert self._nursery is not None
        self._nursery.start_soon(self._spawn_task, self._generation)

    def _respawn(self) -> None:
        turn = self._turn
        if turn is None or turn.cancel is None:
            self._set_state("starting", "respawning the agent")
        else:
            self._set_state("cancelling", "respawning the agent")
        self._spawn()

    def _spawned(self, spawned: _Spawned) -> None:
        if spawned.generation != self._generation or self._stopping:
            self._nursery_kill(spawned.link)
            return
        self._link = spawned.link
        self._live_generation = spawned.generation
        spawned.link.take_now = self._take_now
        self._machine = new_machine(self.spec.protocol)
        if spawned.generation > 1:  # a respawn: its requests' ids must not be the last one's
            self._machine.number_requests(f"@{spawned.generation}")
        self._recycle_for = None  # a fresh process: whatever it held is gone
        limit = self.spec.max_memory_mb
        if limit:
            assert self._nursery is not None
            self._nursery.start_soon(self._memory_watch, spawned.link, spawned.generation, limit)
        turn = self._turn
        if turn is not None and turn.cancel is not None:
            if "respawned" not in turn.cancel.escalation:  # a fresh retry is the same step
                turn.cancel.escalation.append("respawned")
        self._apply(
            self._machine.start(
                cwd=self.cwd, resume=self._resume_from, mcp_servers=self.spec.mcp_servers
            )
        )

    def _established(self, established: SessionEstablished) -> None:
        self._establishing = False
        if self._machine is not None:
            self._carries = self._machine.carries
        self._start_deadline = None
        refused, self._resume_refused = self._resume_refused, None
        resumed = False if refused is not None else established.resumed
        job = self._turn.cancel if self._turn is not None else None
        if resumed is None and job is not None and "respawned" in job.escalation:
            resumed = False  # respawned with nothing to resume: the session is a fresh one
        turn = self._turn
        if turn is not None and turn.cancel is not None:
            job = turn.cancel
            job.resumed = resumed
            if resumed:
                job.escalation.append("resumed")
            self._end_turn(turn, job.outcome or "killed", job.stop_reason, error=job.error)
        self._set_state("ready", established.detail or refused)
        for waiter in self._ready_waiters:
            waiter.resolve(None)
        self._ready_waiters.clear()
        self._start_next()

    def _start_fresh(self, reason: str) -> None:
        """The agent could not resume its session: start it again without resuming."""
        self._resume_refused = reason
        self._emit(ev.ErrorEvent(code="resume_failed", message=reason))
        self._kill_live_link(respawn=True)
        self._resume_from = None  # after the kill, which would remember the refused id

    def _start_failed(self, message: str, *, code: str = "agent_start_failed") -> None:
        self._failing = True
        self._establishing = False
        self._start_deadline = None
        turn = self._turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                # The stop killed the turn, and the session cannot go on: the receipt says
                # so (never "fresh session"), once what failed to start is gone too.
                job.resumed = None
                job.session_failed = message
                outcome_ = job.outcome or "killed"
                self._end_turn(turn, outcome_, job.stop_reason, hold=self._link is not None)
            else:
                self._end_turn(turn, "failed", None, error=message)
        self._drop_queue(code)
        self._emit(ev.ErrorEvent(code=code, message=message))
        self._failure = message
        self._set_state("failed", message)
        error = AgentNotRunning(f"session {self.id} failed: {message}")
        for waiter in self._ready_waiters:
            waiter.fail(error)
        self._ready_waiters.clear()
        if self._link is not None:
            self._kill_live_link()

    def _end_failed(self) -> None:
        """A stop of a failed session: nothing of it runs any more; the actor ends."""
        for waiter in self._stop_waiters:
            waiter.resolve(self.exit_status)
        self._stop_waiters.clear()
        self._done = True

    def _closed(self, closed: _Closed) -> None:
        status = closed.status
        turn = self._turn
        if closed.survivors:
            self._emit(ev.ErrorEvent(code="kill_failed", message=_survivors_text(closed.survivors)))
        if turn is not None:
            killed = bool(closed.steps)
            job = turn.cancel
            if job is not None:
                job.escalation.extend(closed.steps)
                # A kill of its own came first (its grace expired): the turn was killed.
                killed = killed or job.outcome == "killed"
                job.stop_reason = "session_stopped"
                job.survivors.extend(closed.survivors)
            self._end_turn(turn, "killed" if killed else "cancelled", "session_stopped")
        self.exit_status = status
        self._emit(
            ev.AgentExited(
                exit_code=status.code if status else None,
                signal=status.signal if status else None,
                expected=True,
                killed=bool(closed.steps),  # what the close had to do: sigterm, sigkill
            )
        )
        self._set_state("stopped")
        for waiter in self._stop_waiters:
            waiter.resolve(status)
        for ready in self._ready_waiters:
            ready.fail(AgentNotRunning(f"session {self.id} is stopped"))
        self._ready_waiters.clear()
        self._done = True

    def _nursery_kill(self, link: AgentLink) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._kill_quietly, link)

    async def _kill_quietly(self, link: AgentLink) -> None:
        """A process nobody waits for (spawned after we stopped wanting it)."""
        try:
            await link.kill()
        except KillError as exc:
            log.error("session %s: %s", self.id, _survivors_text(exc.survivors))

    async def _post(self, item: Any) -> None:
        try:
            await self._inbox_send.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _spawn_task(self, generation: int) -> None:
        assert self._nursery is not None
        try:
            link = await self._launcher(
                self.spec,
                cwd=self.cwd,
                resume=self._resume_from,
                generation=generation,
                inbox=self._inbox_send,
                nursery=self._nursery,
            )
        except Exception as exc:
            await self._post(_SpawnFailed(generation, str(exc)))
        else:
            await self._post(_Spawned(generation, link))

    async def _sweep_task(self, link: AgentLink, since: float) -> None:
        try:
            killed = await link.kill_turn_processes(since)
        except KillError as exc:
            await self._post(_Swept(link.generation, [], exc.survivors))
        else:
            await self._post(_Swept(link.generation, killed))

    async def _kill_task(self, link: AgentLink) -> None:
        generation = link.generation
        try:
            steps = await link.kill()
        except KillError as exc:
            await self._post(_KillDone(generation, exc.steps, exc.survivors))
        else:
            await self._post(_KillDone(generation, steps))

    async def _close_task(self, link: AgentLink | None) -> None:
        status: ExitStatus | None = None
        steps: list[str] = []
        if link is not None:
            try:
                status, steps = await link.close(self.spec.kill_timeout_s)
            except KillError as exc:
                await self._post(_Closed(None, exc.steps, exc.survivors))
                return
        await self._post(_Closed(status, steps))

    async def _kill_link_on_exit(self) -> None:
        if self._link is not None:
            link, self._link = self._link, None
            try:
                await link.kill()
            except KillError as exc:
                log.error("session %s: %s", self.id, _survivors_text(exc.survivors))

    # -- events ----------------------------------------------------------------------------------

    def _set_state(self, state: str, detail: str | None = None) -> None:
        if state == self._state and detail is None:
            return
        self._state = state
        # Made stamped, as _emit would stamp it (no turn event: the watchdog is not told).
        self._seq = seq = self._seq + 1
        self._fanout.publish(
            ev.new_session_state(
                session_id=self.id, seq=seq, timestamp=time.time(), state=state, detail=detail
            )
        )
        if state in ("stopped", "failed") and self.on_ended is not None:
            self.on_ended()  # a failed session's actor may live on: its owner hears it now

    def _emit_many(self, events: list[ev.Event]) -> None:
        """:meth:`_emit` each of a run of events: the watchdog told, each stamped (one clock
        read for the run), then published at once."""
        if any(map(_SEQ_OF, events)) or len(set(map(id, events))) < len(events):
            # Some stamped already, or one twice: each is then copied, never changed (rare).
            for event in events:
                self._emit(event)
            return
        turn = self._turn
        if turn is not None:
            if set(map(type, events)) <= _STREAM_EVENTS:  # a stream's run, told in C
                if self._watchdog:
                    turn.heard = True  # what _heard does for each of them
            else:
                stream = False  # the last of the turn's events was one of the stream's
                for event in events:
                    cls = type(event)
                    if cls in _STREAM_EVENTS:
                        stream = True
                    elif cls in _TURN_EVENTS:
                        self._heard(turn, event)
                        stream = False
                if stream and self._watchdog:
                    turn.heard = True
        # Each is a fresh event nobody else has seen: stamped in place (see _stamp).
        session_id = self.id
        seq = self._seq
        now = time.time()
        set_session_id, set_seq, set_timestamp = _SET_STAMP
        for event in events:
            seq += 1
            set_session_id(event, session_id)
            set_seq(event, seq)
            set_timestamp(event, now)
        self._seq = seq
        self._fanout.publish_many(events)

    def _emit(self, event: ev.Event) -> None:
        """Stamp the event and publish it. Machines make a fresh, unstamped event for each
        thing that happens and hand it over: that one is stamped in place (a frozen instance
        nobody else has seen yet; ``attrs.evolve`` would build a second one per event). One
        already stamped is copied, never changed."""
        turn = self._turn
        if turn is not None and type(event) in _TURN_EVENTS:
            self._heard(turn, event)
        self._seq = seq = self._seq + 1
        if event.seq:
            event = attrs.evolve(event, session_id=self.id, seq=seq, timestamp=time.time())
        else:
            set_session_id, set_seq, set_timestamp = _SET_STAMP
            set_session_id(event, self.id)
            set_seq(event, seq)
            set_timestamp(event, time.time())
        self._fanout.publish(event)


def _check_subscription(since_seq: object, max_buffer: object, stall_s: object) -> None:
    """A caller's mistake in what it subscribes with is told as such, before the actor sees it."""
    if since_seq is not None and (type(since_seq) is not int or since_seq < 0):
        raise BadRequest(f"since_seq must be a whole number >= 0 or None, not {since_seq!r}")
    if type(max_buffer) is not int or max_buffer < 1:
        raise BadRequest(f"max_buffer must be a whole number >= 1, not {max_buffer!r}")
    if stall_s is not None and (
        isinstance(stall_s, bool)
        or not isinstance(stall_s, int | float)
        or not 0 < stall_s < math.inf
    ):
        raise BadRequest(f"stall_s must be a number of seconds > 0 or None, not {stall_s!r}")


def _share(lines: list[Any], start: int, allowed: int, count: int = -1) -> tuple[int, int]:
    """How many of ``lines[start:]`` a share of ``allowed`` units pays for (each costs
    ``cost_of`` its size; the first is always taken, however big), and what they cost. With
    ``count``: the cost of that many. Lines shorter than a unit cost one each: told in C."""
    rest = lines[start:] if count < 0 else lines[start : start + count]
    try:
        small = max(map(len, rest), default=0) < BYTES_PER_UNIT
    except TypeError:  # a FramingError among them
        small = False
    if small:
        take = len(rest) if count >= 0 else max(1, min(len(rest), allowed))
        return take, take
    take = spent = 0
    for line in rest:
        cost = cost_of(len(line)) if isinstance(line, (bytes, str)) else 1
        if count < 0 and spent and spent + cost > allowed:
            break
        take += 1
        spent += cost
    return take, spent


def _as_raw(message: Any) -> dict[str, Any]:
    """A decoded message as the dict its line is (a machine's typed hot message converted)."""
    return message if isinstance(message, dict) else msgspec.to_builtins(message)


def _survivors_text(survivors: list[dict[str, Any]]) -> str:
    listed = ", ".join(f"{s['pid']} ({s['command']})" for s in survivors[:5])
    return f"{len(survivors)} process(es) of the agent's tree survived SIGKILL: {listed}"


#: The stamp's slots set through their descriptors (what ``object.__setattr__`` does on a
#: frozen instance, without looking the name up each time): every event is stamped so.
_SET_STAMP = tuple(ev.Event.__dict__[name].__set__ for name in ("session_id", "seq", "timestamp"))
_SEQ_OF = operator.attrgetter("seq")
