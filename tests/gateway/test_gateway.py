"""The gateway over real loopback sockets, with in-memory agents, on the real clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Ping, Pong, Request, TextMessage

from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayClient, GatewayError, connect, websocket_url
from supervisor.gateway import Gateway, GatewayLimits
from supervisor.runtime.fanout import Fanout
from supervisor.runtime.session import DEFAULT_HISTORY
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.testing._memory import MemoryLink
from supervisor.wire.frames import text_frame
from supervisor.wire.requests import MAX_FRAME_BYTES

BOUND = 20.0


@asynccontextmanager
async def gateway(
    behaviour: AcpBehaviour | None = None,
    limits: GatewayLimits | None = None,
    grace: float = 0.5,
    **options: Any,
) -> AsyncIterator[tuple[Gateway, str, AcpLauncher]]:
    launcher = AcpLauncher(behaviour or AcpBehaviour(words=400, word_interval=0.01))
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=grace, **options)
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
            async with trio.open_nursery() as nursery:
                server = Gateway(
                    sup, port=0, token="secret-token", limits=limits or GatewayLimits()
                )
                url = await nursery.start(server.serve)
                yield server, url, launcher
                nursery.cancel_scope.cancel()


async def http(
    url: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, dict[str, Any] | str]:
    """A minimal HTTP/1.1 client over a trio socket (one request, connection: close)."""
    base = url.split("/?")[0]
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    lines = [
        f"{method} {path} HTTP/1.1",
        f"host: {host}:{port}",
        "connection: close",
        f"content-length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode()


async def start_and_subscribe(client: GatewayClient) -> str:
    session_id: str = (await client.start_session("fake"))["session_id"]
    return session_id


async def next_event(
    events: trio.MemoryReceiveChannel[dict[str, Any]], kind: str
) -> dict[str, Any]:
    async for event in events:
        if event["event"] == kind:
            return event
    raise AssertionError(f"no {kind} event")


async def test_ready_url_and_http_routes() -> None:
    async with gateway() as (server, url, _):
        assert url.startswith("http://127.0.0.1:") and url.endswith("?token=secret-token")
        status, body = await http(url, "GET", "/v1/sessions?token=secret-token")
        assert (status, body) == (200, {"paused": False, "sessions": []})
        status, body = await http(
            url, "GET", "/v1/sessions", {"authorization": "Bearer secret-token"}
        )
        assert status == 200
        status, body = await http(url, "GET", "/v1/agents?token=secret-token")
        assert status == 200 and isinstance(body, dict)
        assert body["agents"] == [
            {"name": "fake", "protocol": "acp", "description": "", "prompt_carries": []}
        ]
        status, body = await http(url, "GET", "/?token=secret-token")
        assert status == 200 and "<html" in str(body).lower()
        status, _ = await http(url, "GET", "/nope?token=secret-token")
        assert status == 404


@pytest.mark.parametrize(
    "path,headers,expected",
    [
        ("/v1/sessions", {}, 401),
        ("/v1/sessions?token=wrong", {}, 401),
        ("/v1/sessions", {"authorization": "Bearer wrong"}, 401),
        ("/v1/sessions?token=secret-token", {"origin": "http://evil.example"}, 403),
        ("/?token=secret-token", {"origin": "http://evil.example"}, 403),
        ("/", {}, 401),
    ],
)
async def test_http_refuses_without_token_or_from_other_origin(
    path: str, headers: dict[str, str], expected: int
) -> None:
    async with gateway() as (_, url, _launcher):
        status, _ = await http(url, "GET", path, headers)
        assert status == expected


async def test_websocket_needs_token_and_same_origin() -> None:
    async with gateway() as (_, url, _launcher):
        ws_url = websocket_url(url)
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(ws_url.split("?")[0]):
                pass
        assert rejected.value.status_code == 401
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(
                ws_url, extra_headers=[(b"origin", b"http://evil.example")]
            ):
                pass
        assert rejected.value.status_code == 403
        port = url.split(":")[2].split("/")[0]
        same_origin = [(b"origin", f"http://127.0.0.1:{port}".encode())]
        async with open_websocket_url(ws_url, extra_headers=same_origin) as ws:
            await ws.send_message(json.dumps({"id": 1, "action": "session.list"}))
            assert json.loads(await ws.get_message()) == {
                "id": 1,
                "ok": True,
                "result": {"paused": False, "sessions": []},
            }


async def test_prompt_cancel_is_terminate_then_respond_and_fans_out() -> None:
    async with gateway(AcpBehaviour(words=400, word_interval=0.01, stop_delay=0.05)) as (
        _,
        url,
        _l,
    ):
        async with connect(url) as alice, connect(url) as bob:
            assert [a["name"] for a in await alice.agents()] == ["fake"]
            session_id = await start_and_subscribe(alice)
            async with (
                alice.subscribe(session_id) as alice_events,
                bob.subscribe(session_id) as bob_events,
            ):
                turn = await alice.prompt(session_id, "hello")
                assert turn == {"turn_id": "t1", "queued": False, "held": None}
                await next_event(alice_events, "message.delta")
                receipt = await alice.cancel(session_id, reason="user")
                assert receipt["success"] is True and receipt["outcome"] == "cancelled"
                assert receipt["escalation"] == ["interrupt"] and receipt["turn_id"] == "t1"
                # Bob sees the turn end, with the same receipt.
                ended = await next_event(bob_events, "turn.ended")
                assert ended["data"]["receipt"] == {
                    k: v for k, v in receipt.items() if k != "success"
                }
                [session] = await bob.sessions()
                assert isinstance(session.pop("cwd"), str)
                assert session == {
                    "session_id": session_id,
                    "agent": "fake",
                    "state": "ready",
                    "turn_id": None,
                    "recycles": 0,
                    "recycle_reason": None,
                    "held": None,
                }


async def test_events_are_in_order_with_contiguous_seq_and_replay() -> None:
    async with gateway(AcpBehaviour(words=20, word_interval=0.001)) as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            seen: list[dict[str, Any]] = []
            async with client.subscribe(session_id) as events:
                await client.prompt(session_id, "hello")
                async for event in events:
                    seen.append(event)
                    if event["event"] == "turn.ended":
                        break
            seqs = [e["seq"] for e in seen]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            # Replay from the start: the same events again, from seq 1.
            async with client.subscribe(session_id, since_seq=0) as replay:
                replayed = [await replay.receive() for _ in range(seqs[-1])]
            assert [e["seq"] for e in replayed] == list(range(1, seqs[-1] + 1))
            assert replayed[-len(seen) :] == seen


async def test_two_clients_cancelling_at_once_get_the_same_receipt() -> None:
    async with gateway(AcpBehaviour(words=400, word_interval=0.01, stop_delay=0.1)) as (_, url, _l):
        async with connect(url) as alice, connect(url) as bob:
            session_id = await start_and_subscribe(alice)
            await alice.prompt(session_id, "hello")
            receipts: list[dict[str, Any]] = []

            async def cancel(client: GatewayClient) -> None:
                receipts.append(await client.cancel(session_id))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel, alice)
                nursery.start_soon(cancel, bob)
            assert len(receipts) == 2 and receipts[0] == receipts[1]
            assert receipts[0]["outcome"] == "cancelled"


def queued(events: trio.MemoryReceiveChannel[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events already delivered to a subscription's queue (without waiting)."""
    delivered = []
    while True:
        try:
            delivered.append(events.receive_nowait())
        except trio.WouldBlock:
            return delivered


@pytest.mark.parametrize("stop_delay", [0.0, 0.05, None], ids=["at_once", "later", "killed"])
async def test_cancel_returns_with_the_turn_ended_already_delivered(
    stop_delay: float | None,
) -> None:
    """The wire keeps causal order: a client subscribed on the connection it cancels on holds
    the turn's ``turn.ended`` (with the same receipt) when ``cancel()`` returns."""
    behaviour = AcpBehaviour(words=10_000, word_interval=0.01, stop_delay=stop_delay)
    async with gateway(behaviour, grace=0.3) as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            async with client.subscribe(session_id) as events:
                turn = await client.prompt(session_id, "hello")
                await next_event(events, "message.delta")
                receipt = await client.cancel(session_id)
                ended = [e for e in queued(events) if e["event"] == "turn.ended"]
                assert [e["data"]["turn_id"] for e in ended] == [turn["turn_id"]]
                assert ended[0]["data"]["receipt"] == {
                    k: v for k, v in receipt.items() if k != "success"
                }
                assert receipt["outcome"] == ("killed" if stop_delay is None else "cancelled")


async def test_disconnecting_mid_cancel_does_not_abort_it() -> None:
    # A wedged agent: the cancel takes the whole grace window and a kill.
    async with gateway(
        AcpBehaviour(words=10_000, word_interval=0.01, stop_delay=None), grace=0.5
    ) as (
        _,
        url,
        launcher,
    ):
        async with connect(url) as watcher:
            session_id = await start_and_subscribe(watcher)
            async with watcher.subscribe(session_id) as events:
                async with connect(url) as leaver:
                    await leaver.prompt(session_id, "hello")
                    with trio.move_on_after(0.1):
                        await leaver.cancel(session_id)  # gives up and disconnects
                ended = await next_event(events, "turn.ended")
                assert ended["data"]["outcome"] == "killed"
                assert ended["data"]["receipt"]["resumed"] is True
        assert launcher.kills and launcher.kills[0][1] == ["sigterm"]


@pytest.mark.parametrize(
    "frame,code",
    [
        ("not json", "bad_request"),
        ("[1, 2]", "bad_request"),
        ('{"id": 1}', "bad_request"),
        ('{"id": 1, "action": "no.such"}', "unknown_action"),
        ('{"id": 1, "action": "agent.prompt", "payload": {"session_id": "s1"}}', "bad_request"),
        (
            '{"id": 1, "action": "agent.prompt", "payload": {"session_id": 5, "text": "x"}}',
            "bad_request",
        ),
        (
            '{"id": 1, "action": "agent.prompt", "payload": {"session_id": "s404", "text": "x"}}',
            "session_not_found",
        ),
        (
            '{"id": 1, "action": "agent.cancel", "payload": {"session_id": "s404"}}',
            "session_not_found",
        ),
        ('{"id": 1, "action": "session.start", "payload": {"agent": "nope"}}', "bad_request"),
        (
            '{"id": 1, "action": "permission.respond", "payload": {"session_id": "s1", "request_id": "r"}}',
            "bad_request",
        ),
        ('{"id": true, "action": "session.list"}', "bad_request"),
    ],
)
async def test_bad_input_gets_an_error_and_the_connection_stays_usable(
    frame: str, code: str
) -> None:
    async with gateway() as (_, url, _l):
        async with open_websocket_url(websocket_url(url)) as ws:
            await ws.send_message(frame)
            response = json.loads(await ws.get_message())
            assert response["ok"] is False and response["error"]["code"] == code
            await ws.send_message(json.dumps({"id": "after", "action": "session.list"}))
            assert json.loads(await ws.get_message())["ok"] is True


async def test_oversize_frame_is_too_large_and_connection_survives() -> None:
    async with gateway() as (_, url, _l):
        async with open_websocket_url(websocket_url(url), max_message_size=32 * 1024 * 1024) as ws:
            await ws.send_message(
                json.dumps({"id": 1, "action": "session.list", "payload": {"x": "a" * 2_000_000}})
            )
            response = json.loads(await ws.get_message())
            assert response["error"]["code"] == "too_large"
            await ws.send_message(json.dumps({"id": 2, "action": "session.list"}))
            assert json.loads(await ws.get_message())["ok"] is True


async def test_agent_not_running_after_stop() -> None:
    async with gateway() as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            assert (await client.stop(session_id)) == {"exit_code": 0}
            with pytest.raises(GatewayError) as error:
                await client.prompt(session_id, "again")
            assert error.value.code in ("agent_not_running", "session_not_found")


async def test_a_stopped_session_of_the_store_is_stopped_not_unknown(tmp_path: Path) -> None:
    # Stopped here, it is the store's: a second stop is no error (asked at once too, before
    # the store has written its end), and a cancel says it is stopped and what brings it back (not that an earlier supervisor stored it).
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
    launcher = AcpLauncher(AcpBehaviour(words=3))
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": spec}, launcher=launcher, store=store) as sup:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(Gateway(sup, port=0, token="secret-token").serve)
                async with connect(url) as client:
                    session_id = await start_and_subscribe(client)
                    assert (await client.stop(session_id)) == {"exit_code": 0}
                    # At once, before the store has written its end: known all the same.
                    assert (await client.stop(session_id)) == {"exit_code": None}
                    with pytest.raises(GatewayError) as error:
                        await client.cancel(session_id)
                    assert error.value.code == "agent_not_running"
                    assert error.value.message == (
                        f"session {session_id} is stopped (its agent is not running):"
                        " a prompt starts it again"
                    )
                nursery.cancel_scope.cancel()


async def test_head_is_answered_as_get_without_the_body() -> None:
    # `curl -I`: the status and the head, never an empty reply.
    async with gateway() as (_, url, _l):
        auth = {"authorization": "Bearer secret-token"}
        with trio.fail_after(BOUND):
            assert await http(url, "HEAD", "/v1/sessions", auth) == (200, "")
            assert await http(url, "HEAD", "/", auth) == (200, "")
            assert await http(url, "HEAD", "/v1/sessions") == (401, "")  # no token


async def test_http_abort_returns_the_receipt() -> None:
    async with gateway(AcpBehaviour(words=400, word_interval=0.01, stop_delay=0.02)) as (
        _,
        url,
        _l,
    ):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            status, body = await http(
                url,
                "POST",
                f"/v1/sessions/{session_id}/abort",
                {"authorization": "Bearer secret-token"},
            )
            assert status == 200 and isinstance(body, dict) and body["outcome"] == "no_active_turn"
            await client.prompt(session_id, "hello")
            status, body = await http(
                url,
                "POST",
                f"/v1/sessions/{session_id}/abort?token=secret-token",
                body=b'{"reason": "curl"}',
            )
            assert status == 200 and isinstance(body, dict)
            assert (body["outcome"], body["reason"], body["success"]) == ("cancelled", "curl", True)
            # Another connection has no order with this one: what a WebSocket subscriber learns
            # from turn.ended, the HTTP answer says itself (the same receipt).
            async with client.subscribe(session_id, since_seq=0) as events:
                ended = await next_event(events, "turn.ended")
            assert ended["data"]["receipt"] == {k: v for k, v in body.items() if k != "success"}
            status, body = await http(url, "POST", "/v1/sessions/s999/abort?token=secret-token")
            assert (
                status == 404
                and isinstance(body, dict)
                and body["error"]["code"] == "session_not_found"
            )


async def test_stalled_client_is_cut_off_and_recovers_while_others_lose_nothing() -> None:
    limits = GatewayLimits()
    limits.outgoing_buffer = 4
    limits.subscription_buffer = 256
    limits.send_buffer_bytes = 16 * 1024
    # It holds the agent back until it has taken nothing for this long, then it is cut off.
    limits.subscriber_stall_s = 0.5
    # ~2 MB of events at 500/s; small socket buffers make the stalled reader felt quickly.
    behaviour = AcpBehaviour(words=1000, word_interval=0.002, pad=2000)
    async with gateway(behaviour, limits=limits) as (_, url, _l):
        async with connect(url) as fast:
            session_id = await start_and_subscribe(fast)
            # The slow client subscribes and then does not read at all.
            async with open_websocket_url(websocket_url(url), message_queue_size=1) as slow:
                await slow.send_message(
                    json.dumps(
                        {
                            "id": 1,
                            "action": "session.subscribe",
                            "payload": {"session_id": session_id},
                        }
                    )
                )
                seqs: list[int] = []
                async with fast.subscribe(session_id) as events:
                    turn = await fast.prompt(session_id, "stream")
                    async for event in events:
                        seqs.append(event["seq"])
                        if (
                            event["event"] == "turn.ended"
                            and event["data"]["turn_id"] == turn["turn_id"]
                        ):
                            break
                assert seqs == list(
                    range(seqs[0], seqs[0] + len(seqs))
                )  # nothing lost for the fast one
                # Now the slow one reads: it was cut off, told so, and can catch up by since_seq.
                lagged = None
                while lagged is None:
                    message = json.loads(await slow.get_message())
                    if message.get("event") == "subscription.lagged":
                        lagged = message
                last = lagged["data"]["last_seq"]
                await slow.send_message(
                    json.dumps(
                        {
                            "id": 2,
                            "action": "session.subscribe",
                            "payload": {"session_id": session_id, "since_seq": last},
                        }
                    )
                )
                caught_up = []
                while not caught_up or caught_up[-1] < seqs[-1]:
                    message = json.loads(await slow.get_message())
                    if "event" in message and message["event"] != "subscription.lagged":
                        caught_up.append(message["seq"])
                assert caught_up[0] == last + 1


async def test_flood_reaches_a_slow_client_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent floods far past the session's history while a client reads nothing; once it
    reads, it gets every event: the agent was held back instead (design/gateway.md)."""
    held = trio.Event()
    hold = Fanout.wait_for_room

    async def observed(self: Fanout) -> None:
        held.set()
        await hold(self)

    monkeypatch.setattr(Fanout, "wait_for_room", observed)
    limits = GatewayLimits()
    limits.subscription_buffer = 64
    limits.send_buffer_bytes = 16 * 1024
    limits.subscriber_stall_s = 3600.0  # it is slow, not gone
    words = DEFAULT_HISTORY + 2_000
    # 1 KB events: ~12 MB, more than any socket buffers hold between the two ends.
    async with gateway(AcpBehaviour(flood=True, words=words, pad=1000), limits=limits) as (
        _,
        url,
        _l,
    ):
        async with (
            connect(url) as control,
            open_websocket_url(websocket_url(url), message_queue_size=1) as slow,
        ):
            session_id = await start_and_subscribe(control)
            subscribe = {
                "id": 1,
                "action": "session.subscribe",
                "payload": {"session_id": session_id},
            }
            await slow.send_message(json.dumps(subscribe))
            start = json.loads(await slow.get_message())["result"]["last_seq"]
            await control.prompt(session_id, "flood")
            await held.wait()  # the slow client's buffers are full: the agent waits for it
            seqs: list[int] = []
            deltas = 0
            while True:
                message = json.loads(await slow.get_message())
                assert message["event"] != "subscription.lagged"
                seqs.append(message["seq"])
                deltas += message["event"] == "message.delta"
                if message["event"] == "turn.ended":
                    break
            assert seqs == list(range(start + 1, start + 1 + len(seqs)))
            assert deltas == words


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
def test_event_frames_are_what_wsproto_would_send(size: int) -> None:
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(
        b"GET /ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
        b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    list(server.events())
    server.send(AcceptConnection())
    payload = "é" * (size // 2) + "a" * (size % 2)
    assert text_frame(payload.encode()) == server.send(TextMessage(data=payload))


async def test_ping_is_answered_and_close_is_a_handshake() -> None:
    async with gateway() as (_, url, _l):
        async with open_websocket_url(websocket_url(url)) as ws:
            await ws.ping(b"are you there")
            await ws.send_message(json.dumps({"id": 1, "action": "session.list"}))
            assert json.loads(await ws.get_message())["ok"] is True
        assert ws.closed is not None and ws.closed.code == 1000


async def test_frame_over_the_hard_limit_closes_with_1009() -> None:
    limits = GatewayLimits()
    limits.hard_frame_bytes = 2 * MAX_FRAME_BYTES
    async with gateway(limits=limits) as (_, url, _l):
        async with open_websocket_url(websocket_url(url)) as ws:
            with pytest.raises(ConnectionClosed) as closed:  # while sending, or after
                await ws.send_message("x" * (3 * MAX_FRAME_BYTES))
                await ws.get_message()
            assert closed.value.reason.code == 1009


async def test_session_list_tells_of_a_recycled_agent() -> None:
    async with gateway(AcpBehaviour(words=2, word_interval=0.01)) as (_, url, launcher):
        async with connect(url) as client:
            session_id = (await client.start_session("fake"))["session_id"]
            async with client.subscribe(session_id) as events:
                for _ in range(3):
                    turn = await client.prompt(session_id, "fail")
                    async for event in events:
                        if event["event"] == "turn.ended":
                            assert event["data"]["turn_id"] == turn["turn_id"]
                            assert event["data"]["outcome"] == "failed"
                            break
                async for event in events:
                    if event["event"] == "session.recycled":
                        assert event["data"]["failed_turns"] == 3
                        break
            [entry] = await client.sessions()
            assert entry["recycles"] == 1 and "3 turns failed" in entry["recycle_reason"]
            assert len(launcher.agents) == 2


@pytest.mark.parametrize("steering", [True, False])
async def test_steer_over_the_wire_says_what_happened_after_its_events(steering: bool) -> None:
    """``agent.steer``: ``injected`` into the running turn where the agent steers, else
    ``interrupted`` with the receipt; either way the ``turn.steered`` event (and, interrupted,
    the old turn's ``turn.ended``) is on the wire before the answer."""
    behaviour = AcpBehaviour(words=10_000, word_interval=0.01, steering=steering)
    async with gateway(behaviour, grace=0.3) as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            async with client.subscribe(session_id) as events:
                turn = await client.prompt(session_id, "hello")
                await next_event(events, "message.delta")
                result = await client.steer(session_id, "go left")
                before = queued(events)
                steered = [e for e in before if e["event"] == "turn.steered"]
                assert [e["data"]["turn_id"] for e in steered] == [result["turn_id"]]
                assert steered[0]["data"]["text"] == "go left"
                if steering:
                    assert (result["mode"], result["turn_id"]) == ("injected", turn["turn_id"])
                    assert "receipt" not in result
                else:
                    assert result["mode"] == "interrupted"
                    assert result["turn_id"] != turn["turn_id"]
                    assert result["receipt"]["turn_id"] == turn["turn_id"]
                    assert result["receipt"]["reason"] == "steer"
                    ended = [e for e in before if e["event"] == "turn.ended"]
                    assert [e["data"]["turn_id"] for e in ended] == [turn["turn_id"]]
                    assert steered[0]["data"]["interrupted_turn_id"] == turn["turn_id"]
                await client.cancel(session_id)
            with pytest.raises(GatewayError) as info:
                await client.steer(session_id, 42)  # type: ignore[arg-type]
            assert info.value.code == "bad_request"


async def test_a_stalled_turn_is_told_on_the_wire() -> None:
    """The watchdog's stop as a client sees it: ``turn.stalled``, then the turn's end with
    ``reason: "stalled"`` (and in its receipt); a client's own cancel says ``user``."""
    async with gateway(AcpBehaviour(words=400, word_interval=0.01), stall_s=0.3) as (_, url, _l):
        async with connect(url) as client:
            session_id = (await client.start_session("fake"))["session_id"]
            async with client.subscribe(session_id) as events:
                turn = await client.prompt(session_id, "silent-after=1")
                stalled = await next_event(events, "turn.stalled")
                assert stalled["data"]["turn_id"] == turn["turn_id"]
                assert stalled["data"]["stall_s"] == 0.3 and stalled["data"]["tool_calls"] == []
                assert 0.3 <= stalled["data"]["silent_s"] < 5.0
                ended = await next_event(events, "turn.ended")
                assert (ended["data"]["outcome"], ended["data"]["reason"]) == (
                    "cancelled",
                    "stalled",
                )
                assert ended["data"]["receipt"]["reason"] == "stalled"
                await client.prompt(session_id, "hello")
                await next_event(events, "message.delta")
                receipt = await client.cancel(session_id)
                assert (receipt["outcome"], receipt["reason"]) == ("cancelled", "user")


async def test_a_prompt_the_agent_cannot_be_handed_is_never_announced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure to hand a prompt to the agent (here the link raises) leaves no turn announced
    and the session ready again (its agent recycled: the machine had been told of the prompt);
    the failed request is logged by action, error and size only."""
    send = MemoryLink.send

    def refuse_prompts(self: MemoryLink, message: dict[str, Any]) -> None:
        if message.get("method") == "session/prompt":
            raise RuntimeError("the agent's pipe is broken")
        send(self, message)

    monkeypatch.setattr(MemoryLink, "send", refuse_prompts)
    text = "a private prompt " * 10_000
    async with gateway() as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            async with client.subscribe(session_id) as events:
                with pytest.raises(GatewayError) as failed:
                    await client.prompt(session_id, text)
                assert failed.value.code == "internal"
                # Events come before a response queued after them: all of them are here now.
                messages = []
                while True:
                    try:
                        messages.append(events.receive_nowait())
                    except trio.WouldBlock:
                        break
                seen = [message["event"] for message in messages]
                assert "turn.started" not in seen and "session.recycled" in seen
                with trio.fail_after(30):
                    while not any(
                        m["event"] == "session.state" and m["data"]["state"] == "ready"
                        for m in messages[seen.index("session.recycled") :]
                    ):
                        messages.append(await events.receive())
                [entry] = await client.sessions()
                assert (entry["state"], entry["turn_id"]) == ("ready", None)
    [line] = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("gateway request")
    ]
    size = len(
        json.dumps(
            {
                "id": "c3",
                "action": "agent.prompt",
                "payload": {"session_id": session_id, "text": text},
            }
        )
    )
    assert line == (
        f"gateway request agent.prompt failed ({size} bytes):"
        " RuntimeError: the agent's pipe is broken"
    )
    assert not [r for r in caplog.records if "private prompt" in r.getMessage()]


async def test_a_failed_request_quoting_its_text_is_logged_with_controls_escaped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A steer's text goes to the agent as it is; a log line that quotes it (here an error
    nobody foresaw does) has its control characters and bidi controls escaped: whoever reads
    the log sees them, the terminal or viewer does not act on them."""
    from supervisor.runtime.session import Session

    async def steer(self: Session, text: str) -> None:
        raise RuntimeError(f"could not steer with {text}")

    monkeypatch.setattr(Session, "steer", steer)
    text = "stop\x1b[2J now \u202eexe.txt"
    async with gateway() as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            with pytest.raises(GatewayError) as failed:
                await client.steer(session_id, text)
            # The client is answered with the error as it is (JSON carries it escaped).
            assert failed.value.code == "internal" and text in failed.value.message
    [line] = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("gateway request")
    ]
    assert line.endswith(r"RuntimeError: could not steer with stop\x1b[2J now \u202eexe.txt")


# -- what a client without the token can make the gateway do -----------------------------------


async def _exchange(url: str, *chunks: bytes) -> bytes:
    """Send ``chunks`` (one write each) and read until the server closes."""
    host, port = url.split("/?")[0].removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    for chunk in chunks:
        await stream.send_all(chunk)
    data = b""
    with trio.fail_after(BOUND):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    return data


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _head(url: str, target: str, *fields: str, method: str = "GET") -> bytes:
    port = url.split("/?")[0].rsplit(":", 1)[1]
    lines = [f"{method} {target} HTTP/1.1", f"host: 127.0.0.1:{port}", "connection: close"]
    return ("\r\n".join([*lines, *fields]) + "\r\n\r\n").encode()


async def test_a_head_without_the_token_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A head that holds the token nowhere (as it is, as ``quote`` writes it in a URL, or the
    page's cookie key) cannot pass the check: it is refused (401, the page's own for the page) before h11
    parses it. One that holds it is parsed and checked as before."""
    parsed: list[bytes] = []
    receive = h11.Connection.receive_data

    def counting(self: h11.Connection, data: bytes) -> None:
        parsed.append(data)
        receive(self, data)

    monkeypatch.setattr(h11.Connection, "receive_data", counting)
    async with gateway() as (_, url, _launcher):
        big = [f"x-f{i}: " + "a " * 100 for i in range(90)]
        response = await _exchange(url, _head(url, "/v1/sessions?token=wrong", *big))
        assert _status(response) == 401 and parsed == []
        response = await _exchange(url, _head(url, "/", *big))
        assert _status(response) == 401 and b"Token needed" in response and parsed == []
        response = await _exchange(url, _head(url, "/v1/sessions?token=secret-token", *big))
        assert _status(response) == 200 and parsed


async def test_a_head_of_too_many_lines_is_refused_before_it_is_parsed() -> None:
    """h11 parses a head whole before its token can be checked: a head of more lines than
    ``max_head_fields`` is refused (431) as its bytes come, however they are split into reads;
    one at the limit is served, and a body's lines are not the head's."""
    limit = GatewayLimits().max_head_fields
    auth = "authorization: Bearer secret-token"
    async with gateway() as (_, url, _launcher):
        # host, connection and authorization are three of the fields
        at_limit = _head(url, "/v1/sessions", auth, *(f"x-f{i}: v" for i in range(limit - 3)))
        assert _status(await _exchange(url, at_limit)) == 200
        over = _head(url, "/v1/sessions", auth, *(f"x-f{i}: v" for i in range(limit - 2)))
        assert _status(await _exchange(url, over)) == 431
        pieces = [over[i : i + 7] for i in range(0, len(over), 7)]  # every CRLF split somewhere
        assert _status(await _exchange(url, *pieces)) == 431
        unauthenticated = _head(url, "/v1/sessions", *(f"x-f{i}: v" for i in range(5 * limit)))
        assert _status(await _exchange(url, unauthenticated)) == 431
        body = b"\n" * (5 * limit)
        post = _head(
            url, "/v1/sessions/nope/abort", auth, f"content-length: {len(body)}", method="POST"
        )
        assert _status(await _exchange(url, post + body)) == 404  # its body's lines: not the head's


async def test_before_the_token_a_target_is_split_not_parsed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The target is split at its ``?`` and the query searched for ``token=`` (the first one
    counts, as ``parse_qs`` has it); an absolute URL is taken, and one ``urlsplit`` refuses is a
    400 (a 401 without the token), never a failed connection in the log."""
    async with gateway() as (_, url, _launcher):
        port = url.split("/?")[0].rsplit(":", 1)[1]
        for target, status in (
            ("/v1/sessions?token=secret-token", 200),
            ("/v1/sessions?a=1&b=%20&token=secret-token&c", 200),
            ("/v1/sessions?token=secret-token&token=wrong", 200),
            ("/v1/sessions?token=wrong&token=secret-token", 401),
            ("/v1/sessions?xtoken=secret-token", 401),
            ("/v1/sessions?xtoken=wrong&token=secret-token", 200),
            ("/v1/sessions?token=" + "%41" * 2000, 401),  # no token is that long: not decoded
            ("/v1/sessions?token=", 401),
            (f"http://127.0.0.1:{port}/v1/sessions?token=secret-token", 200),
            ("//[x/", 401),
            ("//[x/?token=secret-token", 404),
            ("http://[x/", 401),  # no token in the head: refused before it is parsed
            ("http://[x/?token=secret-token", 400),
            ("[x/?token=secret-token", 400),
        ):
            response = await _exchange(url, _head(url, target))
            assert _status(response) == status, (target, response)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


async def test_a_client_without_the_token_cannot_fill_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection that never showed the token and fails in a way nobody foresaw (here the
    target split raises) is told in one line a minute with the count since, not a traceback
    per request; the clients with the token are served meanwhile."""
    from supervisor.gateway import http as gateway_http

    def broken(target: str) -> tuple[str, str] | None:
        raise RuntimeError("a failure nobody foresaw")

    async with gateway() as (_, url, _launcher):
        async with connect(url) as client:
            monkeypatch.setattr(gateway_http, "_split_target", broken)
            for _ in range(20):
                assert await _exchange(url, _head(url, "/v1/sessions")) == b""
            assert await client.sessions() == []  # a WebSocket: no target to split
    told = [r for r in caplog.records if r.name == "supervisor.gateway.server"]
    assert [r.levelname for r in told] == ["WARNING"], [r.getMessage() for r in told]
    assert "never showed the token" in told[0].getMessage() and not told[0].exc_info


async def test_a_keep_alive_left_idle_past_the_request_timeout_is_closed_not_answered_again() -> (
    None
):
    """The deadline for the next request on a keep-alive ends the connection: the request
    served before it is never taken for a new one (it was, and answered again, each timeout)."""
    async with gateway(limits=GatewayLimits(request_timeout_s=0.3)) as (_, url, _launcher):
        host, port = url.split("/?")[0].removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        request = f"GET /v1/sessions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        await stream.send_all((request + "authorization: Bearer secret-token\r\n\r\n").encode())
        data = b""
        with trio.fail_after(BOUND):
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += await stream.receive_some(65536)
            assert _status(data) == 200 and len(body) == length
            rest = b""
            while chunk := await stream.receive_some(65536):
                rest += chunk
        assert rest == b"", rest
        await stream.aclose()


async def test_a_clients_second_subscription_to_one_session_is_refused_not_taken_over() -> None:
    """The gateway keeps one subscription per session per connection: a second one on the
    same client would take the first's events and end it on leaving; it is refused, and the
    first goes on."""
    async with gateway(AcpBehaviour(words=20, word_interval=0.001)) as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            async with client.subscribe(session_id) as events:
                with pytest.raises(GatewayError) as refused:
                    async with client.subscribe(session_id):
                        pass
                assert refused.value.code == "bad_request"
                await client.prompt(session_id, "hello")
                ended = await next_event(events, "turn.ended")
                assert ended["data"]["outcome"] == "completed"
            async with client.subscribe(session_id, since_seq=0) as again:  # once it is over
                assert (await next_event(again, "turn.ended"))["data"]["outcome"] == "completed"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"reason": 5}', "'reason' must be a string"),
        (b'{"task_id": ["t1"]}', "'task_id' must be a string"),
        (b"[1, 2]", "body must be a JSON object"),
    ],
)
async def test_http_abort_refuses_a_body_it_cannot_take(body: bytes, why: str) -> None:
    async with gateway(AcpBehaviour(words=400, word_interval=0.01)) as (_, url, _l):
        async with connect(url) as client:
            session_id = await start_and_subscribe(client)
            await client.prompt(session_id, "hello")
            path = f"/v1/sessions/{session_id}/abort?token=secret-token"
            status, answer = await http(url, "POST", path, body=body)
            assert status == 400 and isinstance(answer, dict), answer
            assert answer["error"] == {"code": "bad_request", "message": why}
            assert (await client.sessions())[0]["turn_id"] is not None  # nothing was cancelled


async def test_a_request_framed_both_by_chunks_and_by_length_is_refused_and_closed() -> None:
    """RFC 9112 6.1: a request with both Transfer-Encoding and Content-Length may be a smuggling
    attempt (a proxy in front framed it by the other one): it is refused and its connection
    closed, so what follows it is never served as a request of its own."""
    async with gateway() as (_, url, _launcher):
        auth = "authorization: Bearer secret-token"
        smuggled = _head(url, "/v1/agents", auth).replace(b"connection: close\r\n", b"")
        post = _head(
            url,
            "/v1/sessions/s1/abort",
            auth,
            "content-length: 5",
            "transfer-encoding: chunked",
            method="POST",
        ).replace(b"connection: close\r\n", b"")
        response = await _exchange(url, post + b"0\r\n\r\n" + smuggled)
        assert _status(response) == 400 and response.count(b"HTTP/1.1") == 1, response
        assert b"Transfer-Encoding" in response


class _RawClient:
    """A WebSocket client over a bare socket: it reads only when told, and leaves by closing
    the socket (no closing handshake, which a server that stopped reading would never see)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[object] = []

    @classmethod
    async def connect(cls, url: str) -> _RawClient:
        host, port = url.split("/?")[0].removeprefix("http://").rsplit(":", 1)
        client = cls(await trio.open_tcp_stream(host, int(port)))
        target = "/ws?token=secret-token"
        await client.stream.send_all(client.ws.send(Request(host=f"{host}:{port}", target=target)))
        await client.until(AcceptConnection)
        return client

    async def send(self, *events: Any) -> None:
        await self.stream.send_all(b"".join(self.ws.send(event) for event in events))

    async def until(self, kind: type) -> Any:
        """Read until an event of ``kind`` came; it is taken out of what was read."""
        with trio.fail_after(BOUND):
            while not any(isinstance(event, kind) for event in self.events):
                self.ws.receive_data(await self.stream.receive_some(65536))
                self.events.extend(self.ws.events())
        found = next(event for event in self.events if isinstance(event, kind))
        self.events.remove(found)
        return found


async def test_answers_a_client_leaves_unread_are_bounded_in_bytes_not_only_in_count() -> None:
    """An error answer echoes what it refuses (an action name, a session id) up to a frame's
    size: a client that sends such requests and reads nothing stops being read once its
    unread answers reach ``outgoing_bytes``, not after 1024 of them (a gigabyte)."""
    limits = GatewayLimits(outgoing_bytes=256 * 1024, send_buffer_bytes=16 * 1024)
    async with gateway(limits=limits) as (server, url, _launcher):
        silent = await _RawClient.connect(url)
        # One answer read first: its connection is the server's (the handshake's end is the
        # client's before the server has taken it up).
        await silent.send(TextMessage(data=json.dumps({"id": 0, "action": "agents.list"})))
        await silent.until(TextMessage)
        request = json.dumps({"id": 1, "action": "x" * 20_000})

        async def flood() -> None:
            for _ in range(limits.outgoing_buffer + 100):
                await silent.send(TextMessage(data=request))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood)
            (connection,) = server._clients
            with trio.fail_after(BOUND):
                # A bounded poll: nothing marks the reader's parking but its flag, and the
                # connection's timers keep the run from ever being all blocked.
                while not connection._reader_parked:  # it stopped reading requests
                    await trio.sleep(0.01)
            queued = sum(len(frame) for frame, _ in connection._responses)
            assert queued < limits.outgoing_bytes + 2 * len(request), queued
            nursery.cancel_scope.cancel()
        await silent.stream.aclose()


async def test_a_message_in_tiny_fragments_is_kept_in_few_pieces() -> None:
    """A message may come as any number of fragments; each kept apart would be a Python object
    of ~50 bytes beside its 2 bytes (a 16 MiB message, 450 MB). They are joined as they come,
    and the message is read whole."""
    async with gateway() as (server, url, _launcher):
        client = await _RawClient.connect(url)
        request = json.dumps({"id": "f", "action": "agents.list", "payload": {"x": "ab" * 4_000}})
        pieces = [request[i : i + 2] for i in range(0, len(request), 2)]
        fragments = [TextMessage(data=piece, message_finished=False) for piece in pieces]
        await client.send(*fragments, Ping(b"sync"))
        await client.until(Pong)  # answered once every fragment before it was read
        (connection,) = server._clients
        assert len(connection.websocket._parts) < len(pieces) // 4
        await client.send(TextMessage(data="", message_finished=True))
        answer = await client.until(TextMessage)
        assert json.loads(answer.data)["id"] == "f" and json.loads(answer.data)["ok"]
        await client.stream.aclose()


async def test_a_head_over_max_head_bytes_is_refused_however_it_arrives() -> None:
    """h11 bounds a head only while it is incomplete: one that came whole in one read passed
    at up to 64 KiB. A head over ``max_head_bytes`` is refused (431) in one write or many."""
    most = GatewayLimits().max_head_bytes
    async with gateway() as (_, url, _launcher):
        auth = "authorization: Bearer secret-token"
        assert _status(await _exchange(url, _head(url, "/v1/agents", auth, "x: a"))) == 200
        big = _head(url, "/v1/agents", auth, "x: " + "a" * most)
        assert _status(await _exchange(url, big)) == 431
        pieces = [big[i : i + 8192] for i in range(0, len(big), 8192)]
        assert _status(await _exchange(url, *pieces)) == 431


async def test_a_read_of_many_tiny_frames_gives_the_other_tasks_turns() -> None:
    """One 64 KiB read may hold ~9,000 tiny frames (~70 ms of parsing): the reader lets the
    other tasks run every few hundred of them, so another client's cancel does not wait that
    long at each of its hops."""
    from trio.testing import memory_stream_pair

    from supervisor.gateway.websocket import ServerWebSocket

    client_stream, server_stream = memory_stream_pair()
    server = ServerWebSocket(server_stream, max_message_bytes=MAX_FRAME_BYTES)
    client = WSConnection(ConnectionType.CLIENT)
    await server.accept(client.send(Request(host="x", target="/ws")))
    client.receive_data(await client_stream.receive_some())
    assert isinstance(next(client.events()), AcceptConnection)
    frames = 4096
    data = b"".join(
        client.send(TextMessage(data="a", message_finished=False)) for _ in range(frames)
    )
    await client_stream.send_all(data + client.send(TextMessage(data="", message_finished=True)))
    turns = 0
    done = False

    async def other() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()  # (it has started)
        assert await server.get_message() == "a" * frames
        done = True
    assert turns >= frames // 256 - 2, turns


async def test_a_request_that_expects_100_continue_gets_it_before_its_body_is_read() -> None:
    """A client that sends ``Expect: 100-continue`` waits for it before it sends the body
    (curl a second, others longer): it is sent once the head passed its checks."""
    async with gateway() as (_, url, _launcher):
        host, port = url.split("/?")[0].removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        auth = "authorization: Bearer secret-token"
        post = _head(
            url,
            "/v1/sessions/nope/abort",
            auth,
            "expect: 100-continue",
            "content-length: 2",
            method="POST",
        )
        await stream.send_all(post)
        data = b""
        with trio.fail_after(BOUND):
            while b"\r\n\r\n" not in data and (chunk := await stream.receive_some(65536)):
                data += chunk
        assert data.startswith(b"HTTP/1.1 100 "), data
        await stream.send_all(b"{}")
        with trio.fail_after(BOUND):
            while chunk := await stream.receive_some(65536):
                data += chunk
        assert b"HTTP/1.1 404 " in data and b"session_not_found" in data, data
        await stream.aclose()


async def test_a_websocket_upgrade_in_http_1_0_is_refused() -> None:
    """RFC 6455 4.1: the opening handshake is an HTTP/1.1 request (wsproto would take 1.0)."""
    async with gateway() as (_, url, _launcher):
        handshake = (
            "upgrade: websocket",
            "connection: Upgrade",
            "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
            "sec-websocket-version: 13",
        )
        request = _head(url, "/ws?token=secret-token", *handshake)
        response = await _exchange(url, request.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        assert _status(response) == 400 and b"HTTP/1.1" in response.split(b"\r\n\r\n")[1]
