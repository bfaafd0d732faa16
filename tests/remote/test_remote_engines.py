"""Sessions in a container, through the real ``docker`` and ``kubectl`` clients.

The transport is the documented one, ``["docker", "exec", "-i", "box"]`` or ``["kubectl",
"exec", "-i", "box", "--"]``, run by the real CLI; the engine behind it is a fake of the
project's own (``tests/engines/``: a Docker Engine on a Unix socket, a Kubernetes API server
on 127.0.0.1), which runs the exec'd command on this machine as a "container" process marked
in its environment and, like the real engines (moby#9098, kubernetes#89031), never kills it
when the client goes away. So what is left "in the container" is what carries the mark, and
what cleans up after a front that is gone is the node's detach timer, as the docs say.

Real processes, the real clock, generous bounds; waits are on events or process exits. Where
a client CLI is missing, the tests skip with the reason (strict mode: they fail).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio

from engines._engine import Engine
from engines.fake_docker import start_fake_docker
from engines.fake_kube import start_fake_kube
from helpers import Recorder, skip_or_fail
from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.remote import HostSpec, RemoteSession
from supervisor.supervisor import Supervisor
from supervisor.testing import record

pytestmark = pytest.mark.real_process

BOUND = 60.0  # generous: a stuck test fails instead of hanging the suite
GRACE = 1.0
CONTAINER = "box"


@attrs.frozen
class Box:
    """A container of a fake engine, reached through the real client CLI."""

    cli: str
    engine: Engine
    #: the transport as documented (the CLI finds the engine through its environment)
    transport: list[str]
    #: the container's home directory (its state lives there)
    home: Path

    def processes(self) -> list[psutil.Process]:
        return self.engine.container_processes(CONTAINER)

    def host_spec(self, **changes: Any) -> HostSpec:
        fields: dict[str, Any] = {
            "name": CONTAINER,
            "transport": self.transport,
            "command": [sys.executable, "-m", "supervisor.cli"],  # agent-supervisor "inside"
            "detach_s": 30.0,
            "state_dir": str(self.home / "state"),
            **changes,
        }
        return HostSpec(**fields)

    def demo(self) -> AgentSpec:
        """The demo agent, run in the container."""
        return AgentSpec(
            name="demo",
            protocol="acp",
            command=(
                sys.executable,
                "-m",
                "supervisor.demo_agent",
                "--delay",
                "0.02",
                "--state-dir",
                str(self.home / "demo-state"),
            ),
            grace_s=GRACE,
            kill_timeout_s=0.5,
            hosts=(CONTAINER,),
        )


@pytest.fixture(params=["docker", "kubectl"])
def box(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Box]:
    cli: str = request.param
    if shutil.which(cli) is None:
        skip_or_fail(f"no {cli} client on PATH (the transport is the real CLI)")
    home = tmp_path / "box-home"
    home.mkdir()
    inside = {"env": {"HOME": str(home)}, "workdir": str(home)}
    engine: Engine
    if cli == "docker":
        docker = start_fake_docker(tmp_path, {CONTAINER: inside})
        monkeypatch.setenv("DOCKER_HOST", docker.docker_host)
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
        engine, transport = docker, ["docker", "exec", "-i", CONTAINER]
    else:
        kube = start_fake_kube({CONTAINER: inside})
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig")))
        monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
        engine, transport = kube, ["kubectl", "exec", "-i", CONTAINER, "--"]
    try:
        yield Box(cli=cli, engine=engine, transport=transport, home=home)
    finally:
        engine.close([CONTAINER])  # what the container still runs dies with it


@asynccontextmanager
async def remote_session(
    box: Box, spec: AgentSpec | None = None, **host_changes: Any
) -> AsyncIterator[tuple[Supervisor, RemoteSession, Recorder]]:
    spec = spec if spec is not None else box.demo()
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={spec.name: spec}, hosts={CONTAINER: box.host_spec(**host_changes)}
        ) as sup:
            session = await sup.start_session(spec.name)
            assert isinstance(session, RemoteSession)
            async with record(session) as recorder:
                yield sup, session, recorder
                recorder.check_invariants()


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def only_the_node_is_left(box: Box, node: int) -> None:
    """Every process the container runs is the node, or the node's own cgroup keeper (where
    agents get cgroups: it lives as long as the node, double-forked, its root cgroup named
    ``agent-supervisor.NODE_PID.START``), within a bound."""
    keeper = {p.pid for p in box.processes() if _is_keeper_of(p, node)}
    others = [p for p in box.processes() if p.pid != node and p.pid not in keeper]
    _, alive = psutil.wait_procs(others, timeout=10)
    alive = [p for p in alive if _running(p)]
    assert alive == [], [_describe(p) for p in alive]
    assert {p.pid for p in box.processes()} == {node, *keeper}


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_keeper_of(process: psutil.Process, node: int) -> bool:
    try:
        argv = process.cmdline()
    except psutil.Error:
        return False
    root = os.path.basename(argv[-1]) if argv else ""
    return any(w.endswith("cgroup_keeper.py") for w in argv) and root.startswith(
        f"agent-supervisor.{node}."
    )


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid}: {' '.join(process.cmdline())}"
    except psutil.Error:
        return str(process.pid)


async def test_stream_and_cancel_in_a_container(box: Box) -> None:
    async with remote_session(box) as (sup, session, rec):
        assert session.host == CONTAINER and session.id == f"{session.node_id}@{CONTAINER}"
        turn = await session.prompt("hello words=400")
        await rec.wait_for(is_delta, count=3)
        # The node and the agent run in the container: the engine exec'd the bridge there.
        node = session.link.node_pid
        assert node is not None
        inside = {p.pid for p in box.processes()}
        assert node in inside and len(inside) >= 3, [_describe(p) for p in box.processes()]
        assert any("exec" in r for r in box.engine.requests), box.engine.requests
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        assert receipt.escalation == ["interrupt"]
        assert (receipt.host, receipt.session_id) == (CONTAINER, session.id)
        await rec.catch_up()
        [ended] = rec.of_kind("turn.ended")
        assert isinstance(ended, ev.TurnEnded) and ended.receipt is not None
        assert ended.receipt["host"] == CONTAINER
        again = await session.prompt("again words=3")
        done = await rec.wait_kind("turn.ended", turn_id=again.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        assert [s.host for s in sup.list()] == [CONTAINER]
    # Leaving the supervisor stopped the session in the container: only the node is left.
    only_the_node_is_left(box, node)


async def test_the_engine_keeps_a_command_running_when_its_client_is_killed(box: Box) -> None:
    """The caveat itself, with the real CLI: killed, it leaves its command running in the
    container, whose stdin is closed (moby#9098, kubernetes#89031); nothing signals it."""
    fifo = box.home / "stdin-closed"
    os.mkfifo(fifo)
    script = f'cat; echo closed > "{fifo}"; exec sleep 600'
    client = await trio.lowlevel.open_process(
        [*box.transport, "sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    try:
        with trio.fail_after(BOUND):
            # (the engine's thread records it: waited for in a thread, given up on a timeout)
            await trio.to_thread.run_sync(box.engine.first_started.wait, abandon_on_cancel=True)
            [command] = box.engine.started
            client.kill()
            await client.wait()
            said = await trio.to_thread.run_sync(fifo.read_text)  # blocks until sh writes
            process = psutil.Process(command.process.pid)
            # sh execs the sleep next; mid-exec its environment (the container's mark) reads
            # empty, and nothing tells when an exec is done but the process's name.
            while process.name() != "sleep":
                await trio.sleep(0.05)
        assert said == "closed\n"  # its stdin closed when the client went away
        assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        assert command.exit_code is None
        assert [p.pid for p in box.processes()] == [process.pid]  # still running, alone
    finally:
        if client.returncode is None:
            client.kill()


async def test_client_cli_killed_mid_turn_events_resume_without_gap(box: Box) -> None:
    async with remote_session(box) as (_, session, rec):
        turn = await session.prompt("long words=2000")
        await rec.wait_for(is_delta, count=5)
        client = session.link.process
        assert client is not None and session.link.connects == 1
        assert psutil.Process(client.pid).name().startswith(box.cli)
        [bridge] = box.engine.started
        node = session.link.node_pid
        client.send_signal(signal.SIGKILL)
        seen = len(rec.of_kind("message.delta"))
        # Deltas come again only once the link is back and resubscribed from its last seq.
        await rec.wait_for(is_delta, count=seen + 20)
        assert session.link.connects == 2 and session.link.node_pid == node
        # The engine did not kill the first bridge (it never does): its stdin closed, so it
        # ended by itself, with status 0, and the node saw its connection go.
        assert await trio.to_thread.run_sync(bridge.finished.wait, BOUND)
        assert bridge.exit_code == 0
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        assert receipt.host == CONTAINER
        await rec.catch_up()
        # check_invariants (on the way out): seq contiguous from 1, one turn.ended per turn
        deltas = [e for e in rec.events if isinstance(e, ev.MessageDelta)]
        assert len(deltas) == len({e.seq for e in deltas})
    assert node is not None
    only_the_node_is_left(box, node)


async def test_wedged_agent_killed_in_the_container_with_its_setsid_grandchild(box: Box) -> None:
    async with remote_session(box, box.demo().with_args("--ignore-cancel")) as (_, session, rec):
        await session.prompt("grandchildren words=10000")
        tool = await rec.wait_kind("tool.call")
        assert isinstance(tool, ev.ToolCall)
        leaked = [psutil.Process(pid) for pid in tool.raw["rawOutput"]["pids"]]
        setsid = tool.raw["rawOutput"]["setsidGrandchild"]
        in_box = {p.pid for p in box.processes()}
        assert {p.pid for p in leaked} <= in_box and setsid in in_box
        assert os.getsid(setsid) == setsid  # in a session of its own
        receipt = await session.cancel()
        assert receipt.outcome == "killed" and receipt.host == CONTAINER, receipt
        assert receipt.escalation[:2] == ["interrupt", "grace_expired"], receipt.escalation
        assert receipt.survivors == [] and receipt.resumed is True
        _, alive = psutil.wait_procs(leaked, timeout=10)
        assert alive == [], [_describe(p) for p in alive]
        again = await session.prompt("again words=3")
        done = await rec.wait_kind("turn.ended", turn_id=again.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        node = session.link.node_pid
    assert node is not None
    only_the_node_is_left(box, node)


async def freeze(process: trio.Process) -> None:
    """SIGSTOP, and return once the whole process has stopped (``waitid`` reports the group
    stop to its parent): a Go client's other threads could otherwise still relay the bytes
    written next, and the cancel would reach the node after all."""
    process.send_signal(signal.SIGSTOP)
    await trio.to_thread.run_sync(
        os.waitid, os.P_PID, process.pid, os.WSTOPPED | os.WNOWAIT, abandon_on_cancel=True
    )


async def test_partition_during_a_cancel_gives_an_honest_receipt(box: Box) -> None:
    """The client CLI freezes (SIGSTOP) and the engine answers no new connection: the cancel
    keeps trying within the node's ladder, then says the container was unreachable, never
    ``killed``. Once the engine answers again the link comes back by itself, the stream goes
    on with no gap, and a cancel stops the turn."""
    async with remote_session(box, connect_timeout_s=3.0) as (_, session, rec):
        turn = await session.prompt("long words=5000")
        await rec.wait_for(is_delta, count=3)
        client = session.link.process
        assert client is not None
        box.engine.pause()
        try:
            await freeze(client)
            receipt = await session.cancel()
        finally:
            box.engine.resume()
        assert receipt.outcome == "unreachable", receipt
        assert (receipt.host, receipt.turn_id, receipt.escalation) == (CONTAINER, turn.id, [])
        assert receipt.details["cause"] == "timeout", receipt.details
        seen = len(rec.of_kind("message.delta"))
        await rec.wait_for(is_delta, count=seen + 5)
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        node = session.link.node_pid
    assert node is not None
    only_the_node_is_left(box, node)


def serve_config(box: Box, tmp_path: Path, detach: float) -> Path:
    """A front's configuration: the container as host ``box``, ``remote-demo`` in it."""
    host = box.host_spec(detach_s=detach)

    def words(argv: Any) -> str:
        return ", ".join(f'"{w}"' for w in argv)

    config = tmp_path / "agents.toml"
    config.write_text(
        f"""
[hosts.{CONTAINER}]
transport = [{words(host.transport)}]
command = [{words(host.command)}]
detach_s = {detach}
state_dir = "{host.state_dir}"

[agents.remote-demo]
protocol = "acp"
command = [{words(box.demo().command)}]
hosts = ["{CONTAINER}"]
"""
    )
    return config


async def test_nobody_reconnects_within_detach_s_nothing_is_left(box: Box, tmp_path: Path) -> None:
    """A front (``serve``) dies mid-turn. The engine kills nothing; the client CLI sees its
    stdin close and ends, the bridge in the container likewise, and after ``detach_s``
    undriven the node stops the session, its tree, and itself: the container runs nothing."""
    from supervisor.client import connect

    detach = 2.0
    config = serve_config(box, tmp_path, detach)
    env = {**os.environ, "AGENT_SUPERVISOR_STATE_DIR": str(tmp_path / "front-state")}
    argv = [sys.executable, "-m", "supervisor.cli", "serve", "--config", str(config)]
    serve = await trio.lowlevel.open_process(
        [*argv, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    try:
        with trio.fail_after(BOUND):
            assert serve.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                data = await serve.stdout.receive_some(1)
                assert data, "serve exited before it was ready"
                line += data
            async with connect(line.decode().split()[1]) as client:
                sid = (await client.start_session("remote-demo"))["session_id"]
                async with client.subscribe(sid, since_seq=0) as events:
                    await client.prompt(sid, "long words=10000")
                    async for event in events:
                        assert event["host"] == CONTAINER
                        if event["event"] == "message.delta":
                            break
                in_box = box.processes()
                assert len(in_box) >= 3, [_describe(p) for p in in_box]  # bridge, node, agent
                clients = [
                    p for p in psutil.Process(serve.pid).children() if p.name().startswith(box.cli)
                ]
                assert len(clients) == 1, psutil.Process(serve.pid).children()
                serve.send_signal(signal.SIGKILL)
        # The client CLI outlives serve only until it sees its stdin close.
        _, alive = psutil.wait_procs(clients, timeout=BOUND)
        assert alive == [], [_describe(p) for p in alive]
        # Nobody drives the node: within detach_s (and its ladder) the container is empty.
        _, alive = psutil.wait_procs(in_box, timeout=detach + 20)
        assert alive == [], [_describe(p) for p in alive]
        assert box.processes() == []
        assert len(box.engine.started) == 1  # nobody reconnected
    finally:
        if serve.returncode is None:
            serve.kill()
        with trio.move_on_after(5):
            await serve.wait()


@pytest.mark.parametrize("case", ["no_container", "not_installed"])
async def test_errors_name_their_cause_through_the_engine(box: Box, case: str) -> None:
    """What the real CLI says when the container is not there, or agent-supervisor is not in
    it, is named (docker: 'No such container', exit 127; kubectl: 'Error from server
    (NotFound)', 'command terminated with exit code 126')."""
    from supervisor.remote import HostUnreachable

    if case == "no_container":
        host = box.host_spec(
            transport=[w if w != CONTAINER else "elsewhere" for w in box.transport]
        )
    else:
        host = box.host_spec(command=["/opt/nowhere/agent-supervisor"])
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": box.demo()}, hosts={CONTAINER: host}) as sup:
            with pytest.raises(HostUnreachable) as raised:
                await sup.start_session("demo")
    assert raised.value.cause == case, raised.value
    words = {"no_container": "not there", "not_installed": "not installed"}
    assert words[case] in str(raised.value), raised.value
    assert box.processes() == []  # nothing ran in the container, or it is gone
