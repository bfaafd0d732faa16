"""Benchmark 3b: stopping an ACP turn: the ACP Python SDK against our ACP path.

The agent on both sides is the same demo agent (``python -m supervisor.demo_agent``, ACP over
stdio, streaming a word every 5 ms and stopping 1 ms after ``session/cancel``, as in
``bench/cancel_overhead.py``). Round by round in turn:

- **SDK** (``agent-client-protocol``, asyncio, in its own process: ``bench/acp_sdk_worker.py``):
  ``await conn.cancel(session_id)`` until ``prompt()`` returns ``stopReason: cancelled``, timed
  inside that process;
- **ours**: ``await session.cancel()`` until the receipt (the agent under the shim).

Wedged agent (the turn's prompt says ``ignore-cancel``: the agent streams on and never answers
the prompt): ours escalates after the grace window (kill, respawn, ``session/load``, receipt);
the SDK has no escalation: its wait is capped (``--sdk-cap``) and reported as "not ended", and
the way out it offers, leaving ``spawn_agent_process`` (stdin EOF, then SIGTERM after 2 s), is
timed too.

Last line: the ratio ours/SDK, p50, cooperative.
Usage: ``python -m bench.peer_acp [--rounds 100] [--wedged-rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

from bench.cancel_overhead import AGENT_ARGS, percentile, supervisor_cancel
from protocols.framing import LineDecoder, Message
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.config import DEFAULT_GRACE_S

WEDGED_PROMPT = "go ignore-cancel"


class Worker:
    """The SDK's process: one command line in, one JSON line out."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.decoder = LineDecoder()
        self.pending: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while not self.pending:
            data = await self.process.stdout.receive_some(65536)
            if not data:
                raise EOFError("the SDK worker exited")
            self.pending += [f.payload for f in self.decoder.feed(data) if isinstance(f, Message)]
        return self.pending.pop(0)

    async def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(command.encode() + b"\n")
        answer = await self.receive()
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer


async def ours_wedged(session: Session) -> tuple[float, list[str]]:
    async with session.subscribe() as events:
        await session.prompt(WEDGED_PROMPT)
        async for event in events:
            if event.kind == "message.delta":
                break
        start = time.perf_counter()
        receipt = await session.cancel()
        elapsed = time.perf_counter() - start
    assert receipt.outcome == "killed" and receipt.resumed is True, receipt
    return elapsed, receipt.escalation


async def main(rounds: int, wedged_rounds: int, grace: float, cap: float) -> dict[str, Any]:
    state_dir = tempfile.mkdtemp(prefix="bench-peer-acp-")
    agent = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", state_dir, *AGENT_ARGS]
    spec = AgentSpec(name="demo", protocol="acp", command=agent, grace_s=grace)
    worker_argv = [sys.executable, "-m", "bench.acp_sdk_worker", "--", *agent]
    sdk: list[float] = []
    ours: list[float] = []
    wedged_sdk: list[dict[str, Any]] = []
    wedged_ours: list[float] = []
    escalation: list[str] = []
    process = await trio.lowlevel.open_process(
        worker_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        worker = Worker(process)
        assert (await worker.receive()).get("ready")
        async with open_supervisor(agents={"demo": spec}) as sup:
            session = await sup.start_session("demo", cwd="/")
            for _ in range(5):  # warm-up, both sides
                await worker.ask("coop")
                await supervisor_cancel(session)
            for _ in range(rounds):
                sdk.append((await worker.ask("coop"))["cancel_ms"] / 1000)
                ours.append(await supervisor_cancel(session))
            for _ in range(wedged_rounds):
                wedged_sdk.append(await worker.ask(f"wedged {cap}"))
                elapsed, escalation = await ours_wedged(session)
                wedged_ours.append(elapsed)
        assert process.stdin is not None
        await process.stdin.send_all(b"quit\n")
        with trio.move_on_after(10):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    ended = [r for r in wedged_sdk if r["ended_ms"] is not None]
    result: dict[str, Any] = {
        "rounds": rounds,
        "sdk_cancel_p50_ms": percentile(sdk, 0.5) * 1000,
        "sdk_cancel_p99_ms": percentile(sdk, 0.99) * 1000,
        "ours_receipt_p50_ms": percentile(ours, 0.5) * 1000,
        "ours_receipt_p99_ms": percentile(ours, 0.99) * 1000,
        "wedged_rounds": wedged_rounds,
        "wedged_grace_s": grace,
        "wedged_escalation": escalation,
        "wedged_ours_receipt_p50_ms": percentile(wedged_ours, 0.5) * 1000,
        "wedged_ours_receipt_max_ms": max(wedged_ours) * 1000,
        "wedged_ours_beyond_grace_p50_ms": (percentile(wedged_ours, 0.5) - grace) * 1000,
        "wedged_sdk_cap_s": cap,
        "wedged_sdk_ended_within_cap": f"{len(ended)}/{wedged_rounds}",
        "wedged_sdk_teardown_p50_ms": percentile([r["teardown_ms"] for r in wedged_sdk], 0.5),
    }
    result["ratio_p50"] = result["ours_receipt_p50_ms"] / result["sdk_cancel_p50_ms"]
    result["ratio_p99"] = result["ours_receipt_p99_ms"] / result["sdk_cancel_p99_ms"]
    result["wedged_ratio_vs_cap"] = result["wedged_ours_receipt_p50_ms"] / (cap * 1000)
    return result


def report(f: dict[str, Any]) -> None:
    print(
        f"ACP turn stop, same demo agent, {f['rounds']} cooperative rounds interleaved"
        " (agent-client-protocol SDK on asyncio, own process, vs our ACP path)"
    )
    print(
        f"  SDK  conn.cancel() -> prompt() returns cancelled: p50 {f['sdk_cancel_p50_ms']:.2f} ms  p99 {f['sdk_cancel_p99_ms']:.2f} ms"
    )
    print(
        f"  ours session.cancel() -> receipt:                 p50 {f['ours_receipt_p50_ms']:.2f} ms  p99 {f['ours_receipt_p99_ms']:.2f} ms"
    )
    print(f"wedged agent (ignores session/cancel, streams on), {f['wedged_rounds']} rounds:")
    print(
        f"  ours: receipt p50 {f['wedged_ours_receipt_p50_ms']:.0f} ms (max {f['wedged_ours_receipt_max_ms']:.0f} ms)"
        f" = grace {f['wedged_grace_s']:g} s + {f['wedged_ours_beyond_grace_p50_ms']:.0f} ms;"
        f" {' -> '.join(f['wedged_escalation'])}"
    )
    print(
        f"  SDK:  turn ended within the {f['wedged_sdk_cap_s']:g} s cap in {f['wedged_sdk_ended_within_cap']} rounds"
        " (it has no escalation; the wait was capped by this benchmark)"
    )
    print(
        f"        its way out, leaving spawn_agent_process (EOF, SIGTERM after 2 s; no resume): p50 {f['wedged_sdk_teardown_p50_ms']:.0f} ms"
    )
    print(
        f"  wedged: ours / SDK cap = {f['wedged_ratio_vs_cap']:.2f} (the SDK's true time is unbounded)"
    )
    print(f"  ratio ours/SDK p99 (cooperative): {f['ratio_p99']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--wedged-rounds", type=int, default=3)
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S)
    parser.add_argument("--sdk-cap", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = trio.run(main, args.rounds, args.wedged_rounds, args.grace, args.sdk_cap)
    report(figures)
    if args.json:
        print(json.dumps(figures))
    print(f"ratio ours/SDK p50 (cooperative, cancel -> turn ended): {figures['ratio_p50']:.2f}")
