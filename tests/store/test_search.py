"""``session.search`` over the WebSocket: the stored prompts, steers and answers of every
session found with the store's own full-text search (SQLite FTS5, PostgreSQL's tsvector), on
each backend; bad payloads are ``bad_request``, and so is a gateway that keeps no store."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from supervisor import AgentSpec, Supervisor, open_supervisor
from supervisor.client import GatewayClient, GatewayError, connect
from supervisor.gateway import Gateway
from supervisor.store import sqlite
from supervisor.store.backend import INDEX_CHARS, Batch, EventRun, SearchHit, StoredSession, TextRow
from supervisor.store.sqlite import CHECKPOINT_PAGES, SqliteBackend
from supervisor.store.writer import SessionStore
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.requests import (
    MAX_SEARCH_LIMIT,
    SEARCH_LIMIT,
    Request,
    RequestError,
    SearchSessions,
    decode_request,
)

BOUND = 30.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


@asynccontextmanager
async def served(store: str | None) -> AsyncIterator[tuple[GatewayClient, Supervisor]]:
    """A gateway on a supervisor with ``store``, and a client of it."""
    launcher = AcpLauncher(AcpBehaviour(text="the zebra crossed the river", word_interval=0))
    async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=store) as sup:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(Gateway(sup, port=0, token="t").serve)
            async with connect(url) as client:
                yield client, sup
            nursery.cancel_scope.cancel()


async def turn(client: GatewayClient, session_id: str, text: str) -> None:
    """Prompt and wait for the turn's end (its answer is stored with it)."""
    async with client.subscribe(session_id) as events:
        await client.prompt(session_id, text)
        async for event in events:
            if event["event"] == "turn.ended":
                return


async def test_search_finds_prompts_and_answers_of_every_session(store_url: str) -> None:
    before = time.time()
    with trio.fail_after(BOUND):
        async with served(store_url) as (client, sup):
            one = (await client.start_session("fake"))["session_id"]
            two = (await client.start_session("fake"))["session_id"]
            await turn(client, one, "tell me about a giraffe")
            await turn(client, two, "and an elephant please")
            assert sup.store is not None
            await sup.store.flushed()  # (the answers are written a few ms after their turns)
            answers = await client.search("zebra")
            prompt = await client.search("giraffe")
            both = await client.search("elephant please")
            nothing = await client.search("okapi")
            limited = await client.search("zebra", limit=1)
    assert {hit["session_id"] for hit in answers} == {one, two}
    assert {hit["kind"] for hit in answers} == {"answer"}
    assert all(hit["agent"] == "fake" and hit["turn_id"] == "t1" for hit in answers)
    assert all("[zebra]" in hit["snippet"] for hit in answers)
    assert all(before <= hit["time"] <= time.time() for hit in answers)
    [hit] = prompt
    assert (hit["session_id"], hit["kind"], hit["turn_id"]) == (one, "prompt", "t1")
    assert "[giraffe]" in hit["snippet"]
    assert [h["session_id"] for h in both] == [two]
    assert nothing == []
    assert len(limited) == 1


async def test_a_gateway_without_a_store_says_search_needs_one() -> None:
    with trio.fail_after(BOUND):
        async with served(None) as (client, _):
            with pytest.raises(GatewayError) as caught:
                await client.search("zebra")
            assert await client.agents()  # the connection stays usable
    assert caught.value.code == "bad_request"
    assert "needs a session store" in caught.value.message


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "payload needs 'query'"),
        ({"query": 3}, "payload 'query' must be str"),
        ({"query": "   "}, "'query' must hold a word to find"),
        ({"query": "x" * 1001}, "'query' is longer than 1000 characters"),
        ({"query": "x", "limit": "5"}, "payload 'limit' must be int"),
        ({"query": "x", "limit": True}, "payload 'limit' must be int"),
        ({"query": "x", "limit": 0}, f"'limit' must be from 1 to {MAX_SEARCH_LIMIT}"),
        ({"query": "x", "limit": MAX_SEARCH_LIMIT + 1}, "'limit' must be from 1"),
    ],
)
def test_a_bad_search_payload_is_bad_request(payload: dict[str, object], message: str) -> None:
    result = decode_request(json.dumps({"id": 7, "action": "session.search", "payload": payload}))
    assert isinstance(result, RequestError)
    assert (result.id, result.code) == (7, "bad_request")
    assert result.message.startswith(message)


def test_a_search_payload_is_its_typed_call() -> None:
    frame = {"id": 1, "action": "session.search", "payload": {"query": "zebra river"}}
    assert decode_request(json.dumps(frame)) == Request(
        1, SearchSessions("zebra river", SEARCH_LIMIT)
    )
    frame["payload"] = {"query": "zebra", "limit": 3}
    result = decode_request(json.dumps(frame))
    assert isinstance(result, Request) and result.call == SearchSessions("zebra", 3)


async def test_a_bad_search_over_the_wire_is_answered_and_the_connection_stays() -> None:
    with trio.fail_after(BOUND):
        async with served(None) as (client, _):
            with pytest.raises(GatewayError) as caught:
                await client.request("session.search", {"query": "x", "limit": -1})
            assert caught.value.code == "bad_request"
            assert await client.agents()


async def test_the_search_runs_on_the_stores_thread_not_the_event_loop(tmp_path: Path) -> None:
    threads: list[int] = []

    class Watched(SqliteBackend):
        def search(self, query: str, limit: int) -> list[SearchHit]:
            threads.append(threading.get_ident())
            return [SearchHit(session_id="s1", turn_id="t1", seq=1, kind="prompt", snippet="x")]

        def events(self, session_id: str, since_seq: int, limit: int) -> list[tuple[int, bytes]]:
            threads.append(threading.get_ident())
            return [(1, b'{"timestamp": 12.5}')]

    store = SessionStore(Watched(tmp_path / "sessions.db"))
    with trio.fail_after(BOUND):
        await store.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            [hit] = await store.search("x", 5)
            await store.aclose()
    assert hit.time == 12.5
    assert len(threads) == 2 and threading.get_ident() not in threads


def test_a_text_stored_and_not_yet_indexed_is_found_and_deleted_whole(tmp_path: Path) -> None:
    """The SQLite index is brought up to the texts after their write: a text a supervisor
    that went away stored and did not index is found after a restart, and deleting a session
    whose text waits to be indexed leaves the index whole."""
    path = tmp_path / "sessions.db"
    row = StoredSession(
        id="s1", agent="a", protocol="acp", host=None, cwd="/", mcp_servers="[]",
        agent_session_id=None, created=0.0, last_active=0.0, state="stopped",
    )  # fmt: skip
    answer = TextRow(session_id="s1", turn_id="t1", seq=4, kind="answer", text="zebra river")
    backend = SqliteBackend(path)
    backend.open()
    backend.write(Batch(sessions=[row], texts=[answer]))
    backend.close()  # (gone before its index)
    backend = SqliteBackend(path)
    backend.open()
    assert [hit.seq for hit in backend.search("zebra", 5)] == [4]
    backend.write(
        Batch(sessions=[attrs.evolve(row, id="s2")], texts=[attrs.evolve(answer, session_id="s2")])
    )
    backend.delete(["s1", "s2"])
    assert backend.search("zebra", 5) == []
    backend.close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO texts_fts (texts_fts) VALUES ('integrity-check')")  # raises if not
    db.close()


def test_the_write_ahead_log_is_checkpointed_by_settle_not_by_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write leaves the log as it is (its events go to subscribers without a checkpoint's
    wait); a long log is checkpointed by ``settle``, beside the writes (they go on while it
    runs), and so is any log once the store is idle (a checkpoint is seen as the file growing
    by what the log held)."""
    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)
    backend.open()
    go = threading.Event()
    checkpoint = sqlite._Checkpointer._checkpoint

    def held(self: Any) -> None:
        assert go.wait(60)
        checkpoint(self)

    monkeypatch.setattr(sqlite._Checkpointer, "_checkpoint", held)
    payload = b'{"event":"message.delta","data":{"text":"' + b"x" * 1000 + b'"}}'
    empty = path.stat().st_size
    wal = Path(f"{path}-wal")
    seq, due, log = 1, False, 0
    while log < 1.1 * CHECKPOINT_PAGES * 16384:  # past SQLite's own checkpoint (1,000 pages)
        due = backend.write(
            Batch(events=[EventRun(session_id="s1", first_seq=seq, payloads=[payload] * 100)])
        )
        seq += 100
        assert path.stat().st_size == empty  # no write checkpointed the log
        log = wal.stat().st_size
    assert due
    backend.settle(idle=False)  # (returns with the checkpoint begun, held here)
    assert not backend.write(
        Batch(events=[EventRun(session_id="s1", first_seq=seq, payloads=[payload] * 100)])
    )
    assert path.stat().st_size == empty
    go.set()
    checkpointer = backend._checkpointer
    assert checkpointer is not None
    checkpointer.join()
    assert path.stat().st_size > log / 2  # (its data pages; leaves it holds many times)
    seq += 100
    assert not backend.write(
        Batch(events=[EventRun(session_id="s1", first_seq=seq, payloads=[payload] * 100)])
    )
    checkpointed = path.stat().st_size
    backend.settle(idle=False)
    checkpointer.join()
    assert path.stat().st_size == checkpointed  # (a short log waits for an idle store)
    backend.settle(idle=True)
    checkpointer.join()
    assert path.stat().st_size > checkpointed
    backend.close()


def test_texts_are_indexed_once_enough_wait_or_the_store_is_idle(tmp_path: Path) -> None:
    """A few texts wait for an idle store (or a search) to be indexed, so a turn's end is
    not followed by its answer's index beside the next turn's events; INDEX_CHARS of them
    are indexed by the next ``settle`` (one pass stays short)."""
    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)
    backend.open()

    def indexed() -> int:
        return int(backend._read("SELECT count(*) FROM texts_fts_docsize", ())[0][0])

    def answer(seq: int, text: str) -> TextRow:
        return TextRow(session_id="s1", turn_id=f"t{seq}", seq=seq, kind="answer", text=text)

    assert not backend.write(Batch(texts=[answer(1, "zebra"), answer(2, "river")]))
    backend.settle(idle=False)
    assert indexed() == 0
    backend.settle(idle=True)
    assert indexed() == 2
    assert not backend.write(Batch(texts=[answer(3, "okapi")]))
    assert [hit.seq for hit in backend.search("okapi", 5)] == [3]  # (indexed first)
    assert backend.write(Batch(texts=[answer(4, "w " * (INDEX_CHARS // 2))]))
    backend.settle(idle=False)
    assert indexed() == 4
    backend.close()
