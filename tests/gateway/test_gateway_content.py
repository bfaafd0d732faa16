"""A prompt's content and the agent's modes over the gateway's wire (real loopback sockets,
in-memory agents, the real clock): ``agent.prompt`` with ``content`` (ACP content blocks),
``agent.set_mode``, and what a subscriber learns of them in its subscribe answer."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayError, connect, websocket_url
from supervisor.gateway import Gateway
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.requests import MAX_FRAME_BYTES, MAX_PROMPT_FRAME_BYTES

BOUND = 20.0
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
IMAGE = {"type": "image", "data": PNG, "mimeType": "image/png"}
LINK = {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"}


@asynccontextmanager
async def gateway(behaviour: AcpBehaviour) -> AsyncIterator[tuple[str, AcpLauncher]]:
    launcher = AcpLauncher(behaviour)
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=1.0)
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(Gateway(sup, port=0, token="t0k3n").serve)
                yield url, launcher
                nursery.cancel_scope.cancel()


def prompts_sent(launcher: AcpLauncher) -> list[list[dict[str, Any]]]:
    return [
        m["params"]["prompt"]
        for kind, _, m in launcher.log
        if kind == "to_agent" and m.get("method") == "session/prompt"
    ]


async def ended(events: trio.MemoryReceiveChannel[dict[str, Any]], turn_id: str) -> dict[str, Any]:
    async for message in events:
        if message["event"] == "turn.ended" and message["data"]["turn_id"] == turn_id:
            return message
    raise AssertionError("the stream ended first")


async def test_content_reaches_an_agent_that_takes_it_and_modes_switch() -> None:
    async with gateway(AcpBehaviour(words=2, images=True, modes=True)) as (url, launcher):
        async with connect(url) as client:
            listed = {a["name"]: a for a in await client.agents()}
            assert listed["fake"]["prompt_carries"] == []  # an ACP agent says when it runs
            session_id = (await client.start_session("fake"))["session_id"]
            async with client.subscribe(session_id) as events:
                answer = client.subscribed[session_id]
                assert {"image", "resource"} <= set(answer["prompt_carries"])
                assert answer["modes"]["currentModeId"] == "ask"
                blocks = [{"type": "text", "text": "look"}, IMAGE, LINK]
                turn = await client.prompt(session_id, "look at this", content=blocks)
                message = await ended(events, turn["turn_id"])
                assert message["data"]["outcome"] == "completed"
                assert prompts_sent(launcher)[-1] == blocks  # each block as such
                assert await client.set_mode(session_id, "code") is None
                with pytest.raises(GatewayError, match="unknown mode 'plan'") as refused:
                    await client.set_mode(session_id, "plan")
                assert refused.value.code == "bad_request"
                # With content and no text, what events show is the text of its blocks.
                turn = await client.prompt(
                    session_id, "", content=[{"type": "text", "text": "hi"}, LINK]
                )
                await ended(events, turn["turn_id"])


async def test_content_an_agent_cannot_take_is_refused_with_the_reason() -> None:
    async with gateway(AcpBehaviour(words=2)) as (url, launcher):
        async with connect(url) as client:
            session_id = (await client.start_session("fake"))["session_id"]
            async with client.subscribe(session_id):
                assert client.subscribed[session_id]["prompt_carries"] == ["resource_link"]
                assert client.subscribed[session_id]["modes"] is None
                with pytest.raises(GatewayError, match="does not take an image") as refused:
                    await client.prompt(session_id, "look", content=[IMAGE])
                assert refused.value.code == "bad_request"
                with pytest.raises(GatewayError, match="content: content blocks of type 'x'"):
                    await client.prompt(session_id, "look", content=[{"type": "x"}])
                with pytest.raises(GatewayError, match="offers no session modes") as moded:
                    await client.set_mode(session_id, "code")
                assert moded.value.code == "bad_request"
                assert prompts_sent(launcher) == []  # nothing was sent for any of them


async def test_a_prompt_with_content_may_be_bigger_than_other_requests() -> None:
    """A screenshot is megabytes of base64: a prompt with content may be up to
    MAX_PROMPT_FRAME_BYTES; the same size of any other request is still ``too_large``."""
    big = {"type": "image", "data": "A" * (2 * MAX_FRAME_BYTES), "mimeType": "image/png"}
    async with gateway(AcpBehaviour(words=2, images=True)) as (url, launcher):
        async with connect(url) as client:
            session_id = (await client.start_session("fake"))["session_id"]
            async with client.subscribe(session_id) as events:
                turn = await client.prompt(session_id, "big", content=[big])
                await ended(events, turn["turn_id"])
                assert prompts_sent(launcher)[-1][0]["data"] == big["data"]
        async with open_websocket_url(websocket_url(url, "t0k3n"), max_message_size=32 << 20) as ws:
            frames = [
                {
                    "id": 1,
                    "action": "agent.prompt",
                    "payload": {"session_id": session_id, "text": "x" * (2 * MAX_FRAME_BYTES)},
                },
                {
                    "id": 2,
                    "action": "agent.prompt",
                    "payload": {
                        "session_id": session_id,
                        "text": "x",
                        "content": [{**big, "data": "A" * MAX_PROMPT_FRAME_BYTES}],
                    },
                },
            ]
            for frame in frames:
                await ws.send_message(json.dumps(frame))
                response = json.loads(await ws.get_message())
                assert (response["id"], response["error"]["code"]) == (frame["id"], "too_large")
