"""The store's writer process (``python -m supervisor.store.writer_child FD``): opens the store
for writes only (:meth:`~supervisor.store.backend.Backend.open_writes`) and answers three
requests, write a batch, settle and index, until the supervisor closes its end of the socket
(:mod:`supervisor.store.writer_process` says why a process, and what the supervisor keeps).
It imports what the writes need and no more (no trio): it starts at each store's open.

The wire, over a socket pair: frames of a 4-byte length and a pickle (both ends are this
package, from the same installation). The first request is the store's URL (a PostgreSQL
password never shows in ``ps``); then ``("write", Batch)``, ``("settle", idle)`` and
``("index", None)``. Each
answer is ``("ok", value)`` or ``("error", one line)``.
"""

from __future__ import annotations

import pickle
import signal
import socket
import struct
import sys
from typing import Any

from supervisor.store.backend import StoreError

__all__ = ["LENGTH", "frame", "main"]

#: a frame's length, before its pickle
LENGTH = struct.Struct("<I")


def frame(message: object) -> tuple[bytes, bytes]:
    """A frame's two pieces, its length and its pickle (sent together, not joined: a batch's
    pickle is its event bytes, and the event loop copies them once, into the socket)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(body)), body


def _serve(sock: socket.socket) -> None:
    """The child: open the store the first request names, then answer requests until the
    supervisor closes its end."""
    from supervisor.store.url import backend_for

    reader = sock.makefile("rb")

    def requests() -> Any:
        while True:
            head = reader.read(LENGTH.size)
            if len(head) < LENGTH.size:
                return
            (length,) = LENGTH.unpack(head)
            body = reader.read(length)
            if len(body) < length:
                return
            yield pickle.loads(body)

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
