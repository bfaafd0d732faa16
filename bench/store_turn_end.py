"""How long a turn's end with a long answer waits for the store before subscribers get it.

At a turn's end the store's writer writes one batch: the turn's last events, its receipt and
its answer (the turn's ``message.delta`` texts joined); the session's fan-out gives those
events to subscribers once that batch commits, and ``Backend.settle`` runs after that
(``design/store.md``). Each round writes such a batch for a new session with an answer of
``--words`` distinct words (``w0 w1 ...``, as the light agent streams them) and, interleaved
with it (the order alternating), the floor: the same batch with a one-word answer; the
``settle`` after each is timed apart. Median and p90 of ``--repeats`` rounds, wall time of
the backend's calls (the server's work is in another process). PostgreSQL runs on a throwaway
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
from pathlib import Path

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


def timed(backend: Backend, batch: Batch) -> tuple[float, float]:
    """Seconds of the write (what subscribers wait for) and of the settle after it."""
    begun = time.perf_counter()
    due = backend.write(batch)
    written = time.perf_counter()
    if due:
        backend.settle(idle=False)
    return written - begun, time.perf_counter() - written


def measure(backend: Backend, words: int, repeats: int) -> dict[str, list[float]]:
    answer = " ".join(f"w{i}" for i in range(words))
    times: dict[str, list[float]] = {"floor": [], "floor_settle": [], "long": [], "settle": []}
    timed(backend, turn_end("warm", answer))  # (the tables' first pages, the plans)
    for round_ in range(repeats):
        sides = [("floor", "w0"), ("long", answer)]
        for side, text in sides if round_ % 2 == 0 else reversed(sides):
            write_s, settle_s = timed(backend, turn_end(f"{side}{round_}", text))
            times[side].append(write_s)
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
            figures[f"{name}_{key}_p50_ms"] = round(statistics.median(values), 3)
            figures[f"{name}_{key}_p90_ms"] = round(percentile(values, 0.9), 3)
        ratio = statistics.median(ms["long"]) / statistics.median(ms["floor"])
        figures[f"{name}_write_ratio_p50"] = round(ratio, 3)
        lines.append(
            f"{name:10s} turn end, {args.words:,}-word answer: write p50"
            f" {statistics.median(ms['long']):.2f} ms (p90 {percentile(ms['long'], 0.9):.2f}),"
            f" floor (one word) p50 {statistics.median(ms['floor']):.2f} ms (ratio"
            f" {ratio:.2f}); settle after it p50 {statistics.median(ms['settle']):.2f} ms"
            f" ({args.repeats} interleaved rounds)"
        )
        if not args.json:
            print(lines[-1], flush=True)
    if args.json:
        print("\n".join(lines))
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
