"""Remote hosts without SSH: the configuration, placement, the handshake, the causes named.

The link is also run over the ``env`` transport (a "host" that is this machine, as this user):
the same bridge, node and WebSocket, without sshd, so it runs wherever Python does. The real
SSH scenarios are in ``test_remote_ssh.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from hosts import env_node

from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.config import ConfigError, builtin_agents, parse_agents
from supervisor.errors import BadRequest
from supervisor.gateway import Gateway
from supervisor.remote import HostSpec, HostUnreachable, RemoteSession
from supervisor.remote.front import RemoteHosts, rank
from supervisor.remote.handshake import Hello, package_version, spec_from_wire, spec_to_wire
from supervisor.remote.hosts import (
    DEFAULT_DETACH_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    check_agent_hosts,
    parse_hosts,
)
from supervisor.remote.link import classify_transport_failure
from supervisor.remote.version import TEST_VERSION_VARIABLE, TEST_WIRE_VARIABLE, WIRE
from supervisor.testing import record

BOUND = 60.0


def test_hosts_parse_with_defaults_and_agents_name_them() -> None:
    document = {
        "hosts": {
            "b1": {"transport": ["ssh", "agents@b1", "--"], "max_sessions": 40},
            "b2": {
                "transport": ["ssh", "b2", "--"],
                "detach_s": 60,
                "command": ["/opt/as"],
                "request_timeout_s": 5,
            },
        },
        "agents": {"c": {"protocol": "acp", "command": ["c"], "hosts": ["b1", "b2"]}},
    }
    hosts = parse_hosts(document, "f.toml")
    assert hosts["b1"].max_sessions == 40 and hosts["b1"].detach_s == DEFAULT_DETACH_S
    assert hosts["b1"].command == ("agent-supervisor",)
    assert hosts["b1"].request_timeout_s == DEFAULT_REQUEST_TIMEOUT_S == 30.0
    assert hosts["b2"].max_sessions is None and hosts["b2"].detach_s == 60.0
    assert hosts["b2"].request_timeout_s == 5.0
    agents = parse_agents(document, "f.toml")
    assert agents["c"].hosts == ("b1", "b2")
    check_agent_hosts(agents, hosts)
    with pytest.raises(ConfigError, match="unknown host.*b3"):
        check_agent_hosts({"x": agents["c"].with_options(hosts=("b3",))}, hosts)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({}, "'transport' is required"),
        ({"transport": "ssh b1 --"}, "not a shell string"),
        ({"transport": ["ssh"], "max_sessions": 0}, "'max_sessions' must be a whole number"),
        ({"transport": ["ssh"], "detach_s": -1}, "'detach_s' must be a number of seconds > 0"),
        (
            {"transport": ["ssh"], "request_timeout_s": True},
            "'request_timeout_s' must be a number of seconds > 0",
        ),
        ({"transport": ["ssh"], "ports": 1}, "unknown key"),
    ],
)
def test_bad_host_tables_name_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        parse_hosts({"hosts": {"b1": table}}, "f.toml")
    assert "f.toml: [hosts.b1]" in str(raised.value)


def test_the_bridge_command_is_quoted_for_ssh_only() -> None:
    ssh = HostSpec(name="a", transport=["ssh", "h", "--"], command=["/opt/a b/as"], detach_s=5)
    assert ssh.bridge_argv() == [
        "ssh",
        "h",
        "--",
        "'/opt/a b/as'",
        "node",
        "--bridge",
        "--detach",
        "5",
    ]
    docker = HostSpec(name="a", transport=["docker", "exec", "-i", "c"], command=["/opt/a b/as"])
    assert docker.bridge_argv()[4] == "/opt/a b/as"


def test_placement_goes_to_the_most_room_then_says_capacity() -> None:
    """Ranking from the counts the nodes gave (sessions of every front)."""
    small = HostSpec(name="small", transport=["x"], max_sessions=1)
    big = HostSpec(name="big", transport=["x"], max_sessions=3)
    endless = HostSpec(name="endless", transport=["x"])
    assert rank([small, big], {"small": 0, "big": 0}) == ([big, small], [])
    assert rank([small, big], {"small": 0, "big": 2}) == ([small, big], [])  # ties: fewer
    assert rank([small, big], {"small": 1, "big": 1}) == ([big], [small])
    assert rank([small, big], {"small": 1, "big": 3}) == ([], [small, big])
    assert rank([small, endless], {"small": 0, "endless": 9}) == ([endless, small], [])
    remote = RemoteHosts(nursery=None, hosts={"small": small, "big": big})  # type: ignore[arg-type]
    spec = AgentSpec(name="a", protocol="acp", command=["a"], hosts=("small", "big"))
    assert remote.candidates(spec, None) == [small, big]
    assert remote.candidates(spec, "small") == [small]
    with pytest.raises(BadRequest, match="may not run on"):
        remote.candidates(spec.with_options(hosts=("big",)), "small")
    with pytest.raises(BadRequest, match="unknown host"):
        remote.candidates(spec, "elsewhere")


def test_hello_and_spec_round_trip() -> None:
    hello = Hello(version="1.2.3", instance="abc", pid=7, token="t")
    assert Hello.parse(hello.line().strip()) == hello
    assert Hello.parse(b"Welcome to build1!") is None
    assert Hello.parse(json.dumps({"agent_supervisor_node": 1}).encode()) is None
    spec = (
        builtin_agents()["demo"]
        .with_args("--ignore-cancel")
        .with_options(grace_s=0.5, env={"A": "b"}, hosts=("b1",))
    )
    wire = spec_to_wire(spec)
    assert "hosts" not in wire
    assert spec_from_wire("demo", json.loads(json.dumps(wire))) == spec.with_options(hosts=())
    with pytest.raises(ValueError, match="agent spec 'x'"):
        spec_from_wire("x", {"protocol": "acp"})


@pytest.mark.parametrize(
    ("returncode", "stderr", "cause"),
    [
        (255, "Host key verification failed.\r\n", "host_key_mismatch"),
        (255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "host_key_mismatch"),
        (255, "agents@b1: Permission denied (publickey).", "auth_refused"),
        (127, "bash: line 1: agent-supervisor: command not found", "not_installed"),
        (1, "/usr/bin/python3: No module named supervisor", "not_installed"),
        (3, "agent-supervisor node: the node exited at start (1): boom", "node_failed"),
        (255, "ssh: connect to host b1 port 22: Connection refused", "transport_failed"),
    ],
)
def test_transport_failures_are_named(returncode: int, stderr: str, cause: str) -> None:
    error = classify_transport_failure("b1", returncode, stderr, ["ssh", "b1"])
    assert error.cause == cause, error
    assert str(error).startswith("host b1: ")


async def test_a_spec_or_a_host_limit_is_refused_by_a_gateway_that_is_not_a_node() -> None:
    from supervisor.client import GatewayError, connect

    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        url = await nursery.start(Gateway(sup, port=0).serve)
        async with connect(url) as client:
            with pytest.raises(GatewayError, match="'spec' is for nodes") as raised:
                await client.request(
                    "session.start", {"agent": "demo", "spec": spec_to_wire(sup.agents["demo"])}
                )
            assert raised.value.code == "bad_request"
            with pytest.raises(GatewayError, match="'max_sessions' is for nodes"):
                await client.request("session.start", {"agent": "demo", "max_sessions": 1})
            assert sup.list() == []
        nursery.cancel_scope.cancel()


async def test_a_node_of_another_wire_is_refused_naming_both(tmp_path: Path) -> None:
    """A real node that speaks another wire (the test variable, in its environment through
    the ``env`` transport): ``version_mismatch``, naming both versions and both wires."""
    hosts = {
        "h": HostSpec(
            name="h",
            transport=["env", f"{TEST_WIRE_VARIABLE}=99", f"{TEST_VERSION_VARIABLE}=9.9.9"],
            command=[sys.executable, "-m", "supervisor"],
            detach_s=1.0,
            state_dir=str(tmp_path / "node"),
        )
    }
    spec = builtin_agents()["demo"].with_options(hosts=("h",))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}, hosts=hosts) as sup:
            with pytest.raises(HostUnreachable) as raised:
                await sup.start_session("demo")
    assert raised.value.cause == "version_mismatch"
    message = str(raised.value)
    assert "9.9.9 (wire 99)" in message, message
    assert f"{package_version()} (wire {WIRE})" in message, message


def test_the_bridge_imports_only_the_standard_library(tmp_path: Path) -> None:
    """``node --bridge``, as a front runs it, with ``-X importtime``: no third-party module
    (the node it starts is another process, and imports the runtime there)."""
    import subprocess

    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "supervisor", "node", "--bridge"]
        + ["--detach", "1", "--state-dir", str(state)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=BOUND,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    hello = Hello.parse(done.stdout.splitlines()[0])
    assert hello is not None and hello.wire == WIRE
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in done.stderr.decode().splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "json" in imported and "supervisor" in imported  # (the output is what we think)
    heavy = imported & {"trio", "attrs", "cattrs", "psutil", "h11", "wsproto", "trio_websocket"}
    assert heavy == set(), heavy
    supervisor_modules = {
        line.split("|")[-1].strip()
        for line in done.stderr.decode().splitlines()
        if line.split("|")[-1].strip().startswith("supervisor")
    }
    assert supervisor_modules <= {
        "supervisor",
        "supervisor.__main__",
        "supervisor.remote",
        "supervisor.remote.version",
        "supervisor.node",
        "supervisor.node.bridge",
    }, supervisor_modules
    import psutil

    if psutil.pid_exists(hello.pid):
        _, alive = psutil.wait_procs([psutil.Process(hello.pid)], timeout=30)  # detach_s: 1
        assert alive == []


async def test_a_local_node_over_the_env_transport(tmp_path: Path) -> None:
    """The whole path (bridge, node daemon, WebSocket over stdio) with no SSH at all."""
    hosts = {"here": env_node(tmp_path / "node")}
    spec = builtin_agents()["demo"].with_args("--state-dir", str(tmp_path / "demo"))
    spec = spec.with_options(hosts=("here",))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}, hosts=hosts) as sup:
            session = await sup.start_session("demo", cwd=str(tmp_path))
            assert isinstance(session, RemoteSession) and session.id == "s1@here"
            # The node listens on a socket only its user can reach, and on no TCP port.
            import stat

            import psutil

            directory = tmp_path / "node" / "node"
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
            sock = directory / f"{session.link.instance}.sock"
            assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600
            node = psutil.Process(session.link.node_pid)
            assert [c for c in node.net_connections(kind="inet") if c.status == "LISTEN"] == []
            async with record(session) as recorder:
                turn = await session.prompt("hello words=400")
                await recorder.wait_kind("message.delta")
                receipt = await session.cancel()
                assert (receipt.outcome, receipt.host) == ("cancelled", "here")
                steer = await session.steer("and now this words=3")
                assert steer.mode == "started" and steer.turn_id != turn.id
                ended = await recorder.wait_kind("turn.ended", turn_id=steer.turn_id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
                recorder.check_invariants()
            node_pid = session.link.node_pid
            assert await sup.stop_session(session.id) is not None or session.state == "stopped"
            assert sup.list() == []
    # undriven for detach_s, the node exits
    import psutil

    assert node_pid is not None
    _, alive = psutil.wait_procs([psutil.Process(node_pid)], timeout=15)
    assert alive == []


def test_a_node_socket_deeper_than_a_socket_address_allows(tmp_path: Path) -> None:
    """A socket path longer than ``sun_path`` (107 bytes) is bound and reached by its base
    name from its directory; the working directory is as it was."""
    from supervisor.node.bridge import bind_unix, connect_unix

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "0123456789abcdef.sock"
    assert len(str(path)) > 107
    here = Path.cwd()
    server = bind_unix(path)
    try:
        client = connect_unix(path)
        accepted, _ = server.accept()
        client.sendall(b"ping")
        assert accepted.recv(4) == b"ping"
        client.close()
        accepted.close()
    finally:
        server.close()
    assert Path.cwd() == here


def test_a_dead_nodes_files_are_swept_but_never_a_live_or_young_ones(tmp_path: Path) -> None:
    """What a SIGKILLed node leaves (``I.lock``, ``I.json``, ``I.sock``): swept by the next
    node once nobody holds the lock, never a live node's (held lock), nor a lock file so young
    that its node may be about to lock it."""
    import os
    import time

    from supervisor.node.bridge import try_lock
    from supervisor.node.daemon import sweep_dead_nodes

    old = time.time() - 3600
    for instance in ("dead", "live", "young"):
        for suffix in (".lock", ".json", ".sock"):
            (tmp_path / f"{instance}{suffix}").write_bytes(b"")
    for instance in ("dead", "live"):
        os.utime(tmp_path / f"{instance}.lock", (old, old))
    (tmp_path / "daemon.lock").write_bytes(b"")
    os.utime(tmp_path / "daemon.lock", (old, old))
    live = try_lock(tmp_path / "live.lock")
    assert live is not None
    try:
        assert sweep_dead_nodes(tmp_path) == ["dead"]
    finally:
        live.close()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [
            "daemon.lock",
            *(f"{i}{s}" for i in ("live", "young") for s in (".lock", ".json", ".sock")),
        ]
    )


async def test_a_host_session_takes_content_and_modes_its_agent_offers(tmp_path: Path) -> None:
    """What the agent on the host takes (an image) and its modes reach the front through the
    node's subscribe answer; an image goes through as such, and a mode switches there."""
    from protocols.content import Part, parts_text

    hosts = {"here": env_node(tmp_path / "node")}
    spec = builtin_agents()["demo"].with_args(
        "--state-dir", str(tmp_path / "demo"), "--content", "--modes"
    )
    spec = spec.with_options(hosts=("here",))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}, hosts=hosts) as sup:
            session = await sup.start_session("demo", cwd=str(tmp_path))
            assert isinstance(session, RemoteSession)
            assert {"image", "resource"} <= session.prompt_carries
            assert session.modes is not None and session.modes["currentModeId"] == "ask"
            async with record(session) as recorder:
                parts = (
                    Part("text", text="look words=3 fast"),
                    Part("image", data="iVBORw0KGgo=", mime_type="image/png"),
                )
                turn = await session.prompt(parts_text(parts), parts)
                await recorder.wait_kind("turn.ended", turn_id=turn.id)
                said = "".join(
                    e.text
                    for e in recorder.of_kind("message.delta")
                    if isinstance(e, ev.MessageDelta) and e.turn_id == turn.id
                )
                assert said.startswith("received: image image/png 8 bytes")
                await session.set_mode("code")
                assert session.modes["currentModeId"] == "code"
                turn = await session.prompt("hi words=3 fast")
                await recorder.wait_kind("turn.ended", turn_id=turn.id)
                thought = "".join(
                    e.text
                    for e in recorder.of_kind("thought.delta")
                    if isinstance(e, ev.ThoughtDelta) and e.turn_id == turn.id
                )
                assert thought.startswith("Thinking about: [mode code] hi")
                recorder.check_invariants()
            await sup.stop_session(session.id)
