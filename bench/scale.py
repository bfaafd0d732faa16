"""Benchmark 5: scale: N concurrent sessions, a prompt and a cancel each, all at once.

Two kinds of agent, each configuration in a fresh interpreter (so memory and descriptors are
that configuration's alone):

- **subprocess** agents, N = 10, 100, 500: ``bench/fake_light_agent.py`` (stdlib ACP agent,
  ``python -S``, ~10 MB) under the containment shim, i.e. two processes per session;
- **in-memory** agents, N = 10, 100, 1000, 10000: ``bench/fake_memory_agent.py``, one trio task
  each: what the session actor itself costs.

Per configuration: start N sessions at once and wait until all are ready; then every session
subscribes and prompts at once, and once every turn has streamed its first word, all N cancels
are fired at once. Reported: receipts/s (N over the span from the burst to the last receipt),
p50/p99 receipt latency (each ``session.cancel()`` call to its receipt), the supervisor's RSS
and open file descriptors per session (idle sessions, and again with the turns running and
subscribed), the agents' own RSS per session (shim + agent, subprocess only), start and
teardown times, and the share of the start and of the burst spent in Python's cyclic garbage
collector (``gc.callbacks``: wall time in collections over the span; and, steadier on a shared
machine, the collector's CPU time over the supervisor's CPU time in the burst), with the
number of full (generation 2) collections in the burst. The supervisor runs under its GC
policy (``apply_gc_policy``; ``--gc-policy off`` runs without it, ``--compare-gc`` runs every
configuration both ways, alternately, and prints the ratios). An outcome other than ``cancelled`` is shown: when the supervisor
cannot get to an agent's answer within the grace window (3 s, counted from when the actor takes
the cancel), the session escalates as it would for a wedged agent. ``RLIMIT_NOFILE`` is raised to its hard limit in each run (500 sessions hold a
few thousand descriptors). Writes ``bench/scale.png`` (matplotlib, Agg): cost against N.

Last line: largest N against smallest, subprocess agents: the ratios of RSS and descriptors per
session (1.0: cost grows linearly with N), of receipts/s and of p99 receipt latency.
Usage: ``python -m bench.scale [--process 10,100,500] [--memory 10,100,1000,10000]
[--gc-policy on|off | --compare-gc]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import trio

from bench.cancel_overhead import percentile
from bench.fake_memory_agent import LeanLauncher
from bench.machine import raise_fd_limit
from supervisor import AgentSpec, Session, open_supervisor

HERE = Path(__file__).resolve().parent
#: Seconds between words after the first: the turns are running, and mostly waiting.
INTERVAL = 10.0
LIGHT_AGENT = [sys.executable, "-S", str(HERE / "fake_light_agent.py"), "--interval", str(INTERVAL)]


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def agents_rss() -> int:
    """Resident memory of every process below us (shims and agents)."""
    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class GcClock:
    """Time spent in Python's cyclic garbage collector (``gc.callbacks``), by phase."""

    def __init__(self) -> None:
        self.total = 0.0  # wall time
        self.cpu = 0.0  # this thread's CPU time: not inflated when the machine preempts us
        self.runs = [0, 0, 0]  # collections by generation; 2 walks every live object
        self._began = (0.0, 0.0)
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = (time.perf_counter(), time.thread_time())
        else:
            self.total += time.perf_counter() - self._began[0]
            self.cpu += time.thread_time() - self._began[1]
            self.runs[info["generation"]] += 1

    def read(self) -> tuple[float, float, list[int]]:
        return self.total, self.cpu, list(self.runs)


async def one(kind: str, n: int, gc_policy: bool = True) -> dict[str, Any]:
    fd_limit = raise_fd_limit()
    gc_clock = GcClock()
    if kind == "subprocess":
        spec = AgentSpec(name="light", protocol="acp", command=LIGHT_AGENT)
        launcher = None
    else:
        spec = AgentSpec(name="light", protocol="acp", command=["in-memory"])
        launcher = LeanLauncher(INTERVAL)
    sessions: list[Session] = []
    latencies: list[float] = []
    ends: list[float] = []
    outcomes: dict[str, int] = {}
    all_running = trio.Event()
    go = trio.Event()
    running = 0

    async def start(sup: Any) -> None:
        sessions.append(await sup.start_session("light", cwd="/"))

    async def turn(session: Session) -> None:
        nonlocal running
        async with session.subscribe() as events:
            await session.prompt("go")
            async for event in events:
                if event.kind == "message.delta":
                    break
            running += 1
            if running == n:
                all_running.set()
            await go.wait()
            begin = time.perf_counter()
            receipt = await session.cancel()
            end = time.perf_counter()
        latencies.append(end - begin)
        ends.append(end)
        outcomes[receipt.outcome] = outcomes.get(receipt.outcome, 0) + 1

    async with open_supervisor(
        agents={"light": spec}, launcher=launcher, gc_policy=gc_policy
    ) as sup:
        rss0, fd0 = rss(), fd_count()
        gc0 = gc_clock.read()
        began = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(start, sup)
        start_s = time.perf_counter() - began
        gc1 = gc_clock.read()
        rss1, fd1 = rss(), fd_count()
        agents = agents_rss() if kind == "subprocess" else 0
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(turn, session)
            await all_running.wait()
            rss2, fd2 = rss(), fd_count()
            gc2 = gc_clock.read()
            burst, burst_cpu = time.perf_counter(), time.process_time()
            go.set()
        span = max(ends) - burst
        gc3 = gc_clock.read()
        span_cpu = time.process_time() - burst_cpu
        leaving = time.perf_counter()
    teardown_s = time.perf_counter() - leaving
    return {
        "kind": kind,
        "n": n,
        "gc_policy": gc_policy,
        "fd_limit": fd_limit,
        "outcomes": outcomes,
        "start_s": start_s,
        "receipts_per_s": n / span,
        "burst_span_s": span,
        "receipt_p50_ms": percentile(latencies, 0.5) * 1000,
        "receipt_p99_ms": percentile(latencies, 0.99) * 1000,
        "rss_per_session_kb": (rss1 - rss0) / n / 1024,
        "rss_per_running_session_kb": (rss2 - rss0) / n / 1024,
        "fds_per_session": (fd1 - fd0) / n,
        "fds_per_running_session": (fd2 - fd0) / n,
        "agents_rss_per_session_mb": agents / n / 2**20,
        "supervisor_rss_mb": rss2 / 2**20,
        "teardown_s": teardown_s,
        "gc_share_start": (gc1[0] - gc0[0]) / start_s,
        "gc_share_burst": (gc3[0] - gc2[0]) / span,
        "gc_cpu_share_burst": (gc3[1] - gc2[1]) / span_cpu if span_cpu > 0 else 0.0,
        "gc_runs_burst": [after - before for after, before in zip(gc3[2], gc2[2], strict=True)],
        "gc_full_collections": gc3[2][2] - gc0[2][2] - 2,  # less the 2 rss() asks for between
    }


def run_one(kind: str, n: int, gc_policy: bool = True) -> dict[str, Any]:
    """One configuration in a fresh interpreter."""
    command = [sys.executable, "-m", "bench.scale", "--one", kind, str(n)]
    if not gc_policy:
        command += ["--gc-policy", "off"]
    done = subprocess.run(
        command, cwd=HERE.parent, capture_output=True, text=True, check=True, timeout=600
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter, ScalarFormatter

    panels = [
        ("rss_per_session_kb", "supervisor RSS per idle session (KiB)"),
        ("supervisor_rss_mb", "supervisor RSS, N turns running (MiB)"),
        ("fds_per_session", "supervisor file descriptors per session"),
        ("receipt_p99_ms", "p99 receipt latency, N cancels at once (ms)"),
        ("receipts_per_s", "receipts per second, N cancels at once"),
        ("gc_share_burst", "share of that burst spent in the cyclic GC"),
    ]
    styles = {
        ("subprocess", True): ("o-", "agent subprocesses (each under its shim)"),
        ("in-memory", True): ("s--", "in-memory agents (the actor alone)"),
        ("subprocess", False): ("o:", "agent subprocesses, GC policy off"),
        ("in-memory", False): ("s:", "in-memory agents, GC policy off"),
    }
    figure, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for axis, (key, title) in zip(axes.flat, panels, strict=True):
        for (kind, policy), (style, label) in styles.items():
            points = [
                (r["n"], r[key]) for r in rows if r["kind"] == kind and r["gc_policy"] == policy
            ]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            axis.plot(xs, ys, style, label=label)
            for x, y in points:
                if key.startswith("gc_"):
                    shown = f"{y:.0%}"
                else:
                    shown = f"{y:.0f}" if y >= 100 else f"{y:.3g}"
                axis.annotate(shown, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        axis.set_xscale("log")
        axis.set_xlabel("concurrent sessions N")
        axis.set_title(title, fontsize=10)
        axis.grid(True, which="both", alpha=0.3)
        if key in ("receipt_p99_ms", "supervisor_rss_mb"):
            axis.set_yscale("log")
            axis.yaxis.set_major_formatter(ScalarFormatter())
            low, high = axis.get_ylim()
            if high / low < 30:  # within about a decade: label the minor ticks too
                axis.yaxis.set_minor_formatter(ScalarFormatter())
                axis.tick_params(axis="y", which="minor", labelsize=7)
        if key.startswith("gc_"):
            axis.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.flat[0].legend(fontsize=8)
    figure.suptitle(
        "agent-supervisor: cost against N (a prompt and a cancel per session, all at once;"
        f" {os.cpu_count()} cores)",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(
    process_ns: list[int], memory_ns: list[int], gc_policy: bool = True, compare_gc: bool = False
) -> dict[str, Any]:
    configs = [("subprocess", n) for n in process_ns] + [("in-memory", n) for n in memory_ns]
    rows, without = [], []
    for kind, n in configs:
        if compare_gc:  # alternately, so that both sides share the machine's mood
            without.append(run_one(kind, n, gc_policy=False))
        rows.append(run_one(kind, n, gc_policy=gc_policy or compare_gc))
    plot(rows + without, HERE / "scale.png")
    result: dict[str, Any] = {}
    for row in rows:
        prefix = f"{'proc' if row['kind'] == 'subprocess' else 'mem'}{row['n']}"
        for key in (
            "receipts_per_s",
            "receipt_p50_ms",
            "receipt_p99_ms",
            "rss_per_session_kb",
            "rss_per_running_session_kb",
            "fds_per_session",
            "agents_rss_per_session_mb",
            "start_s",
            "teardown_s",
            "gc_share_start",
            "gc_share_burst",
            "gc_cpu_share_burst",
            "gc_full_collections",
            "supervisor_rss_mb",
        ):
            if key == "agents_rss_per_session_mb" and row["kind"] != "subprocess":
                continue
            result[f"{prefix}_{key}"] = row[key]
        result[f"{prefix}_gc_full_in_burst"] = row["gc_runs_burst"][2]
    for row, off in zip(rows, without, strict=False):
        prefix = f"{'proc' if row['kind'] == 'subprocess' else 'mem'}{row['n']}"
        for key in ("receipt_p99_ms", "gc_share_burst", "gc_cpu_share_burst"):
            result[f"{prefix}_{key}_gc_policy_off"] = off[key]
        result[f"{prefix}_ratio_p99_gc_policy_on_off"] = (
            row["receipt_p99_ms"] / off["receipt_p99_ms"]
        )
    result["fd_limit"] = rows[0]["fd_limit"]
    result["rows"] = rows
    result["rows_gc_policy_off"] = without
    small, large = rows[0], rows[len(process_ns) - 1]
    for key in ("rss_per_session_kb", "fds_per_session", "receipts_per_s", "receipt_p99_ms"):
        result[f"ratio_{key}_largest_smallest"] = large[key] / small[key]
    return result


def report(f: dict[str, Any]) -> None:
    print(
        "scale: N sessions, a prompt each, then all N cancels at once"
        f" (RLIMIT_NOFILE raised to {f['fd_limit']}); plot: bench/scale.png"
    )
    print(
        f"  {'agents':<11}{'N':>6} {'receipts/s':>11} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'RSS/sess':>10} {'running':>10} {'fds/sess':>9} {'agent RSS':>10} {'start s':>8} {'stop s':>7}"
        f" {'GC start':>9} {'GC burst':>9} {'GC cpu':>7} {'gen 0/1/2 in burst':>19}"
    )
    for row in f["rows"] + f["rows_gc_policy_off"]:
        agent = f"{row['agents_rss_per_session_mb']:.1f} MB" if row["kind"] == "subprocess" else "-"
        print(
            f"  {row['kind']:<11}{row['n']:>6} {row['receipts_per_s']:>11.0f} {row['receipt_p50_ms']:>8.1f}"
            f" {row['receipt_p99_ms']:>8.1f} {row['rss_per_session_kb']:>7.0f} KB"
            f" {row['rss_per_running_session_kb']:>7.0f} KB {row['fds_per_session']:>9.1f}"
            f" {agent:>10} {row['start_s']:>8.2f} {row['teardown_s']:>7.2f}"
            f" {row['gc_share_start']:>9.0%} {row['gc_share_burst']:>9.0%}"
            f" {row['gc_cpu_share_burst']:>7.0%} {'/'.join(map(str, row['gc_runs_burst'])):>19}"
            + ("" if row["gc_policy"] else "  (GC policy off)")
        )
        if set(row["outcomes"]) != {"cancelled"}:
            print(f"    outcomes: {row['outcomes']}")
    if f["rows_gc_policy_off"]:
        print("  GC policy on against off, same run, alternately:")
        for on, off in zip(f["rows"], f["rows_gc_policy_off"], strict=True):
            print(
                f"    {on['kind']:<11}{on['n']:>6}  p99 ratio on/off"
                f" {on['receipt_p99_ms'] / off['receipt_p99_ms']:>5.2f}"
                f"  GC share of burst {off['gc_share_burst']:.0%} -> {on['gc_share_burst']:.0%}"
                f" (CPU {off['gc_cpu_share_burst']:.0%} -> {on['gc_cpu_share_burst']:.0%})"
                f"  full GCs in burst {off['gc_runs_burst'][2]} -> {on['gc_runs_burst'][2]}"
            )


def parse_ns(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process", type=parse_ns, default=[10, 100, 500])
    parser.add_argument("--memory", type=parse_ns, default=[10, 100, 1000, 10000])
    parser.add_argument("--one", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--gc-policy", choices=("on", "off"), default="on")
    parser.add_argument("--compare-gc", action="store_true", help="run each N with it off too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.one:
        result = trio.run(one, args.one[0], int(args.one[1]), args.gc_policy == "on")
        print(json.dumps(result))
        sys.exit(0)
    figures = main(args.process, args.memory, args.gc_policy == "on", args.compare_gc)
    report(figures)
    rows, without = figures.pop("rows"), figures.pop("rows_gc_policy_off")
    if args.json:
        print(json.dumps(figures))
    figures["rows"], figures["rows_gc_policy_off"] = rows, without
    first, last = args.process[0], args.process[-1]
    print(
        f"ratio N={last} / N={first}, subprocess agents: RSS per session"
        f" {figures['ratio_rss_per_session_kb_largest_smallest']:.2f}, fds per session"
        f" {figures['ratio_fds_per_session_largest_smallest']:.2f}, receipts/s"
        f" {figures['ratio_receipts_per_s_largest_smallest']:.2f}, p99 receipt latency"
        f" {figures['ratio_receipt_p99_ms_largest_smallest']:.2f}"
    )
