"""The two versions a front and a node compare: the wire's number and the package's.

Standard library only: the bridge (``supervisor/node/bridge.py``) reads these too.

- :data:`WIRE` is what must agree: the bridge's hello and options, what the front asks of a
  node (the gateway's actions, ``spec``, ``task_id``, ``node_retired``) and what the events
  mean. A front and a node of the same wire number work together whatever their package
  versions; another wire number is ``version_mismatch``, naming both.
- The package version (``agent-supervisor``'s) only tells the nodes of one host apart: a
  bridge of a newer package retires the node of an older one (it drains: it serves its
  sessions and exits after the last one), and starts its own beside it.

Tests run a node "of another version" on this machine with :data:`TEST_VERSION_VARIABLE` and
:data:`TEST_WIRE_VARIABLE` in its environment (e.g. ``transport = ["env", "VAR=..."]``): they
are meant for tests only.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["TEST_VERSION_VARIABLE", "TEST_WIRE_VARIABLE", "WIRE", "package_version", "wire"]

#: Bump when the hello, the bridge's options, what a front asks of a node or what an event
#: means changes incompatibly (2: the node on a Unix socket, ``--instance``, ``node_retired``;
#: 3: ``session.held``, ``session.pause``/``session.resume``). A new event kind is such a change
#: too: a front refuses a kind it does not know as a protocol error of that node
#: (``supervisor/remote/frames.py``). What a node says it can do is no such change: the front
#: asks only what the node said (the subscribe answer's ``prompt_carries``, its ``checkpoints``:
#: a node too old to say is never asked for a rewind, ``RemoteSession.rewind``).
WIRE: Final = 3
#: For tests only: the package version a process says it is.
TEST_VERSION_VARIABLE: Final = "AGENT_SUPERVISOR_TEST_PACKAGE_VERSION"
#: For tests only: the wire number a process speaks.
TEST_WIRE_VARIABLE: Final = "AGENT_SUPERVISOR_TEST_WIRE"


def package_version() -> str:
    override = os.environ.get(TEST_VERSION_VARIABLE)
    if override:
        return override
    from importlib import metadata

    try:
        return metadata.version("agent-supervisor")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def wire() -> int:
    override = os.environ.get(TEST_WIRE_VARIABLE)
    return int(override) if override and override.isdigit() else WIRE
