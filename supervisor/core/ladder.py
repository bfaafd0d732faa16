"""The cancel ladder: one cancel of one turn, its rungs in the order a stop takes them.

A :class:`CancelJob` is made when a turn is asked to stop (by a caller, the stall watchdog, a
steer the agent cannot take, the memory limit, or a stop of the session) and lives until the
turn has ended. The session core calls its rungs as things happen; each rung writes down what
the stop took. This module is the only place that appends escalation steps and builds
receipts, so a receipt's every word can be traced to one method here:

1. :meth:`CancelJob.begin`: at once and without awaiting any reply, the protocol interrupt
   (``interrupt``), every pending permission answered cancelled (``permissions_cancelled``);
   the grace timer armed (``deadline``). Concurrent cancels :meth:`join` it and share its
   receipt.
2. :meth:`CancelJob.turn_ended`: the agent ended the turn in time: ``cancelled``, or
   ``completed`` if it says it finished by itself (agents answer a cancelled turn with
   ``end_turn``: only their positive word counts). :meth:`tools_swept` adds the turn's tools
   that outlived it and were killed (``tools_killed``).
3. :meth:`CancelJob.grace_expired`: the timer won: ``grace_expired``, the outcome ``killed``.
4. :meth:`CancelJob.killed`: the whole tree killed (``sigterm``, ``sigkill``;
   ``containment_lost`` when what held it together died first), or :meth:`agent_exited` when
   it went by itself; :meth:`tree_survived` when members outlived SIGKILL (the session fails).
5. :meth:`CancelJob.respawned`, :meth:`resumed`: the agent started again and its session
   resumed (``respawned``, ``resumed``), or :meth:`session_failed` when it could not be.
6. :meth:`CancelJob.closed`: a stop of the session ended the turn with the agent.
7. :meth:`CancelJob.receipt`: the answer, made once the turn has ended and the session is
   ready again (terminate-then-respond).

Each rung is given the time it is reached: the receipt's ``timeline`` says when each step was
taken, in ms after the cancel began, and when the agent answered the interrupt
(``interrupt_answered``, where its protocol says: :meth:`interrupt_answered`), ended the turn
(``turn_ended``) or exited (``agent_exited``). Traces are built from it
(``supervisor/observe/tracing.py``), and the interrupt's delivery time is measured with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from attrs import define

from protocols.machine import TurnFinished
from supervisor.core.waiter import Waiter
from supervisor.receipt import CancelReceipt, DroppedPrompt, new_cancel_receipt

__all__ = ["CancelJob"]


def _ms(seconds: float) -> float:
    """To the microsecond, not by round(x, 3): that converts through decimal strings, ~1 us
    warm and 12-15 us on a cancel's cold path."""
    return int(seconds * 1_000_000 + 0.5) / 1000


#: What a cancel's job holds of the adapter's details until it has some.
_NO_DETAILS: Mapping[str, Any] = MappingProxyType({})


@define  # made on a cancel's cold path: see protocols.events.quick_constructor
class CancelJob:
    """One cancel of one turn; every concurrent cancel of that turn waits on it.

    What most cancels never add to (what was dropped, the adapter's details, survivors)
    starts as a shared empty, immutable default, and a rung that adds to one gives the job a
    new one of its own: no container is made for a cancel that never needs it."""

    turn_id: str
    started_at: float
    reason: str | None
    grace_s: float
    escalation: list[str]
    waiters: list[Waiter[CancelReceipt]]
    #: when each step was taken (and what the agent did meanwhile), in ms after ``started_at``
    timeline: dict[str, float]
    #: the queued prompts (and steers) this cancel threw away
    dropped: Sequence[DroppedPrompt] = ()
    #: when the grace runs out (None: not racing it, or no longer)
    deadline: float | None = None
    #: set once the turn is over (or known to be killed)
    outcome: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    resumed: bool | None = None
    details: Mapping[str, Any] = _NO_DETAILS
    survivors: Sequence[dict[str, Any]] = ()
    session_failed_: str | None = None
    #: the queue stays (the watchdog's, a steer's, the memory limit's cancel); a caller who
    #: joins drops it
    queue_kept: bool = False

    def _at(self, now: float, *names: str) -> None:
        """The steps ``names`` were taken at ``now`` (a step taken again keeps its first)."""
        ms = _ms(now - self.started_at)
        timeline = self.timeline
        for name in names:
            timeline.setdefault(name, ms)

    def drop(self, prompts: Sequence[DroppedPrompt], *, first: bool = False) -> None:
        """The cancel threw ``prompts`` away too (``first``: listed before those it had)."""
        if prompts:
            ours = self.dropped
            self.dropped = [*prompts, *ours] if first else [*ours, *prompts]

    def _survived(self, survivors: list[dict[str, Any]]) -> None:
        if survivors:
            self.survivors = [*self.survivors, *survivors]

    # -- 1. at once ---------------------------------------------------------------------------

    @classmethod
    def begin(
        cls,
        turn_id: str,
        now: float,
        reason: str | None,
        grace_s: float,
        waiters: list[Waiter[CancelReceipt]],
        *,
        permissions: bool,
        keep_queue: bool,
    ) -> CancelJob:
        """The interrupt is being sent (and ``permissions``: pending permission requests
        answered cancelled); the grace races the turn's end from ``now``."""
        if permissions:
            escalation = ["interrupt", "permissions_cancelled"]
            timeline = {"interrupt": 0.0, "permissions_cancelled": 0.0}
        else:
            escalation, timeline = ["interrupt"], {"interrupt": 0.0}
        return cls(
            turn_id,
            now,
            reason,
            grace_s,
            escalation,
            waiters,
            timeline,
            deadline=now + grace_s,
            queue_kept=keep_queue,
        )

    @classmethod
    def during_stop(
        cls,
        turn_id: str,
        now: float,
        reason: str | None,
        grace_s: float,
        waiter: Waiter[CancelReceipt],
        *,
        interrupted: bool,
    ) -> CancelJob:
        """A cancel that meets a stop of the session under way: the stop already interrupted
        the turn (``interrupted``) and closes the agent; no grace of its own is raced."""
        if interrupted:  # by the stop, before this cancel came
            return cls(turn_id, now, reason, grace_s, ["interrupt"], [waiter], {"interrupt": 0.0})
        return cls(turn_id, now, reason, grace_s, [], [waiter], {})

    def join(self, waiter: Waiter[CancelReceipt], dropped: list[DroppedPrompt]) -> None:
        """Another cancel of the same turn: it shares this receipt, and what it dropped (the
        queue, steers) is listed there too."""
        self.waiters.append(waiter)
        self.drop(dropped)
        self.queue_kept = False

    def interrupt_answered(self, now: float) -> None:
        """The agent answered the interrupt (a protocol whose interrupt is a request): it was
        delivered; the turn's end is another matter."""
        self._at(now, "interrupt_answered")

    # -- 2. the turn ended in time --------------------------------------------------------------

    def turn_ended(self, finished: TurnFinished, now: float) -> None:
        """The agent ended the turn: ``completed`` only on its own positive word that it
        finished by itself, else ``cancelled``."""
        self.timeline.setdefault("turn_ended", _ms(now - self.started_at))
        finished_itself = finished.interrupted is False and finished.error is None
        self.outcome = "completed" if finished_itself else "cancelled"
        self.stop_reason = finished.stop_reason
        if finished.details:
            self.details = {**self.details, **finished.details}
        if finished.error is not None and self.stop_reason is None:
            self.stop_reason = "error"
        self.error = finished.error

    def tools_swept(
        self, killed: list[dict[str, Any]], survivors: list[dict[str, Any]], now: float
    ) -> None:
        """The turn's tools that the agent left running were killed (``killed``); members that
        outlived SIGKILL are listed (the agent itself is fine)."""
        if killed:
            self.escalation.append("tools_killed")
            self._at(now, "tools_killed")
            self.details = {**self.details, "tool_processes_killed": killed}
        self._survived(survivors)

    # -- 3. the grace expired -------------------------------------------------------------------

    def grace_expired(self, now: float) -> None:
        self.deadline = None
        self.escalation.append("grace_expired")
        self._at(now, "grace_expired")
        self.outcome = "killed"
        self.stop_reason = "killed"

    # -- 4. the tree killed, or gone by itself ---------------------------------------------------

    def killed(self, steps: list[str], now: float) -> None:
        """The kill ladder ran: its steps (``sigterm``, ``sigkill``; ``containment_lost``
        first when what held the tree together died and the tree was killed loose). The
        ladder reports them once it is done: each is timed at its end."""
        self.escalation.extend(steps)
        self._at(now, *steps)

    def details_at_kill(self, details: dict[str, Any]) -> None:
        """What the cancel asked of sub-agents or tasks that never confirmed (the protocol
        machine's word, read as its process goes)."""
        self.details = {**details, **self.details}

    def agent_exited(self, now: float, *, killed: bool, announced: bool) -> None:
        """The agent's process is gone while stopping: ``killed`` by us (containment was lost),
        or it exited. ``announced``: it said it would (Amp ends its run on the stop); if it also
        ended the turn first, that said how."""
        self.deadline = None
        self._at(now, "agent_exited")
        if killed or not announced or self.outcome is None:
            self.outcome = "killed" if killed else "cancelled"
            self.stop_reason = "killed" if killed else "agent_exited"

    def tree_survived(self, survivors: list[dict[str, Any]]) -> None:
        """Members of the tree outlived SIGKILL: listed; nothing is resumed (the session
        fails rather than start an agent beside them)."""
        self._survived(survivors)
        self.deadline = None
        self.resumed = None

    def lost_with_the_agent(self) -> None:
        """The tree outlived SIGKILL as the agent went: whatever the agent said, killed."""
        self.outcome = "killed"
        self.stop_reason = "killed"

    # -- 5. respawned and resumed, or not ------------------------------------------------------

    def respawned(self, now: float) -> None:
        if "respawned" not in self.escalation:  # a fresh retry after a refused resume: the same
            self.escalation.append("respawned")
            self._at(now, "respawned")

    def resumed_as(self, resumed: bool | None, now: float) -> None:
        """The new agent is up: it restored the session (``True``), could not (``False``: a
        fresh session), or was never asked to (``None``)."""
        if resumed is None and "respawned" in self.escalation:
            resumed = False  # respawned with nothing to resume: the session is a fresh one
        self.resumed = resumed
        if resumed:
            self.escalation.append("resumed")
            self._at(now, "resumed")

    def session_failed(self, message: str) -> None:
        """The session cannot go on (the agent could not be started again after the kill):
        the receipt says so, never "fresh session"."""
        self.resumed = None
        self.session_failed_ = message

    # -- 6. a stop of the session ended the turn -------------------------------------------------

    def closed(self, steps: list[str], survivors: list[dict[str, Any]], now: float) -> str:
        """The stop closed the agent, taking ``steps``; the turn's outcome: ``killed`` if the
        close had to kill, or a kill of this cancel's own came first, else ``cancelled``."""
        self.escalation.extend(steps)
        self._at(now, *steps)
        self.stop_reason = "session_stopped"
        self._survived(survivors)
        return "killed" if steps or self.outcome == "killed" else "cancelled"

    # -- 7. the answer ---------------------------------------------------------------------------

    def receipt(self, session_id: str, outcome: str, now: float) -> CancelReceipt:
        """The receipt of a turn that has ended as ``outcome``."""
        self.outcome = outcome
        return new_cancel_receipt(
            session_id=session_id,
            turn_id=self.turn_id,
            outcome=outcome,
            escalation=list(self.escalation),
            stop_reason=self.stop_reason,
            dropped_prompts=list(self.dropped),
            resumed=self.resumed,
            elapsed_ms=_ms(now - self.started_at),
            grace_s=self.grace_s,
            reason=self.reason,
            details=dict(self.details) if self.details else {},
            survivors=list(self.survivors),
            session_failed=self.session_failed_,
            timeline=dict(self.timeline),
        )

    def answer(self, receipt: CancelReceipt) -> None:
        for waiter in self.waiters:
            waiter.resolve(receipt)
