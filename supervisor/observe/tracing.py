"""OpenTelemetry traces: a span per session, per turn and per cancel, and one per rung of the
cancel ladder (``agent-supervisor[otel]``).

Spans are built from the events a session publishes, as metrics are (``design/observe.md``):
the session's span opens when the session is made and ends with its ``stopped`` or ``failed``
state; a turn's runs from its ``turn.started`` to its ``turn.ended``; a cancel's, a child of its
turn's, from when the cancel began (the receipt's ``elapsed_ms`` before the ``turn.ended``
that carries it) to the receipt; and each rung's, a child of the cancel's, from the receipt's
``timeline`` (:func:`rungs`). Every span is made with explicit start and end times, so a rung
that happened seconds ago is told as it happened, and nothing runs on an event's way but a
lookup of its class.

Off unless configured, as OpenTelemetry's libraries are: ``open_supervisor(tracer_provider=)``,
or the application's global provider if it set one (:func:`global_provider`); ``serve`` and
``node`` configure one from the standard ``OTEL_*`` variables (:func:`provider_from_env`).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from protocols import events as ev
from supervisor.config import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "INSTRUMENTATION",
    "SessionSpans",
    "Tracing",
    "global_provider",
    "provider_from_env",
    "rungs",
]

log = logging.getLogger(__name__)

#: The instrumentation scope the spans are made under.
INSTRUMENTATION: Final = "agent-supervisor"
#: Span attributes are namespaced so that they never collide with a collector's own.
_NS: Final = "agent_supervisor."
#: The ladder's steps, as their rung spans are named (the grace is the wait, not its end).
_RUNG_NAMES: Final = {"grace_expired": "grace"}
#: What each step of the ladder waits for, the first of these the timeline has: it starts
#: when that happened (the cancel's start if none did).
_KILLED_AFTER: Final = ("grace_expired", "turn_ended", "interrupt")
_STARTS_AFTER: Final[Mapping[str, tuple[str, ...]]] = {
    "permissions_cancelled": ("interrupt",),
    "grace_expired": ("interrupt",),
    "tools_killed": ("turn_ended",),
    "containment_lost": _KILLED_AFTER,
    "sigterm": _KILLED_AFTER,
    "sigkill": _KILLED_AFTER,
    "respawned": ("sigkill", "sigterm", "containment_lost", "agent_exited", *_KILLED_AFTER),
    "resumed": ("respawned",),
}
#: The ``OTEL_TRACES_EXPORTER`` values this package builds an exporter for.
_EXPORTERS: Final = ("otlp", "console")


def rungs(escalation: list[str], timeline: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """(name, start ms, end ms) of each rung the cancel took, from its receipt: a step ends
    when the timeline says it was taken, and starts when what it follows ended
    (``_STARTS_AFTER``). The interrupt runs until the agent answered it (where its protocol
    says: else it has no length); the kill ladder's ``sigterm`` and ``sigkill`` both span the
    whole kill (it reports once, at its end)."""
    out: list[tuple[str, float, float]] = []
    for step in escalation:
        end = timeline.get(step)
        if end is None:
            continue  # a receipt of a node too old to time its rungs
        if step == "interrupt":
            answered = timeline.get("interrupt_answered")
            out.append(("interrupt", end, answered if answered is not None else end))
            continue
        after = _STARTS_AFTER.get(step, ())
        start = next((timeline[name] for name in after if name in timeline), 0.0)
        out.append((_RUNG_NAMES.get(step, step), min(start, end), end))
    return out


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


class SessionSpans:
    """One session's spans: the session's, open while it lives, and its turns' as they end."""

    def __init__(self, tracer: Tracer, attributes: dict[str, Any]) -> None:
        from opentelemetry import trace

        self._tracer = tracer
        self._trace = trace
        self._attributes = attributes
        self._span: Span | None = tracer.start_span(
            "session", attributes=attributes, start_time=time.time_ns()
        )
        self._context = trace.set_span_in_context(self._span)
        #: turns that started and have not ended: their start, in ns
        self._started: dict[str, int] = {}
        self._failed = False

    def __call__(self, event: ev.Event) -> None:
        try:
            if isinstance(event, ev.TurnStarted):
                self._started[event.turn_id] = _ns(event.timestamp)
            elif isinstance(event, ev.TurnEnded):
                self._turn_ended(event)
            elif isinstance(event, ev.SessionState) and event.state in ("stopped", "failed"):
                self._ended(event)
        except Exception:  # a remote node's odd receipt: never the session's problem
            if not self._failed:
                self._failed = True
                log.exception("traces: an event could not be told (logged once per session)")

    def _turn_ended(self, event: ev.TurnEnded) -> None:
        trace = self._trace
        end = _ns(event.timestamp)
        start = self._started.pop(event.turn_id, None)
        if start is None:
            return  # a queued prompt a cancel dropped never ran: the cancel lists it
        attributes = {
            **self._attributes,
            _NS + "turn_id": event.turn_id,
            _NS + "outcome": event.outcome,
        }
        if event.stop_reason is not None:
            attributes[_NS + "stop_reason"] = event.stop_reason
        if event.reason is not None:
            attributes[_NS + "reason"] = event.reason
        turn = self._tracer.start_span(
            "turn", context=self._context, attributes=attributes, start_time=start
        )
        if event.outcome == "failed":
            turn.set_status(trace.Status(trace.StatusCode.ERROR, event.error or "failed"))
        receipt = event.receipt
        if receipt is not None:
            self._cancel(trace.set_span_in_context(turn), receipt, end, attributes)
        turn.end(end_time=end)

    def _cancel(
        self, context: Any, receipt: dict[str, Any], end: int, attributes: dict[str, Any]
    ) -> None:
        escalation = [str(step) for step in receipt.get("escalation", ())]
        began = end - _ns(float(receipt.get("elapsed_ms", 0.0)) / 1000)
        details = {
            **attributes,
            _NS + "escalation": escalation,
            _NS + "elapsed_ms": float(receipt.get("elapsed_ms", 0.0)),
        }
        if receipt.get("resumed") is not None:
            details[_NS + "resumed"] = bool(receipt["resumed"])
        dropped = [str(p.get("turn_id")) for p in receipt.get("dropped_prompts", ())]
        if dropped:
            details[_NS + "dropped_prompts"] = dropped
        cancel = self._tracer.start_span(
            "cancel", context=context, attributes=details, start_time=began
        )
        timeline = receipt.get("timeline") or {}
        inner = self._trace.set_span_in_context(cancel)
        for name, start_ms, end_ms in rungs(escalation, timeline):
            rung = self._tracer.start_span(
                name,
                context=inner,
                attributes={_NS + "session_id": attributes[_NS + "session_id"]},
                start_time=began + _ns(start_ms / 1000),
            )
            rung.end(end_time=began + _ns(end_ms / 1000))
        cancel.end(end_time=end)

    def _ended(self, event: ev.SessionState) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        if event.state == "failed":
            trace = self._trace
            span.set_status(trace.Status(trace.StatusCode.ERROR, event.detail or "failed"))
        span.end(end_time=_ns(event.timestamp))


class Tracing:
    """Spans from ``provider``'s tracer, one :class:`SessionSpans` per session."""

    def __init__(self, provider: TracerProvider) -> None:
        from supervisor.remote.version import package_version

        self.provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION, package_version())

    def observer(
        self, session_id: str, agent: str, protocol: str, host: str | None
    ) -> Callable[[ev.Event], None]:
        attributes: dict[str, Any] = {
            _NS + "session_id": session_id,
            _NS + "agent": agent,
            _NS + "protocol": protocol,
        }
        if host is not None:
            attributes[_NS + "host"] = host
        return SessionSpans(self._tracer, attributes)


def global_provider() -> TracerProvider | None:
    """The application's global tracer provider, if it set one (an SDK's, or one an
    auto-instrumentation made); None if it set none, or never loaded OpenTelemetry at all (so
    nothing is imported for it)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider: TracerProvider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider


def provider_from_env(environ: Mapping[str, str] = os.environ) -> SdkTracerProvider | None:
    """A tracer provider as the standard variables ask, for a process the CLI owns; None when
    they ask for none. ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``; ``otlp`` by
    default once ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
    set); the exporter reads its own variables (endpoint, headers, protocol), and
    ``OTEL_SERVICE_NAME`` names the service (``agent-supervisor`` by default). Raises
    :class:`ConfigError` when traces are asked for and cannot be made (the extra or the
    exporter is not installed, or an exporter this package does not build)."""
    exporter_name = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not exporter_name:
        if not endpoint:
            return None
        exporter_name = "otlp"
    if exporter_name == "none":
        return None
    if exporter_name not in _EXPORTERS:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={exporter_name!r}: agent-supervisor builds"
            f" {' or '.join(_EXPORTERS)} (or none)"
        )
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        raise ConfigError(
            "traces are asked for (OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT) but"
            " OpenTelemetry is not installed: pip install 'agent-supervisor[otel]'"
        ) from None
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        exporter = _otlp_exporter(environ)
    service = environ.get("OTEL_SERVICE_NAME") or INSTRUMENTATION
    provider = SdkProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    """The OTLP exporter ``OTEL_EXPORTER_OTLP_PROTOCOL`` asks for (``http/protobuf`` by
    default, as the specification has it; ``grpc``), from the package that provides it (an
    optional one: imported by name)."""
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    package = "grpc" if protocol == "grpc" else "http"
    try:
        module = importlib.import_module(
            f"opentelemetry.exporter.otlp.proto.{package}.trace_exporter"
        )
    except ImportError:
        raise ConfigError(
            f"OTLP traces over {protocol} need opentelemetry-exporter-otlp-proto-{package}:"
            f" pip install opentelemetry-exporter-otlp-proto-{package}"
        ) from None
    return module.OTLPSpanExporter()
