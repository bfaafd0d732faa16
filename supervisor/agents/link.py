"""What the session actor sees of a running agent, and how one is started.

The actor never awaits agent I/O. A *link* queues outgoing messages for a writer task and its
pump tasks post everything that happens (frames, stderr lines, the exit) into the actor's inbox,
tagged with the link's *generation* so that anything from a killed predecessor is recognised
and dropped. Real agents are :class:`supervisor.agents.process_link.ProcessLink`; tests plug
in-memory fakes in through the same :class:`Launcher` signature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

import trio
from attrs import define, field, frozen

from protocols.framing import Frame, RawLine
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus

__all__ = [
    "AgentFrame",
    "AgentGone",
    "AgentLines",
    "AgentLink",
    "AgentStderrLines",
    "Inbox",
    "Launcher",
    "LinkItem",
]


class Inbox(Protocol):
    """Where a link posts what happens: the send end of the session actor's inbox (a memory
    channel's, or the session's own, which notes that something came: ``Session._take_now``)."""

    def send_nowait(self, value: Any) -> None: ...

    async def send(self, value: Any) -> None: ...


@frozen
class AgentFrame:
    """One decoded message (or bad line) from the agent."""

    generation: int
    frame: Frame


@define  # made on a cancel's cold path: see protocols.events.quick_constructor
class AgentLines:
    """One read's worth of the agent's stdout: complete lines, not decoded yet. The actor
    decodes and handles them at the pace the supervisor's
    :class:`~supervisor.runtime.ingest.IngestGate` allows, so one item per read, not per line,
    crosses the inbox."""

    generation: int
    lines: list[RawLine]


@frozen
class AgentStderrLines:
    """One read's worth of the agent's stderr, as lines (bounded, decoded leniently)."""

    generation: int
    lines: list[str]


@frozen
class AgentGone:
    """Posted once, after the last frame of stdout, when the agent's process has exited and
    nothing of its tree is left (or ``survivors`` says what is).

    ``steps`` is what the supervisor had to do because containment was lost (the shim was
    killed and its tree found loose: ``containment_lost``, ``sigkill``); ``survivors`` lists
    ``{"pid", "command"}`` of members still alive after SIGKILL.
    """

    generation: int
    status: ExitStatus
    steps: list[str] = field(factory=list)
    survivors: list[dict[str, Any]] = field(factory=list)


LinkItem = AgentFrame | AgentLines | AgentStderrLines | AgentGone


class AgentLink(ABC):
    """One running agent process, as the actor drives it."""

    generation: int
    #: Set by the session once the link is its live one: offered each item of agent output
    #: before it is posted; True means the session handled it there and then, in the pump's
    #: own step (a cancel's answer, when the actor waits for it: ``Session._take_now``).
    take_now: Callable[[Any], bool] | None = None

    async def post_output(self, item: Any, inbox: Inbox) -> None:
        """An item of agent output, offered to the session first (:attr:`take_now`), else
        posted to its inbox (waiting while the inbox is full: backpressure)."""
        take = self.take_now
        if take is not None and take(item):
            await trio.lowlevel.checkpoint()
        else:
            await inbox.send(item)

    @abstractmethod
    def send(self, message: dict[str, Any]) -> None:
        """Queue one message for the agent. Never blocks: a wedged agent cannot stall us."""

    @abstractmethod
    def signal(self, signum: int) -> None:
        """Deliver a signal to the agent (protocols without an in-band interrupt)."""

    def hold_writes(self) -> None:  # noqa: B027  # optional: by default nothing is held
        """Until :meth:`release_writes`, :meth:`send` still takes (and encodes) each message,
        and the writing waits: the step the session runs in another task ends with it
        (``Session._ask``, ``Session._take_now``; why: ``design/actor.md``). By default, as
        for a link whose sends are not writes of its own, nothing is held."""

    def release_writes(self) -> None:  # noqa: B027  # (see hold_writes)
        """Write what :meth:`hold_writes` kept, in order, at once."""

    @abstractmethod
    async def kill(self) -> list[str]:
        """Run the kill ladder; on return no process of the tree is alive.

        Returns the steps taken, in order, from ``containment_lost``, ``sigterm`` and
        ``sigkill``. Raises :class:`supervisor.agents.process.KillError` (with ``survivors``) when
        members outlived SIGKILL.
        """

    @abstractmethod
    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        """Ask the agent to exit (stdin EOF), wait up to ``timeout``, then :meth:`kill`."""

    async def kill_turn_processes(self, since: float) -> list[dict[str, Any]]:
        """Kill the tree's processes started at or after ``since`` (``tree_clock``): a cancelled
        turn's tools that the agent left running. Returns ``{"pid", "command"}`` of each killed;
        no-op by default."""
        return []

    async def memory_mb(self) -> float | None:
        """The resident memory of the agent's whole tree, in MB (None: cannot tell)."""
        return None

    @property
    def leader_exited(self) -> bool:
        """Our child (the agent, or the shim it runs under) has exited, whatever it still says
        on its pipes: how its tree fared is for its exit report (``AgentGone``) to tell. False
        by default (a link with no process of its own)."""
        return False

    @property
    @abstractmethod
    def stderr_tail(self) -> list[str]:
        """The last lines the agent wrote to stderr, for error messages."""


class Launcher(Protocol):
    """Starts an agent and its pump tasks in ``nursery``; raises ``SpawnError`` if it can't.

    ``resume`` is the agent session id a respawn should restore (None on a first start); the
    protocol decides whether that changes the command line.
    """

    async def __call__(
        self,
        spec: AgentSpec,
        *,
        cwd: str,
        resume: str | None,
        generation: int,
        inbox: Inbox,
        nursery: trio.Nursery,
    ) -> AgentLink: ...
