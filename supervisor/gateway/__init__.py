"""The gateway: ``agent-supervisor serve``, the supervisor behind one TCP port.

- :mod:`~supervisor.gateway.server`: :class:`Gateway`: listening, admission of connections
  among ``max_connections``, and composing the rest.
- :mod:`~supervisor.gateway.http`: HTTP (h11): reading and answering requests, the routes.
- :mod:`~supervisor.gateway.auth`: the token, the ``Origin`` and ``Host`` checks, the page's
  cookie.
- :mod:`~supervisor.gateway.websocket`: the server side of a WebSocket, on wsproto.
- :mod:`~supervisor.gateway.connection`: one WebSocket client: its reader, its writer (responses
  and events in causal order, flow control), its subscriptions.
- :mod:`~supervisor.gateway.actions`: what each call of the wire protocol does.
- :mod:`~supervisor.gateway.limits`: the bounds (:class:`GatewayLimits`).
- :mod:`~supervisor.wire.requests`: the wire protocol's requests (one typed call per action) and
  responses, without I/O.
- ``static/``: the web UI, one self-contained page.

The JSON form of events and receipts (:mod:`supervisor.wire.codec`) is shared with the runtime (a
session serializes each event once, when it emits it), so it lives beside the runtime.
"""

from supervisor.gateway.auth import is_loopback
from supervisor.gateway.limits import LIMITS, GatewayLimits
from supervisor.gateway.server import CannotListen, Gateway

__all__ = ["LIMITS", "CannotListen", "Gateway", "GatewayLimits", "is_loopback"]
