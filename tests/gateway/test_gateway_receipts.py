"""The gateway's recent stops (``supervisor/stops.py``): ``receipts.list`` on the WebSocket and
``GET /v1/receipts``, what they hold and how far back; the ring on its own."""

from __future__ import annotations

import time
import weakref
from typing import Any

import pytest
import trio
from test_gateway import gateway, http, next_event

from supervisor.client import GatewayError, connect
from supervisor.receipt import CancelReceipt, DroppedPrompt
from supervisor.stops import RECENT_STOPS, RecentStops
from supervisor.testing._acp import AcpBehaviour

AUTH = {"authorization": "Bearer secret-token"}


async def ended(events: trio.MemoryReceiveChannel[dict[str, Any]], turn_id: str) -> dict[str, Any]:
    while True:
        event = await next_event(events, "turn.ended")
        if event["data"]["turn_id"] == turn_id:
            return event


async def test_every_stop_of_every_session_is_listed_oldest_first() -> None:
    """A cancel, a kill (with a queued prompt it drops) and a stall, in two sessions: three
    stops, each with its session, agent, outcome, latency, escalation, reason and summary; a
    completed turn and the dropped prompt are none."""
    behaviour = AcpBehaviour(words=10_000, word_interval=0.01, stop_delay=0.02)
    async with gateway(behaviour, grace=0.3, stall_s=0.5) as (_, url, _l):
        async with connect(url) as client:
            empty = await client.receipts()
            assert empty == {"receipts": [], "kept": RECENT_STOPS, "last_seq": 0}
            one = (await client.start_session("fake"))["session_id"]
            two = (await client.start_session("fake"))["session_id"]
            async with client.subscribe(one) as events_one, client.subscribe(two) as events_two:
                short = (await client.prompt(one, "short words=3"))["turn_id"]
                await ended(events_one, short)  # completed: not a stop
                await client.prompt(one, "hello")
                await next_event(events_one, "message.delta")
                cancelled = await client.cancel(one)
                await client.prompt(two, "ignore-cancel")
                await next_event(events_two, "message.delta")
                assert (await client.prompt(two, "queued"))["queued"]
                killed = await client.cancel(two)
                silent = (await client.prompt(one, "silent-after=1"))["turn_id"]
                stalled = (await ended(events_one, silent))["data"]["receipt"]
            listed = await client.receipts()
            status, body = await http(url, "GET", "/v1/receipts", AUTH)
    assert (cancelled["outcome"], killed["outcome"]) == ("cancelled", "killed")
    assert len(killed["dropped_prompts"]) == 1
    assert (status, body) == (200, listed)
    assert listed["kept"] == RECENT_STOPS and listed["last_seq"] == 3
    stops = listed["receipts"]
    assert [(s["seq"], s["session_id"], s["outcome"], s["reason"]) for s in stops] == [
        (1, one, "cancelled", "user"),
        (2, two, "killed", "user"),
        (3, one, "cancelled", "stalled"),
    ]
    for stop, receipt in zip(stops, (cancelled, killed, stalled), strict=True):
        assert stop == {
            "seq": stop["seq"],
            "time": stop["time"],
            "session_id": receipt["session_id"],
            "turn_id": receipt["turn_id"],
            "agent": "fake",
            "protocol": "acp",
            "outcome": receipt["outcome"],
            "elapsed_ms": receipt["elapsed_ms"],
            "escalation": receipt["escalation"],
            "reason": receipt["reason"],
            "stop_reason": receipt["stop_reason"],
            "summary": CancelReceipt(
                **{k: v for k, v in receipt.items() if k not in ("success", "dropped_prompts")},
                dropped_prompts=[DroppedPrompt(**p) for p in receipt["dropped_prompts"]],
            ).summary(),
        }
        assert 0 < time.time() - stop["time"] < 60
    assert (
        stops[1]["summary"]
        == "Killed after 0.3 s grace, session resumed; 1 queued prompt(s) dropped"
    )
    assert stops[1]["escalation"][-2:] == ["respawned", "resumed"]


async def test_how_many_and_since_which_by_websocket_and_http() -> None:
    async with gateway(AcpBehaviour(words=10_000, word_interval=0.01, stop_delay=0.0)) as (
        _,
        url,
        _l,
    ):
        async with connect(url) as client:
            session_id = (await client.start_session("fake"))["session_id"]
            for _ in range(3):
                await client.prompt(session_id, "hello")
                await client.cancel(session_id)

            async def seqs(**payload: int) -> list[int]:
                return [s["seq"] for s in (await client.receipts(**payload))["receipts"]]

            assert await seqs() == [1, 2, 3]
            assert await seqs(limit=2) == [2, 3]
            assert await seqs(limit=0) == []
            assert await seqs(since_seq=1) == [2, 3]
            assert await seqs(since_seq=1, limit=1) == [3]
            assert await seqs(since_seq=3) == []
            for payload in ({"limit": -1}, {"since_seq": -1}, {"limit": "2"}, {"limit": 1.5}):
                with pytest.raises(GatewayError) as refused:
                    await client.request("receipts.list", payload)
                assert refused.value.code == "bad_request", payload

        async def route(query: str, headers: dict[str, str] = AUTH) -> tuple[int, Any]:
            return await http(url, "GET", "/v1/receipts" + query, headers)

        status, body = await route("?limit=1&since_seq=1")
        assert status == 200 and [s["seq"] for s in body["receipts"]] == [3]
        status, body = await route("?token=secret-token&since_seq=2", {})
        assert status == 200 and [s["seq"] for s in body["receipts"]] == [3]
        for query in ("?limit=x", "?limit=-1", "?since_seq=", "?limit=1e3", "?limit=%EF%BC%91"):
            status, body = await route(query)
            assert status == 400 and body["error"]["code"] == "bad_request", query
        # The same token as every route: none, or a wrong one, is refused before anything.
        assert (await route("", {}))[0] == 401
        assert (await route("?token=wrong", {}))[0] == 401
        assert (await route("", {**AUTH, "origin": "http://evil.example"}))[0] == 403
        status, _ = await http(url, "POST", "/v1/receipts", AUTH)
        assert status == 405


async def test_the_gateway_keeps_its_last_stops_only() -> None:
    over = 5
    async with gateway(AcpBehaviour(words=10_000, word_interval=0.01, stop_delay=0.0)) as (
        _,
        url,
        _l,
    ):
        async with connect(url) as client:
            session_id = (await client.start_session("fake"))["session_id"]
            for _ in range(RECENT_STOPS + over):
                await client.prompt(session_id, "hello")
                await client.cancel(session_id)
            listed = await client.receipts()
            status, body = await http(url, "GET", "/v1/receipts?limit=1000", AUTH)
    seqs = [s["seq"] for s in listed["receipts"]]
    assert seqs == list(range(over + 1, RECENT_STOPS + over + 1))
    assert listed["last_seq"] == RECENT_STOPS + over and listed["kept"] == RECENT_STOPS
    assert (status, body) == (200, listed)


def receipt(n: int, **fields: Any) -> CancelReceipt:
    return CancelReceipt(session_id="s1", turn_id=f"t{n}", outcome="cancelled", **fields)


def test_the_ring_keeps_the_last_stops_compact() -> None:
    stops = RecentStops(kept=3)
    assert stops.recent() == [] and stops.last_seq == 0
    for n in range(1, 6):
        stops.add("demo", "acp", receipt(n, elapsed_ms=float(n)), 1000.0 + n)
    assert [s.seq for s in stops.recent()] == [3, 4, 5] and stops.last_seq == 5
    assert [s.turn_id for s in stops.recent(limit=2)] == ["t4", "t5"]
    assert [s.seq for s in stops.recent(since_seq=1)] == [3, 4, 5]
    assert stops.recent(since_seq=5) == []
    # What a receipt may carry by the megabyte (what it dropped, the adapter's details) is
    # counted in its summary, never kept.
    big = receipt(
        6,
        dropped_prompts=[DroppedPrompt.of(f"t{n}", "x" * 100_000) for n in range(7, 39)],
        details={"blob": "y" * 100_000},
        escalation=["interrupt"] * 100,
    )
    stops.add("demo", "acp", big, 2000.0)
    kept = weakref.ref(big)
    del big
    assert kept() is None  # the ring made its record at once, and let the receipt go
    newest = stops.recent(limit=1)[0]
    assert len(repr(newest)) < 1000 and len(newest.escalation) == 16
    assert newest.summary.endswith("; 32 queued prompt(s) dropped")
    assert newest.to_wire()["escalation"] == ["interrupt"] * 16
    assert "host" not in newest.to_wire()
    stops.add("demo", "acp", receipt(7, host="b1"), 2001.0)
    assert stops.recent(limit=1)[0].to_wire()["host"] == "b1"
