"""Tier 2: the otel extra's spans, caught by the SDK's ``InMemorySpanExporter``, on virtual time.

A span per session, per turn and per cancel, and one per rung of the ladder, each made from
the events the session published with the times they carry: the rungs' lengths are the
receipt's ``timeline``, exact on the virtual clock. Also: spans go to the application's global
provider when it set one and none is given, and ``serve``'s configuration from the ``OTEL_*``
variables.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from helpers import KILLED_HARD
from supervisor.config import ConfigError
from supervisor.observe.tracing import provider_from_env, rungs
from supervisor.testing import FakeAgent, open_test_supervisor, record

LONG = "word " * 200


@contextmanager
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    spans = TracerProvider()
    spans.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        yield spans, exporter
    finally:
        spans.shutdown()


def seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return span.parent is not None and span.parent.span_id == parent.get_span_context().span_id


def attribute(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes["agent_supervisor." + name]


async def test_a_killed_turn_is_a_session_a_turn_a_cancel_and_a_span_per_rung(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Claude acknowledges the interrupt and goes on: killed at the 1 s grace (SIGTERM ignored:
    SIGKILL 2 s later), its successor up 0.5 s after its start, the session resumed."""
    claude = FakeAgent(
        "claude",
        reply=LONG,
        on_cancel="ignore",
        grace_s=1.0,
        ignores_sigterm=True,
        kill_timeout_s=2.0,
        start_delay=0.5,
    )
    with provider() as (spans, exporter):
        async with open_test_supervisor(agents={"claude": claude}, tracer_provider=spans) as sup:
            session = await sup.start_session("claude")
            async with record(session) as events:
                turn = await session.prompt("refactor")
                await events.wait_kind("message.delta", turn_id=turn.id)
                receipt = await session.cancel()
        finished = {span.name: span for span in exporter.get_finished_spans()}
    assert receipt.escalation == KILLED_HARD
    assert set(finished) == {
        "session",
        "turn",
        "cancel",
        "interrupt",
        "grace",
        "sigterm",
        "sigkill",
        "respawned",
        "resumed",
    }
    session_span, turn_span, cancel = finished["session"], finished["turn"], finished["cancel"]
    assert session_span.parent is None and child_of(turn_span, session_span)
    assert child_of(cancel, turn_span)
    assert attribute(session_span, "protocol") == "claude"
    assert attribute(turn_span, "turn_id") == turn.id
    assert attribute(turn_span, "outcome") == "killed"
    assert attribute(cancel, "escalation") == tuple(receipt.escalation)
    assert attribute(cancel, "resumed") is True
    assert seconds(cancel) == pytest.approx(3.5, abs=1e-6)  # grace, SIGKILL's wait, restart
    # Each rung as the receipt's timeline has it, in virtual seconds.
    lengths = {
        "interrupt": 0.0,  # acknowledged at once
        "grace": 1.0,
        "sigterm": 2.0,  # the whole kill: the ladder reports once, at its end
        "sigkill": 2.0,
        "respawned": 0.0,  # the new process runs at once
        "resumed": 0.5,  # its handshake
    }
    for name, length in lengths.items():
        assert child_of(finished[name], cancel), name
        assert seconds(finished[name]) == pytest.approx(length, abs=1e-6), name
    assert cancel.start_time == finished["interrupt"].start_time == finished["grace"].start_time
    assert finished["grace"].end_time == finished["sigterm"].start_time
    assert finished["sigkill"].end_time == finished["respawned"].start_time
    assert finished["resumed"].end_time == cancel.end_time


async def test_a_cooperative_stop_and_a_dropped_prompt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Codex ends the turn 250 ms after the interrupt, answering it as the turn aborts (its
    ``{}``, as the real app-server does); the prompt queued behind it never ran: no turn span
    of its own, listed on the cancel's."""
    codex = FakeAgent("codex", reply=LONG, on_cancel=0.25)
    with provider() as (spans, exporter):
        async with open_test_supervisor(agents={"codex": codex}, tracer_provider=spans) as sup:
            session = await sup.start_session("codex")
            async with record(session) as events:
                turn = await session.prompt("go")
                queued = await session.prompt("then this")
                await events.wait_kind("message.delta", turn_id=turn.id)
                await session.cancel()
                finished = exporter.get_finished_spans()
                assert [span.name for span in finished] == ["interrupt", "cancel", "turn"]
        names = [span.name for span in exporter.get_finished_spans()]
    assert names[-1] == "session"  # ended with the session's stop
    interrupt, cancel, turn_span = finished
    assert seconds(cancel) == pytest.approx(0.25, abs=1e-6)
    assert seconds(interrupt) == pytest.approx(0.25, abs=1e-6)
    assert attribute(cancel, "dropped_prompts") == (queued.id,)
    assert attribute(turn_span, "outcome") == "cancelled"


async def test_the_global_provider_is_taken_when_none_is_given(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with provider() as (spans, exporter):
        monkeypatch.setattr(trace, "get_tracer_provider", lambda: spans)
        async with open_test_supervisor(agents={"acp": FakeAgent("acp")}) as sup:
            session = await sup.start_session("acp")
            assert session.fanout.observer is not None
        assert [span.name for span in exporter.get_finished_spans()] == ["session"]


def test_rungs_start_when_what_they_follow_ended() -> None:
    """An Amp cancel: its interrupt is a signal, its process exits with the turn, and a new one
    is started: the respawn starts at the exit."""
    timeline = {
        "interrupt": 0.0,
        "turn_ended": 20.0,
        "agent_exited": 30.0,
        "respawned": 45.0,
        "resumed": 45.0,
    }
    assert rungs(["interrupt", "respawned", "resumed"], timeline) == [
        ("interrupt", 0.0, 0.0),
        ("respawned", 30.0, 45.0),
        ("resumed", 45.0, 45.0),
    ]
    swept = {"interrupt": 0.0, "turn_ended": 8.0, "tools_killed": 11.0}
    assert rungs(["interrupt", "tools_killed"], swept) == [
        ("interrupt", 0.0, 0.0),
        ("tools_killed", 8.0, 11.0),
    ]
    assert rungs(["interrupt", "grace_expired"], {}) == []  # a node too old to say


def test_serve_configures_traces_from_the_standard_variables() -> None:
    assert provider_from_env({}) is None
    assert provider_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    console = provider_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "x"})
    assert isinstance(console, TracerProvider)
    assert console.resource.attributes["service.name"] == "x"
    console.shutdown()
    with pytest.raises(ConfigError, match="zipkin"):
        provider_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    # An endpoint alone asks for OTLP; its exporter is not installed here: said, not ignored.
    with pytest.raises(ConfigError, match="opentelemetry-exporter-otlp-proto-http"):
        provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
