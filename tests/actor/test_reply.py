"""The one-shot reply slot of the session actor, and the supervisor's GC policy."""

from __future__ import annotations

import gc

import pytest
import trio
import trio.testing

from supervisor import supervisor as supervisor_module
from supervisor.runtime.reply import Reply


async def test_answer_reaches_a_waiting_caller() -> None:
    reply: Reply[int] = Reply()
    got: list[int] = []

    async def caller() -> None:
        got.append(await reply.wait())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await trio.testing.wait_all_tasks_blocked()
        reply.resolve(7)
        reply.resolve(8)  # answered exactly once: later answers are ignored
    assert got == [7]


async def test_answer_given_before_the_wait() -> None:
    reply: Reply[str] = Reply()
    reply.resolve("early")
    assert reply.done
    assert await reply.wait() == "early"


async def test_failure_is_raised_in_the_caller() -> None:
    reply: Reply[int] = Reply()
    reply.fail(ValueError("no"))
    with pytest.raises(ValueError, match="no"):
        await reply.wait()


async def test_a_caller_that_goes_away_drops_the_answer() -> None:
    reply: Reply[int] = Reply()
    with trio.CancelScope() as scope:
        scope.cancel()
        await reply.wait()
    assert scope.cancelled_caught
    reply.resolve(1)  # no caller any more: nothing is rescheduled, nothing raises
    assert reply.done


async def test_a_cancelled_wait_raises_cancelled_even_when_answered() -> None:
    reply: Reply[int] = Reply()
    reply.resolve(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await reply.wait()  # a checkpoint like any trio wait
    assert scope.cancelled_caught


def test_gc_policy_applies_once_and_never_lowers_a_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    saved = gc.get_threshold()
    monkeypatch.setattr(supervisor_module, "_gc_policy_applied", False)
    try:
        gc.set_threshold(100_000, saved[1], saved[2])
        assert supervisor_module.apply_gc_policy()
        assert gc.get_threshold()[0] == 100_000  # the application's own, higher, is kept
        assert gc.get_freeze_count() > 0
        assert not supervisor_module.apply_gc_policy()  # once per process

        monkeypatch.setattr(supervisor_module, "_gc_policy_applied", False)
        gc.set_threshold(700, saved[1], saved[2])
        assert supervisor_module.apply_gc_policy()
        assert gc.get_threshold()[0] == supervisor_module.GC_GEN0_THRESHOLD

        monkeypatch.setattr(supervisor_module, "_gc_policy_applied", False)
        gc.disable()
        try:
            assert not supervisor_module.apply_gc_policy()  # the application turned it off
        finally:
            gc.enable()
    finally:
        gc.set_threshold(*saved)
