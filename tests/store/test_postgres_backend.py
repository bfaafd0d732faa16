"""What only the PostgreSQL backend meets: a server that restarts under it, a connection that
drops, the one-line errors of a URL that does not lead to a usable database, and text a
PostgreSQL column or tsvector cannot hold as it is. The rest is the backend contract
(``test_backend_contract.py``), which runs on PostgreSQL too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio

from helpers import stored_row as session
from pg import PostgresServer
from protocols import events as ev
from supervisor.store import backend as contract
from supervisor.store.backend import INDEX_CHARS, Batch, EventRun, StoreError, TextRow
from supervisor.store.postgres import PostgresBackend, redacted
from supervisor.store.url import backend_for
from supervisor.store.writer import SessionStore
from supervisor.wire.codec import event_json


def events(first: int, count: int, sid: str = "s1") -> list[EventRun]:
    """``count`` events from ``first`` on, in runs of up to 3 (as the writer's batches hold)."""
    return [
        EventRun(
            session_id=sid,
            first_seq=start,
            payloads=[b'{"seq":%d}' % seq for seq in range(start, min(start + 3, first + count))],
        )
        for start in range(first, first + count, 3)
    ]


@pytest.fixture
def url(postgresql: PostgresServer) -> str:
    return postgresql.database()


@pytest.fixture
def backend(url: str) -> Iterator[PostgresBackend]:
    backend = PostgresBackend(url)
    backend.open()
    yield backend
    backend.close()


def stored_seqs(backend: PostgresBackend, sid: str = "s1") -> list[int]:
    return [seq for seq, _ in backend.events(sid, 0, 1_000_000)]


@pytest.fixture
def restartable(postgresql: PostgresServer) -> Iterator[PostgresServer]:
    """The run's server, running again after the test whatever it did to it."""
    yield postgresql
    if not postgresql.running:
        postgresql.start()


@pytest.mark.parametrize("immediate", [False, True], ids=["shutdown", "crash"])
def test_the_next_batch_after_a_server_restart_is_written_once(
    backend: PostgresBackend, restartable: PostgresServer, immediate: bool
) -> None:
    backend.write(Batch(sessions=[session()], events=events(1, 100)))
    restartable.stop(immediate=immediate)
    restartable.start()
    # The backend's connection died with the server: the write connects again, unasked.
    backend.write(Batch(events=events(101, 100)))
    assert stored_seqs(backend) == list(range(1, 201))


def test_a_batch_refused_while_the_server_is_down_is_written_once_when_it_is_back(
    backend: PostgresBackend, restartable: PostgresServer
) -> None:
    backend.write(Batch(sessions=[session()], events=events(1, 10)))
    restartable.stop()
    batch = Batch(events=events(11, 10))
    with pytest.raises(StoreError) as raised:
        backend.write(batch)
    message = str(raised.value)
    assert "\n" not in message and "cannot reach the PostgreSQL server" in message, message
    with pytest.raises(StoreError):
        backend.write(batch)  # still down: refused again, nothing half-written
    restartable.start()
    backend.write(batch)  # the caller's retry
    backend.write(batch)  # and once more, as after a commit whose answer was lost
    assert stored_seqs(backend) == list(range(1, 21))


def test_a_batch_partly_stored_already_stores_the_rest_once(backend: PostgresBackend) -> None:
    backend.write(Batch(sessions=[session()], events=events(1, 6)))
    # Its first runs are stored (COPY meets them), its last ones not: written once, all.
    backend.write(Batch(sessions=[session()], events=events(1, 12)))
    assert stored_seqs(backend) == list(range(1, 13))


def test_overlapping_runs_are_read_a_page_at_a_time_each_seq_once(
    backend: PostgresBackend,
) -> None:
    backend.write(Batch(sessions=[session()], events=events(1, 30)))  # runs of 3
    # Runs inside what is stored (a node's session adopted again hands over events again):
    # a page of runs may hold fewer new events than it has runs.
    backend.write(
        Batch(
            events=[EventRun(session_id="s1", first_seq=n, payloads=[b"{}"]) for n in (2, 6, 8, 11)]
        )
    )
    assert stored_seqs(backend) == list(range(1, 31))
    assert [seq for seq, _ in backend.events("s1", 0, 5)] == [1, 2, 3, 4, 5]
    assert [seq for seq, _ in backend.events("s1", 1, 4)] == [2, 3, 4, 5]
    assert [seq for seq, _ in backend.events("s1", 26, 10)] == [27, 28, 29, 30]
    # Two runs, [4-6] and [6], hold one event past 5: the second is read from another page.
    assert [seq for seq, _ in backend.events("s1", 5, 2)] == [6, 7]
    assert [payload for _, payload in backend.events("s1", 1, 1)] == [b'{"seq":2}']


def test_a_connection_the_server_ends_is_replaced(backend: PostgresBackend, url: str) -> None:
    backend.write(Batch(sessions=[session()], events=events(1, 5)))
    assert backend._connection is not None
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(%s)", (backend._connection.info.backend_pid,)
        ).fetchone()
    assert ended == (True,)
    assert stored_seqs(backend) == [1, 2, 3, 4, 5]  # a read reconnects too
    backend.write(Batch(events=events(6, 5)))
    assert stored_seqs(backend) == list(range(1, 11))


def test_the_lock_of_its_own_lost_connection_is_taken_back(backend: PostgresBackend) -> None:
    backend.write(Batch(sessions=[session()], events=events(1, 5)))
    # The connection is lost to the backend while its server process lives on, the lock held
    # (a network that dropped it: the server notices only when its keepalives give up).
    lost = backend._connection
    assert lost is not None
    backend._connection = None
    try:
        backend.write(Batch(events=events(6, 5)))
        assert stored_seqs(backend) == list(range(1, 11))
        with pytest.raises(psycopg.OperationalError):
            lost.execute("SELECT 1")  # its server process was ended
    finally:
        lost.close()


def test_the_server_ends_a_connection_whose_client_vanished_within_a_minute(
    postgresql: PostgresServer,
) -> None:
    # Over TCP, the server's keepalives and user timeout for the connection (its defaults, the
    # kernel's, take hours to let go of a vanished supervisor's lock).
    backend = PostgresBackend(postgresql.tcp_url())
    backend.open()
    try:
        assert backend._connection is not None
        shown = [
            backend._connection.execute(f"SHOW {name}").fetchone()
            for name in ("tcp_keepalives_idle", "tcp_keepalives_count", "tcp_user_timeout")
        ]
        assert shown == [("30",), ("3",), ("60000",)]
    finally:
        backend.close()


def test_a_second_supervisor_on_the_same_database_is_refused(
    backend: PostgresBackend, url: str
) -> None:
    second = PostgresBackend(url)
    with pytest.raises(StoreError, match="in use by another process"):
        second.open()
    backend.close()
    second.open()  # the lock went with the first one's connection
    second.close()


@pytest.mark.parametrize(
    "make_url, expected",
    [
        (lambda pg: "postgresql://a b@@/x", "not a valid PostgreSQL URL"),
        (lambda pg: pg.tcp_url(password="wrong-secret"), "refused the credentials"),
        (
            lambda pg: pg.tcp_url().replace(f":{pg.port}/", f":{_closed_port()}/"),
            "cannot reach the PostgreSQL server",
        ),
        (lambda pg: pg.url("no_such_database"), "has no such database"),
        (lambda pg: pg.url().replace("asup@", "nobody@"), "has no such user"),
    ],
    ids=["malformed", "bad-password", "unreachable", "no-database", "no-user"],
)
def test_a_url_that_leads_nowhere_is_one_line(
    postgresql: PostgresServer, make_url: object, expected: str
) -> None:
    url: str = make_url(postgresql)  # type: ignore[operator]
    backend = backend_for(url)
    assert backend is not None
    with pytest.raises(StoreError) as raised:
        backend.open()
    message = str(raised.value)
    assert "\n" not in message and expected in message, message
    assert "wrong-secret" not in message and postgresql.password not in message
    assert "Traceback" not in message


def test_a_user_without_create_is_told_what_to_grant(postgresql: PostgresServer, url: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS reader")
        admin.execute("CREATE ROLE reader LOGIN")
        admin.execute("GRANT USAGE ON SCHEMA " + _schema(url) + " TO reader")
    try:
        backend = PostgresBackend(url.replace("asup@", "reader@"))
        with pytest.raises(StoreError) as raised:
            backend.open()
        message = str(raised.value)
        assert "\n" not in message and "grant the user CREATE" in message, message
    finally:
        with psycopg.connect(postgresql.url(), autocommit=True) as admin:
            admin.execute("DROP OWNED BY reader")
            admin.execute("DROP ROLE reader")


def test_a_search_path_without_a_schema_is_one_line(url: str) -> None:
    backend = PostgresBackend(url.replace(_schema(url), "no_such_schema"))
    with pytest.raises(StoreError) as raised:
        backend.open()
    message = str(raised.value)
    assert "\n" not in message and "create the schema" in message, message


def test_two_schemas_of_one_database_are_two_stores(postgresql: PostgresServer) -> None:
    first, second = PostgresBackend(postgresql.database()), PostgresBackend(postgresql.database())
    first.open()
    try:
        second.open()  # not "in use": the lock is the schema's
        try:
            first.write(Batch(sessions=[session("a")], events=events(1, 3, "a")))
            second.write(Batch(sessions=[session("b")], events=events(1, 2, "b")))
            assert [s.id for s in first.sessions()] == ["a"]
            assert [s.id for s in second.sessions()] == ["b"]
        finally:
            second.close()
    finally:
        first.close()


def test_text_postgresql_cannot_hold_as_is_is_stored_and_found(backend: PostgresBackend) -> None:
    # 2 MB of distinct words: a tsvector of all of it would pass its 1 MB bound.
    long = " ".join(f"w{i}" for i in range(300_000))
    backend.write(
        Batch(
            sessions=[session()],
            texts=[
                TextRow(session_id="s1", turn_id="t1", seq=1, kind="answer", text=long),
                TextRow(session_id="s1", turn_id="t1", seq=2, kind="prompt", text="a nul\x00 here"),
            ],
        )
    )
    answer, prompt = backend.texts("s1")
    assert answer.text == long  # stored in full; its first 100,000 characters indexed
    assert prompt.text == "a nul\ufffd here"
    assert [h.seq for h in backend.search("w5", 10)] == [1]
    assert [h.seq for h in backend.search("here", 10)] == [2]


def indexed(url: str) -> dict[tuple[int, str], bool]:
    """Whether each stored text has its ``tsvector``, by (seq, kind): read by a connection of
    its own, so what it sees is what was committed."""
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT seq, kind, search IS NOT NULL FROM texts").fetchall()
    return {(seq, kind): bool(has) for seq, kind, has in rows}


def answer(seq: int, text: str, sid: str = "s1") -> TextRow:
    return TextRow(session_id=sid, turn_id="t1", seq=seq, kind="answer", text=text)


def test_a_texts_vector_is_computed_after_the_write_that_stores_it(url: str) -> None:
    """The batch that stores a text (a turn's end with its answer, which subscribers wait
    for) commits without the text's ``tsvector``; ``settle`` computes it once INDEX_CHARS
    wait or the store is idle, a search before that finds the text too, and what a process
    that went away left unindexed is indexed by the next."""
    first = PostgresBackend(url)
    first.open()
    # (what a process before it may have left: indexed by the first settle)
    assert first.write(Batch(sessions=[session()], texts=[answer(4, "zebra river")]))
    assert indexed(url) == {(4, "answer"): False}
    first.settle(idle=False)
    assert indexed(url) == {(4, "answer"): True}
    assert not first.write(Batch(events=events(1, 3)))  # nothing left to settle
    assert not first.write(Batch(texts=[answer(5, "short")]))  # waits for idle, or for more
    first.settle(idle=False)
    assert indexed(url)[(5, "answer")] is False
    first.settle(idle=True)
    assert indexed(url)[(5, "answer")] is True
    assert first.write(Batch(texts=[answer(7, "w " * (INDEX_CHARS // 2))]))  # due at once
    first.settle(idle=False)
    assert indexed(url)[(7, "answer")] is True
    assert not first.write(Batch(texts=[answer(8, "zebra again")]))
    first.close()  # (gone before its settle)
    assert indexed(url)[(8, "answer")] is False
    reader = PostgresBackend(url, kind="acp")
    reader.open()
    try:
        assert [h.seq for h in reader.search("zebra", 10)] == [4, 8]
        assert all(indexed(url).values())
    finally:
        reader.close()


def test_a_store_whose_vectors_were_generated_is_migrated_and_searched(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of schema version 5 (each text's vector generated as its row is written) keeps
    its vectors, and its new texts are indexed after their write; new long texts are
    compressed with LZ4 (Debian's server has it), stored ones keep pglz."""
    long = " ".join(f"w{i}" for i in range(2_000))  # (past the 2 KB a row's value is kept in)
    monkeypatch.setattr(contract, "SCHEMA_VERSION", 5)
    old = PostgresBackend(url)
    old.open()
    old.write(Batch(sessions=[session()], texts=[answer(4, "zebra river"), answer(5, long)]))
    old.close()
    assert indexed(url) == {(4, "answer"): True, (5, "answer"): True}
    monkeypatch.undo()
    new = PostgresBackend(url)
    new.open()
    try:
        new.write(Batch(texts=[answer(8, "zebra again"), answer(9, long)]))
        assert indexed(url) == {(s, "answer"): s < 8 for s in (4, 5, 8, 9)}
        new.settle(idle=False)
        assert indexed(url) == {(s, "answer"): True for s in (4, 5, 8, 9)}
        assert [h.seq for h in new.search("zebra", 10)] == [4, 8]
        assert [h.snippet for h in new.search("river", 10)] == ["zebra [river]"]
        assert [h.seq for h in new.search("w1999", 10)] == [5, 9]
        with psycopg.connect(url) as connection:
            compressed = connection.execute(
                "SELECT seq, pg_column_compression(text) FROM texts WHERE seq IN (5, 9)"
            ).fetchall()
        assert sorted(compressed) == [(5, "pglz"), (9, "lz4")]
    finally:
        new.close()


async def test_a_turns_end_reaches_subscribers_before_its_answer_is_made(url: str) -> None:
    """Through the store's writer, on its thread: when the fan-out is told the turn's end is
    stored (its subscribers get it), its answer is neither made nor indexed; by the writer's
    close it is both, and the answer is found."""
    seen: list[dict[tuple[int, str], bool]] = []

    class Fanout:
        def committed(self, seq: int) -> None:
            seen.append(indexed(url))

    backend = PostgresBackend(url)
    store = SessionStore(backend)
    fanout: Any = Fanout()
    words = [
        ev.MessageDelta(session_id="s1", seq=seq, timestamp=1.0, turn_id="t1", text=f"zebra{seq} ")
        for seq in (1, 2, 3)
    ]
    ended = ev.TurnEnded(session_id="s1", seq=4, timestamp=1.0, turn_id="t1", outcome="completed")
    with trio.fail_after(60):
        await store.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            store.record([*words, ended], [event_json(e) for e in [*words, ended]], fanout)
            await store.flushed()
            await store.aclose()
    assert seen == [{}]
    assert indexed(url) == {(4, "answer"): True}
    backend.open()
    try:
        assert [h.seq for h in backend.search("zebra2", 10)] == [4]
    finally:
        backend.close()


def test_the_password_never_shows() -> None:
    assert redacted("postgresql://u:s3cret@h/db") == "postgresql://u:***@h/db"
    assert redacted("postgresql://h/db?sslmode=require&password=s3cret") == (
        "postgresql://h/db?sslmode=require&password=***"
    )
    assert redacted("postgresql://u@h/db") == "postgresql://u@h/db"


def _schema(url: str) -> str:
    """The schema ``PostgresServer.database()`` put in the URL."""
    return url.rpartition("search_path%3D")[2]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: nothing listens there
