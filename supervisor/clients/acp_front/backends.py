"""Where the sessions behind the ACP front door live: in this process, or on a gateway.

:class:`EmbeddedSessions` owns a supervisor of its own (``agent-supervisor acp``);
:class:`GatewaySessions` speaks to a running gateway over its WebSocket (``--connect URL``),
so the editor shares each session with the web UI and the chat. Both hand out
:class:`FrontSession` objects with the same few calls, and both give events as universal
event objects, in order, with no gaps (a subscriber cut off for falling behind catches up).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from typing import Any, Protocol

import trio
from trio_websocket import ConnectionClosed

from protocols import PROTOCOLS
from protocols import events as ev
from protocols.content import CARRY_WORDS, Part, refusal, to_acp
from protocols.mcp import mcp_servers_from_acp
from supervisor.client import GatewayClient, GatewayError
from supervisor.errors import AgentNotRunning, BadRequest, SessionNotFound, SupervisorError
from supervisor.runtime.session import Session, Subscription
from supervisor.store.backend import TextRow
from supervisor.store.dormant import DormantSession
from supervisor.store.writer import said_in_texts
from supervisor.supervisor import AnySession, Supervisor
from supervisor.wire.codec import known_event

__all__ = [
    "Backend",
    "BackendError",
    "BackendNotFound",
    "BackendRefused",
    "EmbeddedSession",
    "EmbeddedSessions",
    "FrontSession",
    "GatewaySession",
    "GatewaySessions",
]

log = logging.getLogger(__name__)

#: For a gateway to replay a session's history (``session/load`` on ``--connect``): at most
#: 10,000 events of ~100 bytes, well under a second on loopback.
HISTORY_BOUND_S = 30.0
#: Bound on stopping one session (its turn's ladder, the agent's exit) when the front closes.
STOP_BOUND_S = 10.0
#: Entries of a transcript ``session/load`` replays (a prompt or a reply each): the newest.
MAX_TRANSCRIPT_ENTRIES = 200
#: Characters of one replayed entry: a replay shows the conversation, not every byte of it.
MAX_ENTRY_CHARS = 16_000
#: Characters of a listed session's title (its first prompt's first line).
MAX_TITLE_CHARS = 80


class BackendError(Exception):
    """A call on a session failed; the message is for the person in the editor."""


class BackendRefused(BackendError):
    """The session refused what it was asked, as asked (content the agent cannot take)."""


class BackendNotFound(BackendRefused):
    """The session a call names is not known (ACP's "Resource not found")."""


class FrontSession(Protocol):
    """One session behind the front door."""

    id: str  # the backend's own id (a gateway's ``s3``)
    agent: str
    cwd: str
    #: what it said so far, when the backend keeps it (``attach(history=True)``): role, text
    transcript: list[list[str]]
    #: its agent is not running: the next prompt starts it, resuming the agent's own session
    resumes: bool

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> str:
        """Returns the turn id once the session accepted the prompt; ``parts``: its content
        when it is more than text (:class:`BackendRefused` if the agent cannot take it)."""
        ...

    @property
    def prompt_carries(self) -> frozenset[str]:
        """What the agent behind takes in a prompt besides text (``protocols.content``)."""
        ...

    async def cancel(self) -> None:
        """Returns once the running turn has ended (the whole ladder ran)."""
        ...

    async def steer(self, text: str) -> str:
        """Returns the steer's mode: ``injected``, ``started`` or ``interrupted``."""
        ...

    async def respond_permission(self, request_id: str, option_id: str | None) -> None: ...

    @property
    def modes(self) -> dict[str, Any] | None:
        """The agent's session modes (ACP's ``SessionModeState``), or None: it has none."""
        ...

    async def set_mode(self, mode_id: str) -> None:
        """Returns once the agent took the mode (:class:`BackendRefused` if it did not)."""
        ...

    def events(self) -> AsyncIterator[ev.Event]:
        """Events from when the session was opened here, in order, until it ends."""
        ...

    async def stop(self) -> None:
        """Stop the session (embedded), or stop following it (a gateway's lives on)."""
        ...

    @property
    def agent_session_id(self) -> str | None: ...


class Backend(Protocol):
    @property
    def agents(self) -> Sequence[tuple[str, str]]:
        """The agents it can start: name, description."""
        ...

    @property
    def persistent_ids(self) -> bool:
        """Whether its sessions outlive this process (a store keeps them): ``session/list``
        lists the stopped ones too, and ``session/load`` of one brings it back."""
        ...

    def mcp_transports(self, agent: str | None) -> frozenset[str]:
        """The kinds of MCP server ``agent`` can be given (``stdio``, ``http``, ``sse``)."""
        ...

    def prompt_carries(self, agent: str | None) -> frozenset[str]:
        """What ``agent`` takes in a prompt besides text as far as is known before a session
        of it runs (its protocol's word; an ACP agent's own comes when it starts)."""
        ...

    async def start(
        self,
        agent: str,
        cwd: str,
        *,
        mcp_servers: Sequence[dict[str, Any]] = (),
        resume: str | None = None,
    ) -> FrontSession: ...

    async def attach(self, session_id: str, *, history: bool = False) -> FrontSession:
        """A session that runs already (a gateway's), followed from now on; ``history``: its
        transcript so far is read first (``FrontSession.transcript``)."""
        ...

    async def list(self) -> list[dict[str, Any]]:
        """The sessions the backend itself knows (``session_id``, ``agent``, ``cwd``?)."""
        ...


# -- embedded -------------------------------------------------------------------------------


class EmbeddedSession:
    """A session of the front door's own supervisor. One the store keeps whose agent is not
    running (stored by an earlier process, or stopped here) starts its agent again on the
    first prompt or steer (``Supervisor.reopen``): its events go on from there."""

    def __init__(
        self, session: AnySession, subscription: Subscription, supervisor: Supervisor
    ) -> None:
        self._session = session
        self._subscription = subscription
        self._supervisor = supervisor
        self.id = session.id
        self.agent = session.spec.name
        self.cwd: str = session.cwd or ""
        #: what ``session/load`` replays (``EmbeddedSessions.attach(history=True)``)
        self.transcript: list[list[str]] = []
        #: its agent was started again (a prompt or steer came while it was stored)
        self._revived = trio.Event()
        self.resumes = isinstance(session, DormantSession) and session.agent_session_id is not None

    @property
    def _current(self) -> AnySession:
        """The supervisor's session of this id: the live one once a stored one is revived."""
        try:
            return self._supervisor.get(self.id)
        except SupervisorError:
            return self._session

    def _check_revived(self) -> None:
        if isinstance(self._session, DormantSession) and self._current is not self._session:
            self._revived.set()

    @property
    def agent_session_id(self) -> str | None:
        current = self._current
        if isinstance(current, Session | DormantSession):
            return current.agent_session_id
        return None

    @property
    def prompt_carries(self) -> frozenset[str]:
        return self._current.prompt_carries

    @property
    def modes(self) -> dict[str, Any] | None:
        return self._current.modes

    async def set_mode(self, mode_id: str) -> None:
        try:
            await self._current.set_mode(mode_id)
        except (BadRequest, AgentNotRunning) as exc:
            # Not running: a stored session, opened offering no modes (its agent says them
            # once a prompt starts it), refuses a mode as any session offering none does.
            raise BackendRefused(str(exc)) from exc
        except SupervisorError as exc:
            raise BackendError(str(exc)) from exc

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> str:
        try:
            return (await self._current.prompt(text, parts)).id
        except BadRequest as exc:
            raise BackendRefused(str(exc)) from exc
        except SupervisorError as exc:
            raise BackendError(str(exc)) from exc
        finally:
            self._check_revived()

    async def cancel(self) -> None:
        try:
            await self._current.cancel(reason="user")
        except SupervisorError as exc:
            raise BackendError(str(exc)) from exc

    async def steer(self, text: str) -> str:
        try:
            return (await self._current.steer(text)).mode
        except SupervisorError as exc:
            raise BackendError(str(exc)) from exc
        finally:
            self._check_revived()

    async def respond_permission(self, request_id: str, option_id: str | None) -> None:
        try:
            await self._current.respond_permission(
                request_id, option_id, cancelled=option_id is None
            )
        except SupervisorError as exc:
            raise BackendError(str(exc)) from exc

    async def events(self) -> AsyncIterator[ev.Event]:
        while True:
            try:
                async for event in self._subscription:
                    yield event
            except trio.ClosedResourceError:
                return  # closed here: the session is being stopped
            if not self._subscription.lagged:
                if not isinstance(self._session, DormantSession):
                    return  # it stopped
                # A stored session's (its history is the store's): its events start when a
                # prompt starts its agent again, after the stored ones.
                await self._revived.wait()
                self._session = self._current
            # Cut off for falling behind, or revived: on from the last event had.
            last_seq = self._subscription.last_seq
            self._subscription.close()
            self._subscription = await self._session.open_subscription(since_seq=last_seq)

    async def stop(self) -> None:
        self._subscription.close()
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_BOUND_S):
            try:
                await self._current.stop()
            except SupervisorError:
                pass  # stopped or failed already


class EmbeddedSessions:
    """Sessions of a supervisor in this process; with a store (``open_supervisor(store=)``),
    the stored ones too: listed, loaded with their history, revived by a prompt."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self.agents = [(spec.name, spec.description) for spec in supervisor.agents.values()]
        self.persistent_ids = supervisor.store is not None

    async def start(
        self,
        agent: str,
        cwd: str,
        *,
        mcp_servers: Sequence[dict[str, Any]] = (),
        resume: str | None = None,
    ) -> EmbeddedSession:
        try:
            session = await _start_with_mcp(self._supervisor, agent, cwd, resume, mcp_servers)
            # From its first event: how its start went (a resume refused) is told too.
            subscription = await session.open_subscription(since_seq=0)
        except BadRequest as exc:  # what was asked (a cwd, an MCP server), refused
            raise BackendRefused(f"cannot start {agent}: {exc}") from exc
        except SupervisorError as exc:
            raise BackendError(f"cannot start {agent}: {exc}") from exc
        return EmbeddedSession(session, subscription, self._supervisor)

    def mcp_transports(self, agent: str | None) -> frozenset[str]:
        spec = self._supervisor.agents.get(agent) if agent is not None else None
        protocol = PROTOCOLS.get(spec.protocol) if spec is not None else None
        return protocol.mcp_transports if protocol is not None else frozenset({"stdio"})

    def prompt_carries(self, agent: str | None) -> frozenset[str]:
        spec = self._supervisor.agents.get(agent) if agent is not None else None
        if spec is None or spec.hosts:
            return frozenset()  # a host's session takes text (RemoteSession)
        protocol = PROTOCOLS.get(spec.protocol)
        return protocol.prompt_carries if protocol is not None else frozenset()

    async def attach(self, session_id: str, *, history: bool = False) -> EmbeddedSession:
        """The session ``session_id``, running or stored (a prompt revives a stored one); with
        ``history``, its stored prompts and answers (``FrontSession.transcript``)."""
        try:
            session = await self._supervisor.reopen(session_id)
            subscription = await session.open_subscription()
        except SessionNotFound as exc:
            raise BackendNotFound(f"no session {session_id!r} is known here") from exc
        except SupervisorError as exc:
            raise BackendError(f"cannot open session {session_id!r}: {exc}") from exc
        front = EmbeddedSession(session, subscription, self._supervisor)
        store = self._supervisor.store
        if history and store is not None:
            await store.flushed()
            front.transcript = _transcript(await store.texts(session_id))
        return front

    async def list(self) -> list[dict[str, Any]]:
        """Every stored session, the most recently active first (``title``: its first
        prompt's first line; ``updated_at``: its last activity, Unix time)."""
        store = self._supervisor.store
        if store is None:  # the sessions of this process only
            return [
                {"session_id": s.session_id, "agent": s.agent, "cwd": s.cwd, "state": s.state}
                for s in self._supervisor.list()
            ]
        await store.flushed()
        prompts = await store.first_prompts(MAX_TITLE_CHARS * 4)
        listed = []
        for stored in await store.sessions():
            prompt = prompts.get(stored.id, "").strip()
            listed.append(
                {
                    "session_id": stored.id,
                    "agent": stored.agent,
                    "cwd": stored.cwd,
                    "state": stored.state,
                    "title": prompt.splitlines()[0][:MAX_TITLE_CHARS] if prompt else None,
                    "updated_at": stored.last_active,
                }
            )
        return listed


def _transcript(texts: list[TextRow]) -> list[list[str]]:
    """What ``session/load`` replays of stored texts: each prompt or steer (``user``) and
    answer (``agent``), the newest :data:`MAX_TRANSCRIPT_ENTRIES`, each cut at
    :data:`MAX_ENTRY_CHARS`."""
    entries = [
        ["agent" if said.role == "assistant" else "user", said.text[:MAX_ENTRY_CHARS]]
        for said in said_in_texts(texts)
        if said.text
    ]
    return entries[-MAX_TRANSCRIPT_ENTRIES:]


async def _start_with_mcp(
    supervisor: Supervisor,
    agent: str,
    cwd: str,
    resume: str | None,
    mcp_servers: Sequence[dict[str, Any]],
) -> AnySession:
    """The client's ``mcpServers`` reach the agent behind, on top of its own, the way its
    protocol takes them (``Supervisor.start_session(mcp_servers=...)``)."""
    try:
        servers = mcp_servers_from_acp(list(mcp_servers))
    except ValueError as exc:
        raise BackendRefused(f"mcpServers{exc}") from None
    return await supervisor.start_session(agent, cwd=cwd, resume=resume, mcp_servers=servers)


# -- a gateway ------------------------------------------------------------------------------


class GatewaySession:
    """A gateway's session, followed over this front's WebSocket connection."""

    def __init__(
        self,
        sessions: GatewaySessions,
        session_id: str,
        agent: str,
        cwd: str,
        channel: trio.MemoryReceiveChannel[dict[str, Any]],
        stack: AsyncExitStack,
    ) -> None:
        self._sessions = sessions
        self._client = sessions.client
        self.id = session_id
        self.agent = agent
        self.cwd = cwd
        self._channel = channel
        self._stack = stack
        self._last_seq: int | None = None
        #: what ``session/load`` replays (``read_history``)
        self.transcript: list[list[str]] = []
        modes = self._client.subscribed.get(session_id, {}).get("modes")
        self._modes: dict[str, Any] | None = modes if isinstance(modes, dict) else None

    agent_session_id = None
    resumes = False

    async def read_history(self, head: int) -> None:
        """Take the replayed events up to ``head`` (the newest when subscribed) off the
        channel, as a transcript (``[role, text]``); what comes after is the live stream."""
        self.transcript = []
        while (self._last_seq or 0) < head:
            try:
                message = await self._channel.receive()
            except trio.EndOfChannel:
                raise BackendError("the session ended while its history was read") from None
            if message.get("event") in ("subscription.lagged", "subscription.closed"):
                raise BackendError(f"the gateway cut the replay short ({message.get('event')})")
            event = known_event(message)
            if event is None:
                continue
            self._last_seq = event.seq
            if isinstance(event, ev.TurnStarted):
                self.transcript.append(["user", event.text])
            elif isinstance(event, ev.MessageDelta) and event.role != "user" and event.text:
                if self.transcript and self.transcript[-1][0] == "agent":
                    self.transcript[-1][1] += event.text
                else:
                    self.transcript.append(["agent", event.text])

    async def _request(self, action: str, payload: dict[str, Any]) -> dict[str, Any]:
        with _gateway_errors():
            return await self._client.request(action, {"session_id": self.id, **payload})

    @property
    def prompt_carries(self) -> frozenset[str]:
        """What the gateway's session takes besides text, as its subscribe said (an older
        gateway says nothing: text only)."""
        carries = self._client.subscribed.get(self.id, {}).get("prompt_carries")
        return frozenset(carries) & CARRY_WORDS if isinstance(carries, list) else frozenset()

    @property
    def modes(self) -> dict[str, Any] | None:
        return self._modes

    async def set_mode(self, mode_id: str) -> None:
        if self._modes is None:
            raise BackendRefused(f"agent {self.agent!r} offers no modes")
        with _gateway_errors(refused=True):
            await self._client.set_mode(self.id, mode_id)
        self._modes = {**self._modes, "currentModeId": mode_id}

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> str:
        why = refusal(parts, self.prompt_carries, f"agent {self.agent!r}")
        if why is not None:
            raise BackendRefused(why)
        content = [to_acp(part, CARRY_WORDS) for part in parts]  # each as such
        with _gateway_errors(refused=True):  # what the agent cannot take: refused
            result = await self._client.prompt(self.id, text, content=content)
        return str(result["turn_id"])

    async def cancel(self) -> None:
        await self._request("agent.cancel", {"reason": "user"})

    async def steer(self, text: str) -> str:
        return str((await self._request("agent.steer", {"text": text}))["mode"])

    async def respond_permission(self, request_id: str, option_id: str | None) -> None:
        with _gateway_errors():
            await self._client.respond_permission(self.id, request_id, option_id)

    async def events(self) -> AsyncIterator[ev.Event]:
        # From where the history read (``read_history``) left off.
        async for event in self._client.events(self.id, self._channel, after_seq=self._last_seq):
            self._last_seq = event.seq
            yield event

    async def stop(self) -> None:
        """Stop following: the session is the gateway's, and its other clients keep it."""
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_BOUND_S):
            await self._stack.aclose()


@contextmanager
def _gateway_errors(*, refused: bool = False) -> Iterator[None]:
    """A failed gateway call as a :class:`BackendError` for the person in the editor; with
    ``refused``, a ``bad_request`` as :class:`BackendRefused` (what was asked, refused)."""
    try:
        yield
    except GatewayError as exc:
        if refused and exc.code == "bad_request":
            raise BackendRefused(exc.message) from exc
        raise BackendError(exc.message) from exc
    except ConnectionClosed as exc:
        raise BackendError("the connection to the gateway is closed") from exc


class GatewaySessions:
    """Sessions of a running gateway (``--connect URL``); ids are the gateway's."""

    persistent_ids = False

    def __init__(
        self,
        client: GatewayClient,
        agents: Sequence[tuple[str, str]],
        carries: dict[str, frozenset[str]] | None = None,
    ) -> None:
        self.client = client
        self.agents = list(agents)
        #: what each agent's protocol takes besides text, as the gateway lists it
        self._carries = carries or {}

    def mcp_transports(self, agent: str | None) -> frozenset[str]:
        """The gateway's agents are known by name and protocol only: stdio servers, which
        every protocol takes (the gateway refuses, with the reason, what it cannot pass)."""
        return frozenset({"stdio"})

    def prompt_carries(self, agent: str | None) -> frozenset[str]:
        return self._carries.get(agent or "", frozenset())

    @classmethod
    async def open(cls, client: GatewayClient) -> GatewaySessions:
        try:
            listed = await client.agents()
        except GatewayError as exc:
            raise BackendError(f"the gateway does not list its agents: {exc}") from exc
        agents = [(str(a.get("name")), str(a.get("description") or "")) for a in listed]
        carries = {
            str(a.get("name")): frozenset(a["prompt_carries"]) & CARRY_WORDS
            for a in listed
            if isinstance(a.get("prompt_carries"), list)
        }
        return cls(client, agents, carries)

    async def start(
        self,
        agent: str,
        cwd: str,
        *,
        mcp_servers: Sequence[dict[str, Any]] = (),
        resume: str | None = None,
    ) -> GatewaySession:
        try:
            started = await self.client.start_session(agent, cwd, mcp_servers=mcp_servers)
        except GatewayError as exc:
            refused = BackendRefused if exc.code == "bad_request" else BackendError
            raise refused(f"cannot start {agent}: {exc.message}") from exc
        except ConnectionClosed as exc:
            raise BackendError(
                f"cannot start {agent}: the connection to the gateway is closed"
            ) from exc
        return await self._follow(str(started["session_id"]), agent, cwd)

    async def attach(self, session_id: str, *, history: bool = False) -> GatewaySession:
        """Follow ``session_id``; with ``history``, its transcript so far is read first (the
        gateway replays its events from the start) for ``session/load`` to show."""
        try:
            listed = await self.client.sessions()
        except GatewayError as exc:
            raise BackendError(str(exc)) from exc
        except ConnectionClosed as exc:
            raise BackendError("the connection to the gateway is closed") from exc
        for summary in listed:
            if summary.get("session_id") == session_id:
                agent = str(summary.get("agent"))
                cwd = str(summary.get("cwd") or "")
                return await self._follow(session_id, agent, cwd, history=history)
        raise BackendNotFound(f"the gateway has no session {session_id!r}")

    async def _follow(
        self, session_id: str, agent: str, cwd: str, *, history: bool = False
    ) -> GatewaySession:
        stack = AsyncExitStack()
        try:
            channel = await stack.enter_async_context(
                self.client.subscribe(session_id, since_seq=0 if history else None)
            )
        except (GatewayError, ConnectionClosed) as exc:
            await stack.aclose()
            raise BackendError(f"cannot follow session {session_id}: {exc}") from exc
        session = GatewaySession(self, session_id, agent, cwd, channel, stack)
        if history:
            head = int(self.client.subscribed.get(session_id, {}).get("last_seq") or 0)
            try:
                with trio.fail_after(HISTORY_BOUND_S):
                    await session.read_history(head)
            except (trio.TooSlowError, BackendError) as exc:
                await stack.aclose()
                raise BackendError(f"cannot read the history of {session_id}: {exc}") from exc
        return session

    async def list(self) -> list[dict[str, Any]]:
        try:
            return await self.client.sessions()
        except GatewayError as exc:
            raise BackendError(str(exc)) from exc
        except ConnectionClosed as exc:
            raise BackendError("the connection to the gateway is closed") from exc
