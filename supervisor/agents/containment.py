"""Which containment keeps agent process trees together in this process: a cgroup or the shim.

- ``cgroup``: a cgroup v2 per agent process (``supervisor/agents/cgroups.py``): the kernel keeps the
  tree and kills it; no helper process per agent, one keeper per supervisor process.
- ``shim``: the agent runs below ``supervisor/agents/shim.py``, a child subreaper (one small Python
  process per agent), and the supervisor watches the shim and takes over if it dies.

``auto`` (the default) takes ``cgroup`` when :func:`supervisor.agents.cgroups.detect` proves it
works here and this process is neither pid 1 nor a child subreaper (agents' orphans would then be
re-parented to us, and we reap only our own children: they would stay zombies), else ``shim``.
The mode comes from ``open_supervisor(containment=...)``, else the environment variable
``AGENT_SUPERVISOR_CONTAINMENT``, else ``auto``. Detection runs once per process, in a thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

import trio
from attrs import frozen

from supervisor.agents.cgroups import CgroupRoot, detect
from supervisor.errors import SupervisorError

__all__ = [
    "CONTAINMENT_VARIABLE",
    "MODES",
    "Containment",
    "ContainmentUnavailable",
    "choose",
    "choose_blocking",
]

log = logging.getLogger(__name__)

CONTAINMENT_VARIABLE = "AGENT_SUPERVISOR_CONTAINMENT"
MODES = ("auto", "cgroup", "shim")
_PR_GET_CHILD_SUBREAPER = 37


@frozen
class Containment:
    """The containment agents get, and, for logs and ``agents``, why."""

    kind: str  # "cgroup" or "shim"
    detail: str
    root: CgroupRoot | None = None


class ContainmentUnavailable(SupervisorError):
    code = "spawn_failed"


_lock = threading.Lock()
_cgroup: CgroupRoot | str | None = None  # detected once: the root, or why not


def _reaps_orphans() -> str | None:
    """Why orphans would land on this process, if they would."""
    if os.getpid() == 1:
        return "this process is pid 1"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value:
            return "this process is a child subreaper"
    except (OSError, AttributeError):
        pass
    return None


def _cgroup_root() -> CgroupRoot | str:
    global _cgroup
    with _lock:
        if _cgroup is None:
            _cgroup = detect()
            if isinstance(_cgroup, str):
                log.info("agent containment: no cgroups (%s); using the shim", _cgroup)
            else:
                log.info("agent containment: a cgroup per agent under %s", _cgroup.path)
        return _cgroup


def _mode(mode: str | None) -> str:
    chosen = mode or os.environ.get(CONTAINMENT_VARIABLE) or "auto"
    if chosen not in MODES:
        raise ContainmentUnavailable(
            f"unknown containment {chosen!r} (one of {', '.join(MODES)};"
            f" from {'the argument' if mode else CONTAINMENT_VARIABLE})"
        )
    return chosen


def choose_blocking(mode: str | None = None) -> Containment:
    """The containment for ``mode`` (see the module docstring); blocks on first detection."""
    chosen = _mode(mode)
    if chosen == "shim":
        return Containment("shim", "the containment shim, as asked")
    orphans = _reaps_orphans()
    cgroup = _cgroup_root() if orphans is None else orphans
    if isinstance(cgroup, CgroupRoot):
        return Containment("cgroup", f"a cgroup v2 per agent under {cgroup.path}", cgroup)
    if chosen == "cgroup":
        raise ContainmentUnavailable(f"cgroup containment asked for, but {cgroup}")
    return Containment("shim", f"the containment shim ({cgroup})")


async def choose(mode: str | None = None) -> Containment:
    """:func:`choose_blocking` without blocking the trio loop on the first detection."""
    if _cgroup is not None or _mode(mode) == "shim":
        return choose_blocking(mode)
    return await trio.to_thread.run_sync(choose_blocking, mode)
