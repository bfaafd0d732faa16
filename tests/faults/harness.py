"""Shared pieces of the fault suite: the long-mode switch, process-tree checks, a recorder.

Process deaths are waited for on pidfds (an event, not a poll): ``pidfd_open`` works for any
process, not only our children, and the descriptor turns readable when the process has exited.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil
import trio

from helpers import Recorder
from pg import SERVER_PIDS
from protocols import events as ev
from supervisor.agents.cgroups import Cgroup
from supervisor.agents.containment import choose_blocking

#: ``AGENT_SUPERVISOR_LONG_FAULTS=1``: the long mode (minutes instead of seconds).
LONG = os.environ.get("AGENT_SUPERVISOR_LONG_FAULTS") == "1"
FAKES = Path(__file__).resolve().parent.parent / "fakes"
#: A stuck test fails instead of hanging the suite; shared, slow machines need generous bounds.
BOUND = 60.0


def tree() -> list[psutil.Process]:
    """Every agent process of this test process's supervisors: below us (shims and their
    trees, agents in cgroups), and in our cgroups (what agents in a cgroup left to init); not
    the cgroup keeper, which lives as long as we do."""
    found = {p.pid: p for p in psutil.Process().children(recursive=True) if not _postgresql(p.pid)}
    root = choose_blocking("auto").root
    if root is not None:
        found.pop(root.keeper_pid or -1, None)
        for pid in Cgroup(root.path).pids():
            if not _postgresql(pid):
                with contextlib.suppress(psutil.Error):
                    found.setdefault(pid, psutil.Process(pid))
    return list(found.values())


def _postgresql(pid: int) -> bool:
    """A process of a PostgreSQL server the store tests started in this process."""
    try:
        return pid in SERVER_PIDS or psutil.Process(pid).ppid() in SERVER_PIDS
    except psutil.Error:
        return False


def living(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` that still run (a zombie has exited; pid reuse is checked)."""
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


async def wait_gone(processes: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited; return those still alive after ``timeout``."""
    pending = living(processes)
    with trio.move_on_after(timeout):
        for process in pending:
            try:
                pidfd = os.pidfd_open(process.pid)
            except ProcessLookupError:
                continue
            try:
                if not process.is_running():  # the pid is someone else's now: ours is gone
                    continue
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
    return living(pending)


def session_of(process: psutil.Process) -> int:
    return os.getsid(process.pid)


class FaultRecorder(Recorder):
    """A :class:`Recorder` whose subscription never lags (floods must not cut it off)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.session.subscribe(
            since_seq=0, max_buffer=10_000_000, max_buffer_bytes=1 << 40
        ) as subscription:
            task_status.started()
            async for event in subscription:
                # With it, everything already buffered: taken one at a time (a checkpoint
                # each), the recorder let a flooding session publish ~40 events for each one
                # it took, and a cell then spent minutes on a loaded machine reading the flood
                # it had fallen behind on.
                self.events.append(event)
                self.events.extend(subscription.take(subscription.pending))
                self._changed.set()
                self._changed = trio.Event()
            assert not subscription.lagged, "the recorder fell behind"

    async def wait_for(self, predicate: Callable[[ev.Event], bool], *, count: int = 1) -> ev.Event:
        """Like :meth:`Recorder.wait_for`, in linear time (a flood records many events)."""
        index = matched = 0
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if predicate(event):
                    matched += 1
                    if matched == count:
                        return event
            await self._changed.wait()

    def turn_ended(self, turn_id: str) -> list[ev.TurnEnded]:
        return [
            e
            for e in self.of_kind("turn.ended")
            if isinstance(e, ev.TurnEnded) and e.turn_id == turn_id
        ]

    def stderr(self) -> list[str]:
        return [e.line for e in self.of_kind("agent.stderr") if isinstance(e, ev.AgentStderr)]
