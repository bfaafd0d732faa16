"""The ACP front door driven by the official SDK clients: its command line, the TypeScript
client's run, and the check of every logged message against the ACP v1 schema. Shared by the
front door's own tests (``tests/clients/test_acp_front.py``) and those with real agents behind it
(``tests/real/test_real_acp_front.py``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from helpers import skip_or_fail
from paths import REPO, TESTS
from realagents import install
from schemas import AcpSchema, violations, walk_messages

ROOT = REPO
TS_CLIENT = TESTS / "acp_clients" / "ts_client.mjs"
TEE = TESTS / "realagents" / "tee.py"
FAKE_MCP = TESTS / "fakes" / "mcp_server.py"
#: A scenario's whole run, a few agent starts and a 3 s grace included, on a loaded machine.
SCENARIO_S = 90.0
#: demo-stubborn's grace (3 s) plus the kill ladder (<= 1 s) and a loaded machine's slack.
STUBBORN_CANCEL_S = 3.0 + 1.0 + 3.0


@pytest.fixture(scope="module")
def schema() -> AcpSchema:
    """The ACP v1 schema the TypeScript SDK ships (as ``tests/machines/test_schemas.py`` reads it)."""
    folder = Path(sdk_entry()).parents[3] / "schema" / "v1"
    return AcpSchema.load(folder / "schema.json")


def sdk_entry() -> str:
    try:
        installed = install.ensure("acp-sdk")
    except install.Unavailable as exc:
        skip_or_fail(f"the ACP TypeScript SDK is not available: {exc}")
        raise
    return os.fspath(installed.package.folder / installed.package.entry)


def front_argv(log_dir: Path, *args: str) -> list[str]:
    """``agent-supervisor acp ARGS`` behind the tee that logs its wire."""
    return [
        sys.executable,
        "-S",
        "-E",
        os.fspath(TEE),
        os.fspath(log_dir),
        "--",
        sys.executable,
        "-c",
        "import sys; from supervisor.cli import main; sys.exit(main())",
        "acp",
        *args,
    ]


def front_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "AGENT_SUPERVISOR_STATE_DIR": os.fspath(tmp_path / "state"),
        "PYTHONPATH": os.fspath(ROOT),
    }


async def run_ts(
    tmp_path: Path,
    scenario: str,
    *front_args: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> dict[str, Any]:
    """Run ``scenario`` of the TypeScript client against ``acp FRONT_ARGS``; the ACP session's
    cwd is ``cwd`` (default: ``tmp_path``)."""
    node = "node"
    argv = front_argv(tmp_path / "wire", *front_args)
    where = cwd or str(tmp_path)
    with trio.fail_after(SCENARIO_S):
        done = await trio.run_process(
            [node, os.fspath(TS_CLIENT), sdk_entry(), scenario, json.dumps(argv), where],
            capture_stdout=True,
            env={**front_env(tmp_path), **(env or {})},
            check=False,
        )
    assert done.returncode == 0, f"the TypeScript client failed ({done.returncode})"
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def conversations(log_dir: Path) -> list[list[tuple[bool, Any]]]:
    """The tee's log as conversations (each begins with an ``initialize``): (from the client,
    message)."""
    found: list[list[tuple[bool, Any]]] = []
    for line in (log_dir / "wire.log").read_bytes().splitlines():
        _, mark, payload = line.split(b" ", 2)
        message = json.loads(payload)
        from_client = mark == b">"
        if from_client and isinstance(message, dict) and message.get("method") == "initialize":
            found.append([])
        found[-1].append((from_client, message))
    return found


def check_wire(log_dir: Path, schema: AcpSchema) -> list[dict[str, Any]]:
    """Every message both ways valid ACP v1; returns the front door's messages."""
    problems: list[str] = []
    ours: list[dict[str, Any]] = []
    talks = conversations(log_dir)
    assert talks, "nothing on the wire"
    for number, talk in enumerate(talks):
        # In the schema's terms the client is "Client" (``ours=True`` in test_schemas' walk,
        # which was written from the client side), the front door is "Agent".
        steps = [(step, from_client, message) for step, (from_client, message) in enumerate(talk)]
        for wire in walk_messages(f"acp-front-{number}.log", steps):
            checks = schema.checks(wire)
            if isinstance(checks, str):
                problems.append(f"{wire.where}: {checks}")
                continue
            if wire.ours:  # the client's: valid as the schema says
                problems += violations(schema.schema, checks, wire, lenient=True)
            else:  # ours: valid, and no member name the schema never declares
                for check in checks:
                    problems += [
                        f"{wire.where} against {check.label}: {error.message}"
                        for error in schema.schema.errors(check, wire.message)
                    ]
                # Inside a tool's rawInput/rawOutput (free-form, the agent's own) and an error's
                # data (JSON-RPC's free-form member) any name goes.
                bare_message = _without_raw(wire.message)
                if isinstance(bare_message.get("error"), dict):
                    bare_message["error"].pop("data", None)
                bare = attrs.evolve(wire, message=bare_message)
                problems += violations(schema.schema, checks, bare, lenient=False)
            if not wire.ours:
                ours.append(wire.message)
    assert not problems, "\n".join(problems)
    return ours


def _without_raw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_raw(v) for k, v in value.items() if k not in ("rawInput", "rawOutput")}
    if isinstance(value, list):
        return [_without_raw(v) for v in value]
    return value


def updates(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["params"]["update"] for m in messages if m.get("method") == "session/update"]
