"""Benchmark 2: the cost of stopping an agent that ignores the interrupt.

The demo agent runs with ``--ignore-cancel`` and the grace window is 0.5 s. After the grace
expires the supervisor kills the whole tree, reaps it, starts the agent again and resumes the
session (ACP ``session/load``); the receipt comes after all that. Reported: receipt time minus
the grace window (kill + reap + respawn + resume), side by side with the floor for the last two:
the same agent started by hand, without shim or supervisor, up to its ``session/load`` answer.

Last line: the ratio (receipt - grace) / hand-started agent, p50.
Usage: ``python bench/wedged_agent.py [--rounds 20]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.cancel_overhead import RawAgent, percentile
from supervisor import AgentSpec, Session, open_supervisor

GRACE_S = 0.5


async def hand_started_agent(argv: list[str], session_id: str) -> float:
    """Spawn, initialize, session/load: the agent's own share of a respawn."""
    start = time.perf_counter()
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        raw = RawAgent(process)
        await raw.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        await raw.call("session/load", {"sessionId": session_id, "cwd": "/", "mcpServers": []})
        return time.perf_counter() - start
    finally:
        process.kill()
        await process.wait()


async def one_kill(session: Session) -> tuple[float, list[str]]:
    async with session.subscribe() as events:
        await session.prompt("go words=100000")
        async for event in events:
            if event.kind == "message.delta":
                break
        start = time.perf_counter()
        receipt = await session.cancel()
        elapsed = time.perf_counter() - start
    assert receipt.outcome == "killed" and receipt.resumed is True, receipt
    return elapsed - GRACE_S, receipt.escalation


async def main(rounds: int) -> dict[str, Any]:
    state_dir = tempfile.mkdtemp(prefix="bench-wedged-")
    argv = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", state_dir]
    argv += ["--delay", "0.01", "--ignore-cancel"]
    spec = AgentSpec(name="wedged", protocol="acp", command=argv, grace_s=GRACE_S)
    beyond: list[float] = []
    floor: list[float] = []
    async with open_supervisor(agents={"wedged": spec}) as sup:
        session = await sup.start_session("wedged", cwd="/")
        escalation: list[str] = []
        for _ in range(rounds):
            extra, escalation = await one_kill(session)
            beyond.append(extra)
            # The agent session id lives in the demo agent's state dir; load the newest one.
            agent_session = sorted(
                Path(state_dir).glob("*.json"),
                key=lambda p: p.stat().st_mtime,
            )[-1].stem
            floor.append(await hand_started_agent(argv, agent_session))
    return {
        "rounds": rounds,
        "grace_s": GRACE_S,
        "escalation": escalation,
        "beyond_grace_p50_ms": percentile(beyond, 0.5) * 1000,
        "beyond_grace_p99_ms": percentile(beyond, 0.99) * 1000,
        "agent_start_p50_ms": percentile(floor, 0.5) * 1000,
        "agent_start_p99_ms": percentile(floor, 0.99) * 1000,
        "ratio_p50": percentile(beyond, 0.5) / percentile(floor, 0.5),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = trio.run(main, args.rounds)
    print(
        f"wedged agent, grace {GRACE_S} s, {figures['rounds']} kills: {' -> '.join(figures['escalation'])}"
    )
    print(
        f"  receipt - grace (kill, reap, respawn, resume): p50 {figures['beyond_grace_p50_ms']:.1f} ms  p99 {figures['beyond_grace_p99_ms']:.1f} ms"
    )
    print(
        f"  the agent started by hand up to session/load:  p50 {figures['agent_start_p50_ms']:.1f} ms  p99 {figures['agent_start_p99_ms']:.1f} ms"
    )
    overhead = figures["beyond_grace_p50_ms"] - figures["agent_start_p50_ms"]
    print(
        f"  supervisor's share (kill + reap + shim + handshake bookkeeping): p50 {overhead:.1f} ms (target <= 100 ms)"
    )
    if args.json:
        print(json.dumps(figures))
    print(f"ratio (receipt - grace) / agent start p50: {figures['ratio_p50']:.2f}")
