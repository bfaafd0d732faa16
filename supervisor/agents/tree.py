"""Who belongs to an agent's process tree, found by the supervisor itself, and how to kill them.

Containment (a cgroup, or the shim as subreaper) keeps a tree together while it works; this
module is what the supervisor does when it cannot take containment's word for it: the shim was
killed and its tree re-parented to init, a crashed supervisor's trees are swept, or a ladder
wants to be sure nothing escaped. A process is a member when it can be *proved* to be one:

- it carries the tree's **mark**: a random token in ``AGENT_SUPERVISOR_TREE`` that every
  descendant inherits, whatever it does to its process group, session or parent (short of
  clearing its environment);
- or it is in the session of the tree's leader while that session id is still in use: Linux
  does not hand out a pid again while any process still has it as its session or group id, so
  right after the leader is reaped, "session == leader's pid" names our orphans and nobody
  else's (this proof does not survive the last member, so a later sweep never relies on it);
- or it was seen as a member earlier and is the same process now: identity is the pid *and*
  the start time (``/proc/PID/stat`` field 22, in clock ticks since boot: exact, unlike a
  wall-clock float), so a reused pid is never taken for the member it replaced.

Signals go through :func:`send_signal` alone, so a test can make one member unkillable (a
process in uninterruptible sleep, or one we may not signal) and check that a receipt reports
it instead of claiming the tree is dead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import psutil
import trio
from attrs import frozen

__all__ = [
    "TREE_MARK_VARIABLE",
    "Member",
    "alive",
    "cgroup_of",
    "describe",
    "identify",
    "in_session",
    "kill_and_verify",
    "marked",
    "running",
    "send_signal",
    "signal_all",
    "start_ticks",
]

#: Set in every agent's environment; its descendants inherit it wherever they go.
TREE_MARK_VARIABLE = "AGENT_SUPERVISOR_TREE"

#: Between re-kills while verifying that killed processes are gone.
VERIFY_SLICE_S = 0.02


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3, the state, first)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and ')', so split after the last ')'.
    return data[data.rfind(b")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None if there is no such process.

    With the pid, an exact identity: the kernel never starts two processes with the same pid in
    the same tick.
    """
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def running(pid: int, started: int | None) -> bool:
    """That very process (pid and start time) exists and is not a zombie."""
    fields = _stat(pid)
    if fields is None or started is None or len(fields) < 20:
        return False
    return fields[0] not in (b"Z", b"X") and fields[19] == str(started).encode()


@frozen
class Member:
    """One process of a tree, as first seen: pid, start time, what it ran."""

    pid: int
    started: int  # start_ticks()
    command: str

    @classmethod
    def of(cls, process: psutil.Process) -> Member | None:
        started = start_ticks(process.pid)
        if started is None:
            return None
        return cls(process.pid, started, command_of(process))

    def is_same(self) -> bool:
        """The process is still this member (alive or a zombie), not a stranger on its pid."""
        return start_ticks(self.pid) == self.started

    def to_wire(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": self.command}


def command_of(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:200] or process.name()
    except psutil.Error:
        return "?"


def identify(pid: int, started: int | None) -> psutil.Process | None:
    """The live process with this pid *and* start time, or None (gone, or a reused pid)."""
    if started is None or start_ticks(pid) != started:
        return None
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        return None
    # psutil pinned its own start time just now; check ours again, in case the pid was reused
    # between the two reads.
    return process if start_ticks(pid) == started else None


def alive(process: psutil.Process) -> bool:
    """Running code: not gone, not a zombie (a zombie runs nothing and holds no pipe)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def marked(mark: str, *, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Every live process whose environment carries ``mark`` (a /proc scan: a few ms)."""
    skip = {os.getpid(), *exclude}
    found = []
    needle = f"{TREE_MARK_VARIABLE}={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                data = environ.read()
        except OSError:  # gone, or not ours to read (then not ours to kill either)
            continue
        if needle in data.split(b"\0"):
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(int(entry)))
    return [process for process in found if alive(process)]


def in_session(sid: int) -> list[psutil.Process]:
    """Every live process whose session id is ``sid`` (see the module docstring for when that
    proves membership)."""
    found = []
    me = os.getpid()
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        try:
            if os.getsid(process.pid) == sid and alive(process):
                found.append(process)
        except (ProcessLookupError, PermissionError):
            continue
    return found


def cgroup_of(pid: int) -> str | None:
    """The process's cgroup v2 path (``/proc/PID/cgroup``, line ``0::PATH``); None if gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as cgroup:
            for line in cgroup:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass
    return None


def send_signal(process: psutil.Process, signum: int) -> None:
    """Signal unless it already died (psutil checks the pid still names the same process)."""
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        process.send_signal(signum)


def signal_all(processes: Iterable[psutil.Process], signum: int) -> None:
    for process in processes:
        send_signal(process, signum)


def describe(processes: Iterable[psutil.Process]) -> list[dict[str, Any]]:
    """``{"pid", "command"}`` of each, for receipts and logs."""
    return [{"pid": process.pid, "command": command_of(process)} for process in processes]


#: How often :func:`wait_gone` looks again: from the first, doubling, up to the most.
GONE_POLL_FIRST_S = 0.001
GONE_POLL_MOST_S = 0.02


def wait_gone(processes: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` for every process to stop running; the ones still running.

    A zombie counts as gone: it runs nothing and holds no pipe, and whether its parent reaps it
    soon is not ours to wait for (an init that reaps slowly, an agent that never reaps its
    tool's child: ``psutil.wait_procs`` would wait the whole ``timeout`` for each of them).
    Blocking: run it in a worker thread."""
    pending = [process for process in processes if alive(process)]
    deadline = time.monotonic() + timeout
    pause = GONE_POLL_FIRST_S
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, GONE_POLL_MOST_S)
        pending = [process for process in pending if alive(process)]
    return pending


async def kill_and_verify(
    processes: Iterable[psutil.Process],
    *,
    timeout: float,
    limiter: trio.CapacityLimiter | None = None,
) -> list[psutil.Process]:
    """SIGKILL every process and wait until all are gone, re-killing; return the survivors.

    Shielded and bounded by ``timeout``: a process that outlives it (uninterruptible sleep, or
    one we may not signal) is returned, never waited for forever. Never pass a child of ours
    that trio reaps: ``psutil.wait_procs`` would reap it behind trio's back (:func:`wait_gone`
    only looks).
    """
    pending = [process for process in processes if alive(process)]
    with trio.CancelScope(shield=True):
        with trio.move_on_after(timeout):
            while pending:
                signal_all(pending, signal.SIGKILL)
                pending = await trio.to_thread.run_sync(
                    functools.partial(wait_gone, pending, VERIFY_SLICE_S), limiter=limiter
                )
    return [process for process in pending if alive(process)]
