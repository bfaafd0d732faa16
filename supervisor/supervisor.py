"""The supervisor: owns every session, and leaves no agent process behind.

``open_supervisor()`` is an async context manager around a nursery. Leaving it, normally, on
an exception or on outer cancellation, stops every session concurrently, each bounded by its
kill ladder, under a shield, so an embedding application that leaves its nursery leaves no
process of any agent tree alive.

It also applies, once per process, the cyclic-GC policy of a supervisor (``apply_gc_policy``;
why and at what cost: ``design/actor.md``, "Garbage collection").
"""

from __future__ import annotations

import functools
import gc
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from protocols.mcp import McpServer, McpUnsupported
from supervisor.agents.containment import choose
from supervisor.agents.link import Launcher
from supervisor.agents.process_link import ProcessLauncher
from supervisor.agents.statefile import StateFile, sweep_orphans
from supervisor.checkpoints import CheckpointError, ShadowStore, Snapshot
from supervisor.checkpoints.records import CheckpointRecords
from supervisor.config import AgentSpec, ConfigError, builtin_agents
from supervisor.core.checkpoints import CHECKPOINTS_KEPT
from supervisor.core.exit import ExitStatus
from supervisor.errors import (
    AgentNotRunning,
    AtCapacity,
    BadRequest,
    SessionNotFound,
    SupervisorError,
    check_text,
)
from supervisor.pausing import PauseStatus, Pausing
from supervisor.remote.front import RemoteHosts
from supervisor.remote.hosts import HostSpec, check_agent_hosts
from supervisor.remote.record import RemoteRecord
from supervisor.remote.revival import Revival, first_node_id
from supervisor.remote.session import RemoteSession
from supervisor.runtime.alarm import AlarmClock
from supervisor.runtime.context import Said
from supervisor.runtime.fanout import DEFAULT_BUFFER_BYTES, DEFAULT_HISTORY_BYTES
from supervisor.runtime.handle import SessionHandle
from supervisor.runtime.ingest import IngestGate
from supervisor.runtime.session import DEFAULT_HISTORY, Session, SessionSummary
from supervisor.stops import RecentStops
from supervisor.worktrees import Worktree, WorktreeError, Worktrees

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from supervisor.observe.metrics import Metrics
    from supervisor.observe.observers import Observers
    from supervisor.store.backend import CheckpointRow, StoredSession
    from supervisor.store.dormant import DormantSession
    from supervisor.store.retention import Retention
    from supervisor.store.writer import SessionStore

__all__ = ["AnySession", "Supervisor", "apply_gc_policy", "open_supervisor"]

#: A session here, or on a ``[hosts.NAME]`` (``supervisor/remote/``): the same API.
AnySession = SessionHandle

log = logging.getLogger(__name__)

#: Upper bound on stopping one session on the way out: stdin EOF wait plus the kill ladder.
_STOP_BOUND_S = 10.0
#: States in which a session holds no agent process: it does not count against a cap.
_ENDED = ("stopped", "failed")
#: Beyond the grace and the kill ladder, for a shutdown's cancels to be answered.
_SHUTDOWN_MARGIN_S = 1.0
#: Upper bound on looking at the stopped sessions' worktrees on the way out (each is a few git
#: calls: milliseconds); one not looked at in time is kept, and listed by ``worktrees``.
_WORKTREES_BOUND_S = 10.0
#: Upper bound on writing a node's last checkpoint records on the way out (a few lines each);
#: one not written in time is a checkpoint its session, started again, does not get back.
_RECORDS_BOUND_S = 5.0

#: Upper bound on deleting a failed start's rows from the store (a batch and a delete:
#: milliseconds); a store that cannot write that long keeps it, as a stopped session.
_DISCARD_BOUND_S = 5.0

#: Young-generation threshold of the cyclic GC under :func:`apply_gc_policy` (CPython's default
#: is 700 allocations; 3.13 raised it to 2000). Objects that die within this many allocations
#: never reach the older generations, so they never count towards a full collection, which
#: walks every live object (~165 per session with a turn running: 1.6 M, 1-2 s, at 10,000
#: sessions). A young collection then walks up to this many objects (a few ms). Measured with
#: ``bench/scale.py`` (design/actor.md, "Garbage collection").
GC_GEN0_THRESHOLD = 10_000

_gc_policy_applied = False


def apply_gc_policy() -> bool:
    """Tune the cyclic GC for a long-running supervisor process; once per process.

    Collects, then ``gc.freeze()``: what is alive now (modules, classes, configuration) is
    never walked again by a collection. Then raises the young-generation threshold to
    :data:`GC_GEN0_THRESHOLD` (never lowers one the application set). Leaves the GC alone if
    the application disabled it. Returns whether it changed anything.
    """
    global _gc_policy_applied
    if _gc_policy_applied or not gc.isenabled():
        return False
    _gc_policy_applied = True
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if 0 < gen0 < GC_GEN0_THRESHOLD:
        gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
    return True


class Supervisor:
    """Starts, finds, lists and stops sessions. Use :func:`open_supervisor` to get one."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        agents: Mapping[str, AgentSpec] | None = None,
        launcher: Launcher | None = None,
        max_sessions: int | None = None,
        hosts: Mapping[str, HostSpec] | None = None,
        remote_record: RemoteRecord | None = None,
        keep_node_sessions: bool = False,
        session_ids: Callable[[], str] | None = None,
        history_size: int = DEFAULT_HISTORY,
        hold_unacknowledged: bool = False,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        observers: Observers | None = None,
        store: SessionStore | None = None,
        stored: Iterable[StoredSession] = (),
        retention: Retention | None = None,
        checkpoints_dir: str | os.PathLike[str] | None = None,
        worktrees_dir: str | os.PathLike[str] | None = None,
        record_checkpoints: bool = False,
        checkpoint_watch: bool = True,
    ) -> None:
        """``checkpoints_dir``: where the checkpoint stores of its local sessions' working
        directories are (``supervisor/checkpoints/``; an agent's ``checkpoints = false``
        keeps none); None: none are kept. ``worktrees_dir``: where sessions started with
        ``worktree`` get theirs (``supervisor/worktrees.py``); None: they cannot be.
        ``record_checkpoints`` (a node's, which keeps no session store): each session's
        checkpoints are recorded beside its snapshots, for a front's stored session started
        again here (``supervisor/checkpoints/records.py``). ``checkpoint_watch``: the stores'
        snapshots are told what changed by a watcher of the directory (``ShadowStore(watch=)``)."""
        self._nursery = nursery
        self._worktrees = Worktrees(worktrees_dir) if worktrees_dir is not None else None
        self._checkpoints_dir = checkpoints_dir
        self._checkpoint_watch = checkpoint_watch
        self._records: CheckpointRecords | None = None
        if record_checkpoints and checkpoints_dir is not None:
            self._records = CheckpointRecords()
            nursery.start_soon(self._records.run)
        #: one store per working directory: sessions sharing one take turns on its index
        self._checkpoint_stores: dict[str, ShadowStore] = {}
        #: where every session and its events are written (``supervisor/store/``); None: not
        self.store = store
        #: what observes the sessions (metrics, traces); None: nothing does
        self._observers = observers
        #: events of history each session keeps (for a resubscribe with ``since_seq``), and
        #: the bytes they may take at most
        self.history_size = history_size
        self.history_bytes = history_bytes
        #: the bytes a subscriber may have buffered at most
        self.buffer_bytes = buffer_bytes
        #: a node's: sessions keep what the front has not acknowledged (``open_supervisor``)
        self.hold_unacknowledged = hold_unacknowledged
        #: leaving leaves the sessions that run in a node running there, recorded for the
        #: next front (``open_supervisor``'s ``keep_node_sessions``)
        self.keep_node_sessions = keep_node_sessions
        self.agents: dict[str, AgentSpec] = dict(agents if agents is not None else builtin_agents())
        # Its own by default: ``kill`` kills what this launcher started, nobody else's.
        self._launcher = launcher if launcher is not None else ProcessLauncher()
        #: sessions that may run at once (None: no cap); each agent may have its own too
        self.max_sessions = max_sessions
        self._sessions: dict[str, AnySession] = {}
        #: the receipts of the last turns stopped in any of its sessions (``stops.py``)
        self.stops = RecentStops()
        check_agent_hosts(self.agents, hosts or {})
        #: the remote hosts and the links to their nodes
        self.remote = RemoteHosts(nursery, hosts or {}, remote_record)
        #: pause all, resume all (``pause``)
        self._pausing = Pausing()
        if remote_record is not None:
            # Sessions a crashed front left on their hosts: ours again, same ids.
            for session in self.remote.recover(remote_record.adopt(), self.agents):
                self._sessions[session.id] = session
                self._watch_remote(session)
                session.on_held = self._held_in_node
                self._observe(session)
        stored = list(stored)
        if store is not None:
            # Sessions an earlier supervisor stored: listed, their history replayed from the
            # store; their agents are not running.

            for record in stored:
                if record.id not in self._sessions:
                    self._sessions[record.id] = self._dormant(record)
            own = {record.id: record.agent_session_id for record in stored}
            for adopted in self._sessions.values():
                if isinstance(adopted, RemoteSession):
                    # (its agent's own session id kept until its node says it again)
                    store.attach(adopted, own.get(adopted.id))
        ids = count(1 + _highest_number(record.id for record in stored))
        #: names new sessions (``s1``, ``s2``, ...; a node numbers them across its host's nodes;
        #: with a store and no ``session_ids``, the store does: ``_next_id``)
        self._new_id = session_ids if session_ids is not None else lambda: f"s{next(ids)}"
        self._ids_by_store = store is not None and session_ids is None
        self._closing = False
        self._stop_scope: trio.CancelScope | None = None  # aclose's, while it runs
        #: raised by ``start_session`` instead of starting one (``refuse_new_sessions``)
        self._refusal: SupervisorError | None = None
        #: stored sessions whose agent is being started again (``_revive``)
        self._reviving: dict[str, trio.Event] = {}
        #: sessions stopped here, no longer listed, whose end the store may not have written
        #: yet: ``find`` waits for it rather than say they are unknown (``_stored_soon``)
        self._unstored: set[str] = set()
        self._sessions_changed = trio.Event()
        #: the agent-output allowance every session of this supervisor shares (``ingest.py``)
        self.gate = IngestGate()
        nursery.start_soon(self.gate.run)
        #: the deadlines of every session's actor (``alarm.py``)
        self.alarms = AlarmClock()
        nursery.start_soon(self.alarms.run)
        if observers is not None and observers.metrics is not None:
            observers.metrics.watch(lambda: self._sessions.values(), self.remote.links)
        #: set once the store's retention sweep at start is done (at once: none to do)
        self.first_sweep = trio.Event()
        if store is not None and retention:
            nursery.start_soon(self._sweep_store_forever, retention)
        else:
            self.first_sweep.set()

    def _dormant(self, record: StoredSession) -> DormantSession:
        """A stored session listed (its agent runs nowhere here; another process of the
        store may run it: ``DormantSession.elsewhere``)."""
        from supervisor.store.dormant import DormantSession

        assert self.store is not None
        spec = self.agents.get(record.agent) or AgentSpec(
            name=record.agent, protocol=record.protocol, command=()
        )
        dormant = DormantSession(record, spec, self.store, self._revive)
        dormant.elsewhere = self.store.owner_of(record)
        return dormant

    async def _next_id(self) -> str:
        """A new session's id: handed out by the store when there is one, so that every
        process of the store gets ids of its own, never reused."""
        if self._ids_by_store:
            assert self.store is not None
            return await self.store.new_session_id()
        return self._new_id()

    async def refresh_stored(self) -> None:
        """The stored sessions listed as the store has them now: those other processes of
        the store started since are listed too, and each stored one says whether another live
        process runs it (``DormantSession.elsewhere``). Without a store, nothing to do."""
        from supervisor.store.dormant import DormantSession

        if self.store is None:
            return
        changed = False
        for record in await self.store.refresh():
            current = self._sessions.get(record.id)
            if current is None:
                self._sessions[record.id] = self._dormant(record)
                changed = True
            elif isinstance(current, DormantSession) and record.id not in self._reviving:
                current.stored = record
                current.elsewhere = self.store.owner_of(record)
        if changed:
            self._poke()

    def _store(self, session: Session | RemoteSession, resume: str | None = None) -> None:
        if self.store is not None:
            self.store.attach(session, resume)

    @property
    def metrics(self) -> Metrics | None:
        """The metrics its sessions feed (``open_supervisor(metrics=)``); None: off."""
        return self._observers.metrics if self._observers is not None else None

    def _observe(self, session: AnySession) -> None:
        if self._observers is not None:
            self._observers.attach(session)

    async def start_session(
        self,
        agent: AgentSpec | str,
        *,
        cwd: str | os.PathLike[str] | None = None,
        wait_ready: bool = True,
        host: str | None = None,
        mcp_servers: Iterable[McpServer] = (),
        resume: str | None = None,
        at_most: int | None = None,
        worktree: bool | None = None,
        after: tuple[int, int] = (0, 0),
        earlier: Sequence[Said] = (),
        checkpoints_of: str | None = None,
    ) -> AnySession:
        """Start an agent and its session; by default return once it takes prompts.

        An agent with ``hosts`` runs on one of them (``host``, or the one with the most room):
        its session is a :class:`~supervisor.remote.session.RemoteSession`, the same API.
        Raises :class:`supervisor.errors.AgentNotRunning` (with the agent's own words) when the
        agent cannot start, :class:`BadRequest` for an unknown agent name or a cwd that is not
        a directory (or whose name is not UTF-8: no agent protocol could carry it), and
        :class:`AtCapacity` when ``max_sessions`` (the supervisor's or the agent's) are running.

        ``mcp_servers`` are given to the agent on top of its own (``AgentSpec.mcp_servers``;
        one of the same name replaces the agent's), the way its protocol takes them, again at
        every respawn; :class:`BadRequest` names one its protocol cannot take. An ACP agent
        whose ``mcpCapabilities`` refuse one fails to start, with the reason
        (:class:`~supervisor.errors.AgentNotRunning`).
        ``resume``: the agent's own id of an earlier session (``Session.agent_session_id``) to go
        on with, the way a respawn does (a refused resume starts afresh, and says so).
        ``at_most``: :class:`AtCapacity` too unless fewer than this many sessions are live here
        (a node applies a front's ``[hosts.NAME] max_sessions`` with it: checked and counted
        in one step, so two fronts racing for the last place cannot both win).
        ``worktree``: the session runs in a new git worktree of ``cwd``'s repository, on a
        branch named after it (None: as its agent's ``worktree`` says;
        ``design/worktrees.md``); :class:`BadRequest` for a ``cwd`` in no repository.
        ``after`` and ``earlier`` (a node's, for a front's stored session started again on
        it: ``supervisor/remote/revival.py``): the last seq and the number of turns it goes
        on after, and what was said, for an agent that cannot resume; ``checkpoints_of``: the
        key its checkpoints were recorded under here (a node's ``record_checkpoints``), had
        back for a rewind or a diff of its earlier turns, its own recorded under it too.
        """
        if self._closing:
            raise BadRequest("the supervisor is shutting down")
        if self._refusal is not None:
            raise self._refusal
        spec = self._resolve(agent)
        extra = tuple(mcp_servers)
        if extra:
            try:
                spec = spec.with_mcp_servers(extra)
            except McpUnsupported as exc:
                raise BadRequest(str(exc)) from None
        if host is not None or spec.hosts:
            if worktree:
                raise BadRequest("a worktree is for sessions on this machine, not on a host")
            if resume is not None:
                raise BadRequest("resuming a session on another host is not supported")
            return await self._place(spec, host, os.fspath(cwd) if cwd is not None else spec.cwd)
        where = os.fspath(cwd if cwd is not None else spec.cwd or os.getcwd())
        if isinstance(where, bytes):
            where = os.fsdecode(where)
        check_text("cwd", where)
        if not os.path.isdir(where):
            raise BadRequest(f"cwd {where!r} is not a directory")
        self._check_capacity(spec, at_most)
        session_id = await self._next_id()
        made: Worktree | None = None
        if spec.worktree if worktree is None else worktree:
            made = await self._make_worktree(session_id, where)
            where = made.cwd
            try:
                self._check_capacity(spec, at_most)  # others may have started meanwhile
            except AtCapacity:
                await self._release_quietly(made)
                raise
        key = checkpoints_of if checkpoints_of is not None else session_id
        try:
            kept = await self._recorded_checkpoints(key, spec, where) if checkpoints_of else []
            session = await self._start_here(
                session_id, spec, where, resume, after, earlier, worktree=made, kept=kept, key=key
            )
        except BaseException:
            if made is not None and session_id not in self._sessions:
                await self._release_quietly(made)
            raise
        if wait_ready:
            try:
                await session.wait_ready()
            except SupervisorError:
                await self._discard_failed_start(session)
                raise
            except BaseException:
                # Its caller went away: stopped and forgotten, never left running for nobody,
                # unless somebody else took it up meanwhile (it is listed while it starts).
                if session.untouched:
                    self._forget_soon(session)
                raise
        return session

    async def _place(
        self,
        spec: AgentSpec,
        host: str | None,
        cwd: str | None,
        revive: tuple[str, Revival] | None = None,
    ) -> RemoteSession:
        """A session on one of ``spec``'s hosts (``host``, if given), listed and stored;
        ``revive``: the stored session of this id started again on its ``host``."""
        changes = self._pausing.changes
        remote = await self.remote.start_session(
            spec,
            host=host,
            cwd=cwd,
            paused=self._pausing.for_new_session(),
            revive=revive,
        )
        self._sessions[remote.id] = remote
        self._store(remote, revive[1].resume if revive is not None else None)
        self._watch_remote(remote)
        if self._pausing.changes != changes:  # paused or resumed while it was placed
            await self._pausing.bring_one(remote)
        self._observe(remote)
        return remote

    def _watch_remote(self, session: RemoteSession) -> None:
        """Its stops to :attr:`stops`; with a store, once its node lost it, it is listed as
        stored, and a prompt starts it again on its host."""
        self._watch_stops(session)
        if self.store is not None:
            session.on_gone = self._list_gone
            session.revive = self._revive_gone

    def _list_gone(self, session: RemoteSession) -> None:
        with suppress(RuntimeError):  # the supervisor is closing
            self._nursery.start_soon(self._reopen_quietly, session.id)

    async def _reopen_quietly(self, session_id: str) -> None:
        from supervisor.store.backend import StoreError

        try:
            await self.reopen(session_id)
        except (SupervisorError, StoreError) as exc:  # listed as failed meanwhile
            log.warning(
                "session %s: its node lost it, and the store cannot say: %s", session_id, exc
            )

    async def _revive_gone(self, session: RemoteSession) -> AnySession:
        """``session``'s node lost it: the stored session, started again on its host."""
        from supervisor.store.dormant import DormantSession

        found = await self.reopen(session.id)
        if isinstance(found, DormantSession):
            return await found.revive()
        if found is session:  # (the store no longer has it: retention let it go)
            raise AgentNotRunning(f"session {session.id}'s node lost it, and the store has it not")
        return found  # started again meanwhile

    async def _start_here(
        self,
        session_id: str,
        spec: AgentSpec,
        where: str,
        resume: str | None,
        after: tuple[int, int] = (0, 0),
        earlier: Sequence[Said] = (),
        worktree: Worktree | None = None,
        kept: Sequence[tuple[CheckpointRow, Snapshot, Snapshot | None]] = (),
        key: str | None = None,
    ) -> Session:
        """A session on this machine, listed, its actor running (its agent starting);
        ``worktree``: the one made for it, ``where`` is in it; ``kept``: the checkpoints it
        had before (``Session.seed_checkpoints``); ``key``: what its checkpoints are recorded
        under (``record_checkpoints``; None: its id)."""
        shadow = self._checkpoint_store(spec, where)
        session = Session(
            session_id,
            spec,
            cwd=where,
            launcher=self._launcher,
            gate=self.gate,
            alarms=self.alarms,
            resume=resume,
            history_size=self.history_size,
            hold_unacknowledged=self.hold_unacknowledged,
            history_bytes=self.history_bytes,
            buffer_bytes=self.buffer_bytes,
            paused=self._pausing.for_new_session(),
            after=after,
            earlier=earlier,
            checkpoints=shadow,
        )
        session.worktree = worktree
        if kept:
            session.seed_checkpoints(kept)
        if self._records is not None and shadow is not None:
            path = self._records.path(shadow, key if key is not None else session_id)
            session.on_checkpoint = functools.partial(self._records.keep, path)
        self._sessions[session.id] = session
        self._observe(session)
        self._store(session, resume)
        session.on_ended = self._poke  # a retired node's drain counts a failed session too
        self._watch_stops(session)
        await self._nursery.start(self._run_session, session)
        return session

    async def _make_worktree(self, session_id: str, cwd: str) -> Worktree:
        if self._worktrees is None:
            raise BadRequest(
                "a worktree needs the supervisor's state directory (serve has one;"
                " open_supervisor(state_dir=...))"
            )
        try:
            return await self._worktrees.create(session_id, cwd)
        except WorktreeError as exc:
            raise BadRequest(f"no worktree for the session: {exc}") from None

    async def _release_quietly(self, worktree: Worktree) -> None:
        if self._worktrees is not None:
            with trio.CancelScope(shield=True):
                await self._worktrees.release(worktree)

    async def _leave_worktree(self, session: AnySession) -> None:
        """``session`` stopped: its worktree removed if it holds no work, else kept and said
        (``Session.worktree_left``)."""
        if not isinstance(session, Session) or self._worktrees is None:
            return
        worktree = session.worktree
        if worktree is not None and session.worktree_left is None:
            session.worktree_left = await self._worktrees.release(worktree)

    def _checkpoint_store(self, spec: AgentSpec, cwd: str) -> ShadowStore | None:
        if self._checkpoints_dir is None or not spec.checkpoints:
            return None
        real = os.path.realpath(cwd)
        if real in (os.path.sep, os.path.realpath(os.path.expanduser("~"))):
            # Not a project: a snapshot would walk every file below (a home's caches, a
            # whole filesystem), and every turn's start would wait for it.
            return None
        store = self._checkpoint_stores.get(real)
        if store is None:
            store = self._checkpoint_stores[real] = ShadowStore(
                self._checkpoints_dir,
                real,
                watch=self._checkpoint_watch,
                own=[os.path.dirname(self._checkpoints_dir)],  # the state directory
            )
        return store

    async def _revive(self, dormant: DormantSession) -> AnySession:
        """Start the agent of a stored session again (a prompt or steer came for it): the
        session keeps its id, its agent resumes its own session (``resume=``, as a respawn
        does; a refused resume starts afresh and says so), it gets the MCP servers it was
        started with, and its seqs and turn ids go on after the stored ones. Returns the live
        session once it takes prompts."""
        reviving = self._reviving.get(dormant.id)
        if reviving is not None:  # two prompts at once: one start
            await reviving.wait()
        current = self.get(dormant.id)
        if current is not dormant:
            return current
        if self._closing:
            raise BadRequest("the supervisor is shutting down")
        if self._refusal is not None:
            raise self._refusal
        if dormant.host is not None and dormant.host not in self.remote.hosts:
            raise BadRequest(
                f"session {dormant.id} ran on host {dormant.host}, which is not configured here"
                f" ([hosts.{dormant.host}]): it stays stored"
            )
        spec = self._resolve(dormant.spec.name)
        from supervisor.store.writer import mcp_servers_from_json

        stored_servers = mcp_servers_from_json(dormant.stored.mcp_servers)
        if stored_servers:
            # The servers it was started with, on top of its agent's own as configured now.
            try:
                spec = spec.with_mcp_servers(stored_servers)
            except McpUnsupported as exc:
                raise BadRequest(str(exc)) from None
        if dormant.host is None:
            self._check_capacity(spec)  # (a host's node counts its own)
        self._reviving[dormant.id] = done = trio.Event()
        try:
            from supervisor.store.backend import SessionElsewhere, StoreError

            assert self.store is not None
            # Taken up in the store first: another process of it may run it (refused, naming
            # that process), or have run it since it was listed here (its row as it is now).
            try:
                dormant.stored = await self.store.claim(dormant.id)
            except SessionElsewhere as exc:
                dormant.elsewhere = self.store.owner_of(dormant.stored)
                raise AgentNotRunning(str(exc)) from None
            except StoreError as exc:
                raise AgentNotRunning(
                    f"session {dormant.id} cannot be started again: {exc}"
                ) from None
            dormant.elsewhere = None
            if dormant.host is not None:
                return await self._revive_on_host(dormant, dormant.host, spec)
            where = dormant.cwd or spec.cwd or os.getcwd()
            worktree = await self._reopen_worktree(dormant)
            if worktree is not None:
                where = worktree.cwd
            if not os.path.isdir(where):
                raise BadRequest(f"cwd {where!r} of stored session {dormant.id} is not a directory")
            assert self.store is not None
            turns = await self.store.turns(dormant.id)
            kept = await self._stored_checkpoints(dormant.id, spec, where)
            # What was said, should its agent start afresh (runtime/context.py): read now, as
            # the agent's answer to the resume comes in the actor, which never waits on I/O.
            earlier = await self.store.conversation(dormant.id, spec.context_bytes)
            session = await self._start_here(
                dormant.id,
                spec,
                where,
                dormant.agent_session_id,
                after=(dormant.last_seq, turns),
                earlier=earlier,
                worktree=worktree,
                kept=kept,
            )
            await session.wait_ready()  # failed to start: listed as failed, its history kept
        finally:
            del self._reviving[dormant.id]
            done.set()
        return session

    async def _revive_on_host(
        self, dormant: DormantSession, host: str, spec: AgentSpec
    ) -> RemoteSession:
        """``_revive`` of a session of another host: on that host, by its node, in the same
        cwd there (``supervisor/remote/revival.py``). A host that cannot be reached is
        :class:`~supervisor.remote.errors.HostUnreachable`, naming it: the session stays
        stored."""
        assert self.store is not None
        revival = Revival(
            resume=dormant.agent_session_id,
            last_seq=dormant.last_seq,
            turns=await self.store.turns(dormant.id),
            earlier=tuple(await self.store.conversation(dormant.id, spec.context_bytes)),
            checkpoints_of=first_node_id(dormant.id),
        )
        # (a stored cwd of "" is a session started in its node's own directory)
        return await self._place(spec, host, dormant.cwd or None, (dormant.id, revival))

    async def _stored_checkpoints(
        self, session_id: str, spec: AgentSpec, where: str
    ) -> list[tuple[CheckpointRow, Snapshot, Snapshot | None]]:
        """The checkpoints a stored session kept, from the session store's rows and the
        checkpoint store's commits: a rewind or a diff of a turn from before the restart
        works. Those whose commits are gone are left out; a store that cannot be read leaves
        out all (said in the log): the session runs on without them."""
        shadow = self._checkpoint_store(spec, where)
        if shadow is None or self.store is None:
            return []
        rows = await self.store.checkpoints(session_id, CHECKPOINTS_KEPT)
        return await self._load_checkpoints(session_id, shadow, rows)

    async def _recorded_checkpoints(
        self, key: str, spec: AgentSpec, where: str
    ) -> list[tuple[CheckpointRow, Snapshot, Snapshot | None]]:
        """The checkpoints a node recorded under ``key`` (``record_checkpoints``): a front's
        stored session started again here has its earlier turns' back. As
        :meth:`_stored_checkpoints`, those whose commits are gone are left out."""
        shadow = self._checkpoint_store(spec, where)
        if shadow is None or self._records is None:
            return []
        try:
            rows = await self._records.read(self._records.path(shadow, key), key)
        except OSError as exc:
            log.warning("checkpoints recorded under %s cannot be read: %s", key, exc)
            return []
        return await self._load_checkpoints(key, shadow, rows)

    async def _load_checkpoints(
        self, session_id: str, shadow: ShadowStore, rows: Sequence[CheckpointRow]
    ) -> list[tuple[CheckpointRow, Snapshot, Snapshot | None]]:
        """``rows`` with their snapshots, read from ``shadow``'s commits."""
        try:
            found = await shadow.load(c for row in rows for c in (row.start, row.end) if c)
        except CheckpointError as exc:
            log.warning("session %s: its earlier checkpoints cannot be read: %s", session_id, exc)
            return []
        return [
            (row, found[row.start], found.get(row.end) if row.end is not None else None)
            for row in rows
            if row.start in found
        ]

    async def _reopen_worktree(self, dormant: DormantSession) -> Worktree | None:
        """The worktree a stored session ran in, there again for it (None: it had none)."""
        stored = dormant.stored.worktree
        if stored is None:
            return None
        if self._worktrees is None:
            raise BadRequest(
                f"session {dormant.id} ran in a worktree, and this supervisor keeps none"
                " (it has no state directory)"
            )
        try:
            return await self._worktrees.reopen(Worktree.from_json(stored))
        except WorktreeError as exc:
            raise BadRequest(
                f"session {dormant.id}'s worktree cannot be had again: {exc}"
            ) from None

    def _watch_stops(self, session: Session | RemoteSession) -> None:
        """Each stop of ``session`` goes to :attr:`stops`, with its agent."""
        session.on_stop = functools.partial(
            self.stops.add, session.spec.name, session.spec.protocol
        )

    def _forget_soon(self, session: Session) -> None:
        with suppress(RuntimeError):  # the supervisor is closing: it stops all
            self._nursery.start_soon(self._forget, session)

    async def _forget(self, session: Session) -> None:
        with suppress(SupervisorError):
            await self.stop_session(session.id)

    async def _discard_failed_start(self, session: Session) -> None:
        """``session``'s agent never came up: no session to go back to (its starter has the
        reason), so it is neither listed nor kept in the store, where it would stay a past
        session without a prompt. Listed as failed until its rows are gone, so a call naming it
        meanwhile says why."""
        from supervisor.store.backend import StoreError

        with trio.CancelScope(shield=True):  # (its starter may be leaving: done all the same)
            await session.stop()  # (over already: this waits for its actor's last events)
            if self.store is not None:
                with trio.move_on_after(_DISCARD_BOUND_S), suppress(StoreError):
                    await self.store.flushed()
                    await self.store.delete([session.id])
            with suppress(SupervisorError):
                await self.stop_session(session.id)

    def _check_capacity(self, spec: AgentSpec, at_most: int | None = None) -> None:
        live = [s for s in self._sessions.values() if s.state not in _ENDED]
        if at_most is not None and len(live) >= at_most:
            raise AtCapacity(
                f"{len(live)} sessions are live here, its max_sessions for this host is {at_most}"
            )
        if self.max_sessions is not None and len(live) >= self.max_sessions:
            raise AtCapacity(
                f"{len(live)} sessions are running, the most this supervisor runs at once"
                " (max_sessions): stop one first"
            )
        if spec.max_sessions is not None:
            same = sum(1 for s in live if s.spec.name == spec.name)
            if same >= spec.max_sessions:
                raise AtCapacity(
                    f"{same} sessions of agent {spec.name!r} are running, its max_sessions:"
                    " stop one first"
                )

    def _resolve(self, agent: AgentSpec | str) -> AgentSpec:
        if isinstance(agent, AgentSpec):
            return agent
        try:
            return self.agents[agent]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise BadRequest(f"unknown agent {agent!r} (known: {known})") from None

    async def _run_session(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await session.run(task_status=task_status)
        except Exception:
            # One broken session must not take the others down with it.
            log.exception("session %s crashed", session.id)
        except BaseExceptionGroup as group:
            # A crash still being cleaned up when the supervisor is cancelled comes with that
            # Cancelled: the crash is logged as any other, only the Cancelled goes on.
            crashed, rest = group.split(Exception)
            if crashed is not None:
                log.error("session %s crashed", session.id, exc_info=crashed)
            if rest is not None:
                raise rest from None
        finally:
            self._poke()

    async def _sweep_store_forever(self, keep: Retention) -> None:
        from supervisor.store.backend import StoreError
        from supervisor.store.retention import SWEEP_EVERY_S

        while True:
            try:
                await self.sweep_store(keep)
            except StoreError as exc:  # the database is away: the next sweep tries again
                log.error("store: the retention sweep failed (%s); the next is in an hour", exc)
            self.first_sweep.set()
            await trio.sleep(SWEEP_EVERY_S)

    async def sweep_store(self, keep: Retention) -> list[str]:
        """Delete the stored sessions ``keep`` lets go (``supervisor/store/retention.py``):
        stopped ones only, never one running or being started again; they leave the list
        first, so nothing starts them meanwhile. Returns their ids."""
        from supervisor.store.dormant import DormantSession

        assert self.store is not None
        running = {i for i, s in self._sessions.items() if not isinstance(s, DormantSession)}
        found = await self.store.expired(keep, running | set(self._reviving))
        gone = []
        for session_id in found:
            session = self._sessions.get(session_id)
            if session_id in self._reviving or not isinstance(session, DormantSession | None):
                continue  # started again since it was found
            self._sessions.pop(session_id, None)
            gone.append(session_id)
        if gone:
            self._poke()
            await self.store.delete(gone)
            log.info("store: %d stopped sessions deleted, as [store] keep_* asks", len(gone))
        return gone

    def _poke(self) -> None:
        self._sessions_changed.set()
        self._sessions_changed = trio.Event()

    def refuse_new_sessions(self, error: SupervisorError) -> None:
        """From now on ``start_session`` raises ``error`` (a retired node's ``node_retired``);
        the sessions there are go on."""
        self._refusal = error

    def live_sessions(self) -> int:
        """Sessions that hold an agent (neither stopped nor failed)."""
        return sum(1 for s in self._sessions.values() if s.state not in _ENDED)

    async def wait_no_live_sessions(self) -> None:
        """Return once every session has stopped or failed (a retired node's drain)."""
        while self.live_sessions() > 0:
            await self._sessions_changed.wait()

    def get(self, session_id: str) -> AnySession:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no session {session_id!r}") from None

    async def find(self, session_id: str) -> AnySession:
        """The session ``session_id``: one listed here, or one the store has that another of
        its processes started since the last list (listed from now on, as stored: it says
        which process runs it). :class:`SessionNotFound` when neither knows it."""
        current = self._sessions.get(session_id)
        if current is not None or self.store is None:
            return self.get(session_id)
        if session_id in self._unstored:
            await self.store.flushed()
        record = await self.store.stored(session_id)
        current = self._sessions.get(session_id)
        if current is not None:  # (listed meanwhile)
            return current
        if record is None:
            raise SessionNotFound(f"no session {session_id!r}")
        dormant = self._sessions[session_id] = self._dormant(record)
        self._poke()
        return dormant

    def list(self) -> list[SessionSummary]:
        return [session.summary() for session in self._sessions.values()]

    async def reopen(self, session_id: str) -> AnySession:
        """The session ``session_id`` to go on with: the one listed, unless its agent stopped
        or failed here and the store has it: then it is listed again as stored
        (:class:`~supervisor.store.dormant.DormantSession`, as an earlier supervisor's), and
        a prompt starts its agent again, resuming its own session. Raises
        :class:`SessionNotFound` when neither this supervisor nor its store knows it."""
        current = self._sessions.get(session_id)
        if self.store is None or (current is not None and current.state not in _ENDED):
            return self.get(session_id)
        from supervisor.store.dormant import DormantSession

        if isinstance(current, DormantSession):
            return current
        await self.store.flushed()  # its last events and its row are in the store
        stored = await self.store.stored(session_id)
        current = self._sessions.get(session_id)
        if stored is None or (current is not None and current.state not in _ENDED):
            return self.get(session_id)  # unknown; or started again meanwhile
        if isinstance(current, DormantSession):
            return current
        dormant = self._dormant(stored)
        self._sessions[session_id] = dormant
        self._poke()
        return dormant

    async def stop_session(self, session_id: str) -> ExitStatus | None:
        session = self.get(session_id)
        status = await session.stop()
        if self._sessions.pop(session_id, None) is not None:
            if self._observers is not None:
                self._observers.retire(session)
            if self.store is not None:
                self._unstored.add(session_id)
                with suppress(RuntimeError):  # the supervisor is closing: nothing asks again
                    self._nursery.start_soon(self._stored_soon, session_id)
        self._poke()
        await self._leave_worktree(session)
        return status

    async def _stored_soon(self, session_id: str) -> None:
        assert self.store is not None
        await self.store.flushed()
        self._unstored.discard(session_id)

    async def pause(self, deadline_s: float | None = None) -> PauseStatus:
        """Pause all: from now on no new turn starts in any session, running now or started
        later, until :meth:`resume`. A prompt is accepted and queued, its answer saying
        ``held: "paused"``; turns already running go on, and those still running
        ``deadline_s`` seconds from now are cancelled through the ladder (``reason:
        "paused"``; None: they finish by themselves). Paused already, an earlier deadline
        stands. Returns once every session holds (a session on a host whose link is down is
        ``pending``: its node is told once the link is back)."""
        self._pausing.hold(deadline_s)
        await self._pausing.bring(self._sessions.values())
        return self.pause_status()

    async def resume(self) -> PauseStatus:
        """Resume all: every session starts what it held, in order. Idempotent."""
        self._pausing.release()
        await self._pausing.bring(self._sessions.values())
        return self.pause_status()

    def pause_status(self) -> PauseStatus:
        return self._pausing.status(self._sessions.values())

    def _held_in_node(self, session: RemoteSession) -> None:
        """An adopted session is paused in its node (a front before this one paused it, and
        nobody resumed it): the pause is this supervisor's now, never lost on the way."""
        if self._pausing.held:
            return
        log.warning(
            "session %s is paused in its node: this supervisor takes the pause up and holds"
            " new turns in every session (resume releases them)",
            session.id,
        )
        self._pausing.hold(None)
        with suppress(RuntimeError):  # closing: nothing left to hold
            self._nursery.start_soon(self._pausing.bring, list(self._sessions.values()))

    def _kept(self, session: AnySession) -> bool:
        """Left running in its node when this supervisor closes (``keep_node_sessions``)."""
        return self.keep_node_sessions and isinstance(session, RemoteSession)

    async def cancel_turns(self, reason: str = "shutdown") -> None:
        """Cancel every running turn through its ladder, concurrently, and refuse new sessions
        (the first step of a graceful shutdown). Returns once every cancel was answered, or
        after the longest grace plus kill ladder of those agents: it never waits for a respawn
        that a stop would undo anyway."""
        self._closing = True
        for session in self._sessions.values():
            if isinstance(session, Session):
                session.closing = "the supervisor is shutting down"
        running = [
            s for s in self._sessions.values() if s.turn_id is not None and not self._kept(s)
        ]
        if not running:
            return
        bound = max(s.spec.grace_s + s.spec.kill_timeout_s for s in running) + _SHUTDOWN_MARGIN_S
        with trio.move_on_after(bound):
            async with trio.open_nursery() as nursery:
                for session in running:
                    nursery.start_soon(self._cancel_quietly, session, reason)

    async def _cancel_quietly(self, session: AnySession, reason: str) -> None:
        try:
            await session.cancel(reason=reason)
        except SupervisorError:  # stopped or failed meanwhile: nothing left to cancel
            pass

    async def kill(self) -> None:
        """Kill every agent's tree now (SIGTERM and SIGKILL with no wait between), and end
        every session: for when a graceful stop takes too long (a second Ctrl-C)."""
        self._closing = True
        if self._stop_scope is not None:
            self._stop_scope.cancel()  # an aclose waiting for stops: they are moot now
        kill_all = getattr(self._launcher, "kill_all", None)
        if kill_all is not None:
            await kill_all()
        self._nursery.cancel_scope.cancel()  # each actor kills what is left of its tree

    async def aclose(self) -> None:
        """Stop every session at once (but those kept in their nodes: ``keep_node_sessions``);
        bounded, and safe to call while being cancelled."""
        self._closing = True
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_STOP_BOUND_S) as self._stop_scope:
                async with trio.open_nursery() as nursery:
                    for session in list(self._sessions.values()):
                        if not self._kept(session):
                            nursery.start_soon(self._stop_quietly, session)
            self._stop_scope = None
            with trio.move_on_after(_WORKTREES_BOUND_S):
                async with trio.open_nursery() as nursery:
                    for session in list(self._sessions.values()):
                        nursery.start_soon(self._leave_worktree, session)
            for session in self._sessions.values():
                if isinstance(session, RemoteSession) and self._kept(session):
                    session.release()
            await self.remote.aclose(release=self.keep_node_sessions)
            if self._records is not None:  # (its sessions' last checkpoints, recorded)
                self._records.close()
                with trio.move_on_after(_RECORDS_BOUND_S):
                    await self._records.drained.wait()
        self._nursery.cancel_scope.cancel()

    async def _stop_quietly(self, session: AnySession) -> None:
        try:
            await session.stop()
        except Exception:  # already stopped or failed: its actor still kills the tree on exit
            pass


@asynccontextmanager
async def open_supervisor(
    *,
    agents: Mapping[str, AgentSpec] | None = None,
    config: str | os.PathLike[str] | None = None,
    launcher: Launcher | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    gc_policy: bool = False,
    containment: str | None = None,
    max_sessions: int | None = None,
    hosts: Mapping[str, HostSpec] | None = None,
    keep_node_sessions: bool = False,
    session_ids: Callable[[], str] | None = None,
    history_size: int = DEFAULT_HISTORY,
    hold_unacknowledged: bool = False,
    history_bytes: int = DEFAULT_HISTORY_BYTES,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    metrics: Metrics | None = None,
    tracer_provider: TracerProvider | None = None,
    store: str | None = None,
    store_kind: str = "serve",
    store_writer: str = "process",
    retention: Retention | None = None,
    checkpoints: bool = True,
    record_checkpoints: bool = False,
    checkpoint_watch: bool = True,
) -> AsyncIterator[Supervisor]:
    """A supervisor whose sessions all end, with their process trees, when the block ends.

    With ``state_dir`` (``serve`` uses ``~/.local/state/agent-supervisor``), agent processes
    left by a supervisor that crashed are killed first, and this one records its own. A state
    directory that cannot be used (a read-only home) is logged, in one line, and the supervisor
    runs without that crash safety. Its local sessions' working directories are checkpointed
    per turn under ``state_dir/checkpoints`` (``design/checkpoints.md``) unless ``checkpoints``
    is false or their agent's ``checkpoints = false``, each snapshot told what changed by a
    watcher of the directory unless ``checkpoint_watch`` is false (``[checkpoints] watch``);
    sessions started with ``worktree``
    run in git worktrees under ``state_dir/worktrees`` (``design/worktrees.md``).
    ``record_checkpoints`` (a node's): each session's checkpoints are recorded beside its
    snapshots, for a front's stored session started again here
    (``supervisor/checkpoints/records.py``).
    ``max_sessions`` caps the sessions running at once (``AtCapacity`` beyond it).
    ``containment`` is ``auto`` (the default: a cgroup per agent where the host allows it, else
    the shim), ``cgroup`` or ``shim`` (``supervisor/agents/containment.py``); None reads
    ``AGENT_SUPERVISOR_CONTAINMENT``.
    ``hosts``: the ``[hosts.NAME]`` its agents may run on (a ``config`` file's are read too).
    With a ``state_dir``, the sessions it places in nodes are recorded there, and the next
    supervisor with that ``state_dir`` (in this process or another) finds them again.
    ``keep_node_sessions``: leaving the block stops every session (the default), or, True,
    leaves the sessions that run in a node running there, their turns going on, for the next
    supervisor to adopt (their node stops them after its ``detach_s`` if none comes); needs a
    ``state_dir``. Sessions without a node are stopped either way.
    ``session_ids``: names new sessions (default ``s1``, ``s2``, ...).
    ``history_size``: events each session keeps for a resubscribe with ``since_seq``;
    ``history_bytes``: the most bytes of JSON they take (the oldest go first, and a late
    subscriber hears of them as a ``stream.gap``); ``buffer_bytes``: the most one subscriber
    may have buffered (past it, it is cut off as for a full buffer of events).
    ``hold_unacknowledged`` (a node's): a session drops no event its driver has not
    acknowledged; with ``history_size`` of them it stops reading its agent until they are.
    ``gc_policy=True`` applies :func:`apply_gc_policy` (once per process): the CLI does, since
    it owns its process; an embedding application owns its garbage collector and opts in.
    ``metrics``: a :class:`~supervisor.observe.Metrics` its sessions feed (None: none kept;
    ``serve`` and ``node`` keep one, at ``GET /metrics``). ``tracer_provider``: OpenTelemetry
    spans per session, turn, cancel and rung of the ladder go to it (``agent-supervisor[otel]``);
    None: to the application's global provider if it set one, else none are made
    (``supervisor/observe/``, ``docs/metrics.md``).
    ``store``: the URL of a session store (``sqlite:///PATH``; ``design/store.md``) where
    every session, event, receipt and prompt is written, and whose sessions are listed again
    (stopped, their history replayed from it); None or ``"none"``: nothing is stored (the
    default: an embedding application's sessions live in its memory). A store that cannot be
    opened raises :class:`~supervisor.store.backend.StoreError`, one line saying what to do.
    ``store_kind``: what this process is to the store's other processes (``serve``, of which
    one at a time opens a store; ``acp``, an ACP front door, any number beside it).
    ``store_writer``: what writes its batches, ``"process"`` (a child process of its own, the
    default: under a flood of many sessions a thread waits for the GIL; ``design/store.md``)
    or ``"thread"`` (the store's worker thread: no second process).
    ``retention``: how long the store keeps stopped sessions (``[store] keep_days``,
    ``keep_sessions``, ``keep_bytes``; None: for good), swept at start and every hour.
    """
    if store_writer not in ("process", "thread"):
        raise ConfigError(f"store_writer is {store_writer!r}: 'process' (the default) or 'thread'")
    if gc_policy:
        apply_gc_policy()
    state: StateFile | None = None
    if launcher is None:
        chosen = await choose(containment)
        log.info("agent containment: %s", chosen.detail)
        if state_dir is not None:
            state = await _open_state(Path(state_dir))
        launcher = ProcessLauncher(state, containment=chosen)
    if config is not None:
        from supervisor.config import load_agents
        from supervisor.remote.hosts import load_hosts

        if agents is not None:
            raise ConfigError("give agents or config, not both")
        agents = load_agents(config)
        hosts = {**load_hosts(config), **(hosts or {})}
    record = RemoteRecord(Path(state_dir)) if state_dir is not None and hosts else None
    if keep_node_sessions and state_dir is None:
        raise ConfigError(
            "keep_node_sessions needs a state_dir: that is where the next supervisor finds them"
        )
    observers = _observers(metrics, tracer_provider)
    session_store: SessionStore | None = None
    stored: list[StoredSession] = []
    if store is not None:
        from supervisor.store.url import backend_for
        from supervisor.store.writer import SessionStore

        backend = backend_for(store, store_kind)
        if backend is not None:
            session_store = SessionStore(backend, apart=store_writer == "process")
            stored = await session_store.open()
    try:
        async with trio.open_nursery() as writer, trio.open_nursery() as nursery:
            if session_store is not None:
                writer.start_soon(session_store.run)
            supervisor = Supervisor(
                nursery,
                agents=agents,
                launcher=launcher,
                max_sessions=max_sessions,
                hosts=hosts,
                remote_record=record,
                keep_node_sessions=keep_node_sessions,
                session_ids=session_ids,
                history_size=history_size,
                hold_unacknowledged=hold_unacknowledged,
                history_bytes=history_bytes,
                buffer_bytes=buffer_bytes,
                observers=observers,
                store=session_store,
                stored=stored,
                retention=retention,
                checkpoints_dir=(
                    await _checkpoints_dir(Path(state_dir))
                    if state_dir is not None and checkpoints
                    else None
                ),
                worktrees_dir=Path(state_dir) / "worktrees" if state_dir is not None else None,
                record_checkpoints=record_checkpoints,
                checkpoint_watch=checkpoint_watch,
            )
            try:
                yield supervisor
            finally:
                await supervisor.aclose()
                if session_store is not None:
                    # Its sessions' last events were recorded as they stopped: written here,
                    # before the nurseries exit, which an exception leaving the block (a
                    # KeyboardInterrupt) would do cancelling the writer, the close's events
                    # never written and the sessions marked clean.
                    with trio.CancelScope(shield=True):
                        await session_store.aclose()
    except BaseExceptionGroup as group:
        # Sessions never raise into this nursery, so a lone exception is the caller's own:
        # give it back as raised, not wrapped in a group it did not ask for.
        lone: BaseException = group
        while isinstance(lone, BaseExceptionGroup) and len(lone.exceptions) == 1:
            lone = lone.exceptions[0]  # (the writer's nursery holds the sessions')
        if lone is not group:
            raise lone from None
        raise
    finally:
        if state is not None:
            state.close()


def _highest_number(ids: Iterable[str]) -> int:
    """The highest N of ids ``sN`` (0: none): new sessions are numbered past it."""
    return max((int(i[1:]) for i in ids if i[:1] == "s" and i[1:].isdigit()), default=0)


def _observers(metrics: Metrics | None, provider: TracerProvider | None) -> Observers | None:
    """What observes the sessions; None when nothing is asked for (nothing is imported)."""
    if provider is None:
        from supervisor.observe.tracing import global_provider

        provider = global_provider()
    if metrics is None and provider is None:
        return None
    from supervisor.observe.observers import Observers

    tracing = None
    if provider is not None:
        from supervisor.observe.tracing import Tracing

        tracing = Tracing(provider)
    return Observers(metrics, tracing)


async def _checkpoints_dir(state_dir: Path) -> Path | None:
    """Where the sessions' per-turn checkpoints are kept; None (and one line in the log) if it
    cannot be made: sessions then run without checkpoints rather than fail each turn's."""
    directory = state_dir / "checkpoints"
    try:
        await trio.to_thread.run_sync(
            functools.partial(directory.mkdir, parents=True, exist_ok=True)
        )
    except OSError as exc:
        log.warning(
            "checkpoints are off: %s cannot be used (%s): turns' changes are not recorded and"
            " cannot be rewound",
            directory,
            exc.strerror or exc,
        )
        return None
    return directory


async def _open_state(directory: Path) -> StateFile | None:
    """Sweep what crashed supervisors left in ``directory``, and start our own file there;
    None (and one line in the log) if the directory cannot be used."""
    try:
        report = await trio.to_thread.run_sync(sweep_orphans, directory)
        state = StateFile(directory)
        state.open()
    except OSError as exc:
        log.warning(
            "state directory %s is unusable (%s): running without crash safety (agents left"
            " by a supervisor that crashes will not be swept at the next start)",
            directory,
            exc.strerror or exc,
        )
        return None
    if report.killed:
        log.warning(
            "swept %d agent process(es) left by %d crashed supervisor(s)",
            len(report.killed),
            report.files,
        )
    return state
