"""``agent-supervisor node --metrics``: this host's node's ``GET /metrics``, on stdout.

A node serves ``/metrics`` as any gateway does, with its token, but on its Unix socket (mode
0600, in a 0700 directory): no TCP port is opened for it. This command, run on the host as the
node's user, reads the node's hello file (its token), asks the socket, and prints the metrics
in the Prometheus text format: what a node exporter's textfile collector, a cron job or an SSH
command hands to Prometheus.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Final, TextIO

from supervisor.node.bridge import connect_unix, node_dir
from supervisor.remote.handshake import Hello

__all__ = ["EXIT_NO_NODE", "print_metrics", "scrape"]

#: The exit status when no node runs (or it did not answer): nothing is printed on stdout.
EXIT_NO_NODE: Final = 3
#: The node answers at once: a scrape that takes longer than this is a node in trouble.
SCRAPE_TIMEOUT_S: Final = 10.0


class ScrapeFailed(Exception):
    pass


def scrape(state_dir: Path | None = None, instance: str | None = None) -> bytes:
    """The metrics of the host's current node (or node ``instance``); raises
    :class:`ScrapeFailed` with the reason."""
    directory = node_dir(state_dir)
    hello_file = directory / (f"{instance}.json" if instance else "node.json")
    try:
        hello = Hello.parse(hello_file.read_bytes())
    except OSError as exc:
        raise ScrapeFailed(f"no node runs here ({hello_file}: {exc.strerror})") from None
    if hello is None:
        raise ScrapeFailed(f"{hello_file} is not a node's hello")
    request = (
        f"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1:{hello.port}\r\n"
        f"authorization: Bearer {hello.token}\r\nconnection: close\r\n\r\n"
    ).encode()
    try:
        with connect_unix(directory / f"{hello.instance}.sock") as sock:
            sock.settimeout(SCRAPE_TIMEOUT_S)
            sock.sendall(request)
            response = _read_all(sock)
    except OSError as exc:
        raise ScrapeFailed(f"node {hello.instance} did not answer ({exc})") from None
    head, _, body = response.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        said = body.decode(errors="replace").strip()
        raise ScrapeFailed(f"node {hello.instance} answered {head[:40]!r}: {said}")
    return body


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def print_metrics(state_dir: Path | None, instance: str | None, out: TextIO = sys.stdout) -> int:
    """The command: the metrics on ``out``, or one line on stderr and :data:`EXIT_NO_NODE`."""
    try:
        body = scrape(state_dir, instance)
    except ScrapeFailed as exc:
        print(f"agent-supervisor node --metrics: {exc}", file=sys.stderr)
        return EXIT_NO_NODE
    out.write(body.decode())
    out.flush()
    return 0
