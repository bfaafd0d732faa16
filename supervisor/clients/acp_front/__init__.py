"""The ACP front door: ``agent-supervisor acp``, the supervisor itself as an ACP agent.

An editor that speaks the Agent Client Protocol (Zed, JetBrains, Neovim and Emacs plug-ins, any
ACP client) starts ``agent-supervisor acp`` as its agent and gets every supervised agent behind
it (any ACP agent, Codex app-server, Claude Code stream-json, OpenCode, Amp) with the supervisor's
stop: a ``session/cancel`` always ends the turn (interrupt, grace, the tree killed), the agent is
respawned and its session resumed behind the editor's back. The protocol machine is sans-IO
(``protocols/acp_agent.py``); this package is its I/O (``server``), the sessions behind it, in
this process or on a gateway (``backends``), and what is kept for ``session/list`` and
``session/load`` (``records``). ``design/acp-front.md`` has the design.
"""

from __future__ import annotations

import signal
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio

from supervisor.clients.acp_front.backends import BackendError, EmbeddedSessions, GatewaySessions
from supervisor.clients.acp_front.records import Records
from supervisor.clients.acp_front.server import AcpFront, records_dir, stdio_streams

if TYPE_CHECKING:
    from supervisor.client import GatewayClient

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
            from supervisor.agents.statefile import default_state_dir
            from supervisor.config import builtin_agents, load_agents
            from supervisor.remote.hosts import load_hosts
            from supervisor.supervisor import open_supervisor

            agents = load_agents(config) if config else builtin_agents()
            hosts = load_hosts(config) if config else None
            state_dir = default_state_dir()
            supervisor = await stack.enter_async_context(
                open_supervisor(agents=agents, state_dir=state_dir, gc_policy=True, hosts=hosts)
            )
            backend = EmbeddedSessions(supervisor)
            front = AcpFront(backend, default_agent=agent, records=Records(records_dir(state_dir)))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_shut_down_on_signal, front)
            await front.serve(receive, send)
            nursery.cancel_scope.cancel()
    return 0


async def _connect(stack: AsyncExitStack, url: str) -> GatewayClient:
    """The gateway's client, or :class:`BackendError` saying why not (never its token)."""
    from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError

    from supervisor.client import connect

    where = urlsplit(url).netloc or url
    try:
        return await stack.enter_async_context(connect(url))
    except ConnectionRejected as exc:
        body = (exc.body or b"").decode("utf-8", errors="replace")
        raise BackendError(
            f"{where} refused the connection (HTTP {exc.status_code}): {body}"
        ) from exc
    except (OSError, HandshakeError, ConnectionClosed) as exc:
        why = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
        raise BackendError(f"cannot connect to {where}: {why}") from exc


async def _shut_down_on_signal(front: AcpFront) -> None:
    """SIGTERM or SIGINT (an editor closing its agent server, Ctrl-C): a graceful end, every
    session's tree stopped through its ladder; a second one kills at once (the default)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            front.shutdown()
            break
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
