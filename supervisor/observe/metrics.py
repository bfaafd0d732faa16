"""What an operator scrapes: the supervisor's metrics, in the Prometheus text format.

:class:`Metrics` wraps a ``prometheus_client`` :class:`~prometheus_client.CollectorRegistry`
(``open_supervisor(metrics=Metrics())``; the gateway serves it at ``GET /metrics``). Two kinds
of figures, each got the cheapest way it can be (``design/observe.md`` says why):

- **Counted from the events sessions publish** (:meth:`Metrics.observer`, told of each event a
  session's fan-out publishes): turns by outcome, cancels and the time they took (the receipt
  ``turn.ended`` carries), the ladder's steps, the interrupt's delivery (the receipt's
  ``timeline``), stalls, recycles, memory-limit stops. They agree with what every client sees
  because they are made from the very events clients get. The observer looks at an event's
  class and returns for all but five kinds: a stream's runs never reach it.
- **Read at scrape time** (:class:`_ScrapeTime`, a custom collector): sessions by state, the
  bytes their histories hold, subscribers, events published, what a node's front has not
  acknowledged, each host's link. Nothing is updated per event for them.

Every metric is listed, with its labels and what it leaves out, in ``docs/metrics.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from protocols import events as ev
from supervisor.receipt import REASON_MEMORY_LIMIT
from supervisor.runtime.fanout import Fanout

__all__ = ["LATENCY_BUCKETS", "Metrics"]

log = logging.getLogger(__name__)

#: The buckets of both latency histograms, in seconds: 1 ms (a cooperative agent's stop) to
#: 30 s (a grace, a kill and a slow agent's restart and resume).
LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: What ``GET /metrics`` answers: the text format every Prometheus reads, which is what
#: ``generate_latest`` writes for names like ours (plain ASCII), and what prometheus-client's own
#: servers answer a scraper that asks for nothing newer.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
#: The states a session is counted in (each is given, 0 included: a series that vanishes
#: reads as missing data, not as none).
_STATES: Final = ("starting", "ready", "running", "cancelling", "stopped", "failed")
#: A queued prompt a cancel dropped ends with a receipt too (its ``stop_reason``): a turn, not
#: a cancel's latency (it took none).
_DROPPED: Final = "dropped"


class _Session(Protocol):
    """What a scrape reads of a session (``SessionHandle``, local or remote)."""

    @property
    def state(self) -> str: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def fanout(self) -> Fanout: ...


class _Host(Protocol):
    @property
    def name(self) -> str: ...


class _Link(Protocol):
    """What a scrape reads of a link to a host's node (``NodeLink``)."""

    @property
    def host(self) -> _Host: ...

    @property
    def connected(self) -> bool: ...

    @property
    def rtt_s(self) -> float | None: ...


class Metrics:
    """The supervisor's metrics in ``registry`` (a new one by default; give your own to serve
    them beside your application's). One supervisor feeds it (``open_supervisor``)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        registry = self.registry
        self._cancel = Histogram(
            "agent_supervisor_cancel_seconds",
            "Cancel to receipt: a turn stopped through the ladder, until its turn.ended"
            " carried the receipt",
            ("protocol", "outcome"),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._delivery = Histogram(
            "agent_supervisor_interrupt_delivery_seconds",
            "Cancel to the agent's answer to the interrupt (codex, claude, opencode: protocols"
            " whose interrupt is a request)",
            ("protocol",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._turns = Counter(
            "agent_supervisor_turns",
            "Turns ended (turn.ended), by outcome",
            ("protocol", "outcome"),
            registry=registry,
        )
        self._escalations = Counter(
            "agent_supervisor_escalations",
            "Steps the cancel ladder took, as receipts list them",
            ("step",),
            registry=registry,
        )
        self._stalls = Counter(
            "agent_supervisor_stalls",
            "Turns the stall watchdog stopped (turn.stalled)",
            ("protocol",),
            registry=registry,
        )
        self._recycles = Counter(
            "agent_supervisor_recycles",
            "Agents restarted that nobody asked to (session.recycled: failing turns, memory)",
            ("protocol",),
            registry=registry,
        )
        self._memory = Counter(
            "agent_supervisor_memory_limit_stops",
            "Agents found over max_memory_mb (error events with code memory_limit)",
            ("protocol",),
            registry=registry,
        )
        if process:  # the supervisor's own CPU, memory and file descriptors, read at a scrape
            ProcessCollector(registry=registry)
        #: the supervisor's sessions and links, read at a scrape (:meth:`watch`)
        self._sessions: Callable[[], Iterable[_Session]] = tuple
        self._links: Callable[[], Iterable[_Link]] = tuple
        #: each step's child of the escalations counter, looked up once for every session
        self._steps: dict[str, Any] = {}
        #: events published by sessions no longer listed (so the total never goes back)
        self.retired_events = 0
        self._watched = False
        self._failed = False  # an event could not be counted (logged once)
        registry.register(_ScrapeTime(self))

    #: ``Content-Type`` of :meth:`render`'s bytes
    content_type: Final = CONTENT_TYPE

    def render(self) -> bytes:
        """The registry's metrics, as ``GET /metrics`` serves them."""
        return generate_latest(self.registry)

    def watch(
        self, sessions: Callable[[], Iterable[_Session]], links: Callable[[], Iterable[_Link]]
    ) -> None:
        """Read these at each scrape: the supervisor's sessions, and its links to hosts."""
        if self._watched:
            raise ValueError("a Metrics is fed by one supervisor")
        self._watched = True
        self._sessions, self._links = sessions, links

    def retire(self, session: _Session) -> None:
        """``session`` is no longer listed: what it published stays counted."""
        self.retired_events += session.last_seq

    def observer(self, protocol: str) -> Callable[[ev.Event], None]:
        """The observer of one session of ``protocol``: counts what the events say (see the
        module docstring). Each label's child is looked up once."""
        turns: dict[str, Any] = {}
        cancels: dict[str, Any] = {}
        steps = self._steps
        delivery = self._delivery.labels(protocol)
        stalls = self._stalls.labels(protocol)
        recycles = self._recycles.labels(protocol)
        memory = self._memory.labels(protocol)

        def turn_ended(event: ev.TurnEnded) -> None:
            outcome = event.outcome
            counter = turns.get(outcome)
            if counter is None:
                counter = turns[outcome] = self._turns.labels(protocol, outcome)
            counter.inc()
            receipt = event.receipt
            if receipt is None or receipt.get("stop_reason") == _DROPPED:
                return
            histogram = cancels.get(outcome)
            if histogram is None:
                histogram = cancels[outcome] = self._cancel.labels(protocol, outcome)
            histogram.observe(float(receipt.get("elapsed_ms", 0.0)) / 1000)
            for step in receipt.get("escalation", ()):
                counter = steps.get(step)
                if counter is None:
                    counter = steps[step] = self._escalations.labels(step)
                counter.inc()
            answered = (receipt.get("timeline") or {}).get("interrupt_answered")
            if answered is not None:
                delivery.observe(float(answered) / 1000)

        def error(event: ev.ErrorEvent) -> None:
            if event.code == REASON_MEMORY_LIMIT:
                memory.inc()

        # What each kind counts; every other kind is one dict lookup.
        handlers: dict[type, Callable[[Any], None]] = {
            ev.TurnEnded: turn_ended,
            ev.TurnStalled: lambda _: stalls.inc(),
            ev.SessionRecycled: lambda _: recycles.inc(),
            ev.ErrorEvent: error,
        }

        def observe(event: ev.Event) -> None:
            handler = handlers.get(event.__class__)
            if handler is None:
                return
            try:
                handler(event)
            except Exception:  # a remote node's odd receipt: never the session's problem
                if not self._failed:
                    self._failed = True
                    log.exception("metrics: an event could not be counted (logged once)")

        return observe


class _ScrapeTime:
    """The figures read when scraped, from the sessions and links themselves: nothing is
    updated on an event's way for them."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # (names unknown to the registry's duplicate check: all ours)

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        states = dict.fromkeys(_STATES, 0)
        held = subscribers = unacknowledged = 0
        published = metrics.retired_events
        for session in list(metrics._sessions()):
            state = str(session.state)
            states[state] = states.get(state, 0) + 1
            published += session.last_seq
            fanout = session.fanout
            held += fanout.held_bytes
            subscribers += fanout.subscriber_count
            unacknowledged += fanout.unacknowledged
        by_state = GaugeMetricFamily(
            "agent_supervisor_sessions", "Sessions listed, by state", labels=("state",)
        )
        for state, count in states.items():
            by_state.add_metric((state,), count)
        yield by_state
        yield GaugeMetricFamily(
            "agent_supervisor_history_bytes",
            "Bytes of events the sessions' histories hold (for since_seq replays)",
            value=held,
        )
        yield GaugeMetricFamily(
            "agent_supervisor_subscribers", "Open subscriptions to sessions", value=subscribers
        )
        yield CounterMetricFamily(
            "agent_supervisor_events",
            "Events sessions published (each reaches every subscriber of its session)",
            value=published,
        )
        yield GaugeMetricFamily(
            "agent_supervisor_unacknowledged_events",
            "Events a node's sessions hold that their front has not acknowledged",
            value=unacknowledged,
        )
        up = GaugeMetricFamily(
            "agent_supervisor_link_up", "1 while the link to a host's node is up", labels=("host",)
        )
        rtt = GaugeMetricFamily(
            "agent_supervisor_link_rtt_seconds",
            "The last keepalive ping's round trip on the link to a host's node",
            labels=("host",),
        )
        for link in list(metrics._links()):
            host = link.host.name
            up.add_metric((host,), 1 if link.connected else 0)
            seconds = link.rtt_s
            if seconds is not None:
                rtt.add_metric((host,), seconds)
        yield up
        yield rtt
