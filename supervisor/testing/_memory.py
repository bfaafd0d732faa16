"""What every in-memory agent shares: the link, the launcher, the process that is a trio task.

An in-memory agent plugs into the session through the same ``Launcher`` signature as a real
process, but its "process" is a trio task: messages are dicts, a kill is a cancel scope, and
every delay is virtual, so tests can assert exact receipt times. A protocol's fake
(``memory_agent.py`` for ACP, ``memory_amp.py``, ``memory_claude.py``, ``memory_codex.py``,
``memory_opencode.py``) adds only what its protocol says: a :class:`Behaviour` with its
knobs and prompt tokens, a :class:`MemoryAgent` that answers messages, and a
:class:`MemoryLauncher` that says how a launch starts one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Self, TypeVar

import attrs
import trio
from attrs import define, field

from protocols.framing import Message
from supervisor.agents.link import AgentFrame, AgentGone, AgentLink, Inbox
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus

#: A prompt token's effect: the field it sets and how its ``=value`` becomes that field's value.
Token = tuple[str, Callable[[str], Any]]


def on(_: str) -> bool:
    """A bare token that switches its field on (``permission``)."""
    return True


def never(_: str) -> None:
    """A bare token that sets its delay to None: it never happens (``wedged``)."""
    return None


@define
class Behaviour:
    """What every fake can be told: how much it says and how fast, how it stops and dies.

    Set per launcher; :meth:`for_prompt` overrides it for one prompt with the tokens of
    ``TOKENS`` in the prompt text (``words=3 stop-delay=0.5``); other words are ignored.
    """

    words: int = 10
    word_interval: float = 0.1
    stop_delay: float | None = 0.0  # None: the protocol's interrupt is not obeyed (wedged)
    start_delay: float = 0.0
    ignores_sigterm: bool = False  # a kill then takes the launcher's kill_timeout
    kill_time: float = 0.0  # virtual time a kill takes after SIGTERM
    close_time: float = 0.0  # virtual time it takes to exit once its stdin is closed

    TOKENS: ClassVar[dict[str, Token]] = {
        "stop-delay": ("stop_delay", float),
        "words": ("words", int),
        "interval": ("word_interval", float),
    }

    def for_prompt(self, text: str) -> Self:
        changes: dict[str, Any] = {}
        for token in text.split():
            key, _, value = token.partition("=")
            if key in self.TOKENS:
                name, convert = self.TOKENS[key]
                changes[name] = convert(value)
        return attrs.evolve(self, **changes)


B = TypeVar("B", bound=Behaviour)
A = TypeVar("A", bound="MemoryAgent[Any]")


@define
class Store:
    """What survives a kill, like the agent's files on disk: session histories."""

    sessions: dict[str, list[str]] = field(factory=dict)
    counter: int = 0


class MemoryLink(AgentLink):
    """The supervisor's end of one in-memory process; kills follow the launcher's behaviour."""

    def __init__(self, launcher: MemoryLauncher[Any, Any], generation: int, inbox: Inbox):
        self.generation = generation
        self.launcher = launcher
        self.inbox = inbox
        self.to_agent_send, self.to_agent = trio.open_memory_channel[dict[str, Any]](math.inf)
        self.sent: list[dict[str, Any]] = []
        #: sent while writes are held (``hold_writes``), not yet given to the agent
        self.held: list[dict[str, Any]] | None = None
        self.scope = trio.CancelScope()
        self.alive = True
        self.signals: list[int] = []
        self.agent: MemoryAgent[Any] | None = None

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if self.held is not None:
            self.held.append(message)
        else:
            self.deliver(message)

    def hold_writes(self) -> None:
        """As a pipe's link does: what is sent meanwhile reaches the agent on release."""
        if self.held is None:
            self.held = []

    def release_writes(self) -> None:
        held, self.held = self.held, None
        for message in held or ():
            self.deliver(message)

    def deliver(self, message: dict[str, Any]) -> None:
        """The message reaches the agent (a pipe's link: it is written)."""
        self.launcher.log.append(("to_agent", self.generation, message))
        if self.alive:
            self.to_agent_send.send_nowait(message)

    def signal(self, signum: int) -> None:
        if self.held:
            self.release_writes()  # what was sent before it reaches the agent before it
            self.hold_writes()
        self.signals.append(signum)
        if self.agent is not None:
            self.agent.on_signal(signum)

    async def memory_mb(self) -> float | None:
        """What the fake says its tree holds (``MemoryAgent.memory_mb``); None once dead."""
        if not self.alive or self.agent is None:
            return None
        return self.agent.memory_mb

    async def kill(self) -> list[str]:
        if not self.alive:
            return []
        steps = ["sigterm"]
        if self.launcher.behaviour.ignores_sigterm:
            await trio.sleep(self.launcher.spec_kill_timeout)
            steps.append("sigkill")
        elif self.launcher.behaviour.kill_time:
            await trio.sleep(self.launcher.behaviour.kill_time)
        self._die()
        self.launcher.kills.append((self.generation, steps))
        return steps

    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        if self.launcher.behaviour.close_time:
            await trio.sleep(self.launcher.behaviour.close_time)
        self._die()
        return ExitStatus(code=0, signal=None), []

    def _die(self) -> None:
        self.alive = False
        self.scope.cancel()

    @property
    def stderr_tail(self) -> list[str]:
        return ["fake agent stderr"]

    async def post(self, message: dict[str, Any]) -> None:
        self.launcher.log.append(("from_agent", self.generation, message))
        await self.post_output(AgentFrame(self.generation, Message(message)), self.inbox)


class MemoryAgent(Generic[B]):
    """One in-memory process: :meth:`boot`, then :meth:`handle` every message until killed."""

    def __init__(self, link: MemoryLink, launcher: MemoryLauncher[B, Any]):
        self.link = link
        self.launcher = launcher
        self.behaviour: B = launcher.behaviour
        self.store = launcher.store
        self.nursery: trio.Nursery | None = None
        #: what the tree "holds", for ``max_memory_mb`` (a test sets it)
        self.memory_mb: float = launcher.memory_mb

    async def run(self) -> None:
        with self.link.scope:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                if await self.boot():
                    async for message in self.link.to_agent:
                        await self.handle(message, nursery)

    async def boot(self) -> bool:
        """Start-up before the first message is read; False when the process exits instead."""
        if await self.crashed_at_launch():
            return False
        if self.behaviour.start_delay:
            await trio.sleep(self.behaviour.start_delay)
        return True

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        raise NotImplementedError

    def on_signal(self, signum: int) -> None:
        """A signal the supervisor sent (after it is recorded on the link): ignored."""

    async def crashed_at_launch(self) -> bool:
        """Exit 1 at once when this launch is one the launcher was told to crash."""
        if len(self.launcher.links) not in self.launcher.crash_on_launch:
            return False
        await self.exit(1)
        return True

    async def exit(self, code: int) -> None:
        self.link.alive = False
        status = ExitStatus(code=code, signal=None)
        await self.link.inbox.send(AgentGone(self.link.generation, status))
        self.link.scope.cancel()


class MemoryLauncher(Generic[B, A]):
    """A ``Launcher`` whose processes are :class:`MemoryAgent` tasks; records what happened.

    A protocol's launcher names its behaviour type and says in :meth:`launch` which agent a
    launch starts.
    """

    behaviour_type: type[B]

    def __init__(
        self,
        behaviour: B | None = None,
        *,
        kill_timeout: float = 1.0,
        crash_on_launch: frozenset[int] = frozenset(),
    ):
        self.behaviour: B = behaviour or self.behaviour_type()
        self.crash_on_launch = crash_on_launch  # launch numbers (1-based) that die at once
        self.spec_kill_timeout = kill_timeout
        self.store = Store()
        #: what each agent's tree "holds" when it starts (``max_memory_mb`` tests change it)
        self.memory_mb = 10.0
        self.links: list[MemoryLink] = []
        self.agents: list[A] = []
        self.resumes: list[str | None] = []
        self.kills: list[tuple[int, list[str]]] = []
        self.log: list[tuple[str, int, dict[str, Any]]] = []
        #: protocol rules the client broke, as the fake noticed them
        self.violations: list[str] = []

    async def __call__(
        self,
        spec: AgentSpec,
        *,
        cwd: str,
        resume: str | None,
        generation: int,
        inbox: Inbox,
        nursery: trio.Nursery,
    ) -> AgentLink:
        link = MemoryLink(self, generation, inbox)
        self.links.append(link)
        self.resumes.append(resume)
        agent = self.launch(link, spec, resume)
        link.agent = agent
        self.agents.append(agent)
        nursery.start_soon(agent.run)
        return link

    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> A:
        """The agent this launch starts (not running yet)."""
        raise NotImplementedError

    def sent_methods(self) -> list[str]:
        return [m.get("method", "<response>") for kind, _, m in self.log if kind == "to_agent"]
