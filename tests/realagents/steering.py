"""Tier-4 steps of the steering scenarios (``tests/test_real_*_steer.py``).

``session.steer(text)`` on a real agent: the text carries :data:`MARK`, so the fake model's log
shows the first request that carries it (its newest user text, :func:`request_carrying`), and
the prompt it steers carries :data:`PROMPT_MARK`, so that request's body shows it belongs to the
same conversation. The fake model answers a request by the last scenario word of its newest user
text: :data:`STEER_QUICK` is answered at once, :data:`STEER_STREAM` with the slow token stream
(a steered turn that keeps running, to cancel it).

Timings (reported in the tier-4 table, never asserted): from the ``steer()`` call to its
``SteerResult`` (``steer_result_ms``), and to the model request carrying the text
(``steer_to_model_ms``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from protocols import events as ev
from realagents import scenarios
from realagents.conftest import Harness, record
from realagents.fake_model import Exchange
from supervisor.steering import SteerResult

__all__ = [
    "MARK",
    "PROMPT_MARK",
    "STEER_QUICK",
    "STEER_STREAM",
    "Steered",
    "SteeredMidStream",
    "assert_one_turn_took_it",
    "assert_steered_event",
    "carries",
    "request_carrying",
    "steer",
    "steer_row",
    "steer_mid_stream",
    "steer_starts_a_turn",
    "streaming",
]

MARK = "STEERMARK"
#: In the prompt of the turn being steered (the fake model streams: ``stream``).
PROMPT_MARK = "PROMPTMARK"
#: A steer the fake model answers at once (``quick`` is its last scenario word).
STEER_QUICK = f"{MARK} change of plan: answer quick now."
#: A steer the fake model answers with its 60 s token stream: the turn keeps running.
STEER_STREAM = f"{MARK} change of plan: stream tokens instead."


@attrs.frozen
class Steered:
    """A ``steer()`` call: its answer, and when (``time.monotonic()``) it was made and answered."""

    result: SteerResult
    sent_at: float
    answered_at: float

    @property
    def result_ms(self) -> float:
        return round((self.answered_at - self.sent_at) * 1000, 1)

    def to_model_ms(self, request: Exchange | None) -> float | None:
        return scenarios.ms_after(self.sent_at, request.started_at if request else None)


async def streaming(
    h: Harness, prompt: str = f"stream tokens, {PROMPT_MARK}"
) -> tuple[Any, Exchange]:
    """A turn whose model streams slowly (tokens reached the model's stream and the session)."""
    turn = await h.session.prompt(prompt)
    stream = await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
    await h.recorder.wait_kind("message.delta", turn_id=turn.id)
    return turn, stream


async def steer(h: Harness, text: str) -> Steered:
    sent_at = time.monotonic()
    result = await h.session.steer(text)
    return Steered(result, sent_at, time.monotonic())


def carries(exchange: Exchange, text: str = MARK) -> bool:
    """A main request (with tools) whose newest user message holds ``text``: as its own text,
    or inside the tool result it answers (Claude Code puts a steer that joins a cycle there, in
    a ``<system-reminder>``). Side requests (a title, a suggestion) carry no tools."""
    result = exchange.tool_result or {}
    return exchange.has_tools and (text in exchange.user_text or text in str(result.get("output")))


async def request_carrying(
    h: Harness, since: float, text: str = MARK, timeout: float = 30.0
) -> Exchange:
    """The first main request since ``since`` whose newest user text holds ``text``."""
    return await h.model.wait_for(lambda e: e.started_at >= since and carries(e, text), timeout)


def requests_carrying(h: Harness, text: str = MARK) -> list[Exchange]:
    return h.model.find(lambda e: carries(e, text))


def body_text(exchange: Exchange) -> str:
    """The whole request body as text (``keep_bodies=True``): the conversation it carries."""
    return json.dumps(exchange.body)


async def assert_steered_event(h: Harness, steered: Steered, text: str) -> ev.TurnSteered:
    """Subscribers heard ``turn.steered`` naming the steer's turn, mode and text."""
    event = await h.recorder.wait_kind("turn.steered", turn_id=steered.result.turn_id)
    assert isinstance(event, ev.TurnSteered)
    assert (event.mode, event.text) == (steered.result.mode, text), event
    return event


def turns_started(h: Harness) -> list[str]:
    return [e.turn_id for e in h.recorder.of_kind("turn.started") if isinstance(e, ev.TurnStarted)]


def ever_cancelling(h: Harness) -> bool:
    """Whether the session was ever ``cancelling`` (a ladder ran)."""
    return any(
        isinstance(e, ev.SessionState) and e.state == "cancelling"
        for e in h.recorder.of_kind("session.state")
    )


def steer_row(
    h: Harness,
    key: str,
    scenario: str,
    steered: Steered,
    request: Exchange | None,
    *,
    notes: Sequence[str] = (),
    **extra: Any,
) -> None:
    """One row of the tier-4 table: ``outcome`` is the steer's mode, the ms column the time to
    its ``SteerResult``; the notes add the time to the model request carrying the text."""
    to_model = steered.to_model_ms(request)
    record(
        agent=key,
        scenario=scenario,
        outcome=steered.result.mode,
        elapsed_ms=steered.result_ms,
        ready_s=round(h.ready_s, 1),
        namespace=h.namespace,
        steer_result_ms=steered.result_ms,
        steer_to_model_ms=to_model,
        notes=" ".join(
            [
                f"steer_result_ms={steered.result_ms}",
                f"steer_to_model_ms={to_model if to_model is not None else '-'}",
                *notes,
            ]
        ),
        **extra,
    )


async def steer_starts_a_turn(
    h: Harness,
    key: str,
    stop_reason: str,
    second_prompt_completes: Callable[[Harness], Awaitable[object]],
) -> None:
    """A steer with no turn running (``steer-idle``) starts a turn of its own, which the agent
    completes with ``stop_reason``; a prompt after it completes too."""
    steered = await steer(h, STEER_QUICK)
    assert steered.result.mode == "started", steered
    await assert_steered_event(h, steered, STEER_QUICK)
    request = await request_carrying(h, steered.sent_at)
    ended = await h.recorder.wait_kind("turn.ended", turn_id=steered.result.turn_id)
    steer_row(h, key, "steer-idle", steered, request)
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.outcome, ended.stop_reason) == ("completed", stop_reason), ended
    assert turns_started(h) == [steered.result.turn_id]
    await second_prompt_completes(h)


@attrs.frozen
class SteeredMidStream:
    """A quick steer taken into a turn while its model streamed (:func:`steer_mid_stream`)."""

    turn: Any
    steered: Steered
    #: the first model request carrying the steer's text
    request: Exchange
    ended: ev.TurnEnded
    #: the turn's model stream, ended
    stream: Exchange

    @property
    def dropped_note(self) -> str:
        """The row's note: how long after the steer the agent hung up the old stream."""
        dropped = scenarios.ms_after(self.steered.sent_at, self.stream.disconnected_at)
        return f"stream_dropped_ms={dropped}"


async def steer_mid_stream(h: Harness) -> SteeredMidStream:
    """A quick steer while a turn streams: the running turn takes it (``injected``, no receipt),
    then ends; waits for that end and for the old stream's."""
    turn, stream = await streaming(h)
    steered = await steer(h, STEER_QUICK)
    assert (steered.result.mode, steered.result.turn_id) == ("injected", turn.id)
    assert (steered.result.receipt, steered.result.detail) == (None, None), steered
    await assert_steered_event(h, steered, STEER_QUICK)
    request = await request_carrying(h, steered.sent_at)
    ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    gone = await scenarios.stream_ended(h, stream)
    return SteeredMidStream(turn, steered, request, ended, gone)


def assert_one_turn_took_it(h: Harness, mid: SteeredMidStream, stop_reason: str) -> None:
    """The steered turn completed (``stop_reason``) as the only turn, nothing cancelled; the
    agent dropped the old stream, and the steer's request holds the steered prompt (one
    conversation)."""
    assert (mid.ended.outcome, mid.ended.stop_reason, mid.ended.receipt) == (
        "completed",
        stop_reason,
        None,
    )
    assert turns_started(h) == [mid.turn.id]
    assert not ever_cancelling(h)
    assert mid.stream.disconnected_at is not None, h.model.describe()
    assert PROMPT_MARK in body_text(mid.request), mid.request.body
