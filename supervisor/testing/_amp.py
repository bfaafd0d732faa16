"""An in-memory Amp CLI for tests on virtual time, behaving as the real one does.

Here the "process" is a trio task (see ``_memory.py``). Like Amp 0.0.1790142911
(``protocols/amp.py``): ``system/init`` once, after the first prompt; a ``user`` echo, then one
whole ``assistant`` message per word, each at the end of its ``word_interval``, the last with
``stop_reason: end_turn`` (no ``result`` per turn). SIGINT or SIGTERM: after ``stop_delay`` it
writes the ``error_during_execution`` result ("User cancelled (SIGINT/SIGTERM)") and exits 0
``exit_delay`` later (never, when ``stop_delay`` is None: an Amp that does not answer the
signal). ``threads continue`` (the launcher's ``resume``) picks up a known thread, or exits 1 at
once (every thread, for an Amp that cannot ``resume``). A steering line (``"steer": true``)
joins the running turn: echoed as a ``user`` line before the next word. A tool call is an
``assistant`` ``tool_use`` (``stop_reason: tool_use``) and its ``tool_result``. ``fail_turn``
ends the turn with Amp's error ``result`` and exits 0 (the run is over); ``crash_after`` exits 3
mid-turn, with no ``result`` at all. Amp has no permission protocol in this mode, and takes
every steer.

Prompt tokens beyond the shared ones (``_memory.Behaviour``): ``ignore-cancel``,
``exit-delay=S``.
"""

from __future__ import annotations

import signal
from typing import Any, Final

import trio
from attrs import define

from supervisor.config import AgentSpec
from supervisor.testing._memory import (
    TOOL_CALL_ID,
    TOOL_COMMAND,
    Behaviour,
    MemoryAgent,
    MemoryLauncher,
    MemoryLink,
    never,
)

CANCELLED: Final = "User cancelled (SIGINT/SIGTERM)"


@define
class AmpBehaviour(Behaviour):
    #: from the cancelled ``result`` to the process's exit
    exit_delay: float = 0.03

    TOKENS = {
        **Behaviour.TOKENS,
        "ignore-cancel": ("stop_delay", never),
        "exit-delay": ("exit_delay", float),
    }


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
        self.finished_turns = 0
        self.stopping = False
        self.running = False
        self.queued_steers: list[str] = []  # steered texts the running turn has not taken yet

    def on_signal(self, signum: int) -> None:
        if signum not in (signal.SIGINT, signal.SIGTERM) or self.stopping:
            return
        if self.nursery is None:
            return
        if self.turn_behaviour.crash_on_cancel:
            self.stopping = True
            self.nursery.start_soon(self.crash)
        elif self.turn_behaviour.stop_delay is not None:
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
                "num_turns": self.finished_turns,
                "error": error,
                "session_id": self.thread,
            }
        )
        await trio.sleep(self.turn_behaviour.exit_delay)
        await self.exit(0)

    async def boot(self) -> bool:
        if self.resume is not None and (
            self.resume not in self.threads or not self.behaviour.resumes
        ):
            await self.exit(1)  # "Thread ... does not exist."
            return False
        if not await super().boot():
            return False
        self.thread = self.resume or f"T-{len(self.threads) + 1}"
        self.threads.add(self.thread)
        return True

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        text = "".join(b["text"] for b in message["message"]["content"])
        if message.get("steer") and self.running:
            # As Amp's server does: the text joins the running turn; the CLI echoes it.
            self.queued_steers.append(text)
            return
        self.running = True
        self.turns.append(text)
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
        words = behaviour.said()
        said = 0

        async def say(word: str) -> None:
            # A message is written whole, so once its time is over: the last, which ends the
            # turn, ``word_interval`` after the one before, as the other fakes end theirs.
            nonlocal said
            await trio.sleep(behaviour.word_interval)
            await self.take_steers()
            said += 1
            last = said == len(words) and not behaviour.fail_turn
            await self.assistant([{"type": "text", "text": word}], "end_turn" if last else None)

        await self.speak(behaviour, say, tool=self.run_tool, interval=0.0)
        self.finished_turns += 1
        if behaviour.fail_turn:
            # Amp's error form: the text is in ``error``, not ``result`` (shared/amp/README.md).
            result = {"subtype": "error_during_execution", "is_error": True}
            await self.end_run(result, "Upstream provider error: 529 overloaded")
        elif not words:
            await self.assistant([], "end_turn")

    async def take_steers(self) -> None:
        while self.queued_steers:
            steered = self.queued_steers.pop(0)
            self.steers.append(steered)
            user = {"role": "user", "content": [{"type": "text", "text": steered}]}
            await self.link.post({"type": "user", "message": user})

    async def assistant(self, content: list[dict[str, Any]], stop_reason: str | None) -> None:
        await self.link.post(
            {
                "type": "assistant",
                "message": {
                    "type": "message",
                    "role": "assistant",
                    "content": content,
                    "stop_reason": stop_reason,
                },
                "session_id": self.thread,
            }
        )

    async def run_tool(self, seconds: float) -> None:
        tool_input = {"cmd": TOOL_COMMAND}
        use = {"type": "tool_use", "id": TOOL_CALL_ID, "name": "Bash", "input": tool_input}
        await self.assistant([use], "tool_use")
        await trio.sleep(seconds)
        result = {"type": "tool_result", "tool_use_id": TOOL_CALL_ID, "content": "ok"}
        await self.link.post({"type": "user", "message": {"role": "user", "content": [result]}})
