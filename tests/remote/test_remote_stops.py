"""A front's recent stops (``supervisor/stops.py``) hold its sessions on other hosts too: the
stop a node's ``turn.ended`` tells of, and the cancel no node answered (``unreachable``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hosts import env_node
from test_remote_faults import FAR, fake_host

from supervisor import open_supervisor
from supervisor.config import builtin_agents
from supervisor.remote import RemoteSession
from supervisor.testing import record

BOUND = 60.0


async def test_a_hosts_stops_are_the_fronts_beside_its_own(tmp_path: Path) -> None:
    """A remote cancel, with a queued prompt it drops, and a local one: two stops, the remote
    one naming its host; the dropped prompt's ``turn.ended`` (its receipt too) is none."""
    here = env_node(tmp_path / "node")
    demo = builtin_agents()["demo"].with_args("--state-dir", str(tmp_path / "demo"))
    agents = {"demo": demo, "far": demo.with_options(name="far", hosts=("here",))}
    with trio.fail_after(BOUND):
        async with open_supervisor(agents=agents, hosts={"here": here}) as sup:
            remote = await sup.start_session("far", cwd=str(tmp_path))
            local = await sup.start_session("demo", cwd=str(tmp_path))
            assert isinstance(remote, RemoteSession)
            async with record(remote) as recorder:
                turn = await remote.prompt("hello words=400")
                await recorder.wait_kind("message.delta")
                queued = await remote.prompt("after words=3")
                assert queued.queued
                far = await remote.cancel()
                assert [p.turn_id for p in far.dropped_prompts] == [queued.id]
                await recorder.wait_kind("turn.ended", turn_id=queued.id)
                await local.prompt("hello words=400")
                near = await local.cancel()
            stops = sup.stops.recent()
    assert [(s.session_id, s.turn_id, s.host, s.agent) for s in stops] == [
        (remote.id, turn.id, "here", "far"),
        (local.id, near.turn_id, None, "demo"),
    ]
    assert [(s.outcome, s.elapsed_ms, s.summary) for s in stops] == [
        (far.outcome, far.elapsed_ms, far.summary()),
        (near.outcome, near.elapsed_ms, near.summary()),
    ]


@pytest.mark.parametrize("told", [True, False], ids=["turn_ended_first", "never_told"])
async def test_a_cancel_no_node_answered_is_one_stop(told: bool) -> None:
    """A node that never answers the cancel: its ``unreachable`` receipt is the stop, unless
    the node's ``turn.ended`` told of the stop already (one stop, not two, for one turn)."""
    host = fake_host("silent", "cancel", *(() if told else ("--keep-turn",)))
    async with open_supervisor(agents={"far": FAR}, hosts={"h": host}) as sup:
        with trio.fail_after(BOUND):
            session = await sup.start_session("far")
            async with record(session) as recorder:
                turn = await session.prompt("hi")
                await recorder.wait_kind("message.delta", turn_id=turn.id)
                receipt = await session.cancel()
            assert receipt.outcome == "unreachable"
            [stop] = sup.stops.recent()
            assert (stop.session_id, stop.turn_id, stop.host) == (session.id, turn.id, "h")
            if told:
                assert (stop.outcome, stop.summary) == ("cancelled", "Cancelled in 0 ms")
            else:
                assert (stop.outcome, stop.summary) == ("unreachable", receipt.summary())
