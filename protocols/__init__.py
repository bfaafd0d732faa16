"""Sans-IO agent protocol machines: decoded messages in, messages to send and events out.

Nothing in this package does I/O or imports trio. ``PROTOCOLS`` maps the ``protocol`` value of
an agent's configuration to its machine (imported when first used); adding a protocol means
adding an entry here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Final

from protocols.machine import AgentProtocol

__all__ = ["PROTOCOLS", "AgentProtocol", "new_machine"]


class _Registry(MutableMapping[str, type[AgentProtocol]]):
    """Protocol name -> machine class, each module imported when its protocol is first used:
    together they take ~50 ms to import, and a supervisor usually runs one or two of them."""

    def __init__(self, modules: dict[str, str]) -> None:
        self._modules = modules  # name -> "module:Class"
        self._loaded: dict[str, type[AgentProtocol]] = {}

    def __getitem__(self, name: str) -> type[AgentProtocol]:
        found = self._loaded.get(name)
        if found is None:
            module, _, attribute = self._modules[name].partition(":")
            found = getattr(importlib.import_module(module), attribute)
            assert found is not None and found.name == name, f"{module} is not {name!r}"
            self._loaded[name] = found
        return found

    def __setitem__(self, name: str, machine: type[AgentProtocol]) -> None:
        self._loaded[name] = machine

    def __delitem__(self, name: str) -> None:
        found = self._loaded.pop(name, None)
        if self._modules.pop(name, None) is None and found is None:
            raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self._modules), **dict.fromkeys(self._loaded)})

    def __len__(self) -> int:
        return len(self._modules.keys() | self._loaded.keys())


PROTOCOLS: Final[MutableMapping[str, type[AgentProtocol]]] = _Registry(
    {
        "acp": "protocols.acp:AcpClient",
        "amp": "protocols.amp:AmpClient",
        "claude": "protocols.claude:ClaudeClient",
        "codex": "protocols.codex:CodexClient",
        "opencode": "protocols.opencode:OpenCodeClient",
        "terminal": "protocols.terminal:TerminalClient",
    }
)


def new_machine(protocol: str, settings: object | None = None) -> AgentProtocol:
    """A fresh machine for one agent process speaking ``protocol``, with the agent's
    ``settings`` for it, if the protocol takes any (:meth:`AgentProtocol.configured`)."""
    try:
        machine = PROTOCOLS[protocol]
    except KeyError:
        raise ValueError(
            f"unknown protocol {protocol!r} (known: {', '.join(sorted(PROTOCOLS))})"
        ) from None
    return machine.configured(settings)
