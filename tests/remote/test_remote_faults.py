"""A node that breaks the protocol ends its own link, and nothing else.

The node here is ``tests/faults/fake_node.py``, run as the host's ``transport``: a real process
that says the bridge's hello and speaks the gateway's WebSocket protocol over its stdio, and
sends one bad frame (or a bad answer, or none) at a chosen point of a session's life. Whatever
it sends, the supervisor (and ``serve``) goes on: a local session beside it still completes a
prompt and a cancel, the remote session's caller gets an error that names the host and its
cause (``protocol_error``, or ``timeout`` for a node that never answers), and nothing is logged
with a traceback.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from faults.fake_node import ANSWERS, FRAMES, POINTS

from helpers import Recorder
from paths import TESTS
from protocols import events as ev
from served import serve
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.config import builtin_agents
from supervisor.errors import AgentNotRunning
from supervisor.remote import HostSpec, HostUnreachable, RemoteSession
from supervisor.remote.link import LogThrottle
from supervisor.supervisor import Supervisor
from supervisor.testing import record

BOUND = 60.0
FAKE_NODE = TESTS / "faults" / "fake_node.py"
#: The fake host's deadline for an answer: short, so a silent node is given up at once (the
#: default is 30 s); the remote agent's bounds (below) are short for the same reason.
REQUEST_TIMEOUT_S = 1.0
#: The agent on the fake hosts: its command never runs (the fake node runs nothing).
FAR = AgentSpec(
    name="far",
    protocol="acp",
    command=["never-run"],
    hosts=("h",),
    grace_s=0.2,
    kill_timeout_s=0.2,
    start_timeout_s=1.0,
)
#: The points of a session's life each fault is tried at: a bad frame anywhere; a bad answer
#: where there is one; the handshake only before any; a state that is none where the node
#: says a session's state (a start's answer, an event of a known session).
FAULTS = {
    **{fault: POINTS for fault in FRAMES if fault != "bad_state"},
    "bad_state": ("start", "turn"),
    **{fault: tuple(at for at in POINTS if at != "connect") for fault in ANSWERS},
    "handshake": ("connect",),
}


def fake_host(fault: str, at: str, *options: str, name: str = "h") -> HostSpec:
    return HostSpec(
        name=name,
        transport=[sys.executable, str(FAKE_NODE), "--fault", fault, "--at", at, *options, "--"],
        detach_s=1.0,
        connect_timeout_s=BOUND / 2,
        # (64 MiB take a while to arrive: the answer's deadline must not end it first)
        request_timeout_s=BOUND / 2 if fault == "oversize" else REQUEST_TIMEOUT_S,
    )


def local_demo(tmp_path: Path) -> AgentSpec:
    return builtin_agents()["demo"].with_args("--state-dir", str(tmp_path / "demo"))


async def still_works(session: Session | RemoteSession, recorder: Recorder) -> None:
    """A prompt runs and cancels (``cancelled``); and, on a local session, completes."""
    if not isinstance(session, RemoteSession):  # (the fake node's turns only end by a cancel)
        turn = await session.prompt("hello words=3 fast")
        ended = await recorder.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
    turn = await session.prompt("again words=400")
    await recorder.wait_kind("message.delta", turn_id=turn.id)
    receipt = await session.cancel()
    assert receipt.outcome == "cancelled", receipt


async def fault_the_remote_session(sup: Supervisor, host: str, at: str, fault: str) -> str:
    """Run a session on ``host`` up to ``at``, where its node does ``fault``; the cause its
    caller was given (checked to name the host)."""
    named = f"host {host}: "
    if at in ("connect", "start", "subscribe"):
        with pytest.raises(HostUnreachable) as raised:
            await sup.start_session("far", host=host)
        assert str(raised.value).startswith(named), raised.value
        assert [s.host for s in sup.list()].count(host) == 0
        return raised.value.cause
    session = await sup.start_session("far", host=host)
    assert isinstance(session, RemoteSession)
    async with record(session) as recorder:
        if at == "turn" and fault in ANSWERS:
            with pytest.raises(HostUnreachable) as raised:
                await session.prompt("hi")
            assert str(raised.value).startswith(named), raised.value
            cause = raised.value.cause
        elif at == "turn":
            turn = await session.prompt("hi")
            await recorder.wait_kind("message.delta", turn_id=turn.id)  # mid-turn
            ended = await recorder.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
            assert ended.error is not None and ended.error.startswith(named), ended
            with pytest.raises(AgentNotRunning, match=named):
                await session.prompt("again")
            cause = "protocol_error"
        else:
            turn = await session.prompt("hi")
            await recorder.wait_kind("message.delta", turn_id=turn.id)
            receipt = await session.cancel()
            # The turn's fate is unknown here: the receipt says so, and why.
            assert (receipt.outcome, receipt.host, receipt.escalation) == ("unreachable", host, [])
            assert str(receipt.details["error"]).startswith(named), receipt
            cause = str(receipt.details["cause"])
            await recorder.wait_kind("turn.ended", turn_id=turn.id)
        if cause == "protocol_error":
            await recorder.wait_kind("session.state", state="failed")
            assert [s.state for s in sup.list() if s.host == host] == ["failed"]
            link = sup.remote.link(host)
            assert not link.connected  # the link is given up: its transport ends
            assert link.process is not None
            await link.process.wait()
        if session.last_seq:
            await recorder.catch_up()
        recorder.check_invariants()
    return cause


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_bad_frame_or_answer_from_a_node_ends_its_link_and_nothing_else(
    tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``fault`` at every point of a session's life, each on a host of its own, all at once;
    beside them a local session and a session on a well-behaved host go on."""
    points = FAULTS[fault]
    hosts = {f"h-{at}": fake_host(fault, at, name=f"h-{at}") for at in points}
    hosts["good"] = fake_host("none", "connect", name="good")
    far = FAR.with_options(hosts=tuple(hosts))
    causes: dict[str, str] = {}

    async def fault_at(at: str) -> None:
        causes[at] = await fault_the_remote_session(sup, f"h-{at}", at, fault)

    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"demo": local_demo(tmp_path), "far": far}, hosts=hosts
        ) as sup:
            local = await sup.start_session("demo", cwd=str(tmp_path))
            healthy = await sup.start_session("far", host="good")
            assert isinstance(healthy, RemoteSession)
            others = [(local, Recorder(local)), (healthy, Recorder(healthy))]  # type: ignore[arg-type]
            async with trio.open_nursery() as nursery:
                for _, recorder in others:
                    await nursery.start(recorder.run)
                turn = await healthy.prompt("across the faults")  # running meanwhile
                async with trio.open_nursery() as faults:
                    for at in points:
                        faults.start_soon(fault_at, at)
                await healthy.cancel(turn_id=turn.id)
                for session, recorder in others:
                    await still_works(session, recorder)
                nursery.cancel_scope.cancel()
    expected = "timeout" if fault == "silent" else "protocol_error"
    assert causes == dict.fromkeys(points, expected)
    # One line per bad node, never a traceback.
    assert [r for r in caplog.records if r.exc_info] == []
    logged = [r.getMessage() for r in caplog.records if "the node sent" in r.getMessage()]
    assert len(logged) <= len(points), logged


async def test_a_protocol_error_fails_every_session_of_its_link_and_the_next_connects_anew(
    tmp_path: Path,
) -> None:
    """Two sessions on one link; one's turn gets a bad frame: both fail with the cause, and
    nothing is resumed. The next session on the host opens a new connection (here, to a
    node that behaves), which first stops the two there (nobody drives them any more), and
    works."""
    requests = tmp_path / "requests"
    options = ("--once", str(tmp_path / "faulted"), "--log", str(requests))
    hosts = {"h": fake_host("not_json", "turn", *options)}
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"far": FAR}, hosts=hosts) as sup:
            first = await sup.start_session("far")
            second = await sup.start_session("far")
            assert isinstance(first, RemoteSession) and isinstance(second, RemoteSession)
            async with record(second) as recorder:
                await first.prompt("hi")
                failed = await recorder.wait_kind("session.state", state="failed")
                assert isinstance(failed, ev.SessionState) and failed.detail is not None
                assert failed.detail.startswith("host h: the node sent a frame"), failed
            assert [s.state for s in sup.list()] == ["failed", "failed"]
            link = sup.remote.link("h")
            assert link.connects == 1
            third = await sup.start_session("far")
            assert link.connects == 2 and link.connected
            async with record(third) as recorder:
                turn = await third.prompt("hi")
                await recorder.wait_kind("message.delta", turn_id=turn.id)
                receipt = await third.cancel()
                assert (receipt.outcome, receipt.host) == ("cancelled", "h")
            await sup.stop_session(third.id)
    # The stops went out on the new connection, as soon as it was up (before the third
    # session's turn).
    lines = requests.read_text().splitlines()
    again = [n for n, line in enumerate(lines) if line == "session.start None"][2]
    turn = lines.index(f"agent.prompt {third.node_id}")
    stops = {f"session.stop {session.node_id}" for session in (first, second)}
    assert stops <= set(lines[again:turn]), "\n".join(lines)


async def test_a_bad_handshake_on_a_reconnect_fails_the_sessions_at_once(tmp_path: Path) -> None:
    """The link drops, and the node it reaches again answers the handshake with garbage: its
    sessions fail with that cause at once, instead of retrying for ``detach_s``."""
    armed = tmp_path / "armed"
    # (with its detach_s, a link that only dropped would be retried for five minutes)
    host = attrs.evolve(fake_host("handshake", "connect", "--armed", str(armed)), detach_s=300.0)
    hosts = {"h": host}
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"far": FAR}, hosts=hosts) as sup:
            session = await sup.start_session("far")
            assert isinstance(session, RemoteSession)
            async with record(session) as recorder:
                armed.touch()
                process = session.link.process
                assert process is not None
                process.kill()  # the link drops; the reconnection meets the bad handshake
                failed = await recorder.wait_kind("session.state", state="failed")
                assert isinstance(failed, ev.SessionState) and failed.detail is not None
                assert "host h: the node's WebSocket handshake failed" in failed.detail, failed
            assert session.link.last_error is not None
            assert session.link.last_error.cause == "protocol_error"


async def test_a_start_answered_after_its_deadline_is_stopped(tmp_path: Path) -> None:
    """A node that starts a session later than the start's deadline (``request_timeout_s`` +
    the agent's ``start_timeout_s``): the caller hears ``timeout``, and the session the node
    started after all is stopped (the fake node exits once it is), not left running there."""
    late_s = REQUEST_TIMEOUT_S + FAR.start_timeout_s + 1.0
    hosts = {"h": fake_host("late", "start", "--late-s", str(late_s))}
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"far": FAR}, hosts=hosts) as sup:
            with pytest.raises(HostUnreachable) as raised:
                await sup.start_session("far")
            assert raised.value.cause == "timeout"
            assert "did not answer session.start in 2 s" in str(raised.value), raised.value
            process = sup.remote.link("h").process
            assert process is not None
            assert await process.wait() == 0  # it exits once its session is stopped


async def test_a_session_whose_subscribe_is_not_answered_is_stopped(tmp_path: Path) -> None:
    """The start is answered, its subscribe never: the caller hears ``timeout``, and the session
    the node started is stopped there, not left running for nobody."""
    requests = tmp_path / "requests"
    hosts = {"h": fake_host("silent", "subscribe", "--log", str(requests))}
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"far": FAR}, hosts=hosts) as sup:
            with pytest.raises(HostUnreachable) as raised:
                await sup.start_session("far")
            assert raised.value.cause == "timeout", raised.value
            # The stop goes out in a task of its own, during the first of these round trips at
            # the latest; the node answers in order: by the second answer, it had the stop.
            for _ in range(2):
                await sup.remote.count(hosts["h"])
    lines = requests.read_text().splitlines()
    [subscribe] = [line for line in lines if line.startswith("session.subscribe ")]
    assert f"session.stop {subscribe.split()[1]}" in lines, lines


async def test_serve_stays_up_and_names_the_host(tmp_path: Path) -> None:
    """``serve`` with two broken hosts: a start on the one whose node breaks the protocol at
    once is ``host_unreachable`` naming it (not ``internal``); a session on the other fails
    mid-turn with the cause naming it; ``serve`` goes on, its local session too, and stops
    cleanly."""
    from supervisor.client import GatewayError, connect

    def table(name: str, host: HostSpec) -> str:
        words = ", ".join(f'"{w}"' for w in host.transport)
        return f"[hosts.{name}]\ntransport = [{words}]\nrequest_timeout_s = 1\n"

    config = tmp_path / "agents.toml"
    demo = ", ".join(f'"{w}"' for w in local_demo(tmp_path).command)
    config.write_text(
        table("early", fake_host("no_result", "start"))
        + table("late", fake_host("deep", "turn"))
        + f'[agents.demo]\nprotocol = "acp"\ncommand = [{demo}]\n'
        + '[agents.far]\nprotocol = "acp"\ncommand = ["never-run"]\nhosts = ["early", "late"]\n'
    )
    async with serve(tmp_path, "--config", str(config)) as served:
        with trio.fail_after(BOUND):
            async with connect(served.url) as client:
                local = (await client.start_session("demo", str(tmp_path)))["session_id"]
                with pytest.raises(GatewayError) as raised:
                    await client.start_session("far", host="early")
                assert raised.value.code == "host_unreachable", raised.value
                assert "host early: the node sent an answer" in str(raised.value)
                remote = (await client.start_session("far", host="late"))["session_id"]
                async with client.subscribe(remote, since_seq=0) as events:
                    await client.prompt(remote, "hi")
                    async for event in events:
                        if event["event"] == "turn.ended":
                            break
                assert event["data"]["outcome"] == "failed"
                assert event["data"]["error"].startswith("host late: the node sent"), event
                with pytest.raises(GatewayError) as raised:
                    await client.prompt(remote, "again")
                assert raised.value.code == "agent_not_running"
                async with client.subscribe(local, since_seq=0) as events:
                    turn = (await client.prompt(local, "hello words=3 fast"))["turn_id"]
                    async for event in events:
                        if event["event"] == "turn.ended" and event["data"]["turn_id"] == turn:
                            break
                assert event["data"]["outcome"] == "completed"
        assert served.process.returncode is None  # still serving
        served.signal(signal.SIGTERM)  # a clean stop
        assert await served.wait_exit() == 0, served.stderr[-2000:]
    assert "Traceback" not in served.stderr, served.stderr[-4000:]


async def test_bad_input_is_logged_once_per_interval_with_a_count(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    logger = logging.getLogger("test.throttle")
    throttle = LogThrottle(60.0, logger)
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for n in range(5):
            throttle.log(logging.WARNING, "bad frame %d", n)
        assert [r.getMessage() for r in caplog.records] == ["bad frame 0"]
        mock_clock.jump(59.0)
        throttle.log(logging.WARNING, "bad frame %d", 5)
        assert len(caplog.records) == 1
        mock_clock.jump(1.0)
        throttle.log(logging.WARNING, "bad frame %d", 6)
        assert [r.getMessage() for r in caplog.records][1:] == [
            "bad frame 6 (and 5 more like it since the line before, not logged)"
        ]
        mock_clock.jump(60.0)
        throttle.log(logging.WARNING, "bad frame %d", 7)
        assert caplog.records[-1].getMessage() == "bad frame 7"


async def test_a_receipt_from_a_node_is_read_field_by_field() -> None:
    """Every field of a receipt has its JSON type checked (a new field of ``CancelReceipt``
    must be added to the table), and a receipt that is not one is a protocol error."""
    from types import SimpleNamespace

    from supervisor.receipt import CancelReceipt
    from supervisor.remote.frames import NodeProtocolError
    from supervisor.remote.session import _RECEIPT_FIELDS
    from supervisor.wire.codec import receipt_to_wire

    names = {field.name for field in attrs.fields(CancelReceipt)}
    assert set(_RECEIPT_FIELDS) == names - {"session_id", "host"}
    link = SimpleNamespace(host=fake_host("none", "connect"))
    session = RemoteSession(link, node_id="s1", spec=FAR, cwd=None, state="ready")  # type: ignore[arg-type]
    good = receipt_to_wire(
        CancelReceipt(
            session_id="s1", turn_id="t1", outcome="killed", escalation=["interrupt", "sigkill"]
        )
    )
    receipt = session._receipt({**good, "success": True})
    assert (receipt.session_id, receipt.host, receipt.outcome) == ("s1@h", "h", "killed")
    assert receipt.escalation == ["interrupt", "sigkill"]
    for bad in (
        {},
        {**good, "outcome": ["cancelled"]},
        {**good, "escalation": "interrupt"},
        {**good, "escalation": [1]},
        {**good, "elapsed_ms": "fast"},
        {**good, "details": []},
        {**good, "survivors": [7]},
        {**good, "dropped_prompts": [{}]},
    ):
        with pytest.raises(NodeProtocolError):
            session._receipt(bad)
