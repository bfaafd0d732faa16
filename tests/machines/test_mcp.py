"""MCP servers as data (``protocols/mcp.py``) and each protocol's form of them.

ACP's form is checked by the golden transcripts (``tests/golden/acp/mcp_servers*.json``, also
validated against the ACP schema by ``test_schemas.py``); here: parsing the ACP shape, merging
a session's servers over an agent's, the configuration's ``mcp_servers``, the gateway's
``session.start`` payload, the remote spec, and the Codex, Claude Code, OpenCode and Amp forms.

Tier 1: plain pytest, no processes (TOML files in ``tmp_path`` only).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from protocols.amp import AmpClient, amp_mcp_config
from protocols.claude import ClaudeClient
from protocols.codex import CodexClient, codex_mcp_table
from protocols.mcp import (
    McpServer,
    McpUnsupported,
    NameValue,
    mcp_server_from_acp,
    mcp_server_to_acp,
    mcp_servers_from_acp,
    merge_mcp_servers,
)
from protocols.opencode import CONFIG_CONTENT_VAR, OpenCodeClient
from supervisor.config import AgentSpec, ConfigError, load_agents
from supervisor.remote.handshake import spec_from_wire, spec_to_wire
from supervisor.wire.requests import Request, StartSession, decode_request

STDIO = McpServer(
    name="files",
    command="/usr/bin/mcp-files",
    args=("--root", "/w"),
    env=(NameValue("LOG", "debug"),),
)
HTTP = McpServer(
    name="docs",
    transport="http",
    url="http://127.0.0.1:9/mcp",
    headers=(NameValue("Authorization", "Bearer t"),),
)
SSE = McpServer(name="events", transport="sse", url="https://example.test/sse")


# --- the ACP shape -----------------------------------------------------------------------


@pytest.mark.parametrize("server", [STDIO, HTTP, SSE], ids=lambda s: s.transport)
def test_acp_form_round_trips(server: McpServer) -> None:
    wire = mcp_server_to_acp(server)
    assert mcp_server_from_acp(json.loads(json.dumps(wire))) == server


def test_acp_form_is_the_schemas() -> None:
    assert mcp_server_to_acp(STDIO) == {
        "name": "files",
        "command": "/usr/bin/mcp-files",
        "args": ["--root", "/w"],
        "env": [{"name": "LOG", "value": "debug"}],
    }
    assert mcp_server_to_acp(HTTP) == {
        "type": "http",
        "name": "docs",
        "url": "http://127.0.0.1:9/mcp",
        "headers": [{"name": "Authorization", "value": "Bearer t"}],
    }


def test_optional_lists_and_an_explicit_stdio_type() -> None:
    server = mcp_server_from_acp({"type": "stdio", "name": "a", "command": "x"})
    assert server == McpServer(name="a", command="x")
    assert mcp_server_from_acp({"type": "sse", "name": "b", "url": "http://h/s"}).headers == ()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("files", "must be an object"),
        ({"command": "x"}, "'name' must be a non-empty string"),
        ({"name": "a"}, "'command' must be a non-empty string"),
        ({"name": "a", "command": "x", "args": "-v"}, "'args' must be a list of strings"),
        ({"name": "a", "command": "x", "env": {"K": "v"}}, "'env' must be a list of {name, value}"),
        ({"name": "a", "command": "x", "env": [{"name": "K"}]}, "'env' must be a list"),
        ({"name": "a", "command": "x", "url": "http://h"}, "unknown key(s) url for a stdio"),
        ({"type": "http", "name": "a"}, "'url' must be an http:// or https:// URL"),
        ({"type": "http", "name": "a", "url": "file:///x"}, "'url' must be an http"),
        ({"type": "http", "name": "a", "url": "http://h", "command": "x"}, "unknown key(s)"),
        ({"type": "ws", "name": "a", "url": "ws://h"}, "'type' must be one of stdio, http, sse"),
        # what no UTF-8 message or exec can carry (a lone surrogate once crashed the session)
        ({"name": "a\ud800", "command": "x"}, "name holds a NUL or a lone surrogate"),
        ({"name": "a", "command": "x\0y"}, "command holds a NUL"),
        ({"name": "a", "command": "x", "args": ["\udfff"]}, "holds a NUL or a lone surrogate"),
        ({"name": "a", "command": "x", "env": [{"name": "K", "value": "\0"}]}, "env 'K' holds"),
        ({"type": "http", "name": "a", "url": "http://h/\ud800"}, "url holds"),
    ],
)
def test_malformed_servers_say_what_is_wrong(raw: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        mcp_server_from_acp(raw)


def test_a_list_names_the_bad_entry_and_refuses_a_name_twice() -> None:
    with pytest.raises(ValueError, match=r"^\[1\]: MCP server 'b': 'command'"):
        mcp_servers_from_acp([{"name": "a", "command": "x"}, {"name": "b"}])
    with pytest.raises(ValueError, match=r"^\[1\]: a second MCP server named 'a'"):
        mcp_servers_from_acp([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}])
    with pytest.raises(ValueError, match="must be a list"):
        mcp_servers_from_acp({"name": "a", "command": "x"})


def test_the_class_refuses_half_built_servers() -> None:
    with pytest.raises(ValueError, match="needs a command"):
        McpServer(name="a")
    with pytest.raises(ValueError, match="needs a url"):
        McpServer(name="a", transport="http")
    with pytest.raises(ValueError, match="transport must be one of"):
        McpServer(name="a", transport="ws", url="ws://h")


def test_a_sessions_server_replaces_the_agents_of_the_same_name() -> None:
    mine = McpServer(name="files", command="/opt/other")
    assert merge_mcp_servers((STDIO, HTTP), (SSE, mine)) == (mine, HTTP, SSE)
    assert merge_mcp_servers((), (STDIO,)) == (STDIO,)
    assert merge_mcp_servers((STDIO,), ()) == (STDIO,)


# --- each protocol's own form ------------------------------------------------------------


def test_codex_takes_one_config_override_per_server() -> None:
    argv = CodexClient.command(["codex", "app-server"], None, mcp_servers=[STDIO, HTTP])
    assert argv[:2] == ["codex", "app-server"]
    assert argv[2::2] == ["-c", "-c"]
    overrides = {}
    for value in argv[3::2]:
        key, _, toml = value.partition("=")
        overrides[key] = tomllib.loads(f"v = {toml}")["v"]  # what Codex parses the value as
    assert overrides == {
        "mcp_servers.files": {
            "command": "/usr/bin/mcp-files",
            "args": ["--root", "/w"],
            "env": {"LOG": "debug"},
        },
        "mcp_servers.docs": {
            "url": "http://127.0.0.1:9/mcp",
            "http_headers": {"Authorization": "Bearer t"},
        },
    }
    assert CodexClient.command(["codex", "app-server"], None) == ["codex", "app-server"]


def test_codex_toml_quotes_what_needs_quoting() -> None:
    odd = McpServer(
        name="x",
        command='/bin/with "quotes" \\ and\nnewline',
        args=("ü", "\x7f", "tab\t"),
        env=(NameValue("A.B C", "=v"),),
    )
    parsed = tomllib.loads(f"v = {codex_mcp_table(odd)}")["v"]
    assert parsed == {
        "command": odd.command,
        "args": list(odd.args),
        "env": {"A.B C": "=v"},
    }


def test_codex_refuses_sse_and_names_it_cannot_key() -> None:
    CodexClient.check_mcp_servers([STDIO, HTTP])
    with pytest.raises(McpUnsupported, match="Codex cannot take sse MCP server 'events'"):
        CodexClient.check_mcp_servers([SSE])
    with pytest.raises(McpUnsupported, match="name 'my.files'"):
        CodexClient.check_mcp_servers([McpServer(name="my.files", command="x")])


def test_claude_takes_mcp_config_json_before_resume() -> None:
    base = ["claude", "-p"]
    argv = ClaudeClient.command(base, "sess-9", mcp_servers=[STDIO, HTTP, SSE])
    assert argv[:3] == ["claude", "-p", "--mcp-config"]
    assert argv[4:] == ["--resume", "sess-9"]
    assert json.loads(argv[3]) == {
        "mcpServers": {
            "files": {
                "type": "stdio",
                "command": "/usr/bin/mcp-files",
                "args": ["--root", "/w"],
                "env": {"LOG": "debug"},
            },
            "docs": {
                "type": "http",
                "url": "http://127.0.0.1:9/mcp",
                "headers": {"Authorization": "Bearer t"},
            },
            "events": {"type": "sse", "url": "https://example.test/sse", "headers": {}},
        }
    }
    assert ClaudeClient.command(base, None) == base
    ClaudeClient.check_mcp_servers([STDIO, HTTP, SSE])


def test_opencode_takes_them_in_its_config_content() -> None:
    env = OpenCodeClient.environment("secret", mcp_servers=[STDIO, HTTP, SSE])
    assert json.loads(env[CONFIG_CONTENT_VAR]) == {
        "mcp": {
            "files": {
                "type": "local",
                "command": ["/usr/bin/mcp-files", "--root", "/w"],
                "environment": {"LOG": "debug"},
                "enabled": True,
            },
            "docs": {
                "type": "remote",
                "url": "http://127.0.0.1:9/mcp",
                "headers": {"Authorization": "Bearer t"},
                "enabled": True,
            },
            "events": {
                "type": "remote",
                "url": "https://example.test/sse",
                "headers": {},
                "enabled": True,
            },
        }
    }
    assert CONFIG_CONTENT_VAR not in OpenCodeClient.environment("secret")


def test_opencode_keeps_a_configured_config_content() -> None:
    configured = {CONFIG_CONTENT_VAR: json.dumps({"model": "m", "mcp": {"old": {"x": 1}}})}
    env = OpenCodeClient.environment("s", mcp_servers=[STDIO], configured=configured)
    document = json.loads(env[CONFIG_CONTENT_VAR])
    assert document["model"] == "m"
    assert set(document["mcp"]) == {"old", "files"}
    with pytest.raises(McpUnsupported, match="not a JSON object"):
        OpenCodeClient.environment("s", mcp_servers=[STDIO], configured={CONFIG_CONTENT_VAR: "["})


def test_amp_takes_mcp_config_json_and_no_sse() -> None:
    argv = AmpClient.command(["amp", "--execute", "--stream-json"], None, mcp_servers=[STDIO])
    assert argv[:4] == ["amp", "--execute", "--stream-json", "--mcp-config"]
    assert json.loads(argv[4]) == amp_mcp_config([STDIO])
    assert amp_mcp_config([STDIO, HTTP]) == {
        "files": {
            "command": "/usr/bin/mcp-files",
            "args": ["--root", "/w"],
            "env": {"LOG": "debug"},
        },
        "docs": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer t"}},
    }
    resumed = AmpClient.command(["amp", "--execute"], "T-1", mcp_servers=[STDIO])
    assert resumed[:5] == ["amp", "threads", "continue", "T-1", "--execute"]
    assert resumed[5] == "--mcp-config"
    with pytest.raises(McpUnsupported, match="cannot take sse"):
        AmpClient.check_mcp_servers([SSE])


# --- configuration, gateway, remote ------------------------------------------------------

CONFIG = """
[agents.coder]
protocol = "codex"
command = ["codex", "app-server"]

[[agents.coder.mcp_servers]]
name = "files"
command = "/usr/bin/mcp-files"
args = ["--root", "/w"]
env = [{ name = "LOG", value = "debug" }]

[[agents.coder.mcp_servers]]
type = "http"
name = "docs"
url = "http://127.0.0.1:9/mcp"
headers = [{ name = "Authorization", value = "Bearer t" }]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(text)
    return path


def test_config_mcp_servers(tmp_path: Path) -> None:
    spec = load_agents(_write(tmp_path, CONFIG))["coder"]
    assert spec.mcp_servers == (STDIO, HTTP)
    assert load_agents(_write(tmp_path, CONFIG))["demo"].mcp_servers == ()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('mcp_servers = "files"', "'mcp_servers' must be a list"),
        ("mcp_servers = [{ name = 'a' }]", r"mcp_servers\[0\]: MCP server 'a': 'command'"),
        (
            "mcp_servers = [{ type = 'sse', name = 'e', url = 'http://h/s' }]",
            "Codex cannot take sse MCP server 'e'",
        ),
    ],
)
def test_config_mcp_server_errors(tmp_path: Path, text: str, match: str) -> None:
    path = _write(tmp_path, f'[agents.coder]\nprotocol = "codex"\ncommand = ["c"]\n{text}\n')
    with pytest.raises(ConfigError, match=match) as caught:
        load_agents(path)
    assert "[agents.coder]" in str(caught.value) and str(path) in str(caught.value)


def test_spec_with_session_servers() -> None:
    spec = AgentSpec(name="c", protocol="codex", command=["codex"], mcp_servers=[STDIO])
    mine = McpServer(name="files", command="/opt/mine")
    assert spec.with_mcp_servers([mine, HTTP]).mcp_servers == (mine, HTTP)
    with pytest.raises(McpUnsupported, match="sse"):
        spec.with_mcp_servers([SSE])


def test_the_remote_spec_carries_them() -> None:
    spec = AgentSpec(name="c", protocol="acp", command=["a"], mcp_servers=[STDIO, HTTP, SSE])
    wire = json.loads(json.dumps(spec_to_wire(spec)))
    assert spec_from_wire("c", wire) == spec


def test_gateway_session_start_takes_mcp_servers() -> None:
    servers = [mcp_server_to_acp(STDIO)]
    frame = json.dumps(
        {"id": 1, "action": "session.start", "payload": {"agent": "demo", "mcp_servers": servers}}
    )
    request = decode_request(frame)
    assert isinstance(request, Request) and isinstance(request.call, StartSession)
    assert request.call.mcp_servers == (STDIO,)
    bad = json.dumps(
        {"id": 2, "action": "session.start", "payload": {"agent": "demo", "mcp_servers": {}}}
    )
    assert not isinstance(decode_request(bad), Request)
