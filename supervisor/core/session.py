"""The session core: every decision about one agent session, in code that never waits.

:class:`SessionCore` is fed what happens, as plain method calls, and acts through its
:class:`SessionIO` port, which the Trio shell (``supervisor/runtime/session.py``) implements:

- a caller's call: :meth:`~SessionCore.prompt`, :meth:`~SessionCore.cancel`,
  :meth:`~SessionCore.steer`, :meth:`~SessionCore.respond_permission`,
  :meth:`~SessionCore.set_mode`, :meth:`~SessionCore.wait_ready`, :meth:`~SessionCore.stop`,
  each with the caller's :class:`~supervisor.core.waiter.Waiter` (answered once; a caller's
  mistake raises a :class:`~supervisor.errors.SupervisorError` instead);
- what the agent said: :meth:`~SessionCore.receive` (a decoded message),
  :meth:`~SessionCore.receive_run` (a run of them), :meth:`~SessionCore.bad_line`,
  :meth:`~SessionCore.stderr_line`;
- what the shell's work came to: :meth:`~SessionCore.spawned` (or ``spawn_failed``),
  :meth:`~SessionCore.agent_gone`, :meth:`~SessionCore.kill_done`, :meth:`~SessionCore.closed`,
  :meth:`~SessionCore.swept`, :meth:`~SessionCore.memory_over`;
- time: :meth:`~SessionCore.next_deadline` says when the core must next act though nothing
  comes, and :meth:`~SessionCore.deadline_passed` is called once it has passed.

What it asks of the port: write a protocol step to the live agent, publish events, start,
kill, close or sweep the agent process, and read the clock. So a test drives a whole session,
cancel ladder and all, with plain calls and a port that records (``tests/core/``).

Collaborators each own one concern: the agent process (``agent.py``), the running turn and the
queue (``turns.py``), a cancel's ladder and receipt (``ladder.py``), steers (``steers.py``),
the stall watchdog (``watchdog.py``), restarts (``recycle.py``); the states and their moves are
``states.py``.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import msgspec

from protocols import PROTOCOLS, new_machine
from protocols import events as ev
from protocols.content import Part, refusal
from protocols.framing import FramingError
from protocols.machine import (
    AgentExiting,
    AgentProtocol,
    Control,
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
from supervisor.core.agent import MAX_EXITS_WITHOUT_TURN, AgentPhase, AgentState
from supervisor.core.events import EventLog
from supervisor.core.exit import ExitStatus
from supervisor.core.ladder import CancelJob
from supervisor.core.recycle import MAX_MEMORY_RESTARTS, Recycler
from supervisor.core.states import ENDS, TRANSITIONS, IllegalTransition, State
from supervisor.core.steers import Steering
from supervisor.core.turns import EndedTurns, PromptQueue, Turn, TurnIds
from supervisor.core.waiter import Waiter
from supervisor.core.watchdog import STREAM_EVENTS, TURN_EVENTS, StallWatch
from supervisor.errors import AgentNotRunning, BadRequest
from supervisor.receipt import (
    REASON_MEMORY_LIMIT,
    REASON_STALLED,
    CancelReceipt,
    DroppedPrompt,
)
from supervisor.steering import SteerResult
from supervisor.wire.codec import receipt_to_wire

__all__ = ["SessionCore", "SessionIO", "StopPhase", "TurnHandle"]

log = logging.getLogger("supervisor.session")

#: The states in which agent output is urgent: it waits for no share of the supervisor's.
URGENT_STATES = frozenset({State.CANCELLING, State.STARTING})


@attrs.frozen
class TurnHandle:
    """A prompt accepted by the session: ``queued`` when it waits behind another turn."""

    id: str
    queued: bool


class StopPhase(enum.Enum):
    """Where a stop of the session stands."""

    #: nobody asked
    NONE = "none"
    #: the agent is being closed (politely, then killed)
    CLOSING = "closing"
    #: a kill of the agent's tree was under way when the stop came: the stop ends with it
    AFTER_KILL = "after_kill"
    #: the session failed, and its last agent is being killed: the stop ends with that
    AFTER_FAILURE = "after_failure"


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
        """Start an agent process; :meth:`SessionCore.spawned` or ``spawn_failed`` follows."""

    def kill(self, generation: int) -> None:
        """Kill the live agent's whole tree (nothing more is read from it);
        :meth:`SessionCore.kill_done` follows."""

    def close(self) -> None:
        """Close the live agent (stdin EOF, a bounded wait, then the kill);
        :meth:`SessionCore.closed` follows."""

    def sweep(self, generation: int, since: float) -> None:
        """Kill what the turn started at or after ``since`` and left running;
        :meth:`SessionCore.swept` follows."""

    def watch_memory(self, generation: int, limit_mb: float) -> None:
        """Sample the live tree's memory; :meth:`SessionCore.memory_over` when over."""

    def leader_exited(self) -> bool:
        """Our child (the agent, or its shim) has exited, whatever it still says on its pipes."""

    def ended(self) -> None:
        """The session is stopped or failed (its owner forgets it)."""


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
    ) -> None:
        self.id = session_id
        self.spec = spec
        self.cwd = cwd
        self._io = io
        self.state = State.STARTING
        protocol = PROTOCOLS.get(spec.protocol)
        self.agent = AgentState(
            protocol.prompt_carries if protocol is not None else frozenset(), resume
        )
        self.turn: Turn | None = None
        self.queue = PromptQueue(max_queued)
        self.turn_ids = TurnIds()
        self.ended_turns = EndedTurns()
        self.recycler = Recycler(spec.max_failed_turns, spec.max_memory_mb)
        self.log = EventLog(session_id, io.publish, io.publish_many)
        self.steering = Steering(
            session_id, spec.grace_s, self.turn_ids, self.queue, self.log, self
        )
        self._watchdog = bool(spec.stall_s or spec.tool_stall_s)
        self.stop_phase = StopPhase.NONE
        #: a stop was asked (``stop_phase`` is not ``NONE``): read on every cancel
        self.stopping = False
        self._stop_waiters: list[Waiter[ExitStatus | None]] = []
        #: the stop interrupted the running turn
        self._stop_interrupted = False
        #: the steps and survivors of the kills a stop waits for (``StopPhase.AFTER_KILL``)
        self._stop_steps: list[str] = []
        self._stop_survivors: list[dict[str, Any]] = []
        self._ready_waiters: list[Waiter[None]] = []
        #: the cancel job of a turn being ended, until its waiters have their receipt
        self._ending: CancelJob | None = None
        #: a receipt of a turn that ended as the session failed, and its waiters: answered
        #: once the agent that failed to start again is gone (``kill_done``)
        self._held: tuple[CancelJob, CancelReceipt] | None = None
        #: why the session failed, for later callers
        self.failure: str | None = None
        #: nothing is left for the shell to run: its actor may end
        self.done = False
        self.exit_status: ExitStatus | None = None

    # -- what the shell reads -----------------------------------------------------------------

    @property
    def seq(self) -> int:
        """The newest event's seq (0 before the first)."""
        return self.log.seq

    @property
    def turn_id(self) -> str | None:
        return self.turn.id if self.turn is not None else None

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
        return self.state in URGENT_STATES or self.agent.starting or self.stopping

    @property
    def may_hold_back(self) -> bool:
        """A subscriber may hold the agent's output back: only while a turn simply runs (a
        cancel waits for no one, and a stop must hear the agent go)."""
        return self.state is State.RUNNING and not self.stopping

    @property
    def agent_session_id(self) -> str | None:
        machine = self.agent.machine
        if machine is not None and machine.agent_session_id is not None:
            return machine.agent_session_id
        return self.agent.resume_from

    def not_running(self, why: str = "") -> AgentNotRunning:
        failure = f": {self.failure}" if self.state is State.FAILED and self.failure else ""
        return AgentNotRunning(f"session {self.id} is {self.state}{why or failure}")

    # -- calls ----------------------------------------------------------------------------------

    def start(self) -> None:
        """The actor runs: start the first agent process."""
        self._spawn()

    def prompt(self, text: str, parts: tuple[Part, ...]) -> TurnHandle:
        self._check_takes_calls()
        self.queue.check_room()
        why = refusal(parts, self.agent.carries, f"agent {self.spec.name!r}")
        if why is not None:
            raise BadRequest(why)
        turn_id = self.turn_ids.next()
        self.queue.keep_parts(turn_id, parts)
        if self.state is State.READY and self.turn is None:
            self._start_turn(turn_id, text)
            return TurnHandle(turn_id, queued=False)
        self.queue.put(turn_id, text)
        return TurnHandle(turn_id, queued=True)

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

    def wait_ready(self, waiter: Waiter[None]) -> None:
        if self.state in ENDS:
            why = f": {self.failure}" if self.failure else ""  # the spawn error, say
            waiter.fail(AgentNotRunning(f"session {self.id} is {self.state}{why}"))
        elif self.state is State.STARTING or (self.stopping and self.state is not State.STOPPED):
            self._ready_waiters.append(waiter)
        else:
            waiter.resolve(None)

    def _check_takes_calls(self) -> None:
        if self.state in ENDS:
            raise AgentNotRunning(f"session {self.id} is {self.state}")
        if self.stopping:
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
            dropped = self._drop_queue(reason)
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
            job.join(waiter, [*steers, *self._drop_queue(reason)])
            return
        if self.stopping:
            # The stop already interrupted the turn and closes the agent: the receipt says
            # what that took, once the turn has ended with it (closed).
            turn.cancel = job = CancelJob.during_stop(
                turn.id, now, reason, self.spec.grace_s, waiter, interrupted=self._stop_interrupted
            )
            job.dropped.extend(steers)
            return
        self.begin_cancel(turn, now, reason, [waiter])
        if steers and turn.cancel is not None:
            turn.cancel.dropped[:0] = steers

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
            job.dropped = self._drop_queue(reason)
        self._set_state(State.CANCELLING, detail)
        if step.events:
            self._apply_events(step)
        if job.grace_s <= 0 and turn.cancel is job and self.turn is turn:
            # No grace: no answer to the interrupt can come in time, so the kill does not race
            # one (an answer already in the pipe would otherwise be read first and spared).
            self._grace_expired(turn, job)

    def _grace_expired(self, turn: Turn, job: CancelJob) -> None:
        """5. The agent did not end the turn in time: kill its tree, then respawn and resume."""
        job.grace_expired()
        self._set_state(State.CANCELLING, f"no turn end after {job.grace_s:g} s grace: killing")
        self._kill_live_agent()

    def _cancel_other_turn(self, turn_id: str, reason: str | None) -> CancelReceipt:
        """A cancel naming a turn that is not running: queued, ended, or unknown."""
        dropped = self.queue.take(turn_id)
        if dropped is not None:
            return self.drop(dropped, reason)
        ended = self.ended_turns.get(turn_id)
        if ended is None:
            raise BadRequest(f"unknown turn {turn_id!r} in session {self.id}")
        return ended

    def _drop_queue(self, reason: str | None) -> list[DroppedPrompt]:
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
        self._emit(
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

    # -- turns ----------------------------------------------------------------------------------

    def _start_turn(self, turn_id: str, text: str) -> None:
        machine = self.agent.machine
        assert machine is not None
        parts = self.queue.parts_of(turn_id)
        # A part the agent restarted since cannot take any more is written as its text.
        step = machine.prompt(turn_id, text, parts) if parts else machine.prompt(turn_id, text)
        # The prompt is handed to the agent first: if that fails, no turn was announced (and
        # the session is not left running a turn the agent never got).
        try:
            self.deliver(step)
        except Exception:
            # The machine now holds a turn the agent never got: the two no longer agree. The
            # one state both agree on again is a fresh agent, the session resumed.
            self._recycle("a prompt could not be handed to the agent")
            raise
        now = self._io.now()
        watch = StallWatch.start(now, self.spec.stall_s, self.spec.tool_stall_s)
        self.turn = Turn(turn_id, text, now, self._io.tree_clock(), watch)
        self._set_state(State.RUNNING)
        self._emit(ev.TurnStarted(turn_id=turn_id, text=text))
        self._apply_events(step)

    def start_next(self) -> None:
        if self.state is State.READY and self.turn is None and self.queue:
            turn_id, text = self.queue.take_next()
            try:
                self._start_turn(turn_id, text)
            except Exception as exc:  # its caller was answered when it queued: tell everyone
                log.exception(
                    "session %s: prompt %s could not be handed to the agent", self.id, turn_id
                )
                failed = CancelReceipt(session_id=self.id, turn_id=turn_id, outcome="failed")
                self.ended_turns.remember(turn_id, failed)
                self._emit(
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
            self._end_turn(turn, outcome, finished.stop_reason, error=finished.error)
            if self.recycler.turn_ended_by_itself(failed=outcome == "failed"):
                self._recycle(self.recycler.failing_reason(finished.error or "failed"))
                return
            if self.recycler.due is not None:  # its machine asked (RestartWanted)
                self._recycle(self.recycler.due)
                return
            if self.agent.exiting is not None:
                # Its process ends with the turn (Amp after an error): the next prompt waits
                # for the next process.
                self._set_state(State.STARTING, f"the agent is exiting ({self.agent.exiting})")
                return
            self._set_state(State.READY)
            self.start_next()
            return
        if self.recycler.failed_in_a_row:
            self.recycler.turn_stopped()
        job.turn_ended(finished)  # 4. ended in time: cancelled, or completed
        if self.agent.exiting is not None:
            # The turn is over but its process is not (Amp ends its run on the SIGINT that
            # stopped it): the receipt waits until it is gone and a new one runs, within the
            # grace timer, which stays set. The exit takes the process's tree with it.
            self._set_state(State.CANCELLING, f"the agent is exiting ({self.agent.exiting})")
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
        self._finish_cancelled_turn(turn, job)

    def _finish_cancelled_turn(self, turn: Turn, job: CancelJob) -> None:
        self._end_turn(turn, job.outcome or "cancelled", job.stop_reason, error=job.error)
        if self.recycler.due is not None:
            # Stopped for its memory (the agent ended the turn but still holds it), or its
            # machine asked for a restart meanwhile.
            self._recycle(self.recycler.due)
            return
        self._set_state(State.READY)
        if self.queue:
            self.start_next()

    def swept(
        self, generation: int, killed: list[dict[str, Any]], survivors: list[dict[str, Any]]
    ) -> None:
        """The cancelled turn's leftover processes are gone (``killed`` had to be killed)."""
        turn = self.turn
        if generation != self.agent.live or turn is None or turn.cancel is None:
            return  # the agent died meanwhile: the respawn path ends the turn
        turn.cancel.tools_swept(killed, survivors)
        if survivors:
            # The agent is fine; tools of its turn outlived SIGKILL: say so, never hide it.
            self._emit(ev.ErrorEvent(code="kill_failed", message=survivors_text(survivors)))
        self._finish_cancelled_turn(turn, turn.cancel)

    def _end_turn(
        self,
        turn: Turn,
        outcome: str,
        stop_reason: str | None,
        *,
        error: str | None = None,
        hold: bool = False,
    ) -> None:
        """The one place a running turn ends: one ``turn.ended``, the cancel's waiters
        answered (``hold``: once the kill under way is done, see ``_held``)."""
        receipt: CancelReceipt | None = None
        job = turn.cancel
        if job is not None:
            receipt = job.receipt(self.id, outcome, self._io.now())  # 7. the answer
            self._ending = job  # no longer the turn's: should a bug stop us, still answered
        else:
            # A turn nobody cancelled: a later cancel naming it learns how it really ended.
            self.ended_turns.remember(
                turn.id,
                CancelReceipt(
                    session_id=self.id,
                    turn_id=turn.id,
                    outcome="failed" if outcome == "failed" else "completed",
                    stop_reason=stop_reason,
                ),
            )
        self.turn = None
        self.log.turn_ended(
            turn.id,
            outcome,
            stop_reason,
            error,
            receipt_to_wire(receipt) if receipt is not None else None,
            job.reason if job is not None else None,
        )
        if job is not None and receipt is not None:
            self.ended_turns.remember(turn.id, receipt)
            if hold:
                self._held = (job, receipt)
            else:
                for waiter in job.waiters:
                    waiter.resolve(receipt)
                self._ending = None
        if turn.steers is not None:
            refused = None
            if self.stopping or self.failure is not None:
                refused = AgentNotRunning(f"session {self.id} is {self.state}")
            self.steering.after_turn(turn, receipt, refused)

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
            self._emit(ev.AgentUnparsed(raw=payload))
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
                self._emit(ev.AgentUnparsed(raw=message))
                used = failure.consumed + 1
            except Exception:  # a machine without the PartialStep contract: one message
                log.exception("session %s: protocol machine failed on %r", self.id, run[done])
                self._emit(ev.AgentUnparsed(raw=_as_raw(run[done])))
                used = 1
            else:
                self.apply(step)
            done += used
            if self.agent.live != generation or self.done:
                break
        return at + done

    def bad_line(self, error: FramingError) -> None:
        """The agent wrote a line that is no message."""
        self.agent.heard_from_live = True
        self._emit(
            ev.ErrorEvent(
                code=f"agent_{error.kind}",
                message=f"agent wrote a bad line ({error.detail}, {error.size} bytes):"
                f" {error.excerpt!r}",
            )
        )

    def stderr_line(self, line: str) -> None:
        self._emit(ev.AgentStderr(line=line))

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
            self._established(control)
        elif isinstance(control, StartFailed):
            if control.resume_failed and self.agent.resume_from is not None:
                self._start_fresh(control.message)
            else:
                self._start_failed(control.message)
        elif isinstance(control, SteerAnswered):
            self.steering.answered(self.turn, control, self._io.now())
        elif isinstance(control, ModeSet):
            self._mode_set(control)
        elif isinstance(control, AgentExiting):
            self._agent_exiting(control)
        elif isinstance(control, RestartWanted):
            self._restart_wanted(control.reason)

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
            and not self.stopping
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
        self._emit(
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
        the start's timeout, a steer's answer, an exit that should come, or the stall
        watchdog's limit (once the stream heard is dated)."""
        deadline = math.inf
        turn = self.turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                if job.deadline is not None:
                    deadline = job.deadline
            elif turn.watch.stall_at != math.inf:
                if turn.watch.heard:
                    turn.watch.note_time(self._io.now())
                deadline = turn.watch.stall_at
            steers = turn.steers
            if steers is not None and steers.pending:
                deadline = min(deadline, steers.next_deadline())
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
        if agent.start_deadline is not None and now >= agent.start_deadline:
            agent.start_deadline = None
            self._start_failed(
                f"agent did not finish its handshake in {self.spec.start_timeout_s} s"
            )
        turn = self.turn
        if turn is not None and turn.cancel is not None and turn.cancel.deadline is not None:
            if now >= turn.cancel.deadline:
                self._grace_expired(turn, turn.cancel)
        if turn is not None and turn is self.turn and turn.steers is not None:
            for steer_id in turn.steers.overdue(now):
                if turn.steers is not None and steer_id in turn.steers.pending:
                    self.steering.timed_out(turn, steer_id, self.agent.machine, now)
        if agent.exit_deadline is not None and now >= agent.exit_deadline:
            self._exit_overdue()
        turn = self.turn
        if turn is not None and turn.cancel is None and now >= turn.watch.stall_at:
            self._stall_check(now)

    # -- the agent process --------------------------------------------------------------------

    def _spawn(self) -> None:
        generation = self.agent.spawn(self._io.now(), self.spec.start_timeout_s)
        self._io.spawn(generation, self.agent.resume_from)

    def _respawn(self) -> None:
        turn = self.turn
        if turn is None or turn.cancel is None:
            self._set_state(State.STARTING, "respawning the agent")
        else:
            self._set_state(State.CANCELLING, "respawning the agent")
        self._spawn()

    def takes_agent(self, generation: int) -> bool:
        """The process started for ``generation`` is wanted (else the shell kills it)."""
        return self.agent.takes(generation) and not self.stopping

    def spawned(self, generation: int) -> None:
        """The process for ``generation`` runs (after :meth:`takes_agent`): its handshake."""
        machine = new_machine(self.spec.protocol)
        if generation > 1:  # a respawn: its requests' ids must not be the last one's
            machine.number_requests(f"@{generation}")
        self.agent.running(generation, machine)
        self.recycler.fresh_process()
        limit = self.spec.max_memory_mb
        if limit:
            self._io.watch_memory(generation, limit)
        turn = self.turn
        if turn is not None and turn.cancel is not None:
            turn.cancel.respawned()  # 5. respawned
        self.apply(
            machine.start(
                cwd=self.cwd, resume=self.agent.resume_from, mcp_servers=self.spec.mcp_servers
            )
        )

    def spawn_failed(self, generation: int, message: str) -> None:
        if generation == self.agent.generation and self.agent.starting and not self.stopping:
            self._start_failed(message)

    def _established(self, established: SessionEstablished) -> None:
        refused = self.agent.established()
        resumed = False if refused is not None else established.resumed
        turn = self.turn
        if turn is not None and turn.cancel is not None:
            job = turn.cancel
            job.resumed_as(resumed)  # 5. resumed (or a fresh session)
            self._end_turn(turn, job.outcome or "killed", job.stop_reason, error=job.error)
        self._set_state(State.READY, established.detail or refused)
        for waiter in self._ready_waiters:
            waiter.resolve(None)
        self._ready_waiters.clear()
        self.start_next()

    def _start_fresh(self, reason: str) -> None:
        """The agent could not resume its session: start it again without resuming."""
        self.agent.resume_refused = reason
        self._emit(ev.ErrorEvent(code="resume_failed", message=reason))
        self._kill_live_agent(fresh=True)
        self.agent.resume_from = None  # after the kill, which would remember the refused id

    def _agent_exiting(self, exiting: AgentExiting) -> None:
        """The live agent says its process ends now, by design: let it, and respawn."""
        if self.stopping or self.agent.exiting is not None or self.agent.live is None:
            return
        self.agent.announced_exit(exiting.reason, self._io.now() + self.spec.grace_s)
        if self.turn is None and self.state is State.READY:
            self._set_state(State.STARTING, f"the agent is exiting ({exiting.reason})")

    def _exit_overdue(self) -> None:
        """The agent said it would exit and still runs a grace later: kill it, then respawn
        (a cancel in progress has its own grace timer, which kills it first)."""
        agent = self.agent
        agent.exit_deadline = None
        if agent.exiting is None or agent.live is None:
            return
        detail = f"the agent said it would exit ({agent.exiting}) but still runs: killing it"
        turn = self.turn
        if turn is not None and turn.cancel is not None:
            self._grace_expired(turn, turn.cancel)
            return
        if turn is not None:
            self._end_turn(turn, "failed", None, error=detail)
        self._set_state(State.STARTING, detail)
        self._kill_live_agent()

    def _kill_live_agent(self, *, fresh: bool = False) -> None:
        """Detach the live agent and have its tree killed; then (:meth:`kill_done`) respawn
        it, resuming (``fresh``: without resuming: the agent refused the resume)."""
        self.agent.remember_resume(self.agent.machine)
        generation = self.agent.live if self.agent.live is not None else self.agent.generation
        self._drop_machine()
        self.agent.kill_started(fresh=fresh)
        self._io.kill(generation)

    def _drop_machine(self) -> None:
        """Forget the live process's machine, keeping for the receipt what its unfinished
        cancel had asked of sub-agents or tasks (they never confirmed)."""
        machine = self.agent.detach()
        while self.agent.mode_waiters:  # never answered: the process that was to answer is gone
            self.agent.mode_waiters.popleft().fail(
                AgentNotRunning(f"the agent of session {self.id} exited before it took the mode")
            )
        turn = self.turn
        if machine is not None and turn is not None and turn.cancel is not None:
            turn.cancel.details_at_kill(machine.details_at_kill())

    def kill_done(self, steps: list[str], survivors: list[dict[str, Any]]) -> None:
        """A kill of an agent's tree ended: ``steps`` taken, ``survivors`` outlived SIGKILL."""
        fresh = self.agent.fresh_after_kill
        self.agent.kill_done()
        last = not self.agent.kills_in_flight
        if self.state is State.FAILED:
            if self._held is not None and last:
                job, receipt = self._held
                self._held = None
                self._ending = None
                job.answer(receipt)
            if self.stopping and last:
                self._end_failed()
            return
        if self.stopping:
            if self.stop_phase is StopPhase.AFTER_KILL:
                self._stop_steps += steps
                self._stop_survivors += survivors
                if last:
                    self.closed(None, self._stop_steps, self._stop_survivors)
            return
        turn = self.turn
        if turn is not None and turn.cancel is not None and not fresh:
            turn.cancel.killed(steps)  # 4. the tree killed
        self._emit(ev.AgentExited(exit_code=None, expected=True, killed=True))
        if survivors:
            self._tree_survived(survivors)
            return
        if fresh:
            self.agent.fresh_after_kill = False
            self._spawn()  # a fresh start after a refused resume: the state stays as it is
        else:
            self._respawn()

    def agent_gone(
        self,
        generation: int,
        status: ExitStatus,
        steps: list[str],
        survivors: list[dict[str, Any]],
        stderr_tail: Sequence[str] = (),
    ) -> None:
        """The live agent exited without being asked to (or its shim died and the shell killed
        its tree: ``containment_lost``), or as it said it would (``AgentExiting``).
        ``stderr_tail``: its last words on stderr, for the reason given."""
        agent = self.agent
        if generation != agent.live:
            return
        tail = list(stderr_tail)[-5:]
        exiting = agent.exiting
        establishing = agent.starting
        machine = agent.machine
        agent.resume_from = machine.agent_session_id if machine else agent.resume_from
        self._drop_machine()
        agent.phase = AgentPhase.DOWN
        lost = "containment_lost" in steps
        self._emit(
            ev.AgentExited(
                exit_code=status.code,
                signal=status.signal,
                expected=exiting is not None,
                killed=lost,
            )
        )
        if lost:
            detail = (
                f"containment lost: the agent's shim died ({status.description});"
                " the supervisor killed the agent's tree itself"
            )
        elif exiting is not None:
            detail = f"the agent exited as it said it would ({exiting}; {status.description})"
        else:
            detail = f"agent exited unexpectedly ({status.description})"
        if tail:
            detail += ": " + " | ".join(tail)
        turn = self.turn
        job = turn.cancel if turn is not None else None
        if job is not None:
            job.killed(steps)  # 4. what losing containment took, if it was lost
        if survivors:
            if job is not None:
                job.lost_with_the_agent()
            self._tree_survived(survivors, detail)
            return
        if establishing:
            # It died before the handshake finished: respawning would only loop.
            self._start_failed(detail)
            return
        agent.exits_without_turn += 1
        if agent.exits_without_turn >= MAX_EXITS_WITHOUT_TURN:
            self._start_failed(
                f"the agent exited {agent.exits_without_turn} times in a row: {detail}"
            )
            return
        resumed_process_was_mute = (
            agent.spawned_resume is not None and not agent.heard_from_live and exiting is None
        )
        if turn is not None:
            if job is None:
                self._end_turn(turn, "failed", None, error=detail)
            else:
                # It died while stopping (or we killed it: containment lost): the turn has
                # ended; the receipt waits for the respawn, so the session is ready when the
                # caller hears back.
                job.agent_exited(killed="sigkill" in steps, announced=exiting is not None)
                self._set_state(State.CANCELLING, detail)
        if resumed_process_was_mute:
            # Protocols without a handshake (Amp) cannot refuse a resume; a resumed process
            # that dies before saying anything is how they say it. Go on fresh.
            agent.resume_refused = detail
            agent.resume_from = None
            self._emit(ev.ErrorEvent(code="resume_failed", message=detail))
        self._respawn()

    def _tree_survived(self, survivors: list[dict[str, Any]], detail: str | None = None) -> None:
        """Members of the agent's tree outlived SIGKILL: the session fails, honestly, instead
        of starting a new agent beside them (it could collide with them: same files, ports)."""
        message = survivors_text(survivors)
        if detail is not None:
            message = f"{detail}; {message}"
        turn = self.turn
        if turn is not None and turn.cancel is not None:
            turn.cancel.tree_survived(survivors)
        self._start_failed(message, code="kill_failed")

    def _start_failed(self, message: str, *, code: str = "agent_start_failed") -> None:
        self.failure = message
        self.agent.start_failed()
        turn = self.turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                # The stop killed the turn, and the session cannot go on: the receipt says
                # so, once what failed to start is gone too.
                job.session_failed(message)
                self._end_turn(
                    turn, job.outcome or "killed", job.stop_reason, hold=self.agent.live is not None
                )
            else:
                self._end_turn(turn, "failed", None, error=message)
        self._drop_queue(code)
        self._emit(ev.ErrorEvent(code=code, message=message))
        self._set_state(State.FAILED, message)
        error = AgentNotRunning(f"session {self.id} failed: {message}")
        for waiter in self._ready_waiters:
            waiter.fail(error)
        self._ready_waiters.clear()
        if self.agent.live is not None:
            self._kill_live_agent()

    # -- restarts nobody asked for --------------------------------------------------------------

    def _recycle(self, reason: str) -> None:
        """Restart the agent and resume the session; queued prompts wait for the new one."""
        failed = self.recycler.recycled(reason)
        self._emit(ev.SessionRecycled(reason=reason, failed_turns=failed))
        self._set_state(State.STARTING, f"recycling the agent: {reason}")
        self._kill_live_agent()  # then respawned, resuming the agent's session

    def _restart_wanted(self, reason: str) -> None:
        """The agent's machine says only a restart clears its state: now if no turn runs,
        else once the running turn is over."""
        if self.stopping or self.state not in (State.READY, State.RUNNING, State.CANCELLING):
            return
        self.recycler.wanted(reason)
        if self.turn is None:
            self._recycle(reason)

    def memory_over(self, generation: int, used_mb: float) -> None:
        """The agent's tree holds more memory than ``max_memory_mb`` allows: stop the turn
        through the ladder (``reason: "memory_limit"``), then restart the agent."""
        if (
            generation != self.agent.live
            or self.stopping
            or self.recycler.due is not None
            or self.state not in (State.READY, State.RUNNING, State.CANCELLING)
        ):
            return
        verdict = self.recycler.over_memory(used_mb)
        self._emit(ev.ErrorEvent(code=REASON_MEMORY_LIMIT, message=verdict.reason))
        if verdict.give_up:
            # Over the limit again and again with no turn done in between: a restart does not
            # help (the limit is below what the agent needs); fail instead of looping.
            self._start_failed(
                f"{verdict.reason}, after {MAX_MEMORY_RESTARTS} restarts in a row",
                code="memory_limit",
            )
            return
        turn = self.turn
        if turn is None:
            self._recycle(verdict.reason)
        elif turn.cancel is None:
            self.begin_cancel(
                turn,
                self._io.now(),
                REASON_MEMORY_LIMIT,
                [],
                keep_queue=True,
                detail=f"{verdict.reason}: stopping the turn, then restarting the agent",
            )
        # else: a cancel is on its way; the agent is restarted once it is over

    # -- stopping -----------------------------------------------------------------------------

    def stop(self, waiter: Waiter[ExitStatus | None]) -> None:
        """End the session: the turn is stopped, the agent exits (or is killed)."""
        if self.state is State.STOPPED:
            waiter.resolve(self.exit_status)
            return
        self._stop_waiters.append(waiter)
        if self.stopping:
            return
        if self.state is State.FAILED:
            # Nothing runs any more but maybe the kill of its last agent: once that is done,
            # the actor ends (and its owner forgets the session).
            self.stop_phase = StopPhase.AFTER_FAILURE
            self.stopping = True
            if not self.agent.kills_in_flight:
                self._end_failed()
            return
        self.stop_phase = StopPhase.CLOSING
        self.stopping = True
        agent = self.agent
        agent.exit_deadline = None
        self._drop_queue("session_stopped")
        machine = agent.machine
        turn = self.turn
        if turn is not None:
            # The turn ends with the agent: when the close (and maybe the ladder) is done.
            if machine is not None and agent.live is not None:
                step = machine.cancel()
                self._stop_interrupted = True
                if machine.pending_permissions:  # answered, and the clients told, as a cancel
                    step.extend(machine.cancel_permissions())
                self.apply(step)
            if turn.cancel is not None:
                turn.cancel.deadline = None
        machine = agent.machine
        if machine is not None and agent.live is not None:
            self.apply(machine.close())  # before its stdin closes (ACP session/close)
        self._drop_machine()
        agent.down()
        if agent.kills_in_flight and agent.phase is AgentPhase.KILLING:
            # The agent's tree is being killed (a cancel's ladder, a recycle): the stop ends,
            # and its turn with it, once that kill is done, with what it took (kill_done).
            self.stop_phase = StopPhase.AFTER_KILL
            return
        self._io.close()

    def closed(
        self, status: ExitStatus | None, steps: list[str], survivors: list[dict[str, Any]]
    ) -> None:
        """The stop's close of the agent ended (or the kill it waited for)."""
        if survivors:
            self._emit(ev.ErrorEvent(code="kill_failed", message=survivors_text(survivors)))
        turn = self.turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                outcome = job.closed(steps, survivors)  # 6. the stop ended the turn
            else:
                outcome = "killed" if steps else "cancelled"
            self._end_turn(turn, outcome, "session_stopped")
        self.exit_status = status
        self._emit(
            ev.AgentExited(
                exit_code=status.code if status else None,
                signal=status.signal if status else None,
                expected=True,
                killed=bool(steps),  # what the close had to do: sigterm, sigkill
            )
        )
        self._set_state(State.STOPPED)
        for waiter in self._stop_waiters:
            waiter.resolve(status)
        for ready in self._ready_waiters:
            ready.fail(AgentNotRunning(f"session {self.id} is stopped"))
        self._ready_waiters.clear()
        self.done = True

    def _end_failed(self) -> None:
        """A stop of a failed session: nothing of it runs any more; the actor ends."""
        for waiter in self._stop_waiters:
            waiter.resolve(self.exit_status)
        self._stop_waiters.clear()
        self.done = True

    # -- the end ------------------------------------------------------------------------------

    def crashed(self, exc: Exception) -> None:
        """A bug stopped the actor: the session is failed, and says so, not just stopped."""
        self.failure = f"the session crashed: {exc!r}"
        if self.state is State.FAILED:
            return
        try:
            self._set_state(State.FAILED, self.failure)
        except Exception:  # the bug may be in telling subscribers: the state at least
            self.state = State.FAILED

    def finish(self) -> None:
        """The actor ended: a session that had not stopped or failed is stopped."""
        self.done = True
        if self.state not in ENDS:
            self.state = State.STOPPED

    def abandon(self) -> None:
        """The actor ends: every caller the core still holds is answered (failed with why)."""
        error = self.not_running()
        for waiter in self._ready_waiters:
            waiter.fail(error)
        self._ready_waiters.clear()
        while self.agent.mode_waiters:
            self.agent.mode_waiters.popleft().fail(error)
        if self._held is not None:  # the actor ends before that kill is done: answered now
            held, receipt = self._held
            held.answer(receipt)
        for job in (self.turn.cancel if self.turn is not None else None, self._ending):
            if job is not None:
                for cancel_waiter in job.waiters:
                    cancel_waiter.fail(error)  # no-op for one already answered

    # -- events -------------------------------------------------------------------------------

    def _set_state(self, state: State, detail: str | None = None) -> None:
        old = self.state
        if state is old and detail is None:
            return
        if state not in TRANSITIONS[old]:
            raise IllegalTransition(old, state)
        self.state = state
        self.log.state(state, detail)  # (no turn event: the watchdog is not told)
        if state in ENDS:
            self._io.ended()  # a failed session's actor may live on: its owner hears it now

    def _emit(self, event: ev.Event) -> None:
        turn = self.turn
        if turn is not None and type(event) in TURN_EVENTS:
            self._heard(turn, event)
        self.log.emit(event)

    def _emit_many(self, events: list[ev.Event]) -> None:
        """:meth:`_emit` each of a run of events: the watchdog told, then the run stamped and
        published at once."""
        if not EventLog.fresh(events):  # (rare) each is then copied, never changed
            for event in events:
                self._emit(event)
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


def survivors_text(survivors: Sequence[dict[str, Any]]) -> str:
    listed = ", ".join(f"{s['pid']} ({s['command']})" for s in survivors[:5])
    return f"{len(survivors)} process(es) of the agent's tree survived SIGKILL: {listed}"


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
