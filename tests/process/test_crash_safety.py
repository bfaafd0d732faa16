"""Supervisor crash safety: a new supervisor kills the agent trees a crashed one left behind,
and only what it can prove was theirs."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio

from paths import TESTS
from supervisor.agents import tree as tree_module
from supervisor.agents.statefile import StateFile, sweep_orphans

HERE = TESTS
TREE_AGENT = HERE / "fakes" / "tree_agent.py"
CRASHING = HERE / "fakes" / "crashing_supervisor.py"


@attrs.define
class Recorded:
    """What StateFile.record reads of an AgentProcess."""

    pid: int
    started_ticks: int | None
    mark: str
    containment: str = "shim"
    cgroup: Any = None


def test_state_file_records_and_removes(tmp_path: Path) -> None:
    state = StateFile(tmp_path)
    state.open()
    state.record(Recorded(12345, 678, "mark"), ["agent", "--x"])  # type: ignore[arg-type]
    data = json.loads(state.path.read_text())
    assert data["supervisor"] == {
        "pid": os.getpid(),
        "started": tree_module.start_ticks(os.getpid()),
    }
    assert data["trees"] == [
        {
            "pid": 12345,
            "started": 678,
            "mark": "mark",
            "containment": "shim",
            "cgroup": None,
            "argv": ["agent", "--x"],
        }
    ]
    state.forget(12345)
    assert json.loads(state.path.read_text())["trees"] == []
    state.close()
    assert not state.path.exists()


def test_sweep_leaves_live_supervisors_alone(tmp_path: Path) -> None:
    state = StateFile(tmp_path)
    state.open()
    me = os.getpid()
    state.record(Recorded(me, tree_module.start_ticks(me), "x"), ["me"])  # type: ignore[arg-type]
    report = sweep_orphans(tmp_path)
    assert report.files == 0 and report.killed == []
    assert state.path.exists()  # ours: we are alive
    state.close()


def test_unreadable_state_files_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "supervisor-1.json").write_text("{not json")
    assert sweep_orphans(tmp_path).files == 0


def _dead_pid() -> int:
    """The pid of a process that has exited: a supervisor that is gone."""
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def stranger() -> Any:
    """An unrelated process leading its own session, as a terminal or a tmux server does."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield psutil.Process(process.pid)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("layout", ["current", "older"])
def test_a_stale_file_naming_an_unrelated_process_kills_nobody(
    tmp_path: Path, stranger: psutil.Process, layout: str
) -> None:
    # A crashed supervisor's shim had the pid the stranger has now (and so the session id the
    # stranger leads), and it started earlier; the stranger is not marked. Not ours to kill.
    ticks = tree_module.start_ticks(stranger.pid)
    assert ticks is not None and os.getsid(stranger.pid) == stranger.pid
    dead = _dead_pid()
    if layout == "current":
        data: dict[str, Any] = {
            "supervisor": {"pid": dead, "started": 1},
            "trees": [{"pid": stranger.pid, "started": ticks - 50, "mark": secrets.token_hex(8)}],
        }
    else:  # the file an older version wrote: psutil create_time floats, "shims"
        born = stranger.create_time() - 5.0
        data = {
            "supervisor": {"pid": dead, "create_time": born - 10},
            "shims": [{"pid": stranger.pid, "create_time": born, "mark": secrets.token_hex(8)}],
        }
    (tmp_path / f"supervisor-{dead}.json").write_text(json.dumps(data))
    report = sweep_orphans(tmp_path)
    assert report.files == 1 and report.killed == []
    assert stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE
    assert list(tmp_path.glob("supervisor-*.json")) == []


def test_a_recorded_identity_or_mark_is_proof(tmp_path: Path) -> None:
    # The leader recorded by pid and exact start time, and a process carrying the mark (here
    # in a session of its own and re-parented, as a daemon would be), are killed.
    mark = secrets.token_hex(8)
    env = {**os.environ, tree_module.TREE_MARK_VARIABLE: mark}
    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)
    daemon = subprocess.Popen(["sleep", "60"], start_new_session=True, env=env)
    try:
        dead = _dead_pid()
        record = {"pid": leader.pid, "started": tree_module.start_ticks(leader.pid), "mark": mark}
        data = {"supervisor": {"pid": dead, "started": 1}, "trees": [record]}
        (tmp_path / f"supervisor-{dead}.json").write_text(json.dumps(data))
        report = sweep_orphans(tmp_path)
        assert sorted(report.killed) == sorted([leader.pid, daemon.pid])
        # Gone (they are our children here, so the sweep's wait reaped them already).
        assert not psutil.pid_exists(leader.pid) and not psutil.pid_exists(daemon.pid)
    finally:
        for process in (leader, daemon):
            process.kill()
            process.wait()


@pytest.mark.usefixtures("containment")
async def test_orphans_of_a_crashed_supervisor_are_swept(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    argv = [
        sys.executable,
        str(CRASHING),
        str(state_dir),
        "--",
        sys.executable,
        str(TREE_AGENT),
        "--spawn",
        "child",
        "--spawn",
        "setsid",
        "--spawn",
        "double-fork-ignore-term",
    ]
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, env=env)
    report: dict[str, Any] = {}
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(4096)
                assert chunk, "crashing supervisor exited early"
                line += chunk
        report = json.loads(line)
        tree = [psutil.Process(pid) for pid in report["tree"]]
        # All die at once, with no chance to clean up: nothing can kill the tree now (the
        # shim, or the cgroup keeper, is gone with the supervisor).
        os.kill(report["keeper"] or report["shim"], signal.SIGKILL)
        process.kill()
        await process.wait()
        orphans = [p for p in tree if p.pid != report["shim"] or report["keeper"]]
        survivors = [p for p in orphans if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert survivors, "the test needs orphans to sweep"
        swept = sweep_orphans(state_dir)
        assert swept.files == 1
        _, alive = psutil.wait_procs(orphans, timeout=5)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        assert list(state_dir.glob("supervisor-*.json")) == []
    finally:
        if process.returncode is None:
            process.kill()
        for pid in report.get("tree", []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
