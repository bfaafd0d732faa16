"""What writing a long answer costs the store, in a batch beside a turn's last events.

A turn's answer (the turn's ``message.delta`` texts joined) is written by the ``Backend.settle``
after the batch of its turn's end, once that batch's events are given to subscribers
(``design/store.md``); the next batch's events wait for it. Each round writes a batch of a
turn's last events, its receipt and its answer for a new session with an answer of
``--words`` distinct words (``w0 w1 ...``, as the light agent streams them) and, interleaved
with it (the order alternating), the floor: the same batch with a one-word answer; the
``settle`` after each is timed apart. Median and p90 of ``--repeats`` rounds, wall time of
the backend's calls; and the CPU the write takes where the database works (PostgreSQL: the
connection's server process, read at the kernel's 10 ms tick, so only its mean over the rounds
means anything; SQLite: this thread), steadier than wall time on a busy machine. PostgreSQL runs on a throwaway
cluster of Debian's PostgreSQL 15 (``tests/pg.py``, fsync off) or on ``--url``; a machine
without one (``scripts/ensure-postgresql.sh``) gets a line that says why not.

    python -m bench.store_turn_end --backends postgresql,sqlite --words 100000 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bench.cancel_overhead import percentile
from bench.store_write import _session, _store
from supervisor.store.backend import Backend, Batch, EventRun, ReceiptRow, TextRow
from supervisor.store.url import backend_for

#: The turn's last events in the batch beside its end: a stream's run of deltas.
_DELTAS = 20


def turn_end(sid: str, answer: str) -> Batch:
    """The batch the writer makes at a turn's end (``SessionStore._batch``)."""
    payloads = [
        b'{"event":"message.delta","session_id":"%s","seq":%d,"turn_id":"t1","text":"w "}'
        % (sid.encode(), seq)
        for seq in range(1, _DELTAS + 1)
    ]
    ended = (
        b'{"event":"turn.ended","session_id":"%s","seq":%d,"turn_id":"t1",'
        b'"outcome":"completed","receipt":{"turn_id":"t1","outcome":"completed"}}'
        % (sid.encode(), _DELTAS + 1)
    )
    return Batch(
        sessions=[_session(sid)],
        events=[EventRun(session_id=sid, first_seq=1, payloads=[*payloads, ended])],
        receipts=[ReceiptRow(session_id=sid, turn_id="t1", seq=_DELTAS + 1, payload=ended)],
        texts=[TextRow(session_id=sid, turn_id="t1", seq=_DELTAS + 1, kind="answer", text=answer)],
    )


def cpu_clock(backend: Backend) -> Callable[[], float]:
    """CPU seconds so far where the backend's database works: PostgreSQL's server process
    for its connection, else this thread (SQLite works in it)."""
    connection = getattr(backend, "_connection", None)
    if connection is None:
        return time.thread_time
    server = psutil.Process(connection.info.backend_pid)

    def used() -> float:
        times = server.cpu_times()
        return float(times.user + times.system)

    return used


def timed(backend: Backend, batch: Batch, cpu: Callable[[], float]) -> tuple[float, float, float]:
    """Seconds of the write (what subscribers wait for), its CPU, and the settle after it."""
    cpu_before = cpu()
    begun = time.perf_counter()
    due = backend.write(batch)
    written = time.perf_counter()
    cpu_s = cpu() - cpu_before
    if due:
        backend.settle(idle=False)
    return written - begun, cpu_s, time.perf_counter() - written


def measure(backend: Backend, words: int, repeats: int) -> dict[str, list[float]]:
    answer = " ".join(f"w{i}" for i in range(words))
    keys = ("floor", "floor_cpu", "floor_settle", "long", "long_cpu", "settle")
    times: dict[str, list[float]] = {key: [] for key in keys}
    cpu = cpu_clock(backend)
    timed(backend, turn_end("warm", answer), cpu)  # (the tables' first pages, the plans)
    for round_ in range(repeats):
        sides = [("floor", "w0"), ("long", answer)]
        for side, text in sides if round_ % 2 == 0 else reversed(sides):
            write_s, cpu_s, settle_s = timed(backend, turn_end(f"{side}{round_}", text), cpu)
            times[side].append(write_s)
            times[f"{side}_cpu"].append(cpu_s)
            times["floor_settle" if side == "floor" else "settle"].append(settle_s)
    return times


def _no_server() -> str | None:
    """Why this machine cannot start a throwaway PostgreSQL (None: it can)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pg import why_not

    reason: str | None = why_not()
    return reason


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="postgresql")
    parser.add_argument("--words", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--url", default=None, help="PostgreSQL: this database, not a new one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, float | int | str] = {"words": args.words, "repeats": args.repeats}
    lines = []
    for name in args.backends.split(","):
        if name == "postgresql" and args.url is None and (reason := _no_server()) is not None:
            lines.append(f"{name:10s} not measured ({reason})")
            figures[f"{name}_skipped"] = reason
            if not args.json:
                print(lines[-1], flush=True)
            continue
        with _store(name, args.url) as url:
            backend = backend_for(url)
            assert backend is not None
            backend.open()
            try:
                times = measure(backend, args.words, args.repeats)
            finally:
                backend.close()
        ms = {key: [t * 1000 for t in values] for key, values in times.items()}
        for key, values in ms.items():
            if key.endswith("_cpu"):
                figures[f"{name}_{key}_mean_ms"] = round(statistics.mean(values), 3)
                continue
            figures[f"{name}_{key}_p50_ms"] = round(statistics.median(values), 3)
            figures[f"{name}_{key}_p90_ms"] = round(percentile(values, 0.9), 3)
        ratio = statistics.median(ms["long"]) / statistics.median(ms["floor"])
        figures[f"{name}_write_ratio_p50"] = round(ratio, 3)
        lines.append(
            f"{name:10s} turn end, {args.words:,}-word answer: write p50"
            f" {statistics.median(ms['long']):.2f} ms (p90 {percentile(ms['long'], 0.9):.2f}),"
            f" floor (one word) p50 {statistics.median(ms['floor']):.2f} ms (ratio"
            f" {ratio:.2f}); its CPU {statistics.mean(ms['long_cpu']):.1f} ms (floor"
            f" {statistics.mean(ms['floor_cpu']):.1f}); settle after it p50"
            f" {statistics.median(ms['settle']):.2f} ms ({args.repeats} interleaved rounds)"
        )
        if not args.json:
            print(lines[-1], flush=True)
    if args.json:
        print("\n".join(lines))
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
