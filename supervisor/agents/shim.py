"""Containment shim: runs one agent and makes sure none of its descendants outlive it.

Run as a plain script, never imported by the supervisor:

    python -S -E -P /abs/path/supervisor/shim.py --lifeline-fd N -- CMD ARGS...

The shim marks itself child-subreaper, so every process the agent starts stays below it even
after a double fork or ``setsid``: orphans are re-parented to the shim, not to init. It hands its
stdio descriptors straight to the agent (no copying) and then points its own at /dev/null, so
the supervisor sees EOF on stdout as soon as the agent tree closes it.

- SIGTERM, SIGINT, SIGHUP are forwarded to every descendant (also those that left the group).
- When the agent exits, the remaining descendants get SIGTERM, then SIGKILL after
  ``CLEANUP_GRACE_S``; the shim exits with the agent's status (mirroring a fatal signal).
- EOF on the lifeline (the supervisor died: it held the other end) kills the tree at once.
- The lifeline is one end of a socket pair: just before exiting, with no descendant left, the
  shim writes one byte on it. A shim that exits without that byte was killed (an OOM kill,
  ``pkill -9``) and may have left its tree loose: the supervisor then kills the tree itself.

The shim never uses ``PR_SET_PDEATHSIG``: it fires when the *thread* that spawned the child
exits, and trio spawns from worker threads that exit after ~10 s idle.

"No descendant is left" is decided by ``waitpid(-1)`` failing with ECHILD, which the kernel
answers atomically: as a subreaper, the shim has a descendant if and only if it has a child.
The /proc walk is only used to find whom to signal.

Startup cost matters (one shim per agent), so this imports the C ``_signal`` module instead of
``signal`` (which pulls in ``enum``, ~6 ms of the ~20 ms total) and nothing beyond os, select
and ctypes. Stdlib only: it must not import the ``supervisor`` package.
"""

import os  # frozen into the interpreter, like sys: no sys.path lookup
import sys

# Without -P the script's own directory (supervisor/) leads sys.path and a sibling module could
# shadow a stdlib one; drop it before importing anything found on sys.path.
_here = os.path.dirname(os.path.abspath(__file__))
if not sys.flags.safe_path and sys.path and sys.path[0] == _here:
    del sys.path[0]

import select  # noqa: E402
import time  # noqa: E402

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import NoReturn
else:
    import _signal as signal

PROG = "agent-supervisor shim"

PR_SET_CHILD_SUBREAPER = 36

# After the agent exits, how long its leftovers get between SIGTERM and SIGKILL. The brief's
# measurement: a cooperative tree with a setsid grandchild dies in ~0.2 s after SIGTERM; the
# supervisor's own ladder gives the whole tree 1 s by default, so this must stay below that.
CLEANUP_GRACE_S = 0.5

# How often the shim rescans /proc while it is SIGKILLing: a process forked just before its
# parent died is re-parented to us without any notification, so we look again. The interval
# doubles up to the maximum, so a process we may not kill (EPERM: a setuid child) costs little.
KILL_RESCAN_S = 0.005
KILL_RESCAN_MAX_S = 0.5

# Written on the lifeline once no descendant is left, just before the shim exits; the second
# if some of them had to be SIGKILLed (they outlived the cleanup grace, or the lifeline broke).
TREE_GONE = b"1"
TREE_GONE_KILLED = b"2"

# Forwarded to every descendant: the usual "please stop" signals.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# Caught and dropped so that a stray ``kill(0, sig)`` from inside the agent's process group
# cannot kill or stop the shim (its death would orphan the tree to init). Handlers set by
# Python are reset to the default by exec, so the agent still sees these normally.
SHIELDED = (
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
    signal.SIGALRM,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
)

# CPython ignores these at startup; an exec'd program would inherit SIG_IGN, so the agent gets
# them back at their defaults (what subprocess's restore_signals does).
RESTORED_FOR_AGENT = (signal.SIGPIPE, signal.SIGXFSZ)

_pending: list[int] = []


def _on_signal(signum: int, frame: object) -> None:
    """Only records; the main loop acts. The wakeup fd interrupts the loop's poll()."""
    _pending.append(signum)


def _usage(message: str) -> "NoReturn":
    os.write(2, f"{PROG}: {message}\nusage: shim.py [--lifeline-fd N] -- CMD [ARGS...]\n".encode())
    os._exit(2)


def _parse(argv: list[str]) -> tuple[int | None, list[str]]:
    """Tiny by hand: argparse alone would cost more than the whole shim's startup budget."""
    lifeline: int | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            cmd = argv[i + 1 :]
            if not cmd:
                _usage("no command given")
            return lifeline, cmd
        if arg == "--lifeline-fd" and i + 1 < len(argv):
            try:
                lifeline = int(argv[i + 1])
                os.fstat(lifeline)
            except (ValueError, OSError):
                _usage(f"bad --lifeline-fd {argv[i + 1]!r}")
            i += 2
            continue
        _usage(f"unexpected argument {arg!r}")
    _usage("missing '--' before the command")


def _become_subreaper() -> None:
    """Without this, orphans of the agent go to init and out of our reach; say so, carry on."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        message = f"{PROG}: warning: PR_SET_CHILD_SUBREAPER failed: {os.strerror(err)}\n"
        os.write(2, message.encode())


def _descendants(root: int) -> list[int]:
    """Every process below ``root``, from the ppid field of /proc/*/stat (no /proc/*/children
    on kernels without CONFIG_PROC_CHILDREN). A snapshot: callers rescan."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
        except OSError:
            continue
        try:
            data = os.read(fd, 512)
        except OSError:
            continue
        finally:
            os.close(fd)
        # "pid (comm) state ppid ...": comm may contain spaces and ')', so split after the last ')'.
        fields = data[data.rfind(b")") + 2 :].split(b" ", 2)
        if len(fields) < 2:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:  # ESRCH: it died meanwhile; EPERM: it changed credentials, can't help
            pass


class _Shim:
    """The event loop's state. Modes: running, cleaning (agent gone), killing."""

    def __init__(self, lifeline: int | None) -> None:
        self.me = os.getpid()
        self.lifeline = lifeline
        self.agent_pid = -1
        self.agent_status: int | None = None  # raw wait status
        self.cleaning_until: float | None = None  # set when the agent has exited
        self.killing = False  # lifeline lost, or the cleanup grace is over
        self.rescan_s = KILL_RESCAN_S
        self.termed: set[int] = set()
        self.sigkilled = False  # a descendant was sent SIGKILL

    def reap(self) -> bool:
        """Reap every waitable child; True once no child (hence no descendant) is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if pid == self.agent_pid:
                self.agent_status = status

    def forward(self, signum: int) -> None:
        _signal_all(_descendants(self.me), signum)

    def step(self) -> None:
        """Called after every wakeup: advance cleanup or killing by one scan."""
        now = time.monotonic()
        if self.agent_status is not None and self.cleaning_until is None:
            self.cleaning_until = now + CLEANUP_GRACE_S
        if self.cleaning_until is not None and now >= self.cleaning_until:
            self.killing = True
        if self.killing:
            doomed = _descendants(self.me)
            if doomed:
                self.sigkilled = True
            _signal_all(doomed, signal.SIGKILL)
        elif self.cleaning_until is not None:
            fresh = [pid for pid in _descendants(self.me) if pid not in self.termed]
            _signal_all(fresh, signal.SIGTERM)
            self.termed.update(fresh)

    def timeout_ms(self) -> int | None:
        if self.killing:
            timeout, self.rescan_s = self.rescan_s, min(self.rescan_s * 2, KILL_RESCAN_MAX_S)
            return int(timeout * 1000)
        if self.cleaning_until is not None:
            return max(1, int((self.cleaning_until - time.monotonic()) * 1000) + 1)
        return None

    def run(self, wake_r: int) -> None:
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        if self.lifeline is not None:
            poller.register(self.lifeline, select.POLLIN)
        while True:
            done = self.reap()
            while _pending:
                signum = _pending.pop(0)
                if signum in FORWARDED and self.cleaning_until is None and not self.killing:
                    self.forward(signum)
            if (self.agent_status is not None or self.killing) and done:
                return
            self.step()
            if (self.agent_status is not None or self.killing) and self.reap():
                return
            for fd, events in poller.poll(self.timeout_ms()):
                if fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                elif fd == self.lifeline and self._lifeline_lost(events):
                    poller.unregister(fd)
                    self.killing = True

    def _lifeline_lost(self, events: int) -> bool:
        if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return True
        assert self.lifeline is not None
        try:
            return os.read(self.lifeline, 512) == b""
        except BlockingIOError:
            return False


def _exit_like(status: int | None) -> "NoReturn":
    """Exit with the agent's status; for a fatal signal, die of the same signal."""
    if status is None:  # the agent was never reaped: we are here because the lifeline broke
        os._exit(128 + signal.SIGKILL)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    signum = os.WTERMSIG(status)
    import resource  # only on this path: don't leave a core file of the shim beside the agent's

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # only if the signal was somehow not fatal


def main() -> "NoReturn":
    lifeline, cmd = _parse(sys.argv[1:])
    _become_subreaper()

    wake_r, wake_w = os.pipe()  # both close-on-exec, as Python makes every fd
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    for signum in (signal.SIGCHLD, *FORWARDED, *SHIELDED):
        signal.signal(signum, _on_signal)
    if lifeline is not None:
        os.set_inheritable(lifeline, False)  # the agent must not keep the supervisor's lifeline
        os.set_blocking(lifeline, False)

    shim = _Shim(lifeline)
    try:
        shim.agent_pid = os.posix_spawnp(
            cmd[0],
            cmd,
            os.environ,
            setsigmask=(),
            setsigdef=RESTORED_FOR_AGENT,
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        os.write(2, f"{PROG}: cannot execute {cmd[0]!r}: {reason}\n".encode(errors="replace"))
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)

    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd, inheritable=False)
    os.close(devnull)

    shim.run(wake_r)
    if lifeline is not None:
        try:
            os.write(lifeline, TREE_GONE_KILLED if shim.sigkilled else TREE_GONE)
        except OSError:  # the supervisor is gone: nobody to tell
            pass
    _exit_like(shim.agent_status)


if __name__ == "__main__":
    main()
