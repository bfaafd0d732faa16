"""A terminal session over the gateway: a fake TUI (``tests/fakes/fake_tui.py``) in a
pseudo-terminal, the real gateway on loopback, the real clock. A subscriber that joins late gets
the screen first (``terminal.screen``), then the events after the event it shows."""

from __future__ import annotations

import base64
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from hosts import env_node

from paths import TESTS
from protocols.terminal import TerminalClient, TerminalSettings
from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayClient, connect
from supervisor.gateway import Gateway
from supervisor.remote import session as remote_session

pytestmark = pytest.mark.real_process

BOUND = 30.0
COLS, ROWS = 100, 30


@asynccontextmanager
async def terminal_gateway(tmp_path: Path) -> AsyncIterator[str]:
    command = [sys.executable, str(TESTS / "fakes" / "fake_tui.py")]
    spec = AgentSpec(
        name="tui",
        protocol="terminal",
        command=command,
        terminal=TerminalSettings(idle_s=0.3, cols=COLS, rows=ROWS),
        grace_s=2.0,
    )
    demo = AgentSpec.from_config("demo").with_args("--delay", "0.01")
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"tui": spec, "demo": demo}) as sup:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(Gateway(sup, port=0, token="secret-token").serve)
                yield url
                nursery.cancel_scope.cancel()


def drawn(frames: list[bytes], cols: int = COLS, rows: int = ROWS) -> str:
    """The screen's text once ``frames`` are drawn on a fresh terminal of that size."""
    view = TerminalClient(TerminalSettings(cols=cols, rows=rows))
    view.start(cwd="/")
    for frame in frames:
        view.receive({"output": frame, "now": 0.0})
    return view.screen_text


async def until(events: trio.MemoryReceiveChannel[dict[str, Any]], kind: str) -> dict[str, Any]:
    async for event in events:
        if event["event"] == kind:
            return event
    raise AssertionError(f"no {kind}")


async def a_turn(client: GatewayClient, session_id: str, text: str) -> None:
    async with client.subscribe(session_id) as events:
        await client.prompt(session_id, text)
        ended = await until(events, "turn.ended")
        assert ended["data"]["outcome"] == "completed", ended


async def test_a_late_subscriber_gets_the_screen_first(tmp_path: Path) -> None:
    async with terminal_gateway(tmp_path) as url, connect(url, token="secret-token") as first:
        session_id = (await first.start_session("tui", cwd=str(tmp_path)))["session_id"]
        await a_turn(first, session_id, "hello")
        async with connect(url, token="secret-token") as late:
            async with late.subscribe(session_id) as events:
                head = late.subscribed[session_id]["last_seq"]
                screen = await events.receive()
        assert screen["event"] == "terminal.screen" and screen["seq"] is None, screen
        data = screen["data"]
        assert (data["cols"], data["rows"], data["last_seq"]) == (COLS, ROWS, head)
        shown = drawn([base64.b64decode(data["data"])])
        assert "answer: hello" in shown and shown.rstrip().endswith(">"), shown

        # With a replay: the picture first, then every event from seq 1, contiguous; the
        # terminal.output events up to last_seq draw the very screen the picture shows.
        async with connect(url, token="secret-token") as again:
            async with again.subscribe(session_id, since_seq=0) as events:
                screen = await events.receive()
                replay = [await events.receive() for _ in range(screen["data"]["last_seq"])]
        assert screen["event"] == "terminal.screen"
        assert [e["seq"] for e in replay] == list(range(1, len(replay) + 1))
        outputs = [
            base64.b64decode(e["data"]["data"]) for e in replay if e["event"] == "terminal.output"
        ]
        assert drawn(outputs) == drawn([base64.b64decode(screen["data"]["data"])])


async def test_other_protocols_get_no_screen(tmp_path: Path) -> None:
    async with terminal_gateway(tmp_path) as url, connect(url, token="secret-token") as client:
        session_id = (await client.start_session("demo", cwd=str(tmp_path)))["session_id"]
        async with client.subscribe(session_id, since_seq=0) as events:
            first = await events.receive()
        assert first["event"] != "terminal.screen" and first["seq"] == 1, first


async def test_the_page_loads_xterm_from_the_gateway_with_its_license(tmp_path: Path) -> None:
    async with terminal_gateway(tmp_path) as url:
        auth = {"authorization": "Bearer secret-token"}
        status, _, page = await http_raw(url, "/", auth)
        assert status == 200
        for path in ("/static/xterm/xterm.js", "/static/xterm/addon-fit.js"):
            assert f'<script src="{path}">' in page
        assert '<link rel="stylesheet" href="/static/xterm/xterm.css">' in page
        for path, kind, needle in (
            ("/static/xterm/xterm.js", "text/javascript", "Terminal"),
            ("/static/xterm/addon-fit.js", "text/javascript", "FitAddon"),
            ("/static/xterm/xterm.css", "text/css", ".xterm"),
            ("/static/xterm/LICENSE", "text/plain", "Permission is hereby granted"),
            ("/static/xterm/LICENSE.addon-fit", "text/plain", "Permission is hereby granted"),
        ):
            status, headers, body = await http_raw(url, path, auth)
            assert status == 200, f"{path}: {status} (make install puts xterm.js there)"
            assert headers["content-type"].startswith(kind), (path, headers)
            assert headers["x-content-type-options"] == "nosniff"
            assert needle in body, path
        # The page's cookie (a script element sends no token) opens them, and no API.
        assert (await http_raw(url, "/static/xterm/xterm.js", {}))[0] == 401
        _, headers, _ = await http_raw(url, "/", auth)
        cookie = {"cookie": headers["set-cookie"].split(";")[0]}
        assert (await http_raw(url, "/static/xterm/xterm.css", cookie))[0] == 200
        assert (await http_raw(url, "/v1/sessions", cookie))[0] == 401
        assert (await http_raw(url, "/static/xterm/other.js", auth))[0] == 404


async def http_raw(url: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], str]:
    """GET ``path``: the status, the headers (lower-cased names) and the body as text."""
    base = url.split("/?")[0]
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    lines = [f"GET {path} HTTP/1.1", f"host: {host}:{port}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    parsed = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
    return int(status_line.split()[1]), parsed, body.decode("utf-8", "replace")


async def test_a_late_subscriber_through_the_front_gets_the_node_s_screen_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A terminal session on another host (a node over the ``env`` transport): the front
    draws the output since the node's picture on it for a subscriber that joins late, and
    asks the node for a new picture once that output passes its bound."""
    hosts = {"here": env_node(tmp_path / "node")}
    spec = AgentSpec(
        name="tui",
        protocol="terminal",
        command=[sys.executable, str(TESTS / "fakes" / "fake_tui.py")],
        terminal=TerminalSettings(idle_s=0.3, cols=COLS, rows=ROWS),
        hosts=("here",),
    )
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"tui": spec}, hosts=hosts) as sup:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(Gateway(sup, port=0, token="secret-token").serve)
                async with connect(url, token="secret-token") as first:
                    started = await first.start_session("tui", cwd=str(tmp_path))
                    session_id = started["session_id"]
                    assert started["host"] == "here"
                    await a_turn(first, session_id, "hello")
                    shown = await late_screen(url, session_id, COLS, ROWS)
                    assert "answer: hello" in shown and shown.rstrip().endswith(">"), shown

                    monkeypatch.setattr(remote_session, "SCREEN_OUTPUT_BYTES", 16)
                    await first.resize(session_id, 60, 20)  # (the picture follows the size)
                    await a_turn(first, session_id, "again")  # past the bound: a new picture
                    shown = await late_screen(url, session_id, 60, 20)
                    assert "answer: again" in shown and "resized 60x20" in shown, shown
                    await first.stop(session_id)
                nursery.cancel_scope.cancel()


async def late_screen(url: str, session_id: str, cols: int, rows: int) -> str:
    """What a subscriber joining now is drawn first: the screen's text."""
    async with connect(url, token="secret-token") as late:
        async with late.subscribe(session_id) as events:
            head = late.subscribed[session_id]["last_seq"]
            screen = await events.receive()
    assert screen["event"] == "terminal.screen", screen
    data = screen["data"]
    assert (data["cols"], data["rows"], data["last_seq"]) == (cols, rows, head)
    return drawn([base64.b64decode(data["data"])], cols, rows)
