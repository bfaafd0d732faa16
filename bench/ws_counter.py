"""WebSocket subscribers that are not the bottleneck, for ``bench/throughput.py``:
``python -m bench.ws_counter URL N REQUEST_JSON``.

Opens N connections to URL (``ws://host:port/path?query``) with plain blocking sockets and a
hand-written handshake (``bench/bare_websocket.py``), sends REQUEST_JSON on each (a
``session.subscribe`` request) and waits for its answer; prints ``{"ready": true}`` once all N
are subscribed. Then one ``select`` loop reads every connection in 256 KiB gulps and counts
``message.delta`` frames by their header and the first bytes of their payload (nothing is
decoded, nothing copied), until each connection's ``turn.ended``. Per frame that is a few
hundred nanoseconds, so several of these processes keep up with any server this machine runs.

A connection cut off for lagging (``subscription.lagged``) does what a client should: it
subscribes again with ``since_seq`` and the session replays what it missed; when the history no
longer reaches back (the answer says ``gap``), the deltas in between are lost and the count
shows it. Last, one JSON line: per connection the deltas counted, their payload bytes and the
``time.monotonic()`` of the first and last read that held one (system-wide clock: the parent
compares several of these processes), cut-offs, gaps, one delta's payload as a sample, and
this process's CPU time while counting.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from bench.bare_websocket import FrameScanner, client_handshake, masked_text_frame

#: A payload's kind is found in its first bytes: ``{"event":"message.delta",...``.
LOOK = 48
DELTA = b'"message.delta"'
ENDED = b'"turn.ended"'
LAGGED = b'"subscription.lagged"'
EVENT = b'"event"'
GULP = 256 * 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Connection:
    def __init__(self, url: str, request: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        hello, accept = client_handshake(f"{parts.hostname}:{parts.port}", target)
        self.sock.sendall(hello)
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the server closed during the handshake")
            head += data
        head, _, rest = head.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0] or accept not in head:
            raise RuntimeError(f"handshake refused: {head[:200]!r}")
        self.scanner = FrameScanner()
        self.scanner.feed(rest)
        self.request = json.loads(request)
        self.answers = 0  # responses to our subscribe requests
        self.count = self.payload_bytes = self.lagged = self.gaps = 0
        self.first = self.last = 0.0
        self.ended = False
        self.sample: str | None = None
        self.send(self.request)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(masked_text_frame(json.dumps(message).encode()))

    def receive(self) -> None:
        """One read, and every complete frame in it."""
        data = self.sock.recv(GULP)
        if not data:
            raise EOFError("the server closed the connection")
        now = time.monotonic()
        scanner = self.scanner
        scanner.feed(data)
        buffer = scanner.buffer
        deltas = 0
        for start, end in scanner.frames():
            if buffer.find(DELTA, start, start + LOOK) >= 0:
                deltas += 1
                self.payload_bytes += end - start
                if self.sample is None:
                    self.sample = buffer[start:end].decode()
            elif buffer.find(ENDED, start, start + LOOK) >= 0:
                self.ended = True
            elif buffer.find(LAGGED, start, start + LOOK) >= 0:
                # Cut off for falling behind: catch up as a client should, from history.
                self.lagged += 1
                notice = json.loads(buffer[start:end])
                again = dict(self.request, id=f"again{self.lagged}")
                again["payload"] = dict(again["payload"], since_seq=notice["data"]["last_seq"])
                self.send(again)
            elif buffer.find(EVENT, start, start + LOOK) < 0:  # a response: rare, decode it
                answer = json.loads(buffer[start:end])
                if not answer.get("ok"):
                    raise RuntimeError(f"subscribe refused: {answer}")
                self.answers += 1
                self.gaps += bool(answer.get("result", {}).get("gap"))
        if deltas:
            if not self.count:
                self.first = now
            self.count += deltas
            self.last = now


def main(url: str, n: int, request: str) -> None:
    connections = [Connection(url, request) for _ in range(n)]
    for connection in connections:
        while not connection.answers:
            connection.receive()
    print(json.dumps({"ready": True}), flush=True)
    cpu = cpu_seconds()
    selector = selectors.DefaultSelector()
    for connection in connections:
        selector.register(connection.sock, selectors.EVENT_READ, connection)
    running = sum(not c.ended for c in connections)
    while running:
        for key, _ in selector.select():
            connection = key.data
            connection.receive()
            if connection.ended:
                selector.unregister(connection.sock)
                running -= 1
    cpu = cpu_seconds() - cpu
    report = {
        "counts": [c.count for c in connections],
        "payload_bytes": [c.payload_bytes for c in connections],
        "firsts": [c.first for c in connections],
        "lasts": [c.last for c in connections],
        "lagged": sum(c.lagged for c in connections),
        "gaps": sum(c.gaps for c in connections),
        "sample": next((c.sample for c in connections if c.sample), None),
        "cpu_s": cpu,
    }
    print(json.dumps(report), flush=True)
    for connection in connections:
        connection.sock.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
