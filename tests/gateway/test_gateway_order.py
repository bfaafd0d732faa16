"""The connection writer keeps causal order (``Connection._collect``): a response never overtakes an
event its session had buffered for the connection before the response was queued.

Deterministic and without sockets or agents: a :class:`Fanout` stands in for a session (the
actor's ``publish``, without its announcements), and the writer's next socket write is what
``_collect`` returns. Causal order is per session: a response waits for the events of the
session its request named, never for another session's. The same order over real processes and sockets, for every protocol, is
``tests/faults/test_wire_order.py``.
"""

from __future__ import annotations

import json
from typing import Any, cast

import attrs
import trio
import trio.testing

from protocols import events as ev
from supervisor.gateway import GatewayLimits
from supervisor.gateway.actions import Actions
from supervisor.gateway.connection import Connection
from supervisor.gateway.websocket import ServerWebSocket
from supervisor.runtime.fanout import Fanout, Subscription
from supervisor.supervisor import Supervisor


class Session:
    """A session's fan-out and its seq counter, as the actor stamps events."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.fanout = Fanout(history_size=1000)
        self.seq = 0

    def publish(self, event: ev.Event) -> None:
        self.seq += 1
        self.fanout.publish(attrs.evolve(event, session_id=self.id, seq=self.seq))

    def delta(self, text: str = "word") -> None:
        self.publish(ev.MessageDelta(turn_id="t1", text=text))

    def subscribe(self, since_seq: int | None = None) -> Subscription:
        return self.fanout.subscribe(since_seq, head_seq=self.seq, max_buffer=1000, stall_s=5.0)


def client(batch_events: int = 256) -> Connection:
    limits = GatewayLimits()
    limits.batch_events = batch_events
    return Connection(cast(ServerWebSocket, None), limits, Actions(cast(Supervisor, None)))


def subscribe(c: Connection, session: Session, since_seq: int | None = None) -> None:
    """What ``Connection.subscribe`` does once the session answered: the answer, then the events."""
    subscription = session.subscribe(since_seq)
    c._send({"id": f"sub-{session.id}", "ok": True, "result": {"last_seq": subscription.head_seq}})
    c._subscriptions[session.id] = subscription
    subscription.set_listener(c._notify)


def wire(frames: list[bytes]) -> list[str]:
    """Each frame as a short label: ``id`` of a response, ``event:seq`` of an event."""
    labels = []
    for frame in frames:
        message: dict[str, Any] = json.loads(_payload(frame))
        if "id" in message:
            labels.append(str(message["id"]))
        elif message["seq"] is None:
            labels.append(message["event"])
        else:
            labels.append(f"{message['event']}:{message['seq']}")
    return labels


def _payload(frame: bytes) -> bytes:
    """The payload of an unmasked server text frame (what ``text_frame`` builds)."""
    length = frame[1] & 0x7F
    if length == 126:
        return frame[4:]
    if length == 127:
        return frame[10:]
    return frame[2:]


def drain(c: Connection) -> list[list[str]]:
    """Every socket write the writer would make now, until it has nothing left."""
    writes = []
    c._ready = True
    while c._ready:
        c._ready = False
        frames = c._collect()
        if frames:
            writes.append(wire(frames))
    return writes


def test_a_response_follows_the_events_buffered_before_it() -> None:
    """The review's case: ``turn.ended`` is buffered (not yet announced, not yet written) when
    the cancel's reply resolves; the wire must not show the receipt while the turn looks open."""
    c = client()
    session = Session("s1")
    subscribe(c, session)
    assert drain(c) == [["sub-s1"]]
    session.delta()
    session.publish(ev.TurnEnded(turn_id="t1", outcome="cancelled"))
    c._send({"id": "cancel", "ok": True, "result": {}}, "s1")
    assert drain(c) == [["message.delta:1", "turn.ended:2", "cancel"]]


def test_the_subscribe_answer_precedes_the_replay_and_later_events() -> None:
    c = client()
    session = Session("s1")
    for _ in range(3):
        session.delta()
    subscribe(c, session, since_seq=0)
    session.delta()
    assert drain(c) == [["sub-s1", "message.delta:1", "message.delta:2", "message.delta:3",
                         "message.delta:4"]]  # fmt: skip


def test_events_after_a_response_are_not_held_back_by_it() -> None:
    """Only what came before is a barrier: later events go in the same write, after it."""
    c = client()
    session = Session("s1")
    subscribe(c, session)
    drain(c)
    session.delta()
    c._send({"id": "prompt", "ok": True, "result": {}}, "s1")
    session.delta()
    assert drain(c) == [["message.delta:1", "prompt", "message.delta:2"]]


def test_each_response_waits_only_for_its_own_sessions_events() -> None:
    """Another session's backlog is no barrier: a quiet session's answer goes at once."""
    c = client()
    one, two = Session("s1"), Session("s2")
    subscribe(c, one)
    subscribe(c, two)
    drain(c)
    one.delta()
    c._send({"id": "a", "ok": True, "result": {}}, "s1")
    two.delta()
    one.delta()
    c._send({"id": "b", "ok": True, "result": {}}, "s2")
    two.delta()
    c._send({"id": "list", "ok": True, "result": {}})  # names no session: no barrier
    assert drain(c) == [
        ["message.delta:1", "a", "message.delta:1", "b", "list", "message.delta:2",
         "message.delta:2"]
    ]  # fmt: skip


def test_a_barrier_beyond_one_batch_spreads_over_writes_and_others_pass_it() -> None:
    """Batching stays bounded (``batch_events`` per subscription per write); while a response
    waits for its session's backlog, another session's answer and events go ahead of it."""
    c = client(batch_events=4)
    one, two = Session("s1"), Session("s2")
    subscribe(c, one)
    drain(c)
    for _ in range(10):
        one.delta()
    c._send({"id": "cancel", "ok": True, "result": {}}, "s1")
    two.delta()
    subscribe(c, two, since_seq=0)
    c._send({"id": "quiet", "ok": True, "result": {}}, "s2")
    one.delta()
    assert drain(c) == [
        ["message.delta:1", "message.delta:2", "message.delta:3", "message.delta:4",
         "sub-s2", "message.delta:1", "quiet"],
        ["message.delta:5", "message.delta:6", "message.delta:7", "message.delta:8"],
        ["message.delta:9", "message.delta:10", "cancel", "message.delta:11"],
    ]  # fmt: skip


def test_one_write_is_bounded_across_subscriptions_and_they_take_turns() -> None:
    c = client(batch_events=4)
    c.limits.write_events = 6
    sessions = [Session(f"s{i}") for i in range(3)]
    for session in sessions:
        subscribe(c, session)
    drain(c)
    for session in sessions:
        for _ in range(4):
            session.delta(session.id)
    first, second = ([json.loads(_payload(f))["data"]["text"] for f in c._collect()] for _ in "12")
    assert len(first) == len(second) == 6 and drain(c) == []  # two bounded writes, all sent
    assert sorted(first + second) == ["s0"] * 4 + ["s1"] * 4 + ["s2"] * 4
    assert first[0] != second[0]  # the next write starts with the next subscription


def test_a_closed_subscription_does_not_hold_a_response() -> None:
    """Unsubscribed after the response was queued: its events are dropped, the answer goes."""
    c = client()
    session = Session("s1")
    subscribe(c, session)
    drain(c)
    session.delta()
    c._send({"id": "prompt", "ok": True, "result": {}}, "s1")
    c.unsubscribe(session.id)
    assert drain(c) == [["prompt"]]


def test_a_subscription_that_ended_is_closed_before_the_answer_that_followed() -> None:
    """The session ended (stopped, or cut the subscriber off) before the response: the notice
    comes first, after the subscription's last events."""
    c = client()
    session = Session("s1")
    subscribe(c, session)
    drain(c)
    session.delta()
    session.fanout.close()
    c._send({"id": "stop", "ok": True, "result": {}}, "s1")
    assert drain(c) == [["message.delta:1", "subscription.closed", "stop"]]
    assert c._subscriptions == {}


def test_an_ended_subscription_already_drained_is_closed_before_the_answer() -> None:
    c = client()
    session = Session("s1")
    subscribe(c, session)
    session.delta()
    assert drain(c) == [["sub-s1", "message.delta:1"]]
    session.fanout.close()
    c._send({"id": "stop", "ok": True, "result": {}}, "s1")
    assert drain(c) == [["subscription.closed", "stop"]]


class PingingSocket:
    """The writer's side of a WebSocket, in memory: the writes it made, the pings it sent,
    and pongs the test hands back (as a client answers once it has read up to the ping)."""

    def __init__(self) -> None:
        self.closed = False
        self.writes: list[list[bytes]] = []
        self.pings_sent = 0
        self.pongs_seen = 0
        self.pong_lot = trio.lowlevel.ParkingLot()

    async def send_frames(self, frames: list[bytes]) -> None:
        self.writes.append(frames)
        await trio.lowlevel.checkpoint()

    async def ping(self) -> int:
        self.pings_sent += 1
        await trio.lowlevel.checkpoint()
        return self.pings_sent

    def pong(self, number: int) -> None:
        self.pongs_seen = number
        self.pong_lot.unpark_all()


async def test_flight_bytes_paces_events_by_pongs_but_never_an_answer() -> None:
    """The writer pings after each quarter of ``flight_bytes``; with four pings unanswered it
    writes no more events, but an answer (with the events of its own session it must follow)
    still goes at once; a pong lets events go again; a reader waiting for the writer to drain
    its answers (it reads no pong then) lets everything go."""
    limits = GatewayLimits()
    limits.batch_events, limits.write_events, limits.flight_bytes = 4, 4, 2400
    socket = PingingSocket()
    c = Connection(cast(ServerWebSocket, socket), limits, Actions(cast(Supervisor, None)))
    flooder, quiet = Session("s1"), Session("s2")
    subscribe(c, quiet)
    subscribe(c, flooder)
    for _ in range(200):
        flooder.delta("x" * 100)  # ~150 bytes a frame: 4 a write, a ping each write
    async with trio.open_nursery() as nursery:
        c._nursery = nursery
        nursery.start_soon(c._writer)
        await trio.testing.wait_all_tasks_blocked()
        assert socket.pings_sent == 4 and socket.pongs_seen == 0
        held = len(socket.writes)
        c._notify()  # more events announced: still held
        await trio.testing.wait_all_tasks_blocked()
        assert len(socket.writes) == held
        quiet.publish(ev.TurnEnded(turn_id="t1", outcome="cancelled"))
        c._send({"id": "receipt", "ok": True, "result": {}}, "s2")
        await trio.testing.wait_all_tasks_blocked()
        assert len(socket.writes) == held + 1
        assert wire(socket.writes[-1]) == ["turn.ended:1", "receipt"]
        socket.pong(socket.pings_sent)
        await trio.testing.wait_all_tasks_blocked()
        assert len(socket.writes) > held + 1 and socket.pings_sent - socket.pongs_seen == 4
        c._reader_parked = True
        socket.pong_lot.unpark_all()
        await trio.testing.wait_all_tasks_blocked()
        assert sum(len(write) for write in socket.writes) == 2 + 1 + 1 + 200
        nursery.cancel_scope.cancel()
