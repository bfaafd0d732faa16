"""Benchmark 4: event throughput, agent -> session -> gateway -> WebSocket subscribers.

A fake agent streams one-word ``agent_message_chunk`` deltas as fast as it can; the subscribers
(1, then 10 WebSocket connections, in their own process: ``bench/ws_receiver.py``) count the
``message.delta`` frames. Side by side in the same run, interleaved, each ``--repeats`` times
(the median is reported):

- **raw**: the baseline: a bare trio-websocket server sending the same frames (the same JSON
  text, built as a dict and serialized once per event, then sent to every connection in turn);
- **ours**: the light fake agent (``bench/fake_light_agent.py``, a subprocess under the shim,
  writing pre-built lines as fast as the pipe takes them), through a :class:`Session` and the
  :class:`Gateway`: pipe, framing, ACP machine, actor, fan-out, ``event_to_wire``, WebSocket;
- **ours, in-memory agent**: the same with ``tests/fakes/memory_agent.py`` in ``flood`` mode
  instead of a process: no pipe and no JSON decoding, so the difference is their cost.

events/s = deltas each subscriber received / (first delta seen .. last delta seen on every
connection); frames/s is that times the subscribers. The gateway batches: the frames queued for
a connection go out in one socket write (the raw server sends each with its own
``send_message``, as a bare trio-websocket server does; the frames are identical, checked below).
A subscriber a full buffer (4096 events) behind holds the agent back (its pipe is not read) rather
than being cut off, so under a flood the figure is the rate the slowest subscriber drains; one
that stalls for 5 s is cut off (``subscription.lagged``) and catches up from the session's history
with ``since_seq``, as a client should, and what the history no longer holds is lost. The share
of deltas lost and the times subscribers were cut off (over all repeats) are shown if any. The
server process's CPU use over the span is shown too (and the subscribers' process's): near 100 %
means that process was the bottleneck.
Last line: the ratios ours/raw events/s, 1 and 10 subscribers (target >= 0.7).
Usage: ``python -m bench.throughput [--words 20000] [--repeats 3] [--profile]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio
from trio_websocket import WebSocketRequest, serve_websocket

from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.client import websocket_url
from supervisor.gateway import Gateway
from supervisor.gateway_protocol import ok_response
from supervisor.wire import event_to_wire

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fakes"))  # read-only use of the memory agent
from memory_agent import Behaviour, MemoryLauncher  # noqa: E402

LIGHT_AGENT = [sys.executable, "-S", str(HERE / "fake_light_agent.py")]
SUBSCRIBERS = (1, 10)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_frame(seq: int, text: str) -> dict[str, Any]:
    """The gateway's wire form of a ``message.delta``, built by hand as a bare server would."""
    return {
        "event": "message.delta",
        "session_id": "s1",
        "seq": seq,
        "timestamp": time.time(),
        "data": {"turn_id": "t1", "text": text, "role": "assistant"},
    }


def check_same_frames() -> None:
    ours = event_to_wire(
        ev.MessageDelta(turn_id="t1", text="w7 ", session_id="s1", seq=9, timestamp=1.5)
    )
    raw = raw_frame(9, "w7 ") | {"timestamp": 1.5}
    assert json.dumps(ours) == json.dumps(raw), (ours, raw)


class Receivers:
    """The subscribers' process for one run."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buffer = b""

    @classmethod
    async def start(cls, url: str, n: int, request: dict[str, Any]) -> Receivers:
        argv = [sys.executable, "-m", "bench.ws_receiver", url, str(n), json.dumps(request)]
        process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, cwd=HERE.parent)
        receivers = cls(process)
        assert (await receivers.line()).get("ready"), "receivers did not subscribe"
        return receivers

    async def line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self.buffer:
            data = await self.process.stdout.receive_some(65536)
            if not data:
                raise EOFError("the receivers' process exited")
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(b"\n")
        result: dict[str, Any] = json.loads(head)
        return result

    async def finish(self) -> dict[str, Any]:
        result = await self.line()
        await self.process.wait()
        return result


def figures(result: dict[str, Any], words: int, n: int, cpu: float) -> dict[str, Any]:
    span = result["span_s"]
    delivered = sum(result["counts"])
    return {
        "cut_off": result["lagged"],
        "gaps": result["gaps"],
        "lost": 1 - delivered / (words * n),
        "events_per_s": delivered / n / span,
        "server_cpu": cpu / span,
        "receiver_cpu": result["cpu_s"] / span,
    }


async def run_raw(n: int, words: int) -> dict[str, Any]:
    """The floor: a bare trio-websocket server, the same frames, no session, no gateway."""
    connections: list[Any] = []
    subscribed = trio.Event()
    done = trio.Event()

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        message = json.loads(await ws.get_message())
        await ws.send_message(json.dumps(ok_response(message["id"], {"last_seq": 0})))
        connections.append(ws)
        if len(connections) == n:
            subscribed.set()
        await done.wait()

    async with trio.open_nursery() as nursery:
        servers = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        port = servers.port
        request = {"id": "r1", "action": "session.subscribe", "payload": {"session_id": "s1"}}
        receivers = await Receivers.start(f"ws://127.0.0.1:{port}/ws", n, request)
        await subscribed.wait()
        cpu = cpu_seconds()
        for seq in range(1, words + 1):
            frame = json.dumps(raw_frame(seq, f"w{seq} "), separators=(",", ":"))
            for ws in connections:
                await ws.send_message(frame)
        end = {"event": "turn.ended", "session_id": "s1", "seq": words + 1, "data": {}}
        for ws in connections:
            await ws.send_message(json.dumps(end))
        result = await receivers.finish()
        cpu = cpu_seconds() - cpu
        done.set()
        nursery.cancel_scope.cancel()
    return figures(result, words, n, cpu)


async def run_ours(n: int, words: int, memory: bool) -> dict[str, Any]:
    if memory:
        launcher = MemoryLauncher(Behaviour(flood=True, words=words))
        spec = AgentSpec(name="flood", protocol="acp", command=["in-memory"])
        supervisor = open_supervisor(agents={"flood": spec}, launcher=launcher)
        prompt = "go"
    else:
        spec = AgentSpec(name="flood", protocol="acp", command=LIGHT_AGENT)
        supervisor = open_supervisor(agents={"flood": spec})
        prompt = f"flood words={words}"
    async with supervisor as sup, trio.open_nursery() as nursery:
        gateway = Gateway(sup, port=0)
        url = await nursery.start(gateway.serve)
        session = await sup.start_session("flood", cwd="/")
        request = {"id": "r1", "action": "session.subscribe", "payload": {"session_id": session.id}}
        receivers = await Receivers.start(websocket_url(url), n, request)
        cpu = cpu_seconds()
        await session.prompt(prompt)
        result = await receivers.finish()
        cpu = cpu_seconds() - cpu
        nursery.cancel_scope.cancel()
    return figures(result, words, n, cpu)


VARIANTS = ("raw", "ours", "ours_memory")


async def main(words: int, repeats: int, profile: str | None) -> dict[str, Any]:
    check_same_frames()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(repeats):
        for n in SUBSCRIBERS:
            for variant in VARIANTS:
                if variant == "raw":
                    run = await run_raw(n, words)
                else:
                    run = await run_ours(n, words, memory=variant == "ours_memory")
                runs.setdefault((variant, n), []).append(run)
    result: dict[str, Any] = {"words": words, "repeats": repeats}
    for (variant, n), values in runs.items():
        for key in ("events_per_s", "server_cpu", "receiver_cpu", "lost"):
            result[f"{variant}_{n}sub_{key}"] = statistics.median(v[key] for v in values)
        result[f"{variant}_{n}sub_cut_off"] = sum(v["cut_off"] for v in values)
        result[f"{variant}_{n}sub_gaps"] = sum(v["gaps"] for v in values)
    for n in SUBSCRIBERS:
        raw = result[f"raw_{n}sub_events_per_s"]
        result[f"ratio_{n}sub"] = result[f"ours_{n}sub_events_per_s"] / raw
        result[f"ratio_memory_{n}sub"] = result[f"ours_memory_{n}sub_events_per_s"] / raw
    if profile is not None:
        await profile_ours(profile, words)
    return result


async def profile_ours(path: str, words: int) -> None:
    """One more run of the 10-subscriber path under pyinstrument (not part of the figures)."""
    from pyinstrument import Profiler

    profiler = Profiler(async_mode="disabled", interval=0.0005)
    profiler.start()
    await run_ours(10, words, memory=False)
    profiler.stop()
    Path(path).write_text(profiler.output_text(unicode=False, color=False, show_all=False))


def report(f: dict[str, Any]) -> None:
    print(
        f"event throughput, {f['words']} one-word deltas per run, median of {f['repeats']} interleaved runs"
    )
    names = {
        "raw": "raw trio-websocket (baseline)",
        "ours": "ours: agent process -> session -> gateway",
        "ours_memory": "ours: in-memory agent -> session -> gateway",
    }
    for n in SUBSCRIBERS:
        print(f"  {n} subscriber{'s' if n > 1 else ''}:")
        for variant in VARIANTS:
            key = f"{variant}_{n}sub"
            print(
                f"    {names[variant]:<45} {f[key + '_events_per_s']:>9.0f} events/s"
                f" {f[key + '_events_per_s'] * n:>9.0f} frames/s"
                f"  server CPU {f[key + '_server_cpu']:>4.0%}  subscribers' CPU {f[key + '_receiver_cpu']:>4.0%}"
                + (
                    f"  cut off {f[key + '_cut_off']}x, lost {f[key + '_lost']:.0%}"
                    if f[key + "_cut_off"]
                    else ""
                )
            )
        print(
            f"    ratio ours/raw {f[f'ratio_{n}sub']:.2f} (in-memory agent {f[f'ratio_memory_{n}sub']:.2f}); target >= 0.7"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--profile", metavar="FILE", help="also profile one 10-subscriber run (pyinstrument)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = trio.run(main, args.words, args.repeats, args.profile)
    report(result)
    if args.json:
        print(json.dumps(result))
    print(
        f"ratio ours/raw events/s, 1 subscriber {result['ratio_1sub']:.2f},"
        f" 10 subscribers {result['ratio_10sub']:.2f} (target >= 0.7)"
    )
