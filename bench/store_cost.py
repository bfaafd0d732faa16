"""What the session store costs: store off beside store on (SQLite in a temporary directory),
interleaved in one run.

- **cancel**: p50/p99 of ``Session.cancel()`` on a light agent streaming a turn (as
  ``bench/transport_floor.py``'s "light" row: ``bench/cancel_overhead.py``'s
  ``supervisor_cancel``), ``--rounds`` cancels each way;
- **throughput**: one WebSocket subscriber, the light agent flooding ``--words`` one-word
  deltas (``bench/throughput.py``'s "ours"), ``--repeats`` runs each way; events/s and the
  server's CPU per event (the store's worker thread included: it is the same process);
- **backend**: events/s the SQLite backend writes alone, in batches of 100 and of 1,000
  events of ~120 bytes (one transaction each, one session's run); the same for PostgreSQL on
  a throwaway cluster (``tests/pg.py``, as ``bench/store_write.py`` starts it) when this
  machine has one (``scripts/ensure-postgresql.sh``), else one line says why not;
- **restart**: a store of ``--sessions`` sessions of ``--events`` events each (one in ten with
  a turn left running), opened as a restarted ``serve`` opens it: the open, the running turns
  ended, the sessions listed; then one session's whole history read for a replay.

Usage: ``python -m bench.store_cost [--rounds 200] [--words 20000] [--repeats 5]
[--sessions 1000] [--events 1000] [--json]`` (``--events 10000``: 10 million events, a 1.3 GB
file; ``--json``: a summary and the figures on one line, as ``bench/run_all.py`` reads them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.cancel_overhead import percentile, supervisor_cancel
from bench.throughput import run_ours
from bench.transport_floor import LIGHT_AGENT, SETTLE_S
from supervisor import AgentSpec, open_supervisor
from supervisor.store.backend import Backend, Batch, EventRun, StoredSession
from supervisor.store.sqlite import SqliteBackend
from supervisor.store.url import backend_for
from supervisor.store.writer import SessionStore

#: receiver processes for the throughput runs (one subscriber needs one)
RECEIVERS = 1


async def cancels(rounds: int, directory: Path) -> dict[str, Any]:
    spec = AgentSpec(name="light", protocol="acp", command=LIGHT_AGENT)
    times: dict[str, list[float]] = {"off": [], "on": []}
    url = f"sqlite:///{directory / 'cancel.db'}"
    async with (
        open_supervisor(agents={"light": spec}) as off,
        open_supervisor(agents={"light": spec}, store=url) as on,
    ):
        sessions = {
            "off": await off.start_session("light", cwd="/"),
            "on": await on.start_session("light", cwd="/"),
        }
        store = on.store
        assert store is not None
        for round_ in range(5 + rounds):
            # Each side first in every other round: the second runs in what the first left
            # (a side's cancel in second place measures ~1-2 % faster, store off on both).
            order = ["off", "on"] if round_ % 2 == 0 else ["on", "off"]
            for name in order:
                elapsed = await supervisor_cancel(sessions[name], SETTLE_S)
                if round_ >= 5:
                    times[name].append(elapsed)
                # The store writes the cancel's events, and does what that write left it
                # (the search index, a checkpoint: Backend.settle), before the other side's
                # cancel: one side's store work never falls inside the other's measurement.
                # (A read runs on the store's thread after the settle in progress.)
                await store.flushed()
                await store.sessions()
    result: dict[str, Any] = {}
    for name, values in times.items():
        result[f"cancel_{name}_p50_ms"] = percentile(values, 0.5) * 1000
        result[f"cancel_{name}_p99_ms"] = percentile(values, 0.99) * 1000
    result["cancel_ratio_p50"] = result["cancel_on_p50_ms"] / result["cancel_off_p50_ms"]
    result["cancel_ratio_p99"] = result["cancel_on_p99_ms"] / result["cancel_off_p99_ms"]
    return result


async def throughput(words: int, repeats: int, directory: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for index in range(repeats):
        url = f"sqlite:///{directory / f'flood-{index}.db'}"
        for name in ["off", "on"] if index % 2 == 0 else ["on", "off"]:  # (each first in turn)
            store = url if name == "on" else None
            runs[name].append(await run_ours(1, words, RECEIVERS, memory=False, store=store))
    result: dict[str, Any] = {}
    for name, values in runs.items():
        result[f"events_per_s_{name}"] = statistics.median(v["events_per_s"] for v in values)
        result[f"us_per_event_{name}"] = statistics.median(v["server_us_per_event"] for v in values)
        result[f"lost_{name}"] = max(v["lost"] for v in values)
    result["throughput_ratio"] = result["events_per_s_on"] / result["events_per_s_off"]
    return result


def backend_rate(backend: Backend, batch: int, total: int = 200_000) -> float:
    backend.open()
    session = StoredSession(
        id="s1",
        agent="a",
        protocol="acp",
        host=None,
        cwd="/",
        mcp_servers="[]",
        agent_session_id=None,
        created=0.0,
        last_active=0.0,
        state="running",
    )
    payload = b'{"event":"message.delta","session_id":"s1","seq":%d,"timestamp":1.0,' + (
        b'"data":{"turn_id":"t1","text":"word ","role":"assistant"}}'
    )
    seq = 0
    start = time.perf_counter()
    while seq < total:
        rows = [
            EventRun(
                session_id="s1",
                first_seq=seq + 1,
                payloads=[payload % n for n in range(seq + 1, seq + batch + 1)],
            )
        ]
        if backend.write(Batch(sessions=[session], events=rows)):
            backend.settle(idle=False)  # (as the store's writer does: a checkpoint too)
        seq += batch
    elapsed = time.perf_counter() - start
    backend.close()
    return total / elapsed


def postgresql_rates() -> dict[str, Any]:
    """PostgreSQL's write rate as :func:`backend_rate` measures SQLite's, on a throwaway
    cluster; ``postgresql_skipped``: why not, when this machine has no server to start."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pg import start_postgresql, why_not

    reason = why_not()
    if reason is not None:
        return {"postgresql_skipped": reason}
    cluster = start_postgresql()
    server = next(cluster)
    try:
        result: dict[str, Any] = {}
        for batch in (100, 1000):
            backend = backend_for(server.database())
            assert backend is not None
            result[f"postgresql_events_per_s_batch_{batch}"] = backend_rate(backend, batch)
        return result
    finally:
        cluster.close()


async def restart(directory: Path, sessions: int, events: int) -> dict[str, Any]:
    path = directory / "restart.db"
    backend = SqliteBackend(path)
    backend.open()
    payload = b'{"event":"message.delta","session_id":"s%d","seq":%d,"timestamp":1.0,' + (
        b'"data":{"turn_id":"t1","text":"word ","role":"assistant"}}'
    )
    for number in range(1, sessions + 1):
        row = StoredSession(
            id=f"s{number}",
            agent="demo",
            protocol="acp",
            host=None,
            cwd="/",
            mcp_servers="[]",
            agent_session_id="own",
            created=1.0,
            last_active=float(number),
            state="running",
            open_turn_id="t1" if number % 10 == 0 else None,
        )
        runs = [
            EventRun(
                session_id=row.id,
                first_seq=first,
                payloads=[payload % (number, n) for n in range(first, first + 1000)],
            )
            for first in range(1, events + 1, 1000)
        ]
        if backend.write(Batch(sessions=[row], events=runs)):
            backend.settle(idle=False)
    backend.close()
    start = time.perf_counter()
    store = SessionStore(SqliteBackend(path))
    listed = await store.open()
    ready = time.perf_counter() - start
    start = time.perf_counter()
    replayed = await store.events(f"s{sessions // 2}", 0, 10**9)
    replay = time.perf_counter() - start
    await trio.to_thread.run_sync(store.backend.close)
    assert len(listed) == sessions
    return {
        "restart_sessions": sessions,
        "restart_events": sessions * events,
        "restart_file_mb": path.stat().st_size / 2**20,
        "restart_ready_ms": ready * 1000,
        "restart_replay_one_session_ms": replay * 1000,
        "restart_replayed_events": len(replayed),
    }


async def main(rounds: int, words: int, repeats: int, sessions: int, events: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-store-") as name:
        directory = Path(name)
        result = {"rounds": rounds, "words": words, "repeats": repeats}
        result.update(await cancels(rounds, directory))
        result.update(await throughput(words, repeats, directory))
        for batch in (100, 1000):
            sqlite = SqliteBackend(directory / f"rate-{batch}.db")
            result[f"sqlite_events_per_s_batch_{batch}"] = backend_rate(sqlite, batch)
        result.update(postgresql_rates())
        result.update(await restart(directory, sessions, events))
    return result


def report(f: dict[str, Any]) -> None:
    print(
        f"cancel p50 off {f['cancel_off_p50_ms']:.3f} ms, on {f['cancel_on_p50_ms']:.3f} ms"
        f" (ratio {f['cancel_ratio_p50']:.3f}); p99 off {f['cancel_off_p99_ms']:.3f}, on"
        f" {f['cancel_on_p99_ms']:.3f} (ratio {f['cancel_ratio_p99']:.3f})"
    )
    print(
        f"throughput, 1 subscriber: off {f['events_per_s_off']:,.0f} events/s, on"
        f" {f['events_per_s_on']:,.0f} (ratio {f['throughput_ratio']:.3f}, target >= 0.9);"
        f" server CPU per event off {f['us_per_event_off']:.2f} us, on"
        f" {f['us_per_event_on']:.2f} us"
    )
    print(
        f"SQLite backend alone: {f['sqlite_events_per_s_batch_100']:,.0f} events/s in batches"
        f" of 100, {f['sqlite_events_per_s_batch_1000']:,.0f} in batches of 1,000"
    )
    if "postgresql_skipped" in f:
        print(f"PostgreSQL backend: not measured ({f['postgresql_skipped']})")
    else:
        print(
            f"PostgreSQL backend alone: {f['postgresql_events_per_s_batch_100']:,.0f} events/s"
            f" in batches of 100, {f['postgresql_events_per_s_batch_1000']:,.0f} in batches"
            " of 1,000"
        )
    print(
        f"restart: {f['restart_sessions']} sessions, {f['restart_events']:,} events"
        f" ({f['restart_file_mb']:.0f} MB): ready in {f['restart_ready_ms']:.1f} ms, one"
        f" session's replay {f['restart_replay_one_session_ms']:.1f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--words", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--events", type=int, default=1000, help="per session, a multiple of 1000")
    parser.add_argument("--json", action="store_true", help="the figures as one JSON line too")
    args = parser.parse_args()
    figures = trio.run(main, args.rounds, args.words, args.repeats, args.sessions, args.events)
    if args.json:
        report(figures)
        print(json.dumps(figures))
    else:
        json.dump(figures, sys.stdout, indent=1)
        print()
