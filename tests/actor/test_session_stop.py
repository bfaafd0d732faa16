"""Tier 2: stopping a session, on virtual time with in-memory agents: calls that meet a stop
under way, a stop of a failed session, and starts nobody holds any more.

A stop is the end of a session, so whatever meets it must hear that, never a made-up error: a
second ``stop()`` joins the first, a ``cancel()`` gets the turn's receipt once the turn has
ended with the agent, and a failed session can be stopped (and is then forgotten) like any
other.
"""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from helpers import running
from protocols import events as ev
from supervisor import AgentNotRunning, AgentSpec, open_supervisor
from supervisor.testing import record
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

GRACE = 2.0


def fake_spec(**changes: object) -> AgentSpec:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=GRACE)
    return spec.with_options(**changes) if changes else spec


#: An agent that ignores the interrupt and takes a while to exit once its stdin closes.
SLOW_TO_STOP = AcpBehaviour(words=1000, stop_delay=None, close_time=0.5)


async def test_a_second_stop_joins_the_first(autojump_clock: trio.testing.MockClock) -> None:
    launcher = AcpLauncher(SLOW_TO_STOP)
    async with running(launcher, fake_spec()) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        statuses: list[object] = []

        async def stop() -> None:
            statuses.append(await session.stop())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop)
            await trio.sleep(0.01)  # the first stop is under way
            nursery.start_soon(stop)
        assert len(statuses) == 2 and statuses[0] == statuses[1]
        assert session.state == "stopped"
        assert await session.stop() == statuses[0]  # and once it is over, too


async def test_a_cancel_during_a_stop_gets_the_turns_receipt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(SLOW_TO_STOP)
    async with running(launcher, fake_spec()) as (session, _, rec):
        turn = await session.prompt("hello")
        await rec.wait_kind("message.delta")
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.stop)
            await trio.sleep(0.1)
            receipt = await session.cancel()
            # Answered once the turn has ended with the agent, saying what that took.
            assert trio.current_time() == pytest.approx(t0 + 0.5)
            await rec.catch_up()
            ended = rec.of_kind("turn.ended")
            assert [e.turn_id for e in ended] == [turn.id]
            assert receipt.turn_id == turn.id
            assert receipt.outcome == "cancelled" and receipt.stop_reason == "session_stopped"
            assert receipt.escalation == ["interrupt"]
            assert not launcher.links[0].alive
        with pytest.raises(AgentNotRunning, match="is stopped"):
            await session.prompt("again")


async def test_other_calls_during_a_stop_are_told_it_is_stopping(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(SLOW_TO_STOP)
    async with running(launcher, fake_spec()) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.stop)
            await trio.sleep(0.01)
            with pytest.raises(AgentNotRunning, match="is stopping"):
                await session.prompt("again")
            with pytest.raises(AgentNotRunning, match="is stopping"):
                await session.steer("now")


async def test_a_stop_answers_a_pending_permission_and_says_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=100, permission=True))
    async with running(launcher, fake_spec()) as (session, _, rec):
        await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        await session.stop()
        await rec.catch_up()
        resolved = rec.of_kind("permission.resolved")
        assert [(e.request_id, e.outcome, e.by) for e in resolved] == [
            (requested.request_id, "cancelled", "supervisor")
        ]
        assert resolved[0].seq < rec.of_kind("turn.ended")[0].seq
        # ... and the agent is told, before its stdin closes
        answers = [m for m in launcher.links[0].sent if str(m.get("id")) == requested.request_id]
        assert [m.get("result") for m in answers] == [{"outcome": {"outcome": "cancelled"}}]


async def test_a_failed_session_can_be_stopped_and_is_then_forgotten(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=1000, stop_delay=None), crash_on_launch={2})
    async with open_supervisor(agents={"fake": fake_spec()}, launcher=launcher) as sup:
        session = await sup.start_session("fake", cwd="/")
        await session.prompt("hello")
        await session.cancel()  # killed; its respawn dies at once: the session fails
        assert session.state == "failed"
        assert [s.session_id for s in sup.list()] == [session.id]
        assert await sup.stop_session(session.id) is None
        assert sup.list() == []
        assert session.state == "failed"  # it failed; stopping it does not rewrite that
        assert await session.stop() is None  # and again: nothing to do
        with pytest.raises(AgentNotRunning, match="is failed"):
            await session.prompt("again")


async def test_a_receipt_of_a_session_that_failed_waits_for_the_failed_agent_to_die(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The respawn after the kill hangs in its handshake: the session fails at its start
    timeout, and the receipt says so once that agent (deaf to SIGTERM) is gone too."""
    launcher = AcpLauncher(AcpBehaviour(words=1000, stop_delay=None))
    spec = fake_spec(start_timeout_s=5.0)
    async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
        session = await sup.start_session("fake", cwd="/")
        async with record(session) as recorder:
            await session.prompt("hello")
            await recorder.wait_kind("message.delta")
            launcher.behaviour = attrs.evolve(
                launcher.behaviour, start_delay=1000.0, ignores_sigterm=True
            )
            t0 = trio.current_time()
            receipt = await session.cancel()
            # The grace, the kill (SIGTERM ignored: 1 s), the respawn's start timeout (5 s),
            # then the kill of what hung (1 s again): only then the receipt.
            assert trio.current_time() == pytest.approx(t0 + GRACE + 1.0 + 5.0 + 1.0)
            assert len(launcher.links) == 2 and not any(link.alive for link in launcher.links)
            assert receipt.outcome == "killed"
            assert receipt.resumed is None
            assert receipt.session_failed is not None and "5" in receipt.session_failed
            assert "fresh session" not in receipt.summary()
            assert receipt.summary().endswith("session failed")
            assert session.state == "failed"
            ended = recorder.of_kind("turn.ended")
            assert len(ended) == 1 and isinstance(ended[0], ev.TurnEnded)
            assert ended[0].receipt is not None
            assert ended[0].receipt["session_failed"] == receipt.session_failed


async def test_a_start_that_fails_leaves_no_session_behind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(fail_start=True))
    async with open_supervisor(agents={"fake": fake_spec()}, launcher=launcher) as sup:
        for _ in range(3):
            with pytest.raises(AgentNotRunning):
                await sup.start_session("fake", cwd="/")
        await trio.testing.wait_all_tasks_blocked()
        assert sup.list() == []


async def test_a_start_whose_caller_goes_away_leaves_no_session_behind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(start_delay=10.0))
    async with open_supervisor(agents={"fake": fake_spec()}, launcher=launcher) as sup:
        with trio.move_on_after(1.0):
            await sup.start_session("fake", cwd="/")
        await trio.sleep(20.0)
        assert sup.list() == []
        assert len(launcher.links) == 1 and not launcher.links[0].alive


async def test_after_a_shutdown_began_no_new_turn_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``cancel_turns`` (a graceful shutdown's first step) ends the running turns; a prompt or a
    steer sent after it would start a turn the shutdown cuts off without its end."""
    launcher = AcpLauncher(AcpBehaviour(words=1000))
    async with open_supervisor(agents={"fake": fake_spec()}, launcher=launcher) as sup:
        session = await sup.start_session("fake", cwd="/")
        await session.prompt("hello")
        await sup.cancel_turns("shutdown")
        assert session.turn_id is None
        with pytest.raises(AgentNotRunning, match="shutting down"):
            await session.prompt("one more")
        with pytest.raises(AgentNotRunning, match="shutting down"):
            await session.steer("this instead")
        assert session.turn_id is None


async def test_a_start_whose_caller_goes_away_keeps_a_session_somebody_took_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Listed while it starts, a session can be taken up by another client (a gateway's):
    then its starter going away does not stop it."""
    launcher = AcpLauncher(AcpBehaviour(start_delay=10.0, words=2))
    async with open_supervisor(agents={"fake": fake_spec()}, launcher=launcher) as sup:
        async with trio.open_nursery() as nursery:
            starting = trio.CancelScope()

            async def start() -> None:
                with starting:
                    await sup.start_session("fake", cwd="/")

            nursery.start_soon(start)
            await trio.sleep(1.0)
            [summary] = sup.list()
            other = sup.get(summary.session_id)
            async with other.subscribe() as events:
                turn = await other.prompt("hello")  # queued until it is ready
                starting.cancel()
                async for event in events:
                    if event.kind == "turn.ended" and event.turn_id == turn.id:
                        break
            assert event.outcome == "completed"
            assert [s.session_id for s in sup.list()] == [other.id]


@pytest.mark.parametrize("stop_at", [GRACE + 0.3, GRACE + 1.5])
async def test_a_stop_during_a_cancels_kill_waits_for_it_and_says_killed(
    autojump_clock: trio.testing.MockClock, stop_at: float
) -> None:
    """The agent ignores the interrupt and SIGTERM: the cancel's grace expires and its kill
    takes the kill timeout. A stop that comes during that kill (or during the respawn after
    it) ends with the kill: the receipt says ``killed`` with the kill's steps, and neither it
    nor the stop is answered while a process of that agent lives."""
    launcher = AcpLauncher(AcpBehaviour(words=1000, stop_delay=None, ignores_sigterm=True))
    spec = fake_spec(kill_timeout_s=2.0, start_timeout_s=30.0)
    async with running(launcher, spec) as (session, _, rec):
        turn = await session.prompt("hello")
        await rec.wait_kind("message.delta")
        if stop_at > GRACE + 1.0:  # after the kill (1 s), during a slow respawn
            launcher.behaviour = attrs.evolve(launcher.behaviour, start_delay=10.0)
        t0 = trio.current_time()
        answered: dict[str, float] = {}
        receipts = []

        async def cancel() -> None:
            receipts.append(await session.cancel())
            answered["cancel"] = trio.current_time() - t0
            assert not launcher.links[0].alive

        async def stop() -> None:
            await trio.sleep(stop_at)
            await session.stop()
            answered["stop"] = trio.current_time() - t0
            assert not launcher.links[0].alive

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            nursery.start_soon(stop)
        [receipt] = receipts
        assert receipt.turn_id == turn.id and receipt.outcome == "killed"
        assert receipt.escalation[:4] == ["interrupt", "grace_expired", "sigterm", "sigkill"]
        assert answered["cancel"] > GRACE and answered["stop"] >= stop_at
        await rec.catch_up()
        [ended] = [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]
        assert ended.outcome == "killed" and ended.receipt is not None
        assert session.state == "stopped"
