"""Runs a command with the terminal on its stdin as its controlling terminal.

Run as a plain script, never imported by the supervisor, between the containment and an agent
that runs in a pseudo-terminal:

    python -S -E -P /abs/path/supervisor/agents/ctty.py CMD ARGS...

A program gets a controlling terminal only as a session leader, by asking for it
(``TIOCSCTTY``); inheriting the terminal as its stdio is not enough, and without it the agent
gets no SIGWINCH when the terminal is resized, no SIGINT for a Ctrl-C typed in raw mode's
absence, and no SIGHUP when the terminal goes. So this leads a new session unless it already
does (under the cgroup's wrapper it does; below the shim it does not), takes the terminal, and
execs the command, which keeps all of it. Stdlib only, like the shim.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal  # (as the shim: ``signal`` pulls in ``enum``)

import fcntl  # noqa: E402
import termios  # noqa: E402

PROG = "agent-supervisor ctty"


def main() -> None:
    cmd = sys.argv[1:]
    if not cmd:
        os.write(2, f"{PROG}: no command given\n".encode())
        os._exit(2)
    if os.getsid(0) != os.getpid():
        os.setsid()
    try:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    except OSError as exc:
        os.write(2, f"{PROG}: stdin is not a terminal we can take: {exc}\n".encode())
        os._exit(126)
    # Exec keeps an ignored signal ignored: the agent gets these back at their defaults. CPython
    # ignores SIGPIPE and SIGXFSZ at startup (what subprocess's restore_signals undoes); a shell
    # ignores SIGINT and SIGQUIT in what a script runs in the background (``supervisor &``), and
    # the terminal's own keys (Ctrl-C, a TUI's interrupt) would then never reach the agent.
    for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        os.write(2, f"{PROG}: cannot execute {cmd[0]!r}: {reason}\n".encode(errors="replace"))
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
