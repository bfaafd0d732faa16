"""A live session asked for events older than its in-memory history holds reads them from
the store: a subscriber from ``since_seq: 0`` of a session whose history keeps 10 events gets
every seq, contiguous, once, then the live ones; so does one that subscribes mid-flood (events
the writer has not written yet come from what waits), one over the wire, and one of a session
started again after a restart. On each backend; in-memory agents, the real clock."""

from __future__ import annotations

import trio

from supervisor import AgentSpec, open_supervisor
from supervisor.client import connect
from supervisor.gateway import Gateway
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 60.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
#: the history a session keeps: far fewer than a turn's events
HISTORY = 10


async def test_a_subscriber_from_before_the_history_gets_every_event(store_url: str) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=400, flood=True))
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, store=store_url, history_size=HISTORY
        ) as sup:
            session = await sup.start_session("fake")
            async with session.subscribe() as events:
                await session.prompt("flood")
                async for event in events:
                    if event.kind == "message.delta" and event.seq > 100:
                        break
                # Mid-flood: some of what is older than the history is not written yet.
                async with session.subscribe(since_seq=0) as late:
                    seqs = []
                    async for event in late:
                        seqs.append(event.seq)
                        assert event.kind != "stream.gap"
                        if event.kind == "turn.ended":
                            break
            assert seqs == list(range(1, len(seqs) + 1))
            async with session.subscribe(since_seq=5) as again:
                first = await again.receive()
                assert (first.seq, again.gap) == (6, False)

            # Over the wire: frames, and a replay from the store for a session s1 started again.
            async with trio.open_nursery() as nursery:
                address = await nursery.start(Gateway(sup, port=0, token="t").serve)
                async with connect(address) as client, client.subscribe(session.id) as channel:
                    await client.prompt(session.id, "again")
                    async for message in channel:
                        if message["event"] == "turn.ended":
                            break
                    head = message["seq"]
                async with connect(address) as client:
                    async with client.subscribe(session.id, since_seq=0) as channel:
                        wire = []
                        async for message in channel:
                            wire.append(message["seq"])
                            if message["seq"] == head:
                                break
                assert wire == list(range(1, head + 1))
                nursery.cancel_scope.cancel()

        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, store=store_url, history_size=HISTORY
        ) as sup:
            stored = sup.get(session.id)
            await stored.prompt("after a restart")  # its agent starts again: a live session
            live = sup.get(session.id)
            async with live.subscribe(since_seq=0) as events:
                replay = []
                async for event in events:
                    replay.append(event)
                    if event.kind == "turn.ended" and event.seq > head:
                        break
            assert [e.seq for e in replay] == list(range(1, len(replay) + 1))
            assert sum(e.kind == "turn.started" for e in replay) == 3
