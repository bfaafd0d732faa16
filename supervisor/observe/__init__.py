"""What an operator sees of a running supervisor: metrics to scrape, and traces.

- :mod:`~supervisor.observe.metrics`: :class:`Metrics`, the Prometheus registry
  (``open_supervisor(metrics=...)``, ``GET /metrics``).
- :mod:`~supervisor.observe.tracing`: OpenTelemetry spans per session, turn, cancel and rung
  of the ladder (``agent-supervisor[otel]``; ``open_supervisor(tracer_provider=...)``).
- :mod:`~supervisor.observe.observers`: one observer per session for both, set on its fan-out.

Both are made from the events sessions publish, so they say what clients see
(``design/observe.md``). The names are imported lazily: a supervisor with neither on loads
neither ``prometheus_client`` nor OpenTelemetry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.observe.metrics import LATENCY_BUCKETS, Metrics

_EXPORTS = {
    "LATENCY_BUCKETS": "supervisor.observe.metrics",
    "Metrics": "supervisor.observe.metrics",
}

__all__ = ["LATENCY_BUCKETS", "Metrics"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor.observe' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
