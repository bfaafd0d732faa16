"""The cancel ladder (``supervisor/core/ladder.py``) by plain calls: each rung writes its step,
and the receipt says exactly what the stop took."""

from __future__ import annotations

from coreio import Slot
from helpers import KILLED_HARD
from protocols.machine import TurnFinished
from supervisor.core.ladder import CancelJob
from supervisor.receipt import DroppedPrompt


def job(*, permissions: bool = False, grace_s: float = 3.0) -> CancelJob:
    return CancelJob.begin(
        "t1", 10.0, "user", grace_s, [Slot()], permissions=permissions, keep_queue=False
    )


def test_the_first_rung_is_the_interrupt_and_the_grace() -> None:
    plain, with_permissions = job(), job(permissions=True)
    assert plain.escalation == ["interrupt"] and plain.deadline == 13.0
    assert with_permissions.escalation == ["interrupt", "permissions_cancelled"]


def test_a_turn_ended_in_time_is_cancelled_unless_the_agent_says_it_finished() -> None:
    stopped = job()
    stopped.turn_ended(TurnFinished("t1", "end_turn", interrupted=None), 10.5)
    assert stopped.outcome == "cancelled"  # agents answer a cancelled turn with end_turn
    finished = job()
    finished.turn_ended(TurnFinished("t1", "end_turn", interrupted=False), 10.5)
    assert finished.outcome == "completed"
    failed = job()
    failed.turn_ended(TurnFinished("t1", None, interrupted=False, error="boom"), 10.5)
    assert (failed.outcome, failed.stop_reason, failed.error) == ("cancelled", "error", "boom")


def test_the_kill_rungs_in_order_then_the_receipt() -> None:
    ladder = job()
    ladder.grace_expired(13.0)
    ladder.killed(["sigterm", "sigkill"], 13.1)
    ladder.respawned(13.2)
    ladder.respawned(13.22)  # a fresh retry after a refused resume is the same step
    ladder.resumed_as(True, 13.25)
    receipt = ladder.receipt("s1", "killed", 13.2504)
    assert receipt.escalation == KILLED_HARD
    assert (receipt.outcome, receipt.stop_reason, receipt.resumed) == ("killed", "killed", True)
    assert receipt.elapsed_ms == 3250.4 and receipt.grace_s == 3.0
    # when each rung was reached, in ms after the cancel began (the kill's steps at its end)
    assert receipt.timeline == {
        "interrupt": 0.0,
        "grace_expired": 3000.0,
        "sigterm": 3100.0,
        "sigkill": 3100.0,
        "respawned": 3200.0,
        "resumed": 3250.0,
    }


def test_respawned_with_nothing_to_resume_is_a_fresh_session() -> None:
    ladder = job()
    ladder.grace_expired(13.0)
    ladder.respawned(13.1)
    ladder.resumed_as(None, 13.2)
    assert ladder.resumed is False and "resumed" not in ladder.escalation


def test_what_outlived_sigkill_is_listed_and_nothing_resumed() -> None:
    ladder = job()
    survivor = {"pid": 7, "command": "sleep"}
    ladder.grace_expired(13.0)
    ladder.tree_survived([survivor])
    ladder.session_failed("its tree outlived SIGKILL")
    receipt = ladder.receipt("s1", "killed", 14.0)
    assert receipt.survivors == [survivor] and receipt.resumed is None
    assert receipt.session_failed == "its tree outlived SIGKILL"


def test_tools_left_running_are_swept_and_said() -> None:
    ladder = job()
    ladder.interrupt_answered(10.001)
    ladder.turn_ended(TurnFinished("t1", "cancelled", interrupted=True), 10.25)
    ladder.tools_swept([{"pid": 9, "command": "npm test"}], [], 10.5)
    receipt = ladder.receipt("s1", "cancelled", 10.5)
    assert receipt.escalation == ["interrupt", "tools_killed"]
    assert receipt.timeline == {
        "interrupt": 0.0,
        "interrupt_answered": 1.0,
        "turn_ended": 250.0,
        "tools_killed": 500.0,
    }
    assert receipt.details["tool_processes_killed"] == [{"pid": 9, "command": "npm test"}]


def test_a_stop_that_had_to_kill_says_killed() -> None:
    polite, forced = job(), job()
    assert polite.closed([], [], 11.0) == "cancelled"
    assert forced.closed(["sigterm"], [], 11.0) == "killed"
    assert forced.timeline == {"interrupt": 0.0, "sigterm": 1000.0}
    assert forced.stop_reason == "session_stopped" and forced.escalation[-1] == "sigterm"


def test_joining_cancels_share_the_receipt_and_list_what_they_dropped() -> None:
    ladder = CancelJob.begin("t1", 0.0, "stalled", 3.0, [], permissions=False, keep_queue=True)
    late = Slot()
    ladder.join(late, [DroppedPrompt("t2", "next")])
    assert not ladder.queue_kept and ladder.dropped == [DroppedPrompt("t2", "next")]
    receipt = ladder.receipt("s1", "cancelled", 1.0)
    ladder.answer(receipt)
    assert late.value is receipt
