"""How long ``agent-supervisor serve`` takes from exec to its ``ready`` line.

Runs it ``--runs`` times (each with a fresh state directory, then SIGTERM) and prints the
minimum and the median in milliseconds. Nearly all of it is importing: trio alone is ~40% on
a 2-core machine. Bytecode is compiled first (as an install does), so a run does not measure
the compiler; with ``PYTHONDONTWRITEBYTECODE`` set and no ``__pycache__``, every start would.

    python -m bench.serve_start [--runs 21] [--json]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_once() -> float:
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, AGENT_SUPERVISOR_STATE_DIR=state)
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "serve", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        elapsed = time.perf_counter() - started
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    if not line.startswith(b"ready "):
        raise SystemExit(f"serve did not start: {line!r}")
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for package in ("supervisor", "protocols"):
        compileall.compile_dir(ROOT / package, quiet=1)
    times = [start_once() for _ in range(args.runs)]
    figures = {"serve_ready_min_ms": min(times), "serve_ready_median_ms": statistics.median(times)}
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"serve to its ready line: min {figures['serve_ready_min_ms']:.0f} ms,"
            f" median {figures['serve_ready_median_ms']:.0f} ms ({args.runs} runs)"
        )


if __name__ == "__main__":
    main()
