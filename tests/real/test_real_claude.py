"""Tier 4: the real Claude Code CLI in stream-json mode under the supervisor, against a fake model.

``claude -p --input-format stream-json --output-format stream-json ...`` (protocol ``claude``,
``protocols/claude.py``): the native binary of ``@anthropic-ai/claude-code@2.1.332``, installed by
``tests/realagents/install.py`` (key ``claude-code``; skipped with the reason when that is
impossible, a failure under ``AGENT_SUPERVISOR_STRICT_SKIPS=1``), with a fresh ``HOME`` per test,
in its own loopback-only network namespace, talking to the ``POST /v1/messages`` stream of
``tests/realagents/fake_model.py``. The same scenarios as ``test_real_acp_agents.py``:

(a) cancel while the model streams: receipt ``cancelled`` (``aborted_streaming``), and the CLI
    hung up on the model;
(b) cancel while an approved Bash command runs: after the receipt no process of the command is
    alive. Claude's Bash shell lives in its own session (asserted: no process-group kill of the
    CLI reaches it); what the CLI leaves behind the supervisor kills before the receipt, which
    then says ``tools_killed``. 2.1.332 kills its shell itself before its ``result``, so the
    receipt says ``interrupt`` only;
(c) cancel while a ``can_use_tool`` permission request is pending: the command never runs;
(d) after each, a ``quick`` prompt completes;
(e) a turn that outlives its grace (0 s here) is killed with the CLI's whole tree, the CLI started
    again with ``--resume <session_id>``, and the next turn's request to the model still holds the
    conversation from before the kill.

Every test also checks that the adapter understood every line the CLI wrote (no
``agent.unparsed``) and saw no protocol error (no ``error`` event).

Real clock, generous bounds. The cancel latencies go into the tier-4 table at the end of the run
(and ``.cache/tier4-results.json``) as agent ``claude-stream-json``. ``AGENT_TIER4_TEE=1`` logs
every line to and from the CLI under the test's tmp folder (``wire/wire.log``).
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from protocols import events as ev
from protocols.claude import CLAUDE_COMMAND
from realagents import install, scenarios
from realagents.agents import (
    CLAUDE_STREAM_JSON,
    CLAUDE_STREAM_JSON_ARGS,
    claude_stream_json_spec,
)
from realagents.conftest import GRACE_S, Harness, real_agent_session
from realagents.fake_model import PERMISSION_COMMAND, SHELL_COMMAND
from realagents.scenarios import (
    TOOL_LEAF,
    command_of,
    family,
    is_alive,
    ms_after,
)

pytestmark = pytest.mark.real_process

KEY = CLAUDE_STREAM_JSON.key
#: Whole-test bound: start (~0.5 s), three turns, a possible kill ladder and respawn.
BOUND_S = 60.0


@pytest.fixture(scope="module")
def claude_install() -> install.Installed:
    return scenarios.ensure_installed(CLAUDE_STREAM_JSON.package, KEY)


@pytest.fixture
def open_claude(claude_install: install.Installed, tmp_path: Path) -> Any:
    """``async with open_claude(grace_s=..., keep_bodies=...) as h:`` the CLI with the
    ``claude`` protocol; afterwards the adapter understood every line the CLI wrote, and the
    CLI every request."""
    return lambda **options: real_agent_session(
        CLAUDE_STREAM_JSON,
        tmp_path,
        claude_install,
        spec_of=claude_stream_json_spec,
        catch_up=True,
        checks=scenarios.understood_everything,
        **options,
    )


def row(h: Harness, scenario: str, receipt: Any, **extra: Any) -> None:
    """One row of the tier-4 table (plus fields only the JSON file shows)."""
    unparsed = {
        f"{e.raw.get('type')}/{e.raw.get('subtype') or (e.raw.get('event') or {}).get('type')}"
        for e in h.recorder.of_kind("agent.unparsed")
        if isinstance(e, ev.AgentUnparsed) and isinstance(e.raw, dict)
    }
    scenarios.record_receipt(
        h, KEY, CLAUDE_STREAM_JSON.package, scenario, receipt, extra, unparsed=unparsed
    )


async def second_prompt_completes(h: Harness) -> ev.TurnEnded:
    """(d): the session takes a new prompt after the cancel, and it completes."""
    return await scenarios.second_prompt_completes(h, stop_reason="completed")


def _bash_command(requested: ev.PermissionRequested, option: ev.PermissionOption) -> str:
    return str(requested.tool_call.get("rawInput", {}).get("command", "?"))


#: Answer every permission request of the turn "allow", noting each Bash command.
approve_permissions = partial(scenarios.approve_permissions, approved_as=_bash_command)


def test_command_line_is_the_adapters() -> None:
    """The tier runs the adapter's own command line, plus a model and no settings files."""
    assert CLAUDE_STREAM_JSON_ARGS[: len(CLAUDE_COMMAND) - 1] == CLAUDE_COMMAND[1:]
    assert CLAUDE_STREAM_JSON_ARGS[len(CLAUDE_COMMAND) - 1 :] == (
        "--model",
        "claude-sonnet-4-5",
        "--setting-sources",
        "",
    )
    package = install.PACKAGES[CLAUDE_STREAM_JSON.package]
    assert (package.npm, package.version) == ("@anthropic-ai/claude-code", "2.1.332")


async def test_cancel_while_streaming(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            turn, stream = await scenarios.streaming(h)
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            gone = await scenarios.stream_ended(h, stream, timeout=30)
            row(h, "stream", receipt, model_gone_ms=ms_after(cancelled_at, gone.disconnected_at))
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "aborted_streaming", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            scenarios.assert_stream_abandoned(h, gone, cancelled_at)

            await second_prompt_completes(h)
            scenarios.assert_only_stream(h, stream)


async def test_cancel_while_bash_runs(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            assert h.tool_processes(SHELL_COMMAND) == []
            # Claude asks before every Bash command here (no settings are read at all).
            turn, tools, approved = await scenarios.shell_running(h, approve_permissions)
            watched = list({p.pid: p for t in tools for p in [t, *family(t)]}.values())
            [cli] = [p for p in psutil.Process().children(recursive=True) if _is_cli(p)]
            own_session = all(_sid(p) not in (None, _sid(cli)) for p in watched)
            receipt, alive_at_receipt, gone_ms, still = await scenarios.cancel_while_tools_run(
                h, watched
            )
            killed = receipt.details.get("tool_processes_killed", [])
            row(
                h,
                "shell",
                receipt,
                notes=[
                    f"approved={len(approved)}",
                    f"tool_procs={len(watched)} tool_own_session={own_session}",
                    *scenarios.tool_notes(watched, alive_at_receipt, gone_ms, killed),
                ],
                tools_killed=killed,
            )
            assert receipt.turn_id == turn.id
            assert approved == [SHELL_COMMAND], approved
            # The hard case: the shell is not in the CLI's session, so no process-group kill of
            # the CLI reaches it (shared/protocols.md section 3, "Escape and SIGINT").
            assert own_session, [(p.pid, _sid(p), command_of(p)) for p in watched]
            scenarios.assert_tools_gone(receipt, alive_at_receipt, still)
            assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "aborted_tools"), receipt
            assert receipt.escalation in (["interrupt"], ["interrupt", "tools_killed"]), receipt
            assert receipt.elapsed_ms < GRACE_S * 1000 + 2000  # + the sweep's settle/term
            await second_prompt_completes(h)
            assert h.tool_processes(TOOL_LEAF) == []
            # The command never finished as far as the model heard.
            results = [e.tool_result for e in h.model.snapshot() if e.tool_result]
            assert all(not r.get("output", "").startswith("Exit code 124") for r in results)


async def test_cancel_with_pending_permission(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            async with scenarios.permission_pending(h) as (turn, requested):
                assert requested.tool_call["rawInput"]["command"] == PERMISSION_COMMAND
                receipt = await h.session.cancel()
                row(h, "permission", receipt)
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                scenarios.assert_permissions_cancelled(receipt)
                assert receipt.stop_reason in ("aborted_tools", "aborted_streaming"), receipt
                assert receipt.elapsed_ms < GRACE_S * 1000
                scenarios.assert_cancelled_by_supervisor(h, requested)
                await second_prompt_completes(h)
            assert not any(
                "exit code: 0" in str(e.tool_result).lower() for e in h.model.snapshot()
            ), h.model.describe()


async def test_killed_turn_resumes_session(open_claude: Any) -> None:
    """(e) A turn that does not end within the grace (none at all here) is killed with the CLI's
    whole tree; the CLI is started again with ``--resume <session_id>`` and keeps the history."""
    with trio.fail_after(BOUND_S):
        async with open_claude(grace_s=0.0, keep_bodies=True) as h:
            turn, stream, tree = await scenarios.killed_mid_stream(h)
            session_id = _inits(h)[0]["session_id"]
            [old_cli] = [p for p in tree if _is_cli(p)]
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            alive = await scenarios.wait_gone(tree)
            gone = await scenarios.stream_ended(h, stream)
            row(
                h,
                "kill",
                receipt,
                model_gone_ms=ms_after(cancelled_at, gone.disconnected_at),
                notes=[f"resumed={receipt.resumed}", *scenarios.respawn_notes(h, "cli")],
            )
            scenarios.assert_killed_and_resumed(h, receipt, turn.id, alive, gone)

            # The new CLI was started with --resume <the session id from system/init>.
            [new_cli] = [
                p for p in psutil.Process().children(recursive=True) if _is_cli(p) and is_alive(p)
            ]
            assert new_cli.pid != old_cli.pid
            argv = new_cli.cmdline()
            assert argv[-2:] == ["--resume", session_id], argv

            await second_prompt_completes(h)
            inits = _inits(h)
            assert {i["session_id"] for i in inits} == {session_id}, inits
            errors = [e for e in h.recorder.of_kind("error") if isinstance(e, ev.ErrorEvent)]
            assert not [e for e in errors if e.code in ("resume_mismatch", "agent_session_changed")]
            scenarios.assert_history_kept(h)


def _inits(h: Harness) -> list[dict[str, Any]]:
    return [
        e.data
        for e in h.recorder.of_kind("session.info")
        if isinstance(e, ev.SessionInfo) and e.info_kind == "init"
    ]


def _is_cli(proc: psutil.Process) -> bool:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return bool(argv) and argv[0].endswith("/claude.exe")


def _sid(proc: psutil.Process) -> int | None:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None
