"""The operator's pause on the pure core (``supervisor/core/pause.py``): no turn starts while it
holds, the running turn goes on (or is stopped through the ladder at the deadline, ``reason:
"paused"``), and the resume starts what waited, in order.
"""

from __future__ import annotations

import math

from coreio import ACP, AcpAgent, RecordingIO, Slot, acp_session
from helpers import KILLED
from protocols import events as ev
from supervisor.core.pause import Pause
from supervisor.core.session import SessionCore
from supervisor.core.states import State

GRACE = ACP.grace_s


def held_events(io: RecordingIO) -> list[ev.SessionHeld]:
    return [e for e in io.events if isinstance(e, ev.SessionHeld)]


def started(io: RecordingIO) -> list[str]:
    return [e.turn_id for e in io.events if isinstance(e, ev.TurnStarted)]


def prompts_sent(io: RecordingIO) -> int:
    return sum(1 for m in io.sent if m.get("method") == "session/prompt")


def test_a_paused_session_queues_every_prompt_and_says_it_is_held() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.pause(math.inf)
    assert core.held == "paused"
    first = core.prompt("one", ())
    second = core.prompt("two", ())
    agent.answer()
    assert (first.id, first.queued, first.held) == ("t1", True, "paused")
    assert (second.id, second.queued, second.held) == ("t2", True, "paused")
    assert core.state is State.READY and core.turn is None and prompts_sent(io) == 0
    [held] = held_events(io)
    assert (held.held, held.deadline_s, held.queued) == ("paused", None, 0)


def test_the_resume_runs_what_waited_in_order_one_turn_at_a_time() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.pause(math.inf)
    for text in ("one", "two", "three"):
        core.prompt(text, ())
    core.resume()
    agent.answer()
    assert core.held is None and core.turn_id == "t1" and core.state is State.RUNNING
    released = held_events(io)[-1]
    assert (released.held, released.queued) == (None, 3)
    assert list(agent.prompts.values()) == ["one"]  # one at a time, as always
    agent.end_turn()
    agent.end_turn()
    agent.end_turn()
    assert started(io) == ["t1", "t2", "t3"] and core.state is State.READY
    assert [e.outcome for e in io.ended_turns()] == ["completed"] * 3


def test_a_running_turn_goes_on_and_ends_by_itself_and_nothing_starts_after_it() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("long job", ())
    agent.answer()
    core.pause(math.inf)
    waiting = core.prompt("after it", ())
    assert waiting.queued and waiting.held == "paused"
    assert core.next_deadline() == ACP.stall_s  # the watchdog's: the pause has no deadline
    agent.say("still ")
    agent.end_turn()
    assert core.state is State.READY and core.turn is None and started(io) == ["t1"]
    [ended] = io.ended_turns()
    assert (ended.turn_id, ended.outcome) == ("t1", "completed")
    core.resume()
    assert core.turn_id == "t2"


def test_at_the_deadline_a_running_turn_is_cancelled_with_reason_paused() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("long job", ())
    agent.answer()
    io.clock = 100.0
    core.pause(130.0)
    core.prompt("held", ())
    assert core.next_deadline() == 130.0
    assert held_events(io)[-1].deadline_s == 30.0
    io.clock = 129.999
    core.deadline_passed()
    assert core.state is State.RUNNING  # not yet
    io.clock = 130.0
    core.deadline_passed()
    assert core.state is State.CANCELLING
    assert io.sent[-1]["method"] == "session/cancel"  # the ladder's first rung
    io.clock = 130.2
    agent.end_turn("cancelled")
    [ended] = io.ended_turns()
    assert (ended.turn_id, ended.outcome, ended.reason) == ("t1", "cancelled", "paused")
    assert ended.receipt is not None and ended.receipt["reason"] == "paused"
    assert ended.receipt["escalation"] == ["interrupt"] and ended.receipt["dropped_prompts"] == []
    # the held prompt was kept, and waits for the resume
    assert core.state is State.READY and core.turn is None and list(core.queue) == [("t2", "held")]
    core.resume()
    assert core.turn_id == "t2"


def test_an_agent_that_ignores_the_deadlines_interrupt_is_killed_after_its_grace() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("wedged", ())
    agent.answer()
    core.pause(10.0)
    io.clock = 10.0
    core.deadline_passed()
    assert core.next_deadline() == 10.0 + GRACE
    io.clock = 10.0 + GRACE
    core.deadline_passed()
    assert io.kills == [1]
    core.life.kill_done(["sigterm"], [])
    agent.prompts.clear()
    agent.come_up()
    [ended] = io.ended_turns()
    assert ended.outcome == "killed" and ended.reason == "paused"
    assert ended.receipt is not None and ended.receipt["escalation"] == KILLED
    # the agent is back, the pause still holds: nothing starts
    assert core.state is State.READY and core.turn is None and core.held == "paused"


def test_a_deadline_already_passed_cancels_at_once() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("long job", ())
    agent.answer()
    io.clock = 5.0
    core.pause(5.0)  # deadline_s 0: stop what runs now
    assert core.state is State.CANCELLING and io.sent[-1]["method"] == "session/cancel"


def test_pause_and_resume_are_idempotent_and_a_deadline_only_comes_forward() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("job", ())
    agent.answer()
    core.pause(math.inf)
    core.pause(math.inf)
    assert len(held_events(io)) == 1
    core.pause(60.0)  # brought forward: said
    core.pause(90.0)  # pushed back: not taken
    assert [e.deadline_s for e in held_events(io)] == [None, 60.0]
    assert core.paused.deadline == 60.0
    core.resume()
    core.resume()
    assert [e.held for e in held_events(io)] == ["paused", "paused", None]
    assert core.next_deadline() == ACP.stall_s  # released: the pause's deadline is gone
    core.resume()
    assert len(held_events(io)) == 3


def test_a_session_started_paused_says_so_first_and_holds_its_first_prompt() -> None:
    io = RecordingIO()
    core = SessionCore("s1", ACP, cwd="/w", io=io, max_queued=4, paused=Pause(held=True))
    agent = AcpAgent(core, io)
    agent.start()
    assert core.state is State.READY
    assert isinstance(io.events[0], ev.SessionHeld) and io.events[0].held == "paused"
    handle = core.prompt("first", ())
    assert handle.queued and handle.held == "paused" and core.turn is None
    core.resume()
    agent.answer()
    assert core.turn_id == "t1"


def test_a_prompt_queued_while_starting_waits_for_the_resume_not_for_ready() -> None:
    core, io, agent = acp_session()
    core.start()
    core.pause(math.inf)
    core.prompt("early", ())
    agent.come_up()
    assert core.state is State.READY and core.turn is None and prompts_sent(io) == 0


def test_a_steer_with_no_turn_is_held_first_in_the_queue() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.pause(math.inf)
    core.prompt("queued first", ())
    slot = Slot()
    core.steer("look here", slot)
    result = slot.value
    assert (result.mode, result.turn_id, result.held) == ("started", "t2", "paused")
    assert core.turn is None
    core.resume()
    agent.answer()
    assert core.turn_id == "t2"  # the steer goes ahead of the prompt, as always


def test_a_steer_that_interrupts_the_running_turn_holds_its_text_until_the_resume() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("job", ())
    agent.answer()
    core.pause(math.inf)
    core.prompt("queued", ())
    slot = Slot()
    core.steer("this instead", slot)  # the fake cannot steer: the turn makes way
    assert core.state is State.CANCELLING
    agent.end_turn("cancelled")
    result = slot.value
    assert (result.mode, result.turn_id, result.held) == ("interrupted", "t3", "paused")
    assert result.receipt is not None and result.receipt.reason == "steer"
    assert core.state is State.READY and core.turn is None
    assert [turn_id for turn_id, _ in core.queue] == ["t3", "t2"]
    core.resume()
    assert core.turn_id == "t3"


def test_a_callers_cancel_during_a_pause_drops_the_held_prompts_as_ever() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.pause(math.inf)
    core.prompt("one", ())
    core.prompt("two", ())
    slot = Slot()
    core.cancel(None, "user", slot)
    assert slot.receipt.outcome == "no_active_turn"
    assert [p.turn_id for p in slot.receipt.dropped_prompts] == ["t1", "t2"]
    assert not core.queue


def test_a_pause_of_an_ended_session_is_nothing() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.life.stop(Slot())
    core.life.closed(None, [], [])
    core.pause(math.inf)
    core.resume()
    assert held_events(io) == [] and core.state is State.STOPPED


def test_a_deadline_that_passes_during_a_stop_is_not_a_deadline_of_the_core() -> None:
    core, io, agent = acp_session()
    agent.start()
    core.prompt("job", ())
    agent.answer()
    core.life.stop(Slot())  # the stop ends the turn with the agent: nothing for the pause to do
    core.pause(5.0)
    io.clock = 10.0
    assert core.next_deadline() > io.clock  # else the actor would wake for it, at once, again
    sent = len(io.sent)
    core.deadline_passed()
    assert len(io.sent) == sent and core.turn is not None and core.turn.cancel is None
