"""Cgroup keeper: kills every agent of one supervisor process when that process dies.

Run as a plain script, one per supervisor process (not per agent), never imported:

    python -S -E -P /abs/path/supervisor/agents/cgroup_keeper.py --lifeline-fd N --report-fd M ROOT

``ROOT`` is the supervisor's root cgroup (``supervisor/agents/cgroups.py``); every agent tree
lives in a cgroup below it. The supervisor holds the only write end of the lifeline pipe and
never writes to it, so EOF means the supervisor is gone (however it died: the kernel closes
the pipe). Then ``ROOT/cgroup.kill`` SIGKILLs every process below ROOT at once, and once they are
gone the cgroup directories are removed, deepest first. The keeper lives in the supervisor's
own cgroup, not below ROOT, so the kill cannot reach it. Stdlib only, like the shim.
"""

import os
import select
import sys
import time

#: How long the kill may take to empty ROOT before the keeper gives up on removing it (a
#: process in uninterruptible sleep dies only when it wakes; the next supervisor sweeps).
EMPTY_WAIT_S = 10.0
#: Where inotify is unavailable, how often ``cgroup.events`` is read instead.
POLL_S = 0.005


def _watch(events: str) -> int | None:
    """An inotify descriptor that turns readable when ``events`` changes (kernfs sends a
    "modified" event on every change of ``populated``); None if inotify is unavailable."""
    try:
        import ctypes  # only now: the keeper's start stays small

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0o4000 | 0o2000000)  # IN_NONBLOCK | IN_CLOEXEC
        if fd >= 0 and libc.inotify_add_watch(fd, events.encode(), 0x2) >= 0:  # IN_MODIFY
            return int(fd)
        if fd >= 0:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    return None


def _populated(root: str) -> bool:
    try:
        with open(os.path.join(root, "cgroup.events")) as events:
            return "populated 1" in events.read()
    except OSError:
        return False


def main() -> None:
    args = sys.argv[1:]
    if len(args) != 5 or args[0] != "--lifeline-fd" or args[2] != "--report-fd":
        os.write(2, b"usage: cgroup_keeper.py --lifeline-fd N --report-fd M ROOT\n")
        os._exit(2)
    lifeline, report, root = int(args[1]), int(args[3]), args[4]
    # Detach: the supervisor waits for this first process, which exits at once; the keeper
    # goes on as init's child, and says which pid it is.
    pid = os.fork()
    if pid > 0:
        os.write(report, str(pid).encode())
        os._exit(0)
    os.close(report)
    while True:
        try:
            if not os.read(lifeline, 512):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    try:
        with open(os.path.join(root, "cgroup.kill"), "w") as kill:
            kill.write("1")
    except OSError:
        pass
    deadline = time.monotonic() + EMPTY_WAIT_S
    watch = _watch(os.path.join(root, "cgroup.events"))  # before the first look: no race
    while _populated(root) and time.monotonic() < deadline:
        if watch is None:
            time.sleep(POLL_S)
            continue
        select.select([watch], [], [], max(0.0, deadline - time.monotonic()))
        try:
            while os.read(watch, 4096):
                pass
        except BlockingIOError:
            pass
    for directory, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        try:
            os.rmdir(directory)
        except OSError:
            pass


if __name__ == "__main__":
    main()
