"""The actors' alarm clock (``supervisor/runtime/alarm.py``), on virtual time."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from supervisor.runtime.alarm import HEARTBEAT_S, AlarmClock


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


@asynccontextmanager
async def running_clock() -> AsyncIterator[AlarmClock]:
    clock = AlarmClock()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(clock.run)
        yield clock
        nursery.cancel_scope.cancel()


async def test_rings_once_at_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    woken = Woken()
    async with running_clock() as clock:
        alarm = clock.alarm(woken)
        start = trio.current_time()
        alarm.set(start + 5.0)
        assert await woken.next() == start + 5.0
        assert alarm.rang
        await trio.sleep(20)
        assert len(woken.at) == 1  # once: the deadline is spent until the actor sets another


async def test_a_deadline_moved_earlier_rings_then(autojump_clock: trio.testing.MockClock) -> None:
    woken = Woken()
    async with running_clock() as clock:
        alarm = clock.alarm(woken)
        start = trio.current_time()
        alarm.set(start + 300.0)
        await trio.sleep(0.1)
        alarm.set(start + 0.3)
        assert await woken.next() == start + 0.3
        await trio.sleep(400)
        assert woken.at == [start + 0.3]  # the replaced entry never rings


async def test_a_deadline_moved_later_or_cleared_does_not_ring_early(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woken = Woken()
    async with running_clock() as clock:
        alarm = clock.alarm(woken)
        start = trio.current_time()
        alarm.set(start + 2.0)
        await trio.sleep(1.5)
        alarm.set(start + 7.0)  # later: filed again at 7 when its old time comes
        assert await woken.next() == start + 7.0
        alarm.set(trio.current_time() + 3.0)
        alarm.set(math.inf)  # cleared before it passed
        await trio.sleep(10)
        assert woken.at == [start + 7.0]


async def test_many_alarms_ring_each_at_its_own_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_clock() as clock:
        start = trio.current_time()
        woken = [Woken() for _ in range(5)]
        for index, each in enumerate(woken):
            clock.alarm(each).set(start + 10.0 - index)
        await trio.sleep(11)
        assert [each.at for each in woken] == [[start + 10.0 - i] for i in range(5)]


async def test_a_far_deadline_set_while_one_is_armed_needs_no_wake_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What keeps a cancel's path free of the clock: with a deadline set (the watchdog's,
    during a turn) the clock looks at least every HEARTBEAT_S, so a deadline further away than
    that (a cancel's grace) is met at a look, without unparking it."""
    woken = Woken()
    async with running_clock() as clock:
        alarm = clock.alarm(woken)
        start = trio.current_time()
        alarm.set(start + 300.0)
        await trio.sleep(0.25)
        assert clock._lot.statistics().tasks_waiting == 1
        alarm.set(start + 0.25 + 3.0)
        assert clock._lot.statistics().tasks_waiting == 1  # not woken
        assert await woken.next() == start + 3.25  # and yet on time
        assert HEARTBEAT_S < 3.0


async def test_a_closed_alarm_never_rings(autojump_clock: trio.testing.MockClock) -> None:
    woken = Woken()
    async with running_clock() as clock:
        alarm = clock.alarm(woken)
        alarm.set(trio.current_time() + 1.0)
        alarm.close()
        await trio.sleep(5)
        assert woken.at == [] and not alarm.rang
