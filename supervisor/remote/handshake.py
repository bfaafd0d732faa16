"""What the bridge says first, before the WebSocket: who the node is, where, and its version.

The bridge (``agent-supervisor node --bridge``, on the host) writes one JSON line on its stdout
and then relays bytes both ways between its stdio and the node's gateway socket::

    {"agent_supervisor_node": 1, "version": "0.1.0", "instance": "...", "pid": 4242,
     "port": 40123, "token": "..."}

``agent_supervisor_node`` is the version of this handshake (and of the wire protocol spoken
over it); ``instance`` is new for every node process, so a front tells a node that restarted
(its sessions are gone) from a link that only dropped. The front refuses a node of another
``version``: front and node are the same program, and their events must mean the same.
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any, Final

import cattrs
from attrs import frozen

from supervisor.config import AgentSpec

__all__ = ["HANDSHAKE", "Hello", "package_version", "spec_from_wire", "spec_to_wire"]

#: Bump when the bridge's handshake or what the front asks of a node changes.
HANDSHAKE: Final = 1
#: The longest hello line we read: it is ~200 bytes.
MAX_HELLO_BYTES: Final = 4096


def package_version() -> str:
    try:
        return metadata.version("agent-supervisor")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


@frozen(kw_only=True)
class Hello:
    version: str
    instance: str
    pid: int
    port: int
    token: str
    handshake: int = HANDSHAKE

    def line(self) -> bytes:
        return (
            json.dumps(
                {
                    "agent_supervisor_node": self.handshake,
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
                handshake=int(message["agent_supervisor_node"]),
                version=str(message["version"]),
                instance=str(message["instance"]),
                pid=int(message["pid"]),
                port=int(message["port"]),
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
