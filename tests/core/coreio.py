"""Driving a :class:`~supervisor.core.session.SessionCore` with plain calls, no trio.

:class:`RecordingIO` is the core's port: it records what the core asks (messages to the agent,
events, processes to start, kill, close or sweep) and its clock is a number the test sets.
:class:`AcpAgent` answers the ACP machine's requests the way an ACP agent would, so a test can
walk a session through its whole life: start, prompts, cancels, kills, respawns and resumes.
"""

from __future__ import annotations

from typing import Any

from attrs import define, field

from protocols import events as ev
from protocols.machine import Step
from supervisor.config import AgentSpec
from supervisor.core.session import SessionCore
from supervisor.receipt import CancelReceipt

ACP = AgentSpec(name="acp", protocol="acp", command=("fake-acp",))


@define
class Slot:
    """A caller's waiter: what it was answered with, once."""

    value: Any = None
    error: BaseException | None = None
    answers: int = 0

    def resolve(self, value: Any) -> None:
        self.answers += 1
        if self.answers == 1:
            self.value = value

    def fail(self, error: BaseException) -> None:
        self.answers += 1
        if self.answers == 1:
            self.error = error

    @property
    def receipt(self) -> CancelReceipt:
        assert isinstance(self.value, CancelReceipt), (self.value, self.error)
        return self.value


@define
class RecordingIO:
    """The core's port, recording; ``clock`` is the time the core reads."""

    clock: float = 0.0
    sent: list[dict[str, Any]] = field(factory=list)
    signals: list[int] = field(factory=list)
    events: list[ev.Event] = field(factory=list)
    spawns: list[tuple[int, str | None]] = field(factory=list)
    kills: list[int] = field(factory=list)
    closes: int = 0
    sweeps: list[tuple[int, float]] = field(factory=list)
    memory_watches: list[int] = field(factory=list)
    leader_gone: bool = False
    ended_count: int = 0
    stops: list[CancelReceipt] = field(factory=list)
    #: what :meth:`conversation` answers, and the limits it was asked with
    said: str = ""
    conversation_limits: list[int] = field(factory=list)
    #: what was asked of the checkpoints, in order: ("baseline",), ("checkpoint" |
    #: "turn_changes", turn id), ("rewind", checkpoint id, undo id)
    checkpoints: list[tuple[str, ...]] = field(factory=list)

    def now(self) -> float:
        return self.clock

    def tree_clock(self) -> float:
        return self.clock

    def deliver(self, step: Step) -> None:
        self.sent.extend(step.send)
        self.signals.extend(step.signals)

    def publish(self, event: ev.Event) -> None:
        self.events.append(event)

    def publish_many(self, events: list[ev.Event]) -> None:
        self.events.extend(events)

    def spawn(self, generation: int, resume: str | None) -> None:
        self.spawns.append((generation, resume))

    def kill(self, generation: int) -> None:
        self.kills.append(generation)

    def close(self) -> None:
        self.closes += 1

    def sweep(self, generation: int, since: float) -> None:
        self.sweeps.append((generation, since))

    def watch_memory(self, generation: int, limit_mb: float) -> None:
        self.memory_watches.append(generation)

    def leader_exited(self) -> bool:
        return self.leader_gone

    def ended(self) -> None:
        self.ended_count += 1

    def stopped(self, receipt: CancelReceipt) -> None:
        self.stops.append(receipt)

    def conversation(self, limit: int) -> str:
        """What the shell would give a fresh agent session: ``said``, with ``limit`` noted."""
        self.conversation_limits.append(limit)
        return self.said

    def baseline(self) -> None:
        self.checkpoints.append(("baseline",))

    def checkpoint(self, turn_id: str) -> None:
        self.checkpoints.append(("checkpoint", turn_id))

    def turn_changes(self, turn_id: str) -> None:
        self.checkpoints.append(("turn_changes", turn_id))

    def rewind(self, checkpoint_id: str, undo_id: str, force: bool = False) -> None:
        self.checkpoints.append(("rewind", checkpoint_id, undo_id))

    # -- what a test reads ---------------------------------------------------------------------

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    def states(self) -> list[str]:
        return [e.state for e in self.events if isinstance(e, ev.SessionState)]

    def ended_turns(self) -> list[ev.TurnEnded]:
        return [e for e in self.events if isinstance(e, ev.TurnEnded)]


class AcpAgent:
    """An ACP agent as plain calls: it answers what the machine sent, when the test says."""

    def __init__(self, core: SessionCore, io: RecordingIO, *, load_session: bool = True) -> None:
        self.core = core
        self.io = io
        self.load_session = load_session
        self.answered = 0  # how many of io.sent it has looked at
        self.sessions = 0
        #: open session/prompt requests: id -> turn's text
        self.prompts: dict[int, str] = {}

    def start(self) -> None:
        """The supervisor starts the agent; the first process comes up and establishes."""
        self.core.start()
        self.come_up()

    def come_up(self) -> None:
        """The newest process asked for runs: the handshake, answered in full."""
        generation, _ = self.io.spawns[-1]
        assert self.core.life.takes_agent(generation)
        self.core.life.spawned(generation)
        self.answer()

    def answer(self) -> None:
        """Answer every request sent since the last look (prompts stay open: see
        :meth:`end_turn`)."""
        while self.answered < len(self.io.sent):
            message = self.io.sent[self.answered]
            self.answered += 1
            method = message.get("method")
            if "id" not in message or method is None:
                continue
            request_id = message["id"]
            if method == "initialize":
                capabilities = {"loadSession": True} if self.load_session else {}
                self.reply(request_id, {"protocolVersion": 1, "agentCapabilities": capabilities})
            elif method == "session/new":
                self.sessions += 1
                self.reply(request_id, {"sessionId": f"S{self.sessions}"})
            elif method == "session/load":
                self.reply(request_id, None)
            elif method == "session/prompt":
                self.prompts[request_id] = message["params"]["prompt"][0]["text"]

    def reply(self, request_id: int, result: Any) -> None:
        self.core.receive({"jsonrpc": "2.0", "id": request_id, "result": result})
        self.answer()

    def say(self, text: str) -> None:
        """A message chunk of the running turn."""
        self.core.receive(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": f"S{self.sessions}",
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": text},
                    },
                },
            }
        )

    def end_turn(self, stop_reason: str = "end_turn") -> None:
        """The oldest open prompt ends."""
        self.answer()
        request_id = min(self.prompts)
        del self.prompts[request_id]
        self.reply(request_id, {"stopReason": stop_reason})


def acp_session(
    spec: AgentSpec = ACP,
    *,
    max_queued: int = 32,
    resume: str | None = None,
    checkpoints: bool = False,
) -> tuple[SessionCore, RecordingIO, AcpAgent]:
    io = RecordingIO()
    core = SessionCore(
        "s1", spec, cwd="/w", io=io, max_queued=max_queued, resume=resume, checkpoints=checkpoints
    )
    return core, io, AcpAgent(core, io)
