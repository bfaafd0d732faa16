"""MCP servers reach a real agent process: the demo agent (ACP) starts the tests' own stdio MCP
server (``tests/fakes/mcp_server.py``), and calls its tool, because the supervisor passed it in
``session/new`` / ``session/load``; again after a kill and respawn; through the gateway too.

Tier 3: real processes on the real clock, generous bounds (nothing here sleeps to wait).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from helpers import Recorder
from paths import TESTS
from protocols import events as ev
from protocols.mcp import McpServer, NameValue, mcp_server_to_acp
from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayError, connect
from supervisor.errors import AgentNotRunning, BadRequest
from supervisor.gateway import Gateway
from supervisor.testing import record

FAKE_MCP = TESTS / "fakes" / "mcp_server.py"
#: A loaded 2-core machine starts the demo agent and a Python MCP server in about a second.
BOUND = 60.0


def demo(tmp_path: Path, *args: str, **options: Any) -> AgentSpec:
    spec = AgentSpec.from_config("demo").with_args("--state-dir", str(tmp_path / "state"), *args)
    return spec.with_options(**options)


def marker_server(marker: Path, word: str, name: str = "marker") -> McpServer:
    return McpServer(
        name=name,
        command=sys.executable,
        args=(str(FAKE_MCP), str(marker)),
        env=(NameValue("FAKE_MCP_WORD", word),),
    )


def marks(marker: Path) -> list[dict[str, Any]]:
    if not marker.exists():
        return []
    return [json.loads(line) for line in marker.read_text().splitlines()]


async def reply_of(session: Any, recorder: Recorder, text: str) -> str:
    turn = await session.prompt(text)
    await recorder.wait_kind("turn.ended", turn_id=turn.id)
    return "".join(
        e.text
        for e in recorder.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta)
        if e.turn_id == turn.id
    )


async def test_the_demo_agent_starts_and_calls_a_sessions_mcp_server(tmp_path: Path) -> None:
    marker = tmp_path / "marker.jsonl"
    with trio.fail_after(BOUND):
        async with open_supervisor() as sup:
            session = await sup.start_session(
                demo(tmp_path), cwd=tmp_path, mcp_servers=[marker_server(marker, "hello")]
            )
            async with record(session) as recorder:
                reply = await reply_of(session, recorder, "mcp fast")
    assert "marker connected (fake-mcp 1.0; tools: marker_ping)" in reply
    assert "marker_ping said 'pong hello'" in reply
    initialize, call = marks(marker)
    assert initialize["event"] == "initialize" and initialize["word"] == "hello"
    assert initialize["client"]["name"] == "demo-agent"
    assert call == {"event": "call", "pid": initialize["pid"], "word": "hello"}


async def test_the_agents_own_servers_and_the_sessions_same_name_wins(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.jsonl", tmp_path / "theirs.jsonl"
    spec = demo(
        tmp_path,
        mcp_servers=[marker_server(ours, "agent"), marker_server(theirs, "agent", name="other")],
    )
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}) as sup:
            session = await sup.start_session(
                "demo", cwd=tmp_path, mcp_servers=[marker_server(ours, "session")]
            )
            assert [s.name for s in session.spec.mcp_servers] == ["marker", "other"]
            async with record(session) as recorder:
                reply = await reply_of(session, recorder, "mcp fast")
    assert "'pong session'" in reply and "'pong agent'" in reply
    assert [m["word"] for m in marks(ours)] == ["session", "session"]  # initialize, call
    assert [m["word"] for m in marks(theirs)] == ["agent", "agent"]


async def test_a_respawned_agent_gets_its_mcp_servers_again(tmp_path: Path) -> None:
    marker = tmp_path / "marker.jsonl"
    spec = demo(tmp_path, "--ignore-cancel", "--words", "400", grace_s=0.3)
    with trio.fail_after(BOUND):
        async with open_supervisor() as sup:
            session = await sup.start_session(
                spec, cwd=tmp_path, mcp_servers=[marker_server(marker, "again")]
            )
            async with record(session) as recorder:
                await session.prompt("keep talking")
                await recorder.wait_kind("message.delta")
                receipt = await session.cancel(reason="test")
                assert receipt.outcome == "killed" and receipt.resumed is True
                reply = await reply_of(session, recorder, "mcp fast")
    first, second, call = marks(marker)
    assert [first["event"], second["event"], call["event"]] == ["initialize"] * 2 + ["call"]
    assert first["pid"] != second["pid"] == call["pid"]  # the first died with the old tree
    assert "'pong again'" in reply


async def test_a_kind_the_agent_does_not_advertise_is_a_clear_error(tmp_path: Path) -> None:
    http = McpServer(name="docs", transport="http", url="http://127.0.0.1:9/mcp")
    with trio.fail_after(BOUND):
        async with open_supervisor() as sup:
            with pytest.raises(AgentNotRunning, match="cannot take http MCP server 'docs'"):
                await sup.start_session(demo(tmp_path), cwd=tmp_path, mcp_servers=[http])
            codex = AgentSpec(name="c", protocol="codex", command=["codex", "app-server"])
            sse = McpServer(name="feed", transport="sse", url="http://127.0.0.1:9/sse")
            with pytest.raises(BadRequest, match="Codex cannot take sse MCP server 'feed'"):
                await sup.start_session(codex, cwd=tmp_path, mcp_servers=[sse])


async def test_gateway_session_start_with_mcp_servers(tmp_path: Path) -> None:
    marker = tmp_path / "marker.jsonl"
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": demo(tmp_path)}) as sup:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(Gateway(sup, port=0, token="t").serve)
                async with connect(url) as client:
                    with pytest.raises(GatewayError, match=r"mcp_servers\[0\]: .*'command'") as bad:
                        await client.start_session("demo", mcp_servers=[{"name": "x"}])
                    assert bad.value.code == "bad_request"
                    started = await client.start_session(
                        "demo",
                        str(tmp_path),
                        mcp_servers=[mcp_server_to_acp(marker_server(marker, "wire"))],
                    )
                    session_id = started["session_id"]
                    async with client.subscribe(session_id) as events:
                        turn = await client.prompt(session_id, "mcp fast")
                        text = []
                        async for event in events:
                            if event["event"] == "message.delta":
                                text.append(event["data"]["text"])
                            if event["event"] == "turn.ended":
                                assert event["data"]["turn_id"] == turn["turn_id"]
                                break
                nursery.cancel_scope.cancel()
    assert "'pong wire'" in "".join(text)
    assert marks(marker)[0]["word"] == "wire"
