"""The store's writer: batches (a few ms, or a batch's worth at once), a failing database
(tried again, then given up in one log line, the sessions going on), and a database that
falls behind (the sessions hold their agents back; nothing is dropped)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from memory_store import MemoryBackend, in_this_thread

from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.store.backend import Batch, TurnEnd
from supervisor.store.writer import (
    ACTIVE_EVERY_S,
    SETTLE_IDLE_S,
    TURN_END_S,
    SessionStore,
    StoreFault,
    StoreNotice,
    StoreRecovered,
)
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import event_json


def deltas(first: int, count: int, session_id: str = "s1") -> tuple[list[ev.Event], list[bytes]]:
    events: list[ev.Event] = [
        ev.MessageDelta(session_id=session_id, seq=seq, timestamp=1.0, turn_id="t1", text="w ")
        for seq in range(first, first + count)
    ]
    return events, [event_json(e) for e in events]


async def test_events_gather_for_a_few_ms_or_a_batch_worth(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = MemoryBackend()
    backend.clock = trio.current_time
    store = SessionStore(backend, flush_s=0.005, batch_events=100, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        start = trio.current_time()
        store.record(*deltas(1, 3))
        store.record(*deltas(4, 3))
        await store.flushed()
        ((at, batch),) = backend.batches
        assert [(run.first_seq, run.last_seq) for run in batch.events] == [(1, 6)]  # one run
        assert at - start == pytest.approx(0.005)  # gathered for flush_s
        start = trio.current_time()
        store.record(*deltas(7, 100))  # a batch's worth: written at once
        await store.flushed()
        assert backend.batches[-1][0] == start
        await store.aclose()
    assert backend.seqs() == list(range(1, 107))


async def test_a_streams_runs_are_one_piece_of_its_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Runs a flooding session records one after another (the ingest gate hands it a few
    lines at a time) are joined once, as one piece, the lists its fan-out keeps untouched; a
    run with a turn's end, or after a gap in the seqs, starts a run of its own."""
    backend = MemoryBackend()
    store = SessionStore(backend, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        first, second, third = deltas(1, 3), deltas(4, 2), deltas(7, 2)
        ended = ev.TurnEnded(
            session_id="s1", seq=9, timestamp=1.0, turn_id="t1", outcome="completed"
        )
        kept = [list(payloads) for _, payloads in (first, second)]
        for events, payloads in (first, second):
            store.record(events, payloads)
        store.record(*third)  # (seq 6 is missing: a new run)
        store.record([ended], [event_json(ended)])
        await store.flushed()
        await store.aclose()
    assert [payloads for _, payloads in (first, second)] == kept
    ((_, batch),) = backend.batches
    pieces = [(run.first_seq, run.counts, len(run.payloads)) for run in batch.events]
    assert pieces == [(1, [5], 1), (7, [2, 1], 2)]
    assert batch.events[0].payloads == [b"\n".join(first[1] + second[1])]


class _Session:
    """What the writer reads of a session it stores (``SessionStore.attach``)."""

    id = "s1"
    host = None
    cwd = "/"
    agent_session_id = None

    def __init__(self) -> None:
        self.spec = AgentSpec(name="demo", protocol="acp", command=["demo"])
        self.fanout = _Fanout([])


async def test_a_streams_batches_write_its_events_and_its_row_when_it_changes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = MemoryBackend()
    store = SessionStore(backend, run_sync=in_this_thread)
    store.attach(_Session())

    def delta(seq: int, at: float) -> tuple[list[ev.Event], list[bytes]]:
        event = ev.MessageDelta(session_id="s1", seq=seq, timestamp=at, turn_id="t1", text="w")
        return [event], [event_json(event)]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        for seq, at in enumerate([100.0, 100.2, 100.2 + ACTIVE_EVERY_S], 1):
            store.record(*delta(seq, at))
            await store.flushed()
        state = ev.SessionState(session_id="s1", seq=4, timestamp=101.3, state="idle")
        store.record([state], [event_json(state)])
        await store.flushed()
        await store.aclose()
    rows = [
        [(row.last_active, row.state) for row in batch.sessions] for _, batch in backend.batches
    ]
    # The first write, a last_active a second on, a new state; the clean close, exact.
    assert rows == [
        [(100.0, "starting")],
        [],
        [(100.2 + ACTIVE_EVERY_S, "starting")],
        [(101.3, "idle")],
        [(101.3, "idle")],
    ]


async def test_the_rows_of_many_streaming_sessions_are_written_together(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A row whose only change is its ``last_active`` is written with every other session's
    of the batch, every half ``ACTIVE_EVERY_S``: the batches between are events alone."""
    backend = MemoryBackend()
    store = SessionStore(backend, run_sync=in_this_thread)
    ids = ["s1", "s2", "s3"]
    for sid in ids:
        session = _Session()
        session.id = sid
        store.attach(session)
    step = ACTIVE_EVERY_S / 10
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        for tick in range(8):
            for sid in ids:
                at = 100.0 + tick * step
                event = ev.MessageDelta(
                    session_id=sid, seq=tick + 1, timestamp=at, turn_id="t1", text="w"
                )
                store.record([event], [event_json(event)])
            await store.flushed()
        await store.aclose()
    rows = [sorted(row.id for row in batch.sessions) for _, batch in backend.batches]
    assert rows[:8] == [ids, [], [], [], [], ids, [], []]


class _Fanout:
    """What the writer tells a session's fan-out (its subscribers get what is stored)."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def committed(self, seq: int) -> None:
        self.calls.append(f"committed {seq}")

    def serialize(self) -> None:
        pass


async def test_a_turns_end_is_named_in_its_batch_and_settled_after_its_events_go_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The batch that holds a turn's end names the turn (with its start, as the session's
    events told it), whose answer the backend makes by the settle that follows once the
    batch's events are given to subscribers (``tests/store/test_answers.py``)."""
    calls: list[str] = []

    class Ordered(MemoryBackend):
        def write(self, batch: Batch) -> bool:
            calls.append(f"write {len(batch.turn_ends)} turn ends, {len(batch.texts)} texts")
            super().write(batch)
            return bool(batch.turn_ends)

        def settle(self, idle: bool) -> None:
            calls.append(f"settle idle={idle}")

    backend = Ordered()
    store = SessionStore(backend, run_sync=in_this_thread)
    session: Any = _Session()
    store.attach(session)
    fanout: Any = _Fanout(calls)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        start = ev.TurnStarted(session_id="s1", seq=1, timestamp=1.0, turn_id="t1", text="go")
        events, payloads = deltas(2, 3)
        ended = ev.TurnEnded(
            session_id="s1", seq=5, timestamp=1.0, turn_id="t1", outcome="completed"
        )
        store.record([start, *events], [event_json(start), *payloads], fanout)
        await store.flushed()
        store.record([ended], [event_json(ended)], fanout)
        await store.flushed()
        await store.aclose()
    assert calls[:5] == [
        "write 0 turn ends, 1 texts",  # (the prompt)
        "committed 4",
        "write 1 turn ends, 0 texts",
        "committed 5",
        "settle idle=False",
    ]
    ((_, batch),) = [(at, b) for at, b in backend.batches if b.turn_ends]
    assert batch.turn_ends == [TurnEnd(session_id="s1", turn_id="t1", seq=5, started=1)]


async def test_the_backend_settles_once_the_store_is_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settled: list[tuple[float, bool]] = []

    class Settled(MemoryBackend):
        def settle(self, idle: bool) -> None:
            settled.append((trio.current_time(), idle))

    store = SessionStore(Settled(), run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        store.record(*deltas(1, 3))
        await store.flushed()
        written = trio.current_time()
        await trio.sleep(SETTLE_IDLE_S / 2)
        store.record(*deltas(4, 3))  # (not idle yet: the wait starts again)
        await store.flushed()
        written = trio.current_time()
        await trio.sleep(SETTLE_IDLE_S * 5)
        await store.aclose()
    assert settled == [(pytest.approx(written + SETTLE_IDLE_S), True)]  # once, not again


async def test_a_turns_end_is_written_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """A turn's end recorded in its session's step is written at once, not after flush_s:
    its clients see it once stored."""
    backend = MemoryBackend()
    backend.clock = trio.current_time
    store = SessionStore(backend, flush_s=0.005, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        start = trio.current_time()
        events, payloads = deltas(1, 3)
        ended = ev.TurnEnded(
            session_id="s1", seq=4, timestamp=1.0, turn_id="t1", outcome="cancelled"
        )
        store.record(events, payloads)
        store.record([ended], [event_json(ended)])
        await store.flushed()
        ((at, _),) = backend.batches
        assert at == start  # not flush_s, nor TURN_END_S (a cancel's, from its caller's step)
        await store.aclose()
    assert backend.seqs() == [1, 2, 3, 4]


async def test_a_turns_first_word_is_written_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The run after a turn's start (its agent's first word) is written at once: what a
    person waits for, seen by clients once stored; the turn's start alone, and the words
    after the first, gather for flush_s as a stream's do."""
    backend = MemoryBackend()
    backend.clock = trio.current_time
    store = SessionStore(backend, flush_s=0.005, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        begun = ev.TurnStarted(session_id="s1", seq=1, timestamp=1.0, turn_id="t1", text="go")
        start = trio.current_time()
        store.record([begun], [event_json(begun)])
        await store.flushed()
        assert backend.batches[-1][0] - start == pytest.approx(0.005)
        first = trio.current_time()
        store.record(*deltas(2, 2))
        await store.flushed()
        assert backend.batches[-1][0] == first
        later = trio.current_time()
        store.record(*deltas(4, 2))
        await store.flushed()
        assert backend.batches[-1][0] - later == pytest.approx(0.005)
        # A prompt's own events, published in its caller's step (written TURN_END_S on), and
        # its first word in the session's next step: written at once, the start with it.
        again = ev.TurnStarted(session_id="s1", seq=6, timestamp=1.0, turn_id="t2", text="go")
        prompt = AsideEvents(store, [again])
        store.soon(prompt)  # type: ignore[arg-type]
        prompted = trio.current_time()
        prompt.serialize()  # (the session's step serializes what waits, its word with it)
        store.record(*deltas(7, 1))
        await store.flushed()
        assert backend.batches[-1][0] == prompted
        await store.aclose()
    assert backend.seqs() == list(range(1, 8))


class AsideEvents:
    """A session's events published in another task's step (a cancel's, a prompt's), serialized
    when the store asks."""

    def __init__(self, store: SessionStore, events: list[ev.Event]) -> None:
        self.store = store
        self.events = events
        self.serialized_at: float | None = None

    def serialize(self) -> None:
        if self.events:
            self.serialized_at = trio.current_time()
            events, self.events = self.events, []
            self.store.record(events, [event_json(e) for e in events])


@pytest.mark.parametrize("hasten", [False, True])
async def test_a_cancels_events_are_stored_from_the_writers_step(
    autojump_clock: trio.testing.MockClock, hasten: bool
) -> None:
    """Events left as objects by a cancel's step are serialized by the writer TURN_END_S on,
    not in the step that asked; at once if a client waits for them (a held response)."""
    backend = MemoryBackend()
    backend.clock = trio.current_time
    store = SessionStore(backend, flush_s=0.005, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for work
        aside = AsideEvents(
            store,
            [ev.TurnEnded(session_id="s1", seq=1, timestamp=1.0, turn_id="t1", outcome="x")],
        )
        start = trio.current_time()
        store.soon(aside)  # type: ignore[arg-type]
        assert aside.serialized_at is None  # not in the caller's step
        if hasten:
            store.hasten()
        await store.flushed()
        ((at, _),) = backend.batches
        assert aside.serialized_at == at
        assert at - start == pytest.approx(0.0 if hasten else TURN_END_S)
        # What the writer's own step recorded was in that write: the next events (a new
        # turn's stream) wait for flush_s as any, not at once for a turn's end already stored.
        await trio.testing.wait_all_tasks_blocked()
        events, payloads = deltas(2, 3)
        start = trio.current_time()
        store.record(events, payloads)
        await store.flushed()
        assert backend.batches[-1][0] - start == pytest.approx(0.005)
        await store.aclose()
    assert backend.seqs() == [1, 2, 3, 4]


async def test_a_floods_writes_gather_longer_and_a_trickles_do_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After a write of a batch's worth or more (a flood), the next one gathers for
    ``flood_flush_s`` or ``flood_batch_events``, whichever comes first; after a write of
    less, for ``flush_s`` again."""
    backend = MemoryBackend()
    backend.clock = trio.current_time
    store = SessionStore(
        backend,
        flush_s=0.005,
        batch_events=100,
        flood_flush_s=0.015,
        flood_batch_events=250,
        run_sync=in_this_thread,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        start = trio.current_time()
        for first, count in [(1, 100), (101, 100), (201, 250), (451, 10), (461, 10)]:
            store.record(*deltas(first, count))
            await store.flushed()
        await store.aclose()
    # at once (a batch's worth); a flood's window; a flood's batch's worth at once; a flood's
    # window again (the last write was a flood's); flush_s (the last one held 10)
    times = [at - start for at, _ in backend.batches]
    assert times == pytest.approx([0.0, 0.015, 0.015, 0.030, 0.035])
    assert backend.seqs() == list(range(1, 471))


async def test_a_turns_first_word_and_end_are_written_alone_while_a_flood_gathers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While a flood's next write gathers (``flood_flush_s``), another session's turn's first
    word, then its end, are written at once and alone; the flood's events gather on until
    their window ends, counted from their first, not from those writes."""
    backend = MemoryBackend()
    backend.clock = trio.current_time
    store = SessionStore(
        backend,
        batch_events=100,
        flood_flush_s=0.015,
        flood_batch_events=10_000,
        run_sync=in_this_thread,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        start = trio.current_time()
        store.record(*deltas(1, 100))  # a batch's worth: at once, and a flood from then on
        await trio.testing.wait_all_tasks_blocked()
        store.record(*deltas(101, 50))
        # (virtual time: when each write goes, against the flood's window, is what is tested)
        await trio.sleep(0.005)
        started = ev.TurnStarted(session_id="s2", seq=1, timestamp=1.0, turn_id="t1", text="go")
        store.record([started], [event_json(started)])
        store.record(*deltas(2, 1, session_id="s2"))  # its first word
        await trio.sleep(0.005)
        ended = ev.TurnEnded(session_id="s2", seq=3, timestamp=1.0, turn_id="t1", outcome="x")
        store.record([ended], [event_json(ended)])
        await store.flushed()
        await store.aclose()
    written = [
        (at - start, [(run.session_id, run.first_seq, run.last_seq) for run in batch.events])
        for at, batch in backend.batches
    ]
    assert written == [
        (0.0, [("s1", 1, 100)]),
        (pytest.approx(0.005), [("s2", 1, 2)]),
        (pytest.approx(0.010), [("s2", 3, 3)]),
        (pytest.approx(0.015), [("s1", 101, 150)]),
    ]


async def test_a_waiting_client_has_what_is_recorded_written_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = MemoryBackend()
    backend.clock = trio.current_time
    store = SessionStore(backend, flush_s=0.005, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        start = trio.current_time()
        store.record(*deltas(1, 3))
        store.hasten()  # not flush_s
        await store.flushed()
        ended = ev.TurnEnded(session_id="s1", seq=4, timestamp=1.0, turn_id="t1", outcome="x")
        store.record([ended], [event_json(ended)])
        await trio.testing.wait_all_tasks_blocked()  # the writer waits TURN_END_S
        store.hasten()  # not TURN_END_S
        await store.flushed()
        assert [at - start for at, _ in backend.batches] == [0.0, 0.0]
        await store.aclose()
    assert backend.seqs() == [1, 2, 3, 4]


async def test_a_database_away_for_long_holds_the_agents_back_and_drops_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend(failures=10**9)
    store = SessionStore(backend, max_pending=100, batch_events=10, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        store.record(*deltas(1, 2))
        await trio.sleep(60)  # a failover, a full disk: far longer than a blip
        assert backend.seqs() == []
        for first in range(3, 103, 10):
            store.record(*deltas(first, 10))
        assert store.full  # the sessions hold their agents back
        room = trio.Event()
        store.when_room(room.set)
        await trio.sleep(60)
        assert not room.is_set()
        backend.failures = 0  # the database is back
        await room.wait()
        await store.flushed()
        assert not store.full
        await store.aclose()
    assert backend.seqs() == list(range(1, 103))  # every event, once, in order
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # One line per LOG_EVERY_S (10 s) at most over the two minutes, each on one line.
    assert 1 <= len(lines) <= 13
    assert "disk I/O error" in lines[0] and "s1 seq 1-2" in lines[0]
    assert all("\n" not in line for line in lines)


async def test_failing_writes_are_told_then_their_recovery_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = MemoryBackend(failures=10**9)
    store = SessionStore(backend, max_pending=100, batch_events=10, run_sync=in_this_thread)
    told: list[tuple[float, StoreNotice]] = []
    store.watch(lambda notice: told.append((trio.current_time(), notice)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        start = trio.current_time()
        store.record(*deltas(1, 2))
        store.record(*deltas(1, 4, session_id="s2"))
        await trio.sleep(1)
        ((at, first),) = told  # at once, with what waits
        assert at - start < 0.05
        assert isinstance(first, StoreFault) and store.fault == first
        assert first.where == "memory" and "disk I/O error" in first.error
        assert first.sessions == {"s1": (1, 2), "s2": (1, 4)} and first.waiting == 6
        assert not first.held
        for begin in range(3, 103, 10):
            store.record(*deltas(begin, 10))  # the agents are held back from now on
        await trio.sleep(30)
        faults = [notice for _, notice in told]
        assert 3 <= len(faults) <= 5  # again with each log line, every 10 s
        assert faults[-1].held and faults[-1].sessions["s1"] == (1, 102)  # type: ignore[union-attr]
        backend.failures = 0
        await store.flushed()
        (_, recovered) = told[-1]
        assert isinstance(recovered, StoreRecovered) and recovered.failed_s >= 30
        assert store.fault is None
        count = len(told)
        store.record(*deltas(103, 1))
        await store.flushed()
        assert len(told) == count  # told once: writes that go through say nothing
        await store.aclose()
    assert backend.seqs().count(1) == 2  # (s1's and s2's), every event once


async def test_what_cannot_be_written_at_close_is_said_in_one_line(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend(failures=10**9)
    store = SessionStore(backend, run_sync=in_this_thread)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        store.record(*deltas(1, 2))
        store.record(*deltas(1, 3, session_id="s2"))
        await trio.sleep(30)
        await store.aclose()
    assert backend.seqs() == []
    (line,) = [
        r.getMessage() for r in caplog.records if "before the supervisor stopped" in r.getMessage()
    ]
    assert "5 events" in line and "s1 seq 1-2" in line and "s2 seq 1-3" in line


async def test_a_database_that_falls_behind_holds_the_agents_back(tmp_path: Path) -> None:
    gate = threading.Event()
    backend = MemoryBackend(gate=gate)
    store = SessionStore(backend, max_pending=200, batch_events=50)
    launcher = AcpLauncher(AcpBehaviour(words=3000, flood=True))
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
                sup.store = store
                session = await sup.start_session("fake")
                async with session.subscribe() as events:
                    await session.prompt("flood")
                    while not store.full:
                        await trio.sleep(0.01)
                    # Held: the session reads no more of the agent while the store is full.
                    held_at = session.last_seq
                    await trio.sleep(0.2)
                    assert session.fanout.store_holds >= 1
                    assert session.last_seq - held_at < 200
                    gate.set()
                    async for event in events:
                        if event.kind == "turn.ended":
                            break
            last = session.last_seq  # its last events too, recorded as it stopped
            await store.flushed()
            await store.aclose()
    assert backend.seqs() == list(range(1, last + 1))  # every event, once, in order
