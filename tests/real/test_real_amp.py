"""Tier 4: the real Amp CLI under the supervisor, against the tests' fake Amp server.

``amp --execute --stream-json --stream-json-input --no-archive-after-execute`` (protocol
``amp``, ``protocols/amp.py``): the Bun executable of ``@sourcegraph/amp@0.0.1790142911-g7618fb``
(``node_modules/@ampcode/cli-linux-x64/amp``), installed by ``tests/realagents/install.py`` (key
``amp``; skipped with the reason when that is impossible, a failure under
``AGENT_SUPERVISOR_STRICT_SKIPS=1``), with a fresh ``HOME`` per test, in its own loopback-only
network namespace. Amp's CLI calls no model: its agent loop is on Amp's server, here
``tests/realagents/fake_amp.py`` (``AMP_URL``), which logs every turn it runs. Proven:

(a) a turn, then another on the same process (no ``result`` per turn: each ends at its
    ``end_turn`` message);
(b) a shell tool call that really runs: the server leases ``shell_command`` to the CLI, the CLI
    runs it in the session's folder and reports its output;
(c) cancel mid-turn: SIGINT, Amp's "User cancelled" result, its exit; the receipt (``cancelled``)
    comes only once the old process is reaped and ``amp threads continue <T-id>`` runs; a prompt
    sent right after it completes in the same thread, whose history the server kept;
(d) cancel while the shell tool runs: no process of the tool outlives the receipt;
(e) an Amp that does not answer SIGINT (stopped with SIGSTOP, as a hung process would be)
    meets the grace timer and the kill ladder, and the thread still goes on;
(f) ``threads continue`` of a thread the server lost: a clear ``resume_failed`` error with
    Amp's words, and the session goes on in a fresh thread (no hang);
(g) steering: the machine's ``"steer": true`` line, written to the real CLI mid-turn, reaches
    the server as part of the running turn (driven through the machine alone: the session's
    ``steer`` is not this module's).

Real clock, generous bounds. The cancel latencies go into the tier-4 table at the end of the run
(and ``.cache/tier4-results.json``) as agent ``amp``. ``AGENT_TIER4_TEE=1`` logs every line to
and from the CLI under the test's tmp folder (``wire/wire.log``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio

from helpers import Recorder
from paths import TESTS
from protocols import events as ev
from protocols.amp import AMP_COMMAND, AmpClient
from protocols.framing import Message, decode_line
from protocols.machine import AgentExiting, Step, TurnFinished
from protocols.mcp import McpServer, NameValue
from realagents import install, scenarios
from realagents.agents import AMP, TEE_VARIABLE, Prepared, amp_spec
from realagents.conftest import GRACE_S, noted_namespace, record
from realagents.fake_amp import (
    AFTER_TOOL_TEXT,
    LONG_TOOL_COMMAND,
    QUICK_TEXT,
    STEERED_PREFIX,
    TOOL_COMMAND,
    TOOL_MARKER,
    FakeAmp,
)
from realagents.scenarios import is_alive, is_holder
from supervisor import Session, open_supervisor

pytestmark = pytest.mark.real_process

KEY = AMP.key
#: Whole-test bound: Amp starts in ~1 s; a few turns, a respawn or two, maybe a kill ladder.
BOUND_S = 90.0
#: Grace of the ignored-SIGINT test: the ladder's time is what it measures, not this.
SHORT_GRACE_S = 1.0
#: psutil's process start times are in clock ticks (10 ms).
CLOCK_TICK_S = 0.01
#: The binary, as it shows in a process's command line.
AMP_BINARY = "cli-linux-x64/amp"
#: What Amp reports of a shell command a signal ended: it had no exit code, and printed nothing.
KILLED_TOOL_RESULT = {"status": "done", "result": {"output": "", "exitCode": -1}}


#: The tests' own stdio MCP server.
FAKE_MCP = TESTS / "fakes" / "mcp_server.py"


@pytest.fixture(scope="module")
def amp_install() -> install.Installed:
    return scenarios.ensure_installed(AMP.package, KEY)


@attrs.define
class AmpHarness:
    session: Session
    recorder: Recorder
    server: FakeAmp
    prepared: Prepared
    ready_s: float
    namespace: bool

    @property
    def work(self) -> Path:
        return self.prepared.cwd

    def amp_processes(self) -> list[psutil.Process]:
        """The live Amp CLIs of this test (children of this test process; a fresh one may
        still be the containment's ``sh -c '... exec amp ...'``)."""
        found = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if (
                    AMP_BINARY in " ".join(proc.cmdline())
                    and is_alive(proc)
                    and not is_holder(proc)
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def the_amp(self) -> psutil.Process:
        [proc] = self.amp_processes()
        return proc

    def thread(self) -> str:
        inits = [e for e in self.recorder.of_kind("session.info") if isinstance(e, ev.SessionInfo)]
        [thread] = {e.data["session_id"] for e in inits if e.info_kind == "init"}
        return str(thread)


@pytest.fixture
def open_amp(amp_install: install.Installed, tmp_path: Path) -> Any:
    """``async with open_amp(grace_s=..., mcp_servers=...) as h:`` the real CLI under a
    supervisor, its fake server serving in the CLI's network namespace."""

    @asynccontextmanager
    async def opener(
        *, grace_s: float = GRACE_S, mcp_servers: tuple[McpServer, ...] = ()
    ) -> AsyncIterator[AmpHarness]:
        with noted_namespace() as namespace:
            listener = namespace.listener if namespace is not None else None
            with FakeAmp(listener) as server:
                prepared = AMP.prepare(amp_install.argv, tmp_path, server.base_url)
                tee = tmp_path / "wire" if os.environ.get(TEE_VARIABLE) == "1" else None
                spec = amp_spec(prepared, grace_s=grace_s, tee_dir=tee)
                spec = spec.with_options(mcp_servers=mcp_servers)
                if namespace is not None:
                    spec = spec.with_options(command=tuple(namespace.wrap(list(spec.command))))
                async with open_supervisor(agents={spec.name: spec}) as sup:
                    started = time.monotonic()
                    session = await sup.start_session(spec.name)
                    ready_s = time.monotonic() - started
                    recorder = Recorder(session)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(recorder.run)
                        yield AmpHarness(
                            session, recorder, server, prepared, ready_s, namespace is not None
                        )
                        await recorder.catch_up()
                        recorder.check_invariants()
                        unparsed = recorder.of_kind("agent.unparsed")
                        assert unparsed == [], unparsed  # the machine understood every line
                        nursery.cancel_scope.cancel()

    return opener


def row(h: AmpHarness, scenario: str, receipt: Any, notes: list[str]) -> None:
    record(
        agent=KEY,
        install=scenarios.installed_as(AMP.package),
        scenario=scenario,
        outcome=receipt.outcome,
        elapsed_ms=receipt.elapsed_ms,
        ready_s=round(h.ready_s, 1),
        namespace=h.namespace,
        notes=" ".join([*scenarios.receipt_notes(receipt), *notes]),
    )


async def completes(h: AmpHarness, text: str) -> ev.TurnEnded:
    turn = await h.session.prompt(text)
    ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.outcome, ended.stop_reason) == ("completed", "end_turn"), (
        ended,
        h.server.describe(),
    )
    return ended


async def streaming(h: AmpHarness) -> tuple[Any, psutil.Process]:
    """A ``stream`` turn the server is streaming (the CLI prints nothing of it before its end,
    but the prompt's echo). The turn and the CLI's process."""
    turn = await h.session.prompt("stream, and remember marker-5a1e")
    await h.server.wait_for(lambda t: t.scenario == "stream" and t.tokens_sent >= 3)
    await h.recorder.wait_kind("message.delta", turn_id=turn.id, role="user")
    return turn, h.the_amp()


def test_command_line_is_the_adapters() -> None:
    assert AMP.args == AMP_COMMAND[1:]
    package = install.PACKAGES[AMP.package]
    assert (package.npm, package.version) == ("@sourcegraph/amp", "0.0.1790142911-g7618fb")


async def test_turns_end_at_end_turn_on_one_process(open_amp: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_amp() as h:
            first = await completes(h, "quick: hello")
            second = await completes(h, "quick, once more")
            # One process for both (no result per turn, no respawn); Amp's text, whole.
            exited = h.recorder.of_kind("agent.exited")
            assert exited == [] and len(h.amp_processes()) == 1
            texts = [
                e.text
                for e in h.recorder.of_kind("message.delta")
                if isinstance(e, ev.MessageDelta) and e.role == "assistant"
            ]
            assert texts == [QUICK_TEXT, QUICK_TEXT]
            thread = h.thread()
            assert [t.thread for t in h.server.find_turns(lambda t: True)] == [thread, thread]
            assert first.turn_id != second.turn_id
            assert h.recorder.of_kind("error") == []


async def test_a_configured_mcp_server_is_started(open_amp: Any, tmp_path: Path) -> None:
    """``--mcp-config`` (``protocols/amp.py``): the CLI starts the tests' own stdio MCP server
    (``tests/fakes/mcp_server.py``) with the env it was given, and says so in ``system/init``.
    (The fake server leases no MCP tool to the CLI, so nothing calls it here.)"""
    marker = tmp_path / "marker.jsonl"
    server = McpServer(
        name="marker",
        command=sys.executable,
        args=(str(FAKE_MCP), str(marker)),
        env=(NameValue("FAKE_MCP_WORD", "amp-word"),),
    )
    with trio.fail_after(BOUND_S):
        async with open_amp(mcp_servers=(server,)) as h:
            await completes(h, "quick: hello")
            # The CLI connects its MCP servers beside the thread, with no event of ours to wait
            # on: sample the marker file, bounded.
            while not marker.exists() or "initialize" not in marker.read_text():
                await trio.sleep(0.05)
    initialize = json.loads(marker.read_text().splitlines()[0])
    assert initialize["word"] == "amp-word", initialize
    assert "amp" in json.dumps(initialize["client"]).lower(), initialize


async def test_shell_tool_really_runs(open_amp: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_amp() as h:
            ended = await completes(h, "shell")
            [call] = [e for e in h.recorder.of_kind("tool.call") if isinstance(e, ev.ToolCall)]
            assert (call.title, call.tool_kind, call.status) == (
                "shell_command",
                "execute",
                "pending",
            )
            assert call.raw["input"] == {"command": TOOL_COMMAND}
            [update] = [
                e for e in h.recorder.of_kind("tool.update") if isinstance(e, ev.ToolUpdate)
            ]
            assert (update.tool_call_id, update.status) == (call.tool_call_id, "completed")
            # It ran in the session's folder, and the server heard its output and exit code.
            assert (h.work / TOOL_MARKER).read_text() == "amp-tool-output\n"
            [turn] = h.server.find_turns(lambda t: t.scenario == "shell")
            assert turn.tool_result == {
                "status": "done",
                "result": {"output": "amp-tool-output\n", "exitCode": 0},
            }
            assert json.loads(update.raw["content"]) == turn.tool_result["result"]
            texts = [
                e.text
                for e in h.recorder.of_kind("message.delta")
                if isinstance(e, ev.MessageDelta)
            ]
            assert f"{AFTER_TOOL_TEXT} 0." in texts, texts
            assert call.turn_id == update.turn_id == ended.turn_id


async def test_cancel_answers_after_the_respawn_and_the_thread_goes_on(open_amp: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_amp() as h:
            await completes(h, "quick: remember marker-7f3a9")
            thread = h.thread()
            turn, old = await streaming(h)
            cancelled_at, cancelled_wall = time.monotonic(), time.time()
            receipt = await h.session.cancel()
            answered_wall = time.time()
            # Terminate-then-respond: the old CLI is reaped, `threads continue` runs, ready.
            assert not is_alive(old)
            assert h.session.state == "ready"
            # (A process mid-exec shows no command line for a moment: sampled until it does.)
            [new] = await scenarios.sample_until(h.amp_processes)
            assert new.pid != old.pid and new.create_time() <= answered_wall + CLOCK_TICK_S
            # (It may still be the containment's exec wrapper, just before Amp runs.)
            assert f"threads continue {thread} --execute" in " ".join(new.cmdline())
            assert (receipt.outcome, receipt.stop_reason, receipt.turn_id) == (
                "cancelled",
                "cancelled",
                turn.id,
            ), receipt
            assert receipt.escalation == ["interrupt", "respawned", "resumed"], receipt
            assert receipt.resumed is True
            assert receipt.elapsed_ms < GRACE_S * 1000
            [stopped] = h.server.find_turns(lambda t: t.id == 2)
            assert stopped.outcome == "cancelled" and stopped.cancelled_at is not None
            await h.recorder.catch_up()  # what was published before the receipt
            exited = [
                e for e in h.recorder.of_kind("agent.exited") if isinstance(e, ev.AgentExited)
            ]
            assert [(e.exit_code, e.expected) for e in exited] == [(0, True)]
            # A client's next prompt, at once: it completes, in the same thread.
            prompted_at = time.monotonic()
            await completes(h, "quick: what did I ask you to remember?")
            done_at = time.monotonic()
            [after] = h.server.find_turns(lambda t: t.id == 3)
            assert after.thread == thread
            history = json.dumps(h.server.messages(thread))
            assert "marker-7f3a9" in history and "marker-5a1e" in history
            await h.recorder.catch_up()
            assert h.recorder.of_kind("error") == []
            row(
                h,
                "stream",
                receipt,
                [
                    f"server_cancel_ms={(stopped.cancelled_at - cancelled_at) * 1000:.0f}",
                    f"exit_ms={(exited[0].timestamp - cancelled_wall) * 1000:.0f}",
                    f"next_turn_ms={(done_at - prompted_at) * 1000:.0f}",
                ],
            )


async def test_cancel_while_the_shell_tool_runs(open_amp: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_amp() as h:
            turn = await h.session.prompt("longshell")
            await h.recorder.wait_kind("tool.call", turn_id=turn.id)
            leaf = scenarios.TOOL_LEAF
            tools = await scenarios.sample_until(lambda: tool_processes(h, leaf))
            await trio.sleep(scenarios.RUNNING_FOR_S)  # as a person would, a while later
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            alive_at_receipt = [p for p in tools if is_alive(p)]
            assert alive_at_receipt == [], [p.cmdline() for p in alive_at_receipt]
            assert receipt.outcome == "cancelled", receipt
            assert receipt.escalation == ["interrupt", "respawned", "resumed"], receipt
            [stopped] = h.server.find_turns(lambda t: t.scenario == "longshell")
            assert stopped.tool_call is not None and stopped.tool_call["args"] == {
                "command": LONG_TOOL_COMMAND
            }
            # The command never finished by itself. The cancel's SIGINT reaches the tool too
            # (Amp runs it in a session of its own, beyond a terminal's Ctrl-C): when Amp sees
            # it die before it handles its own SIGINT, it reports the death (no exit code: -1)
            # beside its client_cancel; otherwise it reports nothing.
            if stopped.tool_result is not None:
                assert stopped.tool_result == KILLED_TOOL_RESULT, h.server.describe()
                assert stopped.tool_result_at is not None
                assert stopped.tool_result_at > cancelled_at, h.server.describe()
            assert stopped.outcome == "cancelled", h.server.describe()
            death = f"tool_death_reported={stopped.tool_result is not None}"
            row(h, "shell", receipt, [f"tool_procs={len(tools)}", death])
            await completes(h, "quick")


def tool_processes(h: AmpHarness, needle: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if needle in " ".join(proc.info["cmdline"] or []) and is_alive(proc):
                if proc.info["cwd"] == os.fspath(h.work):
                    found.append(proc)
        except psutil.Error:
            continue
    return found


async def test_amp_that_does_not_answer_sigint_is_killed_and_continued(open_amp: Any) -> None:
    """SIGSTOP makes Amp deaf to our SIGINT, as a hung process is: the grace runs out, the
    ladder's SIGTERM (and SIGCONT) ends it, and ``threads continue`` takes over."""
    with trio.fail_after(BOUND_S):
        async with open_amp(grace_s=SHORT_GRACE_S) as h:
            await completes(h, "quick: remember marker-7f3a9")
            thread = h.thread()
            turn, old = await streaming(h)
            old.suspend()
            receipt = await h.session.cancel()
            assert not is_alive(old)
            assert (receipt.outcome, receipt.turn_id) == ("killed", turn.id), receipt
            assert receipt.escalation[:3] == ["interrupt", "grace_expired", "sigterm"], receipt
            assert receipt.escalation[-2:] == ["respawned", "resumed"], receipt
            assert receipt.resumed is True
            assert SHORT_GRACE_S * 1000 <= receipt.elapsed_ms < SHORT_GRACE_S * 1000 + 5000
            row(h, "kill", receipt, [])
            await completes(h, "quick, after the kill")
            [after] = h.server.find_turns(lambda t: t.user_text == "quick, after the kill")
            assert after.thread == thread
            assert "marker-7f3a9" in json.dumps(h.server.messages(thread))


async def test_lost_thread_is_a_clear_resume_failure(open_amp: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_amp() as h:
            await completes(h, "quick")
            thread = h.thread()
            await streaming(h)
            h.server.forget(thread)  # the server no longer has it
            receipt = await h.session.cancel()
            assert receipt.outcome == "cancelled", receipt
            failure = await h.recorder.wait_kind("error", code="resume_failed")
            assert isinstance(failure, ev.ErrorEvent)
            assert f"Thread {h.server.base_url}/threads/{thread} does not exist." in failure.message
            assert "exit 1" in failure.message
            # The session goes on in a fresh thread. A prompt that raced the dying CLI fails
            # with Amp's words; the next one runs.
            outcomes = []
            for _ in range(3):
                await h.session.wait_ready()
                turn = await h.session.prompt("quick")
                ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
                assert isinstance(ended, ev.TurnEnded)
                outcomes.append(ended.outcome)
                if ended.outcome == "completed":
                    break
                assert ended.error is not None and "does not exist" in ended.error, ended
            assert outcomes[-1] == "completed", outcomes
            [fresh] = h.server.thread_ids()
            assert fresh != thread
            record(
                agent=KEY,
                install=scenarios.installed_as(AMP.package),
                scenario="lost",
                outcome="resume_failed",
                ready_s=round(h.ready_s, 1),
                namespace=h.namespace,
                notes=f"turns_until_fresh={len(outcomes)}",
            )


# -- (g) steering, through the machine alone -------------------------------------------------


class Cli:
    """The real CLI on plain pipes, driven by an :class:`AmpClient` (no supervisor)."""

    def __init__(self, process: trio.Process, machine: AmpClient) -> None:
        self.process = process
        self.machine = machine
        self.outputs: list[Any] = []
        self.lines: list[dict[str, Any]] = []
        self._buffer = b""

    async def apply(self, step: Step) -> None:
        assert self.process.stdin is not None
        for message in step.send:
            await self.process.stdin.send_all(json.dumps(message).encode() + b"\n")
        self.outputs.extend(step.events)

    async def until(self, predicate: Any) -> Any:
        """Feed the CLI's lines to the machine until one of its outputs matches."""
        assert self.process.stdout is not None
        while True:
            for output in self.outputs:
                if predicate(output):
                    return output
            chunk = await self.process.stdout.receive_some(65536)
            assert chunk, f"the CLI closed stdout; outputs: {self.outputs}"
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                frame = decode_line(line)
                if isinstance(frame, Message):
                    self.lines.append(frame.payload)
                    await self.apply(self.machine.receive(frame.payload))


async def test_steer_line_joins_the_running_turn(
    amp_install: install.Installed, tmp_path: Path
) -> None:
    with trio.fail_after(BOUND_S), noted_namespace() as namespace:
        with FakeAmp(namespace.listener if namespace else None) as server:
            prepared = AMP.prepare(amp_install.argv, tmp_path, server.base_url)
            argv = list(prepared.argv)
            if namespace is not None:
                argv = namespace.wrap(argv)
            process = await trio.lowlevel.open_process(
                argv,
                stdin=-1,  # subprocess.PIPE
                stdout=-1,
                cwd=prepared.cwd,
                env={**os.environ, **prepared.env},
            )
            try:
                cli = Cli(process, AmpClient())
                await cli.apply(cli.machine.start(cwd=os.fspath(prepared.cwd)))
                await cli.apply(cli.machine.prompt("t1", "stream"))
                await server.wait_for(lambda t: t.tokens_sent >= 3)
                steered_at = time.monotonic()
                await cli.apply(cli.machine.steer("t1", 1, "go left instead"))
                finished = await cli.until(lambda o: isinstance(o, TurnFinished))
                assert finished == TurnFinished("t1", "end_turn", interrupted=False)
                # On the server: the steering message came while the turn ran, flagged, and
                # joined that turn instead of starting another.
                [turn] = server.find_turns(lambda t: True)
                assert (turn.outcome, turn.steered_with) == ("steered", ["go left instead"])
                [append_steer] = [
                    c for c in server.find_calls("client_append_user_msg") if c.params.get("steer")
                ]
                assert turn.started_at < append_steer.at < (turn.ended_at or 0)
                # The CLI echoed it as part of the turn, and printed the turn's steered answer.
                deltas = [
                    (o.role, o.text, o.turn_id)
                    for o in cli.outputs
                    if isinstance(o, ev.MessageDelta)
                ]
                assert deltas == [
                    ("user", "stream", "t1"),
                    ("user", "go left instead", "t1"),
                    ("assistant", f"{STEERED_PREFIX}go left instead", "t1"),
                ]
                [echo] = [line for line in cli.lines if "go left instead" in json.dumps(line)][:1]
                assert echo["type"] == "user" and echo["session_id"] == turn.thread
                record(
                    agent=KEY,
                    install=scenarios.installed_as(AMP.package),
                    scenario="steer",
                    outcome="injected",
                    elapsed_ms=round(((turn.ended_at or 0) - steered_at) * 1000, 1),
                    namespace=namespace is not None,
                    notes="elapsed_ms=steer line written to the steered answer's end",
                )
                # stdin EOF, idle: Amp's success result, and its exit.
                assert process.stdin is not None
                await process.stdin.aclose()
                await cli.until(lambda o: isinstance(o, AgentExiting))
                assert await process.wait() == 0
            finally:
                if process.returncode is None:
                    process.send_signal(signal.SIGKILL)
                    with trio.CancelScope(shield=True):
                        await process.wait()
