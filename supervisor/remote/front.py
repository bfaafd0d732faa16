"""The front's side of remote hosts: one link per host, and where a new session goes.

The :class:`~supervisor.Supervisor` owns one :class:`RemoteHosts`; ``start_session`` hands it
every session whose agent lists ``hosts`` (or that names a ``host``). Placement: the host
asked for, which must be one of the agent's; else the agent's host with the most room, as
the nodes count it: each candidate's node is asked how many sessions it holds, from every
front (``max_sessions`` minus that; no limit counts as endless room; ties go to the fewer
sessions, then the order of the agent's list; a host that does not answer in
``PROBE_TIMEOUT_S`` is skipped with its cause). The node is the authority: ``session.start``
carries the host's ``max_sessions`` and the node refuses a start over it (``capacity``), so two
fronts racing for its last place cannot both win; the loser tries its next host. ``capacity``
when none has room; the unreachable host's error when none answered.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Mapping
from typing import Any, Final

import trio

from protocols.framing import is_text
from supervisor.config import AgentSpec, builtin_agents
from supervisor.core.pause import Pause
from supervisor.errors import BadRequest, SupervisorError
from supervisor.remote.errors import HostCapacity, HostUnreachable, LinkLost, NodeRetired
from supervisor.remote.frames import as_is, check_state, text_field
from supervisor.remote.handshake import spec_to_wire
from supervisor.remote.hosts import HostSpec
from supervisor.remote.link import Connection, NodeLink
from supervisor.remote.record import RemoteRecord
from supervisor.remote.revival import Revival
from supervisor.remote.session import RemoteSession

__all__ = ["PROBE_TIMEOUT_S", "RemoteHosts", "rank"]

log = logging.getLogger(__name__)

#: Placement asks each candidate's node how many sessions it holds, waiting at most this long
#: (or the host's ``connect_timeout_s`` if shorter): a first connection, the node starting,
#: takes ~1-2 s here; a host that does not answer in time is skipped with its cause.
PROBE_TIMEOUT_S: Final = 10.0


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
        self._links: dict[str, NodeLink[RemoteSession]] = {}
        #: links to retired nodes (an upgrade on the host): they serve the sessions there
        self._retired: list[NodeLink[RemoteSession]] = []
        self._starting: dict[str, int] = {}  # sessions being placed, not yet started

    def links(self) -> list[NodeLink[RemoteSession]]:
        """The links to the hosts' current nodes (made so far)."""
        return list(self._links.values())

    def link(self, host: str) -> NodeLink[RemoteSession]:
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

    def _retire(self, link: NodeLink[RemoteSession]) -> None:
        """``link``'s node was retired: it keeps driving the sessions there, and the host's
        next session goes through a new link, to the host's current node."""
        if self._links.get(link.host.name) is link:
            del self._links[link.host.name]
            self._retired = [old for old in self._retired if old.sessions]
            self._retired.append(link)

    def candidates(self, spec: AgentSpec, host: str | None) -> list[HostSpec]:
        """The hosts ``spec`` may start on now: ``host`` (checked), else every one it lists."""
        if host is not None:
            if host not in self.hosts:
                known = ", ".join(sorted(self.hosts)) or "none"
                raise BadRequest(f"unknown host {host!r} (configured: {known})")
            if host not in spec.hosts:
                where = ", ".join(spec.hosts) or "this machine only"
                raise BadRequest(f"agent {spec.name!r} may not run on {host} (its hosts: {where})")
            return [self.hosts[host]]
        candidates = [self.hosts[name] for name in spec.hosts if name in self.hosts]
        if not candidates:
            raise BadRequest(f"agent {spec.name!r} lists no configured host")
        return candidates

    async def count(self, host: HostSpec) -> int:
        """How many sessions the host's node holds now, from every front (bounded by
        ``PROBE_TIMEOUT_S``; raises :class:`HostUnreachable`), plus ours still being placed
        there (the node counts a session once it started)."""
        link = self.link(host.name)
        timeout = min(PROBE_TIMEOUT_S, host.connect_timeout_s)
        with trio.move_on_after(timeout):
            try:
                conn = await link.connection(deadline=trio.current_time() + timeout)
                result = await conn.request("session.list", {}, as_is)
            except LinkLost as exc:
                raise HostUnreachable(host.name, "transport_failed", str(exc)) from None
            sessions = result.get("sessions")
            live = [
                s
                for s in (sessions if isinstance(sessions, list) else [])
                if isinstance(s, dict) and s.get("state") not in ("stopped", "failed")
            ]
            # A retired node (an upgrade on the host) still holds ours; other fronts' there
            # are not counted (the current node enforces max_sessions on its own).
            retired = sum(len(old.sessions) for old in self._retired if old.host.name == host.name)
            return len(live) + retired + self._starting.get(host.name, 0)
        raise HostUnreachable(
            host.name, "timeout", f"no answer to how many sessions it holds in {timeout:g} s"
        )

    async def start_session(
        self,
        spec: AgentSpec,
        *,
        host: str | None,
        cwd: str | None,
        paused: Pause | None = None,
        revive: tuple[str, Revival] | None = None,
    ) -> RemoteSession:
        """Place and start a session: on the host asked for, else on the agent's host with
        the most room as its node counts it (see :func:`rank`); a node refuses a start over
        its ``max_sessions`` itself (``capacity``), and the next host is tried. ``paused``:
        the front is paused, and the node holds the session before it is anybody's.
        ``revive``: the id of a stored session of ``host`` and what it goes on from: the
        node's new session is that one again (``supervisor/remote/revival.py``)."""
        candidates = self.candidates(spec, host)
        failures: list[tuple[HostSpec, SupervisorError]] = []
        if len(candidates) > 1:
            counts: dict[str, int] = {}

            async def probe(candidate: HostSpec) -> None:
                try:
                    counts[candidate.name] = await self.count(candidate)
                except SupervisorError as exc:  # unreachable, or its node's own error
                    failures.append((candidate, exc))

            async with trio.open_nursery() as nursery:
                for candidate in candidates:
                    nursery.start_soon(probe, candidate)
            for candidate, exc in failures:
                log.warning(
                    "placing a session of %r: skipping %s: %s", spec.name, candidate.name, exc
                )
            ordered, full = rank([c for c in candidates if c.name in counts], counts)
            failures += [(c, HostCapacity(_full(c, counts[c.name]))) for c in full]
        else:
            ordered = candidates
        for chosen in ordered:
            try:
                return await self._start_on(chosen, spec, cwd, paused, revive)
            except (HostCapacity, HostUnreachable) as exc:
                failures.append((chosen, exc))  # (another front took the last place meanwhile)
                log.info("placing a session of %r: %s refused: %s", spec.name, chosen.name, exc)
        raise _no_host(spec, candidates, failures)

    async def _start_on(
        self,
        chosen: HostSpec,
        spec: AgentSpec,
        cwd: str | None,
        paused: Pause | None,
        revive: tuple[str, Revival] | None = None,
    ) -> RemoteSession:
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
            if chosen.max_sessions is not None:
                payload["max_sessions"] = chosen.max_sessions  # the node decides, for all fronts
            if revive is not None:
                payload["revive"] = revive[1].to_wire()
            for attempt in range(3):
                link = self.link(name)
                conn = await link.connection()
                try:
                    node_id, state = await conn.request(
                        "session.start",
                        payload,
                        _started,
                        # The node answers once the agent is up (or could not start).
                        timeout=chosen.request_timeout_s + spec.start_timeout_s,
                        on_late=functools.partial(_stop_late_start, conn),
                    )
                    break
                except NodeRetired:
                    if attempt == 2:
                        raise
                    log.info("host %s: node pid %d is retired: a new link", name, link.node_pid)
                    self._retire(link)
            session = RemoteSession(
                link,
                node_id=node_id,
                spec=spec,
                cwd=cwd,
                state=state,
                paused=paused,
                session_id=revive[0] if revive is not None else None,
                after=revive[1].last_seq if revive is not None else 0,
            )
            link.sessions[session.node_id] = session
            if self.record is not None:
                self.record.add(session.record())
            try:
                await session.subscribe_on(conn)
            except SupervisorError as exc:
                # Nobody will have it (this start fails): not left registered for the link to
                # keep resubscribing, and stopped in the node while the link is up (after a
                # protocol error: once a connection reaches that node again).
                session.fail(f"subscribing on {name} failed: {exc}")
                conn.spawn_request("session.stop", {"session_id": node_id})
                raise
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
        per_node: dict[tuple[str, object], tuple[NodeLink[RemoteSession], object]] = {}
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
            cwd, session_id = entry.get("cwd"), entry.get("session_id")
            session = RemoteSession(
                link,
                node_id=str(entry.get("node_id")),
                spec=spec,
                cwd=cwd if isinstance(cwd, str) else None,
                state="starting",
                session_id=session_id if isinstance(session_id, str) else None,
            )
            session.recovering()
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


def _started(result: dict[str, Any]) -> tuple[str, str]:
    """A start's answer: the node's session id, and the session's state."""
    state = check_state(result.get("state", "ready"), "whose 'state'")
    return text_field(result, "session_id"), state


def _stop_late_start(conn: Connection, response: dict[str, Any]) -> None:
    """A ``session.start`` answered after its deadline: its caller was told the host did not
    answer, so the session it started is nobody's; it is stopped at once, rather than run (and
    count against ``max_sessions``) until its node stops undriven sessions."""
    result = response.get("result")
    node_id = result.get("session_id") if isinstance(result, dict) else None
    if isinstance(node_id, str) and is_text(node_id):
        log.warning(
            "host %s: session %s started after its start was given up: stopping it",
            conn.host.name,
            node_id,
        )
        conn.spawn_request("session.stop", {"session_id": node_id})


def rank(
    candidates: list[HostSpec], counts: Mapping[str, int]
) -> tuple[list[HostSpec], list[HostSpec]]:
    """(the hosts with room, best first; the full ones), from the sessions each node holds:
    the most room first (``max_sessions`` minus its count; no limit is endless room), ties to
    the fewer sessions, then the order of the agent's list."""

    def room(host: HostSpec) -> float:
        if host.max_sessions is None:
            return math.inf
        return host.max_sessions - counts[host.name]

    ordered = sorted(
        enumerate(candidates), key=lambda item: (-room(item[1]), counts[item[1].name], item[0])
    )
    return [h for _, h in ordered if room(h) > 0], [h for _, h in ordered if room(h) <= 0]


def _full(host: HostSpec, count: int) -> str:
    return f"host {host.name} holds {count} sessions, its max_sessions is {host.max_sessions}"


def _no_host(
    spec: AgentSpec, candidates: list[HostSpec], failures: list[tuple[HostSpec, SupervisorError]]
) -> SupervisorError:
    """No host took the session: ``capacity`` if one was full, else the host unreachable
    (its cause; every host's in the message when there were several)."""
    if len(failures) == 1:
        return failures[0][1]
    said = "; ".join(
        f"{host.name} unreachable ({exc.cause}): {exc}"
        if isinstance(exc, HostUnreachable)
        else f"{host.name}: {exc}"
        for host, exc in failures
    )
    unreachable = [exc for _, exc in failures if isinstance(exc, HostUnreachable)]
    if len(unreachable) == len(failures) and unreachable:
        first = unreachable[0]
        return HostUnreachable(
            first.host, first.cause, f"no host of agent {spec.name!r} answered ({said})"
        )
    if any(not isinstance(exc, HostCapacity) for _, exc in failures):
        return HostCapacity(f"every host of agent {spec.name!r} is full or did not answer ({said})")
    return HostCapacity(f"every host of agent {spec.name!r} holds its max_sessions ({said})")


def _is_builtin(spec: AgentSpec) -> bool:
    """The node has the built-in agents itself (with its own Python): send none of ours."""
    builtin = builtin_agents().get(spec.name)
    return builtin is not None and builtin.with_options(hosts=spec.hosts) == spec
