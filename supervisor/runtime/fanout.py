"""A session's event history and its subscribers (the fan-out), and a subscriber's view.

The session actor owns one :class:`Fanout`: it appends every stamped event to the history and
to each subscriber's own bounded buffer, never waiting. The history keeps each event in its
wire form (JSON bytes, serialized once: ``supervisor/wire/codec.py``), not as an object: bytes are
never walked by Python's cyclic garbage collector, so 10,000 events of history per session,
times hundreds of flooding sessions, add nothing to a full collection (as objects they made one
last ~0.2-0.8 s, stopping every session at once), and take a fraction of the memory. A
subscriber gets either the event objects (the Python API) or the event's WebSocket text frame
(``supervisor/wire/frames.py``; ``wire=True``: the gateway, which sends it as it is). Each
event is framed once, for every wire subscriber at once: what a gateway connection does per
event is hand the same bytes to its socket, however many connections follow the session. A
replay is decoded (objects) or framed (wire) from the history.
While no subscriber takes frames, the newest events published one at a time (a turn's
start and end, state changes: not a stream's runs, :meth:`Fanout.publish_many`) wait as
objects and are serialized in one batch when the session next waits in its own step
(:meth:`Fanout.serialize`), the history is read, or ``_UNSERIALIZED_MAX`` have come: nobody
needs their bytes yet, and a cancel's own events (published in its caller's and its pump's
steps) are then not serialized on its way to the receipt.

A subscriber that falls a full buffer behind is either cut off (``lagged``; it resubscribes
with ``since_seq`` and the history replays what it missed) or, if it asked for backpressure
(``stall_s``), holds the agent back: the actor stops reading the agent's output (so the agent
blocks on its stdout pipe) until that subscriber has made room again, or has taken nothing for
``stall_s`` and is cut off after all. See ``design/gateway.md``, "Nothing lost under a flood".

A node's sessions keep what their front has not acknowledged (``hold_unacknowledged``): the
history drops only events the front acknowledged (:meth:`Subscription.acknowledge`, or a
resubscribe from ``since_seq``), and once ``history_size`` events are unacknowledged the actor
stops reading the agent, as for a full subscriber, until the front is back and catches up.
See ``design/remote.md``, "Nothing lost across a partition".

A :class:`Recorder` (the session store, ``supervisor/store/writer.py``) is handed every event
as it enters the history, with its wire bytes; a recorder that is :attr:`Recorder.full` holds
the agent back as a full backpressured subscriber does, with no stall window: what a store
has not written yet is never dropped. With a recorder, subscribers are offered events only
once it stored them (:meth:`Fanout.committed`, called by the writer after each write): a
client never sees an event a crash can lose (``design/store.md``, "Clients see what is
stored").
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from itertools import islice, repeat
from typing import Any, Protocol

import attrs
import trio

from protocols import events as ev
from protocols.machine import TerminalScreen
from supervisor.wire.codec import dumps, event_from_json, event_json, event_to_wire, events_json
from supervisor.wire.frames import frame_payload, text_frame, text_frames

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DEFAULT_HISTORY_BYTES",
    "Fanout",
    "Recorder",
    "Subscription",
    "fill_from_recorder",
]

#: A backpressured subscriber may hold this many buffers' worth before it is cut off anyway.
#: The session stops reading the agent at one buffer, so the excess is only what one agent
#: message, or a call handled meanwhile, emits; and events emitted while a cancel is in
#: progress (a cancel never waits for a subscriber: it reads the agent at full speed).
_HARD_LIMIT_FACTOR = 2
#: A listener (a batching writer, :meth:`Subscription.set_listener`) is told of new events when
#: the session is about to wait (:meth:`Fanout.flush`) or, while it is busy, every this many
#: events: a flood reaches the writer in batches, and a single event is not delayed at all.
#: One gateway write's worth (``GatewayLimits.batch_events``): a wake-up of a connection's
#: writer is then about one full socket write, and each subscriber's writer is woken that
#: often (with ten subscribers, a quarter of it, 64, makes 1.6 times the writes and 15 % more
#: Python bytecodes per event: ``bench/throughput.py --ops 5000 --subscribers 10``). A flood's
#: 256 events take ~2 ms; a stream at an agent's pace reaches the writer event by event, as
#: the session waits.
_ANNOUNCE_EVERY = 256
#: While no subscriber takes frames, up to this many of the newest events are kept as
#: objects, to be serialized at once (few enough that the collector never minds them).
_UNSERIALIZED_MAX = 64
#: What a session's history holds at most, in bytes of JSON, beside its count of events: a
#: session is bounded in memory whatever its events carry (a tool's 1 MB output, a pasted
#: file's preview). 10,000 stream events are ~1.5 MB; a gateway's default cap gives each
#: session 512 MiB of the machine, so history and buffers stay a small share of it.
DEFAULT_HISTORY_BYTES = 4 * 1024 * 1024
#: What one subscriber may have buffered at most, in bytes, beside its count of events: past
#: it, it is cut off (or, backpressured, holds the agent back) as for a full count.
DEFAULT_BUFFER_BYTES = 4 * 1024 * 1024
#: Events a subscriber may fall behind before it is cut off (it resubscribes with since_seq).
DEFAULT_SUBSCRIBER_BUFFER = 4096
#: The size counted for an event buffered before it was serialized (a state change, a turn's
#: start or end: events the session makes, small, a prompt's text previewed).
_UNSERIALIZED_SIZE = 1024


class Recorder(Protocol):
    """Told of each event kept in a session's history (the session store)."""

    #: it cannot take more for now: the session holds its agent back until :meth:`when_room`
    full: bool

    def record(
        self,
        events: list[ev.Event],
        payloads: list[bytes],
        fanout: Fanout,
        kinds: AbstractSet[type[ev.Event]] | None = None,
    ) -> bool:
        """Events as they enter ``fanout``'s history, with their wire bytes and (when known
        already) the set of their classes (the session's actor: must not block). Once they
        are stored, call ``fanout.committed(seq)`` with the newest one's seq (from the event
        loop, never a worker thread); if they never will be (given up at close),
        ``fanout.abandon()``. Returns whether they were taken into the run recorded just
        before (of the same fan-out: both are stored by one write, never one without the
        other)."""

    def when_room(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once it is no longer :attr:`full`."""

    def soon(self, fanout: Fanout) -> None:
        """``fanout`` has events not serialized yet, published in another task's step (a
        cancel's) while its session waits: call ``fanout.serialize()`` before the next write,
        in the recorder's own step (the cancel's caller is not kept waiting for it)."""

    def hasten(self, fanout: Fanout | None = None) -> None:
        """A client waits for what is recorded (a response held behind its session's events,
        given once stored), or a session is held back for it: store it now rather than batch
        it (``fanout``'s events alone, if it is named)."""

    async def recorded(self, session_id: str, after: int, upto: int) -> list[tuple[int, bytes]]:
        """The session's events with seqs above ``after`` up to ``upto``, as ``(seq, wire
        JSON)``: what a subscriber from before the history's oldest event is replayed
        (:func:`fill_from_recorder`); what it cannot read is left out."""


@attrs.define
class _HeldRun:
    """A run a fan-out holds until its recorder stored it. A stream's runs the recorder took
    as one (:meth:`Recorder.record`) are one here too: a write releases one or two of them,
    not the few dozen the ingest gate handed the session."""

    #: its first and last seq
    first: int
    last: int
    #: its events' wire bytes
    payloads: list[bytes]
    #: the events (None: not kept, decoded from the bytes if asked for)
    objects: list[ev.Event] | None
    #: each event's size and their sum (as the history counted them: not counted again at
    #: the release)
    sizes: list[int]
    total: int
    #: their text frames (None: no gated subscription took frames when it came)
    frames: list[bytes] | None

    def seqs(self) -> Iterable[int]:
        events = self.objects
        return range(self.first, self.last + 1) if events is None else [e.seq for e in events]


def _objects_of(runs: list[_HeldRun]) -> list[ev.Event]:
    """The events of ``runs``, decoded from their bytes where they were not kept (a gated
    subscription that takes objects came after they were recorded)."""
    events: list[ev.Event] = []
    for run in runs:
        kept = run.objects
        events += kept if kept is not None else map(event_from_json, run.payloads)
    return events


def _gap_json(first: bytes, from_seq: int, to_seq: int) -> bytes:
    """A ``stream.gap`` for events ``from_seq``-``to_seq``, in the wire form of ``first`` (the
    oldest event kept: its session id, and its host if it has one)."""
    kept = json.loads(first)
    gap = ev.StreamGap(
        session_id=str(kept.get("session_id", "")),
        seq=to_seq,
        timestamp=time.time(),
        from_seq=from_seq,
        to_seq=to_seq,
        cause="the session's history no longer reached back to them",
    )
    message = event_to_wire(gap)
    if "host" in kept:
        message["host"] = kept["host"]
    return dumps(message)


def _covers(first: bytes, from_seq: int) -> bool:
    """``first`` (the oldest event kept) is a ``stream.gap`` that already says events from
    ``from_seq`` on were lost (a remote session's mirror opens with the node's gap)."""
    if b'"stream.gap"' not in first:
        return False
    kept = json.loads(first)
    data = kept.get("data") or {}
    return bool(
        kept.get("event") == "stream.gap" and data.get("from_seq", from_seq + 1) <= from_seq
    )


class Subscription:
    """Events of one session, in order, from one subscribe call.

    If the subscriber falls more than its buffer behind, the session cuts it off: iteration
    ends and :attr:`lagged` is true; subscribe again with ``since_seq=last_seq`` to catch up.
    :attr:`gap` is true when history no longer reached back to the ``since_seq`` asked for.
    With ``stall_s`` (backpressure) it is cut off only when it took nothing for that long.
    """

    def __init__(
        self,
        replay: list[Any],
        *,
        last_seq: int,
        head_seq: int,
        gap: bool,
        max_buffer: int,
        stall_s: float | None = None,
        on_room: Callable[[], None] | None = None,
        on_ack: Callable[[int], None] | None = None,
        wire: bool = False,
        sizes: list[int] | None = None,
        max_bytes: int = DEFAULT_BUFFER_BYTES,
    ):
        #: buffered events: objects, or (``wire``) their WebSocket text frames
        self._events: deque[Any] = deque(replay)
        #: each buffered event's size in bytes (its JSON), and their sum
        self._sizes: deque[int] = deque(sizes if sizes is not None else map(len, replay))
        self._bytes = sum(self._sizes)
        #: a full buffer in bytes (as ``capacity`` in events); the replay is room of its own
        self.byte_capacity = max(1, max_bytes) + self._bytes
        self._byte_limit = (
            self.byte_capacity if stall_s is None else _HARD_LIMIT_FACTOR * self.byte_capacity
        )
        #: what this subscriber takes: text frames (the gateway) or event objects
        self.wire = wire
        #: a full buffer: the session cuts us off, or (with stall_s) stops reading the agent
        self.capacity = max(1, max_buffer) + len(replay)
        self._low_water = self.capacity // 2
        self.stall_s = stall_s
        #: past this many buffered, the session cuts us off (backpressured: a margin more)
        self._limit = self.capacity if stall_s is None else _HARD_LIMIT_FACTOR * self.capacity
        self._on_room = on_room
        self._on_ack = on_ack
        self._lot = trio.lowlevel.ParkingLot()
        self._parked = 0  # tasks waiting in receive(): the lot is unparked only for them
        self._listener: Callable[[], object] | None = None
        self._unannounced = 0  # events buffered since the subscriber was last told
        self._ended = False  # by the session: it is done, or cut us off
        self._closed = False  # by the subscriber
        #: events taken so far (the session's stall check compares it across its window)
        self.taken = 0
        self.last_seq = last_seq
        #: the session's newest seq when this subscription began
        self.head_seq = head_seq
        self.gap = gap
        #: the seqs the history no longer held, a ``stream.gap`` first in the replay stands
        #: for (:func:`fill_from_recorder` puts them there from the store); None: none
        self.missing: tuple[int, int] | None = None
        self.lagged = False
        #: a terminal agent's screen as it stood at :attr:`head_seq` (taken with the
        #: subscription, in the actor), drawn before the events; None: no terminal
        self.screen: TerminalScreen | None = None
        #: (a store's subscriber) it has every event up to this seq: those of them the store
        #: gives it are not offered again
        self._after = 0
        #: (a store's subscriber) its session's fan-out, whose events it is offered once
        #: stored (:attr:`due_seq`)
        self._source: Fanout | None = None

    # -- the subscriber's side -------------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> ev.Event:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def receive(self) -> ev.Event:
        """The next event; raises ``trio.EndOfChannel`` when the session is done or cut us off."""
        if self._events:
            await trio.lowlevel.checkpoint()
        while not self._events:
            if self._closed:
                raise trio.ClosedResourceError
            if self._ended:
                raise trio.EndOfChannel
            self._parked += 1
            try:
                await self._lot.park()
            finally:
                self._parked -= 1
        return self.take(1)[0]

    def take(self, limit: int) -> list[ev.Event]:
        """Up to ``limit`` buffered events at once, without waiting (a batching writer's call)."""
        taken = self._take(limit)
        return [event_from_json(frame_payload(item)) for item in taken] if self.wire else taken

    def take_frames(self, limit: int) -> list[bytes]:
        """Like :meth:`take`, each event as the WebSocket text frame that carries its JSON
        (``wire``: the very bytes every wire subscriber of the session is given)."""
        taken = self._take(limit)
        return taken if self.wire else text_frames(events_json(taken))

    def _take(self, limit: int) -> list[Any]:
        events = self._events
        before = len(events)
        was_full = self._full
        if limit >= before:
            taken = list(events)
            events.clear()
            self._sizes.clear()
            self._bytes = 0
        else:
            taken = list(map(deque.popleft, repeat(events, limit)))  # a loop in C
            self._bytes -= sum(map(deque.popleft, repeat(self._sizes, limit)))
        if taken:
            # Events are contiguous: the last taken is as many seqs on as were taken.
            self.taken += len(taken)
            self.last_seq += len(taken)
            if self._on_room is not None and (
                before > self._low_water >= len(events)
                or (was_full and self._bytes <= self.byte_capacity // 2)
            ):
                self._on_room()
        return taken

    @property
    def pending(self) -> int:
        """Events buffered and not yet taken."""
        return len(self._events)

    @property
    def offered(self) -> int:
        """Events buffered so far, taken or not (the replay included): a position in the stream.
        A writer that must send something only after what is buffered now (a response after
        the events that caused it) holds it until :attr:`taken` reaches this. No counter: a
        buffered event leaves only by :meth:`take`, which counts it, or by :meth:`close`."""
        return self.taken + len(self._events)

    @property
    def due_seq(self) -> int | None:
        """(A store's subscriber) the newest seq its session published, stored or not: every
        event up to it is offered here in time, and a response caused by them goes after them
        (:attr:`offered_seq`). None without a store: what is published is offered at once
        (:attr:`offered` is where the stream stands)."""
        source = self._source
        return None if source is None else source.head_seq

    def hasten(self) -> None:
        """(A store's subscriber) its subscriber waits for the events :attr:`due_seq` names
        (a response behind them): the store writes what it has now."""
        source = self._source
        if source is not None and source.recorder is not None:
            source.recorder.hasten(source)

    @property
    def offered_seq(self) -> int:
        """The seq of the newest event offered so far (events are contiguous)."""
        return self.last_seq + len(self._events)

    @property
    def closed(self) -> bool:
        """The subscriber closed it (:meth:`close`)."""
        return self._closed

    @property
    def ended(self) -> bool:
        """The session will send nothing more (it is done, or cut us off: see :attr:`lagged`)."""
        return self._ended

    def acknowledge(self, seq: int) -> None:
        """The subscriber holds every event up to ``seq`` for good (a node's gateway says so
        once its front answered a ping sent after them): the session may forget them."""
        if self._on_ack is not None:
            self._on_ack(seq)

    def set_listener(self, listener: Callable[[], object] | None) -> None:
        """Call ``listener()`` (from the session's task, so it must not block) when new events
        are buffered (in batches: see ``_ANNOUNCE_EVERY``) or the stream ends: a writer that
        serves many subscriptions waits on its own wake-up instead of one task per
        subscription."""
        self._listener = listener

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._events.clear()
        self._sizes.clear()
        self._bytes = 0
        self._limit = self._byte_limit = -1  # the next offer finds no room: we are forgotten
        self._lot.unpark_all()
        if self._on_room is not None:
            self._on_room()  # a session held back for us goes on

    # -- the session's side (its actor task only) ---------------------------------------------

    def _offer(self, item: Any, size: int) -> bool:
        """Buffer one event (the object, or ``wire`` its frame) of ``size`` bytes; False if we
        are over the limit (then cut off) or closed: the fan-out forgets us."""
        events = self._events
        if len(events) >= self._limit or self._bytes >= self._byte_limit:
            return self._cut_off()
        events.append(item)
        self._sizes.append(size)
        self._bytes += size
        if self._parked:
            self._lot.unpark_all()  # a task waiting in receive() hears at once, as it always did
        self._unannounced += 1
        if self._unannounced >= _ANNOUNCE_EVERY:
            self._announce()
        return True

    def _offer_many(self, items: list[Any], sizes: list[int], total: int) -> bool:
        """Buffer a run of events of ``sizes`` bytes (``total`` in all), as :meth:`_offer` each
        would: False if they did not all fit (those that did are buffered, and we are cut off)
        or we are closed. One wake-up for the run."""
        buffered = self._events
        room = self._limit - len(buffered)
        count = len(items)
        fits = room >= count and self._bytes + total <= self._byte_limit
        if not fits:
            count = max(room, 0)
            spare = self._byte_limit - self._bytes
            for index, size in enumerate(sizes[:count]):  # (rare: a cut-off)
                if spare < size and (index or self._bytes):
                    count = index
                    break
                spare -= size
            items, sizes, total = items[:count], sizes[:count], sum(sizes[:count])
        if count:
            buffered.extend(items)
            self._sizes.extend(sizes)
            self._bytes += total
            if self._parked:
                self._lot.unpark_all()
            self._unannounced += count
            if self._unannounced >= _ANNOUNCE_EVERY:
                self._announce()
        return fits or self._cut_off()

    def _cut_off(self) -> bool:
        """An offer found no room: the subscriber is cut off, unless it closed (False)."""
        if not self._closed:
            self._end(lagged=True)
        return False

    def _announce(self) -> None:
        self._unannounced = 0
        if self._parked:
            self._lot.unpark_all()
        if self._listener is not None:
            self._listener()

    def _end(self, *, lagged: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        self.lagged = lagged
        self._announce()

    @property
    def _full(self) -> bool:
        return len(self._events) >= self.capacity or self._bytes >= self.byte_capacity

    def _fill(self, items: list[Any], sizes: list[int]) -> None:
        """``items`` (``sizes`` bytes each) in place of the ``stream.gap`` that opens the
        replay (:attr:`missing`); nothing is taken yet. Room for them as for the replay."""
        assert self.missing is not None and self.taken == 0 and self._events
        self.missing = None
        self._events.popleft()
        gap_size = self._sizes.popleft()
        self._events.extendleft(reversed(items))
        self._sizes.extendleft(reversed(sizes))
        more, more_bytes = len(items) - 1, sum(sizes) - gap_size
        self._bytes += more_bytes
        # The seq the last of them has is the gap's: the stream goes on as it did.
        self.last_seq -= more
        self.capacity += more
        self.byte_capacity += more_bytes
        factor = 1 if self.stall_s is None else _HARD_LIMIT_FACTOR
        self._limit, self._byte_limit = factor * self.capacity, factor * self.byte_capacity
        self._low_water = self.capacity // 2
        if self._source is not None:
            self._source._held_room = (0, 0)  # (its buffer grew)


async def fill_from_recorder(subscription: Subscription, recorder: Recorder, sid: str) -> None:
    """A subscriber from before the history's oldest event (:attr:`Subscription.missing`)
    gets those events from the recorder (the session store), in place of the ``stream.gap``
    that stood for them, before it takes anything: then the history's, then the live ones,
    without a hole or an event twice. Seqs the store lacks at the start stay a gap; if it
    lacks the last ones (it could not be read), the gap stays as it was."""
    if subscription.missing is None:
        return
    low, high = subscription.missing
    rows = await recorder.recorded(sid, low - 1, high)
    if not rows or rows[-1][0] != high or subscription._closed:
        return
    payloads = [payload for _, payload in rows]
    if rows[0][0] > low:  # the store begins later: what it lacks is said
        payloads.insert(0, _gap_json(payloads[0], low, rows[0][0] - 1))
    sizes = list(map(len, payloads))
    wire = subscription.wire
    subscription._fill(
        text_frames(payloads) if wire else list(map(event_from_json, payloads)), sizes
    )
    subscription.gap = rows[0][0] > low


class Fanout:
    """A session's history (for ``since_seq`` replay) and its subscribers; owned by the actor."""

    def __init__(
        self,
        history_size: int,
        *,
        hold_unacknowledged: bool = False,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    ) -> None:
        #: the newest events in wire form (see :attr:`history`), each one's size, and their
        #: bytes in all; a node's history is trimmed by hand (``_trim``), a front's drops its
        #: oldest by itself at ``history_size``
        length = None if hold_unacknowledged else max(1, history_size)
        self._history: deque[bytes] = deque(maxlen=length)
        self._sizes: deque[int] = deque(maxlen=length)
        self._history_total = 0
        #: the most bytes the history holds (the oldest events go first, as for its count)
        self.history_bytes = max(1, history_bytes)
        #: the most bytes a subscriber may have buffered
        self.buffer_bytes = buffer_bytes
        #: newer events than those, not yet serialized: nobody has asked for their bytes
        self._unserialized: list[ev.Event] = []
        #: a subscriber takes text frames: each event is framed once, for all of them
        self._framed = False
        #: a subscriber takes frames (or a front must be able to trim): serialize at once
        self._serialize_now = hold_unacknowledged
        self.head_seq = 0
        self.history_size = max(1, history_size)
        #: keep what is not acknowledged, and hold the agent back once that fills the history
        self.hold_unacknowledged = hold_unacknowledged
        #: every event up to this seq is held for good by whoever drives us (a node's front)
        self.acked_seq = 0
        #: waits of the session held back for unacknowledged events (a diagnostic)
        self.ack_holds = 0
        self._subscriptions: list[Subscription] = []
        self._room = trio.Event()
        #: while holding the agent back: when the stall window ends, and what each full
        #: subscriber had taken when it began
        self._window: tuple[float, dict[int, int]] | None = None
        self._maybe_full = False
        self._closed = False
        #: times the session held the agent back for a full subscriber (a diagnostic)
        self.holds = 0
        #: told of each event :meth:`publish` publishes: the session's own (its states, its
        #: turns' starts and ends, stalls, recycles), never a stream's runs
        #: (:meth:`publish_many`). None: nobody watches (``supervisor/observe/``: metrics and
        #: traces), and a publish costs one test more
        self.observer: Callable[[ev.Event], None] | None = None
        #: handed each event entering the history, with its bytes (the session store);
        #: None: nothing is stored, and keeping an event costs one test more. Set before
        #: anyone subscribes: with it, subscribers get only what it stored (:meth:`committed`)
        self.recorder: Recorder | None = None
        #: (with a recorder) subscriptions offered events once they are stored, not as they
        #: are published: ``_subscriptions`` stays empty, so publishing costs nothing more
        self._gated: list[Subscription] = []
        #: (with a recorder) runs recorded and not stored yet, in order: first and last seq,
        #: wire bytes, and the events themselves only while a gated subscription takes
        #: objects (:attr:`_objects`) or the run's seqs have a hole: a stream's events die
        #: with their step, not once their batch is written (fewer objects for the collector
        #: to walk while a write is under way)
        self._held: deque[_HeldRun] = deque()
        #: (with a recorder) a gated subscription takes event objects, not wire frames
        self._objects = False
        #: (with a recorder) a gated subscription takes wire frames: each run is framed as it
        #: is kept
        self._frames = False
        self._held_count = 0
        self._held_bytes = 0
        #: (with a recorder) held counts and bytes below which no backpressured gated
        #: subscription is past half its margin (:meth:`_held_full`): found again only when
        #: they reach it, or once a gated subscription was offered events or came (its
        #: buffer only shrinks meanwhile, as it takes); (0, 0): to be found
        self._held_room = (0, 0)
        #: waits of the session held back for a full recorder (a diagnostic)
        self.store_holds = 0

    @property
    def held_bytes(self) -> int:
        """The bytes the history holds (an event not serialized yet counted as
        ``_UNSERIALIZED_SIZE``): read at a metrics scrape, never on the way of an event."""
        return self._history_total + len(self._unserialized) * _UNSERIALIZED_SIZE

    @property
    def subscriber_count(self) -> int:
        """Subscriptions neither closed nor ended."""
        return sum(
            1 for s in (*self._subscriptions, *self._gated) if not s._closed and not s._ended
        )

    @property
    def durable_seq(self) -> int:
        """The newest seq subscribers may be given: with a recorder, the newest it stored
        (those after it wait, in :attr:`_held` or as objects not recorded yet); else the
        newest published."""
        if self._held:
            return self._held[0].first - 1
        if self.recorder is not None and self._unserialized:
            return self._unserialized[0].seq - 1
        return self.head_seq

    @property
    def unacknowledged(self) -> int:
        """Events its driver has not acknowledged (``hold_unacknowledged``: a node's; else 0)."""
        return self.head_seq - self.acked_seq if self.hold_unacknowledged else 0

    @property
    def history(self) -> deque[bytes]:
        """The newest events, in wire form; the last one has seq :attr:`head_seq`."""
        if self._unserialized:
            self._serialize()
        return self._history

    def serialize_soon(self) -> None:
        """With a recorder, have what waits as objects serialized, and so stored and given to
        subscribers, although the session may wait long before its own step does it (a
        cancel's events, published in its caller's step)."""
        recorder = self.recorder
        if self._unserialized and recorder is not None:
            recorder.soon(self)

    def serialize(self) -> None:
        """Serialize the events still waiting as objects: the session is about to wait in its
        own step, with nothing in a hurry (what a step done for it in another task's, a
        cancel's, published waits for this or for the history to be read)."""
        if self._unserialized:
            self._serialize()

    def _serialize(self) -> None:
        events, self._unserialized = self._unserialized, []
        kinds = set(map(type, events))
        payloads = events_json(events, kinds)
        sizes = list(map(len, payloads))
        self._keep(payloads, sizes, sum(sizes), events, kinds)

    def _keep(
        self,
        payloads: list[bytes],
        sizes: list[int],
        total: int,
        events: list[ev.Event],
        kinds: AbstractSet[type[ev.Event]] | None = None,
    ) -> None:
        """Add events to the history, its oldest going as its count or its bytes require;
        ``kinds``: the set of their classes, when known (found once for a run)."""
        recorder = self.recorder
        if recorder is not None:
            merged = recorder.record(events, payloads, self, kinds)
            first, last = events[0].seq, events[-1].seq
            objects = events if self._objects or last - first != len(events) - 1 else None
            # (Framed now, while the bytes are in the cache, not once the write is done.)
            frames = text_frames(payloads) if self._frames else None
            held = self._held
            newest = held[-1] if merged and held and objects is None else None
            if (
                newest is not None
                and newest.objects is None
                and newest.last + 1 == first
                and (newest.frames is None) == (frames is None)
            ):
                # (The recorder took them into its run before: a write stores both or none.)
                newest.last = last
                newest.payloads += payloads
                newest.sizes += sizes
                newest.total += total
                held_frames = newest.frames
                if frames is not None and held_frames is not None:
                    held_frames += frames
            else:
                # (The lists are this run's own, made by our caller: a merge extends them.)
                held.append(_HeldRun(first, last, payloads, objects, sizes, total, frames))
            self._held_count += len(events)
            self._held_bytes += total
        history, kept = self._history, self._sizes
        if kept.maxlen is not None:
            over = len(kept) + len(sizes) - kept.maxlen
            if over > 0:  # what the extend drops by itself, the oldest
                self._history_total -= sum(islice(kept, min(over, len(kept))))
        history.extend(payloads)
        kept.extend(sizes)
        if len(sizes) > len(kept):  # a run longer than the whole history
            self._history_total = sum(kept)
        else:
            self._history_total += total
        if self._history_total > self.history_bytes or (
            self.hold_unacknowledged and len(history) > self.history_size
        ):
            self._trim()

    def _subscriptions_changed(self) -> None:
        self._framed = any(s.wire for s in self._subscriptions)
        self._serialize_now = self.hold_unacknowledged or self._framed

    @property
    def subscribed(self) -> bool:
        """Somebody is subscribed (a subscription neither closed nor ended)."""
        return any(not s._closed and not s._ended for s in (*self._subscriptions, *self._gated))

    def subscribe(
        self,
        since_seq: int | None,
        *,
        head_seq: int,
        max_buffer: int,
        stall_s: float | None = None,
        wire: bool = False,
        max_bytes: int | None = None,
    ) -> Subscription:
        replay: list[Any] = []
        gap = False
        missing = None
        gated = self.recorder is not None
        if gated:
            # What is not stored yet comes live, once it is: the replay and the answer's
            # position end at the newest stored event.
            head_seq = min(head_seq, self.durable_seq)
        last_seq = head_seq
        if since_seq is not None:
            if self.hold_unacknowledged:
                self.acknowledge(since_seq)  # a resubscribe from since_seq: the front has it
            history = self.history
            oldest = self.head_seq - len(history) + 1  # the seq of history[0]
            start = max(since_seq + 1, oldest)
            last_seq = start - 1
            skip = start - oldest
            end = len(history)
            # The newest seq the history lacks (those before it): with a recorder, what it
            # has not stored yet may be all the history holds.
            lacks = oldest - 1
            if gated:
                end -= self._held_count
                lacks = min(lacks, head_seq)
            replay = [history[index] for index in range(skip, end)]
            gap = since_seq < lacks
            if gap and history and not (replay and _covers(replay[0], since_seq + 1)):
                # Never a silent jump: the replay opens with what was lost, and why.
                replay.insert(0, _gap_json(history[0], since_seq + 1, lacks))
                last_seq = lacks - 1
                missing = (since_seq + 1, lacks)
            sizes = list(map(len, replay))
            replay = text_frames(replay) if wire else list(map(event_from_json, replay))
        else:
            sizes = []
        subscription = Subscription(
            replay,
            last_seq=last_seq,
            head_seq=head_seq,
            gap=gap,
            max_buffer=max_buffer,
            stall_s=stall_s,
            on_room=self._on_room if stall_s is not None else None,
            on_ack=self.acknowledge if self.hold_unacknowledged else None,
            wire=wire,
            sizes=sizes,
            max_bytes=self.buffer_bytes if max_bytes is None else max_bytes,
        )
        subscription.missing = missing
        if gated and since_seq is not None and since_seq > head_seq:
            # It has events not stored yet by this recorder (stored by an earlier supervisor:
            # a node's session, adopted again, hands its history over to be stored again).
            subscription._after = since_seq
        if self._closed and not (gated and self._held):
            subscription._end()
        elif gated:
            subscription._source = self
            self._gated.append(subscription)
            self._held_room = (0, 0)
            self._objects = self._objects or not wire
            self._frames = self._frames or wire
        else:
            self._subscriptions.append(subscription)
            self._maybe_full = self._maybe_full or subscription._full
            if wire:
                self._framed = self._serialize_now = True
        return subscription

    def publish(self, event: ev.Event, payload: bytes | None = None) -> None:
        """Append to the history and to every subscriber's buffer; never waits. ``payload``:
        the event's wire form when the caller has it already (a remote session's, as the
        node sent it plus ``host``)."""
        self.head_seq = event.seq
        frame = None
        if payload is None and not self._serialize_now:
            size = _UNSERIALIZED_SIZE
            unserialized = self._unserialized
            unserialized.append(event)  # only objects are offered: no bytes needed yet
            if len(unserialized) >= _UNSERIALIZED_MAX:
                self._serialize()
        else:
            if payload is None:
                payload = event_json(event)
            size = len(payload)
            self.serialize()  # what waits as objects is kept first, in order
            self._keep([payload], [size], size, [event])
            if self._framed:
                frame = text_frame(payload)
        stale = False
        for subscription in self._subscriptions:
            if not subscription._offer(frame if subscription.wire else event, size):
                stale = True  # closed, or cut off
            elif subscription.stall_s is not None and subscription._full:
                self._maybe_full = True
        if stale:
            self._drop_stale()
        observer = self.observer
        if observer is not None:
            observer(event)

    def publish_many(self, events: list[ev.Event]) -> None:
        """:meth:`publish` each of a run of stamped events (contiguous seqs, in order), the
        history extended once and each subscriber offered the run at once."""
        if not events:
            return
        self.head_seq = events[-1].seq
        # Serialized at once, whoever subscribes: a run is a stream's (no cancel waits on it),
        # encoded in one pass, and a flood's events kept as objects would live long enough to
        # be walked by the collector (measured: 6-9 % of the time at 100-300 flooding sessions).
        kinds = set(map(type, events))
        payloads = events_json(events, kinds)
        sizes = list(map(len, payloads))
        total = sum(sizes)
        self.serialize()  # what waits as objects is kept first, in order
        self._keep(payloads, sizes, total, events, kinds)
        frames = text_frames(payloads) if self._framed else []
        stale = False
        for subscription in self._subscriptions:
            if not subscription._offer_many(frames if subscription.wire else events, sizes, total):
                stale = True  # closed, or cut off
            elif subscription.stall_s is not None and subscription._full:
                self._maybe_full = True
        if stale:
            self._drop_stale()

    def _drop_stale(self) -> None:
        """Forget the subscriptions closed by their subscribers or cut off by an offer."""
        self._subscriptions = [s for s in self._subscriptions if not s._ended and not s._closed]
        self._subscriptions_changed()

    def flush(self) -> None:
        """Tell every subscriber of the events it has not been told of (the session is about
        to wait: nothing more comes in this batch)."""
        for subscription in self._subscriptions:
            if subscription._unannounced:  # what _announce does, at the end of every step
                subscription._unannounced = 0
                if subscription._parked:
                    subscription._lot.unpark_all()
                if subscription._listener is not None:
                    subscription._listener()

    def committed(self, seq: int) -> None:
        """The recorder stored every event up to ``seq``: its subscribers get them now (the
        writer's task calls this after each write: one wake-up per write, whatever its size).
        A session held back for what waits to be stored goes on."""
        held = self._held
        if not held:
            return
        if held[0].last > seq:
            return
        runs = [held.popleft()]
        while held and held[0].last <= seq:  # (the writer stores whole runs)
            runs.append(held.popleft())
        if len(runs) == 1:  # (a stream's runs, merged: its lists, not copies)
            run = runs[0]
            payloads, sizes, total, framed = run.payloads, run.sizes, run.total, run.frames
        else:
            payloads, sizes, total = [], [], 0
            framed = []
            for run in runs:
                payloads += run.payloads
                sizes += run.sizes
                total += run.total
                if framed is not None:
                    if run.frames is None:
                        framed = None  # (a run from before the first subscription of frames)
                    else:
                        framed += run.frames
        self._held_count -= len(payloads)
        self._held_bytes -= total
        frames = framed
        events: list[ev.Event] | None = None
        drop = False
        for subscription in self._gated:
            if subscription._closed:
                drop = True
                continue
            if subscription._after:
                if self._offer_after(subscription, runs):
                    drop = True
                continue
            if subscription.wire:
                if frames is None:
                    frames = text_frames(payloads)
                fits = subscription._offer_many(frames, sizes, total)
            else:
                if events is None:
                    events = _objects_of(runs)
                fits = subscription._offer_many(events, sizes, total)
            if not fits:
                subscription._end(lagged=True)
                drop = True
            elif subscription.stall_s is not None and subscription._full:
                self._maybe_full = True
            if subscription._unannounced:
                subscription._announce()
        if drop:
            self._drop_gated()
        self._held_room = (0, 0)  # (their buffers grew)
        if self._closed and not held:
            self._end_gated()
        self._room.set()

    def _drop_gated(self) -> None:
        """Forget the gated subscriptions closed or ended."""
        self._gated = [s for s in self._gated if not s._ended and not s._closed]
        self._objects = any(not s.wire for s in self._gated)
        self._frames = any(s.wire for s in self._gated)

    @staticmethod
    def _offer_after(subscription: Subscription, runs: list[_HeldRun]) -> bool:
        """(:meth:`committed`, rare) Offer ``subscription`` those of ``runs``' events after
        the seq it has (:attr:`Subscription._after`); True if it is cut off."""
        after = subscription._after
        seqs = [seq for run in runs for seq in run.seqs()]
        cut = next((i for i, seq in enumerate(seqs) if seq > after), len(seqs))
        if cut < len(seqs):
            subscription._after = 0
        payloads = [payload for run in runs for payload in run.payloads][cut:]
        if not payloads:
            return False
        sizes = list(map(len, payloads))
        items: list[Any] = text_frames(payloads) if subscription.wire else _objects_of(runs)[cut:]
        if not subscription._offer_many(items, sizes, sum(sizes)):
            subscription._end(lagged=True)
            return True
        if subscription._unannounced:
            subscription._announce()
        return False

    def abandon(self) -> None:
        """The recorder will never store what waits (it gave up at close): subscribers are
        never given it, and their streams end."""
        self._held.clear()
        self._held_count = self._held_bytes = 0
        self._end_gated()

    def _end_gated(self) -> None:
        for subscription in self._gated:
            subscription._end()
        self._gated.clear()

    def _held_full(self) -> bool:
        """A backpressured subscriber would be past half its margin (between a full buffer
        and where it is cut off) once what waits to be stored is offered to it: the session
        reads no more agent output until the store catches up (or it takes), so what a store
        write releases at once never cuts it off, and the other half stays for what the
        session publishes while held (an agent message, a cancel's events). Not at a full
        buffer: what waits to be stored is the store's pipeline (a batch being written, one
        gathering), which a subscriber without a store never has to leave room for; a full
        buffer holds the session anyway (:meth:`must_wait`)."""
        count, size = self._held_count, self._held_bytes
        room_count, room_bytes = self._held_room
        if count < room_count and size < room_bytes:
            return False  # (every step of a stream: one test, not a loop over subscriptions)
        room_count = room_bytes = sys.maxsize
        for s in self._gated:
            if s.stall_s is not None and not s._closed:
                # (past half the margin: 2 * (buffered + held) >= capacity + limit)
                room_count = min(room_count, (s.capacity + s._limit + 1) // 2 - len(s._events))
                room_bytes = min(room_bytes, (s.byte_capacity + s._byte_limit + 1) // 2 - s._bytes)
        self._held_room = (room_count, room_bytes)
        return not (count < room_count and size < room_bytes)

    def acknowledge(self, seq: int) -> None:
        """Events up to ``seq`` are held by the front for good: the history may drop them, and
        a session held back for them goes on once the unacknowledged part has room again."""
        seq = min(seq, self.head_seq)
        if seq <= self.acked_seq:
            return
        was_full = self._unacknowledged_full
        self.acked_seq = seq
        self._trim()
        if was_full and not self._unacknowledged_full:
            self._room.set()  # (also when held for a full subscriber too: it looks again)

    def _trim(self) -> None:
        """Forget the oldest events beyond ``history_size`` or ``history_bytes`` (the newest
        one always stays); a node's only once its front acknowledged them, or past twice the
        count (what a cancel, read at full speed, may add while held: then the front is told
        of a gap, ``stream.gap``). A late subscriber hears of what is gone (``stream.gap``)."""
        history, kept = self._history, self._sizes
        size, most = self.history_size, self.history_bytes
        total = self._history_total
        if self.hold_unacknowledged:
            oldest = self.head_seq - len(history) + 1 - len(self._unserialized)
            acked = self.acked_seq
            while len(history) > 1 and (len(history) > size or total > most):
                if oldest > acked and len(history) <= 2 * size:
                    break
                history.popleft()
                total -= kept.popleft()
                oldest += 1
        else:
            while len(history) > 1 and total > most:
                history.popleft()
                total -= kept.popleft()
        self._history_total = total

    @property
    def _unacknowledged_full(self) -> bool:
        return self.hold_unacknowledged and self.head_seq - self.acked_seq >= self.history_size

    def must_wait(self) -> bool:
        """A backpressured subscriber's buffer is full, or (``hold_unacknowledged``) the
        history holds all the front has not acknowledged it can: the session should not read
        the agent; or the recorder is full."""
        if self._unacknowledged_full:
            return True
        recorder = self.recorder
        if recorder is not None and (recorder.full or (self._held_count and self._held_full())):
            return True
        if not self._maybe_full:
            return False
        if any(
            s.stall_s is not None and s._full and not s._closed
            for s in (*self._subscriptions, *self._gated)
        ):
            return True
        self._maybe_full = False
        self._window = None
        return False

    async def wait_for_room(self) -> None:
        """Return when a full subscriber made room (took half its buffer), went away, or
        :meth:`wake` was called; or cut off, at the end of the stall window, every full
        subscriber that took nothing during it."""
        self.flush()
        if self.recorder is not None:
            self.serialize()  # what waits as objects is stored, and then given, meanwhile
        full = [
            s for s in (*self._subscriptions, *self._gated) if s.stall_s is not None and s._full
        ]
        recorder = self.recorder
        if not full and recorder is not None and (recorder.full or self._held_full()):
            # Held for the store, which has not written what it has (all of it, or what a
            # subscriber has room for): no stall window (the store is where events go for
            # good; dropping them is not an option). A write wakes us (:meth:`committed`).
            self.store_holds += 1
            if self._room.is_set():
                self._room = trio.Event()
            if recorder.full:
                recorder.when_room(self._on_room)
            else:
                recorder.hasten(self)  # (what waits is written now, not once its batch gathered)
            await self._room.wait()
            return
        if not full and self._unacknowledged_full:
            # Held for the front, not for a subscriber: no stall window (a front away for
            # good is bounded by the node's detach_s). An acknowledgement or a call wakes us.
            self.ack_holds += 1
            if self._room.is_set():
                self._room = trio.Event()
            await self._room.wait()
            return
        if self._window is None:
            self.holds += 1
            stall = min((s.stall_s for s in full if s.stall_s is not None), default=0.0)
            self._window = (trio.current_time() + stall, {id(s): s.taken for s in full})
        deadline, taken = self._window
        if self._room.is_set():
            self._room = trio.Event()  # what set it is handled: must_wait() said we still wait
        with trio.move_on_at(deadline) as scope:
            await self._room.wait()
        if not scope.cancelled_caught:
            return
        self._window = None
        for subscription in full:
            if subscription._full and taken.get(id(subscription)) == subscription.taken:
                subscription._end(lagged=True)
        self._subscriptions = [s for s in self._subscriptions if not s._ended]
        self._drop_gated()
        self._subscriptions_changed()

    def wake(self) -> None:
        """A call arrived: a session held back by a subscriber serves it at once."""
        self._room.set()

    def _on_room(self) -> None:
        self._room.set()

    def close(self) -> None:
        """The session is done: every subscription ends (not lagged)."""
        if self.recorder is not None:
            self.serialize()  # its last events reach the store
        self._closed = True
        for subscription in self._subscriptions:
            subscription._end()
        self._subscriptions.clear()
        self._subscriptions_changed()
        if not self._held:  # (else once the recorder stored the last of it)
            self._end_gated()
