"""Tier 2: the public testing kit (``supervisor.testing``), as an application's tests use it.

First, three tests an application could have written (the first, with its ``Chat``, is the
README's example, verbatim): each on the virtual clock, each well under a second of real time. Then the kit's
own options, on every protocol whose agent can do what the option says.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
import trio.testing

from protocols import events as ev
from supervisor import AgentNotRunning, AgentSpec, CancelReceipt, SteerResult
from supervisor.supervisor import AnySession, Supervisor
from supervisor.testing import (
    DEFAULT_REPLY,
    DEFAULT_WORD_DELAY,
    FakeAgent,
    Recorder,
    open_test_supervisor,
    record,
)

pytest_plugins = ["supervisor.testing.pytest_plugin"]

PROTOCOLS = ("acp", "codex", "claude", "opencode", "amp")
#: Those whose agents ask permissions (Amp's stream-json mode has none).
ASKING = ("acp", "codex", "claude", "opencode")
#: Those whose agents answer their handshake: a respawn is ready only once they have.
HANDSHAKING = ("acp", "codex", "claude", "opencode")
#: Real seconds a test on the virtual clock may take, however many virtual ones it waits.
REAL_BOUND_S = 1.0
LONG = "word " * 1000


def said(events: Recorder, turn_id: str | None = None) -> list[str]:
    """What the agent said (not the user's words it echoed), of one turn or all."""
    return [
        e.text
        for e in events.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta)
        and e.role == "assistant"
        and (turn_id is None or e.turn_id == turn_id)
    ]


def is_word(event: ev.Event) -> bool:
    return isinstance(event, ev.MessageDelta) and event.role == "assistant"


@contextmanager
def real_time_under(seconds: float = REAL_BOUND_S) -> Iterator[None]:
    started = time.monotonic()
    yield
    assert time.monotonic() - started < seconds


# -- what an application's tests look like ------------------------------------------------------


class Chat:
    """Your application: its Stop button cancels the running turn and says what became of it."""

    def __init__(self, session: AnySession) -> None:
        self.session = session
        self.status = ""

    async def stop(self) -> CancelReceipt:
        receipt = await self.session.cancel(reason="user")
        self.status = receipt.summary()
        return receipt


async def test_the_stop_button_against_an_agent_that_ignores_it(
    autojump_clock: trio.testing.MockClock,  # pytest-trio's virtual clock
) -> None:
    started = time.monotonic()
    claude = FakeAgent("claude", reply="word " * 1000, on_cancel="ignore", grace_s=3)
    async with open_test_supervisor(agents={"claude": claude}) as sup:
        session = await sup.start_session("claude")
        chat = Chat(session)
        async with record(session) as events:
            await session.prompt("refactor the parser")
            await events.wait_kind("message.delta")  # it is answering
            receipt = await chat.stop()
    assert chat.status == "Killed after 3.0 s grace, session resumed"
    assert (receipt.outcome, receipt.elapsed_ms) == ("killed", 3000.0)
    assert (claude.starts, claude.kills) == (2, 1)  # killed, started again, resumed
    assert time.monotonic() - started < 1.0  # 3 s of grace, on the virtual clock


async def test_a_steer_the_agent_refuses_interrupts_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with real_time_under():
        agent = FakeAgent("acp", reply="word " * 100, steer="refuse")
        async with open_test_supervisor(agents={"agent": agent}) as sup:
            session = await sup.start_session("agent")
            async with record(session) as events:
                first = await session.prompt("write the parser")
                await events.wait_kind("message.delta")
                result = await session.steer("use a table instead")
                steered = await events.wait_kind("turn.ended", turn_id=result.turn_id)
        assert result.mode == "interrupted" and result.receipt is not None
        assert (result.receipt.turn_id, result.receipt.outcome) == (first.id, "cancelled")
        assert result.receipt.reason == "steer" and result.receipt.elapsed_ms == 0.0
        assert result.detail == "cannot steer now (code -32603)"
        assert isinstance(steered, ev.TurnEnded) and steered.outcome == "completed"
        assert agent.prompts == ["write the parser", "use a table instead"]
        assert agent.steers == [] and agent.starts == 1


async def test_a_stalled_turn_is_stopped_by_the_watchdog(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with real_time_under():
        codex = FakeAgent("codex", silent_after=3, word_delay=0.5, stall_s=300)
        async with open_test_supervisor(agents={"codex": codex}) as sup:
            session = await sup.start_session("codex")
            async with record(session) as events:
                turn = await session.prompt("migrate the database")
                await events.wait_kind("message.delta", count=3)
                last_word = trio.current_time()
                stalled = await events.wait_kind("turn.stalled")
                assert trio.current_time() - last_word == 300.0
                ended = await events.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(stalled, ev.TurnStalled) and stalled.silent_s == 300.0
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.reason) == ("cancelled", "stalled")
        assert [e.text for e in events.of_kind("message.delta")] == ["Hello ", "from ", "the "]


# -- the kit's options ---------------------------------------------------------------------------


async def cancel_while_answering(fake: FakeAgent) -> tuple[CancelReceipt, float, Recorder]:
    """A cancel once the fake has said its first word: the receipt, the virtual seconds the
    cancel took, and the session's events."""
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            await session.prompt("go")
            await events.wait_kind("message.delta")
            t0 = trio.current_time()
            receipt = await session.cancel()
            took = trio.current_time() - t0
            await events.catch_up()
            events.check_invariants()
    assert fake.violations == []
    return receipt, took, events


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_on_cancel_stop_ends_the_turn_at_once(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply=LONG)
    receipt, took, _ = await cancel_while_answering(fake)
    assert (receipt.outcome, receipt.elapsed_ms, took) == ("cancelled", 0.0, 0.0)
    assert fake.kills == 0
    # Amp ends its whole run on the signal that cancels: started again, with the thread.
    assert fake.starts == (2 if protocol == "amp" else 1)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_on_cancel_seconds_end_the_turn_that_much_later(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    receipt, took, _ = await cancel_while_answering(
        FakeAgent(protocol, reply=LONG, on_cancel=0.75, grace_s=3)
    )
    assert (receipt.outcome, receipt.elapsed_ms, took) == ("cancelled", 750.0, 0.75)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_on_cancel_ignore_is_killed_at_the_grace_and_resumed(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply=LONG, on_cancel="ignore", grace_s=3)
    receipt, took, _ = await cancel_while_answering(fake)
    assert (receipt.outcome, receipt.elapsed_ms, took) == ("killed", 3000.0, 3.0)
    assert receipt.escalation == ["interrupt", "grace_expired", "sigterm", "respawned", "resumed"]
    assert receipt.resumed is True
    assert (fake.starts, fake.kills) == (2, 1)
    first, second = fake.processes
    assert first.killed == ["sigterm"] and second.killed is None  # closed as the test ended
    assert first.resumed is None and second.resumed is not None


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_the_respawn_takes_the_start_delay(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    """Amp has no handshake: its session is ready as its process starts, whatever it does."""
    fake = FakeAgent(protocol, reply=LONG, on_cancel="ignore", grace_s=3, start_delay=0.25)
    receipt, _, _ = await cancel_while_answering(fake)
    assert receipt.outcome == "killed"
    assert receipt.elapsed_ms == (3250.0 if protocol in HANDSHAKING else 3000.0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_ignores_sigterm_adds_the_kill_timeout(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(
        protocol, reply=LONG, on_cancel="ignore", ignores_sigterm=True, grace_s=3, kill_timeout_s=2
    )
    receipt, _, _ = await cancel_while_answering(fake)
    assert (receipt.outcome, receipt.elapsed_ms) == ("killed", 5000.0)
    assert receipt.escalation[:4] == ["interrupt", "grace_expired", "sigterm", "sigkill"]
    assert fake.processes[0].killed == ["sigterm", "sigkill"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_on_cancel_crash_ends_the_turn_and_the_agent_starts_again(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    """The receipt waits for the new process to be ready, its ``start_delay`` later."""
    fake = FakeAgent(protocol, reply=LONG, on_cancel="crash", grace_s=3, start_delay=0.25)
    receipt, took, events = await cancel_while_answering(fake)
    respawn = 0.25 if protocol in HANDSHAKING else 0.0
    assert (receipt.outcome, receipt.elapsed_ms, took) == ("cancelled", 1000 * respawn, respawn)
    assert receipt.escalation == ["interrupt", "respawned", "resumed"]
    assert (fake.starts, fake.kills) == (2, 0)
    [exited] = events.of_kind("agent.exited")
    assert isinstance(exited, ev.AgentExited) and exited.exit_code == 3


@pytest.mark.parametrize("protocol", [p for p in PROTOCOLS if p != "amp"])
async def test_resumes_false_starts_afresh(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply=LONG, on_cancel="ignore", grace_s=3, resumes=False)
    receipt, _, _ = await cancel_while_answering(fake)
    assert receipt.outcome == "killed" and receipt.resumed is False
    assert "fresh session" in receipt.summary()


async def test_amp_says_it_resumed_before_its_lost_thread_shows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Amp's ``threads continue`` has no answer to wait for: the respawn counts as resumed
    when it starts, and its exit at once (the thread is gone) starts it afresh after."""
    fake = FakeAgent("amp", reply=LONG, on_cancel="ignore", grace_s=3, resumes=False)
    receipt, _, _ = await cancel_while_answering(fake)
    assert receipt.outcome == "killed" and receipt.resumed is True
    assert fake.starts == 3 and fake.processes[2].resumed is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_the_reply_comes_a_word_at_a_time(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply="one two  three\n", word_delay=0.25)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            t0 = trio.current_time()
            turn = await session.prompt("count")
            ended = await events.wait_kind("turn.ended", turn_id=turn.id)
            assert trio.current_time() - t0 == 0.75
    assert said(events, turn.id) == ["one ", "two  ", "three\n"]
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
    assert fake.prompts == ["count"] and fake.received and fake.sent


async def test_replies_in_turn_or_from_the_prompt(autojump_clock: trio.testing.MockClock) -> None:
    in_turn = FakeAgent(reply=["first", "second"])
    echo = FakeAgent("codex", reply=lambda prompt: f"you said {prompt}")
    assert DEFAULT_WORD_DELAY == 0.1
    async with open_test_supervisor(agents={"in_turn": in_turn, "echo": echo}) as sup:
        said: dict[str, list[str]] = {}
        for name, prompts in (("in_turn", ["a", "b", "c"]), ("echo", ["hi"])):
            session = await sup.start_session(name)
            async with record(session) as events:
                for text in prompts:
                    turn = await session.prompt(text)
                    await events.wait_kind("turn.ended", turn_id=turn.id)
                said[name] = [
                    "".join(
                        e.text
                        for e in events.of_kind("message.delta")
                        if e.turn_id == started.turn_id
                    )
                    for started in events.of_kind("turn.started")
                    if isinstance(started, ev.TurnStarted)
                ]
    assert said == {"in_turn": ["first", "second", "second"], "echo": ["you said hi"]}


@pytest.mark.parametrize("protocol", ASKING)
async def test_permission_is_asked_before_the_answer(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, permission=True)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            turn = await session.prompt("clean up")
            asked = await events.wait_kind("permission.requested")
            assert isinstance(asked, ev.PermissionRequested) and asked.turn_id == turn.id
            await trio.sleep(3600)  # it waits for a person, however long
            assert said(events) == []
            await session.respond_permission(asked.request_id, asked.options[0].option_id)
            ended = await events.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
    assert "".join(said(events)) == DEFAULT_REPLY


@pytest.mark.parametrize("protocol", ASKING)
async def test_a_cancel_answers_a_pending_permission(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, permission=True)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            await session.prompt("clean up")
            await events.wait_kind("permission.requested")
            receipt = await session.cancel()
            resolved = await events.wait_kind("permission.resolved")
    assert receipt.outcome == "cancelled" and "permissions_cancelled" in receipt.escalation
    assert isinstance(resolved, ev.PermissionResolved) and resolved.by == "supervisor"


@pytest.mark.parametrize("protocol", ["acp", "codex", "claude", "amp"])
async def test_steer_inject_takes_the_text_into_the_running_turn(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply="word " * 20, steer="inject")
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            turn = await session.prompt("go")
            await events.wait_kind("message.delta")
            result = await session.steer("and add tests")
            ended = await events.wait_kind("turn.ended", turn_id=turn.id)
    assert (result.mode, result.turn_id, result.receipt) == ("injected", turn.id, None)
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
    assert fake.steers == ["and add tests"] and fake.prompts == ["go"]
    said = "".join(e.text for e in events.of_kind("message.delta"))
    # Amp echoes the steered text as the user's; the others say it back.
    assert ("and add tests" if protocol == "amp" else "steered:and add tests") in said


async def steer_while_answering(fake: FakeAgent) -> SteerResult:
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            await session.prompt("go")
            await events.wait_kind("message.delta")
            result = await session.steer("instead")
            await events.wait_kind("turn.ended", turn_id=result.turn_id)
    return result


@pytest.mark.parametrize("protocol", ["acp", "codex", "claude"])
async def test_steer_refuse_makes_the_turn_give_way(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply="word " * 20, steer="refuse")
    result = await steer_while_answering(fake)
    assert result.mode == "interrupted" and result.receipt is not None
    assert result.receipt.reason == "steer" and result.detail
    assert fake.steers == [] and fake.prompts == ["go", "instead"]


@pytest.mark.parametrize("protocol", ["acp", "opencode"])
async def test_agents_that_do_not_steer_make_way_for_the_text(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply="word " * 20)
    result = await steer_while_answering(fake)
    assert (result.mode, result.detail) == ("interrupted", None)
    assert fake.prompts == ["go", "instead"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_silent_after_is_stopped_by_the_watchdog(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    with real_time_under():
        fake = FakeAgent(protocol, silent_after=2, stall_s=300)
        async with open_test_supervisor(agents={"fake": fake}) as sup:
            session = await sup.start_session("fake")
            async with record(session) as events:
                turn = await session.prompt("go")
                await events.wait_for(is_word, count=2)
                last_word = trio.current_time()
                ended = await events.wait_kind("turn.ended", turn_id=turn.id)
                assert trio.current_time() - last_word == 300.0
    assert isinstance(ended, ev.TurnEnded) and (ended.outcome, ended.reason) == (
        "cancelled",
        "stalled",
    )
    # It logged all along: stderr is not the agent saying something about the turn.
    assert len(events.of_kind("agent.stderr")) >= 299


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_tool_call_longer_than_tool_stall_s_is_stopped(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, tool_s=600, tool_stall_s=60)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            t0 = trio.current_time()
            turn = await session.prompt("run the tests")
            stalled = await events.wait_kind("turn.stalled")
            assert trio.current_time() - t0 == 60.0
            ended = await events.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(stalled, ev.TurnStalled)
    assert (stalled.stall_s, stalled.tool_calls) == (60.0, ["call_tool"])
    assert isinstance(ended, ev.TurnEnded) and ended.reason == "stalled"
    assert said(events) == []  # stopped before its first word


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_tool_call_is_not_a_stall_by_default(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, tool_s=3600, stall_s=300)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            t0 = trio.current_time()
            turn = await session.prompt("run the tests")
            ended = await events.wait_kind("turn.ended", turn_id=turn.id)
            assert trio.current_time() - t0 == pytest.approx(3600.5, abs=1e-9)
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
    [call] = events.of_kind("tool.call")
    assert isinstance(call, ev.ToolCall) and call.tool_call_id == "call_tool"


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_fail_turn_fails_and_max_failed_turns_recycles(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, fail_turn=True, max_failed_turns=2)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            for text in ("one", "two"):
                await session.wait_ready()
                turn = await session.prompt(text)
                ended = await events.wait_kind("turn.ended", turn_id=turn.id)
                assert isinstance(ended, ev.TurnEnded)
                assert ended.outcome == "failed" and ended.error
            await events.wait_kind("session.recycled")
            await session.wait_ready()
    if protocol == "amp":
        # Amp's failed turn ends its run (it exits 0): started again after each.
        assert fake.starts == 3
    else:
        assert (fake.starts, fake.kills) == (2, 1)
        assert fake.processes[1].resumed is not None


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_crash_after_fails_the_turn_and_the_agent_starts_again(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, crash_after=2)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            turn = await session.prompt("go")
            ended = await events.wait_kind("turn.ended", turn_id=turn.id)
            await session.wait_ready()
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
    assert ended.error is not None and "exit 3" in ended.error
    assert len(said(events)) == 2
    assert (fake.starts, fake.kills) == (2, 0)


async def test_what_each_process_received_and_sent(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeAgent("acp", reply=LONG, on_cancel="ignore", grace_s=1)
    await cancel_while_answering(fake)
    first, second = fake.processes
    assert [m.get("method") for m in first.received[:3]] == [
        "initialize",
        "session/new",
        "session/prompt",
    ]
    assert first.received[-1]["method"] == "session/cancel"
    assert first.sent[0]["result"]["agentCapabilities"]["loadSession"] is True
    load = [m for m in second.received if m.get("method") == "session/load"]
    assert load[0]["params"]["sessionId"] == second.resumed
    assert first.prompts == ["go"] and second.prompts == []
    assert fake.received == first.received + second.received
    assert "killed" in repr(first) and "2 starts, 1 kills" in repr(fake)


async def test_max_memory_mb_restarts_an_agent_that_holds_too_much(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeAgent(reply=LONG, max_memory_mb=500)
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            turn = await session.prompt("go")
            await events.wait_kind("message.delta")
            fake.processes[0].memory_mb = 700
            ended = await events.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded) and ended.reason == "memory_limit"
    assert fake.starts == 2


async def test_a_spec_option_reaches_the_spec(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeAgent("codex", grace_s=1.5, stall_s=None, max_failed_turns=0)
    assert (fake.spec.grace_s, fake.spec.stall_s, fake.spec.max_failed_turns) == (1.5, None, 0)
    async with open_test_supervisor(agents={"coder": fake}, session_ids=lambda: "mine") as sup:
        session = await sup.start_session("coder")
        assert session.id == "mine" and session.spec.name == "coder"
        assert session.spec.grace_s == 1.5 and session.spec.protocol == "codex"
        with pytest.raises(AgentNotRunning, match="no FakeAgent is named 'other'"):
            await sup.start_session(AgentSpec(name="other", protocol="acp", command=["x"]))


@pytest.mark.parametrize(
    ("protocol", "options", "error"),
    [
        ("gemini", {}, "a FakeAgent speaks acp, codex, claude, opencode, amp"),
        ("amp", {"permission": True}, "no permission protocol"),
        ("amp", {"steer": "refuse"}, "takes every steer"),
        ("opencode", {"steer": "inject"}, "cannot steer"),
        ("acp", {"on_cancel": "later"}, "'stop', 'ignore', 'crash' or seconds"),
        ("acp", {"on_cancel": -1}, "not negative"),
        ("acp", {"reply": []}, "non-empty sequence"),
    ],
)
def test_what_a_fake_cannot_do_is_refused(
    protocol: str, options: dict[str, object], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        FakeAgent(protocol, **options)  # type: ignore[arg-type]


def test_spec_options_are_checked_as_the_spec_checks_them() -> None:
    with pytest.raises(TypeError, match="grace"):
        FakeAgent(grace=3)
    with pytest.raises(TypeError, match="name"):
        FakeAgent(name="x")


def test_the_test_supervisor_refuses_the_real_clock() -> None:
    async def main() -> None:
        async with open_test_supervisor(agents={"fake": FakeAgent()}):
            raise AssertionError("not reached")

    with pytest.raises(RuntimeError, match="MockClock"):
        trio.run(main)


def test_the_kit_imports_without_pytest() -> None:
    blocked = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pytest', '_pytest', 'pytest_trio'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import supervisor.testing\n"
        "print(sorted(supervisor.testing.__all__))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, check=True, timeout=60
    )
    assert "FakeAgent" in out.stdout


# -- the pytest plugin's fixtures ----------------------------------------------------------------


@pytest.fixture
def fake_agents() -> dict[str, FakeAgent]:
    return {"claude": FakeAgent("claude", reply=LONG, on_cancel="ignore", grace_s=2)}


async def test_the_fixtures_give_a_test_supervisor_of_the_fake_agents(
    autojump_clock: trio.testing.MockClock,
    test_supervisor: Supervisor,
    fake_agents: dict[str, FakeAgent],
) -> None:
    with real_time_under():
        session = await test_supervisor.start_session("claude")
        async with record(session) as events:
            await session.prompt("go")
            await events.wait_kind("message.delta")
            receipt = await session.cancel()
        assert (receipt.outcome, receipt.elapsed_ms) == ("killed", 2000.0)
        assert isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)
        assert fake_agents["claude"].kills == 1
