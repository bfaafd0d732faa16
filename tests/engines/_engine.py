"""What both fake engines share: a threaded server, HTTP/1.1 requests read off a socket, and
an exec'd command run as a "container" process that outlives the client.

A real engine's exec does not kill the command when its client goes away (moby#9098,
kubernetes#89031): it closes the command's stdin and keeps draining its output. So does
:class:`Exec` here: the command runs in a session (process group) of its own, marked with
``FAKE_ENGINE_CONTAINER=NAME@ENGINE`` in its environment (``ENGINE`` this engine's own random
id, so engines of tests running side by side never see each other's containers) so a test can
find whatever the "container" still runs; only :meth:`Engine.close` (a container removed)
kills it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Final
from urllib.parse import urlsplit

import attrs
import psutil

#: The environment variable that marks every process of a fake container.
CONTAINER_VARIABLE: Final = "FAKE_ENGINE_CONTAINER"
_MAX_HEAD: Final = 64 * 1024


@attrs.frozen
class Request:
    method: str
    target: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    #: the raw request head (for a WebSocket handshake handed to wsproto)
    head: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> str:
        return urlsplit(self.target).query

    def wants(self, name: str, value: str) -> bool:
        return value in self.headers.get(name, "").lower()


class Reader:
    """Requests off one connection, in order; bytes read past a request stay buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def request(self) -> Request | None:
        """The next request (None: the client closed the connection)."""
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > _MAX_HEAD or not self._fill():
                return None
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
        else:
            body = self.exactly(int(headers.get("content-length", "0")))
        return Request(method, target, headers, body, head + b"\r\n\r\n")

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise ConnectionError("the client closed the connection mid-body")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._fill():
                raise ConnectionError("the client closed the connection mid-body")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _chunked(self) -> bytes:
        body = b""
        while size := int(self._line().split(b";")[0], 16):
            body += self.exactly(size)
            self._line()
        while self._line():  # trailers
            pass
        return body


def response(
    status: str, body: bytes = b"", content_type: str = "application/json", **headers: str
) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Exec:
    """One exec'd command: a process of a "container", its pipes pumped by threads.

    ``on_output(stream, data)`` gets stdout (1) and stderr (2) as they come, and
    ``(stream, b"")`` at each one's end; once the client is gone (``detach``) output is read
    and dropped, so the command never blocks on a full pipe, and is never signalled."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, marker: str
    ) -> None:
        environment = {**os.environ, **env, CONTAINER_VARIABLE: marker}
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            cwd=cwd,
            start_new_session=True,
        )
        self._on_output: Callable[[int, bytes], None] | None = None
        self._lock = threading.Lock()
        self.exit_code: int | None = None
        self.finished = threading.Event()

    def start(self, on_output: Callable[[int, bytes], None]) -> None:
        self._on_output = on_output
        pumps = [
            threading.Thread(target=self._pump, args=(number, pipe), daemon=True)
            for number, pipe in ((1, self.process.stdout), (2, self.process.stderr))
        ]
        for pump in pumps:
            pump.start()

        def reap() -> None:
            for pump in pumps:
                pump.join()
            self.exit_code = self.process.wait()
            self.finished.set()

        threading.Thread(target=reap, daemon=True).start()

    def _pump(self, number: int, pipe: IO[bytes]) -> None:
        while data := pipe.read1(65536):  # type: ignore[attr-defined]  # (a BufferedReader)
            self._emit(number, data)
        self._emit(number, b"")

    def _emit(self, number: int, data: bytes) -> None:
        with self._lock:
            if self._on_output is None:
                return
            try:
                self._on_output(number, data)
            except OSError:
                self._on_output = None  # the client is gone: drain and drop from now on

    def write_stdin(self, data: bytes) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.write(data)
            self.process.stdin.flush()

    def close_stdin(self) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.close()

    def detach(self) -> None:
        """The client went away: stdin closes, the command runs on (as on a real engine)."""
        with self._lock:
            self._on_output = None
        self.close_stdin()


def runtime_error(argv: Sequence[str], exc: OSError) -> bytes:
    """What runc says (and engines pass on, on the command's stdout) when it cannot exec."""
    name = argv[0] if argv else ""
    return (
        f'OCI runtime exec failed: exec failed: unable to start container process: exec: "{name}":'
        f" stat {name}: {exc.strerror.lower() if exc.strerror else exc}: unknown\r\n"
    ).encode()


class Engine:
    """A threaded server on a listening socket; ``handle(sock)`` serves one connection."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        #: tells this engine's containers from those of another engine with the same names
        self.instance = secrets.token_hex(6)
        self.requests: list[str] = []  # "METHOD target", every request served (for tests)
        self.started: list[Exec] = []  # every command exec'd, in order (for tests)
        self.first_started = threading.Event()  # set once ``started`` holds one
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        #: cleared while the engine is "unreachable": new connections wait, unanswered
        self.answering = threading.Event()
        self.answering.set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._connections.add(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            self.answering.wait()
            self.handle(sock)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(sock)
            sock.close()

    def handle(self, sock: socket.socket) -> None:
        raise NotImplementedError

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, container: str
    ) -> Exec:
        running = Exec(argv, env, cwd, self._marker(container))
        with self._lock:
            self.started.append(running)
        self.first_started.set()
        return running

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(f"{request.method} {request.target}")

    def _marker(self, container: str) -> str:
        return f"{container}@{self.instance}"

    def container_processes(self, container: str) -> list[psutil.Process]:
        """Every live process the container runs (marked in its environment)."""
        marker, found = self._marker(container), []
        for process in psutil.process_iter(["status"]):
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            with contextlib.suppress(psutil.Error):
                if process.environ().get(CONTAINER_VARIABLE) == marker:
                    found.append(process)
        return found

    def pause(self) -> None:
        """Answer no new connection (a daemon hung, an API server partitioned away) until
        :meth:`resume`; connections already open go on."""
        self.answering.clear()

    def resume(self) -> None:
        self.answering.set()

    def close(self, containers: Sequence[str] = ()) -> None:
        """Stop serving, drop every connection, and kill what the containers still run
        (what removing a container does)."""
        self.answering.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._connections:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for container in containers:
            left = self.container_processes(container)
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGKILL)
            psutil.wait_procs(left, timeout=10)
