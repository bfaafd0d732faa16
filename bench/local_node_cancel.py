"""Benchmark: what ``serve --local-node`` costs a cancel: a local session against the same
agent in a node on this machine.

The agent is the demo agent told to stop 1 ms after ``session/cancel`` (as in
``bench/remote_cancel.py``). Two sessions, cancelled in turn, round by round, so machine
noise hits them alike:

- **direct**: a session of this supervisor (its actor runs the ladder here);
- **local node**: the same agent in the node of ``serve --local-node`` (no transport: the
  bridge is run directly, then the gateway's WebSocket over its pipes, the node's Unix socket,
  the node's session and its ladder, and back).

Reports the caller's wait (from the call to the receipt) p50/p99 and the receipt's own
``elapsed_ms``. No root needed. Usage: ``python -m bench.local_node_cancel [--rounds 50]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.remote_cancel import AGENT_ARGS, interleaved
from supervisor import AgentSpec, open_supervisor
from supervisor.remote.hosts import local_node


async def measure(rounds: int, state: Path) -> dict[str, Any]:
    direct = AgentSpec.from_config("demo").with_args(*AGENT_ARGS)
    in_node = direct.with_options(name="in-node", hosts=("local",))
    # (undriven for 5 s once the benchmark is done, the node stops and exits)
    hosts = {"local": attrs.evolve(local_node("local", state_dir=state), detach_s=5.0)}
    async with open_supervisor(agents={"demo": direct, "in-node": in_node}, hosts=hosts) as sup:
        here = await sup.start_session("demo", cwd=str(state))
        there = await sup.start_session("in-node", cwd=str(state))
        figures = await interleaved({"direct": here, "node": there}, rounds)
    figures["node_adds_p50_ms"] = figures["node_wait_p50_ms"] - figures["direct_wait_p50_ms"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        figures = trio.run(measure, args.rounds, Path(directory))
    print(
        f"cooperative cancel, {figures['rounds']} rounds (caller's wait, p50/p99):\n"
        f"  direct     {figures['direct_wait_p50_ms']:7.2f} / {figures['direct_wait_p99_ms']:7.2f}"
        f" ms   (receipt elapsed_ms p50 {figures['direct_receipt_elapsed_p50_ms']:.2f})\n"
        f"  local node {figures['node_wait_p50_ms']:7.2f} / {figures['node_wait_p99_ms']:7.2f}"
        f" ms   (receipt elapsed_ms p50 {figures['node_receipt_elapsed_p50_ms']:.2f}, in the node)\n"
        f"  the local node adds {figures['node_adds_p50_ms']:.2f} ms (p50)"
    )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
