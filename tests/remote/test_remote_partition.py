"""Nothing lost across a long partition, over the ``env`` transport (real processes).

The node keeps a small history (``[hosts.NAME] history``, passed to the node as ``--history``)
and an agent floods far more than that: while the front is away (its transport killed, and a
gate in front of the transport holding every reconnection back for seconds), the node drops
nothing the front has not acknowledged and holds the agent back instead (it blocks on its
pipe); once the front is back it resubscribes from its last seq and gets every event once.
Real clock, generous bounds.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import trio

from bench.fairness import LIGHT_AGENT
from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.remote import HostSpec, RemoteSession

BOUND = 120.0
HISTORY = 300
AWAY_S = 3.0
NODE = [sys.executable, "-m", "supervisor.cli"]
#: The transport: wait while the gate file exists, then run the command (a partition that
#: lets no new connection through, as a network gone away would).
GATE = 'while [ -e "$0" ]; do sleep 0.05; done; exec "$@"'


def _host(tmp_path: Path, gate: Path) -> HostSpec:
    return HostSpec(
        name="h",
        transport=["sh", "-c", GATE, str(gate)],
        command=NODE,
        detach_s=60.0,
        state_dir=str(tmp_path / "node"),
        history=HISTORY,
    )


class Reader:
    """A client of the front that reads everything, resubscribing from its last seq when it
    is cut off (as a gateway client does)."""

    def __init__(self, session: RemoteSession) -> None:
        self.session = session
        self.events: list[ev.Event] = []
        self.changed = trio.Event()

    async def run(self) -> None:
        since = 0
        while True:
            async with self.session.subscribe(since_seq=since, max_buffer=1 << 20) as events:
                async for event in events:
                    self.events.append(event)
                    since = event.seq
                    self.changed.set()
                    self.changed = trio.Event()
                if not events.lagged:
                    return

    async def wait_for_seq(self, seq: int) -> None:
        while not self.events or self.events[-1].seq < seq:
            await self.changed.wait()


async def test_a_long_partition_holds_the_agent_and_loses_no_event(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    agents = {"flood": AgentSpec(name="flood", protocol="acp", command=LIGHT_AGENT, hosts=("h",))}
    with trio.fail_after(BOUND):
        async with (
            open_supervisor(agents=agents, hosts={"h": _host(tmp_path, gate)}) as sup,
            trio.open_nursery() as nursery,
        ):
            session = await sup.start_session("flood", cwd="/")
            assert isinstance(session, RemoteSession)
            reader = Reader(session)
            nursery.start_soon(reader.run)
            turn = await session.prompt("flood forever")
            # Connected, the front acknowledges as it reads: the flood runs far past the
            # node's history (it would stop at HISTORY if nothing were acknowledged).
            began = time.monotonic()
            await reader.wait_for_seq(20 * HISTORY)
            rate = session.last_seq / (time.monotonic() - began)
            # The partition: no new connection gets through, and the link is killed.
            gate.touch()
            transport = session.link.process
            assert transport is not None and session.link.connects == 1
            transport.send_signal(signal.SIGKILL)
            await trio.sleep(AWAY_S)  # the partition lasts: real time passes, on purpose
            had = session.last_seq
            gate.unlink()
            with trio.fail_after(30):
                while session.link.connects < 2:  # (polled: the link has no event for it)
                    await trio.sleep(0.05)
            # What the node had when the front came back (the resubscribe's answer): held at
            # its history of unacknowledged events, not what AWAY_S of flooding would make.
            head = session._catch_up_to
            assert head - had <= 2 * HISTORY, (head, had)
            assert rate * AWAY_S > 10 * HISTORY, rate  # unheld, it would have run far past
            # And it floods again once the front has caught up.
            await reader.wait_for_seq(head + 10 * HISTORY)
            receipt = await session.cancel()
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.host == "h"
            await session.stop()
    seqs = [event.seq for event in reader.events]
    assert seqs == list(range(1, len(seqs) + 1))  # every event once, contiguous
    assert not [e for e in reader.events if isinstance(e, ev.StreamGap)]
    ended = [e for e in reader.events if isinstance(e, ev.TurnEnded)]
    assert [(e.turn_id, e.outcome) for e in ended] == [(turn.id, "cancelled")]


async def test_a_front_whose_history_is_gone_is_told_of_the_gap(tmp_path: Path) -> None:
    """The unavoidable case: a front that keeps its node sessions leaves after a flood longer
    than the node's history (all of it acknowledged: nothing was held); the next front adopts
    the session with no history of its own and resubscribes from the start. What the node no
    longer has is announced by a ``stream.gap`` (taking the last lost seq), never a silent
    jump: the stream its subscribers see is contiguous, the gap event included."""
    gate = tmp_path / "gate"  # never made: no partition here
    hosts = {"h": _host(tmp_path, gate)}
    agents = {"flood": AgentSpec(name="flood", protocol="acp", command=LIGHT_AGENT, hosts=("h",))}
    state = tmp_path / "front"
    words = 20 * HISTORY
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents=agents, hosts=hosts, state_dir=state, keep_node_sessions=True
        ) as sup:
            session = await sup.start_session("flood", cwd="/")
            async with session.subscribe(since_seq=0, max_buffer=1 << 20) as events:
                await session.prompt(f"flood words={words}")
                async for event in events:
                    if isinstance(event, ev.TurnEnded):
                        break
            sid, head = session.id, session.last_seq
        async with open_supervisor(agents=agents, hosts=hosts, state_dir=state) as sup:
            again = sup.get(sid)
            got: list[ev.Event] = []
            async with again.subscribe(since_seq=0) as events:
                async for event in events:
                    got.append(event)
                    if event.seq >= head:
                        break
            gap = got[0]
            assert isinstance(gap, ev.StreamGap), gap
            assert gap.from_seq == 1 and gap.seq == gap.to_seq
            assert head - 2 * HISTORY <= gap.to_seq < head - HISTORY + 10  # its history kept
            assert gap.session_id == sid and "history" in gap.cause
            assert [e.seq for e in got] == list(range(gap.seq, head + 1))
            assert len([e for e in got if isinstance(e, ev.StreamGap)]) == 1
            await again.stop()
