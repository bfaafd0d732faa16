"""An in-memory ACP agent for actor tests on virtual time.

It plugs into the session through the same ``Launcher`` signature as real processes, but its
"process" is a trio task: messages are dicts, a kill is a cancel scope, and every delay is
virtual, so tests can assert exact receipt times. Behaviour is set per launcher and can be
overridden per prompt with tokens in the prompt text (``ignore-cancel``, ``stop-delay=0.5``,
``words=3``, ``permission``, ``crash``, ``flood``, ``deferred-id=0.2``).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import trio
from attrs import define, field

from protocols.framing import Message
from supervisor.config import AgentSpec
from supervisor.link import AgentFrame, AgentGone, AgentLink
from supervisor.process import ExitStatus


@define
class Behaviour:
    words: int = 10
    word_interval: float = 0.1
    stop_delay: float | None = 0.0  # None: ignores session/cancel
    ignores_sigterm: bool = False
    kill_time: float = 0.0  # virtual time a kill takes after SIGTERM
    load_session: bool = True
    permission: bool = False
    crash_after: int | None = None
    flood: bool = False
    deferred_id: float | None = None  # announce the turn id this late (deferred protocol)
    start_delay: float = 0.0
    fail_start: bool = False
    pad: int = 0  # extra characters per word, to make big events

    def for_prompt(self, text: str) -> Behaviour:
        changes: dict[str, Any] = {}
        for token in text.split():
            key, _, value = token.partition("=")
            if key == "ignore-cancel":
                changes["stop_delay"] = None
            elif key == "stop-delay":
                changes["stop_delay"] = float(value)
            elif key == "words":
                changes["words"] = int(value)
            elif key == "interval":
                changes["word_interval"] = float(value)
            elif key == "permission":
                changes["permission"] = True
            elif key == "crash":
                changes["crash_after"] = int(value or 1)
            elif key == "flood":
                changes["flood"] = True
            elif key == "pad":
                changes["pad"] = int(value)
            elif key == "deferred-id":
                changes["deferred_id"] = float(value)
        return attrs.evolve(self, **changes)


@define
class Store:
    """What survives a kill, like the agent's files on disk: session histories."""

    sessions: dict[str, list[str]] = field(factory=dict)
    counter: int = 0


class MemoryLink(AgentLink):
    def __init__(
        self, launcher: MemoryLauncher, generation: int, inbox: trio.MemorySendChannel[Any]
    ):
        self.generation = generation
        self.launcher = launcher
        self.inbox = inbox
        self.to_agent_send, self.to_agent = trio.open_memory_channel[dict[str, Any]](math.inf)
        self.sent: list[dict[str, Any]] = []
        self.scope = trio.CancelScope()
        self.alive = True
        self.signals: list[int] = []

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.launcher.log.append(("to_agent", self.generation, message))
        if self.alive:
            self.to_agent_send.send_nowait(message)

    def signal(self, signum: int) -> None:
        self.signals.append(signum)

    async def kill(self) -> list[str]:
        if not self.alive:
            return []
        steps = ["sigterm"]
        if self.launcher.behaviour.ignores_sigterm:
            await trio.sleep(self.launcher.spec_kill_timeout)
            steps.append("sigkill")
        elif self.launcher.behaviour.kill_time:
            await trio.sleep(self.launcher.behaviour.kill_time)
        self._die()
        self.launcher.kills.append((self.generation, steps))
        return steps

    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        self._die()
        return ExitStatus(code=0, signal=None), []

    def _die(self) -> None:
        self.alive = False
        self.scope.cancel()

    @property
    def stderr_tail(self) -> list[str]:
        return ["fake agent stderr"]

    async def post(self, message: dict[str, Any]) -> None:
        self.launcher.log.append(("from_agent", self.generation, message))
        await self.inbox.send(AgentFrame(self.generation, Message(message)))


class MemoryLauncher:
    """A ``Launcher`` that starts :class:`FakeAcpAgent` tasks; records what happened."""

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        *,
        kill_timeout: float = 1.0,
        crash_on_launch: frozenset[int] = frozenset(),
    ):
        self.behaviour = behaviour or Behaviour()
        self.crash_on_launch = crash_on_launch  # launch numbers (1-based) that die at once
        self.store = Store()
        self.links: list[MemoryLink] = []
        self.agents: list[FakeAcpAgent] = []
        self.kills: list[tuple[int, list[str]]] = []
        self.log: list[tuple[str, int, dict[str, Any]]] = []
        self.spec_kill_timeout = kill_timeout

    async def __call__(
        self,
        spec: AgentSpec,
        *,
        cwd: str,
        resume: str | None,
        generation: int,
        inbox: trio.MemorySendChannel[Any],
        nursery: trio.Nursery,
    ) -> AgentLink:
        link = MemoryLink(self, generation, inbox)
        agent = FakeAcpAgent(link, self.behaviour, self.store)
        self.links.append(link)
        self.agents.append(agent)
        nursery.start_soon(agent.run)
        return link

    def sent_methods(self) -> list[str]:
        return [m.get("method", "<response>") for kind, _, m in self.log if kind == "to_agent"]


class FakeAcpAgent:
    def __init__(self, link: MemoryLink, behaviour: Behaviour, store: Store):
        self.link = link
        self.behaviour = behaviour
        self.store = store
        self.session_id: str | None = None
        self.cancelled = trio.Event()
        self.turn_scope: trio.CancelScope | None = None
        self.next_request = 0
        self.permission_answers: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.updates_after_response = 0
        self.turns: list[str] = []
        self.permission_pending: trio.Event | None = None

    async def run(self) -> None:
        if len(self.link.launcher.links) in self.link.launcher.crash_on_launch:
            await self.exit(1)
            return
        with self.link.scope:
            async with trio.open_nursery() as nursery:
                if self.behaviour.start_delay:
                    await trio.sleep(self.behaviour.start_delay)
                async for message in self.link.to_agent:
                    await self.handle(message, nursery)

    async def exit(self, code: int) -> None:
        self.link.alive = False
        await self.link.inbox.send(
            AgentGone(self.link.generation, ExitStatus(code=code, signal=None))
        )
        self.link.scope.cancel()

    async def reply(self, request_id: Any, result: Any) -> None:
        await self.link.post({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def error(self, request_id: Any, code: int, message: str) -> None:
        await self.link.post(
            {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
        )

    async def update(self, update: dict[str, Any]) -> None:
        await self.link.post(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": self.session_id, "update": update},
            }
        )

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        method = message.get("method")
        params = message.get("params") or {}
        if method is None:  # a response to one of our permission requests
            answer = self.permission_answers.pop(message.get("id"), None)  # type: ignore[arg-type]
            if answer is not None:
                answer.send_nowait(message)
            return
        request_id = message.get("id")
        if method == "initialize":
            if self.behaviour.fail_start:
                await self.error(request_id, -32603, "cannot start")
                return
            await self.reply(
                request_id,
                {
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": self.behaviour.load_session},
                    "agentInfo": {"name": "fake", "version": "1"},
                    "authMethods": [],
                },
            )
        elif method == "session/new":
            self.store.counter += 1
            self.session_id = f"fake-{self.store.counter}"
            self.store.sessions[self.session_id] = []
            await self.reply(request_id, {"sessionId": self.session_id})
        elif method == "session/load":
            session_id = params.get("sessionId")
            if session_id not in self.store.sessions:
                await self.error(request_id, -32602, "unknown session")
                return
            self.session_id = session_id
            for text in self.store.sessions[session_id]:
                await self.update(
                    {
                        "sessionUpdate": "user_message_chunk",
                        "content": {"type": "text", "text": text},
                    }
                )
            await self.reply(request_id, None)
        elif method == "session/prompt":
            text = "".join(block.get("text", "") for block in params.get("prompt", []))
            self.turns.append(text)
            assert self.session_id is not None
            self.store.sessions[self.session_id].append(text)
            self.cancelled = trio.Event()
            nursery.start_soon(self.turn, request_id, self.behaviour.for_prompt(text))
        elif method == "session/cancel":
            self.cancelled.set()
        elif request_id is not None:
            await self.error(request_id, -32601, f"Method not found: {method}")

    async def turn(self, request_id: Any, behaviour: Behaviour) -> None:
        stop_reason = "end_turn"
        if behaviour.deferred_id is not None:
            await trio.sleep(behaviour.deferred_id)
            await self.link.post(
                {"jsonrpc": "2.0", "method": "x/turnIdentified", "params": {"turnId": "agent-turn"}}
            )
        async with trio.open_nursery() as nursery:

            async def watch_cancel() -> None:
                await self.cancelled.wait()
                if behaviour.stop_delay is None:
                    return  # wedged: pretends it never heard
                await trio.sleep(behaviour.stop_delay)
                while self.permission_pending is not None:
                    # Like Gemini: a pending permission blocks the cancel until answered.
                    await self.permission_pending.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_cancel)
            for index in range(behaviour.words):
                if behaviour.crash_after is not None and index == behaviour.crash_after:
                    await self.exit(3)
                    return
                if behaviour.permission and index == 1:
                    outcome = await self.ask_permission()
                    if outcome == "cancelled":
                        stop_reason = "cancelled"
                        nursery.cancel_scope.cancel()
                        break
                await self.update(
                    {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": f"w{index} " + "x" * behaviour.pad},
                    }
                )
                if behaviour.flood:
                    await trio.sleep(0)
                else:
                    await trio.sleep(behaviour.word_interval)
            nursery.cancel_scope.cancel()
        if self.cancelled.is_set() and behaviour.stop_delay is not None:
            stop_reason = "cancelled"
        await self.reply(request_id, {"stopReason": stop_reason})

    async def ask_permission(self) -> str:
        request_id = 1000 + self.next_request
        self.next_request += 1
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self.permission_answers[request_id] = send
        await self.link.post(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "session/request_permission",
                "params": {
                    "sessionId": self.session_id,
                    "toolCall": {"toolCallId": "call_1", "title": "rm -rf build"},
                    "options": [
                        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                    ],
                },
            }
        )
        self.permission_pending = trio.Event()
        try:
            answer = await receive.receive()
        finally:
            self.permission_pending.set()
            self.permission_pending = None
        outcome = answer.get("result", {}).get("outcome", {})
        return str(outcome.get("outcome"))
