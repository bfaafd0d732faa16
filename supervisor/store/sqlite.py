"""The session store in an SQLite file (stdlib ``sqlite3``), the default store.

WAL with ``synchronous=NORMAL``: a batch is one transaction, appended to the log without an
fsync per commit (a power cut may lose the last batches, never corrupt the file; a crash of
the process loses nothing written). Several processes share the file (an ACP front door
beside ``serve``): each registers itself in ``owners`` and holds a lock on a file of its own
in the directory ``<file>.owners`` for as long as it lives (``flock``: the kernel lets go of
it when the process dies, however it dies), so another process tells a live owner from a gone
one by trying that lock. A ``serve`` also holds ``<file>.owners/serve``: a second one is
refused at open. Writers wait for each other (SQLite's busy timeout). FTS5 indexes the texts
(``texts_fts``) for :meth:`search`.
What can wait until a batch's events are given to subscribers is done then (:meth:`settle`):
the search index of the texts written, and the checkpoint of the write-ahead log.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from supervisor.store.answers import make_answers, with_answers_due
from supervisor.store.backend import (
    ANSWERS_DUE_QUERY,
    CHECKPOINTS_QUERY,
    EXCLUSIVE_KINDS,
    INDEX_CHARS,
    MIGRATIONS,
    RUNS_QUERY,
    SCHEMA_VERSION,
    SESSION_QUERY,
    SESSIONS_QUERY,
    UPSERT_CHECKPOINT,
    Batch,
    CheckpointRow,
    EventRun,
    Owner,
    ReceiptRow,
    SearchHit,
    StoredSession,
    StoreError,
    TextRow,
    TurnEnd,
    checkpoint_rows,
    store_beyond,
    stored_session,
    this_process,
    turn_ends,
)

__all__ = ["SqliteBackend"]


#: How long opening waits for a lock another process holds before saying so: long enough for
#: a supervisor that is stopping to let go, short enough that a second ``serve`` on the same
#: file says at once that it cannot.
_LOCK_WAIT_S = 2.0
#: The texts the search index (an external-content FTS5 table) lacks, indexed: those above
#: the highest rowid it holds (``texts_fts_docsize`` has a row per text indexed; a text's
#: rowid is above every stored one's, and a deleted text leaves the index with it). Not in
#: the write that stores them: a long answer's index costs tens of ms of SQLite's time (100,000
#: distinct words: ~50-80 ms), which would hold back the turn's last events from subscribers.
_INDEX_TEXTS = """INSERT INTO texts_fts (rowid, text) SELECT rowid, text FROM texts
    WHERE rowid > (SELECT coalesce(max(id), 0) FROM texts_fts_docsize) ORDER BY rowid"""
#: A file an earlier version wrote indexes each text in the write that stores it, by this
#: trigger: dropped, and what it would have indexed is indexed by :data:`_INDEX_TEXTS`.
_DROP_FTS_TRIGGER = "DROP TRIGGER IF EXISTS texts_fts_insert"
#: Pages the write-ahead log holds at most before a checkpoint is due after a write (SQLite's
#: own default, in 16 KB pages: 16 MB); below it, the log is checkpointed when the store is
#: idle (:meth:`SqliteBackend.settle`). SQLite's automatic checkpoint runs inside the commit
#: that fills the log: a copy of the log into the file and two fsyncs, tens of ms on a busy
#: disk, holding back that batch's events from subscribers. Ours runs on a thread and a
#: connection of its own (:class:`_Checkpointer`), beside the writes, which it never holds back.
CHECKPOINT_PAGES = 1000
#: Pages a write adds to the log beyond its rows' bytes (the leaves of the tables and indexes
#: a batch adds to, the file's header): what :meth:`SqliteBackend.write` counts, a bound.
_PAGES_PER_WRITE = 5
#: How long a statement waits for another process's write to end (SQLite's busy timeout): a
#: batch takes a few ms; past this, the write fails and the writer tries it again.
_BUSY_S = 10.0
_WORD = re.compile(r"\w+", re.UNICODE)
#: The page size of a new file (``_setup``).
_PAGE_SIZE = 16384
#: ``PRAGMA auto_vacuum``'s answer for a file that gives freed pages back on request. A new
#: file is not made so: its pointer-map pages, written with every batch, cost 25-50 % of the
#: write rate (``design/store.md``, "Retention"); freed pages are reused for new rows instead.
_INCREMENTAL = 2
_INSERT_EVENTS_HEAD = "INSERT OR IGNORE INTO events (session_id, first_seq, last_seq, payloads)"
_INSERT_EVENTS = _INSERT_EVENTS_HEAD + " VALUES (?, ?, ?, ?)"
#: Rows one statement inserts at most (:func:`_insert_rows`): a batch of many sessions' runs
#: (a flood of many sessions) is then a call or two into SQLite, not one per row. Each call
#: takes the GIL back from the event loop as it returns, and a busy event loop gives it up
#: only at its switch interval (5 ms): a batch of 100 sessions' runs row by row took ~100 ms.
#: Well under SQLite's 32,766 parameters (15 a session's row).
ROWS_PER_STATEMENT = 100
#: Statements the connection keeps prepared: a batch's statement has as many rows as it
#: writes (1 to ``ROWS_PER_STATEMENT``, events and sessions' rows), and preparing one is
#: one more call into SQLite (and one more wait for the GIL) than running it.
_CACHED_STATEMENTS = 512


class SqliteBackend:
    """The store in the SQLite file ``path`` (created, with its directory, if missing)."""

    def __init__(self, path: str | os.PathLike[str], kind: str = "serve") -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self._db: sqlite3.Connection | None = None
        self._page_size = _PAGE_SIZE
        #: the characters of the texts written and not indexed yet (INDEX_CHARS: those a
        #: writer before this one left, of unknown size; 0: none); pages the log holds
        #: (counted as written)
        self._unindexed_chars = 0
        self._log_pages = 0
        self._checkpointer: _Checkpointer | None = None
        #: answers may be due (a batch with turns' ends was written since they were made, or
        #: a writer before this one left some)
        self._answers_due = True
        self.owner = this_process(kind)
        #: the directory of the owners' lock files
        self._locks = self.path.with_name(self.path.name + ".owners")
        #: the lock files this process holds (its owner's, a serve's), open for as long
        self._held: list[int] = []
        #: opened by :meth:`open_writes`: no owner of the store
        self._writes_only = False

    def _hold(self, name: str, wait_s: float) -> bool:
        """Lock ``name`` in the owners' directory (exclusive) and keep it; False if another
        process holds it for ``wait_s``."""
        fd = os.open(self._locks / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
                continue
            self._held.append(fd)
            return True

    def _let_go(self) -> None:
        for fd in self._held:
            os.close(fd)
        self._held.clear()

    def open(self) -> None:
        where = self.where
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the store's directory {self.path.parent}: {exc.strerror}; "
                "choose another with [store] url or --store"
            ) from None
        if not os.access(self.path.parent, os.W_OK) or (
            self.path.exists() and not os.access(self.path, os.W_OK)
        ):
            raise StoreError(
                f"the store {where} is not writable (read-only directory or file); make it "
                "writable or choose another with [store] url or --store"
            )
        try:
            self._locks.mkdir(exist_ok=True)
            if self.owner.kind in EXCLUSIVE_KINDS and not self._hold(self.owner.kind, _LOCK_WAIT_S):
                raise StoreError(
                    f"the store {where} is in use by another process (another agent-supervisor "
                    f"{self.owner.kind}); stop it or choose another file with [store] url or "
                    "--store"
                )
            self._hold(self.owner.token, 0)
        except OSError as exc:
            self._let_go()
            raise StoreError(f"cannot lock the store {where}: {exc.strerror}") from None
        except StoreError:
            self._let_go()
            raise
        try:
            db = _connect(str(self.path))
        except sqlite3.Error as exc:
            self._let_go()
            raise StoreError(f"cannot open the store {where}: {exc}") from None
        try:
            self._setup(db)
        except sqlite3.DatabaseError as exc:
            db.close()
            self._let_go()
            raise StoreError(_open_error(where, exc)) from None
        except StoreError:
            db.close()
            self._let_go()
            raise
        db.execute(f"PRAGMA busy_timeout = {int(_BUSY_S * 1000)}")
        self._db = db

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path.resolve()}"

    def open_writes(self) -> None:
        where = self.where
        try:
            # (mode=rw: the file the supervisor opened, never a new one)
            db = _connect(self.path.resolve().as_uri() + "?mode=rw", uri=True)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {where}: {exc}") from None
        try:
            self._writing_settings(db)  # (the journal mode is the file's)
            db.execute(f"PRAGMA busy_timeout = {int(_BUSY_S * 1000)}")
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(f"cannot open the store {where}: {exc}") from None
        self._writes_only = True
        # (texts a writer before this one left unindexed: indexed by the first settle)
        self._unindexed_chars = INDEX_CHARS
        self._db = db

    def _setup(self, db: sqlite3.Connection) -> None:
        # A new file's pages (an existing file keeps its own): a flood's batch is ~100 KB of
        # runs, written at a third less CPU in 16 KB pages than in the default 4 KB.
        db.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
        if db.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
            raise StoreError(f"the store {self.where} cannot use WAL; choose another file")
        self._writing_settings(db)
        db.execute("BEGIN IMMEDIATE")  # one process migrates at a time
        try:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT max(version) FROM schema_version").fetchone()
            version = row[0] or 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the store {self.where} has schema version {version}, newer than this "
                    f"agent-supervisor's ({SCHEMA_VERSION}); upgrade agent-supervisor or "
                    "choose another file"
                )
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number]["sqlite"]:
                    db.execute(statement)
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (number + 1,))
            db.execute(_DROP_FTS_TRIGGER)
            db.execute(_INDEX_TEXTS)  # (what a supervisor that went away left unindexed)
            o = self.owner
            # (a file kept at an older schema has no owners: none to share it with)
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'owners'").fetchone():
                db.execute(
                    "INSERT INTO owners (token, pid, host, kind, started) VALUES (?, ?, ?, ?, ?)",
                    (o.token, o.pid, o.host, o.kind, o.started),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _writing_settings(self, db: sqlite3.Connection) -> None:
        """How a connection of this process or of the writer process writes: commits without
        an fsync (WAL), the log checkpointed by :meth:`settle` only; the file's page size."""
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA wal_autocheckpoint = 0")
        self._page_size = int(db.execute("PRAGMA page_size").fetchone()[0])

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"the store {self.where} is not open")
        return self._db

    def write(self, batch: Batch) -> bool:
        db = self._conn
        try:
            size = _events_alone(db, batch)
            if size is None:
                db.execute("BEGIN")
                try:
                    size = self._write(db, batch)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to the store {self.where}: {exc}") from None
        self._unindexed_chars += batch.text_chars()
        self._log_pages += _PAGES_PER_WRITE + size // self._page_size
        if batch.turn_ends:
            self._answers_due = True
        return (
            bool(batch.turn_ends)
            or self._unindexed_chars >= INDEX_CHARS
            or self._log_pages >= CHECKPOINT_PAGES
        )

    def _make_answers(self) -> None:
        if self._answers_due:
            make_answers(self, self.answers_due())
            self._answers_due = False

    def settle(self, idle: bool) -> None:
        self._make_answers()
        db = self._conn
        try:
            if self._unindexed_chars >= INDEX_CHARS or (idle and self._unindexed_chars):
                self._index_texts(db)
            if self._log_pages >= CHECKPOINT_PAGES or (idle and self._log_pages):
                if self._checkpointer is None:
                    self._checkpointer = _Checkpointer(self.path)
                if self._checkpointer.start():
                    self._log_pages = 0
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to the store {self.where}: {exc}") from None

    def index(self) -> None:
        self._make_answers()
        try:
            self._index_texts(self._conn)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to the store {self.where}: {exc}") from None

    def _index_texts(self, db: sqlite3.Connection) -> None:
        db.execute(_INDEX_TEXTS)  # (one statement: its own transaction)
        self._unindexed_chars = 0

    @staticmethod
    def _write(db: sqlite3.Connection, batch: Batch) -> int:
        """The rows of ``batch``; returns about how many bytes they hold (its events')."""
        size = 0
        if batch.sessions:
            _insert_rows(
                db,
                """INSERT INTO sessions (id, agent, protocol, host, cwd, mcp_servers,
                    agent_session_id, created, last_active, state, open_turn_id, clean, turns,
                    worktree, owner)""",
                """ON CONFLICT (id) DO UPDATE SET agent = excluded.agent,
                    protocol = excluded.protocol, host = excluded.host, cwd = excluded.cwd,
                    mcp_servers = excluded.mcp_servers,
                    agent_session_id = excluded.agent_session_id,
                    last_active = excluded.last_active, state = excluded.state,
                    open_turn_id = excluded.open_turn_id, clean = excluded.clean,
                    turns = max(sessions.turns, excluded.turns),
                    worktree = excluded.worktree, owner = excluded.owner""",
                [
                    (
                        s.id,
                        s.agent,
                        s.protocol,
                        s.host,
                        s.cwd,
                        s.mcp_servers,
                        s.agent_session_id,
                        s.created,
                        s.last_active,
                        s.state,
                        s.open_turn_id,
                        s.clean,
                        s.turns,
                        s.worktree,
                        s.owner,
                    )
                    for s in batch.sessions
                ],
            )
        if batch.events:
            runs = [run for run in batch.events if run.payloads]
            rows = [(r.session_id, r.first_seq, r.last_seq, b"\n".join(r.payloads)) for r in runs]
            size = sum(len(row[3]) for row in rows)
            inserted = _insert_rows(db, _INSERT_EVENTS_HEAD, "", rows)
            if inserted < len(runs):  # some met a stored run: what they hold beyond it

                def stored_last(session_id: str, first_seq: int) -> int | None:
                    row = db.execute(
                        "SELECT last_seq FROM events WHERE session_id = ? AND first_seq = ?",
                        (session_id, first_seq),
                    ).fetchone()
                    return None if row is None else int(row[0])

                def insert(r: EventRun) -> None:
                    db.execute(
                        _INSERT_EVENTS,
                        (r.session_id, r.first_seq, r.last_seq, b"\n".join(r.payloads)),
                    )

                for r in runs:
                    store_beyond(r, stored_last, insert)
        if batch.receipts:
            db.executemany(
                "INSERT OR IGNORE INTO receipts (session_id, seq, turn_id, payload) "
                "VALUES (?, ?, ?, ?)",
                [(r.session_id, r.seq, r.turn_id, r.payload) for r in batch.receipts],
            )
        if batch.texts:
            db.executemany(
                "INSERT OR IGNORE INTO texts (session_id, seq, kind, turn_id, text) "
                "VALUES (?, ?, ?, ?, ?)",
                [(t.session_id, t.seq, t.kind, t.turn_id, t.text) for t in batch.texts],
            )
        if batch.checkpoints:
            db.executemany(
                UPSERT_CHECKPOINT,
                [(c.session_id, c.checkpoint_id, c.n, c.start, c.end) for c in batch.checkpoints],
            )
        if batch.turn_ends:
            db.executemany(
                "INSERT OR IGNORE INTO answers_due (session_id, turn_id, seq, started) "
                "VALUES (?, ?, ?, ?)",
                [(e.session_id, e.turn_id, e.seq, e.started) for e in batch.turn_ends],
            )
        if batch.answered:
            db.executemany(
                "DELETE FROM answers_due WHERE session_id = ? AND seq = ?",
                [(e.session_id, e.seq) for e in batch.answered],
            )
        return size

    def sessions(self) -> list[StoredSession]:
        return [stored_session(row) for row in self._read(SESSIONS_QUERY, ())]

    def session(self, session_id: str) -> StoredSession | None:
        rows = self._read(SESSION_QUERY.format("?"), (session_id,))
        return stored_session(rows[0]) if rows else None

    def events(self, session_id: str, since_seq: int, limit: int) -> list[tuple[int, bytes]]:
        found: list[tuple[int, bytes]] = []
        try:
            runs = self._conn.execute(
                "SELECT first_seq, payloads FROM events WHERE session_id = ? AND last_seq > ? "
                "ORDER BY first_seq",
                (session_id, since_seq),
            )
            after = since_seq
            for first, payloads in runs:
                for seq, payload in enumerate(bytes(payloads).split(b"\n"), first):
                    if seq > after:  # (runs that overlap: each seq once)
                        found.append((seq, payload))
                        after = seq
                        if len(found) >= limit:
                            return found
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the store {self.where}: {exc}") from None
        return found

    def texts(self, session_id: str) -> list[TextRow]:
        stored = [
            TextRow(session_id=session_id, seq=seq, kind=kind, turn_id=turn_id, text=text)
            for seq, kind, turn_id, text in self._read(
                "SELECT seq, kind, turn_id, text FROM texts WHERE session_id = ? ORDER BY seq",
                (session_id,),
            )
        ]
        return with_answers_due(self, session_id, stored)

    def runs(
        self, session_id: str, after: int, upto: int, limit: int
    ) -> list[tuple[int, int, bytes]]:
        rows = self._read(RUNS_QUERY.format("?"), (session_id, after, upto, limit))
        return [(first, last, bytes(payloads)) for first, last, payloads in rows]

    def answers_due(self, session_id: str | None = None) -> list[TurnEnd]:
        if session_id is None:
            return turn_ends(self._read(ANSWERS_DUE_QUERY.format(""), ()))
        one = ANSWERS_DUE_QUERY.format("WHERE session_id = ?")
        return turn_ends(self._read(one, (session_id,)))

    def receipts(self, session_id: str) -> list[ReceiptRow]:
        return [
            ReceiptRow(session_id=session_id, seq=seq, turn_id=turn_id, payload=bytes(payload))
            for seq, turn_id, payload in self._read(
                "SELECT seq, turn_id, payload FROM receipts WHERE session_id = ? ORDER BY seq",
                (session_id,),
            )
        ]

    def checkpoints(self, session_id: str, limit: int) -> list[CheckpointRow]:
        return checkpoint_rows(session_id, self._read(CHECKPOINTS_QUERY, (session_id, limit)))

    def first_prompts(self, chars: int) -> dict[str, str]:
        rows = self._read(
            """SELECT session_id, substr(text, 1, ?) FROM texts t WHERE kind = 'prompt'
            AND seq = (SELECT min(seq) FROM texts
                WHERE session_id = t.session_id AND kind = 'prompt')""",
            (chars,),
        )
        return {session_id: text for session_id, text in rows}

    def search(self, query: str, limit: int) -> list[SearchHit]:
        words = _WORD.findall(query)
        if not words:
            return []
        due = self.answers_due()  # (every process's: one may have gone away first)
        if due:
            make_answers(self, due)
        if self._unindexed_chars:  # (texts written since: found too)
            self.index()
        # Each word quoted: what the user typed is text to find, never FTS5 syntax.
        match = " ".join('"' + word.replace('"', '""') + '"' for word in words)
        rows = self._read(
            """SELECT t.session_id, t.turn_id, t.seq, t.kind,
                snippet(texts_fts, 0, '[', ']', '...', 12), coalesce(s.agent, '')
            FROM texts_fts JOIN texts t ON t.rowid = texts_fts.rowid
            LEFT JOIN sessions s ON s.id = t.session_id
            WHERE texts_fts MATCH ? ORDER BY rank LIMIT ?""",
            (match, limit),
        )
        return [
            SearchHit(
                session_id=row[0],
                turn_id=row[1],
                seq=row[2],
                kind=row[3],
                snippet=row[4],
                agent=row[5],
            )
            for row in rows
        ]

    def sizes(self) -> dict[str, int]:
        # length() of a blob reads its size from the row's header, not its pages.
        rows = self._read(
            """SELECT session_id, sum(n) FROM (
                SELECT session_id, length(payloads) AS n FROM events
                UNION ALL SELECT session_id, length(payload) FROM receipts
                UNION ALL SELECT session_id, length(text) FROM texts
            ) GROUP BY session_id""",
            (),
        )
        return {session_id: int(size or 0) for session_id, size in rows}

    def delete(self, session_ids: Sequence[str]) -> None:
        db = self._conn
        ids = [(session_id,) for session_id in session_ids]
        try:
            db.execute("BEGIN")
            try:
                # The search index is an external-content table: told of each row that goes,
                # which it must hold (a text it lacks would corrupt it).
                db.execute(_INDEX_TEXTS)
                db.executemany(
                    "INSERT INTO texts_fts (texts_fts, rowid, text) "
                    "SELECT 'delete', rowid, text FROM texts WHERE session_id = ?",
                    ids,
                )
                for table in ("texts", "receipts", "events", "checkpoints", "answers_due"):
                    db.executemany(f"DELETE FROM {table} WHERE session_id = ?", ids)
                db.executemany("DELETE FROM sessions WHERE id = ?", ids)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot delete from the store {self.where}: {exc}") from None

    def reclaim(self, pages: int) -> bool:
        db = self._conn
        try:
            if db.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
                return False
            # (Each step of the statement frees a page: it is stepped to its end.)
            db.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
            return int(db.execute("PRAGMA freelist_count").fetchone()[0]) > 0
        except sqlite3.Error as exc:
            raise StoreError(f"cannot reclaim space in the store {self.where}: {exc}") from None

    def _read(self, sql: str, parameters: tuple[object, ...]) -> list[Any]:
        try:
            return list(self._conn.execute(sql, parameters))
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the store {self.where}: {exc}") from None

    def owners(self) -> dict[str, tuple[Owner, bool]]:
        found: dict[str, tuple[Owner, bool]] = {}
        for token, pid, host, kind, started in self._read(
            "SELECT token, pid, host, kind, started FROM owners", ()
        ):
            owner = Owner(token=token, pid=pid, host=host, kind=kind, started=started)
            found[token] = (owner, token == self.owner.token or self._lives(token))
        return found

    def _lives(self, token: str) -> bool:
        """Whether the process that registered ``token`` holds its lock file still."""
        try:
            fd = os.open(self._locks / token, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False  # (deleted at its clean close)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # (and with it the lock, if it was had)
        return False

    def drop_owners(self, tokens: Sequence[str]) -> None:
        db = self._conn
        try:
            db.executemany("DELETE FROM owners WHERE token = ?", [(t,) for t in tokens])
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to the store {self.where}: {exc}") from None
        for token in tokens:
            try:
                os.unlink(self._locks / token)
            except OSError:
                pass

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        try:
            fd = os.open(self._locks / "exclusive", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot lock the store {self.where}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (held for a few ms by whoever has it)
            yield
        finally:
            os.close(fd)

    def next_session_number(self, at_least: int) -> int:
        db = self._conn
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "UPDATE counters SET value = max(value, ?) + 1 WHERE name = 'session' "
                    "RETURNING value",
                    (at_least,),
                ).fetchone()
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to the store {self.where}: {exc}") from None
        return int(row[0])

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._db is not None:
            if not self._writes_only:
                try:
                    self.drop_owners([self.owner.token])
                except StoreError:  # (the next process finds it gone: its lock went with it)
                    pass
            self._db.close()
            self._db = None
        self._let_go()


class _Checkpointer:
    """Checkpoints the write-ahead log of the file at ``path`` on a thread and a connection of
    its own: a checkpoint (the log copied into the file, two fsyncs: 10-20 ms for a 16 MB log
    here, tens of ms on a busy disk) runs beside the writes, not between two batches, where a
    stream's events would wait for it and its session be held back for the store (a
    100,000-event stream would stop for 13-15 ms). A passive checkpoint takes no lock a write
    needs: it copies what the log holds and leaves what a write adds meanwhile to the next."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._thread: threading.Thread | None = None
        self._db: sqlite3.Connection | None = None
        #: why the last checkpoint failed (None: it did not): said by the next :meth:`start`
        self.error: sqlite3.Error | None = None

    def start(self) -> bool:
        """Begin a checkpoint unless one runs; whether one began. :class:`StoreError` if the
        last one failed (the next call begins one again)."""
        if self._thread is not None and self._thread.is_alive():
            return False
        error, self.error = self.error, None
        if error is not None:
            raise StoreError(f"cannot checkpoint the store {self._path}: {error}")
        self._thread = threading.Thread(
            target=self._checkpoint, name="store checkpoint", daemon=True
        )
        self._thread.start()
        return True

    def _checkpoint(self) -> None:
        try:
            if self._db is None:
                self._db = _connect(str(self._path))
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            self.error = exc

    def join(self) -> None:
        """Return once the checkpoint that runs (if any) is done."""
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        """Wait for a checkpoint that runs, and close the connection."""
        self.join()
        self._thread = None
        if self._db is not None:
            self._db.close()
            self._db = None


def _connect(database: str, uri: bool = False) -> sqlite3.Connection:
    """A connection to the file ``database`` names, as every connection of the store is made:
    transactions begun by hand, usable from the worker thread."""
    return sqlite3.connect(
        database,
        uri=uri,
        timeout=_LOCK_WAIT_S,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=_CACHED_STATEMENTS,
    )


def _insert_rows(db: sqlite3.Connection, head: str, tail: str, rows: list[tuple[Any, ...]]) -> int:
    """``head VALUES (...), (...) tail`` for ``rows``, ``ROWS_PER_STATEMENT`` at a time (one
    call into SQLite each, where ``executemany`` is one a row); returns the rows changed."""
    changed = 0
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        sql = _rows_statement(head, tail, len(chunk[0]), len(chunk))
        changed += db.execute(sql, [value for row in chunk for value in row]).rowcount
    return changed


@functools.lru_cache(maxsize=_CACHED_STATEMENTS)
def _rows_statement(head: str, tail: str, columns: int, rows: int) -> str:
    one = "(" + ", ".join(["?"] * columns) + ")"
    return f"{head} VALUES {', '.join([one] * rows)} {tail}"


def _events_alone(db: sqlite3.Connection, batch: Batch) -> int | None:
    """A batch of runs of events and nothing else (a stream's, most of a flood's: one run a
    session, up to ``ROWS_PER_STATEMENT``), written as one statement, its own transaction:
    one call into SQLite, where ``BEGIN``, the insert and ``COMMIT`` are three, each taking
    the GIL back from the event loop when it returns (a busy event loop can keep it from the
    writer's thread for tens of ms). Returns its bytes; None if it is not such a batch, or a
    run met a stored one at its first seq (:meth:`SqliteBackend._write` then writes the batch
    again: what this inserted is ignored there, what a run holds beyond a stored one added)."""
    runs = batch.events
    if (
        not runs
        or len(runs) > ROWS_PER_STATEMENT
        or batch.sessions
        or batch.receipts
        or batch.texts
        or batch.checkpoints
        or batch.turn_ends
        or batch.answered
        or not all(run.payloads for run in runs)
    ):
        return None
    rows = [(r.session_id, r.first_seq, r.last_seq, b"\n".join(r.payloads)) for r in runs]
    sql = _rows_statement(_INSERT_EVENTS_HEAD, "", 4, len(rows))
    if db.execute(sql, [value for row in rows for value in row]).rowcount < len(rows):
        return None
    return sum(len(row[3]) for row in rows)


def _open_error(where: str, exc: sqlite3.DatabaseError) -> str:
    """The one line for a file that cannot be opened, and what to do."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return (
            f"the store {where} is in use by another process (another agent-supervisor "
            "serve?); stop it or choose another file with [store] url or --store"
        )
    if "readonly" in text or "read-only" in text:
        return (
            f"the store {where} is read-only; make it writable or choose another file "
            "with [store] url or --store"
        )
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return (
            f"the store {where} is not a valid SQLite database ({text}); move it away to "
            "start a new one, or choose another file with [store] url or --store"
        )
    return f"cannot open the store {where}: {text}; choose another file with --store"
