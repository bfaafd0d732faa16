"""One agent OS process under the containment shim: spawn, stdio, exit status, the kill ladder.

The agent runs below ``supervisor/shim.py`` (see its docstring): a child-subreaper that keeps the
agent's whole tree below it, forwards SIGTERM to all of it, cleans up after the agent, and kills
the tree when the lifeline pipe we hold breaks (our death). This module never changes
process-wide settings: no prctl on ourselves, no SIGCHLD handler, no ``waitpid(-1)``. The only
process we reap is the shim, our child, through trio; psutil waits are never pointed at it
(``psutil.Process.wait`` would ``waitpid`` our child and steal its status from trio).

Kill ladder, top to bottom (``kill_tree``):

1. ``sigterm``: SIGTERM (then SIGCONT, so a stopped agent can act on it, as systemd does) to the
   shim's process group, and to every descendant that left the group; the shim forwards too.
2. Wait ``term_timeout`` for the shim to exit. The shim exits only once it has no child left,
   and as a subreaper that means no descendant left: its exit proves the tree is gone.
3. ``sigkill``: freeze every descendant with SIGSTOP (not the shim: it must stay alive so that
   orphans keep landing below it), rescan until nothing new appears, SIGKILL them all. The shim
   sees the agent die, reaps the rest and exits; if it does not, SIGKILL it and its group.
4. Verify with psutil that every process seen on the way is gone, re-killing survivors.

Every wait in the ladder is bounded and the ladder is shielded from cancellation: it always
finishes within ``term_timeout`` plus at most ~4 s (the bounds below), and either returns with
the tree dead or raises :class:`KillError` naming the survivors (e.g. a ``sudo`` child we may
not signal, or a process stuck in uninterruptible sleep). A zombie counts as gone: it runs no
code, and in the normal path the shim reaps every one before it exits.

Measured on 2 cores: a cooperative tree of 5 processes is gone ~6 ms after ``kill_tree`` starts;
a tree that ignores SIGTERM ~15 ms after ``term_timeout`` runs out.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

import psutil
import trio
from attrs import frozen

from supervisor.errors import SupervisorError

__all__ = ["SHIM_PATH", "AgentProcess", "ExitStatus", "KillError", "SpawnError"]

SHIM_PATH = Path(__file__).with_name("shim.py")

# -S -E: no site, no PYTHON* variables: the shim is stdlib only and starts in ~20 ms.
# -P: don't put supervisor/ first on the shim's sys.path, where a sibling module could shadow
# a stdlib one.
_SHIM_PREFIX = (sys.executable, "-S", "-E", "-P", os.fspath(SHIM_PATH))

# Bounds of the steps after SIGTERM. With a healthy shim the SIGKILL step takes milliseconds;
# these only matter when the shim itself is stopped or stuck.
FREEZE_MAX_SCANS = 20  # rescans until no new descendant appears (1-2 in practice)
SHIM_EXIT_S = 1.0  # for the shim to notice its children died and exit by itself
SHIM_REAP_S = 1.0  # for a SIGKILLed shim to be reaped
VERIFY_S = 2.0  # for every process seen to be gone, re-killing survivors
VERIFY_SLICE_S = 0.05  # one psutil.wait_procs call; survivors are re-killed between calls


@frozen
class ExitStatus:
    """How the agent ended, as the shim mirrors it: an exit code or a fatal signal."""

    code: int | None
    signal: int | None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """Subprocess convention: negative means killed by that signal."""
        if returncode < 0:
            return cls(code=None, signal=-returncode)
        return cls(code=returncode, signal=None)

    @property
    def description(self) -> str:
        """For humans and logs: ``exit 0`` or ``killed by SIGKILL``."""
        if self.signal is None:
            return f"exit {self.code}"
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        return f"killed by {name}"


class SpawnError(SupervisorError):
    """The agent could not be started; the message names ``argv[0]`` and the reason."""

    code: ClassVar[str] = "spawn_failed"


class KillError(SupervisorError):
    """The ladder ran to its end and these processes of the tree are still alive."""

    code: ClassVar[str] = "kill_failed"

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = tuple(sorted(pids))
        super().__init__(f"processes of the agent's tree survived SIGKILL: {list(self.pids)}")


def _check_executable(
    program: str, env: Mapping[str, str] | None, cwd: str | os.PathLike[str] | None
) -> None:
    """Fail fast and clearly on the common error; the shim still reports races (exit 127)."""
    if os.sep in program:
        path = program if cwd is None else os.path.join(os.fspath(cwd), program)
        if not os.path.exists(path):
            reason = "No such file or directory"
        elif os.path.isdir(path):
            reason = "Is a directory"
        elif not os.access(path, os.X_OK):
            reason = "Permission denied"
        else:
            return
    else:
        search = (os.environ if env is None else env).get("PATH", os.defpath)
        if shutil.which(program, path=search) is not None:
            return
        reason = "not found on PATH or not executable"
    raise SpawnError(f"cannot execute {program!r}: {reason}")


def _quietly_signal(proc: psutil.Process, signum: int) -> None:
    """Signal unless it already died (or its pid was reused: psutil checks the start time)."""
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        proc.send_signal(signum)


#: After a cancelled turn ends, the processes it started get this long to exit by themselves
#: before they are killed: claude-agent-acp's Bash tool exits 5-18 ms after the agent answers
#: the cancel, and its own short helpers (``claude auth status``) finish within ~100 ms; what is
#: still running then was left behind (codex-acp's shell command runs on for good).
TOOL_SETTLE_S = 0.25
#: psutil start times are in clock ticks (10 ms); compare with that much slack.
_CLOCK_SLACK_S = 0.02


def tree_clock() -> float:
    """Now, on the clock of psutil's ``create_time``: boot time plus time since boot.

    ``create_time`` is the integer boot time from /proc/stat plus ticks since boot, so it can be
    up to a second off ``time.time()``; comparing with this clock instead is exact.
    """
    return float(psutil.boot_time()) + time.clock_gettime(time.CLOCK_BOOTTIME)


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:200] or proc.name()
    except psutil.Error:
        return "?"


def _started_at(proc: psutil.Process) -> float | None:
    try:
        return float(proc.create_time())
    except psutil.Error:
        return None


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


class AgentProcess:
    """One agent under its shim. Use ``async with``: leaving it leaves no process behind."""

    pid: int
    stdin: trio.abc.SendStream
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream

    def __init__(self, proc: trio.Process, lifeline: int, argv: Sequence[str]) -> None:
        """Use :meth:`spawn`."""
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._lifeline: int | None = lifeline
        self._argv = tuple(argv)
        self.pid = proc.pid
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        # Taken now, while the shim is certainly alive and ours: psutil pins the start time,
        # so this object can never signal a stranger that inherited the pid.
        self._shim = psutil.Process(proc.pid)
        self._kill_lock = trio.Lock()
        # Our own thread token, so the shielded ladder never queues behind other threads.
        self._thread_limiter = trio.CapacityLimiter(1)

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> AgentProcess:
        """Start ``argv`` under the shim, in a new session with piped stdio.

        ``env`` replaces the environment (as in subprocess). Raises :class:`SpawnError` if
        ``argv[0]`` is not an executable (looked up on ``env``'s PATH) or the shim can't start.
        If the command vanishes between that check and the exec, the shim writes
        ``agent-supervisor shim: cannot execute ...`` to stderr and exits 127 (126 if denied).
        """
        argv = list(argv)
        if not argv:
            raise SpawnError("cannot execute an empty command")
        _check_executable(argv[0], env, cwd)
        # The supervisor holds the only write end (close-on-exec, never passed); when we die,
        # the kernel closes it and the shim reads EOF. The read end goes to the shim alone.
        lifeline_r, lifeline_w = os.pipe()
        try:
            proc = await trio.lowlevel.open_process(
                [*_SHIM_PREFIX, "--lifeline-fd", str(lifeline_r), "--", *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,
                pass_fds=(lifeline_r,),
            )
        except OSError as exc:
            os.close(lifeline_w)
            raise SpawnError(f"cannot execute {argv[0]!r}: {exc}") from exc
        finally:
            os.close(lifeline_r)
        return cls(proc, lifeline_w, argv)

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else self.returncode.description
        return f"<AgentProcess shim={self.pid} {list(self._argv)!r}: {state}>"

    @property
    def returncode(self) -> ExitStatus | None:
        """None while the shim runs; it mirrors the agent's exit once the tree is gone."""
        code = self._proc.returncode
        return None if code is None else ExitStatus.from_returncode(code)

    async def wait(self) -> ExitStatus:
        """Until the agent has exited and the shim has cleaned up what it left behind."""
        return ExitStatus.from_returncode(await self._proc.wait())

    async def close_stdin(self) -> None:
        """EOF on the agent's stdin: the polite way to ask many agents to exit."""
        await self.stdin.aclose()

    def tree(self) -> list[psutil.Process]:
        """Snapshot of the shim and its live descendants (empty once the shim is gone)."""
        if self._proc.returncode is not None:
            return []
        return [self._shim, *self._descendants()]

    async def kill_descendants_since(
        self, since: float, *, settle: float = TOOL_SETTLE_S, term_timeout: float = 0.5
    ) -> list[dict[str, Any]]:
        """Kill the processes of the tree started at or after ``since`` (a :func:`tree_clock`)
        that are still running after ``settle`` seconds: the tools of one turn, which the agent
        should have stopped. The agent itself and what it started earlier are left alone.

        SIGTERM, up to ``term_timeout`` for them to go, then SIGKILL. Returns ``{"pid",
        "command"}`` for each process killed.
        """
        with trio.CancelScope(shield=True):
            started = [
                proc
                for proc in self._descendants()
                if (_started_at(proc) or 0.0) >= since - _CLOCK_SLACK_S
            ]
            if not started:
                return []
            _, lingering = await trio.to_thread.run_sync(
                functools.partial(psutil.wait_procs, started, timeout=settle),
                limiter=self._thread_limiter,
            )
            victims = [(proc, _command(proc)) for proc in lingering if _is_alive(proc)]
            if not victims:
                return []
            for proc, _ in victims:
                _quietly_signal(proc, signal.SIGTERM)
                _quietly_signal(proc, signal.SIGCONT)
            _, alive = await trio.to_thread.run_sync(
                functools.partial(psutil.wait_procs, [p for p, _ in victims], timeout=term_timeout),
                limiter=self._thread_limiter,
            )
            for proc in alive:
                _quietly_signal(proc, signal.SIGKILL)
            await self._verify_gone(alive)
        return [{"pid": proc.pid, "command": command} for proc, command in victims]

    def _descendants(self) -> list[psutil.Process]:
        try:
            return self._shim.children(recursive=True)
        except psutil.Error:
            return []

    def _signal_group(self, signum: int) -> None:
        """killpg, only while the shim is unreaped: until then its pid, hence the group id,
        cannot be reused."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    async def kill_tree(self, term_timeout: float = 1.0) -> list[str]:
        """The kill ladder (see the module docstring); returns the steps taken, in order.

        ``[]`` if the shim had already exited, ``["sigterm"]`` if the tree went on SIGTERM,
        ``["sigterm", "sigkill"]`` otherwise. Shielded and bounded: it finishes even if the
        caller is cancelled. On return no process of the tree is alive; if that cannot be
        achieved, :class:`KillError`.
        """
        if term_timeout < 0:
            raise ValueError(f"term_timeout must be >= 0, not {term_timeout}")
        with trio.CancelScope(shield=True):
            async with self._kill_lock:
                steps = await self._kill_ladder(term_timeout)
        return steps

    async def _kill_ladder(self, term_timeout: float) -> list[str]:
        steps: list[str] = []
        if self._proc.returncode is not None:
            return steps
        seen = {proc.pid: proc for proc in self._descendants()}

        steps.append("sigterm")
        for signum in (signal.SIGTERM, signal.SIGCONT):
            self._signal_group(signum)
            for proc in seen.values():
                if _pgid(proc) != self.pid:  # left the group: killpg did not reach it
                    _quietly_signal(proc, signum)
        with trio.move_on_after(term_timeout):
            await self._proc.wait()

        if self._proc.returncode is None:
            steps.append("sigkill")
            await self._freeze_and_kill(seen)
        if await self._verify_gone(seen.values()) and "sigkill" not in steps:
            steps.append("sigkill")  # the shim died early (killed by someone) and left orphans
        return steps

    async def _freeze_and_kill(self, seen: dict[int, psutil.Process]) -> None:
        """Stop the tree so that nobody forks while we look, then kill it; the shim last."""
        frozen_pids: set[int] = set()
        for _ in range(FREEZE_MAX_SCANS):
            fresh = [proc for proc in self._descendants() if proc.pid not in frozen_pids]
            if not fresh:
                break
            for proc in fresh:
                _quietly_signal(proc, signal.SIGSTOP)
                frozen_pids.add(proc.pid)
                seen.setdefault(proc.pid, proc)
            await trio.lowlevel.checkpoint()
        for proc in seen.values():
            _quietly_signal(proc, signal.SIGKILL)

        # A healthy shim now reaps them all and exits with the agent's status (SIGKILL).
        with trio.move_on_after(SHIM_EXIT_S):
            await self._proc.wait()
        if self._proc.returncode is None:
            for proc in self._descendants():  # a stuck shim: last look, then the shim itself
                seen.setdefault(proc.pid, proc)
                _quietly_signal(proc, signal.SIGKILL)
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            with trio.move_on_after(SHIM_REAP_S):
                await self._proc.wait()
            if self._proc.returncode is None:
                raise KillError([self.pid])

    async def _verify_gone(self, procs: Iterable[psutil.Process]) -> bool:
        """Wait until none of ``procs`` is alive, SIGKILLing survivors; True if any had to be.

        ``procs`` never contains the shim: psutil would waitpid() it behind trio's back.
        """
        alive = [proc for proc in procs if _is_alive(proc)]
        if not alive:
            return False
        with trio.move_on_after(VERIFY_S):
            while alive:
                for proc in alive:
                    _quietly_signal(proc, signal.SIGKILL)
                await trio.to_thread.run_sync(
                    functools.partial(psutil.wait_procs, alive, timeout=VERIFY_SLICE_S),
                    limiter=self._thread_limiter,
                )
                alive = [proc for proc in alive if _is_alive(proc)]
        if alive:
            raise KillError(proc.pid for proc in alive)
        return True

    async def aclose(self) -> None:
        """Kill the tree if it still runs, close our pipe ends, reap. Shielded: never leaks."""
        with trio.CancelScope(shield=True):
            try:
                await self.kill_tree()
            finally:
                for stream in (self.stdin, self.stdout, self.stderr):
                    await stream.aclose()
                if self._lifeline is not None:
                    # After a KillError this also tells a still-living shim to kill everything.
                    os.close(self._lifeline)
                    self._lifeline = None

    async def __aenter__(self) -> AgentProcess:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
