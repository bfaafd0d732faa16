"""The ACP front door's I/O: one editor connection on a byte stream pair, served on Trio.

The protocol is :class:`protocols.acp_agent.AcpAgentSide`'s; this module reads lines, feeds
them to it, does what its actions ask on the sessions of a :class:`Backend`, feeds the
sessions' events back, and writes what it says, in order, from one writer task. Each action
runs in a task of its own: a cancel is served while a prompt waits for its turn to end, and a
session that takes seconds to start holds up no other.
"""

from __future__ import annotations

import logging
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio
from attrs import define, field

from protocols import events as ev
from protocols.acp_agent import (
    AcpAgentSide,
    Action,
    CancelRequested,
    CloseSession,
    ListSessions,
    NewSession,
    OpenSession,
    Output,
    PermissionAnswered,
    PromptRequested,
    SetAgent,
    SetMode,
    SteerRequested,
    agent_config_option,
)
from protocols.framing import Frame, FramingError, LineDecoder, Message, encode_message
from protocols.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
    RequestId,
)
from supervisor.clients.acp_front.backends import (
    MAX_ENTRY_CHARS,
    MAX_TRANSCRIPT_ENTRIES,
    Backend,
    BackendError,
    BackendNotFound,
    BackendRefused,
    FrontSession,
)
from supervisor.clients.acp_front.records import Records
from supervisor.labels import label

__all__ = ["AGENT_INFO", "AcpFront", "LIST_PAGE"]

log = logging.getLogger(__name__)

AGENT_INFO = {"name": "agent-supervisor", "title": "agent-supervisor", "version": "0.1.0"}
#: Sessions in one ``session/list`` page.
LIST_PAGE = 50
#: How long a cancel waits for the prompts sent before it to reach their session (a mailbox
#: round trip, or one to a gateway: milliseconds; a session still starting takes the prompt
#: into its queue at once too).
SENDING_BOUND_S = 10.0
#: Messages waiting for the client to read them beyond which the sessions' events wait, and
#: the client's next requests are not read (a client that reads slowly, or not at all, must not
#: make this process grow without end).
OUT_BOUND = 1024
#: For the last messages to reach the client when we shut down (it may have stopped reading).
FLUSH_BOUND_S = 2.0
#: How much of a stream one read takes.
_READ_BYTES = 65536


#: What the client asks of one session that must reach it in the order it was sent.
_IN_ORDER = (PromptRequested, SetAgent, SetMode, SteerRequested, OpenSession)
#: Actions whose request is answered by something else than the action's end: a prompt by its
#: turn's (or its session's) end, a session start by its own withdrawal when we shut down.
_ANSWERED_ELSEWHERE = (PromptRequested, NewSession, OpenSession)


class _Lane:
    """What the client sent one session that must reach it in order (prompts, mode and agent
    switches, steers, its load): one task takes them one at a time, so a prompt sent after a
    switch goes to the new agent, and six prompts sent at once run in the order they came.
    A cancel does not queue here (it must go out at once): it waits only for the prompts sent
    before it to reach the session, never for those sent after it."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[Action](math.inf)
        self.prompts_sent = 0  # prompts put in the lane
        self.prompts_done = 0  # of them, taken (or refused) by their session
        self._changed = trio.Event()

    def prompt_done(self) -> None:
        self.prompts_done += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_prompts(self, count: int) -> None:
        """Until the first ``count`` prompts have reached their session."""
        while self.prompts_done < count:
            await self._changed.wait()


@define
class _Live:
    """A session open on this connection."""

    acp_id: str
    front: FrontSession
    #: what a ``session/load`` of it on this connection replays: ``[role, text]`` pairs
    transcript: list[list[str]] = field(factory=list)
    scope: trio.CancelScope = field(factory=trio.CancelScope)  # its event pump's

    def add(self, role: str, text: str) -> None:
        if not text:
            return
        if self.transcript and self.transcript[-1][0] == role == "agent":
            merged = self.transcript[-1][1] + text
            self.transcript[-1][1] = merged[:MAX_ENTRY_CHARS]
        else:
            self.transcript.append([role, text[:MAX_ENTRY_CHARS]])
        del self.transcript[:-MAX_TRANSCRIPT_ENTRIES]


class AcpFront:
    """Serve one ACP client on ``receive``/``send`` with the sessions of ``backend``."""

    def __init__(
        self,
        backend: Backend,
        *,
        default_agent: str | None = None,
        records: Records | None = None,
        attach_to: str | None = None,
    ) -> None:
        self.backend = backend
        names = [name for name, _ in backend.agents]
        if default_agent is not None and default_agent not in names:
            raise BackendError(f"unknown agent {default_agent!r} (known: {', '.join(names)})")
        self.default_agent = default_agent or (names[0] if names else None)
        self.records = records if records is not None else Records(None)
        #: a gateway session every ``session/new`` joins instead of starting one
        self.attach_to = attach_to
        kinds = backend.mcp_transports(self.default_agent)
        carries = self.prompt_carries(self.default_agent)
        self.machine = AcpAgentSide(
            agent_info=dict(AGENT_INFO),
            mcp_capabilities={"http": "http" in kinds, "sse": "sse" in kinds},
            prompt_capabilities={
                "image": "image" in carries,
                "audio": "audio" in carries,
                # Carried as such where the agent takes them, else a text one inline.
                "embeddedContext": True,
            },
        )
        self._live: dict[str, _Live] = {}
        self._out_send, self._out = trio.open_memory_channel[dict[str, Any]](math.inf)
        #: sessions' event pumps waiting for the client to read (see OUT_BOUND)
        self._room = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None
        self._read_scope = trio.CancelScope()
        #: the in-order actions of each session (ACP session id -> its lane)
        self._lanes: dict[str, _Lane] = {}
        #: ``session/new``, ``load`` and ``resume`` requests under way (starting an agent can
        #: take seconds): withdrawn and answered when we shut down meanwhile
        self._opening: dict[RequestId, trio.CancelScope] = {}
        #: requests read whose action has not answered them yet (not prompts, which their
        #: session's end answers, nor session starts, above): each is owed an answer, if only
        #: "shutting down" once the flush bound is over (then a late one is not sent too)
        self._owed: set[RequestId] = set()
        self._withdrawn: set[RequestId] = set()
        self._settled: trio.Event | None = None

    def prompt_carries(self, agent: str | None) -> frozenset[str]:
        """What ``initialize`` can honestly promise of ``agent``'s prompts: what its last
        session here said it takes (an ACP agent's ``promptCapabilities``), else its
        protocol's word (an ACP agent not run here yet: text and resources only)."""
        remembered = self.records.carries(agent) if agent is not None else None
        if remembered is not None:
            return remembered
        return self.backend.prompt_carries(agent)

    def shutdown(self) -> None:
        """Stop reading the client, stop every session here, and return from :meth:`serve`
        (SIGTERM, Ctrl-C): the same end as the client closing stdin."""
        self._read_scope.cancel()

    async def serve(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        """Until the client closes its end (EOF), then every session here is stopped."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                written = trio.Event()
                nursery.start_soon(self._write, send, written)
                with self._read_scope:
                    await self._read(receive)
                with trio.CancelScope(shield=True):
                    self._withdraw_openings()
                    await self._close_all()
                    await self._settle_owed()
                    # What the ends of the sessions said (their prompts' answers) goes out
                    # before we do, if the client still reads.
                    self._out_send.close()
                    with trio.move_on_after(FLUSH_BOUND_S):
                        await written.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None

    # -- the wire ---------------------------------------------------------------------------

    async def _read(self, receive: trio.abc.ReceiveStream) -> None:
        decoder = LineDecoder()
        while True:
            while self._out.statistics().current_buffer_used >= OUT_BOUND:
                # The client does not read what we answer: its requests wait in the pipe (it
                # blocks on its writes) rather than their answers here, without end.
                await self._room.park()
            try:
                data = await receive.receive_some(_READ_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                self._take(decoder.end_of_input())  # a last line without its newline too
                return
            self._take(decoder.feed(bytes(data)))

    def _take(self, frames: list[Frame]) -> None:
        for frame in frames:
            if isinstance(frame, FramingError):
                # JSON that parsed but is no request object (a batch, which ACP does not use;
                # a number) is an invalid request; the rest could not be read as JSON.
                code = INVALID_REQUEST if frame.kind == "not_an_object" else PARSE_ERROR
                self._emit_raw(
                    {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": frame.detail}}
                )
            elif isinstance(frame, Message):
                self._apply(self.machine.receive(frame.payload))

    async def _write(self, send: trio.abc.SendStream, written: trio.Event) -> None:
        try:
            await self._write_all(send)
        finally:
            written.set()

    async def _write_all(self, send: trio.abc.SendStream) -> None:
        async for message in self._out:
            if self._room and self._out.statistics().current_buffer_used < OUT_BOUND // 2:
                self._room.unpark_all()
            try:
                line = encode_message(message)
            except ValueError:
                log.exception("a message could not be written")
                continue
            try:
                await send.send_all(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    def _emit_raw(self, message: dict[str, Any]) -> None:
        self._apply(Output(send=[message]))

    def _apply(self, out: Output) -> None:
        for message in out.send:
            if self._withdrawn and "method" not in message and message.get("id") in self._withdrawn:
                continue  # answered already, "shutting down" (_settle_owed)
            try:
                self._out_send.send_nowait(message)
            except trio.ClosedResourceError:  # shutting down: nobody reads any more
                break
        for action in out.actions:
            assert self._nursery is not None
            rpc_id = getattr(action, "rpc_id", None)
            if rpc_id is not None and not isinstance(action, _ANSWERED_ELSEWHERE):
                self._owed.add(rpc_id)
            if isinstance(action, NewSession | OpenSession):
                # Under way from now: a shutdown before its task begins answers it too.
                self._opening[action.rpc_id] = trio.CancelScope()
            if isinstance(action, _IN_ORDER):
                lane = self._lane(action.session_id)
                if isinstance(action, PromptRequested):
                    lane.prompts_sent += 1
                lane.send.send_nowait(action)
            elif isinstance(action, CancelRequested):
                # What it cancels is what was sent before it: counted now, in the order the
                # client sent them, whichever task runs first.
                waits_on = self._lanes.get(action.session_id)
                before = waits_on.prompts_sent if waits_on is not None else 0
                self._nursery.start_soon(self._cancel, action, waits_on, before)
            else:
                self._nursery.start_soon(self._act, action)

    def _lane(self, session_id: str) -> _Lane:
        lane = self._lanes.get(session_id)
        if lane is None:
            lane = self._lanes[session_id] = _Lane()
            assert self._nursery is not None
            self._nursery.start_soon(self._run_lane, lane)
        return lane

    async def _run_lane(self, lane: _Lane) -> None:
        async for action in lane.receive:
            try:
                await self._act(action)
            finally:
                if isinstance(action, PromptRequested):
                    lane.prompt_done()

    # -- actions ----------------------------------------------------------------------------

    async def _settle_owed(self) -> None:
        """Shutting down: what the client asked for and is still under way gets the flush
        bound to finish; what does not is answered "shutting down" (and never again)."""
        self._settled = trio.Event()
        if self._owed:
            with trio.move_on_after(FLUSH_BOUND_S):
                await self._settled.wait()
        owed, self._owed = self._owed, set()
        for rpc_id in owed:
            self._apply(self.machine.fail(rpc_id, "the front door is shutting down"))
        self._withdrawn |= owed

    def _withdraw_openings(self) -> None:
        """Shutting down: sessions still starting will not be; their requests are answered."""
        openings, self._opening = self._opening, {}
        for rpc_id, scope in openings.items():
            scope.cancel()
            self._apply(self.machine.fail(rpc_id, "the front door is shutting down"))

    async def _opening_one(self, action: NewSession | OpenSession) -> None:
        scope = self._opening.get(action.rpc_id)
        if scope is None:  # withdrawn before it began (shutting down): answered then
            return
        with scope:
            try:
                if isinstance(action, NewSession):
                    await self._new(action)
                else:
                    await self._open(action)
            finally:
                self._opening.pop(action.rpc_id, None)

    async def _act(self, action: Action) -> None:
        rpc_id = getattr(action, "rpc_id", None)
        if rpc_id is not None and rpc_id in self._withdrawn:
            return  # it waited in its lane past the shutdown, and was answered then
        try:
            await self._act_on(action)
        finally:
            if rpc_id is not None and rpc_id in self._owed:
                self._owed.discard(rpc_id)
                if not self._owed and self._settled is not None:
                    self._settled.set()

    async def _act_on(self, action: Action) -> None:
        try:
            if isinstance(action, NewSession | OpenSession):
                await self._opening_one(action)
            elif isinstance(action, ListSessions):
                await self._list(action)
            elif isinstance(action, CloseSession):
                await self._close(action)
            elif isinstance(action, SetAgent):
                await self._set_agent(action)
            elif isinstance(action, SetMode):
                await self._set_mode(action)
            elif isinstance(action, PromptRequested):
                await self._send_prompt(action)
            elif isinstance(action, SteerRequested):
                await self._steer(action)
            elif isinstance(action, PermissionAnswered):
                await self._permission(action)
        except BackendError as exc:
            rpc_id = getattr(action, "rpc_id", None)
            if rpc_id is not None:
                self._apply(self.machine.fail(rpc_id, str(exc), code=_code(exc)))
            else:
                log.info("%s: %s", type(action).__name__, exc)
        except Exception as exc:  # a bug must answer the client, not end the connection
            log.exception("error handling %s", type(action).__name__)
            rpc_id = getattr(action, "rpc_id", None)
            if rpc_id is not None:
                self._apply(self.machine.fail(rpc_id, f"internal error: {exc!r}"))

    def _config_options(self, agent: str) -> list[dict[str, Any]]:
        return [agent_config_option(agent, self.backend.agents)]

    async def _new(self, action: NewSession) -> None:
        if self.attach_to is not None:
            front = await self.backend.attach(self.attach_to)
        else:
            if self.default_agent is None:
                raise BackendError("no agent is configured")
            front = await self.backend.start(
                self.default_agent, action.cwd, mcp_servers=action.mcp_servers
            )
        # For the next initialize's promptCapabilities.
        self.records.remember_carries(front.agent, front.prompt_carries)
        self._adopt(front.id, front)
        self._apply(
            self.machine.session_opened(
                action.rpc_id,
                front.id,
                config_options=self._config_options(front.agent),
                new=True,
                modes=front.modes,
            )
        )

    async def _open(self, action: OpenSession) -> None:
        live = self._live.get(action.session_id)
        if live is None:
            # A stored session's agent starts on the next prompt, resuming its own session.
            front = await self.backend.attach(action.session_id, history=action.replay)
            if front.resumes:
                self.machine.expect_resume(action.session_id)
            live = self._adopt(action.session_id, front)
            live.transcript = [list(entry) for entry in front.transcript]
        replay = [(role, text) for role, text in live.transcript] if action.replay else []
        self._apply(
            self.machine.session_opened(
                action.rpc_id,
                action.session_id,
                config_options=self._config_options(live.front.agent),
                new=False,
                replay=replay,
                modes=live.front.modes,
            )
        )

    async def _list(self, action: ListSessions) -> None:
        sessions: list[dict[str, Any]] = []
        for summary in await self.backend.list():
            state = summary.get("state")
            if not self.backend.persistent_ids and state in ("stopped", "failed"):
                continue  # it cannot be brought back
            if state == "failed" and not summary.get("title"):
                # Nothing was ever said in it: a start that failed (its session/new was
                # answered with the error, never with its id), or an agent that never ran.
                continue
            cwd = summary.get("cwd")
            if not isinstance(cwd, str) or not cwd.startswith("/"):
                continue  # ACP needs its cwd: a gateway too old to say it lists none
            sessions.append(_session_info(summary, cwd, stored=self.backend.persistent_ids))
        if action.cwd is not None:
            sessions = [s for s in sessions if s["cwd"] == action.cwd]
        start = 0
        if action.cursor is not None:
            if not (action.cursor.isascii() and action.cursor.isdigit()):
                # Ours are offsets (nextCursor): one we never gave must not restart the list.
                why = f"cursor {action.cursor!r} is not one session/list gave"
                self._apply(self.machine.fail(action.rpc_id, why, code=INVALID_PARAMS))
                return
            start = int(action.cursor)
        page = sessions[start : start + LIST_PAGE]
        result: dict[str, Any] = {"sessions": page}
        if start + LIST_PAGE < len(sessions):
            result["nextCursor"] = str(start + LIST_PAGE)
        self._apply(self.machine.respond(action.rpc_id, result))

    async def _close(self, action: CloseSession) -> None:
        # Not in the session's lane: a close always goes through, whatever waits there (what
        # does, finds the session gone and says so).
        lane = self._lanes.pop(action.session_id, None)
        if lane is not None:
            lane.send.close()
        live = self._live.pop(action.session_id, None)
        if live is not None:
            await self._stop(live)
        self._apply(self.machine.session_ended(action.session_id))
        self._apply(self.machine.respond(action.rpc_id, {}))

    async def _set_agent(self, action: SetAgent) -> None:
        live = self._live.get(action.session_id)
        if live is None:
            raise _unknown(action.session_id)
        names = [name for name, _ in self.backend.agents]
        if action.agent not in names:
            self._apply(
                self.machine.fail(
                    action.rpc_id,
                    f"unknown agent {action.agent!r} (known: {', '.join(names)})",
                    code=INVALID_PARAMS,
                )
            )
            return
        if action.agent != live.front.agent:
            front = await self.backend.start(action.agent, live.front.cwd)
            if self._live.get(action.session_id) is not live:
                # Closed (or the client went away) while the new agent started: not adopted.
                await front.stop()
                raise BackendError(f"session {action.session_id!r} was closed meanwhile")
            old = self._live.pop(action.session_id)
            await self._stop(old)
            self._apply(self.machine.session_ended(action.session_id, forget=False))
            self.records.remember_carries(front.agent, front.prompt_carries)
            live = self._adopt(action.session_id, front)
            live.transcript = old.transcript
        self._apply(
            self.machine.respond(
                action.rpc_id, {"configOptions": self._config_options(action.agent)}
            )
        )

    async def _set_mode(self, action: SetMode) -> None:
        live = self._live.get(action.session_id)
        if live is None:
            raise _unknown(action.session_id)
        try:
            await live.front.set_mode(action.mode_id)
        except BackendRefused as exc:
            self._apply(self.machine.fail(action.rpc_id, str(exc), code=INVALID_PARAMS))
            return
        self._apply(self.machine.respond(action.rpc_id, {}))

    async def _send_prompt(self, action: PromptRequested) -> None:
        live = self._live.get(action.session_id)
        try:
            if live is None:
                raise _unknown(action.session_id)
            turn_id = await live.front.prompt(action.text, action.parts)
        except BackendError as exc:
            out = self.machine.prompt_failed(
                action.rpc_id, action.session_id, action.text, str(exc), code=_code(exc)
            )
            self._apply(out)
            return
        if self._live.get(action.session_id) is not live:  # closed or replaced meanwhile
            out = self.machine.turn_abandoned(
                action.rpc_id, action.session_id, action.text, turn_id
            )
            self._apply(out)
            return
        self._apply(
            self.machine.prompt_accepted(action.rpc_id, action.session_id, action.text, turn_id)
        )

    async def _cancel(self, action: CancelRequested, lane: _Lane | None, before: int) -> None:
        try:
            if lane is not None:
                with trio.move_on_after(SENDING_BOUND_S):
                    await lane.wait_prompts(before)
            live = self._live.get(action.session_id)
            if live is not None:
                await live.front.cancel()  # the prompt's answer comes with its turn's end
        except BackendError as exc:
            log.info("%s: %s", type(action).__name__, exc)
        except Exception:
            log.exception("error handling %s", type(action).__name__)

    async def _steer(self, action: SteerRequested) -> None:
        live = self._live.get(action.session_id)
        if live is None:
            raise _unknown(action.session_id)
        mode = await live.front.steer(action.text)
        self._apply(self.machine.steer_answered(action.rpc_id, action.session_id, mode))

    async def _permission(self, action: PermissionAnswered) -> None:
        live = self._live.get(action.session_id)
        if live is not None:
            await live.front.respond_permission(action.request_id, action.option_id)

    # -- sessions ---------------------------------------------------------------------------

    def _adopt(self, acp_id: str, front: FrontSession) -> _Live:
        live = _Live(acp_id, front)
        self._live[acp_id] = live
        assert self._nursery is not None
        self._nursery.start_soon(self._pump, live)
        return live

    async def _pump(self, live: _Live) -> None:
        with live.scope:
            try:
                async for event in live.front.events():
                    while self._out.statistics().current_buffer_used >= OUT_BOUND:
                        # The client reads slower than the session speaks: the session's
                        # subscription holds the rest (and catches up when cut off).
                        await self._room.park()
                    self._remember(live, event)
                    self._apply(self.machine.event(live.acp_id, event))
            except BackendError as exc:
                log.warning("session %s: its events stopped: %s", live.acp_id, exc)
        if not live.scope.cancel_called and self._live.get(live.acp_id) is live:
            # Its events ended without us closing it: a gateway connection lost, say. The
            # prompts still waiting would wait for ever: they are answered now.
            why = "the session behind this one ended (its events stopped)"
            self._apply(self.machine.session_ended(live.acp_id, error=why, forget=False))

    def _remember(self, live: _Live, event: ev.Event) -> None:
        if isinstance(event, ev.TurnStarted):
            live.add("user", event.text)
        elif isinstance(event, ev.MessageDelta) and event.role != "user":
            live.add("agent", event.text)

    async def _stop(self, live: _Live) -> None:
        live.scope.cancel()
        await live.front.stop()

    async def _close_all(self) -> None:
        lives, self._live = list(self._live.values()), {}
        async with trio.open_nursery() as nursery:
            for live in lives:
                nursery.start_soon(self._stop, live)
        for live in lives:
            self._apply(self.machine.session_ended(live.acp_id))


def _session_info(summary: dict[str, Any], cwd: str, *, stored: bool) -> dict[str, Any]:
    """ACP's ``SessionInfo`` of a backend's session (``Backend.list``)."""
    session_id, agent = str(summary.get("session_id")), summary.get("agent")
    info: dict[str, Any] = {
        "sessionId": session_id,
        "cwd": cwd,
        "_meta": {"agentSupervisor": {"agent": agent}},
    }
    title = summary.get("title")
    if not stored:
        title = f"{agent} ({session_id})"
    if isinstance(title, str) and title:
        # Shown in the editor's list of sessions (the first prompt's first line): a label.
        info["title"] = label(title)
    updated = summary.get("updated_at")
    if isinstance(updated, int | float):
        info["updatedAt"] = datetime.fromtimestamp(updated, UTC).isoformat()
    return info


def records_dir(state_dir: str | os.PathLike[str] | None) -> Path | None:
    return Path(state_dir) / "acp-sessions" if state_dir is not None else None


async def stdio_streams() -> tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]:
    """This process's stdin and stdout as Trio streams; fd 1 then points at stderr, so a stray
    ``print`` (ours or a library's) cannot corrupt the protocol stream."""
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    os.dup2(2, 1)
    return stdin, stdout


def _code(exc: BackendError) -> int:
    """The JSON-RPC error code of a failed call: a session not there (ACP's "Resource not
    found"), a refusal of what was asked (the client's mistake), or a failure (ours, or the
    agent's)."""
    if isinstance(exc, BackendNotFound):
        return RESOURCE_NOT_FOUND
    return INVALID_PARAMS if isinstance(exc, BackendRefused) else INTERNAL_ERROR


def _unknown(session_id: str) -> BackendNotFound:
    """A call naming a session this front door does not have open: the client's mistake."""
    return BackendNotFound(
        f"no session {session_id!r} here: session/new, session/load or session/resume opens one"
    )
