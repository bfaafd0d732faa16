"""A store that cannot be written at run time is told to the gateway's clients: PostgreSQL
stopped while a session streams gives every client a ``store.error`` (what waits, of which
session, retrying) while what clients are given waits for it; started again, a
``store.recovered``, the stream goes on, and every event is stored. A client that connects
during the outage is told at once. In-memory agents, a real server, the real clock."""

from __future__ import annotations

import trio

from pg import PostgresServer
from supervisor import AgentSpec, open_supervisor
from supervisor.client import connect
from supervisor.gateway import Gateway
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 60.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


async def test_a_server_away_mid_stream_is_told_and_so_is_its_return(
    postgresql: PostgresServer,
) -> None:
    url = postgresql.database()
    launcher = AcpLauncher(AcpBehaviour(words=100_000, word_interval=0.005))
    try:
        with trio.fail_after(BOUND):
            async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
                async with trio.open_nursery() as nursery:
                    address = await nursery.start(Gateway(sup, port=0, token="t").serve)
                    async with connect(address) as client:
                        session = await client.start_session("fake")
                        sid = session["session_id"]
                        async with client.subscribe(sid) as channel:
                            await client.prompt(sid, "stream through an outage")
                            stream = client.events(sid, channel)
                            async for event in stream:
                                if event.kind == "message.delta":
                                    break
                            # Not in a worker thread: the server would die with it.
                            postgresql.stop()
                            error = await client.next_notice()
                            assert error["event"] == "store.error"
                            assert error["session_id"] is None and error["seq"] is None
                            data = error["data"]
                            assert data["retrying"] is True and data["held"] is False
                            assert data["where"] in data["error"]  # one line, naming it
                            assert data["waiting"] >= 1
                            (waiting,) = data["sessions"]
                            assert waiting["session_id"] == sid
                            assert waiting["from_seq"] <= waiting["to_seq"]
                            # A client that comes now is told at once.
                            async with connect(address) as late:
                                assert (await late.next_notice())["event"] == "store.error"
                            postgresql.start()
                            recovered = client.notices[-1] if client.notices else None
                            while recovered is None or recovered["event"] != "store.recovered":
                                recovered = await client.next_notice()
                            assert recovered["data"]["failed_s"] > 0
                            # The session goes on (what clients get waited for the store).
                            seq = (await anext(stream)).seq
                            assert (await anext(stream)).seq == seq + 1
                            await client.cancel(sid)
                    nursery.cancel_scope.cancel()
                assert sup.store is not None
                await sup.store.flushed()
                assert sup.store.fault is None
                stored = await sup.store.events(sid, 0, 1_000_000)
                assert [s for s, _ in stored] == list(range(1, len(stored) + 1))
                assert len(stored) >= seq + 1
    finally:
        if not postgresql.running:
            postgresql.start()
