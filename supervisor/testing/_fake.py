"""``FakeAgent`` and ``open_test_supervisor``: a real supervisor whose agents run in memory.

A :class:`FakeAgent` is a script (what the agent answers, how fast, how it takes a cancel, a
steer, a permission) and a record (every process started from it, what went to it and what it
said). It runs as one of the protocol fakes of this package (``_acp.py``, ``_codex.py``,
``_claude.py``, ``_opencode.py``, ``_amp.py``), which speak the real protocol's messages to the
real protocol machine; only the process is a trio task. How the options become each
protocol's wire: ``docs/testing.md``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
import trio
import trio.testing

from protocols.amp import AMP_COMMAND
from protocols.claude import CLAUDE_COMMAND
from supervisor.agents.link import AgentLink, Inbox
from supervisor.agents.process import SpawnError
from supervisor.config import AgentSpec
from supervisor.runtime.session import DEFAULT_HISTORY
from supervisor.supervisor import Supervisor, open_supervisor
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.testing._amp import AmpBehaviour, AmpLauncher
from supervisor.testing._claude import ClaudeBehaviour, ClaudeLauncher
from supervisor.testing._codex import CodexBehaviour, CodexLauncher
from supervisor.testing._memory import Behaviour, MemoryLauncher
from supervisor.testing._opencode import OpenCodeBehaviour, OpenCodeLauncher

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from supervisor.observe.metrics import Metrics

__all__ = [
    "DEFAULT_REPLY",
    "DEFAULT_WORD_DELAY",
    "PROTOCOLS",
    "FakeAgent",
    "FakeProcess",
    "open_test_supervisor",
]

#: What a FakeAgent answers unless told otherwise.
DEFAULT_REPLY: Final = "Hello from the fake agent."
#: Virtual seconds between the words of an answer, unless told otherwise.
DEFAULT_WORD_DELAY: Final = 0.1
#: The protocols a FakeAgent speaks, and the command line its spec says (never run: the
#: Claude and Amp machines build their argv from it, which the fake then reads).
PROTOCOLS: Final[Mapping[str, tuple[str, ...]]] = {
    "acp": ("fake-acp-agent",),
    "codex": ("codex", "app-server"),
    "claude": CLAUDE_COMMAND,
    "opencode": ("opencode", "serve"),
    "amp": AMP_COMMAND,
}
#: The ``steer`` each protocol's real agent gives when none is asked for: ACP agents mostly
#: offer no steering; Codex (``turn/steer``), Claude Code and Amp take a steer into the running
#: turn; OpenCode cannot steer at all.
_STEER_BY_DEFAULT: Final[Mapping[str, str | None]] = {
    "acp": None,
    "codex": "inject",
    "claude": "inject",
    "opencode": None,
    "amp": "inject",
}
#: What a protocol cannot do, whatever a FakeAgent is told.
_UNSUPPORTED: Final[Mapping[tuple[str, str], str]] = {
    ("amp", "permission"): "Amp has no permission protocol in stream-json mode",
    ("amp", "refuse"): "Amp takes every steer: it has no answer to refuse with",
    ("opencode", "inject"): "OpenCode cannot steer a running turn",
    ("opencode", "refuse"): "OpenCode cannot steer a running turn: it is never asked to",
}

OnCancel = Literal["stop", "ignore", "crash"] | float
Steer = Literal["inject", "refuse"]


class FakeProcess:
    """One start of a :class:`FakeAgent`: what went to it, what it said, how it ended.

    Messages are the protocol's own, as dicts (for OpenCode, an HTTP server, the request and
    response envelopes and the SSE events of ``supervisor/agents/http_link.py``).
    """

    def __init__(self, launcher: MemoryLauncher[Any, Any], index: int) -> None:
        self._launcher = launcher
        self._index = index

    @property
    def _link(self) -> Any:
        return self._launcher.links[self._index]

    @property
    def received(self) -> list[dict[str, Any]]:
        """What the supervisor wrote to it, in order."""
        return list(self._link.received)

    @property
    def sent(self) -> list[dict[str, Any]]:
        """What it wrote to the supervisor, in order."""
        return list(self._link.written)

    @property
    def prompts(self) -> list[str]:
        """The prompts it was given, in order (a steer it took into a turn is not one)."""
        return list(self._launcher.agents[self._index].turns)

    @property
    def steers(self) -> list[str]:
        """The texts it took into a running turn (``steer="inject"``), in order."""
        return list(self._launcher.agents[self._index].steers)

    @property
    def resumed(self) -> str | None:
        """The agent's session id it was started to go on with (a respawn), or None."""
        resume: str | None = self._launcher.resumes[self._index]
        return resume

    @property
    def alive(self) -> bool:
        return bool(self._link.alive)

    @property
    def killed(self) -> list[str] | None:
        """The kill's steps (``["sigterm"]``, then ``"sigkill"`` for one that ignores SIGTERM)
        if the supervisor killed it; None if it exited, was closed, or runs."""
        steps: list[str] | None = self._link.killed
        return None if steps is None else list(steps)

    @property
    def signals(self) -> list[int]:
        """The signals the supervisor sent it (Amp's cancel is SIGINT)."""
        return list(self._link.signals)

    @property
    def memory_mb(self) -> float:
        """What its process tree holds, for the spec's ``max_memory_mb`` (10 MB unless set)."""
        held: float = self._launcher.agents[self._index].memory_mb
        return held

    @memory_mb.setter
    def memory_mb(self, value: float) -> None:
        self._launcher.agents[self._index].memory_mb = value

    def __repr__(self) -> str:
        state = "alive" if self.alive else "killed" if self.killed else "exited"
        return f"<FakeProcess #{self._index + 1} {state}, {len(self.prompts)} prompts>"


class FakeAgent:
    """An agent that runs in memory and speaks ``protocol``'s real wire, scripted by options.

    ``protocol``: ``"acp"``, ``"codex"``, ``"claude"``, ``"opencode"`` or ``"amp"``. An option
    the protocol cannot express (a permission from Amp, a steer to OpenCode) is a
    ``ValueError``.

    What it says, to every prompt:

    - ``reply``: the answer, streamed a word at a time (each word with the spaces after it,
      so the ``message.delta`` texts join back to it); or a sequence (the n-th prompt gets
      the n-th, the last one from then on); or a function of the prompt's text.
    - ``word_delay``: virtual seconds between words: the first comes as the turn starts and
      the turn ends ``word_delay`` after the last, so N words take N x ``word_delay``.
    - ``permission``: before its first word, asks a permission and waits for the answer; it
      then goes on with its reply, unless its protocol says the answer ends the turn (a
      cancel; OpenCode's reject).
    - ``tool_s``: before its first word (after the permission), runs one tool call
      (``make test``) for this many virtual seconds, saying nothing meanwhile.
    - ``silent_after=N``: after N words says nothing more about the turn, ever (it goes on
      logging to stderr, as an agent whose model call never answers): the stall watchdog's
      case.
    - ``crash_after=N``: after N words its process exits (code 3), mid-turn. For both, a
      reply of N words or fewer is said whole.
    - ``fail_turn``: once its words are out, the turn fails with the agent's error (each
      protocol's way); ``max_failed_turns`` of them in a row and the supervisor recycles it.

    How it takes a cancel and a steer:

    - ``on_cancel``: ``"stop"`` (the turn ends as the interrupt arrives), a number (that many
      virtual seconds later), ``"ignore"`` (never: the grace runs out and it is killed) or
      ``"crash"`` (its process exits instead of answering).
    - ``ignores_sigterm``: a kill then waits the spec's ``kill_timeout_s`` for SIGKILL.
    - ``steer``: ``"inject"`` (takes the text into the running turn, saying
      ``steered:<text>``) or ``"refuse"`` (declines it: the supervisor interrupts the turn and
      runs the text next). None: as the protocol's real agent does: ACP agents and OpenCode
      do not steer; Codex, Claude Code and Amp inject.

    How it starts, each time:

    - ``start_delay``: virtual seconds from its start to its handshake's answer: a respawn
      after a kill takes this long too (Amp has no handshake: its session is ready at once).
    - ``resumes``: False: a respawned process cannot go on with the conversation; the session
      starts afresh (``receipt.resumed`` is False).

    Every other keyword argument is an :class:`~supervisor.config.AgentSpec` field, passed
    through to the spec (``grace_s``, ``stall_s``, ``tool_stall_s``, ``max_failed_turns``,
    ``start_timeout_s``, ``kill_timeout_s``, ``max_memory_mb``, ...).

    What it records, across every process started from it (each in :attr:`processes`):
    :attr:`starts`, :attr:`kills`, :attr:`prompts`, :attr:`steers`, :attr:`received` and
    :attr:`sent`.
    """

    def __init__(
        self,
        protocol: str = "acp",
        *,
        reply: str | Sequence[str] | Callable[[str], str] = DEFAULT_REPLY,
        word_delay: float = DEFAULT_WORD_DELAY,
        on_cancel: OnCancel = "stop",
        permission: bool = False,
        tool_s: float | None = None,
        steer: Steer | None = None,
        silent_after: int | None = None,
        crash_after: int | None = None,
        fail_turn: bool = False,
        ignores_sigterm: bool = False,
        start_delay: float = 0.0,
        resumes: bool = True,
        **spec_options: Any,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}: a FakeAgent speaks {', '.join(PROTOCOLS)}")
        for taken in ("name", "protocol"):
            if taken in spec_options:
                raise TypeError(f"{taken}: given by open_test_supervisor's agents and protocol")
        self.protocol = protocol
        spec_options.setdefault("command", PROTOCOLS[protocol])
        #: the agent's spec (its name is the one ``open_test_supervisor`` gives it)
        self.spec = AgentSpec(name="fake", protocol=protocol, **spec_options)
        script = _script(reply)
        for asked, wanted in (("permission", permission), (str(steer), steer is not None)):
            why = _UNSUPPORTED.get((protocol, asked))
            if wanted and why is not None:
                raise ValueError(f"{asked}: {why}")
        steering = steer if steer is not None else _STEER_BY_DEFAULT[protocol]
        stop_delay: float | None
        if on_cancel == "stop" or on_cancel == "crash":
            stop_delay = 0.0
        elif on_cancel == "ignore":
            stop_delay = None
        elif isinstance(on_cancel, int | float) and not isinstance(on_cancel, bool):
            if not 0 <= on_cancel < math.inf:
                raise ValueError(f"on_cancel={on_cancel!r}: seconds are finite, not negative")
            stop_delay = float(on_cancel)
        else:
            raise ValueError(f"on_cancel={on_cancel!r}: 'stop', 'ignore', 'crash' or seconds")
        common = Behaviour(
            script=script,
            prompt_tokens=False,
            word_interval=word_delay,
            stop_delay=stop_delay,
            crash_on_cancel=on_cancel == "crash",
            start_delay=start_delay,
            ignores_sigterm=ignores_sigterm,
            permission=permission,
            tool=tool_s,
            tool_at=0,
            silent_after=silent_after,
            crash_after=crash_after,
            fail_turn=fail_turn,
            resumes=resumes,
        )
        self._launcher = _launcher(protocol, attrs.asdict(common, recurse=False), steering)

    @property
    def processes(self) -> list[FakeProcess]:
        """Every process started from it, in order."""
        return [FakeProcess(self._launcher, index) for index in range(self.starts)]

    @property
    def starts(self) -> int:
        """How many times it was started (the first start, then every respawn)."""
        return len(self._launcher.links)

    @property
    def kills(self) -> int:
        """How many of its processes the supervisor killed (a grace run out, a stop that
        took too long, a recycle); not those that exited or were closed."""
        return len(self._launcher.kills)

    @property
    def prompts(self) -> list[str]:
        """Every prompt it was given, in order."""
        return [text for process in self.processes for text in process.prompts]

    @property
    def steers(self) -> list[str]:
        """Every text it took into a running turn, in order."""
        return [text for process in self.processes for text in process.steers]

    @property
    def received(self) -> list[dict[str, Any]]:
        """Every message the supervisor wrote to it, in order."""
        return [message for process in self.processes for message in process.received]

    @property
    def sent(self) -> list[dict[str, Any]]:
        """Every message it wrote to the supervisor, in order."""
        return [message for process in self.processes for message in process.sent]

    @property
    def violations(self) -> list[str]:
        """Rules of its protocol the supervisor broke, as the fake noticed them."""
        return list(self._launcher.violations)

    def forget(self) -> None:
        """Drop the messages, prompts and steers recorded so far, and the conversations the
        fake keeps to replay on a resume (the counts of starts and kills stay): a long test of
        an application's own memory then measures the application's, not the fake's."""
        launcher = self._launcher
        launcher.log.clear()
        for history in launcher.store.sessions.values():
            history.clear()
        for link in launcher.links:
            link.received.clear()
            link.written.clear()
            link.sent.clear()
        for agent in launcher.agents:
            agent.turns.clear()
            agent.steers.clear()

    def __repr__(self) -> str:
        return f"<FakeAgent {self.protocol}, {self.starts} starts, {self.kills} kills>"


def _script(reply: str | Sequence[str] | Callable[[str], str]) -> Callable[[str], str]:
    """``reply`` as a function of the prompt's text."""
    if isinstance(reply, str):
        text = reply
        return lambda _prompt: text
    if callable(reply):
        return reply
    replies = list(reply)
    if not replies or not all(isinstance(r, str) for r in replies):
        raise ValueError("reply: a text, a non-empty sequence of texts, or a function")
    answers: Iterator[str] = iter(replies)

    def nth(_prompt: str) -> str:
        return next(answers, replies[-1])

    return nth


def _launcher(protocol: str, common: dict[str, Any], steer: str | None) -> MemoryLauncher[Any, Any]:
    """The protocol's fake, told ``common`` (a :class:`Behaviour`'s fields) and ``steer``."""
    answer = "refuse" if steer == "refuse" else "injected"
    if protocol == "acp":
        return AcpLauncher(AcpBehaviour(**common, steering=steer is not None, steer_answer=answer))
    if protocol == "codex":
        return CodexLauncher(CodexBehaviour(**common, steer_answer=answer))
    if protocol == "claude":
        return ClaudeLauncher(ClaudeBehaviour(**common, steer_answer=answer))
    if protocol == "amp":
        # It exits as it writes the cancelled result: a cancel takes no time of its own.
        return AmpLauncher(AmpBehaviour(**common, exit_delay=0.0))
    return OpenCodeLauncher(OpenCodeBehaviour(**common))


class _Launchers:
    """The supervisor's launcher: each agent's spec starts its FakeAgent."""

    def __init__(self, fakes: Mapping[str, FakeAgent]) -> None:
        self._fakes = dict(fakes)

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
        fake = self._fakes.get(spec.name)
        if fake is None:
            known = ", ".join(sorted(self._fakes))
            raise SpawnError(f"no FakeAgent is named {spec.name!r} (known: {known})")
        return await fake._launcher(
            spec, cwd=cwd, resume=resume, generation=generation, inbox=inbox, nursery=nursery
        )


@asynccontextmanager
async def open_test_supervisor(
    agents: Mapping[str, FakeAgent],
    *,
    max_sessions: int | None = None,
    session_ids: Callable[[], str] | None = None,
    history_size: int = DEFAULT_HISTORY,
    metrics: Metrics | None = None,
    tracer_provider: TracerProvider | None = None,
) -> AsyncIterator[Supervisor]:
    """A real :class:`~supervisor.supervisor.Supervisor` whose agents are ``agents``, each
    run in memory under its name (``sup.start_session(name)``).

    Everything but the agent processes is the real code: sessions, protocol machines,
    receipts, events, steering, the watchdog, recycling, the grace and the kill ladder,
    respawn and resume. The options are :func:`~supervisor.supervisor.open_supervisor`'s.

    Runs on trio's virtual clock only (``trio.testing.MockClock``; with
    ``autojump_threshold=0``, as pytest-trio's ``autojump_clock`` fixture gives, a test that
    waits out a 300 s watchdog takes milliseconds): on another clock it raises
    ``RuntimeError`` rather than make a test wait in real time.
    """
    clock = trio.lowlevel.current_clock()
    if not isinstance(clock, trio.testing.MockClock):
        raise RuntimeError(
            "open_test_supervisor runs on trio's virtual clock: give the run a"
            " trio.testing.MockClock(autojump_threshold=0) (pytest-trio: the autojump_clock"
            f" fixture); this run's clock is a {type(clock).__name__}"
        )
    specs = {name: attrs.evolve(fake.spec, name=name) for name, fake in agents.items()}
    async with open_supervisor(
        agents=specs,
        launcher=_Launchers(agents),
        max_sessions=max_sessions,
        session_ids=session_ids,
        history_size=history_size,
        metrics=metrics,
        tracer_provider=tracer_provider,
    ) as supervisor:
        yield supervisor
