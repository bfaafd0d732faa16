"""What an operator scrapes: the supervisor's metrics, in the Prometheus text format.

:class:`Metrics` puts them in a ``prometheus_client`` :class:`~prometheus_client.CollectorRegistry`
(``open_supervisor(metrics=Metrics())``; the gateway serves it at ``GET /metrics``). Two kinds
of figures, each got the cheapest way it can be (``design/observe.md`` says why):

- **Counted from the events sessions publish** (:meth:`Metrics.observer`, told of each event a
  session's fan-out publishes): turns by outcome, cancels and the time they took (the receipt
  ``turn.ended`` carries), the ladder's steps, the interrupt's delivery (the receipt's
  ``timeline``), stalls, recycles, memory-limit stops. They agree with what every client sees
  because they are made from the very events clients get. The observer looks up an event's
  class and returns for all but four kinds (a stream's runs never reach it); what it counts is
  plain integers and floats (:class:`_Latencies`, dicts of counts), not prometheus-client's
  metric objects: a cancel's ``turn.ended`` is counted on its way to the receipt, where their
  locks and checks cost several times as much.
- **Read at scrape time** (:class:`_Collector`, prometheus-client's custom collector): those
  counts, and sessions by state, the bytes their histories hold, subscribers, events published,
  what a node's front has not acknowledged, each host's link. Nothing is updated per event for
  these.

Every metric is listed, with its labels and what it leaves out, in ``docs/metrics.md``.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from protocols import events as ev
from supervisor.receipt import REASON_MEMORY_LIMIT
from supervisor.runtime.fanout import Fanout

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "Metrics"]

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
#: Each bucket's ``le`` label, as Prometheus writes it, and the one that takes every value.
_LE: Final = (*map(floatToGoString, LATENCY_BUCKETS), "+Inf")
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


class _Latencies:
    """One histogram's series: how many values fell in each bucket (not cumulative: the last
    takes what is above every bound), and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * len(_LE)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # the first bound >= it
        self.sum += seconds

    def buckets(self) -> list[tuple[str, float]]:
        return list(zip(_LE, accumulate(self.counts), strict=True))


class _Protocol:
    """What the sessions of one protocol counted."""

    __slots__ = ("cancels", "delivery", "memory", "recycles", "stalls", "turns")

    def __init__(self) -> None:
        #: by the turn's outcome
        self.turns: dict[str, int] = {}
        #: by the receipt's outcome
        self.cancels: dict[str, _Latencies] = {}
        self.delivery = _Latencies()
        self.stalls = 0
        self.recycles = 0
        self.memory = 0


class Metrics:
    """The supervisor's metrics in ``registry`` (a new one by default; give your own to serve
    them beside your application's). One supervisor feeds it (``open_supervisor``).
    ``process``: the supervisor process's own CPU, memory and files (prometheus-client's)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        #: what each protocol's sessions counted, and the ladder's steps, all of them
        self._protocols: dict[str, _Protocol] = {}
        self._steps: dict[str, int] = {}
        #: the supervisor's sessions and links, read at a scrape (:meth:`watch`)
        self._sessions: Callable[[], Iterable[_Session]] = tuple
        self._links: Callable[[], Iterable[_Link]] = tuple
        #: events published by sessions no longer listed (so the total never goes back)
        self.retired_events = 0
        self._watched = False
        self._failed = False  # an event could not be counted (logged once)
        if process:
            ProcessCollector(registry=self.registry)
        self.registry.register(_Collector(self))

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
        module docstring)."""
        counted = self._protocols.get(protocol)
        if counted is None:
            counted = self._protocols[protocol] = _Protocol()
        turns, cancels, delivery, steps = (
            counted.turns,
            counted.cancels,
            counted.delivery,
            self._steps,
        )

        def turn_ended(event: ev.TurnEnded) -> None:
            outcome = event.outcome
            turns[outcome] = turns.get(outcome, 0) + 1
            receipt = event.receipt
            if receipt is None or receipt.get("stop_reason") == _DROPPED:
                return
            latencies = cancels.get(outcome)
            if latencies is None:
                latencies = cancels[outcome] = _Latencies()
            latencies.observe(float(receipt.get("elapsed_ms", 0.0)) / 1000)
            for step in receipt.get("escalation", ()):
                steps[step] = steps.get(step, 0) + 1
            answered = (receipt.get("timeline") or {}).get("interrupt_answered")
            if answered is not None:
                delivery.observe(float(answered) / 1000)

        def stalled(_: ev.TurnStalled) -> None:
            counted.stalls += 1

        def recycled(_: ev.SessionRecycled) -> None:
            counted.recycles += 1

        def error(event: ev.ErrorEvent) -> None:
            if event.code == REASON_MEMORY_LIMIT:
                counted.memory += 1

        # What each kind counts; every other kind is one dict lookup.
        handlers: dict[type, Callable[[Any], None]] = {
            ev.TurnEnded: turn_ended,
            ev.TurnStalled: stalled,
            ev.SessionRecycled: recycled,
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


class _Collector:
    """Every figure of ours, made when the registry is collected (a scrape): the counts the
    observers kept, and what is read from the sessions and links themselves."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # (names unknown to the registry's duplicate check: all ours)

    def collect(self) -> Iterator[Metric]:
        yield from self._counted()
        yield from self._sessions()
        yield from self._links()

    def _counted(self) -> Iterator[Metric]:
        metrics = self._metrics
        protocols = sorted(metrics._protocols.items())
        cancel = HistogramMetricFamily(
            "agent_supervisor_cancel_seconds",
            "Cancel to receipt: a turn stopped through the ladder, until its turn.ended"
            " carried the receipt",
            labels=("protocol", "outcome"),
        )
        delivery = HistogramMetricFamily(
            "agent_supervisor_interrupt_delivery_seconds",
            "Cancel to the agent's answer to the interrupt (codex, claude, opencode: protocols"
            " whose interrupt is a request)",
            labels=("protocol",),
        )
        turns = CounterMetricFamily(
            "agent_supervisor_turns",
            "Turns ended (turn.ended), by outcome",
            labels=("protocol", "outcome"),
        )
        stalls = CounterMetricFamily(
            "agent_supervisor_stalls",
            "Turns the stall watchdog stopped (turn.stalled)",
            labels=("protocol",),
        )
        recycles = CounterMetricFamily(
            "agent_supervisor_recycles",
            "Agents restarted that nobody asked to (session.recycled: failing turns, memory)",
            labels=("protocol",),
        )
        memory = CounterMetricFamily(
            "agent_supervisor_memory_limit_stops",
            "Agents found over max_memory_mb (error events with code memory_limit)",
            labels=("protocol",),
        )
        for protocol, counted in protocols:
            for outcome, count in sorted(counted.turns.items()):
                turns.add_metric((protocol, outcome), count)
            for outcome, latencies in sorted(counted.cancels.items()):
                cancel.add_metric((protocol, outcome), latencies.buckets(), latencies.sum)
            delivery.add_metric((protocol,), counted.delivery.buckets(), counted.delivery.sum)
            stalls.add_metric((protocol,), counted.stalls)
            recycles.add_metric((protocol,), counted.recycles)
            memory.add_metric((protocol,), counted.memory)
        steps = CounterMetricFamily(
            "agent_supervisor_escalations",
            "Steps the cancel ladder took, as receipts list them",
            labels=("step",),
        )
        for step, count in sorted(metrics._steps.items()):
            steps.add_metric((step,), count)
        yield from (cancel, delivery, turns, steps, stalls, recycles, memory)

    def _sessions(self) -> Iterator[Metric]:
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

    def _links(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "agent_supervisor_link_up", "1 while the link to a host's node is up", labels=("host",)
        )
        rtt = GaugeMetricFamily(
            "agent_supervisor_link_rtt_seconds",
            "The last keepalive ping's round trip on the link to a host's node",
            labels=("host",),
        )
        for link in list(self._metrics._links()):
            host = link.host.name
            up.add_metric((host,), 1 if link.connected else 0)
            seconds = link.rtt_s
            if seconds is not None:
                rtt.add_metric((host,), seconds)
        yield up
        yield rtt
