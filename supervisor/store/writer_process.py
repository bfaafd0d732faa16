"""The store's batches written by a process of its own, beside the supervisor's: the
supervisor's end (the child is :mod:`supervisor.store.writer_child`).

Why a process and not the worker thread: under a flood of many sessions the event loop is busy
all the time, and a thread gets the GIL back after each call into the database only at the
event loop's switch interval (5 ms), often far later (``design/store.md``, "Off the actor"):
a batch takes tens to hundreds of ms there, the backlog grows to tens of thousands of events
and a quiet session's first word waits for it. A process has a GIL of its own.

The supervisor's process keeps everything else: it opens the store (its lock, its ``owners``
row, the migrations), makes each batch's rows (:meth:`SessionStore._batch`), reads, and
writes what is not a batch (a session taken up, retention's deletes), each of these in turn
with the batches (one at a time, in the order asked). The child opens the store for writes
only (:meth:`~supervisor.store.backend.Backend.open_writes`) and does three things:
:meth:`~supervisor.store.backend.Backend.write` a batch,
:meth:`~supervisor.store.backend.Backend.settle`, and
:meth:`~supervisor.store.backend.Backend.index` what waits for a search.

The wire, over a socket pair, is the child's (:func:`~supervisor.store.writer_child.frame`).

The child goes away with the supervisor, however that goes: it reads the end of its socket
(the kernel closes the supervisor's end when its process dies) and exits. It runs in a
session of its own, so a Ctrl-C at the terminal reaches the supervisor alone, which writes
what is left through it before closing it. A child that dies (killed, out of memory) fails
the batch it had with :class:`StoreError`; the writer tries the batch again as any failed
write (nothing of it is stored twice: ``Backend.write``), and the next request starts a new
child.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from supervisor.store.backend import Batch, StoreError
from supervisor.store.writer_child import HEAD, frame, sizes

__all__ = ["WriterProcess"]

#: How long a child that was asked to go (its socket closed) may take to write what it has
#: and exit before it is killed.
CLOSE_WAIT_S = 5.0
#: The directory this package is in: put first on the child's ``sys.path``, so it runs this
#: very code whatever the supervisor's working directory and ``PYTHONPATH``.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class WriterProcess:
    """The supervisor's end: a child started at the first request, and again after one
    went away. Requests are sent one at a time (the store's writer asks, and waits)."""

    def __init__(self, url: str, where: str) -> None:
        self._url = url
        #: the store, for messages (a URL without its password)
        self.where = where
        self._process: trio.Process | None = None
        #: our end of the socket pair (non-blocking: a call that would block waits in trio)
        self._socket: socket.socket | None = None
        self._buffer = bytearray()
        self._chunk = bytearray(4096)  # (recv_into: answers are small, never allocated anew)
        #: children started so far (1, and one more for each that went away)
        self.started = 0

    @property
    def pid(self) -> int | None:
        """The child's process id (None: none runs now)."""
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Start the child and open the store in it, unless one runs; :class:`StoreError`
        if it cannot."""
        if self._socket is not None:
            return
        ours, theirs = socket.socketpair()
        try:
            environment = dict(os.environ)
            path = environment.get("PYTHONPATH")
            environment["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
            self._process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor.store.writer_child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                # (not the supervisor's stdio: an ACP front door's stdout is its editor's
                # channel, and one held open by a child would outlive the front door)
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                env=environment,
            )
        except OSError as exc:
            ours.close()
            raise StoreError(
                f"cannot start the writer process of the store {self.where}: {exc.strerror}"
            ) from None
        finally:
            theirs.close()
        ours.setblocking(False)
        self._socket = ours
        self._buffer.clear()
        self.started += 1
        try:
            await self._ask(self._url)
        except StoreError:
            await self._gone()  # (it exits: it could not open the store)
            raise

    async def write(self, batch: Batch) -> bool:
        """:meth:`Backend.write` in the child."""
        return bool(await self._ask(("write", batch)))

    async def settle(self, idle: bool) -> None:
        """:meth:`Backend.settle` in the child."""
        await self._ask(("settle", idle))

    async def index(self) -> None:
        """:meth:`Backend.index` in the child."""
        await self._ask(("index", None))

    async def _ask(self, request: object) -> Any:
        if self._socket is None:
            await self.start()
        sock = self._socket
        assert sock is not None
        try:
            await _send(sock, frame(request))
            # (an answer takes the child's time: it is waited for, not tried for first)
            await trio.lowlevel.wait_readable(sock)
            length, count = HEAD.unpack(await self._receive(sock, HEAD.size))
            lengths = sizes(count, await self._receive(sock, 4 * count))
            body = await self._receive(sock, length)
            buffers = [await self._receive(sock, size) for size in lengths]
            kind, value = pickle.loads(body, buffers=buffers)
        except (OSError, EOFError, trio.ClosedResourceError):
            raise StoreError(
                f"the writer process of the store {self.where} went away "
                f"({await self._gone()}); a new one writes the batch again"
            ) from None
        except BaseException:
            # Cancelled mid-frame: what the child answers next is no longer this request's.
            with trio.CancelScope(shield=True):
                await self._gone()
            raise
        if kind == "error":
            raise StoreError(value)
        return value

    async def _receive(self, sock: socket.socket, size: int) -> bytes:
        """``size`` bytes of what the child sends (waiting in trio only when there are not
        enough yet: the rest of an answer is read at once, not after a trip through the
        scheduler)."""
        buffer, chunk = self._buffer, self._chunk
        while len(buffer) < size:
            try:
                got = sock.recv_into(chunk)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            if not got:
                raise EOFError
            buffer += memoryview(chunk)[:got]
        data = bytes(buffer[:size])
        del buffer[:size]
        return data

    async def _gone(self) -> str:
        """End the child (killed if it runs: what it answers is lost) and reap it; how it
        ended."""
        process, sock = self._process, self._socket
        self._process = self._socket = None
        if sock is not None:
            _close(sock)
        if process is None:
            return "not started"
        if process.returncode is None:
            process.kill()
        code = await process.wait()
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    async def aclose(self) -> None:
        """Close the child's socket (it exits once it has answered what it was asked) and
        reap it; killed if it takes over :data:`CLOSE_WAIT_S`."""
        process, sock = self._process, self._socket
        self._process = self._socket = None
        with trio.CancelScope(shield=True):
            if sock is not None:
                _close(sock)
            if process is None:
                return
            with trio.move_on_after(CLOSE_WAIT_S):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


#: the most pieces given to one ``sendmsg`` (the kernel takes at most ``IOV_MAX``, 1024)
_PIECES_AT_ONCE = 512


def _close(sock: socket.socket) -> None:
    """Close our end (a task waiting on it is woken with :class:`trio.ClosedResourceError`)."""
    trio.lowlevel.notify_closing(sock)
    sock.close()


async def _send(sock: socket.socket, pieces: list[bytes | memoryview]) -> None:
    """``pieces`` (byte strings, or views of bytes) one after the other, by ``sendmsg``
    (waiting in trio only while the socket is full)."""
    views = [memoryview(piece) for piece in pieces if len(piece)]
    first = 0
    while first < len(views):
        try:
            sent = sock.sendmsg(views[first : first + _PIECES_AT_ONCE])
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        while sent:
            size = len(views[first])
            if sent < size:
                views[first] = views[first][sent:]
                break
            sent -= size
            first += 1
