"""Tier 2: a node's session keeps what its front has not acknowledged, on virtual time.

``hold_unacknowledged`` (what ``agent-supervisor node`` runs with): the history drops only
events acknowledged (``Subscription.acknowledge``: the node's gateway says so once its front
answered a ping sent after them; or a resubscribe from ``since_seq``), and with
``history_size`` of them unacknowledged the actor stops reading the agent until they are. A
cancel or a stop is no read of the agent's output: it works at once while the agent is held.
A replay that cannot reach back opens with a ``stream.gap``: never a silent jump in seq.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from protocols import events as ev
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

HISTORY = 200
WORDS = 5_000  # 25 histories: without the hold, a front away loses nearly all of them
#: Real seconds of idleness before the virtual clock jumps. A task in
#: ``wait_all_tasks_blocked`` keeps the clock from jumping, so the held state is seen first
#: however small this is; each jump costs it in real time (a held minute is ~60 of them).
IDLE = 0.01


def spec() -> AgentSpec:
    return AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)


@asynccontextmanager
async def node_session(words: int = WORDS, *, hold: bool = True) -> AsyncIterator[Session]:
    launcher = AcpLauncher(AcpBehaviour(flood=True, words=words))
    async with open_supervisor(
        agents={"fake": spec()},
        launcher=launcher,
        history_size=HISTORY,
        hold_unacknowledged=hold,
    ) as sup:
        session = await sup.start_session("fake", cwd="/")
        assert isinstance(session, Session)
        yield session
    assert launcher.violations == []


async def test_the_agent_is_held_until_the_front_acknowledges_and_nothing_is_dropped(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = IDLE
    async with node_session() as session:
        fanout = session._fanout
        # A front that reads (this subscriber takes everything) but acknowledges nothing yet:
        # the link dropped after the node wrote them, say.
        link = await session.open_subscription(since_seq=0, max_buffer=WORDS * 2)
        await session.prompt("flood")
        await trio.testing.wait_all_tasks_blocked(IDLE / 2)
        held_at = session.last_seq
        assert session.state == "running" and fanout.ack_holds >= 1
        # Held: one agent message of slack at most beyond the history, nothing dropped.
        assert HISTORY <= held_at <= HISTORY + 16, held_at
        assert fanout.head_seq - len(fanout.history) + 1 <= 1  # event 1 is still kept
        await trio.sleep(60)  # virtual: however long the front is away, the agent waits
        assert session.last_seq == held_at
        # The front comes back and acknowledges as it goes: the flood goes on, whole.
        seen: list[ev.Event] = []
        async for event in link:
            seen.append(event)
            link.acknowledge(event.seq)
            # never more unacknowledged than the history (plus one agent message)
            assert fanout.head_seq - fanout.acked_seq <= HISTORY + 16
            if isinstance(event, ev.TurnEnded):
                break
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        assert len([e for e in seen if isinstance(e, ev.MessageDelta)]) == WORDS
        assert len(fanout.history) <= 2 * HISTORY
        link.close()


async def test_a_resubscribe_from_since_seq_is_an_acknowledgement(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = IDLE
    async with node_session() as session:
        await session.prompt("flood")
        await trio.testing.wait_all_tasks_blocked(IDLE / 2)
        assert session._fanout.ack_holds == 1
        got: list[ev.Event] = []
        since = 0
        while not any(isinstance(e, ev.TurnEnded) for e in got):
            # Each reconnect: what the front has so far, then what the node kept after it.
            again = await session.open_subscription(since_seq=since, max_buffer=WORDS * 2)
            assert not again.gap
            await trio.testing.wait_all_tasks_blocked(IDLE / 2)
            got.extend(again.take(WORDS * 2))
            again.close()
            since = got[-1].seq
        assert [e.seq for e in got] == list(range(1, len(got) + 1))
        assert len([e for e in got if isinstance(e, ev.MessageDelta)]) == WORDS
        assert session._fanout.ack_holds > 1


async def test_a_cancel_and_a_stop_work_at_once_while_the_agent_is_held(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = IDLE
    async with node_session(words=1_000_000) as session:
        turn = await session.prompt("flood")
        await trio.testing.wait_all_tasks_blocked(IDLE / 2)
        assert session._fanout.ack_holds == 1 and session.state == "running"
        began = trio.current_time()
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        assert receipt.escalation == ["interrupt"]
        assert trio.current_time() - began < 1.0  # not the grace (2 s), not a stall window
        # The next turn is held again, and a stop ends it at once.
        await session.prompt("flood")
        await trio.testing.wait_all_tasks_blocked(IDLE / 2)
        assert session._fanout.ack_holds == 2
        began = trio.current_time()
        await session.stop()
        assert session.state == "stopped"
        assert trio.current_time() - began < 1.0


async def test_plain_sessions_keep_their_history_bounded_and_never_hold(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = IDLE
    async with node_session(hold=False) as session:
        async with session.subscribe(max_buffer=WORDS * 2) as events:
            await session.prompt("flood")
            async for event in events:
                if isinstance(event, ev.TurnEnded):
                    break
        assert session._fanout.ack_holds == 0
        assert len(session._fanout.history) == HISTORY


async def test_a_replay_that_cannot_reach_back_opens_with_a_stream_gap(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = IDLE
    async with node_session(hold=False) as session:
        async with session.subscribe(max_buffer=WORDS * 2) as events:
            await session.prompt("flood")
            async for event in events:
                if isinstance(event, ev.TurnEnded):
                    break
        head = session.last_seq
        oldest = head - HISTORY + 1
        for wire in (False, True):
            again = await session.open_subscription(since_seq=3, wire=wire)
            assert again.gap
            first, second = again.take(2)
            assert isinstance(first, ev.StreamGap), first
            assert (first.from_seq, first.to_seq, first.seq) == (4, oldest - 1, oldest - 1)
            assert first.session_id == session.id and "history" in first.cause
            assert second.seq == oldest  # contiguous after the gap
            rest = again.take(HISTORY)
            assert [e.seq for e in rest] == list(range(oldest + 1, head + 1))
            assert again.last_seq == head
            again.close()


async def test_a_retired_nodes_drain_counts_a_failed_session(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A session that failed (its agent never started) keeps its actor, but it holds no
    agent: ``wait_no_live_sessions`` (a retired node's drain) returns for it at once; it
    waited for a stop, or the detach timer, before."""
    mock_clock.autojump_threshold = IDLE
    launcher = AcpLauncher(AcpBehaviour(fail_start=True))
    async with open_supervisor(agents={"fake": spec()}, launcher=launcher) as sup:
        session = await sup.start_session("fake", cwd="/", wait_ready=False)
        with trio.fail_after(1):  # virtual: the drain must not wait for anything more
            await sup.wait_no_live_sessions()
        assert session.state == "failed" and sup.live_sessions() == 0
