"""Tier 2: a session's fan-out under a flood (``supervisor/runtime/fanout.py``), on virtual time.

A subscriber that asked for backpressure (``stall_s``, as the gateway does) and falls a full
buffer behind holds the agent back instead of being cut off, so a flood far longer than the
session's history reaches it whole. One that takes nothing for ``stall_s`` is cut off (lagged)
and the others go on; a cancel never waits for any subscriber.
"""

from __future__ import annotations

import trio
import trio.testing

import helpers
from protocols import events as ev
from supervisor import AgentSpec, Session
from supervisor.runtime.fanout import Subscription
from supervisor.runtime.session import DEFAULT_HISTORY
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

#: Longer than the history (10,000 events): without backpressure a slow subscriber loses some.
WORDS = DEFAULT_HISTORY + 5_000
BUFFER = 64
#: Real seconds of idleness before a test's virtual clock jumps, where a test must see the held
#: state first (``wait_all_tasks_blocked`` with no cushion wakes before the jump).
IDLE = 0.5


def spec() -> AgentSpec:
    return AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)


def holds(session: Session) -> int:
    return session._fanout.holds


async def read_slowly(
    subscription: Subscription, seen: list[ev.Event], *, until_turn_ended: bool = True
) -> None:
    """Take one event per virtual millisecond: much slower than the flood."""
    async for event in subscription:
        seen.append(event)
        if until_turn_ended and isinstance(event, ev.TurnEnded):
            return
        await trio.sleep(0.001)


async def read_all(subscription: Subscription, seen: list[ev.Event]) -> None:
    """Take every event at once, until the turn ends (a fast reader, without backpressure)."""
    async for event in subscription:
        seen.append(event)
        if isinstance(event, ev.TurnEnded):
            return


async def test_slow_backpressured_subscriber_loses_nothing_of_a_flood(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(flood=True, words=WORDS))
    async with helpers.running(launcher, spec(), catch_up=True) as (session, _, rec):
        subscription = await session.open_subscription(max_buffer=BUFFER, stall_s=1.0)
        seen: list[ev.Event] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_slowly, subscription, seen)
            await session.prompt("flood")
        subscription.close()
        assert not subscription.lagged
        seqs = [event.seq for event in seen]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert len([e for e in seen if isinstance(e, ev.MessageDelta)]) == WORDS
        # It was a flood the subscriber could not keep up with: the agent was held back.
        assert holds(session) > 0
        # The recorder (no backpressure, a big buffer, reading at once) lost nothing either.
        assert len(rec.of_kind("message.delta")) == WORDS


async def test_stalled_subscriber_is_cut_off_and_the_flood_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(flood=True, words=WORDS))
    async with helpers.running(launcher, spec(), catch_up=True) as (session, _, rec):
        stalled = await session.open_subscription(max_buffer=BUFFER, stall_s=0.5)
        fast: list[ev.Event] = []
        async with session.subscribe(max_buffer=WORDS * 2) as everything:
            await session.prompt("flood")
            await read_all(everything, fast)
        assert holds(session) > 0
        # It took nothing for stall_s: cut off, told so after what it already had.
        got = [event async for event in stalled]
        assert stalled.lagged and len(got) >= BUFFER
        assert stalled.last_seq == got[-1].seq
        # It asks for the rest with since_seq: what the history still holds is replayed, and
        # the answer says whether it reached back (here it cannot: the flood was longer).
        async with session.subscribe(since_seq=stalled.last_seq) as again:
            assert again.gap
            first = await again.receive()
            assert first.seq > stalled.last_seq + 1
        # The others lost nothing.
        assert len([e for e in fast if isinstance(e, ev.MessageDelta)]) == WORDS


async def test_cancel_waits_for_no_subscriber(mock_clock: trio.testing.MockClock) -> None:
    # Virtual time moves only after real idle, so "all tasks blocked" below is the held state.
    mock_clock.autojump_threshold = IDLE
    launcher = AcpLauncher(AcpBehaviour(flood=True, words=1_000_000, stop_delay=0.0))
    async with helpers.running(launcher, spec(), catch_up=True) as (session, _, rec):
        stalled = await session.open_subscription(max_buffer=BUFFER, stall_s=3600.0)
        await session.prompt("flood")
        await rec.wait_for(lambda e: e.kind == "message.delta", count=BUFFER // 2)
        await trio.testing.wait_all_tasks_blocked()
        assert holds(session) > 0 and not stalled.lagged  # held back by the stalled one
        t0 = trio.current_time()
        receipt = await session.cancel()
        # Served at once although a subscriber holds the agent back (and never reads).
        assert receipt.outcome == "cancelled"
        assert trio.current_time() == t0
        await rec.catch_up()
        stalled.close()


async def test_closing_a_full_subscription_releases_the_agent(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = IDLE
    launcher = AcpLauncher(AcpBehaviour(flood=True, words=WORDS))
    async with helpers.running(launcher, spec(), catch_up=True) as (session, _, rec):
        stalled = await session.open_subscription(max_buffer=BUFFER, stall_s=3600.0)
        fast: list[ev.Event] = []
        async with session.subscribe(max_buffer=WORDS * 2) as everything:
            await session.prompt("flood")
            while len(fast) < BUFFER:
                fast.append(await everything.receive())
            await trio.testing.wait_all_tasks_blocked()
            assert holds(session) > 0  # the stalled one is full: the agent is held back
            t0 = trio.current_time()
            stalled.close()
            assert not stalled.lagged  # closed by us, not cut off by the stall window
            await read_all(everything, fast)
        assert trio.current_time() == t0  # no stall window: closing it let the agent go on
        assert len([e for e in fast if isinstance(e, ev.MessageDelta)]) == WORDS
