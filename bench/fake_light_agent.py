"""A light fake ACP agent for the benchmarks: stdlib only, one thread, one ``select`` loop.

Run as ``python -S bench/fake_light_agent.py`` (no ``site``: ~8 MB resident, ~15 ms to start),
so hundreds of them fit on the machine and their own cost stays out of the figures.
It speaks just enough ACP v1 on stdio: ``initialize`` (advertising ``loadSession``),
``session/new``, ``session/load``, ``session/prompt``, ``session/cancel``; stdin EOF ends it.

A prompt streams ``agent_message_chunk`` words: the first at once, then one every
``--interval`` seconds (default 1 s: the scale benchmark's turns mostly wait), until
``session/cancel``, which it answers at once with ``stopReason: cancelled``. Prompt words:

- ``flood words=N``: N one-word chunks as fast as the pipe takes them (pre-built lines, written
  in batches), then ``end_turn``: the throughput benchmark's source;
- ``flood forever``: chunks as fast as the pipe takes them until ``session/cancel``: the load of
  the fairness benchmark.

Output goes through one non-blocking outbox: the agent writes a batch only when its stdout pipe
has room, and reads stdin whenever it has data, so a flooding agent still reads a cancel as soon
as it arrives (a blocking write to a full pipe would hide it). A reply queues behind at most one
batch of chunks already produced.

``--log FILE``: for every ``session/cancel`` it reads, it appends ``cancel <t> <pid>`` to FILE,
``t`` being ``time.monotonic()`` just after the ``read()`` that returned the cancel's bytes
(CLOCK_MONOTONIC is system-wide, so the benchmark compares it with its own clock). The line is
written before the reply, so the reader of a receipt always finds it; that costs the reply one
small file write (a few microseconds), and the read timestamp not at all.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

BATCH = 256  # flood lines per write


def line(message: dict) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


class Agent:
    def __init__(self, interval: float, log_path: str | None) -> None:
        self.interval = interval
        self.log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT) if log_path else None
        self.outbox = bytearray()
        self.session_id: str | None = None
        self.turn_id: object = None  # the running prompt's request id
        self.next_word_at = 0.0
        self.words = 0
        self.flood_left = 0  # flood chunks still to write; -1: until cancelled
        self.flood_head = self.flood_tail = b""

    def write(self, data: bytes) -> None:
        self.outbox += data

    def reply(self, request_id: object, result: object) -> None:
        self.write(line({"jsonrpc": "2.0", "id": request_id, "result": result}))

    def chunk(self, index: int) -> bytes:
        return line(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": self.session_id,
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": f"w{index} "},
                    },
                },
            }
        )

    def handle(self, message: dict, read_at: float) -> None:
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            self.reply(
                request_id,
                {
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": True},
                    "agentInfo": {"name": "bench-light-agent", "version": "1"},
                    "authMethods": [],
                },
            )
        elif method == "session/new":
            self.session_id = f"light-{os.getpid()}"
            self.reply(request_id, {"sessionId": self.session_id})
        elif method == "session/load":
            self.session_id = params.get("sessionId")
            self.reply(request_id, None)
        elif method == "session/prompt":
            text = " ".join(b.get("text", "") for b in params.get("prompt", []))
            tokens = dict(t.partition("=")[::2] for t in text.split())
            self.turn_id = request_id
            self.words = 0
            if "flood" in tokens:
                # The common prefix and suffix are built once; only the word changes.
                self.flood_head, _, self.flood_tail = self.chunk(0).partition(b"w0 ")
                self.flood_left = -1 if "forever" in tokens else int(tokens.get("words") or 10000)
            else:
                self.flood_left = 0
                self.next_word_at = time.monotonic()
        elif method == "session/cancel":
            if self.log is not None:
                os.write(self.log, b"cancel %.9f %d\n" % (read_at, os.getpid()))
            if self.turn_id is not None:
                self.end_turn("cancelled")
        elif request_id is not None:
            self.write(
                line(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": {"code": -32601, "message": f"Method not found: {method}"},
                    }
                )
            )

    def end_turn(self, reason: str) -> None:
        turn, self.turn_id = self.turn_id, None
        self.flood_left = 0
        self.reply(turn, {"stopReason": reason})

    def produce(self) -> None:
        """Top up an empty outbox: the next flood batch, or the next word once it is due."""
        if self.turn_id is None or self.outbox:
            return
        if self.flood_left:
            count = BATCH if self.flood_left < 0 else min(BATCH, self.flood_left)
            head, tail, first = self.flood_head, self.flood_tail, self.words
            self.write(b"".join(head + b"w%d " % i + tail for i in range(first, first + count)))
            self.words += count
            if self.flood_left > 0:
                self.flood_left -= count
                if not self.flood_left:
                    self.end_turn("end_turn")
        elif time.monotonic() >= self.next_word_at:
            self.write(self.chunk(self.words))
            self.words += 1
            self.next_word_at += self.interval

    def timeout(self) -> float | None:
        if self.turn_id is None or self.outbox or self.flood_left:
            return None  # woken by stdin, or by room in the pipe
        return max(0.0, self.next_word_at - time.monotonic())

    def run(self) -> int:
        os.set_blocking(1, False)
        pending = b""
        while True:
            self.produce()
            writers = [1] if self.outbox else []
            ready, writable, _ = select.select([0], writers, [], self.timeout())
            if ready:
                data = os.read(0, 65536)
                read_at = time.monotonic()
                if not data:
                    return 0
                pending += data
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    if raw.strip():
                        self.handle(json.loads(raw), read_at)
            if self.outbox and (writable or not writers):
                try:
                    del self.outbox[: os.write(1, self.outbox)]
                except BlockingIOError:
                    pass


def main() -> int:
    interval, log_path = 1.0, None
    args = sys.argv[1:]
    if "--interval" in args:
        interval = float(args[args.index("--interval") + 1])
    if "--log" in args:
        log_path = args[args.index("--log") + 1]
    try:
        return Agent(interval, log_path).run()
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


if __name__ == "__main__":
    sys.exit(main())
