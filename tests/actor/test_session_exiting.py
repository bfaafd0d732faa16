"""Tier 2: an agent whose cooperative stop ends its process, whatever its protocol.

Amp is one (``tests/machines/test_amp.py``), but nothing in the actor is about Amp: a machine announces
the exit with :class:`protocols.machine.AgentExiting` and the actor lets the process go. Here
the protocol is ACP plus that one announcement, and the agent the in-memory ACP agent plus an
exit after it answered the cancelled prompt; resuming is ACP's ``session/load``. Virtual time:
the receipt times are exact.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import trio
import trio.testing
from attrs import define

from helpers import KILLED, running
from protocols import PROTOCOLS
from protocols import events as ev
from protocols.acp import AcpClient
from protocols.machine import AgentExiting, Step
from supervisor import AgentSpec
from supervisor.testing._acp import AcpAgent, AcpBehaviour, AcpLauncher
from supervisor.testing._memory import MemoryLink

#: From the cancelled prompt's answer to the process's exit.
EXIT_DELAY = 0.25
STOP_DELAY = 0.05


@define
class ExitingAcp(AcpClient):
    """ACP whose agent ends its process when it stops a turn (and says so in advance)."""

    name: ClassVar[str] = "exiting-acp"

    def cancel(self) -> Step:
        step = super().cancel()
        if step.send:
            step.events.append(AgentExiting("the agent exits when it stops a turn"))
        return step


class ExitingAgent(AcpAgent):
    async def turn(self, request_id: Any, behaviour: AcpBehaviour) -> None:
        await super().turn(request_id, behaviour)
        if self.cancelled.is_set():
            await trio.sleep(EXIT_DELAY)
            await self.exit(0)


class ExitingLauncher(AcpLauncher):
    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> AcpAgent:
        return ExitingAgent(link, self)


@pytest.fixture
def exiting_protocol(monkeypatch: pytest.MonkeyPatch) -> AgentSpec:
    monkeypatch.setitem(PROTOCOLS, ExitingAcp.name, ExitingAcp)
    return AgentSpec(name="x", protocol=ExitingAcp.name, command=["x"], grace_s=2.0)


async def test_receipt_waits_for_the_exit_and_the_resumed_process(
    autojump_clock: trio.testing.MockClock, exiting_protocol: AgentSpec
) -> None:
    """The turn ends ``cancelled`` at the agent's answer (0.05 s), but the receipt comes when the
    process is gone and the next one has loaded the session (0.30 s), and it is ready then."""
    launcher = ExitingLauncher(AcpBehaviour(words=1000, stop_delay=STOP_DELAY))
    async with running(launcher, exiting_protocol, catch_up=True) as (session, _, rec):
        turn = await session.prompt("hello")
        await rec.wait_kind("message.delta")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(STOP_DELAY + EXIT_DELAY)
        assert (receipt.outcome, receipt.stop_reason) == ("cancelled", "cancelled")
        assert receipt.escalation == ["interrupt", "respawned", "resumed"]
        assert (receipt.resumed, receipt.turn_id) == (True, turn.id)
        assert session.state == "ready"
        assert [link.alive for link in launcher.links] == [False, True]
        await rec.catch_up()  # what was published before the receipt
        exited = [e for e in rec.of_kind("agent.exited") if isinstance(e, ev.AgentExited)]
        assert [(e.exit_code, e.expected) for e in exited] == [(0, True)]
        ended = [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]
        assert [(e.turn_id, e.outcome) for e in ended] == [(turn.id, "cancelled")]
        # What a client does next: a prompt at once. It runs on the new process.
        second = await session.prompt("again words=2")
        assert not second.queued
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
        assert [m.get("method") for m in launcher.links[0].sent].count("session/prompt") == 1


async def test_concurrent_cancels_and_a_queued_prompt(
    autojump_clock: trio.testing.MockClock, exiting_protocol: AgentSpec
) -> None:
    """Two cancels share the one receipt; a prompt that came meanwhile runs after the respawn."""
    launcher = ExitingLauncher(AcpBehaviour(words=1000, stop_delay=STOP_DELAY))
    async with running(launcher, exiting_protocol, catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        receipts = []

        async def cancel() -> None:
            receipts.append(await session.cancel())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            nursery.start_soon(cancel)
            await rec.wait_for(lambda e: isinstance(e, ev.SessionState) and "exiting" in str(e))
            queued = await session.prompt("again words=2")  # the agent answered, still exits
        assert receipts[0] is receipts[1] and receipts[0].outcome == "cancelled"
        assert queued.queued
        done = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done


async def test_an_agent_that_does_not_exit_meets_the_grace_timer(
    autojump_clock: trio.testing.MockClock,
    exiting_protocol: AgentSpec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It said it would exit and did not: killed at the grace, the session resumed."""
    monkeypatch.setattr(f"{__name__}.EXIT_DELAY", 3600.0)
    launcher = ExitingLauncher(AcpBehaviour(words=1000, stop_delay=STOP_DELAY))
    async with running(launcher, exiting_protocol, catch_up=True) as (session, _, rec):
        await session.prompt("hello")
        await rec.wait_kind("message.delta")
        t0 = trio.current_time()
        receipt = await session.cancel()
        assert trio.current_time() - t0 == pytest.approx(2.0)
        assert receipt.outcome == "killed"
        assert receipt.escalation == KILLED
        second = await session.prompt("again words=2")
        done = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(done, ev.TurnEnded) and done.outcome == "completed", done
