"""The session store's contract: what a backend stores, how it is asked, and its schema.

A backend is synchronous and used from one worker thread at a time (the store's writer runs
every call through ``trio.to_thread.run_sync`` with a ``CapacityLimiter(1)``): the trio side
never blocks on a database. Each backend keeps one connection, opened by :meth:`Backend.open`.

What is stored (``design/store.md``): every session (:class:`StoredSession`), every event
with its ``seq`` as the clients got it (its wire JSON bytes, in runs: :class:`EventRun`),
every receipt
(:class:`ReceiptRow`), and every prompt and steer in full beside each turn's answer
(:class:`TextRow`, searchable with the database's own full-text search).

The schema is :data:`MIGRATIONS`: one entry per schema version, each a list of SQL statements
per dialect. A backend records the version it reached in its table ``schema_version`` (one
column ``version``, created before the migrations as ``CREATE TABLE IF NOT EXISTS
schema_version (version INTEGER NOT NULL)``, one row); a file or
database of a version newer than ``len(MIGRATIONS)`` is refused (:class:`StoreError`), never
written to.
"""

from __future__ import annotations

import operator
import os
import pickle
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, SupportsIndex

from attrs import field, frozen

__all__ = [
    "EXCLUSIVE_KINDS",
    "INDEX_CHARS",
    "MIGRATIONS",
    "Owner",
    "SessionElsewhere",
    "SCHEMA_VERSION",
    "SESSIONS_QUERY",
    "SESSION_QUERY",
    "Backend",
    "Batch",
    "CheckpointRow",
    "EventRun",
    "FIRST_PROMPT_CHARS",
    "ReceiptRow",
    "SearchHit",
    "StoreError",
    "StoredSession",
    "TEXT_KINDS",
    "TextRow",
    "TurnEnd",
    "UPSERT_CHECKPOINT",
    "RUNS_QUERY",
    "ANSWERS_DUE_QUERY",
    "turn_ends",
    "CHECKPOINTS_QUERY",
    "checkpoint_rows",
    "highest_number",
    "this_process",
    "store_beyond",
    "stored_session",
]


class StoreError(Exception):
    """The store cannot be used: one line naming the file or URL and what to do about it
    (a corrupt file, a newer schema, a lock held by another process, a read-only directory,
    an unreachable server, bad credentials), or a write that failed (the batch is not
    written: all of it or none)."""


class SessionElsewhere(StoreError):
    """The stored session runs in another live process on the same store (its owner): it
    cannot be started again here; the message names that process."""


#: Characters of texts written and not in the search index yet past which a write leaves
#: :meth:`Backend.settle` their index to make at once; fewer wait for the store to be idle
#: (the writer's ``settle(idle=True)``) or for a search, which indexes what waits first. An
#: index costs the database ~100 ns a character (SQLite's FTS5; PostgreSQL's ``tsvector``
#: about half): made after each turn's end, a 20,000-word answer's would take its 10-20 ms
#: beside the next turn's first events; this bounds what one pass of it takes (~30 ms).
INDEX_CHARS = 256_000
#: The kinds of process of which one at most opens a store (a second is refused at open, one
#: line): two ``serve``s on one store would each serve its own half of the sessions.
EXCLUSIVE_KINDS = frozenset({"serve"})


@frozen(kw_only=True)
class Owner:
    """A process that has the store open (a row of ``owners``, written at open, deleted at a
    clean close). Its sessions are its own while it lives: no other process recovers them,
    starts their agents again, or lets retention delete them. Whether it lives is told by a
    lock it holds (``Backend.owners``), never guessed from its pid: the pid, host and start
    are what messages say of it."""

    #: random, never reused: what a session row's ``owner`` names
    token: str
    pid: int
    host: str
    #: ``serve``, ``acp`` (an ACP front door), ``embedded``...
    kind: str
    started: float

    def describe(self) -> str:
        """``acp pid 1234 on box``: how a message names it."""
        return f"{self.kind} pid {self.pid} on {self.host}"


@frozen(kw_only=True)
class StoredSession:
    """A session as the store keeps it. Written (upserted) whenever it changes; ``created`` is
    kept from its first write. ``last_seq`` is the store's own, filled when read (ignored in a
    :class:`Batch`): the newest ``seq`` stored."""

    id: str
    agent: str
    protocol: str
    host: str | None
    cwd: str
    #: the MCP servers given at start, as JSON text (a list of objects)
    mcp_servers: str
    #: the agent's own session id (what a resume passes to it); None: not known yet
    agent_session_id: str | None
    created: float
    last_active: float
    #: its last ``session.state`` (``supervisor/core/states.py``)
    state: str
    #: the turn whose ``turn.started`` is stored without its ``turn.ended`` (None: none): a
    #: supervisor that finds one at its start ends it (it ran when the last one went away)
    open_turn_id: str | None = None
    #: the supervisor that wrote it last closed the store cleanly (everything it recorded is
    #: written); False while one writes it: a store opened with it False was left unclean
    #: (a SIGKILL, a crash), and events clients saw may be missing (``design/store.md``)
    clean: bool = True
    #: turn numbers (``tN``) used at least, beside those the stored texts name: what an
    #: unclean end reserved for turns that may have started unstored (never lowered)
    turns: int = 0
    last_seq: int = 0
    #: its first stored prompt, its first :data:`FIRST_PROMPT_CHARS` characters ("": none);
    #: the store's own, filled when read (ignored in a :class:`Batch`), for lists of sessions
    first_prompt: str = ""
    #: the git worktree it runs in (``supervisor/worktrees.py``'s ``Worktree`` as JSON text);
    #: None: none
    worktree: str | None = None
    #: the token of the process (:class:`Owner`) that runs it (None: none, since its last
    #: process closed the store cleanly or its owner was found gone)
    owner: str | None = None


#: How much of a session's first prompt :data:`SESSIONS_QUERY` reads: a line of a list of
#: sessions (the web UI's past sessions) and some to spare; cut in the database, so a prompt
#: of megabytes costs a list nothing.
FIRST_PROMPT_CHARS = 200

#: Every stored session, newest first, with its newest ``seq`` and the start of its first
#: prompt (each an index lookup: ``texts`` is keyed by session and seq): the same SQL in both
#: dialects; each row is made a :class:`StoredSession` by :func:`stored_session`.
_SESSION_ROWS = f"""SELECT id, agent, protocol, host, cwd, mcp_servers, agent_session_id,
    created, last_active, state, open_turn_id, clean, turns,
    (SELECT max(last_seq) FROM events WHERE session_id = sessions.id),
    (SELECT substr(text, 1, {FIRST_PROMPT_CHARS}) FROM texts
        WHERE session_id = sessions.id AND kind = 'prompt' ORDER BY seq LIMIT 1),
    worktree, owner
FROM sessions"""
SESSIONS_QUERY = f"{_SESSION_ROWS} ORDER BY last_active DESC, id DESC"
#: One stored session, by id (the primary key), as :data:`SESSIONS_QUERY` has it; ``{}``: the
#: dialect's placeholder.
SESSION_QUERY = _SESSION_ROWS + " WHERE id = {}"


def stored_session(row: Sequence[Any]) -> StoredSession:
    """A row of :data:`SESSIONS_QUERY`."""
    return StoredSession(
        id=row[0],
        agent=row[1],
        protocol=row[2],
        host=row[3],
        cwd=row[4],
        mcp_servers=row[5],
        agent_session_id=row[6],
        created=row[7],
        last_active=row[8],
        state=row[9],
        open_turn_id=row[10],
        clean=bool(row[11]),
        turns=row[12],
        last_seq=row[13] or 0,
        first_prompt=row[14] or "",
        worktree=row[15],
        owner=row[16],
    )


@frozen(kw_only=True)
class EventRun:
    """Events of one session with contiguous seqs, from ``first_seq`` on, as clients got them:
    each its wire JSON (``supervisor/wire/codec.py``), byte for byte. Stored as one row (the
    payloads joined by ``\\n``, which compact JSON never holds): a row per event costs a
    flood ~3 us per event in SQLite, as much as the rest of the supervisor's work on it."""

    session_id: str
    first_seq: int
    #: each event's wire JSON; with :attr:`counts`, pieces of ``counts[i]`` events each,
    #: joined already (the store's writer hands over a stream's runs so)
    payloads: list[bytes]
    counts: list[int] | None = None

    @property
    def last_seq(self) -> int:
        count = len(self.payloads) if self.counts is None else sum(self.counts)
        return self.first_seq + count - 1

    def each(self) -> list[bytes]:
        """Each event's wire JSON."""
        if self.counts is None:
            return self.payloads
        return b"\n".join(self.payloads).split(b"\n")

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        """Pickled with its large pieces of bytes out of band (protocol 5): a writer process's
        batch sends them as they are, not copied into the pickle first
        (``supervisor/store/writer_child.py``); and with its fields as they are, not through
        a dictionary of them."""
        payloads: list[Any] = self.payloads
        if operator.index(protocol) >= 5:
            payloads = [
                pickle.PickleBuffer(piece) if len(piece) >= OUT_OF_BAND_BYTES else piece
                for piece in payloads
            ]
        return (_event_run, (self.session_id, self.first_seq, payloads, self.counts))


#: A piece of a batch's bytes at least this long is pickled out of band (a shorter one costs
#: the kernel more as a piece of its own than its copy into the pickle does).
OUT_OF_BAND_BYTES = 4096


def _event_run(
    session_id: str, first_seq: int, payloads: list[bytes], counts: list[int] | None
) -> EventRun:
    """(Unpickling) an :class:`EventRun`."""
    return EventRun(session_id=session_id, first_seq=first_seq, payloads=payloads, counts=counts)


@frozen(kw_only=True)
class ReceiptRow:
    """A turn's receipt (the one its ``turn.ended`` at ``seq`` carries), as wire JSON."""

    session_id: str
    turn_id: str
    seq: int
    payload: bytes


@frozen(kw_only=True)
class CheckpointRow:
    """A checkpoint a session may rewind to (``design/checkpoints.md``): a turn's (``tN``:
    the snapshot at its start, and at its end once it ended) or a rewind's own (``rN``: the
    state before it). The ids are commits of the session's checkpoint store, whose files
    outlive the process: a session revived later gets its checkpoints back from these rows.
    Written again when its turn ends: a row with ``end`` sets the stored row's end (its ``n``
    and ``start`` are known), one without replaces it (:data:`UPSERT_CHECKPOINT`)."""

    session_id: str
    checkpoint_id: str
    #: its place in the session's checkpoints: the newest has the highest
    n: int
    #: the snapshot's commit (a turn's start, the state before a rewind)
    start: str
    #: the snapshot at a turn's end (None: not ended, or a rewind's)
    end: str | None = None


#: How a :class:`CheckpointRow` is written, in both dialects (PostgreSQL's placeholders are
#: ``%s``): a row with an end (a turn's, as it ended) sets the stored row's end; one without (a
#: new checkpoint, whose id may have been a forgotten one's) replaces it.
UPSERT_CHECKPOINT = """INSERT INTO checkpoints (session_id, checkpoint_id, n, start_commit,
    end_commit) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (session_id, checkpoint_id) DO UPDATE SET
        n = CASE WHEN excluded.end_commit IS NULL THEN excluded.n ELSE checkpoints.n END,
        start_commit = CASE WHEN excluded.end_commit IS NULL THEN excluded.start_commit
            ELSE checkpoints.start_commit END,
        end_commit = excluded.end_commit"""

#: A session's newest checkpoints, at most a number of them, in both dialects (as above):
#: :func:`checkpoint_rows` reads them.
CHECKPOINTS_QUERY = """SELECT checkpoint_id, n, start_commit, end_commit FROM checkpoints
    WHERE session_id = ? ORDER BY n DESC LIMIT ?"""


def checkpoint_rows(session_id: str, rows: Sequence[Sequence[Any]]) -> list[CheckpointRow]:
    """The rows of :data:`CHECKPOINTS_QUERY`, oldest first."""
    return [
        CheckpointRow(session_id=session_id, checkpoint_id=c, n=n, start=start, end=end)
        for c, n, start, end in reversed(rows)
    ]


#: what a :class:`TextRow` holds: a prompt, a steer (both in full: events carry previews), or
#: the agent's answer in a turn (its ``message.delta`` texts joined, written at the turn's end)
TEXT_KINDS = ("prompt", "steer", "answer")


@frozen(kw_only=True)
class TextRow:
    """Text of a turn, kept in full and indexed for :meth:`Backend.search`."""

    session_id: str
    turn_id: str
    #: the seq of the event it goes with (the turn's start, the steer, the turn's end)
    seq: int
    #: one of :data:`TEXT_KINDS`
    kind: str
    text: str


@frozen(kw_only=True)
class SearchHit:
    """Where a search's words were found; ``snippet`` shows them in context."""

    session_id: str
    turn_id: str
    seq: int
    kind: str
    snippet: str
    #: the session's agent ("" for a text whose session row is missing)
    agent: str = ""
    #: when (Unix time) the event the text goes with happened; None: not stored
    time: float | None = None


@frozen(kw_only=True)
class TurnEnd:
    """A turn that ended, whose answer (:class:`TextRow` of kind ``answer``) is made from its
    stored events after the batch that holds its end (``supervisor/store/answers.py``):
    stored with that batch (``answers_due``) until it is."""

    session_id: str
    turn_id: str
    #: the seq of its ``turn.ended``
    seq: int
    #: the seq of its ``turn.started`` (None: not known)
    started: int | None = None


#: The stored runs :meth:`Backend.runs` reads (``{0}``: the dialect's placeholder).
RUNS_QUERY = """SELECT first_seq, last_seq, payloads FROM events WHERE session_id = {0}
    AND last_seq > {0} AND first_seq <= {0} ORDER BY first_seq LIMIT {0}"""
#: The answers due (:meth:`Backend.answers_due`), in order of their turn's end: every
#: session's, or (``{}``: ``WHERE session_id = ...``) one session's.
ANSWERS_DUE_QUERY = "SELECT session_id, turn_id, seq, started FROM answers_due {} ORDER BY seq"


def turn_ends(rows: Iterable[Sequence[Any]]) -> list[TurnEnd]:
    """The rows of :data:`ANSWERS_DUE_QUERY`."""
    return [
        TurnEnd(session_id=sid, turn_id=turn_id, seq=seq, started=started)
        for sid, turn_id, seq, started in rows
    ]


@frozen(kw_only=True)
class Batch:
    """What one :meth:`Backend.write` writes, in one transaction: all of it or none. Runs,
    receipts and texts already stored (the same ``session_id`` and ``first_seq``, ``seq``, or
    ``seq`` and ``kind``) are left as they are: a batch written twice stores nothing twice; a
    run longer than the one stored at its first seq has the rest stored
    (:func:`store_beyond`)."""

    sessions: list[StoredSession] = field(factory=list)
    events: list[EventRun] = field(factory=list)
    receipts: list[ReceiptRow] = field(factory=list)
    texts: list[TextRow] = field(factory=list)
    #: upserted as :data:`UPSERT_CHECKPOINT` says
    checkpoints: list[CheckpointRow] = field(factory=list)
    #: the turns it ends (their answers are due: made by :meth:`Backend.settle`)
    turn_ends: list[TurnEnd] = field(factory=list)
    #: turns whose answers it holds among its :attr:`texts` (no longer due)
    answered: list[TurnEnd] = field(factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.sessions
            or self.events
            or self.receipts
            or self.texts
            or self.checkpoints
            or self.turn_ends
            or self.answered
        )

    def text_chars(self) -> int:
        """The characters of its texts, each at least one (what their search index waits for:
        :data:`INDEX_CHARS`; above 0 when it has any)."""
        return sum(len(text.text) or 1 for text in self.texts)


def this_process(kind: str) -> Owner:
    """This process as an owner of a store, of ``kind``, with a new token."""
    return Owner(
        token=secrets.token_hex(8),
        pid=os.getpid(),
        host=socket.gethostname(),
        kind=kind,
        started=time.time(),
    )


def highest_number(ids: Iterable[str]) -> int:
    """The highest ``N`` of the ids ``sN`` among ``ids`` (0: none)."""
    return max((int(i[1:]) for i in ids if i[:1] == "s" and i[1:].isdigit()), default=0)


def store_beyond(
    run: EventRun,
    stored_last: Callable[[str, int], int | None],
    insert: Callable[[EventRun], None],
) -> None:
    """Store what ``run`` holds beyond the runs stored at its first seq: a run starting at a
    stored run's ``first_seq`` may be longer (a node's session adopted again hands over more
    than was stored); the stored events stay as they are (what clients got), the rest is
    inserted as a run of its own. ``stored_last(session_id, first_seq)``: the last seq of the
    run stored there, None if none; ``insert``: store a run whose key is free (the backends
    call this only for a batch that met a stored key: the common batch costs no query)."""
    first = run.first_seq
    while first <= run.last_seq:
        last = stored_last(run.session_id, first)
        if last is None:
            insert(
                EventRun(
                    session_id=run.session_id,
                    first_seq=first,
                    payloads=run.each()[first - run.first_seq :],
                )
            )
            return
        first = last + 1


class Backend(Protocol):
    """A database the store writes to and reads from (SQLite: ``supervisor/store/sqlite.py``)."""

    #: where it is, for messages (a path or a URL without its password)
    where: str

    def open(self) -> None:
        """Connect; create the schema or migrate it to :data:`SCHEMA_VERSION`. Raises
        :class:`StoreError` (one line: :attr:`where` and what to do) when it cannot."""

    @property
    def url(self) -> str:
        """The store's URL, as :func:`~supervisor.store.url.backend_for` takes it (with its
        password: never shown), for another process to open it."""

    def open_writes(self) -> None:
        """Connect for :meth:`write` and :meth:`settle` only, in a process beside the one that
        opened the store (:mod:`~supervisor.store.writer_process`): no lock, no ``owners``
        row, no migration (that process did those). :class:`StoreError` if it cannot."""

    def write(self, batch: Batch) -> bool:
        """Write ``batch`` in one transaction; :class:`StoreError` if it could not (nothing of
        it is written). True: :meth:`settle` has work to do now."""

    def settle(self, idle: bool) -> None:
        """What writes leave for after their events are given to subscribers: the answers of
        the turns that ended (:func:`~supervisor.store.answers.make_answers`), the search
        index of the texts written once :data:`INDEX_CHARS` wait (which :meth:`search` brings
        up to date itself too, and SQLite's :meth:`delete`), SQLite's checkpoint of a long
        write-ahead log; ``idle``: nothing was written for a while, so what can wait for that
        is done too (the index of whatever texts wait, a checkpoint of the log whatever it
        holds). :class:`StoreError` if it could not (the next call does it)."""

    def index(self) -> None:
        """Make the answers due and index every text written and not in the search index yet,
        as :meth:`search` does first: for a search another connection of the store is about
        to make."""

    def answers_due(self, session_id: str | None = None) -> list[TurnEnd]:
        """The turns that ended and whose answers are not made yet (of ``session_id``, or of
        every session), in order of their end."""

    def sessions(self) -> list[StoredSession]:
        """Every stored session, the most recently active first."""

    def events(self, session_id: str, since_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` events of the session with a seq above ``since_seq``, in order, as
        ``(seq, wire JSON)``; each seq once, though stored runs overlap (a node's session
        adopted again may hand over events already stored)."""

    def runs(
        self, session_id: str, after: int, upto: int, limit: int
    ) -> list[tuple[int, int, bytes]]:
        """Up to ``limit`` of the session's stored runs that hold a seq above ``after`` and
        not above ``upto``, in order of their first seq, as ``(first_seq, last_seq, wire JSON
        of each event joined by newlines)``: what reads many events at once reads (runs may
        overlap: a node's session adopted again)."""

    def texts(self, session_id: str) -> list[TextRow]:
        """The session's prompts, steers and answers, in order of seq: those of turns whose
        answers are not made yet too (made from their events here)."""

    def receipts(self, session_id: str) -> list[ReceiptRow]:
        """The session's receipts, in order of seq."""

    def checkpoints(self, session_id: str, limit: int) -> list[CheckpointRow]:
        """The session's newest ``limit`` checkpoints, oldest first."""

    def first_prompts(self, chars: int) -> dict[str, str]:
        """Each session's first stored prompt, its first ``chars`` characters, by session id
        (sessions without one left out): what a list of sessions shows of each."""

    def search(self, query: str, limit: int) -> list[SearchHit]:
        """Up to ``limit`` texts matching ``query`` (words, as the user typed them: the backend
        quotes them for its full-text search), the best first."""

    def sizes(self) -> dict[str, int]:
        """Each stored session's bytes: its events, receipts and texts as stored (what
        ``keep_bytes`` bounds; indexes and free pages not counted), by session id."""

    def delete(self, session_ids: Sequence[str]) -> None:
        """Delete the sessions, each whole (its row, events, receipts, texts and their search
        index, checkpoints), in one transaction; :class:`StoreError` if it could not (nothing
        is deleted)."""

    def reclaim(self, pages: int) -> bool:
        """Give back to the file system up to ``pages`` of the space deleted sessions freed
        (SQLite's incremental vacuum); whether some is left to give back. A backend whose
        database reuses freed space by itself (PostgreSQL) returns False."""

    def close(self) -> None:
        """Close the connection (the writer flushed what it had), delete this process's
        ``owners`` row and let go of its locks."""

    def session(self, session_id: str) -> StoredSession | None:
        """The stored session ``session_id`` (None: the store has it not): one indexed
        read, for a session another process of the store started since it was listed."""

    #: this process, as :meth:`open` registers it in ``owners``
    owner: Owner

    def owners(self) -> dict[str, tuple[Owner, bool]]:
        """Every registered owner by token, and whether it lives (holds its lock; this
        process's own does)."""

    def drop_owners(self, tokens: Sequence[str]) -> None:
        """Delete the ``owners`` rows of processes found gone (their sessions recovered)."""

    def exclusive(self) -> AbstractContextManager[None]:
        """Held by one process of the store at a time: what reads sessions' owners and
        writes by what it read (recovery, a session taken up, retention's deletes) runs in
        it, so two processes never both take one session."""

    def next_session_number(self, at_least: int) -> int:
        """A new session number (``sN``), one no process of the store was given before nor
        any stored session has; above ``at_least``. Atomic across processes."""


#: New texts compressed with LZ4 rather than PostgreSQL's own pglz where the server has it
#: (version 14 and later, built with it, as Debian's is): a long answer is compressed in the
#: batch of its turn's end, which subscribers wait for, and pglz takes ~13 ms for 100,000
#: words where LZ4 takes ~3 (``bench/store_turn_end.py``). A server without it keeps pglz;
#: stored texts keep theirs.
_LZ4_TEXTS = """DO $$ BEGIN
    EXECUTE 'ALTER TABLE texts ALTER COLUMN text SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN NULL;
END $$"""

#: The schema, one entry per version: its statements for each dialect, run in order in one
#: transaction with the version's ``schema_version`` row. Tables and columns are the same in
#: every dialect (the names the backends query); only types and full-text indexing differ.
#:
#: - ``sessions``: :class:`StoredSession` (``clean`` and ``turns`` from version 2,
#:   ``worktree`` from version 3).
#: - ``events``: :class:`EventRun`, unique ``(session_id, first_seq)`` (the primary key in
#:   PostgreSQL), with its ``last_seq`` and ``payloads`` (joined by ``\n``); indexed on
#:   ``(session_id, last_seq)``.
#: - ``receipts``: :class:`ReceiptRow`, primary key ``(session_id, seq)``.
#: - ``texts``: :class:`TextRow`, primary key ``(session_id, seq, kind)``; SQLite indexes
#:   ``text`` in the FTS5 table ``texts_fts`` (rowid: the row's ``rowid``), PostgreSQL in a
#:   ``tsvector`` column ``search`` with a GIN index, of the text's first 100,000 characters
#:   (a tsvector holds at most 1 MB: a longer text's would fail its batch). Both fill their
#:   index after the write that stores a text (:meth:`Backend.settle`); PostgreSQL's
#:   ``search`` is NULL until then (a plain column from version 6, generated before), and
#:   its partial index ``texts_unindexed`` finds those rows.
#: - ``checkpoints`` (from version 4): :class:`CheckpointRow`, primary key
#:   ``(session_id, checkpoint_id)``, its commits in ``start_commit`` and ``end_commit``.
#: - ``owners`` (from version 5): :class:`Owner`, primary key ``token``; ``sessions.owner``
#:   names one. ``counters`` (from version 5): ``name`` and ``value``; the row ``session``
#:   is the highest session number handed out (:meth:`Backend.next_session_number`).
#: - ``answers_due`` (from version 7): :class:`TurnEnd`, primary key ``(session_id, seq)``:
#:   the turns whose answers are not made yet.
MIGRATIONS: list[dict[str, list[str]]] = [
    {
        "sqlite": [
            """CREATE TABLE sessions (
                id TEXT PRIMARY KEY,
                agent TEXT NOT NULL,
                protocol TEXT NOT NULL,
                host TEXT,
                cwd TEXT NOT NULL,
                mcp_servers TEXT NOT NULL,
                agent_session_id TEXT,
                created REAL NOT NULL,
                last_active REAL NOT NULL,
                state TEXT NOT NULL,
                open_turn_id TEXT
            )""",
            "CREATE INDEX sessions_by_activity ON sessions (last_active)",
            """CREATE TABLE events (
                session_id TEXT NOT NULL,
                first_seq INTEGER NOT NULL,
                last_seq INTEGER NOT NULL,
                payloads BLOB NOT NULL,
                PRIMARY KEY (session_id, first_seq)
            ) WITHOUT ROWID""",
            "CREATE INDEX events_by_last ON events (session_id, last_seq)",
            """CREATE TABLE receipts (
                session_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                turn_id TEXT NOT NULL,
                payload BLOB NOT NULL,
                PRIMARY KEY (session_id, seq)
            ) WITHOUT ROWID""",
            """CREATE TABLE texts (
                session_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                kind TEXT NOT NULL,
                turn_id TEXT NOT NULL,
                text TEXT NOT NULL,
                UNIQUE (session_id, seq, kind)
            )""",
            """CREATE VIRTUAL TABLE texts_fts USING fts5(
                text, content='texts', content_rowid='rowid'
            )""",
        ],
        "postgresql": [
            """CREATE TABLE sessions (
                id TEXT PRIMARY KEY,
                agent TEXT NOT NULL,
                protocol TEXT NOT NULL,
                host TEXT,
                cwd TEXT NOT NULL,
                mcp_servers TEXT NOT NULL,
                agent_session_id TEXT,
                created DOUBLE PRECISION NOT NULL,
                last_active DOUBLE PRECISION NOT NULL,
                state TEXT NOT NULL,
                open_turn_id TEXT
            )""",
            "CREATE INDEX sessions_by_activity ON sessions (last_active)",
            """CREATE TABLE events (
                session_id TEXT NOT NULL,
                first_seq BIGINT NOT NULL,
                last_seq BIGINT NOT NULL,
                payloads BYTEA NOT NULL,
                PRIMARY KEY (session_id, first_seq)
            )""",
            "CREATE INDEX events_by_last ON events (session_id, last_seq)",
            """CREATE TABLE receipts (
                session_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                turn_id TEXT NOT NULL,
                payload BYTEA NOT NULL,
                PRIMARY KEY (session_id, seq)
            )""",
            """CREATE TABLE texts (
                session_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                kind TEXT NOT NULL,
                turn_id TEXT NOT NULL,
                text TEXT NOT NULL,
                search TSVECTOR GENERATED ALWAYS AS (
                    to_tsvector('simple', left(text, 100000))
                ) STORED,
                PRIMARY KEY (session_id, seq, kind)
            )""",
            "CREATE INDEX texts_search ON texts USING GIN (search)",
        ],
    },
    {
        "sqlite": [
            "ALTER TABLE sessions ADD COLUMN clean INTEGER NOT NULL DEFAULT 1",
            "ALTER TABLE sessions ADD COLUMN turns INTEGER NOT NULL DEFAULT 0",
            # Runs in a rowid table: a run is kilobytes, and SQLite writes a big row of a
            # WITHOUT ROWID table's B-tree at a quarter more CPU (its own advice: WITHOUT ROWID
            # for rows under a twentieth of a page).
            """CREATE TABLE events_runs (
                session_id TEXT NOT NULL,
                first_seq INTEGER NOT NULL,
                last_seq INTEGER NOT NULL,
                payloads BLOB NOT NULL,
                UNIQUE (session_id, first_seq)
            )""",
            """INSERT INTO events_runs (session_id, first_seq, last_seq, payloads)
                SELECT session_id, first_seq, last_seq, payloads FROM events
                ORDER BY session_id, first_seq""",
            "DROP TABLE events",
            "ALTER TABLE events_runs RENAME TO events",
            "CREATE INDEX events_by_last ON events (session_id, last_seq)",
        ],
        "postgresql": [
            "ALTER TABLE sessions ADD COLUMN clean BOOLEAN NOT NULL DEFAULT TRUE",
            "ALTER TABLE sessions ADD COLUMN turns BIGINT NOT NULL DEFAULT 0",
        ],
    },
    {
        "sqlite": ["ALTER TABLE sessions ADD COLUMN worktree TEXT"],
        "postgresql": ["ALTER TABLE sessions ADD COLUMN worktree TEXT"],
    },
    {
        "sqlite": [
            """CREATE TABLE checkpoints (
                session_id TEXT NOT NULL,
                checkpoint_id TEXT NOT NULL,
                n INTEGER NOT NULL,
                start_commit TEXT NOT NULL,
                end_commit TEXT,
                PRIMARY KEY (session_id, checkpoint_id)
            ) WITHOUT ROWID""",
            "CREATE INDEX checkpoints_by_n ON checkpoints (session_id, n)",
        ],
        "postgresql": [
            """CREATE TABLE checkpoints (
                session_id TEXT NOT NULL,
                checkpoint_id TEXT NOT NULL,
                n BIGINT NOT NULL,
                start_commit TEXT NOT NULL,
                end_commit TEXT,
                PRIMARY KEY (session_id, checkpoint_id)
            )""",
            "CREATE INDEX checkpoints_by_n ON checkpoints (session_id, n)",
        ],
    },
    {
        "sqlite": [
            "ALTER TABLE sessions ADD COLUMN owner TEXT",
            """CREATE TABLE owners (
                token TEXT PRIMARY KEY,
                pid INTEGER NOT NULL,
                host TEXT NOT NULL,
                kind TEXT NOT NULL,
                started REAL NOT NULL
            )""",
            "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
            "INSERT INTO counters (name, value) VALUES ('session', 0)",
        ],
        "postgresql": [
            "ALTER TABLE sessions ADD COLUMN owner TEXT",
            """CREATE TABLE owners (
                token TEXT PRIMARY KEY,
                pid BIGINT NOT NULL,
                host TEXT NOT NULL,
                kind TEXT NOT NULL,
                started DOUBLE PRECISION NOT NULL
            )""",
            "CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
            "INSERT INTO counters (name, value) VALUES ('session', 0)",
        ],
    },
    {
        "sqlite": [],
        "postgresql": [
            # The vectors stored stay; new rows' are set after their write (settle()).
            "ALTER TABLE texts ALTER COLUMN search DROP EXPRESSION",
            "CREATE INDEX texts_unindexed ON texts (session_id) WHERE search IS NULL",
            _LZ4_TEXTS,
        ],
    },
    {
        "sqlite": [
            """CREATE TABLE answers_due (
                session_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                turn_id TEXT NOT NULL,
                started INTEGER,
                PRIMARY KEY (session_id, seq)
            ) WITHOUT ROWID"""
        ],
        "postgresql": [
            """CREATE TABLE answers_due (
                session_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                turn_id TEXT NOT NULL,
                started BIGINT,
                PRIMARY KEY (session_id, seq)
            )"""
        ],
    },
]

#: The schema version this code writes (a store of a newer one is refused).
SCHEMA_VERSION = len(MIGRATIONS)
