"""Real-process tests of the built-in demo ACP agent (real clock, no mocks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from paths import REPO

pytestmark = pytest.mark.real_process

TIMEOUT = 10.0

Message = dict[str, Any]


class AgentProc:
    """A running demo agent with a tiny JSON-lines client around its stdio."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = bytearray()
        self.scanned = 0
        self.next_id = 100

    async def send_raw(self, data: bytes) -> None:
        """Write raw bytes to the agent's stdin."""
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(data)

    async def send(self, message: Message) -> None:
        """Write one JSON-RPC message (adds "jsonrpc")."""
        await self.send_raw(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def notify(self, method: str, params: Message) -> None:
        """Send a notification."""
        await self.send({"method": method, "params": params})

    async def request(self, method: str, params: Message) -> int:
        """Send a request and return its id."""
        request_id = self.next_id
        self.next_id += 1
        await self.send({"id": request_id, "method": method, "params": params})
        return request_id

    async def close_stdin(self) -> None:
        """Close the agent's stdin (EOF)."""
        assert self.proc.stdin is not None
        await self.proc.stdin.aclose()

    async def read_line(self) -> bytes | None:
        """Return the next stdout line without its newline, or None at EOF."""
        assert self.proc.stdout is not None
        while True:
            newline = self.buffer.find(b"\n", self.scanned)
            if newline >= 0:
                line = bytes(self.buffer[:newline])
                del self.buffer[: newline + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buffer)
            data = await self.proc.stdout.receive_some(1 << 20)
            if not data:
                return None
            self.buffer += data

    async def read_msg(self) -> Message:
        """Return the next stdout line parsed as a JSON-RPC message."""
        line = await self.read_line()
        assert line is not None, "agent closed stdout"
        message = json.loads(line)
        assert isinstance(message, dict)
        assert message["jsonrpc"] == "2.0"
        return message

    async def until_response(self, request_id: int) -> tuple[list[Message], Message]:
        """Read messages up to the answer to request_id; return (others, answer)."""
        others: list[Message] = []
        while True:
            message = await self.read_msg()
            if message.get("id") == request_id and "method" not in message:
                return others, message
            others.append(message)

    async def call(self, method: str, params: Message) -> tuple[list[Message], Message]:
        """Send a request and read up to its answer."""
        return await self.until_response(await self.request(method, params))

    async def initialize(self) -> Message:
        """Run the initialize handshake and return its result."""
        _, answer = await self.call(
            "initialize",
            {
                "protocolVersion": 1,
                "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}},
                "clientInfo": {"name": "test", "version": "0"},
            },
        )
        result = answer["result"]
        assert isinstance(result, dict)
        return result

    async def new_session(self, cwd: Path = REPO) -> str:
        """Create a session and return its id."""
        _, answer = await self.call("session/new", {"cwd": str(cwd), "mcpServers": []})
        session_id = answer["result"]["sessionId"]
        assert isinstance(session_id, str)
        return session_id

    async def prompt(self, session_id: str, text: str) -> int:
        """Start a prompt turn and return the request id."""
        return await self.request(
            "session/prompt",
            {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
        )

    async def next_update(self, kind: str) -> Message:
        """Read messages until a session/update of the given kind; return the update."""
        while True:
            message = await self.read_msg()
            if message.get("method") == "session/update":
                update = message["params"]["update"]
                assert isinstance(update, dict)
                if update["sessionUpdate"] == kind:
                    return update
            else:
                raise AssertionError(f"unexpected message while waiting for {kind}: {message}")


Spawn = Callable[..., Awaitable[AgentProc]]


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Spawn]:
    """Start demo agents (same state dir) and kill them all at the end."""
    procs: list[trio.Process] = []

    async def start(*args: str, stderr: int | None = None) -> AgentProc:
        proc = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "supervisor.demo_agent",
                "--delay",
                "0.01",
                "--state-dir",
                str(tmp_path / "state"),
                *args,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=str(REPO),
        )
        procs.append(proc)
        return AgentProc(proc)

    try:
        yield start
    finally:
        with trio.CancelScope(shield=True):
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        await stream.aclose()


def text_of(update: Message) -> str:
    content = update["content"]
    assert content["type"] == "text"
    text = content["text"]
    assert isinstance(text, str)
    return text


def chunks(messages: list[Message], kind: str = "agent_message_chunk") -> list[str]:
    """The texts of the session/update chunks of one kind."""
    return [
        text_of(m["params"]["update"])
        for m in messages
        if m.get("method") == "session/update" and m["params"]["update"]["sessionUpdate"] == kind
    ]


async def test_initialize_and_new_session(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn()
        result = await agent.initialize()
        assert result == {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": False},
                "mcpCapabilities": {"http": False, "sse": False},
            },
            "agentInfo": {"name": "demo-agent", "version": "0.1"},
            "authMethods": [],
            "_meta": {"steering": {"supported": True}},
        }
        _, answer = await agent.call("initialize", {"protocolVersion": 99})
        assert answer["result"]["protocolVersion"] == 1
        session_id = await agent.new_session()
        assert session_id.startswith("demo-")
        assert session_id != await agent.new_session()


async def test_prompt_streams_and_ends_turn(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "7")
        await agent.initialize()
        sid = await agent.new_session()
        updates, answer = await agent.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
        )
        assert answer["result"] == {"stopReason": "end_turn"}
        assert all(m["method"] == "session/update" for m in updates)
        assert all(m["params"]["sessionId"] == sid for m in updates)
        assert chunks(updates, "agent_thought_chunk") == ["Thinking about: hi"]
        words = chunks(updates)
        assert len(words) == 7
        assert all(w.endswith(" ") and len(w.split()) == 1 for w in words)
        assert "".join(words).startswith("Hello! I am the demo agent")
        plans = [
            m["params"]["update"]["entries"]
            for m in updates
            if m["params"]["update"]["sessionUpdate"] == "plan"
        ]
        assert [e["status"] for e in plans[0]] == ["completed", "in_progress"]
        assert [e["status"] for e in plans[-1]] == ["completed", "completed"]  # a turn done


async def test_inline_overrides_and_flood(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--delay", "5")
        await agent.initialize()
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "please flood words=2000")
        updates, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        assert len(chunks(updates)) == 2000
        rid = await agent.prompt(sid, "words=3 delay=0")
        updates, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        assert len(chunks(updates)) == 3


async def test_cancel_mid_stream(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "100000")
        await agent.initialize()
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "go")
        for _ in range(3):
            await agent.next_update("agent_message_chunk")
        await agent.notify("session/cancel", {"sessionId": sid})
        late, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
        assert all(m["method"] == "session/update" for m in late)
        # Nothing from the old turn comes after its answer: the next line on
        # stdout is the answer to the next request.
        probe = await agent.request("session/new", {"cwd": "/", "mcpServers": []})
        message = await agent.read_msg()
        assert message["id"] == probe and "result" in message
        # Cancel while idle is ignored; the session still works.
        await agent.notify("session/cancel", {"sessionId": sid})
        rid = await agent.prompt(sid, "words=2")
        _, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}


async def test_stop_delay_keeps_streaming_then_cancels(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "100000", "--stop-delay", "0.3")
        await agent.initialize()
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "go")
        await agent.next_update("agent_message_chunk")
        await agent.notify("session/cancel", {"sessionId": sid})
        late, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
        assert len(chunks(late)) >= 3


async def test_ignore_cancel_runs_to_end_turn(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "20", "--ignore-cancel")
        await agent.initialize()
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "go")
        await agent.next_update("agent_message_chunk")
        await agent.notify("session/cancel", {"sessionId": sid})
        rest, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        assert len(chunks(rest)) == 19


async def test_ignore_cancel_directive_is_per_turn(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "15")
        await agent.initialize()
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "ignore-cancel")
        await agent.next_update("agent_message_chunk")
        await agent.notify("session/cancel", {"sessionId": sid})
        _, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        rid = await agent.prompt(sid, "words=100000")
        await agent.next_update("agent_message_chunk")
        await agent.notify("session/cancel", {"sessionId": sid})
        _, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}


async def start_permission_turn(agent: AgentProc, sid: str) -> tuple[int, Message]:
    """Start a permission turn; return (prompt id, permission request)."""
    rid = await agent.prompt(sid, "permission words=3")
    tool_call = await agent.next_update("tool_call")
    assert tool_call["toolCallId"].startswith("call_")
    assert tool_call["title"] == "Run `echo hello`"
    assert tool_call["kind"] == "execute"
    assert tool_call["status"] == "pending"
    request = await agent.read_msg()
    assert request["method"] == "session/request_permission"
    params = request["params"]
    assert params["sessionId"] == sid
    assert params["toolCall"]["toolCallId"] == tool_call["toolCallId"]
    assert [(o["optionId"], o["kind"]) for o in params["options"]] == [
        ("allow-once", "allow_once"),
        ("reject-once", "reject_once"),
    ]
    return rid, request


async def test_permission_allow_reject_cancelled(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn()
        await agent.initialize()
        sid = await agent.new_session()

        rid, request = await start_permission_turn(agent, sid)
        assert request["id"] == 0
        await agent.send(
            {"id": 0, "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}}
        )
        updates, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        tool_update = updates[0]["params"]["update"]
        assert tool_update["sessionUpdate"] == "tool_call_update"
        assert tool_update["status"] == "completed"
        assert len(chunks(updates)) == 3

        rid, request = await start_permission_turn(agent, sid)
        assert request["id"] == 1
        await agent.send(
            {"id": 1, "result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}}
        )
        updates, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        assert updates[0]["params"]["update"]["status"] == "failed"
        assert len(chunks(updates)) == 3

        rid, request = await start_permission_turn(agent, sid)
        await agent.send({"id": request["id"], "result": {"outcome": {"outcome": "cancelled"}}})
        updates, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
        assert chunks(updates) == []


async def test_cancel_waits_for_permission_answer(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn()
        await agent.initialize()
        sid = await agent.new_session()
        rid, request = await start_permission_turn(agent, sid)
        await agent.notify("session/cancel", {"sessionId": sid})
        # Like Gemini, the turn stays blocked until the permission is answered.
        with trio.move_on_after(0.3) as blocked:
            await agent.read_msg()
        assert blocked.cancelled_caught
        await agent.send(
            {
                "id": request["id"],
                "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}},
            }
        )
        updates, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
        assert chunks(updates) == []


async def test_permission_watches_cancel(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--permission-watches-cancel")
        await agent.initialize()
        sid = await agent.new_session()
        rid, request = await start_permission_turn(agent, sid)
        await agent.notify("session/cancel", {"sessionId": sid})
        others, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
        assert {
            "jsonrpc": "2.0",
            "method": "$/cancel_request",
            "params": {"requestId": 0},
        } in others
        # A late answer to the abandoned request is ignored.
        await agent.send({"id": request["id"], "result": {"outcome": {"outcome": "cancelled"}}})
        rid = await agent.prompt(sid, "words=1")
        _, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}


async def test_session_load_after_restart(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        first = await spawn("--words", "4")
        await first.initialize()
        sid = await first.new_session()
        rid = await first.prompt(sid, "first question")
        updates, _ = await first.until_response(rid)
        reply = "".join(chunks(updates))
        first.proc.kill()
        await first.proc.wait()

        second = await spawn()
        await second.initialize()
        replay, answer = await second.call(
            "session/load", {"sessionId": sid, "cwd": str(REPO), "mcpServers": []}
        )
        assert answer["result"] == {}
        assert [m["params"]["update"] for m in replay] == [
            {
                "sessionUpdate": "user_message_chunk",
                "content": {"type": "text", "text": "first question"},
            },
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": reply}},
        ]
        rid = await second.prompt(sid, "second words=2")
        _, answer = await second.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}

        _, answer = await second.call(
            "session/load", {"sessionId": "demo-nope", "cwd": "/", "mcpServers": []}
        )
        assert answer["error"]["code"] == -32602
        assert answer["error"]["message"]


def _drain_fifo(path: Path) -> bytes:
    """Read a FIFO until its writer closes it (blocks until a writer opens it)."""
    with open(path, "rb") as fifo:
        return fifo.read()


async def test_a_stuck_state_write_never_stops_the_reading(spawn: Spawn, tmp_path: Path) -> None:
    """A disk that does not answer holds up the state file, never the agent's reading: the
    prompt streams, a cancel and a request after it are read and answered, and the turn is
    answered only once its state is on disk (a kill after the answer loses nothing)."""
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "100000")
        await agent.initialize()
        sid = await agent.new_session()
        # The next write of this session's state opens a FIFO nobody reads: it waits there,
        # as on a disk that does not answer, until the test reads it.
        state = tmp_path / "state" / f"{sid}.json"
        stuck = state.with_name(f"{state.name}.{agent.proc.pid}.tmp")
        os.mkfifo(stuck)
        rid = await agent.prompt(sid, "stuck disk")
        for _ in range(3):
            await agent.next_update("agent_message_chunk")
        await agent.notify("session/cancel", {"sessionId": sid})
        probe = await agent.request("initialize", {"protocolVersion": 1})
        before, answer = await agent.until_response(probe)
        assert "result" in answer
        assert all(m.get("id") != rid for m in before), "the turn answered before its save"
        # (abandoned on the timeout: an agent that never opens the FIFO fails, never hangs)
        written = await trio.to_thread.run_sync(_drain_fifo, stuck, abandon_on_cancel=True)
        assert b"stuck disk" in written  # the prompt's own snapshot, taken when it came
        late, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
        saved = json.loads(state.read_text())
        assert saved["history"][0] == {"role": "user", "text": "stuck disk"}
        assert saved["history"][1]["role"] == "agent"  # the turn's end, on disk before it


async def test_errors(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "100000")
        await agent.initialize()
        _, answer = await agent.call("session/fly", {})
        assert answer["error"]["code"] == -32601
        await agent.notify("_unknown/notification", {})
        await agent.send_raw(b"{not json\n")
        message = await agent.read_msg()
        assert message["id"] is None and message["error"]["code"] == -32700
        await agent.send_raw(b"\xff\xfe\n")
        message = await agent.read_msg()
        assert message["id"] is None and message["error"]["code"] == -32700
        _, answer = await agent.call(
            "session/prompt", {"sessionId": "demo-none", "prompt": [{"type": "text", "text": "x"}]}
        )
        assert answer["error"]["code"] == -32602
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "go")
        busy = await agent.prompt(sid, "again")
        others, answer = await agent.until_response(busy)
        assert "error" in answer
        await agent.notify("session/cancel", {"sessionId": sid})
        _, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}


async def test_fail_directive(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "2")
        await agent.initialize()
        sid = await agent.new_session()
        _, answer = await agent.until_response(await agent.prompt(sid, "fail"))
        assert answer["error"]["code"] == -32603
        _, answer = await agent.until_response(await agent.prompt(sid, "ok"))
        assert answer["result"] == {"stopReason": "end_turn"}


async def test_write_directive_writes_plain_names_in_the_sessions_cwd(
    spawn: Spawn, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "2")
        await agent.initialize()
        work = tmp_path / "work"
        work.mkdir()
        sid = await agent.new_session(work)
        text = "write=a.txt write=../out.txt write=b-c_d.md edit"
        _, answer = await agent.until_response(await agent.prompt(sid, text))
        assert answer["result"] == {"stopReason": "end_turn"}
        assert sorted(p.name for p in work.iterdir()) == ["a.txt", "b-c_d.md"]
        assert not (tmp_path / "out.txt").exists()
        assert (work / "a.txt").read_text() == text + "\n"


async def test_garbage_and_huge(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "2")
        await agent.initialize()
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "garbage huge")
        lines: list[bytes] = []
        while True:
            line = await agent.read_line()
            assert line is not None
            lines.append(line)
            if len(line) > 1024 * 1024:
                break
        junk = lines[2:-1]  # after the thought and the plan
        assert len(junk) == 5
        assert junk[0].startswith(b"demo-agent:")
        with pytest.raises(UnicodeDecodeError):
            junk[1].decode("utf-8")
        assert isinstance(json.loads(junk[2]), list)
        assert "jsonrpc" not in json.loads(junk[3])
        assert junk[4] == b'{"deep": ' + b"[" * 981 + b"]" * 981 + b"}"  # valid, too deep
        assert len(lines[-1]) >= 50 * 1024 * 1024
        assert lines[-1].startswith(b'{"jsonrpc":"2.0","method":"_demo/huge"')
        updates, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        assert len(chunks(updates)) == 2


async def test_crash_exits_3(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "10", stderr=subprocess.PIPE)
        await agent.initialize()
        sid = await agent.new_session()
        await agent.prompt(sid, "crash")
        words = 0
        while (line := await agent.read_line()) is not None:
            message = json.loads(line)
            if message["params"]["update"]["sessionUpdate"] == "agent_message_chunk":
                words += 1
        assert words == 3
        assert await agent.proc.wait() == 3
        assert agent.proc.stderr is not None
        err = b""
        while data := await agent.proc.stderr.receive_some(65536):
            err += data
        assert b"demo-agent: crashing as asked" in err


async def test_eof_exits_0_even_mid_turn(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "100000")
        await agent.initialize()
        sid = await agent.new_session()
        rid = await agent.prompt(sid, "go")
        await agent.next_update("agent_message_chunk")
        await agent.close_stdin()
        _, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
        assert await agent.read_line() is None
        assert await agent.proc.wait() == 0


async def test_eof_while_waiting_for_permission(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn()
        await agent.initialize()
        sid = await agent.new_session()
        await start_permission_turn(agent, sid)
        await agent.close_stdin()
        assert await agent.proc.wait() == 0


async def test_sigterm(spawn: Spawn) -> None:
    with trio.fail_after(TIMEOUT):
        agent = await spawn()
        await agent.initialize()
        agent.proc.send_signal(signal.SIGTERM)
        assert await agent.proc.wait() in (0, 143, -signal.SIGTERM)

        stubborn = await spawn("--ignore-sigterm")
        await stubborn.initialize()
        stubborn.proc.send_signal(signal.SIGTERM)
        await stubborn.initialize()  # still answers
        assert stubborn.proc.returncode is None


def _ignores_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError("no SigIgn line")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_grandchildren_are_leaked_and_reported(spawn: Spawn) -> None:
    pids: list[int] = []
    try:
        with trio.fail_after(TIMEOUT):
            agent = await spawn("--words", "2")
            await agent.initialize()
            sid = await agent.new_session()
            rid = await agent.prompt(sid, "grandchildren")
            tool_call = await agent.next_update("tool_call")
            raw = tool_call["rawOutput"]
            pids = list(raw["pids"])
            assert tool_call["status"] == "completed"
            assert pids == [
                raw["child"],
                raw["intermediate"],
                raw["setsidGrandchild"],
                raw["ignoresSigterm"],
            ]
            _, answer = await agent.until_response(rid)
            assert answer["result"] == {"stopReason": "end_turn"}

            agent_pid = agent.proc.pid
            for pid in pids:
                assert psutil.pid_exists(pid)
            assert psutil.Process(raw["child"]).ppid() == agent_pid
            assert psutil.Process(raw["intermediate"]).ppid() == agent_pid
            assert psutil.Process(raw["setsidGrandchild"]).ppid() == raw["intermediate"]
            assert os.getsid(raw["setsidGrandchild"]) == raw["setsidGrandchild"]
            assert os.getsid(raw["child"]) == os.getsid(agent_pid)
            assert _ignores_sigterm(raw["ignoresSigterm"])
            assert not _ignores_sigterm(raw["child"])

            # They outlive the agent.
            agent.proc.kill()
            await agent.proc.wait()
            for pid in pids:
                assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        for pid in pids:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


async def test_a_steer_joins_the_running_turn(spawn: Spawn) -> None:
    """``_session/steering`` as claude-agent-acp answers it: ``injected`` mid-turn (the reply
    says it and streams on, one prompt answer for the whole turn), ``promptRequired`` when
    idle; ``--no-steering`` neither advertises nor answers it."""
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "30")
        await agent.initialize()
        sid = await agent.new_session()
        steer = {"sessionId": sid, "prompt": [{"type": "text", "text": "say hi"}]}
        _, idle = await agent.call("_session/steering", steer)
        assert idle["result"] == {"outcome": "promptRequired", "reason": "noRunningTurn"}
        prompt_id = await agent.prompt(sid, "go")
        await agent.next_update("agent_message_chunk")
        steer_id = await agent.request("_session/steering", steer)
        seen: list[Message] = []
        answers: dict[int, Message] = {}
        while prompt_id not in answers:
            message = await agent.read_msg()
            if "id" in message and "method" not in message:
                answers[message["id"]] = message
            else:
                seen.append(message)
        assert answers[steer_id]["result"] == {"outcome": "injected"}
        assert answers[prompt_id]["result"] == {"stopReason": "end_turn"}
        assert any(text.startswith("Steered: say hi. ") for text in chunks(seen))

        plain = await spawn("--no-steering")
        assert "_meta" not in await plain.initialize()
        plain_sid = await plain.new_session()
        _, refused = await plain.call("_session/steering", {**steer, "sessionId": plain_sid})
        assert refused["error"]["code"] == -32601


async def test_a_steer_after_the_last_word_is_not_taken_into_the_turn(
    spawn: Spawn, tmp_path: Path
) -> None:
    """Its words all said, the turn only waits for its state to be on disk: a steer then
    could never be said in it, so it is answered ``promptRequired`` (the text starts a turn of
    its own), not ``injected``. And a turn stuck on its model refuses one (the supervisor then
    interrupts it)."""
    with trio.fail_after(TIMEOUT):
        agent = await spawn("--words", "3")
        await agent.initialize()
        sid = await agent.new_session()
        state = tmp_path / "state" / f"{sid}.json"
        stuck = state.with_name(f"{state.name}.{agent.proc.pid}.tmp")
        os.mkfifo(stuck)  # the turn's save waits here until the test reads it
        rid = await agent.prompt(sid, "stuck disk")
        seen = [await agent.next_update("agent_message_chunk") for _ in range(3)]
        steer = {"sessionId": sid, "prompt": [{"type": "text", "text": "say hi"}]}
        _, late = await agent.call("_session/steering", steer)
        assert late["result"] == {"outcome": "promptRequired", "reason": "noRunningTurn"}
        await trio.to_thread.run_sync(_drain_fifo, stuck, abandon_on_cancel=True)
        rest, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "end_turn"}
        assert not any("Steered" in text for text in chunks([*seen, *rest]))

        rid = await agent.prompt(sid, "hang")
        for _ in range(3):
            await agent.next_update("agent_message_chunk")
        _, refused = await agent.call("_session/steering", steer)
        assert "cannot take a steer" in refused["error"]["message"]
        await agent.notify("session/cancel", {"sessionId": sid})
        _, answer = await agent.until_response(rid)
        assert answer["result"] == {"stopReason": "cancelled"}
