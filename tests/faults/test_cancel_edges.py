"""Cancels that name turns which are not running (queued, dropped, failed: protocol-independent,
so in-memory ACP agents on the real clock); a session stopped while a cancel is in flight, and
a respawn that cannot resume (real agent processes).

Found while building the fault suite; each test states the guarantee it holds the
supervisor to (brief section 4, ``design/actor.md`` "The cancel procedure" step 1). The
supervisor broke each of them when this suite was written; they were fixed with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest
import trio

import helpers
from faults.agents import AGENTS
from faults.harness import FaultRecorder, living, tree
from helpers import Recorder
from protocols import events as ev
from supervisor import AgentSpec, CancelReceipt, Session, open_supervisor
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import receipt_to_wire

BOUND = 20.0


@asynccontextmanager
async def memory_session() -> AsyncIterator[tuple[Session, Recorder]]:
    launcher = AcpLauncher(AcpBehaviour(words=10_000, word_interval=0.01, stop_delay=0.02))
    spec = AgentSpec(name="m", protocol="acp", command=["memory"], grace_s=2.0)
    with trio.fail_after(BOUND):
        async with helpers.running(launcher, spec, catch_up=True) as (session, _, rec):
            yield session, rec


async def test_named_cancel_of_a_queued_turn_drops_it_and_leaves_the_running_one() -> None:
    async with memory_session() as (session, rec):
        running = await session.prompt("hello")
        queued = await session.prompt("later")
        assert queued.queued
        receipt = await session.cancel(turn_id=queued.id)
        assert (receipt.outcome, receipt.turn_id, receipt.stop_reason) == (
            "cancelled",
            queued.id,
            "dropped",
        )
        ended = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason) == ("cancelled", "dropped")
        assert session.turn_id == running.id and session.state == "running"  # not the newer one
        assert (await session.cancel()).turn_id == running.id


async def test_concurrent_cancels_of_a_queued_turn_share_one_receipt() -> None:
    async with memory_session() as (session, _rec):
        await session.prompt("hello")
        queued = await session.prompt("later")
        receipts: list[CancelReceipt] = []

        async def cancel() -> None:
            receipts.append(await session.cancel(turn_id=queued.id))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            nursery.start_soon(cancel)
        assert len(receipts) == 2 and receipts[0] == receipts[1]
        await session.cancel()


async def test_cancel_naming_a_dropped_turn_gets_its_receipt_again() -> None:
    async with memory_session() as (session, rec):
        running = await session.prompt("hello")
        queued = await session.prompt("later")
        receipt = await session.cancel()
        assert receipt.turn_id == running.id
        assert [d.turn_id for d in receipt.dropped_prompts] == [queued.id]
        ended = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason) == ("cancelled", "dropped")
        again = await session.cancel(turn_id=queued.id)  # BadRequest today
        assert (again.outcome, again.turn_id, again.stop_reason) == (
            "cancelled",
            queued.id,
            "dropped",
        )


async def test_turn_ended_of_a_queued_turn_cancelled_by_name_carries_the_receipt() -> None:
    async with memory_session() as (session, rec):
        await session.prompt("hello")
        queued = await session.prompt("later")
        receipt = await session.cancel(turn_id=queued.id)
        ended = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(ended, ev.TurnEnded)
        await session.cancel()
        assert ended.receipt == receipt_to_wire(receipt)


async def test_cancel_naming_a_failed_turn_does_not_say_completed() -> None:
    async with memory_session() as (session, rec):
        turn = await session.prompt("crash=2 words=10")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
        await session.wait_ready()
        receipt = await session.cancel(turn_id=turn.id)
        assert receipt.turn_id == turn.id
        assert receipt.outcome != "completed", receipt


# -- a session stopped while a cancel is in flight (real processes) ------------------------


@asynccontextmanager
async def stopped_mid_cancel(
    tmp_path: Path,
) -> AsyncIterator[tuple[CancelReceipt, list[psutil.Process], FaultRecorder]]:
    """The fake Amp in ``mute`` mode ignores SIGINT (its interrupt) and its stdin: a cancel is
    in flight when ``session.stop()`` comes; only the stop's kill ladder ends the agent."""
    agent = AGENTS["amp"]
    spec = agent.spec(tmp_path, "mute", grace=5.0)
    got: list[tuple[CancelReceipt, list[psutil.Process]]] = []
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"amp": spec}) as sup:
            session = await sup.start_session("amp", cwd=str(tmp_path))
            rec = FaultRecorder(session)
            async with trio.open_nursery() as nursery:
                await nursery.start(rec.run)
                turn = await session.prompt(agent.words["mute"])
                await rec.wait_for(
                    lambda e: isinstance(e, ev.MessageDelta) and e.turn_id == turn.id, count=3
                )
                before = tree()

                async def cancel() -> None:
                    receipt = await session.cancel()
                    got.append((receipt, living(before)))  # what runs when the receipt comes

                nursery.start_soon(cancel)
                await rec.wait_kind("session.state", state="cancelling")
                await session.stop()
                await rec.catch_up()
                rec.check_invariants()
                nursery.cancel_scope.cancel()
    [(receipt, alive_at_receipt)] = got
    yield receipt, alive_at_receipt, rec


@pytest.mark.real_process
async def test_stop_during_a_cancel_answers_it_only_once_the_tree_is_gone(
    tmp_path: Path,
) -> None:
    async with stopped_mid_cancel(tmp_path) as (receipt, alive_at_receipt, _rec):
        assert alive_at_receipt == [], f"{receipt} given while {alive_at_receipt} ran"
        assert receipt.outcome == "killed" and "sigterm" in receipt.escalation, receipt


@pytest.mark.real_process
async def test_stop_during_a_cancel_receipt_agrees_with_turn_ended(tmp_path: Path) -> None:
    async with stopped_mid_cancel(tmp_path) as (receipt, _alive, rec):
        assert receipt.turn_id is not None
        [ended] = rec.turn_ended(receipt.turn_id)
        assert ended.receipt == receipt_to_wire(receipt)
        assert receipt.stop_reason == ended.stop_reason == "session_stopped", (receipt, ended)


# -- a respawn that cannot resume says so ---------------------------------------------------


@pytest.mark.real_process
@pytest.mark.parametrize(
    "protocol,text",
    [
        # Killed before its system/init: the CLI never named its session.
        ("claude", "init-delay=2 ignore-interrupt words=100000"),
        # SIGINT (Amp's interrupt) before its system/init: the thread was never named.
        ("amp", "init-delay=2 words=100000"),
    ],
)
async def test_a_respawn_that_cannot_resume_says_so(
    protocol: str, text: str, tmp_path: Path
) -> None:
    spec = AGENTS[protocol].spec(tmp_path, "ignores_interrupt", grace=0.5)
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={protocol: spec}) as sup:
            session = await sup.start_session(protocol, cwd=str(tmp_path))
            await session.prompt(text)
            receipt = await session.cancel()
            assert "respawned" in receipt.escalation, receipt
            assert receipt.resumed is False, receipt
