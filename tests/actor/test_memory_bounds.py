"""A session's memory is bounded in bytes, not only in events.

The history keeps at most ``history_bytes`` of JSON and each subscriber's buffer at most
``buffer_bytes``; what leaves the history is said to a late subscriber (``stream.gap``), never
dropped silently. A long prompt or steer reaches the agent whole, but its events carry a
preview and the size. Then a thousand turns of 1 MiB prompts: the supervisor's memory stays
flat.
"""

from __future__ import annotations

import gc

import psutil
import trio
import trio.testing

from protocols import events as ev
from supervisor.runtime.fanout import Fanout
from supervisor.testing import FakeAgent, open_test_supervisor, record


def delta(seq: int, text: str) -> ev.MessageDelta:
    return ev.MessageDelta(session_id="s", seq=seq, timestamp=1.0, turn_id="t1", text=text)


def test_the_history_keeps_what_its_bytes_allow_and_a_late_subscriber_is_told_the_rest() -> None:
    fanout = Fanout(10_000, history_bytes=64 * 1024)
    for seq in range(1, 101):
        fanout.publish_many([delta(seq, "x" * 4000)])  # ~4 KB each, 400 KB in all
    assert sum(map(len, fanout.history)) <= 64 * 1024
    assert len(fanout.history) < 20 and fanout.head_seq == 100
    late = fanout.subscribe(0, head_seq=100, max_buffer=1000)
    first = late.take(1)[0]
    assert isinstance(first, ev.StreamGap) and first.from_seq == 1, first
    kept = late.take(1000)
    assert [e.seq for e in kept] == list(range(first.to_seq + 1, 101))  # contiguous after it


def test_the_count_bound_still_holds_and_small_events_fill_it() -> None:
    fanout = Fanout(50)
    fanout.publish_many([delta(seq, "w ") for seq in range(1, 201)])
    assert len(fanout.history) == 50


def test_a_subscriber_over_its_bytes_is_cut_off_as_over_its_count() -> None:
    fanout = Fanout(10_000, buffer_bytes=32 * 1024)
    reader = fanout.subscribe(None, head_seq=0, max_buffer=10_000)
    for seq in range(1, 6):
        fanout.publish_many([delta(seq, "y" * 10_000)])
    assert reader.lagged and reader.ended
    assert reader.pending * 10_000 <= 32 * 1024 + 10_000  # cut where it no longer fitted


def test_a_backpressured_subscriber_over_its_bytes_holds_the_agent_back() -> None:
    fanout = Fanout(10_000, buffer_bytes=32 * 1024)
    reader = fanout.subscribe(None, head_seq=0, max_buffer=10_000, stall_s=5.0)
    for seq in range(1, 5):
        fanout.publish_many([delta(seq, "z" * 10_000)])
    assert fanout.must_wait() and not reader.lagged
    reader.take(4)
    assert not fanout.must_wait()


async def test_a_long_prompt_reaches_the_agent_whole_and_its_event_carries_a_preview(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = FakeAgent("acp", reply="ok")
    text = "é" * 300_000  # 600,000 bytes of UTF-8
    async with open_test_supervisor(agents={"acp": agent}) as sup:
        session = await sup.start_session("acp")
        async with record(session) as events:
            turn = await session.prompt(text)
            started = await events.wait_kind("turn.started", turn_id=turn.id)
            await events.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(started, ev.TurnStarted)
    assert len(started.text) == ev.PREVIEW_CHARS and text.startswith(started.text)
    assert started.text_bytes == 600_000
    assert agent.prompts == [text]


async def test_a_thousand_turns_of_one_mib_prompts_leave_memory_flat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each turn's prompt is a fresh 1 MiB: before the bounds, a session kept every
    ``turn.started`` whole (1.27 MB of RSS a turn, in a straight line)."""
    agent = FakeAgent("acp", reply="ok", word_delay=0.0)
    process = psutil.Process()
    async with open_test_supervisor(agents={"acp": agent}) as sup:
        session = await sup.start_session("acp")
        async with session.subscribe(max_buffer=100_000) as events:

            async def drain() -> None:
                async for _ in events:
                    pass

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain)
                rss = []
                for turn in range(1_000):
                    prompt = f"{turn} " + "p" * (1 << 20)
                    handle = await session.prompt(prompt)
                    while session.turn_id == handle.id or session.state != "ready":
                        await trio.sleep(0.01)  # virtual: the fake answers at once
                    assert agent.prompts == [prompt]  # the agent got it whole
                    agent.forget()  # the fake's own records are not the supervisor's memory
                    if turn in (99, 999):
                        gc.collect()
                        rss.append(process.memory_info().rss)
                nursery.cancel_scope.cancel()
    grown = rss[1] - rss[0]
    assert grown < 64 * 1024 * 1024, f"RSS grew {grown / 2**20:.0f} MiB over 900 turns"
