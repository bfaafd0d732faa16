"""The stall watchdog (``supervisor/core/watchdog.py``) by plain calls."""

from __future__ import annotations

import math

from protocols import events as ev
from supervisor.core.watchdog import StallWatch


def delta() -> ev.MessageDelta:
    return ev.MessageDelta(turn_id="t1", text="x")


def tool(status: str | None, call: str = "c1") -> ev.ToolUpdate:
    return ev.ToolUpdate(turn_id="t1", tool_call_id=call, status=status)


def test_the_stream_is_heard_without_reading_the_clock() -> None:
    watch = StallWatch.start(0.0, 300.0, None)
    assert watch.stall_at == 300.0
    assert watch.hear(delta(), 50.0, "t1") is False  # no deadline moved on the hot path
    assert watch.heard and watch.heard_at == 0.0
    assert watch.check(300.0, watching=True) is None  # heard: dated now, the deadline moves
    assert watch.stall_at == 600.0


def test_a_silent_turn_is_stalled_at_its_limit() -> None:
    watch = StallWatch.start(0.0, 300.0, None)
    stall = watch.check(300.0, watching=True)
    assert stall is not None and (stall.silent_s, stall.stall_s) == (300.0, 300.0)
    assert watch.stall_at == math.inf


def test_a_tool_in_progress_is_judged_by_its_own_limit() -> None:
    watch = StallWatch.start(0.0, 60.0, None)  # tool_stall_s None: a tool may run for ever
    assert watch.hear(tool("in_progress"), 10.0, "t1") is True
    assert watch.due(watching=True) == math.inf
    watch.hear(tool("completed"), 20.0, "t1")
    assert watch.due(watching=True) == 80.0
    timed = StallWatch.start(0.0, 60.0, 600.0)
    timed.hear(tool("in_progress"), 10.0, "t1")
    assert timed.due(watching=True) == 610.0


def test_a_late_word_about_another_turns_tool_changes_nothing() -> None:
    watch = StallWatch.start(0.0, 60.0, 600.0)
    late = ev.ToolUpdate(turn_id="t0", tool_call_id="old", status="in_progress")
    assert watch.hear(late, 5.0, "t1") is False and watch.tools is None


def test_nothing_is_due_while_nobody_watches_and_a_pause_is_not_silence() -> None:
    watch = StallWatch.start(0.0, 60.0, None)
    assert watch.due(watching=False) == math.inf  # a permission request waits on a person
    watch.paused(30.0)
    assert watch.due(watching=True) == 90.0
