"""The core's side of checkpoints (``supervisor/core/checkpoints.py``), with plain calls: when
a snapshot is asked for, what waits for it, and what never does."""

from __future__ import annotations

import pytest

from coreio import AcpAgent, RecordingIO, Slot, acp_session
from supervisor.core.session import SessionCore
from supervisor.core.states import State
from supervisor.errors import Busy

CHANGES = [{"path": "a.txt", "change": "modified"}]


def ready() -> tuple[SessionCore, RecordingIO, AcpAgent]:
    core, io, agent = acp_session(checkpoints=True)
    agent.start()
    assert core.state is State.READY
    return core, io, agent


def prompt_sent(io: RecordingIO) -> bool:
    return any(message.get("method") == "session/prompt" for message in io.sent)


def test_a_turn_starts_only_once_its_checkpoint_is_taken() -> None:
    core, io, agent = ready()
    handle = core.prompt("edit", ())
    assert not handle.queued
    assert io.checkpoints == [("checkpoint", "t1")]
    assert core.turn is None and not prompt_sent(io)  # the agent has not got it yet
    core.checkpoint_taken("t1", None)
    agent.answer()
    assert core.turn_id == "t1" and core.state is State.RUNNING and prompt_sent(io)


@pytest.mark.parametrize("named", [False, True], ids=["the-running-turn", "by-its-id"])
def test_a_cancel_never_waits_for_a_checkpoint(named: bool) -> None:
    """The caller was told its prompt runs (not queued): a cancel stops it as the turn it is,
    at once, nothing interrupted; one ``turn.ended``, ``cancelled``."""
    core, io, _agent = ready()
    core.prompt("edit", ())
    core.prompt("behind it", ())
    slot = Slot()
    core.cancel("t1" if named else None, "user", slot)
    receipt = slot.receipt  # at once
    assert (receipt.outcome, receipt.turn_id, receipt.stop_reason) == (
        "cancelled",
        "t1",
        "cancelled",
    )
    assert receipt.escalation == [] and receipt.elapsed_ms == 0.0
    # A cancel of the turn drops what waits behind it; one naming the turn leaves it queued.
    assert [p.turn_id for p in receipt.dropped_prompts] == ([] if named else ["t2"])
    ended = {e.turn_id: e for e in io.ended_turns()}
    assert (ended["t1"].outcome, ended["t1"].stop_reason) == ("cancelled", "cancelled")
    assert ("t2" in ended) is not named
    core.checkpoint_taken("t1", None)  # comes later: t1 never starts
    assert not prompt_sent(io)
    if named:  # the prompt behind it is next, with its own checkpoint
        assert io.checkpoints[-1] == ("checkpoint", "t2")
        core.checkpoint_taken("t2", None)
        assert core.turn_id == "t2"
    else:
        assert core.turn is None


def test_a_stopped_turns_end_and_receipt_wait_for_its_changes_and_carry_them() -> None:
    core, io, agent = ready()
    core.prompt("edit", ())
    core.checkpoint_taken("t1", None)
    agent.answer()
    slot = Slot()
    core.cancel("t1", "user", slot)
    agent.end_turn("cancelled")
    assert core.state is State.READY and slot.answers == 0 and io.ended_turns() == []
    assert io.checkpoints[-1] == ("turn_changes", "t1")
    core.turn_changes("t1", CHANGES, None)
    [ended] = io.ended_turns()
    assert ended.changes == CHANGES
    assert ended.receipt is not None and ended.receipt["changes"] == CHANGES
    assert slot.receipt.changes == CHANGES


def test_a_queued_turn_waits_for_the_last_turns_changes_then_its_own_checkpoint() -> None:
    core, io, agent = ready()
    core.prompt("edit", ())
    core.checkpoint_taken("t1", None)
    agent.answer()
    assert core.prompt("next", ()).queued
    agent.end_turn()
    assert core.turn is None and io.checkpoints[-1] == ("turn_changes", "t1")
    core.turn_changes("t1", [], None)
    assert io.checkpoints[-1] == ("checkpoint", "t2") and core.turn is None
    core.checkpoint_taken("t2", None)
    assert core.turn_id == "t2"


def test_a_rewind_is_refused_while_a_turn_runs_and_is_itself_a_checkpoint() -> None:
    core, io, agent = ready()
    core.prompt("edit", ())
    core.checkpoint_taken("t1", None)
    agent.answer()
    with pytest.raises(Busy, match="turn t1 runs"):
        core.rewind("t1", Slot())
    agent.end_turn()
    with pytest.raises(Busy, match="checkpoint"):  # its changes are being taken
        core.rewind("t1", Slot())
    core.turn_changes("t1", CHANGES, None)
    slot = Slot()
    core.rewind("t1", slot)
    assert io.checkpoints[-1] == ("rewind", "t1", "r1")
    core.rewound("t1", "r1", {"restored": ["a.txt"], "not_restored": []}, None)
    assert slot.value == {"restored": ["a.txt"], "not_restored": [], "turn_id": "t1", "undo": "r1"}
    assert io.kinds()[-1] == "session.rewound"
    core.rewind("r1", Slot())  # the rewind's own state may be gone back to
    assert io.checkpoints[-1] == ("rewind", "r1", "r2")


def test_a_failed_checkpoint_is_said_and_the_turn_runs_without_one() -> None:
    core, io, agent = ready()
    core.prompt("edit", ())
    core.checkpoint_taken("t1", "the working directory /w is gone")
    agent.answer()
    assert core.turn_id == "t1"
    assert "checkpoint_failed" in [getattr(e, "code", None) for e in io.events]
    agent.end_turn()
    [ended] = io.ended_turns()  # no changes to wait for
    assert ended.changes is None
