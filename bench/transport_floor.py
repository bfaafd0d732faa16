"""Benchmark: the transport floor of a cancel, and how far ours is from it.

The agent answers at once: ``bench/fake_light_agent.py`` (stdlib) replies to ``session/cancel``
as soon as it has read it. Three runs, interleaved round by round so machine noise hits them
alike; each round is a prompt, its first word, a pause of ``SETTLE_S``, then the clock:

- **floor**: one JSON-RPC line over a pipe and one back, Python on both sides, each side
  serializing (``json.dumps``) and parsing (``json.loads``) its message: the light agent spawned
  directly, driven with blocking ``os.write``/``os.read`` from this process (no event loop),
  from writing ``session/cancel`` to having parsed the ``session/prompt`` response;
- **floor on trio**: the same exchange through trio's pipe streams: what an event loop adds;
- **the shape alone**: the supervisor's shape with nothing in it: a caller hands the cancel to
  an actor task and waits on a reply slot; the actor parked (waiting for its inbox, as here),
  the caller's step writes the line itself, as a session's does (else it goes through the
  mailbox); a reader task posts what it reads to the actor's inbox, and the actor parses it and
  answers the caller (a cancel's answer, the reader parses in its own step while the actor is
  parked, as a session's pump does).
  The same tasks and hops as ours, the floor's JSON, no protocol machine, no events, no
  receipt: what the actor shape costs by itself, so that ours/shape is what our own work costs;
  and the same without the reader task: the actor waits on the pipe itself, under a cancel
  scope a caller's post cancels (the other way for one task to hear both callers and the agent);
- **ours**: ``await session.cancel()`` until the receipt, against the same light agent, under
  the supervisor (containment, actor, ACP machine, receipt, the session ready again).

Each round's window is also timed in this process's CPU (``thread_time``): what it spent working,
whichever of its tasks; the rest of the wall time is the agent's work and the kernel's wake-ups,
about the same on every side, so ours' extra over the shape alone's CPU is our own work.

The pause puts the agent to sleep in ``select`` before the cancel arrives, as it is in real use,
so every side pays the same wake-ups (the agent's, then the reader's). Left out: starting the
turn and the agent's start-up. Last line: the ratios ours/floor and ours/floor on trio, p50
(target: <= 1.5x the floor), and ours/the shape alone.
Usage: ``python -m bench.transport_floor [--rounds 200]``.
"""

from __future__ import annotations

import argparse
import contextlib
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
from bench.opcount import OpCount
from supervisor import AgentSpec, open_supervisor
from supervisor.runtime.reply import Reply

#: What a round's window is measured with besides the clock: bytecodes, or CPU time.
Window = contextlib.AbstractContextManager[Any]

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


class CpuTime:
    """``with cpu: ...`` adds this thread's CPU time inside (user and system, ``thread_time``)
    to ``cpu.seconds``: the part of a round's wall time this process spent working, whichever
    of its tasks; the rest is the agent's work and the kernel's wake-ups."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> CpuTime:
        self._start = time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.thread_time() - self._start


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

    def one_cancel(self, count: Window | None = None) -> float:
        request_id = self.next_id = self.next_id + 1
        os.write(self.stdin, Lines.encode(_prompt(request_id, self.session_id)))
        while not _is_chunk(self.receive()):
            pass
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        with count or contextlib.nullcontext():
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

    async def one_cancel(self, count: Window | None = None) -> float:
        request_id = self.next_id = self.next_id + 1
        await self.stdin.send_all(Lines.encode(_prompt(request_id, self.session_id)))
        while not _is_chunk(await self.receive()):
            pass
        await trio.sleep(SETTLE_S)
        start = time.perf_counter()
        with count or contextlib.nullcontext():
            await self.stdin.send_all(Lines.encode(_cancel(self.session_id)))
            while not _answers(await self.receive(), request_id):
                pass
        return time.perf_counter() - start

    async def aclose(self) -> None:
        self.process.kill()
        await self.process.wait()


class ShapeFloor:
    """The supervisor's shape with nothing in it (see the module docstring): caller, mailbox,
    actor, reader task, inbox, reply slot. Prompts and cancels only, no failure handling.
    ``reader=False``: no reader task; the actor waits on the pipe itself, under a cancel scope
    a caller's post cancels to wake it (the other way to hear both callers and the agent)."""

    def __init__(self, process: trio.Process, *, reader: bool = True) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process, self.stdout = process, process.stdout
        self.reader = reader
        self.stdout_fd = process.stdout.fileno()
        self.wait_scope: trio.CancelScope | None = None  # the actor's wait on the pipe
        self.buffer = b""
        self.stdin_fd = process.stdin.fileno()  # non-blocking, like every trio pipe
        #: (message to send or None, its reply slot, what the slot waits for: "" its answer)
        self.mailbox: deque[tuple[dict[str, Any] | None, Reply[dict[str, Any]], str]] = deque()
        self.inbox_send, self.inbox = trio.open_memory_channel[list[bytes]](16)
        self.waiting: dict[str, Reply[dict[str, Any]]] = {}
        self.parked = False  # the actor waits for its next lines, nothing half done
        self.next_id = 0
        self.session_id = ""

    @classmethod
    async def start(
        cls, argv: list[str], nursery: trio.Nursery, *, reader: bool = True
    ) -> ShapeFloor:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        shape = cls(process, reader=reader)
        if reader:
            nursery.start_soon(shape.read)
        nursery.start_soon(shape.act)
        await shape.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        reply = await shape.call("session/new", {"cwd": "/", "mcpServers": []})
        shape.session_id = reply["result"]["sessionId"]
        return shape

    async def read(self) -> None:
        """The reader task: one inbox item per read; what a cancel waits for is taken in the
        reader's own step while the actor is parked, as a session's pump does."""
        buffer = b""
        while data := await self.stdout.receive_some(65536):
            *complete, buffer = (buffer + data).split(b"\n")
            if self.parked and "cancel" in self.waiting and not self.mailbox:
                self.take(complete)
            else:
                await self.inbox_send.send(complete)

    async def lines(self) -> list[bytes]:
        """The next lines: one inbox item, or (no reader task) what one read of the pipe
        holds, once it is readable or a post wakes the actor (then none)."""
        if self.reader:
            return await self.inbox.receive()
        if not self.waiting:  # nothing to hear from the agent: wait for a post alone
            with trio.CancelScope() as self.wait_scope:
                await trio.sleep_forever()
            return []
        with trio.CancelScope() as self.wait_scope:
            await trio.lowlevel.wait_readable(self.stdout_fd)
        self.wait_scope = None
        try:
            data = os.read(self.stdout_fd, 65536)
        except BlockingIOError:
            return []  # woken by a post
        *complete, self.buffer = (self.buffer + data).split(b"\n")
        return complete

    def wake(self) -> None:
        """A post came: wake the actor wherever it waits."""
        if self.reader:
            with contextlib.suppress(trio.WouldBlock):
                self.inbox_send.send_nowait([])  # as a session's caller does
        elif self.wait_scope is not None:
            self.wait_scope.cancel()

    def handle(
        self, message: dict[str, Any] | None, reply: Reply[dict[str, Any]], waits_for: str
    ) -> None:
        """One call: what it waits for written down, its message written to the agent."""
        if waits_for:
            self.waiting[waits_for] = reply
        elif message is not None:
            self.next_id += 1
            message = {**message, "id": self.next_id}
            self.waiting[str(self.next_id)] = reply
        if message is not None:
            os.write(self.stdin_fd, Lines.encode(message))

    async def act(self) -> None:
        """The actor task: the mailbox first, then one inbox item."""
        while True:
            while self.mailbox:
                self.handle(*self.mailbox.popleft())
            self.parked = True
            try:
                lines = await self.lines()
            finally:
                self.parked = False
            self.take(lines)

    def take(self, lines: list[bytes]) -> None:
        """Parse the agent's lines and answer whoever waits for them."""
        for line in lines:
            if not line:
                continue
            message = json.loads(line)
            if _is_chunk(message):
                waiter = self.waiting.pop("chunk", None)
            elif "id" in message and "method" not in message:
                waiter = self.waiting.pop(str(message["id"]), None)
                cancel = self.waiting.pop("cancel", None)
                if cancel is not None and message.get("result", {}).get("stopReason"):
                    cancel.resolve(message)
            else:
                waiter = None
            if waiter is not None:
                waiter.resolve(message)

    async def post(self, message: dict[str, Any], waits_for: str = "") -> dict[str, Any]:
        """A call, handled at once if the actor is parked (as a session's are), else posted."""
        reply: Reply[dict[str, Any]] = Reply()
        if self.parked and not self.mailbox:
            self.handle(message, reply, waits_for)
            if not self.reader:
                self.wake()  # it may wait for a post alone: now it has the agent to hear
        else:
            self.mailbox.append((message, reply, waits_for))
            self.wake()
        return await reply.wait()

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self.post({"jsonrpc": "2.0", "id": 0, "method": method, "params": params})

    async def one_cancel(self, count: Window | None = None) -> float:
        chunk: Reply[dict[str, Any]] = Reply()
        answered: Reply[dict[str, Any]] = Reply()
        self.mailbox.append((None, chunk, "chunk"))  # wait for the first word
        self.mailbox.append((_prompt(0, self.session_id), answered, ""))
        self.wake()
        await chunk.wait()
        await trio.sleep(SETTLE_S)
        start = time.perf_counter()
        with count or contextlib.nullcontext():
            await self.post(_cancel(self.session_id), "cancel")
        elapsed = time.perf_counter() - start
        await answered.wait()
        return elapsed

    def kill(self) -> None:
        self.process.kill()


async def main(rounds: int, ops_rounds: int = 0) -> dict[str, Any]:
    spec = AgentSpec(name="light", protocol="acp", command=LIGHT_AGENT)
    times: dict[str, list[float]] = {
        "floor": [],
        "floor_trio": [],
        "shape": [],
        "shape_no_reader": [],
        "light": [],
    }
    ops: dict[str, list[int]] = {name: [] for name in times}
    cpu: dict[str, list[float]] = {name: [] for name in times}
    blocking = BlockingFloor(LIGHT_AGENT)
    on_trio = await TrioFloor.start(LIGHT_AGENT)
    try:
        async with open_supervisor(agents={"light": spec}) as sup, trio.open_nursery() as nursery:
            shape = await ShapeFloor.start(LIGHT_AGENT, nursery)
            lean = await ShapeFloor.start(LIGHT_AGENT, nursery, reader=False)
            session = await sup.start_session("light", cwd="/")
            for warm_up in [True] * 5 + [False] * rounds:
                clocks = [CpuTime() for _ in times]
                figures = (
                    blocking.one_cancel(clocks[0]),
                    await on_trio.one_cancel(clocks[1]),
                    await shape.one_cancel(clocks[2]),
                    await lean.one_cancel(clocks[3]),
                    await supervisor_cancel(session, SETTLE_S, clocks[4]),
                )
                if not warm_up:
                    for name, value, clock in zip(times, figures, clocks, strict=True):
                        times[name].append(value)
                        cpu[name].append(clock.seconds)
            for _ in range(ops_rounds):  # untimed: tracing is slow
                counts = [OpCount() for _ in times]
                blocking.one_cancel(counts[0])
                await on_trio.one_cancel(counts[1])
                await shape.one_cancel(counts[2])
                await lean.one_cancel(counts[3])
                await supervisor_cancel(session, SETTLE_S, counts[4])
                for name, count in zip(times, counts, strict=True):
                    ops[name].append(count.ops)
            shape.kill()
            lean.kill()
            nursery.cancel_scope.cancel()
    finally:
        blocking.close()
        await on_trio.aclose()
    result: dict[str, Any] = {"rounds": rounds, "settle_ms": SETTLE_S * 1000}
    for name, values in times.items():
        result[f"{name}_p50_ms"] = percentile(values, 0.5) * 1000
        result[f"{name}_p99_ms"] = percentile(values, 0.99) * 1000
        result[f"{name}_cpu_p50_ms"] = percentile(cpu[name], 0.5) * 1000
        # the rest of each round's wall time: the agent's work and the kernel's wake-ups
        rest = [wall - used for wall, used in zip(values, cpu[name], strict=True)]
        result[f"{name}_rest_p50_ms"] = percentile(rest, 0.5) * 1000
    result["ratio_floor_p50"] = result["light_p50_ms"] / result["floor_p50_ms"]
    result["ratio_floor_p99"] = result["light_p99_ms"] / result["floor_p99_ms"]
    result["ratio_floor_trio_p50"] = result["light_p50_ms"] / result["floor_trio_p50_ms"]
    result["ratio_shape_p50"] = result["light_p50_ms"] / result["shape_p50_ms"]
    result["shape_floor_trio_p50"] = result["shape_p50_ms"] / result["floor_trio_p50_ms"]
    if ops_rounds:
        result["ops_rounds"] = ops_rounds
        for name, counted in ops.items():
            result[f"{name}_ops_p50"] = percentile([float(n) for n in counted], 0.5)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--ops", type=int, default=0, metavar="N", help="also count bytecodes over N rounds"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    f = trio.run(main, args.rounds, args.ops)
    print(f"transport floor over {f['rounds']} cancels (light agent, answers at once)")
    print(
        f"  floor  (a JSON-RPC line each way, blocking): p50 {f['floor_p50_ms']:.3f} ms  p99 {f['floor_p99_ms']:.3f} ms"
    )
    print(
        f"  floor on trio (the same, trio pipes):       p50 {f['floor_trio_p50_ms']:.3f} ms  p99 {f['floor_trio_p99_ms']:.3f} ms"
    )
    print(
        f"  the shape alone (tasks and hops, no work):  p50 {f['shape_p50_ms']:.3f} ms  p99 {f['shape_p99_ms']:.3f} ms"
    )
    print(
        f"  the same, no reader task (actor on pipe):   p50 {f['shape_no_reader_p50_ms']:.3f} ms  p99 {f['shape_no_reader_p99_ms']:.3f} ms"
    )
    print(
        f"  ours   (session.cancel -> receipt):         p50 {f['light_p50_ms']:.3f} ms  p99 {f['light_p99_ms']:.3f} ms"
    )
    print(
        "  this process's CPU per cancel, p50 (the rest of the wall time: the agent, the kernel's"
        " wake-ups):"
    )
    print(
        "   "
        + ", ".join(
            f" {label} {f[name + '_cpu_p50_ms']:.3f} ms (rest {f[name + '_rest_p50_ms']:.3f})"
            for label, name in (
                ("blocking floor", "floor"),
                ("on trio", "floor_trio"),
                ("the shape alone", "shape"),
                ("ours", "light"),
            )
        )
    )
    if args.ops:
        print(
            f"  Python bytecodes per cancel, p50 of {f['ops_rounds']} untimed rounds: blocking floor"
            f" {f['floor_ops_p50']:.0f}, on trio {f['floor_trio_ops_p50']:.0f}, the shape alone"
            f" {f['shape_ops_p50']:.0f} (no reader task {f['shape_no_reader_ops_p50']:.0f}),"
            f" ours {f['light_ops_p50']:.0f}"
        )
    if args.json:
        print(json.dumps(f))
    print(
        f"ratio ours/floor p50 {f['ratio_floor_p50']:.2f} (p99 {f['ratio_floor_p99']:.2f}),"
        f" ours/floor on trio p50 {f['ratio_floor_trio_p50']:.2f} (target <= 1.5);"
        f" ours/the shape alone {f['ratio_shape_p50']:.2f}"
        f" (the shape alone/floor on trio {f['shape_floor_trio_p50']:.2f})"
    )
