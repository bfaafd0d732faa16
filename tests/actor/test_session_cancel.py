"""Tier 2: the session actor's cancel procedure, on virtual time with in-memory ACP agents.

What every protocol must do when cancelled is the contract, ``test_cancel_contract.py``; here
are the ladder's own corners, shown on ACP: an answer exactly at the grace, no grace, a
flood, a turn the agent names late, a kill that takes time, a respawn that fails, an answer
after the shim died, and the session's other doors around a cancel (stop, start, subscribers).

Most tests script the agent as an application's tests would (``supervisor.testing.FakeAgent``);
those that need what only the project's own fakes do (a flood, a turn id announced late, a
crash at one launch, a slow kill, a prompt's own script) use the ACP fake directly.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
import trio
import trio.testing

import helpers
from helpers import Recorder
from protocols import events as ev
from supervisor import AgentNotRunning, AgentSpec, BadRequest, Session, open_supervisor
from supervisor.errors import SessionNotFound
from supervisor.testing import FakeAgent, open_test_supervisor
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

GRACE = 2.0
#: An answer that outlasts any test: 1000 words, 100 s.
LONG = "word " * 1000


def fake(**options: object) -> FakeAgent:
    """An ACP agent with this file's grace."""
    options.setdefault("grace_s", GRACE)
    return FakeAgent("acp", **options)  # type: ignore[arg-type]


def fake_spec(**changes: object) -> AgentSpec:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=GRACE)
    return spec.with_options(**changes) if changes else spec


def running(
    behaviour: AcpBehaviour | None = None, **spec_changes: object
) -> AbstractAsyncContextManager[tuple[Session, AcpLauncher, Recorder]]:
    return helpers.running(AcpLauncher(behaviour), fake_spec(**spec_changes))


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


async def test_an_agent_stopping_exactly_at_grace_is_not_killed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its answer and the grace's alarm wake in the same pass of the run loop, in either
    order (trio shuffles a pass), as on a loaded machine the alarm and a pump holding an
    answer written in time do: what the inbox holds when the deadline is seen is read
    before the deadline is acted on, so the turn ended by then is cancelled, never killed."""
    agent = fake(reply=LONG, on_cancel=GRACE)
    async with helpers.fake_session(agent) as (session, rec):
        for _ in range(12):
            await session.prompt("hello")
            await rec.wait_for(is_delta)
            t0 = trio.current_time()
            receipt = await session.cancel()
            assert trio.current_time() - t0 == pytest.approx(GRACE)
            assert (receipt.outcome, receipt.escalation) == ("cancelled", ["interrupt"])
            await rec.catch_up()
            rec.events.clear()
        assert agent.starts == 1


async def test_no_grace_kills_even_an_agent_that_answers_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``grace_s = 0``: no answer to the interrupt can come in time, so the kill never races
    one (the agent here answers at once; on a loaded machine it has often answered before the
    actor first looks at the deadline). Every cancel kills, respawns and resumes."""
    agent = fake(reply=LONG, grace_s=0.0)
    async with helpers.fake_session(agent) as (session, rec):
        for round_ in range(6):
            await session.prompt("hello")
            await rec.wait_for(is_delta)
            receipt = await session.cancel()
            assert receipt.outcome == "killed", receipt
            assert receipt.escalation[:3] == ["interrupt", "grace_expired", "sigterm"], receipt
            assert receipt.escalation[-2:] == ["respawned", "resumed"], receipt
            assert agent.starts == round_ + 2
            await rec.catch_up()
            rec.events.clear()


async def test_permission_answered_by_client(autojump_clock: trio.testing.MockClock) -> None:
    async with helpers.fake_session(fake(permission=True)) as (session, rec):
        turn = await session.prompt("hello")
        requested = await rec.wait_kind("permission.requested")
        assert isinstance(requested, ev.PermissionRequested)
        with pytest.raises(BadRequest):
            await session.respond_permission(requested.request_id, "maybe")
        await session.respond_permission(requested.request_id, "allow")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        resolved = rec.of_kind("permission.resolved")[0]
        assert isinstance(resolved, ev.PermissionResolved)
        assert (resolved.option_id, resolved.by) == ("allow", "client")
        with pytest.raises(BadRequest):
            await session.respond_permission(requested.request_id, "allow")


async def test_cancel_served_while_agent_floods(autojump_clock: trio.testing.MockClock) -> None:
    behaviour = AcpBehaviour(words=1_000_000, flood=True, stop_delay=0.0)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("flood")
        await rec.wait_for(is_delta, count=1000)
        before = len(rec.of_kind("message.delta"))
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        assert receipt.outcome == "cancelled"
        assert trio.current_time() == t0
        after = len(rec.of_kind("message.delta"))
        # The cancel waited behind at most what was already buffered, not the whole flood.
        assert after - before < 2000


async def test_cancel_before_turn_identified(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fakes.deferred_protocol import DeferredAcp
    from protocols import PROTOCOLS

    monkeypatch.setitem(PROTOCOLS, "deferred", DeferredAcp)
    behaviour = AcpBehaviour(words=100, stop_delay=0.05, deferred_id=0.5)
    async with running(behaviour, protocol="deferred") as (session, launcher, rec):
        await session.prompt("hello")
        t0 = trio.current_time()
        receipt = await session.cancel()
        await rec.catch_up()
        # The interrupt could only go out once the agent named the turn, at t0 + 0.5.
        assert trio.current_time() - t0 == pytest.approx(0.55)
        assert receipt.outcome == "cancelled"
        assert launcher.sent_methods().count("session/cancel") == 1
        order = [m.get("method") for _, _, m in launcher.log]
        assert order.index("x/turnIdentified") < order.index("session/cancel")


async def test_start_failure_raises_with_reason(autojump_clock: trio.testing.MockClock) -> None:
    launcher = AcpLauncher(AcpBehaviour(fail_start=True))
    async with open_supervisor(agents={"fake": fake_spec()}, launcher=launcher) as sup:
        with pytest.raises(AgentNotRunning, match="cannot start"):
            await sup.start_session("fake", cwd="/")
        assert sup.list() == []  # no session to go back to: its starter has the reason
        with pytest.raises(SessionNotFound):
            sup.get("s1")


async def test_stop_ends_session(autojump_clock: trio.testing.MockClock) -> None:
    async with helpers.fake_session(fake(reply=LONG)) as (session, rec):
        turn = await session.prompt("hello")
        await rec.wait_for(is_delta)
        status = await session.stop()
        await rec.catch_up()
        assert status is not None and status.code == 0
        assert session.state == "stopped"
        ended = rec.of_kind("turn.ended")
        assert len(ended) == 1 and isinstance(ended[0], ev.TurnEnded)
        assert (ended[0].turn_id, ended[0].stop_reason) == (turn.id, "session_stopped")
        with pytest.raises(AgentNotRunning):
            await session.prompt("again")
        with pytest.raises(AgentNotRunning):
            await session.cancel()


async def test_slow_subscriber_is_cut_off_and_catches_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with helpers.fake_session(fake(reply="word " * 50, word_delay=0.01)) as (session, rec):
        async with session.subscribe(max_buffer=5) as slow:
            turn = await session.prompt("hello")
            await rec.wait_kind("turn.ended", turn_id=turn.id)
            seen = [event async for event in slow]
            assert slow.lagged and len(seen) == 5
        async with session.subscribe(since_seq=slow.last_seq) as again:
            assert not again.gap
            rest = []
            while len(seen) + len(rest) < len(rec.events) - seen[0].seq + 1:
                rest.append(await again.receive())
        seqs = [e.seq for e in seen + rest]
        assert seqs == list(range(seen[0].seq, seen[0].seq + len(seqs)))


async def test_leaving_supervisor_stops_every_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = fake(reply=LONG)
    async with open_test_supervisor(agents={"fake": agent}) as sup:
        sessions = [await sup.start_session("fake") for _ in range(3)]
        for session in sessions:
            await session.prompt("hello")
    assert agent.starts == 3 and all(not process.alive for process in agent.processes)
    assert all(session.state == "stopped" for session in sessions)


async def test_agent_dying_during_respawn_fails_session_without_looping(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(
        AcpBehaviour(words=1000, stop_delay=None), crash_on_launch=frozenset({2})
    )
    async with open_supervisor(agents={"fake": fake_spec()}, launcher=launcher) as sup:
        session = await sup.start_session("fake", cwd="/")
        await session.prompt("hello")
        receipt = await session.cancel()
        assert receipt.outcome == "killed"
        # Not "could not be resumed (fresh session)": there is no session to go on with.
        assert receipt.resumed is None
        assert receipt.session_failed is not None and "exited" in receipt.session_failed
        assert receipt.summary().endswith("the agent could not be started again: session failed")
        assert receipt.escalation == ["interrupt", "grace_expired", "sigterm", "respawned"]
        assert session.state == "failed"
        assert len(launcher.links) == 2
        with pytest.raises(AgentNotRunning):
            await session.prompt("again")


async def test_start_timeout_fails_session_at_exact_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = fake(start_delay=1000.0, start_timeout_s=5.0)
    async with open_test_supervisor(agents={"fake": agent}) as sup:
        t0 = trio.current_time()
        with pytest.raises(AgentNotRunning, match="handshake"):
            await sup.start_session("fake")
        assert trio.current_time() - t0 == 5.0
    [process] = agent.processes
    assert process.killed == ["sigterm"]  # the silent agent was killed, not closed


async def test_error_answer_to_the_prompt_fails_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """ACP's end of a turn is the ``session/prompt`` answer: a JSON-RPC error there is a failed
    turn, reported ``failed`` with the agent's words, never ``completed``; the session goes on."""
    async with running(AcpBehaviour(words=2, word_interval=0.1)) as (session, _, rec):
        turn = await session.prompt("fail-turn")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert ended.outcome == "failed", ended
        assert ended.error == "Internal error: model overloaded (code -32603)"
        assert session.state == "ready"
        second = await session.prompt("again")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"


async def test_a_cancel_joining_a_kill_also_drops_what_was_queued_since(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first cancel's kill and respawn take a while; a prompt sent meanwhile queues, and a
    second cancel (its sender stopping that prompt) shares the receipt and drops it too."""
    behaviour = AcpBehaviour(words=1000, stop_delay=None, kill_time=1.0)
    async with running(behaviour) as (session, launcher, rec):
        await session.prompt("hello")
        receipts = []

        async def cancel() -> None:
            receipts.append(await session.cancel())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            await trio.sleep(GRACE + 0.5)  # being killed
            queued = await session.prompt("next")
            assert queued.queued
            nursery.start_soon(cancel)
        assert receipts[0] == receipts[1]
        assert [p.turn_id for p in receipts[0].dropped_prompts] == [queued.id]
        await rec.catch_up()
        ended = [e for e in rec.of_kind("turn.ended") if e.turn_id == queued.id]
        assert len(ended) == 1 and ended[0].stop_reason == "dropped"
        assert not [e for e in rec.of_kind("turn.started") if e.turn_id == queued.id]
        assert session.state == "ready"


async def test_a_late_answer_to_a_request_of_a_killed_agent_answers_nothing_of_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The respawned agent's JSON-RPC ids start again: its permission request must not take
    the id the last process's request had, which a stale client may still answer."""
    async with running(AcpBehaviour(words=100)) as (session, launcher, rec):
        await session.prompt("hello permission")
        first = await rec.wait_kind("permission.requested")
        assert (await session.cancel()).outcome == "cancelled"  # the request withdrawn
        await session.prompt("stubborn ignore-cancel")
        receipt = await session.cancel()  # the agent ignores it: killed, respawned
        assert receipt.outcome == "killed" and "respawned" in receipt.escalation
        await session.prompt("again permission")
        second = await rec.wait_kind("permission.requested", count=2)
        assert first.request_id == "1000" and second.request_id != first.request_id
        with pytest.raises(BadRequest):
            await session.respond_permission(first.request_id, "allow")
        assert not rec.of_kind("permission.resolved") or all(
            e.request_id != second.request_id for e in rec.of_kind("permission.resolved")
        )
        await session.respond_permission(second.request_id, "allow")
        resolved = await rec.wait_for(
            lambda e: e.kind == "permission.resolved" and e.request_id == second.request_id
        )
        assert resolved.by == "client"
        await session.cancel()
        await rec.catch_up()


async def test_an_answer_after_the_shim_died_waits_for_the_tree_to_be_settled(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shim dies (killed, OOM) and then the agent answers the cancel: the tree is loose and
    being killed, so the answer does not end the turn. The receipt waits for the exit report
    and the respawn, and says what they took: ``killed``, ``containment_lost``, ``sigkill``."""
    from supervisor.agents.link import AgentGone
    from supervisor.core.exit import ExitStatus
    from supervisor.testing._memory import MemoryLink

    monkeypatch.setattr(
        MemoryLink, "leader_exited", property(lambda link: getattr(link, "shim_dead", False))
    )
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=5.0)
    async with helpers.running(AcpLauncher(AcpBehaviour(words=1000)), spec) as (s, launcher, rec):
        turn = await s.prompt("hello")
        await rec.wait_kind("message.delta")
        link = launcher.links[0]
        link.shim_dead = True  # type: ignore[attr-defined]  # its shim was just SIGKILLed

        async def the_exit_report() -> None:  # what the link's watch of its child sends
            await trio.sleep(0.3)
            link._die()
            killed = ExitStatus(code=None, signal=9)
            lost = ["containment_lost", "sigkill"]
            await link.inbox.send(AgentGone(link.generation, killed, steps=lost))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(the_exit_report)
            t0 = trio.current_time()
            receipt = await s.cancel()
        assert trio.current_time() - t0 >= 0.3
        assert (receipt.turn_id, receipt.outcome) == (turn.id, "killed")
        assert receipt.escalation[:3] == ["interrupt", "containment_lost", "sigkill"], receipt
        assert receipt.escalation[3:] == ["respawned", "resumed"] and receipt.resumed is True
        assert s.state == "ready" and len(launcher.links) == 2
