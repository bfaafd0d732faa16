"""A supervisor process to be killed with SIGKILL mid-turn (``tests/faults/test_supervisor_crash.py``).

    python fault_supervisor.py STATE_DIR AGENT_STATE_DIR

Runs ``open_supervisor(state_dir=STATE_DIR)`` with the demo agent (which ignores SIGTERM and the
cancel), starts a turn that leaks background processes (one in its own session, one ignoring
SIGTERM) and streams, and once the turn is streaming prints one JSON line::

    {"supervisor": pid, "shim": pid, "keeper": pid, "agent": pid, "setsid": pid,
     "tree": [pids...]}

(``shim``: our child, the shim, or under cgroup containment the agent itself; ``keeper``: the
cgroup keeper, or None; ``tree``: every process of the agent's tree, our child included). Then
it sleeps while the turn streams on, until it is killed.
"""

from __future__ import annotations

import json
import os
import sys

import psutil
import trio

from supervisor import AgentSpec, open_supervisor
from supervisor.agents.containment import choose_blocking
from supervisor.agents.process import CgroupProcess


def _keeper_pid() -> int | None:
    root = choose_blocking().root
    return root.keeper_pid if root is not None else None


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
        process = session._link.process  # type: ignore[union-attr]
        members = process.members()
        keeper = process.cgroup.path if isinstance(process, CgroupProcess) else None
        agent = process.pid if keeper is not None else psutil.Process(process.pid).children()[0].pid
        report = {
            "supervisor": os.getpid(),
            "shim": process.pid,
            "keeper": _keeper_pid() if keeper is not None else None,
            "agent": agent,
            "setsid": setsid,
            "tree": [process.pid, *(p.pid for p in members)],
        }
        print(json.dumps(report), flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
