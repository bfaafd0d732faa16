"""The queue of prompts and the steers that go ahead of it (``supervisor/core/turns.py``)."""

from __future__ import annotations

import pytest

from supervisor.core.turns import ENDED_TURNS_KEPT, EndedTurns, PromptQueue, TurnIds
from supervisor.errors import BadRequest
from supervisor.receipt import CancelReceipt, DroppedPrompt


def test_steered_turns_go_ahead_of_prompts_in_the_order_they_came() -> None:
    queue = PromptQueue(limit=8)
    queue.put("t1", "first prompt")
    queue.put_steered("t2", "steer a")
    queue.put("t3", "second prompt")
    queue.put_steered("t4", "steer b")
    queue.put_steered_first([("t5", "left by a turn"), ("t6", "and another")])
    assert [turn_id for turn_id, _ in queue] == ["t5", "t6", "t2", "t4", "t1", "t3"]
    assert queue.take_next() == ("t5", "left by a turn")


def test_the_queue_is_bounded_and_a_cancel_can_take_one_out() -> None:
    queue = PromptQueue(limit=2)
    queue.put("t1", "a")
    queue.keep_parts("t1", ())
    queue.put("t2", "b")
    with pytest.raises(BadRequest, match="at most 2"):
        queue.check_room()
    assert queue.take("t2") == DroppedPrompt("t2", "b")
    assert queue.take("t9") is None
    assert queue.take_all() == [DroppedPrompt("t1", "a")] and not queue


def test_ids_are_never_reused_and_old_endings_are_forgotten_in_order() -> None:
    ids = TurnIds()
    assert [ids.next() for _ in range(3)] == ["t1", "t2", "t3"]
    ended = EndedTurns()
    for n in range(ENDED_TURNS_KEPT + 1):
        ended.remember(f"t{n}", CancelReceipt(session_id="s", turn_id=f"t{n}", outcome="completed"))
    assert ended.get("t0") is None and ended.get(f"t{ENDED_TURNS_KEPT}") is not None
