"""``serve`` killed (SIGKILL) in the middle of a flood, with no wait for the store: every event
the client saw is in the store, the same JSON at the same seq, and what is stored is contiguous
from seq 1 (clients are given only what is stored); started again on the same store (each
backend), seqs strictly increase and what the session does next takes seqs and turn ids past
everything the client saw. Real processes (serve, the demo agent, PostgreSQL) on the real
clock."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import trio

from served import (
    check_replay,
    demo_command,
    read_deltas,
    serve,
    whole_history,
    write_config,
)
from supervisor.client import connect
from supervisor.store.url import backend_for

BOUND = 120.0
#: message.delta events the client sees before serve is killed: mid-flood, the writer's
#: batches of a few ms behind what the client got.
KILL_AFTER = 3000


def flood_config(tmp_path: Path) -> Path:
    """A config whose agent ``flood`` answers a prompt with words as fast as it can."""
    return write_config(
        tmp_path,
        {"flood": {"command": demo_command(tmp_path, "--words", "200000", "--delay", "0")}},
    )


async def test_every_event_a_client_saw_before_a_sigkill_is_stored(
    tmp_path: Path, store_url: str
) -> None:
    config = flood_config(tmp_path)
    seen: dict[int, dict[str, Any]] = {}
    with trio.fail_after(BOUND):
        async with serve(tmp_path, "--config", str(config), "--store", store_url) as served:
            async with connect(served.url) as client:
                sid = (await client.start_session("flood"))["session_id"]
                async with client.subscribe(sid, since_seq=0) as events:
                    await client.prompt(sid, "flood")
                    seen.update((e["seq"], e) for e in await read_deltas(events, KILL_AFTER))
                    served.signal(signal.SIGKILL)
                    # (the channel ends with the connection: every event that reached the
                    # client before the kill is in ``seen``)
                    async for event in events:
                        seen[event["seq"]] = event
                await served.wait_exit()
    backend = backend_for(store_url)
    assert backend is not None
    backend.open()
    try:
        stored = dict(backend.events(sid, 0, 10_000_000))
    finally:
        backend.close()
    assert list(stored) == list(range(1, len(stored) + 1)), "stored seqs are contiguous"
    assert max(seen) > KILL_AFTER
    missing = sorted(set(seen) - set(stored))
    assert not missing, f"{len(missing)} events the client saw are not stored: {missing[:5]}"
    for seq, event in seen.items():
        assert json.loads(stored[seq]) == event


async def test_serve_killed_mid_flood_reuses_no_seq(tmp_path: Path, store_url: str) -> None:
    config = flood_config(tmp_path)
    seen: dict[int, dict[str, Any]] = {}
    with trio.fail_after(BOUND):
        async with serve(tmp_path, "--config", str(config), "--store", store_url) as first:
            async with connect(first.url) as client:
                sid = (await client.start_session("flood"))["session_id"]
                async with client.subscribe(sid, since_seq=0) as events:
                    await client.prompt(sid, "flood")
                    seen.update((e["seq"], e) for e in await read_deltas(events, KILL_AFTER))
                first.signal(signal.SIGKILL)  # no wait for the store: the flood goes on
                await first.wait_exit()
        async with serve(tmp_path, "--config", str(config), "--store", store_url) as second:
            async with connect(second.url) as client:
                history = await whole_history(client, sid)
                check_replay(history, seen)
                (gap,) = [e for e in history if e["event"] == "stream.gap"]
                assert gap["data"]["to_seq"] > max(seen)
                (ended,) = [e for e in history if e["event"] == "turn.ended"]
                assert ended["data"]["stop_reason"] == "supervisor_gone"
                assert ended is history[-1]
                # The session goes on past everything the client saw: no seq, no turn id
                # means two things.
                answer = await client.prompt(sid, "again")
                seen_turns = {e["data"].get("turn_id") for e in seen.values()}
                assert answer["turn_id"] not in seen_turns
                async with client.subscribe(sid, since_seq=history[-1]["seq"]) as events:
                    async for event in events:
                        assert event["seq"] > max(seen)
                        if event["event"] == "turn.started":
                            break
                    await client.cancel(sid)
        # A clean stop leaves nothing to mark: a third start adds no gap.
        async with serve(tmp_path, "--config", str(config), "--store", store_url) as third:
            async with connect(third.url) as client:
                again = await whole_history(client, sid)
                assert [e for e in again if e["event"] == "stream.gap"] == [gap]
