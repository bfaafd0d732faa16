"""The actor's alarm clock (``supervisor/alarm.py``), on virtual time."""

from __future__ import annotations

import math

import trio
import trio.testing

from supervisor.alarm import HEARTBEAT_S, Alarm


class Woken:
    def __init__(self) -> None:
        self.at: list[float] = []
        self.event = trio.Event()

    def __call__(self) -> None:
        self.at.append(trio.current_time())
        self.event.set()

    async def next(self) -> float:
        await self.event.wait()
        self.event = trio.Event()
        return self.at[-1]


async def test_rings_once_at_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    woken = Woken()
    alarm = Alarm(woken)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(alarm.run)
        start = trio.current_time()
        alarm.set(start + 5.0)
        assert await woken.next() == start + 5.0
        assert alarm.rang
        await trio.sleep(20)
        assert len(woken.at) == 1  # once: the deadline is spent until the actor sets another
        nursery.cancel_scope.cancel()


async def test_a_deadline_moved_earlier_rings_then(autojump_clock: trio.testing.MockClock) -> None:
    woken = Woken()
    alarm = Alarm(woken)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(alarm.run)
        start = trio.current_time()
        alarm.set(start + 300.0)
        await trio.sleep(0.1)
        alarm.set(start + 0.3)  # nearer than its next look: it is woken to re-arm
        assert await woken.next() == start + 0.3
        nursery.cancel_scope.cancel()


async def test_a_deadline_moved_later_or_cleared_does_not_ring_early(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woken = Woken()
    alarm = Alarm(woken)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(alarm.run)
        start = trio.current_time()
        alarm.set(start + 2.0)
        await trio.sleep(1.5)
        alarm.set(start + 7.0)  # later: nothing to wake, it looks at its time and sleeps on
        assert await woken.next() == start + 7.0
        alarm.set(trio.current_time() + 3.0)
        alarm.set(math.inf)  # cleared before it passed
        await trio.sleep(10)
        assert woken.at == [start + 7.0]
        nursery.cancel_scope.cancel()


async def test_a_far_deadline_set_while_one_is_armed_needs_no_wake_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What keeps a cancel's path free of the alarm: with a deadline set (the watchdog's,
    during a turn) the alarm looks at least every HEARTBEAT_S, so a deadline further away
    than that (a cancel's grace) is met at a look, without unparking it."""
    woken = Woken()
    alarm = Alarm(woken)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(alarm.run)
        start = trio.current_time()
        alarm.set(start + 300.0)
        await trio.sleep(0.25)
        parked = alarm._lot.statistics().tasks_waiting
        alarm.set(start + 0.25 + 3.0)
        assert alarm._lot.statistics().tasks_waiting == parked == 1  # not woken
        assert await woken.next() == start + 3.25  # and yet on time
        assert HEARTBEAT_S < 3.0
        nursery.cancel_scope.cancel()
