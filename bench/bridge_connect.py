"""Benchmark: how long ``node --bridge`` takes to say hello, with the node already running.

Every connection a front opens to a host runs the bridge once, so its start is paid on every
connect and reconnect. Two entries, interleaved run by run:

- ``python -m supervisor node --bridge``: the console script's path, the standard library only
  (``supervisor/node/bridge.py``);
- ``python -m supervisor.cli node --bridge``: through the whole CLI (trio, attrs, cattrs, ...),
  as every bridge did before.

The first run starts the node (not counted). No SSH: add the transport's login to both (about
0.2 s over loopback SSH). Usage: ``python -m bench.bridge_connect [--runs 10]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRIES = {"stdlib bridge": "supervisor", "whole CLI": "supervisor.cli"}


def hello_ms(module: str, state: Path) -> float:
    argv = [sys.executable, "-m", module, "node", "--bridge", "--detach", "5"]
    argv += ["--state-dir", str(state)]
    bridge = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert bridge.stdin is not None and bridge.stdout is not None
    started = time.perf_counter()
    line = bridge.stdout.readline()
    elapsed = (time.perf_counter() - started) * 1000
    bridge.stdin.close()
    bridge.wait()
    assert b"agent_supervisor_node" in line, line
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in ENTRIES}
    with tempfile.TemporaryDirectory() as directory:
        state = Path(directory)
        first = hello_ms("supervisor", state)  # starts the node
        for _ in range(args.runs):
            for name, module in ENTRIES.items():
                times[name].append(hello_ms(module, state))
    figures = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"bridge to hello, node running, {args.runs} runs (p50; the first, starting it:"
        f" {first:.0f} ms):"
    )
    for name, value in figures.items():
        print(
            f"  {name:<14} {value:6.0f} ms   (min {min(times[name]):.0f}, max {max(times[name]):.0f})"
        )
    if args.json:
        print(json.dumps({"first_ms": first, **{f"{k}_p50_ms": v for k, v in figures.items()}}))


if __name__ == "__main__":
    main()
