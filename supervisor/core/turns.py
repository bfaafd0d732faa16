"""Turns: the running one, the prompts queued behind it, and how the ended ones ended.

A turn's id is ``t1``, ``t2``, ... in the order prompts (and steers) were accepted, never
reused. Queued prompts wait in order; the turns a steer starts go to the queue's front, in the
order the steers came (:meth:`PromptQueue.put_steered`), ahead of the prompts.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

from attrs import define, field, frozen

from protocols.content import Part
from supervisor.core.ladder import CancelJob
from supervisor.core.waiter import Waiter
from supervisor.core.watchdog import StallWatch
from supervisor.errors import BadRequest
from supervisor.receipt import CancelReceipt, DroppedPrompt
from supervisor.steering import SteerMode, SteerResult

__all__ = [
    "ENDED_TURNS_KEPT",
    "EndedTurns",
    "NativeSteer",
    "PromptQueue",
    "SteerNext",
    "Turn",
    "TurnIds",
    "TurnSteers",
]

#: Turns remembered so a late cancel naming one gets an honest answer.
ENDED_TURNS_KEPT: Final = 64


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
    """The running turn's steers that are not settled yet."""

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


@define
class Turn:
    """The running turn."""

    id: str
    text: str
    started_at: float
    #: ``tree_clock()`` when it started: tells this turn's processes from the agent's own
    started_clock: float
    #: the stall watchdog's view of it
    watch: StallWatch
    #: its cancel, once one began
    cancel: CancelJob | None = None
    #: a tool.call was seen: only then can processes be left behind by a cancel
    ran_tools: bool = False
    #: steers waiting for the agent's answer, and the turns steers start after this one (None
    #: until the first steer: most turns have none)
    steers: TurnSteers | None = None


class TurnIds:
    """``t1``, ``t2``, ...: one per prompt or steer accepted, never reused."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return f"t{self.count}"


class PromptQueue(deque[tuple[str, str]]):
    """Prompts waiting behind the running turn, ``(turn_id, text)`` in order, with the content
    parts of those that have more than text. At most ``limit``: more is a client bug, not a
    workload. (A deque itself: whether it is empty is asked on every cancel, and told in C.)"""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        #: the queued turns a steer starts (at the queue's front)
        self._steered: set[str] = set()
        #: the content parts of queued prompts that have more than text, by turn id
        self._parts: dict[str, tuple[Part, ...]] = {}

    def check_room(self) -> None:
        if len(self) >= self.limit:
            raise BadRequest(f"too many queued prompts (at most {self.limit})")

    def keep_parts(self, turn_id: str, parts: tuple[Part, ...]) -> None:
        if parts:
            self._parts[turn_id] = parts

    def parts_of(self, turn_id: str) -> tuple[Part, ...]:
        """The content parts of a turn that starts now (forgotten here)."""
        return self._parts.pop(turn_id, ())

    def put(self, turn_id: str, text: str) -> None:
        self.append((turn_id, text))

    def put_steered(self, turn_id: str, text: str) -> None:
        """A steer's turn: after the steers queued before it, ahead of every prompt."""
        ahead = 0
        for queued_id, _ in self:
            if queued_id not in self._steered:
                break
            ahead += 1
        self.insert(ahead, (turn_id, text))
        self._steered.add(turn_id)

    def put_steered_first(self, turns: list[tuple[str, str]]) -> None:
        """Steers a turn did not take, in order, at the very front."""
        self.extendleft(reversed(turns))
        self._steered.update(turn_id for turn_id, _ in turns)

    def take_next(self) -> tuple[str, str]:
        turn_id, text = self.popleft()
        self._steered.discard(turn_id)
        return turn_id, text

    def take(self, turn_id: str) -> DroppedPrompt | None:
        """Take ``turn_id`` out of the queue (a cancel naming it), if it is there."""
        for index, (queued_id, text) in enumerate(self):
            if queued_id == turn_id:
                del self[index]
                self._steered.discard(turn_id)
                self._parts.pop(turn_id, None)
                return DroppedPrompt.of(turn_id, text)
        return None

    def take_all(self) -> list[DroppedPrompt]:
        """Empty the queue: every prompt in it, in order, never to run."""
        if not self:
            return []
        dropped = [DroppedPrompt.of(turn_id, text) for turn_id, text in self]
        self.clear()
        self._steered.clear()
        for prompt in dropped:
            self._parts.pop(prompt.turn_id, None)
        return dropped


class EndedTurns:
    """How the last :data:`ENDED_TURNS_KEPT` turns ended, for a cancel naming one later."""

    def __init__(self) -> None:
        self._receipts: dict[str, CancelReceipt] = {}

    def remember(self, turn_id: str, receipt: CancelReceipt) -> None:
        self._receipts[turn_id] = receipt
        while len(self._receipts) > ENDED_TURNS_KEPT:
            del self._receipts[next(iter(self._receipts))]

    def get(self, turn_id: str) -> CancelReceipt | None:
        return self._receipts.get(turn_id)
