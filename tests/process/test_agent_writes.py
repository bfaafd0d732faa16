"""When the session writes to an agent's stdin: a caller's step writes the interrupt last.

Real process, real clock. A pipe write wakes its reader on the writer's core, to run once the
writer sleeps, so whatever the writing step does after the write delays the agent's read by
as long: the link holds what the step sends and writes it as the step's last act.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import pytest
import trio

from paths import REPO
from supervisor import AgentSpec, open_supervisor
from supervisor.agents.process_link import ProcessLink

pytestmark = pytest.mark.real_process

LIGHT_AGENT = REPO / "bench" / "fake_light_agent.py"
LIMIT_S = 20  # generous: real processes on a loaded CI box


def _spec() -> AgentSpec:
    argv = [sys.executable, "-S", str(LIGHT_AGENT), "--interval", "600"]
    return AgentSpec(name="light", protocol="acp", command=argv)


async def test_the_interrupt_is_written_after_the_cancels_bookkeeping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the write of ``session/cancel`` the session already says ``cancelling`` and its
    subscriber holds that event, and the write is made in the caller's own task."""
    written: list[tuple[str, int, trio.lowlevel.Task]] = []
    with trio.fail_after(LIMIT_S):
        async with open_supervisor(agents={"light": _spec()}) as sup:
            session = await sup.start_session("light", cwd="/")
            async with session.subscribe() as events:
                await session.prompt("go")
                async for event in events:
                    if event.kind == "message.delta":
                        break
                write = os.write

                def watching(fd: int, data: Any) -> int:
                    if b"session/cancel" in bytes(data):
                        written.append(
                            (session.state, events.pending, trio.lowlevel.current_task())
                        )
                    return write(fd, data)

                monkeypatch.setattr(os, "write", watching)
                receipt = await session.cancel()
                monkeypatch.setattr(os, "write", write)
                assert written == [("cancelling", 1, trio.lowlevel.current_task())]
                assert receipt.outcome == "cancelled"
                assert session.state == "ready"


async def test_held_writes_go_out_in_order_at_release_and_before_a_signal() -> None:
    """Held, each message is taken (encoded) and nothing reaches the pipe; on release they
    are written at once, in order; a signal sent while held goes after what came before it."""
    with trio.fail_after(LIMIT_S):
        async with open_supervisor(agents={"light": _spec()}) as sup:
            session = await sup.start_session("light", cwd="/")
            link = session._link
            assert isinstance(link, ProcessLink)
            order: list[str] = []
            write = os.write

            def recording(fd: int, data: Any) -> int:
                order.extend(json.loads(line)["method"] for line in bytes(data).splitlines())
                return write(fd, data)

            def signalling(signum: int) -> None:
                order.append(f"signal {signum}")

            link.process.signal = signalling  # type: ignore[method-assign]
            os.write = recording
            try:
                link.hold_writes()
                link.send({"jsonrpc": "2.0", "method": "one"})
                link.send({"jsonrpc": "2.0", "method": "two"})
                assert order == []
                link.signal(signal.SIGWINCH)
                link.send({"jsonrpc": "2.0", "method": "three"})
                assert order[-1] == f"signal {signal.SIGWINCH}"
                link.release_writes()
                link.release_writes()  # nothing left: a no-op
            finally:
                os.write = write
            assert order == ["one", "two", f"signal {signal.SIGWINCH}", "three"]
            await session.stop()
