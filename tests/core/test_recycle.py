"""When an agent is restarted though nobody asked (``supervisor/core/recycle.py``)."""

from __future__ import annotations

from supervisor.core.recycle import MAX_MEMORY_RESTARTS, Recycler


def test_failed_turns_in_a_row_recycle_and_a_good_one_resets_the_count() -> None:
    recycler = Recycler(max_failed_turns=3, max_memory_mb=None)
    assert not recycler.turn_ended_by_itself(failed=True)
    assert not recycler.turn_ended_by_itself(failed=False)  # reset
    assert not recycler.turn_ended_by_itself(failed=True)
    assert not recycler.turn_ended_by_itself(failed=True)
    assert recycler.turn_ended_by_itself(failed=True)
    assert recycler.failing_reason("boom") == "3 turns failed in a row; the last: boom"
    assert recycler.recycled("boom") == 3
    assert (recycler.recycles, recycler.reason, recycler.failed_in_a_row) == (1, "boom", 0)


def test_zero_turns_means_never() -> None:
    recycler = Recycler(max_failed_turns=0, max_memory_mb=None)
    assert not any(recycler.turn_ended_by_itself(failed=True) for _ in range(10))


def test_a_stopped_turn_says_nothing_of_the_agents_health() -> None:
    recycler = Recycler(max_failed_turns=2, max_memory_mb=None)
    recycler.turn_ended_by_itself(failed=True)
    recycler.turn_stopped()
    assert not recycler.turn_ended_by_itself(failed=True)


def test_memory_restarts_give_up_after_the_limit_with_no_turn_in_between() -> None:
    recycler = Recycler(max_failed_turns=3, max_memory_mb=512)
    for _ in range(MAX_MEMORY_RESTARTS):
        verdict = recycler.over_memory(900.0)
        assert not verdict.give_up and recycler.due == verdict.reason
        recycler.recycled(verdict.reason)
    assert "900 MB (max_memory_mb 512)" in verdict.reason
    assert recycler.over_memory(900.0).give_up
    # a turn that ended by itself in between: the agent can work within its limit
    other = Recycler(max_failed_turns=3, max_memory_mb=512)
    for _ in range(MAX_MEMORY_RESTARTS * 2):
        assert not other.over_memory(900.0).give_up
        other.turn_ended_by_itself(failed=False)
