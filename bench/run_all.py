"""Run every benchmark, side by side with its baseline, and write ``bench/results.md``.

Each benchmark runs in its own interpreter and prints its figures as a JSON line (``--json``);
this collects them into one table a reader can trust: the ratios are measured in the same run,
the absolute times are reported but are only this machine's. ``--only NAME`` runs one of them
again and replaces its section, keeping the others.

``--compare REV`` also runs the headline benchmarks on a checkout of another revision (``git
archive REV``, in a temporary folder, with this interpreter), each right before this tree's run
of the same benchmark, and puts the two side by side at the top ("Before and after"): a change's
cost, measured on one machine in one sitting, not against figures of another day.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.machine import free_cpu

HERE = Path(__file__).parent
BENCHMARKS = [
    ("cancel_overhead", ["--rounds", "200"]),
    ("transport_floor", ["--rounds", "200"]),
    ("wedged_agent", ["--rounds", "20"]),
    ("peer_claude", ["--rounds", "100", "--wedged-rounds", "3"]),
    ("peer_acp", ["--rounds", "100", "--wedged-rounds", "3"]),
    ("throughput", ["--words", "20000", "--repeats", "5"]),
    ("fairness", ["--k", "0,10,100,300", "--rounds", "200"]),
    ("session_cost", ["--sessions", "40", "--cycles", "5", "--rounds", "30"]),
    ("scale", []),
    ("remote_cancel", ["--rounds", "50"]),
    ("remote_fairness", ["--k", "0,10,50", "--rounds", "100"]),
    ("metrics_cost", ["--rounds", "200", "--words", "100000", "--repeats", "7"]),
    # ~100 s here: the 1,000-session restart is 1 million events (10 million: ``--events
    # 10000``, minutes, a 1.3 GB file), the throughput runs interleaved 15 times each way,
    # the K=100 flood ~80 s (a supervisor and 101 agents started for each of 12 blocks).
    (
        "store_cost",
        ["--rounds", "600", "--words", "100000", "--repeats", "15"]
        + ["--flooders", "100", "--fair-rounds", "100", "--events", "10000"],
    ),
    ("store_turn_end", ["--backends", "postgresql,sqlite", "--words", "100000", "--repeats", "15"]),
    ("checkpoint_snapshot", ["--files", "10000", "--changed", "3", "--repeats", "30"]),
    # minutes on a slow disk: making and deleting 100,000 files, and a first snapshot of them
    ("checkpoint_snapshot_100k", ["--repeats", "5", "--first-turns", "1"]),
    ("terminal_cost", ["--mb", "2", "--repeats", "5"]),
]


#: What "Before and after" shows: the figures the targets are set on, by benchmark.
HEADLINES: dict[str, list[tuple[str, str]]] = {
    "transport_floor": [
        ("ratio_floor_trio_p50", "cancel vs the trio floor, p50 (ratio; target <= 1.5)"),
        ("light_cpu_p50_ms", "cancel: this process's CPU, p50 (ms)"),
    ],
    "cancel_overhead": [
        ("overhead_p50_ms", "cancel overhead over the agent's own stop, p50 (ms; <= 1)"),
        ("overhead_p99_ms", "cancel overhead, p99 (ms; <= 5)"),
    ],
    "throughput": [
        ("ratio_1sub", "events/s vs the floor, 1 subscriber (ratio; >= 0.8)"),
        ("ours_1sub_server_us_per_event", "server CPU per event, 1 subscriber (us; <= 15)"),
        ("ratio_10sub", "events/s vs the floor, 10 subscribers (ratio; >= 0.8)"),
    ],
    "fairness": [
        ("k100_delivery_p99_ms", "K=100: interrupt delivery p99 (ms; <= 3)"),
        ("k100_receipt_p99_ms", "K=100: receipt p99 (ms; <= 10)"),
        ("k300_receipt_p99_ms", "K=300: receipt p99 (ms; <= 25)"),
    ],
    "session_cost": [
        ("cgroup_light_owned_per_session_mb", "supervisor-owned memory per session (MB; <= 1)"),
    ],
    "store_cost": [
        ("cancel_ratio_p50", "cancel p50, store on/off (ratio; within 5 %)"),
        ("cancel_ratio_p99", "cancel p99, store on/off (ratio; within 5 %)"),
        ("throughput_ratio", "events/s, 1 subscriber, store on/off (ratio; >= 0.9)"),
        ("fair_sqlite_receipt_p99_ratio", "K=100 flood: receipt p99, SQLite on/off (ratio)"),
        ("fair_off_halves_receipt_p99_ratio", "K=100 flood: receipt p99, off/off (the noise)"),
        ("fair_sqlite_delivery_p99_ratio", "K=100 flood: delivery p99, SQLite on/off (ratio)"),
        ("fair_sqlite_word_p50_ms", "K=100 flood: a quiet session's first word, SQLite, p50 (ms)"),
        ("fair_sqlite_word_p99_ms", "K=100 flood: that first word, p99 (ms)"),
        ("fair_sqlite_written_per_s", "K=100 flood: events/s SQLite wrote"),
        ("fair_postgresql_written_per_s", "K=100 flood: events/s PostgreSQL wrote"),
    ],
    "store_turn_end": [
        ("postgresql_long_p50_ms", "a turn's end, 100,000-word answer, PostgreSQL write p50 (ms)"),
        ("postgresql_write_ratio_p50", "that write vs a one-word answer's, p50 (ratio)"),
    ],
    "checkpoint_snapshot": [
        ("snapshot_p50_ms", "a turn's snapshot, 10,000 files, 3 changed, p50 (ms; <= 20)"),
        ("p50_ratio", "that snapshot vs git add -A && git write-tree, p50 (ratio)"),
        ("first_ratio", "first snapshot vs the same floor (ratio; <= 2)"),
        ("first_turn_wait_p50_ms", "a new session's first turn's start, prompt 1 s in (ms)"),
    ],
    "metrics_cost": [
        ("cancel_sup_ratio_p50", "cancel p50, metrics on/off (ratio; within 3 %)"),
        ("throughput_ratio", "events/s, metrics on/off (ratio; within 3 %)"),
    ],
}


def run(name: str, args: list[str], root: Path = HERE.parent) -> tuple[dict[str, object], str]:
    command = [sys.executable, "-m", f"bench.{name}", "--json", *args]
    env = {**os.environ, "PYTHONPATH": os.fspath(root)}
    result = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, check=True, timeout=1800
    )
    lines = result.stdout.strip().splitlines()
    figures = next(json.loads(line) for line in reversed(lines) if line.startswith("{"))
    text = "\n".join(line for line in lines if not line.startswith("{"))
    return figures, text


def section(name: str, figures: dict[str, object], text: str, load: str) -> list[str]:
    body = [f"## {name}", "", "```", text, "```", "", load, ""]
    body += ["| figure | value |", "|---|---|"]
    for key, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        body.append(f"| {key} | {shown} |")
    body.append("")
    return body


def checkout(revision: str, folder: Path) -> Path:
    """``revision``'s files in ``folder`` (no ``.git``: only what ``git archive`` gives)."""
    archive = subprocess.run(
        ["git", "archive", revision], cwd=HERE.parent, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", os.fspath(folder)], input=archive.stdout, check=True)
    return folder


def compared(
    revision: str, runs: dict[str, tuple[dict[str, object], dict[str, object]]]
) -> list[str]:
    """The "Before and after" section: each headline figure of ``revision`` and of this tree."""
    lines = [
        "## Before and after",
        "",
        f"Each benchmark below ran on `{revision}` and then on this tree, one right after the"
        " other, in this `make bench`.",
        "",
        f"| figure | `{revision}` | this tree |",
        "|---|---|---|",
    ]
    for name, (before, after) in runs.items():
        for key, label in HEADLINES[name]:
            old, new = before.get(key), after.get(key)
            shown = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in (old, new)]
            lines.append(f"| {name}: {label} | {shown[0]} | {shown[1]} |")
    return [*lines, ""]


def main() -> None:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    base = sys.argv[sys.argv.index("--compare") + 1] if "--compare" in sys.argv else None
    folder = tempfile.TemporaryDirectory(prefix="bench-base-") if base else None
    base_root = checkout(base, Path(folder.name)) if base and folder else None
    sections = []
    runs: dict[str, tuple[dict[str, object], dict[str, object]]] = {}
    for name, args in BENCHMARKS:
        if only is not None and name != only:
            continue
        base_figures: dict[str, object] | None = None
        if (
            base_root is not None
            and name in HEADLINES
            and (base_root / "bench" / f"{name}.py").exists()
        ):
            print(f"running bench/{name}.py on {base} ...", flush=True)
            base_figures, _ = run(name, args, base_root)
        print(f"running bench/{name}.py ...", flush=True)
        before, free = os.getloadavg()[0], free_cpu()
        figures, text = run(name, args)
        if base_figures is not None:
            runs[name] = (base_figures, figures)
        load = (
            f"Machine just before: load average (1 min) {before:.2f}, a busy loop got"
            f" {free:.0%} of a core."
        )
        print(text, flush=True)
        sections.append((name, figures, text, load))
    header = [
        "# Benchmark results",
        "",
        f"Written by `make bench` on {datetime.date.today()}: {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, {platform.system()} {platform.release()}.",
        "Ratios are measured side by side in the same run; absolute times are this machine's.",
        "Each section says how busy the machine was just before it: anything else running shows",
        "there (both sides of a ratio share the same conditions; absolute figures do not).",
        "",
    ]
    if only is not None:
        # One benchmark again (``--only NAME``): its section replaced (or added), the rest kept.
        results = (HERE / "results.md").read_text()
        name, figures, text, load = sections[0]
        new = "\n".join(section(name, figures, text, load))
        start = results.find(f"## {name}\n")
        if start < 0:
            results = results.rstrip("\n") + "\n\n" + new
        else:
            end = results.find("\n## ", start + 1)
            results = results[:start] + new + (results[end:] if end >= 0 else "\n")
        (HERE / "results.md").write_text(results)
        print(f"updated {name} in {HERE / 'results.md'}")
        return
    body = compared(base, runs) if base and runs else []
    for name, figures, text, load in sections:
        body += section(name, figures, text, load)
    (HERE / "results.md").write_text("\n".join(header + body))
    if folder is not None:
        folder.cleanup()
    print(f"wrote {HERE / 'results.md'}")


if __name__ == "__main__":
    main()
