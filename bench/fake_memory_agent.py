"""A lean in-memory ACP agent for ``bench/scale.py``: the actor's own cost, without processes.

It plugs into the session through the same ``Launcher`` signature as real processes (like
``supervisor/testing/_acp.py``, but it keeps no logs, so what a session costs is the session's):
one trio task per agent, messages as dicts, a kill is a cancel scope. It behaves like
``bench/fake_light_agent.py``: a prompt streams its first word at once and then one every
``interval`` seconds, until ``session/cancel``, answered at once with ``stopReason: cancelled``.

Like that agent's ``select`` loop it is one task whose word timer is the deadline of its
receive: no task or cancel scope per turn, and a cancel cancels nothing in trio (a cancelled
scope raises ``Cancelled``, whose traceback materialises frames: a dozen container objects per
turn that would be the fake's cost, not the session's).
"""

from __future__ import annotations

import math
from typing import Any

import trio

from protocols.framing import Message
from supervisor.agents.link import AgentFrame, AgentLink
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus


class LeanLink(AgentLink):
    def __init__(self, generation: int, inbox: trio.MemorySendChannel[Any], interval: float):
        self.generation = generation
        self._inbox = inbox
        self._interval = interval
        self._to_agent, self._agent_inbox = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._scope = trio.CancelScope()
        self._session_id: str | None = None
        self._turn: Any = None  # the running prompt's request id
        self._next_word_at = math.inf
        self._words = 0

    # -- AgentLink ---------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._to_agent.send_nowait(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def signal(self, signum: int) -> None:
        pass

    async def kill(self) -> list[str]:
        self._scope.cancel()
        return ["sigterm"]

    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        self._scope.cancel()
        return ExitStatus(code=0, signal=None), []

    @property
    def stderr_tail(self) -> list[str]:
        return []

    # -- the agent ---------------------------------------------------------------------------

    async def post(self, payload: dict[str, Any]) -> None:
        await self._inbox.send(AgentFrame(self.generation, Message(payload)))

    async def run(self) -> None:
        with self._scope:
            while True:
                message: dict[str, Any] | None = None
                if self._turn is None:
                    message = await self._agent_inbox.receive()
                else:
                    with trio.move_on_at(self._next_word_at):
                        message = await self._agent_inbox.receive()
                if message is None:
                    await self.word()
                else:
                    await self.handle(message)

    async def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            result: Any = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True},
                "agentInfo": {"name": "bench-lean-agent", "version": "1"},
                "authMethods": [],
            }
        elif method == "session/new":
            self._session_id = f"lean-{id(self)}"
            result = {"sessionId": self._session_id}
        elif method == "session/load":
            self._session_id = params.get("sessionId")
            result = None
        elif method == "session/prompt":
            self._turn = request_id
            self._words = 0
            await self.word()  # the first at once
            return
        elif method == "session/cancel":
            if self._turn is not None:
                turn_id, self._turn = self._turn, None
                await self.post(
                    {"jsonrpc": "2.0", "id": turn_id, "result": {"stopReason": "cancelled"}}
                )
            return
        else:
            return
        await self.post({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def word(self) -> None:
        self._next_word_at = trio.current_time() + self._interval
        await self.post(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": self._session_id,
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": f"w{self._words} "},
                    },
                },
            }
        )
        self._words += 1


class LeanLauncher:
    """A ``Launcher`` of :class:`LeanLink` agents."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval

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
        link = LeanLink(generation, inbox, self.interval)
        nursery.start_soon(link.run)
        return link
