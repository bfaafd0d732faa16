"""The front's side of remote hosts: one link per host, and where a new session goes.

The :class:`~supervisor.Supervisor` owns one :class:`RemoteHosts`; ``start_session`` hands it
every session whose agent lists ``hosts`` (or that names a ``host``). Placement: the host
asked for, which must be one of the agent's; else the agent's host with the most room
(``max_sessions`` minus the sessions this front has there; no limit counts as endless room;
ties go to the fewer sessions, then the order of the agent's list); ``capacity`` when none
has room.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping

import trio

from supervisor.config import AgentSpec, builtin_agents
from supervisor.errors import BadRequest
from supervisor.remote.errors import HostCapacity, NodeRetired
from supervisor.remote.handshake import spec_to_wire
from supervisor.remote.hosts import HostSpec
from supervisor.remote.link import NodeLink
from supervisor.remote.record import RemoteRecord
from supervisor.remote.session import RemoteSession

__all__ = ["RemoteHosts"]

log = logging.getLogger(__name__)


class RemoteHosts:
    def __init__(
        self,
        nursery: trio.Nursery,
        hosts: Mapping[str, HostSpec],
        record: RemoteRecord | None = None,
    ) -> None:
        self._nursery = nursery
        self.hosts = dict(hosts)
        #: where this front keeps its remote sessions for the one after a crash
        self.record = record
        self._links: dict[str, NodeLink] = {}
        #: links to retired nodes (an upgrade on the host): they serve the sessions there
        self._retired: list[NodeLink] = []
        self._starting: dict[str, int] = {}  # sessions being placed, not yet started

    def link(self, host: str) -> NodeLink:
        """The link to ``host`` (made on first use; it connects on its first request)."""
        link = self._links.get(host)
        if link is None:
            link = self._links[host] = NodeLink(
                self.hosts[host], self._nursery, on_forget=self._forgotten
            )
        return link

    def _forgotten(self, session: RemoteSession) -> None:
        if self.record is not None:
            self.record.remove(session.id)

    def sessions_on(self, host: str) -> int:
        links = [self._links.get(host), *(old for old in self._retired if old.host.name == host)]
        held = sum(len(link.sessions) for link in links if link is not None)
        return held + self._starting.get(host, 0)

    def _retire(self, link: NodeLink) -> None:
        """``link``'s node was retired: it keeps driving the sessions there, and the host's
        next session goes through a new link, to the host's current node."""
        if self._links.get(link.host.name) is link:
            del self._links[link.host.name]
            self._retired = [old for old in self._retired if old.sessions]
            self._retired.append(link)

    def place(self, spec: AgentSpec, host: str | None) -> HostSpec:
        if host is not None:
            if host not in self.hosts:
                known = ", ".join(sorted(self.hosts)) or "none"
                raise BadRequest(f"unknown host {host!r} (configured: {known})")
            if host not in spec.hosts:
                where = ", ".join(spec.hosts) or "this machine only"
                raise BadRequest(f"agent {spec.name!r} may not run on {host} (its hosts: {where})")
            if self._room(self.hosts[host]) <= 0:
                raise HostCapacity(
                    f"host {host} holds its max_sessions ({self.hosts[host].max_sessions})"
                )
            return self.hosts[host]
        candidates = [self.hosts[name] for name in spec.hosts if name in self.hosts]
        if not candidates:
            raise BadRequest(f"agent {spec.name!r} lists no configured host")
        best = max(
            enumerate(candidates),
            key=lambda item: (self._room(item[1]), -self.sessions_on(item[1].name), -item[0]),
        )[1]
        if self._room(best) <= 0:
            raise HostCapacity(
                f"every host of agent {spec.name!r} holds its max_sessions"
                f" ({', '.join(f'{h.name}: {h.max_sessions}' for h in candidates)})"
            )
        return best

    def _room(self, host: HostSpec) -> float:
        if host.max_sessions is None:
            return math.inf
        return host.max_sessions - self.sessions_on(host.name)

    async def start_session(
        self, spec: AgentSpec, *, host: str | None, cwd: str | None
    ) -> RemoteSession:
        chosen = self.place(spec, host)
        name = chosen.name
        if cwd is None and not chosen.transport:
            cwd = os.getcwd()  # this machine, with no transport: where a local session starts
        self._starting[name] = self._starting.get(name, 0) + 1
        try:
            payload: dict[str, object] = {"agent": spec.name}
            if cwd is not None:
                payload["cwd"] = cwd
            if not _is_builtin(spec):
                payload["spec"] = spec_to_wire(spec)
            for attempt in range(3):
                link = self.link(name)
                conn = await link.connection()
                try:
                    result = await conn.request("session.start", payload)
                    break
                except NodeRetired:
                    if attempt == 2:
                        raise
                    log.info("host %s: node pid %d is retired: a new link", name, link.node_pid)
                    self._retire(link)
            session = RemoteSession(
                link,
                node_id=str(result["session_id"]),
                spec=spec,
                cwd=cwd,
                state=str(result.get("state", "ready")),
            )
            link.sessions[session.node_id] = session
            if self.record is not None:
                self.record.add(session.record())
            await session._subscribe_on(conn)
            return session
        finally:
            self._starting[name] -= 1

    def recover(
        self, entries: list[dict[str, object]], agents: Mapping[str, AgentSpec]
    ) -> list[RemoteSession]:
        """Sessions a crashed front left on their hosts (its record's ``entries``), taken
        back: each host is reached in the background and every session resubscribed from
        seq 0 (the node's history rebuilds ours). Entries naming a host or an agent this
        front does not have are dropped (their node stops them after its ``detach_s``)."""
        sessions: list[RemoteSession] = []
        # One link per node: after an upgrade on a host, an old node and a new one.
        per_node: dict[tuple[str, object], tuple[NodeLink, object]] = {}
        for entry in entries:
            host, agent = entry.get("host"), entry.get("agent")
            if not isinstance(host, str) or host not in self.hosts:
                log.warning("not recovering %s: host %r is not configured", entry, host)
                self._drop(entry)
                continue
            spec = agents.get(agent) if isinstance(agent, str) else None
            if spec is None:
                log.warning("not recovering %s: agent %r is not configured", entry, agent)
                self._drop(entry)
                continue
            instance = entry.get("instance")
            known = per_node.get((host, instance))
            if known is not None:
                link = known[0]
            elif host not in self._links:
                link = self.link(host)
            else:
                link = NodeLink(self.hosts[host], self._nursery, on_forget=self._forgotten)
                self._retired.append(link)
            per_node[(host, instance)] = (link, entry.get("node_pid"))
            cwd = entry.get("cwd")
            session = RemoteSession(
                link,
                node_id=str(entry.get("node_id")),
                spec=spec,
                cwd=cwd if isinstance(cwd, str) else None,
                state="starting",
            )
            session._recovering()
            link.sessions[session.node_id] = session
            sessions.append(session)
        for (_, instance), (link, pid) in per_node.items():
            link.recover(
                instance if isinstance(instance, str) else None,
                pid if isinstance(pid, int) else None,
            )
        return sessions

    def _drop(self, entry: dict[str, object]) -> None:
        if self.record is not None:
            self.record.remove(str(entry.get("session_id")))

    async def aclose(self, *, release: bool = False) -> None:
        """Close every link; ``release``: the sessions left are kept in their nodes, and
        their record is left for the next front (in this process or another) to adopt."""
        for link in [*self._links.values(), *self._retired]:
            await link.aclose()
        if self.record is not None:
            self.record.close(release=release)


def _is_builtin(spec: AgentSpec) -> bool:
    """The node has the built-in agents itself (with its own Python): send none of ours."""
    builtin = builtin_agents().get(spec.name)
    return builtin is not None and builtin.with_options(hosts=spec.hosts) == spec
