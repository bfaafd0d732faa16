"""The ACP Python SDK side of ``bench/peer_acp.py``, in its own process (the SDK is asyncio).

Started by ``bench/peer_acp.py`` with the demo agent's command line after ``--``. It spawns the
agent with the SDK (``acp.spawn_agent_process``), opens a session, and then serves one round per
command line on its stdin, answering one JSON line on its stdout, timed here with this process's
own clock (no clocks are compared across processes):

- ``coop``: prompt, wait for the first ``agent_message_chunk``, ``await conn.cancel()`` and wait
  for ``prompt()`` to return ``stopReason: cancelled``: ``{"cancel_ms": ...}``.
- ``wedged CAP``: a fresh agent, prompt ``go ignore-cancel`` (the demo agent ignores the cancel
  for that turn), cancel, wait for the prompt to return up to ``CAP`` seconds (the SDK has no
  escalation), then leave ``spawn_agent_process`` (stdin EOF, 2 s, SIGTERM, 2 s, SIGKILL):
  ``{"ended_ms": ... | null, "teardown_ms": ...}``.
- ``quit``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.schema import AgentMessageChunk


class BenchClient:
    """The least a client needs: it watches for the turn's first word."""

    def __init__(self) -> None:
        self.first_chunk = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk):
            self.first_chunk.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # the benchmark's turns ask none

    def on_connect(self, conn: Any) -> None:
        pass


async def open_session(conn: Any) -> str:
    await conn.initialize(protocol_version=PROTOCOL_VERSION)
    session = await conn.new_session(cwd="/", mcp_servers=[])
    return str(session.session_id)


async def one_cancel(conn: Any, client: BenchClient, session_id: str, text: str, cap: float | None):
    """Prompt, cancel on the first word; seconds from the cancel to the prompt's end, or None."""
    client.first_chunk.clear()
    turn = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block(text)]))
    await client.first_chunk.wait()
    start = time.perf_counter()
    await conn.cancel(session_id=session_id)
    try:
        response = await asyncio.wait_for(asyncio.shield(turn), cap)
    except TimeoutError:
        turn.cancel()
        return None
    assert response.stop_reason == "cancelled", response
    return time.perf_counter() - start


async def wedged(agent: list[str], cap: float) -> dict[str, Any]:
    client = BenchClient()
    start = time.perf_counter()
    async with spawn_agent_process(client, agent[0], *agent[1:]) as (conn, _process):
        session_id = await open_session(conn)
        ended = await one_cancel(conn, client, session_id, "go ignore-cancel", cap)
        start = time.perf_counter()
    return {
        "ended_ms": None if ended is None else ended * 1000,
        "teardown_ms": (time.perf_counter() - start) * 1000,
    }


async def main(agent: list[str]) -> None:
    loop = asyncio.get_running_loop()
    client = BenchClient()
    async with spawn_agent_process(client, agent[0], *agent[1:]) as (conn, _process):
        session_id = await open_session(conn)
        print(json.dumps({"ready": True}), flush=True)
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                break
            if line[0] == "coop":
                elapsed = await one_cancel(conn, client, session_id, "go", None)
                assert elapsed is not None
                answer: dict[str, Any] = {"cancel_ms": elapsed * 1000}
            elif line[0] == "wedged":
                answer = await wedged(agent, float(line[1]))
            else:
                answer = {"error": f"unknown command {line[0]!r}"}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    separator = sys.argv.index("--")
    asyncio.run(main(sys.argv[separator + 1 :]))
