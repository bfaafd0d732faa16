"""A session on another host, as the front sees it: the same API as a local ``Session``.

Every call is a request to the host's node (``supervisor/remote/link.py``); the node's session
does the work (its actor, its ladder, its receipt). The front keeps a mirror: the events the
node sent, in a :class:`~supervisor.runtime.fanout.Fanout` of its own (so the front's
subscribers replay from the front's history, with ``since_seq``, like a local session's), the
state and the current turn. Events keep the node's ``seq``: after a reconnect the link
resubscribes from the last one it has, and what the node replays continues the stream with no
gap and nothing twice. Each event, receipt and summary carries ``host``; the session's id on
the front is ``NODE_ID@HOST`` (``s3@build1``), the same however often the front reconnects.
"""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs
import cattrs
import trio

from protocols import events as ev
from protocols.content import CARRY_WORDS, Part, refusal, to_acp
from protocols.machine import TerminalScreen
from protocols.terminal import TerminalClient, TerminalSettings, check_size
from supervisor.checkpoints.shadow import GIT_TIMEOUT_S
from supervisor.config import AgentSpec
from supervisor.core.calls import (
    check_mode,
    check_permission_answer,
    check_prompt,
    check_steer,
    check_subscription,
)
from supervisor.core.exit import ExitStatus
from supervisor.core.pause import Pause
from supervisor.errors import AgentNotRunning, BadRequest, SupervisorError
from supervisor.receipt import REASON_USER, CancelReceipt
from supervisor.remote.errors import HostUnreachable, LinkLost
from supervisor.remote.frames import (
    NodeProtocolError,
    as_is,
    check_held,
    check_state,
    text_field,
)
from supervisor.runtime.fanout import (
    DEFAULT_SUBSCRIBER_BUFFER,
    Fanout,
    Subscription,
    fill_from_recorder,
)
from supervisor.runtime.handle import Subscribable
from supervisor.runtime.session import DEFAULT_HISTORY, SessionSummary, TurnHandle
from supervisor.steering import STEER_MODES, SteerResult
from supervisor.wire.codec import converter, dumps, event_to_wire, known_event

if TYPE_CHECKING:
    from supervisor.remote.link import Connection, NodeLink
    from supervisor.runtime.handle import SessionHandle

__all__ = ["RemoteSession"]

log = logging.getLogger(__name__)

#: A cancel whose link is down keeps trying to reach the node this much longer than the
#: node's own ladder takes (grace, then the kill): past that, the receipt says the host could
#: not be reached.
CANCEL_REACH_MARGIN_S: Final = 5.0

#: Git calls a rewind on the node may make one after the other (a snapshot of the state before
#: it: add, write-tree, commit, ref; then the restore's reads), each within
#: ``GIT_TIMEOUT_S``: past that and the host's ``request_timeout_s``, the node is not answering.
REWIND_GIT_CALLS: Final = 6

#: A terminal agent's output kept to draw on the node's last picture of its screen for a late
#: subscriber (drawn then, ~1.4 us a byte: at most ~0.1 s of the front's loop). Past it the
#: node is asked for a new picture (the link subscribes again: ~2 ms on the node), so the
#: front never runs a screen model on the whole stream.
SCREEN_OUTPUT_BYTES: Final = 64 * 1024

T = TypeVar("T")

#: A receipt's fields as the wire has them (all but ``session_id`` and ``host``, which are the
#: front's own): the JSON types each may take (absent: its default). Checked before the
#: converter builds it, which would otherwise make a string of a number, a list of a string's
#: characters, and the like.
_RECEIPT_FIELDS: Final[dict[str, tuple[type, ...]]] = {
    "turn_id": (str, type(None)),
    "outcome": (str,),
    "escalation": (list,),
    "stop_reason": (str, type(None)),
    "dropped_prompts": (list,),
    "resumed": (bool, type(None)),
    "elapsed_ms": (int, float),
    "grace_s": (int, float, type(None)),
    "reason": (str, type(None)),
    "details": (dict,),
    "survivors": (list,),
    "session_failed": (str, type(None)),
    "timeline": (dict,),
    "changes": (list, type(None)),
    "restored": (dict, type(None)),
}


class _Gone(AgentNotRunning):
    """A call to a session its node lost, not sent: a prompt or a steer starts it again."""


def _announces_gap(message: dict[str, Any], from_seq: int) -> bool:
    """The node's event is a ``stream.gap`` that covers what we lack from ``from_seq`` on."""
    data = message.get("data")
    return (
        message.get("event") == "stream.gap"
        and isinstance(data, dict)
        and isinstance(data.get("from_seq"), int)
        and data["from_seq"] <= from_seq
    )


def _turn_handle(result: dict[str, Any]) -> TurnHandle:
    """A prompt's answer: its turn's id, whether it waits, and why it is held."""
    queued = result.get("queued")
    if not isinstance(queued, bool):
        raise NodeProtocolError("without a boolean 'queued'")
    held = check_held(result.get("held"), "whose 'held'")
    return TurnHandle(text_field(result, "turn_id"), queued, held)


def _rewound(result: dict[str, Any]) -> dict[str, Any]:
    """A rewind's answer, as a local session's is: what the caller reads of it checked."""
    restored, not_restored = result.get("restored"), result.get("not_restored")
    if not isinstance(restored, list) or not all(isinstance(p, str) for p in restored):
        raise NodeProtocolError("whose 'restored' is not a list of paths")
    if not isinstance(not_restored, list) or not all(
        isinstance(item, dict) and isinstance(item.get("path"), str) for item in not_restored
    ):
        raise NodeProtocolError("whose 'not_restored' is not a list of paths and whys")
    text_field(result, "turn_id")
    text_field(result, "undo")
    return result


def _diffed(result: dict[str, Any]) -> dict[str, Any]:
    """A diff's answer: ``diff`` text, and its three flags booleans."""
    if not isinstance(result.get("diff"), str):
        raise NodeProtocolError("whose 'diff' is not text")
    if not all(isinstance(result.get(k), bool) for k in ("truncated", "binary", "too_big")):
        raise NodeProtocolError("whose 'truncated', 'binary' or 'too_big' is not a boolean")
    return result


class RemoteSession(Subscribable):
    """One session of a node on another host (create it through the ``Supervisor``)."""

    def __init__(
        self,
        link: NodeLink[RemoteSession],
        *,
        node_id: str,
        spec: AgentSpec,
        cwd: str | None,
        state: str,
        history_size: int = DEFAULT_HISTORY,
        paused: Pause | None = None,
        session_id: str | None = None,
        after: int = 0,
    ) -> None:
        """``session_id``: its id on the front (None: ``NODE_ID@HOST``); one the node started
        again for a stored session keeps the stored one, and its events go on ``after`` that
        session's last seq."""
        self.link = link
        self.node_id = node_id
        self.host: str = link.host.name
        self.id = session_id if session_id is not None else f"{node_id}@{self.host}"
        self.spec = spec
        self.cwd = cwd
        self._state = state
        self._turn_id: str | None = None
        self._seq = after
        self._fanout = Fanout(history_size)
        self._fanout.head_seq = after
        self._done = False
        self._failure: str | None = None
        self.exit_status: ExitStatus | None = None
        self._ended = trio.Event()
        #: the front's history holds what the node had when we (re)subscribed: a recovered
        #: session replays the node's history first, and a subscriber waits for it
        self._caught_up = trio.Event()
        self._catch_up_to = 0
        self._caught_up.set()
        #: what the agent takes and its modes, as the node says when we subscribe
        self._carries: frozenset[str] = frozenset()
        self._modes: dict[str, Any] | None = None
        #: whether the node checkpoints this session's turns, as it says when we subscribe
        #: (None: it did not say: a node older than rewinds on other hosts, which keeps none)
        self._checkpoints: bool | None = None
        #: the node's package version, for what an older node cannot do
        self._node_version: str | None = None
        #: called with the receipt of each stopped turn once it has ended, and when: the
        #: supervisor's recent stops (as a local session's ``on_stop``)
        self.on_stop: Callable[[CancelReceipt, float], None] | None = None
        #: why the node's session holds new turns (``paused``), as it says (its subscribe
        #: answer, its ``session.held`` events)
        self._held: str | None = None
        #: what this front wants of the node's hold (``pause``, ``resume``): None, no word yet
        #: (what the node holds stands: a session adopted from a front that paused it); told
        #: at once, and again first thing on every (re)subscription, before other calls
        self._pause_wanted: Pause | None = paused
        #: the wish last told on a connection (``_tell_when_back`` tells a newer one)
        self._pause_told: Pause | None = None
        #: called when the node says it holds this session and this front has said nothing:
        #: the supervisor takes the pause up (``Supervisor._held_in_node``)
        self.on_held: Callable[[RemoteSession], None] | None = None
        #: the agent's own session id, as the node said when we last subscribed (a store
        #: keeps it: a session whose node lost it resumes it, started again on its host)
        self.agent_session_id: str | None = None
        #: its node lost it (replaced, or no longer has it, or gone past its ``detach_s``):
        #: nothing of it runs anywhere
        self.gone = False
        #: called once its node lost it (the supervisor lists it as stored, if it has a store)
        self.on_gone: Callable[[RemoteSession], None] | None = None
        #: starts it again on its host, from what the store kept, and returns that session (a
        #: prompt or a steer to it once its node lost it); None: it cannot be
        self.revive: Callable[[RemoteSession], Awaitable[SessionHandle]] | None = None
        #: a terminal agent's screen as the node pictured it for our subscription
        #: (``terminal.screen``), as it stood after event ``_screen_seq``, and the output
        #: since: drawn on it for a subscriber of ours (:meth:`_current_screen`)
        self._screen: TerminalScreen | None = None
        self._screen_seq = 0
        self._screen_output: list[bytes] = []
        self._screen_output_bytes = 0
        self._repicturing = False

    # -- the Session API ---------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def fanout(self) -> Fanout:
        return self._fanout

    @property
    def turn_id(self) -> str | None:
        return self._turn_id

    @property
    def held(self) -> str | None:
        """Why the node's session holds new turns (``paused``), as its node last said."""
        return self._held

    def summary(self) -> SessionSummary:
        return SessionSummary(
            self.id,
            self.spec.name,
            self._state,
            self._turn_id,
            host=self.host,
            cwd=self.cwd,
            held=self._held,
        )

    @property
    def prompt_carries(self) -> frozenset[str]:
        """What the agent on the host takes in a prompt besides text, as its node said when
        we last subscribed (nothing from a node too old to say: text only)."""
        return self._carries

    @property
    def modes(self) -> dict[str, Any] | None:
        """The agent's modes (ACP ``SessionModeState``) as its node last said, or None."""
        return self._modes

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether the node checkpoints this session's turns (where the files are), as it said
        when we last subscribed."""
        return self._checkpoints is True

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> TurnHandle:
        parts = check_prompt(text, parts)
        why = refusal(parts, self._carries, f"the agent on host {self.host!r}")
        if why is not None:
            raise BadRequest(why)
        payload: dict[str, Any] = {"text": text}
        if parts:
            # Every part as such: the node's session writes each in its agent's own form.
            payload["content"] = [to_acp(part, CARRY_WORDS) for part in parts]
        try:
            return await self._request("agent.prompt", payload, _turn_handle)
        except _Gone:
            live = await self._start_again()
        return await live.prompt(text, parts)

    async def set_mode(self, mode_id: str) -> None:
        """Switch the agent's session on the host to mode ``mode_id``; returns once it took it."""
        check_mode(mode_id)
        await self._request("agent.set_mode", {"mode_id": mode_id}, as_is)
        if self._modes is not None:
            self._modes = {**self._modes, "currentModeId": mode_id}

    async def input(self, data: str) -> None:
        """Keys for the agent's terminal on the host."""
        await self._request("session.input", {"data": data}, as_is)

    async def resize(self, cols: int, rows: int) -> None:
        """Resize the agent's terminal on the host (and our picture of it, as the node
        resizes its own: the events before its answer have come before it)."""
        await self._request("session.resize", {"cols": cols, "rows": rows}, as_is)
        if self._screen is not None:
            self._current_screen((cols, rows))

    async def cancel(
        self, *, turn_id: str | None = None, reason: str | None = None, rewind: bool = False
    ) -> CancelReceipt:
        """The node's receipt, plus ``host``: returns once the turn has ended on the host (its
        ``turn.ended`` is published here first). If the link drops meanwhile, the cancel is
        sent again, naming the turn, once it is back (the node answers a repeated cancel from
        the same job, or from the receipt it kept); if the host cannot be reached within the
        node's whole ladder and a margin, the receipt says so: ``outcome: "unreachable"``,
        never ``killed`` for a tree nobody saw die.

        ``rewind``: the node then rewinds the turn, as a local session's cancel does, and the
        receipt's ``restored`` says what that did (a cancel sent again rewinds again: the files
        end as the turn found them, and ``restored`` is what that second rewind restored)."""
        self._check_running()
        started = time.monotonic()
        target = turn_id if turn_id is not None else self._turn_id
        payload: dict[str, Any] = {"reason": REASON_USER if reason is None else reason}
        if turn_id is not None:
            payload["task_id"] = turn_id
        unable = self._no_checkpoints() if rewind else None
        if rewind and unable is None:
            payload["rewind"] = True
        bound = self._stop_bound_s() + (self._rewind_bound_s() if rewind else 0.0)
        receipt = await self._cancel(payload, target, started, bound)
        if not rewind or receipt.turn_id is None or receipt.outcome == "no_active_turn":
            return receipt
        if unable is not None:
            # (a node that keeps none is never asked: an older one may not know the field)
            return attrs.evolve(receipt, restored={"error": str(unable), "code": unable.code})
        if receipt.outcome == "unreachable":
            why = f"the node on {self.host} could not be reached: whether it rewound is unknown"
            return attrs.evolve(receipt, restored={"error": why, "code": "host_unreachable"})
        return receipt

    async def _cancel(
        self, payload: dict[str, Any], target: str | None, started: float, bound: float
    ) -> CancelReceipt:
        reach = self.spec.grace_s + self.spec.kill_timeout_s + CANCEL_REACH_MARGIN_S
        give_up = trio.current_time() + max(reach, self.link.host.connect_timeout_s)
        attempts = 0
        while True:
            attempts += 1
            try:
                conn = await self.link.connection(deadline=give_up)
                # A new node answers now (the old one died meanwhile, and this session with
                # it): it never had this session; what ended it is what the caller hears.
                self._check_running()
                receipt = await conn.request(
                    "agent.cancel",
                    {"session_id": self.node_id, **payload},
                    self._receipt,
                    timeout=bound,
                    watch=True,
                )
            except LinkLost:
                if target is not None:
                    payload["task_id"] = target  # never a newer turn than the one we meant
                continue
            except HostUnreachable as exc:
                # The host is gone, or its node broke the protocol, or did not answer in time:
                # the turn's fate is unknown, and the receipt says so with the cause.
                unreachable = self._unreachable_receipt(target, payload["reason"], started, exc)
                if self.on_stop is not None and target is not None and target == self._turn_id:
                    # A stop no ``turn.ended`` told of (yet: a node that comes back tells its
                    # own); one that did is a stop already.
                    self.on_stop(unreachable, time.time())
                return unreachable
            if attempts > 1:
                receipt = converter.structure(
                    {
                        **converter.unstructure(receipt),
                        "details": {**receipt.details, "link_retries": attempts - 1},
                    },
                    CancelReceipt,
                )
            return receipt

    async def rewind(self, turn_id: str, *, force: bool = False) -> dict[str, Any]:
        """The node's ``Session.rewind`` of its session, where the files are: the same answer
        (``{"turn_id", "restored", "not_restored", "undo"}``) and the same refusals, with
        their codes (``busy``, ``conflict``, ``bad_request``)."""
        unable = self._no_checkpoints()
        if unable is not None:
            raise unable
        bound = self.link.host.request_timeout_s + self._rewind_bound_s()
        payload: dict[str, Any] = {"turn_id": turn_id}
        if force:
            payload["force"] = True
        return await self._request("session.rewind", payload, _rewound, timeout=bound)

    async def diff(self, turn_id: str, path: str) -> dict[str, Any]:
        """The node's ``Session.diff``: what the ended turn ``turn_id`` did to ``path``."""
        unable = self._no_checkpoints()
        if unable is not None:
            raise unable
        bound = self.link.host.request_timeout_s + GIT_TIMEOUT_S
        payload = {"turn_id": turn_id, "path": path}
        return await self._request("session.diff", payload, _diffed, timeout=bound)

    def _no_checkpoints(self) -> BadRequest | None:
        """Why the node cannot rewind this session (None: it can)."""
        if self._checkpoints is True:
            return None
        if self._checkpoints is None:
            return BadRequest(
                f"session {self.id}: the node on {self.host} (agent-supervisor"
                f" {self._node_version or 'unknown'}) is too old to keep checkpoints: a session"
                " started once the host runs a newer node has them"
            )
        return BadRequest(
            f"session {self.id} keeps no checkpoints (its agent's checkpoints are off, or its"
            f" directory on {self.host} is / or the home directory)"
        )

    async def steer(self, text: str) -> SteerResult:
        check_steer(text)
        try:
            return await self._request(
                "agent.steer", {"text": text}, self._steer_result, timeout=self._stop_bound_s()
            )
        except _Gone:
            live = await self._start_again()
        return await live.steer(text)

    async def _start_again(self) -> SessionHandle:
        assert self.revive is not None  # (else _check_running raises no _Gone)
        return await self.revive(self)

    def _steer_result(self, result: dict[str, Any]) -> SteerResult:
        mode = result.get("mode")
        if mode not in STEER_MODES:
            raise NodeProtocolError(f"whose 'mode' is not one of {', '.join(STEER_MODES)}")
        receipt = result.get("receipt")
        if receipt is not None and not isinstance(receipt, dict):
            raise NodeProtocolError("whose 'receipt' is not an object")
        detail = result.get("detail")
        return SteerResult(
            session_id=self.id,
            mode=mode,
            turn_id=text_field(result, "turn_id"),
            receipt=self._receipt(receipt) if receipt is not None else None,
            detail=detail if isinstance(detail, str) else None,
            held=check_held(result.get("held"), "whose 'held'"),
        )

    async def respond_permission(
        self, request_id: str, option_id: str | None = None, *, cancelled: bool = False
    ) -> None:
        check_permission_answer(request_id, option_id, cancelled)
        payload: dict[str, Any] = {"request_id": request_id}
        if option_id is None:
            payload["cancelled"] = True
        else:
            payload["option_id"] = option_id
        await self._request("permission.respond", payload, as_is)

    async def open_subscription(
        self,
        *,
        since_seq: int | None = None,
        max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        stall_s: float | None = None,
        wire: bool = False,
        max_buffer_bytes: int | None = None,
    ) -> Subscription:
        """Events of the front's mirror. A subscriber that falls behind is cut off
        (``lagged``) at twice its buffer even with ``stall_s``: the agent it would hold back
        runs on another host (the node holds it back for the link instead)."""
        check_subscription(since_seq, max_buffer, stall_s, max_buffer_bytes)
        await self._caught_up.wait()
        subscription = self._fanout.subscribe(
            since_seq,
            head_seq=self._seq,
            max_buffer=max_buffer,
            stall_s=stall_s,
            wire=wire,
            max_bytes=max_buffer_bytes,
        )
        subscription.screen = self._current_screen()
        recorder = self._fanout.recorder
        if subscription.missing is not None and recorder is not None:
            await fill_from_recorder(subscription, recorder, self.id)
        return subscription

    async def pause(self, deadline: float = math.inf) -> None:
        """Hold new turns in the node's session (``Session.pause``; ``deadline`` on this
        front's clock, sent as the seconds left). With the link down it returns at once: the
        node is told first thing once the link is back, before any other call uses it."""
        wanted = Pause()
        if self._pause_wanted is not None and self._pause_wanted.held:
            wanted = Pause(held=True, deadline=self._pause_wanted.deadline)
        wanted.hold(deadline)
        await self._want(wanted)

    async def resume(self) -> None:
        """Release the node's session's hold (told as :meth:`pause` is)."""
        await self._want(Pause())

    async def _want(self, wanted: Pause) -> None:
        self._check_running()
        self._pause_wanted = wanted
        if not self.link.connected:
            # Down: the resubscription tells the node (subscribe_on), or, if it has passed
            # this session already, this does once the connection is ready.
            self.link.start_soon(self._tell_when_back)
            await trio.lowlevel.checkpoint()
            return
        try:
            conn = await self.link.connection()
            await self._tell_pause(conn, wanted)
        except (LinkLost, HostUnreachable):
            pass  # the reconnection tells it, or fails the session

    async def _tell_when_back(self) -> None:
        deadline = trio.current_time() + self.link.host.detach_s + CANCEL_REACH_MARGIN_S
        try:
            conn = await self.link.connection(deadline=deadline)
            wanted = self._pause_wanted
            if wanted is not None and wanted is not self._pause_told and not self._done:
                await self._tell_pause(conn, wanted)
        except SupervisorError:
            pass  # gone for good: the link fails the session, with the cause

    async def _tell_pause(self, conn: Connection, wanted: Pause) -> None:
        payload: dict[str, Any] = {"session_id": self.node_id}
        if wanted.held and wanted.deadline != math.inf:
            payload["deadline_s"] = max(0.0, wanted.deadline - trio.current_time())
        action = "session.pause" if wanted.held else "session.resume"
        await conn.request(action, payload, as_is)
        self._pause_told = wanted

    async def wait_ready(self) -> None:
        await trio.lowlevel.checkpoint()
        self._check_running()

    async def stop(self) -> ExitStatus | None:
        """End the session on the host (its tree is killed there), then here."""
        if self._done:
            await trio.lowlevel.checkpoint()
            return self.exit_status
        try:
            result = await self._request("session.stop", {}, as_is, timeout=self._stop_bound_s())
        except AgentNotRunning:
            result = {"exit_code": None}
        code = result.get("exit_code")
        self.exit_status = ExitStatus(code=code, signal=None) if isinstance(code, int) else None
        self._finish("stopped")
        return self.exit_status

    # -- the link's side ---------------------------------------------------------------------

    async def subscribe_on(self, conn: Connection) -> None:
        """Subscribe on ``conn`` from the last seq we have (0: from the start)."""
        result = await conn.request(
            "session.subscribe", {"session_id": self.node_id, "since_seq": self._seq}, as_is
        )
        head = result.get("last_seq")
        if head.__class__ is not int or head < 0:
            raise conn.fault("an answer to session.subscribe without a whole 'last_seq'")
        self._catch_up_to = head
        carries = result.get("prompt_carries")
        if isinstance(carries, list):
            self._carries = frozenset(word for word in carries if word in CARRY_WORDS)
        modes = result.get("modes")
        self._modes = modes if isinstance(modes, dict) else None
        checkpoints = result.get("checkpoints")
        self._checkpoints = checkpoints if isinstance(checkpoints, bool) else None
        own = result.get("agent_session_id")
        if isinstance(own, str) and own:
            self.agent_session_id = own
        self._node_version = conn.hello.version
        try:
            self._held = check_held(result.get("held"), "whose 'held'")
        except NodeProtocolError as exc:
            raise conn.fault(f"an answer to session.subscribe {exc}") from None
        if self._seq >= self._catch_up_to:
            self._caught_up.set()
        wanted = self._pause_wanted
        if wanted is not None:
            # Before any other call uses this connection: no turn starts that this front
            # holds, and none stays held that it released while the link was down.
            await self._tell_pause(conn, wanted)
        elif self._held is not None and self.on_held is not None:
            self.on_held(self)
        if result.get("gap"):
            log.warning(
                "session %s: the node's history no longer reaches back to seq %d: events were lost",
                self.id,
                self._seq,
            )

    def on_node_message(self, message: dict[str, Any]) -> None:
        """An event (or a subscription notice) from the node, in wire order."""
        kind = message.get("event")
        if kind in ("subscription.closed", "subscription.lagged"):
            self._on_notice(str(kind))
            return
        if kind == "terminal.screen":
            self._pictured(message["data"])
            return
        seq = message.get("seq")
        if not isinstance(seq, int) or seq <= self._seq or self._done:
            return  # a replay of what we have
        message["session_id"] = self.id
        message["host"] = self.host
        data = message["data"]  # (an object: judged at the door, frames.check_event)
        if isinstance(data.get("receipt"), dict):
            data["receipt"] = {**data["receipt"], "session_id": self.id, "host": self.host}
        event = known_event(message)
        if event is None:
            # Another kind, or fields of other types: the wire's number is the same, so the
            # node is broken, and the mirror cannot go on faithfully past a lost event.
            raise NodeProtocolError(f"a {kind} event this front cannot read")
        if isinstance(event, ev.SessionState):
            check_state(event.state, "a session.state event's state")
        elif isinstance(event, ev.SessionHeld):
            check_held(event.held, "a session.held event's held")
        if seq != self._seq + 1 and not _announces_gap(message, self._seq + 1):
            self._gap(seq)  # (the node's own ``stream.gap`` says so itself: it is mirrored)
        self._seq = seq
        self._track(event)
        if isinstance(event, ev.TerminalOutput) and self._screen is not None:
            self._kept_output(event)
        self._fanout.publish(event, dumps(message))
        self._fanout.flush()
        if seq >= self._catch_up_to:
            self._caught_up.set()

    def _gap(self, seq: int) -> None:
        """The node's next event is ``seq``, and we have up to ``self._seq``: what lies between
        is lost for good (the node's history no longer reached back: the node holds its agent
        rather than drop what we have not acknowledged, so only a cancel's overflow, or a front
        whose own history is gone, comes here). Subscribers are told, with an event of its own
        that takes the last lost seq, so the stream goes on contiguous."""
        first, last = self._seq + 1, seq - 1
        cause = (
            f"the node on {self.host} no longer had events {first}-{last} when this front"
            " subscribed again"
        )
        log.warning("session %s: events %d-%d were lost: %s", self.id, first, last, cause)
        gap = ev.StreamGap(
            session_id=self.id,
            seq=last,
            timestamp=time.time(),
            from_seq=first,
            to_seq=last,
            cause=cause,
        )
        message = event_to_wire(gap)
        message["host"] = self.host
        self._seq = last
        self._fanout.publish(gap, dumps(message))

    def _pictured(self, data: dict[str, Any]) -> None:
        """The node's picture of the screen, sent after its answer to our subscribe, before
        any event: what a subscriber of ours is drawn from (one this front cannot read is
        left out: subscribers then get none, as from a node too old to send one)."""
        self._repicturing = False
        picture, last_seq = data.get("data"), data.get("last_seq")
        cols: Any = data.get("cols")
        rows: Any = data.get("rows")
        try:
            if not isinstance(picture, str) or last_seq.__class__ is not int:
                raise ValueError("no picture or no last_seq")
            check_size(cols, rows)
            screen = TerminalScreen(base64.b64decode(picture, validate=True), cols, rows)
        except ValueError as exc:
            log.warning("session %s: a terminal.screen this front cannot read: %s", self.id, exc)
            self._screen = None
            return
        self._screen, self._screen_seq = screen, last_seq
        self._screen_output.clear()
        self._screen_output_bytes = 0

    def _kept_output(self, event: ev.TerminalOutput) -> None:
        """Output after the picture, kept to draw on it; past :data:`SCREEN_OUTPUT_BYTES`
        the node is asked for a new picture instead (the link subscribes again)."""
        if event.seq <= self._screen_seq:
            return  # (the node's replay of what the picture shows)
        data = base64.b64decode(event.data)
        self._screen_output.append(data)
        self._screen_output_bytes += len(data)
        if self._screen_output_bytes > SCREEN_OUTPUT_BYTES and not self._repicturing:
            self._repicturing = True
            self.link.start_soon(self._resubscribe)

    def _current_screen(self, size: tuple[int, int] | None = None) -> TerminalScreen | None:
        """The screen as it stands after the newest event we have (``size``: then made that
        size, as the node's is), or None if we have no picture of it."""
        screen = self._screen
        if screen is None or self._screen_seq > self._seq:
            return None  # (a picture ahead of what we have: our events catch up first)
        if self._screen_output or size is not None:
            view = TerminalClient(TerminalSettings(cols=screen.cols, rows=screen.rows))
            for data in (screen.data, *self._screen_output):
                view.receive({"output": data, "now": 0.0})
            if size is not None:
                view.resize(*size)
            self._screen, self._screen_seq = view.screen(), self._seq
            self._screen_output.clear()
            self._screen_output_bytes = 0
        return self._screen

    def recovering(self) -> None:
        """Created for a session a crashed front left: subscribers wait for the replay."""
        self._caught_up = trio.Event()
        self._catch_up_to = 2**62

    def record(self) -> dict[str, Any]:
        """What the front's record keeps (``supervisor/remote/record.py``)."""
        return {
            "session_id": self.id,
            "host": self.host,
            "node_id": self.node_id,
            "agent": self.spec.name,
            "cwd": self.cwd,
            "instance": self.link.instance,
            "node_pid": self.link.node_pid,
        }

    def _on_notice(self, kind: str) -> None:
        if kind == "subscription.lagged":
            # The node cut the link's subscription off (the link did not read for a while):
            # resubscribe from where we are.
            self.link.start_soon(self._resubscribe)
            return
        # subscription.closed: the node's session is over (stopped or failed there).
        self._finish(self._state if self._state in ("stopped", "failed") else "stopped")

    async def _resubscribe(self) -> None:
        try:
            conn = await self.link.connection()
            await self.subscribe_on(conn)
        except (LinkLost, HostUnreachable):
            pass  # the link's reconnection resubscribes (or has failed the session)
        except SupervisorError as exc:  # the node's answer: it no longer has the session, say
            self.fail(f"resubscribing on {self.host} failed: {exc}")

    def _track(self, event: ev.Event) -> None:
        if isinstance(event, ev.SessionState):
            self._state = event.state
        elif isinstance(event, ev.SessionHeld):
            self._held = event.held
        elif isinstance(event, ev.TurnStarted):
            self._turn_id = event.turn_id
        elif isinstance(event, ev.TurnEnded):
            if event.turn_id == self._turn_id:
                self._turn_id = None
            if event.receipt is not None and event.stop_reason != "dropped":
                self._stopped(event.receipt, event.timestamp)
        elif isinstance(event, ev.SessionInfo) and event.info_kind == "current_mode_update":
            mode = event.data.get("currentModeId")
            if self._modes is not None and isinstance(mode, str):
                self._modes = {**self._modes, "currentModeId": mode}  # the agent switched

    def _stopped(self, wire: dict[str, Any], timestamp: float) -> None:
        """A stopped turn's ``turn.ended`` (not a dropped prompt's: that turn never ran) came:
        its receipt to ``on_stop``; one this front cannot read is logged, not recorded (the
        event itself is mirrored as it came)."""
        if self.on_stop is None:
            return
        try:
            receipt = self._receipt(wire)
        except NodeProtocolError as exc:
            log.warning("session %s: a turn.ended %s", self.id, exc)
            return
        self.on_stop(receipt, timestamp)

    def fail(self, cause: str, *, gone: bool = False) -> None:
        """The node is gone, or has lost this session: it fails here, with the cause (its
        turn, if one ran, ends ``failed``: every turn has its ``turn.ended``). ``gone``:
        nothing of it runs anywhere any more (not so after a protocol error: the node may run
        it on), so it may be started again (:attr:`revive`)."""
        if self._done:
            return
        self._failure = cause
        self.gone = gone
        now = time.time()
        if self._turn_id is not None:
            self._emit(ev.TurnEnded(turn_id=self._turn_id, outcome="failed", error=cause), now)
            self._turn_id = None
        self._emit(ev.SessionState(state="failed", detail=cause), now)
        self._finish("failed")
        if gone and self.on_gone is not None:
            self.on_gone(self)

    def _emit(self, event: ev.Event, timestamp: float) -> None:
        """An event of the front's own (only once the node can no longer send any)."""
        self._seq += 1
        stamped = attrs.evolve(event, session_id=self.id, seq=self._seq, timestamp=timestamp)
        message = event_to_wire(stamped)
        message["host"] = self.host
        self._track(stamped)
        self._fanout.publish(stamped, dumps(message))
        self._fanout.flush()

    def release(self) -> None:
        """The front closes and leaves this session running in its node
        (``keep_node_sessions``): its subscribers here see their stream end; its record stays,
        for the next front."""
        self._done = True
        self._fanout.close()
        self._ended.set()
        self._caught_up.set()

    def _finish(self, state: str) -> None:
        if self._done:
            return
        self._done = True
        self._state = state
        self._fanout.close()
        self.link.forget(self)
        self._ended.set()
        self._caught_up.set()

    # -- helpers -----------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._done or self._state in ("stopped", "failed"):
            cause = f": {self._failure}" if self._failure else ""
            gone = self.gone and self.revive is not None
            raise (_Gone if gone else AgentNotRunning)(f"session {self.id} is {self._state}{cause}")

    async def _request(
        self,
        action: str,
        payload: dict[str, Any],
        read: Callable[[dict[str, Any]], T],
        *,
        timeout: float | None = None,
    ) -> T:
        """``action`` for this session, its result as ``read`` makes it. The link down for
        good is :class:`AgentNotRunning` (the session cannot go on); a node that did not
        answer in time, or broke the protocol, is :class:`HostUnreachable` with that cause."""
        self._check_running()
        try:
            conn = await self.link.connection()
        except HostUnreachable as exc:
            raise AgentNotRunning(f"session {self.id}: {exc}") from None
        self._check_running()  # (as in cancel: the node may have been replaced meanwhile)
        try:
            return await conn.request(
                action, {"session_id": self.node_id, **payload}, read, timeout=timeout
            )
        except LinkLost as exc:
            raise AgentNotRunning(
                f"session {self.id}: the link to {self.host} dropped before the node answered"
                f" {action} (whether it acted is unknown): {exc}"
            ) from None

    def _stop_bound_s(self) -> float:
        """How long the node may rightly take to answer a call that stops the turn (a cancel,
        a steer that interrupts, a stop): its grace, the kill of its tree, the agent's restart
        (a cancel answers once the session is resumed), its exit on a stop; and the host's
        ``request_timeout_s`` for the rest."""
        spec = self.spec
        agent = spec.grace_s + 2 * spec.kill_timeout_s + spec.start_timeout_s
        return self.link.host.request_timeout_s + agent

    def _rewind_bound_s(self) -> float:
        """How long the node's rewind may rightly take, beyond the answer's way back."""
        return REWIND_GIT_CALLS * GIT_TIMEOUT_S

    def _receipt(self, wire: dict[str, Any]) -> CancelReceipt:
        """The node's receipt (a cancel's answer, a steer's), as this front's: its session id,
        its host. Raises :class:`NodeProtocolError` for one that is not a receipt."""
        if not isinstance(wire.get("outcome"), str):
            raise NodeProtocolError("without a receipt's 'outcome'")
        for name, types in _RECEIPT_FIELDS.items():
            if name in wire and not isinstance(wire[name], types):
                raise NodeProtocolError(f"whose receipt's {name!r} is of another type")
        if not all(isinstance(word, str) for word in wire.get("escalation", ())) or not all(
            isinstance(item, dict)
            for name in ("dropped_prompts", "survivors")
            for item in wire.get(name, ())
        ):
            raise NodeProtocolError("whose receipt has lists of other things")
        fields = {k: v for k, v in wire.items() if k in _RECEIPT_FIELDS}
        try:
            receipt: CancelReceipt = converter.structure(
                {**fields, "session_id": self.id, "host": self.host}, CancelReceipt
            )
        except (cattrs.BaseValidationError, KeyError, TypeError, ValueError) as exc:
            raise NodeProtocolError(f"whose receipt cannot be read ({exc})") from None
        return receipt

    def _unreachable_receipt(
        self, turn_id: str | None, reason: str, started: float, error: HostUnreachable
    ) -> CancelReceipt:
        return CancelReceipt(
            session_id=self.id,
            turn_id=turn_id,
            outcome="unreachable",
            escalation=[],
            elapsed_ms=(time.monotonic() - started) * 1000,
            grace_s=self.spec.grace_s,
            reason=reason,
            details={
                "error": str(error),
                "cause": error.cause,
                "backstop": f"the node stops sessions nobody drives after"
                f" {self.link.host.detach_s:g} s",
            },
            host=self.host,
        )
