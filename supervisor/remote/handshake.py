"""What the bridge says first, before the WebSocket: who the node is, its wire and version.

The bridge (``agent-supervisor node --bridge``, on the host) writes one JSON line on its stdout
and then relays bytes both ways between its stdio and the node's Unix socket::

    {"agent_supervisor_node": 2, "version": "0.1.0", "instance": "...", "pid": 4242,
     "port": 0, "token": "..."}

``agent_supervisor_node`` is the wire's number (``supervisor/remote/version.py``): a front
refuses a node of another one (``version_mismatch``, naming both) and works with a node of
any package ``version`` that speaks its wire. ``instance`` is new for every node process, so a
front tells a node that restarted (its sessions are gone) from a link that only dropped.
``port`` is 0: the node listens on a Unix socket, and the front's WebSocket handshake names
``127.0.0.1:0`` as its ``Host``.
"""

from __future__ import annotations

import json
from typing import Any, Final

import cattrs
from attrs import frozen

from supervisor.config import AgentSpec
from supervisor.remote.version import WIRE, package_version, wire

__all__ = ["WIRE", "Hello", "package_version", "spec_from_wire", "spec_to_wire", "wire"]

#: The longest hello line we read: it is ~200 bytes.
MAX_HELLO_BYTES: Final = 4096


@frozen(kw_only=True)
class Hello:
    version: str
    instance: str
    pid: int
    token: str
    #: the wire's number (``supervisor/remote/version.py``)
    wire: int = WIRE
    #: 0: the node listens on a Unix socket (the bridge connects there)
    port: int = 0

    def line(self) -> bytes:
        return (
            json.dumps(
                {
                    "agent_supervisor_node": self.wire,
                    "version": self.version,
                    "instance": self.instance,
                    "pid": self.pid,
                    "port": self.port,
                    "token": self.token,
                }
            ).encode()
            + b"\n"
        )

    @classmethod
    def parse(cls, line: bytes) -> Hello | None:
        """The hello, or None if ``line`` is not one (a shell's banner, a stray message)."""
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if not isinstance(message, dict) or "agent_supervisor_node" not in message:
            return None
        try:
            return cls(
                wire=int(message["agent_supervisor_node"]),
                version=str(message["version"]),
                instance=str(message["instance"]),
                pid=int(message["pid"]),
                port=int(message.get("port", 0)),
                token=str(message["token"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


_converter = cattrs.Converter()


def spec_to_wire(spec: AgentSpec) -> dict[str, Any]:
    """An agent's definition as the front sends it to a node (``session.start`` ``spec``):
    the node runs the front's agent, resolved on the host (``command`` by the host's PATH)."""
    wire: dict[str, Any] = _converter.unstructure(spec)
    wire.pop("hosts", None)  # on the node it runs where it is
    return wire


def spec_from_wire(name: str, wire: dict[str, Any]) -> AgentSpec:
    """The node's side of :func:`spec_to_wire`; raises ``ValueError`` on a malformed one."""
    try:
        spec = _converter.structure({**wire, "name": name, "hosts": []}, AgentSpec)
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"agent spec {name!r}: {exc}") from None
    return spec
