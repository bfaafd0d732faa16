"""Tier 4: the real ``opencode serve`` under the supervisor (protocol ``opencode``), against a fake model.

The native binary of npm ``opencode-ai@1.18.33`` (installed by ``tests/realagents/install.py``,
key ``opencode``; skipped with the reason when that is impossible, a failure under
``AGENT_SUPERVISOR_STRICT_SKIPS=1``), with a fresh ``HOME`` per test and the same
``opencode.json`` as ``opencode acp`` (``tests/realagents/agents.py``: model ``fake/fake-model``
on the chat-completions stream of ``tests/realagents/fake_model.py``; bash asks first, except
for :data:`SHELL_COMMAND`). The same scenarios as ``test_real_acp_agents.py``:

(a) cancel while the model streams: receipt ``cancelled`` (``aborted``), the server hung up on
    the model, and it has a password of its own (any other client gets 401);
(b) cancel while a long shell command runs (allowed without asking by the config): after the
    receipt no process of the command is alive;
(c) cancel while a permission request is pending (``permission.asked``): the command never runs,
    and the request is answered ``reject`` by the supervisor;
(d) after each, a ``quick`` prompt completes;
(e) a turn that outlives its grace (0 s here) is killed with the server's whole tree, a new
    server started, the session found again with ``GET /session/{id}``, and the next turn's
    request to the model still holds the conversation from before the kill.

Every test also checks that the adapter understood every event the server sent (no
``agent.unparsed``) and saw no protocol error (no ``error`` event).

The server listens on 127.0.0.1 of its loopback-only network namespace, where the supervisor
cannot reach it: :func:`bridge` (this file run as a script) starts it there and relays its port
to one of ours (so the kill ladder's SIGTERM reaches the bridge first; the tree kill takes the
server with it). Real clock, generous bounds. The cancel latencies go into the tier-4 table at the
end of the run (and ``.cache/tier4-results.json``) as agent ``opencode-serve``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from test_opencode_process import (
    assert_refused_without_the_password,
    assert_secret_nowhere,
    listening_url,
    server_password,
    stderr_lines,
)

from helpers import Recorder
from protocols import events as ev
from realagents import conftest as realagents_conftest
from realagents import install, netns
from realagents.agents import AGENTS
from realagents.conftest import GRACE_S, Harness, record, skip_or_fail
from realagents.fake_model import PERMISSION_COMMAND, SHELL_COMMAND, FakeModel
from supervisor import AgentSpec, open_supervisor

pytestmark = [
    pytest.mark.real_process,
    pytest.mark.skipif(sys.platform != "linux", reason="the npm package's binary is linux-x64"),
]

KEY = "opencode-serve"  # its rows in the tier-4 table
AGENT = AGENTS["opencode"]  # the same package and setup as ``opencode acp``
#: Whole-test bound: start (3-10 s here), three turns, a possible kill ladder and respawn.
BOUND_S = 120.0
#: How long a tool process may take to vanish after the receipt before we call it leaked.
TOOL_GONE_S = 1.0
#: psutil sampling period: there is no event for "a process appeared" or "never started".
SAMPLE_S = 0.02
#: How long the shell command has run when the test cancels it.
RUNNING_FOR_S = 1.0
#: How soon after the cancel the server must have hung up on the model's stream.
MODEL_GONE_S = 1.0
PERMISSION_MARKER = "permission-command-ran"  # the file PERMISSION_COMMAND touches first
RESUME_MARKER = "marker-7f3a9"  # in the turn before the kill: the resumed session must know it
KILLED_MARKER = "marker-k1113"  # in the killed turn's prompt: kept or not, reported


@pytest.fixture(scope="module")
def opencode_install() -> install.Installed:
    try:
        return install.ensure(AGENT.package)
    except install.Unavailable as exc:
        skip_or_fail(f"opencode-ai is not available: {exc}")
        raise  # not reached


@pytest.fixture(scope="module", autouse=True)
def _summary_hook(request: pytest.FixtureRequest) -> None:
    """The table is printed by ``realagents/conftest.py``'s terminal summary hook, which pytest
    loads only when it walks into ``tests/realagents/``: register it when this file runs alone."""
    plugins = request.config.pluginmanager
    if not plugins.is_registered(realagents_conftest):
        plugins.register(realagents_conftest, "realagents-tier4-summary")


@pytest.fixture
def open_serve(opencode_install: install.Installed, tmp_path: Path) -> Any:
    """``async with open_serve(grace_s=..., keep_bodies=...) as h:``"""
    return lambda **options: serve_session(tmp_path, opencode_install, **options)


@asynccontextmanager
async def serve_session(
    root: Path, installed: install.Installed, *, grace_s: float = GRACE_S, keep_bodies: bool = False
) -> AsyncIterator[Harness]:
    """Like ``realagents.conftest.real_agent_session``, with ``opencode serve`` and the bridge."""
    with netns.open_namespace() as namespace:
        if not realagents_conftest._namespace_note:  # the table's "network namespace:" line
            realagents_conftest._namespace_note.append(
                f"none ({netns.unavailable_reason()})"
                if namespace is None
                else f"loopback-only, per test ({'unshare -rn' if namespace.user else 'unshare -n'} + setns bridge)"
            )
        # Entering a user namespace's network needs its privileges: only a root-made one.
        isolated = namespace is not None and not namespace.user
        with FakeModel(
            namespace.listener if isolated and namespace else None, keep_bodies=keep_bodies
        ) as model:
            prepared = AGENT.prepare(installed.argv, root, model.base_url)
            command = [*installed.argv, "serve"]
            if isolated and namespace is not None:
                command = [sys.executable, __file__, "bridge", namespace.path, "--", *command]
            spec = AgentSpec(
                name=KEY,
                protocol="opencode",
                command=tuple(command),
                env=prepared.env,
                cwd=os.fspath(prepared.cwd),
                grace_s=grace_s,
                kill_timeout_s=1.0,
                start_timeout_s=90.0,
            )
            async with open_supervisor(agents={KEY: spec}) as sup:
                started = time.monotonic()
                session = await sup.start_session(KEY)
                ready_s = time.monotonic() - started
                recorder = Recorder(session)
                async with trio.open_nursery() as nursery:
                    await nursery.start(recorder.run)
                    yield Harness(AGENT, session, recorder, model, prepared, ready_s, isolated)
                    await recorder.catch_up()
                    recorder.check_invariants()
                    # The adapter understood every event the server sent, and no request failed.
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
    package = install.PACKAGES[AGENT.package]
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


def texts_of(h: Harness, turn_id: str) -> str:
    return "".join(
        e.text
        for e in h.recorder.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta) and e.turn_id == turn_id
    )


async def second_prompt_completes(h: Harness) -> None:
    """(d): the session takes a new prompt after the cancel, and it completes."""
    turn = await h.session.prompt("quick")
    ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.outcome, ended.stop_reason) == ("completed", "stop"), (ended, h.model.describe())
    assert texts_of(h, turn.id) == "Quick answer from the fake model."


async def sample_until(check: Any) -> Any:
    """Call ``check()`` every SAMPLE_S until it returns something truthy (bounded by the caller)."""
    while not (found := check()):
        await trio.sleep(SAMPLE_S)
    return found


async def test_cancel_while_streaming(open_serve: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_serve() as h:
            turn = await h.session.prompt("stream")
            stream = await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
            await h.recorder.wait_kind("message.delta", turn_id=turn.id)
            tree = psutil.Process().children(recursive=True)
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel(reason="tier 4")
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
            assert (receipt.escalation, receipt.stop_reason) == (["interrupt"], "aborted"), receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            # The server really stopped calling the model, not just said so.
            assert gone.disconnected_at is not None, f"stream not abandoned:\n{h.model.describe()}"
            assert gone.disconnected_at - cancelled_at < MODEL_GONE_S, h.model.describe()
            assert gone.tokens_sent < 200, "the stream ran to its end"
            assert all(_alive(p) for p in tree)  # stopped in-band: nothing killed
            # The server has a password of its own: nothing but our link can drive it.
            password = server_password(tree)
            await assert_refused_without_the_password(listening_url(h.recorder), password)

            await second_prompt_completes(h)
            # Nothing streamed again for the cancelled turn: the only token stream is ours.
            streams = h.model.find(lambda e: e.streaming_tokens)
            assert [e.id for e in streams] == [stream.id], h.model.describe()
            assert not any("server is unsecured" in line for line in stderr_lines(h.recorder))
            assert_secret_nowhere(password, h.recorder, repr(receipt))


async def test_cancel_while_shell_runs(open_serve: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_serve() as h:
            assert h.tool_processes(SHELL_COMMAND) == []
            turn = await h.session.prompt("shell")
            # The config allows SHELL_COMMAND without asking (asserted at the end: no request).
            tools = await sample_until(lambda: h.tool_processes("tail -f /dev/null"))
            seen_at = trio.current_time()
            # Stop a command that has been running for a while, as a person would.
            await trio.sleep_until(seen_at + RUNNING_FOR_S)
            watched = list({p.pid: p for t in tools for p in [t, *_family(t)]}.values())
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
                    f"tool_procs={len(watched)}",
                    f"tool_alive_at_receipt={len(alive_at_receipt)}/{len(watched)}",
                    f"supervisor_killed={len(killed)}",
                ]
                + ([f"tool_gone_after_receipt_ms={gone_ms}"] if alive_at_receipt else []),
                tools_killed=killed,
            )
            assert receipt.turn_id == turn.id
            # Terminate-then-respond: the receipt comes after the tool is gone, whether the
            # server killed it or the supervisor had to (then the receipt says tools_killed).
            assert alive_at_receipt == [], (
                f"receipt {receipt.outcome!r} ({receipt.escalation}) while the tool still ran:"
                f" {[(p.pid, _cmd(p)) for p in alive_at_receipt]}"
            )
            assert still == [], f"the tool still runs: {[(p.pid, _cmd(p)) for p in still]}"
            assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "aborted"), receipt
            assert receipt.escalation in (["interrupt"], ["interrupt", "tools_killed"]), receipt
            assert receipt.elapsed_ms < GRACE_S * 1000 + 2000  # + the sweep's settle/term
            assert h.recorder.of_kind("permission.requested") == []
            calls = [
                e
                for e in h.recorder.of_kind("tool.call")
                if isinstance(e, ev.ToolCall) and e.turn_id == turn.id
            ]
            assert [c.tool_kind for c in calls] == ["execute"], calls
            await second_prompt_completes(h)
            assert h.tool_processes("tail -f /dev/null") == []
            # The loop never went back to the model with the killed command's result.
            assert [e for e in h.model.snapshot() if e.tool_result] == [], h.model.describe()


async def watch_for(h: Harness, needle: str, seen: list[psutil.Process]) -> None:
    """Until cancelled: remember every process running ``needle`` in the work folder."""
    while True:
        seen.extend(p for p in h.tool_processes(needle) if p not in seen)
        await trio.sleep(SAMPLE_S)


async def test_cancel_with_pending_permission(open_serve: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_serve() as h:
            marker = h.work / PERMISSION_MARKER
            seen: list[psutil.Process] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_for, h, "29.3", seen)
                turn = await h.session.prompt("permission")
                requested = await h.recorder.wait_kind("permission.requested", turn_id=turn.id)
                assert isinstance(requested, ev.PermissionRequested)
                assert requested.tool_call["permission"] == "bash", requested
                assert requested.tool_call["title"] == PERMISSION_COMMAND, requested
                receipt = await h.session.cancel()
                row(h, "permission", receipt)
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                assert receipt.escalation == ["interrupt", "permissions_cancelled"], receipt
                # The abort and the reject go out together; either may end the turn first
                # (both seen here: protocols/opencode.py).
                assert receipt.stop_reason in ("aborted", "permission_rejected"), receipt
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
            # The loop never went back to the model with the call's result.
            assert [e for e in h.model.snapshot() if e.tool_result] == [], h.model.describe()


async def test_killed_turn_resumes_session(open_serve: Any) -> None:
    """(e) A turn that does not end within the grace (none at all here) is killed with the
    server's whole tree; a new server finds the session again and keeps its history."""
    with trio.fail_after(BOUND_S):
        async with open_serve(grace_s=0.0, keep_bodies=True) as h:
            first = await h.session.prompt(f"quick: remember {RESUME_MARKER}")
            await h.recorder.wait_kind("turn.ended", turn_id=first.id)
            turn = await h.session.prompt(f"stream, and remember {KILLED_MARKER}")
            stream = await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
            tree = [p for p in psutil.Process().children(recursive=True) if not _is_holder(p)]
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            _, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(tree, timeout=5))
            gone = await h.model.wait_for(lambda e: e.id == stream.id and e.ended_at is not None)
            model_gone_ms = (
                round((gone.disconnected_at - cancelled_at) * 1000, 1)
                if gone.disconnected_at
                else None
            )
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

            await second_prompt_completes(h)
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


def _is_holder(proc: psutil.Process) -> bool:
    try:
        return "netns.py" in " ".join(proc.cmdline())
    except psutil.Error:
        return True


def _family(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return "?"


# --- The namespace bridge (run as a script: ``python test_real_opencode_serve.py bridge ...``) ---


def bridge(argv: list[str]) -> int:
    """``bridge NETNS -- COMMAND...``: run COMMAND in the network namespace NETNS (a path like
    ``/proc/PID/ns/net``) and relay the HTTP server it announces to a port of ours.

    The relay's listening socket is made before we enter the namespace, so it stays in ours
    (a socket belongs to the namespace it was created in); everything after, the command and
    the relay's connections to it, is in NETNS. The ``listening on`` line is rewritten to name
    the relay. Bytes are copied as they come, so the event stream is not held back.
    """
    import ctypes
    import re
    import socket
    import subprocess
    import threading

    netns_path, separator, *command = argv
    assert separator == "--" and command, "usage: bridge NETNS -- COMMAND..."
    relay = socket.create_server(("127.0.0.1", 0))
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns_path, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns {netns_path}")
    os.close(fd)
    child = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert child.stdout is not None

    def copy(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve(port: int) -> None:
        while True:
            incoming, _ = relay.accept()
            try:
                outgoing = socket.create_connection(("127.0.0.1", port))
            except OSError:
                incoming.close()
                continue
            for pair in ((incoming, outgoing), (outgoing, incoming)):
                threading.Thread(target=copy, args=pair, daemon=True).start()

    listening = re.compile(rb"listening on http://[^\s:/]+:(\d+)")
    relayed = False
    for line in child.stdout:
        match = listening.search(line)
        if match is not None and not relayed:
            relayed = True
            threading.Thread(target=serve, args=(int(match.group(1)),), daemon=True).start()
            ours = f"listening on http://127.0.0.1:{relay.getsockname()[1]}".encode()
            line = line[: match.start()] + ours + line[match.end() :]
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__" and sys.argv[1:2] == ["bridge"]:
    sys.exit(bridge(sys.argv[2:]))
