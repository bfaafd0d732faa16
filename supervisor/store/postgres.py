"""The session store in a PostgreSQL database (psycopg 3, its synchronous API).

For a gateway whose state lives on a managed database: the same tables as SQLite (the
``postgresql`` dialect of :data:`~supervisor.store.backend.MIGRATIONS`), the same behaviour.
One connection in autocommit mode (a read never leaves a transaction open), used from the
store's one worker thread; a batch is one explicit transaction.

Event runs are written with binary ``COPY`` (2.2 times as fast as ``executemany`` for a
batch of 100 events over 100 sessions, 2.5 times for 1,000: ``design/store-postgresql.md``).
``COPY`` cannot skip a row already stored, so a batch that meets one (a batch written again
after a commit whose answer was lost, a node's session adopted again handing over a longer
run) is written again, whole, run by run, storing what each holds beyond the stored run
(:func:`~supervisor.store.backend.store_beyond`): still one transaction, still nothing twice.

A text's ``tsvector`` is not computed in the batch that stores it: a long answer's takes the
server tens of ms (100,000 words: ``design/store-postgresql.md``), and that batch holds its
turn's end, which subscribers wait for. :meth:`PostgresBackend.settle` computes it once the
batch's events are given to them, and :meth:`PostgresBackend.search` first, for texts not
indexed yet (``search IS NULL``, found by a partial index).

Several processes share the database (ACP front doors beside a ``serve``): each registers
itself in ``owners`` and holds a session-level advisory lock of its own (its token's) for as
long as its connection lives, which tells the others it lives (``pg_locks``). One ``serve``
at a time: a ``serve`` also holds the store's advisory lock, taken at open. When the server
goes away (a restart, a failover) or the connection drops, the next call connects again,
takes the locks again (from its own old connection's server process if that one has not
noticed yet) and carries on; a batch that failed is written again by the caller, and nothing
of it is stored twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from supervisor.store import backend as contract
from supervisor.store.answers import make_answers, with_answers_due
from supervisor.store.backend import (
    ANSWERS_DUE_QUERY,
    INDEX_CHARS,
    RUNS_QUERY,
    SESSION_QUERY,
    SESSIONS_QUERY,
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

__all__ = ["PostgresBackend"]


#: Connection settings given unless the URL sets them. ``connect_timeout``: a server that does
#: not answer (a dropped route, a firewall) is reported after this long rather than after the
#: kernel's TCP retries (minutes). Keepalives and ``tcp_user_timeout``: a connection whose
#: server vanished without closing it fails within about a minute instead of hanging a write.
_CONNECTION_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
    "application_name": "agent-supervisor",
}
#: The same bounds on the server's side of the connection (session settings any user may
#: set; ignored over a Unix socket).
_SERVER_SIDE_TIMEOUTS = {
    "tcp_keepalives_idle": "30",
    "tcp_keepalives_interval": "10",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "60000",
}
#: The advisory lock that makes one supervisor the store's only writer: this number ("asup")
#: and the hash of the schema the store's tables are in (advisory locks are per database; two
#: stores in two schemas of one database are two stores).
_LOCK_CLASS = 0x61737570
_LOCK = "%s, hashtext(current_schema())"
#: Each owner's advisory lock: this number and the hash of its token.
_OWNER_CLASS = 0x61737571
_OWNER_LOCK = "%s, hashtext(%s)"
#: The lock :meth:`PostgresBackend.exclusive` holds a moment (per schema, as the store's).
_EXCLUSIVE_CLASS = 0x61737572
#: How long taking the lock back from this backend's own lost connection waits for its server
#: process to exit (it exits at its next check for interrupts: at once when idle).
_TAKE_BACK_WAIT_MS = 5_000
#: A text's first characters that its ``tsvector`` indexes (the ``search`` column: a tsvector
#: holds at most 1 MB, and a text whose vector would not fit must not fail its indexing); the
#: snippet is made from the same characters.
_INDEXED_CHARS = 100_000
#: The texts not indexed yet, indexed: every process's (one that went away before it indexed
#: its own leaves them to the next). Rows another process is indexing at the moment are
#: skipped, not waited for: two processes that each wait for a row the other locked first
#: would deadlock.
_INDEX_TEXTS = f"""UPDATE texts t
    SET search = to_tsvector('simple', left(t.text, {_INDEXED_CHARS}))
    FROM (SELECT session_id, seq, kind FROM texts WHERE search IS NULL
        FOR UPDATE SKIP LOCKED) AS u
    WHERE t.session_id = u.session_id AND t.seq = u.seq AND t.kind = u.kind"""
#: The search snippet: about a dozen words around the first match, the words in brackets
#: (as SQLite's ``snippet()`` gives it).
_HEADLINE = "StartSel=[, StopSel=], MaxWords=12, MinWords=5, ShortWord=0"
_WORD = re.compile(r"\w+", re.UNICODE)
_SECRET_IN_USERINFO = re.compile(r"(://[^/@?#:]*):[^/@?#]*@")
_SECRET_IN_QUERY = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)

_T = TypeVar("_T")


class PostgresBackend:
    """The store in the PostgreSQL database ``url`` names (``postgresql://user:pw@host/db``;
    libpq's parameters, such as ``sslmode``, in its query string), in the first schema of its
    ``search_path`` (``public`` by default; another: ``options=-csearch_path%3DNAME``)."""

    def __init__(self, url: str, kind: str = "serve") -> None:
        self.owner = this_process(kind)
        self.url = url
        self.where = redacted(url)
        self._connection: psycopg.Connection[Any] | None = None
        self._opened = False
        #: the server process of the connection that holds the lock: its pid and start time
        #: (a pid alone may be another process's after a restart)
        self._server_process: tuple[int, datetime] | None = None
        #: connections made since open: 1, and one more each time the server dropped one
        self.connections = 0
        #: the characters of the texts that may wait to be indexed (written here and not
        #: indexed; INDEX_CHARS: those left at open, of unknown size); 0: none
        self._unindexed_chars = 0
        #: answers may be due (a batch with turns' ends was written since they were made, or
        #: a process before this one left some)
        self._answers_due = True
        #: opened by :meth:`open_writes`: no lock, no owner of the store
        self._writes_only = False

    # -- connecting

    def open(self) -> None:
        self.connections = 0
        self._connection = self._connect()
        self._opened = True
        # (what a process that went away left unindexed: indexed by the first settle)
        self._unindexed_chars = INDEX_CHARS

    def open_writes(self) -> None:
        self._writes_only = True
        self.open()

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection holding the lock, the schema at :data:`SCHEMA_VERSION`."""
        try:
            parameters = conninfo_to_dict(self.url)
            for key, value in _CONNECTION_DEFAULTS.items():
                parameters.setdefault(key, value)
            conninfo = make_conninfo("", **parameters)
        except psycopg.Error as exc:
            raise StoreError(
                f"store URL {self.where} is not a valid PostgreSQL URL ({_line(exc)}); "
                "it looks like postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
            ) from None
        try:
            connection = psycopg.connect(conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(_connect_error(self.where, exc)) from None
        try:
            self._setup(connection)
        except BaseException as exc:
            connection.close()
            if isinstance(exc, psycopg.Error):
                raise StoreError(_setup_error(self.where, exc)) from None
            raise
        self.connections += 1
        return connection

    def _setup(self, connection: psycopg.Connection[Any]) -> None:
        # A batch the store counts as written must outlive a crash of the server, whatever
        # the server's default (synchronous_commit = off loses the last commits on a crash).
        connection.execute("SET synchronous_commit = on")
        # The server's side of the same: a supervisor whose machine vanished (no reset sent)
        # leaves a connection holding the store's lock; the server ends it within about a
        # minute instead of its default of hours, and the next supervisor gets the lock.
        for setting, value in _SERVER_SIDE_TIMEOUTS.items():
            connection.execute("SELECT set_config(%s, %s, false)", (setting, value))
        if self._writes_only:
            return
        schema = connection.execute("SELECT current_schema()").fetchone()
        if schema is None or schema[0] is None:
            raise StoreError(
                f"the store {self.where} has no schema to keep its tables in (none of its "
                "search_path exists); create the schema or fix search_path in the URL"
            )
        self._lock(connection)
        newest = contract.SCHEMA_VERSION
        with connection.transaction():
            # The migrations one at a time in one transaction; a second supervisor that opens
            # the database meanwhile finds the lock taken (above) and never gets here.
            exists = connection.execute("SELECT to_regclass('schema_version')").fetchone()
            if exists is None or exists[0] is None:
                connection.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            row = connection.execute("SELECT max(version) FROM schema_version").fetchone()
            version = (row[0] if row else None) or 0
            if version > newest:
                raise StoreError(
                    f"the store {self.where} has schema version {version}, newer than this "
                    f"agent-supervisor's ({newest}); upgrade agent-supervisor or choose "
                    "another database"
                )
            for number in range(version, newest):
                for statement in contract.MIGRATIONS[number]["postgresql"]:
                    connection.execute(statement)
                connection.execute("DELETE FROM schema_version")
                connection.execute(
                    "INSERT INTO schema_version (version) VALUES (%s)", (number + 1,)
                )
            o = self.owner
            connection.execute(
                "INSERT INTO owners (token, pid, host, kind, started) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (token) DO NOTHING",
                (o.token, o.pid, o.host, o.kind, o.started),
            )

    def _lock(self, connection: psycopg.Connection[Any]) -> None:
        """Take the advisory lock. Held already by this backend's own last connection (its
        server process, which has not noticed yet that the connection is gone: a network that
        dropped it rather than a server restart), the lock is taken back by ending that process;
        held by anyone else, the database is in use. Only a ``serve`` takes it (one at a
        time); every process takes its owner's lock the same way."""
        if self.owner.kind in contract.EXCLUSIVE_KINDS:
            self._take(connection, _LOCK_CLASS)
        owner_lock = (_OWNER_CLASS, self.owner.token)
        if not _try_lock(connection, _OWNER_LOCK, owner_lock):
            previous = self._server_process
            if previous is None or not _end_server_process(connection, previous, _OWNER_CLASS):
                raise StoreError(f"the store {self.where}: this process's lock is held elsewhere")
            _try_lock(connection, _OWNER_LOCK, owner_lock)
        row = connection.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        self._server_process = (row[0], row[1]) if row else None

    def _take(self, connection: psycopg.Connection[Any], lock_class: int) -> None:
        """The store's lock, as :meth:`_lock` says."""
        if not _try_lock(connection):
            previous = self._server_process
            if previous is None or not _end_server_process(connection, previous, lock_class):
                raise StoreError(
                    f"the store {self.where} is in use by another process (another "
                    "agent-supervisor serve? the server lets go of one whose machine went "
                    "away within a minute); stop it or choose another database with "
                    "[store] url or --store"
                )
            if not _try_lock(connection):
                raise StoreError(
                    f"the store {self.where} was taken by another process while this one "
                    "reconnected (another agent-supervisor serve?); stop it"
                )

    def _live(self) -> psycopg.Connection[Any]:
        """The connection; a new one when the server dropped the last (a restart)."""
        if not self._opened:
            raise StoreError(f"the store {self.where} is not open")
        connection = self._connection
        if connection is None or connection.closed:
            connection = self._connection = self._connect()
        return connection

    def _run(self, what: str, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """``work`` on the connection; once more on a new connection if the old one turns out
        to be gone (the server restarted since the last call: every call is safe to repeat).
        ``what``: "write to" or "read"."""
        for attempt in range(2):
            connection = self._live()
            try:
                return work(connection)
            except psycopg.OperationalError as exc:
                if connection.broken:
                    connection.close()
                    self._connection = None
                    if attempt == 0:
                        continue
                raise StoreError(f"cannot {what} the store {self.where}: {_line(exc)}") from None
            except (psycopg.Error, TypeError, ValueError) as exc:
                # What the server refused or the driver could not send (a value it cannot
                # adapt, text it cannot encode): the batch is not written.
                raise StoreError(f"cannot {what} the store {self.where}: {_line(exc)}") from None
        raise AssertionError("unreachable")

    # -- writing

    def write(self, batch: Batch) -> bool:
        if batch:
            self._run("write to", lambda connection: _write(connection, batch))
            self._unindexed_chars += batch.text_chars()
        if batch.turn_ends:
            self._answers_due = True
        return bool(batch.turn_ends) or self._unindexed_chars >= INDEX_CHARS

    def settle(self, idle: bool) -> None:
        if self._answers_due:
            make_answers(self, self.answers_due())
            self._answers_due = False
        if self._unindexed_chars >= INDEX_CHARS or (idle and self._unindexed_chars):
            self._index()

    def index(self) -> None:
        # (Those of every process of the store: one may have gone away before making them.)
        make_answers(self, self.answers_due())
        self._answers_due = False
        self._index()

    def _index(self) -> None:
        """(One statement: its own transaction.)"""
        self._run("write to", lambda connection: connection.execute(_INDEX_TEXTS))
        self._unindexed_chars = 0

    def delete(self, session_ids: Sequence[str]) -> None:
        # Freed rows are reused by later writes once autovacuum has been by; a VACUUM FULL
        # to give them back would lock the tables against every write while it rewrites them.
        def delete(connection: psycopg.Connection[Any]) -> None:
            ids = list(session_ids)
            with connection.transaction():
                for table in ("texts", "receipts", "events", "checkpoints", "answers_due"):
                    connection.execute(f"DELETE FROM {table} WHERE session_id = ANY(%s)", (ids,))
                connection.execute("DELETE FROM sessions WHERE id = ANY(%s)", (ids,))

        if session_ids:
            self._run("delete from", delete)

    def reclaim(self, pages: int) -> bool:
        return False

    # -- reading

    def sizes(self) -> dict[str, int]:
        # octet_length() of a stored value reads its size, not the value (nor its TOAST).
        rows = self._read(
            """SELECT session_id, sum(n) FROM (
                SELECT session_id, octet_length(payloads) AS n FROM events
                UNION ALL SELECT session_id, octet_length(payload) FROM receipts
                UNION ALL SELECT session_id, octet_length(text) FROM texts
            ) AS sized GROUP BY session_id""",
            (),
        )
        return {session_id: int(size or 0) for session_id, size in rows}

    def sessions(self) -> list[StoredSession]:
        return [stored_session(row) for row in self._read(SESSIONS_QUERY, ())]

    def session(self, session_id: str) -> StoredSession | None:
        rows = self._read(SESSION_QUERY.format("%s"), (session_id,))
        return stored_session(rows[0]) if rows else None

    def events(self, session_id: str, since_seq: int, limit: int) -> list[tuple[int, bytes]]:
        # Runs in order of their first seq, a page at a time: the first run of a page has a
        # seq past what was found (its last_seq is), so each page adds one event at least;
        # runs may overlap (a node's session adopted again), so a page may add fewer than it
        # has runs, and each seq is taken once.
        found: list[tuple[int, bytes]] = []
        after = since_seq
        while len(found) < limit:
            wanted = limit - len(found)
            page = self._read(
                "SELECT first_seq, payloads FROM events WHERE session_id = %s AND last_seq > %s "
                "ORDER BY first_seq LIMIT %s",
                (session_id, after, wanted),
            )
            for first, payloads in page:
                for seq, payload in enumerate(bytes(payloads).split(b"\n"), first):
                    if seq > after:
                        found.append((seq, payload))
                        after = seq
                        if len(found) >= limit:
                            return found
            if len(page) < wanted:  # no more runs
                break
        return found

    def texts(self, session_id: str) -> list[TextRow]:
        stored = [
            TextRow(session_id=session_id, seq=seq, kind=kind, turn_id=turn_id, text=text)
            for seq, kind, turn_id, text in self._read(
                "SELECT seq, kind, turn_id, text FROM texts WHERE session_id = %s "
                "ORDER BY seq, kind",
                (session_id,),
            )
        ]
        return with_answers_due(self, session_id, stored)

    def runs(
        self, session_id: str, after: int, upto: int, limit: int
    ) -> list[tuple[int, int, bytes]]:
        rows = self._read(RUNS_QUERY.format("%s"), (session_id, after, upto, limit))
        return [(first, last, bytes(payloads)) for first, last, payloads in rows]

    def answers_due(self, session_id: str | None = None) -> list[TurnEnd]:
        if session_id is None:
            return turn_ends(self._read(ANSWERS_DUE_QUERY.format(""), ()))
        one = ANSWERS_DUE_QUERY.format("WHERE session_id = %s")
        return turn_ends(self._read(one, (session_id,)))

    def receipts(self, session_id: str) -> list[ReceiptRow]:
        return [
            ReceiptRow(session_id=session_id, seq=seq, turn_id=turn_id, payload=bytes(payload))
            for seq, turn_id, payload in self._read(
                "SELECT seq, turn_id, payload FROM receipts WHERE session_id = %s ORDER BY seq",
                (session_id,),
            )
        ]

    def checkpoints(self, session_id: str, limit: int) -> list[CheckpointRow]:
        return checkpoint_rows(session_id, self._read(_CHECKPOINTS_QUERY, (session_id, limit)))

    def first_prompts(self, chars: int) -> dict[str, str]:
        rows = self._read(
            """SELECT DISTINCT ON (session_id) session_id, left(text, %s) FROM texts
            WHERE kind = 'prompt' ORDER BY session_id, seq""",
            (chars,),
        )
        return {session_id: text for session_id, text in rows}

    def search(self, query: str, limit: int) -> list[SearchHit]:
        words = _WORD.findall(query)
        if not words:
            return []
        # Texts written and not indexed yet are found too: this process's, and those another
        # process of the store wrote a moment ago (a partial index's probe when there are none).
        self.index()
        # The words only, each a lexeme that must be present: what the user typed is text to
        # find, never tsquery syntax. The snippet is made for the rows returned, not all hits.
        rows = self._read(
            f"""WITH q AS (SELECT plainto_tsquery('simple', %s) AS q),
            hits AS (
                SELECT t.session_id, t.turn_id, t.seq, t.kind, t.text,
                    ts_rank(t.search, q.q) AS rank
                FROM texts t, q WHERE t.search @@ q.q
                ORDER BY rank DESC, t.session_id, t.seq LIMIT %s
            )
            SELECT hits.session_id, turn_id, seq, kind,
                ts_headline('simple', left(text, {_INDEXED_CHARS}), q.q, %s),
                coalesce(s.agent, '')
            FROM hits CROSS JOIN q LEFT JOIN sessions s ON s.id = hits.session_id
            ORDER BY rank DESC, hits.session_id, seq""",
            (" ".join(words), limit, _HEADLINE),
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

    def _read(self, sql: str, parameters: Sequence[object]) -> list[Any]:
        def read(connection: psycopg.Connection[Any]) -> list[Any]:
            return connection.execute(sql, parameters).fetchall()

        return self._run("read", read)

    def owners(self) -> dict[str, tuple[Owner, bool]]:
        rows = self._read(
            """SELECT o.token, o.pid, o.host, o.kind, o.started, EXISTS (
                SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND l.classid = %s AND l.objid = hashtext(o.token)::oid AND l.objsubid = 2)
            FROM owners o""",
            (_OWNER_CLASS,),
        )
        return {
            token: (
                Owner(token=token, pid=pid, host=host, kind=kind, started=started),
                token == self.owner.token or bool(alive),
            )
            for token, pid, host, kind, started, alive in rows
        }

    def drop_owners(self, tokens: Sequence[str]) -> None:
        ids = list(tokens)
        self._run(
            "write to",
            lambda c: c.execute("DELETE FROM owners WHERE token = ANY(%s)", (ids,)),
        )

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        def lock(connection: psycopg.Connection[Any]) -> None:
            connection.execute(
                "SELECT pg_advisory_lock(%s, hashtext(current_schema()))", (_EXCLUSIVE_CLASS,)
            )

        def unlock(connection: psycopg.Connection[Any]) -> None:
            connection.execute(
                "SELECT pg_advisory_unlock(%s, hashtext(current_schema()))", (_EXCLUSIVE_CLASS,)
            )

        self._run("lock", lock)
        try:
            yield
        finally:
            try:
                self._run("unlock", unlock)
            except StoreError:  # (the connection went, and its lock with it)
                pass

    def next_session_number(self, at_least: int) -> int:
        def take(connection: psycopg.Connection[Any]) -> int:
            row = connection.execute(
                "UPDATE counters SET value = greatest(value, %s) + 1 WHERE name = 'session' "
                "RETURNING value",
                (at_least,),
            ).fetchone()
            assert row is not None
            return int(row[0])

        return self._run("write to", take)

    def close(self) -> None:
        if (
            self._opened
            and not self._writes_only
            and self._connection is not None
            and not self._connection.broken
        ):
            try:
                self._connection.execute("DELETE FROM owners WHERE token = %s", (self.owner.token,))
            except psycopg.Error:
                pass  # (the next process finds it gone: its lock went with its connection)
        self._opened = False
        self._server_process = None
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if not connection.broken:
            # Let go of the lock now: the server would only when the closed connection's
            # process exits, a moment after close() returns (a supervisor starting again at
            # once would find the database in use).
            try:
                connection.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error:
                pass  # gone: its lock with it
        connection.close()


# -- the lock


def _try_lock(
    connection: psycopg.Connection[Any],
    lock: str = _LOCK,
    key: tuple[object, ...] = (_LOCK_CLASS,),
) -> bool:
    row = connection.execute(f"SELECT pg_try_advisory_lock({lock})", key).fetchone()
    return bool(row and row[0])


def _end_server_process(
    connection: psycopg.Connection[Any], process: tuple[int, datetime], lock_class: int
) -> bool:
    """End the server process ``(pid, start time)`` if it is still there and holds the lock,
    and wait (a bounded while) until it has exited, its lock released; whether it did."""
    pid, started = process
    row = connection.execute(
        """SELECT pg_terminate_backend(a.pid, %s) FROM pg_stat_activity a
        JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid = %s AND l.objsubid = 2
        WHERE a.pid = %s AND a.backend_start = %s""",
        (_TAKE_BACK_WAIT_MS, lock_class, pid, started),
    ).fetchone()
    return bool(row and row[0])


# -- a batch's SQL

_UPSERT_SESSION = """INSERT INTO sessions (id, agent, protocol, host, cwd, mcp_servers,
        agent_session_id, created, last_active, state, open_turn_id, clean, turns, worktree,
        owner)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (id) DO UPDATE SET agent = excluded.agent, protocol = excluded.protocol,
        host = excluded.host, cwd = excluded.cwd, mcp_servers = excluded.mcp_servers,
        agent_session_id = excluded.agent_session_id, last_active = excluded.last_active,
        state = excluded.state, open_turn_id = excluded.open_turn_id, clean = excluded.clean,
        turns = greatest(sessions.turns, excluded.turns), worktree = excluded.worktree,
        owner = excluded.owner"""
_EVENT_COLUMNS = "events (session_id, first_seq, last_seq, payloads)"
_INSERT_EVENTS = f"INSERT INTO {_EVENT_COLUMNS} VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
_INSERT_RECEIPT = """INSERT INTO receipts (session_id, seq, turn_id, payload)
    VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"""
_UPSERT_CHECKPOINT = contract.UPSERT_CHECKPOINT.replace("?", "%s")
_CHECKPOINTS_QUERY = contract.CHECKPOINTS_QUERY.replace("?", "%s")
_INSERT_TEXT = """INSERT INTO texts (session_id, seq, kind, turn_id, text)
    VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"""


def _write(connection: psycopg.Connection[Any], batch: Batch) -> None:
    try:
        _write_batch(connection, batch, copy_events=True)
    except errors.UniqueViolation:
        # Some of its events are stored already (a batch written again): the same batch,
        # skipping what is there.
        _write_batch(connection, batch, copy_events=False)


def _write_batch(connection: psycopg.Connection[Any], batch: Batch, *, copy_events: bool) -> None:
    with connection.transaction(), connection.cursor() as cursor:
        if batch.sessions:
            cursor.executemany(
                _UPSERT_SESSION,
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
            rows = [
                (run.session_id, run.first_seq, run.last_seq, b"\n".join(run.payloads))
                for run in batch.events
                if run.payloads
            ]
            if copy_events:
                # Binary: the payloads go as they are, not hex-escaped and decoded again
                # (1.7 times the rate of text COPY for runs of 10 events).
                with cursor.copy(f"COPY {_EVENT_COLUMNS} FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(["text", "int8", "int8", "bytea"])
                    for row in rows:
                        copy.write_row(row)
            else:
                # A batch that met stored runs (rare): each run on its own, and what a run
                # holds beyond the one stored at its first seq.
                def stored_last(session_id: str, first_seq: int) -> int | None:
                    found = cursor.execute(
                        "SELECT last_seq FROM events WHERE session_id = %s AND first_seq = %s",
                        (session_id, first_seq),
                    ).fetchone()
                    return None if found is None else int(found[0])

                def insert(r: EventRun) -> None:
                    cursor.execute(
                        _INSERT_EVENTS,
                        (r.session_id, r.first_seq, r.last_seq, b"\n".join(r.payloads)),
                    )

                for r in batch.events:
                    if r.payloads:
                        store_beyond(r, stored_last, insert)
        if batch.receipts:
            cursor.executemany(
                _INSERT_RECEIPT,
                [(r.session_id, r.seq, r.turn_id, r.payload) for r in batch.receipts],
            )
        if batch.texts:
            cursor.executemany(
                _INSERT_TEXT,
                [(t.session_id, t.seq, t.kind, t.turn_id, _storable(t.text)) for t in batch.texts],
            )
        if batch.checkpoints:
            cursor.executemany(
                _UPSERT_CHECKPOINT,
                [(c.session_id, c.checkpoint_id, c.n, c.start, c.end) for c in batch.checkpoints],
            )
        if batch.turn_ends:
            cursor.executemany(
                "INSERT INTO answers_due (session_id, turn_id, seq, started) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(e.session_id, e.turn_id, e.seq, e.started) for e in batch.turn_ends],
            )
        if batch.answered:
            cursor.executemany(
                "DELETE FROM answers_due WHERE session_id = %s AND seq = %s",
                [(e.session_id, e.seq) for e in batch.answered],
            )


def _storable(text: str) -> str:
    """PostgreSQL's text cannot hold NUL (an agent's answer may): U+FFFD stands in for it."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


# -- one-line messages


def redacted(url: str) -> str:
    """``url`` without a password it carries (it goes into messages and logs)."""
    return _SECRET_IN_QUERY.sub(r"\1***", _SECRET_IN_USERINFO.sub(r"\1:***@", url))


def _line(exc: BaseException) -> str:
    """The error's text on one line (libpq's run over several: a reason, then a hint)."""
    lines = (" ".join(line.split()) for line in str(exc).splitlines())
    return "; ".join(line for line in lines if line) or type(exc).__name__


def _connect_error(where: str, exc: psycopg.Error) -> str:
    text = _line(exc)
    lowered = text.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return (
            f"the PostgreSQL server refused the credentials of {where} ({_tail(text)}); "
            "fix the user or password in [store] url or --store"
        )
    if "does not exist" in lowered and "database" in lowered:
        return (
            f"the PostgreSQL server of {where} has no such database ({_tail(text)}); "
            "create it (createdb) or fix [store] url or --store"
        )
    if "role" in lowered and "does not exist" in lowered:
        return (
            f"the PostgreSQL server of {where} has no such user ({_tail(text)}); "
            "fix [store] url or --store"
        )
    if "pg_hba.conf" in lowered:
        return (
            f"the PostgreSQL server does not let {where} in ({_tail(text)}); "
            "allow this host and user in its pg_hba.conf, or fix [store] url or --store"
        )
    return (
        f"cannot reach the PostgreSQL server of {where} ({_tail(text)}); start it, or fix "
        "[store] url or --store"
    )


def _setup_error(where: str, exc: psycopg.Error) -> str:
    if isinstance(exc, errors.InsufficientPrivilege):
        return (
            f"the store {where} cannot create its tables ({_line(exc)}); grant the user "
            "CREATE on the database's schema, or make it the database's owner"
        )
    return f"cannot open the store {where}: {_line(exc)}"


def _tail(text: str) -> str:
    """libpq's reason without its "connection failed: connection to server at ... failed:"
    preamble (the URL says where)."""
    reason = text.rpartition(" failed: ")[2] if " failed: " in text else text
    return reason.removeprefix("FATAL: ").strip()
