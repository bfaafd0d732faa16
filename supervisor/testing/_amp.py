"""An in-memory Amp CLI for actor tests on virtual time, behaving as the real one does.

Here the "process" is a trio task (see ``memory_base.py``). Like Amp 0.0.1790142911
(``protocols/amp.py``): ``system/init`` once, after the first prompt; a ``user`` echo, then one
whole ``assistant`` message per word, the last with ``stop_reason: end_turn`` (no ``result``
per turn). SIGINT or SIGTERM: after ``stop_delay`` it writes the ``error_during_execution``
result ("User cancelled (SIGINT/SIGTERM)") and exits 0 ``exit_delay`` later (never, when
``stop_delay`` is None: an Amp that does not answer the signal). ``threads continue`` (the
launcher's ``resume``) picks up a known thread, or exits 1 at once. ``fail-turn`` ends the turn
with Amp's error ``result`` and exits 0 (the run is over); ``crash`` exits 3 mid-turn, with no
``result`` at all.
"""

from __future__ import annotations

import signal
from typing import Any

import trio
from attrs import define

from supervisor.config import AgentSpec
from supervisor.testing._acp import AcpBehaviour
from supervisor.testing._memory import MemoryAgent, MemoryLauncher, MemoryLink

CANCELLED = "User cancelled (SIGINT/SIGTERM)"


@define
class AmpBehaviour(AcpBehaviour):
    #: from the cancelled ``result`` to the process's exit
    exit_delay: float = 0.03

    TOKENS = {**AcpBehaviour.TOKENS, "exit-delay": ("exit_delay", float)}


class AmpLauncher(MemoryLauncher[AmpBehaviour, "AmpCli"]):
    behaviour_type = AmpBehaviour

    def __init__(self, behaviour: AmpBehaviour | None = None, **kwargs: Any) -> None:
        super().__init__(behaviour, **kwargs)
        self.threads: set[str] = set()

    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> AmpCli:
        return AmpCli(link, self, resume)


class AmpCli(MemoryAgent[AmpBehaviour]):
    def __init__(self, link: MemoryLink, launcher: AmpLauncher, resume: str | None) -> None:
        super().__init__(link, launcher)
        self.threads = launcher.threads
        self.resume = resume
        self.thread = ""
        self.turn_behaviour = self.behaviour
        self.init_sent = False
        self.turns = 0
        self.stopping = False
        self.running = False
        self.steers: list[str] = []  # steered texts the running turn has not taken yet

    def on_signal(self, signum: int) -> None:
        if signum not in (signal.SIGINT, signal.SIGTERM) or self.stopping:
            return
        if self.turn_behaviour.stop_delay is not None and self.nursery is not None:
            self.stopping = True
            self.nursery.start_soon(self.cancelled)

    async def cancelled(self) -> None:
        await trio.sleep(self.turn_behaviour.stop_delay or 0.0)
        await self.end_run({"subtype": "error_during_execution", "is_error": True}, CANCELLED)

    async def end_run(self, result: dict[str, Any], error: str) -> None:
        """Amp's one ``result`` of the run, then its exit (code 0: the run itself went fine)."""
        await self.link.post(
            {
                "type": "result",
                **result,
                "duration_ms": 10,
                "num_turns": self.turns,
                "error": error,
                "session_id": self.thread,
            }
        )
        await trio.sleep(self.turn_behaviour.exit_delay)
        await self.exit(0)

    async def boot(self) -> bool:
        if self.resume is not None and self.resume not in self.threads:
            await self.exit(1)  # "Thread ... does not exist."
            return False
        self.thread = self.resume or f"T-{len(self.threads) + 1}"
        self.threads.add(self.thread)
        return True

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        text = "".join(b["text"] for b in message["message"]["content"])
        if message.get("steer") and self.running:
            # As Amp's server does: the text joins the running turn; the CLI echoes it.
            self.steers.append(text)
            return
        self.running = True
        nursery.start_soon(self.run_turn, message, text)

    async def run_turn(self, message: dict[str, Any], text: str) -> None:
        try:
            await self._run_turn(message, text)
        finally:
            self.running = False

    async def _run_turn(self, message: dict[str, Any], text: str) -> None:
        behaviour = self.turn_behaviour = self.behaviour.for_prompt(text)
        if not self.init_sent:
            self.init_sent = True
            await self.link.post({"type": "system", "subtype": "init", "session_id": self.thread})
        await self.link.post({"type": "user", "message": message["message"]})
        for index in range(behaviour.words):
            while self.steers:
                steered = self.steers.pop(0)
                user = {"role": "user", "content": [{"type": "text", "text": steered}]}
                await self.link.post({"type": "user", "message": user})
            if behaviour.crash_after is not None and index == behaviour.crash_after:
                await self.exit(3)
                return
            last = index == behaviour.words - 1 and not behaviour.fail_turn
            await self.link.post(
                {
                    "type": "assistant",
                    "message": {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "text", "text": f"w{index} "}],
                        "stop_reason": "end_turn" if last else None,
                    },
                    "session_id": self.thread,
                }
            )
            await trio.sleep(behaviour.word_interval)
        self.turns += 1
        if behaviour.fail_turn:
            # Amp's error form: the text is in ``error``, not ``result`` (shared/amp/README.md).
            result = {"subtype": "error_during_execution", "is_error": True}
            await self.end_run(result, "Upstream provider error: 529 overloaded")
