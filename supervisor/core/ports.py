"""The session core's port: what it asks of the shell around it (``SessionIO``)."""

from __future__ import annotations

from typing import Protocol

from protocols import events as ev
from protocols.machine import Step
from supervisor.receipt import CancelReceipt

__all__ = ["SessionIO"]


class SessionIO(Protocol):
    """What the core asks of the shell around it. None of it waits: what takes time is
    started, and its result comes back as a call into the core."""

    def now(self) -> float:
        """The run's clock (trio's; a test's ``MockClock``)."""

    def tree_clock(self) -> float:
        """The clock process start times are read on (tells a turn's processes from the
        agent's own)."""

    def deliver(self, step: Step) -> None:
        """Write the step's messages and signals to the live agent."""

    def publish(self, event: ev.Event) -> None:
        """Add a stamped event to the history and hand it to the subscribers."""

    def publish_many(self, events: list[ev.Event]) -> None:
        """:meth:`publish` each, at once."""

    def spawn(self, generation: int, resume: str | None) -> None:
        """Start an agent process; :meth:`AgentLifecycle.spawned` or ``spawn_failed`` follows."""

    def kill(self, generation: int) -> None:
        """Kill the live agent's whole tree (nothing more is read from it);
        :meth:`AgentLifecycle.kill_done` follows."""

    def close(self) -> None:
        """Close the live agent (stdin EOF, a bounded wait, then the kill);
        :meth:`AgentLifecycle.closed` follows."""

    def sweep(self, generation: int, since: float) -> None:
        """Kill what the turn started at or after ``since`` and left running;
        :meth:`SessionCore.swept` follows."""

    def watch_memory(self, generation: int, limit_mb: float) -> None:
        """Sample the live tree's memory; :meth:`AgentLifecycle.memory_over` when over."""

    def leader_exited(self) -> bool:
        """Our child (the agent, or its shim) has exited, whatever it still says on its pipes."""

    def ended(self) -> None:
        """The session is stopped or failed (its owner forgets it)."""

    def stopped(self, receipt: CancelReceipt) -> None:
        """A running turn was stopped and has ended: its receipt (the owner's recent stops)."""

    def conversation(self, limit: int) -> str:
        """The conversation so far (its prompts, steers and answers, the newest kept) as an
        agent whose session is a fresh one is to read it before the next prompt: at most
        ``limit`` bytes, ending with what introduces that prompt; "" when there is none."""

    def baseline(self) -> None:
        """Snapshot the working directory as the session starts, kept by no turn;
        :meth:`SessionCore.baseline_taken` follows."""

    def checkpoint(self, turn_id: str) -> None:
        """Snapshot the working directory as ``turn_id``'s start;
        :meth:`SessionCore.checkpoint_taken` follows."""

    def turn_changes(self, turn_id: str) -> None:
        """Snapshot the working directory and say what changed since ``turn_id`` started;
        :meth:`SessionCore.turn_changes` follows."""

    def rewind(self, checkpoint_id: str, undo_id: str, force: bool = False) -> None:
        """Put the working directory back as it was at ``checkpoint_id``, the state before
        kept as ``undo_id`` (unless it would undo other sessions' changes there: ``force``
        does anyway); :meth:`SessionCore.rewound` follows."""
