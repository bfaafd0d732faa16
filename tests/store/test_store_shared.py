"""One store, two processes: a ``serve`` and an ACP front door's supervisor (``store_kind=
"acp"``, as ``agent-supervisor acp`` opens it) on the same state directory. Each lists the
other's sessions, ids never collide, a prompt to a session the other runs is refused naming
it, and once the other is SIGKILLed its sessions are recovered (its turn ended honestly) and
started again here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from served import ROOT, _env, demo_command, serve, write_config
from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayClient, GatewayError, connect
from supervisor.errors import AgentNotRunning, SessionNotFound
from supervisor.store.dormant import DormantSession
from supervisor.store.retention import Retention
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

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
