"""The core tells its owner of each stopped turn once, with the receipt its callers get
(``SessionIO.stopped``: the supervisor's recent stops, ``supervisor/stops.py``), and of
nothing else: not a turn that completed or failed, not a dropped prompt, not a cancel with no
turn to stop."""

from __future__ import annotations

from coreio import ACP, Slot, acp_session
from supervisor.core.exit import ExitStatus


def test_each_stopped_turn_is_told_once_with_its_receipt() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("first", ())
    agent.answer()
    agent.end_turn()  # completed: no stop
    nothing = Slot()
    core.cancel(None, "user", nothing)  # no turn: no stop
    assert nothing.receipt.outcome == "no_active_turn" and io.stops == []

    core.prompt("second", ())
    agent.answer()
    assert core.prompt("queued", ()).queued
    cancelled = Slot()
    core.cancel(None, "user", cancelled)
    agent.end_turn("cancelled")
    # The running turn's receipt, not the dropped prompt's (that turn never ran).
    assert io.stops == [cancelled.receipt]
    assert [p.turn_id for p in cancelled.receipt.dropped_prompts] == ["t3"]

    core.prompt("ignored", ())
    agent.answer()
    io.clock = 10.0
    killed = Slot()
    core.cancel(None, "user", killed)
    io.clock = 10.0 + ACP.grace_s
    core.deadline_passed()
    core.life.kill_done(["sigterm"], [])
    agent.come_up()
    assert killed.receipt.outcome == "killed"
    assert io.stops == [cancelled.receipt, killed.receipt]

    core.prompt("crashes", ())
    agent.answer()
    core.life.agent_gone(2, ExitStatus(code=1, signal=None), [], [], [])  # failed: no stop
    assert len(io.stops) == 2


def test_the_watchdogs_stop_is_told_too() -> None:
    core, io, agent = acp_session(ACP.with_options(stall_s=30.0))
    agent.start()
    core.prompt("think", ())
    agent.answer()
    io.clock = 30.0
    core.deadline_passed()
    io.clock = 30.5
    agent.end_turn("cancelled")
    [stop] = io.stops
    assert (stop.outcome, stop.reason, stop.elapsed_ms) == ("cancelled", "stalled", 500.0)
