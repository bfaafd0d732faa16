"""Amp: tier 1 (the machine) and tier 3 (a scripted fake CLI through the real supervisor)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import psutil
import pytest
import trio
import trio.testing

from helpers import Recorder, running
from protocols import events as ev
from protocols.amp import AmpClient
from protocols.machine import SessionEstablished, TurnFinished, UnknownPermission
from supervisor import AgentSpec, open_supervisor

FAKE_AMP = Path(__file__).parent / "fakes" / "fake_amp.py"
BASE = ["amp", "--execute", "--stream-json", "--stream-json-input"]


# -- tier 1 ----------------------------------------------------------------------------------


def test_command_continues_the_thread_on_resume() -> None:
    assert AmpClient.command(BASE, None) == BASE
    assert AmpClient.command(BASE, "T-1") == ["amp", "threads", "continue", "T-1", *BASE[1:]]
    wrapped = ["node", "amp.js", "--execute"]
    assert AmpClient.command(wrapped, "T-1") == [
        "node",
        "amp.js",
        "threads",
        "continue",
        "T-1",
        "--execute",
    ]


def test_established_at_once_and_resumed_when_asked() -> None:
    assert AmpClient().start(cwd="/").events == [SessionEstablished(None, resumed=None)]
    assert AmpClient().start(cwd="/", resume="T-1").events == [
        SessionEstablished("T-1", resumed=True)
    ]


def test_turn_streams_and_ends_at_result() -> None:
    amp = AmpClient()
    amp.start(cwd="/")
    step = amp.prompt("t1", "hello")
    assert step.send == [
        {
            "type": "user",
            "message": {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        }
    ]
    [init] = amp.receive({"type": "system", "subtype": "init", "session_id": "T-9"}).events
    assert isinstance(init, ev.SessionInfo) and init.info_kind == "init"
    assert amp.agent_session_id == "T-9"
    delta = amp.receive(
        {"type": "assistant", "message": {"id": "m1", "content": [{"type": "text", "text": "hi "}]}}
    )
    assert delta.events == [ev.MessageDelta(turn_id="t1", text="hi ")]
    end = amp.receive(
        {"type": "result", "subtype": "success", "is_error": False, "session_id": "T-9"}
    )
    assert end.events == [TurnFinished("t1", "success", interrupted=False)]


def test_cancel_is_one_sigint_and_nothing_in_band() -> None:
    amp = AmpClient()
    amp.start(cwd="/")
    assert amp.cancel().signals == []  # no turn: nothing to stop
    amp.prompt("t1", "hello")
    first = amp.cancel()
    assert (first.send, first.signals) == ([], [signal.SIGINT])
    assert amp.cancel().signals == []  # once per turn
    with pytest.raises(UnknownPermission):
        amp.respond_permission("1", "allow")


def test_error_result_fails_the_turn_with_its_words() -> None:
    """Amp's error form names its text ``error`` (not ``result``): the turn ends with it. The
    same line after our SIGINT is Amp's word for the cancel, left to the actor."""
    amp = AmpClient()
    amp.start(cwd="/")
    amp.prompt("t1", "hello")
    failure = {
        "type": "result",
        "subtype": "error_during_execution",
        "duration_ms": 2558,
        "is_error": True,
        "num_turns": 1,
        "error": "Upstream provider error: 529 overloaded",
        "session_id": "T-9",
    }
    [end] = amp.receive(failure).events
    assert end == TurnFinished(
        "t1",
        "error_during_execution",
        interrupted=None,
        error="error_during_execution: Upstream provider error: 529 overloaded",
    )
    # A second result of the same run (Amp prints one at exit) ends nothing.
    [late] = amp.receive({**failure, "error": "User cancelled (SIGINT/SIGTERM)"}).events
    assert isinstance(late, ev.SessionInfo) and late.info_kind == "result"
    amp.prompt("t2", "again")
    assert amp.cancel().signals == [signal.SIGINT]
    cancelled = {**failure, "error": "User cancelled (SIGINT/SIGTERM)", "num_turns": 0}
    assert amp.receive(cancelled).events == [
        TurnFinished("t2", "error_during_execution", interrupted=None, error=None)
    ]


# -- tier 3 ----------------------------------------------------------------------------------


def amp_spec(tmp_path: Path, *extra: str) -> AgentSpec:
    command = [
        sys.executable,
        str(FAKE_AMP),
        "--execute",
        "--stream-json",
        "--stream-json-input",
        "--state-dir",
        str(tmp_path),
        *extra,
    ]
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
                await rec.wait_kind("message.delta")
                init = await rec.wait_kind("session.info", info_kind="init")
                assert isinstance(init, ev.SessionInfo)
                thread = init.data["session_id"]
                tree = psutil.Process().children(recursive=True)
                receipt = await session.cancel()
                if ignores_sigint:
                    assert receipt.outcome == "killed"
                    assert receipt.escalation == [
                        "interrupt",
                        "grace_expired",
                        "sigterm",
                        "respawned",
                        "resumed",
                    ]
                else:
                    assert receipt.outcome == "cancelled" and receipt.stop_reason == "agent_exited"
                    assert receipt.escalation == ["interrupt", "respawned", "resumed"]
                    assert receipt.elapsed_ms < 1000
                assert receipt.resumed is True and receipt.turn_id == turn.id
                _, alive = psutil.wait_procs([*tree, helper], timeout=5)
                assert alive == []  # the shell helper in its own session too
                second = await session.prompt("again words=3")
                ended = await rec.wait_kind("turn.ended", turn_id=second.id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
                # The respawned CLI continued the same thread.
                inits = [
                    e
                    for e in rec.of_kind("agent.stderr")
                    if isinstance(e, ev.AgentStderr) and "continuing" in e.line
                ]
                assert inits and thread is not None and thread in inits[-1].line
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
                await rec.wait_kind("message.delta")
                for thread_file in tmp_path.glob("T-*"):
                    thread_file.unlink()  # Amp lost the thread
                receipt = await session.cancel()
                assert receipt.outcome == "cancelled"
                # Amp has no handshake in which to refuse the thread: the continued CLI dies at
                # start, maybe under the next prompt (which then fails with its words), and the
                # session goes on in a fresh thread.
                outcomes = []
                for _ in range(3):
                    await session.wait_ready()
                    turn = await session.prompt("again words=2")
                    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
                    assert isinstance(ended, ev.TurnEnded)
                    outcomes.append(ended.outcome)
                    if ended.outcome == "completed":
                        break
                    assert ended.error is not None and "not found" in ended.error
                assert outcomes[-1] == "completed"
                assert [
                    e
                    for e in rec.of_kind("error")
                    if isinstance(e, ev.ErrorEvent) and e.code == "resume_failed"
                ]
                nursery.cancel_scope.cancel()


# -- tier 2 (virtual time) -----------------------------------------------------------------


async def test_sigint_stop_on_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    from fakes.memory_agent import Behaviour
    from fakes.memory_amp import AmpMemoryLauncher

    launcher = AmpMemoryLauncher(Behaviour(words=1000, stop_delay=0.05))
    spec = AgentSpec(name="amp", protocol="amp", command=BASE, grace_s=2.0)
    async with running(launcher, spec, catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(0.05)
        assert receipt.outcome == "cancelled"
        assert receipt.escalation == ["interrupt", "respawned", "resumed"]
        assert launcher.links[0].signals == [signal.SIGINT]
        assert launcher.resumes == [None, "T-1"]
        second = await session.prompt("again words=2")
        ended = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"


async def test_amp_ignoring_sigint_is_killed_at_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from fakes.memory_agent import Behaviour
    from fakes.memory_amp import AmpMemoryLauncher

    launcher = AmpMemoryLauncher(Behaviour(words=1000, stop_delay=None))
    spec = AgentSpec(name="amp", protocol="amp", command=BASE, grace_s=2.0)
    async with open_supervisor(agents={"amp": spec}, launcher=launcher) as sup:
        session = await sup.start_session("amp", cwd="/")
        async with session.subscribe() as events:
            await session.prompt("hello")
            async for event in events:
                if event.kind == "message.delta":
                    break
            t0 = trio.current_time()
            receipt = await session.cancel()
            assert trio.current_time() - t0 == pytest.approx(2.0)
            assert receipt.outcome == "killed" and receipt.resumed is True
            assert launcher.resumes == [None, "T-1"]


async def test_error_result_and_exit_fail_the_turn_on_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Amp's error ``result`` line, and an exit mid-turn with no ``result`` at all: each ends the
    turn ``failed`` with what went wrong, never ``completed``; the session goes on."""
    from fakes.memory_agent import Behaviour
    from fakes.memory_amp import AmpMemoryLauncher

    launcher = AmpMemoryLauncher(Behaviour(words=2, word_interval=0.1))
    spec = AgentSpec(name="amp", protocol="amp", command=BASE, grace_s=2.0)
    async with running(launcher, spec, catch_up=True) as (session, _, rec):
        failing = await session.prompt("fail-turn")
        ended = await rec.wait_kind("turn.ended", turn_id=failing.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.error) == (
            "failed",
            "error_during_execution: Upstream provider error: 529 overloaded",
        )
        crashing = await session.prompt("crash=1 words=3")
        crashed = await rec.wait_kind("turn.ended", turn_id=crashing.id)
        assert isinstance(crashed, ev.TurnEnded) and crashed.outcome == "failed", crashed
        assert crashed.error is not None and "exit 3" in crashed.error
        await session.wait_ready()
        second = await session.prompt("again")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
