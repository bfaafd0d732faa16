"""One agent OS process and its whole tree: spawn, stdio, exit status, the kill ladder.

Two containments (``supervisor/agents/containment.py`` picks one per process):

- **cgroup** (:class:`CgroupProcess`): the agent is our child, in a cgroup of its own
  (``supervisor/agents/cgroups.py``). The cgroup's member list is exact, ``cgroup.kill``
  kills it all at once, and a per-supervisor keeper kills every cgroup if we die.
- **shim** (:class:`ShimProcess`): the agent runs below ``supervisor/agents/shim.py`` (see its
  docstring): a child subreaper that keeps the agent's whole tree below it, forwards signals to
  all of it, cleans up after the agent, and kills the tree when the lifeline we hold breaks
  (our death). The shim is one process that can die like any other (the OOM killer, ``pkill -9
  python``), so we do not take its word alone: it writes a byte on the lifeline just before a
  clean exit, and a shim that exits without it is *containment lost*. Then the supervisor finds
  the loose tree itself (``supervisor/agents/tree.py``: the tree mark in the environment, the shim's
  session, members seen before, each by pid *and* start time) and kills it directly.

Either way, :meth:`AgentProcess.wait` returns only once nothing of the tree is alive, or with
the survivors listed in :attr:`AgentProcess.survivors`; :meth:`AgentProcess.kill_tree` returns
the steps it took (``sigterm``, ``sigkill``; ``containment_lost`` first when the shim was gone)
or raises :class:`KillError` naming what survived SIGKILL (a process in uninterruptible sleep,
one we may not signal). A receipt never says a tree is dead while a member lives.

Kill ladder, top to bottom (``kill_tree``):

1. ``sigterm``: SIGTERM, then SIGCONT (so a stopped agent can act on it, as systemd does), to
   the agent's process group and to every member that left it.
2. Wait ``term_timeout`` for the tree to go (the shim exits only once it has no child left, and
   as a subreaper that means no descendant left; a cgroup reports itself empty).
3. ``sigkill``: ``cgroup.kill``; or, with the shim, freeze every descendant with SIGSTOP (not the
   shim: it must stay alive so that orphans keep landing below it), rescan until nothing new
   appears, SIGKILL them all, the shim last.
4. Verify that every process seen on the way is gone, re-killing survivors, and look for
   members that escaped every view by their mark.

This module changes no process-wide setting: no prctl on ourselves, no SIGCHLD handler, no
``waitpid(-1)``. The only process we reap is our child (the shim, or the agent in its cgroup),
through trio; psutil waits are never pointed at it (``psutil.Process.wait`` would ``waitpid``
our child and steal its status from trio).

Measured on 2 cores: a cooperative tree of 5 processes is gone ~6 ms after ``kill_tree`` starts;
a tree that ignores SIGTERM ~15 ms after ``term_timeout`` runs out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import math
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Final, cast

import psutil
import trio

from supervisor.agents import tree
from supervisor.agents.cgroups import JOIN_AND_EXEC, Cgroup, CgroupRoot
from supervisor.agents.containment import Containment, choose
from supervisor.agents.tree import TREE_MARK_VARIABLE, Member
from supervisor.core.exit import ExitStatus
from supervisor.errors import SupervisorError

__all__ = [
    "SHIM_PATH",
    "AgentProcess",
    "CgroupProcess",
    "KillError",
    "ShimProcess",
    "SpawnError",
    "tree_clock",
]

log = logging.getLogger(__name__)

SHIM_PATH = Path(__file__).with_name("shim.py")

# -S -E: no site, no PYTHON* variables: the shim is stdlib only and starts in ~20 ms.
# -P: don't put supervisor/ first on the shim's sys.path, where a sibling module could shadow
# a stdlib one.
_SHIM_PREFIX = (sys.executable, "-S", "-E", "-P", os.fspath(SHIM_PATH))
#: Run before an agent in a pseudo-terminal: it makes the terminal the agent's controlling one
#: (``supervisor/agents/ctty.py``), then execs the agent. Same flags as the shim's, same reasons.
_CTTY_PREFIX = (sys.executable, "-S", "-E", "-P", os.fspath(Path(__file__).with_name("ctty.py")))
#: What a shim writes on its lifeline just before a clean exit (``supervisor/agents/shim.py``): the
#: tree is gone; and gone, but what the agent left had to be SIGKILLed.
_TREE_GONE = b"1"
_TREE_GONE_KILLED = b"2"

# Bounds of the steps after SIGTERM. With a healthy shim the SIGKILL step takes milliseconds;
# these only matter when the shim itself is stopped or stuck, or a member will not die.
FREEZE_MAX_SCANS = 20  # rescans until no new descendant appears (1-2 in practice)
SHIM_EXIT_S = 1.0  # for the shim to notice its children died and exit by itself
SHIM_REAP_S = 1.0  # for a SIGKILLed shim (or agent) to be reaped
VERIFY_S = 2.0  # for every process seen to be gone, re-killing survivors
#: After the agent exits, how long what it left running gets between SIGTERM and SIGKILL: the
#: shim's own ``CLEANUP_GRACE_S``, so both containments clean up alike.
CLEANUP_GRACE_S = 0.5


class SpawnError(SupervisorError):
    """The agent could not be started; the message names ``argv[0]`` and the reason."""

    code: ClassVar[str] = "spawn_failed"


class KillError(SupervisorError):
    """The ladder ran to its end and these processes of the tree are still alive."""

    code: ClassVar[str] = "kill_failed"

    def __init__(
        self, survivors: Iterable[dict[str, Any]], steps: Iterable[str] = ("sigterm", "sigkill")
    ) -> None:
        #: ``{"pid", "command"}`` of each survivor
        self.survivors = sorted(survivors, key=lambda s: int(s["pid"]))
        self.pids = tuple(int(s["pid"]) for s in self.survivors)
        #: the ladder's steps, all taken in vain
        self.steps = list(steps)
        super().__init__(f"processes of the agent's tree survived SIGKILL: {list(self.pids)}")


def os_error_text(exc: OSError) -> str:
    """``Too many open files (EMFILE)``: the reason, and the errno's name to look up."""
    name = errno.errorcode.get(exc.errno) if exc.errno is not None else None
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


def _check_executable(
    program: str, env: Mapping[str, str] | None, cwd: str | os.PathLike[str] | None
) -> None:
    """Fail fast and clearly on the common error; the shim still reports races (exit 127)."""
    if os.sep in program:
        path = program if cwd is None else os.path.join(os.fspath(cwd), program)
        if not os.path.exists(path):
            reason = "No such file or directory (ENOENT)"
        elif os.path.isdir(path):
            reason = "Is a directory (EISDIR)"
        elif not os.access(path, os.X_OK):
            reason = "Permission denied (EACCES)"
        else:
            return
    else:
        search = (os.environ if env is None else env).get("PATH", os.defpath)
        if shutil.which(program, path=search) is not None:
            return
        reason = "not found on PATH or not executable (ENOENT)"
    raise SpawnError(f"cannot execute {program!r}: {reason}")


#: After a cancelled turn ends, the processes it started get this long to exit by themselves
#: before they are killed: claude-agent-acp's Bash tool exits 5-18 ms after the agent answers
#: the cancel, and its own short helpers (``claude auth status``) finish within ~100 ms; what is
#: still running then was left behind (codex-acp's shell command runs on for good).
TOOL_SETTLE_S = 0.25
#: How many times the sweep of a turn's leftovers looks again for what appeared meanwhile
#: (each look freezes and kills what it finds; a quiet tree needs one).
SWEEP_MAX_ROUNDS = 5
#: Start times in /proc are in clock ticks (10 ms); compare with that much slack.
_CLOCK_SLACK_S = 0.02


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def tree_clock() -> float:
    """Now, in seconds since boot: the clock of a process's start time in /proc (its ticks
    since boot), so comparing the two is exact. (psutil's ``create_time`` adds the boot time to
    it, which /proc/stat gives in whole seconds and which moves when the wall clock is set; and
    reading it cost a file read on every prompt.)"""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _started_at(proc: psutil.Process) -> float | None:
    ticks = tree.start_ticks(proc.pid)
    return None if ticks is None else ticks / _CLOCK_TICKS


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


async def _open_piped(
    wrapper: list[str],
    argv: list[str],
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None,
    *,
    pass_fds: tuple[int, ...] = (),
    terminal: int | None = None,
) -> trio.Process:
    """``wrapper + argv`` with piped stdio (or ``terminal``, a pseudo-terminal's slave end, as
    all three), leading a new session (so, its process group)."""
    stdio: int = subprocess.PIPE if terminal is None else terminal
    try:
        return await trio.lowlevel.open_process(
            [*wrapper, *argv],
            stdin=stdio,
            stdout=stdio,
            stderr=stdio,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        raise SpawnError(f"cannot execute {argv[0]!r}: {os_error_text(exc)}") from exc


def set_terminal_size(fd: int, cols: int, rows: int) -> None:
    """Give the pseudo-terminal ``fd`` (either end) the size ``cols`` x ``rows``; the kernel
    sends SIGWINCH to its foreground process group when that changes the size."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _NoOutput(trio.abc.ReceiveStream):
    """The stderr of an agent in a pseudo-terminal: its stderr is the terminal, read as its
    stdout; this one ends at once."""

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class AgentProcess(ABC):
    """One agent and its tree. Use ``async with``: leaving it leaves no process behind.

    Make one with :meth:`spawn`; it returns a :class:`CgroupProcess` or a :class:`ShimProcess`.
    """

    #: ``cgroup`` or ``shim``
    containment: ClassVar[str]
    #: our child: the agent itself (cgroup) or its shim
    pid: int
    stdin: trio.abc.SendStream
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    #: the tree's mark (``AGENT_SUPERVISOR_TREE`` in its environment)
    mark: str
    #: steps taken when the tree was found loose after its leader died (``containment_lost``,
    #: ``sigkill``), reported with the exit
    lost_steps: list[str]

    def __init__(
        self, proc: trio.Process, argv: Sequence[str], mark: str, terminal: int | None = None
    ) -> None:
        """Use :meth:`spawn`. ``terminal``: the master end of the agent's pseudo-terminal,
        which becomes ours (its stdin and stdout; it has no stderr of its own)."""
        self._proc = proc
        self._argv = tuple(argv)
        self.pid = proc.pid
        if terminal is None:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            self.stdin = proc.stdin
            self.stdout = proc.stdout
            self.stderr = proc.stderr
        else:
            self.stdin = trio.lowlevel.FdStream(os.dup(terminal))
            self.stdout = trio.lowlevel.FdStream(terminal)
            self.stderr = _NoOutput()
        #: the non-blocking pipe under ``stdin``, for writes that must not wait a task switch
        self.stdin_fd = cast(trio.lowlevel.FdStream, self.stdin).fileno()
        self.mark = mark
        self.lost_steps = []
        #: members SIGKILL did not kill (never our child: psutil may wait for them)
        self._stubborn: list[psutil.Process] = []
        #: what the agent left running outlived the cleanup grace and was SIGKILLed
        self.cleanup_killed = False
        # Taken now, while our child is certainly alive and ours: psutil pins the start time,
        # so this object can never signal a stranger that inherited the pid.
        self._leader = psutil.Process(proc.pid)
        leader = Member.of(self._leader)
        self.started_ticks = leader.started if leader is not None else None
        #: every member seen so far, by pid (identity is pid and start time)
        self._known: dict[int, Member] = {}
        self._kill_lock = trio.Lock()
        # Our own thread token, so the shielded ladder never queues behind other threads.
        self._thread_limiter = trio.CapacityLimiter(1)
        self._settling = False
        self._settled = trio.Event()

    @staticmethod
    async def spawn(
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        containment: Containment | str | None = None,
        terminal: tuple[int, int] | None = None,
    ) -> AgentProcess:
        """Start ``argv`` contained (see the module docstring), in a new session, piped stdio.

        ``terminal`` (columns, rows): in a pseudo-terminal of that size instead of pipes, as
        its stdin, stdout and stderr, and as the agent's controlling terminal (it leads a
        session of its own, so it gets SIGWINCH when the size changes and SIGHUP when the
        terminal goes). ``stdout`` and ``stdin`` are then the terminal's master end.

        ``env`` replaces the environment (as in subprocess); the tree's mark is added to it.
        ``containment`` is a :class:`Containment`, a mode (``auto``, ``cgroup``, ``shim``) or
        None (``AGENT_SUPERVISOR_CONTAINMENT``, else ``auto``). Raises :class:`SpawnError` if
        ``argv[0]`` is not an executable (looked up on ``env``'s PATH) or cannot be started.
        """
        argv = list(argv)
        if not argv:
            raise SpawnError("cannot execute an empty command")
        _check_executable(argv[0], env, cwd)
        if not isinstance(containment, Containment):
            containment = await choose(containment)
        mark = secrets.token_hex(8)
        environment = dict(os.environ if env is None else env)
        environment[TREE_MARK_VARIABLE] = mark
        master = slave = None
        try:
            if terminal is not None:
                master, slave = os.openpty()
                set_terminal_size(master, *terminal)
                argv = [*_CTTY_PREFIX, *argv]
            if containment.root is not None:
                return await CgroupProcess.start(
                    argv, environment, cwd, mark, containment.root, terminal=(master, slave)
                )
            return await ShimProcess.start(argv, environment, cwd, mark, terminal=(master, slave))
        except OSError as exc:  # out of file descriptors for a pipe, say: the cause, named
            if master is not None:
                os.close(master)
            raise SpawnError(f"cannot start {argv[0]!r}: {os_error_text(exc)}") from exc
        except BaseException:
            if master is not None:
                os.close(master)
            raise
        finally:
            if slave is not None:
                os.close(slave)  # the agent's now: its end must close when its tree is gone

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else self.returncode.description
        return f"<{type(self).__name__} {self.pid} {list(self._argv)!r}: {state}>"

    @property
    def returncode(self) -> ExitStatus | None:
        """None while our child runs; the agent's exit once it is gone (the shim mirrors it)."""
        code = self._proc.returncode
        return None if code is None else ExitStatus.from_returncode(code)

    async def wait(self) -> ExitStatus:
        """Until the agent has exited and nothing it left behind is alive (see
        :attr:`survivors` for what could not be killed, :attr:`lost_steps` for how)."""
        status = ExitStatus.from_returncode(await self._proc.wait())
        if not self._settling:
            self._settling = True
            try:
                with trio.CancelScope(shield=True):
                    await self._settle()
            finally:
                self._settled.set()
        else:
            await self._settled.wait()
        return status

    @property
    def survivors(self) -> list[dict[str, Any]]:
        """``{"pid", "command"}`` of processes of the tree still alive although it was killed
        (in uninterruptible sleep, or not ours to signal): nothing may be started beside them."""
        unique = {proc.pid: proc for proc in self._stubborn}
        return tree.describe(proc for proc in unique.values() if tree.alive(proc))

    async def close_stdin(self) -> None:
        """EOF on the agent's stdin: the polite way to ask many agents to exit."""
        await self.stdin.aclose()

    @abstractmethod
    def signal(self, signum: int) -> None:
        """Deliver ``signum`` to every process of the tree (Amp's interrupt is a SIGINT)."""

    @abstractmethod
    def members(self) -> list[psutil.Process]:
        """The tree's live processes below our child (the agent's descendants, and with the
        shim the agent too). Each is remembered, for when containment is lost."""

    def memory_bytes(self) -> int:
        """The resident memory of every live member of the tree, summed (blocking: a scan;
        shared pages count once per process, so this is an upper bound, like ``ps``)."""
        total = 0
        for member in self.members():
            try:
                total += member.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return total

    def _remember(self, processes: Iterable[psutil.Process]) -> list[psutil.Process]:
        found = []
        for process in processes:
            member = self._known.get(process.pid)
            if member is None or not member.is_same():
                member = Member.of(process)
                if member is None:
                    continue
                self._known[process.pid] = member
            found.append(process)
        return found

    @abstractmethod
    async def _settle(self) -> None:
        """Our child is reaped: make sure nothing of the tree is left (containment-specific)."""

    async def _kill_loose(self, loose: list[psutil.Process], why: str) -> None:
        """Containment was lost and these members are loose: SIGKILL them now (nothing keeps
        them together any more; a polite SIGTERM would give them time to scatter)."""
        log.warning("%s: killing %d loose process(es) of %r", why, len(loose), self._argv[:3])
        self.lost_steps = ["containment_lost", "sigkill"]
        self._stubborn = await tree.kill_and_verify(
            loose, timeout=VERIFY_S, limiter=self._thread_limiter
        )

    @property
    def exit_steps(self) -> list[str]:
        """What had to be done after the agent exited by itself: :attr:`lost_steps`, and
        ``sigkill`` if what it left running outlived the cleanup grace."""
        steps = list(self.lost_steps)
        if self.cleanup_killed and "sigkill" not in steps:
            steps.append("sigkill")
        return steps

    async def kill_tree(self, term_timeout: float = 1.0) -> list[str]:
        """The kill ladder (see the module docstring); returns the steps taken, in order.

        ``[]`` if the tree had already gone, ``["sigterm"]`` if it went on SIGTERM,
        ``["sigterm", "sigkill"]`` otherwise (``["containment_lost", "sigkill"]`` when the shim
        had died and its tree was loose). Shielded and bounded: it finishes even if the caller
        is cancelled. On return no process of the tree is alive; if that cannot be achieved,
        :class:`KillError` names the survivors.
        """
        if term_timeout < 0:
            raise ValueError(f"term_timeout must be >= 0, not {term_timeout}")
        with trio.CancelScope(shield=True):
            async with self._kill_lock:
                if self._proc.returncode is not None:
                    await self.wait()  # settles: a loose tree is killed there
                    steps = self.exit_steps
                    if self._stubborn:  # they survived SIGKILL before: try again
                        self._stubborn = await tree.kill_and_verify(
                            self._stubborn, timeout=VERIFY_S, limiter=self._thread_limiter
                        )
                else:
                    steps = await self._ladder(term_timeout)
                    await self.wait()
                    if self.lost_steps:  # the shim died under the ladder: say so, in order
                        steps = [step for step in steps if step != "sigkill"]
                        steps += ["containment_lost", "sigkill"]
        if self.survivors:
            raise KillError(self.survivors, steps)
        return steps

    @abstractmethod
    async def _ladder(self, term_timeout: float) -> list[str]:
        """SIGTERM, wait, SIGKILL, verify; our child is reaped (or dead) when it returns."""

    async def kill_descendants_since(
        self, since: float, *, settle: float = TOOL_SETTLE_S, term_timeout: float = 0.5
    ) -> list[dict[str, Any]]:
        """Kill the processes of the tree started at or after ``since`` (a :func:`tree_clock`)
        that are still running after ``settle`` seconds: the tools of one turn, which the agent
        should have stopped. The agent itself and what it started earlier are left alone.

        SIGTERM, up to ``term_timeout`` for them to go, then SIGKILL. What appears meanwhile (a
        loop that starts them, one forked in answer to the SIGTERM, one started just after the
        agent's answer) is found by looking again, frozen (SIGSTOP) as it is found and
        SIGKILLed, until a look finds nothing new (at most ``SWEEP_MAX_ROUNDS`` looks). Returns
        ``{"pid", "command"}`` for each process killed.
        """
        with trio.CancelScope(shield=True):
            started = self._started_since(since)
            if not started:
                return []
            victims = await trio.to_thread.run_sync(
                functools.partial(tree.wait_gone, started, settle),
                limiter=self._thread_limiter,
            )
            killed = tree.describe(victims)
            if victims:
                tree.signal_all(victims, signal.SIGTERM)
                tree.signal_all(victims, signal.SIGCONT)
                alive = await trio.to_thread.run_sync(
                    functools.partial(tree.wait_gone, victims, term_timeout),
                    limiter=self._thread_limiter,
                )
                survivors = await tree.kill_and_verify(
                    alive, timeout=VERIFY_S, limiter=self._thread_limiter
                )
                if survivors:
                    raise KillError(tree.describe(survivors))
            seen = set(started)
            for _ in range(SWEEP_MAX_ROUNDS):
                frozen: list[psutil.Process] = []
                for _ in range(FREEZE_MAX_SCANS):
                    fresh = [proc for proc in self._started_since(since) if proc not in seen]
                    if not fresh:
                        break
                    for proc in fresh:  # stopped as found: nothing it forks gets away
                        tree.send_signal(proc, signal.SIGSTOP)
                        seen.add(proc)
                        frozen.append(proc)
                    await trio.lowlevel.checkpoint()
                if not frozen:
                    break
                killed += tree.describe(frozen)
                survivors = await tree.kill_and_verify(
                    frozen, timeout=VERIFY_S, limiter=self._thread_limiter
                )
                if survivors:
                    raise KillError(tree.describe(survivors))
        return killed

    def _started_since(self, since: float) -> list[psutil.Process]:
        return [
            proc for proc in self.members() if (_started_at(proc) or 0.0) >= since - _CLOCK_SLACK_S
        ]

    def _signal_group(self, signum: int) -> None:
        """killpg, only while our child is unreaped: until then its pid, hence the group id,
        cannot be reused."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    def _term(self, members: Iterable[psutil.Process]) -> None:
        """SIGTERM then SIGCONT to the group and to every member that left it."""
        outside = [proc for proc in members if _pgid(proc) != self.pid]
        for signum in (signal.SIGTERM, signal.SIGCONT):
            self._signal_group(signum)
            tree.signal_all(outside, signum)

    @abstractmethod
    def _release(self) -> None:
        """Let go of what containment holds once the tree is gone."""

    async def aclose(self) -> None:
        """Kill the tree if it still runs, close our pipe ends, reap. Shielded: never leaks."""
        with trio.CancelScope(shield=True):
            try:
                await self.kill_tree()
            finally:
                for stream in (self.stdin, self.stdout, self.stderr):
                    await stream.aclose()
                self._release()

    async def __aenter__(self) -> AgentProcess:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class CgroupProcess(AgentProcess):
    """The agent is our child, alone in a cgroup of its own (with whatever it starts)."""

    containment = "cgroup"

    def __init__(
        self,
        proc: trio.Process,
        argv: Sequence[str],
        mark: str,
        cgroup: Cgroup,
        *,
        terminal: int | None = None,
    ) -> None:
        super().__init__(proc, argv, mark, terminal)
        self.cgroup = cgroup

    @classmethod
    async def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        cwd: str | os.PathLike[str] | None,
        mark: str,
        root: CgroupRoot,
        *,
        terminal: tuple[int | None, int | None] = (None, None),
    ) -> CgroupProcess:
        try:
            cgroup = root.new_cgroup()
        except OSError as exc:
            raise SpawnError(f"cannot make a cgroup for {argv[0]!r}: {os_error_text(exc)}") from exc
        master, slave = terminal
        try:
            proc = await _open_piped(
                [*JOIN_AND_EXEC, os.fspath(cgroup.procs_file)], argv, env, cwd, terminal=slave
            )
        except SpawnError:
            cgroup.remove()
            raise
        return cls(proc, argv, mark, cgroup, terminal=master)

    def members(self) -> list[psutil.Process]:
        found = []
        for pid in self.cgroup.pids():
            if pid == self.pid:
                continue
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
        return self._remember(found)

    def signal(self, signum: int) -> None:
        # What the shim does for its tree: the agent and every process it started.
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signum)
        tree.signal_all(self.members(), signum)

    def _escaped(self) -> list[psutil.Process]:
        """Members outside the cgroup: only a process allowed to write another cgroup's
        ``cgroup.procs`` can get there, but then only the mark still finds it. (Asked of each
        process, not of ``cgroup.procs``, which drops a dying process a moment before it is
        a zombie.)"""
        ours = self.cgroup.name
        return [proc for proc in tree.marked(self.mark) if tree.cgroup_of(proc.pid) != ours]

    async def _settle(self) -> None:
        # The agent exited: what it left running gets SIGTERM, then the cgroup is killed.
        if self.cgroup.populated():
            self._term(self.members())
            if not await self.cgroup.wait_empty(CLEANUP_GRACE_S):
                self.cleanup_killed = True
                self.cgroup.kill()
                await self.cgroup.wait_empty(VERIFY_S)
        # A /proc scan (~0.3 ms per 70 processes): in a thread, so a busy host's many exits never
        # hold up other sessions' steps.
        escaped = await trio.to_thread.run_sync(self._escaped, limiter=self._thread_limiter)
        if escaped:
            await self._kill_loose(escaped, f"agent {self.pid}: processes left its cgroup")
        for pid in self.cgroup.pids():  # still here after cgroup.kill: they outlived SIGKILL
            with contextlib.suppress(psutil.Error):
                self._stubborn.append(psutil.Process(pid))

    async def _ladder(self, term_timeout: float) -> list[str]:
        steps = ["sigterm"]
        self._term(self.members())
        # The tree gets ``term_timeout`` to go, as under the shim: the agent exits, what it
        # left gets the shim's cleanup grace and is then killed by that cleanup, not by us.
        with trio.move_on_after(term_timeout) as window:
            await self._proc.wait()
            if not await self.cgroup.wait_empty(CLEANUP_GRACE_S):
                self.cleanup_killed = True
                self.cgroup.kill()
                await self.cgroup.wait_empty(math.inf)
        if window.cancelled_caught or self.cleanup_killed:
            steps.append("sigkill")
            self.cgroup.kill()
            await self.cgroup.wait_empty(VERIFY_S)
        with trio.move_on_after(SHIM_REAP_S):
            await self._proc.wait()
        if self._proc.returncode is None:  # not even the agent died of SIGKILL
            self._stubborn = self.members()
            raise KillError(tree.describe([self._leader, *self._stubborn]), steps)
        return steps

    def _release(self) -> None:
        if not self.cgroup.remove_tree():
            log.warning("cannot remove %s: still in use", self.cgroup.path)


class ShimProcess(AgentProcess):
    """The agent runs below the containment shim, our child, which we watch."""

    containment = "shim"

    def __init__(
        self,
        proc: trio.Process,
        argv: Sequence[str],
        mark: str,
        lifeline: socket.socket,
        *,
        terminal: int | None = None,
    ) -> None:
        super().__init__(proc, argv, mark, terminal)
        self._lifeline: socket.socket | None = lifeline

    @classmethod
    async def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        cwd: str | os.PathLike[str] | None,
        mark: str,
        *,
        terminal: tuple[int | None, int | None] = (None, None),
    ) -> ShimProcess:
        # We hold one end (close-on-exec, never passed); when we die the kernel closes it and
        # the shim reads EOF. The other end goes to the shim alone; it writes on it just before
        # a clean exit.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            wrapper = [*_SHIM_PREFIX, "--lifeline-fd", str(theirs.fileno()), "--"]
            proc = await _open_piped(
                wrapper, argv, env, cwd, pass_fds=(theirs.fileno(),), terminal=terminal[1]
            )
        except SpawnError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(proc, argv, mark, ours, terminal=terminal[0])

    def members(self) -> list[psutil.Process]:
        if self._proc.returncode is not None:
            return self._loose()
        try:
            found = self._leader.children(recursive=True)
        except psutil.Error:
            found = []
        return self._remember(found)

    def signal(self, signum: int) -> None:
        # The shim forwards SIGINT, SIGTERM and SIGHUP to every process of the tree.
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signum)
        else:
            tree.signal_all(self._loose(), signum)

    def _exited_cleanly(self) -> bool:
        """The shim said, just before exiting, that no descendant was left."""
        if self._lifeline is None:
            return False
        try:
            said = self._lifeline.recv(1)
        except OSError:
            return False
        self.cleanup_killed = said == _TREE_GONE_KILLED
        return said in (_TREE_GONE, _TREE_GONE_KILLED)

    def _loose(self) -> list[psutil.Process]:
        """The tree's members once the shim is gone: every process proved to be one (see
        ``supervisor/agents/tree.py``): seen before, in the shim's session, or carrying the mark."""
        return self._remember(self._find_loose(list(self._known.values())))

    def _find_loose(self, known: list[Member]) -> list[psutil.Process]:
        """The /proc scans of :meth:`_loose`; touches no state, so it may run in a thread."""
        found: dict[int, psutil.Process] = {}
        for member in known:
            process = tree.identify(member.pid, member.started)
            if process is not None and tree.alive(process):
                found[process.pid] = process
        if self.started_ticks is not None:
            for proc in tree.in_session(self.pid):
                started = tree.start_ticks(proc.pid)
                if started is not None and started >= self.started_ticks:
                    found.setdefault(proc.pid, proc)
        for proc in tree.marked(self.mark):
            found.setdefault(proc.pid, proc)
        found.pop(self.pid, None)
        return list(found.values())

    async def _settle(self) -> None:
        if self._exited_cleanly():
            return
        known = list(self._known.values())
        loose = self._remember(
            await trio.to_thread.run_sync(self._find_loose, known, limiter=self._thread_limiter)
        )
        if loose:
            status = self.returncode
            why = f"shim {self.pid} died ({status.description if status else '?'})"
            await self._kill_loose(loose, why)

    async def _ladder(self, term_timeout: float) -> list[str]:
        steps = ["sigterm"]
        seen = {proc.pid: proc for proc in self.members()}
        self._term(seen.values())
        with trio.move_on_after(term_timeout):
            await self._proc.wait()

        if self._proc.returncode is None:
            steps.append("sigkill")
            await self._freeze_and_kill(seen)
        with trio.move_on_after(SHIM_REAP_S):
            await self._proc.wait()
        if self._proc.returncode is None:
            raise KillError(tree.describe([self._leader]), steps)
        # Did the shim exit cleanly? If it died (killed by someone, or by us as a last resort),
        # the loose tree is killed here, and the steps say so.
        await self.wait()
        if self.cleanup_killed and "sigkill" not in steps:
            steps.append("sigkill")  # the shim's cleanup killed what the agent left
        lingering = [proc for proc in seen.values() if tree.alive(proc)]
        if lingering:  # nothing should be: the shim, or the settling, killed them all
            if "sigkill" not in steps:
                steps.append("sigkill")
            self._stubborn += await tree.kill_and_verify(
                lingering, timeout=VERIFY_S, limiter=self._thread_limiter
            )
        return steps

    async def _freeze_and_kill(self, seen: dict[int, psutil.Process]) -> None:
        """Stop the tree so that nobody forks while we look, then kill it; the shim last."""
        frozen_pids: set[int] = set()
        for _ in range(FREEZE_MAX_SCANS):
            fresh = [proc for proc in self.members() if proc.pid not in frozen_pids]
            if not fresh:
                break
            for proc in fresh:
                tree.send_signal(proc, signal.SIGSTOP)
                frozen_pids.add(proc.pid)
                seen.setdefault(proc.pid, proc)
            await trio.lowlevel.checkpoint()
        tree.signal_all(seen.values(), signal.SIGKILL)

        # A healthy shim now reaps them all and exits with the agent's status (SIGKILL).
        with trio.move_on_after(SHIM_EXIT_S):
            await self._proc.wait()
        if self._proc.returncode is None:
            for proc in self.members():  # a stuck shim: last look, then the shim itself
                seen.setdefault(proc.pid, proc)
                tree.send_signal(proc, signal.SIGKILL)
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def _release(self) -> None:
        if self._lifeline is not None:
            # After a KillError this also tells a still-living shim to kill everything.
            self._lifeline.close()
            self._lifeline = None
