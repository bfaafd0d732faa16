"""A supervisor process for the crash-safety test: starts an agent tree, reports, waits.

    python crashing_supervisor.py STATE_DIR -- AGENT ARGV...

Prints one JSON line ``{"shim": pid, "keeper": pid, "tree": [pids...]}`` once the agent
reported ready, then sleeps until killed (the test kills it, and what would kill its tree: the
shim, or the cgroup keeper, with SIGKILL). ``shim`` is our child: the shim, or the agent itself
in its cgroup; ``keeper`` is None under the shim.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trio

from protocols.framing import Message, decode_line
from supervisor.agents.containment import Containment, choose
from supervisor.agents.link import AgentLines
from supervisor.agents.process_link import ProcessLauncher, ProcessLink
from supervisor.agents.statefile import StateFile
from supervisor.config import AgentSpec


async def _ready_line(receive: trio.MemoryReceiveChannel[object]) -> dict[str, Any]:
    """The tree agent's ready line, from the lines its link posts."""
    async for item in receive:
        if isinstance(item, AgentLines):
            for line in item.lines:
                frame = decode_line(line) if isinstance(line, bytes) else line
                if isinstance(frame, Message) and frame.payload.get("ready"):
                    return frame.payload
    raise RuntimeError("the agent exited before its ready line")


async def main(state_dir: str, argv: list[str]) -> None:
    state = StateFile(Path(state_dir))
    state.open()
    launcher = ProcessLauncher(state, containment=await choose())
    spec = AgentSpec(name="tree", protocol="acp", command=argv)
    send, receive = trio.open_memory_channel[object](100)
    async with trio.open_nursery() as nursery:
        link = await launcher(spec, cwd="/", resume=None, generation=1, inbox=send, nursery=nursery)
        assert isinstance(link, ProcessLink)
        ready = await _ready_line(receive)
        tree = [link.process.pid, ready["pid"], *ready["pids"]]
        keeper = None
        if isinstance(launcher.containment, Containment) and launcher.containment.root:
            keeper = launcher.containment.root.keeper_pid
        report = {"shim": link.process.pid, "keeper": keeper, "tree": tree}
        print(json.dumps(report), flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    separator = sys.argv.index("--")
    trio.run(main, sys.argv[1], sys.argv[separator + 1 :])
