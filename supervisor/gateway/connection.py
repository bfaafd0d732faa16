"""One WebSocket client of the gateway (``design/gateway.md``, "Fan-out, and a client that falls
behind"): its reader serves requests concurrently, each call run by
:class:`~supervisor.gateway.actions.Actions`; its one writer task owns the socket and sends the
responses and the events of every subscription in causal order (a response after the events of
its session buffered before it), several frames per socket write, with flow control above TCP
when ``flight_bytes`` is set.
"""

from __future__ import annotations

import base64
import logging
from collections import deque
from typing import Any, Final

import trio

from supervisor.errors import AgentNotRunning, SupervisorError
from supervisor.gateway.actions import Actions
from supervisor.gateway.limits import GatewayLimits
from supervisor.gateway.websocket import CLOSE_GOING_AWAY, ServerWebSocket, WebSocketClosed
from supervisor.labels import label
from supervisor.runtime.session import Subscription
from supervisor.supervisor import AnySession
from supervisor.wire.codec import dumps
from supervisor.wire.frames import text_frame
from supervisor.wire.requests import (
    Request,
    RequestError,
    decode_request,
    error_response,
    ok_response,
    session_of,
)

__all__ = ["Connection"]

log = logging.getLogger(__name__)

#: A session actor answers a subscribe ahead of any agent output; this only bounds a shield.
_SUBSCRIBE_BOUND_S: Final = 10.0
#: Flow-control pings per ``flight_bytes``: finer steps keep the pipe fuller for the same bound.
_FLIGHT_PINGS: Final = 4

#: Where each subscription of a connection stood when a response was queued: (session id, its
#: subscription, :attr:`Subscription.offered` then, :attr:`Subscription.due_seq` then). The
#: response goes out after those events; with a store, after every event its session had
#: published, offered once stored.
_Barrier = tuple[tuple[str, Subscription, int, int | None], ...]


class Connection:
    """One WebSocket client: requests served concurrently (each call run by ``actions``); one
    writer task sends responses and the events of every subscription, in causal order, several
    frames per socket write."""

    def __init__(self, websocket: ServerWebSocket, limits: GatewayLimits, actions: Actions) -> None:
        self.websocket = websocket
        self.limits = limits
        self.actions = actions
        # frames of responses and notices, in order, each behind its barrier
        self._responses: deque[tuple[bytes, _Barrier]] = deque()
        self._queued_bytes = 0  # the bytes of those frames (``outgoing_bytes``)
        self._subscriptions: dict[str, Subscription] = {}  # session id -> its events, in order
        self._wake = trio.lowlevel.ParkingLot()  # the writer waits here for work
        self._ready = False  # there is work: a response, or events a subscription announced
        self._drained = trio.lowlevel.ParkingLot()  # the reader waits here for the writer
        self._reader_parked = False  # (then no pong can be read: the writer must not wait)
        self._unacked = 0  # bytes written since the last flow-control ping
        self._marks: deque[int] = deque()  # flow-control pings not answered yet
        #: pings not answered yet, each with where every subscription stood when it went: once
        #: answered, the client holds those events (``Subscription.acknowledge``)
        self._acks: deque[tuple[int, list[tuple[Subscription, int]]]] = deque()
        self._first = 0  # the subscription that goes first in the next write
        self._pending = 0
        self._nursery: trio.Nursery | None = None
        self._leaving = False  # the server shuts down: send what is buffered, then close
        self._left = trio.Event()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._writer)
            if self.limits.flight_bytes is not None:
                nursery.start_soon(self._acknowledger)
            try:
                while True:
                    message = await self.websocket.get_message()
                    while self._backlogged():
                        # It does not read its answers: wait (and let the writer go on
                        # without flow-control pongs, which only this task could read).
                        self._reader_parked = True
                        self.websocket.pong_lot.unpark_all()
                        try:
                            await self._drained.park()
                        finally:
                            self._reader_parked = False
                    self._on_frame(message)
            except WebSocketClosed:
                pass
            finally:
                self._left.set()
                # Requests in flight are abandoned, not undone: a cancel goes on in its session.
                nursery.cancel_scope.cancel()
                for subscription in self._subscriptions.values():
                    subscription.close()
                self._subscriptions.clear()

    async def leave(self) -> None:
        """Send what is buffered (a shutdown's last ``turn.ended``, say), then close."""
        self._leaving = True
        self._notify()
        if self.limits.flight_bytes is not None:
            self.websocket.pong_lot.unpark_all()  # a goodbye is not paced: it is bounded
        await self._left.wait()

    def _on_frame(self, frame: str | bytes) -> None:
        assert self._nursery is not None
        decoded = decode_request(frame)
        if isinstance(decoded, RequestError):
            self._send(error_response(decoded.id, decoded.code, decoded.message))
            return
        if self._pending >= self.limits.max_pending:
            self._send(
                error_response(
                    decoded.id,
                    "overloaded",
                    f"more than {self.limits.max_pending} requests in flight",
                )
            )
            return
        self._pending += 1
        self._nursery.start_soon(self._serve, decoded)

    def _backlogged(self) -> bool:
        """Whether the answers queued for the socket are as many frames (``outgoing_buffer``)
        or bytes (``outgoing_bytes``: an answer may echo a megabyte of its request) as the
        client may leave unread: then no more requests are read until the writer drains them."""
        return (
            len(self._responses) >= self.limits.outgoing_buffer
            or self._queued_bytes >= self.limits.outgoing_bytes
        )

    def notice(self, message: dict[str, Any]) -> None:
        """Queue a notice of no session (the gateway's own: ``store.error``)."""
        self._send(message)

    def _send(self, message: dict[str, Any], session_id: str | None = None) -> None:
        """Queue a response or notice for the writer, behind every event of ``session_id``
        (the session the request named) already buffered for this connection (bounded: the
        reader waits when full); with a store, behind every event that session published, as
        they are offered once stored. A cancel's answer is queued once its session has emitted
        the turn's ``turn.ended``: the wire keeps that order. Other sessions' events are no
        barrier: a quiet session's receipt does not wait behind a flooding one's backlog."""
        subscription = self._subscriptions.get(session_id) if session_id is not None else None
        barrier: _Barrier = (
            ((session_id, subscription, subscription.offered, subscription.due_seq),)
            if session_id is not None and subscription is not None
            else ()
        )
        frame = text_frame(dumps(message))
        self._responses.append((frame, barrier))
        self._queued_bytes += len(frame)
        self._notify()
        if self.limits.flight_bytes is not None:
            self.websocket.pong_lot.unpark_all()  # a writer held by flow control sends answers

    def _notify(self) -> None:
        self._ready = True
        self._wake.unpark_all()

    async def _writer(self) -> None:
        # It waits to be told (a response, or a session announcing a batch of events) even
        # when events are already buffered: under a flood a session announces every few dozen
        # events, or when it goes idle, and they go out in one socket write, not one each.
        try:
            while True:
                while not self._ready:
                    await self._wake.park()
                self._ready = False
                if self._window_full():
                    # Flow control: only answers go now (a receipt must not wait for the
                    # client to read a whole allowance of other sessions' events); events
                    # wait for a pong. A new answer wakes us too (``_send``).
                    frames = self._collect(events=False)
                    if frames:
                        await self.websocket.send_frames(frames)
                        await self._count_flight(frames)
                    self._ready = True
                    await self.websocket.pong_lot.park()
                    continue
                frames = self._collect()
                if frames:
                    await self.websocket.send_frames(frames)
                    await self._count_flight(frames, idle=not self._ready)
                if self._leaving and not self._ready:
                    await self.websocket.close(CLOSE_GOING_AWAY, "the server is shutting down")
                    self._left.set()
                    return
        except WebSocketClosed:
            # Nothing more can be sent: the connection is over (the reader may be waiting for
            # us to drain its answers, so it would not notice by itself).
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()

    def _window_full(self) -> bool:
        """Flow control (``GatewayLimits.flight_bytes``): a ping goes after each quarter of the
        allowance; with four unanswered, the client has not read a whole allowance yet. Never
        while the reader waits for us to drain its answers (it reads no pong meanwhile), nor
        once the server says goodbye (what is buffered goes, within the shutdown's bound)."""
        websocket = self.websocket
        while self._marks and websocket.pongs_seen >= self._marks[0]:
            self._marks.popleft()
        return (
            len(self._marks) >= _FLIGHT_PINGS
            and not self._reader_parked
            and not self._leaving
            and not websocket.closed
        )

    async def _count_flight(self, frames: list[bytes], *, idle: bool = False) -> None:
        """A flow-control ping after each quarter of ``flight_bytes``, and (``idle``: nothing
        more to write now) one that only acknowledges the events written, so a node's session
        held back for its front's acknowledgement (``design/remote.md``) is never left
        waiting for events of a write too small to be paced."""
        flight = self.limits.flight_bytes
        if flight is None:
            return
        self._unacked += sum(len(frame) for frame in frames)
        paced = self._unacked >= flight // _FLIGHT_PINGS
        if not paced and not (idle and self._unacked):
            return
        self._unacked = 0
        number = await self.websocket.ping()
        if paced:
            self._marks.append(number)
        positions = [(sub, sub.last_seq) for sub in self._subscriptions.values()]
        self._acks.append((number, positions))

    async def _acknowledger(self) -> None:
        """Each pong: the client holds every event written before its ping."""
        websocket = self.websocket
        while not websocket.closed:
            acks = self._acks
            while acks and websocket.pongs_seen >= acks[0][0]:
                for subscription, seq in acks.popleft()[1]:
                    subscription.acknowledge(seq)
            await websocket.pong_lot.park()

    def _collect(self, *, events: bool = True) -> list[bytes]:
        """What to send next, in causal order: each queued response after the events of its
        session its barrier names, then (``events``) up to ``batch_events`` events of each
        subscription.
        A barrier more than a batch away is reached over several writes; meanwhile a response
        of another session goes ahead of it (a response of the same session cannot: its mark
        is at least as far), so one session's backlog holds up no other session's answers."""
        frames: list[bytes] = []
        batch = self.limits.batch_events
        sent: dict[Subscription, int] = {}  # events taken per subscription for this write
        waiting: deque[tuple[bytes, _Barrier]] = deque()
        answered = 0
        more = False  # a barrier is more than this write's batch away: go on after it
        while self._responses:
            frame, barrier = self._responses.popleft()
            reached = True
            for session_id, subscription, mark, due in barrier:
                stored = True
                if due is not None:
                    # With a store: the mark is where ``due`` is, once the store has given
                    # it (its write wakes us through the subscription's listener).
                    newest = subscription.offered_seq
                    if newest >= due:
                        mark = subscription.taken + due - subscription.last_seq
                    else:
                        mark = subscription.offered
                        stored = subscription.ended or subscription.closed or self._leaving
                        subscription.hasten()
                behind = mark - subscription.taken
                if behind > 0:
                    done = sent.get(subscription, 0)
                    done += self._take(subscription, min(behind, batch - done), frames)
                    sent[subscription] = done
                if subscription.pending:
                    if subscription.taken < mark:
                        reached = False  # this write's batch is used up: the rest goes next
                        more = True
                elif subscription.ended:
                    self._finish(session_id, subscription, frames)
                # (Nothing pending short of the mark: the subscriber closed, its events are gone.)
                if not stored:
                    reached = False
            if reached:
                frames.append(frame)
                answered += 1
                self._queued_bytes -= len(frame)
            else:
                waiting.append((frame, barrier))
        self._responses = waiting
        if answered:
            self._drained.unpark_all()
        if more:
            self._ready = True
        if not events:
            return frames
        ended: list[str] = []
        room = self.limits.write_events
        subscriptions = list(self._subscriptions.items())
        first = self._first % len(subscriptions) if subscriptions else 0
        self._first = first + 1
        for session_id, subscription in subscriptions[first:] + subscriptions[:first]:
            room -= self._take(subscription, min(room, batch - sent.get(subscription, 0)), frames)
            if subscription.pending:
                self._ready = True  # more than one batch: go on after this write
            elif subscription.ended:
                ended.append(session_id)
        for session_id in ended:
            self._finish(session_id, self._subscriptions[session_id], frames)
        return frames

    def _take(self, subscription: Subscription, limit: int, frames: list[bytes]) -> int:
        """Append the frames of up to ``limit`` buffered events; how many there were."""
        if limit <= 0:
            return 0
        # Each event was serialized and framed once, by its session, for every subscriber.
        taken = subscription.take_frames(limit)
        frames.extend(taken)
        return len(taken)

    def _finish(self, session_id: str, subscription: Subscription, frames: list[bytes]) -> None:
        """A subscription the session ended, all its events taken: say so, and forget it."""
        if self._subscriptions.get(session_id) is not subscription:
            return  # already finished, or replaced by a newer subscribe
        del self._subscriptions[session_id]
        subscription.close()
        notice = "subscription.lagged" if subscription.lagged else "subscription.closed"
        message = {
            "event": notice,
            "session_id": session_id,
            "seq": None,
            "data": {"last_seq": subscription.last_seq},
        }
        frames.append(text_frame(dumps(message)))

    async def _serve(self, request: Request) -> None:
        try:
            result = await self.actions.run(request.id, request.call, self)
        except SupervisorError as exc:
            response = error_response(request.id, exc.code, str(exc))
        except Exception as exc:
            # The action, the error and the size, never the payload: a prompt may be megabytes,
            # and it is the user's. The traceback only at debug level. The error may quote a
            # client's text: the log line has it escaped (``supervisor/labels.py``).
            error = _brief(exc)
            log.error(
                "gateway request %s failed (%d bytes): %s",
                request.action,
                request.size,
                label(error),
            )
            log.debug("gateway request %s failed", request.action, exc_info=True)
            response = error_response(request.id, "internal", error)
        else:
            if result is None:
                return  # already answered (subscribe answers before its events)
            response = ok_response(request.id, result)
        finally:
            self._pending -= 1
        self._send(response, session_of(request.call))

    async def subscribe(
        self, request_id: str | int, session: AnySession, since_seq: int | None
    ) -> None:
        """Subscribe to ``session`` (one subscription per session: a newer one replaces it),
        answering ``request_id`` before the first event."""
        self.unsubscribe(session.id)
        # Shielded (the actor answers a subscribe at once, ahead of agent output): if this
        # connection went away meanwhile, the subscription is closed here, not left to hold
        # the agent back until it stalls.
        with trio.move_on_after(_SUBSCRIBE_BOUND_S) as bound:
            bound.shield = True
            subscription = await session.open_subscription(
                since_seq=since_seq,
                max_buffer=self.limits.subscription_buffer,
                stall_s=self.limits.subscriber_stall_s,
                wire=True,
            )
        if bound.cancelled_caught:
            raise AgentNotRunning(f"session {session.id} did not answer a subscribe")
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except trio.Cancelled:
            subscription.close()
            raise
        self.unsubscribe(session.id)  # two subscribes to one session at once: the last wins
        # The answer first, then the events: its barrier does not name this subscription, and
        # the writer sends no subscription's events while a response waits for its barrier.
        # What the session takes now: a client (the ACP front door, a front's mirror of a
        # node's session) learns it here, where it also learns where the stream stands.
        result = {
            "last_seq": subscription.head_seq,
            "gap": subscription.gap,
            "prompt_carries": sorted(session.prompt_carries),
            "modes": session.modes,
            "held": session.held,
            # Whether a rewind and a diff can be asked (a front's mirror of a node's session
            # learns it here: a node too old to say keeps none).
            "checkpoints": session.keeps_checkpoints,
            # The agent's own session id (None: none yet): a front's store keeps it, to
            # resume the agent should its node lose the session (supervisor/remote/revival.py).
            "agent_session_id": session.agent_session_id,
        }
        self._send(ok_response(request_id, result))
        if subscription.screen is not None:
            self._send(screen_notice(session.id, subscription))
        self._subscriptions[session.id] = subscription
        subscription.set_listener(self._notify)

    def unsubscribe(self, session_id: str) -> None:
        subscription = self._subscriptions.pop(session_id, None)
        if subscription is not None:
            subscription.close()


def screen_notice(session_id: str, subscription: Subscription) -> dict[str, Any]:
    """``terminal.screen``: a terminal agent's screen as it stood after event ``last_seq``,
    ahead of the subscription's events. A notice (``seq: null``), not an event: it is a
    picture of the state, made for this subscriber, and in no session's history; a view
    draws it, then the ``terminal.output`` events after ``last_seq`` (those up to it, in a
    replay, are already in the picture)."""
    screen = subscription.screen
    assert screen is not None
    return {
        "event": "terminal.screen",
        "session_id": session_id,
        "seq": None,
        "data": {
            "data": base64.b64encode(screen.data).decode("ascii"),
            "cols": screen.cols,
            "rows": screen.rows,
            "last_seq": subscription.head_seq,
        },
    }


def _brief(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:200] + "…"
