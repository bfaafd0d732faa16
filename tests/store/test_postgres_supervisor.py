"""A supervisor on a PostgreSQL store: its server restarts (or crashes) while a session
streams, and every event the clients saw is stored once, seqs contiguous; a supervisor started
again on the database finds the session and its history. In-memory agents, a real server, the
real clock."""

from __future__ import annotations

import pytest
import trio

from pg import PostgresServer
from supervisor import AgentSpec, open_supervisor
from supervisor.store.postgres import PostgresBackend
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 60.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
#: message.delta events seen before the server goes away: mid-stream, with more to come.
RESTART_AFTER = 40


@pytest.mark.parametrize(
    ("immediate", "writer"),
    [(False, "process"), (True, "process"), (True, "thread")],
    ids=["restart", "crash", "crash-thread"],
)
async def test_a_server_restart_mid_stream_loses_no_event(
    postgresql: PostgresServer, immediate: bool, writer: str
) -> None:
    url = postgresql.database()
    launcher = AcpLauncher(AcpBehaviour(words=300, word_interval=0.003))
    try:
        with trio.fail_after(BOUND):
            async with open_supervisor(
                agents={"fake": SPEC}, launcher=launcher, store=url, store_writer=writer
            ) as sup:
                backend = sup.store.backend  # type: ignore[union-attr]
                assert isinstance(backend, PostgresBackend)
                session = await sup.start_session("fake")
                async with session.subscribe() as events:
                    await session.prompt("stream through a restart")
                    deltas = 0
                    async for event in events:
                        if event.kind == "message.delta":
                            deltas += 1
                            if deltas == RESTART_AFTER:
                                # Not in a worker thread: the server would die with it.
                                postgresql.stop(immediate=immediate)
                                postgresql.start()
                        if event.kind == "turn.ended":
                            break
            seen = [bytes(b) for b in session.fanout.history]  # all of it, to the session's end
            if writer == "thread":
                # The writer went on on a new connection (the first went with the server).
                assert backend.connections == 2

            async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
                assert [s.session_id for s in sup.list()] == [session.id]
                stored = await sup.store.events(session.id, 0, 1_000_000)  # type: ignore[union-attr]
                assert [seq for seq, _ in stored] == list(range(1, len(seen) + 1))
                assert [payload for _, payload in stored] == seen
                async with sup.get(session.id).subscribe(since_seq=0) as events:
                    replay = [event async for event in events]
                assert [e.seq for e in replay] == list(range(1, len(replay) + 1))
    finally:
        if not postgresql.running:
            postgresql.start()
