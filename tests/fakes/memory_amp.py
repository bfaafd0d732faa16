"""An in-memory Amp CLI for actor tests on virtual time.

Amp has no in-band interrupt: the supervisor's cancel is SIGINT, which ends Amp's whole run.
Here the "process" is a trio task (see ``memory_base.py``); ``signal(SIGINT)`` ends it after
``stop_delay`` (or never, when ``stop_delay`` is None: an Amp that ignores SIGINT), and
``threads continue`` (the launcher's ``resume``) picks up a known thread. ``fail-turn`` ends the
turn with Amp's error ``result``; ``crash`` exits 3 mid-turn, with no ``result`` at all.
"""

from __future__ import annotations

import signal
from typing import Any

import trio

from fakes.memory_agent import Behaviour
from fakes.memory_base import BaseLauncher, MemoryAgent, MemoryLink
from supervisor.config import AgentSpec


class AmpMemoryLauncher(BaseLauncher[Behaviour, "FakeAmp"]):
    behaviour_type = Behaviour

    def __init__(self, behaviour: Behaviour | None = None, **kwargs: Any) -> None:
        super().__init__(behaviour, **kwargs)
        self.threads: set[str] = set()

    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> FakeAmp:
        return FakeAmp(link, self, resume)


class FakeAmp(MemoryAgent[Behaviour]):
    def __init__(self, link: MemoryLink, launcher: AmpMemoryLauncher, resume: str | None) -> None:
        super().__init__(link, launcher)
        self.threads = launcher.threads
        self.resume = resume
        self.thread = ""
        self.stop_delay: float | None = self.behaviour.stop_delay

    def on_signal(self, signum: int) -> None:
        if signum == signal.SIGINT and self.stop_delay is not None and self.nursery is not None:
            self.nursery.start_soon(self.exit_after, self.stop_delay)

    async def exit_after(self, delay: float) -> None:
        await trio.sleep(delay)
        await self.exit(130)

    async def boot(self) -> bool:
        if self.resume is not None and self.resume not in self.threads:
            await self.exit(1)
            return False
        self.thread = self.resume or f"T-{len(self.threads) + 1}"
        self.threads.add(self.thread)
        return True

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        text = "".join(b["text"] for b in message["message"]["content"])
        behaviour = self.behaviour.for_prompt(text)
        self.stop_delay = behaviour.stop_delay
        await self.link.post({"type": "system", "subtype": "init", "session_id": self.thread})
        for index in range(behaviour.words):
            if behaviour.crash_after is not None and index == behaviour.crash_after:
                await self.exit(3)
                return
            await self.link.post(
                {
                    "type": "assistant",
                    "message": {
                        "id": f"m{index}",
                        "content": [{"type": "text", "text": f"w{index} "}],
                    },
                }
            )
            await trio.sleep(behaviour.word_interval)
        if behaviour.fail_turn:
            # Amp's error form: the text is in ``error``, not ``result`` (shared/amp/README.md).
            await self.link.post(
                {
                    "type": "result",
                    "subtype": "error_during_execution",
                    "is_error": True,
                    "num_turns": 1,
                    "error": "Upstream provider error: 529 overloaded",
                    "session_id": self.thread,
                }
            )
            return
        await self.link.post(
            {"type": "result", "subtype": "success", "is_error": False, "session_id": self.thread}
        )
