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
    request to the model still holds the conversation from before the kill;
(f) the outside review's case: a cancel right after the first prompt of a fresh server aborts
    it before its first model request, inside the server's model lookup, which stays broken:
    every later prompt fails inside OpenCode, its ``session.error`` coming after the idle. Each
    such turn ends ``failed`` with that error, never ``completed``.

Every test also checks that the adapter understood every event the server sent (no
``agent.unparsed``) and saw no protocol error (no ``error`` event).

The server listens on 127.0.0.1 of its loopback-only network namespace, where the supervisor
cannot reach it: ``tests/realagents/netns_bridge.py`` starts it there and relays its port
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

from opencode_server import (
    assert_refused_without_the_password,
    assert_secret_nowhere,
    listening_url,
    server_password,
    stderr_lines,
)
from paths import TESTS
from protocols import events as ev
from protocols.content import Part, parts_text
from protocols.mcp import McpServer
from realagents import install, scenarios
from realagents.agents import AGENTS
from realagents.conftest import GRACE_S, Harness, noted_namespace, supervised
from realagents.fake_model import PERMISSION_COMMAND, SHELL_COMMAND, FakeModel
from realagents.scenarios import (
    TOOL_LEAF,
    children,
    is_alive,
    ms_after,
)
from supervisor import AgentSpec

pytestmark = [
    pytest.mark.real_process,
    pytest.mark.skipif(sys.platform != "linux", reason="the npm package's binary is linux-x64"),
]

KEY = "opencode-serve"  # its rows in the tier-4 table
#: runs the server in the test's network namespace, relayed to a port of ours
NETNS_BRIDGE = TESTS / "realagents" / "netns_bridge.py"
AGENT = AGENTS["opencode"]  # the same package and setup as ``opencode acp``
#: Whole-test bound: start (3-10 s here), three turns, a possible kill ladder and respawn.
BOUND_S = 120.0
#: Fresh servers (f) may take before its abort lands inside the model lookup (~7 in 8 do).
EARLY_ABORT_ATTEMPTS = 4
#: (f)'s grace: an abort inside the fresh server's model lookup takes effect once the lookup is
#: over, 1-4 s here under eight busy loops: past the default grace (GRACE_S), and a stop taken
#: for a refusal is killed. What (f) looks at comes after the stop; this grace only has to tell
#: a stop from none, with room for a machine far busier than that.
EARLY_ABORT_GRACE_S = 60.0


@pytest.fixture(scope="module")
def opencode_install() -> install.Installed:
    return scenarios.ensure_installed(AGENT.package, "opencode-ai")


@pytest.fixture
def open_serve(opencode_install: install.Installed, tmp_path: Path) -> Any:
    """``async with open_serve(grace_s=..., keep_bodies=..., config=...) as h:``"""
    return lambda **options: serve_session(tmp_path, opencode_install, **options)


@asynccontextmanager
async def serve_session(
    root: Path,
    installed: install.Installed,
    *,
    grace_s: float = GRACE_S,
    keep_bodies: bool = False,
    config: dict[str, Any] | None = None,
    mcp_servers: tuple[McpServer, ...] = (),
) -> AsyncIterator[Harness]:
    """Like ``realagents.conftest.real_agent_session``, with ``opencode serve`` and the bridge;
    ``config``: keys added to the test's ``opencode.json``; ``mcp_servers``: the agent's."""
    with noted_namespace("setns bridge") as namespace:
        # Entering a user namespace's network needs its privileges: only a root-made one.
        isolated = namespace is not None and not namespace.user
        with FakeModel(
            namespace.listener if isolated and namespace else None, keep_bodies=keep_bodies
        ) as model:
            prepared = AGENT.prepare(installed.argv, root, model.base_url)
            if config:
                settings = prepared.cwd / "opencode.json"
                settings.write_text(json.dumps(_merged(json.loads(settings.read_text()), config)))
            command = [*installed.argv, "serve"]
            if isolated and namespace is not None:
                command = [sys.executable, os.fspath(NETNS_BRIDGE), namespace.path, "--", *command]
            spec = AgentSpec(
                name=KEY,
                protocol="opencode",
                command=tuple(command),
                env=prepared.env,
                cwd=os.fspath(prepared.cwd),
                grace_s=grace_s,
                kill_timeout_s=1.0,
                start_timeout_s=90.0,
                mcp_servers=mcp_servers,
            )
            # The adapter must understand every event the server sent, and no request fail.
            async with supervised(
                spec,
                AGENT,
                model,
                prepared,
                isolated,
                catch_up=True,
                checks=scenarios.understood_everything,
            ) as h:
                yield h


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra``'s keys over ``base``'s, objects merged key by key (a model's options added
    to the test's provider keep its URL)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def row(h: Harness, scenario: str, receipt: Any, **extra: Any) -> None:
    """One row of the tier-4 table (plus fields only the JSON file shows)."""
    scenarios.record_receipt(h, KEY, AGENT.package, scenario, receipt, extra)


def texts_of(h: Harness, turn_id: str) -> str:
    return "".join(
        e.text
        for e in h.recorder.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta) and e.turn_id == turn_id
    )


def loop_requests(h: Harness) -> list[Any]:
    """The requests of the agent loop to the model: those that offer tools."""
    return [e for e in h.model.snapshot() if e.has_tools]


async def second_prompt_completes(h: Harness) -> None:
    """(d): the session takes a new prompt after the cancel, and it completes."""
    ended = await scenarios.second_prompt_completes(h, stop_reason="stop")
    assert texts_of(h, ended.turn_id) == "Quick answer from the fake model."


async def test_cancel_while_streaming(open_serve: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_serve() as h:
            turn, stream = await scenarios.streaming(h)
            tree = psutil.Process().children(recursive=True)
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel(reason="tier 4")
            gone = await scenarios.stream_ended(h, stream, timeout=30)
            row(h, "stream", receipt, model_gone_ms=ms_after(cancelled_at, gone.disconnected_at))
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert (receipt.escalation, receipt.stop_reason) == (["interrupt"], "aborted"), receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            # The server really stopped calling the model, not just said so.
            scenarios.assert_stream_abandoned(h, gone, cancelled_at)
            assert all(is_alive(p) for p in tree)  # stopped in-band: nothing killed
            # The server has a password of its own: nothing but our link can drive it.
            password = server_password(tree)
            await assert_refused_without_the_password(listening_url(h.recorder), password)

            await second_prompt_completes(h)
            scenarios.assert_only_stream(h, stream)
            assert not any("server is unsecured" in line for line in stderr_lines(h.recorder))
            assert_secret_nowhere(password, h.recorder, repr(receipt))


async def test_cancel_while_shell_runs(open_serve: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_serve() as h:
            assert h.tool_processes(SHELL_COMMAND) == []
            # The config allows SHELL_COMMAND without asking (asserted at the end: no request).
            turn, tools, _ = await scenarios.shell_running(h)
            watched = list({p.pid: p for t in tools for p in [t, *children(t)]}.values())
            receipt, alive_at_receipt, gone_ms, still = await scenarios.cancel_while_tools_run(
                h, watched
            )
            killed = receipt.details.get("tool_processes_killed", [])
            row(
                h,
                "shell",
                receipt,
                notes=[
                    f"tool_procs={len(watched)}",
                    *scenarios.tool_notes(watched, alive_at_receipt, gone_ms, killed),
                ],
                tools_killed=killed,
            )
            assert receipt.turn_id == turn.id
            scenarios.assert_tools_gone(receipt, alive_at_receipt, still)
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
            assert h.tool_processes(TOOL_LEAF) == []
            # The loop never went back to the model with the killed command's result.
            assert [e for e in h.model.snapshot() if e.tool_result] == [], h.model.describe()


async def test_cancel_with_pending_permission(open_serve: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_serve() as h:
            async with scenarios.permission_pending(h) as (turn, requested):
                assert requested.tool_call["permission"] == "bash", requested
                assert requested.tool_call["title"] == PERMISSION_COMMAND, requested
                receipt = await h.session.cancel()
                row(h, "permission", receipt)
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                scenarios.assert_permissions_cancelled(receipt)
                # The abort and the reject go out together; either may end the turn first
                # (both seen here: protocols/opencode.py).
                assert receipt.stop_reason in ("aborted", "permission_rejected"), receipt
                assert receipt.elapsed_ms < GRACE_S * 1000
                scenarios.assert_cancelled_by_supervisor(h, requested)
                await second_prompt_completes(h)
            # The loop never went back to the model with the call's result.
            assert [e for e in h.model.snapshot() if e.tool_result] == [], h.model.describe()


async def test_killed_turn_resumes_session(open_serve: Any) -> None:
    """(e) A turn that does not end within the grace (none at all here) is killed with the
    server's whole tree; a new server finds the session again and keeps its history."""
    with trio.fail_after(BOUND_S):
        async with open_serve(grace_s=0.0, keep_bodies=True) as h:
            turn, stream, tree = await scenarios.killed_mid_stream(h)
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

            await second_prompt_completes(h)
            scenarios.assert_history_kept(h)


async def test_an_image_in_the_prompt_reaches_the_model(open_serve: Any) -> None:
    """A prompt with an image (``Session.prompt(text, parts)``): ``prompt_async`` gets it as a
    ``file`` part with a ``data:`` URL, and the server passes its bytes to a model configured
    to take images (one that is not gets OpenCode's own "this model does not support image
    input" text in its place: seen here with the test's plain fake model)."""
    image_model = {
        "attachment": True,
        "modalities": {"input": ["text", "image"], "output": ["text"]},
    }
    config = {"provider": {"fake": {"models": {"fake-model": image_model}}}}
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    parts = (
        Part("text", text="quick"),
        Part("image", data=png, mime_type="image/png", uri="file:///w/dot.png"),
    )
    with trio.fail_after(BOUND_S):
        async with open_serve(keep_bodies=True, config=config) as h:
            assert "image" in h.session.prompt_carries
            turn = await h.session.prompt(parts_text(parts), parts)
            ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded)
            assert ended.outcome == "completed", (ended, h.model.describe())
            bodies = [json.dumps(e.body) for e in h.model.snapshot() if e.body is not None]
            assert any(png in body for body in bodies), "the image never reached the model"


async def test_prompts_failing_after_an_early_abort_are_failed(
    opencode_install: install.Installed, tmp_path: Path
) -> None:
    """(f) Seen on 1.18.33: the abort lands before the first model request (the loop goes busy
    and loads its model first; our abort goes out at ``busy``) and leaves that lookup
    interrupted for good. Every later prompt goes busy, idle, and only then comes its
    ``session.error`` ``UnknownError``: the turn must end ``failed`` with it, not
    ``completed`` (the adapter asks ``GET /session/status`` at an idle it cannot judge); and the
    adapter knows that failure after such an abort, so the server is recycled at once (not
    after ``max_failed_turns`` of them) and the next prompt works.

    The title agent is off: it looks the model up beside the loop, and when it does so first the
    abort interrupts only the loop's wait, not the lookup, and nothing breaks. Even so the lookup
    is sometimes over before the abort lands (about one run in eight here: the turn then ends
    ``aborted``, with the model's ``MessageAbortedError``); that is not the case, and it is tried
    again on a fresh server, as is a turn the server ended before it answered the abort."""
    with trio.fail_after(EARLY_ABORT_ATTEMPTS * BOUND_S):
        for attempt in range(EARLY_ABORT_ATTEMPTS):
            async with serve_session(
                tmp_path / f"attempt-{attempt}",
                opencode_install,
                config={"agent": {"title": {"disable": True}}},
                # What is tested is the server after an early abort, not how fast it stops: a
                # loaded machine's slow start must not turn the cancel into a kill.
                grace_s=EARLY_ABORT_GRACE_S,
            ) as h:
                first = await h.session.prompt("quick")
                receipt = await h.session.cancel()  # held until busy, then the abort goes out
                assert receipt.turn_id == first.id, receipt
                # (On a loaded machine the server may answer the abort only once the turn is
                # over: the receipt says so, ``completed``; that is not the case either.)
                assert receipt.outcome in ("cancelled", "completed"), receipt
                # The case: the abort stopped the loop before its processor ran (no word of the
                # abort, and no request of the loop, the only ones with tools, reached the model).
                if (
                    receipt.outcome != "cancelled"
                    or receipt.stop_reason != "idle"
                    or loop_requests(h) != []
                ):
                    continue
                row(h, "early-abort", receipt, notes=[f"attempt={attempt + 1}"])
                turn = await h.session.prompt("quick")
                ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
                assert isinstance(ended, ev.TurnEnded)
                assert (ended.outcome, ended.stop_reason) == ("failed", "error"), (
                    ended,
                    h.model.describe(),
                )
                assert ended.error is not None
                assert ended.error.startswith("UnknownError: "), ended
                assert texts_of(h, turn.id) == ""
                assert loop_requests(h) == [], h.model.describe()  # it never got to the model
                # The error came with its turn (the module's checks: no stray error event). The
                # first such failure recycles the server: a new `opencode serve`, the session
                # resumed, and the next prompt reaches the model and completes.
                recycled = await h.recorder.wait_kind("session.recycled")
                assert isinstance(recycled, ev.SessionRecycled), recycled
                assert "UnknownError" in recycled.reason and recycled.failed_turns == 1
                await h.session.wait_ready()
                again = await h.session.prompt("quick")
                ended = await h.recorder.wait_kind("turn.ended", turn_id=again.id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", (
                    ended,
                    h.model.describe(),
                )
                assert loop_requests(h) != [] and texts_of(h, again.id) != ""
                assert h.session.summary().recycles == 1
                return
    pytest.fail(f"the abort never landed inside the model lookup in {EARLY_ABORT_ATTEMPTS} tries")
