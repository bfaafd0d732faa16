"""A stored session started again after a restart, whose agent cannot resume its own session,
gets what the store kept of the conversation with the next prompt; one that resumes gets the
prompt alone. In-memory agents, on the real clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from helpers import run_turn
from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 30.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


@pytest.mark.parametrize("resumes", [False, True])
async def test_a_restarted_session_whose_agent_cannot_resume_gets_what_was_said(
    tmp_path: Path, resumes: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    launcher = AcpLauncher(AcpBehaviour(words=3, word_interval=0.01))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            first = await sup.start_session("fake")
            await run_turn(first, "remember the number 42")
        last = first.last_seq
        launcher.behaviour = AcpBehaviour(words=3, word_interval=0.01, resumes=resumes)
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            await sup.get("s1").prompt("what was the number?")
            async with sup.get("s1").subscribe(since_seq=last) as events:
                async for event in events:
                    if isinstance(event, ev.TurnStarted):
                        started = event
                    if event.kind == "turn.ended":
                        break
    given = launcher.agents[-1].turns[0]
    assert started.text == "what was the number?"
    if resumes:
        assert given == "what was the number?"
        assert started.context is None and started.context_bytes is None
        return
    assert given.startswith("The conversation so far, for context")
    assert "User: remember the number 42\n\nAssistant: w0 w1 w2" in given
    assert given.endswith("\n\nwhat was the number?")
    assert started.context == "injected"
    assert started.context_bytes == len(given.encode()) - len(b"what was the number?")
