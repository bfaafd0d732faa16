"""Steering: text that redirects the running turn, the best way the agent has.

What a steer becomes (``supervisor/steering.py`` has the answer's words):

- no turn runs: the text starts one now, ahead of any queued prompt (``started``);
- the turn is already being stopped: the text starts the next turn once it has ended
  (``interrupted``);
- the agent can take it natively: it is sent, and waits for the agent's answer
  (``SteerAnswered``) until the agent's grace: joined (``injected``), or refused, or late, and
  then the turn makes way through the ladder (``interrupted``);
- the agent cannot: the turn makes way at once, and the text goes first once it is over.

While the supervisor is paused (``pause.py``) the turn a steer starts waits first in the queue
like any other, and its answer says so (``held``); a steer joined to the running turn is not
held: a pause holds new turns, not the one running.

A steer that is not settled belongs to the running turn (:class:`TurnSteers`): when the turn
ends, what it did not take goes first in the queue, in order; when a caller stops it, those
steers are dropped with it, each with its own turn id and ``turn.ended``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from protocols import events as ev
from protocols.machine import AgentProtocol, SteerAnswered, Step
from supervisor.core.turns import NativeSteer, PromptQueue, SteerNext, Turn, TurnIds, TurnSteers
from supervisor.core.waiter import Waiter
from supervisor.errors import AgentNotRunning
from supervisor.receipt import REASON_STEER, CancelReceipt, DroppedPrompt
from supervisor.steering import SteerMode, SteerResult

if TYPE_CHECKING:
    from supervisor.core.events import EventLog

__all__ = ["Steering", "SteeringHost"]


class SteeringHost(Protocol):
    """What steering asks of the session core."""

    def begin_cancel(self, turn: Turn, now: float, reason: str, *, keep_queue: bool) -> None: ...

    def start_next(self) -> None: ...

    def drop(self, prompt: DroppedPrompt, reason: str | None) -> CancelReceipt: ...

    def apply(self, step: Step) -> None: ...

    def deliver(self, step: Step) -> None: ...

    @property
    def held(self) -> str | None:
        """Why no turn starts now (``paused``), else None."""


class Steering:
    """The session's steering: where each steer goes, and what becomes of it."""

    def __init__(
        self,
        session_id: str,
        grace_s: float,
        ids: TurnIds,
        queue: PromptQueue,
        log: EventLog,
        host: SteeringHost,
    ) -> None:
        self._session_id = session_id
        self._grace_s = grace_s
        self._ids = ids
        self._queue = queue
        self._log = log
        self._host = host
        self._count = 0  # steer ids, for the agent's answers

    def steer(
        self,
        turn: Turn | None,
        machine: AgentProtocol | None,
        now: float,
        text: str,
        waiter: Waiter[SteerResult],
    ) -> None:
        """Route a steer (``machine``: the live agent's, None when none is live)."""
        if turn is None:
            self._start(text, waiter, "started")
        elif turn.cancel is not None:
            # Already on its way out: the text starts the next turn once it has ended.
            self._after(turn, text, waiter, "interrupted")
        elif machine is not None and machine.can_steer:
            self._count += 1
            _steers_of(turn).pending[self._count] = NativeSteer(text, waiter, now + self._grace_s)
            self._host.apply(machine.steer(turn.id, self._count, text))
        else:
            self._interrupt(turn, now, text, waiter)

    def answered(self, turn: Turn | None, answer: SteerAnswered, now: float) -> None:
        """The agent's answer to a native steer."""
        if turn is None or turn.id != answer.turn_id or turn.steers is None:
            return  # its turn ended first, and the text went to the next one then
        pending = turn.steers.pending.pop(answer.steer_id, None)
        if pending is None:
            return
        if answer.injected:
            self._log.emit(_steered(turn.id, "injected", pending.text))
            pending.waiter.resolve(
                SteerResult(session_id=self._session_id, mode="injected", turn_id=turn.id)
            )
        elif turn.cancel is not None:
            self._after(turn, pending.text, pending.waiter, "interrupted", answer.detail)
        elif answer.no_turn:
            # The agent's turn is over and ours ends with its answer, on its way: the text
            # starts the turn after it.
            self._after(turn, pending.text, pending.waiter, "started", answer.detail)
        else:
            self._interrupt(turn, now, pending.text, pending.waiter, answer.detail)

    def timed_out(
        self, turn: Turn, steer_id: int, machine: AgentProtocol | None, now: float
    ) -> None:
        """The agent did not answer the steer within its grace: withdraw it where the protocol
        can, and let the turn make way."""
        pending = _steers_of(turn).pending.pop(steer_id)
        detail = f"the agent did not answer the steer in {self._grace_s:g} s"
        if machine is not None:
            self._host.deliver(machine.abandon_steer(steer_id))
        if turn.cancel is not None:
            self._after(turn, pending.text, pending.waiter, "interrupted", detail)
        else:
            self._interrupt(turn, now, pending.text, pending.waiter, detail)

    def drop(self, turn: Turn, reason: str | None) -> list[DroppedPrompt]:
        """A caller stops the turn: its steers not taken yet are dropped with it, as queued
        prompts are, each with its turn id and its one ``turn.ended``; their callers hear it."""
        if turn.steers is None:
            return []
        steers: list[tuple[str | None, NativeSteer | SteerNext]] = [
            (None, steer) for steer in turn.steers.pending.values()
        ]
        steers += [(steer.turn_id, steer) for steer in turn.steers.then]
        turn.steers = None
        dropped = []
        for steer_turn_id, steer in steers:
            turn_id = steer_turn_id if steer_turn_id is not None else self._ids.next()
            self._log.emit(_steered(turn_id, "interrupted", steer.text, turn.id))
            prompt = DroppedPrompt.of(turn_id, steer.text)
            self._host.drop(prompt, reason)
            dropped.append(prompt)
            steer.waiter.resolve(
                SteerResult(
                    session_id=self._session_id,
                    mode="interrupted",
                    turn_id=turn_id,
                    detail="dropped: the turn it steered was stopped, and the text with it",
                )
            )
        return dropped

    def after_turn(
        self, turn: Turn, receipt: CancelReceipt | None, refused: AgentNotRunning | None
    ) -> None:
        """The turn is over: the steers it did not take go first in the queue, in order, and
        their callers hear back now (the turn they steered has ended); ``refused``: the session
        takes no more (it stops or failed), and they are told so instead."""
        if turn.steers is None:
            return
        following = [*turn.steers.then]
        following += [
            SteerNext("", steer.text, steer.waiter, "started")
            for steer in turn.steers.pending.values()
        ]
        turn.steers = None
        if not following:
            return
        if refused is not None:
            for steer in following:
                steer.waiter.fail(refused)
            return
        queued = []
        for steer in following:
            turn_id = steer.turn_id or self._ids.next()
            queued.append((turn_id, steer.text))
            interrupted = steer.mode == "interrupted"
            self._log.emit(
                _steered(turn_id, steer.mode, steer.text, turn.id if interrupted else None)
            )
            steer.waiter.resolve(
                SteerResult(
                    session_id=self._session_id,
                    mode=steer.mode,
                    turn_id=turn_id,
                    receipt=receipt if interrupted else None,
                    detail=steer.detail,
                    held=self._host.held,
                )
            )
        self._queue.put_steered_first(queued)

    def _start(
        self, text: str, waiter: Waiter[SteerResult], mode: SteerMode, detail: str | None = None
    ) -> None:
        """The text starts a turn: now if the session is ready, else first in the queue."""
        turn_id = self._ids.next()
        self._queue.put_steered(turn_id, text)
        self._log.emit(_steered(turn_id, mode, text))
        waiter.resolve(
            SteerResult(
                session_id=self._session_id,
                mode=mode,
                turn_id=turn_id,
                detail=detail,
                held=self._host.held,
            )
        )
        self._host.start_next()

    def _after(
        self,
        turn: Turn,
        text: str,
        waiter: Waiter[SteerResult],
        mode: SteerMode,
        detail: str | None = None,
    ) -> None:
        """The text starts the turn after ``turn``, once that has ended (:meth:`after_turn`)."""
        _steers_of(turn).then.append(SteerNext(self._ids.next(), text, waiter, mode, detail))

    def _interrupt(
        self,
        turn: Turn,
        now: float,
        text: str,
        waiter: Waiter[SteerResult],
        detail: str | None = None,
    ) -> None:
        """The agent cannot take the text into its turn: the turn makes way through the whole
        ladder, and the text goes first once it is over."""
        self._host.begin_cancel(turn, now, REASON_STEER, keep_queue=True)
        self._after(turn, text, waiter, "interrupted", detail)


def _steers_of(turn: Turn) -> TurnSteers:
    """The turn's steers, made at its first."""
    if turn.steers is None:
        turn.steers = TurnSteers()
    return turn.steers


def _steered(
    turn_id: str, mode: SteerMode, text: str, interrupted: str | None = None
) -> ev.TurnSteered:
    """``turn.steered``, its text previewed as events carry it (the agent gets it whole)."""
    shown, size = ev.preview(text)
    return ev.TurnSteered(
        turn_id=turn_id, mode=mode, text=shown, interrupted_turn_id=interrupted, text_bytes=size
    )
