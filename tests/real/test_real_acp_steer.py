"""Tier 4: steering real ACP agents under the supervisor: one that steers, one that cannot.

Set up as in ``test_real_acp_agents.py`` (whose harness this reuses: the pinned npm installs, a
fresh home per test, a loopback-only network namespace, the fake model; a skip, or a failure
under ``AGENT_SUPERVISOR_STRICT_SKIPS=1``, when an agent cannot be installed).

claude-agent-acp 0.101.0 advertises ``_meta.steering.supported`` in its ``initialize`` result,
so the machine steers with ``_session/steering`` (``idleBehavior: "promptRequired"``):

(a) while the model streams: ``{"outcome": "injected"}``; the adapter aborts the stream and asks
    the model about the steer in the same conversation; the running ``session/prompt`` gets one
    answer for the whole steered turn (``end_turn``): one ``turn.ended``, ``completed``, and the
    next prompt completes;
(b) with no turn running: the supervisor starts a turn (``started``; the agent is not asked),
    and it completes;
(c) a steer that took the turn over (the model streams for it), then a cancel: the receipt,
    the stream dropped, nothing runs after.

Gemini CLI 0.61.0 advertises no steering, so the turn makes way:

(d) while the model streams: ``interrupted`` with the receipt of the cancelled turn
    (``session/cancel``), and the steered text runs as the next turn and completes.

Timings go into the tier-4 table, scenarios ``steer-*``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from protocols import events as ev
from realagents import scenarios, steering
from realagents.conftest import agent_opener
from realagents.scenarios import second_prompt_completes
from realagents.steering import STEER_QUICK, STEER_STREAM

pytestmark = pytest.mark.real_process

#: Whole-test bound: the agent's start (node: a few seconds here) and three turns.
BOUND_S = 120.0
STEERING = "claude-agent-acp"
NOT_STEERING = "gemini"


@pytest.fixture
def open_steering(tmp_path: Path) -> Any:
    """``async with open_steering(...) as h:`` claude-agent-acp (it steers natively)."""
    return agent_opener(STEERING, tmp_path)


@pytest.fixture
def open_not_steering(tmp_path: Path) -> Any:
    """``async with open_not_steering(...) as h:`` Gemini CLI (no ``_meta.steering``)."""
    return agent_opener(NOT_STEERING, tmp_path)


async def test_steer_while_streaming_joins_the_running_turn(open_steering: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_steering(keep_bodies=True) as h:
            mid = await steering.steer_mid_stream(h)
            steering.steer_row(
                h, STEERING, "steer-mid", mid.steered, mid.request, notes=[mid.dropped_note]
            )
            steering.assert_one_turn_took_it(h, mid, "end_turn")
            # The steer's answer reached the session as part of the same turn.
            texts = "".join(
                e.text
                for e in h.recorder.of_kind("message.delta")
                if isinstance(e, ev.MessageDelta) and e.turn_id == mid.turn.id
            )
            assert "Quick answer from the fake model." in texts, texts
            await second_prompt_completes(h)
            assert len(steering.requests_carrying(h)) == 1, h.model.describe()


async def test_steer_with_no_turn_running_starts_one(open_steering: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_steering() as h:
            await steering.steer_starts_a_turn(h, STEERING, "end_turn", second_prompt_completes)


async def test_cancel_after_a_steer_took_over_the_turn(open_steering: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_steering(keep_bodies=True) as h:
            turn, stream = await steering.streaming(h)
            steered = await steering.steer(h, STEER_STREAM)
            assert (steered.result.mode, steered.result.turn_id) == ("injected", turn.id)
            steer_stream = await h.model.wait_for(
                lambda e: steering.carries(e) and e.streaming_tokens and e.tokens_sent >= 3
            )
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            gone = await scenarios.stream_ended(h, steer_stream, timeout=30)
            second = await second_prompt_completes(h)
            steering.steer_row(
                h,
                STEERING,
                "steer-stop",
                steered,
                steer_stream,
                notes=[
                    "steer_took_over=1",
                    f"receipt={receipt.outcome}",
                    f"receipt_ms={receipt.elapsed_ms}",
                    f"stop_reason={receipt.stop_reason}",
                    f"model_gone_ms={scenarios.ms_after(cancelled_at, gone.disconnected_at)}",
                ],
            )
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.escalation == ["interrupt"], receipt
            scenarios.assert_stream_abandoned(h, gone, cancelled_at)
            # The first stream was dropped for the steer, the steer's for the cancel: no other.
            streams = h.model.find(lambda e: e.streaming_tokens)
            assert [e.id for e in streams] == [stream.id, steer_stream.id], h.model.describe()
            assert steering.turns_started(h) == [turn.id, second.turn_id]


async def test_an_agent_that_cannot_steer_makes_way(open_not_steering: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_not_steering(keep_bodies=True) as h:
            turn, stream = await steering.streaming(h)
            steered = await steering.steer(h, STEER_QUICK)
            result = steered.result
            assert result.mode == "interrupted", result
            assert result.receipt is not None, result
            assert (result.receipt.outcome, result.receipt.turn_id) == ("cancelled", turn.id)
            assert result.turn_id != turn.id
            event = await steering.assert_steered_event(h, steered, STEER_QUICK)
            assert event.interrupted_turn_id == turn.id, event
            request = await steering.request_carrying(h, steered.sent_at)
            ended = await h.recorder.wait_kind("turn.ended", turn_id=result.turn_id)
            gone = await scenarios.stream_ended(h, stream, timeout=30)
            steering.steer_row(
                h,
                NOT_STEERING,
                "steer-way",
                steered,
                request,
                notes=[
                    f"receipt={result.receipt.outcome}",
                    f"receipt_ms={result.receipt.elapsed_ms}",
                    f"escalation={','.join(result.receipt.escalation)}",
                    f"stream_dropped_ms={scenarios.ms_after(steered.sent_at, gone.disconnected_at)}",
                ],
            )
            # The old turn ended cancelled before the steered text started as a turn of its own.
            first_ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(first_ended, ev.TurnEnded) and first_ended.outcome == "cancelled"
            started = [
                e for e in h.recorder.of_kind("turn.started") if isinstance(e, ev.TurnStarted)
            ]
            assert [(e.turn_id, e.text) for e in started][1:] == [(result.turn_id, STEER_QUICK)]
            assert first_ended.seq < started[1].seq
            assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
            scenarios.assert_stream_abandoned(h, gone, steered.sent_at)
            await second_prompt_completes(h)
