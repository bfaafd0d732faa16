"""A fake Docker Engine on a Unix socket: just what the real ``docker exec -i C CMD...`` asks.

Point the real CLI at it with ``DOCKER_HOST=unix://PATH`` (and a ``DOCKER_CONFIG`` of the
test's own). It implements, of the Engine API (docs.docker.com/reference/api/engine):

- ``GET``/``HEAD /_ping``: version negotiation (the ``API-Version`` header; the CLI then
  prefixes every path with ``/vX.Y``);
- ``GET /containers/{name}/json``: the CLI inspects the container before it creates an exec
  (404 ``No such container`` for a name it does not know);
- ``POST /containers/{name}/exec``: creates an exec (``Cmd``, ``Env``, ``WorkingDir``);
- ``POST /exec/{id}/start``: answers ``101 UPGRADED`` (``Upgrade: tcp``), starts the command
  and hijacks the connection: raw stdin from the client (its half-close closes the command's
  stdin), stdout and stderr to it in the multiplexed framing of a non-tty exec (an 8-byte
  header: stream 1 or 2, three zero bytes, the payload's size as a big-endian uint32), and
  closes it once the command has exited;
- ``GET /exec/{id}/json``: the exit code, which the CLI exits with.

A "container" is a name, an environment and a working directory on this machine; its
commands run as this user, each in a process group of its own, marked with
``FAKE_ENGINE_CONTAINER=NAME@ENGINE``. As on the real engine (moby#9098), a client that goes away
(``docker exec`` killed, its connection dropped) does not kill the command: its stdin closes,
its output is drained and dropped, and it runs on.

Left out: TTYs (``-t``) and resizing, ``--detach``, ``-u``/``--privileged``, attach without
stdin, every other endpoint (404, logged in :attr:`Engine.requests`), TLS and TCP sockets,
namespaces, images, and any isolation at all.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import struct
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from engines._engine import Engine, Exec, Reader, response, runtime_error

__all__ = ["API_VERSION", "FakeDocker", "start_fake_docker"]

#: What the fake says it speaks; Docker CLI 28 (API 1.50) negotiates down to it.
API_VERSION: Final = "1.47"
_VERSIONED = re.compile(r"^/v\d+\.\d+(/.*)$")


@attrs.define
class _Created:
    container: str
    cmd: list[str]
    env: dict[str, str]
    cwd: str | None
    running: Exec | None = None
    #: the exit code of a command that could not be exec'd
    failed: int | None = None


def _not_found(message: str) -> bytes:
    return response("404 Not Found", json.dumps({"message": message}).encode())


class FakeDocker(Engine):
    def __init__(
        self, listener: socket.socket, path: Path, containers: Mapping[str, Mapping[str, Any]]
    ) -> None:
        self.path = path
        #: name -> {"env": {...}, "workdir": "..."}
        self.containers = dict(containers)
        self.execs: dict[str, _Created] = {}
        super().__init__(listener)

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    def handle(self, sock: socket.socket) -> None:
        reader = Reader(sock)
        while (request := reader.request()) is not None:
            self.log(request)
            match = _VERSIONED.match(request.path)
            path = match.group(1) if match else request.path
            parts = path.strip("/").split("/")
            if parts == ["_ping"]:
                body = b"" if request.method == "HEAD" else b"OK"
                sock.sendall(
                    response(
                        "200 OK",
                        body,
                        "text/plain; charset=utf-8",
                        API_Version=API_VERSION,
                        OSType="linux",
                        Docker_Experimental="false",
                        Cache_Control="no-cache, no-store, must-revalidate",
                    )
                )
            elif len(parts) == 3 and parts[0] == "containers" and parts[2] == "json":
                sock.sendall(self._inspect(parts[1]))
            elif len(parts) == 3 and parts[0] == "containers" and parts[2] == "exec":
                sock.sendall(self._create(parts[1], json.loads(request.body or b"{}")))
            elif len(parts) == 3 and parts[0] == "exec" and parts[2] == "json":
                sock.sendall(self._exec_inspect(parts[1]))
            elif len(parts) == 3 and parts[0] == "exec" and parts[2] == "start":
                self._start(sock, reader, parts[1])
                return  # the connection was hijacked, and is over
            else:
                sock.sendall(_not_found(f"the fake engine has no {request.method} {path}"))

    def _inspect(self, name: str) -> bytes:
        container = self.containers.get(name)
        if container is None:
            return _not_found(f"No such container: {name}")
        state = {"Status": "running", "Running": True, "Paused": False, "Restarting": False}
        body = {
            "Id": name,
            "Name": f"/{name}",
            "State": state,
            "Config": {"Tty": False, "WorkingDir": container.get("workdir", "")},
        }
        return response("200 OK", json.dumps(body).encode())

    def _create(self, name: str, config: dict[str, Any]) -> bytes:
        container = self.containers.get(name)
        if container is None:
            return _not_found(f"No such container: {name}")
        if config.get("Tty"):
            return response("400 Bad Request", b'{"message": "the fake engine has no TTYs"}')
        env = dict(container.get("env", {}))
        for item in config.get("Env") or []:
            key, _, value = item.partition("=")
            env[key] = value
        exec_id = secrets.token_hex(32)
        self.execs[exec_id] = _Created(
            container=name,
            cmd=list(config.get("Cmd") or []),
            env=env,
            cwd=config.get("WorkingDir") or container.get("workdir") or None,
        )
        return response("201 Created", json.dumps({"Id": exec_id}).encode())

    def _exec_inspect(self, exec_id: str) -> bytes:
        created = self.execs.get(exec_id)
        if created is None:
            return _not_found(f"No such exec instance: {exec_id}")
        running = created.running
        exit_code = created.failed if running is None else running.exit_code
        body = {
            "ID": exec_id,
            "ContainerID": created.container,
            "Running": running is not None and exit_code is None,
            "ExitCode": exit_code,
            "Pid": 0 if running is None else running.process.pid,
            "ProcessConfig": {"entrypoint": created.cmd[:1], "arguments": created.cmd[1:]},
        }
        return response("200 OK", json.dumps(body).encode())

    def _start(self, sock: socket.socket, reader: Reader, exec_id: str) -> None:
        created = self.execs.get(exec_id)
        if created is None or created.running is not None:
            sock.sendall(_not_found(f"No such exec instance: {exec_id}"))
            return
        sock.sendall(
            b"HTTP/1.1 101 UPGRADED\r\n"
            b"Content-Type: application/vnd.docker.raw-stream\r\n"
            b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        )
        try:
            running = self.run(created.cmd, created.env, created.cwd, created.container)
        except OSError as exc:
            # moby writes the start error on the stream's stdout, and the exit code is 127
            # for a command not found (126 for one that cannot be invoked)
            created.failed = 127 if isinstance(exc, FileNotFoundError) else 126
            sock.sendall(_frame(1, runtime_error(created.cmd, exc)))
            return
        created.running = running

        def on_output(stream: int, data: bytes) -> None:
            if data:
                sock.sendall(_frame(stream, data))

        running.start(on_output)

        def stdin() -> None:
            """The client's bytes to the command; its half-close (or a drop) closes stdin."""
            try:
                if reader.buffer:
                    running.write_stdin(reader.buffer)
                while data := sock.recv(65536):
                    running.write_stdin(data)
            except OSError:
                pass
            running.close_stdin()

        threading.Thread(target=stdin, daemon=True).start()
        running.finished.wait()
        # Output has ended and the command exited: end the stream (the CLI then asks for
        # the exit code). A client that went away earlier only detached from it.
        running.detach()


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


def start_fake_docker(directory: Path, containers: Mapping[str, Mapping[str, Any]]) -> FakeDocker:
    """A fake engine listening on ``directory/docker.sock``; ``containers``: name -> {"env":
    {...}, "workdir": "..."}. :meth:`FakeDocker.close` stops it and kills what its containers
    still run."""
    path = directory / "docker.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    return FakeDocker(listener, path, containers)
