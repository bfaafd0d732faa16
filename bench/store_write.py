"""Events per second a store backend writes, in batches of a given size.

Each backend writes ``--events`` small events (wire JSON of ~130 bytes, the size of a
``message.delta``) over ``--sessions`` sessions in batches of each ``--batches`` size (a run of
events per session in each), one transaction per batch, as the store's writer does, and the
median of ``--repeats`` runs is reported. PostgreSQL runs on a throwaway cluster of Debian's PostgreSQL 15 (``tests/pg.py``,
fsync off: the figure is the backend's and the server's CPU, not a disk's), or on ``--url``.

``--events-by insert`` writes PostgreSQL's events with ``INSERT ... ON CONFLICT DO NOTHING``
through ``executemany`` (the path a batch written twice takes) instead of ``COPY``: the
comparison behind the backend's choice.

    python -m bench.store_write --backends sqlite,postgresql --batches 100,1000 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from supervisor.store.backend import Backend, Batch, EventRun, StoredSession
from supervisor.store.url import backend_for


def _session(sid: str) -> StoredSession:
    return StoredSession(
        id=sid,
        agent="claude",
        protocol="claude",
        host=None,
        cwd="/tmp",
        mcp_servers="[]",
        agent_session_id=None,
        created=time.time(),
        last_active=time.time(),
        state="working",
    )


def _batches(total: int, size: int, sessions: int, run: int) -> list[Batch]:
    """Made before the clock starts: the figure is the backend's, not this loop's. Each batch
    holds ``size`` events, one run per session, as the store's writer makes them."""
    seqs = dict.fromkeys(range(sessions), 0)
    batches = []
    for number in range(total // size):
        runs: dict[int, EventRun] = {}
        for i in range(size):
            s = (number * size + i) % sessions
            seqs[s] += 1
            sid = f"r{run}s{s}"
            if s not in runs:
                runs[s] = EventRun(session_id=sid, first_seq=seqs[s], payloads=[])
            runs[s].payloads.append(
                b'{"event":"message.delta","session_id":"%s","seq":%d,"turn_id":"t1",'
                b'"text":"a few words of the answer, streamed"}' % (sid.encode(), seqs[s])
            )
        batches.append(Batch(events=list(runs.values())))
    return batches


def measure(backend: Backend, total: int, size: int, sessions: int, repeats: int) -> list[float]:
    rates = []
    for run in range(repeats):
        backend.write(Batch(sessions=[_session(f"r{run}s{s}") for s in range(sessions)]))
        batches = _batches(total, size, sessions, run)
        begun = time.perf_counter()
        for batch in batches:
            if backend.write(batch):
                backend.settle(idle=False)  # (as the store's writer does: a checkpoint too)
        rates.append(total / (time.perf_counter() - begun))
    return rates


@contextmanager
def _store(name: str, url: str | None) -> Iterator[str]:
    if name == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            yield url or f"sqlite:///{Path(directory) / 'sessions.db'}"
    elif url is not None:
        yield url
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from pg import start_postgresql

        cluster = start_postgresql()
        server = next(cluster)
        try:
            yield server.database()
        finally:
            cluster.close()


def fill(backend: Backend, sessions: int, events: int, run_length: int) -> None:
    """``events`` events over ``sessions`` sessions in runs of ``run_length``, batches of 100
    runs, made as they are written (10 million events do not fit in memory at once)."""
    backend.write(Batch(sessions=[_session(f"f{s}") for s in range(sessions)]))
    per_session = events // sessions
    runs = [
        (f"f{s}", first) for first in range(1, per_session + 1, run_length) for s in range(sessions)
    ]
    for start in range(0, len(runs), 100):
        batch = []
        for sid, first in runs[start : start + 100]:
            count = min(run_length, per_session - first + 1)
            batch.append(
                EventRun(
                    session_id=sid,
                    first_seq=first,
                    payloads=[
                        b'{"event":"message.delta","session_id":"%s","seq":%d,"turn_id":"t1",'
                        b'"text":"a few words of the answer, streamed"}' % (sid.encode(), seq)
                        for seq in range(first, first + count)
                    ],
                )
            )
        if backend.write(Batch(events=batch)):
            backend.settle(idle=False)


def reopen(url: str) -> tuple[float, float]:
    """Seconds a new backend takes to open the store, and to list its sessions (what a
    restarting supervisor does before it is ready)."""
    backend = backend_for(url)
    assert backend is not None
    begun = time.perf_counter()
    backend.open()
    opened = time.perf_counter() - begun
    backend.sessions()
    listed = time.perf_counter() - begun - opened
    backend.close()
    return opened, listed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--batches", default="100,1000")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--url", default=None, help="PostgreSQL: this database, not a new one")
    parser.add_argument("--events-by", choices=("copy", "insert"), default="copy")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--restart",
        default=None,
        metavar="SESSIONS,EVENTS",
        help="instead: fill a store with EVENTS events of SESSIONS sessions (runs of 10), then "
        "time a new backend's open and its list of sessions",
    )
    args = parser.parse_args()
    if args.restart is not None:
        sessions, events = (int(n) for n in args.restart.split(","))
        restart_figures: dict[str, float] = {}
        for name in args.backends.split(","):
            with _store(name, args.url) as url:
                backend = backend_for(url)
                assert backend is not None
                backend.open()
                begun = time.perf_counter()
                try:
                    fill(backend, sessions, events, 10)
                finally:
                    backend.close()
                filled = time.perf_counter() - begun
                opened, listed = min((reopen(url) for _ in range(3)), key=sum)
            restart_figures[f"{name}_open_s"] = round(opened, 4)
            restart_figures[f"{name}_sessions_s"] = round(listed, 4)
            if not args.json:
                print(
                    f"{name:10s} {sessions:,} sessions, {events:,} events (filled in"
                    f" {filled:.0f} s): open {opened * 1000:.0f} ms, sessions()"
                    f" {listed * 1000:.0f} ms (best of 3)",
                    flush=True,
                )
        if args.json:
            print(json.dumps(restart_figures))
        return
    if args.events_by == "insert":
        from supervisor.store import postgres

        copying = postgres._write_batch
        postgres._write = lambda connection, batch: copying(  # type: ignore[assignment]
            connection, batch, copy_events=False
        )
    figures: dict[str, float | str] = {"events_by": args.events_by}
    for name in args.backends.split(","):
        for size in (int(s) for s in args.batches.split(",")):
            with _store(name, args.url) as url:
                backend = backend_for(url)
                assert backend is not None
                backend.open()
                try:
                    rates = measure(backend, args.events, size, args.sessions, args.repeats)
                finally:
                    backend.close()
            figures[f"{name}_batch{size}_events_per_s"] = round(statistics.median(rates))
            if not args.json:
                spread = ", ".join(f"{r:,.0f}" for r in rates)
                print(
                    f"{name:10s} batches of {size:5d}: {statistics.median(rates):10,.0f} events/s"
                    f" (median of {len(rates)}: {spread})",
                    flush=True,
                )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
