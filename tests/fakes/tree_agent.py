"""A scriptable agent that grows a process tree, for the containment tests (stdlib only).

    python tree_agent.py [--ignore-sigterm] [--spawn KIND]...

KIND is one of ``child``, ``setsid``, ``double-fork``, each optionally suffixed with
``-ignore-term`` (the spawned process ignores SIGTERM):

- ``child``: a plain child that sleeps forever.
- ``setsid``: a child that sleeps forever, and below it a grandchild that called ``os.setsid()``
  (out of the agent's process group and session).
- ``double-fork``: a classic daemon: child -> grandchild (setsid) -> great-grandchild; the two
  in between exit, so the daemon is re-parented (to the shim, a subreaper; to init otherwise).

Every spawned process reports its pid once its signal handling is in place (the daemon also
waits until it has been re-parented), and only then does the agent print one line
``{"ready": true, "pid": <agent>, "pids": [<descendants>], "roles": {<role>: [<pids>]}}``
(roles: ``child``, ``setsid-parent``, ``setsid``, ``daemon``; pids in no particular order): a
test that waits for that line can signal at once without racing the setup.

Then it serves stdin, one command per line:
``exit N`` exits with code N (leaving its descendants behind), ``kill SIG`` kills itself with
signal SIG (a number), anything else is echoed back to stdout. On stdin EOF it sleeps forever.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

KINDS = ("child", "setsid", "double-fork")


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _become(report_w: int, role: str, *, ignore_term: bool) -> None:
    """Set up a spawned descendant: signals first, then report, then idle (never returns)."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_term else signal.SIG_DFL)
        os.write(report_w, f"{role} {os.getpid()}\n".encode())  # one write < PIPE_BUF: atomic
        os.close(report_w)
        _sleep_forever()
    finally:
        os._exit(0)


def _await_exit(pid: int) -> None:
    """Block until ``pid`` has exited; its orphans are re-parented before the pidfd fires."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    select.select([pidfd], [], [])
    os.close(pidfd)


def _fork() -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()


def spawn(kind: str, report_w: int) -> int:
    """Fork the processes of one KIND; returns how many pids they will report."""
    ignore_term = kind.endswith("-ignore-term")
    base = kind.removesuffix("-ignore-term")
    if base == "child":
        if _fork() == 0:
            _become(report_w, "child", ignore_term=ignore_term)
        return 1
    if base == "setsid":
        if _fork() == 0:
            if _fork() == 0:
                os.setsid()
                _become(report_w, "setsid", ignore_term=ignore_term)
            _become(report_w, "setsid-parent", ignore_term=ignore_term)
        return 2
    if base == "double-fork":
        middle = _fork()
        if middle == 0:
            try:
                if _fork() == 0:
                    os.setsid()
                    session_leader = os.getpid()
                    if _fork() == 0:
                        _await_exit(session_leader)  # report only once re-parented
                        _become(report_w, "daemon", ignore_term=ignore_term)
            finally:
                os._exit(0)
        os.waitpid(middle, 0)  # the first fork is ours to reap; the second is the shim's
        return 1
    raise SystemExit(f"tree_agent: unknown kind {kind!r}; use one of {KINDS} [+ '-ignore-term']")


def main(argv: list[str]) -> None:
    kinds: list[str] = []
    ignore_term = False
    args = iter(argv)
    for arg in args:
        if arg == "--ignore-sigterm":
            ignore_term = True
        elif arg == "--spawn":
            kinds.append(next(args))
        else:
            raise SystemExit(f"tree_agent: unexpected argument {arg!r}")
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    report_r, report_w = os.pipe()
    expected = sum(spawn(kind, report_w) for kind in kinds)
    os.close(report_w)
    pids: list[int] = []
    roles: dict[str, list[int]] = {}
    with os.fdopen(report_r, "rb") as reports:
        while len(pids) < expected:
            line = reports.readline()
            if not line:
                raise SystemExit("tree_agent: a descendant died before reporting")
            role, pid = line.split()
            pids.append(int(pid))
            roles.setdefault(role.decode(), []).append(int(pid))
    ready = {"ready": True, "pid": os.getpid(), "pids": pids, "roles": roles}
    print(json.dumps(ready), flush=True)

    for request in sys.stdin:
        command = request.split()
        if len(command) == 2 and command[0] == "exit":
            sys.stdout.flush()
            os._exit(int(command[1]))
        if len(command) == 2 and command[0] == "kill":
            os.kill(os.getpid(), int(command[1]))
            _sleep_forever()  # SIGSTOP and friends: not fatal, but no more commands either
        sys.stdout.write(request)
        sys.stdout.flush()
    _sleep_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
