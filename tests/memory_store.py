"""A store backend in memory, for tests of what the writer and the sessions do with a store
(the backends themselves are tested on their databases): it keeps the batches it is given and
can fail writes or hold them back on demand."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import trio

from supervisor.store.backend import (
    Batch,
    CheckpointRow,
    Owner,
    ReceiptRow,
    SearchHit,
    StoredSession,
    StoreError,
    TextRow,
    TurnEnd,
    this_process,
)


class MemoryBackend:
    """Keeps batches in memory, each with the time of :attr:`clock` it was written at; fails
    the next ``failures`` writes; ``gate``: a write waits for it (the database falls behind).
    Reads find nothing: no session was stored before."""

    where = "memory"

    owner = this_process("serve")

    def __init__(self, failures: int = 0, gate: threading.Event | None = None) -> None:
        self.batches: list[tuple[float, Batch]] = []
        self.failures = failures
        self.gate = gate
        self.clock: Callable[[], float] = lambda: 0.0

    def seqs(self) -> list[int]:
        """The seqs of every event written, in the order they were written."""
        return [
            seq
            for _, batch in self.batches
            for run in batch.events
            for seq in range(run.first_seq, run.last_seq + 1)
        ]

    def owners(self) -> dict[str, tuple[Owner, bool]]:
        return {}

    def drop_owners(self, tokens: Sequence[str]) -> None:
        pass

    def exclusive(self) -> AbstractContextManager[None]:
        return nullcontext()

    def next_session_number(self, at_least: int) -> int:
        return at_least + 1

    def open(self) -> None:
        pass

    def write(self, batch: Batch) -> bool:
        if self.gate is not None:
            assert self.gate.wait(60)
        if self.failures:
            self.failures -= 1
            raise StoreError("cannot write to the store memory: disk I/O error")
        self.batches.append((self.clock(), batch))
        return False  # (nothing for settle to do)

    def settle(self, idle: bool) -> None:
        pass

    def index(self) -> None:
        pass

    def sessions(self) -> list[StoredSession]:
        return []

    def session(self, session_id: str) -> StoredSession | None:
        return None

    def events(self, session_id: str, since_seq: int, limit: int) -> list[tuple[int, bytes]]:
        return []

    def runs(
        self, session_id: str, after: int, upto: int, limit: int
    ) -> list[tuple[int, int, bytes]]:
        return []

    def answers_due(self, session_id: str | None = None) -> list[TurnEnd]:
        return []

    def texts(self, session_id: str) -> list[TextRow]:
        return []

    def receipts(self, session_id: str) -> list[ReceiptRow]:
        return []

    def checkpoints(self, session_id: str, limit: int) -> list[CheckpointRow]:
        return []

    def first_prompts(self, chars: int) -> dict[str, str]:
        return {}

    def search(self, query: str, limit: int) -> list[SearchHit]:
        return []

    def sizes(self) -> dict[str, int]:
        return {}

    def delete(self, session_ids: Sequence[str]) -> None:
        pass

    def reclaim(self, pages: int) -> bool:
        return False

    def close(self) -> None:
        pass


async def in_this_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """A ``run_sync`` for the writer that calls the backend in the test's own thread: virtual
    time sees it take none."""
    await trio.lowlevel.checkpoint()
    return fn(*args)
