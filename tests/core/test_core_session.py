"""The session core by plain calls: section 4 of the brief with no trio, no process, no clock
but a number.

Each test walks a :class:`~supervisor.core.session.SessionCore` through a session's life with
an ACP agent made of plain calls (``coreio.py``), and asserts what the core asked of its port
and answered its callers, to the exact virtual time.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from coreio import ACP, AcpAgent, RecordingIO, Slot, acp_session
from helpers import KILLED
from protocols import PROTOCOLS
from protocols import events as ev
from protocols.acp import AcpClient
from protocols.machine import RestartWanted, Step, TurnFinished
from protocols.terminal import TerminalSettings
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus
from supervisor.core.session import SessionCore
from supervisor.core.states import State
from supervisor.errors import AgentNotRunning, BadRequest

GRACE = ACP.grace_s


def running_turn() -> tuple[SessionCore, RecordingIO, AcpAgent]:
    core, io, agent = acp_session()
    agent.start()
    assert core.state is State.READY
    handle = core.prompt("hello", ())
    agent.answer()
    assert handle.id == "t1" and not handle.queued and core.state is State.RUNNING
    agent.say("Hi ")
    return core, io, agent


def test_a_session_comes_up_ready_and_a_prompt_runs_to_its_end() -> None:
    core, io, agent = running_turn()
    agent.end_turn()
    assert core.state is State.READY and core.turn is None
    assert io.states() == ["ready", "running", "ready"]
    [ended] = io.ended_turns()
    assert (ended.turn_id, ended.outcome, ended.stop_reason) == ("t1", "completed", "end_turn")
    assert [e.seq for e in io.events] == list(range(1, len(io.events) + 1))


def test_a_cooperative_cancel_is_answered_once_the_turn_ended() -> None:
    core, io, agent = running_turn()
    io.clock = 10.0
    slot = Slot()
    core.cancel(None, "user", slot)
    # at once: the interrupt went out, the grace races the turn's end
    assert io.sent[-1] == {
        "jsonrpc": "2.0",
        "method": "session/cancel",
        "params": {"sessionId": "S1"},
    }
    assert core.state is State.CANCELLING and slot.answers == 0
    assert core.next_deadline() == 10.0 + GRACE
    io.clock = 10.25
    agent.end_turn("cancelled")
    receipt = slot.receipt
    assert (receipt.outcome, receipt.escalation, receipt.stop_reason) == (
        "cancelled",
        ["interrupt"],
        "cancelled",
    )
    assert receipt.elapsed_ms == 250.0 and receipt.reason == "user"
    # ACP's interrupt is a notification: its delivery is never known, only the turn's end
    assert receipt.timeline == {"interrupt": 0.0, "turn_ended": 250.0}
    assert core.state is State.READY and core.next_deadline() == math.inf
    # the turn.ended carries the receipt and comes before the answer (one, for the one turn)
    [ended] = io.ended_turns()
    assert ended.receipt is not None and ended.receipt["outcome"] == "cancelled"


def test_an_agent_that_ignores_the_interrupt_is_killed_at_the_grace_and_resumed() -> None:
    core, io, agent = running_turn()
    io.clock = 100.0
    slot = Slot()
    core.cancel(None, "user", slot)
    io.clock = 100.0 + GRACE - 0.001
    core.deadline_passed()  # not yet
    assert io.kills == []
    io.clock = 100.0 + GRACE
    core.deadline_passed()
    assert io.kills == [1] and core.live_generation is None
    assert io.states()[-1] == "cancelling"
    io.clock += 0.05
    core.life.kill_done(["sigterm"], [])
    assert io.spawns[-1] == (2, "S1")  # the next process resumes the agent's session
    io.clock += 0.2
    agent.come_up()  # initialize, then session/load of S1
    assert [m["method"] for m in io.sent[-2:] if "method" in m] == ["initialize", "session/load"]
    receipt = slot.receipt
    assert receipt.outcome == "killed" and receipt.resumed is True
    assert receipt.escalation == KILLED
    assert receipt.elapsed_ms == pytest.approx(GRACE * 1000 + 250.0)
    # each rung at the time it was reached, in ms after the cancel
    assert receipt.timeline == pytest.approx(
        {
            "interrupt": 0.0,
            "grace_expired": GRACE * 1000,
            "sigterm": GRACE * 1000 + 50.0,
            "respawned": GRACE * 1000 + 250.0,  # the new process runs: its handshake at once
            "resumed": GRACE * 1000 + 250.0,
        }
    )
    assert core.state is State.READY
    kinds = io.kinds()
    assert kinds.count("turn.ended") == 1 and "agent.exited" in kinds


def test_concurrent_cancels_share_one_receipt() -> None:
    core, io, agent = running_turn()
    first, second = Slot(), Slot()
    core.cancel(None, "user", first)
    core.cancel(None, "user", second)
    agent.end_turn("cancelled")
    assert first.receipt is second.receipt
    assert len(io.ended_turns()) == 1


def test_no_active_turn_is_an_immediate_receipt() -> None:
    core, io, agent = acp_session()
    agent.start()
    slot = Slot()
    core.cancel(None, "user", slot)
    assert slot.receipt.outcome == "no_active_turn" and slot.receipt.turn_id is None


def test_queued_prompts_are_dropped_by_a_cancel_and_listed() -> None:
    core, io, agent = running_turn()
    assert core.prompt("second", ()).queued
    assert core.prompt("third", ()).queued
    slot = Slot()
    core.cancel(None, "user", slot)
    agent.end_turn("cancelled")
    assert [p.turn_id for p in slot.receipt.dropped_prompts] == ["t2", "t3"]
    outcomes = {e.turn_id: (e.outcome, e.stop_reason) for e in io.ended_turns()}
    assert outcomes == {
        "t1": ("cancelled", "cancelled"),
        "t2": ("cancelled", "dropped"),
        "t3": ("cancelled", "dropped"),
    }


def test_a_cancel_naming_an_older_turn_never_stops_the_newer_one() -> None:
    core, io, agent = running_turn()
    agent.end_turn()
    core.prompt("again", ())
    agent.answer()
    slot = Slot()
    core.cancel("t1", "user", slot)
    assert slot.receipt.outcome == "completed" and slot.receipt.turn_id == "t1"
    assert core.state is State.RUNNING and core.turn_id == "t2"
    with pytest.raises(BadRequest, match="unknown turn"):
        core.cancel("t9", "user", Slot())


def test_a_tree_that_outlives_sigkill_fails_the_session_and_says_so() -> None:
    core, io, agent = running_turn()
    slot = Slot()
    core.cancel(None, "user", slot)
    io.clock = GRACE
    core.deadline_passed()
    survivor = {"pid": 4242, "command": "sleep 1000"}
    core.life.kill_done(["sigterm", "sigkill"], [survivor])
    receipt = slot.receipt
    assert receipt.outcome == "killed" and receipt.survivors == [survivor]
    assert receipt.resumed is None and receipt.session_failed is not None
    assert core.state is State.FAILED and io.spawns == [(1, None)]  # nothing started beside it
    with pytest.raises(AgentNotRunning):
        core.prompt("more", ())


def test_the_stall_watchdog_stops_a_silent_turn_through_the_ladder() -> None:
    spec = ACP.with_options(stall_s=300.0)
    io = RecordingIO()
    core = SessionCore("s1", spec, cwd="/w", io=io, max_queued=4)
    agent = AcpAgent(core, io)
    agent.start()
    core.prompt("think", ())
    agent.answer()
    agent.say("a")  # heard at 0
    io.clock = 120.0
    agent.say("b")  # the stream: heard, dated when the core next reads its deadline
    assert core.next_deadline() == 300.0  # not moved by the stream itself
    io.clock = 300.0
    core.deadline_passed()  # looked at: heard at 120, so 420
    assert core.next_deadline() == 420.0 and core.state is State.RUNNING
    io.clock = 420.0
    core.deadline_passed()
    stalled = [e for e in io.events if isinstance(e, ev.TurnStalled)]
    assert [(s.silent_s, s.stall_s) for s in stalled] == [(300.0, 300.0)]
    assert core.state is State.CANCELLING
    agent.end_turn("cancelled")
    [ended] = io.ended_turns()
    assert ended.reason == "stalled" and ended.receipt is not None


def test_an_unexpected_exit_fails_the_turn_and_respawns_resuming() -> None:
    core, io, agent = running_turn()
    core.life.agent_gone(1, ExitStatus(code=1, signal=None), [], [], ["oops"])
    [ended] = io.ended_turns()
    assert ended.outcome == "failed" and "exit 1" in (ended.error or "")
    assert "oops" in (ended.error or "")
    assert io.spawns[-1] == (2, "S1") and core.state is State.STARTING
    agent.come_up()
    assert core.state is State.READY


def test_a_steer_with_no_turn_starts_one_ahead_of_the_queue() -> None:
    core, io, agent = acp_session()
    agent.start()
    slot = Slot()
    core.steer("look here", slot)
    assert slot.value.mode == "started" and slot.value.turn_id == "t1"
    assert core.state is State.RUNNING and core.turn_id == "t1"


def test_a_steer_the_agent_cannot_take_interrupts_the_turn() -> None:
    core, io, agent = running_turn()  # the fake advertises no steering
    slot = Slot()
    core.steer("this instead", slot)
    assert core.state is State.CANCELLING and slot.answers == 0
    agent.end_turn("cancelled")
    result = slot.value
    assert result.mode == "interrupted" and result.turn_id == "t2"
    assert result.receipt is not None and result.receipt.reason == "steer"
    assert core.state is State.RUNNING and core.turn_id == "t2"


def test_a_stop_ends_the_turn_with_the_agent() -> None:
    core, io, agent = running_turn()
    cancel, stop = Slot(), Slot()
    core.life.stop(stop)
    core.cancel(None, "user", cancel)  # meets the stop: answered once the turn ended with it
    assert io.closes == 1 and core.state is State.RUNNING
    core.life.closed(ExitStatus(code=0, signal=None), [], [])
    assert cancel.receipt.outcome == "cancelled"
    assert cancel.receipt.stop_reason == "session_stopped"
    assert stop.value == ExitStatus(code=0, signal=None)
    assert core.state is State.STOPPED and core.done and io.ended_count == 1


def test_calls_of_a_stopped_session_are_refused() -> None:
    core, io, agent = running_turn()
    core.life.stop(Slot())
    core.life.closed(None, [], [])
    refused = Slot()
    core.cancel(None, "user", refused)
    assert isinstance(refused.error, AgentNotRunning)
    with pytest.raises(AgentNotRunning):
        core.prompt("more", ())


class _Unwell(AcpClient):
    """An ACP machine that says only a restart clears its agent's state when a turn ends with
    ``refusal`` (as OpenCode's does after an early abort poisoned its server)."""

    name = "acp-unwell"

    def receive(self, message: dict[str, Any]) -> Step:
        step = super().receive(message)
        if any(isinstance(e, TurnFinished) and e.stop_reason == "refusal" for e in step.events):
            step.events.insert(0, RestartWanted("stuck: only a restart clears it"))
        return step


def test_a_machine_that_wants_a_restart_gets_one_once_its_turn_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(PROTOCOLS, "acp-unwell", _Unwell)
    spec = ACP.with_options(protocol="acp-unwell")
    io = RecordingIO()
    core = SessionCore("s1", spec, cwd="/w", io=io, max_queued=4)
    agent = AcpAgent(core, io)
    agent.start()
    core.prompt("go", ())
    agent.answer()
    core.prompt("next", ())  # queued: it waits for the new process
    agent.end_turn("refusal")
    [ended] = io.ended_turns()
    assert ended.turn_id == "t1"
    [recycled] = [e for e in io.events if isinstance(e, ev.SessionRecycled)]
    assert recycled.reason == "stuck: only a restart clears it" and recycled.failed_turns == 0
    assert io.kills == [1] and core.state is State.STARTING
    core.life.kill_done(["sigterm"], [])
    assert io.spawns[-1] == (2, "S1")  # resumed
    agent.prompts.clear()
    agent.come_up()
    assert core.recycler.recycles == 1 and core.turn_id == "t2"  # the queued prompt runs now


@pytest.mark.parametrize("load_session", [False, True])
def test_a_fresh_agent_session_gets_the_conversation_with_the_next_prompt_once(
    load_session: bool,
) -> None:
    """The core decides, the shell says what was said (``io.said``): an agent that could not
    go on with its session (no ``loadSession``) gets it in front of the next prompt, once; one
    that resumed gets the prompt alone."""
    core, io, agent = running_turn()
    agent.load_session = load_session
    io.said = "(what was said)\n\n"
    core.life.agent_gone(1, ExitStatus(code=1, signal=None), [], [], [])
    agent.come_up()
    for text in ("next", "and after"):
        core.prompt(text, ())
        agent.answer()
        agent.end_turn()
    prompts = [
        m["params"]["prompt"][0]["text"] for m in io.sent if m.get("method") == "session/prompt"
    ]
    started = [e for e in io.events if isinstance(e, ev.TurnStarted)]
    if load_session:
        assert prompts[1:] == ["next", "and after"] and io.conversation_limits == []
        assert [e.context for e in started] == [None, None, None]
        return
    assert prompts[1:] == ["(what was said)\n\nnext", "and after"]
    assert io.conversation_limits == [ACP.context_bytes]
    assert [(e.text, e.context, e.context_bytes) for e in started[1:]] == [
        ("next", "injected", len("(what was said)\n\n")),
        ("and after", None, None),
    ]


def test_a_terminal_agent_s_output_is_progress_for_the_watchdog() -> None:
    """A TUI redrawing (a spinner, a clock) is alive; one that draws nothing is stalled."""
    spec = AgentSpec(
        name="tui",
        protocol="terminal",
        command=("fake-tui",),
        terminal=TerminalSettings(idle_s=0.5),
        stall_s=60.0,
    )
    io = RecordingIO()
    core = SessionCore("s1", spec, cwd="/w", io=io, max_queued=4)
    core.start()
    core.life.spawned(io.spawns[-1][0])
    core.receive({"output": b"> ", "now": 0.0})
    core.receive({"tick": True, "now": 0.5})
    assert core.state is State.READY
    io.clock = 1.0
    core.prompt("think", ())
    assert core.state is State.RUNNING and core.next_deadline() == 61.0
    for second in range(2, 200):  # a spinner, redrawn in place each second: no new line
        io.clock = float(second)
        core.receive({"output": b"\r" + b"|/-\\"[second % 4 : second % 4 + 1], "now": io.clock})
        if io.clock >= core.next_deadline():
            core.deadline_passed()
    assert core.state is State.RUNNING and not any(isinstance(e, ev.TurnStalled) for e in io.events)
    assert not any(isinstance(e, ev.MessageDelta) for e in io.events)  # the spinner says no text
    io.clock = 199.0 + 60.0  # then silent for stall_s
    core.deadline_passed()
    stalled = [e for e in io.events if isinstance(e, ev.TurnStalled)]
    assert [(s.silent_s, s.stall_s) for s in stalled] == [(60.0, 60.0)]
    assert core.state is State.CANCELLING
