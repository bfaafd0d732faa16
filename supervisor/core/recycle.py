"""When to restart a session's agent though nobody asked: it fails turn after turn, it holds
more memory than ``max_memory_mb`` allows, or its protocol machine says only a restart clears
the state it is in (``RestartWanted``).

A restart (a *recycle*) kills the agent's tree, starts it again and resumes its session; the
queue waits for the new process. An agent can get stuck in a state only a restart clears, so
``max_failed_turns`` failed turns in a row (default 3) recycle it. Over its memory limit, the
running turn is first stopped through the ladder (``reason: "memory_limit"``); an agent over its
limit again and again, with no turn ended by itself in between, needs more than the limit
allows, and after :data:`MAX_MEMORY_RESTARTS` such restarts its session fails instead.
"""

from __future__ import annotations

from typing import Final

from attrs import frozen

__all__ = ["MAX_MEMORY_RESTARTS", "MemoryVerdict", "Recycler"]

#: Restarts for memory with no turn ended by itself in between before the session fails.
MAX_MEMORY_RESTARTS: Final = 3


@frozen
class MemoryVerdict:
    """What to do about a tree over its limit: ``reason`` says so in events and receipts;
    ``give_up``: restarting has not helped, the session fails."""

    reason: str
    give_up: bool


class Recycler:
    def __init__(self, max_failed_turns: int | None, max_memory_mb: float | None) -> None:
        self.max_failed_turns = max_failed_turns
        self.max_memory_mb = max_memory_mb
        self.failed_in_a_row = 0
        #: restarts so far, and why the last one
        self.recycles = 0
        self.reason: str | None = None
        #: why the agent is to be restarted once the running turn is over (its memory, or its
        #: machine said only a restart clears its state); None: it is not
        self.due: str | None = None
        self.memory_restarts = 0

    def turn_ended_by_itself(self, failed: bool) -> bool:
        """A turn nobody stopped ended (``failed`` or not); True: recycle the agent now."""
        self.memory_restarts = 0
        self.failed_in_a_row = self.failed_in_a_row + 1 if failed else 0
        limit = self.max_failed_turns
        return limit is not None and 0 < limit <= self.failed_in_a_row

    def turn_stopped(self) -> None:
        """A turn we stopped ended: it says nothing of the agent's health."""
        self.failed_in_a_row = 0

    def failing_reason(self, last_error: str) -> str:
        return f"{self.failed_in_a_row} turns failed in a row; the last: {last_error}"

    def recycled(self, reason: str) -> int:
        """The agent is being restarted for ``reason``; the failed turns that led to it."""
        failed, self.failed_in_a_row = self.failed_in_a_row, 0
        self.due = None
        self.recycles += 1
        self.reason = reason
        return failed

    def over_memory(self, used_mb: float) -> MemoryVerdict:
        reason = (
            f"memory_limit: the agent's processes hold {used_mb:.0f} MB"
            f" (max_memory_mb {self.max_memory_mb:g})"
        )
        self.memory_restarts += 1
        give_up = self.memory_restarts > MAX_MEMORY_RESTARTS
        if not give_up:
            self.due = reason
        return MemoryVerdict(reason, give_up)

    def wanted(self, reason: str) -> None:
        """The agent's machine says only a restart clears its state: once the turn is over."""
        if self.due is None:
            self.due = reason

    def fresh_process(self) -> None:
        """A new agent process runs: whatever memory the last one held is gone."""
        self.due = None
