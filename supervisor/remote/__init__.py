"""Sessions on other hosts: a node on each host owns them, the front drives it over a transport.

- :mod:`~supervisor.remote.hosts`: ``[hosts.NAME]`` in the configuration.
- :mod:`~supervisor.node.daemon`: ``agent-supervisor node``, the daemon that owns a host's
  sessions, behind the gateway's wire protocol on a Unix socket.
- :mod:`~supervisor.node.bridge`: ``node --bridge``, what the transport runs: it starts the
  node if need be and relays its stdio to it (standard library only: it starts fast).
- :mod:`~supervisor.remote.version`: the wire's number and the package's version.
- :mod:`~supervisor.remote.handshake`: the bridge's hello line (wire, version, instance).
- :mod:`~supervisor.remote.link`: the front's link to one node (WebSocket over the transport's
  stdio; reconnection, resubscription from the last seq).
- :mod:`~supervisor.remote.frames`: what a node sends, judged at the door (a violation ends its
  link as ``protocol_error``).
- :mod:`~supervisor.remote.session`: :class:`RemoteSession`, the front's proxy with the API of
  a local session.
- :mod:`~supervisor.remote.front`: placement of new sessions on hosts.
- :mod:`~supervisor.remote.record`: the front's record of its node sessions, for the next front.

See ``design/remote.md``. The names below are imported lazily, so the bridge, a submodule,
starts without loading the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.remote.errors import HostCapacity, HostUnreachable, LinkLost, NodeRetired
    from supervisor.remote.hosts import HostSpec, load_hosts
    from supervisor.remote.session import RemoteSession

_EXPORTS = {
    "HostCapacity": "supervisor.remote.errors",
    "HostUnreachable": "supervisor.remote.errors",
    "LinkLost": "supervisor.remote.errors",
    "NodeRetired": "supervisor.remote.errors",
    "HostSpec": "supervisor.remote.hosts",
    "load_hosts": "supervisor.remote.hosts",
    "RemoteSession": "supervisor.remote.session",
}

__all__ = [
    "HostCapacity",
    "HostSpec",
    "HostUnreachable",
    "LinkLost",
    "NodeRetired",
    "RemoteSession",
    "load_hosts",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor.remote' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
