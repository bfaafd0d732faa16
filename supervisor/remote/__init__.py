"""Sessions on other hosts: a node on each host owns them, the front drives it over a transport.

- :mod:`~supervisor.remote.hosts`: ``[hosts.NAME]`` in the configuration.
- :mod:`~supervisor.remote.node`: ``agent-supervisor node`` (the daemon that owns a host's
  sessions, behind the gateway's wire protocol) and ``node --bridge`` (what the transport
  runs: it starts the node if need be and relays its stdio to it).
- :mod:`~supervisor.remote.handshake`: the bridge's hello line (version, instance, port).
- :mod:`~supervisor.remote.link`: the front's link to one node (WebSocket over the transport's
  stdio; reconnection, resubscription from the last seq).
- :mod:`~supervisor.remote.session`: :class:`RemoteSession`, the front's proxy with the API of
  a local session.
- :mod:`~supervisor.remote.front`: placement of new sessions on hosts.

See ``design/remote.md``.
"""

from supervisor.remote.errors import HostCapacity, HostUnreachable, LinkLost
from supervisor.remote.hosts import HostSpec, load_hosts
from supervisor.remote.session import RemoteSession

__all__ = ["HostCapacity", "HostSpec", "HostUnreachable", "LinkLost", "RemoteSession", "load_hosts"]
