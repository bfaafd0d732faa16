"""A turn's answer (``supervisor/store/answers.py``), on every backend: made from the turn's
stored events by the settle after the batch that ends it, not in that batch; read from its
events meanwhile by whoever reads the session's texts; made by the next process when the one
that ended the turn went away first; the assistant's words of that turn alone, whatever the
runs, up to its bound."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from memory_store import in_this_thread

from helpers import stored_row
from protocols import events as ev
from supervisor.store import answers
from supervisor.store.backend import Backend, Batch, EventRun, TurnEnd
from supervisor.store.url import backend_for
from supervisor.store.writer import SessionStore
from supervisor.wire.codec import event_json


def said(seq: int, text: str, role: str = "assistant", turn: str = "t1") -> ev.Event:
    return ev.MessageDelta(
        session_id="s1", seq=seq, timestamp=1.0, turn_id=turn, text=text, role=role
    )


def started(seq: int) -> ev.Event:
    return ev.TurnStarted(session_id="s1", seq=seq, timestamp=1.0, turn_id="t1", text="go")


def ended(seq: int) -> ev.Event:
    return ev.TurnEnded(session_id="s1", seq=seq, timestamp=1.0, turn_id="t1", outcome="completed")


def run(*events: ev.Event) -> EventRun:
    """A run as the writer hands it over: its events' wire JSON, in pieces of two."""
    payloads = [event_json(e) for e in events]
    pieces = [b"\n".join(payloads[i : i + 2]) for i in range(0, len(payloads), 2)]
    return EventRun(
        session_id="s1",
        first_seq=events[0].seq,
        payloads=pieces,
        counts=[len(payloads[i : i + 2]) for i in range(0, len(payloads), 2)],
    )


def answers_of(backend: Backend) -> list[tuple[int, str]]:
    return [(t.seq, t.text) for t in backend.texts("s1") if t.kind == "answer"]


END = TurnEnd(session_id="s1", turn_id="t1", seq=7, started=1)


def test_an_answer_is_made_by_the_settle_after_its_turns_end(backend: Backend) -> None:
    backend.write(Batch(sessions=[stored_row()], events=[run(started(1), said(2, "Hi"))]))
    due = backend.write(Batch(events=[run(said(3, ", you"), ended(7))], turn_ends=[END]))
    assert due  # (settle has work: the answer)
    # Not written with the turn's end (no text of it is stored yet), yet read whole.
    assert backend.answers_due() == [END]
    assert answers_of(backend) == [(7, "Hi, you")]
    backend.settle(idle=False)
    assert backend.answers_due() == []
    assert answers_of(backend) == [(7, "Hi, you")]  # (stored now: once)
    assert [h.kind for h in backend.search("you", 10)] == ["answer"]


def test_an_answer_a_process_left_due_is_made_by_the_next(store_url: str) -> None:
    first = backend_for(store_url)
    assert first is not None
    first.open()
    first.write(Batch(sessions=[stored_row()], events=[run(started(1), said(2, "Left "))]))
    first.write(Batch(events=[run(said(3, "due."), ended(7))], turn_ends=[END]))
    first.close()  # (went away before its settle)
    later = backend_for(store_url)
    assert later is not None
    later.open_writes()  # (a writer process of the next supervisor)
    try:
        assert later.answers_due() == [END]
        later.settle(idle=False)
        assert later.answers_due() == []
        assert answers_of(later) == [(7, "Left due.")]
    finally:
        later.close()


def test_the_answer_is_the_assistants_words_of_its_turn(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answers, "READ_RUNS", 1)  # (read back in several pages)
    backend.write(
        Batch(
            sessions=[stored_row()],
            events=[run(started(1), said(2, "hello", role="user"), said(3, "Hi, "))],
        )
    )
    backend.write(
        Batch(
            events=[run(said(4, "there"), said(5, " (t2)", turn="t2"), said(6, "!"), ended(7))],
            turn_ends=[END],
        )
    )
    backend.settle(idle=False)
    assert answers_of(backend) == [(7, "Hi, there!")]


def test_events_stored_twice_count_once(backend: Backend) -> None:
    """Runs that overlap (a node's session adopted again hands over events already stored),
    or lie within one stored before, give each event's text once."""
    backend.write(
        Batch(sessions=[stored_row()], events=[run(started(1), said(2, "a"), said(3, "b"))])
    )
    backend.write(Batch(events=[run(said(2, "a"))]))
    backend.write(Batch(events=[run(said(3, "b"), said(4, "c"), said(5, "d"), ended(7))]))
    backend.write(Batch(turn_ends=[END]))
    backend.settle(idle=False)
    assert answers_of(backend) == [(7, "abcd")]


def test_a_long_answer_is_kept_up_to_its_bound(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answers, "MAX_ANSWER_CHARS", 10)
    backend.write(
        Batch(
            sessions=[stored_row()],
            events=[run(started(1), said(2, "x" * 8), said(3, "y" * 8), ended(7))],
            turn_ends=[END],
        )
    )
    backend.settle(idle=False)
    assert answers_of(backend) == [(7, "x" * 8 + "yy")]


def test_a_turn_that_said_nothing_has_no_answer(backend: Backend) -> None:
    backend.write(
        Batch(sessions=[stored_row()], events=[run(started(1), ended(7))], turn_ends=[END])
    )
    assert answers_of(backend) == []
    backend.settle(idle=False)
    assert backend.answers_due() == [] and answers_of(backend) == []


def test_a_deleted_session_has_no_answer_due(backend: Backend) -> None:
    backend.write(
        Batch(
            sessions=[stored_row()],
            events=[run(started(1), said(2, "gone"), ended(7))],
            turn_ends=[END],
        )
    )
    backend.delete(["s1"])
    assert backend.answers_due() == []


async def test_the_writers_batches_make_the_turns_answer(
    store_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Through the store's writer: the runs as a session records them (a stream's run, runs
    mixing kinds, roles and turns), the answer made once the turn's end is written."""
    backend = backend_for(store_url)
    assert backend is not None
    store = SessionStore(backend, run_sync=in_this_thread)
    await store.open()
    runs: list[list[ev.Event]] = [
        [started(1), said(2, "hello", role="user"), said(3, "Hi, ")],
        [said(4, "there")],
        [said(5, "! "), said(6, "All "), said(7, "good.")],  # a stream's run
        [said(8, " (t2)", turn="t2")],
        [said(9, " Bye."), ended(10)],
    ]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        for events in runs:
            store.record(events, [event_json(e) for e in events])
            await store.flushed()
        assert [(t.seq, t.text) for t in await store.texts("s1") if t.kind == "answer"] == [
            (10, "Hi, there! All good. Bye.")
        ]
        await store.aclose()
    backend = backend_for(store_url)
    assert backend is not None
    backend.open()
    try:
        assert backend.answers_due() == []  # (made by the settle after its end's write)
        assert answers_of(backend) == [(10, "Hi, there! All good. Bye.")]
    finally:
        backend.close()
