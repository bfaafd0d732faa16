"""Pause all holds the sessions that run in a node too, across a dropped link and a front's
restart, without SSH.

The "host" is this machine through the ``env`` transport: the same bridge, node daemon and
WebSocket as over SSH. Real processes and the real clock, generous bounds; waits are on events.
The node's session holds the prompts (``session.pause``, told by the front); a link that was
down is told first thing once it is back, before any other call uses it; a front that adopts a
session its node still holds takes the pause up.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio
from hosts import env_node

from helpers import Recorder
from protocols import events as ev
from supervisor import open_supervisor
from supervisor.config import AgentSpec, builtin_agents
from supervisor.remote import HostSpec, RemoteSession
from supervisor.testing import record

pytestmark = pytest.mark.real_process

BOUND = 60.0


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Path]:
    """Where this test's nodes keep their files; a node still running is stopped after it."""
    yield tmp_path
    import json

    pids = []
    for hello in tmp_path.rglob("node/*.json"):
        try:
            pid = json.loads(hello.read_bytes()).get("pid")
        except (OSError, ValueError):
            continue
        if isinstance(pid, int) and psutil.pid_exists(pid):
            pids.append(psutil.Process(pid))
    for process in pids:
        process.terminate()
    _, alive = psutil.wait_procs(pids, timeout=20)
    for process in alive:
        process.kill()


def hosts(tmp_path: Path) -> dict[str, HostSpec]:
    host = env_node(tmp_path / "host", name="h", detach_s=30.0)
    return {"h": host}


def demo(tmp_path: Path) -> AgentSpec:
    spec = builtin_agents()["demo"].with_args("--state-dir", str(tmp_path / "demo"))
    return spec.with_options(hosts=("h",), grace_s=5.0, kill_timeout_s=0.5)


def started(recorder: Recorder) -> list[str]:
    return [e.turn_id for e in recorder.events if isinstance(e, ev.TurnStarted)]


async def test_a_node_session_is_held_and_a_dropped_link_loses_no_pause(nodes: Path) -> None:
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": demo(nodes)}, hosts=hosts(nodes)) as sup:
            session = await sup.start_session("demo")
            assert isinstance(session, RemoteSession)
            async with record(session) as recorder:
                status = await sup.pause()
                assert status.held == (session.id,) and status.pending == ()
                first = await session.prompt("hello words=3 fast")
                assert (first.queued, first.held) == (True, "paused")
                # The node answers a prompt after the events before it: had it started the
                # turn, the mirror would have its turn.started by now.
                assert session.turn_id is None and started(recorder) == []
                await recorder.wait_kind("session.held", held="paused")
                assert [s.held for s in sup.list()] == ["paused"]

                # The link drops, and the resume finds it down: the node is told once it is
                # back, and the held prompt runs.
                drop(session)
                status = await sup.resume()
                assert not status.paused and status.pending == (session.id,)
                ended = await recorder.wait_kind("turn.ended", turn_id=first.id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"

                # It drops again, and the pause finds it down: told on the new connection
                # before the next prompt goes through it.
                drop(session)
                status = await sup.pause()
                assert status.paused and status.pending == (session.id,)
                second = await session.prompt("again words=3 fast")
                assert (second.queued, second.held) == (True, "paused")
                assert session.turn_id is None and started(recorder) == [first.id]

                await sup.resume()
                ended = await recorder.wait_kind("turn.ended", turn_id=second.id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
                assert started(recorder) == [first.id, second.id]
                assert session.link.connects == 3
                recorder.check_invariants()


def drop(session: RemoteSession) -> None:
    """Kill the link's transport process (the node and its session live on)."""
    transport = session.link.process
    assert transport is not None
    transport.send_signal(signal.SIGKILL)


async def test_at_the_deadline_the_node_stops_the_running_turn_with_reason_paused(
    nodes: Path,
) -> None:
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": demo(nodes)}, hosts=hosts(nodes)) as sup:
            session = await sup.start_session("demo")
            async with record(session) as recorder:
                turn = await session.prompt("long words=3000")
                await recorder.wait_kind("message.delta", turn_id=turn.id)
                await sup.pause(deadline_s=0.5)
                ended = await recorder.wait_kind("turn.ended", turn_id=turn.id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "cancelled"
                assert ended.reason == "paused" and ended.receipt is not None
                assert ended.receipt["host"] == "h" and ended.receipt["reason"] == "paused"


async def test_a_front_that_adopts_a_held_session_takes_the_pause_up(nodes: Path) -> None:
    """A front paused, then left its node sessions running (an upgrade of ``serve``): the
    next front adopts the session its node still holds and is paused itself, so a session it
    starts is held too; its resume releases both, in order."""
    spec, state = demo(nodes), nodes / "front"
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"demo": spec}, hosts=hosts(nodes), state_dir=state, keep_node_sessions=True
        ) as sup:
            session = await sup.start_session("demo")
            await sup.pause()
            held = await session.prompt("waits words=3 fast")
            assert held.held == "paused"
            sid = session.id
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"demo": spec}, hosts=hosts(nodes), state_dir=state
        ) as sup:
            again = sup.get(sid)
            recorder = Recorder(again)
            async with trio.open_nursery() as nursery:
                await nursery.start(recorder.run)  # once the node's history is replayed
                assert again.held == "paused" and again.turn_id is None
                status = sup.pause_status()
                assert status.paused and status.held == (sid,) and status.deadline_s is None
                newcomer = await sup.start_session("demo")
                assert newcomer.held == "paused"
                queued = await newcomer.prompt("me too words=3 fast")
                assert (queued.queued, queued.held) == (True, "paused")
                await sup.resume()
                ended = await recorder.wait_kind("turn.ended", turn_id=held.id)
                assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
                assert started(recorder) == [held.id]
                nursery.cancel_scope.cancel()
            assert newcomer.held is None and not sup.pause_status().paused
