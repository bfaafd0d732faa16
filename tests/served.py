"""A real ``agent-supervisor serve`` in a process of its own, for tests that attack it over
loopback sockets, send it signals and read what it printed.

``serve(tmp_path, *args)`` starts it with its own state directory and waits (bounded) for the
``ready`` line; leaving the block stops it (SIGTERM, which is graceful now, then SIGKILL of its
process group if it does not go). ``refused(tmp_path, *args)`` runs one that must not start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trio
from attrs import define

from supervisor.client import GatewayClient

ROOT = Path(__file__).resolve().parent.parent
#: Generous: a loaded 2-core machine starts ``serve`` in well under a second.
START_S = 30.0
#: For a graceful stop: the longest grace in these tests' configs is 1 s, plus the ladder.
EXIT_S = 30.0


def demo_command(tmp_path: Path, *args: str) -> list[str]:
    state = tmp_path / "demo-state"
    return [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", str(state), *args]


def write_config(
    tmp_path: Path,
    agents: Mapping[str, Mapping[str, Any]],
    gateway: Mapping[str, Any] | None = None,
) -> Path:
    """A TOML config: ``agents`` tables (``protocol`` defaults to acp) and ``[gateway]``."""
    lines: list[str] = []
    for name, table in agents.items():
        lines.append(f"[agents.{name}]")
        for key, value in {"protocol": "acp", **table}.items():
            lines.append(f"{key} = {json.dumps(value)}")
    if gateway:
        lines.append("[gateway]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in gateway.items()]
    path = tmp_path / "agents.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@define
class Served:
    process: trio.Process
    url: str
    stderr_path: Path
    state_dir: Path

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    @property
    def token(self) -> str:
        return parse_qs(urlsplit(self.url).query)["token"][0]

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def wait_exit(self) -> int:
        with trio.fail_after(EXIT_S):
            return await self.process.wait()

    def trees(self) -> list[dict[str, Any]]:
        """The agent trees its state file lists now."""
        [path] = self.state_dir.glob("supervisor-*.json")
        trees: list[dict[str, Any]] = json.loads(path.read_text())["trees"]
        return trees


def _env(tmp_path: Path, env: Mapping[str, str] | None) -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop("AGENT_SUPERVISOR_TOKEN", None)
    environment["AGENT_SUPERVISOR_STATE_DIR"] = str(tmp_path / "supervisor-state")
    environment.update(env or {})
    return environment


@asynccontextmanager
async def serve(
    tmp_path: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> AsyncIterator[Served]:
    environment = _env(tmp_path, env)
    stderr_path = tmp_path / f"serve-{len(list(tmp_path.glob('serve-*.err')))}.err"
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "supervisor.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=environment,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
    try:
        assert process.stdout is not None
        output = b""
        with trio.fail_after(START_S):
            while (match := re.search(rb"ready (\S+)\n", output)) is None:
                data = await process.stdout.receive_some(4096)
                assert data, f"serve exited: {output!r} {stderr_path.read_text()!r}"
                output += data
        yield Served(
            process,
            match.group(1).decode(),
            stderr_path,
            Path(environment["AGENT_SUPERVISOR_STATE_DIR"]),
        )
    finally:
        with trio.CancelScope(shield=True):
            for signum in (signal.SIGTERM, signal.SIGKILL):
                if process.returncode is not None:
                    break
                try:
                    os.killpg(process.pid, signum)
                except ProcessLookupError:
                    break
                with trio.move_on_after(EXIT_S):
                    await process.wait()


async def refused(
    tmp_path: Path, *args: str, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """Run a ``serve`` that must refuse to start: (exit code, stdout, stderr)."""
    with trio.fail_after(START_S):
        done = await trio.run_process(
            [sys.executable, "-m", "supervisor.cli", "serve", "--port", "0", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=_env(tmp_path, env),
            cwd=ROOT,
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def refusal(stderr: str) -> str:
    """The one line a refused ``serve`` wrote: its reason, no traceback. Containment detection
    starts early, in a thread, and may first report the cgroups it swept of supervisors that
    are gone (another test's, say): that line, and only that one, may come before."""
    *before, line = stderr.splitlines()
    assert all("cgroup(s) of supervisors that are gone" in other for other in before), stderr
    return line


async def raw_http(
    port: int, request: bytes, *, host: str = "127.0.0.1"
) -> tuple[bytes, trio.SocketStream]:
    """Send raw bytes; return what came back until the server closed or went quiet after a
    whole response, and the stream (open, for keep-alive checks)."""
    stream = await trio.open_tcp_stream(host, port)
    await stream.send_all(request)
    return await read_response(stream), stream


async def read_response(stream: trio.abc.Stream) -> bytes:
    """One HTTP response (head and content-length body), or what came before EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    want = int(length.group(1)) if length else 0
    while len(body) < want:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


async def closed_by_peer(stream: trio.abc.Stream) -> bytes:
    """Everything until the server closes the connection (the caller bounds the wait)."""
    data = b""
    try:
        while chunk := await stream.receive_some(65536):
            data += chunk
    except trio.BrokenResourceError:  # a reset is a close too
        pass
    return data


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def check_replay(history: list[dict[str, Any]], seen: dict[int, dict[str, Any]]) -> None:
    """``history`` (a replay from seq 0) accounts for every event of ``seen`` (what a client
    got), each seq meaning one event."""
    seqs = [e["seq"] for e in history]
    assert seqs == sorted(set(seqs)), "seqs strictly increase"
    gone: list[tuple[int, int]] = []
    previous = 0
    for event in history:
        if event["event"] == "stream.gap":
            data = event["data"]
            assert data["from_seq"] == previous + 1 and data["to_seq"] == event["seq"]
            gone.append((data["from_seq"], data["to_seq"]))
        else:
            assert event["seq"] == previous + 1, f"a silent jump to {event['seq']}"
        previous = event["seq"]
    stored = {e["seq"]: e for e in history}
    for seq, event in seen.items():
        if any(low <= seq <= high for low, high in gone):
            continue
        assert seq in stored, f"seq {seq} the client saw is neither stored nor in a gap"
        assert json.dumps(stored[seq], sort_keys=True) == json.dumps(event, sort_keys=True)


async def whole_history(client: GatewayClient, session_id: str) -> list[dict[str, Any]]:
    """Every event replayed from seq 1 (the session is stopped: the replay ends)."""
    got: list[dict[str, Any]] = []
    async with client.subscribe(session_id, since_seq=0) as events:
        async for event in events:
            if event["event"].startswith("subscription."):
                break
            got.append(event)
    return got


async def read_deltas(
    events: trio.MemoryReceiveChannel[dict[str, Any]], count: int
) -> list[dict[str, Any]]:
    """The events of ``events`` up to its ``count``-th ``message.delta``: a point in the middle
    of a turn's stream."""
    got: list[dict[str, Any]] = []
    deltas = 0
    async for event in events:
        got.append(event)
        deltas += event["event"] == "message.delta"
        if deltas == count:
            break
    return got
