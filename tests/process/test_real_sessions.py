"""Tier 3: the whole supervisor against the real demo agent, as subprocesses, on the real clock.

The demo agent's modes beyond the cancel contract: a slow stop within the grace, an agent
that ignores SIGTERM too, a crash, garbage and huge lines, a supervisor left in every way, an
agent that closes stdout, tools a cancelled turn left running, recycling, odd JSON values.
What every protocol's agent does when a cancel is obeyed, ignored, or meets a pending
permission is the contract, ``test_cancel_contract_process.py``. Bounds are generous (these machines are shared and slow); exact timing is the
virtual-time tests' job.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import psutil
import pytest
import trio
from faults.harness import tree as harness_tree

from helpers import Recorder, process_session
from protocols import events as ev
from supervisor import AgentSpec, Session, open_supervisor

pytestmark = pytest.mark.real_process

GRACE = 1.0
BOUND = 30.0  # generous: a stuck test fails instead of hanging the suite


def demo(*args: str, **changes: object) -> AgentSpec:
    spec = AgentSpec.from_config("demo").with_args("--delay", "0.02", *args)
    return spec.with_options(**{"grace_s": GRACE, "kill_timeout_s": 0.5, **changes})


def tree_of_this_test() -> list[psutil.Process]:
    """Every agent process of this test's supervisors, whatever the containment."""
    return harness_tree()


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == [], f"still alive: {alive}"


def demo_session(
    *args: str, state_dir: str, **changes: object
) -> AbstractAsyncContextManager[tuple[Session, Recorder]]:
    return process_session(demo("--state-dir", state_dir, *args, **changes), "/", bound=BOUND)


async def second_prompt_completes(session: Session, rec: Recorder) -> None:
    turn = await session.prompt("again words=3")
    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert ended.outcome == "completed", ended


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


async def test_slow_to_stop_within_grace(tmp_path: object) -> None:
    # A 0.3 s stop against a grace ten times longer: a loaded machine (the suite runs on two
    # workers) must not turn the agent's slow stop into a kill.
    grace = 3.0
    async with demo_session("--stop-delay", "0.3", state_dir=str(tmp_path), grace_s=grace) as (
        session,
        rec,
    ):
        await session.prompt("hello")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled", receipt
        assert 250 <= receipt.elapsed_ms < grace * 1000
        await second_prompt_completes(session, rec)


async def test_ignores_sigterm_gets_sigkill(tmp_path: object) -> None:
    args = ("--ignore-cancel", "--ignore-sigterm")
    async with demo_session(*args, state_dir=str(tmp_path)) as (session, rec):
        await session.prompt("hello words=10000")
        await rec.wait_for(is_delta)
        before = tree_of_this_test()
        receipt = await session.cancel()
        assert receipt.outcome == "killed"
        assert receipt.escalation[:4] == ["interrupt", "grace_expired", "sigterm", "sigkill"]
        assert receipt.escalation[4:] == ["respawned", "resumed"]
        assert_all_gone(before)
        await second_prompt_completes(session, rec)


async def test_crash_mid_turn_fails_turn_and_recovers(tmp_path: object) -> None:
    async with demo_session(state_dir=str(tmp_path)) as (session, rec):
        turn = await session.prompt("please crash")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
        assert ended.error is not None and "exit 3" in ended.error
        assert "crashing as asked" in ended.error  # the agent's last words, from stderr
        await session.wait_ready()
        await second_prompt_completes(session, rec)


async def test_garbage_lines_become_errors(tmp_path: object) -> None:
    async with demo_session(state_dir=str(tmp_path)) as (session, rec):
        turn = await session.prompt("garbage words=3")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        codes = sorted(e.code for e in rec.of_kind("error") if isinstance(e, ev.ErrorEvent))
        assert codes == [
            "agent_invalid_json",
            "agent_invalid_utf8",
            "agent_not_an_object",
            "agent_too_deep",
        ]
        assert rec.of_kind("agent.unparsed")  # the JSON object that is not JSON-RPC
        # The history replays whole (a line too deep to encode once crashed the session).
        async with session.subscribe(since_seq=0) as replay:
            replayed = [event async for event in _until_seq(replay, ended.seq)]
        assert [e.seq for e in replayed] == list(range(1, ended.seq + 1))
        await second_prompt_completes(session, rec)


async def _until_seq(events: AsyncIterator[ev.Event], last: int) -> AsyncIterator[ev.Event]:
    async for event in events:
        yield event
        if event.seq >= last:
            return


async def test_huge_line_is_bounded_and_reported(tmp_path: object) -> None:
    async with demo_session(state_dir=str(tmp_path)) as (session, rec):
        rss_before = psutil.Process().memory_info().rss
        turn = await session.prompt("huge words=3")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        [error] = [e for e in rec.of_kind("error") if isinstance(e, ev.ErrorEvent)]
        assert error.code == "agent_oversize"
        grown = psutil.Process().memory_info().rss - rss_before
        assert grown < 45 * 1024 * 1024, f"supervisor grew by {grown} bytes for a 50 MB line"
        await second_prompt_completes(session, rec)


class Boom(Exception):
    pass


@pytest.mark.parametrize("how", ["normally", "exception", "outer_cancel"])
async def test_leaving_open_supervisor_leaves_no_process(how: str, tmp_path: object) -> None:
    spec = demo("--state-dir", str(tmp_path), "--ignore-cancel", "--ignore-sigterm")
    tree: list[psutil.Process] = []
    with trio.move_on_after(BOUND) as outer:
        try:
            async with open_supervisor(agents={"demo": spec}) as sup:
                for _ in range(2):
                    session = await sup.start_session("demo", cwd="/")
                    async with session.subscribe() as events:
                        await session.prompt("grandchildren words=10000")
                        async for event in events:
                            if event.kind == "message.delta":
                                break
                tree = tree_of_this_test()
                assert len(tree) >= 2 * 5  # 2 x (agent, 4 leaked helpers; and maybe a shim)
                if how == "exception":
                    raise Boom
                if how == "outer_cancel":
                    outer.cancel()
                    await trio.sleep_forever()
        except Boom:
            pass
    assert not outer.cancelled_caught or how == "outer_cancel"
    assert_all_gone(tree)
    assert tree_of_this_test() == []


async def test_agent_closing_stdout_but_staying_alive_is_killed(tmp_path: object) -> None:
    async with demo_session(state_dir=str(tmp_path)) as (session, rec):
        before = tree_of_this_test()
        turn = await session.prompt("mute")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
        assert_all_gone(before)
        await session.wait_ready()
        await second_prompt_completes(session, rec)


async def test_tools_left_running_by_a_cancelled_turn_are_killed(tmp_path: object) -> None:
    """The agent ends the turn at once but leaves the turn's processes running (codex-acp does
    that with a shell command): they are killed before the receipt; the agent lives on."""
    async with demo_session(state_dir=str(tmp_path)) as (session, rec):
        agent_before = tree_of_this_test()
        await session.prompt("grandchildren words=10000")
        tool = await rec.wait_kind("tool.call")
        assert isinstance(tool, ev.ToolCall)
        leaked = [psutil.Process(pid) for pid in tool.raw["rawOutput"]["pids"]]
        receipt = await session.cancel()
        assert receipt.outcome == "cancelled"
        assert receipt.escalation == ["interrupt", "tools_killed"]
        killed = receipt.details["tool_processes_killed"]
        assert sorted(k["pid"] for k in killed) == sorted(p.pid for p in leaked)
        assert all(k["command"] for k in killed)
        assert [p for p in leaked if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
        assert all(p.is_running() for p in agent_before)  # the agent and its shim live on
        await second_prompt_completes(session, rec)


async def test_an_agent_failing_turn_after_turn_is_recycled(tmp_path: object) -> None:
    """Three failed turns in a row: the demo agent process is replaced, the session resumed
    (the new process loads it), told in an event and in the gateway's ``session.list``."""
    async with demo_session(state_dir=str(tmp_path)) as (session, rec):
        first = session._link
        for _ in range(3):
            turn = await session.prompt("fail")
            ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed", ended
        recycled = await rec.wait_kind("session.recycled")
        assert isinstance(recycled, ev.SessionRecycled) and recycled.failed_turns == 3
        await session.wait_ready()
        assert session._link is not first  # a new agent process
        await second_prompt_completes(session, rec)
        assert any(
            isinstance(e, ev.AgentStderr) and e.line.startswith("demo-agent: loading session ")
            for e in rec.events
        ), "the new agent did not resume the session"
        assert session.summary().recycles == 1


#: An ACP agent whose ids and input hold what JSON allows and UTF-8 or JSON numbers do not: a
#: lone surrogate (its ``\ud800`` escape) and NaN. It asks for a method we do not serve and for
#: a permission, and reports the ids our answers carried back as its answer's text.
_ODD_VALUES_AGENT = r"""
import json, sys
def out(text): sys.stdout.write(text + "\n"); sys.stdout.flush()
def send(message): out(json.dumps(message))
got = []
prompt = None
for line in sys.stdin:
    message = json.loads(line)
    method, rid = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "odd\ud800"}})
    elif method == "session/prompt":
        prompt = rid
        out(r'{"jsonrpc":"2.0","id":"m\ud800","method":"_odd/unknown","params":{}}')
        out(r'{"jsonrpc":"2.0","id":"p\udfff","method":"session/request_permission","params":{"sessionId":"odd\ud800","toolCall":{"toolCallId":"t","rawInput":{"x":NaN}},"options":[{"optionId":"a","name":"A","kind":"allow_once"}]}}')
    elif method is None and rid is not None:
        got.append(rid)
        if len(got) == 2:
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": json.dumps(got)}}
            send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "odd\ud800", "update": update}})
            send({"jsonrpc": "2.0", "id": prompt, "result": {"stopReason": "end_turn"}})
"""


async def test_odd_values_the_agent_sent_go_back_to_it_exactly(tmp_path: Path) -> None:
    # Echoed back, each once crashed the session (UnicodeEncodeError in the actor), raised out
    # of respond_permission (NaN) with the request lost, or made every prompt raise.
    agent = tmp_path / "odd.py"
    agent.write_text(_ODD_VALUES_AGENT)
    spec = AgentSpec(name="odd", protocol="acp", command=[sys.executable, str(agent)])
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"odd": spec}) as sup:
            session = await sup.start_session("odd", cwd="/")
            async with session.subscribe() as events:
                turn = await session.prompt("go")
                text = ""
                async for event in events:
                    if isinstance(event, ev.PermissionRequested):
                        await session.respond_permission(event.request_id, "a")
                    elif isinstance(event, ev.MessageDelta):
                        text += event.text
                    elif isinstance(event, ev.TurnEnded) and event.turn_id == turn.id:
                        assert event.outcome == "completed"
                        break
            assert sorted(json.loads(text)) == ["m\ud800", "p\udfff"]
            assert session.state == "ready"


async def test_a_killed_agent_that_cannot_resume_answers_with_the_conversation_in_mind(
    tmp_path: Path,
) -> None:
    """The demo agent advertising no ``loadSession`` (as Gemini answers a resume with a fresh
    session): killed past its grace, its fresh session gets the conversation so far with the
    next prompt, and its answer shows it; an earlier prompt's directives are not run again."""
    args = ("--ignore-cancel", "--no-load")
    async with demo_session(*args, state_dir=str(tmp_path)) as (session, rec):
        first = await session.prompt("remember the number 42 words=3")
        await rec.wait_kind("turn.ended", turn_id=first.id)
        await session.prompt("tell a long story words=10000")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.resumed) == ("killed", False), receipt
        turn = await session.prompt("what was the number?")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
        started = await rec.wait_kind("turn.started", turn_id=turn.id)
        assert isinstance(started, ev.TurnStarted)
        assert (started.text, started.context) == ("what was the number?", "injected")
        answer = "".join(
            e.text
            for e in rec.of_kind("message.delta")
            if isinstance(e, ev.MessageDelta) and e.turn_id == turn.id
        )
        assert 'you last said "tell a long story words=10000"' in answer
        assert len(answer.split()) < 100  # its own words=N only: the default 40, not 10000
        await second_prompt_completes(session, rec)
        again = rec.of_kind("turn.started")[-1]
        assert isinstance(again, ev.TurnStarted) and again.context is None
