"""Tier 2: the front door's I/O (``supervisor/acp_front/server.py``) on virtual time, with an
in-memory session behind it: orderings a real client cannot produce on purpose."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import trio
import trio.testing

from protocols import events as ev
from supervisor.acp_front.server import AcpFront


class SlowSession:
    """Takes a prompt only after a while (a session still starting, a gateway far away), and
    ends a turn only when cancelled."""

    id = "f1"
    agent = "fake"
    cwd = "/"
    agent_session_id = None

    def __init__(self) -> None:
        self.transcript: list[list[str]] = []
        self.running: str | None = None
        self.cancels: list[str | None] = []
        self._send, self._receive = trio.open_memory_channel[ev.Event](math.inf)
        self._seq = 0

    def _emit(self, event: ev.Event) -> None:
        self._seq += 1
        self._send.send_nowait(attrs.evolve(event, seq=self._seq))

    prompt_carries: frozenset[str] = frozenset()
    modes = None

    async def set_mode(self, mode_id: str) -> None:
        raise AssertionError("no modes offered")

    async def prompt(self, text: str, parts: Sequence[Any] = ()) -> str:
        await trio.sleep(0.5)
        self.running = "t1"
        self._emit(ev.TurnStarted(turn_id="t1", text=text))
        return "t1"

    async def cancel(self) -> None:
        self.cancels.append(self.running)
        if self.running is not None:
            self._emit(ev.TurnEnded(turn_id=self.running, outcome="cancelled"))
            self.running = None

    async def steer(self, text: str) -> str:
        return "interrupted"

    async def respond_permission(self, request_id: str, option_id: str | None) -> None:
        pass

    async def events(self) -> AsyncIterator[ev.Event]:
        async for event in self._receive:
            yield event

    async def stop(self) -> None:
        self._send.close()


class OneSession:
    agents: Sequence[tuple[str, str]] = [("fake", "")]
    persistent_ids = False

    def __init__(self) -> None:
        self.session = SlowSession()

    def mcp_transports(self, agent: str | None) -> frozenset[str]:
        return frozenset({"stdio"})

    def prompt_carries(self, agent: str | None) -> frozenset[str]:
        return frozenset()

    async def start(self, agent: str, cwd: str, **_: Any) -> SlowSession:
        return self.session

    async def attach(self, session_id: str, *, history: bool = False) -> SlowSession:
        return self.session

    async def list(self) -> list[dict[str, Any]]:
        return []


def line(message: dict[str, Any]) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode()


async def test_a_cancel_in_the_same_read_as_its_prompt_stops_that_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = OneSession()
    front = AcpFront(backend)
    to_front, from_client = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(front.serve, from_client, from_client)
        received = b""

        async def answer(rid: int) -> dict[str, Any]:
            nonlocal received
            while True:
                for raw in received.split(b"\n")[:-1]:
                    message = json.loads(raw)
                    if message.get("id") == rid and "method" not in message:
                        return dict(message)
                received += await to_front.receive_some(65536)

        new = {"id": 1, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}
        await to_front.send_all(line(new))
        session_id = (await answer(1))["result"]["sessionId"]
        text = [{"type": "text", "text": "go"}]
        prompt = {
            "id": 2,
            "method": "session/prompt",
            "params": {"sessionId": session_id, "prompt": text},
        }
        cancel = {"method": "session/cancel", "params": {"sessionId": session_id}}
        await to_front.send_all(line(prompt) + line(cancel))  # one read: both at once
        with trio.fail_after(5):
            answered = await answer(2)
        assert answered["result"]["stopReason"] == "cancelled"
        assert backend.session.cancels == ["t1"]  # the cancel found the turn
        await to_front.aclose()
