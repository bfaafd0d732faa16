"""The fault matrix: every protocol x every fault, real subprocesses, real clock.

Protocols: ACP (the built-in demo agent), Codex, Claude, OpenCode and Amp (their scripted fake
CLIs in ``tests/fakes``), through ``open_supervisor``, each under both containments (a cgroup
per agent, and the shim). Faults: the agent ignores the interrupt; ignores SIGTERM too; crashes
mid-turn; crashes while a cancel is in flight; closes stdout but stays alive; floods output; has
a grandchild in its own session; has a permission request pending; is cancelled before the turn
is identified; gets two concurrent cancels; a gateway client disconnects in the middle of its
cancel; and what holds the tree dies: the shim is SIGKILLed mid-cancel (shim only; an agent that
ignores the interrupt and SIGTERM: the supervisor kills the loose tree at once, not at grace),
or the cgroup keeper is (cgroup only: a new one is started and nothing else changes).

Every cell checks the same things (``Cell.finish``):
- exactly one receipt per cancel call, equal for concurrent calls, and equal to the receipt
  carried by the turn's ``turn.ended``;
- exactly one ``turn.ended`` per turn and a contiguous ``seq`` (``Recorder.check_invariants``);
- the agent's process tree, recorded just before the cancel, is gone the moment a ``killed``
  (or agent-exited) receipt is given, including a grandchild in its own session; when nothing
  was to be killed, nothing was; afterwards the tree is exactly the (respawned) shim and agent;
- the session takes a new prompt that completes; leaving the supervisor leaves no process.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio

from faults.agents import (
    AGENTS,
    CONTAINMENT_FAULTS,
    FAULTS,
    Agent,
    agent_session,
    grandchild_pid,
    said_it_resumed,
)
from faults.harness import LONG, FaultRecorder, living, session_of, tree, wait_gone
from helpers import KILLED as KILL
from helpers import KILLED_HARD as KILL_HARD
from helpers import require_cgroups
from protocols import events as ev
from supervisor import CancelReceipt, Session, Supervisor
from supervisor.agents.containment import CONTAINMENT_VARIABLE, choose_blocking
from supervisor.agents.process import ShimProcess
from supervisor.agents.process_link import ProcessLink
from supervisor.client import GatewayClient, GatewayError, connect
from supervisor.gateway import Gateway
from supervisor.wire.codec import receipt_to_wire

pytestmark = pytest.mark.real_process

#: Grace for cells that end in a kill (the wait is the cost of the cell) and for cells whose
#: agent stops by itself (never waited for in full; long, so a loaded machine cannot turn a
#: cooperative stop into a kill: an OpenCode flood has up to ~1 MB of events in our end of the
#: loopback socket when the abort lands, 0.3 s to drain here when idle, up to ~4 s under load).
KILL_GRACE = 0.5
COOPERATIVE_GRACE = 10.0

EXITED = ["interrupt", "respawned", "resumed"]  # the agent exited during the cancel

#: Cells whose agent is expected to be killed at the grace deadline.
KILLED = {
    "ignores_interrupt",
    "ignores_sigterm",
    "mute",
    "grandchild",
    "client_disconnect",
    "keeper_killed",
}

#: Long mode runs every cell three times, to shake out races a single run is lucky with.
ROUNDS = 3 if LONG else 1

CELLS = [
    pytest.param(
        containment,
        protocol,
        fault,
        id=f"{containment}-{protocol}-{fault}" + (f"-{n}" if n else ""),
    )
    for n in range(ROUNDS)
    for containment in ("cgroup", "shim")
    for protocol, agent in AGENTS.items()
    for fault in FAULTS
    if agent.has(fault) and CONTAINMENT_FAULTS.get(fault, containment) == containment
]


# -- one cell ------------------------------------------------------------------------------


@attrs.define
class Cell:
    agent: Agent
    fault: str
    sup: Supervisor
    session: Session
    rec: FaultRecorder
    receipts: list[CancelReceipt] = attrs.field(factory=list)
    cancel_calls: int = 0

    async def cancel(self, **kwargs: Any) -> CancelReceipt:
        self.cancel_calls += 1
        receipt = await self.session.cancel(**kwargs)
        self.receipts.append(receipt)
        await self.rec.catch_up()  # the recorder reads the events in a task of its own
        return receipt

    async def first_delta(self, turn_id: str, count: int = 1) -> None:
        await self.rec.wait_for(
            lambda e: isinstance(e, ev.MessageDelta) and e.turn_id == turn_id, count=count
        )

    def ended(self, turn_id: str) -> ev.TurnEnded:
        [ended] = self.rec.turn_ended(turn_id)
        return ended

    async def next_prompt_completes(self) -> None:
        turn = await self.session.prompt("again words=3")
        ended = await self.rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert ended.outcome == "completed", ended

    async def finish(self) -> None:
        """The checks every cell ends with."""
        await self.next_prompt_completes()
        assert len(self.receipts) == self.cancel_calls
        for receipt in self.receipts:
            if receipt.outcome != "no_active_turn":
                assert receipt.turn_id is not None
                assert self.ended(receipt.turn_id).receipt == receipt_to_wire(receipt)
        stopped = [
            e.turn_id
            for e in self.rec.of_kind("turn.ended")
            if isinstance(e, ev.TurnEnded) and e.receipt is not None
        ]
        assert set(stopped) <= {r.turn_id for r in self.receipts}, "a turn no cancel asked for"
        # The live tree is the agent (and its shim); nothing a killed or cancelled turn left.
        live = living(tree())
        expected = 2 if choose_blocking().kind == "shim" else 1
        assert len(live) == expected, f"expected the agent (and its shim), found {live}"
        await self.rec.catch_up()
        self.rec.check_invariants()


@asynccontextmanager
async def cell(
    protocol: str, fault: str, state_dir: Path, grace: float
) -> AsyncIterator[tuple[Cell, trio.Nursery]]:
    async with agent_session(protocol, fault, state_dir, grace) as (sup, session, rec, nursery):
        yield Cell(AGENTS[protocol], fault, sup, session, rec), nursery


def assert_gone_now(processes: list[psutil.Process], what: str) -> None:
    """Terminate-then-respond: the tree is gone when the receipt is given, not later."""
    alive = living(processes)
    assert alive == [], f"{what}: still alive when the receipt came: {alive}"


def assert_untouched(processes: list[psutil.Process]) -> None:
    assert living(processes) == processes, "a cooperative stop killed processes"


# -- the matrix ----------------------------------------------------------------------------


@pytest.fixture
def in_containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    mode: str = request.param
    if mode == "cgroup":
        require_cgroups()
    monkeypatch.setenv(CONTAINMENT_VARIABLE, mode)
    return mode


@pytest.mark.parametrize("in_containment,protocol,fault", CELLS, indirect=["in_containment"])
async def test_cell(in_containment: str, protocol: str, fault: str, tmp_path: Path) -> None:
    grace = KILL_GRACE if fault in KILLED else COOPERATIVE_GRACE
    if fault == "client_disconnect":
        await client_disconnects_mid_cancel(protocol, tmp_path)
        return
    async with cell(protocol, fault, tmp_path, grace) as (c, _):
        await SCENARIOS[fault](c)
        await c.finish()


async def killed_at_grace(c: Cell) -> None:
    """Ignores the interrupt (and maybe SIGTERM), went mute, or has a setsid grandchild."""
    turn = await c.session.prompt(c.agent.prompt(c.fault))
    grandchild = None
    if c.fault == "grandchild":
        grandchild = psutil.Process(await grandchild_pid(c.agent.protocol, c.rec, turn.id))
        assert session_of(grandchild) == grandchild.pid, "the grandchild has its own session"
    await c.first_delta(turn.id, count=3 if c.fault == "mute" else 1)
    before = tree()
    if grandchild is not None:
        assert grandchild in before
    receipt = await c.cancel()
    assert (receipt.outcome, receipt.turn_id) == ("killed", turn.id), receipt
    # The demo agent's "grandchildren" include one that ignores SIGTERM: SIGKILL is needed too.
    hard = c.fault == "ignores_sigterm" or (c.fault, c.agent.protocol) == ("grandchild", "acp")
    assert receipt.escalation == (KILL_HARD if hard else KILL), receipt
    assert receipt.resumed is True
    assert receipt.elapsed_ms >= KILL_GRACE * 1000
    assert_gone_now(before, "the killed tree")


async def crash(c: Cell) -> None:
    """Crashes mid-turn with no cancel: the turn fails, the agent is respawned and resumed."""
    turn = await c.session.prompt(c.agent.prompt("crash"))
    await c.first_delta(turn.id)
    before = tree()
    ended = await c.rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed", ended
    assert ended.error is not None and "exit 3" in ended.error, ended
    await c.session.wait_ready()
    assert await wait_gone(before, 5.0) == []
    receipt = await c.cancel()
    assert receipt.outcome == "no_active_turn" and receipt.escalation == []
    await c.next_prompt_completes()
    assert said_it_resumed(c.agent.protocol, c.rec), "the respawned agent did not resume"


async def crash_during_cancel(c: Cell) -> None:
    turn = await c.session.prompt(c.agent.prompt("crash_during_cancel"))
    await c.first_delta(turn.id)
    before = tree()
    receipt = await c.cancel()
    assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "agent_exited"), receipt
    assert receipt.escalation == EXITED and receipt.resumed is True, receipt
    assert_gone_now(before, "the crashed tree")


async def stopped_in_band(c: Cell, receipt: CancelReceipt, before: list[psutil.Process]) -> None:
    """A cooperative stop: nothing killed; for Amp, whose interrupt ends the run, all gone."""
    if c.agent.interrupt_exits:
        # Amp's own word for the stop (its "User cancelled" result), then its exit.
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "cancelled"), receipt
        assert receipt.escalation == EXITED and receipt.resumed is True, receipt
        assert_gone_now(before, "the interrupted Amp run")
    else:
        assert receipt.outcome == "cancelled", receipt
        assert receipt.escalation[0] == "interrupt" and "grace_expired" not in receipt.escalation
        assert_untouched(before)
    assert receipt.elapsed_ms < COOPERATIVE_GRACE * 1000


async def flood(c: Cell) -> None:
    """The cancel is not stuck behind the flood, and the flood is bounded (backpressure)."""
    turn = await c.session.prompt(c.agent.prompt("flood"))
    await c.first_delta(turn.id, count=2000)
    before = tree()
    receipt = await c.cancel()
    await stopped_in_band(c, receipt, before)
    assert receipt.escalation in (["interrupt"], EXITED), receipt


async def permission(c: Cell) -> None:
    turn = await c.session.prompt(c.agent.prompt("permission"))
    requested = await c.rec.wait_kind("permission.requested", turn_id=turn.id)
    assert isinstance(requested, ev.PermissionRequested)
    before = tree()
    receipt = await c.cancel()
    await stopped_in_band(c, receipt, before)
    assert receipt.escalation == ["interrupt", "permissions_cancelled"], receipt
    resolved = [
        e for e in c.rec.of_kind("permission.resolved") if isinstance(e, ev.PermissionResolved)
    ]
    assert [(r.request_id, r.outcome, r.by) for r in resolved] == [
        (requested.request_id, "cancelled", "supervisor")
    ]
    updates = [e for e in c.rec.of_kind("tool.update") if isinstance(e, ev.ToolUpdate)]
    assert all(u.status != "completed" for u in updates), "the tool ran after the cancel"


async def early_cancel(c: Cell) -> None:
    """Cancelled at once, before the agent identified the turn, in a session with history."""
    await c.next_prompt_completes()  # the agent's session (Amp's thread) is known from here
    turn = await c.session.prompt(c.agent.prompt("early_cancel"))
    before = tree()
    receipt = await c.cancel()
    assert receipt.turn_id == turn.id
    await stopped_in_band(c, receipt, before)
    assert receipt.escalation in (["interrupt"], EXITED), receipt


async def concurrent_cancels(c: Cell) -> None:
    turn = await c.session.prompt(c.agent.prompt("concurrent_cancels"))
    await c.first_delta(turn.id)
    before = tree()
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(c.cancel)
    first, second = c.receipts
    assert first == second, "concurrent cancels of one turn share one receipt"
    assert first.turn_id == turn.id
    await stopped_in_band(c, first, before)
    # Later cancels: the ended turn by name gets the same receipt again; no turn, no action.
    assert await c.cancel(turn_id=turn.id) == first
    assert (await c.cancel()).outcome == "no_active_turn"


async def shim_killed(c: Cell) -> None:
    """The shim is SIGKILLed while a cancel waits on an agent that ignores the interrupt and
    SIGTERM: the supervisor kills the loose tree itself, at once (not at grace), and says so."""
    turn = await c.session.prompt(c.agent.prompt(c.fault))
    await c.first_delta(turn.id)
    before = tree()
    link = c.session._link
    assert isinstance(link, ProcessLink) and isinstance(link.process, ShimProcess)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.cancel)
        await c.rec.wait_for(lambda e: isinstance(e, ev.SessionState) and e.state == "cancelling")
        os.kill(link.process.pid, signal.SIGKILL)
    [receipt] = c.receipts
    assert (receipt.outcome, receipt.turn_id) == ("killed", turn.id), receipt
    steps = ["interrupt", "containment_lost", "sigkill", "respawned", "resumed"]
    assert receipt.escalation == steps and receipt.survivors == [], receipt
    assert receipt.elapsed_ms < COOPERATIVE_GRACE * 1000, "waited out the grace"
    assert_gone_now(before, "the loose tree")


async def keeper_killed(c: Cell) -> None:
    """The cgroup keeper dies mid-turn: nothing is lost (the kernel holds the trees); the next
    spawn starts a new keeper, so our death would still take every agent with us."""
    root = choose_blocking().root
    assert root is not None and root.keeper_pid is not None
    old = psutil.Process(root.keeper_pid)
    old.kill()
    turn = await c.session.prompt(c.agent.prompt(c.fault))
    await c.first_delta(turn.id)
    before = tree()
    receipt = await c.cancel()  # the agent is killed at grace and respawned: a new keeper
    assert (receipt.outcome, receipt.escalation) == ("killed", KILL_HARD), receipt
    assert_gone_now(before, "the killed tree")
    assert root.keeper_pid is not None and root.keeper_pid != old.pid
    assert living([psutil.Process(root.keeper_pid)]) != []


SCENARIOS = {
    "ignores_interrupt": killed_at_grace,
    "ignores_sigterm": killed_at_grace,
    "crash": crash,
    "crash_during_cancel": crash_during_cancel,
    "mute": killed_at_grace,
    "flood": flood,
    "grandchild": killed_at_grace,
    "permission": permission,
    "early_cancel": early_cancel,
    "concurrent_cancels": concurrent_cancels,
    "shim_killed": shim_killed,
    "keeper_killed": keeper_killed,
}


# -- a gateway client disconnects mid-cancel ----------------------------------------------


async def client_disconnects_mid_cancel(protocol: str, state_dir: Path) -> None:
    """A client starts a cancel and drops its connection; the cancel goes on to its end, a
    second client watching sees the turn killed, gets the receipt by turn id, and goes on."""
    async with cell(protocol, "client_disconnect", state_dir, KILL_GRACE) as (c, nursery):
        server = Gateway(c.sup, port=0, token="fault-token")
        url = await nursery.start(server.serve)
        async with connect(url) as watcher:
            async with watcher.subscribe(c.session.id) as events:
                async with connect(url) as leaver:
                    turn_id = (
                        await leaver.prompt(c.session.id, c.agent.prompt("client_disconnect"))
                    )["turn_id"]
                    await next_wire_event(events, "message.delta")
                    before = tree()
                    async with trio.open_nursery() as calls:
                        calls.start_soon(cancel_and_lose_it, leaver, c.session.id)
                        await next_wire_event(events, "session.state", state="cancelling")
                        # Drop the TCP connection, no close handshake (a killed browser tab).
                        await trio.aclose_forcefully(leaver.websocket._stream)
                ended = await next_wire_event(events, "turn.ended", turn_id=turn_id)
                assert ended["data"]["outcome"] == "killed", ended
                receipt = ended["data"]["receipt"]
                assert receipt["escalation"] == KILL and receipt["resumed"] is True, receipt
                assert_gone_now(before, "the killed tree")
                again = await watcher.cancel(c.session.id, task_id=turn_id)
                assert {k: v for k, v in again.items() if k != "success"} == receipt
                second = await watcher.prompt(c.session.id, "again words=3")
                ended = await next_wire_event(events, "turn.ended", turn_id=second["turn_id"])
                assert ended["data"]["outcome"] == "completed", ended
        assert [e.outcome for e in c.rec.turn_ended(turn_id)] == ["killed"]
        assert len(living(tree())) == (2 if choose_blocking().kind == "shim" else 1)
        await c.rec.catch_up()
        c.rec.check_invariants()


async def cancel_and_lose_it(client: GatewayClient, session_id: str) -> None:
    try:
        await client.cancel(session_id)
    except GatewayError as error:
        assert error.code == "connection_closed"  # this caller never hears back, by design


async def next_wire_event(
    events: trio.MemoryReceiveChannel[dict[str, Any]], kind: str, **data: Any
) -> dict[str, Any]:
    async for event in events:
        if event["event"] == kind and all(event["data"].get(k) == v for k, v in data.items()):
            return event
    raise AssertionError(f"no {kind} event {data}")
