"""Tier 4: real agents behind ``agent-supervisor acp``, driven by the official TypeScript SDK
client: three that speak no ACP, the Codex app-server (protocol ``codex``), Claude Code in
stream-json mode (protocol ``claude``) and Amp (protocol ``amp``, against the tests' fake Amp
server), and five that do, Gemini CLI and Qwen Code (``--acp``), codex-acp, claude-agent-acp
and OpenCode (``acp``), each against the tests' fake model (``tests/realagents/fake_model.py``)
in its own loopback-only network namespace where the host allows one. A quick turn, a turn
cancelled while the model streams (the prompt answered ``cancelled``), another quick turn;
every message both ways valid ACP v1.

Installed by ``tests/realagents/install.py`` (a skip with the reason when that is impossible, a
failure under ``AGENT_SUPERVISOR_STRICT_SKIPS=1``). Real clock, generous bounds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from acp_harness import check_wire, run_ts
from acp_harness import schema as schema  # the fixture
from realagents import install
from realagents.agents import (
    AGENTS as ACP_AGENTS,
)
from realagents.agents import (
    AMP,
    CLAUDE_STREAM_JSON,
    CODEX_APP_SERVER,
    RealAgent,
    amp_spec,
    claude_stream_json_spec,
    codex_app_server_spec,
)
from realagents.conftest import GRACE_S, noted_namespace, record, skip_or_fail
from realagents.fake_amp import FakeAmp
from realagents.fake_model import FakeModel
from realagents.scenarios import installed_as
from schemas import AcpSchema
from supervisor.config import AgentSpec

pytestmark = pytest.mark.real_process

AGENTS: dict[str, tuple[RealAgent, Callable[..., AgentSpec]]] = {
    "codex-app-server": (CODEX_APP_SERVER, codex_app_server_spec),
    "claude-stream-json": (CLAUDE_STREAM_JSON, claude_stream_json_spec),
    # Amp's agent loop is on its server: the fake Amp server stands in for the fake model.
    "amp": (AMP, amp_spec),
    # Real ACP agents behind the front door: ACP on both sides, the ladder in between.
    **{
        key: (ACP_AGENTS[key], ACP_AGENTS[key].spec)
        for key in ("gemini", "qwen", "codex-acp", "claude-agent-acp", "opencode")
    },
}


def config_toml(spec: AgentSpec, path: Path) -> Path:
    """``spec`` as an ``[agents.NAME]`` table (JSON strings are TOML basic strings)."""
    env = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in spec.env.items())
    lines = [
        f'[agents."{spec.name}"]',
        f"protocol = {json.dumps(spec.protocol)}",
        f"command = {json.dumps(list(spec.command))}",
        f"env = {{ {env} }}",
        f"grace_s = {spec.grace_s}",
        f"kill_timeout_s = {spec.kill_timeout_s}",
        f"start_timeout_s = {spec.start_timeout_s}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def front_config(spec: AgentSpec, namespace: Any, tmp_path: Path) -> Path:
    """The front door's config for ``spec``, run in the test's network namespace if any."""
    if namespace is not None:
        spec = spec.with_options(command=tuple(namespace.wrap(list(spec.command))))
    return config_toml(spec, tmp_path / "agents.toml")


#: A 1x1 PNG: a real image, for the agents that check what they are given.
PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def take_images(path: Path) -> None:
    """OpenCode passes an image to a model its config says takes images; to the test's plain
    fake model it sends its own "this model does not support image input" text instead."""
    config = json.loads(path.read_text())
    model = config["provider"]["fake"]["models"]["fake-model"]
    model.update(attachment=True, modalities={"input": ["text", "image"], "output": ["text"]})
    path.write_text(json.dumps(config, indent=2))


@pytest.mark.parametrize(
    "key",
    [
        "claude-stream-json",
        "codex-app-server",
        "gemini",
        "codex-acp",
        "claude-agent-acp",
        "opencode",
    ],
)
async def test_an_image_in_the_prompt_reaches_the_model(
    key: str, tmp_path: Path, schema: AcpSchema
) -> None:
    """An image the editor puts in its prompt goes through the front door and the agent's own
    protocol (Claude's image block, Codex's data: URL input item, the ACP block to Gemini,
    codex-acp, claude-agent-acp and OpenCode) to the model: the fake model finds its bytes in the
    request the agent made."""
    agent, spec_of = AGENTS[key]
    try:
        installed = install.ensure(agent.package)
    except install.Unavailable as exc:
        skip_or_fail(f"{key} is not available: {exc}")
        raise
    with noted_namespace() as namespace:
        listener = namespace.listener if namespace is not None else None
        with FakeModel(listener, keep_bodies=True) as model:
            prepared = agent.prepare(installed.argv, tmp_path, model.base_url)
            if key == "opencode":
                take_images(prepared.cwd / "opencode.json")
            config = front_config(spec_of(prepared, grace_s=GRACE_S), namespace, tmp_path)
            result: dict[str, Any] = await run_ts(
                tmp_path,
                "realimage",
                "--config",
                os.fspath(config),
                "--agent",
                key,
                cwd=os.fspath(prepared.cwd),
                env={"ACP_TEST_IMAGE": PNG_1X1},
            )
            bodies = [json.dumps(e.body) for e in model.snapshot() if e.body is not None]
    assert result["answer"]["stopReason"] == "end_turn", result
    assert result["text"].strip(), "the turn said something"
    assert any(PNG_1X1 in body for body in bodies), "the image never reached the model"
    if key in ("claude-stream-json", "codex-app-server"):  # an ACP agent's own word comes
        # only once it ran here (then it is remembered for the next initialize)
        assert result["promptCapabilities"]["image"] is True
    check_wire(tmp_path / "wire", schema)


async def say_when_streaming(server: FakeAmp, flag: Path) -> None:
    await server.wait_for(lambda t: t.scenario == "stream" and t.tokens_sent >= 3)
    flag.touch()


@pytest.mark.parametrize("key", sorted(AGENTS))
async def test_real_agent_through_the_front_door(
    key: str, tmp_path: Path, schema: AcpSchema
) -> None:
    agent, spec_of = AGENTS[key]
    try:
        installed = install.ensure(agent.package)
    except install.Unavailable as exc:
        skip_or_fail(f"{key} is not available: {exc}")
        raise
    with noted_namespace() as namespace:
        listener = namespace.listener if namespace is not None else None
        with (FakeAmp if key == "amp" else FakeModel)(listener) as model:
            prepared = agent.prepare(installed.argv, tmp_path, model.base_url)
            config = front_config(spec_of(prepared, grace_s=GRACE_S), namespace, tmp_path)
            streaming = tmp_path / "streaming"
            async with trio.open_nursery() as nursery:
                if isinstance(model, FakeAmp):
                    # Amp's CLI prints nothing while its server streams: the client cancels
                    # once this file says the server does.
                    nursery.start_soon(say_when_streaming, model, streaming)
                result: dict[str, Any] = await run_ts(
                    tmp_path,
                    "real",
                    "--config",
                    os.fspath(config),
                    "--agent",
                    key,
                    cwd=os.fspath(prepared.cwd),
                    env={"ACP_TEST_CANCEL_WHEN": os.fspath(streaming)} if key == "amp" else None,
                )
                nursery.cancel_scope.cancel()
            if isinstance(model, FakeAmp):
                # Amp says nothing until a message is whole: its server says it was streaming
                # when the cancel came, and that the turn was cancelled, not finished.
                [stream] = model.find_turns(lambda t: t.scenario == "stream")
                assert stream.outcome == "cancelled" and stream.tokens_sent > 0, stream
    assert result["quick"]["stopReason"] == "end_turn", result
    assert result["quickText"].strip(), "the quick turn said something"
    assert result["cancelled"]["stopReason"] == "cancelled"
    meta = result["cancelled"]["_meta"]["agentSupervisor"]
    assert meta["outcome"] == "cancelled"
    record(
        agent=key,
        install=installed_as(agent.package),
        scenario="acp front door: cancel while streaming",
        outcome=meta["outcome"],
        elapsed_ms=meta["receipt"]["elapsed_ms"],
        namespace=namespace is not None,
        notes=f"ACP client heard stopReason cancelled {result['cancelMs']:.0f} ms after its cancel",
    )
    assert result["cancelMs"] < (GRACE_S + 2.0) * 1000
    assert result["again"]["stopReason"] == "end_turn"
    print(f"{key}: cancel heard by the ACP client in {result['cancelMs']:.0f} ms")
    check_wire(tmp_path / "wire", schema)
