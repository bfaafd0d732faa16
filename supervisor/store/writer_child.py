"""The store's writer process (``python -m supervisor.store.writer_child FD``): opens the store
for writes only (:meth:`~supervisor.store.backend.Backend.open_writes`) and answers three
requests, write a batch, settle and index, until the supervisor closes its end of the socket
(:mod:`supervisor.store.writer_process` says why a process, and what the supervisor keeps).
It imports what the writes need and no more (no trio): it starts at each store's open.

The wire, over a socket pair: frames of a pickle (protocol 5) and the buffers it keeps out of
band, a batch's event bytes (:meth:`~supervisor.store.backend.EventRun.__reduce_ex__`): a head
of the pickle's length and the buffers' count, each buffer's length, the pickle, the buffers
(both ends are this package, from the same installation). The first request is the store's
URL (a PostgreSQL password never shows in ``ps``); then ``("write", Batch)``, ``("settle",
idle)`` and ``("index", None)``. Each answer is ``("ok", value)`` or ``("error", one line)``.
"""

from __future__ import annotations

import pickle
import signal
import socket
import struct
import sys
from typing import Any

from supervisor.store.backend import StoreError

__all__ = ["HEAD", "frame", "main", "sizes"]

#: a frame's head: its pickle's length and how many out-of-band buffers follow the pickle
#: (each one's length comes after the head, as :func:`sizes` reads them)
HEAD = struct.Struct("<II")


def frame(message: object) -> list[bytes | memoryview]:
    """A frame's pieces, to be sent together and not joined: the event loop copies a batch's
    event bytes once, into the socket, never into the pickle first (a copy of each batch's
    bytes: ~30 ns an event under a one-session flood here)."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    lengths = struct.pack(f"<{len(views)}I", *map(len, views))
    return [HEAD.pack(len(body), len(views)) + lengths, body, *views]


def sizes(count: int, data: bytes) -> tuple[int, ...]:
    """The lengths of a frame's ``count`` buffers, from the ``4 * count`` bytes after its head."""
    return struct.unpack(f"<{count}I", data)


def _serve(sock: socket.socket) -> None:
    """The child: open the store the first request names, then answer requests until the
    supervisor closes its end."""
    from supervisor.store.url import backend_for

    reader = sock.makefile("rb")

    def read(size: int) -> bytes:
        data = reader.read(size)
        if len(data) < size:
            raise EOFError
        return data

    def requests() -> Any:
        while True:
            try:
                length, count = HEAD.unpack(read(HEAD.size))
                lengths = sizes(count, read(4 * count))
                body = read(length)
                buffers = [read(size) for size in lengths]
            except EOFError:
                return
            yield pickle.loads(body, buffers=buffers)

    def answer(kind: str, value: object) -> None:
        sock.sendall(b"".join(frame((kind, value))))

    incoming = requests()
    url = next(incoming, None)
    if url is None:
        return
    try:
        backend = backend_for(url)
        if backend is None:
            raise StoreError(f"the store URL {url!r} names no store")
        backend.open_writes()
    except StoreError as exc:
        answer("error", str(exc))
        return
    answer("ok", None)
    try:
        for what, argument in incoming:
            try:
                if what == "write":
                    answer("ok", backend.write(argument))
                elif what == "settle":
                    backend.settle(argument)
                    answer("ok", None)
                else:
                    backend.index()
                    answer("ok", None)
            except StoreError as exc:
                answer("error", str(exc))
            except Exception as exc:  # a backend's bug: said, and the supervisor goes on
                answer("error", f"the writer process of the store {backend.where} failed: {exc!r}")
    finally:
        backend.close()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the supervisor says when to go)
    with socket.socket(fileno=int(sys.argv[1])) as sock:
        _serve(sock)


if __name__ == "__main__":
    main()
