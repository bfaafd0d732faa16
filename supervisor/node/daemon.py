"""``agent-supervisor node``: the supervisor of one host's sessions, driven from elsewhere.

The *node* is a daemon owning the sessions of this host with the whole runtime (containment,
grace, kill ladder, respawn, receipts) and the gateway's wire protocol, on a Unix socket in
its directory (mode 0700, the socket 0600) with a random token, written to its hello file
(mode 0600). It keeps running when its drivers go away; once nobody has driven it for
``--detach`` seconds it stops every session, whole trees, and exits. ``node --bridge`` (what
a front runs through the transport) is ``supervisor/node/bridge.py``; the files are
described there.

It keeps metrics of its host (``GET /metrics`` on its socket, with its token; ``node --metrics``
prints them) and, when the standard ``OTEL_*`` variables ask, exports traces
(``supervisor/observe/``).

Signals: SIGTERM, SIGINT and SIGHUP stop every session, then the node. SIGUSR1 *retires* it
(what a bridge of a newer package does, and a user may too): it stops being the host's current
node (lets ``daemon.lock`` go: a new node may start beside it), refuses new sessions
(``node_retired``: the front starts them on the current node), serves the ones it has, and
exits after the last one ends.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import trio

from supervisor.node.bridge import bind_unix, node_dir, private_dir, run_bridge, try_lock
from supervisor.remote.handshake import Hello, package_version, wire
from supervisor.remote.hosts import DEFAULT_DETACH_S, DEFAULT_HISTORY

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

__all__ = ["add_node_parser", "main_node", "node_dir"]

log = logging.getLogger(__name__)


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
        "--metrics",
        action="store_true",
        help="print this host's node's metrics (Prometheus text format) and exit",
    )
    node.add_argument(
        "--detach",
        type=float,
        default=DEFAULT_DETACH_S,
        metavar="S",
        help=f"stop every session after this long undriven (s, default {DEFAULT_DETACH_S:g})",
    )
    node.add_argument(
        "--history",
        type=int,
        default=DEFAULT_HISTORY,
        metavar="N",
        help="events each session keeps that its front has not acknowledged; with that many"
        f" the agent is held back until the front catches up (default {DEFAULT_HISTORY})",
    )
    node.add_argument(
        "--config", metavar="FILE", help="agents TOML file on this host (the front sends its own)"
    )
    node.add_argument(
        "--state-dir", metavar="DIR", help="default: $XDG_STATE_HOME/agent-supervisor"
    )
    node.add_argument(
        "--instance",
        metavar="ID",
        help="(--bridge, --metrics) the node to reach while it lives, else the current one",
    )


def main_node(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else None
    if args.metrics:
        from supervisor.node.scrape import print_metrics

        return print_metrics(state_dir, args.instance)
    if args.detach <= 0:
        print("agent-supervisor node: --detach must be > 0", file=sys.stderr)
        return 2
    if args.history < 1:
        print("agent-supervisor node: --history must be >= 1", file=sys.stderr)
        return 2
    if args.bridge:
        return run_bridge(
            config=args.config,
            state_dir=state_dir,
            detach_s=args.detach,
            instance=args.instance,
            history=args.history,
        )
    return run_daemon(
        config=args.config, state_dir=state_dir, detach_s=args.detach, history=args.history
    )


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


def _node_gateway(supervisor: Any, presence: Presence, listener: trio.SocketListener) -> Any:
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


def run_daemon(
    *,
    config: str | None,
    state_dir: Path | None,
    detach_s: float,
    history: int = DEFAULT_HISTORY,
) -> int:
    directory = private_dir(node_dir(state_dir))
    # A bridge probing whether a node runs holds the lock for a moment: try for a little while.
    lock = None
    for _ in range(100):
        lock = try_lock(directory / "daemon.lock")
        if lock is not None:
            break
        time.sleep(0.02)  # another process's lock: polled, briefly
    if lock is None:
        print(f"agent-supervisor node: a node already runs ({directory})", file=sys.stderr)
        return 0
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s node[%(process)d] %(levelname)s %(message)s"
    )
    instance = secrets.token_hex(8)
    mine = try_lock(directory / f"{instance}.lock")
    assert mine is not None  # a new name
    sweep_dead_nodes(directory, keep=instance)
    holder = _Held(lock)
    try:
        trio.run(_serve_node, config, state_dir, detach_s, directory, instance, holder, history)
    except KeyboardInterrupt:
        return 130
    finally:
        holder.release(directory, instance)  # (no longer the current node: a bridge may start one)
        for name in (f"{instance}.sock", f"{instance}.json", f"{instance}.lock"):
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()
        mine.close()
    return 0


#: A node's lock file younger than this is never swept: its node may be between creating the
#: file and locking it (microseconds apart); a live node holds its lock for its whole life.
SWEEP_MIN_AGE_S = 60.0


def sweep_dead_nodes(
    directory: Path, *, keep: str | None = None, min_age_s: float = SWEEP_MIN_AGE_S
) -> list[str]:
    """Remove the files of nodes that died without cleaning up (SIGKILL): ``I.json``,
    ``I.sock`` and ``I.lock`` of every instance ``I`` whose lock nobody holds and whose lock
    file is older than ``min_age_s``. The lock is taken before anything goes, so a live node
    (which holds its lock) is never touched. Returns the instances swept."""
    swept: list[str] = []
    now = time.time()
    for path in directory.glob("*.lock"):
        instance = path.stem
        if instance in ("daemon", "start", keep) or not instance.isalnum():
            continue
        try:
            if now - path.stat().st_mtime < min_age_s:
                continue
        except OSError:
            continue
        held = try_lock(path)
        if held is None:
            continue  # its node lives
        try:
            for name in (f"{instance}.json", f"{instance}.sock", f"{instance}.lock"):
                with contextlib.suppress(FileNotFoundError):
                    (directory / name).unlink()
        finally:
            held.close()
        swept.append(instance)
    if swept:
        log.info("swept the files of %d dead node(s): %s", len(swept), ", ".join(swept))
    return swept


class _Held:
    """``daemon.lock``, held while this node is the host's current one."""

    def __init__(self, lock: IO[bytes]) -> None:
        self._lock: IO[bytes] | None = lock

    def release(self, directory: Path, instance: str) -> None:
        """Give the place up: ``node.json`` goes first (if it is ours), then the lock."""
        if self._lock is None:
            return
        info = directory / "node.json"
        with contextlib.suppress(OSError, ValueError):
            hello = Hello.parse(info.read_bytes())
            if hello is not None and hello.instance == instance:
                info.unlink()
        self._lock.close()
        self._lock = None


async def _serve_node(
    config: str | None,
    state_dir: Path | None,
    detach_s: float,
    directory: Path,
    instance: str,
    held: _Held,
    history: int = DEFAULT_HISTORY,
) -> None:
    from supervisor.agents.statefile import default_state_dir
    from supervisor.config import builtin_agents, load_config
    from supervisor.observe import Metrics
    from supervisor.remote.errors import NodeRetired
    from supervisor.supervisor import open_supervisor

    settings = load_config(config) if config else None
    agents = settings.agents if settings is not None else builtin_agents()
    tracer_provider = _tracer_provider()
    presence = Presence()
    listener = trio.SocketListener(
        trio.socket.from_stdlib_socket(bind_unix(directory / f"{instance}.sock"))
    )
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    with trio.open_signal_receiver(*signals) as received:
        try:
            async with (
                open_supervisor(
                    agents=agents,
                    state_dir=state_dir if state_dir is not None else default_state_dir(),
                    gc_policy=True,
                    session_ids=_HostIds(directory / "session-ids"),
                    # Nothing the front has not acknowledged is dropped: the agent waits.
                    history_size=history,
                    hold_unacknowledged=True,
                    # Each turn's checkpoints are taken here, where the files are: a front's
                    # rewind and diff are the node's (design/remote.md, "Checkpoints").
                    checkpoints=True,
                    checkpoint_watch=settings.checkpoints.watch if settings is not None else True,
                    # ... and recorded beside them: a front's stored session started again
                    # here after this node is gone gets its earlier turns' back.
                    record_checkpoints=True,
                    metrics=Metrics(),  # GET /metrics on its socket; node --metrics
                    tracer_provider=tracer_provider,
                ) as supervisor,
                trio.open_nursery() as nursery,
            ):
                gateway = _node_gateway(supervisor, presence, listener)
                await nursery.start(functools.partial(gateway.serve_listeners, [listener]))
                hello = Hello(
                    version=package_version(),
                    wire=wire(),
                    instance=instance,
                    pid=os.getpid(),
                    token=gateway.token,
                )
                _write_private(directory / f"{instance}.json", hello.line())
                _write_private(directory / "node.json", hello.line())
                log.info(
                    "node %s (agent-supervisor %s, wire %d) listening on %s",
                    instance,
                    hello.version,
                    hello.wire,
                    directory / f"{instance}.sock",
                )

                async def drain() -> None:
                    supervisor.refuse_new_sessions(
                        NodeRetired(
                            f"this node (agent-supervisor {hello.version}, pid {hello.pid}) is"
                            " retired: it serves its sessions and exits after the last one"
                        )
                    )
                    held.release(directory, instance)
                    log.info(
                        "retired: serving %d session(s) until they end",
                        supervisor.live_sessions(),
                    )
                    await supervisor.wait_no_live_sessions()
                    log.info("retired, and its last session ended: exiting")
                    nursery.cancel_scope.cancel()

                async def on_signal() -> None:
                    async for signum in received:
                        if signum == signal.SIGUSR1:
                            if not retired.is_set():
                                retired.set()
                                nursery.start_soon(drain)
                            continue
                        log.info("signal %d: stopping every session", signum)
                        nursery.cancel_scope.cancel()

                retired = trio.Event()
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
            if tracer_provider is not None:  # the spans still batched, before the node goes
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(tracer_provider.shutdown)
            log.info("node %s exited", instance)


def _tracer_provider() -> SdkTracerProvider | None:
    """The tracer provider the ``OTEL_*`` variables ask for; None (and one line in the log)
    when they ask for what cannot be made: a node is started by a bridge, whose front would
    only see it fail to start, so it runs without traces instead."""
    from supervisor.config import ConfigError
    from supervisor.observe.tracing import provider_from_env

    try:
        return provider_from_env()
    except ConfigError as exc:
        log.warning("no traces: %s", exc)
        return None


class _HostIds:
    """Session ids unique across the nodes of one directory (``s1``, ``s2``, ...): a front
    names a session ``ID@HOST``, and an old node and a new one may run side by side."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> str:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read and a write: microseconds
            text = os.read(fd, 64).decode(errors="replace").strip()
            number = (int(text) if text.isdigit() else 0) + 1
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, str(number).encode())
        finally:
            os.close(fd)
        return f"s{number}"


def _write_private(path: Path, data: bytes) -> None:
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)
