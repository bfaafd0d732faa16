"""An in-memory Amp CLI for actor tests on virtual time.

Amp has no in-band interrupt: the supervisor's cancel is SIGINT, which ends Amp's whole run.
Here the "process" is a trio task (see ``memory_agent.py``); ``signal(SIGINT)`` ends it after
``stop_delay`` (or never, when ``stop_delay`` is None: an Amp that ignores SIGINT), and
``threads continue`` (the launcher's ``resume``) picks up a known thread.
"""

from __future__ import annotations

import signal
from typing import Any

import trio

from fakes.memory_agent import Behaviour, MemoryLauncher, MemoryLink
from supervisor.config import AgentSpec
from supervisor.link import AgentGone, AgentLink
from supervisor.process import ExitStatus


class AmpLink(MemoryLink):
    def signal(self, signum: int) -> None:
        super().signal(signum)
        if signum == signal.SIGINT and self.on_sigint is not None:
            self.on_sigint()

    on_sigint: Any = None


class AmpMemoryLauncher(MemoryLauncher):
    def __init__(self, behaviour: Behaviour | None = None, **kwargs: Any) -> None:
        super().__init__(behaviour, **kwargs)
        self.threads: set[str] = set()
        self.resumes: list[str | None] = []

    async def __call__(
        self,
        spec: AgentSpec,
        *,
        cwd: str,
        resume: str | None,
        generation: int,
        inbox: trio.MemorySendChannel[Any],
        nursery: trio.Nursery,
    ) -> AgentLink:
        link = AmpLink(self, generation, inbox)
        self.links.append(link)
        self.resumes.append(resume)
        nursery.start_soon(FakeAmp(link, self, resume).run)
        return link


class FakeAmp:
    def __init__(self, link: AmpLink, launcher: AmpMemoryLauncher, resume: str | None) -> None:
        self.link = link
        self.launcher = launcher
        self.resume = resume
        self.stop_delay: float | None = launcher.behaviour.stop_delay
        link.on_sigint = self.on_sigint
        self.nursery: trio.Nursery | None = None

    def on_sigint(self) -> None:
        if self.stop_delay is not None and self.nursery is not None:
            self.nursery.start_soon(self.exit_after, self.stop_delay)

    async def exit_after(self, delay: float) -> None:
        await trio.sleep(delay)
        self.link.alive = False
        await self.link.inbox.send(
            AgentGone(self.link.generation, ExitStatus(code=130, signal=None))
        )
        self.link.scope.cancel()

    async def run(self) -> None:
        with self.link.scope:
            if self.resume is not None and self.resume not in self.launcher.threads:
                self.link.alive = False
                await self.link.inbox.send(
                    AgentGone(self.link.generation, ExitStatus(code=1, signal=None))
                )
                return
            thread = self.resume or f"T-{len(self.launcher.threads) + 1}"
            self.launcher.threads.add(thread)
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                async for message in self.link.to_agent:
                    text = "".join(b["text"] for b in message["message"]["content"])
                    behaviour = self.launcher.behaviour.for_prompt(text)
                    self.stop_delay = behaviour.stop_delay
                    await self.link.post(
                        {"type": "system", "subtype": "init", "session_id": thread}
                    )
                    for index in range(behaviour.words):
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
                    await self.link.post(
                        {
                            "type": "result",
                            "subtype": "success",
                            "is_error": False,
                            "session_id": thread,
                        }
                    )
