"""The operator's pause: while it holds, no new turn starts (``Supervisor.pause``).

A pause is a condition beside the session's state, not a state of its own: a paused session
still runs the turn it had, takes steers into it, restarts its agent, cancels and stops as
ever. One thing changes: no turn starts. A prompt is accepted, given its turn id and queued,
and its answer says why it waits (``held: "paused"``); a turn a steer would start waits at the
front of the queue the same way. At the pause's deadline a turn still running is stopped
through the ladder (``reason: "paused"``), the queue kept. Released, the queue starts in
order, one turn at a time as always. ``session.held`` tells subscribers of both moves.
"""

from __future__ import annotations

import math
from typing import Final

from attrs import define

from protocols import events as ev

__all__ = ["PAUSED", "Pause"]

#: The word a held prompt's answer, ``session.held`` and ``session.list`` carry.
PAUSED: Final = "paused"


@define
class Pause:
    """Whether new turns are held, and when a turn still running is stopped."""

    held: bool = False
    #: when a turn still running is stopped (inf: it finishes by itself); on the run's clock
    deadline: float = math.inf

    @property
    def word(self) -> str | None:
        """``paused`` while held, else None: what answers and lists say."""
        return PAUSED if self.held else None

    def hold(self, deadline: float) -> bool:
        """Hold new turns, stopping what still runs at ``deadline`` (inf: never). A pause that
        holds already keeps the earlier of its deadline and this one: an operator may bring it
        forward, never push a promised stop back. Whether anything changed."""
        if self.held and deadline >= self.deadline:
            return False
        self.held = True
        self.deadline = deadline
        return True

    def release(self) -> bool:
        """New turns start again. Whether anything changed."""
        if not self.held:
            return False
        self.held = False
        self.deadline = math.inf
        return True

    def due(self, now: float) -> bool:
        """The deadline has come: a turn still running (and not being stopped) is stopped."""
        return self.held and now >= self.deadline

    def event(self, now: float, queued: int) -> ev.SessionHeld:
        """``session.held`` for where the pause stands at ``now``."""
        deadline_s = None
        if self.held and self.deadline != math.inf:
            deadline_s = round(max(0.0, self.deadline - now), 3)
        return ev.SessionHeld(held=self.word, deadline_s=deadline_s, queued=queued)
