"""A turn's answer, made where batches are written (``supervisor/store/answers.py``): from the
runs' wire JSON, whatever their sizes; nothing counted twice when a failed write is tried
again; and whole when the writer that ends the turn did not write its start (the earlier
events are read back from the store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_store import MemoryBackend

from helpers import stored_row
from protocols import events as ev
from supervisor.store.answers import MAX_ANSWER_CHARS, Answers
from supervisor.store.backend import Batch, EventRun, StoreError, TurnEnd
from supervisor.store.sqlite import SqliteBackend
from supervisor.wire.codec import event_json


def said(seq: int, text: str, role: str = "assistant", turn: str = "t1") -> bytes:
    return event_json(
        ev.MessageDelta(session_id="s1", seq=seq, timestamp=1.0, turn_id=turn, text=text, role=role)
    )


def started(seq: int) -> bytes:
    return event_json(
        ev.TurnStarted(session_id="s1", seq=seq, timestamp=1.0, turn_id="t1", text="go")
    )


def ended(seq: int) -> bytes:
    return event_json(
        ev.TurnEnded(session_id="s1", seq=seq, timestamp=1.0, turn_id="t1", outcome="completed")
    )


def run(first_seq: int, *payloads: bytes) -> EventRun:
    """A run as the writer hands it over: its events joined, in pieces of one or more."""
    return EventRun(
        session_id="s1",
        first_seq=first_seq,
        payloads=[b"\n".join(payloads[:2]), *payloads[2:]],
        counts=[min(2, len(payloads)), *[1] * len(payloads[2:])],
    )


END = TurnEnd(session_id="s1", turn_id="t1", seq=6, started=1)


def answers_of(backend: MemoryBackend) -> list[str]:
    return [t.text for _, batch in backend.batches for t in batch.texts if t.kind == "answer"]


def test_the_answer_is_the_assistants_words_of_its_turn_in_every_run() -> None:
    backend = MemoryBackend()
    answers = Answers(backend)
    answers.write(Batch(events=[run(1, started(1), said(2, "hello", role="user"), said(3, "Hi"))]))
    assert answers_of(backend) == []  # (deltas alone: the answer waits for its turn's end)
    answers.write(
        Batch(events=[run(4, said(4, ", you"), said(5, "!", turn="t2"), ended(6))], turn_ends=[END])
    )
    assert answers_of(backend) == ["Hi, you"]


def test_a_batch_tried_again_counts_nothing_twice() -> None:
    backend = MemoryBackend(failures=1)
    answers = Answers(backend)
    first = Batch(events=[run(1, started(1), said(2, "one "), said(3, "two "))])
    with pytest.raises(StoreError):
        answers.write(first)
    answers.write(first)
    answers.write(Batch(events=[run(4, said(4, "three"), said(5, ""), ended(6))], turn_ends=[END]))
    assert answers_of(backend) == ["one two three"]


def test_a_long_answer_is_indexed_up_to_its_bound() -> None:
    backend = MemoryBackend()
    long = "x" * (MAX_ANSWER_CHARS + 10)
    Answers(backend).write(
        Batch(events=[run(1, started(1), said(2, long), ended(3))], turn_ends=[END])
    )
    assert answers_of(backend) == [long[:MAX_ANSWER_CHARS]]


def test_a_writer_that_did_not_write_the_turns_start_reads_it_back(tmp_path: Path) -> None:
    """A writer process killed mid-turn: the next one ends the turn with all of it."""
    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)
    backend.open()
    try:
        Answers(backend).write(
            Batch(sessions=[stored_row()], events=[run(1, started(1), said(2, "Written "))])
        )
        later = Answers(backend)  # (a new writer process: it read nothing of seqs 1-2)
        later.write(Batch(events=[run(3, said(3, "before, "), said(4, "and "), said(5, "after."))]))
        later.write(Batch(events=[run(6, ended(6))], turn_ends=[END]))
        answers = [t.text for t in backend.texts("s1") if t.kind == "answer"]
    finally:
        backend.close()
    assert answers == ["Written before, and after."]
