"""Tier 2: with a store, subscribers get a session's events only once the store has them
(``design/store.md``, "Clients see what is stored"), on virtual time with an in-memory store
whose writes wait until the test lets them through.

An event is never given before the write that stores it; the writes let through, everything
comes, in order, each event after its write. A cancel's answer (a reply, not an event) does not
wait for the store; its ``turn.ended`` does. Without a store, subscribers get events as they
are published, with no writer at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
import trio.testing
from memory_store import MemoryBackend, in_this_thread

from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.store.writer import SessionStore
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=2.0)


def held_store(backend: MemoryBackend, let_through: trio.Event) -> SessionStore:
    async def run_sync(fn: Callable[..., Any], *args: Any) -> Any:
        """The backend called in the test's thread; a write once ``let_through`` is set."""
        if getattr(fn, "__name__", "") == "_write":
            await let_through.wait()
        return await in_this_thread(fn, *args)

    return SessionStore(backend, run_sync=run_sync)


async def test_an_event_is_given_only_once_it_is_stored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = MemoryBackend()
    let_through = trio.Event()
    store = held_store(backend, let_through)
    launcher = AcpLauncher(AcpBehaviour(words=20, word_interval=0.1))
    with trio.fail_after(60):  # (virtual seconds: an event never given fails, not hangs)
        async with trio.open_nursery() as writer:
            writer.start_soon(store.run)
            async with open_supervisor(agents={"fake": SPEC}, launcher=launcher) as sup:
                sup.store = store
                session = await sup.start_session("fake")
                async with session.subscribe(since_seq=0) as events:
                    await session.prompt("hello")
                    await trio.sleep(1)  # ten words said, none stored
                    assert session.last_seq > 10
                    assert events.pending == 0 and not backend.seqs()
                    # The cancel's answer is a reply: it does not wait for the store.
                    receipt = await session.cancel()
                    assert receipt.outcome == "cancelled"
                    assert events.pending == 0
                    let_through.set()
                    seqs = []
                    async for event in events:
                        assert event.seq in backend.seqs()  # stored before it was given
                        seqs.append(event.seq)
                        if isinstance(event, ev.TurnEnded):
                            break
                    assert seqs == list(range(1, len(seqs) + 1))
            await store.aclose()


async def test_without_a_store_events_are_given_as_they_are_published(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=20, word_interval=0.1))
    async with open_supervisor(agents={"fake": SPEC}, launcher=launcher) as sup:
        session = await sup.start_session("fake")
        async with session.subscribe(since_seq=0) as events:
            await session.prompt("hello")
            await trio.sleep(1)
            assert events.pending == session.last_seq > 10
            await session.cancel()
            given = events.take(events.pending)  # the turn's end too, at once
            assert [event.seq for event in given] == list(range(1, session.last_seq + 1))
            assert any(isinstance(event, ev.TurnEnded) for event in given)
