"""Tier 4: real agent CLIs start the tests' own stdio MCP server because the supervisor passed
it the way each protocol takes it, and the model's call of its tool reaches it.

The server is ``tests/fakes/mcp_server.py`` (standard library, started with this interpreter),
configured as the agent's own ``mcp_servers`` (``AgentSpec.mcp_servers``; a session's are
merged over them by the same path, ``test_mcp_process.py``). It appends a line to a marker file
on ``initialize`` (with the client's ``clientInfo`` and the ``FAKE_MCP_WORD`` of its env) and
on each call of its one tool, ``marker_ping``. The fake model (``mcpcall``) calls that tool as
the CLI names it (``mcp__marker__marker_ping``), with no arguments; the test approves the call
when the CLI asks, then checks: the CLI started the server with the env it was given, the tool
was offered to the model, the call reached the server, and its answer went back to the model.

- Claude Code (stream-json, ``--mcp-config`` JSON), with ``ENABLE_TOOL_SEARCH=false``: by
  default it defers MCP tools behind its ``ToolSearch`` tool, and the fake model does not search;
- OpenCode serve (``OPENCODE_CONFIG_CONTENT``'s ``mcp`` table);
- Gemini CLI and OpenCode over ACP (``session/new``'s ``mcpServers``);
- Codex app-server (``-c mcp_servers.marker={...}``): 0.171 always defers MCP tools behind
  ``tool_search``, so the fake model searches first (``tool_search_call``, run by Codex), then
  calls the tool in the namespace the search found; Codex asks before the call with an MCP
  elicitation, which the supervisor turns into a permission request (accepted here).

Real clock, generous bounds; the same installs, network namespaces and fake model as the other
tier-4 files (``tests/realagents/``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from test_real_opencode_serve import serve_session

from paths import TESTS
from protocols import events as ev
from protocols.mcp import McpServer, NameValue
from realagents import install, scenarios
from realagents.agents import (
    AGENTS,
    CLAUDE_STREAM_JSON,
    CODEX_APP_SERVER,
    Prepared,
    claude_stream_json_spec,
    codex_app_server_spec,
)
from realagents.conftest import Harness, real_agent_session
from realagents.fake_model import MCP_TOOL, NO_MCP_TOOL_TEXT
from supervisor import AgentSpec

pytestmark = pytest.mark.real_process

FAKE_MCP = TESTS / "fakes" / "mcp_server.py"
#: Start (Claude ~1 s, Codex ~1 s, plus the MCP server's handshake), one turn of two requests.
BOUND_S = 90.0
WORD = "tier4-word"


@pytest.fixture(scope="module")
def claude_install() -> install.Installed:
    return scenarios.ensure_installed(CLAUDE_STREAM_JSON.package, CLAUDE_STREAM_JSON.key)


@pytest.fixture(scope="module")
def codex_install() -> install.Installed:
    return scenarios.ensure_installed(CODEX_APP_SERVER.package, CODEX_APP_SERVER.key)


def marker_server(marker: Path) -> McpServer:
    return McpServer(
        name="marker",
        command=sys.executable,
        args=(str(FAKE_MCP), str(marker)),
        env=(NameValue("FAKE_MCP_WORD", WORD),),
    )


def with_marker(spec_of: Any, marker: Path, **env: str) -> Any:
    def spec(prepared: Prepared, **options: Any) -> AgentSpec:
        base: AgentSpec = spec_of(prepared, **options)
        return base.with_options(mcp_servers=(marker_server(marker),), env={**base.env, **env})

    return spec


def marks(marker: Path) -> list[dict[str, Any]]:
    if not marker.exists():
        return []
    return [json.loads(line) for line in marker.read_text().splitlines()]


async def approve_all(h: Harness, turn_id: str, approved: list[str]) -> None:
    """Answer every permission request of the turn "allow once" (the MCP tool's, if asked)."""
    seen = 0
    while True:
        requested = await h.recorder.wait_kind(
            "permission.requested", turn_id=turn_id, count=seen + 1
        )
        seen += 1
        assert isinstance(requested, ev.PermissionRequested)
        option = next(o for o in requested.options if o.option_kind == "allow_once")
        approved.append(str(requested.tool_call.get("title") or requested.tool_call))
        await h.session.respond_permission(requested.request_id, option.option_id)


async def mcp_turn(h: Harness) -> tuple[ev.TurnEnded, list[str]]:
    approved: list[str] = []
    turn = await h.session.prompt("mcpcall: call the marker tool")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(approve_all, h, turn.id, approved)
        ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
        nursery.cancel_scope.cancel()
    assert isinstance(ended, ev.TurnEnded)
    return ended, approved


def assert_reached(h: Harness, marker: Path, client: str) -> None:
    """The CLI started the server with its env, offered its tool, and the call reached it."""
    lines = marks(marker)
    initialize = [m for m in lines if m["event"] == "initialize"]
    calls = [m for m in lines if m["event"] == "call"]
    assert initialize, f"the CLI never started the MCP server: {lines}"
    assert initialize[0]["word"] == WORD, initialize  # the env it was given
    assert client in str(initialize[0]["client"]), initialize
    exchanges = h.model.snapshot()
    offered = [e for e in exchanges if e.tool_call and e.tool_call["name"].endswith(MCP_TOOL)]
    assert offered, f"the model was never offered {MCP_TOOL}: {h.model.describe()}"
    assert calls and calls[0]["word"] == WORD, f"the call never reached the server: {lines}"
    results = [e.tool_result for e in exchanges if e.tool_result is not None]
    assert any(f"pong {WORD}" in json.dumps(r) for r in results), results
    assert not [e for e in exchanges if NO_MCP_TOOL_TEXT in (e.user_text or "")]


async def test_claude_code_starts_and_calls_a_configured_mcp_server(
    claude_install: install.Installed, tmp_path: Path
) -> None:
    marker = tmp_path / "marker.jsonl"
    with trio.fail_after(BOUND_S):
        async with real_agent_session(
            CLAUDE_STREAM_JSON,
            tmp_path,
            claude_install,
            # Claude Code defers MCP tools behind its ToolSearch tool by default (the model
            # would have to search for it first): off, so the request offers the tool itself.
            spec_of=with_marker(claude_stream_json_spec, marker, ENABLE_TOOL_SEARCH="false"),
            catch_up=True,
        ) as h:
            ended, approved = await mcp_turn(h)
            assert ended.outcome == "completed", ended
            assert_reached(h, marker, "claude")
            # Claude Code asks (``can_use_tool``) before the MCP tool runs, titled after it.
            assert approved == ["Marker Ping"]


async def test_codex_app_server_starts_and_calls_a_configured_mcp_server(
    codex_install: install.Installed, tmp_path: Path
) -> None:
    marker = tmp_path / "marker.jsonl"
    with trio.fail_after(BOUND_S):
        async with real_agent_session(
            CODEX_APP_SERVER,
            tmp_path,
            codex_install,
            spec_of=with_marker(codex_app_server_spec, marker),
            catch_up=True,
        ) as h:
            ended, approved = await mcp_turn(h)
            assert ended.outcome == "completed", ended
            assert_reached(h, marker, "codex")
            # Codex asks first, with an MCP elicitation: a permission request like any other.
            assert approved == ['Allow the marker MCP server to run tool "marker_ping"?']


#: ACP agents given the server in ``session/new`` (``mcpServers``). Not Qwen Code 0.24.4: it
#: started the server, but its first model request listed no tool of it (not even among its
#: deferred tools), so the model had nothing to call.
ACP_AGENTS = ("gemini", "opencode")


@pytest.mark.parametrize("key", ACP_AGENTS)
async def test_acp_agents_start_and_call_an_mcp_server_from_session_new(
    key: str, tmp_path: Path
) -> None:
    agent = AGENTS[key]
    installed = scenarios.ensure_installed(agent.package, key)
    marker = tmp_path / "marker.jsonl"
    with trio.fail_after(BOUND_S):
        async with real_agent_session(
            agent, tmp_path, installed, spec_of=with_marker(agent.spec, marker), catch_up=True
        ) as h:
            ended, approved = await mcp_turn(h)
            assert ended.outcome == "completed", ended
            assert_reached(h, marker, "")
            assert len(approved) <= 1, approved  # asked once, or allowed by its defaults


async def test_opencode_serve_starts_and_calls_an_mcp_server_from_its_config_content(
    tmp_path: Path,
) -> None:
    installed = scenarios.ensure_installed(AGENTS["opencode"].package, "opencode-serve")
    marker = tmp_path / "marker.jsonl"
    with trio.fail_after(BOUND_S):
        async with serve_session(tmp_path, installed, mcp_servers=(marker_server(marker),)) as h:
            ended, approved = await mcp_turn(h)
            assert ended.outcome == "completed", ended
            assert_reached(h, marker, "opencode")
            assert len(approved) <= 1, approved
