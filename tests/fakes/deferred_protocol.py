"""A test protocol whose turns are identified late (like Codex before ``turn/start`` answers).

It is ACP plus one rule: the agent names the turn with an ``x/turnIdentified`` notification,
and an interrupt can only be sent after that. It proves the actor needs no special case: the
machine remembers the cancel and sends it when it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from attrs import define

from protocols.acp import AcpClient
from protocols.content import Part
from protocols.machine import Step


@define
class DeferredAcp(AcpClient):
    name: ClassVar[str] = "deferred"
    _identified: bool = False
    _cancel_wanted: bool = False

    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        self._identified = False
        self._cancel_wanted = False
        return super().prompt(turn_id, text, parts)

    def cancel(self) -> Step:
        if not self._identified:
            self._cancel_wanted = True
            return Step()
        return super().cancel()

    def receive(self, message: dict[str, Any]) -> Step:
        if message.get("method") == "x/turnIdentified":
            self._identified = True
            return super().cancel() if self._cancel_wanted else Step()
        return super().receive(message)
