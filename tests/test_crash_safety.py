"""Supervisor crash safety: a new supervisor kills the agent trees a crashed one left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import trio

from supervisor.statefile import StateFile, sweep_orphans

HERE = Path(__file__).parent
TREE_AGENT = HERE / "fakes" / "tree_agent.py"
CRASHING = HERE / "fakes" / "crashing_supervisor.py"


def test_state_file_records_and_removes(tmp_path: Path) -> None:
    state = StateFile(tmp_path)
    state.open()
    state.record(12345, 1.0, "mark", ["agent", "--x"])
    data = json.loads(state.path.read_text())
    assert data["supervisor"]["pid"] == os.getpid()
    assert data["shims"] == [
        {"pid": 12345, "create_time": 1.0, "mark": "mark", "argv": ["agent", "--x"]}
    ]
    state.forget(12345)
    assert json.loads(state.path.read_text())["shims"] == []
    state.close()
    assert not state.path.exists()


def test_sweep_leaves_live_supervisors_alone(tmp_path: Path) -> None:
    state = StateFile(tmp_path)
    state.open()
    state.record(os.getpid(), psutil.Process().create_time(), "x", ["me"])
    report = sweep_orphans(tmp_path)
    assert report.files == 0 and report.killed == []
    assert state.path.exists()  # ours: we are alive
    state.close()


def test_unreadable_state_files_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "supervisor-1.json").write_text("{not json")
    assert sweep_orphans(tmp_path).files == 0


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
        # Both die at once, with no chance to clean up: the shim cannot kill its tree.
        os.kill(report["shim"], signal.SIGKILL)
        process.kill()
        await process.wait()
        survivors = [p for p in tree[1:] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert survivors, "the test needs orphans to sweep"
        swept = sweep_orphans(state_dir)
        assert swept.files == 1
        _, alive = psutil.wait_procs(tree[1:], timeout=5)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        assert list(state_dir.glob("supervisor-*.json")) == []
    finally:
        if process.returncode is None:
            process.kill()
        for pid in locals().get("report", {}).get("tree", []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
