"""Benchmark: a cooperative cancel on a remote session (over SSH) against the same local one.

The agent is the demo agent told to stop 1 ms after ``session/cancel``, the same arguments on
both sides. Two runs, interleaved round by round so machine noise hits them alike:

- **local**: ``await session.cancel()`` on a session of this supervisor;
- **remote**: the same call on a session placed on a host reached by ``ssh`` (a real sshd on
  127.0.0.1 and a throwaway user, as in ``tests/remote/test_remote_ssh.py``): the request crosses the
  ssh connection and the bridge to the node, whose session runs the ladder; the node's
  ``turn.ended`` and then its receipt come back the same way.

Both report the caller's wait (from the call to the receipt) and the receipt's own
``elapsed_ms`` (measured where the agent runs: on the node, for the remote one). Their
difference is what the link adds. Loopback SSH: no network latency, only the two extra hops
and their encryption. Needs root (to start sshd and make the user); else prints why not.
Usage: ``python -m bench.remote_cancel [--rounds 50]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from bench.cancel_overhead import percentile  # noqa: E402
from supervisor import AgentSpec, open_supervisor  # noqa: E402
from supervisor.remote import HostSpec  # noqa: E402
from supervisor.supervisor import AnySession  # noqa: E402

AGENT_ARGS = ("--delay", "0.005", "--words", "100000", "--stop-delay", "0.001")


async def one_cancel(session: AnySession) -> tuple[float, float]:
    async with session.subscribe() as events:
        await session.prompt("go")
        async for event in events:
            if event.kind == "message.delta":
                break
        started = time.perf_counter()
        receipt = await session.cancel()
        waited = (time.perf_counter() - started) * 1000
    assert receipt.outcome == "cancelled", receipt
    return waited, receipt.elapsed_ms


async def interleaved(sessions: dict[str, AnySession], rounds: int) -> dict[str, Any]:
    """Cancel each session in turn, round after round (3 warm-up rounds first), so machine
    noise hits them alike: per name, the caller's wait p50/p99 and the receipt's
    ``elapsed_ms`` p50."""
    times: dict[str, list[float]] = {name: [] for name in sessions}
    elapsed: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(3):
        for session in sessions.values():
            await one_cancel(session)
    for _ in range(rounds):
        for name, session in sessions.items():
            waited, took = await one_cancel(session)
            times[name].append(waited)
            elapsed[name].append(took)
    figures: dict[str, Any] = {"rounds": rounds}
    for name in sessions:
        figures[f"{name}_wait_p50_ms"] = statistics.median(times[name])
        figures[f"{name}_wait_p99_ms"] = percentile(times[name], 0.99)
        figures[f"{name}_receipt_elapsed_p50_ms"] = statistics.median(elapsed[name])
    return figures


async def measure(rounds: int, host: Any) -> dict[str, Any]:
    local = AgentSpec.from_config("demo").with_args(*AGENT_ARGS)
    remote = AgentSpec(
        name="remote",
        protocol="acp",
        command=(
            host.python,
            "-m",
            "supervisor.demo_agent",
            "--state-dir",
            str(host.home / "demo-state"),
            *AGENT_ARGS,
        ),
        hosts=("h",),
    )
    hosts = {
        "h": HostSpec(
            name="h",
            transport=host.transport,
            command=host.node_command(),
            state_dir=str(host.home / "bench-node"),
        )
    }
    async with open_supervisor(agents={"demo": local, "remote": remote}, hosts=hosts) as sup:
        with tempfile.TemporaryDirectory() as workdir:
            here = await sup.start_session("demo", cwd=workdir)
            there = await sup.start_session("remote")
            figures = await interleaved({"local": here, "remote": there}, rounds)
    figures["link_adds_p50_ms"] = figures["remote_wait_p50_ms"] - figures["local_wait_p50_ms"]
    figures["ratio_remote_over_local_p50"] = (
        figures["remote_wait_p50_ms"] / figures["local_wait_p50_ms"]
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import pytest

    from sshd import start_ssh_host, why_not

    reason = why_not()
    if reason is not None:
        print(f"skipped: {reason}")
        if args.json:
            print(json.dumps({"skipped": reason}))
        return
    with tempfile.TemporaryDirectory() as directory:
        hosts = start_ssh_host(Path(directory))
        try:
            host = next(hosts)
        except pytest.skip.Exception as exc:
            print(f"skipped: {exc}")
            if args.json:
                print(json.dumps({"skipped": str(exc)}))
            return
        try:
            figures = trio.run(measure, args.rounds, host)
        finally:
            hosts.close()
    print(
        f"cooperative cancel, {figures['rounds']} rounds (caller's wait, p50/p99):\n"
        f"  local  {figures['local_wait_p50_ms']:7.2f} / {figures['local_wait_p99_ms']:7.2f} ms"
        f"   (receipt elapsed_ms p50 {figures['local_receipt_elapsed_p50_ms']:.2f})\n"
        f"  remote {figures['remote_wait_p50_ms']:7.2f} / {figures['remote_wait_p99_ms']:7.2f} ms"
        f"   (receipt elapsed_ms p50 {figures['remote_receipt_elapsed_p50_ms']:.2f}, on the node)\n"
        f"  the SSH link adds {figures['link_adds_p50_ms']:.2f} ms (p50);"
        f" remote/local {figures['ratio_remote_over_local_p50']:.2f}x"
    )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
