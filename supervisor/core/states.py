"""A session's states and the moves between them (``design/actor.md``, "States").

``starting -> ready -> running -> cancelling -> ready``, plus the two ends, ``stopped`` and
``failed``. :data:`TRANSITIONS` is the whole table: :class:`~supervisor.core.session.SessionCore`
checks every move against it, and a move the table does not hold is a bug of the core
(:class:`IllegalTransition`), never something a peer can cause. A move to the state the session
is already in is how a new detail is told (``cancelling``: "killing", then "respawning"); only
``starting`` and ``cancelling`` have such steps.

What a state does not say is held by the collaborator it belongs to: the agent process's phase
(``supervisor/core/agent.py``), whether a stop is under way (``supervisor/core/lifecycle.py``),
the running turn's cancel (``supervisor/core/ladder.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

__all__ = ["ENDS", "TRANSITIONS", "IllegalTransition", "State", "check_transition"]


class State(enum.StrEnum):
    """Where a session stands. A ``str``: ``session.state == "ready"`` holds, and the wire
    carries the word."""

    #: the agent is being started (or restarted: a recycle, an exit it announced)
    STARTING = "starting"
    #: the agent is up and no turn runs: a prompt starts one at once
    READY = "ready"
    #: a turn runs
    RUNNING = "running"
    #: the running turn is being stopped: the cancel ladder is under way
    CANCELLING = "cancelling"
    #: the session ended: its agent is gone, its history stays readable
    STOPPED = "stopped"
    #: the session cannot go on (the agent could not be started, its tree outlived SIGKILL);
    #: it takes nothing but ``stop``
    FAILED = "failed"


#: The two states a session never leaves.
ENDS: Final = frozenset({State.STOPPED, State.FAILED})

_S, _R, _U, _C = State.STARTING, State.READY, State.RUNNING, State.CANCELLING

#: Every move a session can make. Read a row as "from here, to any of these".
TRANSITIONS: Final[Mapping[State, frozenset[State]]] = {
    # up (ready); a new detail while it starts; the handshake failed; stopped before it was up
    State.STARTING: frozenset({_S, _R, State.FAILED, State.STOPPED}),
    # a prompt starts a turn; the agent is restarted (its memory, an exit it announced)
    State.READY: frozenset({_U, _S, State.FAILED, State.STOPPED}),
    # a cancel (a caller's, the watchdog's, a steer's, the memory limit's); the turn ended by
    # itself (ready, or starting when the agent restarts after it: recycled, exiting)
    State.RUNNING: frozenset({_C, _R, _S, State.FAILED, State.STOPPED}),
    # the turn ended (ready, or starting: the agent is recycled after it), details on the way
    State.CANCELLING: frozenset({_C, _R, _S, State.FAILED, State.STOPPED}),
    State.STOPPED: frozenset(),
    State.FAILED: frozenset(),
}


class IllegalTransition(Exception):
    """A move the table does not hold: a bug of the session core, never a peer's doing."""

    def __init__(self, old: State, new: State) -> None:
        super().__init__(f"a session cannot move from {old.value!r} to {new.value!r}")
        self.old = old
        self.new = new


def check_transition(old: State, new: State) -> None:
    """Raise :class:`IllegalTransition` unless :data:`TRANSITIONS` holds ``old -> new``."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(old, new)
