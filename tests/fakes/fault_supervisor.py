"""A supervisor process to be killed with SIGKILL mid-turn (``tests/faults/test_supervisor_crash.py``).

    python fault_supervisor.py STATE_DIR AGENT_STATE_DIR

Runs ``open_supervisor(state_dir=STATE_DIR)`` with the demo agent (which ignores SIGTERM and the
cancel), starts a turn that leaks background processes (one in its own session, one ignoring
SIGTERM) and streams, and once the turn is streaming prints one JSON line::

    {"supervisor": pid, "shim": pid, "agent": pid, "setsid": pid, "tree": [pids...]}

(``tree``: every descendant of this process). Then it sleeps while the turn streams on, until
it is killed.
"""

from __future__ import annotations

import json
import os
import sys

import psutil
import trio

from supervisor import AgentSpec, open_supervisor


async def main(state_dir: str, agent_state_dir: str) -> None:
    demo = AgentSpec.from_config("demo").with_args(
        "--state-dir", agent_state_dir, "--ignore-sigterm", "--delay", "0.02"
    )
    async with open_supervisor(agents={"demo": demo}, state_dir=state_dir) as sup:
        session = await sup.start_session("demo", cwd="/")
        async with session.subscribe() as events:
            await session.prompt("grandchildren ignore-cancel words=1000000")
            setsid = None
            async for event in events:
                if event.kind == "tool.call":
                    setsid = event.raw["rawOutput"]["setsidGrandchild"]  # type: ignore[attr-defined]
                if event.kind == "message.delta" and setsid is not None:
                    break
        [shim] = psutil.Process().children()
        [agent] = shim.children()
        tree = [p.pid for p in psutil.Process().children(recursive=True)]
        report = {
            "supervisor": os.getpid(),
            "shim": shim.pid,
            "agent": agent.pid,
            "setsid": setsid,
            "tree": tree,
        }
        print(json.dumps(report), flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
