"""What each call of the wire protocol does (``design/gateway.md``, "The wire protocol"): the
table from a decoded call (``supervisor/wire/requests.py``) to the supervisor's API, and the
result it answers. A WebSocket connection runs every call here; the HTTP routes run the lists
(the receipts', a :class:`~supervisor.wire.requests.ListReceipts` as ``receipts.list``) and an
abort (a :class:`~supervisor.wire.requests.Cancel`, as ``agent.cancel``)."""

from __future__ import annotations

import math
from typing import Any, Protocol, assert_never

import trio

from protocols import PROTOCOLS
from supervisor.config import AgentSpec
from supervisor.errors import BadRequest
from supervisor.pausing import PauseStatus
from supervisor.remote.revival import Revival
from supervisor.remote.session import RemoteSession
from supervisor.runtime.session import Session, SessionSummary
from supervisor.store.dormant import DormantSession
from supervisor.supervisor import AnySession, Supervisor
from supervisor.wire.codec import receipt_to_wire, steer_to_wire
from supervisor.wire.requests import (
    Call,
    Cancel,
    Diff,
    Input,
    ListAgents,
    ListReceipts,
    ListSessions,
    PauseAll,
    PauseSession,
    Prompt,
    Resize,
    RespondPermission,
    ResumeAll,
    ResumeSession,
    Rewind,
    SearchSessions,
    SetMode,
    StartSession,
    Steer,
    StopSession,
    Subscribe,
    Unsubscribe,
)

__all__ = ["Actions", "Subscriber"]


class Subscriber(Protocol):
    """The connection a call came on, for the calls about its own subscriptions."""

    async def subscribe(
        self, request_id: str | int, session: AnySession, since_seq: int | None
    ) -> None:
        """Subscribe to ``session`` from ``since_seq``, answering ``request_id`` itself (the
        answer goes before the events)."""

    def unsubscribe(self, session_id: str) -> None: ...


class Actions:
    """The calls of one gateway over ``supervisor``. ``accept_specs``: a node's gateway, driven
    by a front that already runs commands on this host (``supervisor/remote/``):
    ``session.start`` may carry the agent's definition (``spec``) and ``max_sessions``, and
    ``session.pause``/``session.resume`` pass the front's pause on to one session."""

    def __init__(self, supervisor: Supervisor, *, accept_specs: bool = False) -> None:
        self.supervisor = supervisor
        self.accept_specs = accept_specs

    async def run(
        self, request_id: str | int, call: Call, client: Subscriber
    ) -> dict[str, Any] | None:
        """The call's result, or None when ``client`` answered it already (a subscribe)."""
        sup = self.supervisor
        match call:
            case ListAgents():
                return self.agents()
            case ListSessions():
                await sup.refresh_stored()  # (other processes of the store start sessions)
                return self.sessions()
            case ListReceipts():
                return self.receipts(call)
            case SearchSessions():
                return await self.search(call)
            case StartSession():
                return await self.start(call)
            case Subscribe():
                session = await sup.find(call.session_id)
                await client.subscribe(request_id, session, call.since_seq)
                return None
            case Unsubscribe():
                client.unsubscribe(sup.get(call.session_id).id)
                return {}
            case Prompt():
                turn = await (await sup.find(call.session_id)).prompt(call.text, call.parts)
                return {"turn_id": turn.id, "queued": turn.queued, "held": turn.held}
            case SetMode():
                await (await sup.find(call.session_id)).set_mode(call.mode_id)
                return {}
            case Input():
                await (await sup.find(call.session_id)).input(call.data)
                return {}
            case Resize():
                await (await sup.find(call.session_id)).resize(call.cols, call.rows)
                return {}
            case Steer():
                return steer_to_wire(await (await sup.find(call.session_id)).steer(call.text))
            case Cancel():
                return await self.cancel(call)
            case RespondPermission():
                await (await sup.find(call.session_id)).respond_permission(
                    call.request_id, call.option_id, cancelled=call.cancelled
                )
                return {}
            case Rewind():
                found = await self._rewindable(call.session_id)
                return await found.rewind(call.turn_id, force=call.force)
            case Diff():
                found = await self._rewindable(call.session_id)
                return await found.diff(call.turn_id, call.path)
            case StopSession():
                return await self.stop(call)
            case PauseAll():
                return pause_to_wire(await sup.pause(call.deadline_s))
            case ResumeAll():
                return pause_to_wire(await sup.resume())
            case PauseSession() | ResumeSession():
                return await self.pause_one(call)
            case _:
                assert_never(call)

    async def start(self, call: StartSession) -> dict[str, Any]:
        if call.max_sessions is not None and not self.accept_specs:
            raise BadRequest("'max_sessions' is for nodes (agent-supervisor node)")
        revival = self._revival(call)
        session = await self.supervisor.start_session(
            self._agent(call),
            cwd=call.cwd,
            host=call.host,
            mcp_servers=call.mcp_servers,
            at_most=call.max_sessions,
            worktree=call.worktree,
            resume=revival.resume if revival is not None else None,
            after=(revival.last_seq, revival.turns) if revival is not None else (0, 0),
            earlier=revival.earlier if revival is not None else (),
            checkpoints_of=revival.checkpoints_of if revival is not None else None,
        )
        host = {"host": session.host} if session.host is not None else {}
        return {"session_id": session.id, "state": session.state, **host, **_worktree(session)}

    async def stop(self, call: StopSession) -> dict[str, Any]:
        """``session.stop``: its exit code, and what became of its worktree if it had one
        (``design/worktrees.md``)."""
        session = self.supervisor.get(call.session_id)
        status = await self.supervisor.stop_session(session.id)
        answer: dict[str, Any] = {"exit_code": status.code if status is not None else None}
        left = session.worktree_left if isinstance(session, Session) else None
        if left is not None:
            answer["worktree"] = left.to_wire()
        return answer

    async def pause_one(self, call: PauseSession | ResumeSession) -> dict[str, Any]:
        """A front's pause of one session of this node (``held``: where it stands now)."""
        if not self.accept_specs:
            raise BadRequest(f"'{call.action}' is for nodes: gateway.pause pauses every session")
        session = self.supervisor.get(call.session_id)
        if isinstance(call, ResumeSession):
            await session.resume()
        else:
            seconds = call.deadline_s
            await session.pause(math.inf if seconds is None else trio.current_time() + seconds)
        return {"held": session.held}

    async def cancel(self, call: Cancel) -> dict[str, Any]:
        """The receipt, once the turn has ended (``agent.cancel``, ``POST .../abort``)."""
        if call.rewind:
            found = await self._rewindable(call.session_id)
            receipt = await found.cancel(turn_id=call.task_id, reason=call.reason, rewind=True)
        else:
            session = await self.supervisor.find(call.session_id)
            receipt = await session.cancel(turn_id=call.task_id, reason=call.reason)
        return {**receipt_to_wire(receipt), "success": True}

    async def _rewindable(self, session_id: str) -> Session | RemoteSession:
        """A session with its checkpoints where its files are: here, or in its host's node
        (which rewinds it there). A stored one (an earlier supervisor's) has its agent started
        again, with the checkpoints it kept; one that cannot be is said as such."""
        session: Any = await self.supervisor.find(session_id)
        if isinstance(session, DormantSession):
            try:
                session = await session.revive()
            except BadRequest as exc:
                where = f" on {session.host}" if session.host is not None else ""
                raise BadRequest(
                    f"session {session_id}{where} is stored (its agent is not running) and"
                    f" cannot be started again: {exc}"
                ) from None
        if not isinstance(session, Session | RemoteSession):
            raise BadRequest(
                f"session {session_id} is not running: a rewind is for running sessions"
                " (send a prompt first to revive a stopped one)"
            )
        return session

    def sessions(self) -> dict[str, Any]:
        return {
            "paused": self.supervisor.pause_status().paused,
            "sessions": [
                {
                    "session_id": s.session_id,
                    "agent": s.agent,
                    "state": s.state,
                    "turn_id": s.turn_id,
                    "recycles": s.recycles,
                    "recycle_reason": s.recycle_reason,
                    "held": s.held,
                    **({"host": s.host} if s.host is not None else {}),
                    **({"cwd": s.cwd} if s.cwd is not None else {}),
                    **({"worktree": s.worktree, "branch": s.branch} if s.worktree else {}),
                    **_stored(s),
                }
                for s in self.supervisor.list()
            ],
        }

    def receipts(self, call: ListReceipts) -> dict[str, Any]:
        """The last stops of every session, oldest first (``receipts.list``,
        ``GET /v1/receipts``): ``kept`` says how many are kept at most, ``last_seq`` the newest
        stop's number (a client asks ``since_seq`` it next time)."""
        stops = self.supervisor.stops
        return {
            "receipts": [stop.to_wire() for stop in stops.recent(call.limit, call.since_seq)],
            "kept": stops.kept,
            "last_seq": stops.last_seq,
        }

    async def search(self, call: SearchSessions) -> dict[str, Any]:
        """Stored texts of every session holding the query's words, the best first
        (``session.search``): the store's own full-text search, on the store's thread."""
        store = self.supervisor.store
        if store is None:
            raise BadRequest(
                "session.search needs a session store, and this gateway keeps none "
                '([store] url = "none"): give serve --store or [store] url'
            )
        hits = await store.search(call.query, call.limit)
        return {
            "hits": [
                {
                    "session_id": hit.session_id,
                    "turn_id": hit.turn_id,
                    "seq": hit.seq,
                    "kind": hit.kind,
                    "snippet": hit.snippet,
                    "time": hit.time,
                    "agent": hit.agent,
                }
                for hit in hits
            ]
        }

    def agents(self) -> dict[str, Any]:
        return {
            "agents": [
                {
                    "name": name,
                    "protocol": a.protocol,
                    "description": a.description,
                    # what its protocol takes in a prompt besides text, before a session runs
                    # (an ACP agent's own comes with its session's subscribe)
                    "prompt_carries": sorted(_static_carries(a)),
                }
                for name, a in self.supervisor.agents.items()
            ]
        }

    def _revival(self, call: StartSession) -> Revival | None:
        """A front's stored session started again here (``session.start``'s ``revive``)."""
        if call.revive is None:
            return None
        if not self.accept_specs:
            raise BadRequest("'revive' is for nodes (agent-supervisor node)")
        try:
            return Revival.from_wire(call.revive)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def _agent(self, call: StartSession) -> str | AgentSpec:
        if call.spec is None:
            return call.agent
        if not self.accept_specs:
            raise BadRequest("'spec' is for nodes (agent-supervisor node): name a configured agent")
        from supervisor.remote.handshake import spec_from_wire

        try:
            return spec_from_wire(call.agent, dict(call.spec))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None


def _worktree(session: AnySession) -> dict[str, Any]:
    """A session's worktree and branch, as ``session.start`` answers them (none: nothing)."""
    worktree = session.worktree if isinstance(session, Session) else None
    if worktree is None:
        return {}
    return {"cwd": session.cwd, "worktree": worktree.path, "branch": worktree.branch}


def _stored(summary: SessionSummary) -> dict[str, Any]:
    """What ``session.list`` tells of a stored session besides the rest (a list of past
    sessions shows it): when it was created and last active, and its first prompt's start."""
    if summary.created is None:
        return {}
    return {
        "created": summary.created,
        "last_active": summary.last_active,
        "first_prompt": summary.first_prompt or "",
        **({"elsewhere": summary.elsewhere} if summary.elsewhere is not None else {}),
    }


def pause_to_wire(status: PauseStatus) -> dict[str, Any]:
    """``gateway.pause`` and ``gateway.resume``'s answer."""
    return {
        "paused": status.paused,
        "deadline_s": status.deadline_s,
        "held": list(status.held),
        "running": list(status.running),
        "pending": list(status.pending),
    }


def _static_carries(spec: AgentSpec) -> frozenset[str]:
    protocol = PROTOCOLS.get(spec.protocol)
    if spec.hosts or protocol is None:
        return frozenset()  # a host's session says what it takes when subscribed
    return protocol.prompt_carries
