"""A light fake ACP agent for the throughput and scale benchmarks: stdlib only, one thread.

Run as ``python -S bench/fake_light_agent.py`` (no ``site``: ~8 MB resident, ~15 ms to start),
so hundreds of them fit on the machine and their own cost stays out of the figures.
It speaks just enough ACP v1 on stdio: ``initialize`` (advertising ``loadSession``),
``session/new``, ``session/load``, ``session/prompt``, ``session/cancel``; stdin EOF ends it.

A prompt streams ``agent_message_chunk`` words: the first at once, then one every
``--interval`` seconds (default 1 s: the scale benchmark's turns mostly wait), until
``session/cancel``, which it answers at once with ``stopReason: cancelled``. A prompt whose text
has ``flood words=N`` writes N one-word chunks as fast as the pipe takes them (pre-built lines,
written in batches), then ends the turn with ``end_turn``: the throughput benchmark's source.
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
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.out = sys.stdout.buffer
        self.session_id: str | None = None
        self.turn_id: object = None  # the running prompt's request id
        self.next_word_at = 0.0
        self.words = 0
        self.cancelled = False

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

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

    def handle(self, message: dict) -> None:
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
            if "flood" in tokens:
                self.flood(request_id, int(tokens.get("words") or 10000))
                return
            self.turn_id = request_id
            self.words = 0
            self.next_word_at = time.monotonic()
        elif method == "session/cancel":
            if self.turn_id is not None:
                turn, self.turn_id = self.turn_id, None
                self.reply(turn, {"stopReason": "cancelled"})
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

    def flood(self, request_id: object, words: int) -> None:
        # The common prefix and suffix are built once; only the word changes.
        head, _, tail = self.chunk(0).partition(b"w0 ")
        for start in range(0, words, BATCH):
            self.out.write(
                b"".join(head + b"w%d " % i + tail for i in range(start, min(words, start + BATCH)))
            )
        self.out.flush()
        self.reply(request_id, {"stopReason": "end_turn"})

    def run(self) -> int:
        pending = b""
        while True:
            timeout = None
            if self.turn_id is not None:
                timeout = max(0.0, self.next_word_at - time.monotonic())
            ready, _, _ = select.select([0], [], [], timeout)
            if ready:
                data = os.read(0, 65536)
                if not data:
                    return 0
                pending += data
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    if raw.strip():
                        self.handle(json.loads(raw))
            if self.turn_id is not None and time.monotonic() >= self.next_word_at:
                self.write(self.chunk(self.words))
                self.words += 1
                self.next_word_at += self.interval


def main() -> int:
    interval = 1.0
    args = sys.argv[1:]
    if "--interval" in args:
        interval = float(args[args.index("--interval") + 1])
    try:
        return Agent(interval).run()
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


if __name__ == "__main__":
    sys.exit(main())
