"""Tier 2: the front door's I/O (``supervisor/clients/acp_front/server.py``) on virtual time, with an
in-memory session behind it: orderings a real client cannot produce on purpose."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed

from protocols import events as ev
from protocols.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
)
from supervisor import AgentSpec, open_supervisor
from supervisor.clients.acp_front.backends import BackendError, EmbeddedSessions, GatewaySessions
from supervisor.clients.acp_front.server import LIST_PAGE, OUT_BOUND, AcpFront
from supervisor.testing._acp import AcpBehaviour, AcpLauncher


class SlowSession:
    """Takes a prompt only after a while (a session still starting, a gateway far away), and
    ends a turn only when cancelled."""

    id = "f1"
    agent = "fake"
    cwd = "/"
    agent_session_id = None
    resumes = False

    def __init__(self) -> None:
        self.transcript: list[list[str]] = []
        self.running: str | None = None
        self.cancels: list[str | None] = []
        self._send, self._receive = trio.open_memory_channel[ev.Event](math.inf)
        self._seq = 0

    def _emit(self, event: ev.Event) -> None:
        self._seq += 1
        self._send.send_nowait(attrs.evolve(event, seq=self._seq))

    prompt_carries: frozenset[str] = frozenset()
    modes = None

    async def set_mode(self, mode_id: str) -> None:
        raise AssertionError("no modes offered")

    async def prompt(self, text: str, parts: Sequence[Any] = ()) -> str:
        await trio.sleep(0.5)
        self.running = "t1"
        self._emit(ev.TurnStarted(turn_id="t1", text=text))
        return "t1"

    async def cancel(self) -> None:
        self.cancels.append(self.running)
        if self.running is not None:
            self._emit(ev.TurnEnded(turn_id=self.running, outcome="cancelled"))
            self.running = None

    async def steer(self, text: str) -> str:
        return "interrupted"

    async def respond_permission(self, request_id: str, option_id: str | None) -> None:
        pass

    async def events(self) -> AsyncIterator[ev.Event]:
        async for event in self._receive:
            yield event

    async def stop(self) -> None:
        self._send.close()


class OneSession:
    agents: Sequence[tuple[str, str]] = [("fake", "")]
    persistent_ids = False

    def __init__(self) -> None:
        self.session = SlowSession()

    def mcp_transports(self, agent: str | None) -> frozenset[str]:
        return frozenset({"stdio"})

    def prompt_carries(self, agent: str | None) -> frozenset[str]:
        return frozenset()

    async def start(self, agent: str, cwd: str, **_: Any) -> SlowSession:
        return self.session

    async def attach(self, session_id: str, *, history: bool = False) -> SlowSession:
        return self.session

    async def list(self) -> list[dict[str, Any]]:
        return []


def line(message: dict[str, Any]) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode()


async def test_a_cancel_in_the_same_read_as_its_prompt_stops_that_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = OneSession()
    front = AcpFront(backend)
    to_front, from_client = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(front.serve, from_client, from_client)
        received = b""

        async def answer(rid: int) -> dict[str, Any]:
            nonlocal received
            while True:
                for raw in received.split(b"\n")[:-1]:
                    message = json.loads(raw)
                    if message.get("id") == rid and "method" not in message:
                        return dict(message)
                received += await to_front.receive_some(65536)

        new = {"id": 1, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}
        await to_front.send_all(line(new))
        session_id = (await answer(1))["result"]["sessionId"]
        text = [{"type": "text", "text": "go"}]
        prompt = {
            "id": 2,
            "method": "session/prompt",
            "params": {"sessionId": session_id, "prompt": text},
        }
        cancel = {"method": "session/cancel", "params": {"sessionId": session_id}}
        await to_front.send_all(line(prompt) + line(cancel))  # one read: both at once
        with trio.fail_after(5):
            answered = await answer(2)
        assert answered["result"]["stopReason"] == "cancelled"
        assert backend.session.cancels == ["t1"]  # the cancel found the turn
        await to_front.aclose()


class Conversation:
    """The client's end of a front door on memory streams: lines out, answers by id."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.received = b""
        self.messages: list[dict[str, Any]] = []

    async def send(self, *messages: dict[str, Any]) -> None:
        await self.stream.send_all(b"".join(line(m) for m in messages))  # one read: all at once

    async def answer(self, rid: int) -> dict[str, Any]:
        while True:
            for message in self.messages:
                if message.get("id") == rid and "method" not in message:
                    return message
            data = await self.stream.receive_some(65536)
            if not data:
                raise AssertionError(f"no answer to request {rid}: the front door ended")
            self.received += data
            *complete, self.received = self.received.split(b"\n")
            self.messages.extend(json.loads(raw) for raw in complete if raw)

    async def new_session(self, rid: int = 1) -> str:
        await self.send(
            {"id": rid, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}
        )
        return str((await self.answer(rid))["result"]["sessionId"])


@asynccontextmanager
async def conversing(
    backend: Any, *, lockstep: bool = False
) -> AsyncIterator[tuple[AcpFront, Conversation]]:
    """A front door serving ``backend`` on memory streams (``lockstep``: nothing buffered on
    the way, so a client that does not read holds the writer), and the client's end of it."""
    front = AcpFront(backend)
    pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    to_front, from_client = pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(front.serve, from_client, from_client)
        yield front, Conversation(to_front)
        nursery.cancel_scope.cancel()


def prompt(rid: int, session_id: str, text: str) -> dict[str, Any]:
    return {
        "id": rid,
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
    }


def switch_agent(rid: int, session_id: str, agent: str) -> dict[str, Any]:
    return {
        "id": rid,
        "method": "session/set_config_option",
        "params": {"sessionId": session_id, "configId": "agent", "value": agent},
    }


class QueueingSession(SlowSession):
    """Takes each prompt after a while, in the order they reach it, queued behind the running
    one; a cancel ends the running one and drops the queued ones (as a session does)."""

    def __init__(self, name: str = "f1", agent: str = "fake") -> None:
        super().__init__()
        self.id, self.agent = name, agent
        self.received: list[str] = []
        self.queue: list[str] = []
        self.counter = 0

    async def prompt(self, text: str, parts: Sequence[Any] = ()) -> str:
        await trio.sleep(0.1 if self.received else 0.5)  # the first finds it still starting
        self.received.append(text)
        self.counter += 1
        turn_id = f"t{self.counter}"
        if self.running is None:
            self._start(turn_id, text)
        else:
            self.queue.append(turn_id)
        return turn_id

    def _start(self, turn_id: str, text: str) -> None:
        self.running = turn_id
        self._emit(ev.TurnStarted(turn_id=turn_id, text=text))

    async def cancel(self) -> None:
        self.cancels.append(self.running)
        if self.running is not None:
            self._emit(ev.TurnEnded(turn_id=self.running, outcome="cancelled"))
            self.running = None
        for turn_id in self.queue:
            self._emit(ev.TurnEnded(turn_id=turn_id, outcome="cancelled", stop_reason="dropped"))
        self.queue.clear()


class TwoAgents(OneSession):
    agents: Sequence[tuple[str, str]] = [("fake", ""), ("other", "")]

    def __init__(self) -> None:
        self.started: list[QueueingSession] = []

    async def start(self, agent: str, cwd: str, **_: Any) -> QueueingSession:
        if self.started:
            await trio.sleep(2.0)  # another agent takes its time to start
        session = QueueingSession(f"f{len(self.started) + 1}", agent)
        self.started.append(session)
        return session


async def test_a_prompt_right_behind_a_cancel_is_not_what_it_cancels(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """ "Stop, then send the next message", both in one read: the cancel stops the running
    turn, the next prompt runs."""
    backend = TwoAgents()
    async with conversing(backend) as (front, client):
        session_id = await client.new_session()
        await client.send(prompt(2, session_id, "first"))
        await trio.sleep(1.0)  # it runs
        cancel = {"method": "session/cancel", "params": {"sessionId": session_id}}
        await client.send(cancel, prompt(3, session_id, "second"))
        with trio.fail_after(5):
            assert (await client.answer(2))["result"]["stopReason"] == "cancelled"
        await trio.sleep(1.0)
        session = backend.started[0]
        assert session.received == ["first", "second"]
        assert session.cancels == ["t1"] and session.running == "t2"  # the second runs


async def test_prompts_sent_at_once_reach_the_session_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = TwoAgents()
    async with conversing(backend) as (front, client):
        session_id = await client.new_session()
        texts = [f"message {n}" for n in range(6)]
        await client.send(*(prompt(10 + n, session_id, text) for n, text in enumerate(texts)))
        await trio.sleep(5.0)
        assert backend.started[0].received == texts


async def test_a_prompt_right_behind_an_agent_switch_goes_to_the_new_agent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = TwoAgents()
    async with conversing(backend) as (front, client):
        session_id = await client.new_session()
        switch = switch_agent(2, session_id, "other")
        await client.send(switch, prompt(3, session_id, "to the other one"))
        with trio.fail_after(10):
            assert "result" in await client.answer(2)
        await trio.sleep(1.0)
        first, second = backend.started
        assert first.received == [] and second.received == ["to the other one"]
        assert second.agent == "other" and second.running == "t1"


async def test_a_close_while_an_agent_switch_starts_leaves_neither_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = TwoAgents()
    stopped: list[str] = []
    async with conversing(backend) as (front, client):
        session_id = await client.new_session()
        switch = switch_agent(2, session_id, "other")
        close = {"id": 3, "method": "session/close", "params": {"sessionId": session_id}}
        await client.send(switch)
        await trio.sleep(0.5)  # the other agent is starting
        await client.send(close)
        with trio.fail_after(10):
            assert "result" in await client.answer(3)
            failed = await client.answer(2)
        assert "error" in failed and "closed" in failed["error"]["message"], failed
        await trio.sleep(1.0)
        for session in backend.started:
            # stopped: its event channel closed by stop()
            with pytest.raises(trio.ClosedResourceError):
                session._send.send_nowait(ev.TurnEnded(turn_id="x", outcome="cancelled"))
            stopped.append(session.id)
        assert stopped == ["f1", "f2"]


class Flooding(SlowSession):
    """Says one event after another, for ever, as fast as it is read."""

    async def events(self) -> AsyncIterator[ev.Event]:
        n = 0
        while True:
            n += 1
            yield ev.MessageDelta(turn_id="t1", text="word ", seq=n)
            await trio.lowlevel.checkpoint()


async def test_a_client_that_stops_reading_does_not_make_the_front_door_grow(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = OneSession()
    backend.session = Flooding()
    async with conversing(backend, lockstep=True) as (front, client):
        await client.new_session()
        await client.send(prompt(2, "f1", "flood"))
        for _ in range(20):  # the client reads nothing more
            await trio.sleep(1.0)
            assert front._out.statistics().current_buffer_used <= OUT_BOUND
        received = 0
        with trio.move_on_after(1.0):  # it reads again: the flood goes on
            while received < 100_000:
                received += len(await client.stream.receive_some(65536))
        assert received >= 100_000


async def test_a_client_that_sends_but_never_reads_is_not_read_without_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Each request's answer waited for the client while the next were read: 3,000 unknown
    # methods of 200 KB each (the answer names the method) grew the front door by 620 MB.
    sent = 0
    many = 10 * OUT_BOUND

    async def send_many(client: Conversation) -> None:
        nonlocal sent
        while sent < many:
            await client.send({"id": sent, "method": "_x/unknown", "params": {}})
            sent += 1

    async with conversing(OneSession(), lockstep=True) as (front, client):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_many, client)
            # The client reads nothing: once every task waits, the sender waits on its write.
            await trio.testing.wait_all_tasks_blocked()
            assert front._out.statistics().current_buffer_used <= OUT_BOUND
            assert 0 < sent < many  # its requests wait for it, in its pipe
            held = sent
            nursery.cancel_scope.cancel()
        for rid in range(held - 1):  # and once it reads, every one is answered
            assert (await client.answer(rid))["error"]["code"] == METHOD_NOT_FOUND


async def test_a_last_line_without_its_newline_is_still_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with conversing(OneSession()) as (front, client):
        hello = {"id": 4, "method": "initialize", "params": {"protocolVersion": 1}}
        await client.stream.send_all(line(hello).rstrip(b"\n"))
        await client.stream.send_eof()
        with trio.fail_after(5):
            assert (await client.answer(4))["result"]["protocolVersion"] == 1


class SlowToStart(OneSession):
    async def start(self, agent: str, cwd: str, **_: Any) -> SlowSession:
        await trio.sleep(60.0)
        return self.session


async def test_a_session_still_starting_at_shutdown_is_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with conversing(SlowToStart()) as (front, client):
        await client.send(
            {"id": 1, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}
        )
        await trio.sleep(1.0)
        front.shutdown()  # SIGTERM: the client still reads
        with trio.fail_after(5):
            answered = await client.answer(1)
        assert "shutting down" in answered["error"]["message"]


class CountingAttach(OneSession):
    def __init__(self) -> None:
        super().__init__()
        self.attached = 0

    async def attach(self, session_id: str, *, history: bool = False) -> SlowSession:
        self.attached += 1
        await trio.sleep(1.0)  # joining a gateway's session takes a round trip
        return self.session


async def test_a_load_and_a_resume_of_one_session_at_once_open_it_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = CountingAttach()
    async with conversing(backend) as (front, client):
        params = {"sessionId": "s7", "cwd": "/w", "mcpServers": []}
        await client.send(
            {"id": 1, "method": "session/load", "params": params},
            {"id": 2, "method": "session/resume", "params": params},
        )
        with trio.fail_after(10):
            assert "result" in await client.answer(1)
            assert "result" in await client.answer(2)
        assert backend.attached == 1


class ClosedGateway:
    """A gateway client whose connection is gone."""

    async def start_session(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ConnectionClosed(None)

    async def sessions(self) -> list[dict[str, Any]]:
        raise ConnectionClosed(None)


async def test_a_gateway_gone_is_said_in_words_not_as_an_exceptions_repr() -> None:
    sessions = GatewaySessions(ClosedGateway(), [("demo", "")])  # type: ignore[arg-type]
    for call in (
        lambda: sessions.start("demo", "/w"),
        lambda: sessions.attach("s1"),
        sessions.list,
    ):
        with pytest.raises(BackendError, match="the connection to the gateway is closed$"):
            await call()


class SlowToList(OneSession):
    """A gateway far away: its list takes ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def list(self) -> list[dict[str, Any]]:
        await trio.sleep(self.delay)
        return [{"session_id": "s9", "agent": "fake", "cwd": "/w", "state": "ready"}]


class SlowModes(SlowSession):
    """A session whose mode change takes a while (its agent answers slowly)."""

    modes = {"currentModeId": "a", "availableModes": [{"id": "a"}, {"id": "b"}]}

    async def set_mode(self, mode_id: str) -> None:
        await trio.sleep(0.5)


@pytest.mark.parametrize("delay", [0.5, 600.0])
async def test_a_request_in_flight_when_stdin_closes_is_answered(
    autojump_clock: trio.testing.MockClock, delay: float
) -> None:
    """A client that writes its requests and closes stdin (``printf ... | agent-supervisor
    acp``) hears every one: what finishes within the flush bound with its answer, what does not
    with an error, never twice, never not at all."""
    backend = SlowToList(delay)
    backend.session = SlowModes()
    front = AcpFront(backend)
    to_front, from_client = trio.testing.memory_stream_pair()
    client = Conversation(to_front)
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            await front.serve(from_client, from_client)
            await from_client.aclose()  # what the process's exit does to its stdout

        nursery.start_soon(serve)
        session_id = await client.new_session()
        await client.send(
            {"id": 2, "method": "session/list", "params": {}},
            {
                "id": 3,
                "method": "session/set_mode",
                "params": {"sessionId": session_id, "modeId": "b"},
            },
        )
        await client.stream.send_eof()
        with trio.fail_after(30):
            listed, mode_set = await client.answer(2), await client.answer(3)
            while data := await client.stream.receive_some(65536):
                client.received += data
    if delay < 1.0:
        assert [s["sessionId"] for s in listed["result"]["sessions"]] == ["s9"]
    else:
        assert "shutting down" in listed["error"]["message"]
    assert "result" in mode_set or "error" in mode_set
    later = [json.loads(raw) for raw in client.received.split(b"\n") if raw]
    ids = [m["id"] for m in client.messages + later if "id" in m and "method" not in m]
    assert sorted(ids) == [1, 2, 3]  # each answered once


@pytest.mark.parametrize(
    ("servers", "said"),
    [
        ([{"name": 5, "command": "x"}], "'name' must be a non-empty string"),
        ([{"name": "a\ud800", "command": "x"}], "lone surrogate"),  # once crashed the session
        ([{"name": "a", "command": "x\0y"}], "holds a NUL"),
    ],
)
async def test_mcp_servers_the_client_got_wrong_are_invalid_params(
    autojump_clock: trio.testing.MockClock, servers: list[dict[str, Any]], said: str
) -> None:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"])
    launcher = AcpLauncher(AcpBehaviour())
    async with open_supervisor(agents={"fake": spec}, launcher=launcher) as sup:
        async with conversing(EmbeddedSessions(sup)) as (front, client):
            params = {"cwd": "/w", "mcpServers": servers}
            await client.send({"id": 1, "method": "session/new", "params": params})
            with trio.fail_after(5):
                error = (await client.answer(1))["error"]
        assert error["code"] == INVALID_PARAMS and said in error["message"], error
        assert sup.list() == []  # nothing was started


async def test_a_call_naming_a_session_not_known_here_is_resource_not_found_naming_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """ACP's own code for a session that is not there (-32002, "Resource not found"), for a
    load or a resume of an id nobody knows as for a call on a session not open here: the
    client's mistake, not ours (-32603), and told apart from a bad parameter."""
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"])
    async with open_supervisor(agents={"fake": spec}, launcher=AcpLauncher(AcpBehaviour())) as sup:
        async with conversing(EmbeddedSessions(sup)) as (front, client):
            mode = {"id": 3, "method": "session/set_mode"}
            mode["params"] = {"sessionId": "nope", "modeId": "m"}
            opening = {"sessionId": "nope", "cwd": "/w", "mcpServers": []}
            load = {"id": 4, "method": "session/load", "params": opening}
            resume = {"id": 5, "method": "session/resume", "params": opening}
            for call in (prompt(1, "nope", "hi"), switch_agent(2, "nope", "fake"), mode):
                await client.send(call)
            await client.send(load)
            await client.send(resume)
            with trio.fail_after(5):
                errors = [(await client.answer(rid))["error"] for rid in (1, 2, 3, 4, 5)]
    said = "no session 'nope' here: session/new, session/load or session/resume opens one"
    assert errors[:3] == [{"code": RESOURCE_NOT_FOUND, "message": said}] * 3
    assert [e["code"] for e in errors[3:]] == [RESOURCE_NOT_FOUND] * 2
    assert all("'nope'" in e["message"] for e in errors[3:]), errors


class AllAtOnce(trio.abc.ReceiveStream):
    """Stdin as a pipe its client wrote and closed before the front door read it: every byte
    in the first read, then the end, no other task run in between."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data, self.data = self.data, b""
        return data

    async def aclose(self) -> None:
        pass


async def test_a_session_new_in_the_last_read_before_stdin_closes_is_answered(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """``printf '...session/new...' | agent-supervisor acp``: the request and the end of input
    are read before its task has begun; it is answered all the same ("shutting down")."""
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"])
    new = {"id": 1, "method": "session/new", "params": {"cwd": str(tmp_path), "mcpServers": []}}
    async with open_supervisor(agents={"fake": spec}, launcher=AcpLauncher(AcpBehaviour())) as sup:
        front = AcpFront(EmbeddedSessions(sup))
        to_front, from_client = trio.testing.memory_stream_pair()
        client = Conversation(to_front)
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                await front.serve(AllAtOnce(line(new)), from_client)
                await from_client.aclose()  # what the process's exit does to its stdout

            nursery.start_soon(serve)
            with trio.fail_after(30):
                answered = await client.answer(1)
    assert answered["error"]["message"] == "the front door is shutting down"


async def test_json_that_is_no_object_is_an_invalid_request_and_bad_json_a_parse_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """JSON-RPC 2.0's two codes: text that is not JSON cannot be parsed (-32700); JSON that
    is not a request object (a batch, a number) parsed, and is an invalid request (-32600)."""
    async with conversing(OneSession()) as (front, client):
        await client.stream.send_all(b"[1, 2]\n{nope\n7\n")
        await client.send({"id": 9, "method": "session/list"})
        with trio.fail_after(5):
            await client.answer(9)
    errors = [m["error"]["code"] for m in client.messages if m.get("id") is None]
    assert errors == [INVALID_REQUEST, PARSE_ERROR, INVALID_REQUEST]


async def test_a_mode_for_a_loaded_session_whose_agent_is_not_running_is_refused(
    tmp_path: Path,
) -> None:
    """A stored session's load offers no modes (its agent starts on the next prompt, and says
    its modes then): a mode set before that prompt is refused as for any session offering
    none, with the reason (a request the client got wrong, not a failure of ours)."""
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"])
    launcher = AcpLauncher(AcpBehaviour(modes=True))
    with trio.fail_after(30):
        async with open_supervisor(agents={"fake": spec}, launcher=launcher, store=url) as sup:
            await sup.start_session("fake")
        async with open_supervisor(agents={"fake": spec}, launcher=launcher, store=url) as sup:
            async with conversing(EmbeddedSessions(sup)) as (front, client):
                opening = {"sessionId": "s1", "cwd": "/w", "mcpServers": []}
                await client.send({"id": 1, "method": "session/load", "params": opening})
                assert "modes" not in (await client.answer(1))["result"]
                params = {"sessionId": "s1", "modeId": "code"}
                await client.send({"id": 2, "method": "session/set_mode", "params": params})
                error = (await client.answer(2))["error"]
    assert error["code"] == INVALID_PARAMS, error
    assert "a prompt starts it again" in error["message"]


async def test_a_session_whose_start_failed_is_not_listed(tmp_path: Path) -> None:
    """The editor heard an error for its ``session/new`` (here: an http MCP server the agent
    does not take) and never got the id; the store keeps the failed session, but an editor's
    history must not show a session it never had, with nothing said in it."""
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"])
    launcher = AcpLauncher(AcpBehaviour())
    http = {"type": "http", "name": "h", "url": "http://127.0.0.1:1/mcp", "headers": []}
    with trio.fail_after(30):
        async with open_supervisor(agents={"fake": spec}, launcher=launcher, store=url) as sup:
            async with conversing(EmbeddedSessions(sup)) as (front, client):
                params = {"cwd": str(tmp_path), "mcpServers": [http]}
                await client.send({"id": 1, "method": "session/new", "params": params})
                assert "error" in await client.answer(1)
                params = {"cwd": str(tmp_path), "mcpServers": []}
                await client.send({"id": 2, "method": "session/new", "params": params})
                good = (await client.answer(2))["result"]["sessionId"]
                await client.send({"id": 3, "method": "session/list", "params": {}})
                listed = (await client.answer(3))["result"]["sessions"]
    assert [s["sessionId"] for s in listed] == [good]


class ManyStored(OneSession):
    """A store of ``count`` sessions, newest first."""

    persistent_ids = True

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    async def list(self) -> list[dict[str, Any]]:
        return [
            {"session_id": f"s{n}", "agent": "fake", "cwd": "/w", "state": "stopped"}
            for n in range(self.count, 0, -1)
        ]


async def test_session_list_pages_follow_the_cursor_and_a_cursor_not_ours_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with conversing(ManyStored(LIST_PAGE * 2 + 3)) as (front, client):
        pages: list[list[str]] = []
        cursor: str | None = None
        for rid in range(1, 5):
            params = {} if cursor is None else {"cursor": cursor}
            await client.send({"id": rid, "method": "session/list", "params": params})
            result = (await client.answer(rid))["result"]
            pages.append([s["sessionId"] for s in result["sessions"]])
            cursor = result.get("nextCursor")
            if cursor is None:
                break
        for rid, junk in enumerate(("-5", "abc", "1e3", "\u00b2", 5), start=10):
            await client.send({"id": rid, "method": "session/list", "params": {"cursor": junk}})
            error = (await client.answer(rid))["error"]
            assert error["code"] == INVALID_PARAMS, (junk, error)
    assert [len(page) for page in pages] == [LIST_PAGE, LIST_PAGE, 3]
    assert sum(pages, []) == [f"s{n}" for n in range(LIST_PAGE * 2 + 3, 0, -1)]
