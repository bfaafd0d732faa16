"""Amp: tier 1 (the machine, golden transcripts), tier 2 (the actor on virtual time with the
in-memory Amp) and tier 3 (a scripted fake CLI through the real supervisor).

The golden files (``tests/golden/amp/*.json``, format in ``tests/golden.py``) hold lines the
real CLI (``@sourcegraph/amp@0.0.1790142911-g7618fb``) printed against the tests' fake Amp
server, trimmed; the real CLI itself is tier 4 (``tests/test_real_amp.py``).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import golden
from helpers import Recorder, running
from protocols import events as ev
from protocols.amp import AMP_COMMAND, AmpClient
from protocols.machine import AgentExiting, SessionEstablished, TurnFinished
from supervisor import AgentSpec, open_supervisor

FAKE_AMP = Path(__file__).parent / "fakes" / "fake_amp.py"
BASE = list(AMP_COMMAND)
GOLDEN_DIR = Path(__file__).parent / "golden" / "amp"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
CHECKS = {"pending_permissions", "agent_session_id"}


# -- tier 1 ----------------------------------------------------------------------------------


def check_wire(message: dict[str, Any], where: str) -> None:
    """All we ever write is a user line: content blocks, and ``steer`` when steering."""
    assert set(message) <= {"type", "message", "steer"}, where
    assert message["type"] == "user", where
    assert set(message["message"]) == {"role", "content"}, where
    assert message["message"]["role"] == "user", where
    assert isinstance(message["message"]["content"], list), where  # Amp wants a list
    assert message.get("steer", True) is True, where


def test_golden_files_exist() -> None:
    assert len(GOLDEN_FILES) >= 10


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_transcript(path: Path) -> None:
    golden.replay(path, AmpClient(), checks=CHECKS, check_sent=check_wire)


CONTINUE = ["threads", "continue", "T-1"]


def test_command_continues_the_thread_on_resume() -> None:
    assert AmpClient.command(BASE, None) == BASE
    assert AmpClient.command(BASE, "T-1") == ["amp", "threads", "continue", "T-1", *BASE[1:]]
    wrapped = ["node", "amp.js", "--execute"]
    assert AmpClient.command(wrapped, "T-1") == ["node", "amp.js", *CONTINUE, "--execute"]
    # A wrapper's own options stay in front (the tier-4 tests run it under nsenter).
    entered = ["nsenter", "--net=/proc/7/ns/net", "--", "amp", "--stream-json", "-x"]
    assert AmpClient.command(entered, "T-1") == [*entered[:5], *CONTINUE, "-x"]
    assert AmpClient.command(["amp", "--verbose"], "T-1") == ["amp", *CONTINUE, "--verbose"]
    assert AmpClient.command(["amp"], "T-1") == ["amp", *CONTINUE]


@pytest.mark.parametrize("announced", ["--help", "", "T-\0", "T-\ud800"])
def test_a_thread_id_no_command_line_can_carry_is_not_continued_and_says_so(
    announced: str,
) -> None:
    assert AmpClient.command(BASE, announced) == BASE
    [established] = AmpClient().start(cwd="/w", resume=announced).events
    assert isinstance(established, SessionEstablished)
    assert established.resumed is False and "fresh session" in (established.detail or "")


def test_example_config_runs_the_adapters_command_line() -> None:
    """``agents.toml.example``'s Amp entry is the command line the machine is written for."""
    import tomllib

    example = Path(__file__).parents[1] / "agents.toml.example"
    entry = tomllib.loads(example.read_text())["agents"]["amp"]
    assert (entry["protocol"], tuple(entry["command"])) == ("amp", AMP_COMMAND)


json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
blocks = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "x"])},
        optional={
            "text": json_scalars,
            "thinking": json_scalars,
            "id": json_scalars,
            "name": st.sampled_from(["shell_command", "Read"]) | json_scalars,
            "tool_use_id": json_scalars,
            "is_error": json_scalars,
        },
    ),
    max_size=3,
)
lines = st.fixed_dictionaries(
    {"type": st.sampled_from(["system", "user", "assistant", "result", "x"]) | json_scalars},
    optional={
        "subtype": st.sampled_from(["init", "success", "error_during_execution"]) | json_scalars,
        "session_id": st.sampled_from(["T-1", "T-2"]) | json_scalars,
        "message": st.fixed_dictionaries(
            {},
            optional={
                "content": blocks | json_scalars,
                "stop_reason": st.sampled_from(["end_turn", "tool_use"]) | json_scalars,
            },
        )
        | json_scalars,
        "is_error": json_scalars,
        "error": st.sampled_from(["User cancelled (SIGINT/SIGTERM)", "boom"]) | json_scalars,
    },
)
calls = st.sampled_from(["prompt", "cancel", "steer"])


@settings(max_examples=300, deadline=None)
@given(script=st.lists(st.one_of(lines, calls), max_size=12), resume=st.sampled_from([None, "T-1"]))
def test_any_output_never_crashes_and_ends_each_turn_at_most_once(
    script: list[Any], resume: str | None
) -> None:
    """Whatever the CLI writes, in whatever order with our calls: no exception, each turn ends
    at most once, the exit is announced at most once, and nothing but user lines goes out."""
    amp = AmpClient()
    amp.start(cwd="/", resume=resume)
    turns = 0
    running_turn: str | None = None
    ended: list[str] = []
    exits = 0
    for item in script:
        if item == "prompt":
            if running_turn is not None or exits:
                continue
            turns += 1
            running_turn = f"t{turns}"
            step = amp.prompt(running_turn, "hi")
        elif item == "cancel":
            step = amp.cancel()
        elif item == "steer":
            try:
                step = amp.steer(running_turn or "t0", turns, "left")
            except RuntimeError:
                continue
        else:
            step = amp.receive(json.loads(json.dumps(item)))
        for message in step.send:
            check_wire(message, str(item))
        for out in step.events:
            if isinstance(out, TurnFinished):
                assert out.turn_id == running_turn
                ended.append(out.turn_id)
                running_turn = None
            elif isinstance(out, AgentExiting):
                exits += 1
        assert all(s == signal.SIGINT for s in step.signals)
    assert len(ended) == len(set(ended)) and exits <= 1


# -- tier 2 (virtual time) -----------------------------------------------------------------


def memory_spec(grace_s: float = 2.0) -> AgentSpec:
    return AgentSpec(name="amp", protocol="amp", command=BASE, grace_s=grace_s)


async def test_cancel_answers_once_the_exit_is_reaped_and_the_thread_continues(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """SIGINT; Amp writes its "User cancelled" result after 0.05 s and exits 0.03 s later. The
    receipt says ``cancelled`` at exactly 0.08 s: after the exit and the respawn, with the
    session ready and ``threads continue`` running. A prompt sent at once goes to it."""
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=1000, stop_delay=0.05, exit_delay=0.03))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        first = await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.08)
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "cancelled")
        assert receipt.escalation == ["interrupt", "respawned", "resumed"]
        assert receipt.resumed is True and receipt.turn_id == first.id
        assert session.state == "ready"
        assert launcher.links[0].signals == [signal.SIGINT]
        assert not launcher.links[0].alive and launcher.links[1].alive
        assert launcher.resumes == [None, "T-1"]
        await rec.catch_up()  # what was published before the receipt
        exited = rec.of_kind("agent.exited")
        assert [(e.exit_code, e.expected) for e in exited if isinstance(e, ev.AgentExited)] == [
            (0, True)
        ]
        # The turn's end reached subscribers before the receipt was answered.
        ended = await rec.wait_kind("turn.ended", turn_id=first.id)
        assert isinstance(ended, ev.TurnEnded) and ended.receipt is not None
        second = await session.prompt("again words=2")
        assert not second.queued
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
        # It went to the new process, not the one that was exiting.
        assert [m["message"]["content"][0]["text"] for m in launcher.links[1].sent] == [
            "again words=2"
        ]
        await rec.catch_up()
        assert rec.of_kind("error") == []


async def test_no_prompt_reaches_the_exiting_process(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A prompt that comes while the cancelled Amp is still exiting waits for the next one."""
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=1000, stop_delay=0.05, exit_delay=0.5))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)
            await rec.wait_for(lambda e: isinstance(e, ev.SessionState) and "exiting" in str(e))
            queued = await session.prompt("again words=2")
            assert queued.queued
        done = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
        assert len(launcher.links[0].sent) == 1 and len(launcher.links[1].sent) == 1


async def test_amp_ignoring_sigint_is_killed_at_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=1000, stop_delay=None))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(2.0)
        assert receipt.outcome == "killed" and receipt.resumed is True
        assert receipt.escalation == [
            "interrupt",
            "grace_expired",
            "sigterm",
            "respawned",
            "resumed",
        ]
        assert launcher.resumes == [None, "T-1"]
        second = await session.prompt("again words=2")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"


async def test_an_exit_that_never_comes_meets_the_grace_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Amp says it stopped (its result) but its process hangs on: the receipt still waits for
    it to be gone, so the grace timer kills it; the turn was stopped, the process killed."""
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=1000, stop_delay=0.05, exit_delay=3600))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(2.0)
        assert receipt.outcome == "killed"
        assert receipt.escalation == [
            "interrupt",
            "grace_expired",
            "sigterm",
            "respawned",
            "resumed",
        ]
        assert session.state == "ready"


async def test_cancel_after_cancel_keeps_the_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every Amp cancel is an exit: many in a row are not a crash loop."""
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=1000, stop_delay=0.01, exit_delay=0.01))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        for n in range(8):
            turn = await session.prompt(f"hello {n}")
            await rec.wait_kind("message.delta", turn_id=turn.id, role="assistant")
            receipt = await session.cancel()
            assert (receipt.outcome, receipt.resumed) == ("cancelled", True), receipt
        assert launcher.resumes == [None] + ["T-1"] * 8
        assert session.state == "ready"


async def test_error_result_fails_the_turn_and_the_next_prompt_waits_for_the_respawn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Amp's error ``result`` ends its run: the turn fails with Amp's words, the process exits
    0, and a prompt sent right after the turn ended runs in the continued thread (no "agent
    exited unexpectedly")."""
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=2, word_interval=0.1, exit_delay=0.2))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        failing = await session.prompt("fail-turn")
        ended = await rec.wait_kind("turn.ended", turn_id=failing.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.error) == (
            "failed",
            "error_during_execution: Upstream provider error: 529 overloaded",
        )
        assert session.state == "starting"
        second = await session.prompt("again words=2")
        assert second.queued
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
        assert launcher.resumes == [None, "T-1"]
        await rec.catch_up()
        exited = [e for e in rec.of_kind("agent.exited") if isinstance(e, ev.AgentExited)]
        assert [(e.exit_code, e.expected) for e in exited] == [(0, True)]


async def test_crash_mid_turn_fails_it_and_the_thread_continues(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An exit mid-turn with no ``result`` at all is a crash: the turn fails with the exit."""
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=5, word_interval=0.1))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        crashing = await session.prompt("crash=1 words=3")
        crashed = await rec.wait_kind("turn.ended", turn_id=crashing.id)
        assert isinstance(crashed, ev.TurnEnded) and crashed.outcome == "failed", crashed
        assert crashed.error is not None and "exit 3" in crashed.error
        await session.wait_ready()
        second = await session.prompt("again")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        assert launcher.resumes == [None, "T-1"]


async def test_lost_thread_is_a_resume_failure_and_the_session_goes_on_fresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``threads continue`` of a thread the server lost exits 1 at once: an error event says
    the resume failed, and the session goes on in a fresh thread, never hanging."""
    from fakes.memory_amp import AmpBehaviour, AmpMemoryLauncher

    launcher = AmpMemoryLauncher(AmpBehaviour(words=1000, stop_delay=0.05))
    async with running(launcher, memory_spec(), catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta", role="assistant")
        launcher.threads.clear()  # the server lost the thread
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled"
        failure = await rec.wait_kind("error", code="resume_failed")
        assert isinstance(failure, ev.ErrorEvent) and "exit 1" in failure.message
        await session.wait_ready()
        turn = await session.prompt("again words=2")
        done = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(done, ev.TurnEnded)
        assert done.outcome in ("completed", "failed"), done  # failed: it met the dying one
        assert launcher.resumes[:3] == [None, "T-1", None]


# -- tier 3 ----------------------------------------------------------------------------------


def amp_spec(tmp_path: Path, *extra: str) -> AgentSpec:
    command = [sys.executable, str(FAKE_AMP), *BASE[1:], "--state-dir", str(tmp_path), *extra]
    return AgentSpec(name="amp", protocol="amp", command=command, grace_s=1.0, kill_timeout_s=0.5)


@pytest.mark.parametrize("ignores_sigint", [False, True])
async def test_cancel_through_the_supervisor(tmp_path: Path, ignores_sigint: bool) -> None:
    extra = ("--ignore-sigint",) if ignores_sigint else ()
    with trio.fail_after(30):
        async with open_supervisor(agents={"amp": amp_spec(tmp_path, *extra)}) as sup:
            session = await sup.start_session("amp", cwd=str(tmp_path))
            rec = Recorder(session)
            async with trio.open_nursery() as nursery:
                await nursery.start(rec.run)
                turn = await session.prompt("shell words=1000")
                tool = await rec.wait_kind("tool.call")
                assert isinstance(tool, ev.ToolCall)
                helper = psutil.Process(tool.raw["input"]["pid"])
                await rec.wait_kind("message.delta", role="assistant")
                init = await rec.wait_kind("session.info", info_kind="init")
                assert isinstance(init, ev.SessionInfo)
                thread = init.data["session_id"]
                tree = psutil.Process().children(recursive=True)
                receipt = await session.cancel()
                if ignores_sigint:
                    # SIGTERM, the ladder's first step, ends it cooperatively (as it ends Amp).
                    assert receipt.outcome == "killed"
                    assert receipt.escalation == [
                        "interrupt",
                        "grace_expired",
                        "sigterm",
                        "respawned",
                        "resumed",
                    ]
                else:
                    assert receipt.outcome == "cancelled" and receipt.stop_reason == "cancelled"
                    assert receipt.escalation == ["interrupt", "respawned", "resumed"]
                    assert receipt.elapsed_ms < 1000
                assert receipt.resumed is True and receipt.turn_id == turn.id
                # Terminate-then-respond: the old CLI is gone, the new one runs.
                assert session.state == "ready"
                _, alive = psutil.wait_procs([*tree, helper], timeout=5)
                assert alive == []  # the shell helper in its own session too
                second = await session.prompt("again words=3")
                ended = await rec.wait_kind("turn.ended", turn_id=second.id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
                # The respawned CLI continued the same thread.
                await rec.catch_up()
                continuing = [
                    e
                    for e in rec.of_kind("agent.stderr")
                    if isinstance(e, ev.AgentStderr) and "continuing" in e.line
                ]
                assert continuing and thread in continuing[-1].line
                rec.check_invariants()
                nursery.cancel_scope.cancel()


async def test_lost_thread_goes_on_fresh(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_supervisor(agents={"amp": amp_spec(tmp_path)}) as sup:
            session = await sup.start_session("amp", cwd=str(tmp_path))
            rec = Recorder(session)
            async with trio.open_nursery() as nursery:
                await nursery.start(rec.run)
                await session.prompt("hello words=1000")
                await rec.wait_kind("message.delta", role="assistant")
                for thread_file in tmp_path.glob("T-*"):
                    thread_file.unlink()  # Amp lost the thread
                receipt = await session.cancel()
                assert receipt.outcome == "cancelled"
                # Amp has no handshake in which to refuse the thread: the continued CLI dies at
                # start, maybe under the next prompt (which then fails with its words), and the
                # session goes on in a fresh thread.
                failure = await rec.wait_kind("error", code="resume_failed")
                assert isinstance(failure, ev.ErrorEvent) and "does not exist" in failure.message
                outcomes = []
                for _ in range(3):
                    await session.wait_ready()
                    turn = await session.prompt("again words=2")
                    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
                    assert isinstance(ended, ev.TurnEnded)
                    outcomes.append(ended.outcome)
                    if ended.outcome == "completed":
                        break
                    assert ended.error is not None and "does not exist" in ended.error
                assert outcomes[-1] == "completed"
                nursery.cancel_scope.cancel()
