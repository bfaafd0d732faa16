"""``GET /metrics`` over real loopback sockets, with in-memory agents, on the real clock.

A WebSocket client drives turns to every outcome (completed, cancelled, killed, failed, a
queued prompt dropped, a stall) and keeps every ``turn.ended`` it gets; ``/metrics`` scraped
with the gateway's token as ``Authorization: Bearer`` and parsed as Prometheus does must count
exactly what the client saw. The route takes the token as every route does, and says so when
the supervisor keeps no metrics. A real ``serve`` keeps metrics, and exports traces when the
``OTEL_*`` variables ask.
"""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from served import serve
from supervisor import AgentSpec, open_supervisor
from supervisor.client import connect
from supervisor.gateway import Gateway
from supervisor.observe import Metrics
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 60.0
TOKEN = "secret-token"
#: a grace and a watchdog short enough for the real clock
GRACE_S = 0.3
STALL_S = 0.5


@asynccontextmanager
async def gateway(metrics: Metrics | None) -> AsyncIterator[str]:
    launcher = AcpLauncher(AcpBehaviour(words=400, word_interval=0.01))
    spec = AgentSpec(
        name="fake", protocol="acp", command=["fake"], grace_s=GRACE_S, stall_s=STALL_S
    )
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"fake": spec}, launcher=launcher, metrics=metrics
        ) as sup:
            async with trio.open_nursery() as nursery:
                server = Gateway(sup, port=0, token=TOKEN)
                yield await nursery.start(server.serve)
                nursery.cancel_scope.cancel()


async def get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(status, content type, body) of one GET (HTTP/1.1, connection: close)."""
    host, port = url.split("/?")[0].removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    lines = [f"GET {path} HTTP/1.1", f"host: {host}:{port}", "connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(
        line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line
    )
    return int(head.split()[1]), fields.get("content-type", ""), body.decode()


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_exactly_the_turns_and_receipts_the_client_received() -> None:
    async with gateway(Metrics()) as url, connect(url) as client:
        session_id = (await client.start_session("fake"))["session_id"]
        ended: list[dict[str, Any]] = []
        async with client.subscribe(session_id) as events:

            async def until_ended(count: int) -> None:
                async for event in events:
                    if event["event"] == "turn.ended":
                        ended.append(event["data"])
                        if len(ended) == count:
                            return

            async def wait_for_words() -> None:
                async for event in events:
                    if event["event"] == "turn.ended":
                        ended.append(event["data"])
                    if event["event"] == "message.delta":
                        return

            await client.prompt(session_id, "words=2")  # completed
            await until_ended(1)
            for prompt in ("words=400", "words=400 ignore-cancel"):  # cancelled, then killed
                await client.prompt(session_id, prompt)
                await wait_for_words()
                await client.cancel(session_id)
            await client.prompt(session_id, "words=1 fail-turn")  # failed
            await until_ended(4)
            await client.prompt(session_id, "words=400")  # cancelled, the next one dropped
            await client.prompt(session_id, "words=2")
            await wait_for_words()
            await client.cancel(session_id)
            await client.prompt(session_id, "words=5 silent-after=1")  # stalled: cancelled
            await until_ended(7)
        status, content_type, text = await get(
            url, "/metrics", {"authorization": f"Bearer {TOKEN}"}
        )
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    samples = parse(text)
    outcomes = Counter(turn["outcome"] for turn in ended)
    assert outcomes == {"completed": 1, "cancelled": 4, "killed": 1, "failed": 1}
    assert {
        dict(labels)["outcome"]: value
        for (name, labels), value in samples.items()
        if name == "agent_supervisor_turns_total" and value
    } == outcomes
    receipts = [t["receipt"] for t in ended if t["receipt"] and t["stop_reason"] != "dropped"]
    cancels = Counter(receipt["outcome"] for receipt in receipts)
    assert cancels == {"cancelled": 3, "killed": 1}  # the stalled turn's too
    assert {
        dict(labels)["outcome"]: value
        for (name, labels), value in samples.items()
        if name == "agent_supervisor_cancel_seconds_count"
    } == cancels
    steps = Counter(step for receipt in receipts for step in receipt["escalation"])
    assert {
        dict(labels)["step"]: value
        for (name, labels), value in samples.items()
        if name == "agent_supervisor_escalations_total"
    } == steps
    acp = frozenset({("protocol", "acp")})
    assert samples["agent_supervisor_stalls_total", acp] == 1
    # ACP's interrupt is a notification: its delivery is never known, so never observed
    assert samples["agent_supervisor_interrupt_delivery_seconds_count", acp] == 0
    assert samples["agent_supervisor_sessions", frozenset({("state", "ready")})] == 1


async def test_the_route_takes_the_token_and_says_when_metrics_are_off() -> None:
    async with gateway(Metrics()) as url:
        assert (await get(url, "/metrics"))[0] == 401
        assert (await get(url, "/metrics", {"authorization": "Bearer wrong"}))[0] == 401
        status, _, text = await get(url, f"/metrics?token={TOKEN}")
        assert status == 200 and "agent_supervisor_sessions" in text
    async with gateway(None) as url:
        status, _, body = await get(url, "/metrics", {"authorization": f"Bearer {TOKEN}"})
        assert status == 404 and "keeps no metrics" in body


async def test_serve_keeps_metrics_and_exports_the_traces_otel_variables_ask_for(
    tmp_path: Path,
) -> None:
    """A real ``serve`` and its demo agent: ``/metrics`` with the token it printed; with
    ``OTEL_TRACES_EXPORTER=console`` the spans (the session's, ended by the shutdown) are
    written on its stdout before it exits."""
    async with serve(tmp_path, env={"OTEL_TRACES_EXPORTER": "console"}) as served:
        async with connect(served.url) as client:
            session_id = (await client.start_session("demo", str(tmp_path)))["session_id"]
            async with client.subscribe(session_id) as events:
                await client.prompt(session_id, "hello")
                async for event in events:
                    if event["event"] == "turn.ended":
                        break
        status, _, text = await get(
            served.url, "/metrics", {"authorization": f"Bearer {served.token}"}
        )
        assert status == 200
        demo = frozenset({("protocol", "acp"), ("outcome", "completed")})
        assert parse(text)["agent_supervisor_turns_total", demo] == 1
        served.signal(signal.SIGTERM)
        assert await served.wait_exit() == 0
        assert served.process.stdout is not None
        output = b""
        while chunk := await served.process.stdout.receive_some(65536):
            output += chunk
    names = [json.loads(span)["name"] for span in re.findall(rb"^\{\n.*?^\}$", output, re.M | re.S)]
    assert "turn" in names and "session" in names
