"""Benchmark: is a stop on another host still instant while other sessions there flood?

One quiet session's cancel, with K other sessions streaming as fast as their pipes take it,
measured twice in the same run: all of them **remote** (placed on one host through its node,
so they share one link: one transport process, one WebSocket), and all of them **local** (the
same agents in this supervisor, as ``bench/fairness.py`` does). The host is this machine
reached by the ``env`` transport (``env agent-supervisor node --bridge``): the same bridge,
node daemon and WebSocket as over SSH, without sshd or its encryption, so it needs no root.

All agents are ``bench/fake_light_agent.py`` (stdlib ACP). The K flooders each run a
``flood forever`` turn (one-word chunks, until cancelled). Locally nobody subscribes to them;
remotely the link subscribes to every session it placed (the front mirrors each one: that is
what the link carries), but no client of the front does. Per level, the quiet session does
``--rounds`` turns: prompt, wait for its first word, then ``t0 = time.monotonic(); receipt =
await session.cancel()``. Two figures per round, both from ``t0`` on CLOCK_MONOTONIC:

- **receipt**: until ``cancel()`` returns (remote: the request crosses the link, the node runs
  the ladder, its ``turn.ended`` and then the receipt come back through the flood of the K
  other sessions on the same connection);
- **interrupt delivery**: until the quiet agent *read* ``session/cancel``, as the agent itself
  timestamps it in its ``--log`` file (the supervisor never carries it).

Per level also the flood absorbed (events/s over the flooders, as the front saw them: for the
remote side, events that crossed the link) and the load average. Reported: each figure, and
remote/local ratios per K. Left out: starting and stopping the flooders (not timed), any
client fan-out on the front, the network (loopback, no encryption: over SSH add its ~1.5 ms,
``bench/remote_cancel.py``), and what the node's own host costs (here the same two cores run
front, node and agents, so remote figures include the node competing with the front).
Usage: ``python -m bench.remote_fairness [--k 0,10,50] [--rounds 100]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.cancel_overhead import percentile
from bench.fairness import LIGHT_AGENT, QUIET_INTERVAL_S, CancelLog, quiet_round
from bench.machine import free_cpu, load_average, raise_fd_limit
from supervisor import AgentSpec, Supervisor, open_supervisor
from supervisor.remote import HostSpec
from supervisor.supervisor import AnySession

WARM_UP_ROUNDS = 5
HOST = "here"


async def start_flooding(sup: Supervisor, agent: str, count: int) -> list[AnySession]:
    """Start ``count`` sessions of ``agent``, each flooding (its first word seen)."""
    sessions: list[AnySession] = []

    async def one() -> None:
        session = await sup.start_session(agent, cwd="/")
        async with session.subscribe() as events:
            await session.prompt("flood forever")
            async for event in events:
                if event.kind == "message.delta":
                    break
        sessions.append(session)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return sessions


async def stop_all(sup: Supervisor, sessions: list[AnySession]) -> None:
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(sup.stop_session, session.id)


async def level(
    sup: Supervisor, quiet: AnySession, flood_agent: str, k: int, rounds: int, log: CancelLog
) -> dict[str, float]:
    flooders = await start_flooding(sup, flood_agent, k)
    try:
        figures: dict[str, float] = {"load_before": load_average()}
        seqs = sum(f.last_seq for f in flooders)
        wall = time.monotonic()
        receipts, deliveries = [], []
        for _ in range(rounds):
            receipt, delivery = await quiet_round(quiet, log)
            receipts.append(receipt)
            deliveries.append(delivery)
        span = time.monotonic() - wall
        figures["flood_events_per_s"] = (sum(f.last_seq for f in flooders) - seqs) / span
        for name, values in (("receipt", receipts), ("delivery", deliveries)):
            for label, fraction in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
                figures[f"{name}_{label}_ms"] = percentile(values, fraction) * 1000
        return figures
    finally:
        await stop_all(sup, flooders)


async def main(levels: list[int], rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "levels": levels,
        "rounds": rounds,
        "fd_limit": raise_fd_limit(),
        "free_cpu_before": free_cpu(),
        "load_before": load_average(),
    }
    work = Path(tempfile.mkdtemp(prefix="bench-remote-fairness-"))
    local_log, remote_log = work / "local.log", work / "remote.log"

    def quiet_spec(name: str, log_path: Path, hosts: tuple[str, ...]) -> AgentSpec:
        command = [*LIGHT_AGENT, "--interval", str(QUIET_INTERVAL_S), "--log", str(log_path)]
        return AgentSpec(name=name, protocol="acp", command=command, hosts=hosts)

    agents = {
        "quiet": quiet_spec("quiet", local_log, ()),
        "flood": AgentSpec(name="flood", protocol="acp", command=LIGHT_AGENT),
        "rquiet": quiet_spec("rquiet", remote_log, (HOST,)),
        "rflood": AgentSpec(name="rflood", protocol="acp", command=LIGHT_AGENT, hosts=(HOST,)),
    }
    hosts = {
        HOST: HostSpec(
            name=HOST,
            transport=["env"],
            command=[sys.executable, "-m", "supervisor.cli"],
            detach_s=5.0,
            state_dir=str(work / "node"),
        )
    }
    logs = {"local": CancelLog(local_log), "remote": CancelLog(remote_log)}
    async with open_supervisor(agents=agents, hosts=hosts) as sup:
        quiet = {
            "local": await sup.start_session("quiet", cwd="/"),
            "remote": await sup.start_session("rquiet", cwd="/"),
        }
        for side in ("local", "remote"):
            for _ in range(WARM_UP_ROUNDS):
                await quiet_round(quiet[side], logs[side])
        for k in levels:
            for side, flood in (("local", "flood"), ("remote", "rflood")):
                figures = await level(sup, quiet[side], flood, k, rounds, logs[side])
                result.update({f"{side}_k{k}_{key}": value for key, value in figures.items()})
            for figure in ("receipt_p50_ms", "receipt_p99_ms", "delivery_p99_ms"):
                local = result[f"local_k{k}_{figure}"]
                result[f"ratio_k{k}_{figure.removesuffix('_ms')}"] = (
                    result[f"remote_k{k}_{figure}"] / local if local else float("nan")
                )
    return result


def report(f: dict[str, Any]) -> None:
    print(
        f"remote fairness: one quiet session's cancel while K sessions on the same host flood"
        f" (env transport, one link), against the same all local; {f['rounds']} cancels per K"
        f" and side (machine before: load {f['load_before']:.2f}, a busy loop got"
        f" {f['free_cpu_before']:.0%} of a core)"
    )
    print(
        f"  {'K':>3} {'side':>6}  {'receipt p50':>11} {'p99':>7} {'max':>7}"
        f"  {'delivery p50':>12} {'p99':>7} {'max':>7}  {'flood events/s':>14}  {'load':>5}"
    )
    for k in f["levels"]:
        for side in ("local", "remote"):
            g = {
                key[len(f"{side}_k{k}_") :]: v
                for key, v in f.items()
                if key.startswith(f"{side}_k{k}_")
            }
            print(
                f"  {k:>3} {side:>6}  {g['receipt_p50_ms']:>8.2f} ms {g['receipt_p99_ms']:>7.2f}"
                f" {g['receipt_max_ms']:>7.2f}  {g['delivery_p50_ms']:>9.2f} ms"
                f" {g['delivery_p99_ms']:>7.2f} {g['delivery_max_ms']:>7.2f}"
                f"  {g['flood_events_per_s']:>14.0f}  {g['load_before']:>5.2f}"
            )
        print(
            f"  {k:>3}  remote/local: receipt p50 {f[f'ratio_k{k}_receipt_p50']:.2f}x,"
            f" p99 {f[f'ratio_k{k}_receipt_p99']:.2f}x,"
            f" delivery p99 {f[f'ratio_k{k}_delivery_p99']:.2f}x"
        )


def summary(f: dict[str, Any]) -> str:
    top = max(f["levels"])
    return (
        f"remote fairness: K={top} remote receipt p50/p99"
        f" {f[f'remote_k{top}_receipt_p50_ms']:.2f}/{f[f'remote_k{top}_receipt_p99_ms']:.2f} ms,"
        f" local {f[f'local_k{top}_receipt_p50_ms']:.2f}/{f[f'local_k{top}_receipt_p99_ms']:.2f}"
        f" ms (p99 ratio {f[f'ratio_k{top}_receipt_p99']:.2f}x)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="0,10,50", help="flooding sessions per level")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    levels = sorted(int(part) for part in args.k.split(","))
    figures = trio.run(main, levels, args.rounds)
    report(figures)
    if args.json:
        print(json.dumps(figures))
    print(summary(figures))
