"""What every store backend does: write and read back, one transaction per batch, search,
migrate, refuse a newer schema. Runs once per backend (``store_url``, ``conftest.py``); and
how many calls into SQLite its writes make (each takes the GIL back from the event loop as it
returns, and a busy event loop can keep it from the writer's thread for tens of ms)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from helpers import stored_row as session
from supervisor.store.backend import (
    FIRST_PROMPT_CHARS,
    MIGRATIONS,
    SCHEMA_VERSION,
    Backend,
    Batch,
    CheckpointRow,
    EventRun,
    ReceiptRow,
    StoreError,
    TextRow,
)
from supervisor.store.sqlite import ROWS_PER_STATEMENT, SqliteBackend
from supervisor.store.url import backend_for


def payload(seq: int, kind: str = "message.delta", sid: str = "s1") -> bytes:
    return b'{"event":"%s","session_id":"%s","seq":%d}' % (kind.encode(), sid.encode(), seq)


def run(first: int, count: int = 1, sid: str = "s1") -> EventRun:
    return EventRun(
        session_id=sid,
        first_seq=first,
        payloads=[payload(seq, sid=sid) for seq in range(first, first + count)],
    )


def test_write_and_read_back(backend: Backend) -> None:
    backend.write(
        Batch(
            sessions=[session("s1", last_active=2.0), session("s2", last_active=3.0)],
            events=[run(1, 2), run(3)],
            receipts=[ReceiptRow(session_id="s1", turn_id="t1", seq=3, payload=b'{"a":1}')],
            texts=[
                TextRow(session_id="s1", turn_id="t1", seq=1, kind="prompt", text="x" * 100_000),
                TextRow(session_id="s1", turn_id="t1", seq=3, kind="answer", text="hello there"),
            ],
        )
    )
    stored = backend.sessions()
    assert [s.id for s in stored] == ["s2", "s1"]  # the most recently active first
    assert stored[1].last_seq == 3
    assert stored[0].last_seq == 0
    assert backend.events("s1", 0, 10) == [(n, payload(n)) for n in (1, 2, 3)]
    assert [seq for seq, _ in backend.events("s1", 1, 1)] == [2]
    assert backend.receipts("s1") == [
        ReceiptRow(session_id="s1", turn_id="t1", seq=3, payload=b'{"a":1}')
    ]
    texts = backend.texts("s1")
    assert [(t.kind, len(t.text)) for t in texts] == [("prompt", 100_000), ("answer", 11)]


def test_upsert_keeps_created_and_updates_the_rest(backend: Backend) -> None:
    backend.write(Batch(sessions=[session(state="starting")]))
    later = attrs.evolve(
        session(), created=9.0, last_active=5.0, agent_session_id="abc", state="ready"
    )
    backend.write(Batch(sessions=[later]))
    (stored,) = backend.sessions()
    assert (stored.created, stored.last_active, stored.agent_session_id, stored.state) == (
        1.0,
        5.0,
        "abc",
        "ready",
    )


def test_events_are_read_from_any_seq_in_runs(backend: Backend) -> None:
    backend.write(Batch(sessions=[session()], events=[run(1, 5), run(6, 1), run(7, 4)]))
    backend.write(Batch(events=[run(1, 3, sid="s2")]))
    assert [seq for seq, _ in backend.events("s1", 0, 100)] == list(range(1, 11))
    assert backend.events("s1", 3, 4) == [(n, payload(n)) for n in (4, 5, 6, 7)]
    assert backend.events("s1", 10, 4) == []
    assert [seq for seq, _ in backend.events("s2", 2, 100)] == [3]
    backend.write(Batch(events=[run(4, 5)]))  # overlaps what is stored: each seq once
    assert [seq for seq, _ in backend.events("s1", 0, 100)] == list(range(1, 11))


def test_a_batch_of_many_sessions_runs_is_stored_whole(backend: Backend) -> None:
    # A flood of many sessions: more rows than one statement takes (SQLite's
    # ROWS_PER_STATEMENT), some of them runs stored already.
    ids = [f"s{n}" for n in range(250)]
    backend.write(Batch(sessions=[session(i) for i in ids[:10]], events=[run(1, 2, sid=ids[0])]))
    rows = [session(i, last_active=5.0) for i in ids]
    backend.write(Batch(sessions=rows, events=[run(1, 3, sid=i) for i in ids]))
    assert {(s.id, s.last_active) for s in backend.sessions()} == {(i, 5.0) for i in ids}
    for i in (ids[0], ids[1], ids[99], ids[100], ids[249]):
        assert backend.events(i, 0, 100) == [(n, payload(n, sid=i)) for n in (1, 2, 3)]


def test_runs_alone_some_stored_already_are_each_stored_once(backend: Backend) -> None:
    # A stream's batch (runs and nothing else, written as one statement by SQLite) that
    # meets runs stored already: those stay, what they do not hold is added.
    ids = [f"s{n}" for n in range(30)]
    backend.write(Batch(events=[run(1, 2, sid=i) for i in ids[::3]]))
    backend.write(Batch(events=[run(1, 4, sid=i) for i in ids]))
    for i in ids:
        assert backend.events(i, 0, 100) == [(n, payload(n, sid=i)) for n in range(1, 5)]


def test_sqlite_writes_runs_of_many_sessions_alone_in_one_statement(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "sessions.db")
    backend.open()
    said: list[str] = []
    backend._conn.set_trace_callback(lambda sql: said.append(sql.split(None, 1)[0].upper()))

    def statements(batch: Batch) -> list[str]:
        said.clear()
        backend.write(batch)
        return list(said)

    ids = [f"s{n}" for n in range(ROWS_PER_STATEMENT)]
    assert statements(Batch(events=[run(1, 3, sid=i) for i in ids])) == ["INSERT"]
    # One more run than a statement takes, or a session's row with them: a transaction.
    more = Batch(events=[run(4, 2, sid=i) for i in [*ids, "s-extra"]])
    assert statements(more)[0] == "BEGIN"
    assert statements(Batch(sessions=[session("s0")], events=[run(6, sid="s0")]))[0] == "BEGIN"
    for i in ids:
        last = 6 if i == "s0" else 5
        assert backend.events(i, 0, 100) == [(n, payload(n, sid=i)) for n in range(1, last + 1)]
    backend.close()


def test_a_longer_run_at_a_stored_first_seq_stores_the_rest(backend: Backend) -> None:
    backend.write(Batch(sessions=[session()], events=[run(1, 3)]))
    # A node's session adopted again hands over more than was stored, from the same seq;
    # what was stored stays as clients got it.
    longer = EventRun(
        session_id="s1", first_seq=1, payloads=[b"{}"] * 3 + [payload(n) for n in (4, 5, 6)]
    )
    backend.write(Batch(events=[longer, run(1, 2, sid="s2")]))
    assert backend.events("s1", 0, 100) == [(n, payload(n)) for n in range(1, 7)]
    assert backend.events("s2", 0, 100) == [(n, payload(n, sid="s2")) for n in (1, 2)]
    backend.write(Batch(events=[run(1, 8)]))  # past two stored runs: only 7 and 8 added
    assert backend.events("s1", 0, 100) == [(n, payload(n)) for n in range(1, 9)]
    assert backend.sessions()[0].last_seq == 8
    backend.write(Batch(events=[run(1, 8)]))  # the same again: nothing twice
    assert backend.events("s1", 0, 100) == [(n, payload(n)) for n in range(1, 9)]


def test_the_open_turn_is_kept_with_the_session(backend: Backend) -> None:
    backend.write(Batch(sessions=[attrs.evolve(session(), open_turn_id="t1")]))
    assert backend.sessions()[0].open_turn_id == "t1"
    backend.write(Batch(sessions=[session()]))
    assert backend.sessions()[0].open_turn_id is None


def test_the_worktree_is_kept_with_the_session(backend: Backend) -> None:
    worktree = '{"path": "/state/worktrees/repo-s1", "branch": "agent-supervisor/s1"}'
    backend.write(Batch(sessions=[attrs.evolve(session(), worktree=worktree)]))
    assert backend.sessions()[0].worktree == worktree
    backend.write(Batch(sessions=[session()]))
    assert backend.sessions()[0].worktree is None


def test_checkpoints_are_kept_newest_last_their_ends_added_and_deleted_whole(
    backend: Backend,
) -> None:
    def row(cid: str, n: int, start: str, end: str | None = None, sid: str = "s1") -> CheckpointRow:
        return CheckpointRow(session_id=sid, checkpoint_id=cid, n=n, start=start, end=end)

    backend.write(Batch(sessions=[session(), session("s2")]))
    backend.write(
        Batch(checkpoints=[row("t1", 1, "a"), row("r1", 2, "b"), row("t1", 9, "b", sid="s2")])
    )
    backend.write(Batch(checkpoints=[row("t1", 0, "a", "c"), row("t2", 3, "d")]))
    assert backend.checkpoints("s1", 10) == [
        row("t1", 1, "a", "c"),
        row("r1", 2, "b"),
        row("t2", 3, "d"),
    ]
    assert backend.checkpoints("s1", 2) == [row("r1", 2, "b"), row("t2", 3, "d")]
    # an id used again (a rewind's, once forgotten) is a new checkpoint: its row replaced
    backend.write(Batch(checkpoints=[row("t1", 4, "e")]))
    assert backend.checkpoints("s1", 10)[-1] == row("t1", 4, "e")
    backend.delete(["s1"])
    assert backend.checkpoints("s1", 10) == []
    assert backend.checkpoints("s2", 10) == [row("t1", 9, "b", sid="s2")]


def test_a_batch_written_twice_stores_nothing_twice(backend: Backend) -> None:
    batch = Batch(
        sessions=[session()],
        events=[run(1, 2)],
        texts=[TextRow(session_id="s1", turn_id="t1", seq=1, kind="prompt", text="once")],
    )
    backend.write(batch)
    backend.write(batch)
    assert len(backend.events("s1", 0, 10)) == 2
    assert len(backend.texts("s1")) == 1
    assert len(backend.search("once", 10)) == 1


def test_a_failed_batch_writes_nothing(backend: Backend) -> None:
    backend.write(Batch(sessions=[session()]))
    bad = TextRow(session_id="s1", turn_id="t1", seq=1, kind="prompt", text=object())  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="cannot write"):
        backend.write(Batch(events=[run(1)], texts=[bad]))
    assert backend.events("s1", 0, 10) == []
    backend.write(Batch(events=[run(1)]))  # and the store goes on
    assert len(backend.events("s1", 0, 10)) == 1


def test_search_finds_words_in_prompts_steers_and_answers(backend: Backend) -> None:
    backend.write(
        Batch(
            sessions=[session("s1"), session("s2")],
            texts=[
                TextRow(
                    session_id="s1", turn_id="t1", seq=1, kind="prompt", text="fix the parser bug"
                ),
                TextRow(
                    session_id="s1", turn_id="t1", seq=5, kind="answer", text="The parser is fixed."
                ),
                TextRow(
                    session_id="s2", turn_id="t1", seq=2, kind="steer", text="use the lexer instead"
                ),
            ],
        )
    )
    hits = backend.search("parser", 10)
    assert sorted((h.session_id, h.kind) for h in hits) == [("s1", "answer"), ("s1", "prompt")]
    assert all("parser" in h.snippet.lower() for h in hits)
    (hit,) = backend.search("LEXER", 10)
    assert (hit.session_id, hit.turn_id, hit.seq, hit.kind) == ("s2", "t1", 2, "steer")
    assert backend.search('"unbalanced AND (', 10) == []  # what is typed is text, not syntax
    assert backend.search("", 10) == []
    assert len(backend.search("parser", 1)) == 1
    assert all(h.agent == "claude" for h in backend.search("parser", 10))


def test_first_prompts_are_each_sessions_earliest_cut_short(backend: Backend) -> None:
    def prompt(sid: str, seq: int, text: str, kind: str = "prompt") -> TextRow:
        return TextRow(session_id=sid, turn_id=f"t{seq}", seq=seq, kind=kind, text=text)

    backend.write(
        Batch(
            sessions=[session("s1"), session("s2"), session("s3")],
            texts=[
                prompt("s1", 9, "the second prompt"),
                prompt("s1", 1, "the first prompt, a long one"),
                prompt("s1", 0, "a steer before it", kind="steer"),
                prompt("s2", 4, "only one"),
                prompt("s3", 2, "an answer only", kind="answer"),
            ],
        )
    )
    assert backend.first_prompts(16) == {"s1": "the first prompt", "s2": "only one"}


def test_sessions_carry_their_first_prompt_cut_short(backend: Backend) -> None:
    """What session.list shows of a stored session: read with the sessions, in one query."""
    backend.write(
        Batch(
            sessions=[session("s1"), session("s2"), session("s3")],
            texts=[
                TextRow(session_id="s1", turn_id="t2", seq=9, kind="prompt", text="later"),
                TextRow(session_id="s1", turn_id="t1", seq=2, kind="prompt", text="é" * 1000),
                TextRow(session_id="s1", turn_id="t0", seq=1, kind="steer", text="a steer"),
                TextRow(session_id="s2", turn_id="t1", seq=4, kind="prompt", text="only one"),
                TextRow(session_id="s3", turn_id="t1", seq=2, kind="answer", text="no prompt"),
            ],
        )
    )
    firsts = {s.id: s.first_prompt for s in backend.sessions()}
    assert firsts == {"s1": "é" * FIRST_PROMPT_CHARS, "s2": "only one", "s3": ""}


def test_reopened_store_keeps_everything(store_url: str) -> None:
    first = backend_for(store_url)
    assert first is not None
    first.open()
    first.write(Batch(sessions=[session()], events=[run(1)]))
    first.close()
    again = backend_for(store_url)
    assert again is not None
    again.open()  # the schema is there: no migration runs twice
    try:
        assert [s.id for s in again.sessions()] == ["s1"]
        assert len(again.events("s1", 0, 10)) == 1
    finally:
        again.close()


def test_a_newer_schema_is_refused(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    newer = backend_for(store_url)
    assert newer is not None
    future = [
        *MIGRATIONS,
        {
            "sqlite": ["CREATE TABLE later (x INTEGER)"],
            "postgresql": ["CREATE TABLE later (x INTEGER)"],
        },
    ]
    monkeypatch.setattr("supervisor.store.backend.MIGRATIONS", future)
    import supervisor.store.backend as contract

    for module in _backend_modules():
        monkeypatch.setattr(module, "MIGRATIONS", future, raising=False)
        monkeypatch.setattr(module, "SCHEMA_VERSION", SCHEMA_VERSION + 1, raising=False)
    monkeypatch.setattr(contract, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    newer.open()  # migrates to the next version
    newer.close()
    monkeypatch.undo()
    old = backend_for(store_url)
    assert old is not None
    with pytest.raises(StoreError) as raised:
        old.open()
    message = str(raised.value)
    assert "\n" not in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message and "upgrade" in message


def _backend_modules() -> list[object]:
    import importlib

    modules = []
    for name in ("supervisor.store.sqlite", "supervisor.store.postgres"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            pass
    return modules


def test_a_store_of_the_first_schema_is_migrated_with_its_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.store import sqlite as module

    path = tmp_path / "sessions.db"
    monkeypatch.setattr(module, "SCHEMA_VERSION", 1)
    first = module.SqliteBackend(path)
    first.open()
    db = first._conn
    db.execute(
        "INSERT INTO sessions VALUES ('s1', 'claude', 'claude', NULL, '/tmp', '[]', NULL, 1.0,"
        " 2.0, 'ready', 't1')"
    )
    for r in (run(1, 3), run(4, 2)):
        db.execute(
            "INSERT INTO events VALUES (?, ?, ?, ?)",
            (r.session_id, r.first_seq, r.last_seq, b"\n".join(r.payloads)),
        )
    first.close()
    monkeypatch.undo()
    second = module.SqliteBackend(path)
    second.open()
    try:
        (stored,) = second.sessions()
        assert (
            stored.last_seq,
            stored.open_turn_id,
            stored.clean,
            stored.turns,
            stored.worktree,
        ) == (5, "t1", True, 0, None)
        assert second.events("s1", 0, 100) == [(n, payload(n)) for n in range(1, 6)]
        second.write(Batch(events=[run(1, 7)]))  # the unique key holds after the rebuild
        assert [seq for seq, _ in second.events("s1", 0, 100)] == list(range(1, 8))
    finally:
        second.close()
