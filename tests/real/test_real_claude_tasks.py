"""Tier 4: Claude Code's background tasks under a cancel, against the real CLI and a fake model.

The setup of ``test_real_claude.py`` (the native binary of ``@anthropic-ai/claude-code@2.1.332``
in stream-json mode, a fresh ``HOME``, a loopback-only network namespace, the fake model of
``tests/realagents/fake_model.py``), with two more scenario words: ``background`` (the model calls
``Bash`` with ``run_in_background: true``, running ``BACKGROUND_COMMAND``) and ``bgagent`` (it
calls ``Agent`` with ``run_in_background: true``; the sub-agent's own requests stream tokens).
The CLI answers either call at once and the task runs on; the model then streams tokens, so the
turn is still running when the test cancels it.

What 2.1.332 does in ``-p --input-format stream-json`` mode (measured; the wire shapes are in
``protocols/claude.py``'s docstring):

- both calls start a task: ``system/task_started`` (``task_type`` ``local_bash``, id ``b`` + 8 of
  ``[0-9a-z]``; or ``local_agent``, id ``a`` + 16 hex digits), and
  ``system/background_tasks_changed`` lists the running background tasks;
- the ``interrupt`` (we declare no ``perTaskStopAffordance``) kills a sub-agent itself, before it
  even acknowledges (``task_updated`` ``killed``, ``task_notification`` ``stopped``), but leaves
  a background shell running;
- ``stop_task {task_id}`` kills a running shell, writes ``task_updated`` ``killed``,
  ``task_notification`` ``stopped`` and ``background_tasks_changed``, then answers success
  ``{}``; a task that is gone is answered success ``{}`` too.

Tests:

1. the raw wire, without the supervisor (the facts the adapter stands on): after the
   interrupt's ``result`` the background shell still runs (watched for ``SPARED_S``) and the CLI
   has reported no end of its task; ``stop_task`` ends it; a second ``stop_task`` is answered
   success; the next turn completes and the CLI exits 0 on stdin EOF;
2. the supervisor cancels a turn while a background shell runs: the adapter's ``stop_task`` makes
   the CLI end the shell before the receipt, which is ``cancelled`` with the escalation
   ``interrupt`` alone and ``details.tasks`` listing the task confirmed and ``stopped``. Had the
   shell outlived the turn, the supervisor's sweep would have killed it and the escalation would
   say ``tools_killed``: that fails here. No process of the task is alive at the receipt; a
   ``quick`` prompt completes;
3. the same with a background sub-agent: the interrupt ends it and its stream to the model, the
   ``stop_task`` is answered success, the receipt lists it ``stopped``.

Real clock, generous bounds; the rows go into the tier-4 table (agent ``claude-stream-json``,
scenarios ``bg-shell``, ``bg-agent``). ``AGENT_TIER4_TEE=1`` logs the supervised wire under the
test's tmp folder (``wire/wire.log``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import test_real_claude
import trio
from test_real_claude import (
    BOUND_S,
    _is_cli,
    _sid,
    approve_permissions,
    row,
    second_prompt_completes,
)

from protocols import events as ev
from realagents import install, netns
from realagents.agents import CLAUDE_STREAM_JSON
from realagents.conftest import GRACE_S, Harness, record
from realagents.fake_model import BACKGROUND_COMMAND, Exchange, FakeModel
from realagents.scenarios import (
    MODEL_GONE_S,
    TOOL_GONE_S,
    cancel_while_tools_run,
    command_of,
    installed_as,
    is_alive,
    ms_after,
    sample_until,
    time_until_gone,
)

pytestmark = pytest.mark.real_process

#: The fixtures of ``test_real_claude.py`` (pytest finds them by these names).
claude_install = test_real_claude.claude_install
open_claude = test_real_claude.open_claude

#: How long the raw test watches the background shell after the interrupt's ``result``, to be
#: sure the interrupt spared it. The CLI kills what it kills before it writes the result (a
#: sub-agent before the interrupt is even acknowledged), so this is a wide margin.
SPARED_S = 1.0
#: Tokens the model must have streamed after a background call: the turn is running on.
STREAMING_TOKENS = 3
#: A raw CLI's exit after stdin EOF once nothing runs (measured ~50 ms).
EXIT_S = 10.0


def _streaming_after_call(e: Exchange) -> bool:
    """The model's token stream that answers the result of a background call."""
    return e.streaming_tokens and e.tool_result is not None and e.tokens_sent >= STREAMING_TOKENS


def _is_task_info(subtype: str, task_id: str | None = None) -> Callable[[ev.Event], bool]:
    return lambda e: (
        isinstance(e, ev.SessionInfo)
        and e.info_kind == subtype
        and (task_id is None or e.data.get("task_id") == task_id)
    )


def _shell(work: Path) -> list[psutil.Process]:
    """The background shell's processes, once its leaf (``tail``) runs; else ``[]``."""
    found = _in(work, BACKGROUND_COMMAND)
    leaf = any(command_of(p) == "tail -f /dev/null" for p in found)
    return found if leaf else []


# --- 1. the raw wire ----------------------------------------------------------------------------


class RawCli:
    """One ``claude -p`` stream-json process driven by hand: every line it wrote, in order."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[dict[str, Any]] = []
        self._changed = trio.Event()
        self._count = 0

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                if line.strip():
                    self.lines.append(json.loads(line))
            self._changed.set()
            self._changed = trio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def request(self, request: dict[str, Any]) -> str:
        self._count += 1
        request_id = f"req_{self._count}_raw"
        await self.send({"type": "control_request", "request_id": request_id, "request": request})
        return request_id

    async def prompt(self, text: str) -> None:
        message = {"role": "user", "content": text}
        await self.send(
            {"type": "user", "message": message, "parent_tool_use_id": None, "session_id": ""}
        )

    async def wait(self, predicate: Callable[[dict[str, Any]], bool], after: int = 0) -> int:
        """The index of the first line from ``after`` on that matches (waits for it)."""
        while True:
            for index in range(after, len(self.lines)):
                if predicate(self.lines[index]):
                    return index
            await self._changed.wait()

    def answered(self, request_id: str) -> Callable[[dict[str, Any]], bool]:
        return lambda m: (
            m.get("type") == "control_response" and m["response"].get("request_id") == request_id
        )


def _system(subtype: str, task_id: str | None = None) -> Callable[[dict[str, Any]], bool]:
    return lambda m: (
        m.get("type") == "system"
        and m.get("subtype") == subtype
        and (task_id is None or m.get("task_id") == task_id)
    )


@asynccontextmanager
async def raw_claude(
    root: Path, installed: install.Installed
) -> AsyncIterator[tuple[RawCli, FakeModel, bool]]:
    """The CLI started as the supervisor would (same argv, env, namespace), but driven by hand;
    yields it, the model and whether it runs in a namespace."""
    with netns.open_namespace() as namespace:
        listener = namespace.listener if namespace is not None else None
        with FakeModel(listener) as model:
            prepared = CLAUDE_STREAM_JSON.prepare(installed.argv, root, model.base_url)
            argv = list(prepared.argv)
            if namespace is not None:
                argv = namespace.wrap(argv)
            process = await trio.lowlevel.open_process(
                argv,
                stdin=-1,
                stdout=-1,
                env={**os.environ, **prepared.env},
                cwd=os.fspath(prepared.cwd),
            )
            cli = RawCli(process)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cli.read)
                    yield cli, model, namespace is not None
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    if process.returncode is None:
                        process.kill()
                    await process.wait()


async def test_raw_interrupt_spares_background_shell(
    claude_install: install.Installed, tmp_path: Path
) -> None:
    """What the adapter's ``stop_task`` is for: the interrupt leaves a background shell running."""
    with trio.fail_after(BOUND_S):
        async with raw_claude(tmp_path, claude_install) as (cli, model, namespaced):
            work = tmp_path / "work"
            await cli.request({"subtype": "initialize", "hooks": None})
            await cli.prompt("background")
            index = await cli.wait(
                lambda m: (
                    m.get("type") == "control_request"
                    and m["request"].get("subtype") == "can_use_tool"
                )
            )
            asked = cli.lines[index]
            assert asked["request"]["input"]["run_in_background"] is True, asked
            answer = {"behavior": "allow", "updatedInput": asked["request"]["input"]}
            await cli.send(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "success",
                        "request_id": asked["request_id"],
                        "response": answer,
                    },
                }
            )
            started = cli.lines[await cli.wait(_system("task_started"))]
            task_id = started["task_id"]
            assert started["task_type"] == "local_bash" and started["is_backgrounded"], started
            listed = cli.lines[await cli.wait(_system("background_tasks_changed"))]
            assert [t["task_id"] for t in listed["tasks"]] == [task_id], listed
            await model.wait_for(_streaming_after_call)
            shell = await sample_until(lambda: _shell(work))

            # The interrupt ends the turn, not the background shell.
            interrupt = await cli.request({"subtype": "interrupt"})
            result_at = await cli.wait(lambda m: m.get("type") == "result")
            result = cli.lines[result_at]
            assert result["terminal_reason"] == "aborted_streaming", result
            await cli.wait(cli.answered(interrupt))
            gone, alive = await trio.to_thread.run_sync(
                lambda: psutil.wait_procs(shell, timeout=SPARED_S)
            )
            assert gone == [] and len(alive) == len(shell), "the interrupt killed the shell"
            ended = [
                m
                for m in cli.lines
                if m.get("type") == "system"
                and m.get("subtype") in ("task_updated", "task_notification")
            ]
            assert ended == [], ended

            # stop_task ends it: its task events first, then the answer.
            before = len(cli.lines)
            asked_at = time.monotonic()
            stop = await cli.request({"subtype": "stop_task", "task_id": task_id})
            answer_at = await cli.wait(cli.answered(stop), after=before)
            stop_ms = (time.monotonic() - asked_at) * 1000
            assert cli.lines[answer_at]["response"] == {
                "subtype": "success",
                "request_id": stop,
                "response": {},
            }
            updated = await cli.wait(_system("task_updated", task_id), after=before)
            notified = await cli.wait(_system("task_notification", task_id), after=before)
            assert cli.lines[updated]["patch"]["status"] == "killed", cli.lines[updated]
            assert cli.lines[notified]["status"] == "stopped", cli.lines[notified]
            assert updated < notified < answer_at
            left = await time_until_gone(shell, TOOL_GONE_S)
            assert left is not None, [(p.pid, command_of(p)) for p in shell if is_alive(p)]

            # A stop_task for a task that is gone: success, nothing else.
            before = len(cli.lines)
            again = await cli.request({"subtype": "stop_task", "task_id": task_id})
            answer_at = await cli.wait(cli.answered(again), after=before)
            assert cli.lines[answer_at]["response"]["subtype"] == "success"

            await cli.prompt("quick")
            done = await cli.wait(lambda m: m.get("type") == "result", after=result_at + 1)
            assert cli.lines[done]["terminal_reason"] == "completed", cli.lines[done]
            assert cli.process.stdin is not None
            await cli.process.stdin.aclose()
            with trio.fail_after(EXIT_S):
                assert await cli.process.wait() == 0
            unknown = {
                f"{m.get('type')}/{m.get('subtype')}"
                for m in cli.lines
                if m.get("type") == "system" and m.get("subtype") not in _RAW_SYSTEM_SUBTYPES
            }
            assert unknown == set(), unknown
            record(
                agent=CLAUDE_STREAM_JSON.key,
                install=installed_as(CLAUDE_STREAM_JSON.package),
                scenario="bg-raw",
                outcome=None,
                namespace=namespaced,
                notes=f"interrupt_spared_shell=True stop_task_ms={stop_ms:.1f}"
                f" task={task_id} shell_procs={len(shell)}",
            )


#: ``system`` subtypes this scenario produces on 2.1.332 (a new one is worth a look).
_RAW_SYSTEM_SUBTYPES = frozenset(
    {
        "init",
        "status",
        "task_started",
        "task_updated",
        "task_notification",
        "background_tasks_changed",
    }
)


def _in(work: Path, needle: str) -> list[psutil.Process]:
    """Live processes in ``work`` running ``needle``, and their children."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if needle in " ".join(proc.info["cmdline"] or []) and proc.info["cwd"] == os.fspath(
                work
            ):
                found[proc.pid] = proc
                found.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.Error:
            continue
    return [p for p in found.values() if is_alive(p)]


# --- 2. and 3. under the supervisor ---------------------------------------------------------


def _task_stop_ms(h: Harness, task_id: str, cancelled_at: float) -> float | None:
    """Milliseconds from the cancel to the task's ``task_notification`` (wall clock stamps)."""
    ends = [e for e in h.recorder.events if _is_task_info("task_notification", task_id)(e)]
    return round((ends[0].timestamp - cancelled_at) * 1000, 1) if ends else None


async def test_cancel_stops_background_shell(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            assert _in(h.work, BACKGROUND_COMMAND) == []
            approved: list[str] = []
            async with trio.open_nursery() as nursery:
                turn = await h.session.prompt("background")
                # Claude asks before every Bash command here, a background one too.
                nursery.start_soon(approve_permissions, h, turn.id, approved)
                started = await h.recorder.wait_for(_is_task_info("task_started"))
                watched = await sample_until(lambda: _shell(h.work))
                await h.model.wait_for(_streaming_after_call)
                nursery.cancel_scope.cancel()
            assert isinstance(started, ev.SessionInfo)
            task_id = started.data["task_id"]
            assert (started.data["task_type"], started.data["is_backgrounded"]) == (
                "local_bash",
                True,
            ), started.data
            [cli] = [p for p in psutil.Process().children(recursive=True) if _is_cli(p)]
            own_session = all(_sid(p) not in (None, _sid(cli)) for p in watched)

            cancelled_at = time.time()
            receipt, alive_at_receipt, gone_ms, _ = await cancel_while_tools_run(h, watched)
            await h.recorder.catch_up()
            stop_ms = _task_stop_ms(h, task_id, cancelled_at)
            row(
                h,
                "bg-shell",
                receipt,
                notes=[
                    f"tasks={json.dumps(receipt.details.get('tasks'), separators=(',', ':'))}",
                    f"task_stopped_ms={stop_ms}",
                    f"tool_procs={len(watched)} tool_own_session={own_session}",
                    f"tool_alive_at_receipt={len(alive_at_receipt)}/{len(watched)}",
                ],
                tools_killed=receipt.details.get("tool_processes_killed", []),
            )
            assert approved == [BACKGROUND_COMMAND], approved
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "aborted_streaming", receipt
            # The CLI ended the shell on our stop_task: nothing was left for the sweep, whose
            # kill would read "tools_killed" here.
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.details == {
                "tasks": [{"task_id": task_id, "confirmed": True, "status": "stopped"}]
            }, receipt.details
            [updated] = [e for e in h.recorder.events if _is_task_info("task_updated", task_id)(e)]
            assert isinstance(updated, ev.SessionInfo)
            assert updated.data["patch"]["status"] == "killed", updated.data
            # No process-group kill of the CLI reaches the shell: it has its own session.
            assert own_session, [(p.pid, _sid(p), command_of(p)) for p in watched]
            assert alive_at_receipt == [], [(p.pid, command_of(p)) for p in alive_at_receipt]
            assert gone_ms is not None
            assert receipt.elapsed_ms < GRACE_S * 1000, receipt

            await second_prompt_completes(h)
            assert _in(h.work, BACKGROUND_COMMAND) == []


async def test_cancel_with_background_agent(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            turn = await h.session.prompt("bgagent")
            started = await h.recorder.wait_for(_is_task_info("task_started"))
            assert isinstance(started, ev.SessionInfo)
            task_id = started.data["task_id"]
            assert (started.data["task_type"], started.data["is_backgrounded"]) == (
                "local_agent",
                True,
            ), started.data
            # Both stream: the turn after the call, and the sub-agent (its prompt is "stream").
            main = await h.model.wait_for(_streaming_after_call)
            sub = await h.model.wait_for(
                lambda e: (
                    e.streaming_tokens
                    and e.tool_result is None
                    and e.tokens_sent >= STREAMING_TOKENS
                )
            )
            cancelled_at, cancelled_mono = time.time(), time.monotonic()
            receipt = await h.session.cancel()
            streams = [
                await h.model.wait_for(lambda e, i=i: e.id == i and e.ended_at is not None)
                for i in (main.id, sub.id)
            ]
            await h.recorder.catch_up()
            stop_ms = _task_stop_ms(h, task_id, cancelled_at)
            gone_ms = [ms_after(cancelled_mono, e.disconnected_at) for e in streams]
            row(
                h,
                "bg-agent",
                receipt,
                model_gone_ms=max((g for g in gone_ms if g is not None), default=None),
                notes=[
                    f"tasks={json.dumps(receipt.details.get('tasks'), separators=(',', ':'))}",
                    f"task_stopped_ms={stop_ms}",
                    f"model_gone_ms(turn,subagent)={gone_ms}",
                ],
            )
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "aborted_streaming", receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.details == {
                "tasks": [{"task_id": task_id, "confirmed": True, "status": "stopped"}]
            }, receipt.details
            assert receipt.elapsed_ms < GRACE_S * 1000, receipt
            # The sub-agent stopped calling the model, as did the turn.
            for stream in streams:
                assert stream.disconnected_at is not None, h.model.describe()
                assert stream.disconnected_at - cancelled_mono < MODEL_GONE_S, h.model.describe()
            await second_prompt_completes(h)
