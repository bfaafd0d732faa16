"""Tier 2: a session's first checkpoint, taken as it starts, on virtual time with an in-memory
agent and a checkpoint store whose snapshots take as long as the test says: the first turn's
start waits for it (then for its own, incremental, snapshot), a cancel never does, a stop
cancels it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from supervisor import AgentSpec
from supervisor.checkpoints import Change, ShadowStore, Snapshot
from supervisor.runtime.session import Session, TurnHandle
from supervisor.testing import Recorder
from supervisor.testing._acp import AcpBehaviour, AcpLauncher


class GatedStore(ShadowStore):
    """Each snapshot waits until the test lets it through (:meth:`let_through`)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "state", root)
        #: each snapshot asked for, its gate, in order
        self.asked: list[trio.Event] = []
        self.taken = 0
        self.cancelled = 0
        self._asked_more = trio.Event()

    async def snapshot(self) -> Snapshot:
        gate = trio.Event()
        self.asked.append(gate)
        self._asked_more.set()
        try:
            await gate.wait()
        except trio.Cancelled:
            self.cancelled += 1
            raise
        self.taken += 1
        return Snapshot(f"c{self.taken}", f"tree{self.taken}")

    async def changes(self, old: Snapshot, new: Snapshot) -> list[Change]:
        return []

    async def housekeep(self) -> None:
        pass

    async def wait_asked(self, count: int) -> None:
        while len(self.asked) < count:
            self._asked_more = trio.Event()
            await self._asked_more.wait()

    def let_through(self, index: int) -> None:
        self.asked[index].set()


@asynccontextmanager
async def gated_session(
    tmp_path: Path, store: GatedStore | None = None, session_id: str = "s1", **changes: Any
) -> AsyncIterator[tuple[Session, GatedStore, Recorder, trio.Event]]:
    """The session (its agent's spec with ``changes``), its store, its events, and whether its
    actor (and its nursery) ended."""
    store = store if store is not None else GatedStore(tmp_path)
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    spec = spec.with_options(**changes) if changes else spec
    launcher = AcpLauncher(AcpBehaviour(words=2, word_interval=0.0))
    session = Session(session_id, spec, cwd=str(tmp_path), launcher=launcher, checkpoints=store)
    recorder = Recorder(session)
    ended = trio.Event()

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await session.run(task_status=task_status)
        finally:
            ended.set()

    with trio.fail_after(60):  # virtual seconds: each step here takes none
        async with trio.open_nursery() as nursery:
            await nursery.start(actor)
            await nursery.start(recorder.run)
            yield session, store, recorder, ended
            nursery.cancel_scope.cancel()


async def prompt_during_the_first_snapshot(session: Session, store: GatedStore) -> TurnHandle:
    """A prompt once the agent is up and the session's first snapshot is under way."""
    await session.wait_ready()
    await store.wait_asked(1)
    return await session.prompt("edit")


async def starts_once_let_through(
    store: GatedStore, recorder: Recorder, index: int, turn: TurnHandle
) -> None:
    """Snapshot ``index`` (``turn``'s start's) let through once asked for: ``turn`` starts."""
    await store.wait_asked(index + 1)
    store.let_through(index)
    started = await recorder.wait_kind("turn.started")
    assert started.turn_id == turn.id


async def test_the_first_turn_waits_for_the_first_snapshot_then_its_own(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with gated_session(tmp_path) as (session, store, recorder, _):
        await session.wait_ready()  # the agent is up beside the first snapshot
        await store.wait_asked(1)
        await trio.sleep(1.0)  # the user types the first prompt
        turn = await session.prompt("edit")
        assert not turn.queued
        await trio.sleep(5.0)
        assert len(store.asked) == 1 and recorder.of_kind("turn.started") == []
        store.let_through(0)
        await store.wait_asked(2)  # the turn's own, the state at its start
        assert recorder.of_kind("turn.started") == []
        await starts_once_let_through(store, recorder, 1, turn)
        await store.wait_asked(3)  # at its end
        store.let_through(2)
        ended = await recorder.wait_kind("turn.ended")
        assert ended.turn_id == turn.id
        assert store.cancelled == 0
        # the first snapshot is kept by no turn: a rewind may not name it
        assert list(session._snapshots) == [turn.id]
        assert store._dropped == ["c1"]
        await session.stop()


async def test_past_its_wait_a_turn_starts_without_a_checkpoint_until_the_first_is_taken(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A first snapshot that takes longer than ``first_snapshot_wait_s`` (a directory the size
    of a disk): the turn waiting for it starts then, without a checkpoint, and says so; so do
    the turns after it, at once, until the first snapshot is taken; then each has its own."""
    async with gated_session(tmp_path, first_snapshot_wait_s=10.0) as (session, store, rec, _):
        turn = await prompt_during_the_first_snapshot(session, store)
        began = trio.current_time()
        started = await rec.wait_kind("turn.started")
        assert started.turn_id == turn.id and trio.current_time() - began == 10.0
        said = rec.of_kind("error")
        assert [e.code for e in said] == ["checkpoint_failed"]
        assert f"turn {turn.id} starts without a checkpoint" in said[0].message
        ended = await rec.wait_kind("turn.ended")
        assert (ended.turn_id, ended.changes) == (turn.id, None)
        second = await session.prompt("edit again")
        await rec.wait_for(lambda e: e.kind == "turn.started" and e.turn_id == second.id)
        await rec.wait_for(lambda e: e.kind == "turn.ended" and e.turn_id == second.id)
        assert len(store.asked) == 1 and len(rec.of_kind("error")) == 2
        store.let_through(0)  # the first snapshot, at last
        await trio.testing.wait_all_tasks_blocked()  # (and the session told so)
        third = await session.prompt("edit once more")
        await store.wait_asked(2)  # its own start snapshot, once the first is taken
        store.let_through(1)
        await rec.wait_for(lambda e: e.kind == "turn.started" and e.turn_id == third.id)
        await store.wait_asked(3)
        store.let_through(2)
        ended = await rec.wait_for(lambda e: e.kind == "turn.ended" and e.turn_id == third.id)
        assert ended.changes == []
        assert list(session._snapshots) == [third.id]
        await session.stop()


async def test_a_cancel_never_waits_for_the_first_snapshot(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with gated_session(tmp_path) as (session, store, recorder, _):
        turn = await prompt_during_the_first_snapshot(session, store)
        before = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() == before  # answered at once
        assert (receipt.turn_id, receipt.outcome) == (turn.id, "cancelled")
        ended = await recorder.wait_kind("turn.ended")
        assert (ended.turn_id, ended.outcome) == (turn.id, "cancelled")
        store.let_through(0)
        second = await session.prompt("again")
        # (the cancelled one never reached the agent)
        await starts_once_let_through(store, recorder, 1, second)
        await session.stop()


async def test_a_stop_cancels_the_first_snapshot(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with gated_session(tmp_path) as (session, store, recorder, gone):
        turn = await prompt_during_the_first_snapshot(session, store)
        with trio.fail_after(10):  # the agent's exit: the snapshot is not waited for
            await session.stop()
            await gone.wait()
        assert store.cancelled == 1 and store.taken == 0 and len(store.asked) == 1
        ended = await recorder.wait_kind("turn.ended")
        assert ended.turn_id == turn.id
        assert [e.code for e in recorder.of_kind("error")] == []
        # not taken: the next session started there takes it
        async with gated_session(tmp_path, store, "s2"):
            await store.wait_asked(2)
            store.let_through(1)


async def test_a_session_started_beside_another_takes_no_first_snapshot_of_its_own(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """One store per directory: its first snapshot of the process, under way for the first
    session, is the second's too (the second's turn takes the store after it)."""
    async with gated_session(tmp_path) as (_, store, _, _):
        await store.wait_asked(1)
        async with gated_session(tmp_path, store, "s2") as (second, _, recorder, _):
            await second.wait_ready()
            turn = await second.prompt("edit")
            # its own start snapshot, asked for at once
            await starts_once_let_through(store, recorder, 1, turn)
            await second.stop()
        store.let_through(0)
