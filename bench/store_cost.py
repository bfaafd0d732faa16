"""What the session store costs: store off beside store on (SQLite in a temporary directory),
interleaved in one run.

- **cancel**: p50/p99 of ``Session.cancel()`` on a light agent streaming a turn (as
  ``bench/transport_floor.py``'s "light" row: ``bench/cancel_overhead.py``'s
  ``supervisor_cancel``), ``--rounds`` cancels each way, in ``CANCEL_BLOCKS`` blocks of new
  sessions (new agents), pooled; the range of the blocks' own p50 ratios beside;
- **throughput**: one WebSocket subscriber, the light agent flooding ``--words`` one-word
  deltas (``bench/throughput.py``'s "ours"), ``--repeats`` pairs of runs, off and on back to
  back; the median of the pairs' ratios (and their range), each side's median events/s and
  the server's CPU per event (the store's writer process included). 100,000 words (~0.5 s) by
  default: a rate, in which the stream's start and end, where a store adds a write's latency
  (the first events wait for a batch, the last for the write after the turn's end:
  ``bench/store_turn_end.py``), weigh ~1 %; over 20,000 words, 5-8 %;
- **backend**: events/s the SQLite backend writes alone, in batches of 100 and of 1,000
  events of ~120 bytes (one transaction each, one session's run); the same for PostgreSQL on
  a throwaway cluster (``tests/pg.py``, as ``bench/store_write.py`` starts it) when this
  machine has one (``scripts/ensure-postgresql.sh``), else one line says why not;
- **flood**: ``bench/fairness.py``'s K=100 level (``--flooders``): a quiet session's cancels
  (``--fair-rounds`` of them each way) while K sessions flood, store off beside store on (SQLite,
  and PostgreSQL when the machine has one), in ``FAIR_BLOCKS`` blocks a side, the sides taking
  turns, each block a supervisor (and a store) of its own, one flooding at a time. Per side:
  receipt and interrupt delivery p50/p99, the time from the quiet prompt to its first word seen
  by its subscriber (with the store, once written), the flood the supervisor absorbed (events/s
  over the flooders), its CPU per event and cyclic-GC pauses, over the block (its rounds, and
  the flood alone until ``FAIR_BLOCK_S``); with the store, the events it
  wrote per second over the same window (``SessionStore.written``), the most that waited
  unwritten (the writer's count, read every ``BACKLOG_EVERY_S``), how often sessions were held
  back for it (``Fanout.store_holds``), and how long after the flood's cancel all was written.
  Ratios store on/off, and off/off (its odd blocks against its even ones: the noise). Left out:
  the sessions' start, the flood's start and stop (not timed), subscribers of the flood (none);
- **restart**: a store of ``--sessions`` sessions of ``--events`` events each (one in ten with
  a turn left running), opened as a restarted ``serve`` opens it: the open, the running turns
  ended, the sessions listed; then one session's whole history read for a replay.

The process runs with ``serve``'s collector policy (``apply_gc_policy``), every side alike: the
supervisor as ``serve`` runs it. The store's batches are written as ``serve`` writes them, by
its writer process (``supervisor/store/writer_process.py``), whose CPU is counted in the
server's.

Usage: ``python -m bench.store_cost [--rounds 200] [--words 100000] [--repeats 5]
[--sessions 1000] [--events 1000] [--flooders 100] [--fair-rounds 100] [--json]`` (``--events 10000``: 10 million events, a 1.3 GB
file; ``--json``: a summary and the figures on one line, as ``bench/run_all.py`` reads them).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench import fairness
from bench.cancel_overhead import percentile, supervisor_cancel
from bench.machine import load_average, raise_fd_limit
from bench.throughput import run_ours, writer_cpu_seconds
from bench.transport_floor import LIGHT_AGENT, SETTLE_S
from supervisor import AgentSpec, open_supervisor
from supervisor.store.backend import Backend, Batch, EventRun, StoredSession
from supervisor.store.sqlite import SqliteBackend
from supervisor.store.url import backend_for
from supervisor.store.writer import SessionStore
from supervisor.supervisor import apply_gc_policy

#: receiver processes for the throughput runs (one subscriber needs one)
RECEIVERS = 1
#: The cancels are split in this many blocks, each with a new session (a new agent process)
#: a side, and pooled: where the kernel runs a side's agent beside the supervisor moves that
#: side's p50 by up to 5 % for as long as the agent lives (store off on both sides, one agent
#: each for 300 rounds: 0.95-1.05 between runs), noise a single agent a side would report as
#: the store's.
CANCEL_BLOCKS = 6
#: rounds of each block's new sessions before its measured ones (each side's agent warm)
CANCEL_WARM_UP = 5
#: The flood section: its sessions flooding at once (fairness is promised at K=100) and the
#: quiet session's measured cancels per side, split in blocks, the sides taking turns (each
#: first in turn): a drift of the machine falls on every side, and two blocks of one side
#: measure the noise a ratio between sides is to be read against.
FLOODERS = 100
FAIR_ROUNDS = 100
FAIR_BLOCKS = 4
#: quiet rounds at the start of each block, not measured: the flood (and the store's batches)
#: in their stride
FAIR_WARM_UP = 3
#: a block's flood measured for at least this long (its rounds, then the flood alone): the
#: flood rate, CPU and collections of every side over windows alike, though a store-on
#: side's rounds take longer (each waits for its first word to be written)
FAIR_BLOCK_S = 2.0
#: how often the store's backlog (events recorded and not yet written) is read in a block;
#: every side runs the same reader, so the wake-ups it costs fall on all of them
BACKLOG_EVERY_S = 0.005


async def cancels(rounds: int, directory: Path) -> dict[str, Any]:
    spec = AgentSpec(name="light", protocol="acp", command=LIGHT_AGENT)
    times: dict[str, list[float]] = {"off": [], "on": []}
    block_ratios: list[float] = []
    url = f"sqlite:///{directory / 'cancel.db'}"
    async with (
        open_supervisor(agents={"light": spec}) as off,
        open_supervisor(agents={"light": spec}, store=url) as on,
    ):
        supervisors = {"off": off, "on": on}
        store = on.store
        assert store is not None
        for block in range(CANCEL_BLOCKS):
            sessions = {
                name: await sup.start_session("light", cwd="/") for name, sup in supervisors.items()
            }
            measured = rounds // CANCEL_BLOCKS + (block < rounds % CANCEL_BLOCKS)
            block_times: dict[str, list[float]] = {"off": [], "on": []}
            for round_ in range(CANCEL_WARM_UP + measured):
                # Each side first in every other round: the second runs in what the first left
                # (a side's cancel in second place measures ~1-2 % faster, store off on both).
                order = ["off", "on"] if round_ % 2 == 0 else ["on", "off"]
                for name in order:
                    elapsed = await supervisor_cancel(sessions[name], SETTLE_S)
                    if round_ >= CANCEL_WARM_UP:
                        block_times[name].append(elapsed)
                    # The store writes the cancel's events, and does what that write left it
                    # (a checkpoint: Backend.settle), before the other side's cancel: one
                    # side's store work never falls inside the other's measurement. (A read
                    # runs on the store's thread after the settle in progress.)
                    await store.flushed()
                    await store.sessions()
            for name, session in sessions.items():
                times[name] += block_times[name]
                await session.stop()
            block_ratios.append(
                percentile(block_times["on"], 0.5) / percentile(block_times["off"], 0.5)
            )
    result: dict[str, Any] = {}
    for name, values in times.items():
        result[f"cancel_{name}_p50_ms"] = percentile(values, 0.5) * 1000
        result[f"cancel_{name}_p99_ms"] = percentile(values, 0.99) * 1000
    result["cancel_ratio_p50"] = result["cancel_on_p50_ms"] / result["cancel_off_p50_ms"]
    result["cancel_ratio_p99"] = result["cancel_on_p99_ms"] / result["cancel_off_p99_ms"]
    result["cancel_blocks"] = CANCEL_BLOCKS
    result["cancel_block_ratio_p50_min"] = min(block_ratios)
    result["cancel_block_ratio_p50_max"] = max(block_ratios)
    return result


async def throughput(words: int, repeats: int, directory: Path) -> dict[str, Any]:
    """``repeats`` pairs of runs, off and on back to back (each first in turn). The ratio
    read against the target is the median of the pairs' own ratios: this machine's speed
    moves by a fifth within seconds, and a pair's two runs share its phase, where the median
    of each side's runs compares runs of different phases (given beside)."""
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
    pairs = [
        on["events_per_s"] / off["events_per_s"]
        for off, on in zip(runs["off"], runs["on"], strict=True)
    ]
    result["throughput_ratio"] = statistics.median(pairs)
    result["throughput_ratio_min"] = min(pairs)
    result["throughput_ratio_max"] = max(pairs)
    result["throughput_ratio_of_medians"] = result["events_per_s_on"] / result["events_per_s_off"]
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


@contextlib.contextmanager
def throwaway_postgresql() -> Iterator[tuple[Any, str | None]]:
    """A throwaway PostgreSQL cluster (``tests/pg.py``'s ``PostgresServer``), or None and why
    this machine has no server to start."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pg import start_postgresql, why_not

    reason = why_not()
    if reason is not None:
        yield None, reason
        return
    cluster = start_postgresql()
    try:
        yield next(cluster), None
    finally:
        cluster.close()


def postgresql_rates(server: Any) -> dict[str, Any]:
    """PostgreSQL's write rate as :func:`backend_rate` measures SQLite's (``server``: a
    :func:`throwaway_postgresql`'s)."""
    result: dict[str, Any] = {}
    for batch in (100, 1000):
        backend = backend_for(server.database())
        assert backend is not None
        result[f"postgresql_events_per_s_batch_{batch}"] = backend_rate(backend, batch)
    return result


@dataclass
class FloodSide:
    """One side of the flood section (store off, or on with a backend): what its blocks
    measured."""

    name: str
    receipts: list[list[float]] = field(default_factory=list)  # (a block's, in seconds)
    deliveries: list[list[float]] = field(default_factory=list)
    words: list[float] = field(default_factory=list)
    blocks: list[dict[str, float]] = field(default_factory=list)


async def flood_block(
    side: FloodSide,
    url: str | None,
    flooders: int,
    rounds: int,
    directory: Path,
    collections: fairness.GcPauses,
) -> None:
    """One block of ``side``: a supervisor of its own (its store at ``url``, a new one), the
    quiet session and ``flooders`` flooding ones; ``rounds`` of the quiet session's cancels
    while they flood, then the flood stopped, and (store on) the time until all of it is
    written. The supervisor is closed and the collector run before the next block: nothing
    of this block falls in another's."""
    log_path = directory / f"fair-{side.name}-{len(side.blocks)}.log"
    log = fairness.CancelLog(log_path)
    async with open_supervisor(agents=fairness.agents(log_path), store=url) as sup:
        store = sup.store
        quiet = await sup.start_session("quiet", cwd="/")
        flooding = await fairness.start_flooders(sup, flooders)
        sessions = [quiet, *flooding]
        for _ in range(fairness.WARM_UP_ROUNDS):
            await fairness.quiet_round(quiet, log)
        await fairness.flood(flooding)
        for _ in range(FAIR_WARM_UP):
            await fairness.quiet_round(quiet, log)
        peak = 0

        async def backlog() -> None:
            nonlocal peak
            while True:
                if store is not None:
                    peak = max(peak, store._count)  # (read only: the writer's own count)
                await trio.sleep(BACKLOG_EVERY_S)

        absorbed = sum(f.last_seq for f in flooding)
        recorded = sum(f.last_seq for f in sessions)
        holds = sum(f.fanout.store_holds for f in sessions)
        written = store.written if store is not None else 0
        collections.take()
        wall, cpu = time.monotonic(), time.process_time() + writer_cpu_seconds(sup)
        receipts, deliveries = [], []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(backlog)
            for _ in range(rounds):
                receipt, delivery = await fairness.quiet_round(quiet, log, side.words)
                receipts.append(receipt)
                deliveries.append(delivery)
            await trio.sleep(max(0.0, wall + FAIR_BLOCK_S - time.monotonic()))
            nursery.cancel_scope.cancel()
        span = time.monotonic() - wall
        block = {
            "span_s": span,
            "cpu_s": time.process_time() + writer_cpu_seconds(sup) - cpu,
            "absorbed": sum(f.last_seq for f in flooding) - absorbed,
            **collections.figures(span),
        }
        if store is not None:
            block["recorded"] = sum(f.last_seq for f in sessions) - recorded
            block["written"] = store.written - written
            block["backlog_peak"] = peak
            block["backlog_end"] = store._count
            block["holds"] = sum(f.fanout.store_holds for f in sessions) - holds
            await fairness.stop_flooding(flooding)
            began = time.monotonic()
            await store.flushed()
            block["drain_s"] = time.monotonic() - began
        # Stopping the sessions at the exit is not part of any figure.
    gc.collect()
    side.receipts.append(receipts)
    side.deliveries.append(deliveries)
    side.blocks.append(block)


def side_figures(side: FloodSide) -> dict[str, Any]:
    """A side's figures over all its blocks, and over each half of them (even and odd
    blocks: what two runs of the same side differ by)."""
    result: dict[str, Any] = {}
    halves = {"": range(len(side.blocks)), "_a": range(0, len(side.blocks), 2)}
    halves["_b"] = range(1, len(side.blocks), 2)
    for half, indices in halves.items():
        receipts = [t for i in indices for t in side.receipts[i]]
        deliveries = [t for i in indices for t in side.deliveries[i]]
        blocks = [side.blocks[i] for i in indices]
        span = sum(b["span_s"] for b in blocks)
        absorbed = sum(b["absorbed"] for b in blocks)
        for name, values in (("receipt", receipts), ("delivery", deliveries)):
            for label, fraction in (("p50", 0.5), ("p99", 0.99)):
                result[f"{name}_{label}_ms{half}"] = percentile(values, fraction) * 1000
        result[f"flood_events_per_s{half}"] = absorbed / span
        if half:
            continue
        result["word_p50_ms"] = percentile(side.words, 0.5) * 1000
        result["word_p99_ms"] = percentile(side.words, 0.99) * 1000
        result["cpu_share"] = sum(b["cpu_s"] for b in blocks) / span
        result["cpu_us_per_event"] = sum(b["cpu_s"] for b in blocks) / absorbed * 1e6
        result["gc_share"] = sum(b["gc_share"] * b["span_s"] for b in blocks) / span
        result["gc_full_collections"] = sum(b["gc_full_collections"] for b in blocks)
        result["gc_longest_ms"] = max(b["gc_longest_ms"] for b in blocks)
        if "written" in blocks[0]:
            written = sum(b["written"] for b in blocks)
            result["written_per_s"] = written / span
            result["written_of_recorded"] = written / sum(b["recorded"] for b in blocks)
            result["backlog_peak"] = max(b["backlog_peak"] for b in blocks)
            result["backlog_end_max"] = max(b["backlog_end"] for b in blocks)
            result["holds"] = sum(b["holds"] for b in blocks)
            result["drain_ms_max"] = max(b["drain_s"] for b in blocks) * 1000
    return result


async def flood_fairness(
    flooders: int, rounds: int, directory: Path, postgresql: Any
) -> dict[str, Any]:
    """``bench/fairness.py``'s K=``flooders`` level, store off beside store on (SQLite in
    ``directory``; PostgreSQL too when ``postgresql`` is a server): ``rounds`` cancels per
    side in ``FAIR_BLOCKS`` blocks, the sides taking turns, one flooding at a time."""
    stores: dict[str, Callable[[int], str | None]] = {
        "off": lambda _: None,
        "sqlite": lambda index: f"sqlite:///{directory / f'fair-{index}' / 'store.db'}",
    }
    if postgresql is not None:
        stores["postgresql"] = lambda _: str(postgresql.database())
    fd_limit = raise_fd_limit()
    collections = fairness.GcPauses()
    sides = [FloodSide(name) for name in stores]
    load = load_average()
    began = time.monotonic()
    per_block = max(1, rounds // FAIR_BLOCKS)
    for index in range(FAIR_BLOCKS):
        (directory / f"fair-{index}").mkdir()
        turn = index % len(sides)
        for side in sides[turn:] + sides[:turn]:
            url = stores[side.name](index)
            await flood_block(side, url, flooders, per_block, directory, collections)
        shutil.rmtree(directory / f"fair-{index}")  # (~120 MB a million events)
    result: dict[str, Any] = {
        "fair_flooders": flooders,
        "fair_rounds": per_block * FAIR_BLOCKS,
        "fair_blocks": FAIR_BLOCKS,
        "fair_fd_limit": fd_limit,
        "fair_load_before": load,
        "fair_load_after": load_average(),
        "fair_seconds": time.monotonic() - began,
        "fair_sides": ",".join(stores),
    }
    figures = {side.name: side_figures(side) for side in sides}
    for name, values in figures.items():
        result.update({f"fair_{name}_{key}": value for key, value in values.items()})
    off = figures["off"]
    keys = [f"{n}_{p}_ms" for n in ("receipt", "delivery") for p in ("p50", "p99")]
    keys.append("flood_events_per_s")
    for key in keys:
        ratio = key.removesuffix("_ms")
        result[f"fair_off_halves_{ratio}_ratio"] = off[f"{key}_b"] / off[f"{key}_a"]
        for name in stores:
            if name != "off":
                result[f"fair_{name}_{ratio}_ratio"] = figures[name][key] / off[key]
    return result


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


async def main(
    rounds: int,
    words: int,
    repeats: int,
    sessions: int,
    events: int,
    flooders: int = FLOODERS,
    fair_rounds: int = FAIR_ROUNDS,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-store-") as name:
        directory = Path(name)
        result: dict[str, Any] = {"rounds": rounds, "words": words, "repeats": repeats}
        result.update(await cancels(rounds, directory))
        result.update(await throughput(words, repeats, directory))
        for batch in (100, 1000):
            sqlite = SqliteBackend(directory / f"rate-{batch}.db")
            result[f"sqlite_events_per_s_batch_{batch}"] = backend_rate(sqlite, batch)
        with throwaway_postgresql() as (server, reason):
            if server is None:
                result["postgresql_skipped"] = reason
            else:
                result.update(postgresql_rates(server))
            if fair_rounds:
                result.update(await flood_fairness(flooders, fair_rounds, directory, server))
        result.update(await restart(directory, sessions, events))
    return result


def report(f: dict[str, Any]) -> None:
    print(
        f"cancel p50 off {f['cancel_off_p50_ms']:.3f} ms, on {f['cancel_on_p50_ms']:.3f} ms"
        f" (ratio {f['cancel_ratio_p50']:.3f}); p99 off {f['cancel_off_p99_ms']:.3f}, on"
        f" {f['cancel_on_p99_ms']:.3f} (ratio {f['cancel_ratio_p99']:.3f}); {f['cancel_blocks']}"
        f" blocks of new sessions, their p50 ratios {f['cancel_block_ratio_p50_min']:.3f}-"
        f"{f['cancel_block_ratio_p50_max']:.3f}"
    )
    print(
        f"throughput, 1 subscriber, {f['repeats']} pairs: on/off {f['throughput_ratio']:.3f}"
        f" (the pairs' median, target >= 0.9; pairs {f['throughput_ratio_min']:.3f}-"
        f"{f['throughput_ratio_max']:.3f}); medians off {f['events_per_s_off']:,.0f} events/s,"
        f" on {f['events_per_s_on']:,.0f} (their ratio {f['throughput_ratio_of_medians']:.3f});"
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
    if "fair_flooders" in f:
        flood_report(f)
    print(
        f"restart: {f['restart_sessions']} sessions, {f['restart_events']:,} events"
        f" ({f['restart_file_mb']:.0f} MB): ready in {f['restart_ready_ms']:.1f} ms, one"
        f" session's replay {f['restart_replay_one_session_ms']:.1f} ms"
    )


def flood_report(f: dict[str, Any]) -> None:
    sides = f["fair_sides"].split(",")
    print(
        f"flood: a quiet session's cancel while K={f['fair_flooders']} sessions flood,"
        f" {f['fair_rounds']} cancels a side in {f['fair_blocks']} blocks, the sides in turn"
        f" ({f['fair_seconds']:.0f} s; load {f['fair_load_before']:.2f} before,"
        f" {f['fair_load_after']:.2f} after)"
    )
    print(
        f"  {'store':<10}  {'receipt p50':>11} {'p99':>6}  {'delivery p50':>12} {'p99':>6}"
        f"  {'first word p50':>14} {'p99':>7}  {'flood events/s':>14}  {'CPU/event':>9}"
        f"  {'GC share, full, longest':>23}"
    )
    for side in sides:
        g = _side_figures(f, side)
        print(
            f"  {side:<10}  {g['receipt_p50_ms']:>8.2f} ms {g['receipt_p99_ms']:>6.2f}"
            f"  {g['delivery_p50_ms']:>9.2f} ms {g['delivery_p99_ms']:>6.2f}"
            f"  {g['word_p50_ms']:>11.2f} ms {g['word_p99_ms']:>7.1f}"
            f"  {g['flood_events_per_s']:>14,.0f}  {g['cpu_us_per_event']:>6.1f} us"
            f"  {g['gc_share']:>9.0%} {g['gc_full_collections']:>4}x {g['gc_longest_ms']:>6.1f} ms"
        )
    names = [("receipt_p50", "receipt p50"), ("receipt_p99", "p99")]
    names += [("delivery_p50", "delivery p50"), ("delivery_p99", "p99")]
    names.append(("flood_events_per_s", "flood events/s"))
    for side in ["off_halves", *sides[1:]]:
        ratios = ", ".join(f"{label} {f[f'fair_{side}_{key}_ratio']:.2f}" for key, label in names)
        what = "off/off (odd blocks/even)" if side == "off_halves" else f"{side} on/off"
        print(f"  {what}: {ratios}")
    for side in sides[1:]:
        g = _side_figures(f, side)
        print(
            f"  {side} wrote {g['written_per_s']:,.0f} events/s during the flood"
            f" ({g['written_of_recorded']:.2f} of those recorded); at most {g['backlog_peak']:,}"
            f" waited unwritten ({g['backlog_end_max']:,} at a block's end), sessions held back"
            f" for it {g['holds']:,} times; all written {g['drain_ms_max']:.0f} ms at most"
            " after the flood's cancel"
        )


def _side_figures(f: dict[str, Any], side: str) -> dict[str, Any]:
    """The flood section's figures of one side (``fair_<side>_...``), by their own names."""
    prefix = f"fair_{side}_"
    return {key[len(prefix) :]: value for key, value in f.items() if key.startswith(prefix)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--words", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--events", type=int, default=1000, help="per session, a multiple of 1000")
    parser.add_argument("--flooders", type=int, default=FLOODERS)
    parser.add_argument("--fair-rounds", type=int, default=FAIR_ROUNDS, help="0: no flood")
    parser.add_argument("--json", action="store_true", help="the figures as one JSON line too")
    args = parser.parse_args()
    apply_gc_policy()
    figures = trio.run(
        main,
        args.rounds,
        args.words,
        args.repeats,
        args.sessions,
        args.events,
        args.flooders,
        args.fair_rounds,
    )
    if args.json:
        report(figures)
        print(json.dumps(figures))
    else:
        json.dump(figures, sys.stdout, indent=1)
        print()
