"""The session core: every decision about one agent session, in code that never waits.

:class:`SessionCore` is fed what happens, as plain method calls, and acts through its
:class:`~supervisor.core.ports.SessionIO` port, which the Trio shell
(``supervisor/runtime/session.py``) implements:

- a caller's call: :meth:`~SessionCore.prompt`, :meth:`~SessionCore.cancel`,
  :meth:`~SessionCore.steer`, :meth:`~SessionCore.respond_permission`,
  :meth:`~SessionCore.set_mode`, and the lifecycle's ``wait_ready`` and ``stop``, each with the
  caller's :class:`~supervisor.core.waiter.Waiter` (answered once; a caller's mistake raises a
  :class:`~supervisor.errors.SupervisorError` instead);
- what the agent said: :meth:`~SessionCore.receive` (a decoded message),
  :meth:`~SessionCore.receive_run` (a run of them), :meth:`~SessionCore.bad_line`,
  :meth:`~SessionCore.stderr_line`;
- what the shell's work came to: a turn's tools swept (:meth:`~SessionCore.swept`), and, to
  the agent's lifecycle (:attr:`SessionCore.life`), a process started, gone, killed or closed,
  or over its memory;
- time: :meth:`~SessionCore.next_deadline` says when the core must next act though nothing
  comes, and :meth:`~SessionCore.deadline_passed` is called once it has passed.

What it asks of the port: write a protocol step to the live agent, publish events, start,
kill, close or sweep the agent process, and read the clock. So a test drives a whole session,
cancel ladder and all, with plain calls and a port that records (``tests/core/``).

This class owns the turns: the running one, the queue, each turn's end, a cancel's
coordination. Collaborators own the rest: the agent process's life, its exits, kills,
respawns and the session's stop (``lifecycle.py``, with the process's own state in
``agent.py`` and the restarts' in ``recycle.py``), a cancel's ladder and receipt
(``ladder.py``), steering (``steers.py``), the stall watchdog (``watchdog.py``), the events'
numbers and stamps (``events.py``); the states and their moves are ``states.py``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import attrs
import msgspec

from protocols import PROTOCOLS
from protocols import events as ev
from protocols.content import Part, refusal
from protocols.framing import FramingError
from protocols.machine import (
    AgentExiting,
    AgentProtocol,
    Control,
    InterruptAnswered,
    ModeSet,
    PartialStep,
    RestartWanted,
    SessionEstablished,
    StartFailed,
    SteerAnswered,
    Step,
    TurnFinished,
    UnknownPermission,
)
from supervisor.config import AgentSpec
from supervisor.core.checkpoints import Checkpoints, HeldEnd
from supervisor.core.events import EventLog
from supervisor.core.exit import ExitStatus
from supervisor.core.ladder import CancelJob
from supervisor.core.lifecycle import AgentLifecycle, survivors_text
from supervisor.core.pause import Pause
from supervisor.core.ports import SessionIO
from supervisor.core.states import ENDS, TRANSITIONS, IllegalTransition, State
from supervisor.core.steers import Steering
from supervisor.core.turns import EndedTurns, PromptQueue, Turn, TurnIds
from supervisor.core.waiter import Waiter
from supervisor.core.watchdog import STREAM_EVENTS, TURN_EVENTS, StallWatch
from supervisor.errors import AgentNotRunning, BadRequest, Busy, CheckpointFailed, Conflict
from supervisor.receipt import (
    REASON_PAUSED,
    REASON_STALLED,
    CancelReceipt,
    DroppedPrompt,
)
from supervisor.steering import SteerResult
from supervisor.wire.codec import receipt_to_wire

__all__ = ["URGENT_STATES", "SessionCore", "TurnHandle"]

log = logging.getLogger("supervisor.session")

#: The states in which agent output is urgent: it waits for no share of the supervisor's.
URGENT_STATES = frozenset({State.CANCELLING, State.STARTING})


@attrs.frozen
class TurnHandle:
    """A prompt accepted by the session: ``queued`` when it waits (behind another turn, or
    held); ``held``: why it waits though no turn may be ahead of it (``paused``: it starts once
    the supervisor is resumed), else None."""

    id: str
    queued: bool
    held: str | None = None


class SessionCore:
    """One agent session's state and decisions (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        spec: AgentSpec,
        *,
        cwd: str,
        io: SessionIO,
        max_queued: int,
        resume: str | None = None,
        paused: Pause | None = None,
        checkpoints: bool = False,
    ) -> None:
        """``checkpoints``: each turn's start is snapshotted and its changes computed
        (``checkpoints.py``): the port takes the snapshots."""
        self.id = session_id
        self.spec = spec
        self.cwd = cwd
        self._io = io
        self.state = State.STARTING
        protocol = PROTOCOLS.get(spec.protocol)
        carries = protocol.prompt_carries if protocol is not None else frozenset()
        self.turn: Turn | None = None
        self.queue = PromptQueue(max_queued)
        self.turn_ids = TurnIds()
        self.ended_turns = EndedTurns()
        self.log = EventLog(session_id, io.publish, io.publish_many)
        self.steering = Steering(
            session_id, spec.grace_s, self.turn_ids, self.queue, self.log, self
        )
        #: the agent process's life: started, exits, kills, restarts, the session's stop
        self.life = AgentLifecycle(
            session_id, spec, cwd=cwd, io=io, host=self, carries=carries, resume=resume
        )
        self.agent = self.life.agent
        self.recycler = self.life.recycler
        self._watchdog = bool(spec.stall_s or spec.tool_stall_s)
        #: the cancel job of a turn being ended, until its waiters have their receipt
        self._ending: CancelJob | None = None
        #: a receipt of a turn that ended as the session failed, and its waiters: answered
        #: once the agent that failed to start again is gone (``release_held``)
        self._held: tuple[CancelJob, CancelReceipt] | None = None
        #: the operator's pause: while it holds, no turn starts (``pause.py``)
        self.paused = paused if paused is not None else Pause()
        #: a turn has started in this session: here, or under an earlier supervisor (the shell
        #: sets it for a stored session started again)
        self.conversed = False
        #: the agent's session is a fresh one though the conversation had begun (a respawn or
        #: a restart could not resume it): the next turn's prompt carries the conversation so
        #: far, once (the turns after it are the fresh session's own)
        self.context_due = False
        #: the working directory's per-turn checkpoints (``checkpoints.py``)
        self.checkpoints = Checkpoints(checkpoints)

    # -- what the shell reads -----------------------------------------------------------------

    @property
    def seq(self) -> int:
        """The newest event's seq (0 before the first)."""
        return self.log.seq

    @property
    def turn_id(self) -> str | None:
        return self.turn.id if self.turn is not None else None

    @property
    def held(self) -> str | None:
        """Why no new turn starts (``paused``), else None."""
        return self.paused.word

    @property
    def live_generation(self) -> int | None:
        return self.agent.live

    @property
    def machine(self) -> AgentProtocol | None:
        """The live agent's protocol machine (None: no agent is live)."""
        return self.agent.machine

    @property
    def urgent(self) -> bool:
        """Agent output waits for no share: a cancel in progress, a start, a stop."""
        return self.state in URGENT_STATES or self.agent.starting or self.life.stopping

    @property
    def may_hold_back(self) -> bool:
        """A subscriber may hold the agent's output back: only while a turn simply runs (a
        cancel waits for no one, and a stop must hear the agent go)."""
        return self.state is State.RUNNING and not self.life.stopping

    @property
    def agent_session_id(self) -> str | None:
        machine = self.agent.machine
        if machine is not None and machine.agent_session_id is not None:
            return machine.agent_session_id
        return self.agent.resume_from

    @property
    def done(self) -> bool:
        """Nothing is left for the shell to run: its actor may end."""
        return self.life.done

    @property
    def exit_status(self) -> ExitStatus | None:
        return self.life.exit_status

    def not_running(self) -> AgentNotRunning:
        """Why a call can no longer be taken: the session's end (and why it failed)."""
        failure = self.life.failure
        why = f": {failure}" if self.state is State.FAILED and failure else ""
        return AgentNotRunning(f"session {self.id} is {self.state}{why}")

    # -- calls ----------------------------------------------------------------------------------

    def start(self) -> None:
        """The actor runs: start the first agent process (a session started paused says so
        first)."""
        if self.paused.held:
            self.emit(self.paused.event(self._io.now(), 0))
        if self.checkpoints.on:
            # Beside the agent's start: the first turn's start snapshot is then incremental.
            self.checkpoints.baseline = True
            self._io.baseline()
        self.life.spawn()

    def prompt(self, text: str, parts: tuple[Part, ...]) -> TurnHandle:
        self._check_takes_calls()
        self.queue.check_room()
        why = refusal(parts, self.agent.carries, f"agent {self.spec.name!r}")
        if why is not None:
            raise BadRequest(why)
        turn_id = self.turn_ids.next()
        self.queue.keep_parts(turn_id, parts)
        if self.state is State.READY and self.turn is None and not self.paused.held:
            if not self.checkpoints.on:
                self._start_turn(turn_id, text)
                return TurnHandle(turn_id, queued=False)
            # It starts once its checkpoint is taken: at the queue's front meanwhile, behind
            # only a prompt that waits for its own.
            behind = bool(self.queue)
            self.queue.put(turn_id, text)
            self.start_next()
            return TurnHandle(turn_id, queued=behind)
        self.queue.put(turn_id, text)
        return TurnHandle(turn_id, queued=True, held=self.paused.word)

    def set_mode(self, mode_id: str, waiter: Waiter[None]) -> None:
        self._check_takes_calls()
        machine = self.agent.machine
        if machine is None or self.state is State.STARTING or self.agent.starting:
            raise AgentNotRunning(
                f"session {self.id} is {self.state}: its agent is not up yet (try again once"
                " it is ready)"
            )
        modes = machine.modes
        if modes is None:
            raise BadRequest(f"agent {self.spec.name!r} offers no session modes")
        known = [m.get("id") for m in modes.get("availableModes", [])]
        if mode_id not in known:
            raise BadRequest(f"unknown mode {mode_id!r} (known: {', '.join(map(str, known))})")
        step = machine.set_mode(mode_id)
        self.agent.mode_waiters.append(waiter)
        self.apply(step)

    def terminal(self, keys: str | None, size: tuple[int, int] | None) -> None:
        """A person's ``keys`` for the agent's terminal, or its new ``size`` (cols, rows):
        only for a protocol with a terminal, and only while an agent runs to take them."""
        self._check_takes_calls()
        machine = self.agent.machine
        if machine is None or self.agent.live is None:
            raise AgentNotRunning(f"session {self.id} is {self.state}: no agent to type into")
        try:
            step = machine.input(keys) if keys is not None else machine.resize(*size or (0, 0))
        except NotImplementedError as exc:
            raise BadRequest(f"agent {self.spec.name!r}: {exc}") from None
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self.apply(step)

    def respond_permission(self, request_id: str, option_id: str | None) -> None:
        self._check_takes_calls()
        machine = self.agent.machine
        if machine is None:
            raise BadRequest(f"no pending permission request {request_id!r}")
        try:
            step = machine.respond_permission(request_id, option_id)
        except UnknownPermission as exc:
            raise BadRequest(str(exc)) from None
        self.apply(step)

    def _check_takes_calls(self) -> None:
        if self.state in ENDS:
            raise AgentNotRunning(f"session {self.id} is {self.state}")
        if self.life.stopping:
            raise AgentNotRunning(f"session {self.id} is stopping")

    # -- the cancel: the ladder's rungs are ladder.py's ------------------------------------------

    def cancel(
        self, turn_id: str | None, reason: str | None, waiter: Waiter[CancelReceipt]
    ) -> None:
        """Stop the running turn (or ``turn_id``); ``waiter`` gets the receipt once it ended."""
        if self.state in ENDS:
            waiter.fail(AgentNotRunning(f"session {self.id} is {self.state}"))
            return
        turn = self.turn
        if turn_id is not None and (turn is None or turn.id != turn_id):
            waiter.resolve(self._cancel_other_turn(turn_id, reason))
            return
        now = self._io.now()
        if turn is None:
            # 1. no active turn: an immediate receipt; queued prompts are dropped and listed
            # (or the turn that waits for its checkpoint is the one stopped)
            starting = self._starting()
            if starting is not None:
                waiter.resolve(self._cancel_starting(starting, reason, rest=True))
                return
            dropped = self.drop_queue(reason)
            waiter.resolve(
                CancelReceipt(
                    session_id=self.id,
                    turn_id=None,
                    outcome="no_active_turn",
                    dropped_prompts=dropped,
                    reason=reason,
                )
            )
            return
        steers = self.steering.drop(turn, reason) if turn.steers is not None else []
        job = turn.cancel
        if job is not None:
            # 6. concurrent cancels share one receipt; what was queued since the job began
            # (the watchdog's kept the queue; a kill takes long enough for the next prompt to
            # come) is what this caller stops too
            job.join(waiter, [*steers, *self.drop_queue(reason)])
            return
        if self.life.stopping:
            # The stop already interrupted the turn and closes the agent: the receipt says
            # what that took, once the turn has ended with it (closed).
            turn.cancel = job = CancelJob.during_stop(
                turn.id,
                now,
                reason,
                self.spec.grace_s,
                waiter,
                interrupted=self.life.stop_interrupted,
            )
            job.drop(steers)
            return
        self.begin_cancel(turn, now, reason, [waiter])
        if steers and turn.cancel is not None:
            turn.cancel.drop(steers, first=True)

    def begin_cancel(
        self,
        turn: Turn,
        now: float,
        reason: str | None,
        waiters: list[Waiter[CancelReceipt]] | None = None,
        *,
        keep_queue: bool = False,
        detail: str | None = None,
    ) -> None:
        """3. At once and without awaiting any reply: the interrupt, pending permissions
        answered cancelled, queued prompts dropped; then the grace races the turn's end."""
        machine = self.agent.machine
        assert machine is not None
        step = machine.cancel()
        permissions = bool(machine.pending_permissions)
        if permissions:
            step.extend(machine.cancel_permissions())
        turn.cancel = job = CancelJob.begin(
            turn.id,
            now,
            reason,
            self.spec.grace_s,
            waiters if waiters is not None else [],
            permissions=permissions,
            keep_queue=keep_queue,
        )
        if self.agent.live is not None:  # first (a caller's step writes it at the step's end)
            self._io.deliver(step)
        if not keep_queue and self.queue:
            job.dropped = self.drop_queue(reason)
        self.set_state(State.CANCELLING, detail)
        if step.events:
            self._apply_events(step)
        if job.grace_s <= 0 and turn.cancel is job and self.turn is turn:
            # No grace: no answer to the interrupt can come in time, so the kill does not race
            # one (an answer already in the pipe would otherwise be read first and spared).
            self.grace_expired(turn, job)

    def grace_expired(self, turn: Turn, job: CancelJob) -> None:
        """5. The agent did not end the turn in time: kill its tree, then respawn and resume."""
        job.grace_expired(self._io.now())
        self.set_state(State.CANCELLING, f"no turn end after {job.grace_s:g} s grace: killing")
        self.life.kill_live_agent()

    def _cancel_other_turn(self, turn_id: str, reason: str | None) -> CancelReceipt:
        """A cancel naming a turn that is not running: queued, ended, or unknown."""
        if turn_id == self._starting():
            return self._cancel_starting(turn_id, reason, rest=False)
        dropped = self.queue.take(turn_id)
        if dropped is not None:
            return self.drop(dropped, reason)
        ended = self.ended_turns.get(turn_id)
        if ended is None:
            raise BadRequest(f"unknown turn {turn_id!r} in session {self.id}")
        return ended

    def _starting(self) -> str | None:
        """The prompt at the queue's front that waits only for its checkpoint: its caller was
        told it runs (``queued`` False), so a cancel stops it as the turn it is."""
        checkpoints = self.checkpoints
        waits = checkpoints.under_way == "start" or (
            checkpoints.under_way is None and checkpoints.baseline
        )
        if not waits or not self.queue:
            return None
        head = self.queue[0][0]
        return head if head == checkpoints.starting else None

    def _cancel_starting(self, turn_id: str, reason: str | None, *, rest: bool) -> CancelReceipt:
        """Stop the turn that waits for its checkpoint: nothing reached the agent, so nothing
        is interrupted; its one ``turn.ended`` says ``cancelled``. ``rest``: the prompts
        queued behind it are dropped too, as a running turn's cancel drops them."""
        self.queue.take(turn_id)
        dropped = self.drop_queue(reason) if rest else []
        receipt = CancelReceipt(
            session_id=self.id,
            turn_id=turn_id,
            outcome="cancelled",
            stop_reason="cancelled",
            dropped_prompts=dropped,
            elapsed_ms=0.0,
            grace_s=self.spec.grace_s,
            reason=reason,
        )
        self.ended_turns.remember(turn_id, receipt)
        self.emit(
            ev.TurnEnded(
                turn_id=turn_id,
                outcome="cancelled",
                stop_reason="cancelled",
                receipt=receipt_to_wire(receipt),
                reason=reason,
            )
        )
        return receipt

    def drop_queue(self, reason: str | None) -> list[DroppedPrompt]:
        dropped = self.queue.take_all()
        for prompt in dropped:
            self.drop(prompt, reason)
        return dropped

    def drop(self, prompt: DroppedPrompt, reason: str | None) -> CancelReceipt:
        """A queued prompt that will never run: its own receipt, its one ``turn.ended``."""
        receipt = CancelReceipt(
            session_id=self.id,
            turn_id=prompt.turn_id,
            outcome="cancelled",
            stop_reason="dropped",
            dropped_prompts=[prompt],
            reason=reason,
        )
        self.ended_turns.remember(prompt.turn_id, receipt)
        self.emit(
            ev.TurnEnded(
                turn_id=prompt.turn_id,
                outcome="cancelled",
                stop_reason="dropped",
                receipt=receipt_to_wire(receipt),
                reason=reason,
            )
        )
        return receipt

    # -- steering (steers.py) ------------------------------------------------------------------

    def steer(self, text: str, waiter: Waiter[SteerResult]) -> None:
        """Redirect the running turn: natively where the agent can, else through the ladder;
        with no turn, the text starts one now."""
        self._check_takes_calls()
        self.steering.steer(self.turn, self.agent.machine, self._io.now(), text, waiter)

    # -- the operator's pause (pause.py) --------------------------------------------------------

    def pause(self, deadline: float) -> None:
        """Hold new turns; a turn still running at ``deadline`` (inf: never) is stopped."""
        if self.state in ENDS or not self.paused.hold(deadline):
            return
        now = self._io.now()
        self.emit(self.paused.event(now, len(self.queue)))
        self._pause_check(now)

    def resume(self) -> None:
        """New turns start again: the queue, in order."""
        if not self.paused.release() or self.state in ENDS:
            return
        self.emit(self.paused.event(self._io.now(), len(self.queue)))
        self.start_next()

    def _pause_applies(self, turn: Turn) -> bool:
        """The pause's deadline is ``turn``'s: held, and the turn simply runs (no cancel, no
        stop) on a live agent; else it is not looked at (a stop under way ends it anyway)."""
        return (
            self.paused.held
            and turn.cancel is None
            and self.state is State.RUNNING
            and not self.life.stopping
            and self.agent.machine is not None
        )

    def _pause_check(self, now: float) -> None:
        """The pause's deadline came: a turn that still simply runs is stopped through the
        ladder; the queue is kept (those prompts run once the pause is released)."""
        turn = self.turn
        if turn is None or not self.paused.due(now) or not self._pause_applies(turn):
            return
        self.begin_cancel(
            turn,
            now,
            REASON_PAUSED,
            [],
            keep_queue=True,
            detail="paused: the pause's deadline passed: cancelling the turn",
        )

    # -- turns ----------------------------------------------------------------------------------

    def _start_turn(self, turn_id: str, text: str) -> None:
        machine = self.agent.machine
        assert machine is not None
        parts = self.queue.parts_of(turn_id)
        due, self.context_due = self.context_due, False
        context = self._io.conversation(self.spec.context_bytes) if due else ""
        # A rewind since the agent's last prompt: it is told, right before what the user says.
        told = self.checkpoints.told
        preface = context + self.checkpoints.take_notice()
        sent = text
        if preface:  # in front of the prompt, as the first of its parts if it has parts
            if parts:
                parts = (Part("text", text=preface), *parts)
            else:
                sent = preface + text
        # A part the agent restarted since cannot take any more is written as its text.
        step = machine.prompt(turn_id, sent, parts) if parts else machine.prompt(turn_id, sent)
        # The prompt is handed to the agent first: if that fails, no turn was announced (and
        # the session is not left running a turn the agent never got).
        try:
            self.deliver(step)
        except Exception:
            # The machine now holds a turn the agent never got: the two no longer agree. The
            # one state both agree on again is a fresh agent, the session resumed.
            self.context_due = due
            self.checkpoints.told = told
            self.life.recycle("a prompt could not be handed to the agent")
            raise
        self.conversed = True
        now = self._io.now()
        watch = StallWatch.start(now, self.spec.stall_s, self.spec.tool_stall_s)
        self.turn = Turn(turn_id, text, now, self._io.tree_clock(), watch)
        self.set_state(State.RUNNING)
        shown, size = ev.preview(text)  # the agent got it whole (and the context before it)
        self.emit(
            ev.TurnStarted(
                turn_id=turn_id,
                text=shown,
                text_bytes=size,
                context="injected" if context else None,
                context_bytes=len(context.encode("utf-8", "surrogatepass")) if context else None,
            )
        )
        self._apply_events(step)

    def fresh_agent_session(self) -> None:
        """The agent's session is a fresh one, not the one it had (a respawn or a restart could
        not resume it, or it offers no resume): if anything was said before, the next prompt
        carries the conversation so far (``spec.context_bytes`` of it; 0: never)."""
        if self.conversed and self.spec.context_bytes > 0:
            self.context_due = True

    def start_next(self) -> None:
        if self.state is State.READY and self.turn is None and self.queue and not self.paused.held:
            if self.checkpoints.on and not self._checkpointed(self.queue[0][0]):
                return
            turn_id, text = self.queue.take_next()
            try:
                self._start_turn(turn_id, text)
            except Exception as exc:  # its caller was answered when it queued: tell everyone
                log.exception(
                    "session %s: prompt %s could not be handed to the agent", self.id, turn_id
                )
                failed = CancelReceipt(session_id=self.id, turn_id=turn_id, outcome="failed")
                self.ended_turns.remember(turn_id, failed)
                self.emit(
                    ev.TurnEnded(
                        turn_id=turn_id,
                        outcome="failed",
                        error=f"the prompt could not be handed to the agent: {exc!r}",
                    )
                )

    def _turn_finished(self, finished: TurnFinished) -> None:
        """The agent says the turn is over."""
        turn = self.turn
        if turn is None or turn.id != finished.turn_id:
            return
        self.agent.exits_without_turn = 0
        job = turn.cancel
        if job is None:
            # Nobody here asked it to stop; but a person may have stopped it inside the agent
            # (Codex's "decline and stop the turn"), and then the agent says so.
            if finished.error is not None:
                outcome = "failed"
            elif finished.interrupted is True:
                outcome = "cancelled"
            else:
                outcome = "completed"
            self.end_turn(turn, outcome, finished.stop_reason, error=finished.error)
            if self.recycler.turn_ended_by_itself(failed=outcome == "failed"):
                self.life.recycle(self.recycler.failing_reason(finished.error or "failed"))
                return
            if self.recycler.due is not None:  # its machine asked (RestartWanted)
                self.life.recycle(self.recycler.due)
                return
            if self.agent.exiting is not None:
                # Its process ends with the turn (Amp after an error): the next prompt waits
                # for the next process.
                self.set_state(State.STARTING, f"the agent is exiting ({self.agent.exiting})")
                return
            self.set_state(State.READY)
            self.start_next()
            return
        if self.recycler.failed_in_a_row:
            self.recycler.turn_stopped()
        now = self._io.now()
        job.turn_ended(finished, now)  # 4. ended in time: cancelled, or completed
        if self.agent.exiting is not None:
            # The turn is over but its process is not (Amp ends its run on the SIGINT that
            # stopped it): the receipt waits until it is gone and a new one runs, within the
            # grace timer, which stays set. The exit takes the process's tree with it.
            self.set_state(State.CANCELLING, f"the agent is exiting ({self.agent.exiting})")
            return
        if self.agent.live is not None and self._io.leader_exited():
            # Its shim died (killed, OOM) before the answer was taken: the tree is loose, and
            # being killed. The receipt waits for the exit report, which says what that took
            # (agent_gone), and for the respawn; the grace timer stays set.
            return
        job.deadline = None
        if job.outcome == "cancelled" and turn.ran_tools and self.agent.live is not None:
            # The agent says it stopped; its tools may not have (codex-acp leaves a running
            # shell command behind). Nothing the turn started may outlive the receipt. (Only
            # after a tool call: the sweep scans /proc, ~1-2 ms, too dear for every cancel.)
            self._io.sweep(self.agent.live, turn.started_clock)
            return
        self._finish_cancelled_turn(turn, job, now)

    def _finish_cancelled_turn(self, turn: Turn, job: CancelJob, now: float) -> None:
        self.end_turn(turn, job.outcome or "cancelled", job.stop_reason, error=job.error, now=now)
        if self.recycler.due is not None:
            # Stopped for its memory (the agent ended the turn but still holds it), or its
            # machine asked for a restart meanwhile.
            self.life.recycle(self.recycler.due)
            return
        self.set_state(State.READY)
        if self.queue:
            self.start_next()

    def swept(
        self, generation: int, killed: list[dict[str, Any]], survivors: list[dict[str, Any]]
    ) -> None:
        """The cancelled turn's leftover processes are gone (``killed`` had to be killed)."""
        turn = self.turn
        if generation != self.agent.live or turn is None or turn.cancel is None:
            return  # the agent died meanwhile: the respawn path ends the turn
        now = self._io.now()
        turn.cancel.tools_swept(killed, survivors, now)
        if survivors:
            # The agent is fine; tools of its turn outlived SIGKILL: say so, never hide it.
            self.emit(ev.ErrorEvent(code="kill_failed", message=survivors_text(survivors)))
        self._finish_cancelled_turn(turn, turn.cancel, now)

    def end_turn(
        self,
        turn: Turn,
        outcome: str,
        stop_reason: str | None,
        *,
        error: str | None = None,
        hold: bool = False,
        now: float | None = None,
    ) -> None:
        """The one place a running turn ends: one ``turn.ended``, the cancel's waiters
        answered (``hold``: once the kill under way is done, see ``_held``). With checkpoints,
        both wait for what the turn changed (:meth:`turn_changes`). ``now``: when it ended, if
        the caller has read the clock already."""
        receipt: CancelReceipt | None = None
        job = turn.cancel
        if job is not None:
            receipt = job.receipt(self.id, outcome, self._io.now() if now is None else now)
            self._ending = job  # no longer the turn's: should a bug stop us, still answered
        self.turn = None
        ended = HeldEnd(
            turn.id, outcome, stop_reason, error, job.reason if job else None, receipt, job
        )
        checkpoints = self.checkpoints
        if (
            checkpoints.on
            and checkpoints.has(turn.id)
            and checkpoints.under_way is None
            and not hold
            and not self.life.stopping
            and self.life.failure is None
        ):
            # A cancel naming it meanwhile learns how it ended; no turn starts before it is
            # told (start_next waits while a checkpoint is under way).
            self.ended_turns.remember(turn.id, receipt or self._ended_receipt(ended, None))
            checkpoints.held = ended
            checkpoints.under_way = "end"
            self._io.turn_changes(turn.id)
        else:
            self._publish_end(ended, None, hold=hold)
        if turn.steers is not None:
            refused = None
            if self.life.stopping or self.life.failure is not None:
                refused = AgentNotRunning(f"session {self.id} is {self.state}")
            self.steering.after_turn(turn, receipt, refused)

    def _ended_receipt(self, ended: HeldEnd, changes: list[dict[str, Any]] | None) -> CancelReceipt:
        """A turn nobody cancelled: what a later cancel naming it learns of how it ended."""
        return CancelReceipt(
            session_id=self.id,
            turn_id=ended.turn_id,
            outcome="failed" if ended.outcome == "failed" else "completed",
            stop_reason=ended.stop_reason,
            changes=changes,
        )

    def _publish_end(
        self, ended: HeldEnd, changes: list[dict[str, Any]] | None, *, hold: bool = False
    ) -> None:
        """The turn's ``turn.ended`` (with what it changed, when known), its receipt given."""
        receipt, job = ended.receipt, ended.job
        if receipt is None:
            self.ended_turns.remember(ended.turn_id, self._ended_receipt(ended, changes))
        elif changes is not None:
            receipt = attrs.evolve(receipt, changes=changes)
        self.log.turn_ended(
            ended.turn_id,
            ended.outcome,
            ended.stop_reason,
            ended.error,
            receipt_to_wire(receipt) if receipt is not None else None,
            ended.reason,
            changes,
        )
        if job is not None and receipt is not None:
            self.ended_turns.remember(ended.turn_id, receipt)
            if hold:
                self._held = (job, receipt)
            else:
                for waiter in job.waiters:
                    waiter.resolve(receipt)  # 7. the answer
                self._ending = None
            self._io.stopped(receipt)

    # -- checkpoints (checkpoints.py) ------------------------------------------------------------

    def _checkpointed(self, turn_id: str) -> bool:
        """Whether ``turn_id`` (the queue's head) may start: its checkpoint is taken. If
        not, it is asked for (once nothing else is under way)."""
        checkpoints = self.checkpoints
        if checkpoints.under_way is not None:
            return False
        if checkpoints.starting == turn_id and checkpoints.taken:
            checkpoints.starting, checkpoints.taken = None, False
            return True
        checkpoints.starting, checkpoints.taken = turn_id, False
        if checkpoints.baseline:
            if checkpoints.baseline_overdue:
                checkpoints.starting = None
                self._without_checkpoint(turn_id)
                return True
            wait = self.spec.first_snapshot_wait_s
            if wait is not None and checkpoints.baseline_until is None:
                checkpoints.baseline_until = self._io.now() + wait
            return False  # asked for once the first snapshot is taken (baseline_taken)
        checkpoints.under_way = "start"
        self._io.checkpoint(turn_id)
        return False

    def baseline_taken(self, error: str | None) -> None:
        """The session's first snapshot is taken (or could not be: ``error``, said once; each
        turn's start tries again): a turn waiting for it has its own start snapshot taken."""
        checkpoints = self.checkpoints
        if not checkpoints.baseline:
            return
        checkpoints.baseline = False
        checkpoints.baseline_until, checkpoints.baseline_overdue = None, False
        if error is not None:
            self.emit(
                ev.ErrorEvent(
                    code="checkpoint_failed",
                    message=f"the working directory cannot be checkpointed: {error}"
                    " (each turn's start tries again)",
                )
            )
        if self.state not in ENDS:
            self.start_next()

    def _baseline_overdue(self) -> None:
        """The first snapshot outlasted ``spec.first_snapshot_wait_s``: the turn waiting for it
        starts without a checkpoint, and so do the turns after it until it is done."""
        checkpoints = self.checkpoints
        checkpoints.baseline_until = None
        turn_id = checkpoints.starting
        if self.turn is not None or turn_id is None or self._starting() != turn_id:
            return  # the turn that waited was cancelled: the next one waits afresh
        checkpoints.baseline_overdue = True
        checkpoints.taken = True  # (kept by no checkpoint: its end asks for none)
        self._without_checkpoint(turn_id)
        if self.state not in ENDS:
            self.start_next()

    def _without_checkpoint(self, turn_id: str) -> None:
        self.emit(
            ev.ErrorEvent(
                code="checkpoint_failed",
                message=f"turn {turn_id} starts without a checkpoint: the working directory's"
                f" first snapshot is still being taken after {self.spec.first_snapshot_wait_s:g}"
                " s (first_snapshot_wait_s); the turns after it have theirs once it is done",
            )
        )

    def checkpoint_taken(self, turn_id: str, error: str | None) -> None:
        """The working directory is snapshotted as ``turn_id``'s start (or could not be:
        ``error``, and the turn starts without one)."""
        checkpoints = self.checkpoints
        if checkpoints.under_way != "start" or checkpoints.starting != turn_id:
            return
        checkpoints.under_way = None
        checkpoints.taken = True
        if error is None:
            checkpoints.keep(turn_id)
        else:
            self.emit(
                ev.ErrorEvent(
                    code="checkpoint_failed",
                    message=f"turn {turn_id} starts without a checkpoint: {error}",
                )
            )
        if self.state not in ENDS:
            self.start_next()

    def turn_changes(
        self, turn_id: str, changes: list[dict[str, Any]] | None, error: str | None
    ) -> None:
        """What the ended turn ``turn_id`` changed (None: not known, ``error`` says why): its
        ``turn.ended`` and receipt go out."""
        checkpoints = self.checkpoints
        ended = checkpoints.held
        if checkpoints.under_way != "end" or ended is None or ended.turn_id != turn_id:
            return
        checkpoints.under_way, checkpoints.held = None, None
        if error is not None:
            self.emit(
                ev.ErrorEvent(
                    code="checkpoint_failed",
                    message=f"what turn {turn_id} changed is not known: {error}",
                )
            )
        self._publish_end(ended, changes)
        if self.state not in ENDS:
            self.start_next()

    def rewind(self, turn_id: str, waiter: Waiter[dict[str, Any]], force: bool = False) -> None:
        """Put the working directory back as it was when ``turn_id`` started (or as it was
        before the rewind ``turn_id`` names, ``r1``...): refused while a turn runs, and
        (unless ``force``) when it would undo what another session there changed."""
        checkpoints = self.checkpoints
        if not checkpoints.on:
            raise BadRequest(f"agent {self.spec.name!r} keeps no checkpoints (checkpoints off)")
        if self.state in ENDS:
            raise AgentNotRunning(f"session {self.id} is {self.state}")
        if not checkpoints.has(turn_id):
            raise BadRequest(f"session {self.id} has no checkpoint of {turn_id!r}")
        starting = self._starting()
        if self.turn is not None or checkpoints.under_way is not None or starting is not None:
            what = (
                f"turn {self.turn.id} runs"
                if self.turn is not None
                else f"turn {starting}'s start"
                if checkpoints.under_way is None
                else "a checkpoint is"
            )
            raise Busy(f"session {self.id} cannot rewind now: {what} under way (stop it first)")
        checkpoints.under_way = "rewind"
        checkpoints.rewinding = waiter
        self._io.rewind(turn_id, checkpoints.next_rewind_id(), force)

    def rewound(
        self,
        turn_id: str,
        undo_id: str,
        result: dict[str, Any] | None,
        error: str | None,
        conflict: bool = False,
    ) -> None:
        """The rewind to ``turn_id`` is done (``result``: what was restored; the state
        before it kept as ``undo_id``), or could not be made (``error``; ``conflict``: it
        was refused, as it would undo another session's changes)."""
        checkpoints = self.checkpoints
        waiter = checkpoints.rewinding
        if checkpoints.under_way != "rewind" or waiter is None:
            return
        checkpoints.under_way, checkpoints.rewinding = None, None
        checkpoints.starting, checkpoints.taken = None, False  # taken before: no longer so
        if result is None and conflict:
            waiter.fail(Conflict(f"session {self.id} did not rewind to {turn_id}: {error}"))
        elif result is None:
            waiter.fail(CheckpointFailed(f"session {self.id} could not rewind: {error}"))
        else:
            checkpoints.keep(undo_id)
            if self.spec.tell_rewind:
                checkpoints.rewound(turn_id, result["restored"])
            self.emit(
                ev.SessionRewound(
                    turn_id=turn_id,
                    restored=result["restored"],
                    not_restored=result["not_restored"],
                )
            )
            waiter.resolve({**result, "turn_id": turn_id, "undo": undo_id})
        if self.state not in ENDS:
            self.start_next()

    # -- what the agent said ------------------------------------------------------------------

    @property
    def hot_decoder(self) -> msgspec.json.Decoder[Any] | None:
        machine = self.agent.machine
        return machine.hot_decoder if machine is not None else None

    def heard_from_agent(self) -> None:
        self.agent.heard_from_live = True

    def receive(self, payload: dict[str, Any]) -> None:
        """One decoded message from the live agent."""
        self.agent.heard_from_live = True
        machine = self.agent.machine
        assert machine is not None
        try:
            step = machine.receive(payload)
        except Exception:
            log.exception("session %s: protocol machine failed on %r", self.id, payload)
            self.emit(ev.AgentUnparsed(raw=payload))
            return
        if step.send or step.signals:  # (what _apply does: a cancel's answer comes this way)
            self.deliver(step)
        self._apply_events(step)

    def receive_run(self, payloads: list[Any], at: int, end: int, generation: int | None) -> int:
        """Feed ``payloads[at:end]`` (messages of the live agent, ``generation``) to its
        machine, acting on each step it hands back, until the run is done or the agent is no
        longer the live one; the index reached."""
        run = payloads[at:end] if at or end < len(payloads) else payloads
        done = 0
        count = len(run)
        while done < count:
            machine = self.agent.machine
            assert machine is not None
            try:
                step, used = machine.receive_many(run, done)
            except PartialStep as failure:
                self.apply(failure.step)
                message = _as_raw(run[failure.failed])
                log.error(
                    "session %s: protocol machine failed on %r",
                    self.id,
                    message,
                    exc_info=failure.__cause__,
                )
                self.emit(ev.AgentUnparsed(raw=message))
                used = failure.consumed + 1
            except Exception:  # a machine without the PartialStep contract: one message
                log.exception("session %s: protocol machine failed on %r", self.id, run[done])
                self.emit(ev.AgentUnparsed(raw=_as_raw(run[done])))
                used = 1
            else:
                self.apply(step)
            done += used
            if self.agent.live != generation or self.life.done:
                break
        return at + done

    def bad_line(self, error: FramingError) -> None:
        """The agent wrote a line that is no message."""
        self.agent.heard_from_live = True
        self.emit(
            ev.ErrorEvent(
                code=f"agent_{error.kind}",
                message=f"agent wrote a bad line ({error.detail}, {error.size} bytes):"
                f" {error.excerpt!r}",
            )
        )

    def stderr_line(self, line: str) -> None:
        self.emit(ev.AgentStderr(line=line))

    def apply(self, step: Step) -> None:
        """Send what the machine wants sent, then act on what it says happened."""
        self.deliver(step)
        self._apply_events(step)

    def deliver(self, step: Step) -> None:
        if self.agent.live is not None:
            self._io.deliver(step)

    def _apply_events(self, step: Step) -> None:
        events = step.events
        if not events:
            return
        if len(events) == 1 and isinstance(events[0], Control):  # a cancel's answer, say
            self._on_control(events[0])
            return
        if not any(map(_is_control, set(map(type, events)))):
            self._emit_many(events)  # type: ignore[arg-type]  # no Control among them
            return
        plain: list[ev.Event] = []
        for output in events:
            if isinstance(output, Control):
                if plain:
                    self._emit_many(plain)
                    plain = []
                self._on_control(output)
            else:
                plain.append(output)
        if plain:
            self._emit_many(plain)

    def _on_control(self, control: Control) -> None:
        if isinstance(control, TurnFinished):  # first: a cancel's answer is one
            self._turn_finished(control)
        elif isinstance(control, SessionEstablished):
            self.life.established(control)
        elif isinstance(control, StartFailed):
            if control.resume_failed and self.agent.resume_from is not None:
                self.life.start_fresh(control.message)
            else:
                self.life.start_failed(control.message)
        elif isinstance(control, SteerAnswered):
            self.steering.answered(self.turn, control, self._io.now())
        elif isinstance(control, ModeSet):
            self._mode_set(control)
        elif isinstance(control, AgentExiting):
            self.life.agent_exiting(control)
        elif isinstance(control, RestartWanted):
            self.life.restart_wanted(control.reason)
        elif isinstance(control, InterruptAnswered):
            turn = self.turn
            if turn is not None and turn.id == control.turn_id and turn.cancel is not None:
                turn.cancel.interrupt_answered(self._io.now())

    def _mode_set(self, answer: ModeSet) -> None:
        if not self.agent.mode_waiters:
            return
        waiter = self.agent.mode_waiters.popleft()
        if answer.error is None:
            waiter.resolve(None)
        else:
            waiter.fail(BadRequest(f"the agent refused mode {answer.mode_id!r}: {answer.error}"))

    # -- the stall watchdog -------------------------------------------------------------------

    def _heard(self, turn: Turn, event: ev.Event) -> None:
        """The agent said something about the running turn (one of ``TURN_EVENTS``)."""
        if isinstance(event, ev.ToolCall):
            turn.ran_tools = True
        if not self._watchdog:
            return
        if turn.watch.hear(event, self._io.now(), turn.id) and turn.cancel is None:
            turn.watch.stall_at = turn.watch.due(self._watching())

    def _watching(self) -> bool:
        """The watchdog's limit applies: the turn runs, the agent is up, and no permission
        request waits on a person (its answer re-arms it)."""
        machine = self.agent.machine
        return (
            self.state is State.RUNNING
            and not self.life.stopping
            and machine is not None
            and not machine.pending_permissions
        )

    def _stall_check(self, now: float) -> None:
        """The watchdog's deadline passed: the turn is stalled, or the deadline moves on."""
        turn = self.turn
        if turn is None or turn.cancel is not None:
            return
        stall = turn.watch.check(now, self._watching())
        if stall is None:
            return
        self.emit(
            ev.TurnStalled(
                turn_id=turn.id,
                silent_s=round(stall.silent_s, 3),
                stall_s=stall.stall_s,
                tool_calls=stall.tool_calls,
            )
        )
        # The same ladder as a caller's cancel; queued prompts stay: the user queued them
        # behind this turn, and it is not the user who gave up on it.
        self.begin_cancel(
            turn,
            now,
            REASON_STALLED,
            [],
            keep_queue=True,
            detail=f"stalled: nothing from the agent for {stall.silent_s:.1f} s"
            f" (stall_s {stall.stall_s:g}): cancelling the turn",
        )

    def holding_back(self) -> Turn | None:
        """The shell is about to read no agent output for a while (a full subscriber holds it
        back): the stream heard so far is dated now. Give the turn to :meth:`held_back`."""
        turn = self.turn
        if turn is not None:
            turn.watch.note_time(self._io.now())
        return turn

    def held_back(self, turn: Turn | None, seconds: float) -> None:
        """The shell read no agent output for ``seconds``: the agent was not silent, we were
        not listening; the watchdog does not count it (if that turn still runs)."""
        if turn is not None and turn is self.turn:
            turn.watch.paused(seconds)

    # -- deadlines ----------------------------------------------------------------------------

    def next_deadline(self) -> float:
        """When the core must next act though nothing comes (inf: never): a cancel's grace,
        the start's timeout, a steer's answer, an exit that should come, the stall
        watchdog's limit (once the stream heard is dated), a pause's deadline, or the end of a
        turn's wait for the first snapshot."""
        deadline = math.inf
        turn = self.turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                if job.deadline is not None:
                    deadline = job.deadline
            else:
                if turn.watch.stall_at != math.inf:
                    if turn.watch.heard:
                        turn.watch.note_time(self._io.now())
                    deadline = turn.watch.stall_at
                if self.paused.held and self._pause_applies(turn):  # (a call only when held)
                    deadline = min(deadline, self.paused.deadline)
            steers = turn.steers
            if steers is not None and steers.pending:
                deadline = min(deadline, steers.next_deadline())
        until = self.checkpoints.baseline_until
        if until is not None and turn is None:
            deadline = min(deadline, until)
        agent = self.agent
        if agent.start_deadline is not None:
            deadline = min(deadline, agent.start_deadline)
        if agent.exit_deadline is not None:
            deadline = min(deadline, agent.exit_deadline)
        return deadline

    def deadline_passed(self) -> None:
        """A deadline passed: act on each that is due (each is read again: what came first
        may have made it moot)."""
        now = self._io.now()
        agent = self.agent
        self.life.start_deadline_passed(now)
        turn = self.turn
        if turn is not None and turn.cancel is not None and turn.cancel.deadline is not None:
            if now >= turn.cancel.deadline:
                self.grace_expired(turn, turn.cancel)
        if turn is not None and turn is self.turn and turn.steers is not None:
            for steer_id in turn.steers.overdue(now):
                if turn.steers is not None and steer_id in turn.steers.pending:
                    self.steering.timed_out(turn, steer_id, self.agent.machine, now)
        if agent.exit_deadline is not None and now >= agent.exit_deadline:
            self.life.exit_overdue()
        turn = self.turn
        if turn is not None and turn.cancel is None and now >= turn.watch.stall_at:
            self._stall_check(now)
        self._pause_check(now)
        until = self.checkpoints.baseline_until
        if until is not None and now >= until and self.checkpoints.baseline:
            self._baseline_overdue()

    # -- the end ------------------------------------------------------------------------------

    def release_held(self) -> None:
        """The kill the failed session waited for is done: its turn's receipt is answered."""
        if self._held is not None:
            job, receipt = self._held
            self._held = None
            self._ending = None
            job.answer(receipt)

    def crashed(self, exc: Exception) -> None:
        """A bug stopped the actor: the session is failed, and says so, not just stopped."""
        self.life.failure = f"the session crashed: {exc!r}"
        if self.state is State.FAILED:
            return
        try:
            self.set_state(State.FAILED, self.life.failure)
        except Exception:  # the bug may be in telling subscribers: the state at least
            self.state = State.FAILED

    def finish(self) -> None:
        """The actor ended: a session that had not stopped or failed is stopped."""
        self.life.done = True
        if self.state not in ENDS:
            self.state = State.STOPPED

    def abandon(self) -> None:
        """The actor ends: every caller the core still holds is answered (failed with why)."""
        error = self.not_running()
        self.life.abandon(error)
        checkpoints = self.checkpoints
        ended, checkpoints.held = checkpoints.held, None
        if ended is not None:  # its changes will not come: the turn's end is told without
            self._publish_end(ended, None)
        rewinding, checkpoints.rewinding = checkpoints.rewinding, None
        if rewinding is not None:
            rewinding.fail(error)
        if self._held is not None:  # the actor ends before that kill is done: answered now
            held, receipt = self._held
            held.answer(receipt)
        for job in (self.turn.cancel if self.turn is not None else None, self._ending):
            if job is not None:
                for cancel_waiter in job.waiters:
                    cancel_waiter.fail(error)  # no-op for one already answered

    # -- events -------------------------------------------------------------------------------

    def set_state(self, state: State, detail: str | None = None) -> None:
        old = self.state
        if state is old and detail is None:
            return
        if state not in TRANSITIONS[old]:
            raise IllegalTransition(old, state)
        self.state = state
        self.log.state(state, detail)  # (no turn event: the watchdog is not told)
        if state in ENDS:
            self._io.ended()  # a failed session's actor may live on: its owner hears it now

    def emit(self, event: ev.Event) -> None:
        turn = self.turn
        if turn is not None and type(event) in TURN_EVENTS:
            self._heard(turn, event)
        self.log.emit(event)

    def _emit_many(self, events: list[ev.Event]) -> None:
        """:meth:`_emit` each of a run of events: the watchdog told, then the run stamped and
        published at once."""
        if not EventLog.fresh(events):  # (rare) each is then copied, never changed
            for event in events:
                self.emit(event)
            return
        turn = self.turn
        if turn is not None:
            if set(map(type, events)) <= STREAM_EVENTS:  # a stream's run, told in C
                if self._watchdog:
                    turn.watch.heard = True  # what hear() does for each of them
            else:
                stream = False  # the last of the turn's events was one of the stream's
                for event in events:
                    cls = type(event)
                    if cls in STREAM_EVENTS:
                        stream = True
                    elif cls in TURN_EVENTS:
                        self._heard(turn, event)
                        stream = False
                if stream and self._watchdog:
                    turn.watch.heard = True
        self.log.emit_run(events)


def _as_raw(message: Any) -> dict[str, Any]:
    """A decoded message as the dict its line is (a machine's typed hot message converted)."""
    return message if isinstance(message, dict) else msgspec.to_builtins(message)


_CONTROL_KINDS: dict[type, bool] = {}


def _is_control(kind: type) -> bool:
    """Whether a machine's output of this class is a :class:`Control` (told in C once known)."""
    known = _CONTROL_KINDS.get(kind)
    if known is None:
        known = _CONTROL_KINDS[kind] = issubclass(kind, Control)
    return known
