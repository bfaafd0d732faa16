"""Steers of the running turn that are not settled yet (what a steer is: ``supervisor.steering``).

A steer the agent can take natively waits for its answer (``SteerAnswered``) until a deadline
(the agent's grace): :attr:`TurnSteers.pending`. A steer that starts the turn after this one,
once it has ended (the turn is being cancelled to make way, or the agent's turn was already
over), waits in :attr:`TurnSteers.then`. Both belong to the running turn: when it ends, what
it did not take goes first in the queue (``PromptQueue.put_steered_first``); when a caller
stops it, they are dropped with it.
"""

from __future__ import annotations

import math

from attrs import define, field, frozen

from supervisor.core.waiter import Waiter
from supervisor.steering import SteerMode, SteerResult

__all__ = ["NativeSteer", "SteerNext", "TurnSteers"]


@define
class NativeSteer:
    """A steer sent to the agent, waiting for its answer until ``deadline``."""

    text: str
    waiter: Waiter[SteerResult]
    deadline: float


@frozen
class SteerNext:
    """A steer that starts the next turn (``turn_id``; empty: given one when it is queued)
    once the running one has ended."""

    turn_id: str
    text: str
    waiter: Waiter[SteerResult]
    mode: SteerMode
    detail: str | None = None


@define
class TurnSteers:
    #: steers the agent has not answered yet, by steer id
    pending: dict[int, NativeSteer] = field(factory=dict)
    #: steers that start the next turns, in order, once this one is over
    then: list[SteerNext] = field(factory=list)

    def __bool__(self) -> bool:
        return bool(self.pending or self.then)

    def next_deadline(self) -> float:
        return min((steer.deadline for steer in self.pending.values()), default=math.inf)

    def overdue(self, now: float) -> list[int]:
        """The steers whose answer is overdue at ``now``, in the order they were sent."""
        return [steer_id for steer_id, steer in self.pending.items() if now >= steer.deadline]

    def take_all(self) -> list[tuple[str | None, NativeSteer | SteerNext]]:
        """Every steer not settled, in order (pending ones first, with no turn id yet)."""
        steers: list[tuple[str | None, NativeSteer | SteerNext]] = [
            (None, steer) for steer in self.pending.values()
        ]
        steers += [(steer.turn_id, steer) for steer in self.then]
        self.pending.clear()
        self.then = []
        return steers

    def after_turn(self) -> list[SteerNext]:
        """The turn is over: what starts next, in order (pending steers the agent never
        answered start a turn of their own)."""
        unanswered = [
            SteerNext("", steer.text, steer.waiter, "started") for steer in self.pending.values()
        ]
        following = [*self.then, *unanswered]
        self.pending.clear()
        self.then = []
        return following
