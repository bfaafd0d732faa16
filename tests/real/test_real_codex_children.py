"""Tier 4: Codex sub-agents (child threads) and goals on cancel, against the real app-server.

The native ``codex app-server`` of ``@openai/codex@0.171.0`` under the supervisor (protocol
``codex``), against ``tests/realagents/fake_model.py``, set up as in ``test_real_codex.py``
(whose harness this reuses). What 0.171.0 really does, found by experiment here:

Sub-agents
  - The tools: with the default config (``[features] multi_agent``, v1, deprecated but on) the
    model's requests carry no ``spawn_agent`` (only ``tool_search``, whose deferred tools may
    hold v1's: not tried) and a direct call is answered ``unsupported call: spawn_agent``.
    ``[features] multi_agent_v2 = true`` adds a ``collaboration`` namespace (``spawn_agent``,
    ``wait_agent``, ``send_message``, ``followup_task``, ``interrupt_agent``, ``list_agents``);
    the model calls one as a ``function_call`` item with ``"namespace":
    "collaboration"`` (without it: ``unsupported call``). ``spawn_agent {task_name, message,
    fork_turns: "none"}`` answers ``{"task_name": "/root/<name>"}``; the child gets its task
    as a trailing ``agent_message`` input item, and its final answer reaches the root the same
    way.
  - On our connection: **no** ``thread/started`` for the child; the root's turn carries an
    ``item/started``/``item/completed`` ``subAgentActivity`` (``kind: "started"``,
    ``agentThreadId``, ``agentPath``) naming it, then the child's own ``thread/status/changed``,
    ``turn/started`` (its ``turn.rootTurnId`` is our root turn), items and deltas are all
    forwarded. ``wait_agent`` is a ``collabAgentToolCall`` (``tool: "wait"``,
    ``receiverThreadIds: []``).
  - Interrupting the root does **not** stop the child: the root's turn ends ``interrupted``
    in ~10 ms while the child keeps streaming from the model (measured: still streaming 5 s
    later). ``turn/interrupt {threadId: child, turnId: child turn}`` is accepted: ``{}`` and
    the child's ``turn/completed`` ``interrupted`` in ~8 ms, and the child's model stream is
    dropped at once. No turn starts by itself afterwards.
    :func:`test_without_child_interrupts_the_child_streams_on` is the control.

Goals (``[features] goals``, on by default in 0.171.0)
  - ``thread/goal/set {status: "active"}`` on an idle thread starts a goal turn by itself at
    once (and another after each that completes); the model can create one too
    (``create_goal``), which is what the fake model's ``setgoal`` does: no item for the call,
    but ``thread/goal/updated`` (``active``, with the turn's id) reaches us while the turn runs
    (and the model's next request ends with a ``goal_objective`` context item of Codex's own).
  - An interrupted turn does not start the next goal turn by itself, even with the goal left
    ``active``: but the goal stays active, so the **next turn the person starts and that
    completes is followed by a goal turn Codex starts on its own** (measured: ~10 ms later,
    and then one after another).
    The adapter's ``thread/goal/set {status: "paused"}`` before the interrupt (answered in
    ~10 ms) prevents that; :func:`test_without_the_pause_a_goal_turn_follows` is the control
    that shows the failure the pause prevents: without it the next turn never ends by itself.
  - A goal turn Codex starts by itself: ``turn/started`` with a new id whose ``rootTurnId`` is
    its own, then ``thread/goal/updated`` (``active``, the new turn id, the usage so far), the
    items, ``turn/completed``; the model's request ends with Codex's own continuation prompt
    (``<codex_internal_context source="goal">``). The model's tools include ``get_goal``,
    ``create_goal`` and ``update_goal``; ``update_goal {status: "complete"}`` ends the goal
    and no goal turn follows. The adapter makes all of them part of the person's turn
    (:func:`test_goal_turns_end_with_the_goal`, :func:`test_cancel_during_a_goal_turn`).

Real clock, generous bounds; latencies go into the tier-4 table (agent ``codex-app-server``,
scenarios ``children``, ``goal``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import test_real_codex as base
import trio
from test_real_codex import BOUND_S, row, second_prompt_completes

from helpers import Recorder
from protocols import events as ev
from protocols.codex import CodexClient
from protocols.machine import Step
from realagents.conftest import GRACE_S
from realagents.fake_model import GOAL_RUN_TURNS, Exchange
from realagents.scenarios import MODEL_GONE_S, ms_after

pytestmark = pytest.mark.real_process

# test_real_codex.py's fixtures, shared: pytest finds them as attributes of this module.
codex_install = base.codex_install
open_codex = base.open_codex

#: How long a goal turn Codex starts by itself may take to show up after a turn completes:
#: measured ~50 ms; without the pause it came every time well within this.
GOAL_TURN_BOUND_S = 3.0
#: How long the control watches an uninterrupted child go on streaming (it streams for 60 s).
CHILD_RUNS_ON_S = 2.0


def _info(event: ev.Event, kind: str) -> dict[str, Any] | None:
    if isinstance(event, ev.SessionInfo) and event.info_kind == kind:
        return event.data
    return None


def _turn_started_on(thread: str | None, *, other: bool = False) -> Any:
    def check(event: ev.Event) -> bool:
        data = _info(event, "turn/started")
        if data is None:
            return False
        return (data.get("threadId") != thread) if other else (data.get("threadId") == thread)

    return check


async def test_cancel_root_while_child_streams(open_codex: Any) -> None:
    """The root spawns a child that streams, then waits on it (``wait_agent``); a cancel stops
    both: the root's ``turn/interrupt`` and one for the child's turn, the receipt lists the
    child confirmed, the model's child stream is dropped, and a ``quick`` prompt completes."""
    with trio.fail_after(BOUND_S):
        async with open_codex(features=("multi_agent_v2",)) as h:
            turn = await h.session.prompt("subagent")
            child_stream = await h.model.wait_for(
                lambda e: e.streaming_tokens and e.tokens_sent >= 3
            )
            # The root is waiting on its child (its model request asked for wait_agent).
            await h.model.wait_for(
                lambda e: e.tool_call is not None and e.tool_call["name"] == "wait_agent"
            )
            root_started = await h.recorder.wait_kind("session.info", info_kind="turn/started")
            assert isinstance(root_started, ev.SessionInfo)
            root_thread = root_started.data["threadId"]
            child_started = await h.recorder.wait_for(_turn_started_on(root_thread, other=True))
            assert isinstance(child_started, ev.SessionInfo)
            child_thread = child_started.data["threadId"]
            child_turn = child_started.data["turn"]["id"]
            # How the adapter knew the child: a subAgentActivity item of the root's turn.
            activity = [
                e.data["item"]
                for e in h.recorder.of_kind("session.info")
                if isinstance(e, ev.SessionInfo) and e.info_kind == "subAgentActivity"
            ]
            assert any(a.get("agentThreadId") == child_thread for a in activity), activity
            assert not [
                e
                for e in h.recorder.of_kind("session.info")
                if (data := _info(e, "thread/started")) and data["thread"]["id"] == child_thread
            ], "0.171.0 did send the child's thread/started: update the module docstring"

            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            received_at = time.monotonic()
            gone = await h.model.wait_for(
                lambda e: e.id == child_stream.id and e.ended_at is not None, timeout=30
            )
            row(
                h,
                "children",
                receipt,
                model_gone_ms=ms_after(cancelled_at, gone.disconnected_at),
                notes=[f"receipt_wall_ms={(received_at - cancelled_at) * 1000:.0f}"],
            )
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "interrupted", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.details == {
                "background_terminals": "cleaned",
                "children": [
                    {
                        "thread_id": child_thread,
                        "turn_id": child_turn,
                        "confirmed": True,
                        "status": "interrupted",
                    }
                ],
            }, receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            # The child really stopped calling the model, and soon.
            assert gone.disconnected_at is not None, h.model.describe()
            assert gone.disconnected_at - cancelled_at < MODEL_GONE_S, h.model.describe()
            assert gone.tokens_sent < 200, "the child's stream ran to its end"
            # The child's turn/completed came before the receipt (the receipt waits for it).
            child_done = [
                data["turn"]["status"]
                for e in h.recorder.of_kind("session.info")
                if (data := _info(e, "turn/completed")) and data.get("threadId") == child_thread
            ]
            assert child_done == ["interrupted"], child_done

            await second_prompt_completes(h)
            # Nothing streams any more, and nothing but the child ever streamed.
            assert _open_streams(h.model.snapshot()) == [], h.model.describe()
            streams = h.model.find(lambda e: e.streaming_tokens)
            assert [e.id for e in streams] == [child_stream.id], h.model.describe()


async def test_without_child_interrupts_the_child_streams_on(
    open_codex: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the same with the adapter's child interrupts switched off. The root's
    interrupt alone leaves the child calling the model (the receipt would be a lie)."""

    def no_child_interrupt(self: CodexClient, turn: Any, thread_id: str, codex_id: str) -> Step:
        return Step()

    monkeypatch.setattr(CodexClient, "_interrupt_child", no_child_interrupt)
    with trio.fail_after(BOUND_S):
        async with open_codex(features=("multi_agent_v2",)) as h:
            turn = await h.session.prompt("subagent")
            child_stream = await h.model.wait_for(
                lambda e: e.streaming_tokens and e.tokens_sent >= 3
            )
            await h.model.wait_for(
                lambda e: e.tool_call is not None and e.tool_call["name"] == "wait_agent"
            )
            receipt = await h.session.cancel()
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert "children" not in receipt.details, receipt
            with pytest.raises(TimeoutError):
                await h.model.wait_for(
                    lambda e: e.id == child_stream.id and e.ended_at is not None,
                    timeout=CHILD_RUNS_ON_S,
                )
            [still] = h.model.find(lambda e: e.id == child_stream.id)
            assert still.tokens_sent > child_stream.tokens_sent, h.model.describe()


def _open_streams(exchanges: list[Exchange]) -> list[Exchange]:
    return [e for e in exchanges if e.streaming_tokens and e.ended_at is None]


async def _goal_turn_then_cancel(h: Any) -> tuple[Any, str]:
    """A turn in which the model creates an active goal, then streams; cancelled."""
    turn = await h.session.prompt("setgoal")
    with trio.move_on_after(20):
        await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
    assert h.model.find(lambda e: e.streaming_tokens), h.model.describe()
    updated = await h.recorder.wait_kind("session.info", info_kind="thread/goal/updated")
    assert isinstance(updated, ev.SessionInfo)
    assert updated.data["goal"]["status"] == "active", updated
    receipt = await h.session.cancel()
    await h.recorder.catch_up()  # it reads the session's events in a task of its own
    assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
    return receipt, str(updated.data["threadId"])


async def _turn_starts_by_itself(rec: Recorder, thread: str, seen: int) -> bool:
    """Whether a turn the server starts on its own shows up within GOAL_TURN_BOUND_S."""
    with trio.move_on_after(GOAL_TURN_BOUND_S):
        await rec.wait_for(_turn_started_on(thread), count=seen + 1)
        return True
    return False


async def test_goal_paused_on_cancel_no_goal_turn_follows(open_codex: Any) -> None:
    """The model creates an active goal mid-turn; the cancel pauses it before the interrupt, so
    after the next ``quick`` turn completes Codex starts no goal turn by itself."""
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            receipt, thread = await _goal_turn_then_cancel(h)
            row(h, "goal", receipt)
            assert receipt.stop_reason == "interrupted", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.details == {"background_terminals": "cleaned", "goal": "paused"}
            assert receipt.elapsed_ms < GRACE_S * 1000
            # The server said so too.
            statuses = [
                data["goal"]["status"]
                for e in h.recorder.of_kind("session.info")
                if (data := _info(e, "thread/goal/updated"))
            ]
            assert statuses[-1] == "paused", statuses
            await second_prompt_completes(h)
            seen = len(
                [e for e in h.recorder.of_kind("session.info") if _turn_started_on(thread)(e)]
            )
            assert seen == 2
            assert not await _turn_starts_by_itself(h.recorder, thread, seen), h.model.describe()
            assert h.session.state == "ready"


def _goal_statuses(rec: Recorder) -> list[str]:
    return [
        data["goal"]["status"]
        for e in rec.of_kind("session.info")
        if (data := _info(e, "thread/goal/updated"))
    ]


def _our_deltas(rec: Recorder) -> list[ev.MessageDelta]:
    return [e for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta)]


async def test_goal_turns_end_with_the_goal(open_codex: Any) -> None:
    """The model creates a goal and answers; the turn completes with the goal active, and
    Codex starts goal turns by itself until, in goal turn ``GOAL_RUN_TURNS``, the model marks
    the goal complete (``update_goal``). The person's turn is all of it: one ``turn.ended``
    (completed) after the last goal turn, every delta with its turn id, no protocol error; then
    nothing starts by itself and the next prompt completes."""
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            turn = await h.session.prompt("goalrun")
            ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded)
            assert (ended.outcome, ended.stop_reason) == ("completed", "completed"), (
                ended,
                h.model.describe(),
            )
            started = [e for e in h.recorder.of_kind("session.info") if _info(e, "turn/started")]
            thread = started[0].data["threadId"]  # type: ignore[attr-defined]
            # The person's Codex turn and GOAL_RUN_TURNS goal turns, all before the end.
            assert len(started) == 1 + GOAL_RUN_TURNS, h.model.describe()
            assert h.recorder.events.index(started[-1]) < h.recorder.events.index(ended)
            goal_turns = h.model.find(lambda e: e.goal_turn)
            assert len(goal_turns) == GOAL_RUN_TURNS, h.model.describe()
            assert [e.tool_call["name"] for e in h.model.find(lambda e: e.tool_call)] == [
                "create_goal",
                "update_goal",
            ]
            assert _goal_statuses(h.recorder)[0] == "active"
            assert _goal_statuses(h.recorder)[-1] == "complete"
            deltas = _our_deltas(h.recorder)
            assert deltas and all(e.turn_id == turn.id for e in deltas)
            seen = len([e for e in started if _turn_started_on(thread)(e)])
            assert not await _turn_starts_by_itself(h.recorder, thread, seen), h.model.describe()
            await second_prompt_completes(h)
            assert len(h.recorder.of_kind("turn.ended")) == 2


async def test_cancel_during_a_goal_turn(open_codex: Any) -> None:
    """A goal turn Codex started by itself streams; the cancel pauses the goal and interrupts
    that goal turn (the adapter adopted it as the person's): one receipt, cancelled, goal
    paused, one goal turn; the model stream is dropped; nothing starts afterwards."""
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            turn = await h.session.prompt("goalstream")
            stream = await h.model.wait_for(
                lambda e: e.goal_turn and e.streaming_tokens and e.tokens_sent >= 3
            )
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            gone = await h.model.wait_for(
                lambda e: e.id == stream.id and e.ended_at is not None, timeout=30
            )
            row(h, "goal_turn", receipt)
            await h.recorder.catch_up()  # it reads the session's events in a task of its own
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "interrupted", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.details == {
                "background_terminals": "cleaned",
                "goal": "paused",
                "goal_turns": 1,
            }, receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            assert gone.disconnected_at is not None, h.model.describe()
            assert gone.disconnected_at - cancelled_at < MODEL_GONE_S, h.model.describe()
            assert _goal_statuses(h.recorder)[-1] == "paused"
            assert [e.turn_id for e in h.recorder.of_kind("turn.ended")] == [turn.id]
            deltas = _our_deltas(h.recorder)
            assert len(deltas) >= 3 and all(e.turn_id == turn.id for e in deltas)
            started = [e for e in h.recorder.of_kind("session.info") if _info(e, "turn/started")]
            assert len(started) == 2
            thread = started[0].data["threadId"]  # type: ignore[attr-defined]
            assert not await _turn_starts_by_itself(h.recorder, thread, 2), h.model.describe()
            await second_prompt_completes(h)
            assert not await _turn_starts_by_itself(h.recorder, thread, 3), h.model.describe()
            assert len(h.model.find(lambda e: e.goal_turn)) == 1


async def test_without_the_pause_a_goal_turn_follows(
    open_codex: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the cancel of the first test with the adapter's goal pause switched off. The
    goal stays active, so the next turn (``quick``) does not end when its Codex turn completes:
    Codex starts goal turns by itself, one after another (the model answers each shortly and
    never completes the goal), and the adapter keeps them in that turn; only a cancel ends it,
    and its receipt says the goal is still active."""

    def no_pause(self: CodexClient, turn: Any) -> Step:
        return Step()

    monkeypatch.setattr(CodexClient, "_pause_goal", no_pause)
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            receipt, thread = await _goal_turn_then_cancel(h)
            assert "goal" not in receipt.details, receipt
            turn = await h.session.prompt("quick")
            # The quick Codex turn, then goal turns Codex started by itself.
            assert await _turn_starts_by_itself(h.recorder, thread, 2 + 2), (
                "Codex 0.171.0 started no goal turns by itself here; without them the pause is"
                f" not needed any more:\n{h.model.describe()}"
            )
            assert [e.turn_id for e in h.recorder.of_kind("turn.ended")] == [receipt.turn_id]
            assert h.model.find(lambda e: e.goal_turn), h.model.describe()
            second = await h.session.cancel()
            await h.recorder.catch_up()
            assert (second.outcome, second.turn_id) == ("cancelled", turn.id), second
            assert second.details["goal"] == "active", second
            assert second.details["goal_turns"] >= 2, second
            deltas = [e for e in _our_deltas(h.recorder) if e.turn_id != receipt.turn_id]
            assert deltas and all(e.turn_id == turn.id for e in deltas)
