"""On the wire, a cancelled turn's ``turn.ended`` comes before the ``agent.cancel`` answer.

The session emits ``turn.ended`` before it answers the cancel; a client subscribed on the same
WebSocket must see them in that order, or it acts on the receipt while the turn still looks
open (an outside review saw the answer first in most of these scenarios). Every protocol (ACP
demo agent, fake Codex, Claude, OpenCode and Amp CLIs), through a real ``Gateway``, checked on
the raw frames of one connection, and through the Python client on a second connection (its
``cancel()`` returns with the ``turn.ended`` already in its subscription's queue). Scenarios: the
agent stops when asked; ends the turn itself (ACP ``end_turn``, ignoring the cancel); has a
permission pending; ignores the interrupt (killed at grace); ignores SIGTERM too; has a
grandchild in its own session. Each without a store and with a SQLite one (whose subscribers
are given events once stored). Real processes, real clock, a short grace for the kills.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from faults.agents import AGENTS, MANY
from faults.harness import BOUND
from supervisor import open_supervisor
from supervisor.client import GatewayClient, connect, websocket_url
from supervisor.gateway import Gateway

pytestmark = pytest.mark.real_process

#: Grace of the cells whose agent is killed (the cell waits for it in full).
KILL_GRACE = 0.3
#: Grace of the cells whose agent ends the turn itself (never waited for in full).
COOPERATIVE_GRACE = 10.0

#: scenario -> (the fault's name in ``AGENTS`` words, or None for its own words; killed?)
SCENARIOS: dict[str, tuple[str | None, bool]] = {
    "stops": (None, False),
    "end_turn": (None, False),
    "permission": ("permission", False),
    "wedged": ("ignores_interrupt", True),
    "stubborn": ("ignores_sigterm", True),
    "tree": ("grandchild", True),
}
#: The demo agent ignores this cancel and finishes the turn (a dozen words, 0.02 s apart).
END_TURN_WORDS = "ignore-cancel words=12"

CELLS = [
    pytest.param(protocol, scenario, id=f"{protocol}-{scenario}")
    for protocol, agent in AGENTS.items()
    for scenario, (fault, _) in SCENARIOS.items()
    if (fault is None and (scenario == "stops" or protocol == "acp")) or fault in agent.words
]


class RawWire:
    """One WebSocket connection read frame by frame, every frame kept in arrival order."""

    def __init__(self, websocket: WebSocketConnection) -> None:
        self.websocket = websocket
        self.frames: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    async def send(self, action: str, **payload: Any) -> str:
        request_id = f"{action}-{next(self._ids)}"
        message = {"id": request_id, "action": action, "payload": payload}
        await self.websocket.send_message(json.dumps(message))
        return request_id

    async def next(self, predicate: Callable[[dict[str, Any]], bool]) -> int:
        """Read until a frame matches; its index in :attr:`frames`."""
        while True:
            frame = json.loads(await self.websocket.get_message())
            self.frames.append(frame)
            if predicate(frame):
                return len(self.frames) - 1

    async def answer(self, request_id: str) -> int:
        index = await self.next(lambda f: f.get("id") == request_id)
        assert self.frames[index]["ok"], self.frames[index]
        return index

    async def event(self, kind: str, **data: Any) -> int:
        return await self.next(
            lambda f: f.get("event") == kind and all(f["data"].get(k) == v for k, v in data.items())
        )


def words_of(protocol: str, scenario: str) -> str:
    fault, _ = SCENARIOS[scenario]
    if scenario == "stops":
        return MANY
    if scenario == "end_turn":
        return END_TURN_WORDS
    assert fault is not None
    return AGENTS[protocol].words[fault]


async def turn_under_way(wire: RawWire, protocol: str, scenario: str, turn_id: str) -> None:
    """Wait until the scenario's situation holds: the permission asked, the grandchild started,
    or (otherwise) the agent streaming."""
    if scenario == "permission":
        await wire.event("permission.requested", turn_id=turn_id)
    elif scenario == "tree" and protocol == "opencode":
        await wire.next(
            lambda f: (
                f.get("event") == "agent.stderr"
                and f["data"]["line"].startswith("fake-opencode: grandchild ")
            )
        )
    elif scenario == "tree":
        await wire.event("tool.call", turn_id=turn_id)
    else:
        await wire.event("message.delta", turn_id=turn_id)


@pytest.mark.parametrize("store", [None, "sqlite"])
@pytest.mark.parametrize("protocol,scenario", CELLS)
async def test_turn_ended_precedes_the_cancel_answer(
    protocol: str, scenario: str, store: str | None, tmp_path: Path
) -> None:
    fault, killed = SCENARIOS[scenario]
    agent = AGENTS[protocol]
    spec = agent.spec(tmp_path, fault or "", KILL_GRACE if killed else COOPERATIVE_GRACE)
    # With a store, events reach subscribers once stored: the answer waits behind them.
    url = f"sqlite:///{tmp_path / 'store.db'}" if store else None
    with trio.fail_after(BOUND):
        async with (
            open_supervisor(agents={protocol: spec}, store=url) as sup,
            trio.open_nursery() as nursery,
        ):
            session = await sup.start_session(protocol, cwd=str(tmp_path))
            server = Gateway(sup, port=0, token="order-token")
            url = await nursery.start(server.serve)
            async with (
                open_websocket_url(websocket_url(url)) as websocket,
                connect(url) as client,
                client.subscribe(session.id) as events,
            ):
                wire = RawWire(websocket)
                # The subscribe answer precedes the replay of its subscription.
                subscribed = await wire.answer(
                    await wire.send("session.subscribe", session_id=session.id, since_seq=0)
                )
                assert subscribed == 0, wire.frames
                prompted = await wire.answer(
                    await wire.send(
                        "agent.prompt", session_id=session.id, text=words_of(protocol, scenario)
                    )
                )
                turn_id = wire.frames[prompted]["result"]["turn_id"]
                await turn_under_way(wire, protocol, scenario, turn_id)
                cancel = await wire.send("agent.cancel", session_id=session.id)
                async with trio.open_nursery() as calls:
                    calls.start_soon(
                        python_client_sees_turn_ended_first, client, session.id, events, turn_id
                    )
                    answered = await wire.answer(cancel)
                receipt = wire.frames[answered]["result"]
                ended = [
                    index
                    for index, frame in enumerate(wire.frames)
                    if frame.get("event") == "turn.ended" and frame["data"]["turn_id"] == turn_id
                ]
                assert ended and ended[0] < answered, (
                    f"agent.cancel answered at frame {answered}, turn.ended at {ended}"
                )
                data = wire.frames[ended[0]]["data"]
                assert data["receipt"] == {k: v for k, v in receipt.items() if k != "success"}
                assert receipt["turn_id"] == turn_id
                if killed:
                    assert receipt["outcome"] == "killed", receipt
                elif scenario == "end_turn":
                    assert receipt["stop_reason"] == "end_turn", receipt
                    assert "grace_expired" not in receipt["escalation"], receipt
            nursery.cancel_scope.cancel()


async def python_client_sees_turn_ended_first(
    client: GatewayClient,
    session_id: str,
    events: trio.MemoryReceiveChannel[dict[str, Any]],
    turn_id: str,
) -> None:
    """``GatewayClient.cancel()`` (naming the turn, so it is the same receipt however the two
    cancels interleave) returns with the turn's ``turn.ended`` already queued for the caller."""
    receipt = await client.cancel(session_id, task_id=turn_id)
    queued = []
    while True:
        try:
            queued.append(events.receive_nowait())
        except trio.WouldBlock:
            break
    ended = [e for e in queued if e["event"] == "turn.ended" and e["data"]["turn_id"] == turn_id]
    assert ended, "cancel() returned before the turn.ended event was delivered"
    assert ended[0]["data"]["receipt"] == {k: v for k, v in receipt.items() if k != "success"}
