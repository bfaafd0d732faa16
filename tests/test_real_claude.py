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

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from helpers import Recorder
from protocols import events as ev
from protocols.claude import CLAUDE_COMMAND
from realagents import conftest as realagents_conftest
from realagents import install, netns
from realagents.agents import (
    CLAUDE_STREAM_JSON,
    CLAUDE_STREAM_JSON_ARGS,
    TEE_VARIABLE,
    claude_stream_json_spec,
)
from realagents.conftest import GRACE_S, Harness, record, skip_or_fail
from realagents.fake_model import PERMISSION_COMMAND, SHELL_COMMAND, FakeModel
from supervisor import open_supervisor

pytestmark = pytest.mark.real_process

KEY = CLAUDE_STREAM_JSON.key
#: Whole-test bound: start (~0.5 s), three turns, a possible kill ladder and respawn.
BOUND_S = 60.0
#: How long a tool process may take to vanish after the receipt before we call it leaked.
TOOL_GONE_S = 1.0
#: psutil sampling period: there is no event for "a process appeared" or "never started".
SAMPLE_S = 0.02
#: How long the shell command has run when the test cancels it.
RUNNING_FOR_S = 1.0
#: How soon after the cancel the CLI must have hung up on the model's stream.
MODEL_GONE_S = 1.0
PERMISSION_MARKER = "permission-command-ran"  # the file PERMISSION_COMMAND touches first
RESUME_MARKER = "marker-7f3a9"  # in the turn before the kill: the resumed session must know it
KILLED_MARKER = "marker-k1113"  # in the killed turn's prompt: kept or not, reported


@pytest.fixture(scope="module")
def claude_install() -> install.Installed:
    try:
        return install.ensure(CLAUDE_STREAM_JSON.package)
    except install.Unavailable as exc:
        skip_or_fail(f"{KEY} is not available: {exc}")
        raise  # not reached


@pytest.fixture(scope="module", autouse=True)
def _summary_hook(request: pytest.FixtureRequest) -> None:
    """The table is printed by ``realagents/conftest.py``'s terminal summary hook, which pytest
    loads only when it walks into ``tests/realagents/``: register it when this file runs alone."""
    plugins = request.config.pluginmanager
    if not plugins.is_registered(realagents_conftest):
        plugins.register(realagents_conftest, "realagents-tier4-summary")


@pytest.fixture
def open_claude(claude_install: install.Installed, tmp_path: Path) -> Any:
    """``async with open_claude(grace_s=..., keep_bodies=...) as h:``"""
    return lambda **options: claude_session(tmp_path, claude_install, **options)


@asynccontextmanager
async def claude_session(
    root: Path, installed: install.Installed, *, grace_s: float = GRACE_S, keep_bodies: bool = False
) -> AsyncIterator[Harness]:
    """Like ``realagents.conftest.real_agent_session``, with the ``claude`` protocol."""
    agent = CLAUDE_STREAM_JSON
    with netns.open_namespace() as namespace:
        if not realagents_conftest._namespace_note:  # the table's "network namespace:" line
            realagents_conftest._namespace_note.append(
                f"none ({netns.unavailable_reason()})"
                if namespace is None
                else f"loopback-only, per test ({'unshare -rn' if namespace.user else 'unshare -n'} + nsenter)"
            )
        listener = namespace.listener if namespace is not None else None
        with FakeModel(listener, keep_bodies=keep_bodies) as model:
            prepared = agent.prepare(installed.argv, root, model.base_url)
            tee = root / "wire" if os.environ.get(TEE_VARIABLE) == "1" else None
            spec = claude_stream_json_spec(prepared, grace_s=grace_s, tee_dir=tee)
            if namespace is not None:
                spec = spec.with_options(command=tuple(namespace.wrap(list(spec.command))))
            async with open_supervisor(agents={KEY: spec}) as sup:
                started = time.monotonic()
                session = await sup.start_session(KEY)
                ready_s = time.monotonic() - started
                recorder = Recorder(session)
                async with trio.open_nursery() as nursery:
                    await nursery.start(recorder.run)
                    yield Harness(
                        agent, session, recorder, model, prepared, ready_s, namespace is not None
                    )
                    await recorder.catch_up()
                    recorder.check_invariants()
                    # The adapter understood every line the CLI wrote, and the CLI every request.
                    assert recorder.of_kind("error") == [], recorder.of_kind("error")
                    assert recorder.of_kind("agent.unparsed") == [], recorder.of_kind(
                        "agent.unparsed"
                    )
                    nursery.cancel_scope.cancel()


def row(h: Harness, scenario: str, receipt: Any, **extra: Any) -> None:
    """One row of the tier-4 table (plus fields only the JSON file shows)."""
    notes = [
        f"stop_reason={receipt.stop_reason}",
        f"escalation={','.join(receipt.escalation)}",
        *extra.pop("notes", []),
    ]
    unparsed = sorted(
        {
            f"{e.raw.get('type')}/{e.raw.get('subtype') or (e.raw.get('event') or {}).get('type')}"
            for e in h.recorder.of_kind("agent.unparsed")
            if isinstance(e, ev.AgentUnparsed) and isinstance(e.raw, dict)
        }
    )
    if unparsed:
        notes.append(f"unparsed={','.join(unparsed)}")
    package = install.PACKAGES[CLAUDE_STREAM_JSON.package]
    record(
        agent=KEY,
        install=f"{package.npm}@{package.version}",
        scenario=scenario,
        outcome=receipt.outcome,
        elapsed_ms=receipt.elapsed_ms,
        ready_s=round(h.ready_s, 1),
        namespace=h.namespace,
        notes=" ".join(notes),
        **extra,
    )


async def second_prompt_completes(h: Harness) -> ev.TurnEnded:
    """(d): the session takes a new prompt after the cancel, and it completes."""
    turn = await h.session.prompt("quick")
    ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.outcome, ended.stop_reason) == ("completed", "completed"), (
        ended,
        h.model.describe(),
    )
    return ended


async def sample_until(check: Any) -> Any:
    """Call ``check()`` every SAMPLE_S until it returns something truthy (bounded by the caller)."""
    while not (found := check()):
        await trio.sleep(SAMPLE_S)
    return found


async def approve_permissions(h: Harness, turn_id: str, approved: list[str]) -> None:
    """Answer every permission request of the turn "allow", as a person would."""
    seen = 0
    while True:
        requested = await h.recorder.wait_kind(
            "permission.requested", turn_id=turn_id, count=seen + 1
        )
        seen += 1
        assert isinstance(requested, ev.PermissionRequested)
        option = next(o for o in requested.options if o.option_kind == "allow_once")
        approved.append(requested.tool_call.get("rawInput", {}).get("command", "?"))
        await h.session.respond_permission(requested.request_id, option.option_id)


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
            turn = await h.session.prompt("stream")
            stream = await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
            await h.recorder.wait_kind("message.delta", turn_id=turn.id)
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            gone = await h.model.wait_for(
                lambda e: e.id == stream.id and e.ended_at is not None, timeout=30
            )
            model_gone_ms = (
                round((gone.disconnected_at - cancelled_at) * 1000, 1)
                if gone.disconnected_at
                else None
            )
            row(h, "stream", receipt, model_gone_ms=model_gone_ms)
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "aborted_streaming", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            assert gone.disconnected_at is not None, f"stream not abandoned:\n{h.model.describe()}"
            assert gone.disconnected_at - cancelled_at < MODEL_GONE_S, h.model.describe()
            assert gone.tokens_sent < 200, "the stream ran to its end"

            await second_prompt_completes(h)
            # Nothing streamed again for the cancelled turn: the only token stream is ours.
            streams = h.model.find(lambda e: e.streaming_tokens)
            assert [e.id for e in streams] == [stream.id], h.model.describe()


async def test_cancel_while_bash_runs(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            assert h.tool_processes(SHELL_COMMAND) == []
            approved: list[str] = []
            async with trio.open_nursery() as nursery:
                turn = await h.session.prompt("shell")
                # Claude asks before every Bash command here (no settings are read at all).
                nursery.start_soon(approve_permissions, h, turn.id, approved)
                tools = await sample_until(lambda: h.tool_processes("tail -f /dev/null"))
                seen_at = trio.current_time()
                nursery.cancel_scope.cancel()
            # Stop a command that has been running for a while, as a person would.
            await trio.sleep_until(seen_at + RUNNING_FOR_S)
            watched = list({p.pid: p for t in tools for p in [t, *_family(t)]}.values())
            [cli] = [p for p in psutil.Process().children(recursive=True) if _is_cli(p)]
            own_session = all(_sid(p) not in (None, _sid(cli)) for p in watched)
            receipt = await h.session.cancel()
            alive_at_receipt = [p for p in watched if _alive(p)]
            gone_ms = await time_until_gone(watched, TOOL_GONE_S)
            still = [p for p in watched if _alive(p)]
            killed = receipt.details.get("tool_processes_killed", [])
            row(
                h,
                "shell",
                receipt,
                notes=[
                    f"approved={len(approved)}",
                    f"tool_procs={len(watched)} tool_own_session={own_session}",
                    f"tool_alive_at_receipt={len(alive_at_receipt)}/{len(watched)}",
                    f"supervisor_killed={len(killed)}",
                ]
                + ([f"tool_gone_after_receipt_ms={gone_ms}"] if alive_at_receipt else []),
                tools_killed=killed,
            )
            assert receipt.turn_id == turn.id
            assert approved == [SHELL_COMMAND], approved
            # The hard case: the shell is not in the CLI's session, so no process-group kill of
            # the CLI reaches it (shared/protocols.md section 3, "Escape and SIGINT").
            assert own_session, [(p.pid, _sid(p), _cmd(p)) for p in watched]
            # Terminate-then-respond: the receipt comes after the tool is gone, whether the CLI
            # killed it or the supervisor had to (then the receipt says tools_killed).
            assert alive_at_receipt == [], (
                f"receipt {receipt.outcome!r} ({receipt.escalation}) while the tool still ran:"
                f" {[(p.pid, _cmd(p)) for p in alive_at_receipt]}"
            )
            assert still == [], f"the tool still runs: {[(p.pid, _cmd(p)) for p in still]}"
            assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "aborted_tools"), receipt
            assert receipt.escalation in (["interrupt"], ["interrupt", "tools_killed"]), receipt
            assert receipt.elapsed_ms < GRACE_S * 1000 + 2000  # + the sweep's settle/term
            await second_prompt_completes(h)
            assert h.tool_processes("tail -f /dev/null") == []
            # The command never finished as far as the model heard.
            results = [e.tool_result for e in h.model.snapshot() if e.tool_result]
            assert all(not r.get("output", "").startswith("Exit code 124") for r in results)


async def watch_for(h: Harness, needle: str, seen: list[psutil.Process]) -> None:
    """Until cancelled: remember every process running ``needle`` in the work folder."""
    while True:
        seen.extend(p for p in h.tool_processes(needle) if p not in seen)
        await trio.sleep(SAMPLE_S)


async def test_cancel_with_pending_permission(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            marker = h.work / PERMISSION_MARKER
            seen: list[psutil.Process] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_for, h, "29.3", seen)
                turn = await h.session.prompt("permission")
                requested = await h.recorder.wait_kind("permission.requested", turn_id=turn.id)
                assert isinstance(requested, ev.PermissionRequested)
                assert requested.tool_call["rawInput"]["command"] == PERMISSION_COMMAND
                receipt = await h.session.cancel()
                row(h, "permission", receipt)
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                assert receipt.escalation == ["interrupt", "permissions_cancelled"], receipt
                assert receipt.stop_reason in ("aborted_tools", "aborted_streaming"), receipt
                assert receipt.elapsed_ms < GRACE_S * 1000
                resolved = [
                    e
                    for e in h.recorder.of_kind("permission.resolved")
                    if isinstance(e, ev.PermissionResolved) and e.request_id == requested.request_id
                ]
                assert [(e.outcome, e.by) for e in resolved] == [("cancelled", "supervisor")]
                await second_prompt_completes(h)
                nursery.cancel_scope.cancel()
            assert not marker.exists(), "the command ran although its permission was cancelled"
            assert seen == [], f"the command ran: {[p.info for p in seen]}"
            assert not any(
                "exit code: 0" in str(e.tool_result).lower() for e in h.model.snapshot()
            ), h.model.describe()


async def test_killed_turn_resumes_session(open_claude: Any) -> None:
    """(e) A turn that does not end within the grace (none at all here) is killed with the CLI's
    whole tree; the CLI is started again with ``--resume <session_id>`` and keeps the history."""
    with trio.fail_after(BOUND_S):
        async with open_claude(grace_s=0.0, keep_bodies=True) as h:
            first = await h.session.prompt(f"quick: remember {RESUME_MARKER}")
            await h.recorder.wait_kind("turn.ended", turn_id=first.id)
            session_id = _inits(h)[0]["session_id"]
            turn = await h.session.prompt(f"stream, and remember {KILLED_MARKER}")
            stream = await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
            tree = [p for p in psutil.Process().children(recursive=True) if not _is_holder(p)]
            [old_cli] = [p for p in tree if _is_cli(p)]
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            _, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(tree, timeout=5))
            gone = await h.model.wait_for(lambda e: e.id == stream.id and e.ended_at is not None)
            model_gone_ms = (
                round((gone.disconnected_at - cancelled_at) * 1000, 1)
                if gone.disconnected_at
                else None
            )
            # Where the time went: the old CLI's exit on SIGTERM, then the new one's start.
            states = [
                e for e in h.recorder.of_kind("session.state") if isinstance(e, ev.SessionState)
            ]
            asked = next(e.timestamp for e in states if e.state == "cancelling")
            exited = next(e.timestamp for e in h.recorder.of_kind("agent.exited"))
            ready = next(e.timestamp for e in states if e.state == "ready" and e.timestamp > exited)
            row(
                h,
                "kill",
                receipt,
                model_gone_ms=model_gone_ms,
                notes=[
                    f"resumed={receipt.resumed}",
                    f"cli_exit_ms={(exited - asked) * 1000:.0f}",
                    f"respawn_ready_ms={(ready - exited) * 1000:.0f}",
                ],
            )
            assert (receipt.outcome, receipt.turn_id) == ("killed", turn.id), receipt
            assert receipt.escalation[:3] == ["interrupt", "grace_expired", "sigterm"], receipt
            assert receipt.escalation[-2:] == ["respawned", "resumed"], receipt
            assert receipt.resumed is True, receipt
            assert alive == [], f"still alive: {alive}"
            assert gone.disconnected_at is not None, h.model.describe()

            # The new CLI was started with --resume <the session id from system/init>.
            [new_cli] = [
                p for p in psutil.Process().children(recursive=True) if _is_cli(p) and _alive(p)
            ]
            assert new_cli.pid != old_cli.pid
            argv = new_cli.cmdline()
            assert argv[-2:] == ["--resume", session_id], argv

            await second_prompt_completes(h)
            inits = _inits(h)
            assert {i["session_id"] for i in inits} == {session_id}, inits
            errors = [e for e in h.recorder.of_kind("error") if isinstance(e, ev.ErrorEvent)]
            assert not [e for e in errors if e.code in ("resume_mismatch", "agent_session_changed")]
            # The resumed session still knows the turn before the killed one.
            [last] = h.model.find(lambda e: e.scenario == "quick" and e.has_tools)[-1:]
            history = json.dumps(last.body)
            assert RESUME_MARKER in history, "the resumed session lost its history"
            realagents_conftest.results[-1]["notes"] += (
                f" killed_prompt_kept={KILLED_MARKER in history}"
            )


async def time_until_gone(procs: list[psutil.Process], bound: float) -> float | None:
    """Milliseconds until none of ``procs`` is alive (sampled), or None after ``bound`` s."""
    start = trio.current_time()
    with trio.move_on_after(bound):
        while any(_alive(p) for p in procs):
            await trio.sleep(SAMPLE_S / 4)
        return round((trio.current_time() - start) * 1000, 1)
    return None


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


def _is_holder(proc: psutil.Process) -> bool:
    try:
        return "netns.py" in " ".join(proc.cmdline())
    except psutil.Error:
        return True


def _family(proc: psutil.Process) -> list[psutil.Process]:
    """The tool's shell (its parent) and its children: everything that runs the command."""
    found = []
    try:
        found.extend(proc.children(recursive=True))
        parent = proc.parent()
        if parent is not None and "tail -f /dev/null" in " ".join(parent.cmdline()):
            found.append(parent)
    except psutil.Error:
        pass
    return found


def _sid(proc: psutil.Process) -> int | None:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:120]
    except psutil.Error:
        return "?"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
