"""Crash safety: a state file per running supervisor, and the sweep of a dead one's agents.

The lifeline already makes a shim kill its tree when the supervisor dies. This is the second
line, for when the shims die too (an OOM kill, ``pkill -9``): each supervisor records, in its own
file, every shim it started: its pid and start time (the shim leads its own session, so its pid
is also the session id its agent tree inherits) and a random *tree mark* the agent gets in its
environment (``AGENT_SUPERVISOR_TREE``), which every descendant inherits, even one that called
``setsid``. A supervisor that starts sweeps the files of supervisors that are gone: every process
born after the shim that is still in its session or carries its mark is killed, then the file is
removed. Start times guard against pid reuse.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import psutil
from attrs import frozen

__all__ = [
    "TREE_MARK_VARIABLE",
    "StateFile",
    "SweepReport",
    "default_state_dir",
    "sweep_orphans",
]

log = logging.getLogger(__name__)

#: Set in every agent's environment; its descendants inherit it wherever they go.
TREE_MARK_VARIABLE = "AGENT_SUPERVISOR_TREE"
#: Processes are compared by start time with this slack (psutil rounds to clock ticks).
_TIME_SLACK_S = 0.05


def default_state_dir() -> Path:
    override = os.environ.get("AGENT_SUPERVISOR_STATE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "agent-supervisor"


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class StateFile:
    """This supervisor's record of the shims it started; removed when it exits cleanly."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        pid = os.getpid()
        self._me = {"pid": pid, "create_time": _create_time(pid)}
        self.path = directory / f"supervisor-{pid}.json"
        self._shims: dict[int, dict[str, Any]] = {}

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._write()

    def record(self, pid: int, create_time: float | None, mark: str, argv: list[str]) -> None:
        self._shims[pid] = {"pid": pid, "create_time": create_time, "mark": mark, "argv": argv[:8]}
        self._write()

    def forget(self, pid: int) -> None:
        if self._shims.pop(pid, None) is not None:
            self._write()

    def close(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _write(self) -> None:
        data = {"supervisor": self._me, "shims": list(self._shims.values())}
        temporary = self.path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(data))
            os.replace(temporary, self.path)
        except OSError as exc:  # crash safety is best effort; never fail a spawn over it
            log.warning("cannot write state file %s: %s", self.path, exc)


@frozen
class SweepReport:
    files: int
    killed: list[int]


def sweep_orphans(directory: Path) -> SweepReport:
    """Kill what dead supervisors left behind; return what was found."""
    killed: list[int] = []
    files = 0
    if not directory.is_dir():
        return SweepReport(0, [])
    for path in sorted(directory.glob("supervisor-*.json")):
        try:
            data = json.loads(path.read_text())
            owner = data["supervisor"]
            shims = data["shims"]
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable state file %s", path)
            continue
        if _alive(owner.get("pid"), owner.get("create_time")):
            continue  # a live supervisor (maybe another one beside us): not ours to sweep
        files += 1
        for shim in shims:
            killed.extend(_kill_tree(shim.get("pid"), shim.get("create_time"), shim.get("mark")))
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    if killed:
        log.warning("killed %d orphaned agent process(es) of a crashed supervisor", len(killed))
    return SweepReport(files, killed)


def _alive(pid: Any, create_time: Any) -> bool:
    if not isinstance(pid, int):
        return False
    current = _create_time(pid)
    if current is None:
        return False
    return not isinstance(create_time, float) or abs(current - create_time) < _TIME_SLACK_S


def _kill_tree(sid: Any, born: Any, mark: Any) -> list[int]:
    """SIGKILL every process born after the shim that is in its session or carries its mark."""
    if not isinstance(sid, int) or not isinstance(born, float):
        return []
    me = os.getpid()
    victims = []
    for process in psutil.process_iter(["pid", "create_time"]):
        try:
            if process.pid == me or process.info["create_time"] + _TIME_SLACK_S < born:
                continue
            if os.getsid(process.pid) == sid or (
                isinstance(mark, str) and process.environ().get(TREE_MARK_VARIABLE) == mark
            ):
                victims.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
            continue
    for process in victims:
        try:
            process.send_signal(signal.SIGKILL)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    psutil.wait_procs(victims, timeout=2)
    return [process.pid for process in victims]
