"""Crash safety: a state file per running supervisor, and the sweep of a dead one's agents.

The keeper (cgroups) or the lifeline (shim) already kill a supervisor's trees when it dies.
This is the second line, for when they die too (an OOM kill, ``pkill -9 python``): each
supervisor records, in its own file, every agent tree it started, and a supervisor that starts
sweeps the files of supervisors that are gone. The sweep kills only what it can *prove* was
one of the dead supervisor's trees (``supervisor/agents/tree.py``):

- the tree's cgroup, if it was in one: the directory name is ours, and ``cgroup.kill`` reaches
  exactly its members;
- a process carrying the tree's mark (``AGENT_SUPERVISOR_TREE``) in its environment;
- the tree's leader (its shim, or the agent in its cgroup), if a process with that pid *and*
  that start time (clock ticks since boot: exact) is still alive.

Never by session or process group alone: once every process of a session has died, its id is
free again, and a terminal or a tmux server that got the pid leads a session of that number.
A stale file naming a pid that someone else holds now kills nobody.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from attrs import frozen

from supervisor.agents import tree
from supervisor.agents.cgroups import ROOT_PREFIX, Cgroup

if TYPE_CHECKING:
    from supervisor.agents.process import AgentProcess

__all__ = ["STATE_DIR_VARIABLE", "StateFile", "SweepReport", "default_state_dir", "sweep_orphans"]

log = logging.getLogger(__name__)

#: For a cgroup's processes to be gone after ``cgroup.kill``, and marked processes after SIGKILL.
_SWEEP_WAIT_S = 2.0


#: Names the state directory, over ``$XDG_STATE_HOME/agent-supervisor``.
STATE_DIR_VARIABLE = "AGENT_SUPERVISOR_STATE_DIR"


def default_state_dir() -> Path:
    override = os.environ.get(STATE_DIR_VARIABLE)
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "agent-supervisor"


class StateFile:
    """This supervisor's record of the trees it started; removed when it exits cleanly."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        pid = os.getpid()
        self._me = {"pid": pid, "started": tree.start_ticks(pid)}
        self.path = directory / f"supervisor-{pid}.json"
        self._trees: dict[int, dict[str, Any]] = {}

    def open(self) -> None:
        """Make the directory and our file; raises OSError if either cannot be made."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._write(strict=True)

    def record(self, process: AgentProcess, argv: list[str]) -> None:
        cgroup = getattr(process, "cgroup", None)
        self._trees[process.pid] = {
            "pid": process.pid,
            "started": process.started_ticks,
            "mark": process.mark,
            "containment": process.containment,
            "cgroup": os.fspath(cgroup.path) if isinstance(cgroup, Cgroup) else None,
            "argv": argv[:8],
        }
        self._write()

    def forget(self, pid: int) -> None:
        if self._trees.pop(pid, None) is not None:
            self._write()

    def close(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _write(self, *, strict: bool = False) -> None:
        data = {"supervisor": self._me, "trees": list(self._trees.values())}
        temporary = self.path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(data))
            os.replace(temporary, self.path)
        except OSError as exc:  # crash safety is best effort; never fail a spawn over it
            if strict:
                raise
            log.warning("cannot write state file %s: %s", self.path, exc)


@frozen
class SweepReport:
    files: int
    killed: list[int]


def sweep_orphans(directory: Path) -> SweepReport:
    """Kill what dead supervisors left behind, proved theirs; return what was found.

    Blocking (it waits up to a few seconds for what it killed to be gone).
    """
    killed: list[int] = []
    files = 0
    if not directory.is_dir():
        return SweepReport(0, [])
    for path in sorted(directory.glob("supervisor-*.json")):
        try:
            data = json.loads(path.read_text())
            owner = data["supervisor"]
            trees = data["trees"] if "trees" in data else data["shims"]
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable state file %s", path)
            continue
        if not isinstance(owner, dict) or _owner_alive(owner):
            continue  # a live supervisor (maybe another one beside us): not ours to sweep
        files += 1
        for record in trees if isinstance(trees, list) else []:
            if isinstance(record, dict):
                killed.extend(_kill_tree(record))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if killed:
        log.warning("killed %d orphaned agent process(es) of a crashed supervisor", len(killed))
    return SweepReport(files, killed)


def _owner_alive(owner: dict[str, Any]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    started = owner.get("started")
    if isinstance(started, int):
        return tree.start_ticks(pid) == started
    # An older file, with a psutil create_time: the same process within a clock tick or two.
    create_time = owner.get("create_time")
    try:
        current = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    return not isinstance(create_time, float) or abs(current - create_time) < 0.05


def _kill_tree(record: dict[str, Any]) -> list[int]:
    """Kill what is proved to be of this tree: its cgroup, its marked processes, its leader."""
    victims: dict[int, psutil.Process] = {}
    killed: list[int] = []
    path = record.get("cgroup")
    if isinstance(path, str) and Path(path).parent.name.startswith(ROOT_PREFIX):
        cgroup = Cgroup(Path(path))
        killed.extend(cgroup.pids())
        if cgroup.kill():
            cgroup.wait_empty_blocking(_SWEEP_WAIT_S)
        cgroup.remove_tree()
        with contextlib.suppress(OSError):
            cgroup.path.parent.rmdir()  # the dead supervisor's root, once its last tree is gone
    mark = record.get("mark")
    if isinstance(mark, str) and mark:
        for process in tree.marked(mark):
            victims[process.pid] = process
    pid, started = record.get("pid"), record.get("started")
    if isinstance(pid, int) and isinstance(started, int):
        leader = tree.identify(pid, started)
        if leader is not None:
            victims[leader.pid] = leader
    victims.pop(os.getpid(), None)
    for process in victims.values():
        tree.send_signal(process, signal.SIGKILL)
    psutil.wait_procs(list(victims.values()), timeout=_SWEEP_WAIT_S)
    return killed + list(victims)
