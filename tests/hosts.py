"""Hosts for the tests of sessions on other hosts that need no SSH: a node on this machine,
reached through the ``env`` transport (the whole path: bridge, node daemon, WebSocket over
stdio)."""

from __future__ import annotations

import os
import sys

from supervisor.remote import HostSpec


def env_node(
    state_dir: str | os.PathLike[str], *, name: str = "here", detach_s: float = 1.0
) -> HostSpec:
    """The host ``name``: a node of this Python, its state in ``state_dir``, keeping its
    sessions ``detach_s`` once nothing drives it."""
    return HostSpec(
        name=name,
        transport=["env"],
        command=[sys.executable, "-m", "supervisor"],
        detach_s=detach_s,
        state_dir=os.fspath(state_dir),
    )
