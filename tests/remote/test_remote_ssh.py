"""Sessions on another host over real SSH: a real ``sshd`` on 127.0.0.1, a throwaway user.

The "host" is this machine seen through ``ssh user@127.0.0.1``: the node runs as the user
(``tests/sshd.py``), so what is left running "on the host" is what that user runs, and the
tree a kill must end is visible here with psutil. Real processes, the real clock, generous
bounds; waits are on events (or process exits), never on sleeps. Each test gets a node of its
own (its own ``state_dir`` on the host); whatever the user still runs after a test is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from helpers import Recorder
from protocols import events as ev
from served import read_deltas
from sshd import SshHost, start_ssh_host
from supervisor import AgentSpec, open_supervisor
from supervisor.errors import AgentNotRunning
from supervisor.remote import HostCapacity, HostSpec, HostUnreachable, RemoteSession
from supervisor.supervisor import Supervisor
from supervisor.testing import record

pytestmark = pytest.mark.real_process

BOUND = 60.0  # generous: a stuck test fails instead of hanging the suite
GRACE = 1.0


@pytest.fixture(scope="module")
def ssh_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHost]:
    yield from start_ssh_host(tmp_path_factory.mktemp("sshd"))


@pytest.fixture
def host(ssh_host: SshHost, request: pytest.FixtureRequest) -> Iterator[SshHost]:
    """The SSH host, with nothing of the user's running before or after the test."""
    _kill_all(ssh_host)
    yield ssh_host
    _kill_all(ssh_host)


def _kill_all(host: SshHost) -> None:
    left = host.processes()
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)


def host_spec(host: SshHost, name: str = "h", **changes: Any) -> HostSpec:
    test = os.environ.get("PYTEST_CURRENT_TEST", "test").split(":")[-1].split(" ")[0]
    fields: dict[str, Any] = {
        "name": name,
        "transport": host.transport,
        "command": host.node_command(),
        "detach_s": 30.0,
        "state_dir": str(host.home / "nodes" / test),
        **changes,
    }
    return HostSpec(**fields)


def demo_on(
    host: SshHost, *args: str, hosts: tuple[str, ...] = ("h",), **changes: Any
) -> AgentSpec:
    """The demo agent, run on the host by the host's Python."""
    spec = AgentSpec(
        name="demo",
        protocol="acp",
        command=(
            host.python,
            "-m",
            "supervisor.demo_agent",
            "--delay",
            "0.02",
            "--state-dir",
            str(host.home / "demo-state"),
            *args,
        ),
        grace_s=GRACE,
        kill_timeout_s=0.5,
        hosts=hosts,
    )
    return spec.with_options(**changes)


@asynccontextmanager
async def remote_session(
    host: SshHost, spec: AgentSpec, hosts: dict[str, HostSpec]
) -> AsyncIterator[tuple[Supervisor, RemoteSession, Recorder]]:
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={spec.name: spec}, hosts=hosts) as sup:
            session = await sup.start_session(spec.name)
            assert isinstance(session, RemoteSession)
            async with record(session) as recorder:
                yield sup, session, recorder
                recorder.check_invariants()


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


def node_pid(session: RemoteSession) -> int:
    conn = session.link._conn
    assert conn is not None
    return conn.hello.pid


def only_the_node_is_left(host: SshHost, node: int) -> None:
    """Every process the user runs is the node (the session's tree is gone), within a bound."""
    others = [p for p in host.processes() if p.pid != node]
    _, alive = psutil.wait_procs(others, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [_describe(p) for p in alive]


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid}: {' '.join(process.cmdline())}"
    except psutil.Error:
        return str(process.pid)


async def test_stream_and_cancel_on_the_host(host: SshHost) -> None:
    spec = demo_on(host)
    async with remote_session(host, spec, {"h": host_spec(host)}) as (sup, session, rec):
        assert session.host == "h" and session.id == f"{session.node_id}@h"
        assert [s.host for s in sup.list()] == ["h"]
        turn = await session.prompt("hello words=400")
        await rec.wait_for(is_delta, count=3)
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        assert receipt.escalation == ["interrupt"]
        assert (receipt.host, receipt.session_id) == ("h", session.id)
        assert receipt.elapsed_ms < GRACE * 1000
        # terminate-then-respond, across the link: the turn's end was published first
        ended = [e for e in session._fanout.history if b'"turn.ended"' in e]
        assert len(ended) == 1 and b'"host":"h"' in ended[0]
        await rec.catch_up()
        [turn_ended] = rec.of_kind("turn.ended")
        assert isinstance(turn_ended, ev.TurnEnded) and turn_ended.receipt is not None
        assert turn_ended.receipt["host"] == "h" and turn_ended.receipt["session_id"] == session.id
        # the session goes on
        again = await session.prompt("again words=3")
        done = await rec.wait_kind("turn.ended", turn_id=again.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        node = node_pid(session)
    # Leaving the supervisor stopped the session on the host: only the node is left there.
    only_the_node_is_left(host, node)


async def test_wedged_agent_killed_on_the_host_with_its_setsid_grandchild(host: SshHost) -> None:
    spec = demo_on(host, "--ignore-cancel")
    async with remote_session(host, spec, {"h": host_spec(host)}) as (_, session, rec):
        await session.prompt("grandchildren words=10000")
        tool = await rec.wait_kind("tool.call")
        assert isinstance(tool, ev.ToolCall)
        pids = tool.raw["rawOutput"]["pids"]
        setsid = tool.raw["rawOutput"]["setsidGrandchild"]
        leaked = [psutil.Process(pid) for pid in pids]
        assert all(p.uids().real == host.uid for p in leaked)  # they run on the "host"
        assert os.getsid(setsid) == setsid  # in a session of its own
        receipt = await session.cancel()
        assert receipt.outcome == "killed", receipt
        assert receipt.host == "h"
        assert receipt.escalation[:2] == ["interrupt", "grace_expired"], receipt.escalation
        assert "respawned" in receipt.escalation and receipt.resumed is True
        assert receipt.survivors == []
        _, alive = psutil.wait_procs(leaked, timeout=5)
        assert alive == [], alive
        again = await session.prompt("again words=3")
        done = await rec.wait_kind("turn.ended", turn_id=again.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
        node = node_pid(session)
    only_the_node_is_left(host, node)


async def test_ssh_client_killed_mid_turn_events_resume_without_gap(host: SshHost) -> None:
    spec = demo_on(host)
    async with remote_session(host, spec, {"h": host_spec(host)}) as (_, session, rec):
        turn = await session.prompt("long words=2000")
        await rec.wait_for(is_delta, count=5)
        transport = session.link.process
        assert transport is not None and session.link.connects == 1
        transport.send_signal(signal.SIGKILL)
        seen = len(rec.of_kind("message.delta"))
        # Deltas come again only once the link is back and resubscribed from its last seq.
        await rec.wait_for(is_delta, count=seen + 20)
        assert session.link.connects == 2
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        await rec.catch_up()
        # check_invariants (on the way out): seq contiguous from 1, one turn.ended per turn
        deltas = [e for e in rec.events if isinstance(e, ev.MessageDelta)]
        assert len(deltas) == len({e.seq for e in deltas})
        node = node_pid(session)
    only_the_node_is_left(host, node)


def serve_config(host: SshHost, tmp_path: Path, detach: float) -> Path:
    """A front's configuration: host ``h`` (this test's node) and ``remote-demo`` on it."""
    spec_host = host_spec(host, detach_s=detach)
    config = tmp_path / "agents.toml"
    command = ", ".join(f'"{w}"' for w in demo_on(host).command)
    config.write_text(
        f"""
[hosts.h]
transport = [{", ".join(f'"{w}"' for w in host.transport)}]
command = [{", ".join(f'"{w}"' for w in host.node_command())}]
detach_s = {detach}
state_dir = "{spec_host.state_dir}"

[agents.remote-demo]
protocol = "acp"
command = [{command}]
hosts = ["h"]
"""
    )
    return config


async def start_serve(config: Path, state: Path) -> tuple[trio.Process, str]:
    """``agent-supervisor serve --config`` on a free port, and its URL once ready."""
    env = {**os.environ, "AGENT_SUPERVISOR_STATE_DIR": str(state)}
    serve = await trio.lowlevel.open_process(
        [sys.executable, "-m", "supervisor.cli", "serve", "--config", str(config), "--port", "0"],
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


async def end(process: trio.Process) -> None:
    if process.returncode is None:
        process.kill()
    with trio.move_on_after(5):
        await process.wait()


async def test_nobody_reconnects_within_detach_s_nothing_is_left(
    host: SshHost, tmp_path: Path
) -> None:
    """A front (``serve``, over the wire) dies mid-turn: its link drops, nobody drives the
    node, and after ``detach_s`` the node has stopped the session, its tree, and itself."""
    from supervisor.client import connect

    detach = 2.0
    config = serve_config(host, tmp_path, detach)
    with trio.fail_after(BOUND):
        serve, url = await start_serve(config, tmp_path / "state")
    try:
        with trio.fail_after(BOUND):
            async with connect(url) as client:
                started = await client.start_session("remote-demo", host="h")
                assert started["host"] == "h" and started["session_id"].endswith("@h")
                sid = started["session_id"]
                [listed] = await client.sessions()
                assert listed["host"] == "h"
                async with client.subscribe(sid, since_seq=0) as events:
                    await client.prompt(sid, "long words=10000")
                    async for event in events:
                        assert event["host"] == "h" and event["session_id"] == sid
                        if event["event"] == "message.delta":
                            break
                # The host runs the node and the agent's tree now.
                on_host = host.processes()
                assert len(on_host) >= 3, [_describe(p) for p in on_host]
                serve.send_signal(signal.SIGKILL)
        # Nobody drives the node any more: within detach_s (and its ladder), it has stopped
        # the session, killed the tree and exited.
        gone, alive = psutil.wait_procs(on_host, timeout=detach + 20)
        assert alive == [], [_describe(p) for p in alive]
        assert host.processes() == []
    finally:
        await end(serve)


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
async def test_serve_stopped_and_started_again_loses_no_session(
    host: SshHost, tmp_path: Path, stop: str
) -> None:
    """``serve`` is SIGKILLed, or stopped cleanly (SIGTERM: it leaves its node sessions to
    their node), mid-turn and started again: it finds its remote session (same id), the turn
    went on on the host meanwhile, and a client that resubscribes from its last ``seq`` sees
    every event once; the turn can then be cancelled."""
    from supervisor.client import connect

    config = serve_config(host, tmp_path, detach=30.0)
    state = tmp_path / "state"
    seen: list[dict[str, Any]] = []

    with trio.fail_after(BOUND):
        first, url = await start_serve(config, state)
    try:
        with trio.fail_after(BOUND):
            async with connect(url) as client:
                sid = (await client.start_session("remote-demo"))["session_id"]
                async with client.subscribe(sid, since_seq=0) as events:
                    turn = (await client.prompt(sid, "long words=3000"))["turn_id"]
                    seen += await read_deltas(events, 10)
            on_host = _node_and_agents(host)
            assert any("demo_agent" in line for line in on_host.values()), on_host
            first.send_signal(getattr(signal, stop))
            await first.wait()
            if stop == "SIGTERM":
                assert first.returncode == 0
            # the node and the agent's tree run on, on the host
            assert _node_and_agents(host) == on_host
    finally:
        await end(first)
    with trio.fail_after(BOUND):
        second, url = await start_serve(config, state)
    try:
        with trio.fail_after(BOUND):
            async with connect(url) as client:
                [listed] = await client.sessions()
                assert (listed["session_id"], listed["host"]) == (sid, "h"), listed
                async with client.subscribe(sid, since_seq=seen[-1]["seq"]) as events:
                    seen += await read_deltas(events, 20)
                    receipt = await client.cancel(sid)
                    assert (receipt["outcome"], receipt["turn_id"]) == ("cancelled", turn)
                    assert receipt["host"] == "h"
                    async for event in events:
                        seen.append(event)
                        if event["event"] == "turn.ended":
                            break
                seqs = [event["seq"] for event in seen]
                assert seqs == list(range(1, len(seqs) + 1)), seqs  # every event, once
                assert [e["data"]["turn_id"] for e in seen if e["event"] == "turn.ended"] == [turn]
                await client.stop(sid)
    finally:
        await end(second)


def _node_and_agents(host: SshHost) -> dict[int, str]:
    """The node and the agents' processes the user runs (not sshd's, nor the bridges)."""
    found = {}
    for process in host.processes():
        with contextlib.suppress(psutil.Error):
            line = " ".join(process.cmdline())
            if " node --detach " in line or "demo_agent" in line:
                found[process.pid] = line
    return found


async def test_partition_during_a_cancel_gives_an_honest_receipt(host: SshHost) -> None:
    """The link freezes (the ssh client stopped) and no new one can be made (sshd stopped):
    the cancel keeps trying within the node's ladder, then says the host was unreachable,
    never ``killed``. Once the host is back the link resubscribes, the stream goes on with no
    gap, and a cancel stops the turn."""
    spec = demo_on(host)
    hosts = {"h": host_spec(host, connect_timeout_s=3.0)}
    async with remote_session(host, spec, hosts) as (_, session, rec):
        turn = await session.prompt("long words=5000")
        await rec.wait_for(is_delta, count=3)
        transport = session.link.process
        assert transport is not None
        os.kill(host.sshd_pid, signal.SIGSTOP)
        try:
            transport.send_signal(signal.SIGSTOP)
            receipt = await session.cancel()
        finally:
            os.kill(host.sshd_pid, signal.SIGCONT)
        assert receipt.outcome == "unreachable", receipt
        assert (receipt.host, receipt.turn_id, receipt.escalation) == ("h", turn.id, [])
        assert receipt.details["cause"] == "timeout", receipt.details
        assert "unreachable" in receipt.summary()
        # The host is back: the link reconnects by itself, and the turn went on there.
        seen = len(rec.of_kind("message.delta"))
        await rec.wait_for(is_delta, count=seen + 5)
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        node = node_pid(session)
    only_the_node_is_left(host, node)


async def test_a_killed_node_fails_its_sessions_with_the_cause(host: SshHost) -> None:
    spec = demo_on(host)
    async with remote_session(host, spec, {"h": host_spec(host)}) as (_, session, rec):
        turn = await session.prompt("long words=5000")
        await rec.wait_for(is_delta, count=3)
        node = psutil.Process(node_pid(session))
        agents = [p for p in node.children(recursive=True)]
        assert agents, "the node runs the agent's tree"
        node.kill()
        failed = await rec.wait_kind("session.state", state="failed")
        assert isinstance(failed, ev.SessionState) and failed.detail is not None
        assert f"pid {node.pid}) is gone" in failed.detail, failed.detail
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
        assert session.state == "failed"
        with pytest.raises(AgentNotRunning, match="is gone"):
            await session.prompt("anyone there?")
        # The tree died with its node (the shim's lifeline): only the new node is left.
        _, alive = psutil.wait_procs(agents, timeout=10)
        assert alive == [], [_describe(p) for p in alive]
        new_node = session.link.node_pid
        assert new_node is not None and new_node != node.pid
    only_the_node_is_left(host, new_node)


async def test_a_cancel_whose_node_dies_meanwhile_says_so(host: SshHost) -> None:
    """The node dies during the cancel's grace: the cancel, sent again once the link is back,
    must not go to the new node (which never had the session) and come back "no session
    's2'"; it is told why the session is over."""
    spec = demo_on(host, "--ignore-cancel", grace_s=5.0)
    async with remote_session(host, spec, {"h": host_spec(host)}) as (_, session, rec):
        turn = await session.prompt("long words=5000")
        await rec.wait_for(is_delta, count=3)
        node = psutil.Process(node_pid(session))
        async with trio.open_nursery() as nursery:
            answers: list[BaseException] = []

            async def cancel() -> None:
                try:
                    await session.cancel()
                except Exception as exc:
                    answers.append(exc)

            nursery.start_soon(cancel)
            await rec.wait_kind("session.state", state="cancelling")
            node.kill()
        [answer] = answers
        assert isinstance(answer, AgentNotRunning), repr(answer)
        assert "is gone" in str(answer), answer
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
        new_node = session.link.node_pid
    only_the_node_is_left(host, new_node)


def _other_key(directory: Path, name: str) -> Path:
    path = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    return path


@pytest.mark.parametrize("case", ["host_key_mismatch", "auth_refused", "not_installed"])
async def test_errors_name_their_cause(host: SshHost, tmp_path: Path, case: str) -> None:
    transport = list(host.transport)
    command = host.node_command()
    if case == "host_key_mismatch":
        impostor = _other_key(tmp_path, "impostor").with_suffix(".pub").read_text()
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{host.port} {impostor}")
        transport = host.with_option(f"UserKnownHostsFile={known}")
    elif case == "auth_refused":
        stranger = _other_key(tmp_path, "stranger")
        transport = [str(stranger) if w == str(host.key) else w for w in transport]
    else:
        command = ["/opt/nowhere/agent-supervisor"]
    hosts = {"h": host_spec(host, transport=transport, command=command)}
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": demo_on(host)}, hosts=hosts) as sup:
            with pytest.raises(HostUnreachable) as raised:
                await sup.start_session("demo")
    assert raised.value.cause == case, raised.value
    assert raised.value.code == "host_unreachable"
    words = {
        "host_key_mismatch": "Host key verification failed",
        "auth_refused": "Permission denied",
        "not_installed": "not installed",
    }
    assert words[case] in str(raised.value), raised.value


async def test_two_hosts_placement_by_room_then_capacity(host: SshHost) -> None:
    """Two hosts (two nodes of the one sshd, each in its own directory): sessions go where
    there is room, and the third gets ``capacity``."""
    hosts = {
        "h1": host_spec(host, "h1", max_sessions=1, state_dir=str(host.home / "nodes" / "h1")),
        "h2": host_spec(host, "h2", max_sessions=1, state_dir=str(host.home / "nodes" / "h2")),
    }
    spec = demo_on(host, hosts=("h1", "h2"))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}, hosts=hosts) as sup:
            first = await sup.start_session("demo")
            second = await sup.start_session("demo")
            assert {first.host, second.host} == {"h1", "h2"}
            assert isinstance(first, RemoteSession) and isinstance(second, RemoteSession)
            assert node_pid(first) != node_pid(second)
            with pytest.raises(HostCapacity, match="every host"):
                await sup.start_session("demo")
            await sup.stop_session(first.id)
            third = await sup.start_session("demo")
            assert third.host == first.host


async def test_an_upgrade_on_the_host_drains_the_old_node(host: SshHost, tmp_path: Path) -> None:
    """The host's package is "upgraded" while a node of the old one (``0.0.1-old``, the same
    wire: the test variable, through ``env`` on the host) runs a session: the next front
    adopts and drives the old session there, its new session goes to a new node of the new
    version beside it, and the old node exits once its last session ends."""
    from supervisor.remote.version import TEST_VERSION_VARIABLE, package_version

    old_command = ["env", f"{TEST_VERSION_VARIABLE}=0.0.1-old", *host.node_command()]
    spec = demo_on(host)
    state = tmp_path / "front"
    with trio.fail_after(BOUND):
        old_hosts = {"h": host_spec(host, command=old_command)}
        async with open_supervisor(
            agents={"demo": spec}, hosts=old_hosts, state_dir=state, keep_node_sessions=True
        ) as sup:
            old = await sup.start_session("demo")
            assert isinstance(old, RemoteSession)
            assert (await old.link.connection()).hello.version == "0.0.1-old"
            turn = await old.prompt("long words=5000")
            old_id, old_node = old.id, node_pid(old)
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"demo": spec}, hosts={"h": host_spec(host)}, state_dir=state
        ) as sup:
            adopted = sup.get(old_id)
            assert isinstance(adopted, RemoteSession)
            async with adopted.subscribe(since_seq=0) as events:
                async for event in events:
                    if is_delta(event):
                        break
            receipt = await adopted.cancel()
            assert (receipt.outcome, receipt.turn_id, receipt.host) == ("cancelled", turn.id, "h")
            assert node_pid(adopted) == old_node
            new = await sup.start_session("demo")
            assert isinstance(new, RemoteSession)
            assert new.id != old_id and node_pid(new) != old_node
            assert (await new.link.connection()).hello.version == package_version()
            await sup.stop_session(old_id)
            _, alive = psutil.wait_procs([psutil.Process(old_node)], timeout=20)
            assert alive == [], "the retired node did not exit after its last session"
            again = await new.prompt("on the new node words=3")
            assert again.id
            new_node = node_pid(new)
    only_the_node_is_left(host, new_node)


async def _answer(session: Any, since: int) -> list[ev.Event]:
    """The events of ``session`` after ``since`` up to its next ``turn.ended``."""
    got: list[ev.Event] = []
    async with session.subscribe(since_seq=since) as events:
        async for event in events:
            got.append(event)
            if event.kind == "turn.ended":
                return got
    raise AssertionError(f"the stream ended before its turn did: {got}")


async def test_a_stored_session_whose_node_is_gone_starts_again_on_its_host(
    host: SshHost, tmp_path: Path
) -> None:
    """The front stops (leaving its session in the node), the node dies, a front starts again
    on the same store: a prompt to the session starts its agent again on the host, in the
    same cwd, resuming the agent's own session, its seqs and turn ids going on. Then the
    agent's own record is gone too: the next start cannot resume, and the agent is given the
    conversation so far."""
    spec = demo_on(host)
    hosts = {"h": host_spec(host)}
    options: dict[str, Any] = {
        "agents": {spec.name: spec},
        "hosts": hosts,
        "state_dir": tmp_path / "state",
        "store": f"sqlite:///{tmp_path / 'sessions.db'}",
        "keep_node_sessions": True,
    }
    cwd = str(host.home)
    with trio.fail_after(BOUND):
        async with open_supervisor(**options) as sup:
            first = await sup.start_session(spec.name, cwd=cwd)
            assert isinstance(first, RemoteSession)
            sid = first.id
            await first.prompt("remember this words=3")
            said = await _answer(first, 0)
            own = first.agent_session_id
            assert own is not None
    last = said[-1].seq
    for round, forgotten in enumerate((False, True)):
        _kill_all(host)  # the node and the agent's tree: nothing of the session runs there
        if forgotten:
            subprocess.run(["rm", "-rf", str(host.home / "demo-state")], check=True)
        with trio.fail_after(BOUND):
            async with open_supervisor(**options) as sup:
                handle = await sup.get(sid).prompt("and now this words=3")
                assert handle.id == f"t{round + 2}"  # turn ids go on
                live = sup.get(sid)
                assert isinstance(live, RemoteSession) and live.host == "h"
                answer = await _answer(live, last)
                assert answer[0].seq == last + 1  # seqs go on
                assert all(e.session_id == sid for e in answer)
                started = next(e for e in answer if isinstance(e, ev.TurnStarted))
                text = "".join(e.text for e in answer if isinstance(e, ev.MessageDelta))
                if forgotten:
                    assert started.context == "injected", started
                    assert 'you last said "and now this words=3"' in text, text
                else:
                    assert started.context is None, answer
                    assert live.agent_session_id == own
                    assert "Given the earlier conversation" not in text, text
                # It runs on the host, in its cwd there.
                agents = [p for p in host.processes() if "demo_agent" in " ".join(p.cmdline())]
                assert agents and {p.cwd() for p in agents} == {cwd}, agents
                last = answer[-1].seq
                await sup.stop_session(sid)


async def test_a_session_started_again_on_its_host_rewinds_to_a_turn_from_before(
    host: SshHost, tmp_path: Path
) -> None:
    """A turn edits files on the host; its node is killed (the front lists the session as
    stored); a prompt starts it again on its host, where the new node has the earlier turn's
    checkpoints back: a rewind to it restores the files byte for byte."""
    spec = demo_on(host)
    before = b"the notes as they were\n\x00\xff raw bytes\n"
    work = host.home / "work-rewind"
    work.mkdir()
    (work / "notes.txt").write_bytes(before)
    for path in (work, work / "notes.txt"):
        os.chown(path, host.uid, -1)
    options: dict[str, Any] = {
        "agents": {spec.name: spec},
        "hosts": {"h": host_spec(host)},
        "state_dir": tmp_path / "state",
        "store": f"sqlite:///{tmp_path / 'sessions.db'}",
    }
    with trio.fail_after(BOUND):
        async with open_supervisor(**options) as sup:
            first = await sup.start_session(spec.name, cwd=str(work))
            assert isinstance(first, RemoteSession) and first.keeps_checkpoints
            await first.prompt("write=notes.txt write=new.txt words=2")
            said = await _answer(first, 0)
            assert said[-1].changes == [  # type: ignore[attr-defined]
                {"path": "new.txt", "change": "added"},
                {"path": "notes.txt", "change": "modified"},
            ]
            async with first.subscribe(since_seq=said[-1].seq) as events:
                psutil.Process(node_pid(first)).kill()
                async for event in events:
                    if isinstance(event, ev.SessionState) and event.state == "failed":
                        break
            handle = await sup.get(first.id).prompt("and now words=1")
            assert handle.id == "t2"
            live = sup.get(first.id)
            assert isinstance(live, RemoteSession) and live is not first
            await _answer(live, said[-1].seq)
            result = await live.rewind("t1")
            assert result["restored"] == ["new.txt", "notes.txt"], result
            assert (work / "notes.txt").read_bytes() == before
            assert not (work / "new.txt").exists()
            await sup.stop_session(first.id)
