"""What a session does when containment itself fails: the shim dies, or a member won't die.

Real processes on the real clock, through ``open_supervisor``, with the built-in demo agent
leaking helpers (``grandchildren``: one in its own session, one ignoring SIGTERM).

- The shim is SIGKILLed while the turn runs (no cancel): the turn fails with "containment
  lost", the supervisor has already killed the loose tree, the session respawns; and when the
  session is stopped right after the kill, nothing of the old tree survives the stop.
- A member of the tree cannot be killed (frozen: ``tests/unkillable.py``, a process in
  uninterruptible sleep): the receipt lists it as a survivor and says the session failed, and
  no agent is started beside it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
import trio

from faults.harness import BOUND, FaultRecorder, living, tree, wait_gone
from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.agents.process import ShimProcess
from supervisor.agents.process_link import ProcessLink
from supervisor.errors import AgentNotRunning
from unkillable import require_freezer, unkillable

pytestmark = pytest.mark.real_process


def demo(tmp_path: Path, *flags: str, grace: float = 0.3) -> AgentSpec:
    spec = AgentSpec.from_config("demo").with_args(
        "--state-dir", str(tmp_path), "--delay", "0.02", *flags
    )
    return AgentSpec(
        name="demo",
        protocol="acp",
        command=spec.command,
        grace_s=grace,
        kill_timeout_s=0.3,
        start_timeout_s=30.0,
    )


async def leaked_helpers(rec: FaultRecorder, turn_id: str) -> dict[str, int]:
    tool = await rec.wait_kind("tool.call", turn_id=turn_id)
    assert isinstance(tool, ev.ToolCall)
    output = tool.raw["rawOutput"]
    await rec.wait_for(lambda e: isinstance(e, ev.MessageDelta) and e.turn_id == turn_id)
    return {key: int(output[key]) for key in ("child", "setsidGrandchild", "ignoresSigterm")}


@pytest.mark.usefixtures("shim_containment")
@pytest.mark.parametrize("stop_at_once", [False, True])
async def test_a_killed_shim_mid_turn_fails_the_turn_and_leaves_nothing(
    tmp_path: Path, stop_at_once: bool
) -> None:
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": demo(tmp_path, "--ignore-sigterm")}) as sup:
            session = await sup.start_session("demo", cwd=str(tmp_path))
            rec = FaultRecorder(session)
            async with trio.open_nursery() as nursery:
                await nursery.start(rec.run)
                turn = await session.prompt("grandchildren ignore-cancel words=100000")
                helpers = await leaked_helpers(rec, turn.id)
                before = tree()
                assert {helpers["setsidGrandchild"]} <= {p.pid for p in before}
                link = session._link
                assert isinstance(link, ProcessLink) and isinstance(link.process, ShimProcess)
                os.kill(link.process.pid, signal.SIGKILL)
                if stop_at_once:
                    # Stopped before the session even heard of the shim's death: the stop's
                    # answer still waits until nothing of the tree is alive.
                    await session.stop()
                    assert living(before) == [], "the old tree outlived stop()"
                else:
                    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
                    assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
                    assert ended.error is not None and "containment lost" in ended.error
                    assert living(before) == [], "the loose tree outlived the turn's end"
                    await session.wait_ready()
                    again = await session.prompt("again words=3")
                    done = await rec.wait_kind("turn.ended", turn_id=again.id)
                    assert isinstance(done, ev.TurnEnded) and done.outcome == "completed"
                    await session.stop()
                nursery.cancel_scope.cancel()
    assert await wait_gone(before, 5.0) == []


@pytest.mark.usefixtures("containment")
async def test_a_member_that_survives_sigkill_fails_the_session_honestly(
    tmp_path: Path,
) -> None:
    require_freezer()
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"demo": demo(tmp_path)}) as sup:
            session = await sup.start_session("demo", cwd=str(tmp_path))
            rec = FaultRecorder(session)
            async with trio.open_nursery() as nursery:
                await nursery.start(rec.run)
                turn = await session.prompt("grandchildren ignore-cancel words=100000")
                helpers = await leaked_helpers(rec, turn.id)
                stuck = helpers["setsidGrandchild"]
                with unkillable(stuck):
                    receipt = await session.cancel()
                    # Honest: killed, but one process lives on, and the session says so.
                    assert receipt.outcome == "killed", receipt
                    assert [s["pid"] for s in receipt.survivors] == [stuck], receipt
                    assert "respawned" not in receipt.escalation, receipt
                    assert receipt.escalation[:3] == ["interrupt", "grace_expired", "sigterm"]
                    assert "survived SIGKILL" in receipt.summary()
                    assert session.state == "failed"
                    # No agent was started beside the survivor, which is all that is left.
                    assert [p.pid for p in living(tree()) if p.pid != stuck] == []
                    assert living([psutil.Process(stuck)]) != []
                    with pytest.raises(AgentNotRunning):
                        await session.prompt("again")
                    await rec.wait_for(
                        lambda e: (
                            isinstance(e, ev.ErrorEvent)
                            and e.code == "kill_failed"
                            and str(stuck) in e.message
                        )
                    )
                [ended] = rec.turn_ended(turn.id)
                assert ended.receipt is not None and ended.receipt["survivors"] == receipt.survivors
                nursery.cancel_scope.cancel()
    assert living(tree()) == []  # thawed, it died of the SIGKILL it had pending
