"""Benchmark: the transport floor of a cancel, and how far ours is from it.

The agent answers at once: ``bench/fake_light_agent.py`` (stdlib) replies to ``session/cancel``
as soon as it has read it. Three runs, interleaved round by round so machine noise hits them
alike; each round is a prompt, its first word, a pause of ``SETTLE_S``, then the clock:

- **floor**: one JSON-RPC line over a pipe and one back, Python on both sides, each side
  serializing (``json.dumps``) and parsing (``json.loads``) its message: the light agent spawned
  directly, driven with blocking ``os.write``/``os.read`` from this process (no event loop),
  from writing ``session/cancel`` to having parsed the ``session/prompt`` response;
- **floor on trio**: the same exchange through trio's pipe streams: what an event loop adds;
- **ours**: ``await session.cancel()`` until the receipt, against the same light agent, under
  the supervisor (containment, actor, ACP machine, receipt, the session ready again).

The pause puts the agent to sleep in ``select`` before the cancel arrives, as it is in real use,
so every side pays the same wake-ups (the agent's, then the reader's). Left out: starting the
turn and the agent's start-up. Last line: the ratios ours/floor and ours/floor on trio, p50
(target: <= 1.5x the floor).
Usage: ``python -m bench.transport_floor [--rounds 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import trio

from bench.cancel_overhead import percentile, supervisor_cancel
from supervisor import AgentSpec, open_supervisor

#: The agent: replies to ``session/cancel`` at once; one word, then silence.
LIGHT_AGENT = [
    sys.executable,
    "-S",
    str(Path(__file__).with_name("fake_light_agent.py")),
    "--interval",
    "600",
]
#: After the first word, every side pauses this long before the cancel, so the agent is asleep
#: in ``select`` when the cancel arrives, as it is in real use, and every side pays the same
#: wake-ups. Without it the blocking floor catches the agent still awake
#: right after writing its word: ~0.04 ms instead of ~0.1 ms, a floor no real cancel sees.
SETTLE_S = 0.002


class Lines:
    """JSON-RPC lines as a plain Python peer handles them: ``json.dumps`` out, ``json.loads`` in."""

    def __init__(self) -> None:
        self.buffer = b""
        self.messages: deque[dict[str, Any]] = deque()

    @staticmethod
    def encode(message: dict[str, Any]) -> bytes:
        return (json.dumps(message) + "\n").encode()

    def feed(self, data: bytes) -> None:
        if not data:
            raise EOFError("agent exited")
        *complete, self.buffer = (self.buffer + data).split(b"\n")
        self.messages.extend(json.loads(line) for line in complete if line)


def _prompt(request_id: int, session_id: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]},
    }


def _cancel(session_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}


def _is_chunk(message: dict[str, Any]) -> bool:
    return message.get("params", {}).get("update", {}).get("sessionUpdate") == "agent_message_chunk"


def _answers(message: dict[str, Any], request_id: int) -> bool:
    return message.get("id") == request_id and "method" not in message


class BlockingFloor:
    """The transport floor: the light agent driven with blocking pipe reads and writes. Called
    from the trio program, it blocks the loop for a round, while nothing else needs to run."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin.fileno(), self.process.stdout.fileno()
        self.lines = Lines()
        self.next_id = 0
        self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        self.session_id = self.call("session/new", {"cwd": "/", "mcpServers": []})["result"][
            "sessionId"
        ]

    def receive(self) -> dict[str, Any]:
        while not self.lines.messages:
            self.lines.feed(os.read(self.stdout, 65536))
        return self.lines.messages.popleft()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = self.next_id = self.next_id + 1
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        os.write(self.stdin, Lines.encode(message))
        while not _answers(reply := self.receive(), request_id):
            pass
        return reply

    def one_cancel(self) -> float:
        request_id = self.next_id = self.next_id + 1
        os.write(self.stdin, Lines.encode(_prompt(request_id, self.session_id)))
        while not _is_chunk(self.receive()):
            pass
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        os.write(self.stdin, Lines.encode(_cancel(self.session_id)))
        while not _answers(self.receive(), request_id):
            pass
        return time.perf_counter() - start

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


class TrioFloor:
    """The same exchange through trio's pipe streams: what an event loop adds to the floor."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process, self.stdin, self.stdout = process, process.stdin, process.stdout
        self.lines = Lines()
        self.next_id = 0
        self.session_id = ""

    @classmethod
    async def start(cls, argv: list[str]) -> TrioFloor:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        floor = cls(process)
        await floor.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        reply = await floor.call("session/new", {"cwd": "/", "mcpServers": []})
        floor.session_id = reply["result"]["sessionId"]
        return floor

    async def receive(self) -> dict[str, Any]:
        while not self.lines.messages:
            self.lines.feed(await self.stdout.receive_some(65536))
        return self.lines.messages.popleft()

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = self.next_id = self.next_id + 1
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        await self.stdin.send_all(Lines.encode(message))
        while not _answers(reply := await self.receive(), request_id):
            pass
        return reply

    async def one_cancel(self) -> float:
        request_id = self.next_id = self.next_id + 1
        await self.stdin.send_all(Lines.encode(_prompt(request_id, self.session_id)))
        while not _is_chunk(await self.receive()):
            pass
        await trio.sleep(SETTLE_S)
        start = time.perf_counter()
        await self.stdin.send_all(Lines.encode(_cancel(self.session_id)))
        while not _answers(await self.receive(), request_id):
            pass
        return time.perf_counter() - start

    async def aclose(self) -> None:
        self.process.kill()
        await self.process.wait()


async def main(rounds: int) -> dict[str, Any]:
    spec = AgentSpec(name="light", protocol="acp", command=LIGHT_AGENT)
    times: dict[str, list[float]] = {"floor": [], "floor_trio": [], "light": []}
    blocking = BlockingFloor(LIGHT_AGENT)
    on_trio = await TrioFloor.start(LIGHT_AGENT)
    try:
        async with open_supervisor(agents={"light": spec}) as sup:
            session = await sup.start_session("light", cwd="/")
            for warm_up in [True] * 5 + [False] * rounds:
                figures = (
                    blocking.one_cancel(),
                    await on_trio.one_cancel(),
                    await supervisor_cancel(session, SETTLE_S),
                )
                if not warm_up:
                    for name, value in zip(times, figures, strict=True):
                        times[name].append(value)
    finally:
        blocking.close()
        await on_trio.aclose()
    result: dict[str, Any] = {"rounds": rounds, "settle_ms": SETTLE_S * 1000}
    for name, values in times.items():
        result[f"{name}_p50_ms"] = percentile(values, 0.5) * 1000
        result[f"{name}_p99_ms"] = percentile(values, 0.99) * 1000
    result["ratio_floor_p50"] = result["light_p50_ms"] / result["floor_p50_ms"]
    result["ratio_floor_p99"] = result["light_p99_ms"] / result["floor_p99_ms"]
    result["ratio_floor_trio_p50"] = result["light_p50_ms"] / result["floor_trio_p50_ms"]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    f = trio.run(main, args.rounds)
    print(f"transport floor over {f['rounds']} cancels (light agent, answers at once)")
    print(
        f"  floor  (a JSON-RPC line each way, blocking): p50 {f['floor_p50_ms']:.3f} ms  p99 {f['floor_p99_ms']:.3f} ms"
    )
    print(
        f"  floor on trio (the same, trio pipes):       p50 {f['floor_trio_p50_ms']:.3f} ms  p99 {f['floor_trio_p99_ms']:.3f} ms"
    )
    print(
        f"  ours   (session.cancel -> receipt):         p50 {f['light_p50_ms']:.3f} ms  p99 {f['light_p99_ms']:.3f} ms"
    )
    if args.json:
        print(json.dumps(f))
    print(
        f"ratio ours/floor p50 {f['ratio_floor_p50']:.2f} (p99 {f['ratio_floor_p99']:.2f}),"
        f" ours/floor on trio p50 {f['ratio_floor_trio_p50']:.2f} (target <= 1.5)"
    )
