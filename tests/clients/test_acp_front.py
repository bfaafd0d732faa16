"""``agent-supervisor acp``, the ACP front door, driven by the official ACP SDK clients.

Not our code on the client side: the TypeScript SDK (``@agentclientprotocol/sdk@2.4.0``, its
``client()`` app, from ``tests/acp_clients/ts_client.mjs`` on the machine's node) and the Python
SDK (``agent-client-protocol``'s ``ClientSideConnection``). The front door runs as a real process
behind ``tests/realagents/tee.py``, which logs every line both ways; every message of every
conversation is then checked against the ACP v1 schema (``tests/machines/test_schemas.py``), ours
strictly (no member name the schema does not declare), the client's as the schema says.

Behind the front door: the demo agent, ``demo-stubborn`` (it ignores the interrupt, so the
cancel needs the kill and a respawn), the demo agent crashing mid-turn, and a gateway session
shared with a WebSocket client. Real clocks and generous bounds: these are real processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import trio

from acp_harness import (
    FAKE_MCP,
    SCENARIO_S,
    STUBBORN_CANCEL_S,
    check_wire,
    front_argv,
    front_env,
    run_ts,
)
from acp_harness import schema as schema  # the fixture
from schemas import AcpSchema, walk_messages
from served import serve
from supervisor.client import connect
from supervisor.store.sqlite import SqliteBackend


async def test_ts_client_streams_a_turn(tmp_path: Path, schema: AcpSchema) -> None:
    result = await run_ts(tmp_path, "basic")
    init = result["init"]
    assert init["protocolVersion"] == 1
    capabilities = init["agentCapabilities"]
    assert capabilities["loadSession"] is True
    assert set(capabilities["sessionCapabilities"]) == {"list", "resume", "close"}
    assert init["authMethods"] == []
    assert init["_meta"]["steering"]["supported"] is True
    (option,) = result["session"]["configOptions"]
    assert option["id"] == "agent" and option["currentValue"] == "demo"
    assert [o["value"] for o in option["options"]] == ["demo", "demo-stubborn"]
    assert result["stopReason"] == "end_turn"
    assert {"agent_message_chunk", "agent_thought_chunk", "plan"} <= set(result["kinds"])
    assert result["text"].startswith("Hello! I am the demo agent")
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_cancel_that_needs_the_kill(tmp_path: Path, schema: AcpSchema) -> None:
    """demo-stubborn ignores session/cancel: the prompt still ends ``cancelled`` within the
    grace plus the kill, and the next prompt works on the respawned, resumed agent."""
    result = await run_ts(tmp_path, "stubborn")
    assert result["current"] == "demo-stubborn"
    assert result["cancelled"]["stopReason"] == "cancelled"
    assert result["cancelled"]["_meta"]["agentSupervisor"]["outcome"] == "killed"
    assert 2500 <= result["cancelMs"] <= STUBBORN_CANCEL_S * 1000
    assert result["next"]["stopReason"] == "end_turn"
    assert result["nextText"].startswith("Hello!")
    sent = check_wire(tmp_path / "wire", schema)
    # The turn's own end (the receipt, after the respawn) reached no second prompt answer.
    prompt_answers = [m for m in sent if "result" in m and "stopReason" in m["result"]]
    assert [a["result"]["stopReason"] for a in prompt_answers] == ["cancelled", "end_turn"]


async def test_ts_client_cancel_right_behind_its_prompt(tmp_path: Path, schema: AcpSchema) -> None:
    """The cancel leaves the client right after the prompt: the front door hands the session
    the prompt first, so the cancel stops that turn rather than finding none."""
    result = await run_ts(tmp_path, "immediate")
    assert result["stops"] == ["cancelled"] * 5
    assert result["after"]["stopReason"] == "end_turn"
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_permission_round_trip_and_withdrawal(
    tmp_path: Path, schema: AcpSchema
) -> None:
    result = await run_ts(tmp_path, "permission")
    assert result["allowed"]["stopReason"] == "end_turn"
    first, second = result["permissions"]
    assert first["toolCall"]["toolCallId"] and first["toolCall"]["title"]
    assert {o["kind"] for o in first["options"]} == {"allow_once", "reject_once"}
    # The held request was withdrawn ($/cancel_request: the SDK aborted its handler), and the
    # turn ended cancelled.
    assert result["withdrawn"] == 1
    assert result["cancelled"]["stopReason"] == "cancelled"
    sent = check_wire(tmp_path / "wire", schema)
    asked = [m for m in sent if m.get("method") == "session/request_permission"]
    withdrawn = [m for m in sent if m.get("method") == "$/cancel_request"]
    assert [w["params"]["requestId"] for w in withdrawn] == [asked[1]["id"]]


async def test_ts_client_agent_crash_is_told_and_survived(
    tmp_path: Path, schema: AcpSchema
) -> None:
    result = await run_ts(tmp_path, "crash")
    assert result["error"]["code"] == -32603
    assert "exited unexpectedly" in result["error"]["message"]
    assert result["notices"] == ["agent_exited", "agent_restarted"]
    assert result["next"]["stopReason"] == "end_turn"
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_sessions_list_load_resume_close(tmp_path: Path, schema: AcpSchema) -> None:
    """A session closed in one ``acp`` process is listed, loaded with its history and prompted
    in the next; the agent behind resumes its own session (the demo agent's state dir)."""
    result = await run_ts(tmp_path, "sessions")
    created, reopened = result["created"], result["reopened"]
    assert created["closed"] == {}
    listed = reopened["listed"]["sessions"]
    assert [s["sessionId"] for s in listed] == [created["sessionId"]]
    assert listed[0]["cwd"] == str(tmp_path)
    assert listed[0]["title"] == "remember banana words=3 fast"
    replayed = reopened["replayed"]
    assert replayed[0] == ["user_message_chunk", "remember banana words=3 fast"]
    assert replayed[1][0] == "agent_message_chunk" and replayed[1][1].startswith("Hello!")
    assert reopened["next"]["stopReason"] == "end_turn"
    assert reopened["resumed"] == {"configOptions": reopened["loaded"]["configOptions"]}
    assert reopened["closed"] == {}
    check_wire(tmp_path / "wire", schema)
    # One session in the store, the prompts of both processes in it.
    store = SqliteBackend(tmp_path / "state" / "sessions.db")
    store.open()
    try:
        (stored,) = store.sessions()
        prompts = [t.text for t in store.texts(stored.id) if t.kind == "prompt"]
    finally:
        store.close()
    assert stored.id == created["sessionId"]
    assert stored.agent_session_id, "the agent's own session id is kept for the resume"
    assert prompts == ["remember banana words=3 fast", "go on words=3 fast"]
    assert 0 < datetime.fromisoformat(listed[0]["updatedAt"]).timestamp() <= stored.last_active


async def test_ts_client_is_told_when_the_agent_cannot_resume(
    tmp_path: Path, schema: AcpSchema
) -> None:
    """``session/load`` after the agent lost its session (its state gone): the transcript is
    still replayed, the editor is told the agent starts afresh, and the next prompt works."""
    demo_state = tmp_path / "demo-state"
    config = tmp_path / "agents.toml"
    command = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", str(demo_state)]
    config.write_text(f'[agents.demo]\nprotocol = "acp"\ncommand = {json.dumps(command)}\n')
    first = await run_ts(tmp_path, "basic", "--config", os.fspath(config))
    session_id = first["session"]["sessionId"]
    for saved in demo_state.iterdir():  # the agent forgets every session it had
        saved.unlink()
    env = {"ACP_TEST_SESSION": session_id}
    result = await run_ts(tmp_path, "reload", "--config", os.fspath(config), env=env)
    assert result["replayed"] == 2  # the prompt and the reply
    assert result["notices"] == ["resume_failed"]
    assert result["next"]["stopReason"] == "end_turn"
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_prompt_content_reaches_the_agents_that_take_it(
    tmp_path: Path, schema: AcpSchema
) -> None:
    """An image, a resource link and an embedded resource reach an ACP agent that advertises
    them (the demo agent with ``--content`` says what came), as ACP blocks; the text-only demo
    agent (switched to in the same session) refuses an image with a clear error and gets an
    embedded text resource inline. ``initialize`` promises images only once a session of the
    default agent has said it takes them (its ``promptCapabilities``, remembered)."""
    demo = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", str(tmp_path / "d")]
    config = tmp_path / "agents.toml"
    config.write_text(
        f'[agents.demo-content]\nprotocol = "acp"\ncommand = {json.dumps([*demo, "--content"])}\n'
        f'[agents.demo]\nprotocol = "acp"\ncommand = {json.dumps(demo)}\n'
    )
    env = {"ACP_TEST_TEXT_AGENT": "demo"}
    front = ("--config", os.fspath(config), "--agent", "demo-content")
    result = await run_ts(tmp_path, "content", *front, env=env)
    # Nothing known of demo-content yet: no promise of images (ACP agents say it when run).
    assert result["promptCapabilities"] == {"image": False, "audio": False, "embeddedContext": True}
    assert result["taken"]["stopReason"] == "end_turn"
    assert result["takenText"].startswith(
        "received: image image/png 8 bytes; link a.py file:///w/a.py;"
        " resource file:///w/b.md (text)\n"
    )
    assert result["refused"]["code"] == -32602
    assert "agent 'demo' does not take an image (image/png)" in result["refused"]["message"]
    assert result["inlined"]["stopReason"] == "end_turn"
    # The link went to the agent as a link (every ACP agent takes them), the text resource
    # inline: the demo agent thinks about its text blocks, joined.
    assert result["thought"] == (
        'Thinking about: read words=3 fast<context uri="file:///w/b.md">\n# B\n</context>'
    )
    sent = check_wire(tmp_path / "wire", schema)
    assert not any(m.get("error", {}).get("code") == -32603 for m in sent)
    again = await run_ts(tmp_path, "basic", *front)
    capabilities = again["init"]["agentCapabilities"]["promptCapabilities"]
    assert capabilities == {"image": True, "audio": True, "embeddedContext": True}


async def test_ts_client_sets_the_mode_of_an_agent_that_offers_modes(
    tmp_path: Path, schema: AcpSchema
) -> None:
    """The demo agent with ``--modes`` offers ``ask`` and ``code``: the front door offers them
    on in ``session/new``, ``session/set_mode`` reaches the agent (its next turn runs in that
    mode), an unknown mode is refused with the reason; the plain demo agent offers none."""
    demo = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", str(tmp_path / "d")]
    config = tmp_path / "agents.toml"
    config.write_text(
        f'[agents.demo-modes]\nprotocol = "acp"\ncommand = {json.dumps([*demo, "--modes"])}\n'
        f'[agents.demo]\nprotocol = "acp"\ncommand = {json.dumps(demo)}\n'
    )
    front = ("--config", os.fspath(config), "--agent", "demo-modes")
    result = await run_ts(tmp_path, "modes", *front)
    assert result["modes"]["currentModeId"] == "ask"
    assert [m["id"] for m in result["modes"]["availableModes"]] == ["ask", "code"]
    assert result["set"] == {}
    assert result["answer"]["stopReason"] == "end_turn"
    assert result["thought"].startswith("Thinking about: [mode code] hi words=3 fast")
    assert result["refused"]["code"] == -32602
    assert "unknown mode 'plan' (known: ask, code)" in result["refused"]["message"]
    assert result["modeUpdates"][-1] == "code"
    check_wire(tmp_path / "wire", schema)
    plain = await run_ts(tmp_path, "basic", "--config", os.fspath(config), "--agent", "demo")
    assert "modes" not in plain["session"]


async def test_ts_client_content_and_modes_through_a_gateway(
    tmp_path: Path, schema: AcpSchema
) -> None:
    """``--connect``: an image reaches the gateway's agent that takes it (what it takes comes
    with the subscribe), the text-only agent refuses it with the reason, and the modes of an
    agent that offers them are offered on and set through the gateway (``agent.set_mode``)."""
    demo = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", str(tmp_path / "d")]
    config = tmp_path / "agents.toml"
    config.write_text(
        f'[agents.demo-content]\nprotocol = "acp"\ncommand = {json.dumps([*demo, "--content"])}\n'
        f'[agents.demo-modes]\nprotocol = "acp"\ncommand = {json.dumps([*demo, "--modes"])}\n'
    )
    async with serve(tmp_path, "--config", os.fspath(config)) as served:
        connect_to = ("--connect", served.url)
        env = {"ACP_TEST_TEXT_AGENT": "demo"}
        result = await run_ts(tmp_path, "content", *connect_to, "--agent", "demo-content", env=env)
        assert result["taken"]["stopReason"] == "end_turn"
        assert result["takenText"].startswith(
            "received: image image/png 8 bytes; link a.py file:///w/a.py;"
            " resource file:///w/b.md (text)\n"
        )
        assert result["refused"]["code"] == -32602
        assert "agent 'demo' does not take an image (image/png)" in result["refused"]["message"]
        assert result["inlined"]["stopReason"] == "end_turn"
        moded = await run_ts(tmp_path, "modes", *connect_to, "--agent", "demo-modes")
    assert [m["id"] for m in moded["modes"]["availableModes"]] == ["ask", "code"]
    assert moded["set"] == {}
    assert moded["thought"].startswith("Thinking about: [mode code] hi words=3 fast")
    assert "unknown mode 'plan' (known: ask, code)" in moded["refused"]["message"]
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_shares_a_gateway_session_with_a_websocket_client(
    tmp_path: Path, schema: AcpSchema
) -> None:
    """``--connect URL --session ID``: the editor and a WebSocket client on one gateway
    session see the same turns; a cancel from either side stops the turn for both."""
    async with serve(tmp_path) as served, connect(served.url) as client:
        session_id = (await client.start_session("demo", str(tmp_path)))["session_id"]
        async with client.subscribe(session_id) as events:
            async with trio.open_nursery() as nursery:
                outcome: dict[str, Any] = {}

                async def editor() -> None:
                    outcome["ts"] = await run_ts(
                        tmp_path, "shared", "--connect", served.url, "--session", session_id
                    )

                nursery.start_soon(editor)
                seen: list[dict[str, Any]] = []
                with trio.fail_after(SCENARIO_S):
                    async for message in events:
                        seen.append(message)
                        data = message["data"]
                        if message["event"] == "message.delta" and data["turn_id"] == "t1":
                            if sum(1 for m in seen if m["event"] == "message.delta") == 1:
                                receipt = await client.cancel(session_id)
                                outcome["receipt"] = receipt
                        if message["event"] == "turn.ended" and data["turn_id"] == "t2":
                            break
    result = outcome["ts"]
    assert result["sessionId"] == session_id
    assert outcome["receipt"]["outcome"] == "cancelled"
    assert result["stoppedByOther"]["stopReason"] == "cancelled"
    assert result["stoppedHere"]["stopReason"] == "cancelled"
    ended = {m["data"]["turn_id"]: m["data"] for m in seen if m["event"] == "turn.ended"}
    assert ended["t1"]["outcome"] == "cancelled" and ended["t1"]["reason"] == "user"
    assert ended["t2"]["outcome"] == "cancelled"
    started = [m["data"]["text"] for m in seen if m["event"] == "turn.started"]
    assert started == ["first story slow words=80", "second story slow words=80"]
    assert session_id in [s["sessionId"] for s in result["listed"]["sessions"]]
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_steers_a_running_turn(tmp_path: Path, schema: AcpSchema) -> None:
    """``_session/steering`` joins the running turn (the demo agent injects it); with no turn
    running and ``idleBehavior: promptRequired`` the answer is ``promptRequired``."""
    result = await run_ts(tmp_path, "steer")
    assert result["advertised"] == {"supported": True}
    assert result["injected"] == {"outcome": "injected"}
    assert result["ended"]["stopReason"] == "end_turn"
    assert "Steered: turn left." in result["text"]
    assert result["userChunks"] == ["turn left"]
    assert result["idle"] == {"outcome": "promptRequired"}
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_mcp_servers_reach_the_agent_behind(
    tmp_path: Path, schema: AcpSchema
) -> None:
    """The editor's ``mcpServers`` go through the front door to the agent, which starts the
    server (``tests/fakes/mcp_server.py``, with the env it was given) and calls its tool."""
    marker = tmp_path / "mcp-marker.jsonl"
    server = {
        "name": "fake",
        "command": sys.executable,
        "args": [os.fspath(FAKE_MCP), os.fspath(marker)],
        "env": [{"name": "FAKE_MCP_WORD", "value": "banana"}],
    }
    env = {"ACP_TEST_MCP_SERVERS": json.dumps([server])}
    result = await run_ts(tmp_path, "mcp", env=env)
    # What the agent's protocol can pass (ACP: all three; the agent's own mcpCapabilities are
    # checked when it starts, and a kind it refuses fails session/new with its reason).
    assert result["mcp"] == {"http": True, "sse": True}
    assert result["answer"]["stopReason"] == "end_turn"
    assert "pong banana" in result["text"]
    started = [json.loads(line) for line in marker.read_text().splitlines()]
    assert started and started[0]["word"] == "banana"
    check_wire(tmp_path / "wire", schema)


async def test_ts_client_loads_a_gateway_session_with_its_history(
    tmp_path: Path, schema: AcpSchema
) -> None:
    """``--connect``: a session the WebSocket client started and talked to is listed, and
    ``session/load`` replays what was said before it answers; then the editor prompts too."""
    async with serve(tmp_path) as served, connect(served.url) as client:
        session_id = (await client.start_session("demo", str(tmp_path)))["session_id"]
        async with client.subscribe(session_id) as events:
            await client.prompt(session_id, "before words=3 fast")
            with trio.fail_after(SCENARIO_S):
                async for message in events:
                    if message["event"] == "turn.ended":
                        break
        env = {"ACP_TEST_SESSION": session_id}
        result = await run_ts(tmp_path, "attachload", "--connect", served.url, env=env)
    listed = {s["sessionId"]: s for s in result["listed"]["sessions"]}
    assert listed[session_id]["cwd"] == str(tmp_path)
    assert result["replayed"][0] == ["user_message_chunk", "before words=3 fast"]
    assert result["replayed"][1][0] == "agent_message_chunk"
    assert result["replayed"][1][1].startswith("Hello!")
    assert len(result["replayed"]) == 2
    assert result["next"]["stopReason"] == "end_turn"
    assert result["nextText"].startswith("Hello!")
    check_wire(tmp_path / "wire", schema)


# -- the Python SDK's client -----------------------------------------------------------------


def test_python_sdk_client_prompt_and_stubborn_cancel(tmp_path: Path, schema: AcpSchema) -> None:
    """The Python SDK (asyncio; this test is not a Trio one) drives the same front door:
    a turn, then a cancel that demo-stubborn ignores, then the next turn."""
    from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
    from acp.schema import AgentMessageChunk

    class Client:
        def __init__(self) -> None:
            self.chunks: list[str] = []
            self.first_chunk = asyncio.Event()

        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            if isinstance(update, AgentMessageChunk):
                self.chunks.append(update.content.text)
                self.first_chunk.set()

        async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("no permission is asked in these turns")

        def on_connect(self, conn: Any) -> None:
            pass

    async def scenario() -> dict[str, Any]:
        client = Client()
        argv = front_argv(tmp_path / "wire", "--agent", "demo-stubborn")
        env = front_env(tmp_path)
        async with spawn_agent_process(client, argv[0], *argv[1:], env=env) as (conn, _):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            first = await conn.prompt(session_id=sid, prompt=[text_block("hi words=3 fast")])
            client.first_chunk.clear()
            turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block("story")]))
            await client.first_chunk.wait()
            started = time.monotonic()
            await conn.cancel(session_id=sid)
            cancelled = await asyncio.wait_for(turn, STUBBORN_CANCEL_S)
            elapsed = time.monotonic() - started
            client.chunks.clear()
            after = await conn.prompt(session_id=sid, prompt=[text_block("again words=3 fast")])
            return {
                "config": session.config_options,
                "first": first.stop_reason,
                "cancelled": cancelled.stop_reason,
                "elapsed": elapsed,
                "after": after.stop_reason,
                "after_text": "".join(client.chunks),
            }

    result = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_S))
    assert result["first"] == "end_turn"
    assert result["cancelled"] == "cancelled"
    assert 2.5 <= result["elapsed"] <= STUBBORN_CANCEL_S
    assert result["after"] == "end_turn"
    assert result["after_text"].startswith("Hello!")
    check_wire(tmp_path / "wire", schema)


# -- the process ------------------------------------------------------------------------------


async def test_sigterm_mid_turn_answers_the_prompt_and_leaves_no_agent_process(
    tmp_path: Path,
) -> None:
    """An editor closing its agent server sends SIGTERM: the running turn is stopped, its
    prompt answered, every agent tree stopped, exit 0. (Raw lines here: this is about the
    process, not the protocol.)"""
    argv = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]
    process = await trio.lowlevel.open_process(
        [*argv, "acp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=front_env(tmp_path),
    )
    assert process.stdin is not None and process.stdout is not None
    lines = LineReader(process.stdout)

    async def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        await process.stdin.send_all((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())

    with trio.fail_after(SCENARIO_S):
        await send({"id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
        await lines.until(lambda m: m.get("id") == 0)
        await send(
            {"id": 1, "method": "session/new", "params": {"cwd": str(tmp_path), "mcpServers": []}}
        )
        session_id = (await lines.until(lambda m: m.get("id") == 1))["result"]["sessionId"]
        text = [{"type": "text", "text": "a long story slow"}]
        await send(
            {
                "id": 2,
                "method": "session/prompt",
                "params": {"sessionId": session_id, "prompt": text},
            }
        )
        await lines.until(lambda m: "agent_message_chunk" in json.dumps(m))
        tree = psutil.Process(process.pid).children(recursive=True)
        assert tree, "the agent runs under the front door"
        process.send_signal(signal.SIGTERM)
        answer = await lines.until(lambda m: m.get("id") == 2)
        assert answer["result"]["stopReason"] == "cancelled"
        assert await process.wait() == 0
    alive = [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []


class LineReader:
    """JSON lines from a stream, kept in order."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def until(self, predicate: Any) -> dict[str, Any]:
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if predicate(message):
                    return dict(message)
            data = await self.stream.receive_some(65536)
            assert data, "the front door closed its stdout"
            self.buffer += data


async def test_a_front_door_that_cannot_serve_says_why(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]
    cases = {
        ("acp", "--agent", "nope"): "unknown agent 'nope' (known: demo, demo-stubborn)",
        ("acp", "--connect", "http://127.0.0.1:1/?token=secret"): "cannot connect to 127.0.0.1:1",
    }
    for args, said in cases.items():
        with trio.fail_after(SCENARIO_S):
            done = await trio.run_process(
                [*argv, *args],
                stdin=b"",
                capture_stdout=True,
                capture_stderr=True,
                env=front_env(tmp_path),
                check=False,
            )
        assert done.returncode == 2, args
        assert said in done.stderr.decode(), done.stderr.decode()
        assert b"secret" not in done.stderr and done.stdout == b""


def test_python_sdk_client_permission_and_crash(tmp_path: Path, schema: AcpSchema) -> None:
    """The Python SDK's client answers a permission request (the tool runs, the turn ends),
    then sees a crash fail its turn (a JSON-RPC error), the notice, and the next turn work."""
    from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
    from acp.schema import AgentMessageChunk, AllowedOutcome, RequestPermissionResponse

    class Client:
        def __init__(self) -> None:
            self.asked: list[list[str]] = []
            self.notices: list[str] = []

        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            meta = getattr(update, "field_meta", None) or {}
            if isinstance(update, AgentMessageChunk) and "agentSupervisor" in meta:
                self.notices.append(meta["agentSupervisor"]["notice"])

        async def request_permission(
            self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
        ) -> RequestPermissionResponse:
            self.asked.append([o.kind for o in options])
            allow = next(o for o in options if o.kind == "allow_once")
            return RequestPermissionResponse(
                outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id)
            )

        def on_connect(self, conn: Any) -> None:
            pass

    async def scenario() -> dict[str, Any]:
        client = Client()
        argv = front_argv(tmp_path / "wire")
        env = front_env(tmp_path)
        async with spawn_agent_process(client, argv[0], *argv[1:], env=env) as (conn, _):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            allowed = await conn.prompt(
                session_id=sid, prompt=[text_block("permission words=3 fast")]
            )
            try:
                await conn.prompt(session_id=sid, prompt=[text_block("crash")])
                crash = None
            except RequestError as exc:
                crash = str(exc)
            after = await conn.prompt(session_id=sid, prompt=[text_block("after words=3 fast")])
            return {
                "allowed": allowed.stop_reason,
                "asked": client.asked,
                "crash": crash,
                "notices": client.notices,
                "after": after.stop_reason,
            }

    result = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_S))
    assert result["allowed"] == "end_turn"
    assert result["asked"] == [["allow_once", "reject_once"]]
    assert result["crash"] is not None and "exited unexpectedly" in result["crash"]
    assert result["notices"][:1] == ["agent_exited"]
    assert result["after"] == "end_turn"
    check_wire(tmp_path / "wire", schema)


def test_what_a_misbehaving_agent_says_reaches_the_editor_in_the_schemas_shape(
    schema: AcpSchema,
) -> None:
    """Sans-IO: an agent behind that puts the wrong types in what the front door passes on
    (tool call content and locations, titles, session updates, a permission's tool call) does
    not make the editor's messages invalid: what does not fit is left out."""
    from protocols import events as ev
    from protocols.acp_agent import AcpAgentSide

    machine = AcpAgentSide(agent_info={"name": "agent-supervisor", "version": "0"})
    talk: list[tuple[bool, dict[str, Any]]] = []

    def client(message: dict[str, Any]) -> list[Any]:
        talk.append((True, message))
        out = machine.receive(message)
        talk.extend((False, sent) for sent in out.send)
        return out.actions

    def ours(out: Any) -> None:
        talk.extend((False, sent) for sent in out.send)

    client({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
    [new] = client(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/new",
            "params": {"cwd": "/w", "mcpServers": []},
        }
    )
    ours(machine.session_opened(new.rpc_id, "S", config_options=[], new=True))
    [asked] = client(
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/prompt",
            "params": {"sessionId": "S", "prompt": [{"type": "text", "text": "go"}]},
        }
    )
    ours(machine.prompt_accepted(asked.rpc_id, "S", "go", "t1"))
    junk: list[ev.Event] = [
        ev.ToolCall(
            turn_id="t1",
            tool_call_id="c1",
            title="run",
            raw={"sessionUpdate": "tool_call", "content": "not a list", "locations": 5},
        ),
        ev.ToolCall(
            turn_id="t1",
            tool_call_id="c2",
            title="read",
            raw={
                "sessionUpdate": "tool_call",
                "content": [{"type": "content", "content": {"type": "text", "text": "ok"}}, 3],
                "locations": [{"path": "/w/a"}, {"line": 1}],
            },
        ),
        ev.ToolUpdate(
            turn_id="t1", tool_call_id="c1", raw={"sessionUpdate": "tool_call_update", "title": 42}
        ),
        ev.SessionInfo(
            info_kind="usage_update",
            data={"sessionUpdate": "usage_update", "used": "lots", "size": 10},
        ),
        ev.SessionInfo(
            info_kind="available_commands_update",
            data={"sessionUpdate": "available_commands_update", "availableCommands": "all"},
        ),
        ev.SessionInfo(
            info_kind="available_commands_update",
            data={
                "sessionUpdate": "available_commands_update",
                "availableCommands": [{"name": "plan", "description": "Plan"}, {"name": 1}],
            },
        ),
        ev.SessionInfo(
            info_kind="session_info_update",
            data={"sessionUpdate": "session_info_update", "title": 7},
        ),
        ev.SessionInfo(
            info_kind="current_mode_update",
            data={"sessionUpdate": "current_mode_update", "currentModeId": 3},
        ),
        ev.PermissionRequested(
            turn_id="t1",
            request_id="p1",
            tool_call={"toolCallId": "c3", "title": 9, "content": {"x": 1}, "locations": "here"},
            options=[
                ev.PermissionOption(option_id="allow", name="Allow", option_kind="allow_once")
            ],
        ),
    ]
    for event in junk:
        ours(machine.event("S", event))
    steps = [(step, from_client, message) for step, (from_client, message) in enumerate(talk)]
    problems: list[str] = []
    for wire in walk_messages("junk", steps):
        checks = schema.checks(wire)
        assert not isinstance(checks, str), checks
        for check in checks:
            problems += [
                f"{wire.where}: {e.message}" for e in schema.schema.errors(check, wire.message)
            ]
    assert not problems, "\n".join(problems)
    sent = [m for from_client, m in talk if not from_client]
    kinds = [
        m["params"]["update"]["sessionUpdate"] for m in sent if m.get("method") == "session/update"
    ]
    # What fits goes on: both tool calls, the update, the good command, the session info.
    assert kinds == [
        "tool_call",
        "tool_call",
        "tool_call_update",
        "available_commands_update",
        "session_info_update",
    ], kinds
    second = [m for m in sent if m.get("method") == "session/update"][1]["params"]["update"]
    assert second["locations"] == [{"path": "/w/a"}] and len(second["content"]) == 1
    [permission] = [m for m in sent if m.get("method") == "session/request_permission"]
    assert permission["params"]["toolCall"] == {"toolCallId": "c3"}
