"""One store, two processes: a ``serve`` and an ACP front door's supervisor (``store_kind=
"acp"``, as ``agent-supervisor acp`` opens it) on the same state directory. Each lists the
other's sessions, ids never collide, a prompt to a session the other runs is refused naming
it, and once the other is SIGKILLed its sessions are recovered (its turn ended honestly) and
started again here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from served import ROOT, _env, demo_command, serve, write_config
from supervisor.client import GatewayClient, GatewayError, connect

BOUND = 60

#: The front door's supervisor: a session whose turn runs for good, its id printed.
FRONT = """
import sys, trio
from supervisor.config import load_config
from supervisor.supervisor import open_supervisor

async def main():
    settings = load_config(sys.argv[1])
    async with open_supervisor(
        agents=settings.agents, store=sys.argv[2], store_kind="acp"
    ) as supervisor:
        session = await supervisor.start_session("talker")
        await session.prompt("talk for a long time")
        print(session.id, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_serve_and_a_front_door_share_the_store(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {"talker": {"command": demo_command(tmp_path, "--words", "100000", "--delay", "0.01")}},
    )
    with trio.fail_after(BOUND):
        async with serve(tmp_path, "--config", str(config)) as served:
            url = f"sqlite:///{served.state_dir / 'sessions.db'}"
            front = await trio.lowlevel.open_process(
                [sys.executable, "-c", FRONT, str(config), url],
                stdout=subprocess.PIPE,
                env=_env(tmp_path, None),
                cwd=ROOT,
            )
            try:
                assert front.stdout is not None
                line = b""
                while not line.endswith(b"\n"):
                    data = await front.stdout.receive_some(100)
                    assert data, "the front door's supervisor exited"
                    line += data
                theirs = line.decode().strip()
                async with connect(served.url) as client:
                    ours = (await client.start_session("talker"))["session_id"]
                    assert ours != theirs
                    listed = {s["session_id"]: s for s in await client.sessions()}
                    assert f"acp pid {front.pid}" in listed[theirs]["elsewhere"]
                    assert "elsewhere" not in listed[ours]
                    with pytest.raises(GatewayError, match=f"acp pid {front.pid}"):
                        await client.prompt(theirs, "mine now?")
                    front.kill()
                    await front.wait()
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
                if front.returncode is None:
                    front.kill()
                    await front.wait()


async def until_ended(client: GatewayClient, session_id: str, turns: int) -> list[dict[str, Any]]:
    """The session's events from seq 1 up to its ``turns``-th ``turn.ended``."""
    got: list[dict[str, Any]] = []
    async with client.subscribe(session_id, since_seq=0) as events:
        async for event in events:
            got.append(event)
            if sum(e["event"] == "turn.ended" for e in got) == turns:
                return got
    raise AssertionError(f"the subscription ended first: {got[-3:]}")
