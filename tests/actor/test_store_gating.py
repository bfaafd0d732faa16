"""Tier 2: with a store, subscribers get a session's events only once the store has them
(``design/store.md``, "Clients see what is stored"), on virtual time with an in-memory store
whose writes wait until the test lets them through.

An event is never given before the write that stores it; the writes let through, everything
comes, in order, each event after its write. A cancel's answer (a reply, not an event) does not
wait for the store; its ``turn.ended`` does. Without a store, subscribers get events as they
are published, with no writer at all.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

import pytest
import trio
import trio.testing
from memory_store import MemoryBackend, in_this_thread

from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.runtime.fanout import Fanout
from supervisor.store.writer import SessionStore
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import event_json
from supervisor.wire.frames import text_frames

SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=2.0)


def held_store(
    backend: MemoryBackend,
    let_through: trio.Event,
    taken: trio.Event | None = None,
    written: trio.Event | None = None,
) -> SessionStore:
    async def run_sync(fn: Callable[..., Any], *args: Any) -> Any:
        """The backend called in the test's thread; a write once ``let_through`` is set
        (``taken`` set as the writer asks for it, ``written`` once it is done)."""
        if getattr(fn, "__name__", "") != "_write":
            return await in_this_thread(fn, *args)
        if taken is not None:
            taken.set()
        await let_through.wait()
        result = await in_this_thread(fn, *args)
        if written is not None:
            written.set()
        return result

    return SessionStore(backend, run_sync=run_sync)


async def test_an_event_is_given_only_once_it_is_stored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = MemoryBackend()
    let_through = trio.Event()
    store = held_store(backend, let_through)
    launcher = AcpLauncher(AcpBehaviour(words=20, word_interval=0.1))
    with trio.fail_after(60):  # (virtual seconds: an event never given fails, not hangs)
        async with trio.open_nursery() as writer:
            writer.start_soon(store.run)
            async with open_supervisor(agents={"fake": SPEC}, launcher=launcher) as sup:
                sup.store = store
                session = await sup.start_session("fake")
                async with session.subscribe(since_seq=0) as events:
                    await session.prompt("hello")
                    await trio.sleep(1)  # ten words said, none stored
                    assert session.last_seq > 10
                    assert events.pending == 0 and not backend.seqs()
                    # The cancel's answer is a reply: it does not wait for the store.
                    receipt = await session.cancel()
                    assert receipt.outcome == "cancelled"
                    assert events.pending == 0
                    let_through.set()
                    seqs = []
                    async for event in events:
                        assert event.seq in backend.seqs()  # stored before it was given
                        seqs.append(event.seq)
                        if isinstance(event, ev.TurnEnded):
                            break
                    assert seqs == list(range(1, len(seqs) + 1))
            await store.aclose()


async def test_without_a_store_events_are_given_as_they_are_published(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=20, word_interval=0.1))
    async with open_supervisor(agents={"fake": SPEC}, launcher=launcher) as sup:
        session = await sup.start_session("fake")
        async with session.subscribe(since_seq=0) as events:
            await session.prompt("hello")
            await trio.sleep(1)
            assert events.pending == session.last_seq > 10
            await session.cancel()
            given = events.take(events.pending)  # the turn's end too, at once
            assert [event.seq for event in given] == list(range(1, session.last_seq + 1))
            assert any(isinstance(event, ev.TurnEnded) for event in given)


class _Recorder:
    """Keeps nothing: what a fan-out asks of a store, for a test that commits by hand."""

    full = False

    def record(
        self,
        events: list[ev.Event],
        payloads: list[bytes],
        fanout: Fanout,
        kinds: AbstractSet[type[ev.Event]] | None = None,
    ) -> bool:
        return False

    def when_room(self, callback: Callable[[], object]) -> None:
        callback()

    def soon(self, fanout: Fanout) -> None:
        pass

    def hasten(self) -> None:
        pass

    async def recorded(self, session_id: str, after: int, upto: int) -> list[tuple[int, bytes]]:
        return []


def test_what_waits_to_be_stored_holds_the_agent_back_before_a_write_could_cut_off() -> None:
    fanout = Fanout(10_000)
    fanout.recorder = _Recorder()
    reader = fanout.subscribe(None, head_seq=0, max_buffer=100, stall_s=5.0)
    # More than a buffer waits for the store (the store's pipeline): the agent is read on,
    # up to half the margin a backpressured subscriber has past a full buffer.
    fanout.publish_many(deltas(1, 120))
    assert not fanout.must_wait()
    fanout.publish_many(deltas(121, 30))
    assert fanout.must_wait()
    # The write gives it all at once: full, held back, never cut off.
    fanout.committed(150)
    assert reader.pending == 150 and not reader.lagged
    assert fanout.must_wait()
    reader.take(150)
    assert not fanout.must_wait()


def test_where_the_agent_is_held_back_moves_with_what_the_subscribers_have_buffered() -> None:
    """Half the margin is counted from what each backpressured subscriber holds now: a write's
    release brings the point nearer, what it takes moves it away, a new subscriber with a
    smaller buffer brings it nearer, one that closed counts no more."""
    fanout = Fanout(10_000)
    fanout.recorder = _Recorder()
    reader = fanout.subscribe(None, head_seq=0, max_buffer=100, stall_s=5.0)
    fanout.publish_many(deltas(1, 60))
    assert not fanout.must_wait()
    fanout.committed(60)
    # 60 buffered: 90 may wait for the store (2 * (60 + 90) is the buffer and its margin)
    fanout.publish_many(deltas(61, 89))
    assert not fanout.must_wait()
    fanout.publish_many(deltas(150, 1))
    assert fanout.must_wait()
    reader.take(30)  # 30 buffered: 120 may wait
    assert not fanout.must_wait()
    fanout.publish_many(deltas(151, 30))
    assert fanout.must_wait()
    fanout.committed(180)
    reader.take(150)
    assert not fanout.must_wait()
    fanout.publish_many(deltas(181, 50))
    assert not fanout.must_wait()
    small = fanout.subscribe(None, head_seq=230, max_buffer=20, stall_s=5.0)  # 30 may wait
    assert fanout.must_wait()
    small.close()
    assert not fanout.must_wait()


async def test_a_session_held_back_for_the_store_has_what_waits_written_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What a subscriber has room for, not a flood's window, bounds what waits to be stored:
    a session held back for the store has it written at once."""
    backend = MemoryBackend()
    store = SessionStore(
        backend,
        batch_events=100,
        flood_flush_s=60.0,
        flood_batch_events=10_000,
        run_sync=in_this_thread,
    )
    fanout = Fanout(10_000)
    fanout.recorder = store
    reader = fanout.subscribe(None, head_seq=0, max_buffer=100, stall_s=5.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        fanout.publish_many(deltas(1, 100))  # a batch's worth: a flood's from then on
        await store.flushed()
        assert len(reader.take(100)) == 100
        start = trio.current_time()
        fanout.publish_many(deltas(101, 150))  # half the subscriber's margin
        assert fanout.must_wait()
        await fanout.wait_for_room()
        assert trio.current_time() == start  # not the flood's window
        assert reader.pending == 150 and fanout.store_holds == 1
        await store.aclose()


def deltas(first: int, count: int) -> list[ev.Event]:
    return [
        ev.MessageDelta(session_id="s", seq=seq, timestamp=1.0, turn_id="t1", text="w")
        for seq in range(first, first + count)
    ]


def test_a_streams_events_do_not_wait_for_their_write_as_objects() -> None:
    """What waits to be stored is bytes: a stream's events die with their step (the collector
    never walks them while a write is under way), and are given as they were, as frames or,
    to a subscription taking objects that came after they were recorded, decoded again."""
    fanout = Fanout(10_000)
    fanout.recorder = _Recorder()
    frames = fanout.subscribe(None, head_seq=0, max_buffer=1000, wire=True)
    events = [
        ev.MessageDelta(session_id="s", seq=seq, timestamp=1.0, turn_id="t1", text=f"w{seq} ")
        for seq in range(1, 51)
    ]
    alive = [weakref.ref(event) for event in events]
    expected = [event_json(event) for event in events]
    fanout.publish_many(events)
    del events
    gc.collect()
    assert not any(ref() for ref in alive)
    objects = fanout.subscribe(None, head_seq=0, max_buffer=1000)
    fanout.committed(50)
    assert frames.take_frames(100) == text_frames(expected)
    assert [event_json(event) for event in objects.take(100)] == expected


def test_a_run_is_framed_as_it_is_kept_not_when_it_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subscription taking frames: each run is framed in the step that keeps it, while its
    bytes are in the cache, not once the write is done (the store's step would read them all
    from memory again); runs kept before such a subscription came are framed at the release."""
    from supervisor.runtime import fanout as module

    fanout = Fanout(10_000)
    fanout.recorder = _Recorder()
    events = [
        ev.MessageDelta(session_id="s", seq=seq, timestamp=1.0, turn_id="t1", text=f"w{seq} ")
        for seq in range(1, 31)
    ]
    expected = text_frames([event_json(event) for event in events])
    objects = fanout.subscribe(None, head_seq=0, max_buffer=1000)
    fanout.publish_many(events[:10])  # (nobody takes frames yet)
    early = fanout.subscribe(None, head_seq=0, max_buffer=1000, wire=True)
    fanout.committed(10)
    assert early.take_frames(100) == expected[:10]
    late = fanout.subscribe(None, head_seq=10, max_buffer=1000, wire=True)
    fanout.publish_many(events[10:20])
    fanout.publish_many(events[20:])
    framed: list[int] = []

    def counted(payloads: list[bytes]) -> list[bytes]:
        framed.append(len(payloads))
        return text_frames(payloads)

    monkeypatch.setattr(module, "text_frames", counted)
    fanout.committed(30)
    assert framed == []  # (framed already)
    assert early.take_frames(100) == late.take_frames(100) == expected[10:]
    assert objects.take(100) == events


async def test_a_write_releases_the_runs_it_stored_and_no_run_recorded_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stream's runs the store takes as one are held as one; a run recorded while a write
    is under way is not part of it: that write releases what it stored, and the run waits
    for the next one."""
    backend = MemoryBackend()
    let_through, taken, written = trio.Event(), trio.Event(), trio.Event()
    store = held_store(backend, let_through, taken, written)
    fanout = Fanout(10_000)
    fanout.recorder = store
    frames = fanout.subscribe(None, head_seq=0, max_buffer=1000, wire=True)
    events = [
        ev.MessageDelta(session_id="s", seq=seq, timestamp=1.0, turn_id="t1", text=f"w{seq} ")
        for seq in range(1, 31)
    ]
    expected = text_frames([event_json(event) for event in events])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        fanout.publish_many(events[:10])
        fanout.publish_many(events[10:20])  # (one run, for the store and the fan-out)
        await taken.wait()  # the writer took them, and waits to write them
        assert backend.seqs() == [] and frames.pending == 0
        fanout.publish_many(events[20:])  # recorded while that write is under way
        let_through.set()
        await written.wait()  # (that write released what it stored as it ended)
        assert backend.seqs() == list(range(1, 21))
        assert frames.take_frames(100) == expected[:20]
        await store.flushed()
        assert frames.take_frames(100) == expected[20:]
        await store.aclose()


def test_a_subscription_taking_objects_keeps_them_until_they_are_stored() -> None:
    fanout = Fanout(10_000)
    fanout.recorder = _Recorder()
    objects = fanout.subscribe(None, head_seq=0, max_buffer=1000)
    events = [
        ev.MessageDelta(session_id="s", seq=seq, timestamp=1.0, turn_id="t1", text="w ")
        for seq in range(1, 11)
    ]
    fanout.publish_many(events)
    fanout.committed(10)
    assert all(a is b for a, b in zip(objects.take(100), events, strict=True))
