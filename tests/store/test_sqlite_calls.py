"""How many calls into SQLite a write makes: each one takes the GIL back from the event loop
as it returns, and a busy event loop can keep it from the writer's thread for tens of ms, so a
stream's batches (and a flood's of many sessions) are one statement."""

from __future__ import annotations

from pathlib import Path

from supervisor.store.backend import Batch, EventRun, StoredSession
from supervisor.store.sqlite import ROWS_PER_STATEMENT, SqliteBackend


def _run(sid: str, first: int, count: int) -> EventRun:
    return EventRun(
        session_id=sid,
        first_seq=first,
        payloads=[b'{"seq":%d}' % seq for seq in range(first, first + count)],
    )


def _statements(backend: SqliteBackend, batch: Batch) -> list[str]:
    said: list[str] = []
    db = backend._conn
    db.set_trace_callback(lambda sql: said.append(sql.split(None, 1)[0].upper()))
    try:
        backend.write(batch)
    finally:
        db.set_trace_callback(None)
    return said


def test_runs_of_many_sessions_alone_are_one_statement(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "sessions.db")
    backend.open()
    ids = [f"s{n}" for n in range(ROWS_PER_STATEMENT)]
    assert _statements(backend, Batch(events=[_run(sid, 1, 3) for sid in ids])) == ["INSERT"]
    # One more run than a statement takes, or a session's row with them: a transaction.
    more = Batch(events=[_run(sid, 4, 2) for sid in [*ids, "s-extra"]])
    assert _statements(backend, more)[0] == "BEGIN"
    row = StoredSession(
        id="s0",
        agent="a",
        protocol="acp",
        host=None,
        cwd="/",
        mcp_servers="[]",
        agent_session_id=None,
        created=1.0,
        last_active=2.0,
        state="ready",
    )
    assert _statements(backend, Batch(sessions=[row], events=[_run("s0", 6, 1)]))[0] == "BEGIN"
    for sid in ids:
        assert [seq for seq, _ in backend.events(sid, 0, 100)] == list(
            range(1, 7 if sid == "s0" else 6)
        )
    backend.close()
