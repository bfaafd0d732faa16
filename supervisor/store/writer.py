"""The trio side of the store: sessions' events written in batches, off their actors.

What a session's step does for the store is one list append (:meth:`SessionStore.record`,
called by the session's :class:`~supervisor.runtime.fanout.Fanout` with the events and the
wire bytes it made of them for its history: nothing is serialized twice). The writer task
takes what gathered every ``flush_s`` or ``batch_events`` events, whichever comes first (a
flood's: ``flood_flush_s`` or ``flood_batch_events``), and writes it in one transaction: by
default in a process of its own (:mod:`~supervisor.store.writer_process`, ``apart=True``), the
batch's rows made on the event loop; or on the store's one worker thread
(``trio.to_thread.run_sync`` with a ``CapacityLimiter(1)``), where the rows are made too.
Everything else the store does (reads, a session taken up, retention's deletes) runs on that
thread, in turn with the writes.

Bounded: when ``max_pending`` events wait (the database fell behind), :attr:`full` is set and
the sessions hold their agents back, as for a full subscriber that asked for backpressure
(the actor stops reading the agent's output until :meth:`when_room` calls back): events are
never dropped to keep up. A batch that cannot be written (a database restarting or failing
over, a full disk) is tried again with backoff for as long as the supervisor runs, with one
log line every ``LOG_EVERY_S`` at most: what waits meanwhile grows to ``max_pending``, and
then the agents wait too. At close, what still cannot be written is said in one line, and
its sessions are not marked clean (the next start puts a ``stream.gap`` where they were).

Subscribers are given a session's events once they are written: after each write, the
writer's task (not the worker thread) calls ``Fanout.committed`` for each session in it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from protocols import events as ev
from protocols.events import PREVIEW_CHARS, preview
from protocols.mcp import McpServer, NameValue
from supervisor.runtime.context import Said, newest
from supervisor.store.backend import (
    Backend,
    Batch,
    CheckpointRow,
    EventRun,
    Owner,
    ReceiptRow,
    SearchHit,
    SessionElsewhere,
    StoredSession,
    StoreError,
    TextRow,
    TurnEnd,
    highest_number,
)
from supervisor.store.retention import Retention, expired
from supervisor.store.writer_process import WriterProcess
from supervisor.wire.codec import dumps, event_json, event_to_wire

__all__ = [
    "SessionStore",
    "StoreFault",
    "StoreNotice",
    "StoreRecovered",
    "mcp_servers_from_json",
]

if TYPE_CHECKING:
    from supervisor.runtime.fanout import Fanout

T = TypeVar("T")

log = logging.getLogger("supervisor.store")

#: How long events gather before a write: a few ms add nothing a person sees, and make a
#: stream's events (one per agent message) a batch of many, one transaction each.
FLUSH_S = 0.005
#: A write starts at once when this many events wait (a flood): ~1-3 ms of SQLite's time.
BATCH_EVENTS = 1000
#: A flood's next write (the last one held at least ``batch_events``) gathers up to this long,
#: or this many events: a write's fixed cost on the event loop (its rows made and pickled, the
#: writer process woken: ``design/store.md``, "What it costs") is spread over two to three
#: times the events, and a flood's subscribers get its events in pieces ~10 ms apart. A
#: trickle's writes stay at ``flush_s``; a session held back for what waits has it written at
#: once (:meth:`SessionStore.hasten`); at most about half the events a gateway's subscriber
#: buffers (``GatewayLimits.subscription_buffer``), so a write's release fits in its buffer.
FLOOD_FLUSH_S = 0.015
FLOOD_BATCH_EVENTS = 2500
#: Events waiting (and being written) at most before sessions hold their agents back: a few
#: seconds of a 100-session flood, ~1-10 MB of wire bytes, referenced, not copied.
MAX_PENDING = 50_000
#: A batch that failed is tried again after these pauses, the last one repeated for as long
#: as it fails (a PostgreSQL restarting or failing over, a disk full until someone frees it):
#: quick for a blip, then a try every 5 s, which costs a database that is down nothing.
RETRY_S = (0.1, 0.5, 1.0, 2.0, 5.0)
#: At most one log line per this many seconds about failing writes.
LOG_EVERY_S = 10.0
#: Seqs (and turn numbers) a stored session skips after an unclean end (no clean close was
#: stored: a SIGKILL, a crash, a database that failed the last writes): clients are given
#: only stored events, but events recorded and never stored took seqs and turns (a prompt's
#: answer names its turn at once), which must never mean something else. Events recorded
#: and not written are at most ``MAX_PENDING`` before every session holds its agent back;
#: what a held session still publishes is the agent message it is handling (a few events
#: each) and what a cancel reads (never held, ended by its ladder within seconds): the second
#: ``MAX_PENDING`` is the room for those. The skipped range is a ``stream.gap`` in the
#: history, so a replay says what is gone.
UNCLEAN_SKIP = 2 * MAX_PENDING
#: How soon after a cancel's events (published in its caller's step: :meth:`SessionStore.soon`)
#: they are written, rather than after ``flush_s``: what a client was told last before a crash
#: is then stored sooner. Not at once: the writer's work (a batch's rows on the thread or the
#: event loop) would run while the cancel's receipt is on its way (``bench.store_cost`` with
#: the thread, cancel p50 store on/off: 1.12 at once, 1.09 at 1 ms, 1.02 at 2.5 ms; 0.86 at
#: 5 ms, where the writes fall on the store-off side's cancels instead). A turn's end in the
#: session's own step (its agent's answer) is written at once: nobody's answer waits behind
#: it, and its clients, who see it once stored, get it sooner.
TURN_END_S = 0.0025
#: Pages a retention sweep's vacuum gives back per call of the worker thread: 64 MB of 16 KB
#: pages, a few tens of ms of it, so a batch never waits long behind a large sweep.
RECLAIM_PAGES = 4096
#: How long the store is idle (nothing recorded) before the backend does what can wait for
#: that (:meth:`Backend.settle`: SQLite checkpoints its write-ahead log then, not in a stream).
SETTLE_IDLE_S = 1.0
#: A batch writes a session's row when it changed, or when only its ``last_active`` did and
#: by at least this much; and every half of it, the rows of all the sessions whose events it
#: holds: a stream's batches (one every few ms) then write events alone, one statement
#: (``SqliteBackend.write``), and a flood of many sessions updates their rows together rather
#: than a few in most batches. What lists and retention read of ``last_active`` is then up to
#: this late while a session streams (a clean close writes it exact).
ACTIVE_EVERY_S = 1.0
#: The states in which a session's agent is gone for good (``Supervisor``'s ended states):
#: the row written with that event hands it back (no owner, clean), for any process of the
#: store to take up.
_GONE_FOR_GOOD = frozenset({"stopped", "failed"})
#: Full texts of long prompts and steers kept for the writer at most (a prompt's is taken as
#: soon as its turn starts is written: only prompts queued and not started wait here).
_MAX_FULL_TEXTS = 10_000
#: The kinds of events the batches' rows are made from (besides every event's bytes): a run
#: with none of them (a stream's) is not looked at again, and its events are not kept.
_READ = frozenset({ev.SessionState, ev.TurnStarted, ev.TurnSteered, ev.TurnEnded})
#: The kinds of events a session makes itself as a turn starts: a run of only these holds no
#: word of the agent's yet.
_NO_WORD = frozenset({ev.SessionState, ev.TurnStarted, ev.TurnSteered})


class _Run:
    """A run of one session's events as recorded, as the writer needs it: made in the
    session's step, where the events are still in the cache, so that the batch's rows are
    made from one object per run and none of a stream's events (on the worker thread, their
    reference counts would pass between two cores), and so that a stream's events need not
    outlive their step (:attr:`events` None). A stream's runs recorded one after the other
    (the ingest gate hands a flooding session a few lines at a time) are one ``_Run``
    (:meth:`SessionStore.record`). A turn's answer is made from its stored events after its
    end (``supervisor/store/answers.py``)."""

    __slots__ = (
        "session_id",
        "first_seq",
        "last_seq",
        "count",
        "last_active",
        "payloads",
        "events",
        "hole",
        "ends_turn",
        "fanout",
    )

    def __init__(
        self,
        events: list[ev.Event],
        payloads: list[bytes],
        fanout: Fanout | None,
        kinds: AbstractSet[type[ev.Event]],
    ) -> None:
        first, last = events[0], events[-1]
        self.session_id: str = first.session_id
        self.first_seq: int = first.seq
        self.last_seq: int = last.seq
        self.count = count = len(events)
        self.last_active: float = last.timestamp
        self.fanout = fanout
        #: each event's bytes (a list of its own: a stream's next runs are added to it)
        self.payloads = list(payloads)
        #: its seqs have a hole (a node's ``stream.gap``): each event is stored as a run of
        #: its own
        self.hole = last.seq - first.seq != count - 1
        #: it holds a ``turn.ended`` (written at once)
        self.ends_turn = ev.TurnEnded in kinds
        #: the events, for the writer to read those of :data:`_READ` (None: it has none)
        self.events: list[ev.Event] | None = (
            events if self.hole or not kinds.isdisjoint(_READ) else None
        )

    def each(self) -> Iterable[tuple[int, bytes]]:
        """Each event's seq and bytes."""
        if self.hole:
            assert self.events is not None
            return zip((event.seq for event in self.events), self.payloads, strict=True)
        return enumerate(self.payloads, self.first_seq)


@attrs.frozen(kw_only=True)
class StoreFault:
    """Writes fail and are tried again (clients are told: ``store.error``). Said when the
    first write fails, then with each log line (every ``LOG_EVERY_S`` at most)."""

    #: the store (a path, or a URL without its password)
    where: str
    #: why the last write failed, one line
    error: str
    #: when the first failed write was (Unix time)
    since: float
    #: events recorded and not written (none is dropped: all are tried again)
    waiting: int
    #: the seqs waiting, by session: ``(lowest, highest)``
    sessions: dict[str, tuple[int, int]]
    #: so many wait that every session holds its agent back (``max_pending``)
    held: bool


@attrs.frozen(kw_only=True)
class StoreRecovered:
    """Writes go through again after ``failed_s`` seconds of failures; nothing was lost."""

    where: str
    failed_s: float


#: What a :meth:`SessionStore.watch` callback is told.
StoreNotice = StoreFault | StoreRecovered


@attrs.define
class _Meta:
    """What the store keeps of a session beside its events (its row, as last written)."""

    agent: str
    protocol: str
    host: str | None
    cwd: str
    mcp_servers: str
    created: float
    session: Any
    state: str = "starting"
    last_active: float = 0.0
    open_turn_id: str | None = None
    #: the seq of its ``turn.started`` (None: not known)
    open_turn_seq: int | None = None
    #: the agent's own session id, as last known (a stopped agent's is kept: it resumes it)
    agent_session_id: str | None = None
    #: its row was written (a clean close marks it clean)
    stored: bool = False
    #: the git worktree it runs in, as JSON text (None: none)
    worktree: str | None = None
    #: the token of this process (its rows name it while it runs the session)
    owner: str | None = None
    #: its row as last written (None: not yet)
    written: StoredSession | None = None


class SessionStore:
    """Writes the events of the sessions it is attached to (:meth:`attach`) to ``backend``.

    Use :meth:`open` (in a nursery's task, :meth:`run` runs the writer) and :meth:`aclose`.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        flush_s: float = FLUSH_S,
        batch_events: int = BATCH_EVENTS,
        flood_flush_s: float = FLOOD_FLUSH_S,
        flood_batch_events: int = FLOOD_BATCH_EVENTS,
        max_pending: int = MAX_PENDING,
        retry_s: tuple[float, ...] = RETRY_S,
        run_sync: Callable[..., Awaitable[Any]] | None = None,
        apart: bool = False,
    ) -> None:
        self.backend = backend
        #: the process that writes the batches (``apart``); None: the worker thread does
        self.writer_process = WriterProcess(backend.url, backend.where) if apart else None
        self.flush_s = flush_s
        self.batch_events = batch_events
        self.flood_flush_s = flood_flush_s
        self.flood_batch_events = max(flood_batch_events, batch_events)
        #: the last write held at least ``batch_events``: the next one gathers as a flood's
        self._flooding = False
        #: events waiting at which a write starts at once (``flood_batch_events`` in a flood)
        self._enough_at = batch_events
        #: when what waits is written, unless something asks sooner (None: nothing gathers)
        self._gather_until: float | None = None
        #: what asks to be written at once alone, not with what else gathers: sessions whose
        #: turn's first word or end was recorded, fan-outs a client or a held session waits
        #: on or whose cancel's events wait (:meth:`soon`)
        self._urgent_sessions: set[str] = set()
        self._urgent_fanouts: set[Fanout] = set()
        #: a client waits on everything that waits: all of it is written at once
        self._whole = False
        self.max_pending = max_pending
        self.retry_s = retry_s
        self._limiter = trio.CapacityLimiter(1)
        #: how the backend is called: on the store's one worker thread (tests on virtual time
        #: give a direct call)
        self._run_sync = run_sync if run_sync is not None else self._on_thread
        #: runs recorded and not taken by a write yet (None: a write, though no event comes
        #: with it: :meth:`keep_checkpoint`)
        self._pending: list[_Run | None] = []
        #: the newest of them (None: a write took them), which a stream's next run joins
        self._newest: _Run | None = None
        #: sessions whose turn started and whose next run (the turn's first word) is not
        #: recorded yet
        self._starting: set[str] = set()
        #: those of the write in progress (tried again while it fails)
        self._writing: list[_Run | None] = []
        #: fan-outs to serialize before the next write (:meth:`soon`)
        self._soon: list[Fanout] = []
        #: the writer's wait while nothing is recorded: :meth:`soon` gives it a deadline
        #: rather than waking it, so a cancel's step runs none of the writer's
        self._idle: trio.CancelScope | None = None
        #: events recorded and not written yet (those of a write in progress too)
        self._count = 0
        #: those not taken by a write yet: a flood's next write starts at ``_enough_at`` of
        #: them, not as soon as the one in progress ends (its batch would be only what came
        #: meanwhile: more writes, each with its own wake-ups, release and transaction)
        self._waiting = 0
        #: sessions hold their agents back (the database fell behind)
        self.full = False
        self._room: list[Callable[[], object]] = []
        self._wake = trio.Event()  # something was recorded
        self._enough = trio.Event()  # a batch's worth, or a turn's end, was recorded
        self._aside = False  # a cancel's events wait (:meth:`soon`): written TURN_END_S on
        #: a client waits for what is recorded (:meth:`hasten`), or a turn's first word came
        self._now = trio.Event()
        self._closing = False
        self._done = trio.Event()
        self._batch_done = trio.Event()  # set (and replaced) as each write ends
        self._meta: dict[str, _Meta] = {}
        #: full texts of long prompts and steers, by (session, preview): events carry previews
        self._full_texts: dict[tuple[str, str], str] = {}
        #: checkpoints kept or ended (``keep_checkpoint``) and not taken by a write yet
        self._checkpoints: list[CheckpointRow] = []
        #: events that could not be written before the close, their sessions' seqs, and why
        self._lost_events = 0
        self._lost: dict[str, list[int]] = {}
        self._lost_error: Exception | None = None
        #: when the last line about failing writes was logged
        self._logged_at = -math.inf
        self._closed = trio.Event()  # aclose was called: a retry's pause ends
        #: events written (a diagnostic, and what the benches read)
        self.written = 0
        #: the batches' (:meth:`_batch`): the rows of the batch being written (kept for a retry)
        self._last_batch = Batch()
        #: something was written since the backend was last told the store is idle
        self._unsettled = False
        #: writes fail now, and are tried again (None: they go through)
        self.fault: StoreFault | None = None
        self._watchers: list[Callable[[StoreNotice], object]] = []
        #: the other live processes of the store that run some of its sessions, by token
        #: (as last read: :meth:`refresh`)
        self.owners: dict[str, Owner] = {}
        #: the highest session number stored when it opened (the store's counter is past it)
        self._highest = 0
        #: the batches' (:meth:`_batch`): the newest ``last_active`` of the last batch that
        #: wrote the rows of all its sessions (``ACTIVE_EVERY_S``)
        self._active_at = -math.inf

    # -- setting up ----------------------------------------------------------------------

    async def open(self) -> list[StoredSession]:
        """Open the backend (:class:`StoreError` if it cannot be) and make good what a
        supervisor that went away left (:meth:`_recover`); returns the stored sessions, the
        most recently active first."""
        await self._in_thread(self.backend.open)
        try:
            stored = await self._in_thread(self._recover)
            if self.writer_process is not None:
                await self.writer_process.start()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._in_thread(self.backend.close)
            raise
        return stored

    def _recover(self) -> list[StoredSession]:
        """Sessions a supervisor that went away left (no owner, or an owner found gone;
        those of another live process are left to it): one that did not close cleanly gets
        a ``stream.gap`` of :data:`UNCLEAN_SKIP` seqs after its last stored one (events
        clients may have seen and the store never got: their seqs are never used again) and
        skips as many turn numbers; a turn whose ``turn.ended`` never reached the store ran
        when its supervisor went away (stopped, killed, crashed): it ends now, in the
        history, failed, once. Written with the sessions' rows in one transaction, with the
        store's other processes kept out meanwhile (:meth:`Backend.exclusive`): a second
        start adds nothing."""
        with self.backend.exclusive():
            stored = self.backend.sessions()
            owners = self.backend.owners()
            self._highest = highest_number(s.id for s in stored)
            runs: list[EventRun] = []
            changed: list[StoredSession] = []
            sessions: list[StoredSession] = []
            for session in stored:
                if self._elsewhere(session, owners) is not None:
                    sessions.append(session)
                    continue
                ended, run = self._recovered(session)
                if ended != session:
                    changed.append(ended)
                if run is not None:
                    runs.append(run)
                sessions.append(ended)
            if changed:
                self.backend.write(Batch(sessions=changed, events=runs))
            gone = [token for token, (_, alive) in owners.items() if not alive]
            if gone:
                self.backend.drop_owners(gone)
        return sessions

    def _elsewhere(
        self, session: StoredSession, owners: dict[str, tuple[Owner, bool]]
    ) -> Owner | None:
        """The other live process that runs ``session`` (None: none does)."""
        if session.owner is None or session.owner == self.backend.owner.token:
            return None
        owner, alive = owners.get(session.owner, (None, False))
        if owner is not None and alive:
            self.owners[owner.token] = owner
            return owner
        return None

    def _recovered(self, session: StoredSession) -> tuple[StoredSession, EventRun | None]:
        """(The worker thread.) ``session`` as its process left it, made good (as
        :meth:`_recover` says), and the events that does so (None: none); its owner
        cleared."""
        # A node's session (``host``) is not: the node numbers its events, and hands over
        # again what the store lacks when it is adopted again.
        unclean = not session.clean and session.host is None
        if not unclean and session.open_turn_id is None:
            return attrs.evolve(session, clean=True, owner=None), None
        now = time.time()
        seq = session.last_seq
        payloads: list[bytes] = []
        turns = session.turns
        if unclean:
            seq += UNCLEAN_SKIP
            payloads.append(
                _wire_json(
                    ev.StreamGap(
                        session_id=session.id,
                        seq=seq,
                        timestamp=now,
                        from_seq=session.last_seq + 1,
                        to_seq=seq,
                        cause="the supervisor went away before they were stored",
                    ),
                    session.host,
                )
            )
            turns = max(turns, _highest_turn(self.backend.texts(session.id))) + UNCLEAN_SKIP
        if session.open_turn_id is not None:
            seq += 1
            payloads.append(
                _wire_json(
                    ev.TurnEnded(
                        session_id=session.id,
                        seq=seq,
                        timestamp=now,
                        turn_id=session.open_turn_id,
                        outcome="failed",
                        stop_reason="supervisor_gone",
                        error="the supervisor went away while the turn ran",
                    ),
                    session.host,
                )
            )
        # One run, its seqs contiguous: the gap takes the seq of the last one it covers.
        first = seq - len(payloads) + 1
        ended = attrs.evolve(
            session,
            open_turn_id=None,
            last_active=now,
            last_seq=seq,
            clean=True,
            turns=turns,
            owner=None,
        )
        return ended, EventRun(session_id=session.id, first_seq=first, payloads=payloads)

    async def claim(self, session_id: str) -> StoredSession:
        """Take up the stored session ``session_id`` to start its agent here: as the store
        has it now (another process may have run it meanwhile), made good if its process went
        away (:meth:`_recover`), its row naming this process. :class:`SessionElsewhere` if
        another live process runs it; :class:`StoreError` if the store has it not."""
        return await self._in_thread(self._claim, session_id)

    def _claim(self, session_id: str) -> StoredSession:
        """(The worker thread.)"""
        with self.backend.exclusive():
            session = self.backend.session(session_id)
            if session is None:
                raise StoreError(f"the store {self.backend.where} has no session {session_id}")
            owner = self._elsewhere(session, self.backend.owners())
            if owner is not None:
                raise SessionElsewhere(
                    f"session {session_id} runs in another process on this store "
                    f"({owner.describe()}): use it there, or stop that process first"
                )
            mine = self.backend.owner.token
            if session.owner == mine:  # (stopped here: its rows are this process's own)
                return session
            ended, run = self._recovered(session)
            claimed = attrs.evolve(ended, owner=mine)
            self.backend.write(Batch(sessions=[claimed], events=[run] if run else []))
            return claimed

    async def new_session_id(self) -> str:
        """A new session id (``sN``), never given by any process of the store before."""
        number = await self._in_thread(self.backend.next_session_number, self._highest)
        return f"s{number}"

    def owner_of(self, session: StoredSession) -> Owner | None:
        """The other live process ``session`` ran in when last read (None: none)."""
        return self.owners.get(session.owner) if session.owner is not None else None

    async def stored(self, session_id: str) -> StoredSession | None:
        """The stored session ``session_id`` as the store has it now (None: it has it not),
        one another process of the store started too (:meth:`owner_of` says whether a live
        process runs it)."""
        return await self._in_thread(self._stored, session_id)

    def _stored(self, session_id: str) -> StoredSession | None:
        """(The worker thread.)"""
        session = self.backend.session(session_id)
        if session is not None and session.owner not in (None, self.backend.owner.token):
            self.owners.pop(session.owner, None)  # (alive as it is read now, or not)
            self._elsewhere(session, self.backend.owners())
        return session

    async def refresh(self) -> list[StoredSession]:
        """The stored sessions as the store has them now, those of other processes too
        (:meth:`owner_of` says which live process runs each)."""
        return await self._in_thread(self._refresh)

    def _refresh(self) -> list[StoredSession]:
        """(The worker thread.)"""
        stored = self.backend.sessions()
        owners = self.backend.owners()
        self.owners = {}
        for session in stored:
            self._elsewhere(session, owners)
        return stored

    def attach(self, session: Any, resume: str | None = None) -> None:
        """Store ``session`` (a local or remote session handle) and its events from now on;
        ``resume``: the agent's own session id it was started to go on with (kept until the
        agent says its own)."""
        spec = session.spec
        worktree = getattr(session, "worktree", None)
        self._meta[session.id] = _Meta(
            agent=spec.name,
            protocol=spec.protocol,
            host=session.host,
            cwd=session.cwd or "",
            mcp_servers=json.dumps([_mcp_json(server) for server in spec.mcp_servers]),
            created=time.time(),
            session=session,
            agent_session_id=resume,
            worktree=worktree.to_json() if worktree is not None else None,
            owner=self.backend.owner.token,
        )
        session.fanout.recorder = self
        if hasattr(session, "on_text"):
            session.on_text = self.keep_text
        if hasattr(session, "on_checkpoint"):
            session.on_checkpoint = self.keep_checkpoint

    def keep_text(self, session_id: str, text: str) -> None:
        """The full text of a prompt or steer longer than an event's preview: stored in full
        with its turn once its event is written."""
        if len(text) <= PREVIEW_CHARS:
            return
        texts = self._full_texts
        if len(texts) >= _MAX_FULL_TEXTS:
            del texts[next(iter(texts))]
        texts[(session_id, preview(text)[0])] = text

    def keep_checkpoint(self, row: CheckpointRow) -> None:
        """A checkpoint a session may rewind to, new or with its turn's end: written with the
        next batch (a session revived later gets it back: :meth:`checkpoints`)."""
        self._checkpoints.append(row)
        self._pending.append(None)
        self._newest = None
        self._wake.set()

    # -- the sessions' side (their actors: never blocks) ---------------------------------------

    def record(
        self,
        events: list[ev.Event],
        payloads: list[bytes],
        fanout: Fanout | None = None,
        kinds: AbstractSet[type[ev.Event]] | None = None,
    ) -> bool:
        """Events a session kept in its history, with their wire bytes (and the set of their
        classes, when the caller has it): written soon, then given to ``fanout``'s
        subscribers (:meth:`Fanout.committed`). Whether they were taken into the run recorded
        just before (:meth:`~supervisor.runtime.fanout.Recorder.record`)."""
        if not events:
            return False
        merged = False
        if kinds is None:
            kinds = set(map(type, events))
        newest = self._newest
        added = len(events)
        if (
            newest is not None
            and newest.fanout is fanout
            and newest.events is None
            and not newest.hole
            and newest.last_seq + 1 == events[0].seq
            and events[-1].seq - newest.first_seq == newest.count + added - 1
            and kinds.isdisjoint(_READ)
            and newest.session_id == events[0].session_id
        ):
            newest.payloads += payloads  # (a stream's runs: one)
            newest.count += added
            newest.last_seq = events[-1].seq
            newest.last_active = events[-1].timestamp
            merged = True
        else:
            run = self._newest = _Run(events, payloads, fanout, kinds)
            self._pending.append(run)
            starting = self._starting
            sid = run.session_id
            if ev.TurnStarted in kinds:
                starting.add(sid)
            if sid in starting and not kinds <= _NO_WORD:
                # A turn's first word is written at once, even after a prompt's own events
                # (published in its caller's step, which wait TURN_END_S otherwise): what a
                # person waits for most, and its clients see it once stored.
                starting.discard(sid)
                self._urgent_sessions.add(sid)
                self._now.set()
                self._enough.set()
            elif run.ends_turn:
                # (A turn's end is written at once: its clients get it sooner, and what a
                # client was told last before a crash is stored sooner: an unclean end's
                # window shrinks.)
                self._urgent_sessions.add(sid)
                self._enough.set()
        count = self._count = self._count + added
        waiting = self._waiting = self._waiting + added
        self._wake.set()
        if count >= self.max_pending:
            self.full = True
        if waiting >= self._enough_at:
            self._enough.set()
        return merged

    def soon(self, fanout: Fanout) -> None:
        """``fanout`` has events to serialize (a cancel's, published in its caller's step):
        done in the writer's step, after ``TURN_END_S`` (they hold a turn's end), not the
        caller's. An idle writer is given a deadline, not woken: waking it would run its step
        before the cancel's caller has its answer."""
        soon = self._soon
        soon.append(fanout)
        self._urgent_fanouts.add(fanout)
        if len(soon) > 1:
            return  # (asked already)
        idle = self._idle
        if idle is not None:
            idle.deadline = trio.current_time() + TURN_END_S
        else:
            self._aside = True
            self._enough.set()

    def hasten(self, fanout: Fanout | None = None) -> None:
        """A client waits for what is recorded (a connection holds a response behind its
        session's events, given once stored), or a session is held back for it (its
        subscriber has no room for more to wait): write it now, not after ``TURN_END_S`` or
        ``flush_s`` (the response waits for the write anyway); ``fanout``'s events alone, if
        it is named (what else gathers goes on gathering)."""
        if not self._pending and not self._soon:
            return  # (being written, or nothing to write)
        if fanout is None:
            self._whole = True
        else:
            self._urgent_fanouts.add(fanout)
        self._now.set()
        self._enough.set()
        if self._idle is not None:
            self._idle.cancel()  # (what soon() asked for)

    def when_room(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once the store has room again (it was :attr:`full`)."""
        if self.full:
            self._room.append(callback)
        else:
            callback()

    def watch(self, callback: Callable[[StoreNotice], object]) -> Callable[[], None]:
        """Call ``callback(notice)`` (from the writer's task: it must not block) when writes
        start failing, every ``LOG_EVERY_S`` while they fail, and once they go through again
        (the gateway tells its clients). Returns what stops it."""
        self._watchers.append(callback)

        def stop() -> None:
            if callback in self._watchers:
                self._watchers.remove(callback)

        return stop

    def _tell(self, notice: StoreNotice) -> None:
        for callback in list(self._watchers):
            callback(notice)

    # -- the writer ------------------------------------------------------------------------

    async def run(self) -> None:
        """Write what is recorded, in batches, until :meth:`aclose`."""
        try:
            while True:
                late = False  # woken by soon()'s deadline: TURN_END_S has passed already
                if not self._pending and not self._soon:
                    if self._closing:
                        return
                    with trio.CancelScope() as idle:
                        self._idle = idle
                        with trio.move_on_after(
                            SETTLE_IDLE_S if self._unsettled else math.inf
                        ) as quiet:
                            await self._wake.wait()
                    self._idle = None
                    if quiet.cancelled_caught:
                        self._unsettled = False
                        await self._settle(idle=True)
                        continue
                    late = idle.cancelled_caught
                    self._wake = trio.Event()
                    if not self._pending and not self._soon:
                        continue
                    if self._soon and not late:  # (woken by a record before the deadline)
                        self._aside = True
                        self._enough.set()
                whole = self._closing or late
                if self._waiting < self._enough_at and not whole:
                    if self._gather_until is None:
                        window = self.flood_flush_s if self._flooding else self.flush_s
                        self._gather_until = trio.current_time() + window
                    with trio.move_on_at(self._gather_until) as gather:
                        await self._enough.wait()
                        if self._aside and self._waiting < self._enough_at:
                            with trio.move_on_after(TURN_END_S):
                                await self._now.wait()
                    whole = gather.cancelled_caught
                soon, self._soon = self._soon, []
                for fanout in soon:
                    fanout.serialize()  # (recorded: in _pending now)
                # (after those records: what they asked for is this write, not the next one)
                self._aside = False
                self._enough = trio.Event()
                self._now = trio.Event()
                sessions, self._urgent_sessions = self._urgent_sessions, set()
                fanouts, self._urgent_fanouts = self._urgent_fanouts, set()
                # (a batch's worth, the window's end, or nothing asked to go alone: all of it)
                whole = (
                    whole
                    or self._whole
                    or self._waiting >= self._enough_at
                    or not (sessions or fanouts)
                )
                self._whole = False
                if self._pending:
                    await self._write_pending(None if whole else (sessions, fanouts))
                else:
                    self._batch_done.set()
                    self._batch_done = trio.Event()
        finally:
            self._done.set()

    async def _write_pending(self, only: tuple[set[str], set[Fanout]] | None = None) -> None:
        """Write what waits; ``only``: the runs of these sessions and fan-outs alone (a turn's
        first word or end, what a client waits on), the rest gathering on until its time."""
        pending: list[_Run | None] = []
        if only is not None:
            sessions, fanouts = only
            rest: list[_Run | None] = []
            for run in self._pending:
                urgent = run is not None and (run.session_id in sessions or run.fanout in fanouts)
                (pending if urgent else rest).append(run)
            if not any(run is not None for run in pending):
                return  # (written already: what gathers goes on gathering)
            if not any(run is not None for run in rest):
                only = None  # (nothing else waits: the whole of it)
        if only is None:
            pending, self._pending = self._pending, []
            self._newest = None
            self._waiting = 0
            checkpoints, self._checkpoints = self._checkpoints, []
            count = sum(run.count for run in pending if run is not None)
            self._gather_until = None
            self._flooding = flooding = count >= self.batch_events
            self._enough_at = self.flood_batch_events if flooding else self.batch_events
        else:
            self._pending = rest
            if self._newest is not None and self._newest in pending:
                self._newest = None  # (being written: a stream's next run is one of its own)
            count = sum(run.count for run in pending if run is not None)
            self._waiting -= count
            checkpoints = []
        self._writing = pending
        pauses = iter(self.retry_s)
        pause = 0.0
        failed_at: float | None = None
        since = 0.0  # (the wall clock's failed_at, for clients)
        first = True
        stored = True
        due = False
        while True:
            try:
                if self.writer_process is not None:
                    due = await self._write_apart(self.writer_process, pending, checkpoints, first)
                else:
                    due = await self._in_thread(self._write, pending, checkpoints, first)
                self.written += count
                if failed_at is not None:
                    failed_s = trio.current_time() - failed_at
                    log.warning(
                        "store: writing again after %.1f s of failed writes; nothing was lost",
                        failed_s,
                    )
                    self._logged_at = -math.inf
                    self.fault = None
                    self._tell(StoreRecovered(where=self.backend.where, failed_s=failed_s))
                break
            except Exception as exc:  # a backend's bug too: the sessions go on
                first = False
                if self._closing:
                    self._given_up(pending, count, exc)
                    stored = False
                    break
                if failed_at is None:
                    failed_at = trio.current_time()
                    since = time.time()
                self._failing(pending, exc, since)
                pause = next(pauses, pause)
                # Never given up while the supervisor runs: what waits grows until the
                # sessions hold their agents back (:attr:`full`); a close ends the wait.
                with trio.move_on_after(pause):
                    await self._closed.wait()
        self._writing = []
        self._count -= count
        self._release(pending, stored)
        self._batch_done.set()
        self._batch_done = trio.Event()
        if self.full and self._count < self.max_pending // 2:
            self.full = False
            room, self._room = self._room, []
            for callback in room:
                callback()
        if stored:
            self._unsettled = True
            if due:
                # Once its events are given to subscribers: a long answer's search index
                # would hold back its turn's last events, a checkpoint the batch's.
                await self._settle(idle=False)

    async def _settle(self, idle: bool) -> None:
        try:
            if self.writer_process is not None:
                async with self._limiter:
                    await self.writer_process.settle(idle)
            else:
                await self._in_thread(self.backend.settle, idle)
        except StoreError:
            pass  # (done by the next call; a store that fails is said by the writes)

    @staticmethod
    def _release(pending: list[_Run | None], stored: bool) -> None:
        """Each fan-out whose events ``pending`` held gives them to its subscribers, up to
        its newest one there (a run is written whole, in order); not ``stored`` (given up at
        close): they never will be."""
        newest: dict[Fanout, int] = {}
        for run in pending:
            if run is not None and run.fanout is not None:
                newest[run.fanout] = run.last_seq
        for fanout, seq in newest.items():
            if stored:
                fanout.committed(seq)
            else:
                fanout.abandon()

    def _failing(self, pending: list[_Run | None], exc: Exception, since: float) -> None:
        """A write failed and is tried again: one log line, and a :class:`StoreFault` told,
        at most every ``LOG_EVERY_S``."""
        now = trio.current_time()
        if now - self._logged_at < LOG_EVERY_S:
            return
        self._logged_at = now
        error = str(exc) if isinstance(exc, StoreError) else repr(exc)
        log.error(
            "store: cannot write (%s); trying again, %d events of sessions %s wait and none is "
            "dropped (past %d the agents are held back)",
            error,
            self._count,
            _names(_spans(pending)),
            self.max_pending,
        )
        self.fault = StoreFault(
            where=self.backend.where,
            error=error,
            since=since,
            waiting=self._count,
            sessions={
                sid: (low, high) for sid, (low, high) in _spans(pending + self._pending).items()
            },
            held=self.full,
        )
        self._tell(self.fault)

    def _given_up(self, pending: list[_Run | None], count: int, exc: Exception) -> None:
        """At close, a batch that still cannot be written: said once for all in
        :meth:`aclose`."""
        self._lost_events += count
        self._lost_error = exc
        for sid, (low, high) in _spans(pending).items():
            span = self._lost.setdefault(sid, [low, high])
            span[0], span[1] = min(span[0], low), max(span[1], high)

    def _write(
        self, pending: list[_Run | None], checkpoints: list[CheckpointRow], first: bool
    ) -> bool:
        """(The worker thread.) The rows of ``pending``, written in one transaction; whether
        the backend has work to :meth:`~Backend.settle` now."""
        if first:
            self._batch(pending, checkpoints)
        return bool(self.backend.write(self._last_batch))

    async def _write_apart(
        self,
        writer: WriterProcess,
        pending: list[_Run | None],
        checkpoints: list[CheckpointRow],
        first: bool,
    ) -> bool:
        """:meth:`_write` by the writer process, the rows made here (on the event loop: a
        thread would wait for the GIL as long as the writes it saves); in turn with the
        worker thread's calls, as the thread's own writes are."""
        if first:
            self._batch(pending, checkpoints)
        limiter = self._limiter
        try:
            # (Taken without a turn given away when nothing else waits for it: the next
            # batch of a flood is ready as the last one is written.)
            limiter.acquire_nowait()
        except trio.WouldBlock:
            await limiter.acquire()
        try:
            return await writer.write(self._last_batch)
        finally:
            limiter.release()

    def _batch(self, pending: list[_Run | None], checkpoints: list[CheckpointRow]) -> None:
        """(The worker thread, or the event loop with a writer process.) The rows of
        ``pending`` and ``checkpoints``: made once, kept for a retry (:attr:`_last_batch`)."""
        runs: list[EventRun] = []
        receipts: list[ReceiptRow] = []
        texts: list[TextRow] = []
        turn_ends: list[TurnEnd] = []
        touched: dict[str, _Meta] = {}
        newest: dict[str, tuple[EventRun, int]] = {}  # each session's last run and seq
        meta = self._meta
        full_texts = self._full_texts
        for recorded in pending:
            if recorded is None:
                continue
            sid = recorded.session_id
            if recorded.hole:  # seqs with a hole (a node's gap): each on its own
                for seq, payload in recorded.each():
                    runs.append(EventRun(session_id=sid, first_seq=seq, payloads=[payload]))
            else:
                joined = b"\n".join(recorded.payloads)
                found = newest.get(sid)
                if found is not None and found[1] + 1 == recorded.first_seq:
                    run = found[0]
                    run.payloads.append(joined)
                    assert run.counts is not None
                    run.counts.append(recorded.count)
                else:
                    run = EventRun(
                        session_id=sid,
                        first_seq=recorded.first_seq,
                        payloads=[joined],
                        counts=[recorded.count],
                    )
                    runs.append(run)
                newest[sid] = (run, recorded.last_seq)
            info = meta.get(sid)
            if info is not None:
                info.last_active = recorded.last_active
                touched[sid] = info
            if recorded.events is None:
                continue  # (none of _READ)
            for event in recorded.events:
                cls = type(event)
                if cls is ev.SessionState:
                    assert isinstance(event, ev.SessionState)
                    if info is not None:
                        info.state = event.state
                        if event.state in _GONE_FOR_GOOD:
                            info.owner = None  # (taken up again here by ``claim``)
                elif cls is ev.TurnStarted or cls is ev.TurnSteered:
                    assert isinstance(event, ev.TurnStarted | ev.TurnSteered)
                    text = event.text
                    if event.text_bytes is not None:
                        text = full_texts.pop((sid, text), text)
                    texts.append(
                        TextRow(
                            session_id=sid,
                            turn_id=event.turn_id,
                            seq=event.seq,
                            kind="prompt" if cls is ev.TurnStarted else "steer",
                            text=text,
                        )
                    )
                    if cls is ev.TurnStarted and info is not None:
                        info.open_turn_id = event.turn_id
                        info.open_turn_seq = event.seq
                elif cls is ev.TurnEnded:
                    assert isinstance(event, ev.TurnEnded)
                    started = None
                    if info is not None and info.open_turn_id == event.turn_id:
                        info.open_turn_id = None
                        started = info.open_turn_seq
                    turn_ends.append(
                        TurnEnd(
                            session_id=sid, turn_id=event.turn_id, seq=event.seq, started=started
                        )
                    )
                    if event.receipt is not None:
                        receipts.append(
                            ReceiptRow(
                                session_id=sid,
                                turn_id=event.turn_id,
                                seq=event.seq,
                                payload=dumps(event.receipt),
                            )
                        )
        sessions: list[StoredSession] = []
        active = max((info.last_active for info in touched.values()), default=-math.inf)
        every = active - self._active_at >= ACTIVE_EVERY_S / 2
        if every:
            self._active_at = active
        for sid, info in touched.items():
            written = info.written
            if (
                not every
                and written is not None
                and info.last_active - written.last_active < ACTIVE_EVERY_S
                and _unchanged(info, written)
            ):
                continue  # (only its last_active moved, and by little)
            info.written = row = _row(sid, info)
            sessions.append(row)
            info.stored = True
        self._last_batch = Batch(
            sessions=sessions,
            events=runs,
            receipts=receipts,
            texts=texts,
            checkpoints=checkpoints,
            turn_ends=turn_ends,
        )

    # -- reading ---------------------------------------------------------------------------

    async def events(self, session_id: str, since_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Stored events of a session after ``since_seq`` (on the store's thread: in order
        with the writes, so what was recorded before is there)."""
        return await self._in_thread(self.backend.events, session_id, since_seq, limit)

    async def recorded(self, session_id: str, after: int, upto: int) -> list[tuple[int, bytes]]:
        """The session's events above ``after`` up to ``upto``, whether written or still
        waiting to be: a subscriber from before a live session's history begins
        (:func:`~supervisor.runtime.fanout.fill_from_recorder`). What waits is looked at
        before the read: an event written meanwhile is then found by the read. Each seq
        once; a store that cannot be read gives what waits alone (the caller keeps its gap)."""
        waiting: dict[int, bytes] = {}
        for run in [*self._writing, *self._pending]:
            if run is not None and run.session_id == session_id:
                if run.last_seq > after and run.first_seq <= upto:
                    for seq, payload in run.each():
                        if after < seq <= upto:
                            waiting[seq] = payload
        try:
            found = await self._in_thread(self.backend.events, session_id, after, upto - after)
        except StoreError:
            found = []
        rows = dict(waiting)
        rows.update((seq, payload) for seq, payload in found if seq <= upto)
        return sorted(rows.items())

    async def turns(self, session_id: str) -> int:
        """How many turn ids (``t1``, ``t2``, ...) a stored session used: the highest."""
        texts = await self._in_thread(self.backend.texts, session_id)
        reserved = max((s.turns for s in await self.sessions() if s.id == session_id), default=0)
        return max(_highest_turn(texts), reserved)

    async def checkpoints(self, session_id: str, limit: int) -> list[CheckpointRow]:
        """A stored session's newest ``limit`` checkpoints, oldest first."""
        return await self._in_thread(self.backend.checkpoints, session_id, limit)

    async def conversation(self, session_id: str, limit: int) -> list[Said]:
        """What was said in a stored session (its prompts, the steers taken into a turn, the
        agent's answers), the newest ``limit`` bytes of it: what an agent that cannot resume
        its own session is given (``supervisor/runtime/context.py``)."""
        return await self._in_thread(self._conversation, session_id, limit)

    def _conversation(self, session_id: str, limit: int) -> list[Said]:
        """(The worker thread.) :meth:`conversation`."""
        return newest(said_in_texts(self.backend.texts(session_id)), limit)

    async def sessions(self) -> list[StoredSession]:
        return await self._in_thread(self.backend.sessions)

    async def texts(self, session_id: str) -> list[TextRow]:
        """A stored session's prompts, steers and answers, in order of seq."""
        return await self._in_thread(self.backend.texts, session_id)

    async def first_prompts(self, chars: int) -> dict[str, str]:
        """Each stored session's first prompt, its first ``chars`` characters, by id."""
        return await self._in_thread(self.backend.first_prompts, chars)

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        """Up to ``limit`` stored texts matching ``query``, the best first, each with when its
        event happened (on the store's thread, as every call of the backend)."""
        if self.writer_process is not None:  # (texts it wrote and not indexed yet: found too)
            try:
                async with self._limiter:
                    await self.writer_process.index()
            except StoreError:
                pass  # (what is indexed is found; a store that fails is said by the writes)
        return await self._in_thread(self._search, query, limit)

    def _search(self, query: str, limit: int) -> list[SearchHit]:
        """(The worker thread.) The backend's hits, each given its event's timestamp: read
        from the event stored at its seq (the texts keep no time of their own; a hit's event
        is one run's read, and a search answers a few dozen hits at most)."""
        hits = self.backend.search(query, limit)
        return [
            attrs.evolve(
                hit,
                time=_timestamp(self.backend.events(hit.session_id, hit.seq - 1, 1), hit.seq),
            )
            for hit in hits
        ]

    # -- retention ---------------------------------------------------------------------------

    async def expired(self, keep: Retention, protected: Collection[str]) -> list[str]:
        """The stored sessions ``keep`` lets go (:func:`~supervisor.store.retention.expired`),
        none of ``protected`` nor of those attached here (they run, or ran in this process)."""
        return await self._in_thread(self._expired, keep, {*protected, *self._meta})

    def _expired(self, keep: Retention, protected: set[str]) -> list[str]:
        """(The worker thread.) Sessions another live process runs are protected too."""
        sizes = self.backend.sizes() if keep.keep_bytes is not None else {}
        stored = self.backend.sessions()
        owners = self.backend.owners()
        protected |= {s.id for s in stored if self._elsewhere(s, owners) is not None}
        return expired(stored, sizes, keep, time.time(), protected)

    def _delete(self, session_ids: Sequence[str]) -> None:
        """(The worker thread.) Those of ``session_ids`` no other live process took up since
        they were chosen, deleted."""
        with self.backend.exclusive():
            owners = self.backend.owners()
            free = {s.id for s in self.backend.sessions() if self._elsewhere(s, owners) is None}
            self.backend.delete([i for i in session_ids if i in free])

    async def delete(self, session_ids: Sequence[str]) -> None:
        """Delete the sessions (whole, in one transaction), then give back what they took, a
        slice at a time (:data:`RECLAIM_PAGES`): writes go in between, as every call of the
        backend runs on the store's one thread. :class:`StoreError` if they could not be
        deleted."""
        if not session_ids:
            return
        await self._in_thread(self._delete, session_ids)
        for session_id in session_ids:
            self._meta.pop(session_id, None)
        while await self._in_thread(self.backend.reclaim, RECLAIM_PAGES):
            pass

    async def flushed(self) -> None:
        """Return once every event the sessions published so far is written (or given up).
        What a session published in its actor's step waits in its fan-out as objects until
        the actor next waits (a turn's end, a cancel's answer just given): serialized here
        first."""
        for meta in self._meta.values():
            meta.session.fanout.serialize()
        while self._count or self._soon:
            await self._batch_done.wait()

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        result: T = await self._run_sync(fn, *args)
        return result

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def aclose(self) -> None:
        """Write what is left, mark the sessions written clean (:attr:`StoredSession.clean`:
        the next supervisor knows nothing is missing), then close the backend."""
        for meta in self._meta.values():  # (a stopped actor's last step waits in its fan-out)
            meta.session.fanout.serialize()
        self._closing = True
        self._closed.set()
        self._wake.set()
        self._enough.set()
        with trio.CancelScope(shield=True):
            await self._done.wait()
            if self._lost_events:
                exc = self._lost_error
                log.error(
                    "store: %d events could not be written before the supervisor stopped "
                    "(%s): %s; the next start marks them as gone (stream.gap)",
                    self._lost_events,
                    _names(self._lost),
                    exc if isinstance(exc, StoreError) else repr(exc),
                )
            if self.writer_process is not None:
                await self.writer_process.aclose()
            try:
                await self._in_thread(self._mark_clean)
            except Exception:  # the next start treats them as unclean: nothing is reused
                pass
            await self._in_thread(self.backend.close)

    def _mark_clean(self) -> None:
        """(The worker thread.) Every session whose row was written, marked clean."""
        rows = [
            attrs.evolve(_row(sid, info), clean=True, owner=None)
            for sid, info in self._meta.items()
            if info.stored and sid not in self._lost and info.owner is not None
        ]
        if rows:
            self.backend.write(Batch(sessions=rows))


def _timestamp(found: list[tuple[int, bytes]], seq: int) -> float | None:
    """The ``timestamp`` of the event at ``seq``, if ``found`` is it (None: not stored, or
    not readable)."""
    if not found or found[0][0] != seq:
        return None
    try:
        value = json.loads(found[0][1]).get("timestamp")
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def _row(session_id: str, info: _Meta) -> StoredSession:
    """The session's row."""
    own = getattr(info.session, "agent_session_id", None)
    if own is not None:
        info.agent_session_id = own
    return StoredSession(
        id=session_id,
        agent=info.agent,
        protocol=info.protocol,
        host=info.host,
        cwd=info.cwd,
        mcp_servers=info.mcp_servers,
        agent_session_id=info.agent_session_id,
        created=info.created,
        last_active=info.last_active,
        state=info.state,
        open_turn_id=info.open_turn_id,
        clean=info.owner is None,  # (handed back with its last events: nothing after)
        worktree=info.worktree,
        owner=info.owner,
    )


def _unchanged(info: _Meta, written: StoredSession) -> bool:
    """``info`` holds what ``written`` does but for ``last_active``: compared field by field
    rather than by making the row (this runs for every session of every batch, on the event
    loop or the worker thread: a row made and compared is ~3 us, 100 sessions a batch)."""
    own = getattr(info.session, "agent_session_id", None)
    return (
        (own if own is not None else info.agent_session_id) == written.agent_session_id
        and info.state == written.state
        and info.open_turn_id == written.open_turn_id
        and info.owner == written.owner
    )


def _spans(pending: list[_Run | None]) -> dict[str, list[int]]:
    """Each session's lowest and highest seq in ``pending``."""
    spans: dict[str, list[int]] = {}
    for run in pending:
        if run is not None:
            low, high = run.first_seq, run.last_seq
            span = spans.setdefault(run.session_id, [low, high])
            span[0], span[1] = min(span[0], low), max(span[1], high)
    return spans


def _names(spans: dict[str, list[int]]) -> str:
    """``s1 seq 3-40, s2 seq 7-9``: at most a few sessions named, then how many more."""
    shown = [f"{sid} seq {low}-{high}" for sid, (low, high) in list(spans.items())[:5]]
    if len(spans) > 5:
        shown.append(f"{len(spans) - 5} more")
    return ", ".join(shown)


def said_in_texts(texts: list[TextRow]) -> list[Said]:
    """The conversation the stored texts hold, in order: prompts and steers as the user's,
    answers as the agent's. A steer that started a turn of its own is left out: that turn's
    prompt is the same text."""
    prompts = {(t.turn_id, t.text) for t in texts if t.kind == "prompt"}
    return [
        Said("assistant" if t.kind == "answer" else "user", t.text)
        for t in texts
        if t.kind != "steer" or (t.turn_id, t.text) not in prompts
    ]


def _highest_turn(texts: list[TextRow]) -> int:
    """The highest turn number (``tN``) the texts name."""
    return max((int(t.turn_id[1:]) for t in texts if t.turn_id[1:].isdigit()), default=0)


def _wire_json(event: ev.Event, host: str | None) -> bytes:
    """``event``'s wire JSON, with ``host`` as a remote session's events carry it."""
    if host is None:
        return event_json(event)
    message = event_to_wire(event)
    message["host"] = host
    return dumps(message)


def _mcp_json(server: Any) -> Any:
    return attrs.asdict(server) if attrs.has(type(server)) else str(server)


def mcp_servers_from_json(text: str) -> list[McpServer]:
    """The MCP servers a session row holds (its ``mcp_servers``, as :meth:`attach` wrote
    them), to give its agent again; one that cannot be read back is left out, and said."""
    servers: list[McpServer] = []
    try:
        stored = json.loads(text or "[]")
    except ValueError:
        stored = None
    for entry in stored if isinstance(stored, list) else [stored]:
        try:
            data = dict(entry)
            for key in ("env", "headers"):
                data[key] = [NameValue(**pair) for pair in data.get(key) or ()]
            servers.append(McpServer(**data))
        except (TypeError, ValueError) as exc:
            log.warning("store: a stored MCP server cannot be read back (%s): %r", exc, entry)
    return servers
