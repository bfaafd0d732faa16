"""The ACP front door: ``agent-supervisor acp``, the supervisor itself as an ACP agent.

An editor that speaks the Agent Client Protocol (Zed, JetBrains, Neovim and Emacs plug-ins, any
ACP client) starts ``agent-supervisor acp`` as its agent and gets every supervised agent behind
it (any ACP agent, Codex app-server, Claude Code stream-json, OpenCode, Amp) with the supervisor's
stop: a ``session/cancel`` always ends the turn (interrupt, grace, the tree killed), the agent is
respawned and its session resumed behind the editor's back. The protocol machine is sans-IO
(``protocols/acp_agent.py``); this package is its I/O (``server``), the sessions behind it, in
this process or on a gateway (``backends``); the sessions of an embedded supervisor are kept in
the session store (``[store] url``, by default the state directory's ``sessions.db``), where
``session/list`` and ``session/load`` find them (``records``: what is kept beside it, and the
JSON records imported into it). ``design/acp-front.md`` has the design.
"""

from __future__ import annotations

import logging
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from supervisor.agents.statefile import default_state_dir
from supervisor.clients.acp_front.backends import BackendError, EmbeddedSessions, GatewaySessions
from supervisor.clients.acp_front.records import Records, import_records, pending_records
from supervisor.clients.acp_front.server import AcpFront, records_dir, stdio_streams
from supervisor.store.url import backend_for, default_url

if TYPE_CHECKING:
    from supervisor.client import GatewayClient
    from supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)

__all__ = ["AcpFront", "BackendError", "run_acp"]


async def run_acp(
    *,
    agent: str | None = None,
    config: str | None = None,
    connect: str | None = None,
    session: str | None = None,
    receive: trio.abc.ReceiveStream | None = None,
    send: trio.abc.SendStream | None = None,
) -> int:
    """Serve ACP on stdin/stdout (or the streams given) until the client closes stdin."""
    if receive is None or send is None:
        receive, send = await stdio_streams()
    async with AsyncExitStack() as stack:
        if connect is not None:
            client = await _connect(stack, connect)
            backend: EmbeddedSessions | GatewaySessions = await GatewaySessions.open(client)
            front = AcpFront(backend, default_agent=agent, attach_to=session)
        else:
            supervisor = await _open_embedded(stack, config)
            backend = EmbeddedSessions(supervisor)
            records = Records(records_dir(default_state_dir()))
            front = AcpFront(backend, default_agent=agent, records=records)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_shut_down_on_signal, front)
            await front.serve(receive, send)
            nursery.cancel_scope.cancel()
    return 0


async def _open_embedded(stack: AsyncExitStack, config: str | None) -> Supervisor:
    """The front door's own supervisor, on the session store (``[store] url``, else the state
    directory's ``sessions.db``), the JSON records of ``acp-sessions/`` imported into it first.
    A store that cannot be opened (another process holds it, a corrupt file) is said in one
    line, and the sessions of this run are not kept: the editor is served all the same."""
    from supervisor.config import Config, builtin_agents, load_config
    from supervisor.remote.hosts import load_hosts
    from supervisor.store.backend import StoreError
    from supervisor.supervisor import open_supervisor

    settings = load_config(config) if config else Config(agents=builtin_agents())
    hosts = load_hosts(config) if config else None
    state_dir = default_state_dir()
    url = settings.store.url or default_url(state_dir)
    directory = records_dir(state_dir)
    try:
        if directory is not None and pending_records(directory):
            protocols = {name: spec.protocol for name, spec in settings.agents.items()}
            await trio.to_thread.run_sync(_import, url, directory, protocols)
        return await stack.enter_async_context(
            open_supervisor(
                agents=settings.agents,
                state_dir=state_dir,
                gc_policy=True,
                hosts=hosts,
                store=url,
                store_kind="acp",
                store_writer=settings.store.writer,
            )
        )
    except StoreError as exc:
        log.warning("%s: sessions of this run are not kept for session/list", exc)
    return await stack.enter_async_context(
        open_supervisor(agents=settings.agents, state_dir=state_dir, gc_policy=True, hosts=hosts)
    )


def _import(url: str, directory: Path, protocols: dict[str, str]) -> None:
    """(A worker thread.) The JSON records of ``directory`` into the store at ``url``."""
    backend = backend_for(url, "acp")
    if backend is None:
        return  # no store: the records stay where they are
    backend.open()
    try:
        report = import_records(directory, backend, protocols)
    finally:
        backend.close()
    if report.imported:
        log.info("imported %d ACP session record(s) into %s", len(report.imported), url)


async def _connect(stack: AsyncExitStack, url: str) -> GatewayClient:
    """The gateway's client, or :class:`BackendError` saying why not (never its token)."""
    from supervisor.client import CONNECT_ERRORS, connect, not_connected

    try:
        return await stack.enter_async_context(connect(url))
    except CONNECT_ERRORS as exc:
        raise BackendError(not_connected(url, exc)) from exc


async def _shut_down_on_signal(front: AcpFront) -> None:
    """SIGTERM or SIGINT (an editor closing its agent server, Ctrl-C): a graceful end, every
    session's tree stopped through its ladder; a second one kills at once (the default)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            front.shutdown()
            break
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
