"""Tier 4: the real ``codex app-server`` under the supervisor, against a fake model.

The native binary of ``@openai/codex@0.171.0`` (installed by ``tests/realagents/install.py``,
key ``codex``; skipped with the reason when that is impossible, a failure under
``AGENT_SUPERVISOR_STRICT_SKIPS=1``), run as ``codex app-server --strict-config`` with protocol
``codex`` (``protocols/codex.py``) and a fresh ``CODEX_HOME/config.toml`` per test pointing at the
``POST /v1/responses`` stream of ``tests/realagents/fake_model.py``, each test in its own
loopback-only network namespace. There is no bubblewrap here, so the fake model asks for its
shell commands with ``sandbox_permissions: "require_escalated"``: every command needs an approval
(the test gives it where the scenario wants the command to run). The scenarios of
``test_real_acp_agents.py``:

(a) cancel while the model streams: receipt ``cancelled`` (``turn/interrupt``, then
    ``turn/completed`` ``interrupted``), and the server hung up on the model's stream;
(b) cancel while an approved command runs: ``turn/interrupt`` leaves it running (Codex's
    documented behaviour), so the adapter's ``thread/backgroundTerminals/clean`` or the
    supervisor's sweep (``tools_killed``) must stop it: after the receipt no process of it lives;
(c) cancel while the approval is pending: the command never runs;
(d) after each, a ``quick`` prompt completes;
(e) a turn that outlives its grace (0 s here) is killed with the server's whole tree, the server
    respawned and the thread resumed with ``thread/resume``; the next request to the model still
    holds the conversation from before the kill;
(f) the wire of a session (a turn, an approval, a cancel, a clean, another turn) logged both
    ways and checked, line by line, against the JSON schema that the same binary generates
    (``tests/machines/test_schemas.py``): what we send, and what the real server sends.

Every test checks that the adapter saw no protocol error; notifications it does not classify
(``agent.unparsed``) must be among :data:`UNCLASSIFIED` (a gap in the adapter, reported).

Real clock, generous bounds. Receipt latencies go into the tier-4 table at the end of the run
(and ``.cache/tier4-results.json``) as agent ``codex-app-server``. ``AGENT_TIER4_TEE=1`` logs
every line of every test (not only (f)) under the test's tmp folder (``wire/wire.log``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from helpers import Recorder
from protocols import events as ev
from realagents import install, scenarios
from realagents.agents import (
    CODEX_APP_SERVER,
    codex_app_server_spec,
    codex_enable_features,
)
from realagents.conftest import GRACE_S, Harness, real_agent_session, record, skip_or_fail
from realagents.fake_model import PERMISSION_COMMAND, SHELL_COMMAND
from realagents.scenarios import (
    TOOL_LEAF,
    family,
    is_alive,
    ms_after,
)

pytestmark = pytest.mark.real_process

KEY = CODEX_APP_SERVER.key
#: Whole-test bound: start (~0.3 s), three turns, a possible kill ladder and respawn.
BOUND_S = 60.0
#: Server notifications of 0.171.0 seen here that the adapter passes on as ``agent.unparsed``
#: (it neither classifies them as session info nor ignores them): valid ServerNotifications
#: ((f) checks), harmless, but every session shows some. Others may appear; they are listed in
#: the table's notes. An unparsed *request or response* fails the test.
UNCLASSIFIED = frozenset(
    {"remoteControl/status/changed", "thread/readState/changed", "thread/goal/cleared"}
)


@pytest.fixture(scope="module")
def codex_install() -> install.Installed:
    return scenarios.ensure_installed(CODEX_APP_SERVER.package, KEY)


@pytest.fixture
def open_codex(codex_install: install.Installed, tmp_path: Path) -> Any:
    """``async with open_codex(grace_s=..., keep_bodies=..., tee=..., features=...) as h:``"""
    return lambda **options: codex_session(tmp_path, codex_install, **options)


def codex_session(
    root: Path,
    installed: install.Installed,
    *,
    features: tuple[str, ...] = (),
    clean: bool = True,
    **options: Any,
) -> AbstractAsyncContextManager[Harness]:
    """Like ``realagents.conftest.real_agent_session``, with the ``codex`` protocol.

    ``features``: extra ``[features]`` flags of ``config.toml``; ``clean=False`` skips the
    end-of-test checks (no error, only notifications unparsed), for a control experiment that
    shows what goes wrong without one of the adapter's steps."""
    return real_agent_session(
        CODEX_APP_SERVER,
        root,
        installed,
        spec_of=codex_app_server_spec,
        prepare=lambda prepared: codex_enable_features(prepared, *features),
        catch_up=True,
        checks=only_notifications_unparsed if clean else None,
        **options,
    )


def only_notifications_unparsed(recorder: Recorder) -> None:
    """No protocol error, and only notifications unparsed (the adapter answers every request)."""
    assert recorder.of_kind("error") == [], recorder.of_kind("error")
    odd = [
        e.raw
        for e in recorder.of_kind("agent.unparsed")
        if isinstance(e, ev.AgentUnparsed) and not (isinstance(e.raw, dict) and "id" not in e.raw)
    ]
    assert odd == [], f"unparsed requests or responses: {odd}"


def row(h: Harness, scenario: str, receipt: Any, **extra: Any) -> None:
    """One row of the tier-4 table (plus fields only the JSON file shows)."""
    scenarios.record_receipt(
        h,
        KEY,
        CODEX_APP_SERVER.package,
        scenario,
        receipt,
        extra,
        details=True,
        unparsed=_unparsed_methods(h.recorder),
    )


async def second_prompt_completes(h: Harness) -> ev.TurnEnded:
    """(d): the session takes a new prompt after the cancel, and it completes."""
    return await scenarios.second_prompt_completes(h, stop_reason="completed")


def _approval_command(requested: ev.PermissionRequested, option: ev.PermissionOption) -> str:
    return str(requested.tool_call.get("params", {}).get("command"))


#: Answer every approval of the turn "accept" (allow once), noting each command.
approve_permissions = partial(scenarios.approve_permissions, approved_as=_approval_command)


def test_command_line() -> None:
    """The tier runs the native binary as the app-server, with a strict config."""
    assert CODEX_APP_SERVER.args == ("app-server", "--strict-config")
    package = install.PACKAGES[CODEX_APP_SERVER.package]
    assert (package.npm, package.version) == ("@openai/codex", "0.171.0")
    assert package.entry.endswith("/vendor/x86_64-unknown-linux-musl/bin/codex")


async def test_cancel_while_streaming(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            turn, stream = await scenarios.streaming(h)
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            gone = await scenarios.stream_ended(h, stream, timeout=30)
            row(h, "stream", receipt, model_gone_ms=ms_after(cancelled_at, gone.disconnected_at))
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "interrupted", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.details == {"background_terminals": "cleaned"}, receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            scenarios.assert_stream_abandoned(h, gone, cancelled_at)

            await second_prompt_completes(h)
            scenarios.assert_only_stream(h, stream)


async def test_cancel_while_shell_runs(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            assert h.tool_processes(SHELL_COMMAND) == []
            # An escalated command (no bubblewrap here): Codex asks; the test says yes.
            turn, tools, approved = await scenarios.shell_running(h, approve_permissions)
            watched = list({p.pid: p for t in tools for p in [t, *family(t)]}.values())
            [server] = [p for p in psutil.Process().children(recursive=True) if _is_server(p)]
            in_server_tree = all(_is_descendant(p, server) for p in watched)
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
                    f"tool_procs={len(watched)} in_server_tree={in_server_tree}",
                    *scenarios.tool_notes(watched, alive_at_receipt, gone_ms, killed),
                ],
                tools_killed=killed,
            )
            assert receipt.turn_id == turn.id
            assert len(approved) == 1 and SHELL_COMMAND in approved[0], approved
            scenarios.assert_tools_gone(receipt, alive_at_receipt, still)
            assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "interrupted"), receipt
            assert receipt.escalation in (["interrupt"], ["interrupt", "tools_killed"]), receipt
            assert receipt.details.get("background_terminals") == "cleaned", receipt
            assert receipt.elapsed_ms < GRACE_S * 1000 + 2000  # + the sweep's settle/term
            await second_prompt_completes(h)
            assert h.tool_processes(TOOL_LEAF) == []
            # The command never finished as far as the model heard.
            results = [e.tool_result for e in h.model.snapshot() if e.tool_result]
            assert all("exit code: 0" not in str(r).lower() for r in results), results


async def test_cancel_with_pending_approval(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            async with scenarios.permission_pending(h, "approval") as (turn, requested):
                assert requested.tool_call["method"] == "item/commandExecution/requestApproval"
                assert PERMISSION_COMMAND in requested.tool_call["params"]["command"]
                receipt = await h.session.cancel()
                row(h, "permission", receipt)
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                scenarios.assert_permissions_cancelled(receipt)
                assert receipt.stop_reason == "interrupted", receipt
                assert receipt.elapsed_ms < GRACE_S * 1000
                scenarios.assert_cancelled_by_supervisor(h, requested)
                await second_prompt_completes(h)
            # The server reported the command item as declined (never run).
            call = requested.tool_call["toolCallId"]
            statuses = [
                e.raw.get("status")
                for e in h.recorder.of_kind("tool.update")
                if isinstance(e, ev.ToolUpdate) and e.tool_call_id == call
            ]
            assert statuses and set(statuses) <= {"declined"}, statuses
            assert not [e for e in h.model.snapshot() if e.tool_result], h.model.describe()


async def test_killed_turn_resumes_thread(open_codex: Any) -> None:
    """(e) A turn that does not end within the grace (none at all here) is killed with the
    server's whole tree; a new server resumes the thread (``thread/resume``) with its history."""
    with trio.fail_after(BOUND_S):
        async with open_codex(grace_s=0.0, keep_bodies=True) as h:
            turn, stream, tree = await scenarios.killed_mid_stream(h)
            [thread_id] = _thread_ids(h)
            [old_server] = [p for p in tree if _is_server(p)]
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            alive = await scenarios.wait_gone(tree)
            gone = await scenarios.stream_ended(h, stream)
            row(
                h,
                "kill",
                receipt,
                model_gone_ms=ms_after(cancelled_at, gone.disconnected_at),
                notes=[f"resumed={receipt.resumed}", *scenarios.respawn_notes(h, "server")],
            )
            scenarios.assert_killed_and_resumed(h, receipt, turn.id, alive, gone)
            servers = [
                p
                for p in psutil.Process().children(recursive=True)
                if _is_server(p) and is_alive(p)
            ]
            # The server the session started again; one it runs itself is its own (not ours).
            tops = [p for p in servers if not any(_is_descendant(p, other) for other in servers)]
            assert len(tops) == 1, [(p.pid, p.ppid(), p.cmdline()) for p in servers]
            assert tops[0].pid != old_server.pid

            await second_prompt_completes(h)
            assert _thread_ids(h) == {thread_id}  # every turn ran in the one thread, resumed
            scenarios.assert_history_kept(h, "thread")


async def test_wire_matches_the_schema(open_codex: Any, tmp_path: Path) -> None:
    """(f) Every line between the supervisor and the real server, both ways, against the schema
    the same binary generates: our messages completely (as ``tests/machines/test_schemas.py`` does for the
    goldens), the server's completely too (they are real, nothing is abbreviated)."""
    from schemas import load_codex_schema, violations, walk_messages

    try:
        schema = load_codex_schema()
    except install.Unavailable as exc:
        skip_or_fail(f"the Codex app-server schema is not available: {exc}")
        raise  # not reached
    with trio.fail_after(BOUND_S):
        async with open_codex(tee=True) as h:
            await second_prompt_completes(h)
            approved: list[str] = []
            async with trio.open_nursery() as nursery:
                turn = await h.session.prompt("shell")
                nursery.start_soon(approve_permissions, h, turn.id, approved)
                await scenarios.command_running(h)
                nursery.cancel_scope.cancel()
            receipt = await h.session.cancel()
            assert receipt.outcome == "cancelled", receipt
            await second_prompt_completes(h)
    lines = list(_wire_log(tmp_path / "wire" / "wire.log"))
    wires = list(walk_messages("wire.log", lines))
    methods = {(w.ours, w.kind, w.method) for w in wires}
    problems: list[str] = []
    for wire in wires:
        checks = schema.checks(wire)
        if isinstance(checks, str):
            problems.append(f"{wire.where}: {checks}: {json.dumps(wire.message)[:300]}")
            continue
        problems += violations(schema.schema, checks, wire, lenient=False)
    # What this session covered: the handshake, turns, an approval, an interrupt, the clean.
    for expected in [
        (True, "request", "initialize"),
        (True, "notification", "initialized"),
        (True, "request", "thread/start"),
        (True, "request", "turn/start"),
        (True, "request", "turn/interrupt"),
        (True, "request", "thread/backgroundTerminals/clean"),
        (True, "response", "item/commandExecution/requestApproval"),
        (False, "request", "item/commandExecution/requestApproval"),
        (False, "response", "turn/interrupt"),
        (False, "response", "thread/backgroundTerminals/clean"),
        (False, "notification", "turn/completed"),
        (False, "notification", "serverRequest/resolved"),
    ]:
        assert expected in methods, (expected, sorted(map(str, methods)))
    record(
        agent=KEY,
        install=scenarios.installed_as(CODEX_APP_SERVER.package),
        scenario="wire",
        outcome="valid" if not problems else "INVALID",
        elapsed_ms=receipt.elapsed_ms,
        ready_s=round(h.ready_s, 1),
        namespace=h.namespace,
        notes=f"lines={len(lines)} schema_violations={len(problems)}"
        f" unparsed={','.join(sorted(_unparsed_methods(h.recorder))) or '-'}",
    )
    assert problems == [], "\n".join(problems[:20])


def _wire_log(path: Path) -> Iterator[tuple[int, bool, Any]]:
    """``(line number, ours, message)`` from a ``tee.py`` log (``STAMP > JSON`` is ours)."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        _, mark, payload = line.split(" ", 2)
        yield number, mark == ">", json.loads(payload)


def _thread_ids(h: Harness) -> set[str]:
    """The Codex threads the session's turns ran in (from ``turn/started``)."""
    return {
        e.data["threadId"]
        for e in h.recorder.of_kind("session.info")
        if isinstance(e, ev.SessionInfo) and e.info_kind == "turn/started"
    }


def _unparsed_methods(recorder: Recorder) -> set[str]:
    return {
        str(e.raw.get("method")) if isinstance(e.raw, dict) else repr(e.raw)
        for e in recorder.of_kind("agent.unparsed")
        if isinstance(e, ev.AgentUnparsed)
    }


def _is_server(proc: psutil.Process) -> bool:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return len(argv) >= 2 and argv[0].endswith("/bin/codex") and argv[1] == "app-server"


def _is_descendant(proc: psutil.Process, ancestor: psutil.Process) -> bool:
    try:
        return any(p.pid == ancestor.pid for p in proc.parents())
    except psutil.Error:
        return False
