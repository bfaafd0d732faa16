"""A session's states: the table walked, and any order of what can happen kept to it.

The table (``supervisor/core/states.py``) is the whole truth of the moves; the core checks each
move against it and raises :class:`IllegalTransition` for one it does not hold. The second
half drives the core with random sequences of calls, agent answers, exits, kills and deadlines
(hypothesis) and checks that no move is illegal and the brief's invariants hold throughout.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coreio import ACP, AcpAgent, RecordingIO, Slot
from protocols import events as ev
from supervisor.core.exit import ExitStatus
from supervisor.core.session import SessionCore
from supervisor.core.states import ENDS, TRANSITIONS, IllegalTransition, State, check_transition
from supervisor.errors import SupervisorError


@pytest.mark.parametrize("old", list(State))
@pytest.mark.parametrize("new", list(State))
def test_every_move_is_in_the_table_or_illegal(old: State, new: State) -> None:
    if new in TRANSITIONS[old]:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransition, match=f"from '{old}' to '{new}'"):
            check_transition(old, new)


def test_the_table_has_a_row_for_every_state_and_the_ends_have_no_way_out() -> None:
    assert set(TRANSITIONS) == set(State)
    for end in ENDS:
        assert TRANSITIONS[end] == frozenset()
    for state in set(State) - ENDS:
        # every living state can end either way
        assert ENDS <= TRANSITIONS[state], state


def test_the_cycle_of_the_brief_is_in_the_table() -> None:
    cycle = [State.STARTING, State.READY, State.RUNNING, State.CANCELLING, State.READY]
    for old, new in zip(cycle, cycle[1:], strict=False):
        check_transition(old, new)


def test_states_are_their_words() -> None:
    assert State.READY == "ready" and f"{State.CANCELLING}" == "cancelling"


# -- any order of what can happen ------------------------------------------------------------

OPERATIONS = st.sampled_from(
    [
        "prompt",
        "cancel",
        "steer",
        "end_turn",
        "end_cancelled",
        "say",
        "crash",
        "deadline",
        "kill_done",
        "come_up",
        "stop",
        "closed",
        "memory",
        "pause",
        "pause_deadline",
        "resume",
    ]
)


class Walk:
    """One session, driven by name; checks the invariants after every step."""

    def __init__(self, grace_s: float) -> None:
        self.io = RecordingIO()
        spec = ACP.with_options(grace_s=grace_s, stall_s=60.0, max_memory_mb=100.0)
        self.core = SessionCore("s1", spec, cwd="/w", io=self.io, max_queued=3)
        self.agent = AcpAgent(self.core, self.io)
        self.cancels: list[Slot] = []
        self.steers: list[Slot] = []
        self.stops: list[Slot] = []
        self.kills_done = 0
        self.closed = False
        self.agent.start()

    def step(self, name: str) -> None:
        core, io, agent = self.core, self.io, self.agent
        held = core.held is not None
        starts = sum(1 for e in io.events if isinstance(e, ev.TurnStarted))
        try:
            if name == "prompt":
                core.prompt(f"p{len(io.events)}", ())
                agent.answer()
            elif name == "cancel":
                self.cancels.append(Slot())
                core.cancel(None, "user", self.cancels[-1])
                agent.answer()
            elif name == "steer":
                self.steers.append(Slot())
                core.steer("steer", self.steers[-1])
                agent.answer()
            elif name in ("end_turn", "end_cancelled") and agent.prompts:
                if core.live_generation is not None:
                    agent.end_turn("cancelled" if name == "end_cancelled" else "end_turn")
            elif name == "say" and core.live_generation is not None and agent.prompts:
                agent.say("word ")
            elif name == "crash" and core.live_generation is not None:
                generation = core.live_generation
                agent.prompts.clear()
                core.life.agent_gone(generation, ExitStatus(code=1, signal=None), [], [])
            elif name == "deadline":
                deadline = core.next_deadline()
                if deadline != math.inf:
                    io.clock = max(io.clock, deadline)
                    core.deadline_passed()
            elif name == "kill_done" and self.kills_done < len(io.kills):
                self.kills_done += 1
                agent.prompts.clear()
                core.life.kill_done(["sigterm"], [])
            elif name == "come_up" and io.spawns and core.life.takes_agent(io.spawns[-1][0]):
                agent.prompts.clear()
                agent.come_up()
            elif name == "stop":
                self.stops.append(Slot())
                core.life.stop(self.stops[-1])
            elif name == "closed" and io.closes and not self.closed:
                self.closed = True
                core.life.closed(ExitStatus(code=0, signal=None), [], [])
            elif name == "memory" and core.live_generation is not None:
                core.life.memory_over(core.live_generation, 500.0)
            elif name == "pause":
                core.pause(math.inf)
            elif name == "pause_deadline":
                core.pause(io.clock + 5.0)
            elif name == "resume":
                core.resume()
        except SupervisorError:
            pass  # a call the session refuses, as it tells its caller
        if held and name != "resume":
            now = sum(1 for e in io.events if isinstance(e, ev.TurnStarted))
            assert now == starts, f"a turn started while paused ({name})"
        self.check()

    def check(self) -> None:
        events = self.io.events
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        ended = [e.turn_id for e in self.io.ended_turns()]
        assert len(ended) == len(set(ended)), f"a turn ended twice: {ended}"
        for slot in (*self.cancels, *self.steers, *self.stops):
            assert slot.answers <= 1
        core = self.core
        if core.turn is None and core.state in (State.READY, *ENDS):
            assert all(slot.answers == 1 for slot in self.cancels), "an unanswered cancel"
        if core.turn is not None:
            assert core.state in (State.RUNNING, State.CANCELLING), core.state
        if core.state is State.READY and core.turn is None and core.held is None:
            assert not core.queue, "a prompt waits though nothing holds it"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(OPERATIONS, max_size=60), grace_s=st.sampled_from([0.0, 3.0]))
def test_any_order_of_events_keeps_to_the_table_and_the_invariants(
    steps: list[str], grace_s: float
) -> None:
    walk = Walk(grace_s)
    for name in steps:
        walk.step(name)


def test_a_walk_that_reaches_every_state() -> None:
    walk = Walk(3.0)
    seen: set[Any] = set()
    for name in [
        "prompt",
        "cancel",
        "deadline",
        "kill_done",
        "come_up",
        "prompt",
        "crash",
        "come_up",
        "stop",
        "closed",
    ]:
        walk.step(name)
        seen.add(walk.core.state)
    assert seen >= {State.READY, State.RUNNING, State.CANCELLING, State.STARTING, State.STOPPED}
