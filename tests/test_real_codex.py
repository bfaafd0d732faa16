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
    (``tests/test_schemas.py``): what we send, and what the real server sends.

Every test checks that the adapter saw no protocol error; notifications it does not classify
(``agent.unparsed``) must be among :data:`UNCLASSIFIED` (a gap in the adapter, reported).

Real clock, generous bounds. Receipt latencies go into the tier-4 table at the end of the run
(and ``.cache/tier4-results.json``) as agent ``codex-app-server``. ``AGENT_TIER4_TEE=1`` logs
every line of every test (not only (f)) under the test's tmp folder (``wire/wire.log``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from helpers import Recorder
from protocols import events as ev
from realagents import conftest as realagents_conftest
from realagents import install, netns
from realagents.agents import (
    CODEX_APP_SERVER,
    TEE_VARIABLE,
    codex_app_server_spec,
    codex_enable_features,
)
from realagents.conftest import GRACE_S, Harness, record, skip_or_fail
from realagents.fake_model import PERMISSION_COMMAND, SHELL_COMMAND, FakeModel
from supervisor import open_supervisor

pytestmark = pytest.mark.real_process

KEY = CODEX_APP_SERVER.key
#: Whole-test bound: start (~0.3 s), three turns, a possible kill ladder and respawn.
BOUND_S = 60.0
#: How long a tool process may take to vanish after the receipt before we call it leaked.
TOOL_GONE_S = 1.0
#: psutil sampling period: there is no event for "a process appeared" or "never started".
SAMPLE_S = 0.02
#: How long the shell command has run when the test cancels it.
RUNNING_FOR_S = 1.0
#: How soon after the cancel the server must have hung up on the model's stream.
MODEL_GONE_S = 1.0
PERMISSION_MARKER = "permission-command-ran"  # the file PERMISSION_COMMAND touches first
RESUME_MARKER = "marker-7f3a9"  # in the turn before the kill: the resumed thread must know it
KILLED_MARKER = "marker-k1113"  # in the killed turn's prompt: kept or not, reported
#: Server notifications of 0.171.0 seen here that the adapter passes on as ``agent.unparsed``
#: (it neither classifies them as session info nor ignores them): valid ServerNotifications
#: ((f) checks), harmless, but every session shows some. Others may appear; they are listed in
#: the table's notes. An unparsed *request or response* fails the test.
UNCLASSIFIED = frozenset(
    {"remoteControl/status/changed", "thread/readState/changed", "thread/goal/cleared"}
)


@pytest.fixture(scope="module")
def codex_install() -> install.Installed:
    try:
        return install.ensure(CODEX_APP_SERVER.package)
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
def open_codex(codex_install: install.Installed, tmp_path: Path) -> Any:
    """``async with open_codex(grace_s=..., keep_bodies=..., tee=..., features=...) as h:``"""
    return lambda **options: codex_session(tmp_path, codex_install, **options)


@asynccontextmanager
async def codex_session(
    root: Path,
    installed: install.Installed,
    *,
    grace_s: float = GRACE_S,
    keep_bodies: bool = False,
    tee: bool = False,
    features: tuple[str, ...] = (),
    clean: bool = True,
) -> AsyncIterator[Harness]:
    """Like ``realagents.conftest.real_agent_session``, with the ``codex`` protocol.

    ``features``: extra ``[features]`` flags of ``config.toml``; ``clean=False`` skips the
    end-of-test checks (no error, only notifications unparsed), for a control experiment that
    shows what goes wrong without one of the adapter's steps."""
    agent = CODEX_APP_SERVER
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
            codex_enable_features(prepared, *features)
            tee_dir = root / "wire" if tee or os.environ.get(TEE_VARIABLE) == "1" else None
            spec = codex_app_server_spec(prepared, grace_s=grace_s, tee_dir=tee_dir)
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
                    if not clean:
                        nursery.cancel_scope.cancel()
                        return
                    assert recorder.of_kind("error") == [], recorder.of_kind("error")
                    # Only notifications may go unparsed (the adapter answers every request).
                    odd = [
                        e.raw
                        for e in recorder.of_kind("agent.unparsed")
                        if isinstance(e, ev.AgentUnparsed)
                        and not (isinstance(e.raw, dict) and "id" not in e.raw)
                    ]
                    assert odd == [], f"unparsed requests or responses: {odd}"
                    nursery.cancel_scope.cancel()


def row(h: Harness, scenario: str, receipt: Any, **extra: Any) -> None:
    """One row of the tier-4 table (plus fields only the JSON file shows)."""
    notes = [
        f"stop_reason={receipt.stop_reason}",
        f"escalation={','.join(receipt.escalation)}",
        *(f"{k}={v}" for k, v in sorted(receipt.details.items()) if k != "tool_processes_killed"),
        *extra.pop("notes", []),
    ]
    unparsed = _unparsed_methods(h.recorder)
    if unparsed:
        notes.append(f"unparsed={','.join(sorted(unparsed))}")
    package = install.PACKAGES[CODEX_APP_SERVER.package]
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
    """Answer every approval of the turn "accept" (allow once), as a person would."""
    seen = 0
    while True:
        requested = await h.recorder.wait_kind(
            "permission.requested", turn_id=turn_id, count=seen + 1
        )
        seen += 1
        assert isinstance(requested, ev.PermissionRequested)
        option = next(o for o in requested.options if o.option_kind == "allow_once")
        approved.append(str(requested.tool_call.get("params", {}).get("command")))
        await h.session.respond_permission(requested.request_id, option.option_id)


def test_command_line() -> None:
    """The tier runs the native binary as the app-server, with a strict config."""
    assert CODEX_APP_SERVER.args == ("app-server", "--strict-config")
    package = install.PACKAGES[CODEX_APP_SERVER.package]
    assert (package.npm, package.version) == ("@openai/codex", "0.171.0")
    assert package.entry.endswith("/vendor/x86_64-unknown-linux-musl/bin/codex")


async def test_cancel_while_streaming(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
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
            assert receipt.stop_reason == "interrupted", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.details == {"background_terminals": "cleaned"}, receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            assert gone.disconnected_at is not None, f"stream not abandoned:\n{h.model.describe()}"
            assert gone.disconnected_at - cancelled_at < MODEL_GONE_S, h.model.describe()
            assert gone.tokens_sent < 200, "the stream ran to its end"

            await second_prompt_completes(h)
            # Nothing streamed again for the cancelled turn: the only token stream is ours.
            streams = h.model.find(lambda e: e.streaming_tokens)
            assert [e.id for e in streams] == [stream.id], h.model.describe()


async def test_cancel_while_shell_runs(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            assert h.tool_processes(SHELL_COMMAND) == []
            approved: list[str] = []
            async with trio.open_nursery() as nursery:
                turn = await h.session.prompt("shell")
                # An escalated command (no bubblewrap here): Codex asks; the test says yes.
                nursery.start_soon(approve_permissions, h, turn.id, approved)
                tools = await sample_until(lambda: h.tool_processes("tail -f /dev/null"))
                seen_at = trio.current_time()
                nursery.cancel_scope.cancel()
            # Stop a command that has been running for a while, as a person would.
            await trio.sleep_until(seen_at + RUNNING_FOR_S)
            watched = list({p.pid: p for t in tools for p in [t, *_family(t)]}.values())
            [server] = [p for p in psutil.Process().children(recursive=True) if _is_server(p)]
            in_server_tree = all(_is_descendant(p, server) for p in watched)
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
                    f"tool_procs={len(watched)} in_server_tree={in_server_tree}",
                    f"tool_alive_at_receipt={len(alive_at_receipt)}/{len(watched)}",
                    f"supervisor_killed={len(killed)}",
                ]
                + ([f"tool_gone_after_receipt_ms={gone_ms}"] if alive_at_receipt else []),
                tools_killed=killed,
            )
            assert receipt.turn_id == turn.id
            assert len(approved) == 1 and SHELL_COMMAND in approved[0], approved
            # Terminate-then-respond: the receipt comes after the tool is gone, whether the
            # background-terminal clean stopped it or the supervisor's sweep had to.
            assert alive_at_receipt == [], (
                f"receipt {receipt.outcome!r} ({receipt.escalation}, {receipt.details}) while"
                f" the tool still ran: {[(p.pid, _cmd(p)) for p in alive_at_receipt]}"
            )
            assert still == [], f"the tool still runs: {[(p.pid, _cmd(p)) for p in still]}"
            assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "interrupted"), receipt
            assert receipt.escalation in (["interrupt"], ["interrupt", "tools_killed"]), receipt
            assert receipt.details.get("background_terminals") == "cleaned", receipt
            assert receipt.elapsed_ms < GRACE_S * 1000 + 2000  # + the sweep's settle/term
            await second_prompt_completes(h)
            assert h.tool_processes("tail -f /dev/null") == []
            # The command never finished as far as the model heard.
            results = [e.tool_result for e in h.model.snapshot() if e.tool_result]
            assert all("exit code: 0" not in str(r).lower() for r in results), results


async def watch_for(h: Harness, needle: str, seen: list[psutil.Process]) -> None:
    """Until cancelled: remember every process running ``needle`` in the work folder."""
    while True:
        seen.extend(p for p in h.tool_processes(needle) if p not in seen)
        await trio.sleep(SAMPLE_S)


async def test_cancel_with_pending_approval(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            marker = h.work / PERMISSION_MARKER
            seen: list[psutil.Process] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_for, h, "29.3", seen)
                turn = await h.session.prompt("permission")
                requested = await h.recorder.wait_kind("permission.requested", turn_id=turn.id)
                assert isinstance(requested, ev.PermissionRequested)
                assert requested.tool_call["method"] == "item/commandExecution/requestApproval"
                assert PERMISSION_COMMAND in requested.tool_call["params"]["command"]
                receipt = await h.session.cancel()
                row(h, "permission", receipt)
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                assert receipt.escalation == ["interrupt", "permissions_cancelled"], receipt
                assert receipt.stop_reason == "interrupted", receipt
                assert receipt.elapsed_ms < GRACE_S * 1000
                resolved = [
                    e
                    for e in h.recorder.of_kind("permission.resolved")
                    if isinstance(e, ev.PermissionResolved) and e.request_id == requested.request_id
                ]
                assert [(e.outcome, e.by) for e in resolved] == [("cancelled", "supervisor")]
                await second_prompt_completes(h)
                nursery.cancel_scope.cancel()
            assert not marker.exists(), "the command ran although its approval was cancelled"
            assert seen == [], f"the command ran: {[p.info for p in seen]}"
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
            first = await h.session.prompt(f"quick: remember {RESUME_MARKER}")
            await h.recorder.wait_kind("turn.ended", turn_id=first.id)
            [thread_id] = _thread_ids(h)
            turn = await h.session.prompt(f"stream, and remember {KILLED_MARKER}")
            stream = await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
            tree = [p for p in psutil.Process().children(recursive=True) if not _is_holder(p)]
            [old_server] = [p for p in tree if _is_server(p)]
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            _, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(tree, timeout=5))
            gone = await h.model.wait_for(lambda e: e.id == stream.id and e.ended_at is not None)
            model_gone_ms = (
                round((gone.disconnected_at - cancelled_at) * 1000, 1)
                if gone.disconnected_at
                else None
            )
            # Where the time went: the old server's exit on SIGTERM, then the new one's start.
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
                    f"server_exit_ms={(exited - asked) * 1000:.0f}",
                    f"respawn_ready_ms={(ready - exited) * 1000:.0f}",
                ],
            )
            assert (receipt.outcome, receipt.turn_id) == ("killed", turn.id), receipt
            assert receipt.escalation[:3] == ["interrupt", "grace_expired", "sigterm"], receipt
            assert receipt.escalation[-2:] == ["respawned", "resumed"], receipt
            assert receipt.resumed is True, receipt
            assert alive == [], f"still alive: {alive}"
            assert gone.disconnected_at is not None, h.model.describe()
            [new_server] = [
                p for p in psutil.Process().children(recursive=True) if _is_server(p) and _alive(p)
            ]
            assert new_server.pid != old_server.pid

            await second_prompt_completes(h)
            assert _thread_ids(h) == {thread_id}  # every turn ran in the one thread, resumed
            # The resumed thread still knows the turn before the killed one.
            [last] = h.model.find(lambda e: e.scenario == "quick" and e.has_tools)[-1:]
            history = json.dumps(last.body)
            assert RESUME_MARKER in history, "the resumed thread lost its history"
            realagents_conftest.results[-1]["notes"] += (
                f" killed_prompt_kept={KILLED_MARKER in history}"
            )


async def test_wire_matches_the_schema(open_codex: Any, tmp_path: Path) -> None:
    """(f) Every line between the supervisor and the real server, both ways, against the schema
    the same binary generates: our messages completely (as ``tests/test_schemas.py`` does for the
    goldens), the server's completely too (they are real, nothing is abbreviated)."""
    from test_schemas import load_codex_schema, violations, walk_messages

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
                await sample_until(lambda: h.tool_processes("tail -f /dev/null"))
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
        install="@openai/codex@0.171.0",
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


async def time_until_gone(procs: list[psutil.Process], bound: float) -> float | None:
    """Milliseconds until none of ``procs`` is alive (sampled), or None after ``bound`` s."""
    start = trio.current_time()
    with trio.move_on_after(bound):
        while any(_alive(p) for p in procs):
            await trio.sleep(SAMPLE_S / 4)
        return round((trio.current_time() - start) * 1000, 1)
    return None


def _is_server(proc: psutil.Process) -> bool:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return len(argv) >= 2 and argv[0].endswith("/bin/codex") and argv[1] == "app-server"


def _is_holder(proc: psutil.Process) -> bool:
    try:
        return "netns.py" in " ".join(proc.cmdline())
    except psutil.Error:
        return True


def _is_descendant(proc: psutil.Process, ancestor: psutil.Process) -> bool:
    try:
        return any(p.pid == ancestor.pid for p in proc.parents())
    except psutil.Error:
        return False


def _family(proc: psutil.Process) -> list[psutil.Process]:
    """The tool's shell (its parent, when it runs the command too) and its children."""
    found = []
    try:
        found.extend(proc.children(recursive=True))
        parent = proc.parent()
        if parent is not None and "tail -f /dev/null" in " ".join(parent.cmdline()):
            found.append(parent)
    except psutil.Error:
        pass
    return found


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
