"""One observer per session, for metrics and traces at once, set on its fan-out.

A session's :class:`~supervisor.runtime.fanout.Fanout` tells its ``observer`` of each event it
publishes. With neither metrics nor traces on, the supervisor makes no :class:`Observers` and
sets none: a publish then costs one test of ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from protocols import events as ev
from supervisor.runtime.handle import SessionHandle

if TYPE_CHECKING:
    from supervisor.observe.metrics import Metrics
    from supervisor.observe.tracing import Tracing

__all__ = ["Observers"]


class Observers:
    """What a supervisor observes its sessions with: ``metrics``, ``tracing``, or both."""

    def __init__(self, metrics: Metrics | None, tracing: Tracing | None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    def attach(self, session: SessionHandle) -> None:
        """Observe ``session`` from its next event on (before its first: it is new)."""
        spec = session.spec
        observers: list[Callable[[ev.Event], None]] = []
        if self.metrics is not None:
            observers.append(self.metrics.observer(spec.protocol))
        if self.tracing is not None:
            observers.append(
                self.tracing.observer(session.id, spec.name, spec.protocol, session.host)
            )
        if len(observers) == 1:
            session.fanout.observer = observers[0]
        elif observers:
            first, second = observers

            def both(event: ev.Event) -> None:
                first(event)
                second(event)

            session.fanout.observer = both

    def retire(self, session: SessionHandle) -> None:
        """``session`` is no longer listed (stopped and forgotten)."""
        if self.metrics is not None:
            self.metrics.retire(session)
