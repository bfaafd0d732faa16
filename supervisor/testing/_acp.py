"""An in-memory ACP agent (JSON-RPC over stdio) for tests on virtual time.

Its "process" is a trio task (``_memory.py``: messages are dicts, a kill is a cancel scope,
every delay is virtual). It answers ``initialize`` (``loadSession`` unless it cannot
``resume``), ``session/new`` and ``session/load`` (the history replayed as
``user_message_chunk``), and a ``session/prompt`` with ``agent_message_chunk`` updates and then
the prompt's answer ``{"stopReason": "end_turn"}``; ``session/cancel`` ends it ``cancelled``.
A permission is ``session/request_permission`` (like Gemini, a pending one holds the cancel
until it is answered); a tool call is a ``tool_call`` ``in_progress`` and its
``tool_call_update`` ``completed``; a failed turn (``fail_turn``) is a JSON-RPC error answer to
the prompt; a silent one logs to stderr (once a second, or as fast as it can with ``flood``).

Prompt tokens beyond the shared ones (``_memory.Behaviour``): ``ignore-cancel``, ``flood``,
``fail`` (the prompt is answered with an error at once), ``pad=N``, ``deferred-id=0.2``.

``steering`` advertises ``_meta.steering.supported`` and answers ``_session/steering`` as
claude-agent-acp does: ``injected`` while a prompt runs (the text is said back as a chunk
``steered:<text>`` and the turn goes on), ``promptRequired`` when idle; ``steer_answer``
``refuse`` answers with an error, ``silent`` never answers.
"""

from __future__ import annotations

from typing import Any

import trio
from attrs import define

from supervisor.config import AgentSpec
from supervisor.testing._memory import (
    SILENT_LOG_INTERVAL_S,
    TOOL_CALL_ID,
    TOOL_COMMAND,
    Behaviour,
    MemoryAgent,
    MemoryLauncher,
    MemoryLink,
    never,
    on,
)


@define
class AcpBehaviour(Behaviour):
    flood: bool = False  # says its words (or its stderr, once silent) as fast as it can
    deferred_id: float | None = None  # announce the turn id this late (deferred protocol)
    fail_start: bool = False
    fail: bool = False  # the turn ends at once with an error response (the agent is fine)
    pad: int = 0  # extra characters per word, to make big events
    steering: bool = False
    steer_answer: str = "injected"  # or "refuse", "silent"
    modes: bool = False  # offers session modes "ask" and "code"
    images: bool = False  # promptCapabilities: image and embeddedContext
    mode_answer: str = "ok"  # or "refuse", "exit" (dies before it answers session/set_mode)

    TOKENS = {
        **Behaviour.TOKENS,
        "ignore-cancel": ("stop_delay", never),
        "flood": ("flood", on),
        "fail": ("fail", on),
        "pad": ("pad", int),
        "deferred-id": ("deferred_id", float),
    }


class AcpLauncher(MemoryLauncher[AcpBehaviour, "AcpAgent"]):
    """A ``Launcher`` that starts :class:`AcpAgent` tasks; records what happened."""

    behaviour_type = AcpBehaviour

    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> AcpAgent:
        return AcpAgent(link, self)


class AcpAgent(MemoryAgent[AcpBehaviour]):
    def __init__(self, link: MemoryLink, launcher: AcpLauncher):
        super().__init__(link, launcher)
        self.session_id: str | None = None
        self.cancelled = trio.Event()
        self.turn_scope: trio.CancelScope | None = None
        self.next_request = 0
        self.permission_answers: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.updates_after_response = 0
        self.permission_pending: trio.Event | None = None
        self.running: Any = None  # the running session/prompt's request id

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

    def _modes(self) -> dict[str, Any]:
        """``modes`` of a session/new or session/load answer (a new process starts in "ask")."""
        if not self.behaviour.modes:
            return {}
        available = [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]
        return {"modes": {"currentModeId": "ask", "availableModes": available}}

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
            result: dict[str, Any] = {
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": self.behaviour.resumes,
                    **(
                        {"promptCapabilities": {"image": True, "embeddedContext": True}}
                        if self.behaviour.images
                        else {}
                    ),
                },
                "agentInfo": {"name": "fake", "version": "1"},
                "authMethods": [],
            }
            if self.behaviour.steering:
                result["_meta"] = {"steering": {"supported": True}}
            await self.reply(request_id, result)
        elif method == "session/new":
            self.store.counter += 1
            self.session_id = f"fake-{self.store.counter}"
            self.store.sessions[self.session_id] = []
            await self.reply(request_id, {"sessionId": self.session_id, **self._modes()})
        elif method == "session/set_mode" and self.behaviour.modes:
            if self.behaviour.mode_answer == "exit":
                await self.exit(1)
            elif self.behaviour.mode_answer == "refuse":
                await self.error(request_id, -32602, "not in this session")
            else:
                await self.reply(request_id, {})
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
            await self.reply(request_id, self._modes() or None)
        elif method == "session/prompt":
            text = "".join(block.get("text", "") for block in params.get("prompt", []))
            self.turns.append(text)
            assert self.session_id is not None
            self.store.sessions[self.session_id].append(text)
            self.cancelled = trio.Event()
            nursery.start_soon(self.turn, request_id, self.behaviour.for_prompt(text))
        elif method == "session/cancel":
            self.cancelled.set()
        elif method == "_session/steering" and self.behaviour.steering:
            text = "".join(block.get("text", "") for block in params.get("prompt", []))
            if self.behaviour.steer_answer == "silent":
                return
            if self.behaviour.steer_answer == "refuse":
                await self.error(request_id, -32603, "cannot steer now")
            elif self.running is None:
                await self.reply(request_id, {"outcome": "promptRequired"})
            else:
                self.steers.append(text)
                await self.reply(request_id, {"outcome": "injected"})
                await self.update(
                    {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": f"steered:{text} "},
                    }
                )
        elif request_id is not None:
            await self.error(request_id, -32601, f"Method not found: {method}")

    async def turn(self, request_id: Any, behaviour: AcpBehaviour) -> None:
        self.running = request_id
        try:
            await self._turn(request_id, behaviour)
        finally:
            self.running = None

    async def _turn(self, request_id: Any, behaviour: AcpBehaviour) -> None:
        if behaviour.fail:
            await self.error(request_id, -32603, "model backend unavailable")
            return
        stop_reason = "end_turn"
        if behaviour.deferred_id is not None:
            await trio.sleep(behaviour.deferred_id)
            await self.link.post(
                {"jsonrpc": "2.0", "method": "x/turnIdentified", "params": {"turnId": "agent-turn"}}
            )
        async with trio.open_nursery() as nursery:

            async def watch_cancel() -> None:
                await self.cancelled.wait()
                if behaviour.crash_on_cancel:
                    await self.crash()
                    return
                if behaviour.stop_delay is None:
                    return  # wedged: pretends it never heard
                await trio.sleep(behaviour.stop_delay)
                while self.permission_pending is not None:
                    # Like Gemini: a pending permission blocks the cancel until answered.
                    await self.permission_pending.wait()
                nursery.cancel_scope.cancel()

            async def say(word: str) -> None:
                await self.update(
                    {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": word + "x" * behaviour.pad},
                    }
                )

            async def ask() -> bool:
                return await self.ask_permission() != "cancelled"

            nursery.start_soon(watch_cancel)
            flood = behaviour.flood
            if not await self.speak(
                behaviour,
                say,
                ask=ask,
                tool=self.run_tool,
                interval=0.0 if flood else None,
                silent_interval=0.0 if flood else SILENT_LOG_INTERVAL_S,
            ):
                stop_reason = "cancelled"
            nursery.cancel_scope.cancel()
        if self.cancelled.is_set() and behaviour.stop_delay is not None:
            stop_reason = "cancelled"
        elif behaviour.fail_turn and stop_reason == "end_turn":
            await self.error(request_id, -32603, "Internal error: model overloaded")
            return
        await self.reply(request_id, {"stopReason": stop_reason})

    async def run_tool(self, seconds: float) -> None:
        await self.update(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": TOOL_CALL_ID,
                "title": TOOL_COMMAND,
                "kind": "execute",
                "status": "in_progress",
            }
        )
        await trio.sleep(seconds)
        await self.update(
            {"sessionUpdate": "tool_call_update", "toolCallId": TOOL_CALL_ID, "status": "completed"}
        )

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
