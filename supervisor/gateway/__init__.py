"""The gateway: ``agent-supervisor serve``, the supervisor behind one TCP port.

- :mod:`~supervisor.gateway.http`: HTTP (h11), the routes, the token and origin checks, and one
  client per WebSocket (its writer sends responses and events in causal order).
- :mod:`~supervisor.gateway.websocket`: the server side of a WebSocket, on wsproto.
- :mod:`~supervisor.wire.requests`: the wire protocol's requests and responses, without I/O.
- ``static/``: the web UI, one self-contained page.

The JSON form of events and receipts (:mod:`supervisor.wire.codec`) is shared with the runtime (a
session serializes each event once, when it emits it), so it lives beside the runtime.
"""

from supervisor.gateway.http import LIMITS, Gateway, GatewayLimits, is_loopback

__all__ = ["LIMITS", "Gateway", "GatewayLimits", "is_loopback"]
