"""Benchmark 1: what the supervisor adds to a cooperative cancel.

The agent is the demo agent (ACP over stdio, a trio program) told to stop 1 ms after
``session/cancel``. Three runs side by side, interleaved round by round so machine noise hits
them alike:

- **baseline**: the same demo agent spawned directly (no containment), driven by hand from this
  benchmark's trio loop: a hand-written ``session/cancel`` on its stdin, then a read until the
  ``session/prompt`` response. It is *not* a physical floor: it includes the agent's own 1 ms
  stop delay (a ``trio.sleep``), the demo agent's trio loop and ours, and our line framing. It
  answers "what does the supervisor add to the same agent". The floor of the transport itself
  (a JSON-RPC line each way, nothing else) is ``bench/transport_floor.py``;
- **supervisor**: ``await session.cancel()`` until the receipt (interrupt, race, receipt, the
  session ready again), the agent under the supervisor's containment;
- **gateway**: the same through the WebSocket gateway (``agent.cancel`` -> its response).

Left out: starting the turn (the clock starts once its first word has arrived) and the agent's
own start-up. Prints p50/p99 of every run, the overhead (supervisor - baseline) and, last, the
ratio supervisor/baseline (p50).
Usage: ``python -m bench.cancel_overhead [--rounds 200]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

from protocols.framing import LineDecoder, Message, encode_message
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.client import GatewayClient, connect
from supervisor.gateway import Gateway

AGENT_ARGS = ("--delay", "0.005", "--words", "100000", "--stop-delay", "0.001")


class RawAgent:
    """The baseline: the demo agent driven by hand, no supervisor, no shim."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.decoder = LineDecoder()
        self.pending: list[dict[str, Any]] = []
        self.next_id = 0

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(encode_message(message))

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while not self.pending:
            data = await self.process.stdout.receive_some(65536)
            if not data:
                raise EOFError("agent exited")
            self.pending.extend(
                f.payload for f in self.decoder.feed(data) if isinstance(f, Message)
            )
        return self.pending.pop(0)

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = self.next_id
        self.next_id += 1
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            message = await self.receive()
            if message.get("id") == request_id and "method" not in message:
                return message

    async def one_cancel(self, session_id: str) -> float:
        request_id = self.next_id
        self.next_id += 1
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "session/prompt",
                "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]},
            }
        )
        while True:  # the turn is running once the first word arrives
            message = await self.receive()
            if (
                message.get("params", {}).get("update", {}).get("sessionUpdate")
                == "agent_message_chunk"
            ):
                break
        start = time.perf_counter()
        await self.send(
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
        )
        while True:
            message = await self.receive()
            if message.get("id") == request_id and "method" not in message:
                return time.perf_counter() - start


async def gateway_cancel(client: GatewayClient, session_id: str) -> float:
    """The same cancel through the WebSocket gateway: client -> receipt."""
    async with client.subscribe(session_id) as events:
        await client.prompt(session_id, "go")
        async for event in events:
            if event["event"] == "message.delta":
                break
        start = time.perf_counter()
        receipt = await client.cancel(session_id)
        elapsed = time.perf_counter() - start
    assert receipt["outcome"] == "cancelled", receipt
    return elapsed


async def supervisor_cancel(
    session: Session,
    settle: float = 0.0,
    count: contextlib.AbstractContextManager[Any] | None = None,
) -> float:
    async with session.subscribe() as events:
        await session.prompt("go")
        async for event in events:
            if event.kind == "message.delta":
                break
        if settle:
            await trio.sleep(settle)
        start = time.perf_counter()
        with count or contextlib.nullcontext():
            receipt = await session.cancel()
        elapsed = time.perf_counter() - start
    assert receipt.outcome == "cancelled", receipt
    return elapsed


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


async def main(rounds: int) -> dict[str, Any]:
    state_dir = tempfile.mkdtemp(prefix="bench-cancel-")
    argv = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", state_dir, *AGENT_ARGS]
    spec = AgentSpec(name="bench", protocol="acp", command=argv)
    raw_times: list[float] = []
    sup_times: list[float] = []
    gw_times: list[float] = []
    process = await trio.lowlevel.open_process(argv, stdin=-1, stdout=-1, stderr=subprocess.DEVNULL)
    try:
        raw = RawAgent(process)
        await raw.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        session_id = (await raw.call("session/new", {"cwd": "/", "mcpServers": []}))["result"][
            "sessionId"
        ]
        async with open_supervisor(agents={"bench": spec}) as sup, trio.open_nursery() as nursery:
            session = await sup.start_session("bench", cwd="/")
            url = await nursery.start(Gateway(sup, port=0).serve)
            async with connect(url) as client:
                gw_session = (await client.start_session("bench"))["session_id"]
                for _ in range(5):  # warm-up, every side
                    await raw.one_cancel(session_id)
                    await supervisor_cancel(session)
                    await gateway_cancel(client, gw_session)
                for _ in range(rounds):
                    raw_times.append(await raw.one_cancel(session_id))
                    sup_times.append(await supervisor_cancel(session))
                    gw_times.append(await gateway_cancel(client, gw_session))
            nursery.cancel_scope.cancel()
    finally:
        process.kill()
        await process.wait()
    result = {
        "rounds": rounds,
        "baseline_p50_ms": percentile(raw_times, 0.5) * 1000,
        "baseline_p99_ms": percentile(raw_times, 0.99) * 1000,
        "supervisor_p50_ms": percentile(sup_times, 0.5) * 1000,
        "supervisor_p99_ms": percentile(sup_times, 0.99) * 1000,
        "overhead_p50_ms": (statistics.median(sup_times) - statistics.median(raw_times)) * 1000,
        "gateway_p50_ms": percentile(gw_times, 0.5) * 1000,
        "gateway_p99_ms": percentile(gw_times, 0.99) * 1000,
    }
    result["overhead_p99_ms"] = result["supervisor_p99_ms"] - result["baseline_p99_ms"]
    result["ratio_p50"] = result["supervisor_p50_ms"] / result["baseline_p50_ms"]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    figures = trio.run(main, args.rounds)
    f = figures
    print(
        f"cancel overhead over {f['rounds']} cooperative cancels (demo agent, stops 1 ms after the cancel)"
    )
    print(
        f"  baseline   (the agent driven by hand):  p50 {f['baseline_p50_ms']:.2f} ms  p99 {f['baseline_p99_ms']:.2f} ms"
    )
    print(
        f"  supervisor (session.cancel -> receipt): p50 {f['supervisor_p50_ms']:.2f} ms  p99 {f['supervisor_p99_ms']:.2f} ms"
    )
    print(
        f"  gateway    (WebSocket -> receipt):      p50 {f['gateway_p50_ms']:.2f} ms  p99 {f['gateway_p99_ms']:.2f} ms"
    )
    print(
        f"  overhead over the baseline: p50 {f['overhead_p50_ms']:.2f} ms, p99 {f['overhead_p99_ms']:.2f} ms (targets: <= 1 ms, <= 5 ms)"
    )
    if args.json:
        print(json.dumps(f))
    print(f"ratio supervisor/baseline p50: {f['ratio_p50']:.2f}")
