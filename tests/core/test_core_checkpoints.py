"""The core's side of checkpoints (``supervisor/core/checkpoints.py``), with plain calls: when
a snapshot is asked for, what waits for it, and what never does."""

from __future__ import annotations

import pytest

from coreio import ACP, AcpAgent, RecordingIO, Slot, acp_session
from supervisor.core.checkpoints import REWIND_NOTICE_PATHS, rewind_notice
from supervisor.core.session import SessionCore
from supervisor.core.states import State
from supervisor.errors import Busy

CHANGES = [{"path": "a.txt", "change": "modified"}]


def ready() -> tuple[SessionCore, RecordingIO, AcpAgent]:
    """A session whose agent is up and whose first snapshot is taken."""
    core, io, agent = acp_session(checkpoints=True)
    agent.start()
    assert core.state is State.READY
    assert io.checkpoints == [("baseline",)]
    core.baseline_taken(None)
    io.checkpoints.clear()
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


def _prompts(io: RecordingIO) -> list[str]:
    """The text of each ``session/prompt`` the agent was sent."""
    return [
        "".join(block["text"] for block in m["params"]["prompt"])
        for m in io.sent
        if m.get("method") == "session/prompt"
    ]


def _rewound_then_prompted(core: SessionCore, io: RecordingIO, agent: AcpAgent) -> None:
    core.prompt("edit", ())
    core.checkpoint_taken("t1", None)
    agent.answer()
    agent.end_turn()
    core.turn_changes("t1", CHANGES, None)
    core.rewind("t1", Slot())
    core.rewound("t1", "r1", {"restored": ["a.txt", "b/c.txt"], "not_restored": []}, None)
    core.prompt("go on", ())
    core.checkpoint_taken("t2", None)
    agent.answer()


def test_the_next_prompt_after_a_rewind_tells_the_agent_which_files_were_restored() -> None:
    core, io, agent = ready()
    _rewound_then_prompted(core, io, agent)
    assert _prompts(io)[-1] == (
        "[The user rewound the files to how they were before t1: a.txt, b/c.txt were restored;"
        " your changes to them since are undone. Read them again before relying on them.]\n\n"
        "go on"
    )
    started = [e for e in io.events if e.kind == "turn.started"]
    assert started[-1].text == "go on"  # clients see what the user said
    # Told once: the prompt after it is the user's text alone.
    agent.end_turn()
    core.turn_changes("t2", [], None)
    core.prompt("and then", ())
    core.checkpoint_taken("t3", None)
    assert _prompts(io)[-1] == "and then"


def test_a_rewind_notice_names_a_bounded_number_of_paths_and_an_undo_as_a_rewind() -> None:
    paths = ["x" * 300] + [f"f{n}.txt" for n in range(REWIND_NOTICE_PATHS + 5)]
    notice = rewind_notice("r2", paths)
    assert notice.startswith("[The user rewound the files to how they were before the rewind r2:")
    assert "x" * 200 + "..., f0.txt" in notice and "x" * 201 not in notice
    assert "f8.txt and 6 more were restored" in notice and "f9.txt" not in notice


def test_tell_rewind_off_leaves_the_prompt_as_typed() -> None:
    core, io, agent = acp_session(ACP.with_options(tell_rewind=False), checkpoints=True)
    agent.start()
    core.baseline_taken(None)
    _rewound_then_prompted(core, io, agent)
    assert _prompts(io)[-1] == "go on"


def test_the_first_snapshot_is_taken_as_the_session_starts_and_the_first_turn_waits_for_it() -> (
    None
):
    """Its start snapshot is then an incremental one, and still the state at its start."""
    core, io, agent = acp_session(checkpoints=True)
    core.start()
    assert io.checkpoints == [("baseline",)]  # beside the agent's start, not after it
    agent.come_up()
    handle = core.prompt("edit", ())
    assert not handle.queued
    assert io.checkpoints == [("baseline",)] and core.turn is None and not prompt_sent(io)
    core.baseline_taken(None)
    assert io.checkpoints[-1] == ("checkpoint", "t1") and not prompt_sent(io)
    core.checkpoint_taken("t1", None)
    agent.answer()
    assert core.turn_id == "t1" and prompt_sent(io)
    assert "error" not in io.kinds()


def test_a_cancel_never_waits_for_the_first_snapshot() -> None:
    core, io, agent = acp_session(checkpoints=True)
    agent.start()
    core.prompt("edit", ())
    core.prompt("behind it", ())
    slot = Slot()
    core.cancel(None, "user", slot)
    receipt = slot.receipt  # at once
    assert (receipt.turn_id, receipt.outcome) == ("t1", "cancelled")
    assert [p.turn_id for p in receipt.dropped_prompts] == ["t2"]
    core.baseline_taken(None)  # comes later: nothing waits for it any more
    assert io.checkpoints == [("baseline",)] and not prompt_sent(io)


def test_a_failed_first_snapshot_is_said_once_and_the_first_turn_tries_again() -> None:
    core, io, agent = acp_session(checkpoints=True)
    agent.start()
    core.prompt("edit", ())
    core.baseline_taken("no space left on the checkpoint store's disk (/s): git add failed")
    [said] = [e for e in io.events if getattr(e, "code", None) == "checkpoint_failed"]
    assert said.message == (
        "the working directory cannot be checkpointed: no space left on the checkpoint"
        " store's disk (/s): git add failed (each turn's start tries again)"
    )
    assert io.checkpoints[-1] == ("checkpoint", "t1")
    core.checkpoint_taken("t1", None)
    agent.answer()
    assert core.turn_id == "t1" and core.checkpoints.has("t1")


def test_a_rewind_does_not_wait_for_the_first_snapshot_but_a_starting_turn_refuses_it() -> None:
    """A session revived from the store may be rewound to a turn of before at once (the
    shell's restore takes the store after the first snapshot); not while a prompt was told
    it runs."""
    core, io, agent = acp_session(checkpoints=True)
    core.checkpoints.seed(["t9"])
    agent.start()
    core.prompt("edit", ())
    with pytest.raises(Busy, match="turn t1's start under way"):
        core.rewind("t9", Slot())
    core.cancel(None, "user", Slot())
    slot = Slot()
    core.rewind("t9", slot)
    assert io.checkpoints == [("baseline",), ("rewind", "t9", "r1")]
    core.baseline_taken(None)
    core.rewound("t9", "r1", {"restored": ["a.txt"], "not_restored": []}, None)
    assert slot.value["undo"] == "r1"
