"""A supervisor killed with SIGKILL mid-turn leaves no agent process behind.

``tests/fakes/fault_supervisor.py`` runs ``open_supervisor(state_dir=...)`` with the demo agent
streaming a turn that leaked helpers (one in its own session, one ignoring SIGTERM); the agent
itself ignores SIGTERM. Then:

- only the supervisor dies: the shim sees its lifeline close and kills its whole tree, within
  a bound, with nobody's help;
- the shim dies too: the agent's tree is orphaned to init, out of everybody's reach but the
  state file's; the next ``open_supervisor`` with the same ``state_dir`` kills it before it
  serves, and then serves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from faults.harness import FAKES, living, session_of, tree, wait_gone
from protocols import events as ev
from supervisor import AgentSpec, open_supervisor

pytestmark = pytest.mark.real_process

SCRIPT = FAKES / "fault_supervisor.py"
#: The shim kills its tree ~0.2 s after the lifeline closes; this is the bound we hold it to.
LIFELINE_BOUND_S = 3.0


@asynccontextmanager
async def crashing_supervisor(
    state_dir: Path, agent_dir: Path
) -> AsyncIterator[tuple[trio.Process, dict[str, Any]]]:
    """The supervisor script, once its turn streams; its report (pids) alongside."""
    process = await trio.lowlevel.open_process(
        [sys.executable, str(SCRIPT), str(state_dir), str(agent_dir)], stdout=subprocess.PIPE
    )
    report: dict[str, Any] = {}
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(4096)
                assert chunk, "the supervisor script exited early"
                line += chunk
        report = json.loads(line)
        yield process, report
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
        for pid in report.get("tree", []):  # never leave anything behind a failed test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def processes(report: dict[str, Any]) -> list[psutil.Process]:
    found = []
    for pid in report["tree"]:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return found


def check_report(report: dict[str, Any], tree_: list[psutil.Process]) -> None:
    # the shim (none in a cgroup), the agent, and the demo's four leaked helpers (one of them
    # in its own session)
    assert len(tree_) == (6 if report["keeper"] is None else 5), tree_
    setsid = psutil.Process(report["setsid"])
    assert setsid in tree_ and session_of(setsid) == setsid.pid


@pytest.mark.usefixtures("containment")
async def test_supervisor_killed_its_tree_dies_with_it(tmp_path: Path) -> None:
    # The shim sees its lifeline close, or the cgroup keeper does and kills the cgroups.
    state_dir = tmp_path / "state"
    async with crashing_supervisor(state_dir, tmp_path / "agent") as (process, report):
        agent_tree = processes(report)
        check_report(report, agent_tree)
        killed_at = time.monotonic()
        process.kill()  # SIGKILL: no finally, no shield, nothing of the supervisor runs
        await process.wait()
        alive = await wait_gone(agent_tree, LIFELINE_BOUND_S)
        took = time.monotonic() - killed_at
        assert alive == [], f"alive {LIFELINE_BOUND_S} s after the supervisor died: {alive}"
        print(
            f"\nlifeline: the tree of {len(agent_tree)} processes was gone {took * 1000:.0f} ms after SIGKILL"
        )
    # The dead supervisor's state file is left; the next supervisor finds nothing to kill,
    # removes it and serves.
    assert len(list(state_dir.glob("supervisor-*.json"))) == 1
    await next_supervisor_serves(state_dir, tmp_path / "agent")


@pytest.mark.usefixtures("containment")
async def test_supervisor_and_its_killer_killed_next_supervisor_sweeps(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    async with crashing_supervisor(state_dir, tmp_path / "agent") as (process, report):
        agent_tree = processes(report)
        check_report(report, agent_tree)
        # Both at once, with no chance to clean up: nothing kills the tree (the shim, or the
        # cgroup keeper, is gone too); only the state file remembers it.
        os.kill(report["keeper"] or report["shim"], signal.SIGKILL)
        process.kill()
        await process.wait()
        orphans = [p for p in agent_tree if p.pid != report["shim"] or report["keeper"]]
        # The agent may exit on its stdin's EOF; its four helpers sleep until killed.
        survivors = living(orphans)
        assert len(survivors) >= 4, f"the test needs orphans to sweep: {survivors}"
        await next_supervisor_serves(state_dir, tmp_path / "agent", orphans=orphans)


async def next_supervisor_serves(
    state_dir: Path, agent_dir: Path, orphans: list[psutil.Process] | None = None
) -> None:
    demo = AgentSpec.from_config("demo").with_args("--state-dir", str(agent_dir), "--delay", "0.01")
    with trio.fail_after(30):
        async with open_supervisor(agents={"demo": demo}, state_dir=state_dir) as sup:
            # Before serving anything: the crashed supervisor's trees are gone, its file too.
            if orphans is not None:
                assert living(orphans) == [], "orphans alive when the new supervisor serves"
            files = sorted(state_dir.glob("supervisor-*.json"))
            assert [f.name for f in files] == [f"supervisor-{os.getpid()}.json"]
            session = await sup.start_session("demo", cwd="/")
            async with session.subscribe() as events:
                turn = await session.prompt("words=3")
                async for event in events:
                    if isinstance(event, ev.TurnEnded) and event.turn_id == turn.id:
                        assert event.outcome == "completed"
                        break
            ours = tree()
    assert await wait_gone(ours, 5.0) == []
    assert list(state_dir.glob("supervisor-*.json")) == []
