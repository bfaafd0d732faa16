"""``agent-supervisor node``: the supervisor of one host's sessions, driven from elsewhere.

Two commands, one program:

- ``agent-supervisor node`` (the *node*): a daemon owning the sessions of this host with the
  whole runtime (containment, grace, kill ladder, respawn, receipts) and the gateway's wire
  protocol, on 127.0.0.1 and a random port with a random token, both written to
  ``node.json`` (mode 0600) in its directory. It keeps running when its drivers go away; once
  nobody has driven it for ``--detach`` seconds it stops every session, whole trees, and
  exits.
- ``agent-supervisor node --bridge`` (the *bridge*): what a front runs through the transport
  (``ssh ... -- agent-supervisor node --bridge``). It starts the node if none runs, writes the
  hello line (``supervisor/remote/handshake.py``) on stdout and relays bytes both ways between
  its stdio and the node's socket, until either side ends. A dropped SSH connection ends its
  stdin: it exits, the node sees the connection close, and the detach timer starts.

Files, in ``$XDG_STATE_HOME/agent-supervisor/node`` (``~/.local/state/...``): ``daemon.lock``
(held by the live node for its whole life: a bridge that can take it knows no node runs),
``start.lock`` (one bridge at a time starts a node), ``node.json`` and ``node.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any, Final

import trio

from supervisor.remote.handshake import Hello, package_version
from supervisor.remote.hosts import DEFAULT_DETACH_S

__all__ = ["add_node_parser", "main_node", "node_dir"]

log = logging.getLogger(__name__)

#: How long a bridge waits for the node it started to listen (its imports and the first
#: containment probe take ~1 s here), or for another bridge that is starting one.
NODE_START_TIMEOUT_S: Final = 30.0
#: The bridge's exit status when no node could be started (the front reads its stderr).
EXIT_NODE_FAILED: Final = 3


def node_dir(state_dir: Path | None = None) -> Path:
    from supervisor.statefile import default_state_dir

    return (state_dir if state_dir is not None else default_state_dir()) / "node"


def add_node_parser(commands: Any) -> None:
    """The ``node`` subcommand (``commands``: the CLI's subparsers)."""
    node = commands.add_parser(
        "node",
        help="own this host's sessions for a front that drives them over a transport (SSH)",
        description="Without --bridge: the node daemon. With --bridge: start it if needed and"
        " relay stdio to it (what a front runs through ssh).",
    )
    node.add_argument("--bridge", action="store_true", help="relay stdio to the node")
    node.add_argument(
        "--detach",
        type=float,
        default=DEFAULT_DETACH_S,
        help=f"stop every session after this long undriven (s, default {DEFAULT_DETACH_S:g})",
    )
    node.add_argument("--config", help="agents TOML file on this host (the front sends its own)")
    node.add_argument("--state-dir", help="default: $XDG_STATE_HOME/agent-supervisor")


def main_node(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else None
    if args.detach <= 0:
        print("agent-supervisor node: --detach must be > 0", file=sys.stderr)
        return 2
    if args.bridge:
        return run_bridge(config=args.config, state_dir=state_dir, detach_s=args.detach)
    return run_daemon(config=args.config, state_dir=state_dir, detach_s=args.detach)


# -- the node --------------------------------------------------------------------------------


class Presence:
    """Who drives the node: clients connected now, and a wait for nobody for ``detach_s``."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = trio.Event()

    def enter(self) -> None:
        self.count += 1
        self._poke()

    def leave(self) -> None:
        self.count -= 1
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @contextlib.asynccontextmanager
    async def driving(self) -> AsyncIterator[None]:
        """One driver (the gateway's ``client_scope``: an authenticated WebSocket client)."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    async def wait_abandoned(self, detach_s: float) -> None:
        """Return once no connection has been open for ``detach_s`` in a row."""
        while True:
            while self.count > 0:
                await self._changed.wait()
            with trio.move_on_after(detach_s) as alone:
                while self.count == 0:
                    await self._changed.wait()
            if alone.cancelled_caught:
                return


def _node_gateway(supervisor: Any, presence: Presence) -> Any:
    """The gateway, counting who drives it and taking agent definitions from fronts."""
    import attrs

    from supervisor.gateway import LIMITS, Gateway

    # Flow control for the link (design/remote.md, "Flow control across the link").
    limits = attrs.evolve(LIMITS, send_buffer_bytes=65536, flight_bytes=32768, write_events=64)
    return Gateway(
        supervisor,
        host="127.0.0.1",
        port=0,
        accept_specs=True,
        limits=limits,
        client_scope=presence.driving,
    )


def run_daemon(*, config: str | None, state_dir: Path | None, detach_s: float) -> int:
    directory = node_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    # A bridge probing whether a node runs holds the lock for a moment: try for a little while.
    lock = None
    for _ in range(100):
        lock = _try_lock(directory / "daemon.lock")
        if lock is not None:
            break
        time.sleep(0.02)
    if lock is None:
        print(f"agent-supervisor node: a node already runs ({directory})", file=sys.stderr)
        return 0
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s node[%(process)d] %(levelname)s %(message)s"
    )
    try:
        trio.run(_serve_node, config, state_dir, detach_s, directory)
    except KeyboardInterrupt:
        return 130
    finally:
        lock.close()
    return 0


async def _serve_node(
    config: str | None, state_dir: Path | None, detach_s: float, directory: Path
) -> None:
    from supervisor.config import builtin_agents, load_agents
    from supervisor.statefile import default_state_dir
    from supervisor.supervisor import open_supervisor

    agents = load_agents(config) if config else builtin_agents()
    presence = Presence()
    instance = secrets.token_hex(8)
    info = directory / "node.json"
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        try:
            async with (
                open_supervisor(
                    agents=agents,
                    state_dir=state_dir if state_dir is not None else default_state_dir(),
                    gc_policy=True,
                ) as supervisor,
                trio.open_nursery() as nursery,
            ):
                gateway = _node_gateway(supervisor, presence)
                await nursery.start(gateway.serve)
                hello = Hello(
                    version=package_version(),
                    instance=instance,
                    pid=os.getpid(),
                    port=gateway.port,
                    token=gateway.token,
                )
                _write_private(info, hello.line())
                log.info("node %s listening on 127.0.0.1:%d", instance, gateway.port)

                async def on_signal() -> None:
                    async for signum in signals:
                        log.info("signal %d: stopping every session", signum)
                        nursery.cancel_scope.cancel()

                nursery.start_soon(on_signal)
                await presence.wait_abandoned(detach_s)
                log.info(
                    "nobody drove the node for %g s: stopping %d session(s)",
                    detach_s,
                    len(supervisor.list()),
                )
                nursery.cancel_scope.cancel()
            # Leaving open_supervisor stopped every session and killed every tree.
        finally:
            with contextlib.suppress(OSError, ValueError):
                if Hello.parse(info.read_bytes()) == hello:
                    info.unlink()
            log.info("node %s exited", instance)


def _write_private(path: Path, data: bytes) -> None:
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _try_lock(path: Path) -> IO[bytes] | None:
    file = open(path, "ab")  # noqa: SIM115 (held for the process's life)
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        return None
    return file


# -- the bridge ------------------------------------------------------------------------------


class NodeStartFailed(Exception):
    pass


def run_bridge(*, config: str | None, state_dir: Path | None, detach_s: float) -> int:
    try:
        hello = ensure_node(config=config, state_dir=state_dir, detach_s=detach_s)
        sock = socket.create_connection(("127.0.0.1", hello.port), timeout=10)
    except (NodeStartFailed, OSError) as exc:
        print(f"agent-supervisor node: {exc}", file=sys.stderr, flush=True)
        return EXIT_NODE_FAILED
    sock.settimeout(None)
    # Small frames both ways (a cancel, a pong): no Nagle delay behind a delayed ACK (~40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        _write_all(1, hello.line())
    except OSError:
        return 0
    _relay(sock)
    return 0


def ensure_node(*, config: str | None, state_dir: Path | None, detach_s: float) -> Hello:
    """The running node's hello; starts the node first if none runs."""
    directory = node_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory / "node.json"
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    with _locked(directory / "start.lock", deadline):
        if not _node_alive(directory):
            with contextlib.suppress(FileNotFoundError):
                info.unlink()
            process = _start_node(directory, config=config, state_dir=state_dir, detach_s=detach_s)
            _wait_for(info, deadline, directory, process)
        try:
            hello = Hello.parse(info.read_bytes())
        except FileNotFoundError:
            hello = None
        if hello is None:
            raise NodeStartFailed(f"the node runs but {info} is missing or unreadable")
        return hello


@contextlib.contextmanager
def _locked(path: Path, deadline: float) -> Any:
    with open(path, "ab") as file:
        while True:
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NodeStartFailed(f"another bridge held {path} too long") from None
                time.sleep(0.02)
        yield


def _node_alive(directory: Path) -> bool:
    """A node holds ``daemon.lock`` for its whole life: if we can take it, none runs."""
    lock = _try_lock(directory / "daemon.lock")
    if lock is None:
        return True
    lock.close()
    return False


def _start_node(
    directory: Path, *, config: str | None, state_dir: Path | None, detach_s: float
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "supervisor.cli", "node", "--detach", f"{detach_s:g}"]
    if config:
        argv += ["--config", config]
    if state_dir is not None:
        argv += ["--state-dir", str(state_dir)]
    with open(directory / "node.log", "ab") as logfile:
        # Its own session, no terminal, none of the bridge's pipes (sshd waits for those to
        # close before it ends the connection), in the home directory.
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=logfile,
            start_new_session=True,
            close_fds=True,
            cwd=os.path.expanduser("~"),
        )


def _wait_for(
    info: Path, deadline: float, directory: Path, process: subprocess.Popen[bytes]
) -> None:
    while not info.exists():
        if process.poll() is not None:
            raise NodeStartFailed(
                f"the node exited at start ({process.returncode}): {_log_tail(directory)}"
            )
        if time.monotonic() > deadline:
            raise NodeStartFailed(
                f"the node did not start in {NODE_START_TIMEOUT_S:g} s: {_log_tail(directory)}"
            )
        time.sleep(0.02)


def _log_tail(directory: Path) -> str:
    try:
        text = (directory / "node.log").read_bytes()[-2000:].decode(errors="replace")
    except OSError:
        return "(no log)"
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-5:]) or "(empty log)"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _relay(sock: socket.socket) -> None:
    """stdin -> socket and socket -> stdout, until either ends; then exit."""
    done = threading.Event()

    def up() -> None:
        try:
            while data := os.read(0, 65536):
                sock.sendall(data)
        except OSError:
            pass
        finally:
            done.set()

    def down() -> None:
        try:
            while data := sock.recv(65536):
                _write_all(1, data)
        except OSError:
            pass
        finally:
            done.set()

    for work in (up, down):
        threading.Thread(target=work, daemon=True).start()
    done.wait()
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
