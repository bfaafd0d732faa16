"""The agent process as the session core sees it: which one is live, where it stands, and what
a new one resumes.

Each process the session starts is a *generation* (1, 2, ...); only the live one's output
counts, so whatever a killed predecessor still says is recognised and dropped. A process moves
through :class:`AgentPhase`: asked for (``spawning``), running its handshake (``establishing``),
taking prompts (``up``), ending by design (``exiting``: Amp's run ends on the signal that stops
its turn), or being killed (``killing``, detached: nothing more is read from it). After a kill or
an exit the next process resumes the agent's own session (``resume_from``: its ACP sessionId,
Codex thread, Claude session), unless the agent refused that resume, in which case it starts
fresh.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Final

from protocols.machine import AgentProtocol
from supervisor.core.waiter import Waiter

__all__ = ["MAX_EXITS_WITHOUT_TURN", "STARTING_PHASES", "AgentPhase", "AgentState"]

#: An agent that exits unexpectedly this many times without finishing a turn in between is
#: not started again: the session fails with its last words instead of looping.
MAX_EXITS_WITHOUT_TURN: Final = 5


class AgentPhase(enum.Enum):
    #: no process, none coming (before the first start; after a close; the session failed)
    DOWN = "down"
    #: a process is being started (``generation``)
    SPAWNING = "spawning"
    #: it runs and its handshake is not done yet
    ESTABLISHING = "establishing"
    #: established: prompts may go
    UP = "up"
    #: it said its process ends now, by design; its exit is awaited (bounded by the grace)
    EXITING = "exiting"
    #: its tree is being killed
    KILLING = "killing"


#: The phases of a live process: its output counts, and messages may be written to it.
_LIVE: Final = frozenset({AgentPhase.ESTABLISHING, AgentPhase.UP, AgentPhase.EXITING})
#: The phases of a start: its output is urgent (``SessionCore.urgent``).
STARTING_PHASES: Final = frozenset({AgentPhase.SPAWNING, AgentPhase.ESTABLISHING})


class AgentState:
    def __init__(self, carries: frozenset[str], resume: str | None) -> None:
        self.phase = AgentPhase.DOWN
        #: the newest process asked for
        self.generation = 0
        #: the live process's generation (None: none is live)
        self.live: int | None = None
        #: the live process's protocol machine
        self.machine: AgentProtocol | None = None
        #: the agent's own session id the next process resumes (None: a fresh session)
        self.resume_from = resume
        #: the resume the live process was started with
        self.spawned_resume: str | None = None
        #: why the last resume was refused (the next ``established`` says so)
        self.resume_refused: str | None = None
        #: the live process has written at least one frame
        self.heard_from_live = False
        #: unexpected exits since a turn last finished
        self.exits_without_turn = 0
        #: why the live process said it ends (``exiting``), and until when we wait for it
        self.exiting: str | None = None
        self.exit_deadline: float | None = None
        #: until when the process being started may take to finish its handshake
        self.start_deadline: float | None = None
        #: kills of process trees begun and not yet done
        self.kills_in_flight = 0
        #: the kill in flight is for a fresh start (the resume was refused), not a respawn
        self.fresh_after_kill = False
        #: what the agent takes in a prompt natively: the protocol's, then what the agent
        #: itself said once it was up (ACP)
        self.carries = carries
        #: ``set_mode`` calls waiting for the live process's answer, in the order sent
        self.mode_waiters: deque[Waiter[None]] = deque()

    @property
    def starting(self) -> bool:
        """A process is being started or runs its handshake."""
        return self.phase in STARTING_PHASES

    @property
    def is_live(self) -> bool:
        return self.phase in _LIVE

    def spawn(self, now: float, start_timeout_s: float) -> int:
        """A new process is asked for: its generation."""
        self.phase = AgentPhase.SPAWNING
        self.spawned_resume = self.resume_from
        self.heard_from_live = False
        self.generation += 1
        self.start_deadline = now + start_timeout_s
        return self.generation

    def takes(self, generation: int) -> bool:
        """The process started for ``generation`` is the one wanted (not a late one)."""
        return self.phase is AgentPhase.SPAWNING and generation == self.generation

    def running(self, generation: int, machine: AgentProtocol) -> None:
        self.phase = AgentPhase.ESTABLISHING
        self.live = generation
        self.machine = machine

    def established(self) -> str | None:
        """The handshake is done; why its resume was refused, if it was."""
        self.phase = AgentPhase.UP
        if self.machine is not None:
            self.carries = self.machine.carries
        self.start_deadline = None
        refused, self.resume_refused = self.resume_refused, None
        return refused

    def start_failed(self) -> None:
        """The start went wrong: no deadline for it any more; nothing of it is wanted."""
        self.start_deadline = None
        if self.phase is AgentPhase.SPAWNING or self.phase is AgentPhase.ESTABLISHING:
            self.phase = AgentPhase.DOWN

    def announced_exit(self, reason: str, deadline: float) -> None:
        self.phase = AgentPhase.EXITING
        self.exiting = reason
        self.exit_deadline = deadline

    def detach(self) -> AgentProtocol | None:
        """The live process is no longer driven (killed, gone, closed): its machine, for what
        it can still tell; nothing more is read from it."""
        machine, self.machine = self.machine, None
        self.live = None
        self.exiting = self.exit_deadline = None  # whatever it said, it is gone now
        return machine

    def remember_resume(self, machine: AgentProtocol | None) -> None:
        """Before a kill: the next process resumes what this one ran, if it said."""
        if machine is not None and machine.agent_session_id is not None:
            self.resume_from = machine.agent_session_id

    def kill_started(self, *, fresh: bool) -> None:
        self.phase = AgentPhase.KILLING
        self.fresh_after_kill = fresh
        self.kills_in_flight += 1

    def kill_done(self) -> None:
        self.kills_in_flight -= 1
        if self.phase is AgentPhase.KILLING and not self.kills_in_flight:
            self.phase = AgentPhase.DOWN

    def down(self) -> None:
        """No process is wanted any more (the session stops or failed)."""
        if self.phase is not AgentPhase.KILLING:
            self.phase = AgentPhase.DOWN
        self.start_deadline = None
