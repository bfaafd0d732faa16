"""Retention: ``[store] keep_days``, ``keep_sessions``, ``keep_bytes``. Which sessions a sweep
lets go (the least recently active stopped ones, never one running), a session deleted whole
on each backend (its events, receipts, texts and their search index), SQLite giving the space
back, and a supervisor's sweep at start and on demand, with live sessions kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from helpers import run_turn, stored_row
from supervisor import AgentSpec, open_supervisor
from supervisor.config import ConfigError, parse_store
from supervisor.store.backend import Backend, Batch, EventRun, ReceiptRow, StoredSession, TextRow
from supervisor.store.retention import Retention, expired, parse_bytes
from supervisor.store.sqlite import SqliteBackend
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 30.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
DAY = 86_400.0


def stored(id: str, last_active: float) -> StoredSession:
    return stored_row(id, created=last_active, last_active=last_active, state="stopped")


# -- which sessions go


NOW = 100 * DAY
#: the most recently active first, as Backend.sessions() gives them
SESSIONS = [stored("s4", NOW - 1), stored("s3", NOW - 2 * DAY), stored("s2", NOW - 9 * DAY)]
SESSIONS.append(stored("s1", NOW - 30 * DAY))
SIZES = {"s4": 100, "s3": 200, "s2": 300, "s1": 400}


def test_nothing_goes_unless_asked() -> None:
    assert not Retention()
    assert expired(SESSIONS, SIZES, Retention(), NOW, ()) == []


def test_by_age_the_ones_last_active_before_the_cutoff() -> None:
    assert expired(SESSIONS, SIZES, Retention(keep_days=7), NOW, ()) == ["s1", "s2"]
    assert expired(SESSIONS, SIZES, Retention(keep_days=7), NOW, {"s2"}) == ["s1"]


def test_by_count_the_least_recently_active_running_ones_counted_never_taken() -> None:
    assert expired(SESSIONS, SIZES, Retention(keep_sessions=3), NOW, ()) == ["s1"]
    # s1 runs: it counts, and the next oldest go in its place
    assert expired(SESSIONS, SIZES, Retention(keep_sessions=2), NOW, {"s1"}) == ["s2", "s3"]
    assert expired(SESSIONS, SIZES, Retention(keep_sessions=1), NOW, {"s4", "s1"}) == [
        "s2",
        "s3",
    ]


def test_by_bytes_the_oldest_until_the_rest_fit() -> None:
    assert expired(SESSIONS, SIZES, Retention(keep_bytes=1000), NOW, ()) == []
    assert expired(SESSIONS, SIZES, Retention(keep_bytes=600), NOW, ()) == ["s1"]
    assert expired(SESSIONS, SIZES, Retention(keep_bytes=250), NOW, ()) == ["s1", "s2", "s3"]


def test_the_bounds_together_each_may_let_one_go() -> None:
    keep = Retention(keep_days=20, keep_sessions=3, keep_bytes=350)
    # age takes s1; three are left, count keeps them; bytes (600) takes s2, then fits (300)
    assert expired(SESSIONS, SIZES, keep, NOW, ()) == ["s1", "s2"]


@pytest.mark.parametrize(
    ("value", "size"),
    [(1000, 1000), ("1000", 1000), ("500 MB", 500 * 10**6), ("2GiB", 2 * 2**30), ("1.5kb", 1500)],
)
def test_sizes_are_bytes_or_a_number_with_its_unit(value: object, size: int) -> None:
    assert parse_bytes(value) == size


@pytest.mark.parametrize("value", [0, -1, "", "lots", "5 parsecs", True, 1.5, "0 MB"])
def test_what_is_not_a_size_is_refused(value: object) -> None:
    assert parse_bytes(value) is None


def test_the_store_table_takes_the_three_bounds() -> None:
    settings = parse_store(
        {"store": {"keep_days": 30, "keep_sessions": 500, "keep_bytes": "2 GB"}}, "a.toml"
    )
    assert (settings.keep_days, settings.keep_sessions, settings.keep_bytes) == (
        30.0,
        500,
        2 * 10**9,
    )
    assert parse_store({}).keep_days is None
    assert parse_store({}).writer == "process"
    assert parse_store({"store": {"writer": "thread"}}).writer == "thread"
    for table, message in [
        ({"keep_days": 0}, "'keep_days' must be a number of days above 0"),
        ({"keep_days": "a week"}, "'keep_days' must be a number of days above 0"),
        ({"keep_sessions": 0}, "'keep_sessions' must be a whole number >= 1"),
        ({"keep_bytes": "big"}, "'keep_bytes' must be a size above 0"),
        ({"keep_forever": 1}, "unknown key(s) keep_forever"),
        ({"writer": "fork"}, '\'writer\' must be "process" (the default) or "thread"'),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_store({"store": table}, "a.toml")


# -- deleting, on each backend


def fill(backend: Backend, session_id: str, events: int = 3, word: str = "zebra") -> None:
    payloads = [
        b'{"event":"message.delta","seq":%d,"text":"%s"}' % (n, b"x" * 100)
        for n in range(1, events + 1)
    ]
    backend.write(
        Batch(
            sessions=[stored(session_id, 1.0)],
            events=[EventRun(session_id=session_id, first_seq=1, payloads=payloads)],
            receipts=[ReceiptRow(session_id=session_id, turn_id="t1", seq=3, payload=b"{}")],
            texts=[
                TextRow(session_id=session_id, turn_id="t1", seq=1, kind="prompt", text=word),
                TextRow(
                    session_id=session_id, turn_id="t1", seq=3, kind="answer", text="a " + word
                ),
            ],
        )
    )


def test_a_session_is_deleted_whole_and_no_other(backend: Backend) -> None:
    fill(backend, "s1", word="zebra")
    fill(backend, "s2", word="zebra")
    sizes = backend.sizes()
    assert set(sizes) == {"s1", "s2"} and sizes["s1"] > 300
    backend.delete(["s1"])
    assert [s.id for s in backend.sessions()] == ["s2"]
    assert backend.events("s1", 0, 10) == [] and backend.receipts("s1") == []
    assert backend.texts("s1") == [] and backend.first_prompts(10) == {"s2": "zebra"}
    assert {hit.session_id for hit in backend.search("zebra", 10)} == {"s2"}  # its index too
    assert len(backend.events("s2", 0, 10)) == 3 and set(backend.sizes()) == {"s2"}
    backend.delete(["s1", "s9"])  # gone already, or never there: nothing to do
    fill(backend, "s1", word="okapi")  # (its index rows went with it: no stale hit)
    assert sorted((h.session_id, h.kind) for h in backend.search("okapi", 10)) == [
        ("s1", "answer"),
        ("s1", "prompt"),
    ]
    assert {hit.session_id for hit in backend.search("zebra", 10)} == {"s2"}


def test_a_sqlite_file_made_incremental_gives_the_space_back(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "sessions.db"
    made = SqliteBackend(path)
    made.open()
    made.close()
    db = sqlite3.connect(path)  # as design/store.md says to, with no serve running
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("VACUUM")
    db.close()
    backend = SqliteBackend(path)
    backend.open()
    try:
        for n in range(20):
            fill(backend, f"s{n}", events=2000)
        backend.write(Batch(sessions=[stored("keep", 1.0)]))
        backend._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        full = path.stat().st_size
        assert full > 5_000_000
        backend.delete([f"s{n}" for n in range(20)])
        pages = 0
        while backend.reclaim(64):  # a slice at a time, as the writer asks
            pages += 64
        assert pages > 64
        backend._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert path.stat().st_size < full // 10
        assert [s.id for s in backend.sessions()] == ["keep"]
    finally:
        backend.close()


def test_a_sqlite_file_reuses_the_pages_deleted_sessions_freed(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)
    backend.open()
    try:
        for n in range(10):
            fill(backend, f"s{n}", events=2000)
        backend._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        full = path.stat().st_size
        backend.delete([f"s{n}" for n in range(10)])
        assert backend.reclaim(64) is False  # not a file that gives pages back
        for n in range(10, 20):
            fill(backend, f"s{n}", events=2000)
        backend._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert path.stat().st_size <= full * 1.05  # the freed pages took the new rows
    finally:
        backend.close()


# -- a supervisor's sweeps


async def three_sessions(url: str) -> None:
    """s1, s2, s3, each with one turn and stopped, s3 the most recently active."""
    launcher = AcpLauncher(AcpBehaviour(text="the zebra crossed", word_interval=0))
    async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
        for _ in range(3):
            session = await sup.start_session("fake")
            await run_turn(session, "tell me about a zebra")
            await sup.stop_session(session.id)  # its last event: s1's the oldest


async def test_sweeps_delete_stopped_sessions_and_never_a_running_one(store_url: str) -> None:
    with trio.fail_after(BOUND):
        await three_sessions(store_url)
        launcher = AcpLauncher(AcpBehaviour(text="hello", word_interval=0))
        async with open_supervisor(
            agents={"fake": SPEC},
            launcher=launcher,
            store=store_url,
            retention=Retention(keep_sessions=2),
        ) as sup:
            await sup.first_sweep.wait()  # at start: the least recently active goes
            assert sorted(s.session_id for s in sup.list()) == ["s2", "s3"]
            assert sup.store is not None
            assert await sup.store.events("s1", 0, 10) == []
            assert {hit.session_id for hit in await sup.store.search("zebra", 10)} == {"s2", "s3"}

            live = await sup.start_session("fake")  # s4
            await run_turn(live, "hi")
            await sup.store.flushed()
            # s4 ran long enough ago for any age bound: it runs, so it stays; s2 and s3 go
            assert await sup.sweep_store(Retention(keep_days=1e-9)) == ["s2", "s3"]
            assert [s.session_id for s in sup.list()] == ["s4"]
            assert await sup.sweep_store(Retention(keep_sessions=1, keep_bytes=1)) == []
            assert [s.id for s in await sup.store.sessions()] == ["s4"]
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, store=store_url
        ) as sup:
            (only,) = sup.list()  # what was deleted stays deleted; ids are not reused
            assert only.session_id == "s4"
            assert (await sup.start_session("fake")).id == "s5"
