"""The kernel's own containment: a cgroup v2 per agent process tree, where the host allows it.

A process cannot leave its cgroup by forking, double-forking, ``setsid`` or re-parenting; only a
write to another cgroup's ``cgroup.procs`` moves it, which needs write access there. So a
cgroup's ``cgroup.procs`` is the exact member list of the agent's tree, ``cgroup.kill``
(Linux 5.14) SIGKILLs all of them in one step with no race against forks, and
``cgroup.events`` says when the last one is gone. With it the supervisor needs no helper
process per agent: the agent is our child, started by ``/bin/sh`` that moves itself into the
cgroup and then ``exec``\\ s the agent (so nothing of the agent runs outside it, and the
wrapper costs ~0.5 ms and no memory once it has exec'd).

Layout: ``<cgroup2 mount><our own cgroup>/agent-supervisor.<pid>.<start ticks>/a<N>``: one
directory per supervisor process (its *root*), one per agent process. The root's name proves
who made it: a process with that pid *and* start time is its owner, and a root whose owner is
gone is swept (killed, removed) by the next supervisor that looks. When this process dies, a
*keeper* (``cgroup_keeper.py``, one per supervisor process, not per agent) sees its lifeline
close and kills the whole root: every agent tree of this supervisor at once.

Detection (:func:`detect`): a cgroup2 mount, our own cgroup in it, a root we may create, a
``cgroup.kill`` in it, and a probe process that really moved into a cgroup below it. Anything
missing means the shim (``supervisor/agents/shim.py``) is used instead, and the reason is logged and
shown by ``agent-supervisor agents``. Controllers are never enabled: we only group and kill.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import trio

from supervisor.agents.tree import running, start_ticks

__all__ = [
    "JOIN_AND_EXEC",
    "Cgroup",
    "CgroupRoot",
    "detect",
    "sweep_dead_roots",
]

log = logging.getLogger(__name__)

#: Prefix of every supervisor's root directory; followed by ``<pid>.<start ticks>``.
ROOT_PREFIX = "agent-supervisor."
#: The wrapper that puts the agent in its cgroup: ``$0`` is the cgroup's ``cgroup.procs``,
#: ``$$`` the shell's pid, which ``exec`` hands on to the agent unchanged.
JOIN_AND_EXEC = ("/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"')
KEEPER_PATH = Path(__file__).with_name("cgroup_keeper.py")
#: How often an emptying cgroup is looked at where inotify is unavailable (kernfs files are
#: always "readable" to epoll, so ``cgroup.events`` itself cannot be waited on).
POLL_S = 0.002
_IN_MODIFY = 0x2
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000


class _EventsWatch:
    """The kernel's own notice that a cgroup's ``cgroup.events`` changed (it sends an inotify
    "modified" event on every change of ``populated``): an emptying cgroup is waited for, not
    polled. ``fd`` is None where inotify is unavailable; then callers poll."""

    def __init__(self, events_file: Path) -> None:
        self.fd: int | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        if libc.inotify_add_watch(fd, os.fsencode(events_file), _IN_MODIFY) < 0:
            os.close(fd)
            return
        self.fd = fd

    def drain(self) -> None:
        assert self.fd is not None
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        if self.fd is not None:
            trio.lowlevel.notify_closing(self.fd)
            os.close(self.fd)
            self.fd = None


def _cgroup2_mount() -> Path | None:
    try:
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                # id parent major:minor root mountpoint options [optional...] - fstype source
                before, _, after = line.partition(" - ")
                if after.split(" ", 1)[0] == "cgroup2":
                    return Path(before.split()[4])
    except OSError:
        pass
    return None


def _own_cgroup() -> str | None:
    try:
        with open("/proc/self/cgroup") as cgroup:
            for line in cgroup:
                hierarchy, _, path = line.rstrip("\n").partition("::")
                if hierarchy == "0":
                    return path
    except OSError:
        pass
    return None


def detect() -> CgroupRoot | str:
    """This process's cgroup root, ready for agents; or why cgroups cannot serve here.

    Blocking (a few ms, once per process): run it in a thread.
    """
    mount = _cgroup2_mount()
    if mount is None:
        return "no cgroup v2 hierarchy is mounted"
    own = _own_cgroup()
    if own is None:
        return "this process is in no cgroup v2 cgroup"
    parent = mount / own.lstrip("/")
    if not parent.is_dir():
        return f"our cgroup {own} is not visible under {mount}"
    if not os.access(JOIN_AND_EXEC[0], os.X_OK):
        return f"{JOIN_AND_EXEC[0]} is missing"
    root = CgroupRoot(parent, own)
    failure = root.open()
    return root if failure is None else failure


def _owner_alive(name: str) -> bool:
    """A root's name is ``agent-supervisor.<pid>.<start ticks>``: is that process alive?"""
    parts = name[len(ROOT_PREFIX) :].split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return True  # not a name we make (a probe of a live detection, say): leave it alone
    pid, ticks = (int(part) for part in parts)
    return start_ticks(pid) == ticks


def sweep_dead_roots(parent: Path) -> list[Path]:
    """Kill and remove every supervisor root under ``parent`` whose owner is gone (its keeper
    died with it, or was killed first). Returns the roots swept. Blocking: a thread's work."""
    swept: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return swept
    for entry in entries:
        if not entry.name.startswith(ROOT_PREFIX) or _owner_alive(entry.name):
            continue
        cgroup = Cgroup(entry)
        cgroup.kill()
        cgroup.wait_empty_blocking(5.0)
        if cgroup.remove_tree():
            swept.append(entry)
    if swept:
        log.warning("removed %d cgroup(s) of supervisors that are gone", len(swept))
    return swept


class Cgroup:
    """One cgroup directory: its members, its kill switch, its emptiness."""

    def __init__(self, path: Path, name: str | None = None) -> None:
        self.path = path
        #: its path as ``/proc/PID/cgroup`` shows it (relative to the mount), when known
        self.name = name

    def __repr__(self) -> str:
        return f"<Cgroup {self.path}>"

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def create(self) -> None:
        self.path.mkdir()

    def pids(self) -> list[int]:
        """Every process in the cgroup and below it (a zombie is no longer listed)."""
        found: list[int] = []
        for directory, _, _ in os.walk(self.path):  # an agent may make cgroups of its own
            with contextlib.suppress(OSError):
                pids = Path(directory, "cgroup.procs").read_text().split()
                found.extend(int(pid) for pid in pids)
        return found

    def populated(self) -> bool:
        """Any live process in the cgroup or below (``cgroup.events``; False once removed)."""
        try:
            events = (self.path / "cgroup.events").read_text()
        except OSError:
            return False
        return "populated 1" in events

    def kill(self) -> bool:
        """SIGKILL every process in the cgroup and below, atomically with respect to forks."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            return False
        return True

    async def wait_empty(self, timeout: float) -> bool:
        """Until no process is left, at most ``timeout`` seconds; whether it emptied."""
        watch = _EventsWatch(self.path / "cgroup.events")  # before the first look: no race
        try:
            with trio.move_on_after(timeout):
                while self.populated():
                    if watch.fd is None:
                        await trio.sleep(POLL_S)
                    else:
                        await trio.lowlevel.wait_readable(watch.fd)
                        watch.drain()
                return True
        finally:
            watch.close()
        return not self.populated()

    def wait_empty_blocking(self, timeout: float) -> bool:
        """:meth:`wait_empty` for a thread (the sweep)."""
        deadline = time.monotonic() + timeout
        watch = _EventsWatch(self.path / "cgroup.events")
        try:
            while self.populated():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if watch.fd is None:
                    time.sleep(min(POLL_S, left))
                else:
                    select.select([watch.fd], [], [], left)
                    watch.drain()
            return True
        finally:
            if watch.fd is not None:
                os.close(watch.fd)

    def remove(self) -> bool:
        """Remove the (empty) directory; False if it is still in use or already gone."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def remove_tree(self) -> bool:
        """Remove the directory and any cgroups an agent made below it, deepest first."""
        ok = True
        for directory, _, _ in sorted(os.walk(self.path), key=lambda e: -len(e[0])):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
        return ok


class CgroupRoot:
    """This supervisor process's root cgroup, its agents' cgroups, and its keeper."""

    def __init__(self, parent: Path, parent_name: str) -> None:
        ticks = start_ticks(os.getpid())
        leaf = f"{ROOT_PREFIX}{os.getpid()}.{ticks}"
        self.path = parent / leaf
        #: as ``/proc/PID/cgroup`` names it
        self.name = f"{parent_name.rstrip('/')}/{leaf}"
        self._count = 0
        self._keeper: tuple[int, int | None] | None = None  # pid, start ticks
        self._lifeline: int | None = None
        self._lock = threading.Lock()  # new_cgroup may run in trio's worker threads
        self.keeper_restarts = 0

    def open(self) -> str | None:
        """Sweep dead supervisors' roots beside ours, create ours, prove that a process can be
        moved into a cgroup in it, and start the keeper. None if all that worked, else what
        failed (and nothing is left behind)."""
        sweep_dead_roots(self.path.parent)
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as exc:
            return f"cannot create a cgroup under {self.path.parent}: {exc.strerror or exc}"
        probe = Cgroup(self.path / "probe")
        try:
            probe.create()
            if not (probe.path / "cgroup.kill").exists():
                return "the kernel has no cgroup.kill (Linux 5.14 or newer is needed)"
            result = subprocess.run(
                [*JOIN_AND_EXEC, os.fspath(probe.procs_file), "true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=10,
                check=False,
            )
            if result.returncode != 0:
                reason = result.stderr.decode(errors="replace").strip()
                return f"cannot move a process into a cgroup: {reason or result.returncode}"
            self._start_keeper()
            return None
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cgroup probe failed: {exc}"
        finally:
            probe.remove()
            if self._keeper is None:
                Cgroup(self.path).remove()

    def _start_keeper(self) -> None:
        """Start the keeper, detached: it double-forks so it is init's child, not ours (an
        embedding application sees no extra child; nobody has to reap it). It reports its pid
        on a pipe; its identity is that pid and its start time."""
        if self._lifeline is not None:
            os.close(self._lifeline)
        read_end, self._lifeline = os.pipe()
        report_r, report_w = os.pipe()
        try:
            intermediate = subprocess.Popen(
                [
                    sys.executable,
                    "-S",
                    "-E",
                    "-P",
                    os.fspath(KEEPER_PATH),
                    "--lifeline-fd",
                    str(read_end),
                    "--report-fd",
                    str(report_w),
                    os.fspath(self.path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(read_end, report_w),
                start_new_session=True,
            )
        finally:
            os.close(read_end)
            os.close(report_w)
        try:
            with os.fdopen(report_r, "rb") as report:
                pid = int(report.read(32) or b"0")
        finally:
            intermediate.wait()
        if pid <= 0:
            raise OSError(f"the cgroup keeper did not start (exit {intermediate.returncode})")
        self._keeper = (pid, start_ticks(pid))

    def ensure_keeper(self) -> None:
        """Start the keeper again if it died (say a ``pkill -9 python``): until it is back,
        nothing would kill our agents should we die too."""
        with self._lock:
            if self._keeper is not None and not running(*self._keeper):
                log.warning("cgroup keeper %d is gone; starting a new one", self._keeper[0])
                self.keeper_restarts += 1
                self._start_keeper()

    @property
    def keeper_pid(self) -> int | None:
        return self._keeper[0] if self._keeper is not None else None

    def new_cgroup(self) -> Cgroup:
        """A fresh, empty cgroup for one agent process."""
        self.ensure_keeper()
        with self._lock:
            self._count += 1
            leaf = f"a{self._count}"
        cgroup = Cgroup(self.path / leaf, f"{self.name}/{leaf}")
        cgroup.create()
        return cgroup
