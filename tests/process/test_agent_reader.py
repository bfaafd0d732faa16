"""The stdout reader's steps: one step of trio's run loop per read that drains the pipe.

Real process, real clock. A step saved per read is a step saved on every cancel's answer: it
runs in the pass between the actor's step and its caller's, and under load a pass is long.
"""

from __future__ import annotations

import sys

import pytest
import trio

from paths import REPO
from supervisor import AgentSpec, open_supervisor

pytestmark = pytest.mark.real_process

LIGHT_AGENT = REPO / "bench" / "fake_light_agent.py"
WORDS = 20
LIMIT_S = 20  # generous: real processes on a loaded CI box


class ReaderSteps(trio.abc.Instrument):
    """Counts the steps of the agent link's task (its stdout reader), once switched on."""

    def __init__(self) -> None:
        self.on = False
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.on and task.name.endswith("._run_link"):
            self.steps += 1


async def test_a_read_that_drains_the_pipe_costs_the_reader_one_step() -> None:
    # One word every 20 ms: each read finds one line and drains the pipe.
    argv = [sys.executable, "-S", str(LIGHT_AGENT), "--interval", "0.02"]
    spec = AgentSpec(name="light", protocol="acp", command=argv)
    counter = ReaderSteps()
    with trio.fail_after(LIMIT_S):
        async with open_supervisor(agents={"light": spec}) as sup:
            session = await sup.start_session("light", cwd="/")
            async with session.subscribe() as events:
                await session.prompt("go")
                deltas = 0
                async for event in events:
                    if event.kind == "message.delta":
                        deltas += 1
                        if deltas == 1:
                            trio.lowlevel.add_instrument(counter)
                            counter.on = True
                        elif deltas == WORDS + 1:
                            counter.on = False
                            break
                trio.lowlevel.remove_instrument(counter)
                await session.cancel()
    # One step per word read (a read may find two if the box is slow: fewer steps, never
    # more); a reader that checkpointed after each post would take two per word.
    assert 1 <= counter.steps <= WORDS + 2, counter.steps
