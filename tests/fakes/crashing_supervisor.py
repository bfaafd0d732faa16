"""A supervisor process for the crash-safety test: starts an agent tree, reports, waits.

    python crashing_supervisor.py STATE_DIR -- AGENT ARGV...

Prints one JSON line ``{"shim": pid, "tree": [pids...]}`` once the agent reported ready, then
sleeps until killed (the test kills it, and the shim, with SIGKILL).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from protocols.framing import Message
from supervisor.agent_link import ProcessLauncher, ProcessLink
from supervisor.config import AgentSpec
from supervisor.link import AgentFrame
from supervisor.statefile import StateFile


async def main(state_dir: str, argv: list[str]) -> None:
    state = StateFile(Path(state_dir))
    state.open()
    launcher = ProcessLauncher(state)
    spec = AgentSpec(name="tree", protocol="acp", command=argv)
    send, receive = trio.open_memory_channel[object](100)
    async with trio.open_nursery() as nursery:
        link = await launcher(spec, cwd="/", resume=None, generation=1, inbox=send, nursery=nursery)
        assert isinstance(link, ProcessLink)
        async for item in receive:
            if isinstance(item, AgentFrame) and isinstance(item.frame, Message):
                if item.frame.payload.get("ready"):
                    tree = [
                        link.process.pid,
                        item.frame.payload["pid"],
                        *item.frame.payload["pids"],
                    ]
                    print(json.dumps({"shim": link.process.pid, "tree": tree}), flush=True)
                    break
        await trio.sleep_forever()


if __name__ == "__main__":
    separator = sys.argv.index("--")
    trio.run(main, sys.argv[1], sys.argv[separator + 1 :])
