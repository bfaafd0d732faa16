"""Benchmark 4: event throughput, agent -> session -> gateway -> WebSocket subscribers, against a
batched floor, and what each delivered event costs the server in CPU.

One-word ``message.delta`` events go to 1, then 10 WebSocket subscribers. Four servers, side by
side in the same run, interleaved, each ``--repeats`` times (the median is reported):

- **floor**: the least a server must do to deliver the same frames: per event, the wire dict
  built and serialized once with the standard library's ``json`` (compact), framed once; the
  frames of ``FLOOR_BATCH`` events joined and sent to each connection with one ``send_all``, on
  a bare trio socket (WebSocket handshake by hand, ``bench/bare_websocket.py``). It has no
  agent: its events come from nowhere. This is the floor the streaming target is set
  against (ours >= 0.8x its events/s);
- **floor with msgspec**: the same, each frame serialized by the gateway's own encoder
  (``supervisor.wire.codec.dumps``: msgspec, ~10x faster than ``json`` on these dicts) and framed by
  its ``text_frame``: the floor for a server that serializes as ours does. A stricter yardstick
  than the one the target names, so its ratio is shown beside it, not instead of it;
- **floor fed by an agent**: the same, with its events read from the light agent's pipe
  (spawned directly, no containment) and parsed (``json.loads`` per line) first: what the
  agent's pipe and JSON add to the floor;
- **ours**: the light fake agent (``bench/fake_light_agent.py``, writing pre-built lines as fast
  as the pipe takes them) through the supervisor's containment, a :class:`Session` and the
  :class:`Gateway`: pipe, framing, ACP machine, actor, fan-out, wire form, WebSocket;
- **ours, in-memory agent**: the same with ``supervisor/testing/_acp.py`` in ``flood`` mode
  instead of a process: no pipe and no JSON decoding, but the agent's own work now runs in the
  server process and counts in its CPU, and it hands over one message per scheduling step,
  where a pipe hands the session a whole read's worth of lines at once (one inbox item, one pass
  of trio's run loop): so this row shows the cost per inbox item, which batching by read removes
  for real agents; it is not a floor of ours.

The subscribers are not the bottleneck: ``bench/ws_counter.py`` processes (up to
``--receiver-processes``, the connections spread over them), plain sockets that count delta
frames from their headers and first bytes without decoding them. Each run shows their CPU (the
busiest receiver process's share of a core): well below 100 % means they kept up.

Figures: **events/s** = deltas each subscriber received / span (first delta seen on any
connection .. last delta on every connection, ``time.monotonic()`` in the receivers); frames/s
is that times the subscribers. **Server CPU per event** = the server process's CPU time (user
+ system; for ours the supervisor and gateway process, not the agent, not the receivers) from
the prompt (floor: its first frame) until the receivers reported, over the distinct events
delivered; per frame, over events x subscribers. That window is slightly wider than the span, so
idle moments at its edges count, alike for every server. Left out: the agent's own CPU (its own
process), connection set-up, and the cost of a receiver that decodes what it gets.
A subscriber a full buffer behind holds the agent back rather than being cut off; one cut off
(``subscription.lagged``) resubscribes with ``since_seq``; deltas lost and cut-offs are shown
if any. One delta frame of the floor and of ours are printed: the same fields, the same size.
The machine's speed drifts over seconds (both the floor's CPU per event and ours swing by half
from run to run, with the same passes, reads and writes: ``--diagnose``), so ours runs between
the two floors it is compared with, and each of its runs is also compared with the floor's run
beside it: the median and range of those pairs are shown beside the ratio of the medians.
Last line: the ratios ours/floor events/s (target >= 0.8; and against the floor with
msgspec) and our server CPU per event (target <= 15 us).

``--ops WORDS`` instead counts the Python bytecodes the server runs per streamed event (one
untimed run, ``bench/opcount.py``): a figure load does not move. ``--diagnose RUNS`` instead
traces RUNS runs of ours, each beside a run of the floor (``bench/pass_trace.py``: passes,
epoll waits, task steps, lines per pipe read and per actor run, frames per socket write,
collections, context switches). Both with one subscriber, or ``--subscribers N``. Usage:
``python -m bench.throughput [--words 20000] [--repeats 5] [--receiver-processes 5]
[--profile FILE] [--ops WORDS] [--diagnose RUNS] [--subscribers 1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import trio

from bench.bare_websocket import FrameScanner, server_handshake, text_frame, unmask
from bench.opcount import OpCount
from bench.transport_floor import Lines
from supervisor import AgentSpec, open_supervisor
from supervisor.client import websocket_url
from supervisor.gateway import Gateway
from supervisor.observe import Metrics
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import dumps
from supervisor.wire.frames import text_frame as gateway_text_frame

HERE = Path(__file__).resolve().parent

LIGHT_AGENT = [sys.executable, "-S", str(HERE / "fake_light_agent.py")]
SUBSCRIBERS = (1, 10)
#: Events per ``send_all`` in the floor: the light agent's write batch, and the most events the
#: gateway takes from one subscription per write (``GatewayLimits.batch_events``).
FLOOR_BATCH = 256
VARIANTS = ("floor", "floor_msgspec", "floor_piped", "ours", "ours_memory")
#: The order they run in: ours between the two floors it is compared with, so each of its runs
#: has a run of each floor next to it (the machine's speed drifts over seconds: see ``main``).
RUN_ORDER = ("floor", "ours", "floor_msgspec", "floor_piped", "ours_memory")
NAMES = {
    "floor": "floor: bare socket, batched sends (json)",
    "floor_msgspec": "floor with msgspec (the gateway's encoder)",
    "floor_piped": "floor fed by the agent's pipe",
    "ours": "ours: agent process -> session -> gateway",
    "ours_memory": "ours: in-memory agent -> session -> gateway",
}
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def writer_cpu_seconds(sup: Any) -> float:
    """The CPU time of ``sup``'s store's writer process (0 without one), part of the
    server's: its ``schedstat`` (ns on a CPU; ``getrusage`` counts children only once
    reaped)."""
    writer = sup.store.writer_process if sup.store is not None else None
    if writer is None or writer.pid is None:
        return 0.0
    with open(f"/proc/{writer.pid}/schedstat") as stat:
        return int(stat.read().split()[0]) / 1e9


def stdlib_frame(message: dict[str, Any]) -> bytes:
    """The floor's frame: compact ``json``, framed by hand (``bench/bare_websocket.py``)."""
    return text_frame(_ENCODER.encode(message).encode())


def gateway_frame(message: dict[str, Any]) -> bytes:
    """The floor with msgspec's frame: the gateway's own encoder and framing."""
    return gateway_text_frame(dumps(message))


def delta_frame(seq: int, text: str, frame: Callable[[dict[str, Any]], bytes]) -> bytes:
    """A ``message.delta`` on the wire, as the floor sends it: serialized once, framed once."""
    event = {
        "event": "message.delta",
        "session_id": "s1",
        "seq": seq,
        "timestamp": time.time(),
        "data": {"turn_id": "t1", "text": text, "role": "assistant"},
    }
    return frame(event)


def shape(value: Any) -> Any:
    """A JSON value's structure: its keys, recursively, and the types of its leaves."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return type(value).__name__


class Receivers:
    """The subscribers of one run: a few ``bench/ws_counter.py`` processes."""

    def __init__(self, processes: list[trio.Process]) -> None:
        self.processes = processes
        self.buffers = [b""] * len(processes)

    @classmethod
    async def spawn(cls, url: str, n: int, request: dict[str, Any], most: int) -> Receivers:
        """Start the processes; they connect and subscribe by themselves (see :meth:`ready`)."""
        count = min(n, most)
        shares = [n // count + (i < n % count) for i in range(count)]
        processes = []
        for share in shares:
            argv = [sys.executable, "-m", "bench.ws_counter", url, str(share), json.dumps(request)]
            processes.append(
                await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, cwd=HERE.parent)
            )
        return cls(processes)

    async def ready(self) -> None:
        """Until every connection is subscribed."""
        for index in range(len(self.processes)):
            assert (await self.line(index)).get("ready"), "receivers did not subscribe"

    async def line(self, index: int) -> dict[str, Any]:
        stdout = self.processes[index].stdout
        assert stdout is not None
        while b"\n" not in self.buffers[index]:
            data = await stdout.receive_some(65536)
            if not data:
                raise EOFError("a receivers' process exited")
            self.buffers[index] += data
        head, _, self.buffers[index] = self.buffers[index].partition(b"\n")
        result: dict[str, Any] = json.loads(head)
        return result

    async def finish(self) -> dict[str, Any]:
        reports = [await self.line(index) for index in range(len(self.processes))]
        for process in self.processes:
            await process.wait()

        def every(key: str) -> list[Any]:
            return [value for report in reports for value in report[key]]

        counts = every("counts")
        return {
            "counts": counts,
            "payload_bytes": sum(every("payload_bytes")),
            "span_s": max(every("lasts"))
            - min(t for t, c in zip(every("firsts"), counts, strict=True) if c),
            "lagged": sum(r["lagged"] for r in reports),
            "gaps": sum(r["gaps"] for r in reports),
            "cpu_s": [r["cpu_s"] for r in reports],
            "sample": next((r["sample"] for r in reports if r["sample"]), None),
        }


def figures(result: dict[str, Any], words: int, n: int, cpu: float) -> dict[str, Any]:
    span = result["span_s"]
    delivered = sum(result["counts"])
    events = delivered / n
    return {
        "cut_off": result["lagged"],
        "gaps": result["gaps"],
        "lost": 1 - delivered / (words * n),
        "events_per_s": events / span,
        "frames_per_s": delivered / span,
        "server_cpu": cpu / span,
        "server_us_per_event": cpu / events * 1e6,
        "server_us_per_frame": cpu / delivered * 1e6,
        "receiver_cpu": sum(result["cpu_s"]) / span,
        "receiver_cpu_max": max(result["cpu_s"]) / span,
        "frame_bytes": result["payload_bytes"] / delivered,
        "sample": result["sample"],
    }


async def accept_subscribers(listener: trio.SocketListener, n: int) -> list[trio.SocketStream]:
    """Accept ``n`` WebSocket connections by hand and answer each one's subscribe request."""
    streams = []
    for _ in range(n):
        stream = await listener.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(65536)
        head, _, rest = head.partition(b"\r\n\r\n")
        await stream.send_all(server_handshake(head))
        scanner = FrameScanner()
        scanner.feed(rest)
        while not (frames := scanner.frames()):
            scanner.feed(await stream.receive_some(65536))
        request = json.loads(unmask(scanner.buffer, *frames[0]))
        answer = {"id": request["id"], "ok": True, "result": {"last_seq": 0}}
        await stream.send_all(text_frame(_ENCODER.encode(answer).encode()))
        streams.append(stream)
    return streams


async def send_batch(streams: list[trio.SocketStream], frames: list[bytes]) -> None:
    data = b"".join(frames)
    for stream in streams:
        await stream.send_all(data)


async def generated(words: int) -> AsyncIterator[list[str]]:
    """The floor's words from nowhere, ``FLOOR_BATCH`` at a time."""
    for start in range(0, words, FLOOR_BATCH):
        yield [f"w{index} " for index in range(start, min(words, start + FLOOR_BATCH))]


async def run_floor(
    n: int, words: int, most: int, piped: bool, frame: Callable[[dict[str, Any]], bytes]
) -> dict[str, Any]:
    """The floor: the same frames, batched, on a bare socket; its words from nowhere or from
    the light agent's pipe; each serialized and framed by ``frame``."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    request = {"id": "r1", "action": "session.subscribe", "payload": {"session_id": "s1"}}
    receivers = await Receivers.spawn(f"ws://127.0.0.1:{port}/ws", n, request, most)
    streams = await accept_subscribers(listeners[0], n)
    await receivers.ready()
    agent = await FloorAgent.start() if piped else None
    cpu = cpu_seconds()
    seq = 0
    async for texts in agent.flood(words) if agent is not None else generated(words):
        batch = []
        for text in texts:
            seq += 1
            batch.append(delta_frame(seq, text, frame))
        await send_batch(streams, batch)
    ended = {"event": "turn.ended", "session_id": "s1", "seq": seq + 1, "data": {}}
    await send_batch(streams, [frame(ended)])
    result = await receivers.finish()
    cpu = cpu_seconds() - cpu
    if agent is not None:
        await agent.aclose()
    for stream in [*streams, *listeners]:
        await stream.aclose()
    return figures(result, words, n, cpu)


class FloorAgent:
    """The light agent spawned directly: its flood lines read from the pipe and parsed."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process, self.stdin, self.stdout = process, process.stdin, process.stdout
        self.lines = Lines()

    @classmethod
    async def start(cls) -> FloorAgent:
        process = await trio.lowlevel.open_process(
            LIGHT_AGENT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        agent = cls(process)
        await agent.stdin.send_all(
            Lines.encode({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
            + Lines.encode({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {}})
        )
        while not any(m.get("id") == 2 for m in agent.lines.messages):
            agent.lines.feed(await agent.stdout.receive_some(65536))
        agent.lines.messages.clear()
        return agent

    async def flood(self, words: int) -> AsyncIterator[list[str]]:
        """The chunks' texts, in batches of at least ``FLOOR_BATCH`` (one or more pipe reads)."""
        prompt = {"sessionId": "x", "prompt": [{"type": "text", "text": f"flood words={words}"}]}
        await self.stdin.send_all(
            Lines.encode({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt})
        )
        texts: list[str] = []
        while True:
            self.lines.feed(await self.stdout.receive_some(262144))
            messages = self.lines.messages
            done = False
            while messages:
                message = messages.popleft()
                if message.get("id") == 3:
                    done = True
                else:
                    texts.append(message["params"]["update"]["content"]["text"])
            if texts and (done or len(texts) >= FLOOR_BATCH):
                yield texts
                texts = []
            if done:
                return

    async def aclose(self) -> None:
        await self.stdin.aclose()
        await self.process.wait()


async def run_ours(
    n: int,
    words: int,
    most: int,
    memory: bool,
    window: contextlib.AbstractContextManager[Any] | None = None,
    metrics: bool = False,
    store: str | None = None,
) -> dict[str, Any]:
    """One run of ours; ``window``: a context (a bytecode count, a trace) around the flood,
    from the prompt until the receivers reported; ``metrics``: the supervisor keeps them
    (``bench/metrics_cost.py``); ``store``: its session store's URL (``bench/store_cost.py``)."""
    kept = Metrics() if metrics else None
    if memory:
        launcher = AcpLauncher(AcpBehaviour(flood=True, words=words))
        spec = AgentSpec(name="flood", protocol="acp", command=["in-memory"])
        supervisor = open_supervisor(
            agents={"flood": spec}, launcher=launcher, metrics=kept, store=store
        )
        prompt = "go"
    else:
        spec = AgentSpec(name="flood", protocol="acp", command=LIGHT_AGENT)
        supervisor = open_supervisor(agents={"flood": spec}, metrics=kept, store=store)
        prompt = f"flood words={words}"
    async with supervisor as sup, trio.open_nursery() as nursery:
        gateway = Gateway(sup, port=0)
        url = await nursery.start(gateway.serve)
        session = await sup.start_session("flood", cwd="/")
        request = {"id": "r1", "action": "session.subscribe", "payload": {"session_id": session.id}}
        receivers = await Receivers.spawn(websocket_url(url), n, request, most)
        await receivers.ready()
        cpu = cpu_seconds() + writer_cpu_seconds(sup)
        with window or contextlib.nullcontext():
            await session.prompt(prompt)
            result = await receivers.finish()
        cpu = cpu_seconds() + writer_cpu_seconds(sup) - cpu
        nursery.cancel_scope.cancel()
    return figures(result, words, n, cpu)


async def diagnose(words: int, runs: int, most: int, n: int) -> None:
    """``runs`` runs of the floor and of ours, ``n`` subscribers, interleaved; each of ours
    traced (``bench/pass_trace.py``): what differs between a fast run and a slow one."""
    from bench import pass_trace

    for index in range(runs):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        floor = await run_floor(n, words, most, piped=False, frame=stdlib_frame)
        floor_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        trace = pass_trace.Traced()
        ours = await run_ours(n, words, most, memory=False, window=trace)
        print(
            f"  run {index + 1}: ratio {ours['events_per_s'] / floor['events_per_s']:.2f};"
            f" floor {floor['events_per_s']:.0f} events/s {floor['server_us_per_event']:.1f}"
            f" us/event, {floor_faults * 1000 / words:.1f} page faults per 1,000 events (whole"
            f" run); ours {ours['events_per_s']:.0f} events/s"
            f" {ours['server_us_per_event']:.1f} us/event"
        )
        print(trace.report(words))


async def count_ours(words: int, most: int, n: int) -> float:
    """Python bytecodes the server runs per streamed event, ``n`` subscribers (an untimed run
    of its own: tracing is slow): a count machine load does not move (``bench/opcount.py``)."""
    count = OpCount()
    await run_ours(n, words, most, memory=False, window=count)
    return count.ops / words


async def one_run(variant: str, n: int, words: int, most: int) -> dict[str, Any]:
    if variant.startswith("floor"):
        frame = gateway_frame if variant == "floor_msgspec" else stdlib_frame
        return await run_floor(n, words, most, piped=variant == "floor_piped", frame=frame)
    return await run_ours(n, words, most, memory=variant == "ours_memory")


async def main(words: int, repeats: int, most: int, profile: str | None) -> dict[str, Any]:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(repeats):
        for n in SUBSCRIBERS:
            for variant in RUN_ORDER:
                runs.setdefault((variant, n), []).append(await one_run(variant, n, words, most))
    result: dict[str, Any] = {"words": words, "repeats": repeats, "receiver_processes": most}
    samples = {}
    for (variant, n), values in runs.items():
        for key in values[0]:
            if key in ("cut_off", "gaps"):
                result[f"{variant}_{n}sub_{key}"] = sum(v[key] for v in values)
            elif key == "sample":
                samples[variant] = values[0][key]
            else:
                result[f"{variant}_{n}sub_{key}"] = statistics.median(v[key] for v in values)
    floor, fast_floor, ours = (json.loads(samples[v]) for v in ("floor", "floor_msgspec", "ours"))
    if not shape(floor) == shape(fast_floor) == shape(ours):
        raise RuntimeError(f"the floors' frames are not ours: {floor}, {fast_floor}, {ours}")
    result["floor_sample"], result["ours_sample"] = samples["floor"], samples["ours"]
    for n in SUBSCRIBERS:
        floor_rate = result[f"floor_{n}sub_events_per_s"]
        result[f"ratio_{n}sub"] = result[f"ours_{n}sub_events_per_s"] / floor_rate
        result[f"ratio_piped_{n}sub"] = (
            result[f"ours_{n}sub_events_per_s"] / result[f"floor_piped_{n}sub_events_per_s"]
        )
        result[f"ratio_memory_{n}sub"] = result[f"ours_memory_{n}sub_events_per_s"] / floor_rate
        result[f"cpu_ratio_{n}sub"] = (
            result[f"ours_{n}sub_server_us_per_event"] / result[f"floor_{n}sub_server_us_per_event"]
        )
        result[f"ratio_msgspec_{n}sub"] = (
            result[f"ours_{n}sub_events_per_s"] / result[f"floor_msgspec_{n}sub_events_per_s"]
        )
        result[f"cpu_ratio_msgspec_{n}sub"] = (
            result[f"ours_{n}sub_server_us_per_event"]
            / result[f"floor_msgspec_{n}sub_server_us_per_event"]
        )
        for name, floor_variant in (("paired", "floor"), ("paired_msgspec", "floor_msgspec")):
            pairs = [
                ours["events_per_s"] / floor["events_per_s"]
                for ours, floor in zip(runs["ours", n], runs[floor_variant, n], strict=True)
            ]
            result[f"{name}_{n}sub"] = statistics.median(pairs)
            result[f"{name}_{n}sub_range"] = (min(pairs), max(pairs))
    if profile is not None:
        await profile_ours(profile, words, most)
    return result


async def profile_ours(path: str, words: int, most: int) -> None:
    """One more run of the 10-subscriber path under pyinstrument (not part of the figures)."""
    from pyinstrument import Profiler

    profiler = Profiler(async_mode="disabled", interval=0.0005)
    profiler.start()
    await run_ours(10, words, most, memory=False)
    profiler.stop()
    Path(path).write_text(profiler.output_text(unicode=False, color=False, show_all=False))


def report(f: dict[str, Any]) -> None:
    print(
        f"event throughput, {f['words']} one-word deltas per run, median of {f['repeats']}"
        f" interleaved runs, receivers in up to {f['receiver_processes']} processes"
    )
    for n in SUBSCRIBERS:
        print(f"  {n} subscriber{'s' if n > 1 else ''}:")
        for variant in VARIANTS:
            key = f"{variant}_{n}sub"
            print(
                f"    {NAMES[variant]:<44} {f[key + '_events_per_s']:>7.0f} events/s"
                f" {f[key + '_frames_per_s']:>7.0f} frames/s"
                f"  server CPU {f[key + '_server_cpu']:>4.0%},"
                f" {f[key + '_server_us_per_event']:>5.1f} us/event"
                f" {f[key + '_server_us_per_frame']:>5.1f} us/frame"
                f"  receivers' CPU {f[key + '_receiver_cpu']:>4.0%}"
                f" (busiest {f[key + '_receiver_cpu_max']:.0%})"
                + (
                    f"  cut off {f[key + '_cut_off']}x, lost {f[key + '_lost']:.0%}"
                    if f[key + "_cut_off"] or f[key + "_lost"]
                    else ""
                )
            )
        print(
            f"    ratio ours/floor events/s {f[f'ratio_{n}sub']:.2f} (target >= 0.8;"
            f" against the floor fed by the agent {f[f'ratio_piped_{n}sub']:.2f},"
            f" in-memory agent/floor {f[f'ratio_memory_{n}sub']:.2f});"
            f" server CPU per event ours/floor {f[f'cpu_ratio_{n}sub']:.2f}"
        )
        print(
            f"    against the floor with msgspec: events/s {f[f'ratio_msgspec_{n}sub']:.2f},"
            f" server CPU per event {f[f'cpu_ratio_msgspec_{n}sub']:.2f}"
        )
        low, high = f[f"paired_{n}sub_range"]
        fast_low, fast_high = f[f"paired_msgspec_{n}sub_range"]
        print(
            f"    each run of ours against the floor's run beside it: median"
            f" {f[f'paired_{n}sub']:.2f} ({low:.2f}-{high:.2f}); against the floor with"
            f" msgspec {f[f'paired_msgspec_{n}sub']:.2f} ({fast_low:.2f}-{fast_high:.2f})"
        )
    print(f"  a floor delta frame ({f['floor_1sub_frame_bytes']:.0f} bytes): {f['floor_sample']}")
    print(f"  one of ours         ({f['ours_1sub_frame_bytes']:.0f} bytes): {f['ours_sample']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--receiver-processes", type=int, default=5)
    parser.add_argument(
        "--profile", metavar="FILE", help="also profile one 10-subscriber run (pyinstrument)"
    )
    parser.add_argument(
        "--ops",
        type=int,
        metavar="WORDS",
        help="only count the Python bytecodes per streamed event, over one run of WORDS",
    )
    parser.add_argument(
        "--diagnose",
        type=int,
        metavar="RUNS",
        help="only trace RUNS runs of ours beside the floor (bench/pass_trace.py)",
    )
    parser.add_argument(
        "--subscribers", type=int, default=1, help="for --ops and --diagnose (default 1)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.diagnose:
        trio.run(diagnose, args.words, args.diagnose, args.receiver_processes, args.subscribers)
        sys.exit(0)
    if args.ops:
        n = args.subscribers
        ops = trio.run(count_ours, args.ops, args.receiver_processes, n)
        print(
            f"Python bytecodes per streamed event, {n} subscriber{'s' if n > 1 else ''},"
            f" {args.ops} events: {ops:.0f}"
        )
        sys.exit(0)
    result = trio.run(main, args.words, args.repeats, args.receiver_processes, args.profile)
    report(result)
    if args.json:
        print(json.dumps(result))
    print(
        f"ratio ours/floor events/s, 1 subscriber {result['ratio_1sub']:.2f}"
        f" (paired runs: median {result['paired_1sub']:.2f},"
        f" {result['paired_1sub_range'][0]:.2f}-{result['paired_1sub_range'][1]:.2f}),"
        f" 10 subscribers {result['ratio_10sub']:.2f} (target >= 0.8); server CPU per event,"
        f" 1 subscriber {result['ours_1sub_server_us_per_event']:.1f} us"
        f" (floor {result['floor_1sub_server_us_per_event']:.1f} us; target <= 15 us);"
        f" against the floor with msgspec, 1 subscriber {result['ratio_msgspec_1sub']:.2f}"
        f" (its CPU per event {result['floor_msgspec_1sub_server_us_per_event']:.1f} us)"
    )
