"""Make a process really unkillable for a while: the test stand-in for uninterruptible sleep.

A task in a *frozen* cgroup-v1 freezer cgroup does not act on SIGKILL until it is thawed: it
shows as ``D`` (uninterruptible) in ``ps``, exactly like a process stuck in the kernel on a dead
NFS server or a hung disk. Nothing our supervisor (or the shim, or ``cgroup.kill``) does can
kill it, which is the point: the receipt must say it survived instead of claiming the tree is
dead. On leaving, the process is SIGKILLed and thawed, so it dies for real.

Needs the v1 freezer (mounted beside cgroup v2 on hybrid hosts, writable as root);
:func:`freezer_reason` says why not where it is missing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

FREEZER = Path("/sys/fs/cgroup/freezer")


def freezer_reason() -> str | None:
    """None if :func:`unkillable` can work here, else why not."""
    if not (FREEZER / "freezer.state").exists() and not (FREEZER / "tasks").exists():
        return "no cgroup-v1 freezer is mounted at /sys/fs/cgroup/freezer"
    if not os.access(FREEZER, os.W_OK):
        return "the cgroup-v1 freezer is not writable"
    return None


def require_freezer() -> None:
    """Skip (or fail, under ``AGENT_SUPERVISOR_STRICT_SKIPS=1`` as in CI) without a freezer."""
    reason = freezer_reason()
    if reason is not None:
        if os.environ.get("AGENT_SUPERVISOR_STRICT_SKIPS") == "1":
            pytest.fail(f"{reason}; AGENT_SUPERVISOR_STRICT_SKIPS=1, so this fails")
        pytest.skip(reason)


@contextlib.contextmanager
def unkillable(pid: int) -> Iterator[None]:
    """While inside: ``pid`` survives SIGKILL (frozen in a v1 freezer cgroup)."""
    group = FREEZER / f"agent-supervisor-test-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        (group / "tasks").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            pass  # FREEZING -> FROZEN takes microseconds; the kernel gives no event to wait on
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        (group / "freezer.state").write_text("THAWED")
        # The thawed task dies of its pending SIGKILL and leaves the group, which can then go.
        for _ in range(100_000):
            try:
                group.rmdir()
                break
            except OSError:
                continue
