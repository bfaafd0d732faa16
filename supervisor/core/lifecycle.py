"""The agent process's life as a session lives it: started, its handshake, its exits expected
or not, the kills, respawns and resumes, the restarts nobody asked for, and the session's stop.

:class:`AgentLifecycle` belongs to one :class:`~supervisor.core.session.SessionCore`: it owns
the agent's state (``agent.py``) and the restarts' (``recycle.py``), and asks the core
(:class:`LifecycleHost`) to end the running turn, change the session's state, tell its
subscribers. Like the core it never waits: what takes time (a process started, a tree killed,
an agent closed) it asks of the shell through the port, and the result comes back as a call.
The ladder's rungs it reaches (killed, respawned, resumed, closed) are the turn's ``CancelJob``
(``ladder.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol

from protocols import events as ev
from protocols import new_machine
from protocols.machine import AgentExiting, SessionEstablished, Step
from supervisor.config import AgentSpec
from supervisor.core.agent import MAX_EXITS_WITHOUT_TURN, AgentPhase, AgentState
from supervisor.core.exit import ExitStatus
from supervisor.core.ladder import CancelJob
from supervisor.core.ports import SessionIO
from supervisor.core.recycle import MAX_MEMORY_RESTARTS, Recycler
from supervisor.core.states import State
from supervisor.core.turns import Turn
from supervisor.core.waiter import Waiter
from supervisor.errors import AgentNotRunning
from supervisor.receipt import REASON_MEMORY_LIMIT, CancelReceipt, DroppedPrompt

__all__ = ["AgentLifecycle", "LifecycleHost", "StopPhase", "survivors_text"]


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


class LifecycleHost(Protocol):
    """What the agent's lifecycle asks of the session core."""

    turn: Turn | None
    state: State

    def set_state(self, state: State, detail: str | None = None) -> None: ...

    def emit(self, event: ev.Event) -> None: ...

    def end_turn(
        self,
        turn: Turn,
        outcome: str,
        stop_reason: str | None,
        *,
        error: str | None = None,
        hold: bool = False,
    ) -> None: ...

    def start_next(self) -> None: ...

    def drop_queue(self, reason: str | None) -> list[DroppedPrompt]: ...

    def begin_cancel(
        self,
        turn: Turn,
        now: float,
        reason: str | None,
        waiters: list[Waiter[CancelReceipt]] | None = None,
        *,
        keep_queue: bool = False,
        detail: str | None = None,
    ) -> None: ...

    def grace_expired(self, turn: Turn, job: CancelJob) -> None: ...

    def apply(self, step: Step) -> None: ...

    def release_held(self) -> None: ...

    def fresh_agent_session(self) -> None: ...


class AgentLifecycle:
    def __init__(
        self,
        session_id: str,
        spec: AgentSpec,
        *,
        cwd: str,
        io: SessionIO,
        host: LifecycleHost,
        carries: frozenset[str],
        resume: str | None,
    ) -> None:
        self.id = session_id
        self.spec = spec
        self.cwd = cwd
        self._io = io
        self._host = host
        self.agent = AgentState(carries, resume)
        self.recycler = Recycler(spec.max_failed_turns, spec.max_memory_mb)
        self.stop_phase = StopPhase.NONE
        #: a stop was asked (``stop_phase`` is not ``NONE``): read on every cancel
        self.stopping = False
        self._stop_waiters: list[Waiter[ExitStatus | None]] = []
        #: the stop interrupted the running turn
        self.stop_interrupted = False
        #: the steps and survivors of the kills a stop waits for (``StopPhase.AFTER_KILL``)
        self._stop_steps: list[str] = []
        self._stop_survivors: list[dict[str, Any]] = []
        #: ``wait_ready`` calls waiting for the agent to be up
        self.ready_waiters: list[Waiter[None]] = []
        #: why the session failed, for later callers
        self.failure: str | None = None
        #: nothing is left for the shell to run: its actor may end
        self.done = False
        self.exit_status: ExitStatus | None = None

    def wait_ready(self, waiter: Waiter[None]) -> None:
        state = self._host.state
        if state is State.STOPPED or state is State.FAILED:
            why = f": {self.failure}" if self.failure else ""  # the spawn error, say
            waiter.fail(AgentNotRunning(f"session {self.id} is {state}{why}"))
        elif state is State.STARTING or self.stopping:
            self.ready_waiters.append(waiter)
        else:
            waiter.resolve(None)

    def start_deadline_passed(self, now: float) -> None:
        agent = self.agent
        if agent.start_deadline is not None and now >= agent.start_deadline:
            agent.start_deadline = None
            self.start_failed(
                f"agent did not finish its handshake in {self.spec.start_timeout_s} s"
            )

    def abandon(self, error: AgentNotRunning) -> None:
        """The actor ends: callers waiting on the agent are answered with ``error``."""
        for waiter in self.ready_waiters:
            waiter.fail(error)
        self.ready_waiters.clear()
        while self.agent.mode_waiters:
            self.agent.mode_waiters.popleft().fail(error)

    # -- the agent process --------------------------------------------------------------------

    def spawn(self) -> None:
        generation = self.agent.spawn(self._io.now(), self.spec.start_timeout_s)
        self._io.spawn(generation, self.agent.resume_from)

    def respawn(self) -> None:
        turn = self._host.turn
        if turn is None or turn.cancel is None:
            self._host.set_state(State.STARTING, "respawning the agent")
        else:
            self._host.set_state(State.CANCELLING, "respawning the agent")
        self.spawn()

    def takes_agent(self, generation: int) -> bool:
        """The process started for ``generation`` is wanted (else the shell kills it)."""
        return self.agent.takes(generation) and not self.stopping

    def spawned(self, generation: int) -> None:
        """The process for ``generation`` runs (after :meth:`takes_agent`): its handshake."""
        machine = new_machine(self.spec.protocol, self.spec.terminal)
        if generation > 1:  # a respawn: its requests' ids must not be the last one's
            machine.number_requests(f"@{generation}")
        self.agent.running(generation, machine)
        self.recycler.fresh_process()
        limit = self.spec.max_memory_mb
        if limit:
            self._io.watch_memory(generation, limit)
        turn = self._host.turn
        if turn is not None and turn.cancel is not None:
            turn.cancel.respawned(self._io.now())  # 5. respawned
        self._host.apply(
            machine.start(
                cwd=self.cwd, resume=self.agent.resume_from, mcp_servers=self.spec.mcp_servers
            )
        )

    def spawn_failed(self, generation: int, message: str) -> None:
        if generation == self.agent.generation and self.agent.starting and not self.stopping:
            self.start_failed(message)

    def established(self, established: SessionEstablished) -> None:
        refused = self.agent.established()
        resumed = False if refused is not None else established.resumed
        if resumed is not True:  # nothing resumed: this agent knows nothing said before
            self._host.fresh_agent_session()
        turn = self._host.turn
        if turn is not None and turn.cancel is not None:
            job = turn.cancel
            job.resumed_as(resumed, self._io.now())  # 5. resumed (or a fresh session)
            self._host.end_turn(turn, job.outcome or "killed", job.stop_reason, error=job.error)
        self._host.set_state(State.READY, established.detail or refused)
        for waiter in self.ready_waiters:
            waiter.resolve(None)
        self.ready_waiters.clear()
        self._host.start_next()

    def start_fresh(self, reason: str) -> None:
        """The agent could not resume its session: start it again without resuming."""
        self.agent.resume_refused = reason
        self._host.emit(ev.ErrorEvent(code="resume_failed", message=reason))
        self.kill_live_agent(fresh=True)
        self.agent.resume_from = None  # after the kill, which would remember the refused id

    def agent_exiting(self, exiting: AgentExiting) -> None:
        """The live agent says its process ends now, by design: let it, and respawn."""
        if self.stopping or self.agent.exiting is not None or self.agent.live is None:
            return
        self.agent.announced_exit(exiting.reason, self._io.now() + self.spec.grace_s)
        if self._host.turn is None and self._host.state is State.READY:
            self._host.set_state(State.STARTING, f"the agent is exiting ({exiting.reason})")

    def exit_overdue(self) -> None:
        """The agent said it would exit and still runs a grace later: kill it, then respawn
        (a cancel in progress has its own grace timer, which kills it first)."""
        agent = self.agent
        agent.exit_deadline = None
        if agent.exiting is None or agent.live is None:
            return
        detail = f"the agent said it would exit ({agent.exiting}) but still runs: killing it"
        turn = self._host.turn
        if turn is not None and turn.cancel is not None:
            self._host.grace_expired(turn, turn.cancel)
            return
        if turn is not None:
            self._host.end_turn(turn, "failed", None, error=detail)
        self._host.set_state(State.STARTING, detail)
        self.kill_live_agent()

    def kill_live_agent(self, *, fresh: bool = False) -> None:
        """Detach the live agent and have its tree killed; then (:meth:`kill_done`) respawn
        it, resuming (``fresh``: without resuming: the agent refused the resume)."""
        self.agent.remember_resume(self.agent.machine)
        generation = self.agent.live if self.agent.live is not None else self.agent.generation
        self.drop_machine()
        self.agent.kill_started(fresh=fresh)
        self._io.kill(generation)

    def drop_machine(self) -> None:
        """Forget the live process's machine, keeping for the receipt what its unfinished
        cancel had asked of sub-agents or tasks (they never confirmed)."""
        machine = self.agent.detach()
        while self.agent.mode_waiters:  # never answered: the process that was to answer is gone
            self.agent.mode_waiters.popleft().fail(
                AgentNotRunning(f"the agent of session {self.id} exited before it took the mode")
            )
        turn = self._host.turn
        if machine is not None and turn is not None and turn.cancel is not None:
            turn.cancel.details_at_kill(machine.details_at_kill())

    def kill_done(self, steps: list[str], survivors: list[dict[str, Any]]) -> None:
        """A kill of an agent's tree ended: ``steps`` taken, ``survivors`` outlived SIGKILL."""
        fresh = self.agent.fresh_after_kill
        self.agent.kill_done()
        last = not self.agent.kills_in_flight
        if self._host.state is State.FAILED:
            if last:
                self._host.release_held()
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
        turn = self._host.turn
        if turn is not None and turn.cancel is not None and not fresh:
            turn.cancel.killed(steps, self._io.now())  # 4. the tree killed
        self._host.emit(ev.AgentExited(exit_code=None, expected=True, killed=True))
        if survivors:
            self.tree_survived(survivors)
            return
        if fresh:
            self.agent.fresh_after_kill = False
            self.spawn()  # a fresh start after a refused resume: the state stays as it is
        else:
            self.respawn()

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
        self.drop_machine()
        agent.phase = AgentPhase.DOWN
        lost = "containment_lost" in steps
        self._host.emit(
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
        turn = self._host.turn
        job = turn.cancel if turn is not None else None
        if job is not None:
            job.killed(steps, self._io.now())  # 4. what losing containment took, if it was lost
        if survivors:
            if job is not None:
                job.lost_with_the_agent()
            self.tree_survived(survivors, detail)
            return
        if establishing:
            # It died before the handshake finished: respawning would only loop.
            self.start_failed(detail)
            return
        agent.exits_without_turn += 1
        if agent.exits_without_turn >= MAX_EXITS_WITHOUT_TURN:
            self.start_failed(
                f"the agent exited {agent.exits_without_turn} times in a row: {detail}"
            )
            return
        resumed_process_was_mute = (
            agent.spawned_resume is not None and not agent.heard_from_live and exiting is None
        )
        if turn is not None:
            if job is None:
                self._host.end_turn(turn, "failed", None, error=detail)
            else:
                # It died while stopping (or we killed it: containment lost): the turn has
                # ended; the receipt waits for the respawn, so the session is ready when the
                # caller hears back.
                job.agent_exited(
                    self._io.now(), killed="sigkill" in steps, announced=exiting is not None
                )
                self._host.set_state(State.CANCELLING, detail)
        if resumed_process_was_mute:
            # Protocols without a handshake (Amp) cannot refuse a resume; a resumed process
            # that dies before saying anything is how they say it. Go on fresh.
            agent.resume_refused = detail
            agent.resume_from = None
            self._host.emit(ev.ErrorEvent(code="resume_failed", message=detail))
        self.respawn()

    def tree_survived(self, survivors: list[dict[str, Any]], detail: str | None = None) -> None:
        """Members of the agent's tree outlived SIGKILL: the session fails, honestly, instead
        of starting a new agent beside them (it could collide with them: same files, ports)."""
        message = survivors_text(survivors)
        if detail is not None:
            message = f"{detail}; {message}"
        turn = self._host.turn
        if turn is not None and turn.cancel is not None:
            turn.cancel.tree_survived(survivors)
        self.start_failed(message, code="kill_failed")

    def start_failed(self, message: str, *, code: str = "agent_start_failed") -> None:
        self.failure = message
        self.agent.start_failed()
        turn = self._host.turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                # The stop killed the turn, and the session cannot go on: the receipt says
                # so, once what failed to start is gone too.
                job.session_failed(message)
                self._host.end_turn(
                    turn, job.outcome or "killed", job.stop_reason, hold=self.agent.live is not None
                )
            else:
                self._host.end_turn(turn, "failed", None, error=message)
        self._host.drop_queue(code)
        self._host.emit(ev.ErrorEvent(code=code, message=message))
        self._host.set_state(State.FAILED, message)
        error = AgentNotRunning(f"session {self.id} failed: {message}")
        for waiter in self.ready_waiters:
            waiter.fail(error)
        self.ready_waiters.clear()
        if self.agent.live is not None:
            self.kill_live_agent()

    # -- restarts nobody asked for --------------------------------------------------------------

    def recycle(self, reason: str) -> None:
        """Restart the agent and resume the session; queued prompts wait for the new one."""
        failed = self.recycler.recycled(reason)
        self._host.emit(ev.SessionRecycled(reason=reason, failed_turns=failed))
        self._host.set_state(State.STARTING, f"recycling the agent: {reason}")
        self.kill_live_agent()  # then respawned, resuming the agent's session

    def restart_wanted(self, reason: str) -> None:
        """The agent's machine says only a restart clears its state: now if no turn runs,
        else once the running turn is over."""
        if self.stopping or self._host.state not in (State.READY, State.RUNNING, State.CANCELLING):
            return
        self.recycler.wanted(reason)
        if self._host.turn is None:
            self.recycle(reason)

    def memory_over(self, generation: int, used_mb: float) -> None:
        """The agent's tree holds more memory than ``max_memory_mb`` allows: stop the turn
        through the ladder (``reason: "memory_limit"``), then restart the agent."""
        if (
            generation != self.agent.live
            or self.stopping
            or self.recycler.due is not None
            or self._host.state not in (State.READY, State.RUNNING, State.CANCELLING)
        ):
            return
        verdict = self.recycler.over_memory(used_mb)
        self._host.emit(ev.ErrorEvent(code=REASON_MEMORY_LIMIT, message=verdict.reason))
        if verdict.give_up:
            # Over the limit again and again with no turn done in between: a restart does not
            # help (the limit is below what the agent needs); fail instead of looping.
            self.start_failed(
                f"{verdict.reason}, after {MAX_MEMORY_RESTARTS} restarts in a row",
                code="memory_limit",
            )
            return
        turn = self._host.turn
        if turn is None:
            self.recycle(verdict.reason)
        elif turn.cancel is None:
            self._host.begin_cancel(
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
        if self._host.state is State.STOPPED:
            waiter.resolve(self.exit_status)
            return
        self._stop_waiters.append(waiter)
        if self.stopping:
            return
        if self._host.state is State.FAILED:
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
        self._host.drop_queue("session_stopped")
        machine = agent.machine
        turn = self._host.turn
        if turn is not None:
            # The turn ends with the agent: when the close (and maybe the ladder) is done.
            if machine is not None and agent.live is not None:
                step = machine.cancel()
                self.stop_interrupted = True
                if machine.pending_permissions:  # answered, and the clients told, as a cancel
                    step.extend(machine.cancel_permissions())
                self._host.apply(step)
            if turn.cancel is not None:
                turn.cancel.deadline = None
        machine = agent.machine
        if machine is not None and agent.live is not None:
            self._host.apply(machine.close())  # before its stdin closes (ACP session/close)
        self.drop_machine()
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
            self._host.emit(ev.ErrorEvent(code="kill_failed", message=survivors_text(survivors)))
        turn = self._host.turn
        if turn is not None:
            job = turn.cancel
            if job is not None:
                outcome = job.closed(steps, survivors, self._io.now())  # 6. the stop ended it
            else:
                outcome = "killed" if steps else "cancelled"
            self._host.end_turn(turn, outcome, "session_stopped")
        self.exit_status = status
        self._host.emit(
            ev.AgentExited(
                exit_code=status.code if status else None,
                signal=status.signal if status else None,
                expected=True,
                killed=bool(steps),  # what the close had to do: sigterm, sigkill
            )
        )
        self._host.set_state(State.STOPPED)
        for waiter in self._stop_waiters:
            waiter.resolve(status)
        for ready in self.ready_waiters:
            ready.fail(AgentNotRunning(f"session {self.id} is stopped"))
        self.ready_waiters.clear()
        self.done = True

    def _end_failed(self) -> None:
        """A stop of a failed session: nothing of it runs any more; the actor ends."""
        for waiter in self._stop_waiters:
            waiter.resolve(self.exit_status)
        self._stop_waiters.clear()
        self.done = True


def survivors_text(survivors: Sequence[dict[str, Any]]) -> str:
    listed = ", ".join(f"{s['pid']} ({s['command']})" for s in survivors[:5])
    return f"{len(survivors)} process(es) of the agent's tree survived SIGKILL: {listed}"
