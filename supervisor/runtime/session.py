"""The session actor: one Trio task runs one :class:`~supervisor.core.session.SessionCore`.

Every decision about the session is the core's; this shell owns what the core must not: the
task, the mailbox of calls, the inbox of what the agent and the session's child tasks report,
time, and the I/O. It feeds the core what happens and runs what the core asks through its port
(:class:`_AgentIO`): writes to the live agent, events to the fan-out, child tasks that start,
kill, close or sweep agent processes and post their result back.

The actor never awaits the agent: messages to it are written without blocking, everything from
it arrives in the inbox, slow work runs in child tasks. So a cancel is always served at once,
and agent output keeps flowing while it is in progress. Four ways keep a stop instant under
load, each behind one door and described where it lives (``design/actor.md`` measures them):

- :meth:`Session._ask`: a call that finds the actor parked runs in its caller's own step;
- :meth:`Session._take_now`: urgent agent output (a cancel's answer) runs in its pump's step;
- the alarm clock (``supervisor/runtime/alarm.py``) wakes the actor at its next deadline: its
  waits have no cancel scope;
- agent output is handled a run at a time, at the pace the supervisor's ingest gate allows
  (:meth:`Session._work_through`).
"""

from __future__ import annotations

import logging
import math
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio
from attrs import define, frozen

from protocols.content import Part
from protocols.events import PREVIEW_CHARS
from protocols.framing import FramingError, decode_line, decode_lines
from protocols.machine import Step
from supervisor.agents.link import (
    AgentFrame,
    AgentGone,
    AgentLines,
    AgentLink,
    AgentStderrLines,
    Launcher,
)
from supervisor.agents.process import KillError, tree_clock
from supervisor.checkpoints import CheckpointError, RewindConflict, ShadowStore, Snapshot
from supervisor.config import AgentSpec
from supervisor.core.agent import STARTING_PHASES
from supervisor.core.calls import (
    check_mode,
    check_permission_answer,
    check_prompt,
    check_steer,
    check_subscription,
)
from supervisor.core.exit import ExitStatus
from supervisor.core.lifecycle import survivors_text
from supervisor.core.pause import Pause
from supervisor.core.session import URGENT_STATES, SessionCore, TurnHandle
from supervisor.core.states import State
from supervisor.errors import AgentNotRunning, BadRequest, CheckpointFailed, SupervisorError
from supervisor.receipt import REASON_USER, CancelReceipt
from supervisor.runtime.alarm import AlarmClock
from supervisor.runtime.context import Said, context_text, said_in
from supervisor.runtime.fanout import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_HISTORY_BYTES,
    DEFAULT_SUBSCRIBER_BUFFER,
    Fanout,
    Subscription,
    fill_from_recorder,
)
from supervisor.runtime.handle import Subscribable
from supervisor.runtime.ingest import BYTES_PER_UNIT, IngestGate, Unlimited, cost_of
from supervisor.runtime.reply import Reply
from supervisor.steering import SteerResult
from supervisor.store.backend import CheckpointRow
from supervisor.worktrees import Left, Worktree

__all__ = ["Session", "SessionSummary", "Subscription", "TurnHandle"]

log = logging.getLogger("supervisor.session")

T = TypeVar("T")

#: Events kept for ``since_seq`` replay. At ~100 bytes each this bounds a session to ~1 MB.
DEFAULT_HISTORY = 10_000
#: Prompts that may wait behind the running turn; more is a client bug, not a workload.
DEFAULT_MAX_QUEUED = 32
#: Items buffered between the pumps and the actor: backpressure on a flooding agent. A reader
#: posts one item per read (up to 64 KiB of lines), so this bounds a session to ~1 MB of agent
#: output held in memory, however fast the agent writes.
_INBOX_SIZE = 16
#: Scheduling turns the inbox must stay empty before the actor counts as idle and subscribers'
#: writers are told of new events: a pump, or an in-memory agent, yields once or twice between
#: two posts, and that is not idle. Costs a few microseconds after the last event of a burst.
_IDLE_TURNS = 3
#: How often the tree's memory is sampled when ``max_memory_mb`` is set (a psutil scan in a
#: worker thread: ~1 ms for a small tree). A tree that grows 1 GB/s overshoots by ~2 GB before
#: it is seen; agents grow over minutes (Claude Code users report ~3 GB per session).
MEMORY_SAMPLE_S = 2.0
#: The checkpoint stores (one per working directory) whose first snapshot of this process a
#: session has begun: the sessions started there after it take none of their own, their first
#: turn's start snapshot waits for the store behind it (each would be a whole incremental
#: snapshot in the way of the others' turns: a second on 100,000 files).
_BASELINED: weakref.WeakSet[ShadowStore] = weakref.WeakSet()


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
    #: why no new turn starts (``paused``: the supervisor is paused), else None
    held: str | None = None
    #: when it was created and last active (Unix time), and the start of its first prompt:
    #: known for a session an earlier supervisor stored (``supervisor/store/dormant.py``),
    #: what a list of past sessions shows; None otherwise
    created: float | None = None
    last_active: float | None = None
    first_prompt: str | None = None
    #: the git worktree it runs in, and its branch (``supervisor/worktrees.py``); None: none
    worktree: str | None = None
    branch: str | None = None
    #: a stored session another process of the store runs: that process (``serve pid 4242 on
    #: box``, ``supervisor/store/dormant.py``); None otherwise
    elsewhere: str | None = None


# -- mailbox calls: what each runs on the core, in the order they came -------------------------


@define
class _Prompt:
    text: str
    parts: tuple[Part, ...]
    reply: Reply[TurnHandle]

    def run(self, session: Session) -> None:
        self.reply.resolve(session.core.prompt(self.text, self.parts))


@define  # made on a cancel's cold path: see protocols.events.quick_constructor
class _Cancel:
    turn_id: str | None
    reason: str | None
    reply: Reply[CancelReceipt]

    def run(self, session: Session) -> None:
        session.core.cancel(self.turn_id, self.reason, self.reply)


@define
class _Steer:
    text: str
    reply: Reply[SteerResult]

    def run(self, session: Session) -> None:
        session.core.steer(self.text, self.reply)


@define
class _SetMode:
    mode_id: str
    reply: Reply[None]

    def run(self, session: Session) -> None:
        session.core.set_mode(self.mode_id, self.reply)


@define
class _Terminal:
    keys: str | None
    size: tuple[int, int] | None
    reply: Reply[None]

    def run(self, session: Session) -> None:
        session.core.terminal(self.keys, self.size)
        self.reply.resolve(None)


@define
class _RespondPermission:
    request_id: str
    option_id: str | None
    reply: Reply[None]

    def run(self, session: Session) -> None:
        session.core.respond_permission(self.request_id, self.option_id)
        self.reply.resolve(None)


@define
class _Subscribe:
    since_seq: int | None
    max_buffer: int
    reply: Reply[Subscription]
    stall_s: float | None = None
    wire: bool = False
    max_buffer_bytes: int | None = None

    def run(self, session: Session) -> None:
        head = session.core.seq
        if self.since_seq is not None and self.since_seq > head:
            # Not this session's history: the one followed before a restart, say (local ids
            # start again at s1). Said, never a silent stream from elsewhere.
            raise BadRequest(
                f"since_seq {self.since_seq} is beyond session {session.id}'s newest event"
                f" ({head}): not the session those events came from"
            )
        subscription = session._fanout.subscribe(
            self.since_seq,
            head_seq=head,
            max_buffer=self.max_buffer,
            stall_s=self.stall_s,
            wire=self.wire,
            max_bytes=self.max_buffer_bytes,
        )
        machine = session.core.agent.machine
        subscription.screen = machine.screen() if machine is not None else None
        self.reply.resolve(subscription)


@define
class _Rewind:
    turn_id: str
    reply: Reply[dict[str, Any]]
    force: bool = False

    def run(self, session: Session) -> None:
        session.core.rewind(self.turn_id, self.reply, self.force)


@define
class _Pause:
    deadline: float
    reply: Reply[None]

    def run(self, session: Session) -> None:
        session.core.pause(self.deadline)
        self.reply.resolve(None)


@define
class _Resume:
    reply: Reply[None]

    def run(self, session: Session) -> None:
        session.core.resume()
        self.reply.resolve(None)


@define
class _WaitReady:
    reply: Reply[None]

    def run(self, session: Session) -> None:
        session.core.life.wait_ready(self.reply)


@define
class _Stop:
    reply: Reply[ExitStatus | None]

    def run(self, session: Session) -> None:
        session.core.life.stop(self.reply)


_Call = (
    _Prompt
    | _Cancel
    | _Steer
    | _RespondPermission
    | _SetMode
    | _Terminal
    | _Subscribe
    | _Rewind
    | _Pause
    | _Resume
    | _WaitReady
    | _Stop
)


# -- inbox items from the session's own child tasks --------------------------------------------


class _Wake:
    """Posted after a mailbox call so an idle actor looks at its mailbox."""

    __slots__ = ()


_WAKE = _Wake()


@define
class _Spawned:
    generation: int
    link: AgentLink


@define
class _SpawnFailed:
    generation: int
    message: str


@define
class _KillDone:
    steps: list[str]
    #: members that outlived SIGKILL: nothing may be started on top of them
    survivors: list[dict[str, Any]]


@define
class _Closed:
    status: ExitStatus | None
    steps: list[str]
    survivors: list[dict[str, Any]]


@define
class _MemoryOver:
    generation: int
    used_mb: float


@define
class _Swept:
    generation: int
    killed: list[dict[str, Any]]
    survivors: list[dict[str, Any]]


@define
class _BaselineTaken:
    error: str | None


@define
class _CheckpointTaken:
    turn_id: str
    error: str | None


@define
class _TurnChanges:
    turn_id: str
    changes: list[dict[str, Any]] | None
    error: str | None


@define
class _Rewound:
    turn_id: str
    undo_id: str
    result: dict[str, Any] | None
    error: str | None
    conflict: bool = False


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


class _AgentIO:
    """The core's port (:class:`~supervisor.core.session.SessionIO`): the live agent's link,
    the fan-out, and the child tasks that do what takes time."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.link: AgentLink | None = None
        #: the run's clock, read straight (``trio.current_time`` looks it up in two calls more:
        #: on a cancel's path, run cold, each call costs): set when the actor starts
        self.now: Callable[[], float] = trio.current_time
        self.publish = session._fanout.publish
        self.publish_many = session._fanout.publish_many
        self.nursery: trio.Nursery | None = None

    def tree_clock(self) -> float:
        return tree_clock()

    def deliver(self, step: Step) -> None:
        link = self.link
        if link is not None:
            for message in step.send:
                link.send(message)
            for signum in step.signals:
                link.signal(signum)

    def leader_exited(self) -> bool:
        link = self.link
        return link is not None and link.leader_exited

    def ended(self) -> None:
        on_ended = self._session.on_ended
        if on_ended is not None:
            on_ended()

    def stopped(self, receipt: CancelReceipt) -> None:
        on_stop = self._session.on_stop
        if on_stop is not None:
            on_stop(receipt, time.time())

    def conversation(self, limit: int) -> str:
        session = self._session
        said = [*session.earlier, *said_in(session._fanout.history)]
        return context_text(said, limit)

    def spawn(self, generation: int, resume: str | None) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self._spawn, generation, resume)

    def kill(self, generation: int) -> None:
        link, self.link = self.link, None
        assert self.nursery is not None
        if link is None:
            self.nursery.start_soon(self._post, _KillDone([], []))
        else:
            self.nursery.start_soon(self._kill, link)

    def close(self) -> None:
        link, self.link = self.link, None
        assert self.nursery is not None
        self.nursery.start_soon(self._close, link)

    def sweep(self, generation: int, since: float) -> None:
        assert self.nursery is not None and self.link is not None
        self.nursery.start_soon(self._sweep, self.link, since)

    def watch_memory(self, generation: int, limit_mb: float) -> None:
        assert self.nursery is not None and self.link is not None
        self.nursery.start_soon(self._watch_memory, self.link, generation, limit_mb)

    # -- the child tasks, each posting its result to the actor's inbox -----------------------

    async def _post(self, item: Any) -> None:
        try:
            await self._session._inbox_send.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _spawn(self, generation: int, resume: str | None) -> None:
        session = self._session
        assert self.nursery is not None
        try:
            link = await session._launcher(
                session.spec,
                cwd=session.cwd,
                resume=resume,
                generation=generation,
                inbox=session._inbox_send,
                nursery=self.nursery,
            )
        except Exception as exc:
            await self._post(_SpawnFailed(generation, str(exc)))
        else:
            await self._post(_Spawned(generation, link))

    async def _kill(self, link: AgentLink) -> None:
        try:
            steps = await link.kill()
        except KillError as exc:
            await self._post(_KillDone(exc.steps, exc.survivors))
        else:
            await self._post(_KillDone(steps, []))

    async def _close(self, link: AgentLink | None) -> None:
        status: ExitStatus | None = None
        steps: list[str] = []
        if link is not None:
            try:
                status, steps = await link.close(self._session.spec.kill_timeout_s)
            except KillError as exc:
                await self._post(_Closed(None, exc.steps, exc.survivors))
                return
        await self._post(_Closed(status, steps, []))

    async def _sweep(self, link: AgentLink, since: float) -> None:
        try:
            killed = await link.kill_turn_processes(since)
        except KillError as exc:
            await self._post(_Swept(link.generation, [], exc.survivors))
        else:
            await self._post(_Swept(link.generation, killed, []))

    async def _watch_memory(self, link: AgentLink, generation: int, limit: float) -> None:
        """Sample the tree's memory every MEMORY_SAMPLE_S while the process lives."""
        while True:
            await trio.sleep(MEMORY_SAMPLE_S)  # the sampling period, not a wait for state
            used = await link.memory_mb()
            if used is None:
                return  # gone (or a link that cannot tell)
            if used > limit:
                await self._post(_MemoryOver(generation, used))

    # -- checkpoints (supervisor/checkpoints/): the files' side, the core's is core/checkpoints.py

    def baseline(self) -> None:
        store = self._session._checkpoints
        assert self.nursery is not None and store is not None
        if store in _BASELINED:
            self.nursery.start_soon(self._post, _BaselineTaken(None))
            return
        _BASELINED.add(store)
        self.nursery.start_soon(self._baseline)

    def checkpoint(self, turn_id: str) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self._checkpoint, turn_id)

    def turn_changes(self, turn_id: str) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self._turn_changes, turn_id)

    def rewind(self, checkpoint_id: str, undo_id: str, force: bool = False) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self._rewind, checkpoint_id, undo_id, force)

    def _keep(self, checkpoint_id: str, snapshot: Snapshot) -> None:
        """A new snapshot a rewind may name (the core keeps its id once told), told to the
        session store; those the core no longer keeps are forgotten, in the checkpoint store
        too (its housekeeping then prunes what they alone held)."""
        session = self._session
        store = session._checkpoints
        assert store is not None
        snapshots = session._snapshots
        for forgotten in session.core.checkpoints.forgotten(set(snapshots)):
            dropped = [snapshots.pop(forgotten)]
            end = session._ends.pop(forgotten, None)
            if end is not None:
                dropped.append(end)
            store.forget(dropped)
        snapshots[checkpoint_id] = snapshot
        session._kept_n += 1
        if session.on_checkpoint is not None:
            session.on_checkpoint(
                CheckpointRow(
                    session_id=session.id,
                    checkpoint_id=checkpoint_id,
                    n=session._kept_n,
                    start=snapshot.commit,
                )
            )
        self._housekeep(store)

    def _housekeep(self, store: ShadowStore) -> None:
        if store.housekeeping_due:
            assert self.nursery is not None
            self.nursery.start_soon(self._housekeeping, store)

    async def _housekeeping(self, store: ShadowStore) -> None:
        try:
            await store.housekeep()
        except (CheckpointError, OSError) as exc:  # tried again after the next snapshots
            log.warning("session %s: checkpoint housekeeping failed: %s", self._session.id, exc)

    async def _baseline(self) -> None:
        """The session's first snapshot, in the actor's nursery (a stop cancels it, and its
        git with it: ``trio.run_process`` ends the process it waits for). No rewind names
        it: its ref goes at the next housekeeping; what it leaves is the store's index."""
        store = self._session._checkpoints
        assert store is not None
        try:
            snapshot = await store.snapshot()
        except (CheckpointError, OSError) as exc:
            await self._post(_BaselineTaken(str(exc)))
        except trio.Cancelled:
            _BASELINED.discard(store)  # not taken: the next session started here takes it
            raise
        else:
            store.forget([snapshot])
            self._housekeep(store)
            await self._post(_BaselineTaken(None))

    async def _checkpoint(self, turn_id: str) -> None:
        store = self._session._checkpoints
        assert store is not None
        try:
            snapshot = await store.snapshot()
        except (CheckpointError, OSError) as exc:
            await self._post(_CheckpointTaken(turn_id, str(exc)))
        else:
            self._keep(turn_id, snapshot)
            await self._post(_CheckpointTaken(turn_id, None))

    async def _turn_changes(self, turn_id: str) -> None:
        session = self._session
        store = session._checkpoints
        start = session._snapshots.get(turn_id)
        assert store is not None and start is not None
        end: Snapshot | None = None
        try:
            end = await store.snapshot()
            found = await store.changes(start, end)
        except (CheckpointError, OSError) as exc:
            if end is not None:
                store.forget([end])
            await self._post(_TurnChanges(turn_id, None, str(exc)))
        else:
            session._ends[turn_id] = end
            store.changed(session.id, turn_id, end, [change.path for change in found])
            if session.on_checkpoint is not None:
                session.on_checkpoint(
                    CheckpointRow(
                        session_id=session.id,
                        checkpoint_id=turn_id,
                        n=0,  # (the stored row's is kept)
                        start=start.commit,
                        end=end.commit,
                    )
                )
            self._housekeep(store)
            changes = [change.to_wire() for change in found]
            await self._post(_TurnChanges(turn_id, changes, None))

    async def _rewind(self, checkpoint_id: str, undo_id: str, force: bool) -> None:
        session = self._session
        store = session._checkpoints
        target = session._snapshots.get(checkpoint_id)
        assert store is not None and target is not None

        def refuse(paths: list[bytes]) -> str | None:
            return None if force else store.conflicts(session.id, target, paths)

        try:
            restored = await store.restore(target, refuse)
        except RewindConflict as exc:
            await self._post(_Rewound(checkpoint_id, undo_id, None, str(exc), conflict=True))
        except (CheckpointError, OSError) as exc:
            await self._post(_Rewound(checkpoint_id, undo_id, None, str(exc)))
        else:
            self._keep(undo_id, restored.before)
            await self._post(_Rewound(checkpoint_id, undo_id, restored.to_wire(), None))

    async def kill_quietly(self, link: AgentLink) -> None:
        """A process nobody waits for (started after the session stopped wanting it)."""
        try:
            await link.kill()
        except KillError as exc:
            log.error("session %s: %s", self._session.id, survivors_text(exc.survivors))


class Session(Subscribable):
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
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        paused: Pause | None = None,
        after: tuple[int, int] = (0, 0),
        earlier: Sequence[Said] = (),
        checkpoints: ShadowStore | None = None,
    ) -> None:
        """``after``: the last seq and the number of turns of the session's history so far
        (a session stored by an earlier supervisor, started again): its seqs and turn ids go
        on from there, never reused; ``earlier``: what was said in it then (the newest of it),
        for an agent that cannot resume its own session (``runtime/context.py``).
        ``checkpoints``: the store of ``cwd``'s checkpoints (each turn's start snapshotted, its
        changes on its ``turn.ended``; :meth:`rewind`); None: none are kept."""
        self.id = session_id
        self.spec = spec
        self.cwd = cwd
        #: the git worktree ``cwd`` is in, made for it (its supervisor's ``worktree``), and
        #: what its stop left of it; None: none
        self.worktree: Worktree | None = None
        self.worktree_left: Left | None = None
        self._launcher = launcher
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
        #: What handling agent output in its pump's step raised (``_take_now``): the actor's.
        self._raise_in_actor: Exception | None = None
        inbox_send, self._inbox = trio.open_memory_channel[Any](_INBOX_SIZE)
        self._inbox_send = _PostBox(inbox_send)
        # The history and the subscribers; a node's sessions keep what their front has not
        # acknowledged, holding the agent back rather than drop it (design/remote.md).
        self._fanout = Fanout(
            history_size,
            hold_unacknowledged=hold_unacknowledged,
            history_bytes=history_bytes,
            buffer_bytes=buffer_bytes,
        )
        self._io = _AgentIO(self)
        # ``paused``: it starts held (the supervisor is paused: ``core/pause.py``)
        self.core = SessionCore(
            session_id,
            spec,
            cwd=cwd,
            io=self._io,
            max_queued=max_queued,
            resume=resume,
            paused=paused,
            checkpoints=checkpoints is not None,
        )
        self._checkpoints = checkpoints
        #: the snapshots a rewind may go back to, by checkpoint id (as many as the core keeps)
        self._snapshots: dict[str, Snapshot] = {}
        #: each ended turn's snapshot at its end, by turn id (:meth:`diff`): forgotten with
        #: its start
        self._ends: dict[str, Snapshot] = {}
        #: the newest checkpoint's place (:class:`~supervisor.store.backend.CheckpointRow`)
        self._kept_n = 0
        #: the session store's, told of each checkpoint kept and each turn's end snapshot: a
        #: session revived later gets them back (:meth:`seed_checkpoints`)
        self.on_checkpoint: Callable[[CheckpointRow], None] | None = None
        last_seq, turns = after
        if last_seq or turns:
            self.core.log.seq = self._fanout.head_seq = last_seq
            self.core.turn_ids.count = turns
            self.core.conversed = turns > 0
        #: the conversation before this supervisor's history of the session (from the store)
        self.earlier = list(earlier)
        # Agent output being worked through (one read's worth), at the actor's own pace.
        self._batch: list[Any] | None = None  # raw lines, frames, or stderr lines
        self._batch_kind = ""  # "lines", "frames" or "stderr"
        self._batch_generation = 0
        self._batch_at = 0
        self._credit = 0  # a share the gate granted, not spent yet
        #: why no new prompt or steer is taken (the supervisor is shutting down); None: they are
        self.closing: str | None = None
        #: called (from the actor, must not block) when the session is stopped or failed
        self.on_ended: Callable[[], None] | None = None
        #: called (from the actor, must not block) with the receipt of each stopped turn once
        #: it has ended, and when (wall clock): the supervisor's recent stops
        self.on_stop: Callable[[CancelReceipt, float], None] | None = None
        #: called with the id and the whole text of each prompt and steer longer than an
        #: event's preview (``protocols.events.PREVIEW_CHARS``): the session store keeps it
        self.on_text: Callable[[str, str], None] | None = None

    # -- public API (any task) ---------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.core.state

    @property
    def _link(self) -> AgentLink | None:
        """The live agent's link (tests reach the process through it)."""
        return self._io.link

    @property
    def exit_status(self) -> ExitStatus | None:
        return self.core.exit_status

    @property
    def untouched(self) -> bool:
        """Nobody has used it yet: no subscriber, no prompt ever (its starter's own wait
        aside)."""
        return self.core.turn_ids.count == 0 and not self._fanout.subscribed

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the newest event (0 before the first)."""
        return self.core.seq

    @property
    def fanout(self) -> Fanout:
        return self._fanout

    @property
    def turn_id(self) -> str | None:
        return self.core.turn_id

    @property
    def held(self) -> str | None:
        """Why no new turn starts (``paused``), else None."""
        return self.core.held

    @property
    def agent_session_id(self) -> str | None:
        """The agent's own id of the session (ACP sessionId, Codex thread, Claude session):
        what ``resume=`` takes to go on with it in another process, later."""
        return self.core.agent_session_id

    def summary(self) -> SessionSummary:
        core = self.core
        return SessionSummary(
            self.id,
            self.spec.name,
            core.state,
            core.turn_id,
            recycles=core.recycler.recycles,
            recycle_reason=core.recycler.reason,
            cwd=self.cwd,
            held=core.held,
            worktree=self.worktree.path if self.worktree is not None else None,
            branch=self.worktree.branch if self.worktree is not None else None,
        )

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> TurnHandle:
        """Queue a prompt; returns once the session accepted it (not when the turn ends).

        ``parts``: its content when it is more than text (images, resources, in order;
        ``protocols.content``); ``text`` is then what events and receipts show of it. A part
        the agent cannot take is refused here (:class:`BadRequest`), before anything is sent."""
        parts = check_prompt(text, parts)
        self._check_open()
        if self.on_text is not None and len(text) > PREVIEW_CHARS:
            self.on_text(self.id, text)
        reply: Reply[TurnHandle] = Reply()
        return await self._ask(_Prompt(text, parts, reply), reply)

    @property
    def modes(self) -> dict[str, Any] | None:
        """The session's modes as the agent gives them (ACP's ``SessionModeState``), or None
        (the agent has none, or is not running)."""
        machine = self.core.machine
        return machine.modes if machine is not None else None

    async def set_mode(self, mode_id: str) -> None:
        """Switch the agent's session to mode ``mode_id`` (one of :attr:`modes`); returns once
        the agent took it (:class:`BadRequest` with its reason if it refused)."""
        check_mode(mode_id)
        reply: Reply[None] = Reply()
        return await self._ask(_SetMode(mode_id, reply), reply)

    @property
    def prompt_carries(self) -> frozenset[str]:
        """What the agent takes in a prompt besides text (``protocols.content``'s words): its
        protocol's, or what the agent advertised when it last started (ACP)."""
        return self.core.agent.carries

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether each turn is checkpointed (its ``changes``, :meth:`rewind`, :meth:`diff`)."""
        return self._checkpoints is not None

    async def cancel(
        self, *, turn_id: str | None = None, reason: str | None = None, rewind: bool = False
    ) -> CancelReceipt:
        """Stop the current turn (or ``turn_id``); returns only once that turn has ended.
        ``reason`` goes into the receipt (``user`` when not given). ``rewind``: then put the
        working directory back as it was when that turn started (:meth:`rewind`); the
        receipt's ``restored`` says what that did."""
        reply: Reply[CancelReceipt] = Reply()
        call = _Cancel(turn_id, REASON_USER if reason is None else reason, reply)
        receipt = await self._ask(call, reply)
        if not rewind or receipt.turn_id is None or receipt.outcome == "no_active_turn":
            return receipt
        try:
            restored = await self.rewind(receipt.turn_id)
        except SupervisorError as exc:
            return attrs.evolve(receipt, restored={"error": str(exc), "code": exc.code})
        return attrs.evolve(receipt, restored=restored)

    async def rewind(self, turn_id: str, *, force: bool = False) -> dict[str, Any]:
        """Put the working directory back as it was when ``turn_id`` started, undoing it and
        every later turn; refused while a turn runs (:class:`~supervisor.errors.Busy`), and,
        unless ``force``, when it would undo what another session in the same directory
        changed since (:class:`~supervisor.errors.Conflict`, naming it and the paths).
        Returns ``{"turn_id", "restored": [paths], "not_restored": [{"path", "why"}],
        "undo"}``: ``undo`` names the state before the rewind, which a rewind to it puts
        back."""
        reply: Reply[dict[str, Any]] = Reply()
        return await self._ask(_Rewind(turn_id, reply, force), reply)

    def seed_checkpoints(
        self, kept: Sequence[tuple[CheckpointRow, Snapshot, Snapshot | None]]
    ) -> None:
        """Checkpoints an earlier process kept: the session store's rows, oldest first, each
        with its snapshot and its turn's end (None: not ended, or a rewind's). A rewind or a
        diff may name them. Before the actor runs."""
        for row, start, end in kept:
            self._snapshots[row.checkpoint_id] = start
            if end is not None:
                self._ends[row.checkpoint_id] = end
            self._kept_n = max(self._kept_n, row.n)
        self.core.checkpoints.seed([row.checkpoint_id for row, _, _ in kept])

    async def diff(self, turn_id: str, path: str) -> dict[str, Any]:
        """What the ended turn ``turn_id`` did to ``path`` (relative to the working
        directory), as a unified diff: ``{"turn_id", "path", "diff", "truncated", "binary",
        "too_big"}``. Read from the checkpoints, so a rewind since changes nothing of it."""
        store = self._checkpoints
        if store is None:
            raise BadRequest(f"session {self.id} keeps no checkpoints (checkpoints off)")
        start, end = self._snapshots.get(turn_id), self._ends.get(turn_id)
        if start is None or end is None:
            raise BadRequest(
                f"session {self.id} has no changes of {turn_id!r} (a turn that has ended, whose"
                " checkpoints are kept)"
            )
        try:
            diff = await store.diff(start, end, os.fsencode(path))
        except CheckpointError as exc:
            raise CheckpointFailed(f"session {self.id}: no diff of {path!r}: {exc}") from None
        return {"turn_id": turn_id, "path": path, **diff.to_wire()}

    async def steer(self, text: str) -> SteerResult:
        """Redirect the running turn with ``text``: joined to it natively where the agent can
        (``injected``), else the turn is cancelled and ``text`` starts the next one
        (``interrupted``, with the receipt); with no turn running it starts one now
        (``started``), ahead of queued prompts. Returns once the text is on its way: for
        ``interrupted``, once the old turn has ended (terminate-then-respond)."""
        check_steer(text)
        self._check_open()
        if self.on_text is not None and len(text) > PREVIEW_CHARS:
            self.on_text(self.id, text)
        reply: Reply[SteerResult] = Reply()
        return await self._ask(_Steer(text, reply), reply)

    async def input(self, data: str) -> None:
        """Write ``data`` to a terminal agent's terminal as its UTF-8 bytes, nothing added (a
        person answering the agent's own menu); :class:`BadRequest` for other protocols."""
        reply: Reply[None] = Reply()
        await self._ask(_Terminal(data, None, reply), reply)

    async def resize(self, cols: int, rows: int) -> None:
        """Make a terminal agent's terminal ``cols`` x ``rows`` (the agent gets SIGWINCH)."""
        reply: Reply[None] = Reply()
        await self._ask(_Terminal(None, (cols, rows), reply), reply)

    async def respond_permission(
        self, request_id: str, option_id: str | None = None, *, cancelled: bool = False
    ) -> None:
        check_permission_answer(request_id, option_id, cancelled)
        reply: Reply[None] = Reply()
        await self._ask(_RespondPermission(request_id, option_id, reply), reply)

    async def open_subscription(
        self,
        *,
        since_seq: int | None = None,
        max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        stall_s: float | None = None,
        wire: bool = False,
        max_buffer_bytes: int | None = None,
    ) -> Subscription:
        """Like :meth:`subscribe`; ``wire=True``: the subscriber takes each event's WebSocket
        text frame (``take_frames``), as the gateway sends it, instead of event objects."""
        check_subscription(since_seq, max_buffer, stall_s, max_buffer_bytes)
        reply: Reply[Subscription] = Reply()
        call = _Subscribe(since_seq, max_buffer, reply, stall_s, wire, max_buffer_bytes)
        subscription = await self._ask(call, reply)
        recorder = self._fanout.recorder
        if subscription.missing is not None and recorder is not None:
            # Older than the history holds: the store has them (``design/store.md``).
            await fill_from_recorder(subscription, recorder, self.id)
        return subscription

    async def pause(self, deadline: float = math.inf) -> None:
        """Hold new turns: a prompt is queued (its answer says ``held``) until :meth:`resume`;
        the running turn goes on, and is cancelled through the ladder (``reason: "paused"``)
        if it still runs at ``deadline`` (trio's clock; inf: never). Paused already, the
        earlier deadline stands (``supervisor/core/pause.py``)."""
        reply: Reply[None] = Reply()
        await self._ask(_Pause(deadline, reply), reply)

    async def resume(self) -> None:
        """Start the prompts the pause held, in order, one turn at a time as always."""
        reply: Reply[None] = Reply()
        await self._ask(_Resume(reply), reply)

    async def wait_ready(self) -> None:
        """Return once the agent is up and the session takes prompts; raise if it failed."""
        reply: Reply[None] = Reply()
        await self._ask(_WaitReady(reply), reply)

    async def stop(self) -> ExitStatus | None:
        """End the session: the turn is stopped, the agent exits (or is killed)."""
        if self.core.done or not self._mailbox_open:  # over, or ending: nothing more to ask
            return self.core.exit_status
        reply: Reply[ExitStatus | None] = Reply()
        return await self._ask(_Stop(reply), reply)

    def _check_open(self) -> None:
        """No new turn once the owner is shutting down (its turns are being cancelled, and a
        turn started now would be cut off without its end)."""
        if self.closing is not None:
            raise AgentNotRunning(f"session {self.id} takes no new prompts: {self.closing}")

    async def _ask(self, call: _Call, reply: Reply[T]) -> T:
        """Post a call and wait for its answer (``reply``, the call's own).

        A call that finds the actor parked (:attr:`_parked`) and the mailbox empty is handled
        at once, in the caller's own step: the core's handler, run while the actor runs
        nothing and holds nothing half done (trio runs one task at a time, and the actor parks
        only between two pieces of work), in the order the mailbox would have given it. So a
        cancel's interrupt goes out in the step that asked for it, not a pass of the run loop
        later, and under load a pass is what every other session's traffic makes long."""
        if not self._mailbox_open:
            raise self.core.not_running()
        parked = self._parked
        if parked and not self._mailbox:
            # What the call sends the agent is written as this step's last act: the kernel
            # wakes a pipe's reader on its writer's core, to run once the writer sleeps, so
            # work done after a write delays the agent's read by as long (design/actor.md).
            link = self._io.link if self.core.agent.live is not None else None
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

    def _handle(self, call: _Call) -> None:
        try:
            call.run(self)
        except SupervisorError as exc:  # the caller's mistake: answered, not logged
            call.reply.fail(exc)
        except Exception as exc:  # a bug must answer the caller, not kill the session
            # The call's kind, not its payload (a prompt may be megabytes, and the user's).
            log.exception("session %s: error handling %s", self.id, type(call).__name__)
            call.reply.fail(exc)

    # -- the actor -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The actor task: runs until the session is stopped (or the caller is cancelled)."""
        self._task = trio.lowlevel.current_task()
        self._io.now = trio.lowlevel.current_clock().current_time
        core = self.core
        store = self._checkpoints
        if store is not None:
            store.hold()  # its directory watched while the session lives
        try:
            async with trio.open_nursery() as nursery:
                self._io.nursery = nursery
                if self._own_clock:
                    nursery.start_soon(self._alarm.clock.run)
                core.start()
                task_status.started()
                try:
                    await self._loop()
                except Exception as exc:
                    core.crashed(exc)
                    raise  # for the supervisor to log: one broken session, not all of them
                finally:
                    self._close_mailbox()
                    with trio.CancelScope(shield=True):
                        await self._kill_link_on_exit()
                    nursery.cancel_scope.cancel()
        finally:
            if store is not None:
                store.release()
            core.finish()
            self._fanout.close()
            self._alarm.close()

    async def _loop(self) -> None:
        core = self.core
        while not core.done:
            self._serve_mailbox()
            if core.done:
                return
            if self._alarm.rang:  # a deadline passed (the watchdog's too)
                if self._late < 0:  # first look: what the agent said before it goes first
                    self._late = await self._posted_by_now()
                    continue  # calls that came meanwhile first, as always
                if (self._late == 0 and self._batch is None) or self._holding():
                    self._alarm.rang = False
                    self._late = -1
                    core.deadline_passed()
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
            self._alarm.set(core.next_deadline())
            item = await self._receive()
            if self._late > 0:
                self._late -= 1
            if self._raise_in_actor is not None:
                raise self._raise_in_actor
            # Calls that came while we waited go before what woke us: a second cancel posted
            # as the agent's answer to the first came in joins it, and shares its receipt.
            self._serve_mailbox()
            if not core.done:
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
            for _ in range(0 if self.core.state is State.CANCELLING else _IDLE_TURNS):
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
        return self.core.may_hold_back and self._fanout.must_wait()

    async def _hold_back(self) -> None:
        """Read no agent output until a full subscriber makes room. The agent is not silent
        meanwhile, we are not listening: the stall watchdog does not count the wait."""
        held_at = self._io.now()
        turn = self.core.holding_back()
        self._parked = "share"
        try:
            await self._fanout.wait_for_room()
        finally:
            self._parked = ""
        self.core.held_back(turn, self._io.now() - held_at)

    def _serve_mailbox(self) -> None:
        mailbox = self._mailbox
        while mailbox:
            self._handle(mailbox.popleft())

    def _close_mailbox(self) -> None:
        self._mailbox_open = False
        error = self.core.not_running()
        while self._mailbox:
            call = self._mailbox.popleft()
            if isinstance(call, _Stop):
                call.reply.resolve(self.core.exit_status)  # what it asked for is done
            else:
                call.reply.fail(error)
        self.core.abandon()

    def _on_inbox(self, item: Any) -> None:
        if isinstance(item, _Wake):
            return
        core = self.core
        if isinstance(item, AgentLines):
            self._start_batch(item.generation, "lines", item.lines)
        elif isinstance(item, AgentStderrLines):
            self._start_batch(item.generation, "stderr", item.lines)
        elif isinstance(item, AgentFrame):
            self._start_batch(item.generation, "frames", [item.frame])
        elif isinstance(item, AgentGone):
            if item.generation == core.live_generation:
                link, self._io.link = self._io.link, None
                tail = link.stderr_tail if link is not None else []
                core.life.agent_gone(item.generation, item.status, item.steps, item.survivors, tail)
        elif isinstance(item, _Spawned):
            self._spawned(item)
        elif isinstance(item, _SpawnFailed):
            core.life.spawn_failed(item.generation, item.message)
        elif isinstance(item, _KillDone):
            core.life.kill_done(item.steps, item.survivors)
        elif isinstance(item, _Closed):
            core.life.closed(item.status, item.steps, item.survivors)
        elif isinstance(item, _Swept):
            core.swept(item.generation, item.killed, item.survivors)
        elif isinstance(item, _MemoryOver):
            core.life.memory_over(item.generation, item.used_mb)
        elif isinstance(item, _CheckpointTaken):
            core.checkpoint_taken(item.turn_id, item.error)
        elif isinstance(item, _BaselineTaken):
            core.baseline_taken(item.error)
        elif isinstance(item, _TurnChanges):
            core.turn_changes(item.turn_id, item.changes, item.error)
        elif isinstance(item, _Rewound):
            core.rewound(item.turn_id, item.undo_id, item.result, item.error, item.conflict)

    def _spawned(self, spawned: _Spawned) -> None:
        core = self.core
        if not core.life.takes_agent(spawned.generation):
            assert self._io.nursery is not None
            self._io.nursery.start_soon(self._io.kill_quietly, spawned.link)
            return
        self._io.link = spawned.link
        spawned.link.take_now = self._take_now
        core.life.spawned(spawned.generation)

    async def _kill_link_on_exit(self) -> None:
        link, self._io.link = self._io.link, None
        if link is not None:
            try:
                await link.kill()
            except KillError as exc:
                log.error("session %s: %s", self.id, survivors_text(exc.survivors))

    # -- agent output, a share at a time --------------------------------------------------------

    def _start_batch(self, generation: int, kind: str, lines: list[Any]) -> None:
        if generation == self.core.live_generation and lines:
            self._batch, self._batch_kind = lines, kind
            self._batch_generation, self._batch_at = generation, 0

    def _take_now(self, item: AgentLines | AgentFrame) -> bool:
        """Offered by the live link's pump each item of agent output before it posts it:
        urgent output (a cancel's answer, a start's, a stop's) is handled at once, in the
        pump's own step, when the actor waits for its inbox with nothing before it; what the
        actor's next step would have done with it, a pass of the run loop sooner (as a call
        to a parked actor is, ``_ask``). Under load that pass is long. Else False: the pump
        posts it. Output that may wait for its share always goes through the inbox."""
        core = self.core
        if (
            self._parked != "inbox"
            or self._mailbox
            or self._batch is not None
            or self._alarm.rang
            or item.generation != core.agent.live
            # not urgent (core.urgent, spelled out: this is a cancel's cold path)
            or not (
                core.state in URGENT_STATES
                or core.life.stopping
                or core.agent.phase in STARTING_PHASES
            )
            or self._inbox_send.posted  # it has something before this, or may have
        ):
            return False
        link = self._io.link  # its writes held to the step's end, as a call's are (_ask)
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
                        core.bad_line(line)
                    else:
                        self._gate.charge(1 + len(line) // BYTES_PER_UNIT)  # (cost_of)
                        frame = decode_line(line)
                        if isinstance(frame, FramingError):
                            core.bad_line(frame)
                        elif frame is not None:
                            core.receive(frame.payload)
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
        subscribers' writers told of the new events (with a store, the events handed to it
        from its writer's step: they reach subscribers once stored)."""
        if self._fanout.recorder is not None:
            self._fanout.serialize_soon()
        self._alarm.set(self.core.next_deadline())
        self._fanout.flush()

    async def _work_through_batch(self) -> None:
        """Handle as much of the current batch as the gate allows now (all of it when the work
        is urgent), waiting for a share when there is none left this pass."""
        lines = self._batch
        assert lines is not None
        if self._batch_generation != self.core.live_generation:
            self._batch = None  # a killed predecessor's: dropped like its frames always were
            return
        want = len(lines) - self._batch_at
        urgent = self.core.urgent
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
            spent = self._one_by_one(lines, allowed, self.core.stderr_line)
        # What was done, against what was taken: a big line may take more than the share; a
        # batch that ended early gives the rest back.
        self._gate.charge(spent if urgent else spent - allowed)
        if self._batch is lines and self._batch_at >= len(lines):
            self._batch = None

    def _on_frame(self, frame: Any) -> None:
        if isinstance(frame, FramingError):
            self.core.bad_line(frame)
        else:
            self.core.receive(frame.payload)

    def _on_line(self, line: bytes | FramingError) -> None:
        frame = line if isinstance(line, FramingError) else decode_line(line)
        if frame is not None:
            self._on_frame(frame)

    def _one_by_one(self, lines: list[Any], allowed: int, handle: Callable[[Any], None]) -> int:
        """Handle items of the batch from ``_batch_at`` on, one at a time, as many as
        ``allowed`` units pay for (the first always); returns the units spent."""
        core = self.core
        spent = 0
        while self._batch is lines and self._batch_at < len(lines):
            if self._batch_generation != core.live_generation or core.done:
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
        core = self.core
        start = self._batch_at
        take, spent = _share(lines, start, allowed)
        decoded = decode_lines(lines[start : start + take], hot=core.hot_decoder)
        if len(decoded) != take:  # a blank line (never from a LineDecoder): one at a time
            return self._one_by_one(lines, allowed, self._on_line)
        core.heard_from_agent()
        generation = core.live_generation
        if FramingError not in set(map(type, decoded)):  # all messages: told in C
            done = core.receive_run(decoded, 0, take, generation)
        else:
            done = 0
            while done < take:
                item = decoded[done]
                if isinstance(item, FramingError):
                    core.bad_line(item)
                    done += 1
                else:
                    end = done + 1
                    while end < take and not isinstance(decoded[end], FramingError):
                        end += 1
                    done = core.receive_run(decoded, done, end, generation)
                    if done < end:
                        break
                if core.live_generation != generation or core.done:
                    break
        self._batch_at = start + done
        return spent if done == take else _share(lines, start, allowed, count=done)[1]


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
