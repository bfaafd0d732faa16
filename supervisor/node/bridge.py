"""``agent-supervisor node --bridge``: what a front runs through the transport (stdlib only).

It is run for every connection (``ssh ... -- agent-supervisor node --bridge``), so it must
start fast: it imports nothing but the standard library (``supervisor/__main__.py`` reaches it
before the CLI's imports). It finds the node it is asked for, starting the host's node if
none runs, writes the node's hello line on stdout, then relays bytes both ways between its
stdio and the node's Unix socket, until either side ends. A dropped SSH connection ends its
stdin: it exits, the node sees the connection close, and its detach timer starts.

The node directory (``$XDG_STATE_HOME/agent-supervisor/node``, mode 0700) holds, per node
process (``INSTANCE``: new for each): ``INSTANCE.lock`` (held for its life), ``INSTANCE.json``
(its hello, mode 0600) and ``INSTANCE.sock`` (its socket); and for the host's *current* node
(the one new sessions go to): ``daemon.lock`` (held by it) and ``node.json`` (its hello).
``start.lock`` lets one bridge at a time start a node.

Which node: ``--instance I`` (a front that has sessions in node I) connects to node I while it
lives, current or retired; else, or when I is gone, to the current node. A current node of
another package version than this bridge's is *retired* first (``SIGUSR1``: it gives up
``daemon.lock``, serves the sessions it has, refuses new ones and exits after the last one),
and a node of this bridge's version is started beside it: that is how an upgrade of the
package on the host takes effect without stopping a session.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Final

from supervisor.remote.version import package_version

__all__ = [
    "EXIT_NODE_FAILED",
    "NodeStartFailed",
    "connect_unix",
    "ensure_node",
    "main_bridge",
    "node_dir",
    "try_lock",
]

#: How long a bridge waits for the node it started to listen (its imports and the first
#: containment probe take ~1 s here), for another bridge that is starting one, or for a node
#: it retired to give up ``daemon.lock``.
NODE_START_TIMEOUT_S: Final = 30.0
#: The bridge's exit status when no node could be started (the front reads its stderr).
EXIT_NODE_FAILED: Final = 3
#: The longest path ``bind``/``connect`` take for a Unix socket (Linux: 108 with the NUL).
_SUN_PATH_MAX: Final = 107


class NodeStartFailed(Exception):
    pass


def node_dir(state_dir: Path | None = None) -> Path:
    """The node's directory: ``STATE_DIR/node`` (default state: as in
    ``supervisor.agents.statefile``)."""
    if state_dir is None:
        override = os.environ.get("AGENT_SUPERVISOR_STATE_DIR")
        if override:
            state_dir = Path(override)
        else:
            base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
            state_dir = Path(base) / "agent-supervisor"
    return state_dir / "node"


def private_dir(directory: Path) -> Path:
    """``directory``, made if need be, and only its owner's (0700): what keeps other local
    users away from the node's socket."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    return directory


def main_bridge(argv: Sequence[str]) -> int:
    """``node --bridge [--detach S] [--history N] [--state-dir D] [--config F] [--instance I]``:
    options it
    does not know are ignored, so a newer front can open an older host's bridge."""
    parser = argparse.ArgumentParser(prog="agent-supervisor node --bridge", add_help=False)
    parser.add_argument("--bridge", action="store_true")
    parser.add_argument("--detach", type=float, default=300.0)
    parser.add_argument("--state-dir")
    parser.add_argument("--config")
    parser.add_argument("--instance")
    parser.add_argument("--history", type=int)
    args, _ = parser.parse_known_args(argv)
    if args.detach <= 0:
        print("agent-supervisor node: --detach must be > 0", file=sys.stderr)
        return 2
    return run_bridge(
        config=args.config,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        detach_s=args.detach,
        instance=args.instance,
        history=args.history,
    )


def run_bridge(
    *,
    config: str | None,
    state_dir: Path | None,
    detach_s: float,
    instance: str | None = None,
    history: int | None = None,
) -> int:
    try:
        directory = private_dir(node_dir(state_dir))
        line, sock = _reach(directory, config, state_dir, detach_s, instance, history)
    except (NodeStartFailed, OSError) as exc:
        print(f"agent-supervisor node: {exc}", file=sys.stderr, flush=True)
        return EXIT_NODE_FAILED
    try:
        _write_all(1, line)
    except OSError:
        return 0
    _relay(sock)
    return 0


def _reach(
    directory: Path,
    config: str | None,
    state_dir: Path | None,
    detach_s: float,
    instance: str | None,
    history: int | None = None,
) -> tuple[bytes, socket.socket]:
    """The hello line and a connected socket: node ``instance`` if it lives, else the current
    node (started if need be). A node that dies between reading its hello and connecting is
    tried again once."""
    for _ in range(2):
        retire_other_version(directory)
        if instance is not None:
            pinned = _connect_node(directory, instance)
            if pinned is not None:
                return pinned
        line = ensure_node(
            directory, config=config, state_dir=state_dir, detach_s=detach_s, history=history
        )
        found = _connect_node(directory, str(json.loads(line)["instance"]))
        if found is not None:
            return found
    raise NodeStartFailed(f"the node in {directory} does not accept connections")


def _connect_node(directory: Path, instance: str) -> tuple[bytes, socket.socket] | None:
    """Node ``instance``'s hello and a connection to it, or None if it is gone."""
    if not instance.isalnum() or not _holds(directory / f"{instance}.lock"):
        return None
    try:
        line = (directory / f"{instance}.json").read_bytes()
        sock = connect_unix(directory / f"{instance}.sock")
    except OSError:
        return None
    return line.rstrip(b"\n") + b"\n", sock


def retire_other_version(directory: Path) -> None:
    """Retire the current node if it is of another package version than this bridge's (the
    package was upgraded, or downgraded, on the host): it drains, and the next node started
    is this version's."""
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    with _locked(directory / "start.lock", deadline):
        current = _current(directory)
        if current is not None and current.get("version") != package_version():
            _retire(directory, current, deadline)


def ensure_node(
    directory: Path,
    *,
    config: str | None,
    state_dir: Path | None,
    detach_s: float,
    history: int | None = None,
) -> bytes:
    """The current node's hello line; retires a current node of another version and starts
    one of ours when none is current."""
    info = directory / "node.json"
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    with _locked(directory / "start.lock", deadline):
        current = _current(directory)
        if current is not None and current.get("version") != package_version():
            _retire(directory, current, deadline)
            current = None
        if current is None:
            with contextlib.suppress(FileNotFoundError):
                info.unlink()
            process = _start_node(
                directory, config=config, state_dir=state_dir, detach_s=detach_s, history=history
            )
            _wait_for(info, deadline, directory, process)
            current = _current(directory)
        if current is None:
            raise NodeStartFailed(f"the node runs but {info} is missing or unreadable")
        return (json.dumps(current) + "\n").encode()


def _current(directory: Path) -> dict[str, Any] | None:
    """The current node's hello, if one holds ``daemon.lock`` (else None)."""
    if not _holds(directory / "daemon.lock"):
        return None
    try:
        hello = json.loads((directory / "node.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(hello, dict) or not _holds(directory / f"{hello.get('instance')}.lock"):
        return None  # the lock's holder has not written its hello yet, or a stale one is left
    return hello


def _retire(directory: Path, hello: dict[str, Any], deadline: float) -> None:
    """Ask the current node (of another version) to give its place up, and wait until it has
    (it lets ``daemon.lock`` go): it drains, and exits after its last session."""
    pid = hello.get("pid")
    if not isinstance(pid, int):
        raise NodeStartFailed(f"the current node's hello names no pid: {hello}")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGUSR1)
    while _holds(directory / "daemon.lock"):
        if time.monotonic() > deadline:
            raise NodeStartFailed(
                f"the node of version {hello.get('version')} (pid {pid}) did not retire in"
                f" {NODE_START_TIMEOUT_S:g} s"
            )
        time.sleep(0.02)  # a lock cannot be waited on with a timeout: polled


def try_lock(path: Path) -> IO[bytes] | None:
    """``path`` locked (flock, exclusive) and held by the returned file; None if another
    process holds it."""
    file = open(path, "ab")  # noqa: SIM115 (held by the caller for as long as it needs)
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        return None
    return file


def _holds(path: Path) -> bool:
    """Whether a live process holds ``path``'s lock (a missing file: nobody)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (releases it, if we took it)
    return False


@contextlib.contextmanager
def _locked(path: Path, deadline: float) -> Iterator[None]:
    with open(path, "ab") as file:
        while True:
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NodeStartFailed(f"another bridge held {path} too long") from None
                time.sleep(0.02)  # a lock cannot be waited on with a timeout: polled
        yield


def _start_node(
    directory: Path,
    *,
    config: str | None,
    state_dir: Path | None,
    detach_s: float,
    history: int | None = None,
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "supervisor", "node", "--detach", f"{detach_s:g}"]
    if history is not None:
        argv += ["--history", str(history)]
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
        time.sleep(0.02)  # another process's file: nothing to wait on but its appearance


def _log_tail(directory: Path) -> str:
    try:
        text = (directory / "node.log").read_bytes()[-2000:].decode(errors="replace")
    except OSError:
        return "(no log)"
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-5:]) or "(empty log)"


@contextlib.contextmanager
def _short_path(path: Path) -> Iterator[str]:
    """A name for ``path`` that fits a Unix socket address: itself, or (too long) its base
    name, from its directory as the working directory for the moment."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield str(path)
        return
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir(path.parent)
        yield path.name
    finally:
        os.fchdir(here)
        os.close(here)


def connect_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _short_path(path) as name:
            sock.connect(name)
    except OSError:
        sock.close()
        raise
    return sock


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, only its owner's (mode 0600, in a 0700
    directory)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)  # a socket is made 0777 & ~umask: 0600
    try:
        with _short_path(path) as name:
            sock.bind(name)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(mask)
    return sock


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
