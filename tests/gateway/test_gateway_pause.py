"""``gateway.pause`` and ``gateway.resume`` over real loopback sockets, with in-memory agents,
on the real clock: every prompt held (its answer says so), ``session.list`` and the subscribe
answer say paused, ``session.held`` tells subscribers, a deadline stops the running turn
(``reason: "paused"``), and the resume runs what waited in order."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayClient, GatewayError, connect
from supervisor.gateway import Gateway
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.requests import PauseAll, RequestError, decode_request

BOUND = 20.0


@asynccontextmanager
async def gateway(behaviour: AcpBehaviour) -> AsyncIterator[tuple[str, AcpLauncher]]:
    launcher = AcpLauncher(behaviour)
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
            async with trio.open_nursery() as nursery:
                server = Gateway(sup, port=0, token="secret-token")
                url = await nursery.start(server.serve)
                yield url, launcher
                nursery.cancel_scope.cancel()


async def until(
    events: trio.MemoryReceiveChannel[dict[str, Any]], kind: str, **data: object
) -> dict[str, Any]:
    async for event in events:
        if event["event"] == kind and all(event["data"].get(k) == v for k, v in data.items()):
            return event
    raise AssertionError(f"no {kind} event")


async def start(client: GatewayClient) -> str:
    session_id: str = (await client.start_session("fake"))["session_id"]
    return session_id


async def test_pause_holds_every_prompt_says_so_and_resume_runs_them_in_order() -> None:
    async with gateway(AcpBehaviour(words=3, word_interval=0.01)) as (url, launcher):
        async with connect(url) as client:
            one, two = await start(client), await start(client)
            async with client.subscribe(one) as events:
                paused = await client.pause()
                assert paused == {
                    "paused": True,
                    "deadline_s": None,
                    "held": [one, two],
                    "running": [],
                    "pending": [],
                }
                held = await until(events, "session.held")
                assert held["data"] == {"held": "paused", "deadline_s": None, "queued": 0}
                answers = [
                    await client.prompt(one, "first"),
                    await client.prompt(two, "other"),
                    await client.prompt(one, "second"),
                ]
                assert answers == [
                    {"turn_id": "t1", "queued": True, "held": "paused"},
                    {"turn_id": "t1", "queued": True, "held": "paused"},
                    {"turn_id": "t2", "queued": True, "held": "paused"},
                ]
                listed = await client.request("session.list")
                assert listed["paused"] is True
                assert [s["held"] for s in listed["sessions"]] == ["paused", "paused"]
                assert all(s["state"] == "ready" for s in listed["sessions"])
                assert launcher.sent_methods().count("session/prompt") == 0
                resumed = await client.resume()
                assert resumed["paused"] is False and resumed["held"] == []
                await until(events, "turn.ended", turn_id="t2")
            listed = await client.request("session.list")
            assert listed["paused"] is False
            assert [s["held"] for s in listed["sessions"]] == [None, None]
        assert launcher.sent_methods().count("session/prompt") == 3


async def test_a_subscriber_learns_the_session_is_held_from_the_subscribe_answer() -> None:
    async with gateway(AcpBehaviour(words=3, word_interval=0.01)) as (url, _):
        async with connect(url) as client:
            session_id = await start(client)
            await client.pause()
            async with client.subscribe(session_id):
                assert client.subscribed[session_id]["held"] == "paused"
            await client.resume()
            async with client.subscribe(session_id):
                assert client.subscribed[session_id]["held"] is None


async def test_at_the_deadline_the_running_turn_ends_with_reason_paused() -> None:
    behaviour = AcpBehaviour(words=100_000, word_interval=0.01)
    async with gateway(behaviour) as (url, _):
        async with connect(url) as client:
            session_id = await start(client)
            async with client.subscribe(session_id) as events:
                await client.prompt(session_id, "long")
                await until(events, "message.delta")
                paused = await client.pause(deadline_s=0.2)
                assert paused["running"] == [session_id] and 0 < paused["deadline_s"] <= 0.2
                queued = await client.prompt(session_id, "after")
                assert queued == {"turn_id": "t2", "queued": True, "held": "paused"}
                ended = await until(events, "turn.ended", turn_id="t1")
                assert ended["data"]["reason"] == "paused"
                assert ended["data"]["receipt"]["reason"] == "paused"
                assert ended["data"]["receipt"]["dropped_prompts"] == []
                listed = await client.sessions()
                assert listed[0]["turn_id"] is None and listed[0]["held"] == "paused"
                await client.resume()
                await until(events, "turn.started", turn_id="t2")
                await client.cancel(session_id)


async def test_bad_deadlines_and_node_only_actions_are_refused() -> None:
    async with gateway(AcpBehaviour(words=3, word_interval=0.01)) as (url, _):
        async with connect(url) as client:
            session_id = await start(client)
            for deadline in (-1, "soon", True):
                with pytest.raises(GatewayError) as refused:
                    await client.request("gateway.pause", {"deadline_s": deadline})
                assert refused.value.code == "bad_request"
            for action in ("session.pause", "session.resume"):
                with pytest.raises(GatewayError, match="is for nodes") as refused:
                    await client.request(action, {"session_id": session_id})
                assert refused.value.code == "bad_request"
            assert (await client.request("session.list"))["paused"] is False


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({}, PauseAll()),
        ({"deadline_s": 30}, PauseAll(30.0)),
        ({"deadline_s": 0.5}, PauseAll(0.5)),
        ({"deadline_s": None}, PauseAll()),
    ],
)
def test_gateway_pause_is_typed(payload: dict[str, Any], expected: PauseAll) -> None:
    request = decode_request(json.dumps({"id": 1, "action": "gateway.pause", "payload": payload}))
    assert not isinstance(request, RequestError) and request.call == expected


@pytest.mark.parametrize("deadline", ["NaN", "Infinity", "-1", "1e999", str(10**400)])
def test_a_deadline_that_is_no_number_of_seconds_is_bad_request(deadline: str) -> None:
    frame = '{"id": 1, "action": "gateway.pause", "payload": {"deadline_s": ' + deadline + "}}"
    result = decode_request(frame)
    assert isinstance(result, RequestError) and result.code == "bad_request", result
    assert "deadline_s" in result.message
