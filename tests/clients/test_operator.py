"""``agent-supervisor pause`` and ``resume``: an operator's actions on a running gateway.

The command's work (``run_operator``) against an in-process gateway with in-memory agents, and
the real command line against a real ``serve``: what it prints, its exit codes, and its errors
(no token, a wrong one, nothing listening).
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from served import ROOT, serve
from supervisor import AgentSpec, open_supervisor
from supervisor.client import connect
from supervisor.clients.operator import OperatorError, run_operator, token_for
from supervisor.gateway import Gateway
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 30.0
TOKEN = "operator-token"


@asynccontextmanager
async def gateway() -> AsyncIterator[str]:
    launcher = AcpLauncher(AcpBehaviour(words=100_000, word_interval=0.01))
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(Gateway(sup, port=0, token=TOKEN).serve)
                yield url
                nursery.cancel_scope.cancel()


async def test_pause_and_resume_say_what_they_did() -> None:
    async with gateway() as url, connect(url) as client:
        running = (await client.start_session("fake"))["session_id"]
        idle = (await client.start_session("fake"))["session_id"]
        await client.prompt(running, "long")
        out = io.StringIO()
        await run_operator("pause", url, TOKEN, out, deadline_s=30)
        assert out.getvalue() == (
            f"paused: no new turn starts (2 sessions ({running}, {idle}) hold their prompts)\n"
            f"still running: {running}: cancelled (reason paused) in 30 s if still running\n"
        )
        assert (await client.prompt(idle, "later"))["held"] == "paused"
        out = io.StringIO()
        await run_operator("resume", url, TOKEN, out, as_json=True)
        answer = json.loads(out.getvalue())
        assert answer["paused"] is False and answer["held"] == []
        assert sorted(answer["running"]) == sorted([running, idle])  # "later" started
        sessions = await client.request("session.list")
        assert sessions["paused"] is False


async def test_no_gateway_or_a_wrong_token_is_one_clear_error() -> None:
    async with gateway() as url:
        with pytest.raises(OperatorError, match=r"refused the token \(HTTP 401\)"):
            await run_operator("pause", url, "wrong", io.StringIO())
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OperatorError, match=f"cannot connect to 127.0.0.1:{port}"):
        await run_operator("resume", f"http://127.0.0.1:{port}/", TOKEN, io.StringIO())


def test_the_token_comes_from_the_file_the_url_or_the_environment() -> None:
    url = "http://127.0.0.1:8765/?token=from-url"
    env = {"AGENT_SUPERVISOR_TOKEN": "from-env"}
    assert token_for(url, "from-file", env) == "from-file"
    assert token_for(url, None, env) == "from-url"
    assert token_for("http://127.0.0.1:8765/", None, env) == "from-env"
    with pytest.raises(OperatorError, match=r"no token for 127.0.0.1:8765: give --url"):
        token_for("http://127.0.0.1:8765/", None, {})


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SUPERVISOR_")}
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=BOUND,
        check=False,
    )


@pytest.mark.real_process
async def test_the_command_line_pauses_and_resumes_a_running_serve(tmp_path: Path) -> None:
    async with serve(tmp_path) as served, connect(served.url) as client:
        session_id = (await client.start_session("demo"))["session_id"]
        paused = await trio.to_thread.run_sync(cli, "pause", "--url", served.url)
        assert (paused.returncode, paused.stderr) == (0, "")
        assert paused.stdout.startswith(f"paused: no new turn starts (1 session ({session_id})")
        answer = await client.prompt(session_id, "hello words=3 fast")
        assert answer == {"turn_id": "t1", "queued": True, "held": "paused"}
        assert (await client.request("session.list"))["paused"] is True
        wrong = served.url.replace(served.token, "wrong")
        refused = await trio.to_thread.run_sync(cli, "resume", "--url", wrong)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.endswith("refused the token (HTTP 401)\n"), refused.stderr
        resumed = await trio.to_thread.run_sync(cli, "resume", "--url", served.url, "--json")
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["paused"] is False
        assert (await client.request("session.list"))["paused"] is False
    bare = await trio.to_thread.run_sync(cli, "pause", "--url", f"http://127.0.0.1:{served.port}/")
    assert bare.returncode == 2 and "no token" in bare.stderr
    bad = await trio.to_thread.run_sync(cli, "pause", "--deadline", "-3")
    assert bad.returncode == 2 and "--deadline takes seconds" in bad.stderr
