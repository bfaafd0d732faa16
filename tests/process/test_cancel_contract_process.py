"""Tier 3: the cancel contract on real processes, once for every protocol.

The cases of ``tests/actor/test_cancel_contract.py`` that real processes change, against each
protocol's agent as a subprocess (the built-in demo agent for ACP, the scripted fake CLIs of
``tests/fakes`` for the others: the agents of the fault suite, ``tests/faults/agents.py``), real
pipes and sockets, the real clock: a stop the agent obeys leaves its process alone; an agent
that ignores it is killed with its whole tree, a helper in a session of its own included, under
either containment, and the new process goes on with the session; a pending permission's
tool never runs. Bounds are generous (shared, slow machines); exact times are tier 2's. Every
fault against every protocol under both containments is the fault matrix
(``tests/faults/test_fault_matrix.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import psutil
import pytest
from faults import agents
from faults.agents import AGENTS, MANY, grandchild_pid, said_it_resumed
from faults.harness import FaultRecorder, living, session_of, tree

from helpers import KILLED, KILLED_HARD
from protocols import events as ev
from supervisor import Session

pytestmark = pytest.mark.real_process

#: Grace for an agent that stops as asked: never waited for in full, and long, so that a
#: loaded machine does not turn a stop into a kill.
COOPERATIVE_GRACE = 10.0
#: Grace for an agent that ignores the interrupt: the wait is what the case costs.
KILL_GRACE = 0.5
EXITED = ["interrupt", "respawned", "resumed"]  # Amp: its interrupt ends the process


@attrs.frozen
class Cli:
    """How one protocol's agent takes the cases: where they differ."""

    #: the receipt's stop_reason when it stops as asked
    stop_reason: str
    #: the start of the stderr line with which it says it got the interrupt (Amp: none, its
    #: interrupt is SIGINT, and its exit says it)
    heard: str | None
    #: the escalation of the kill (the demo agent's helpers include one that ignores SIGTERM)
    killed: list[str] = KILLED
    #: what makes it ask a permission, and the stop_reason once the cancel answered it (None:
    #: Amp has no permission protocol)
    permission: tuple[str, str] | None = None


CLIS = {
    "acp": Cli(
        stop_reason="cancelled",
        heard="demo-agent: session/cancel for ",
        killed=KILLED_HARD,
        permission=("permission", "cancelled"),
    ),
    "codex": Cli(
        stop_reason="interrupted",
        heard="fake-codex: interrupt ",
        permission=(f"approval {MANY}", "interrupted"),
    ),
    "claude": Cli(
        stop_reason="aborted_streaming",
        heard="fake_claude: got interrupt",
        permission=("permission", "aborted_tools"),
    ),
    "opencode": Cli(
        stop_reason="aborted",
        heard="fake-opencode: abort ",
        # It ignores the abort here: the reject alone ends the turn.
        permission=(f"wedged permission {MANY}", "permission_rejected"),
    ),
    "amp": Cli(stop_reason="cancelled", heard=None),
}
PROTOCOLS = list(CLIS)
WITH_PERMISSIONS = [p for p in PROTOCOLS if CLIS[p].permission is not None]


@asynccontextmanager
async def agent_session(
    protocol: str, state_dir: Path, grace: float, fault: str = ""
) -> AsyncIterator[tuple[Session, FaultRecorder]]:
    """A session of the protocol's agent (started as for ``fault`` of the fault suite),
    recorded; on the way out the events keep the invariants, and no process is left."""
    async with agents.agent_session(protocol, fault, state_dir, grace) as (_, session, rec, _):
        yield session, rec
        await rec.catch_up()
        rec.check_invariants()


async def next_prompt_completes(session: Session, rec: FaultRecorder) -> None:
    turn = await session.prompt("again words=3")
    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
    said = [e for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta)]
    assert any(e.role == "assistant" and e.turn_id == turn.id for e in said)


async def heard_one_interrupt(rec: FaultRecorder, cli: Cli) -> None:
    """The agent says it got the interrupt, once (stderr is a pipe of its own: wait for it)."""
    if cli.heard is None:
        return
    prefix = cli.heard
    await rec.wait_for(lambda e: isinstance(e, ev.AgentStderr) and e.line.startswith(prefix))
    assert len([line for line in rec.stderr() if line.startswith(prefix)]) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_stop_the_agent_obeys_leaves_its_process_alone(
    protocol: str, tmp_path: Path
) -> None:
    """Amp's interrupt ends its run: its process goes, and the next one goes on with the
    thread."""
    cli = CLIS[protocol]
    async with agent_session(protocol, tmp_path, COOPERATIVE_GRACE) as (session, rec):
        turn = await session.prompt(MANY)
        await rec.wait_for(lambda e: isinstance(e, ev.MessageDelta), count=3)
        before = tree()
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        assert receipt.stop_reason == cli.stop_reason and session.state == "ready"
        assert receipt.elapsed_ms < COOPERATIVE_GRACE * 1000
        if AGENTS[protocol].interrupt_exits:
            assert (receipt.escalation, receipt.resumed) == (EXITED, True)
            assert living(before) == [], "the interrupted run is still there"
        else:
            assert (receipt.escalation, receipt.resumed) == (["interrupt"], None)
            assert living(before) == before, "a stop the agent obeyed killed processes"
        await next_prompt_completes(session, rec)
        await heard_one_interrupt(rec, cli)
        if AGENTS[protocol].interrupt_exits:
            assert said_it_resumed(protocol, rec)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_an_agent_ignoring_the_interrupt_is_killed_with_its_whole_tree_and_resumed(
    protocol: str, containment: str, tmp_path: Path
) -> None:
    """Its helper left its process group for a session of its own (as a shell tool's
    background job does): it goes with the tree. The new process resumes the session."""
    fault = "grandchild"
    async with agent_session(protocol, tmp_path, KILL_GRACE, fault) as (session, rec):
        turn = await session.prompt(AGENTS[protocol].prompt(fault))
        helper = psutil.Process(await grandchild_pid(protocol, rec, turn.id))
        assert session_of(helper) == helper.pid, "the helper has a session of its own"
        await rec.wait_for(lambda e: isinstance(e, ev.MessageDelta) and e.turn_id == turn.id)
        agent_session_id = session.agent_session_id
        before = tree()
        assert helper in before
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("killed", turn.id), receipt
        assert receipt.escalation == CLIS[protocol].killed
        assert receipt.resumed is True and receipt.elapsed_ms >= KILL_GRACE * 1000
        assert living(before) == [], "the killed tree outlived the receipt"
        assert session.state == "ready"
        await next_prompt_completes(session, rec)
        await heard_one_interrupt(rec, CLIS[protocol])  # and it was not repeated
        assert said_it_resumed(protocol, rec), "the new process did not resume the session"
        assert session.agent_session_id == agent_session_id


@pytest.mark.parametrize("protocol", WITH_PERMISSIONS)
async def test_a_pending_permission_is_answered_cancelled_and_its_tool_never_runs(
    protocol: str, tmp_path: Path
) -> None:
    permission = CLIS[protocol].permission
    assert permission is not None
    words, stop_reason = permission
    async with agent_session(protocol, tmp_path, COOPERATIVE_GRACE) as (session, rec):
        turn = await session.prompt(words)
        requested = await rec.wait_kind("permission.requested", turn_id=turn.id)
        assert isinstance(requested, ev.PermissionRequested)
        before = tree()
        receipt = await session.cancel()
        await rec.catch_up()
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", stop_reason), receipt
        assert receipt.escalation == ["interrupt", "permissions_cancelled"]
        assert receipt.elapsed_ms < COOPERATIVE_GRACE * 1000
        assert living(before) == before, "nothing is killed"
        resolved = [
            e for e in rec.of_kind("permission.resolved") if isinstance(e, ev.PermissionResolved)
        ]
        assert [(r.request_id, r.outcome, r.by) for r in resolved] == [
            (requested.request_id, "cancelled", "supervisor")
        ]
        await next_prompt_completes(session, rec)
        updates = [e for e in rec.of_kind("tool.update") if isinstance(e, ev.ToolUpdate)]
        assert [u.status for u in updates] == ["failed"], "the tool ran after the cancel"
