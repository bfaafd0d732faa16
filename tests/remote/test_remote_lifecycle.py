"""Node sessions across the front's restarts and the host's upgrades, without SSH.

The "host" is this machine through the ``env`` transport, or through no transport at all (the
local node of ``serve --local-node``): the same bridge, node daemon and WebSocket as over
SSH. Real processes and the real clock, generous bounds; waits are on events or process exits.
A node started here is stopped at the end of its test (its pid is in its hello file).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from protocols import events as ev
from served import read_deltas
from supervisor import open_supervisor
from supervisor.config import AgentSpec, builtin_agents
from supervisor.remote import HostSpec, RemoteSession
from supervisor.remote.version import TEST_VERSION_VARIABLE, package_version
from supervisor.testing import record

pytestmark = pytest.mark.real_process

BOUND = 60.0


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Path]:
    """Where this test's nodes keep their files; every node still running there is stopped
    after the test (SIGTERM: it stops its sessions, whole trees)."""
    yield tmp_path
    left = [psutil.Process(pid) for pid in _node_pids(tmp_path) if psutil.pid_exists(pid)]
    for process in left:
        process.terminate()
    _, alive = psutil.wait_procs(left, timeout=20)
    for process in alive:
        process.kill()


def _node_pids(root: Path) -> set[int]:
    pids = set()
    for hello in root.rglob("node/*.json"):
        try:
            pid = json.loads(hello.read_bytes()).get("pid")
        except (OSError, ValueError):
            continue
        if isinstance(pid, int):
            pids.add(pid)
    return pids


def env_host(tmp_path: Path, *env: str, detach_s: float = 30.0) -> HostSpec:
    """This machine as host ``h``, through ``env`` (with ``env``'s assignments, if any)."""
    return HostSpec(
        name="h",
        transport=["env", *env],
        command=[sys.executable, "-m", "supervisor"],
        detach_s=detach_s,
        state_dir=str(tmp_path / "host"),
    )


def demo(tmp_path: Path, *args: str) -> AgentSpec:
    spec = builtin_agents()["demo"].with_args("--state-dir", str(tmp_path / "demo"), *args)
    # A generous grace: the demo agent stops at once, and its cancel is to read `cancelled` on
    # a busy machine too (with 1 s, a slow run of the suite once killed it, twice).
    return spec.with_options(hosts=("h",), grace_s=5.0, kill_timeout_s=0.5)


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


async def test_a_front_that_keeps_its_node_sessions_hands_them_to_the_next(
    nodes: Path,
) -> None:
    """``keep_node_sessions=True``: leaving the block leaves the session running in its node
    (its turn goes on); the next supervisor with that ``state_dir``, in this same process,
    adopts it under the same id, and a subscriber from the last seq it saw sees every event
    once; the turn then cancels with the node's receipt."""
    hosts = {"h": env_host(nodes)}
    spec = demo(nodes)
    state = nodes / "front"
    seen: list[ev.Event] = []
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"demo": spec}, hosts=hosts, state_dir=state, keep_node_sessions=True
        ) as sup:
            session = await sup.start_session("demo")
            assert isinstance(session, RemoteSession)
            async with session.subscribe(since_seq=0) as events:
                turn = await session.prompt("long words=3000")
                async for event in events:
                    seen.append(event)
                    if len([e for e in seen if is_delta(e)]) == 10:
                        break
            sid, node = session.id, session.link.node_pid
            lingering = await session.open_subscription()
    # A subscriber of the front that is gone sees its stream end...
    with trio.fail_after(5):
        async for _ in lingering:
            pass
    # ... while the session and its agent live on in the node.
    assert node is not None and psutil.pid_exists(node)
    assert psutil.Process(node).children(recursive=True)
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}, hosts=hosts, state_dir=state) as sup:
            [listed] = sup.list()
            assert (listed.session_id, listed.host) == (sid, "h")
            again = sup.get(sid)
            async with again.subscribe(since_seq=seen[-1].seq) as events:
                deltas = 0
                async for event in events:
                    seen.append(event)
                    deltas += is_delta(event)
                    if deltas == 20:
                        break
                receipt = await again.cancel()
                assert (receipt.outcome, receipt.turn_id, receipt.host) == (
                    "cancelled",
                    turn.id,
                    "h",
                ), receipt
                async for event in events:
                    seen.append(event)
                    if isinstance(event, ev.TurnEnded):
                        break
            assert again.link.node_pid == node  # the same node, the same agent
    seqs = [e.seq for e in seen]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # every event, once
    assert [e.turn_id for e in seen if isinstance(e, ev.TurnEnded)] == [turn.id]
    # Leaving without keep_node_sessions stopped it: the node has nothing left to run.
    _, alive = psutil.wait_procs(psutil.Process(node).children(recursive=True), timeout=10)
    assert alive == []


async def test_an_upgrade_on_the_host_drains_the_old_node(nodes: Path) -> None:
    """The old node (package "0.0.1-old", same wire) runs a session; the package on the host
    is "upgraded" (the next bridge is this version): the next front adopts and drives the old
    session in the old node, its new session goes to a new node of the new version started
    beside it, and the old node exits once its last session ends."""
    old_host = {"h": env_host(nodes, f"{TEST_VERSION_VARIABLE}=0.0.1-old")}
    new_host = {"h": env_host(nodes)}
    spec = demo(nodes)
    state = nodes / "front"
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"demo": spec}, hosts=old_host, state_dir=state, keep_node_sessions=True
        ) as sup:
            old = await sup.start_session("demo")
            assert isinstance(old, RemoteSession)
            conn = await old.link.connection()
            assert conn.hello.version == "0.0.1-old"
            turn = await old.prompt("long words=3000")
            old_id, old_node = old.id, conn.hello.pid
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}, hosts=new_host, state_dir=state) as sup:
            adopted = sup.get(old_id)
            assert isinstance(adopted, RemoteSession)
            async with record(adopted) as recorder:
                # the old session, driven in the old node: its turn went on, it cancels
                await recorder.wait_for(is_delta, count=5)
                receipt = await adopted.cancel()
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                assert adopted.link.node_pid == old_node
                # a new session: on a new node, of this version
                new = await sup.start_session("demo")
                assert isinstance(new, RemoteSession) and new.id != old_id
                new_conn = await new.link.connection()
                assert new_conn.hello.version == package_version()
                assert new_conn.hello.pid != old_node
                done = await new.prompt("and here words=3")
                assert done.id
                # the old node drains: its last session stopped, it exits
                assert psutil.pid_exists(old_node)
                await sup.stop_session(old_id)
                _, alive = psutil.wait_procs([psutil.Process(old_node)], timeout=20)
                assert alive == [], "the retired node did not exit after its last session"
                # the new one goes on
                steer = await new.steer("more words=3")
                assert steer.turn_id
                recorder.check_invariants()
            assert psutil.pid_exists(new_conn.hello.pid)


# -- serve --local-node ---------------------------------------------------------------------


async def start_serve(state: Path, *args: str) -> tuple[trio.Process, str]:
    """``agent-supervisor serve --port 0 ARGS`` with ``state`` as its state directory, and
    its URL once ready."""
    env = {**os.environ, "AGENT_SUPERVISOR_STATE_DIR": str(state)}
    serve = await trio.lowlevel.open_process(
        [sys.executable, "-m", "supervisor", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert serve.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        data = await serve.stdout.receive_some(1)
        assert data, "serve exited before it was ready"
        line += data
    return serve, line.decode().split()[1]


async def end(process: trio.Process, signum: int = signal.SIGKILL) -> None:
    if process.returncode is None:
        process.send_signal(signum)
    with trio.fail_after(30):
        await process.wait()


def _config(tmp_path: Path) -> Path:
    """``demo`` (cooperative) and ``stubborn`` (ignores cancel: killed after its grace)."""
    demo_args = [sys.executable, "-m", "supervisor.demo_agent", "--delay", "0.02"]
    demo_args += ["--state-dir", str(tmp_path / "demo")]
    path = tmp_path / "agents.toml"
    path.write_text(
        f"""
[agents.demo]
protocol = "acp"
command = {json.dumps(demo_args)}

[agents.stubborn]
protocol = "acp"
command = {json.dumps([*demo_args, "--ignore-cancel"])}
grace_s = 0.5
kill_timeout_s = 0.5
"""
    )
    return path


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
async def test_serve_local_sessions_in_a_local_node_outlive_a_restart(
    nodes: Path, stop: str
) -> None:
    """``serve --local-node``: its sessions of this machine run in a node here. ``serve``
    stopped (cleanly, or killed) and started again: the same session ids, the running turn
    went on, a client resubscribing from its last seq sees every event once; the stop ladder
    is whole (a wedged agent is killed after its grace, respawned, resumed)."""
    from supervisor.client import connect

    state = nodes / "state"
    config = _config(nodes)
    seen: list[dict[str, Any]] = []

    with trio.fail_after(BOUND):
        first, url = await start_serve(state, "--local-node", "--config", str(config))
    try:
        with trio.fail_after(BOUND):
            async with connect(url) as client:
                started = await client.start_session("demo")
                sid = started["session_id"]
                assert (sid, started["host"]) == ("s1@local", "local"), started
                stubborn = (await client.start_session("stubborn"))["session_id"]
                async with client.subscribe(sid, since_seq=0) as events:
                    turn = (await client.prompt(sid, "long words=3000"))["turn_id"]
                    seen += await read_deltas(events, 10)
        await end(first, getattr(signal, stop))
        if stop == "SIGTERM":
            assert first.returncode == 0
    finally:
        await end(first)
    with trio.fail_after(BOUND):
        second, url = await start_serve(state, "--local-node", "--config", str(config))
    try:
        with trio.fail_after(BOUND):
            async with connect(url) as client:
                listed = {s["session_id"]: s for s in await client.sessions()}
                assert set(listed) == {sid, stubborn}, listed
                assert listed[sid]["host"] == "local"
                async with client.subscribe(sid, since_seq=seen[-1]["seq"]) as events:
                    seen += await read_deltas(events, 20)
                    receipt = await client.cancel(sid)
                    assert (receipt["outcome"], receipt["turn_id"]) == ("cancelled", turn)
                    assert receipt["host"] == "local"
                    async for event in events:
                        seen.append(event)
                        if event["event"] == "turn.ended":
                            break
                seqs = [event["seq"] for event in seen]
                assert seqs == list(range(1, len(seqs) + 1)), seqs  # every event, once
                assert [e["data"]["turn_id"] for e in seen if e["event"] == "turn.ended"] == [turn]
                # the whole ladder, in the local node
                async with client.subscribe(stubborn) as events:
                    await client.prompt(stubborn, "grandchildren words=10000")
                    async for event in events:
                        if event["event"] == "tool.call":
                            pids = event["data"]["raw"]["rawOutput"]["pids"]
                            leaked = [psutil.Process(pid) for pid in pids]
                            break
                    killed = await client.cancel(stubborn)
                assert killed["outcome"] == "killed", killed
                assert killed["escalation"][:2] == ["interrupt", "grace_expired"], killed
                assert "respawned" in killed["escalation"] and killed["resumed"] is True
                _, alive = psutil.wait_procs(leaked, timeout=10)
                assert alive == []
                await client.stop(sid)
                await client.stop(stubborn)
                # (kept in the store, as stopped)
                assert {s["state"] for s in await client.sessions()} == {"stopped"}
    finally:
        await end(second, signal.SIGTERM)


async def test_serve_stop_node_sessions_stops_them_at_a_clean_exit(nodes: Path) -> None:
    """``serve --local-node --stop-node-sessions``: SIGTERM stops the node's sessions too
    (their trees are gone, the node has nothing left to run), and the next ``serve`` finds
    none running: the session is listed from the store, stopped."""
    from supervisor.client import connect

    state = nodes / "state"
    config = _config(nodes)
    args = ("--local-node", "--config", str(config))
    with trio.fail_after(BOUND):
        first, url = await start_serve(state, *args, "--stop-node-sessions")
    try:
        with trio.fail_after(BOUND):
            async with connect(url) as client:
                sid = (await client.start_session("demo"))["session_id"]
                async with client.subscribe(sid) as events:
                    await client.prompt(sid, "long words=3000")
                    async for event in events:
                        if event["event"] == "message.delta":
                            break
            [node] = _node_pids(state)
            agents = psutil.Process(node).children(recursive=True)
            assert agents, "the node runs the agent"
        await end(first, signal.SIGTERM)
        assert first.returncode == 0
    finally:
        await end(first)
    _, alive = psutil.wait_procs(agents, timeout=20)
    assert alive == [], alive
    with trio.fail_after(BOUND):
        second, url = await start_serve(state, *args)
    try:
        with trio.fail_after(BOUND):
            async with connect(url) as client:
                listed = [(s["session_id"], s["state"]) for s in await client.sessions()]
                assert listed == [(sid, "stopped")]
    finally:
        await end(second, signal.SIGTERM)


def test_local_node_is_a_flag_and_a_gateway_key(tmp_path: Path) -> None:
    from supervisor.cli import _parser, serve_options
    from supervisor.config import ConfigError, parse_gateway

    assert parse_gateway({"gateway": {"local_node": True}}).local_node is True
    assert parse_gateway({}).local_node is False
    with pytest.raises(ConfigError, match="'local_node' must be true or false"):
        parse_gateway({"gateway": {"local_node": "yes"}})
    config = tmp_path / "a.toml"
    config.write_text("[gateway]\nlocal_node = true\n")
    options = serve_options(_parser().parse_args(["serve", "--config", str(config)]))
    assert (options.local_node, options.keep_node_sessions) == (True, True)
    options = serve_options(_parser().parse_args(["serve", "--local-node", "--stop-node-sessions"]))
    assert (options.local_node, options.keep_node_sessions) == (True, False)
    assert serve_options(_parser().parse_args(["serve"])).local_node is False
    config.write_text('[gateway]\nlocal_node = true\n[hosts.local]\ntransport = ["ssh", "x"]\n')
    with pytest.raises(ConfigError, match=r"\[hosts.local\] is taken"):
        serve_options(_parser().parse_args(["serve", "--config", str(config)]))


def test_the_local_node_detach_s_is_a_gateway_key(tmp_path: Path) -> None:
    """``[gateway] local_node_detach_s``: how long ``serve --local-node``'s node keeps its
    sessions after a ``serve`` that never comes back (the node's ``--detach``)."""
    from supervisor.cli import _parser, serve_options
    from supervisor.config import ConfigError, parse_gateway
    from supervisor.remote.hosts import DEFAULT_DETACH_S, local_node

    assert parse_gateway({}).local_node_detach_s is None
    with pytest.raises(ConfigError, match="'local_node_detach_s' must be a number of seconds"):
        parse_gateway({"gateway": {"local_node_detach_s": 0}})
    config = tmp_path / "a.toml"
    config.write_text("[gateway]\nlocal_node = true\nlocal_node_detach_s = 42.5\n")
    options = serve_options(_parser().parse_args(["serve", "--config", str(config)]))
    assert options.config.gateway.local_node_detach_s == 42.5
    node = local_node("local", state_dir=tmp_path, detach_s=42.5)
    argv = node.bridge_argv()
    assert argv[argv.index("--detach") + 1] == "42.5"
    assert local_node("local", state_dir=tmp_path).detach_s == DEFAULT_DETACH_S
