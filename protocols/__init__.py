"""Sans-IO agent protocol machines: decoded messages in, messages to send and events out.

Nothing in this package does I/O or imports trio. ``PROTOCOLS`` maps the ``protocol`` value of
an agent's configuration to its machine; adding a protocol means adding an entry here.
"""

from __future__ import annotations

from protocols.acp import AcpClient
from protocols.amp import AmpClient
from protocols.claude import ClaudeClient
from protocols.codex import CodexClient
from protocols.machine import AgentProtocol
from protocols.opencode import OpenCodeClient

__all__ = ["PROTOCOLS", "AgentProtocol", "new_machine"]

PROTOCOLS: dict[str, type[AgentProtocol]] = {
    AcpClient.name: AcpClient,
    AmpClient.name: AmpClient,
    ClaudeClient.name: ClaudeClient,
    CodexClient.name: CodexClient,
    OpenCodeClient.name: OpenCodeClient,
}


def new_machine(protocol: str) -> AgentProtocol:
    """A fresh machine for one agent process speaking ``protocol``."""
    try:
        return PROTOCOLS[protocol]()
    except KeyError:
        raise ValueError(
            f"unknown protocol {protocol!r} (known: {', '.join(sorted(PROTOCOLS))})"
        ) from None
