"""Benchmark: what one session costs the machine as a whole, and what containment adds to an
agent's start-up.

**Per-session memory**, for two agents: the light one (``bench/fake_light_agent.py``, stdlib,
``python -S``) and the built-in demo agent (``AgentSpec.from_config("demo")``, a trio program).
``--sessions`` N sessions are started through ``open_supervisor`` and each runs one turn (a
prompt, its first word, a cancel), so the agent has served a prompt; measured; stopped; that
``--cycles`` times per agent (medians reported). Per session:

- **MemAvailable drop**: ``MemAvailable`` (/proc/meminfo) before the sessions minus with them
  running, over N: what the machine lost, whoever holds it (supervisor, containment, agents,
  kernel: page tables, pipe and socket buffers), each reading taken ``2 x vm.stat_interval``
  after the change, once the kernel has folded its per-CPU counters in. The rise when they are stopped is shown
  beside it: this is a machine-wide figure, and other people's work moves it too; the two
  agreeing is the sign it was quiet;
- **USS below the supervisor**: ``memory_full_info().uss`` (memory no other process shares) of
  every process below the supervisor (``psutil`` ``children(recursive=True)``), over N, split
  into the agent's own processes (command line equal to the agent's command) and the rest
  (containment, helpers; whatever the supervisor puts around an agent), with PSS (shared pages
  divided among their users) and the process count beside it;
- **supervisor only**: the supervisor process's own RSS growth over N, and its Python heap
  growth (``tracemalloc``, which runs through this part; its own bookkeeping is subtracted from
  the RSS figure). This is what the per-session KB figures of bench/results.md measure.

Both containments are measured (``--containment``, default ``cgroup,shim``; cgroup only where
this host allows it): under ``cgroup`` there is no process per agent, and the one cgroup keeper
of the supervisor process (not below it: it detaches) is counted apart, once, and divided by N
in the **supervisor-owned** figure: supervisor RSS growth + what is around each agent (shim) +
keeper / N. That is the figure the ``<= 1 MB`` target is about; the agent's own memory is the
agent's.

Left out: the memory of the supervisor process before the first session (interpreter,
modules), and kernel memory that MemAvailable does not show (a cgroup's own kernel objects,
a few KB).

**Containment start-up**: spawn to first byte on stdout of a command started through the
supervisor's process layer (``supervisor.agents.process.AgentProcess.spawn``: what the sessions use to
start an agent) against the same command spawned directly (trio ``open_process``, the same
pipes, a new session), ``--rounds`` times each, in alternating blocks (``BLOCK``): ``/bin/echo`` (the first byte comes
right after exec) and the light agent (its answer to ``initialize``). The difference is what
containment adds to every agent start (and respawn). Left out: the agent's exit and reaping.

Last line: MemAvailable drop and USS per session for both agents, and containment's start-up
cost (p50 difference; target <= 5 ms).
Usage: ``python -m bench.session_cost [--sessions 40] [--cycles 3] [--rounds 30]
[--containment cgroup,shim]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import trio

from bench.cancel_overhead import percentile
from bench.machine import load_average, mem_available, raise_fd_limit, vmstat_interval
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.agents.containment import CONTAINMENT_VARIABLE, choose_blocking
from supervisor.agents.process import AgentProcess

HERE = Path(__file__).resolve().parent
LIGHT_AGENT = [sys.executable, "-S", str(HERE / "fake_light_agent.py"), "--interval", "600"]
AGENTS = {
    "light": AgentSpec(name="light", protocol="acp", command=LIGHT_AGENT),
    "demo": AgentSpec.from_config("demo"),
}
INITIALIZE = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
COMMANDS = {"echo": ["/bin/echo", "ready"], "light": LIGHT_AGENT}
MB = 2**20


def below_us() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def memory_below(command: Sequence[str]) -> dict[str, float]:
    """USS, PSS and count of every process below us: the agent's own, and the others."""
    totals = {f"{part}_{key}": 0.0 for part in ("agent", "other") for key in ("uss", "pss", "n")}
    for proc in below_us():
        try:
            part = "agent" if proc.cmdline() == list(command) else "other"
            info = proc.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        totals[f"{part}_uss"] += info.uss
        totals[f"{part}_pss"] += info.pss
        totals[f"{part}_n"] += 1
    return totals


def supervisor_memory() -> tuple[int, int, int]:
    """This process's RSS, traced Python heap, and tracemalloc's own bookkeeping."""
    gc.collect()
    return (
        psutil.Process().memory_info().rss,
        tracemalloc.get_traced_memory()[0],
        tracemalloc.get_tracemalloc_memory(),
    )


async def settled_mem_available() -> int:
    """MemAvailable once the kernel has folded in what just changed (see ``vmstat_interval``)."""
    await trio.sleep(2 * vmstat_interval())
    return mem_available()


async def one_turn(session: Session) -> None:
    async with session.subscribe() as events:
        await session.prompt("go")
        async for event in events:
            if event.kind == "message.delta":
                break
        receipt = await session.cancel()
    if receipt.outcome not in ("cancelled", "completed"):
        raise RuntimeError(f"unexpected receipt: {receipt}")


def keeper_uss() -> float:
    """The cgroup keeper's USS (one per supervisor process; 0 without one)."""
    root = choose_blocking().root
    if root is None or root.keeper_pid is None:
        return 0.0
    try:
        return float(psutil.Process(root.keeper_pid).memory_full_info().uss)
    except psutil.Error:
        return 0.0


async def memory_cycle(name: str, n: int) -> dict[str, float]:
    """Start ``n`` sessions of agent ``name`` (a turn each), measure, stop them, measure."""
    spec = AGENTS[name]
    tracemalloc.start()
    sessions: list[Session] = []

    async def start(sup: Any) -> None:
        session = await sup.start_session(name, cwd="/")
        await one_turn(session)
        sessions.append(session)

    async with open_supervisor(agents={name: spec}) as sup:
        rss0, heap0, traced0 = supervisor_memory()
        available0 = await settled_mem_available()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(start, sup)
        rss1, heap1, traced1 = supervisor_memory()
        available1 = await settled_mem_available()
        below = memory_below(spec.command)
    available2 = await settled_mem_available()
    tracemalloc.stop()
    result = {f"{key}_per_session_mb": value / n / MB for key, value in below.items()}
    for part in ("agent", "other"):
        result[f"{part}_n_per_session"] = below[f"{part}_n"] / n
        del result[f"{part}_n_per_session_mb"]
    result["uss_per_session_mb"] = (below["agent_uss"] + below["other_uss"]) / n / MB
    result["pss_per_session_mb"] = (below["agent_pss"] + below["other_pss"]) / n / MB
    result["mem_available_drop_per_session_mb"] = (available0 - available1) / n / MB
    result["mem_available_rise_per_session_mb"] = (available2 - available1) / n / MB
    result["supervisor_rss_per_session_kb"] = (rss1 - rss0 - (traced1 - traced0)) / n / 1024
    result["supervisor_heap_per_session_kb"] = (heap1 - heap0) / n / 1024
    keeper = keeper_uss()
    result["keeper_uss_mb"] = keeper / MB
    result["owned_per_session_mb"] = (
        max(0.0, result["supervisor_rss_per_session_kb"]) / 1024
        + result["other_uss_per_session_mb"]
        + keeper / n / MB
    )
    return result


async def memory_per_session(name: str, n: int, cycles: int) -> dict[str, float]:
    """The median of ``cycles`` start-measure-stop cycles, and the spread of MemAvailable's."""
    runs = [await memory_cycle(name, n) for _ in range(cycles)]
    result = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    for key in ("mem_available_drop_per_session_mb", "mem_available_rise_per_session_mb"):
        result[f"{key}_min"] = min(run[key] for run in runs)
        result[f"{key}_max"] = max(run[key] for run in runs)
    return result


async def contained_first_byte(argv: list[str]) -> float:
    """Spawn through the supervisor's process layer, until the first byte on stdout."""
    began = time.perf_counter()
    process = await AgentProcess.spawn(argv)
    async with process:
        if argv == LIGHT_AGENT:
            await process.stdin.send_all(INITIALIZE)
        if not await process.stdout.receive_some(65536):
            raise EOFError(f"{argv[0]} wrote nothing")
        elapsed = time.perf_counter() - began
        await process.close_stdin()
        await process.wait()
    return elapsed


async def direct_first_byte(argv: list[str]) -> float:
    """The same command spawned directly, with the same pipes and a new session."""
    began = time.perf_counter()
    process = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    try:
        if argv == LIGHT_AGENT:
            await process.stdin.send_all(INITIALIZE)
        if not await process.stdout.receive_some(65536):
            raise EOFError(f"{argv[0]} wrote nothing")
        elapsed = time.perf_counter() - began
        await process.stdin.aclose()
        await process.wait()
    finally:
        for stream in (process.stdin, process.stdout, process.stderr):
            await stream.aclose()
    return elapsed


#: Start-ups are timed in alternating blocks of this many, the first of each block untimed: a
#: contained start right after a direct one (or the other way round) is ~10 ms slower for a
#: Python agent on this kernel, a cost neither way of starting has when it runs alone, as the
#: supervisor always does (every one of its agents is contained).
BLOCK = 5


async def containment_start_up(rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, argv in COMMANDS.items():
        times: dict[str, list[float]] = {"direct": [], "contained": []}
        starts = {"direct": direct_first_byte, "contained": contained_first_byte}
        while len(times["contained"]) < rounds:
            for side, start in starts.items():
                for index in range(BLOCK + 1):
                    elapsed = await start(argv)
                    if index:
                        times[side].append(elapsed)
        for side, values in times.items():
            result[f"{name}_{side}_p50_ms"] = percentile(values, 0.5) * 1000
            result[f"{name}_{side}_p99_ms"] = percentile(values, 0.99) * 1000
        result[f"{name}_added_p50_ms"] = (
            result[f"{name}_contained_p50_ms"] - result[f"{name}_direct_p50_ms"]
        )
    return result


async def main(n: int, cycles: int, rounds: int, modes: list[str]) -> dict[str, Any]:
    raise_fd_limit()
    if "cgroup" in modes and choose_blocking("auto").kind != "cgroup":
        print(f"(no cgroups here: {choose_blocking('auto').detail})")
        modes = [mode for mode in modes if mode != "cgroup"]
    result: dict[str, Any] = {
        "sessions": n,
        "cycles": cycles,
        "rounds": rounds,
        "modes": modes,
        "load_before": load_average(),
    }
    for mode in modes:
        os.environ[CONTAINMENT_VARIABLE] = mode
        for name in AGENTS:
            figures = await memory_per_session(name, n, cycles)
            result.update({f"{mode}_{name}_{key}": value for key, value in figures.items()})
        start = await containment_start_up(rounds)
        result.update({f"{mode}_start_{k}": v for k, v in start.items()})
    result["load_after"] = load_average()
    return result


def report(f: dict[str, Any]) -> None:
    print(
        f"per-session cost, {f['sessions']} sessions of each agent, each after one turn,"
        f" median of {f['cycles']} start-stop cycles"
        f" (load average before {f['load_before']:.2f}, after {f['load_after']:.2f})"
    )
    for mode in f["modes"]:
        print(f"containment: {mode}")
        report_mode({k[len(mode) + 1 :]: v for k, v in f.items() if k.startswith(f"{mode}_")}, f)


def report_mode(f: dict[str, Any], whole: dict[str, Any]) -> None:
    for name in AGENTS:
        g = {key[len(name) + 1 :]: v for key, v in f.items() if key.startswith(f"{name}_")}
        print(
            f"  {name} agent: MemAvailable drop {g['mem_available_drop_per_session_mb']:.1f} MB"
            f" per session ({g['mem_available_drop_per_session_mb_min']:.1f}"
            f"-{g['mem_available_drop_per_session_mb_max']:.1f} over the cycles; rise when"
            f" stopped {g['mem_available_rise_per_session_mb']:.1f} MB)"
        )
        print(
            f"    below the supervisor: USS {g['uss_per_session_mb']:.1f} MB"
            f" (PSS {g['pss_per_session_mb']:.1f} MB) per session:"
            f" agent USS {g['agent_uss_per_session_mb']:.1f} MB in {g['agent_n_per_session']:.1f}"
            f" process(es), the rest USS {g['other_uss_per_session_mb']:.1f} MB"
            f" (PSS {g['other_pss_per_session_mb']:.1f} MB) in {g['other_n_per_session']:.1f}"
        )
        print(
            f"    supervisor process only: RSS {g['supervisor_rss_per_session_kb']:.0f} KB,"
            f" Python heap {g['supervisor_heap_per_session_kb']:.0f} KB per session;"
            f" cgroup keeper {g['keeper_uss_mb']:.1f} MB USS once"
        )
        print(
            f"    supervisor-owned per session: {g['owned_per_session_mb']:.2f} MB"
            " (supervisor + containment + keeper / N; target <= 1 MB)"
        )
    print(
        f"  containment start-up, spawn -> first byte on stdout, {whole['rounds']} rounds"
        f" in alternating blocks of {BLOCK}"
    )
    for name in COMMANDS:
        print(
            f"    {name:<6} direct p50 {f[f'start_{name}_direct_p50_ms']:6.2f} ms"
            f" (p99 {f[f'start_{name}_direct_p99_ms']:6.2f}),"
            f" through the process layer p50 {f[f'start_{name}_contained_p50_ms']:6.2f} ms"
            f" (p99 {f[f'start_{name}_contained_p99_ms']:6.2f}):"
            f" containment adds {f[f'start_{name}_added_p50_ms']:.2f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--containment", default="cgroup,shim", help="which containments")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = trio.run(main, args.sessions, args.cycles, args.rounds, args.containment.split(","))
    report(figures)
    if args.json:
        print(json.dumps(figures))
    parts = []
    for mode in figures["modes"]:
        parts.append(
            f"{mode}: supervisor-owned {figures[f'{mode}_light_owned_per_session_mb']:.2f} MB per"
            f" session (light agent; target <= 1 MB), containment adds"
            f" {figures[f'{mode}_start_echo_added_p50_ms']:.1f} ms to a start (target <= 5 ms)"
        )
    print("; ".join(parts))
