"""``serve`` stopped (SIGTERM, or SIGKILL mid-turn) and started again on the same store:
the same sessions, their whole history with the same seqs, the running turn ended once.
Real processes (serve, the demo agent) on the real clock."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from served import check_replay, demo_command, serve, whole_history, write_config
from supervisor.client import connect

BOUND = 90.0


async def until(events: trio.MemoryReceiveChannel[dict[str, Any]], kind: str) -> dict[str, Any]:
    async for event in events:
        if event["event"] == kind:
            return event
    raise AssertionError(f"no {kind}")


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
async def test_serve_again_on_the_same_store(tmp_path: Path, stop: str) -> None:
    config = write_config(
        tmp_path,
        {"talker": {"command": demo_command(tmp_path, "--words", "400", "--delay", "0.02")}},
    )
    with trio.fail_after(BOUND):
        async with serve(tmp_path, "--config", str(config)) as first:
            async with connect(first.url) as client:
                one = (await client.start_session("talker"))["session_id"]
                two = (await client.start_session("talker"))["session_id"]
                async with client.subscribe(one) as events:
                    await client.prompt(one, "say a few words")
                    await until(events, "message.delta")
                    await client.cancel(one)
                    await until(events, "turn.ended")
                    await client.prompt(one, "and again")
                    await until(events, "message.delta")
                    await client.cancel(one)
                    await until(events, "turn.ended")
                async with client.subscribe(two) as events:
                    await client.prompt(two, "keep talking")
                    await until(events, "message.delta")
                    await until(events, "message.delta")
                listed = {s["session_id"]: s["agent"] for s in await client.sessions()}
                assert listed == {one: "talker", two: "talker"}
                if stop == "sigterm":
                    first.signal(signal.SIGTERM)
                else:
                    await trio.sleep(0.1)  # past a flush of the store's writer
                    first.signal(signal.SIGKILL)
                await first.wait_exit()
        async with serve(tmp_path, "--config", str(config)) as second:
            assert "sessions are stored in" in second.stderr
            async with connect(second.url) as client:
                sessions = {s["session_id"]: s for s in await client.sessions()}
                assert {sid: (s["agent"], s["state"]) for sid, s in sessions.items()} == {
                    one: ("talker", "stopped"),
                    two: ("talker", "stopped"),
                }
                for sid in (one, two):
                    history = await whole_history(client, sid)
                    check_replay(history, {})  # seqs increase, a jump only in a stream.gap
                    gaps = [e for e in history if e["event"] == "stream.gap"]
                    assert len(gaps) == (stop == "sigkill")  # where unstored events may be
                    started = [
                        e["data"]["turn_id"] for e in history if e["event"] == "turn.started"
                    ]
                    ended = [e for e in history if e["event"] == "turn.ended"]
                    assert sorted(e["data"]["turn_id"] for e in ended) == sorted(started)
                ones = await whole_history(client, one)
                assert [e["data"]["outcome"] for e in ones if e["event"] == "turn.ended"] == [
                    "cancelled",
                    "cancelled",
                ]
                twos = await whole_history(client, two)
                (last,) = [e for e in twos if e["event"] == "turn.ended"]
                if stop == "sigkill":
                    # The turn ran when serve was killed: ended now, failed, once.
                    assert last["data"]["outcome"] == "failed"
                    assert "supervisor went away" in last["data"]["error"]
                    assert last is twos[-1]
                else:  # a graceful stop cancels the running turn through its ladder
                    assert last["data"]["outcome"] == "cancelled"
                new = (await client.start_session("talker"))["session_id"]
                assert new not in (one, two)
                # A prompt to a stored session starts its agent again; seqs go on.
                answer = await client.prompt(one, "back again")
                async with client.subscribe(one, since_seq=ones[-1]["seq"]) as events:
                    started = await until(events, "turn.started")
                    assert started["data"]["turn_id"] == answer["turn_id"]
                    assert int(answer["turn_id"][1:]) >= 3
                    assert started["seq"] > ones[-1]["seq"]
                    await client.cancel(one)
                    await until(events, "turn.ended")
        async with serve(tmp_path, "--config", str(config)) as third:
            async with connect(third.url) as client:
                assert await whole_history(client, two) == twos  # ended once, not again
