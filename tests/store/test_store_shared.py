"""One store, several processes: ``serve`` and ACP front doors (``agent-supervisor acp``) on
one state directory, and two supervisors in one process on each backend. Each lists the
others' sessions and finds them by id, ids never collide, a session another live process runs
is refused naming it and kept from retention, and one whose process stopped it or was
SIGKILLed is taken up (recovered first: its turn ended honestly) with its history."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from itertools import count
from pathlib import Path
from typing import Any

import pytest
import trio

from served import ROOT, _env, demo_command, serve, write_config
from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayClient, GatewayError, connect
from supervisor.clients.sessions import run_sessions
from supervisor.errors import AgentNotRunning, SessionNotFound
from supervisor.store.dormant import DormantSession
from supervisor.store.retention import Retention
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 60

ACP_FRONT = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]


class Front:
    """``agent-supervisor acp`` as an editor runs it: JSON lines on its stdin and stdout."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buffer = b""
        self.ids = count()

    @classmethod
    async def start(cls, tmp_path: Path, state_dir: Path, *args: str) -> Front:
        process = await trio.lowlevel.open_process(
            [*ACP_FRONT, "acp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_env(tmp_path, {"AGENT_SUPERVISOR_STATE_DIR": str(state_dir)}),
            cwd=ROOT,
        )
        front = cls(process)
        await front.call("initialize", {"protocolVersion": 1})
        return front

    async def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.process.stdin is not None
        rid = next(self.ids)
        line = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        await self.process.stdin.send_all((json.dumps(line) + "\n").encode())
        return rid

    async def until(self, predicate: Any) -> list[dict[str, Any]]:
        """What it says up to and with the first message ``predicate`` takes."""
        assert self.process.stdout is not None
        said = []
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                said.append(json.loads(line))
                if predicate(said[-1]):
                    return said
            data = await self.process.stdout.receive_some(65536)
            assert data, "the front door closed its stdout"
            self.buffer += data

    async def call(self, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """What it says up to its answer (the last), which must not be an error."""
        rid = await self.send(method, params)
        said = await self.until(lambda m: m.get("id") == rid)
        assert "result" in said[-1], said[-1]
        return said

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def text(words: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": words}]


async def test_serve_and_a_front_door_share_the_store(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {"talker": {"command": demo_command(tmp_path, "--words", "100000", "--delay", "0.01")}},
    )
    with trio.fail_after(BOUND):
        async with serve(tmp_path, "--config", str(config)) as served:
            front = await Front.start(
                tmp_path, served.state_dir, "--config", str(config), "--agent", "talker"
            )
            try:
                opened = await front.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
                theirs = opened[-1]["result"]["sessionId"]
                await front.send(
                    "session/prompt", {"sessionId": theirs, "prompt": text("talk for long")}
                )
                await front.until(lambda m: "agent_message_chunk" in json.dumps(m))
                pid = front.process.pid
                async with connect(served.url) as client:
                    # Found by its id, never listed here: it runs in the front door, whose
                    # turn it is to stop or to prompt.
                    with pytest.raises(GatewayError, match=f"acp pid {pid}"):
                        await client.cancel(theirs)
                    with pytest.raises(GatewayError, match=f"acp pid {pid}"):
                        await client.prompt(theirs, "mine now?")
                    ours = (await client.start_session("talker"))["session_id"]
                    assert ours != theirs
                    listed = {s["session_id"]: s for s in await client.sessions()}
                    assert f"acp pid {pid}" in listed[theirs]["elsewhere"]
                    assert "elsewhere" not in listed[ours]
                    await front.kill()
                    listed = {s["session_id"]: s for s in await client.sessions()}
                    assert "elsewhere" not in listed[theirs]
                    # Gone: its session is taken up here, its turn ended honestly first.
                    await client.prompt(theirs, "go on here")
                    await client.cancel(theirs)
                    history = await until_ended(client, theirs, 2)
                    ended = [e for e in history if e["event"] == "turn.ended"]
                    kinds = [e["event"] for e in history]
                    assert kinds.index("stream.gap") < kinds.index("turn.ended")
                    assert ended[0]["data"]["turn_id"] == "t1"
                    assert ended[1]["data"]["turn_id"] not in ("t1", None)
                    assert ended[0]["data"]["stop_reason"] == "supervisor_gone"
                    assert ended[1]["data"]["outcome"] == "cancelled"
                    third = (await client.start_session("talker"))["session_id"]
                    assert third not in (ours, theirs)
            finally:
                await front.kill()


async def test_two_front_doors_share_the_store(tmp_path: Path) -> None:
    """Two editors' front doors on one state directory: each lists the other's session; once
    the first is SIGKILLed, the second loads its session with its history and goes on."""
    state_dir = tmp_path / "state"
    new = {"cwd": str(tmp_path), "mcpServers": []}
    with trio.fail_after(BOUND):
        first = await Front.start(tmp_path, state_dir)
        second = await Front.start(tmp_path, state_dir)
        try:
            theirs = (await first.call("session/new", new))[-1]["result"]["sessionId"]
            said = await first.call(
                "session/prompt", {"sessionId": theirs, "prompt": text("remember banana fast")}
            )
            assert said[-1]["result"]["stopReason"] == "end_turn"
            ours = (await second.call("session/new", new))[-1]["result"]["sessionId"]
            assert ours != theirs
            listed = (await second.call("session/list", {}))[-1]["result"]["sessions"]
            assert {s["sessionId"] for s in listed} == {theirs, ours}
            await first.kill()
            # `agent-supervisor sessions` reads beside them: whose each session is.
            url = f"sqlite:///{state_dir / 'sessions.db'}"
            shown = [await trio.to_thread.run_sync(shown_state, url, i) for i in (theirs, ours)]
            assert shown[0].endswith(
                f"when acp pid {first.process.pid} on {socket.gethostname()} went away"
            )
            assert shown[1].endswith(f"in acp pid {second.process.pid} on {socket.gethostname()}")
            replayed = await second.call("session/load", {"sessionId": theirs, **new})
            chunks = [m["params"]["update"] for m in replayed if m.get("method")]
            assert chunks[0]["sessionUpdate"] == "user_message_chunk"
            assert chunks[0]["content"]["text"] == "remember banana fast"
            assert chunks[1]["sessionUpdate"] == "agent_message_chunk"
            said = await second.call(
                "session/prompt", {"sessionId": theirs, "prompt": text("go on fast")}
            )
            assert said[-1]["result"]["stopReason"] == "end_turn"
        finally:
            await first.kill()
            await second.kill()


def shown_state(url: str, session_id: str) -> str:
    """The state ``agent-supervisor sessions show`` gives ``session_id``."""
    out = io.StringIO()
    run_sessions("show", url, session_id, out, io.BytesIO())
    return out.getvalue().splitlines()[1].rsplit(", ", 1)[0]


async def until_ended(client: GatewayClient, session_id: str, turns: int) -> list[dict[str, Any]]:
    """The session's events from seq 1 up to its ``turns``-th ``turn.ended``."""
    got: list[dict[str, Any]] = []
    async with client.subscribe(session_id, since_seq=0) as events:
        async for event in events:
            got.append(event)
            if sum(e["event"] == "turn.ended" for e in got) == turns:
                return got
    raise AssertionError(f"the subscription ended first: {got[-3:]}")


# -- two supervisors in one process, on each backend: owners, claim, ids, retention


SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


async def one_turn(session: Any, text: str, turns: int = 1) -> list[Any]:
    """``text`` prompted to the live ``session``; its events from seq 1 up to its ``turns``-th
    ``turn.ended``."""
    async with session.subscribe(since_seq=0) as events:
        await session.prompt(text)
        got = []
        async for event in events:
            got.append(event)
            if sum(e.kind == "turn.ended" for e in got) == turns:
                return got
    raise AssertionError("the subscription ended first")


async def test_two_processes_take_a_stopped_session_from_each_other(store_url: str) -> None:
    """A session is its process's while it runs there: the other finds it by id (no list
    first), names that process, and neither starts it again nor lets retention delete it;
    once stopped it is handed back, and the other takes it up while the first lives."""
    launcher = AcpLauncher(AcpBehaviour(words=3))
    agents = {"fake": SPEC}
    with trio.fail_after(BOUND):
        async with (
            open_supervisor(
                agents=agents, launcher=launcher, store=store_url, store_kind="acp"
            ) as first,
            open_supervisor(
                agents=agents, launcher=launcher, store=store_url, store_kind="acp"
            ) as second,
        ):
            theirs = await first.start_session("fake")
            await one_turn(theirs, "hello")
            ours = await second.start_session("fake")
            assert ours.id != theirs.id
            await first.store.flushed()  # type: ignore[union-attr]
            found = await second.find(theirs.id)  # (never listed in ``second``)
            assert isinstance(found, DormantSession)
            assert f"acp pid {os.getpid()}" in (found.summary().elsewhere or "")
            with pytest.raises(AgentNotRunning, match=f"acp pid {os.getpid()}"):
                await found.prompt("mine now?")
            assert await second.sweep_store(Retention(keep_sessions=0)) == []
            with pytest.raises(SessionNotFound):
                await second.find("s999")

            async with theirs.subscribe() as events:
                await first.stop_session(theirs.id)
                async for _ in events:  # (to its end: its last events are in the store)
                    pass
            await first.store.flushed()  # type: ignore[union-attr]
            revived = await (await second.find(theirs.id)).revive()
            events = await one_turn(revived, "go on here", turns=2)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            back = await first.reopen(theirs.id)  # (``first`` lives: it is refused there now)
            with pytest.raises(AgentNotRunning, match="runs in another process"):
                await back.prompt("and back?")
            third = await first.start_session("fake")
            assert third.id not in (theirs.id, ours.id)
