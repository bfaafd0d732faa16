"""``agent-supervisor serve`` as a sysadmin and an attacker meet it: a real process,
real loopback sockets, the demo agent, signals; on the real clock, every wait bounded."""

from __future__ import annotations

import os
import resource
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from served import (
    closed_by_peer,
    demo_command,
    raw_http,
    read_response,
    refusal,
    refused,
    serve,
    status_of,
    write_config,
)
from supervisor.agents import tree
from supervisor.client import GatewayError, connect

pytestmark = pytest.mark.real_process

BOUND = 30.0


def demo_config(tmp_path: Path, gateway: dict[str, Any] | None = None, **agents: Any) -> str:
    tables = {"demo": {"command": demo_command(tmp_path, "--delay", "0.02")}, **agents}
    return str(write_config(tmp_path, tables, gateway))


def head(port: int, method: str, path: str, *extra: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{port}", *extra]
    if (body or method == "POST") and not any(x.startswith("content-length") for x in extra):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def until_turn_ended(events: trio.MemoryReceiveChannel[dict[str, Any]]) -> dict[str, Any]:
    with trio.fail_after(BOUND):  # a session that never ends its turn fails, never hangs
        async for event in events:
            if event["event"] == "turn.ended":
                return event
    raise AssertionError("the connection closed before the turn ended")


# -- denial of service without the token ---------------------------------------------------------


async def test_a_head_without_its_body_or_the_token_is_refused_at_once_and_closed(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path) as served:
        # It promises a body and sends none: refused on its head, then closed.
        request = head(served.port, "POST", "/v1/sessions/s1/abort", "content-length: 10")
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(request)
        with trio.fail_after(BOUND):
            response = await closed_by_peer(stream)
        assert status_of(response) == 401 and b"connection: close" in response.lower()


async def test_a_refused_request_closes_its_keep_alive_connection(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        for path, extra in (("/v1/sessions", ()), ("/v1/sessions?token=wrong", ())):
            stream = await trio.open_tcp_stream("127.0.0.1", served.port)
            await stream.send_all(head(served.port, "GET", path, *extra))
            with trio.fail_after(BOUND):
                response = await closed_by_peer(stream)  # not held open for the next one
            assert status_of(response) == 401
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(
            head(served.port, "GET", f"/v1/sessions?token={served.token}", "origin: http://evil")
        )
        with trio.fail_after(BOUND):
            assert status_of(await closed_by_peer(stream)) == 403


async def test_a_request_whose_body_never_comes_is_closed_at_the_deadline(
    tmp_path: Path,
) -> None:
    config = demo_config(tmp_path, gateway={"request_timeout_s": 0.5})
    async with serve(tmp_path, "--config", config) as served:
        path = f"/v1/sessions/s1/abort?token={served.token}"
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(head(served.port, "POST", path, "content-length: 10"))
        with trio.fail_after(BOUND):
            assert await closed_by_peer(stream) == b""


async def test_a_slowloris_head_is_closed_at_the_deadline(tmp_path: Path) -> None:
    config = demo_config(tmp_path, gateway={"request_timeout_s": 0.5})
    async with serve(tmp_path, "--config", config) as served:
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)

        async def trickle() -> None:
            # A byte every 50 ms: each read is prompt, the head never ends.
            try:
                for byte in head(served.port, "GET", "/v1/sessions") * 100:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.05)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            with trio.fail_after(BOUND):
                assert await closed_by_peer(stream) == b""
            nursery.cancel_scope.cancel()


async def test_unauthenticated_connections_cannot_lock_clients_out(tmp_path: Path) -> None:
    config = demo_config(tmp_path, gateway={"max_connections": 4})
    async with serve(tmp_path, "--config", config) as served:
        async with connect(served.url) as first, connect(served.url) as second:
            # Ten connections that never show a token: each takes the place of an older one
            # of them, never of the clients.
            idle = []
            for _ in range(10):
                stream = await trio.open_tcp_stream("127.0.0.1", served.port)
                await stream.send_all(b"GET /v1/sessions HTTP/1.1\r\n")  # and no more
                idle.append(stream)
            async with connect(served.url) as third, connect(served.url) as fourth:
                for client in (first, second, third, fourth):
                    assert await client.sessions() == []
                # All four slots now serve clients: a fifth connection is turned away.
                response, _ = await raw_http(
                    served.port, head(served.port, "GET", f"/v1/sessions?token={served.token}")
                )
                assert status_of(response) == 503
                assert await first.sessions() == []
            for stream in idle:
                await stream.aclose()


# -- text that cannot be encoded ----------------------------------------------------------------


async def test_a_lone_surrogate_in_a_prompt_is_bad_request_and_the_session_untouched(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, "--config", demo_config(tmp_path)) as served:
        async with connect(served.url) as client:
            session_id = (await client.start_session("demo"))["session_id"]
            async with client.subscribe(session_id) as events:
                with pytest.raises(GatewayError) as refused_prompt:
                    await client.prompt(session_id, "broken paste \ud800 here")
                assert refused_prompt.value.code == "bad_request"
                assert "'text'" in refused_prompt.value.message
                [entry] = await client.sessions()
                assert entry["state"] == "ready" and entry["turn_id"] is None
                turn = await client.prompt(session_id, "hello words=3")
                started = []
                async for event in events:
                    if event["event"] == "turn.started":
                        started.append(event["data"]["turn_id"])
                    if event["event"] == "turn.ended":
                        break
                assert started == [turn["turn_id"]] == ["t1"]
                assert event["data"]["outcome"] == "completed"


async def test_a_non_utf8_cwd_is_bad_request_and_no_session_is_left(tmp_path: Path) -> None:
    directory = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(directory)
    async with serve(tmp_path, "--config", demo_config(tmp_path)) as served:
        async with connect(served.url) as client:
            with pytest.raises(GatewayError) as refused_start:
                await client.start_session("demo", cwd=os.fsdecode(directory))
            assert refused_start.value.code == "bad_request"
            assert await client.sessions() == []
            assert (await client.start_session("demo", cwd=str(tmp_path)))["state"] == "ready"


# -- limits --------------------------------------------------------------------------------------


async def test_max_sessions_of_the_gateway_and_of_an_agent_answer_capacity(
    tmp_path: Path,
) -> None:
    solo = {"command": demo_command(tmp_path), "max_sessions": 1}
    config = demo_config(tmp_path, gateway={"max_sessions": 2}, solo=solo)
    async with serve(tmp_path, "--config", config) as served:
        assert "max_sessions 2" in served.stderr
        async with connect(served.url) as client:
            first = (await client.start_session("solo"))["session_id"]
            with pytest.raises(GatewayError) as agent_full:
                await client.start_session("solo")
            assert agent_full.value.code == "capacity" and "'solo'" in agent_full.value.message
            await client.start_session("demo")
            with pytest.raises(GatewayError) as gateway_full:
                await client.start_session("demo")
            assert gateway_full.value.code == "capacity"
            await client.stop(first)
            await client.start_session("solo")
            states = {s["session_id"]: s["state"] for s in await client.sessions()}
            assert states.pop(first) == "stopped"  # (stored: a prompt would start it again)
            assert len(states) == 2 and "stopped" not in states.values()


async def test_the_max_sessions_flag_wins_over_the_config(tmp_path: Path) -> None:
    config = demo_config(tmp_path, gateway={"max_sessions": 5})
    async with serve(tmp_path, "--config", config, "--max-sessions", "1") as served:
        async with connect(served.url) as client:
            await client.start_session("demo")
            with pytest.raises(GatewayError) as full:
                await client.start_session("demo")
            assert full.value.code == "capacity"


def _low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def open_files_limits(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open files limit")


async def test_serve_raises_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.fail(f"the hard open files limit here is {hard}: nothing to raise it to")
    async with serve(tmp_path, preexec_fn=_low_soft_limit) as served:
        soft_now, hard_now = open_files_limits(served.process.pid)
        assert soft_now == hard_now != "256"
        assert "(was 256)" in served.stderr


async def test_spawn_errors_carry_their_cause(tmp_path: Path) -> None:
    not_executable = tmp_path / "agent.sh"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    config = demo_config(
        tmp_path,
        missing={"command": [str(tmp_path / "no-such-agent")]},
        forbidden={"command": [str(not_executable)]},
    )
    async with serve(tmp_path, "--config", config) as served:
        async with connect(served.url) as client:
            for agent, cause in (("missing", "ENOENT"), ("forbidden", "EACCES")):
                with pytest.raises(GatewayError) as failed:
                    await client.start_session(agent)
                assert cause in failed.value.message, failed.value.message


def _few_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FEW_FILES, FEW_FILES))


#: Enough for serve and a client connection, not for many agents (each takes a few pipes).
FEW_FILES = 64


async def test_running_out_of_file_descriptors_is_named_emfile(tmp_path: Path) -> None:
    config = demo_config(tmp_path)
    # (The default max_sessions, from the file limit, would stop it at 4 first.)
    async with serve(
        tmp_path, "--config", config, "--max-sessions", "1000", preexec_fn=_few_files
    ) as served:
        async with connect(served.url) as client:
            message = None
            for _ in range(FEW_FILES):
                try:
                    await client.start_session("demo")
                except GatewayError as exc:
                    message = exc.message
                    break
            assert message is not None and "EMFILE" in message, message


# -- the token -----------------------------------------------------------------------------------


async def http_status(served: Any, token: str) -> int:
    response, stream = await raw_http(
        served.port, head(served.port, "GET", f"/v1/sessions?token={token}")
    )
    await stream.aclose()
    return status_of(response)


async def test_the_token_may_come_from_the_environment(tmp_path: Path) -> None:
    async with serve(tmp_path, env={"AGENT_SUPERVISOR_TOKEN": "from-the-env"}) as served:
        assert served.token == "from-the-env"
        assert await http_status(served, "from-the-env") == 200
        assert await http_status(served, "other") == 401
        assert "--token is visible" not in served.stderr


async def test_the_token_may_come_from_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    token_file.chmod(0o600)
    async with serve(tmp_path, "--token-file", str(token_file)) as served:
        assert served.token == "from-a-file"
        assert await http_status(served, "from-a-file") == 200
    token_file.chmod(0o640)
    code, stdout, stderr = await refused(tmp_path, "--token-file", str(token_file))
    assert (code, stdout) == (2, "")
    line = refusal(stderr)
    assert "group or others" in line and "chmod 600" in line


async def test_a_token_on_the_command_line_works_with_a_warning(tmp_path: Path) -> None:
    async with serve(tmp_path, "--token", "visible") as served:
        assert await http_status(served, "visible") == 200
        assert "--token is visible to every local user" in served.stderr


# -- what no browser sends ------------------------------------------------------------------------


async def test_a_request_with_two_origins_is_refused_whichever_comes_last(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        path = f"/v1/sessions?token={served.token}"
        own, other = f"origin: http://127.0.0.1:{served.port}", "origin: http://evil.example"
        for origins, expected in (((own,), 200), ((other, own), 403), ((own, other), 403)):
            stream = await trio.open_tcp_stream("127.0.0.1", served.port)
            await stream.send_all(head(served.port, "GET", path, *origins))
            with trio.fail_after(BOUND):
                response = await read_response(stream)
            await stream.aclose()
            assert status_of(response) == expected, (origins, response)


async def test_a_request_with_two_hosts_is_400_whichever_is_allowed(tmp_path: Path) -> None:
    """RFC 9112 section 3.2: more than one Host is a bad request, even when both are ours."""
    async with serve(tmp_path) as served:
        path = f"/v1/sessions?token={served.token}"
        own, other = f"host: 127.0.0.1:{served.port}", "host: evil.example"
        for hosts, expected in (((), 200), ((other,), 400), ((own,), 400)):
            stream = await trio.open_tcp_stream("127.0.0.1", served.port)
            await stream.send_all(head(served.port, "GET", path, *hosts))
            with trio.fail_after(BOUND):
                response = await read_response(stream)
            await stream.aclose()
            assert status_of(response) == expected, (hosts, response)


async def test_an_http_version_other_than_1_0_or_1_1_is_505(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        for version, expected in (("1.1", 200), ("1.0", 200), ("9.9", 505), ("2.0", 505)):
            request = (
                f"GET /v1/sessions?token={served.token} HTTP/{version}\r\n"
                f"host: 127.0.0.1:{served.port}\r\n\r\n"
            )
            stream = await trio.open_tcp_stream("127.0.0.1", served.port)
            await stream.send_all(request.encode())
            with trio.fail_after(BOUND):
                response = await read_response(stream)
                assert status_of(response) == expected, (version, response)
                if expected == 505:
                    assert await closed_by_peer(stream) == b""  # and nothing more is read
            await stream.aclose()


def upgrade(port: int, token: str, version: str) -> bytes:
    return head(
        port,
        "GET",
        f"/ws?token={token}",
        "upgrade: websocket",
        "connection: Upgrade",
        "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
        f"sec-websocket-version: {version}",
    )


async def test_another_websocket_version_is_426_naming_13(tmp_path: Path) -> None:
    """RFC 6455 section 4.4: a version the server does not speak is answered 426 Upgrade
    Required with the versions it does; the connection closes."""
    async with serve(tmp_path) as served:
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(upgrade(served.port, served.token, "8"))
        with trio.fail_after(BOUND):
            response = await closed_by_peer(stream)
        assert status_of(response) == 426, response
        assert b"sec-websocket-version: 13\r\n" in response.lower()
        assert b"unsupported WebSocket version" in response
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(upgrade(served.port, served.token, "13"))
        with trio.fail_after(BOUND):
            assert status_of(await read_response(stream)) == 101
        await stream.aclose()


# -- beyond loopback -----------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost", "agents.example")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return ca, cert, key


async def test_tls_serves_https_and_wss(
    tmp_path: Path, certificate: tuple[trustme.CA, Path, Path]
) -> None:
    import ssl

    ca, cert, key = certificate
    async with serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key)) as served:
        assert served.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context()
        ca.configure_trust(context)
        async with connect(served.url, ssl_context=context) as client:
            assert await client.sessions() == []
        stream = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", served.port, ssl_context=context, https_compatible=True
        )
        await stream.send_all(head(served.port, "GET", f"/v1/sessions?token={served.token}"))
        with trio.fail_after(BOUND):
            assert status_of(await read_response(stream)) == 200
        await stream.aclose()
        # Plain HTTP gets no answer from a TLS port.
        plain = await trio.open_tcp_stream("127.0.0.1", served.port)
        await plain.send_all(head(served.port, "GET", f"/v1/sessions?token={served.token}"))
        with trio.fail_after(BOUND):
            assert b"HTTP/1.1" not in await closed_by_peer(plain)


async def test_allow_host_admits_another_name(tmp_path: Path) -> None:
    async with serve(tmp_path, "--allow-host", "agents.example") as served:
        path = f"/v1/sessions?token={served.token}"
        for host, expected in ((f"agents.example:{served.port}", 200), ("other.example", 403)):
            request = f"GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
            response, stream = await raw_http(served.port, request)
            await stream.aclose()
            assert status_of(response) == expected, host


async def test_a_non_loopback_bind_without_tls_is_refused(tmp_path: Path) -> None:
    code, stdout, stderr = await refused(tmp_path, "--host", "0.0.0.0")
    assert (code, stdout) == (2, "")
    line = refusal(stderr)
    assert "refusing to bind 0.0.0.0 without TLS" in line and "--insecure" in line


async def test_a_taken_port_is_one_line_naming_it_and_how_to_choose_another(
    tmp_path: Path,
) -> None:
    [holder] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = holder.socket.getsockname()[1]
    async with holder:
        code, stdout, stderr = await refused(tmp_path, "--port", str(port))
    assert (code, stdout) == (2, "")
    assert "Traceback" not in stderr
    line = stderr.splitlines()[-1]
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line
    assert "--port N (0 picks a free one)" in line


# -- lows ----------------------------------------------------------------------------------------


async def test_a_deeply_nested_abort_body_is_a_clean_400(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        body = b"[" * 30_000 + b"]" * 30_000
        path = f"/v1/sessions/s1/abort?token={served.token}"
        response, stream = await raw_http(served.port, head(served.port, "POST", path, body=body))
        assert status_of(response) == 400 and b"bad_request" in response
        # The connection is still usable.
        await stream.send_all(head(served.port, "GET", f"/v1/sessions?token={served.token}"))
        with trio.fail_after(BOUND):
            assert status_of(await read_response(stream)) == 200
        await stream.aclose()
        assert "Traceback" not in served.stderr


async def test_the_frame_limit_counts_bytes(tmp_path: Path) -> None:
    async with serve(tmp_path, "--config", demo_config(tmp_path)) as served:
        async with connect(served.url) as client:
            session_id = (await client.start_session("demo"))["session_id"]
            # 300,000 characters of 4 bytes each: 1.2 MB, over the 1 MiB limit.
            with pytest.raises(GatewayError) as too_large, trio.fail_after(BOUND):
                await client.prompt(session_id, "\U0001f600" * 300_000)
            assert too_large.value.code == "too_large"
            assert (await client.sessions())[0]["turn_id"] is None


async def test_an_unusable_state_dir_is_one_line_and_serve_runs_on(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"AGENT_SUPERVISOR_STATE_DIR": str(blocker / "state")}
    async with serve(tmp_path, "--config", demo_config(tmp_path), env=env) as served:
        async with connect(served.url) as client:
            session_id = (await client.start_session("demo"))["session_id"]
            async with client.subscribe(session_id) as events:
                await client.prompt(session_id, "hello words=2")
                assert (await until_turn_ended(events))["data"]["outcome"] == "completed"
        [line] = [line for line in served.stderr.splitlines() if "state directory" in line]
        assert "running without crash safety" in line
        assert "Traceback" not in served.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_signal_shuts_down_gracefully(tmp_path: Path, signum: signal.Signals) -> None:
    async with serve(tmp_path, "--config", demo_config(tmp_path)) as served:
        async with connect(served.url) as client:
            session_id = (await client.start_session("demo"))["session_id"]
            async with client.subscribe(session_id) as events:
                await client.prompt(session_id, "a long one words=5000")
                async for event in events:
                    if event["event"] == "message.delta":
                        break
                trees = served.trees()
                assert trees
                served.signal(signum)
                ended = await until_turn_ended(events)
        # The turn was stopped through the ladder (the demo agent honours the interrupt).
        assert ended["data"]["outcome"] == "cancelled"
        assert ended["data"]["receipt"]["reason"] == "shutdown"
        assert await served.wait_exit() == 0
    assert "Traceback" not in served.stderr
    assert list(served.state_dir.glob("supervisor-*.json")) == []
    for record in trees:
        assert not tree.running(record["pid"], record["started"])
        assert tree.marked(record["mark"]) == []


async def test_a_second_signal_kills_the_agents_at_once(tmp_path: Path) -> None:
    # It ignores the interrupt, and its grace is far longer than this test may take.
    stubborn = {"command": demo_command(tmp_path, "--ignore-cancel"), "grace_s": 600}
    async with serve(tmp_path, "--config", demo_config(tmp_path, stubborn=stubborn)) as served:
        async with connect(served.url) as client:
            session_id = (await client.start_session("stubborn"))["session_id"]
            async with client.subscribe(session_id) as events:
                await client.prompt(session_id, "a long one words=5000")
                async for event in events:
                    if event["event"] == "message.delta":
                        break
                trees = served.trees()
                served.signal(signal.SIGTERM)
                async for event in events:
                    if event["event"] == "session.state" and event["data"]["state"] == "cancelling":
                        break
                served.signal(signal.SIGTERM)
                assert await served.wait_exit() == 1
    assert "killing every agent now" in served.stderr
    assert "Traceback" not in served.stderr
    assert list(served.state_dir.glob("supervisor-*.json")) == []
    for record in trees:
        assert not tree.running(record["pid"], record["started"])
        assert tree.marked(record["mark"]) == []


async def test_serve_does_not_import_httpx(tmp_path: Path) -> None:
    # Only OpenCode's link needs httpx (~35 ms of serve's start): imported when one starts.
    check = (
        "import sys, supervisor.cli, supervisor.gateway, supervisor.supervisor;"
        " sys.exit('httpx' in sys.modules)"
    )
    with trio.fail_after(BOUND):
        done = await trio.run_process([sys.executable, "-c", check], check=False)
    assert done.returncode == 0


def test_token_file_check_reads_the_mode_bits(tmp_path: Path) -> None:
    from supervisor.cli import read_token_file
    from supervisor.config import ConfigError

    path = tmp_path / "token"
    path.write_text("t0k3n")
    for mode in (0o600, 0o400):
        path.chmod(mode)
        assert read_token_file(str(path)) == "t0k3n"
    for mode in (0o604, 0o660, 0o644, 0o602):
        path.chmod(mode)
        with pytest.raises(ConfigError, match=f"mode {stat.S_IMODE(mode):04o}"):
            read_token_file(str(path))


async def test_a_prompt_reads_no_boot_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each turn notes when it started, on the clock of /proc's process start times (to tell
    its tools from the agent's own): that needs no ``psutil.boot_time()``, a file read."""
    import psutil

    from helpers import running
    from supervisor import AgentSpec
    from supervisor.agents.process import _started_at, tree_clock
    from supervisor.testing._acp import AcpBehaviour, AcpLauncher

    def boot_time() -> float:
        raise AssertionError("psutil.boot_time() was read")

    monkeypatch.setattr(psutil, "boot_time", boot_time)
    me = _started_at(psutil.Process())
    assert me is not None and 0 < me <= tree_clock()
    spec = AgentSpec(name="fake", protocol="acp", command=["fake"])
    async with running(AcpLauncher(AcpBehaviour(words=2, word_interval=0.001)), spec) as (
        session,
        _,
        recorder,
    ):
        turn = await session.prompt("hello")
        with trio.fail_after(BOUND):
            await recorder.wait_kind("turn.ended", turn_id=turn.id)


def test_serve_options_refuse_and_warn() -> None:
    from supervisor.cli import _parser, serve_options
    from supervisor.config import ConfigError

    def options(*args: str) -> Any:
        return serve_options(_parser().parse_args(["serve", *args]))

    warned = options("--host", "0.0.0.0", "--insecure")
    assert any("without TLS (--insecure)" in w for w in warned.warnings)
    assert options("--host", "127.0.0.1", "--insecure").warnings == ()
    for args, reason in (
        (("--token", "a", "--token-file", "f"), "not both"),
        (("--tls-cert", "c.pem"), "together"),
        (("--allow-host", "evil.example/x"), "a host name"),
        (("--max-sessions", "0"), ">= 1"),
        (("--token", "two words"), "without spaces"),
    ):
        with pytest.raises(ConfigError, match=reason):
            options(*args)


def test_a_non_loopback_bind_with_tls_needs_no_insecure(
    certificate: tuple[trustme.CA, Path, Path],
) -> None:
    from supervisor.cli import _parser, serve_options

    _, cert, key = certificate
    args = ["serve", "--host", "0.0.0.0", "--tls-cert", str(cert), "--tls-key", str(key)]
    options = serve_options(_parser().parse_args(args))
    assert options.ssl_context is not None and options.warnings == ()
