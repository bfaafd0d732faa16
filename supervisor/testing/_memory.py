"""What every in-memory agent shares: the link, the launcher, the process that is a trio task.

An in-memory agent plugs into the session through the same ``Launcher`` signature as a real
process, but its "process" is a trio task: messages are dicts, a kill is a cancel scope, and
every delay is virtual, so tests can assert exact receipt times. A protocol's fake (``_acp.py``,
``_amp.py``, ``_claude.py``, ``_codex.py``, ``_opencode.py``) adds only what its protocol says:
a :class:`Behaviour` with its knobs and prompt tokens, a :class:`MemoryAgent` that answers
messages, and a :class:`MemoryLauncher` that says how a launch starts one.

What each fake does with the knobs every protocol shares (:class:`Behaviour`), in its own words
on the wire, is :meth:`MemoryAgent.speak`: the words of :meth:`Behaviour.said`, one every
``word_interval``, with a permission, a tool call, a crash or silence before word N. The
interrupt is obeyed ``stop_delay`` later (never when None), or answered by an exit
(``crash_on_cancel``). The public face of all this is ``_fake.FakeAgent``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, Final, Generic, Self, TypeVar

import attrs
import trio
from attrs import define, field

from protocols.framing import Message
from supervisor.agents.link import AgentFrame, AgentGone, AgentLink, AgentStderrLines, Inbox
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus

#: A prompt token's effect: the field it sets and how its ``=value`` becomes that field's value.
Token = tuple[str, Callable[[str], Any]]

#: The exit code of a fake that crashes (``crash_after``, ``crash_on_cancel``): not 0, and not
#: 1, which is what the agents' own start-up failures exit with.
CRASH_EXIT_CODE: Final = 3
#: What a silent fake (``silent_after``) writes to stderr while it says nothing about the turn.
SILENT_LINE: Final = "waiting for the model"
#: Its stderr's pace meanwhile (a real agent's keep-alive logging): once a virtual second.
SILENT_LOG_INTERVAL_S: Final = 1.0
#: The tool call a fake runs (``tool``): its id, and the command it says it runs.
TOOL_CALL_ID: Final = "call_tool"
TOOL_COMMAND: Final = "make test"
#: A word of an answer: what is not space, and the spaces after it (so the words join back).
_WORD = re.compile(r"\S+\s*")


def on(_: str) -> bool:
    """A bare token that switches its field on (``permission``)."""
    return True


def never(_: str) -> None:
    """A bare token that sets its delay to None: it never happens (``wedged``)."""
    return None


@define
class Behaviour:
    """What every fake can be told: what it says and how fast, how it stops and dies.

    Set per launcher; :meth:`for_prompt` makes the one a prompt runs with: ``script``'s answer
    to the prompt, and (with ``prompt_tokens``) the tokens of ``TOKENS`` in the prompt text
    (``words=3 stop-delay=0.5``; other words are ignored).
    """

    #: how many words a turn says when ``text`` is None: ``w0 ``, ``w1 ``, ...
    words: int = 10
    #: what a turn says, a word at a time (None: ``words`` numbered words)
    text: str | None = None
    #: the ``text`` for each prompt, from the prompt's text (None: ``text`` for every prompt)
    script: Callable[[str], str] | None = None
    #: whether prompt texts carry tokens (``words=3``) that change how their turn goes
    prompt_tokens: bool = True
    word_interval: float = 0.1
    stop_delay: float | None = 0.0  # None: the protocol's interrupt is not obeyed (wedged)
    crash_on_cancel: bool = False  # the interrupt makes it exit instead (CRASH_EXIT_CODE)
    start_delay: float = 0.0  # from the launch to the answer of the handshake
    ignores_sigterm: bool = False  # a kill then takes the spec's kill_timeout_s
    kill_time: float = 0.0  # virtual time a kill takes after SIGTERM
    close_time: float = 0.0  # virtual time it takes to exit once its stdin is closed
    permission: bool = False  # asks a permission before word ``tool_at``
    tool: float | None = None  # seconds a tool call runs, silently, before word ``tool_at``
    tool_at: int = 1  # the word the permission and the tool come before
    silent_after: int | None = None  # words said before the agent goes silent (a stall)
    crash_after: int | None = None  # words said before the process exits mid-turn
    fail_turn: bool = False  # the turn ends with the agent's error once its words are out
    resumes: bool = True  # False: a respawned process cannot go on with the conversation

    TOKENS: ClassVar[dict[str, Token]] = {
        "stop-delay": ("stop_delay", float),
        "words": ("words", int),
        "interval": ("word_interval", float),
        "permission": ("permission", on),
        "crash": ("crash_after", lambda value: int(value or 1)),
        "fail-turn": ("fail_turn", on),
        "silent-after": ("silent_after", int),
        "tool": ("tool", float),
    }

    def for_prompt(self, text: str) -> Self:
        changes: dict[str, Any] = {}
        if self.script is not None:
            changes["text"] = self.script(text)
        if self.prompt_tokens:
            for token in text.split():
                key, _, value = token.partition("=")
                if key in self.TOKENS:
                    name, convert = self.TOKENS[key]
                    changes[name] = convert(value)
        return attrs.evolve(self, **changes)

    def said(self) -> list[str]:
        """The words of a turn's answer, each with the spaces after it: they join to ``text``
        (but for its leading spaces)."""
        if self.text is None:
            return [f"w{index} " for index in range(self.words)]
        return _WORD.findall(self.text)


B = TypeVar("B", bound=Behaviour)
A = TypeVar("A", bound="MemoryAgent[Any]")


@define
class Store:
    """What survives a kill, like the agent's files on disk: session histories."""

    sessions: dict[str, list[str]] = field(factory=dict)
    counter: int = 0


class MemoryLink(AgentLink):
    """The supervisor's end of one in-memory process; kills follow the launcher's behaviour."""

    def __init__(
        self, launcher: MemoryLauncher[Any, Any], generation: int, inbox: Inbox, spec: AgentSpec
    ):
        self.generation = generation
        self.launcher = launcher
        self.inbox = inbox
        self.spec = spec
        self.to_agent_send, self.to_agent = trio.open_memory_channel[dict[str, Any]](math.inf)
        #: what the supervisor sent, in order (written to the agent, or held: ``hold_writes``)
        self.sent: list[dict[str, Any]] = []
        #: what reached the agent while it ran, in order
        self.received: list[dict[str, Any]] = []
        #: what the agent wrote, in order
        self.written: list[dict[str, Any]] = []
        #: sent while writes are held (``hold_writes``), not yet given to the agent
        self.held: list[dict[str, Any]] | None = None
        self.scope = trio.CancelScope()
        self.alive = True
        self.signals: list[int] = []
        #: the kill's steps, once the supervisor killed it
        self.killed: list[str] | None = None
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
            self.received.append(message)
            self.to_agent_send.send_nowait(message)

    def signal(self, signum: int) -> None:
        if self.held:
            self.release_writes()  # what was sent before it reaches the agent before it
            self.hold_writes()
        self.signals.append(signum)
        if self.agent is not None and self.alive:
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
        behaviour = self.launcher.behaviour
        if behaviour.ignores_sigterm:
            await trio.sleep(self.spec.kill_timeout_s)
            steps.append("sigkill")
        elif behaviour.kill_time:
            await trio.sleep(behaviour.kill_time)
        self._die()
        self.killed = steps
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
        self.written.append(message)
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
        #: the prompts it was given, in order
        self.turns: list[str] = []
        #: the texts it took into a running turn (steered), in order
        self.steers: list[str] = []

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

    async def crash(self) -> None:
        """The process dies mid-turn, with nothing more said."""
        await self.exit(CRASH_EXIT_CODE)

    async def speak(
        self,
        behaviour: B,
        say: Callable[[str], Awaitable[None]],
        *,
        ask: Callable[[], Awaitable[bool]] | None = None,
        tool: Callable[[float], Awaitable[None]] | None = None,
        interval: float | None = None,
        silent_interval: float = SILENT_LOG_INTERVAL_S,
    ) -> bool:
        """A turn's words (:meth:`Behaviour.said`), each ``say``-ed and followed by
        ``interval`` (default ``word_interval``) of silence, with what the behaviour puts
        before word N: at ``crash_after`` it crashes; at ``tool_at`` it asks a permission
        (``ask``) and runs the ``tool``; at ``silent_after`` it goes silent. An answer too
        short to reach N is said whole, without them.

        False when the permission's answer ends the turn: ``ask`` said so.
        """
        pause = behaviour.word_interval if interval is None else interval
        for index, word in enumerate(behaviour.said()):
            if index == behaviour.crash_after:
                await self.crash()
                await trio.sleep_forever()  # the crash cancels the process
            if index == behaviour.tool_at:
                if behaviour.permission and ask is not None and not await ask():
                    return False
                if behaviour.tool is not None and tool is not None:
                    await tool(behaviour.tool)
            if index == behaviour.silent_after:
                await self.go_silent(silent_interval)
            await say(word)
            await trio.sleep(pause)
        return True

    async def go_silent(self, interval: float = SILENT_LOG_INTERVAL_S) -> None:
        """Say nothing more about the turn, ever (a model call that never answers); only the
        stderr goes on, every ``interval`` (0: as fast as it can). Returns when cancelled."""
        while True:
            await self.link.inbox.send(AgentStderrLines(self.link.generation, [SILENT_LINE]))
            await trio.sleep(interval)


class MemoryLauncher(Generic[B, A]):
    """A ``Launcher`` whose processes are :class:`MemoryAgent` tasks; records what happened.

    A protocol's launcher names its behaviour type and says in :meth:`launch` which agent a
    launch starts.
    """

    behaviour_type: type[B]

    def __init__(self, behaviour: B | None = None, *, crash_on_launch: Iterable[int] = ()):
        self.behaviour: B = behaviour or self.behaviour_type()
        #: launch numbers (1-based) whose process exits 1 at once
        self.crash_on_launch = frozenset(crash_on_launch)
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
        link = MemoryLink(self, generation, inbox, spec)
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
