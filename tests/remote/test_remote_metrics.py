"""Metrics across a node link, over the ``env`` transport (the bridge, the node daemon and the
WebSocket over stdio, without SSH), on real processes and the real clock.

The front counts its remote sessions' turns from the events the node sent it, and reads each
host's link at the scrape; the node counts the same turns for its host, served on its socket
(``agent-supervisor node --metrics`` prints them): the two agree with each other and with what
the front's client saw.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio
from hosts import env_node
from prometheus_client.parser import text_string_to_metric_families

from paths import REPO
from protocols import events as ev
from supervisor import open_supervisor
from supervisor.config import builtin_agents
from supervisor.node.scrape import EXIT_NO_NODE
from supervisor.observe import Metrics
from supervisor.remote import RemoteSession
from supervisor.testing import record

BOUND = 60.0


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def node_metrics(state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "node", "--metrics", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=BOUND,
        cwd=REPO,
        check=False,
    )


async def test_the_front_and_the_node_count_the_same_turns(tmp_path: Path) -> None:
    state_dir = tmp_path / "node"
    hosts = {"here": env_node(state_dir)}
    spec = builtin_agents()["demo"].with_args("--state-dir", str(tmp_path / "demo"))
    spec = spec.with_options(hosts=("here",))
    front = Metrics()
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": spec}, hosts=hosts, metrics=front) as sup:
            session = await sup.start_session("demo", cwd=str(tmp_path))
            assert isinstance(session, RemoteSession)
            async with record(session) as events:
                done = await session.prompt("hello words=3")
                await events.wait_kind("turn.ended", turn_id=done.id)
                turn = await session.prompt("hello words=400")
                await events.wait_kind("message.delta", turn_id=turn.id)
                receipt = await session.cancel()
                ended = [e for e in events.events if isinstance(e, ev.TurnEnded)]
            assert receipt.outcome == "cancelled" and receipt.timeline["turn_ended"] >= 0
            at_front = parse(front.render().decode())
            scraped = await trio.to_thread.run_sync(node_metrics, state_dir)
            assert scraped.returncode == 0, scraped.stderr
            at_node = parse(scraped.stdout)
    outcomes = {(e.outcome, e.receipt is not None) for e in ended}
    assert outcomes == {("completed", False), ("cancelled", True)}
    for samples in (at_front, at_node):
        for outcome in ("completed", "cancelled"):
            labels = frozenset({("protocol", "acp"), ("outcome", outcome)})
            assert samples["agent_supervisor_turns_total", labels] == 1, outcome
        cancelled = frozenset({("protocol", "acp"), ("outcome", "cancelled")})
        assert samples["agent_supervisor_cancel_seconds_count", cancelled] == 1
        step = frozenset({("step", "interrupt")})
        assert samples["agent_supervisor_escalations_total", step] == 1
    # The front reads its link to the host; the node its sessions, and what its front has not
    # acknowledged (a gauge, present however small).
    here = frozenset({("host", "here")})
    assert at_front["agent_supervisor_link_up", here] == 1
    assert 0 < at_front["agent_supervisor_link_rtt_seconds", here] < BOUND
    assert at_node["agent_supervisor_sessions", frozenset({("state", "ready")})] == 1
    assert ("agent_supervisor_unacknowledged_events", frozenset()) in at_node
    assert at_node["agent_supervisor_subscribers", frozenset()] >= 1  # the front's link


def test_node_metrics_says_when_no_node_runs(tmp_path: Path) -> None:
    scraped = node_metrics(tmp_path / "none")
    assert scraped.returncode == EXIT_NO_NODE and scraped.stdout == ""
    assert "no node runs here" in scraped.stderr
