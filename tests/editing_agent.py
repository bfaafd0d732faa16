"""An in-memory ACP agent whose tool call runs the next edit its launcher is given: a test
says what each turn does to the files, in order."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from supervisor import AgentSpec
from supervisor.testing._acp import AcpAgent, AcpBehaviour, AcpLauncher

__all__ = ["EditingAgent", "EditingLauncher"]


class EditingAgent(AcpAgent):
    async def run_tool(self, seconds: float) -> None:
        launcher = self.launcher
        assert isinstance(launcher, EditingLauncher)
        if launcher.edits:
            launcher.edits.popleft()()
        elif launcher.every is not None:
            launcher.every()
        await super().run_tool(seconds)


class EditingLauncher(AcpLauncher):
    """``edits``: what each tool call does, the next one each time (none left: ``every``)."""

    def __init__(self, behaviour: AcpBehaviour) -> None:
        super().__init__(behaviour)
        self.edits: deque[Callable[[], object]] = deque()
        self.every: Callable[[], object] | None = None

    def launch(self, link: Any, spec: AgentSpec, resume: str | None) -> AcpAgent:
        return EditingAgent(link, self)
