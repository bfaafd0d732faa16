"""The stall watchdog: a running turn the agent says nothing about for ``stall_s`` is stopped.

What counts as the agent saying something about the turn (``TURN_EVENTS``): its stream, its
tool calls and their updates, its permission requests, and a terminal agent's output (a TUI
that redraws, a spinner too, is alive; a wedged one draws nothing). Not ``agent.stderr`` (a
wedged agent may log on), nor ``session.info`` or ``agent.unparsed`` (metadata and keep-alives
flow from agents whose model call hangs). While a tool call the agent reported runs,
``tool_stall_s`` applies instead (default: never); while a permission request waits, nothing
does (the turn waits on a person).

The stream is the hot path: a delta only sets :attr:`StallWatch.heard`; the clock is read once
before the session next waits (:meth:`StallWatch.note_time`) and the deadline is looked at only
when it passes, then moved to the last time heard plus the limit, or the turn is stalled.
"""

from __future__ import annotations

import math
from typing import Final

from attrs import define, frozen

from protocols import events as ev

__all__ = ["STREAM_EVENTS", "TURN_EVENTS", "Stall", "StallWatch"]

#: What the agent says about a running turn: any of these keeps the watchdog away.
TURN_EVENTS: Final[frozenset[type[ev.Event]]] = frozenset(
    {
        ev.MessageDelta,
        ev.ThoughtDelta,
        ev.ToolCall,
        ev.ToolUpdate,
        ev.Plan,
        ev.PermissionRequested,
        ev.PermissionResolved,
        ev.TerminalOutput,
    }
)
#: Of those, the stream itself: heard, and nothing else changes for the watchdog.
STREAM_EVENTS: Final[frozenset[type[ev.Event]]] = frozenset(
    {ev.MessageDelta, ev.ThoughtDelta, ev.Plan, ev.TerminalOutput}
)
#: Tool call statuses that end a call (ACP's words, which every machine maps to).
_TOOL_DONE: Final = frozenset({"completed", "failed"})


@frozen
class Stall:
    """The turn is stalled: silent for ``silent_s`` against the limit ``stall_s``, with these
    tool calls in progress."""

    silent_s: float
    stall_s: float
    tool_calls: list[str]


@define
class StallWatch:
    """The watchdog's view of one running turn."""

    stall_s: float | None
    tool_stall_s: float | None
    #: when the agent was last heard from (``heard``: it was since, the clock not read yet)
    heard_at: float
    heard: bool = False
    #: the tool calls it reported in progress
    tools: set[str] | None = None
    #: the deadline the session's wait honours (inf: none)
    stall_at: float = math.inf

    @classmethod
    def start(cls, now: float, stall_s: float | None, tool_stall_s: float | None) -> StallWatch:
        watch = cls(stall_s, tool_stall_s, heard_at=now)
        if stall_s:
            watch.stall_at = now + stall_s
        return watch

    def hear(self, event: ev.Event, now: float, turn_id: str) -> bool:
        """The agent said ``event`` (one of :data:`TURN_EVENTS`) about turn ``turn_id``; True
        when the deadline may have changed (the session then asks :meth:`due` again)."""
        if type(event) in STREAM_EVENTS or (
            isinstance(event, ev.ToolUpdate) and event.status is None
        ):
            self.heard = True  # the stream (a tool's output too): no clock, the hot path
            return False
        self.heard_at = now
        self.heard = False
        if isinstance(event, ev.ToolCall | ev.ToolUpdate):
            if event.turn_id is not None and event.turn_id != turn_id:
                return False  # a late word about an earlier turn's tool
            if event.status in _TOOL_DONE:
                if not self.tools or event.tool_call_id not in self.tools:
                    return False  # nothing changes
                self.tools.discard(event.tool_call_id)
            else:  # started, or said to be in progress
                if self.tools is None:
                    self.tools = set()
                self.tools.add(event.tool_call_id)
        return True

    def note_time(self, now: float) -> None:
        """Before the session waits: the stream heard since is dated now."""
        if self.heard:
            self.heard = False
            self.heard_at = now

    def paused(self, seconds: float) -> None:
        """The session did not read the agent for ``seconds`` (a subscriber held it back): the
        agent was not silent meanwhile, we were not listening."""
        self.heard_at += seconds

    @property
    def limit(self) -> float | None:
        return self.tool_stall_s if self.tools else self.stall_s

    def due(self, watching: bool) -> float:
        """When the turn is stalled if the agent says nothing more (inf: never). ``watching``:
        the turn runs, the agent is up and nobody is asked for a permission."""
        if not watching:
            return math.inf
        limit = self.limit
        return self.heard_at + limit if limit else math.inf

    def check(self, now: float, watching: bool) -> Stall | None:
        """The deadline passed: the stall, or None (heard from since, or waiting on a person,
        or a tool runs) with the deadline moved on."""
        self.note_time(now)
        self.stall_at = self.due(watching)
        if self.stall_at > now:
            return None
        self.stall_at = math.inf
        limit = self.limit
        assert limit
        return Stall(now - self.heard_at, limit, sorted(self.tools or ()))
