"""The trio side of the store: sessions' events written in batches, off their actors.

What a session's step does for the store is one list append (:meth:`SessionStore.record`,
called by the session's :class:`~supervisor.runtime.fanout.Fanout` with the events and the
wire bytes it made of them for its history: nothing is serialized twice). The writer task
takes what gathered every ``flush_s`` or ``batch_events`` events, whichever comes first, and
writes it in one transaction on the store's one worker thread
(``trio.to_thread.run_sync`` with a ``CapacityLimiter(1)``), where the rows are made too: the
event loop pays the append and nothing else.

Bounded: when ``max_pending`` events wait (the database fell behind), :attr:`full` is set and
the sessions hold their agents back, as for a full subscriber that asked for backpressure
(the actor stops reading the agent's output until :meth:`when_room` calls back): events are
never dropped to keep up. A batch that cannot be written is tried again a few times (a
database restarting); then it is given up, with one log line saying which events of which
sessions were not written (rate-limited), and the sessions go on.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from protocols import events as ev
from protocols.events import PREVIEW_CHARS, preview
from supervisor.store.backend import (
    Backend,
    Batch,
    EventRun,
    ReceiptRow,
    StoredSession,
    StoreError,
    TextRow,
)
from supervisor.wire.codec import dumps, event_json

__all__ = ["SessionStore"]

T = TypeVar("T")

log = logging.getLogger("supervisor.store")

#: How long events gather before a write: a few ms add nothing a person sees, and make a
#: stream's events (one per agent message) a batch of many, one transaction each.
FLUSH_S = 0.005
#: A write starts at once when this many events wait (a flood): ~1-3 ms of SQLite's time.
BATCH_EVENTS = 1000
#: Events waiting (and being written) at most before sessions hold their agents back: a few
#: seconds of a 100-session flood, ~1-10 MB of wire bytes, referenced, not copied.
MAX_PENDING = 50_000
#: A batch that failed is tried again after these pauses (a PostgreSQL restarting, a disk
#: momentarily full); after the last, it is given up and said so.
RETRY_S = (0.1, 0.5, 2.0)
#: At most one log line per this many seconds about writes given up (each says how many).
LOG_EVERY_S = 10.0
#: An answer's text indexed for search at most (the events keep it whole).
MAX_ANSWER_CHARS = 1_000_000
#: Full texts of long prompts and steers kept for the writer at most (a prompt's is taken as
#: soon as its turn starts is written: only prompts queued and not started wait here).
_MAX_FULL_TEXTS = 10_000


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
    #: the agent's own session id, as last known (a stopped agent's is kept: it resumes it)
    agent_session_id: str | None = None


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
        max_pending: int = MAX_PENDING,
        retry_s: tuple[float, ...] = RETRY_S,
        run_sync: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        self.backend = backend
        self.flush_s = flush_s
        self.batch_events = batch_events
        self.max_pending = max_pending
        self.retry_s = retry_s
        self._limiter = trio.CapacityLimiter(1)
        #: how the backend is called: on the store's one worker thread (tests on virtual time
        #: give a direct call)
        self._run_sync = run_sync if run_sync is not None else self._on_thread
        #: runs of (events, their wire bytes) recorded and not taken by a write yet
        self._pending: list[tuple[list[ev.Event], list[bytes]]] = []
        #: events recorded and not written yet (those of a write in progress too)
        self._count = 0
        #: sessions hold their agents back (the database fell behind)
        self.full = False
        self._room: list[Callable[[], object]] = []
        self._wake = trio.Event()  # something was recorded
        self._enough = trio.Event()  # a batch's worth was recorded
        self._closing = False
        self._done = trio.Event()
        self._batch_done = trio.Event()  # set (and replaced) as each write ends
        self._meta: dict[str, _Meta] = {}
        #: full texts of long prompts and steers, by (session, preview): events carry previews
        self._full_texts: dict[tuple[str, str], str] = {}
        #: the worker thread's: each running turn's answer so far, by (session, turn)
        self._answers: dict[tuple[str, str], list[str]] = {}
        #: writes given up since the last log line, and when it was
        self._lost_events = 0
        self._lost_batches = 0
        self._logged_at = -math.inf
        #: events written (a diagnostic, and what the benches read)
        self.written = 0
        #: the worker thread's: the rows of the batch being written (kept for a retry)
        self._last_batch = Batch()

    # -- setting up ----------------------------------------------------------------------

    async def open(self) -> list[StoredSession]:
        """Open the backend (:class:`StoreError` if it cannot be) and end the turns a
        supervisor that went away left running (:meth:`end_open_turns`); returns the stored
        sessions, the most recently active first."""
        await self._in_thread(self.backend.open)
        return await self._in_thread(self._end_open_turns)

    def _end_open_turns(self) -> list[StoredSession]:
        """A turn whose ``turn.ended`` never reached the store ran when its supervisor went
        away (stopped, killed, crashed): it ends now, in the history, failed, once."""
        stored = self.backend.sessions()
        now = time.time()
        runs: list[EventRun] = []
        changed: list[StoredSession] = []
        sessions: list[StoredSession] = []
        for session in stored:
            if session.open_turn_id is None:
                sessions.append(session)
                continue
            seq = session.last_seq + 1
            event = ev.TurnEnded(
                session_id=session.id,
                seq=seq,
                timestamp=now,
                turn_id=session.open_turn_id,
                outcome="failed",
                stop_reason="supervisor_gone",
                error="the supervisor went away while the turn ran",
            )
            runs.append(
                EventRun(session_id=session.id, first_seq=seq, payloads=[event_json(event)])
            )
            ended = attrs.evolve(session, open_turn_id=None, last_active=now, last_seq=seq)
            changed.append(ended)
            sessions.append(ended)
        if runs:
            self.backend.write(Batch(sessions=changed, events=runs))
        return sessions

    def attach(self, session: Any, resume: str | None = None) -> None:
        """Store ``session`` (a local or remote session handle) and its events from now on;
        ``resume``: the agent's own session id it was started to go on with (kept until the
        agent says its own)."""
        spec = session.spec
        self._meta[session.id] = _Meta(
            agent=spec.name,
            protocol=spec.protocol,
            host=session.host,
            cwd=session.cwd or "",
            mcp_servers=json.dumps([_mcp_json(server) for server in spec.mcp_servers]),
            created=time.time(),
            session=session,
            agent_session_id=resume,
        )
        session.fanout.recorder = self
        if hasattr(session, "on_text"):
            session.on_text = self.keep_text

    def keep_text(self, session_id: str, text: str) -> None:
        """The full text of a prompt or steer longer than an event's preview: stored in full
        with its turn once its event is written."""
        if len(text) <= PREVIEW_CHARS:
            return
        texts = self._full_texts
        if len(texts) >= _MAX_FULL_TEXTS:
            del texts[next(iter(texts))]
        texts[(session_id, preview(text)[0])] = text

    # -- the sessions' side (their actors: never blocks) ---------------------------------------

    def record(self, events: list[ev.Event], payloads: list[bytes]) -> None:
        """Events a session kept in its history, with their wire bytes: written soon."""
        self._pending.append((events, payloads))
        count = self._count = self._count + len(events)
        self._wake.set()
        if count >= self.batch_events:
            self._enough.set()
            if count >= self.max_pending:
                self.full = True

    def when_room(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once the store has room again (it was :attr:`full`)."""
        if self.full:
            self._room.append(callback)
        else:
            callback()

    # -- the writer ------------------------------------------------------------------------

    async def run(self) -> None:
        """Write what is recorded, in batches, until :meth:`aclose`."""
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    await self._wake.wait()
                    self._wake = trio.Event()
                    if not self._pending:
                        continue
                if self._count < self.batch_events and not self._closing:
                    with trio.move_on_after(self.flush_s):
                        await self._enough.wait()
                self._enough = trio.Event()
                await self._write_pending()
        finally:
            self._done.set()

    async def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        count = sum(len(events) for events, _ in pending)
        for attempt, pause in enumerate((*self.retry_s, None)):
            try:
                await self._in_thread(self._write, pending, attempt == 0)
                self.written += count
                break
            except Exception as exc:  # a backend's bug too: the sessions go on
                if pause is None or self._closing:
                    self._given_up(pending, count, exc)
                    break
                await trio.sleep(pause)
        self._count -= count
        self._batch_done.set()
        self._batch_done = trio.Event()
        if self.full and self._count < self.max_pending // 2:
            self.full = False
            room, self._room = self._room, []
            for callback in room:
                callback()

    def _given_up(
        self, pending: list[tuple[list[ev.Event], list[bytes]]], count: int, exc: Exception
    ) -> None:
        self._lost_events += count
        self._lost_batches += 1
        now = trio.current_time()
        if now - self._logged_at < LOG_EVERY_S:
            return
        spans: dict[str, list[int]] = {}
        for events, _ in pending:
            for event in events:
                span = spans.setdefault(event.session_id, [event.seq, event.seq])
                span[0], span[1] = min(span[0], event.seq), max(span[1], event.seq)
        where = ", ".join(f"{sid} seq {low}-{high}" for sid, (low, high) in spans.items())
        log.error(
            "store: %d events in %d batches could not be written (the last: %s): %s; the "
            "sessions go on",
            self._lost_events,
            self._lost_batches,
            where,
            exc if isinstance(exc, StoreError) else repr(exc),
        )
        self._logged_at = now
        self._lost_events = self._lost_batches = 0

    def _write(self, pending: list[tuple[list[ev.Event], list[bytes]]], first: bool) -> None:
        """(The worker thread.) The rows of ``pending``, written in one transaction."""
        self.backend.write(self._batch(pending) if first else self._last_batch)

    def _batch(self, pending: list[tuple[list[ev.Event], list[bytes]]]) -> Batch:
        """(The worker thread.) The rows of ``pending``: made once, kept for a retry."""
        runs: list[EventRun] = []
        receipts: list[ReceiptRow] = []
        texts: list[TextRow] = []
        touched: dict[str, _Meta] = {}
        newest: dict[str, EventRun] = {}  # each session's last run, to extend
        meta = self._meta
        answers = self._answers
        full_texts = self._full_texts
        for events, payloads in pending:
            if not events:
                continue
            sid = events[0].session_id
            first = events[0].seq
            if events[-1].seq - first != len(events) - 1:  # seqs with a hole (a node's gap)
                for event, payload in zip(events, payloads, strict=True):
                    runs.append(EventRun(session_id=sid, first_seq=event.seq, payloads=[payload]))
            else:
                run = newest.get(sid)
                if run is not None and run.last_seq + 1 == first:
                    run.payloads.extend(payloads)
                else:
                    run = newest[sid] = EventRun(
                        session_id=sid, first_seq=first, payloads=list(payloads)
                    )
                    runs.append(run)
            info = meta.get(sid)
            if info is not None:
                info.last_active = events[-1].timestamp
                touched[sid] = info
            for event in events:
                cls = type(event)
                if cls is ev.MessageDelta:
                    assert isinstance(event, ev.MessageDelta)
                    if event.turn_id is not None and event.role == "assistant":
                        answers.setdefault((sid, event.turn_id), []).append(event.text)
                elif cls is ev.SessionState:
                    assert isinstance(event, ev.SessionState)
                    if info is not None:
                        info.state = event.state
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
                elif cls is ev.TurnEnded:
                    assert isinstance(event, ev.TurnEnded)
                    if info is not None and info.open_turn_id == event.turn_id:
                        info.open_turn_id = None
                    parts = answers.pop((sid, event.turn_id), None)
                    if parts:
                        texts.append(
                            TextRow(
                                session_id=sid,
                                turn_id=event.turn_id,
                                seq=event.seq,
                                kind="answer",
                                text="".join(parts)[:MAX_ANSWER_CHARS],
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
        sessions = [_row(sid, info) for sid, info in touched.items()]
        self._last_batch = Batch(sessions=sessions, events=runs, receipts=receipts, texts=texts)
        return self._last_batch

    # -- reading ---------------------------------------------------------------------------

    async def events(self, session_id: str, since_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Stored events of a session after ``since_seq`` (on the store's thread: in order
        with the writes, so what was recorded before is there)."""
        return await self._in_thread(self.backend.events, session_id, since_seq, limit)

    async def turns(self, session_id: str) -> int:
        """How many turn ids (``t1``, ``t2``, ...) a stored session used: the highest."""
        texts = await self._in_thread(self.backend.texts, session_id)
        numbers = [int(t.turn_id[1:]) for t in texts if t.turn_id[1:].isdigit()]
        return max(numbers, default=0)

    async def sessions(self) -> list[StoredSession]:
        return await self._in_thread(self.backend.sessions)

    async def search(self, query: str, limit: int) -> list[Any]:
        return await self._in_thread(self.backend.search, query, limit)

    async def flushed(self) -> None:
        """Return once nothing recorded waits to be written (written, or given up)."""
        while self._count:
            await self._batch_done.wait()

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        result: T = await self._run_sync(fn, *args)
        return result

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def aclose(self) -> None:
        """Write what is left, then close the backend."""
        self._closing = True
        self._wake.set()
        self._enough.set()
        with trio.CancelScope(shield=True):
            await self._done.wait()
            await self._in_thread(self.backend.close)


def _row(session_id: str, info: _Meta) -> StoredSession:
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
    )


def _mcp_json(server: Any) -> Any:
    return attrs.asdict(server) if attrs.has(type(server)) else str(server)
