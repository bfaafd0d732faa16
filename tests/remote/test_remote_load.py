"""The link under load, and capacity counted by the node, over the ``env`` transport.

Real processes (the bridge, the node daemon, the agents), real clock, generous bounds: the
host is this machine reached through its node, as over SSH but without sshd. The flooders are
``bench/fake_light_agent.py`` (one-word chunks as fast as the pipe takes them, until
cancelled); the same agents, measured, are ``bench/remote_fairness.py``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import pytest
import trio

from bench.fairness import LIGHT_AGENT
from supervisor import AgentSpec, open_supervisor
from supervisor.remote import HostCapacity, HostSpec, RemoteSession
from supervisor.supervisor import AnySession, Supervisor

BOUND = 120.0
NODE = [sys.executable, "-m", "supervisor.cli"]


def _host(name: str, tmp_path: Path, **options: object) -> HostSpec:
    return HostSpec(
        name=name,
        transport=["env"],
        command=NODE,
        detach_s=2.0,
        state_dir=str(tmp_path / "node"),
        **options,  # type: ignore[arg-type]
    )


def _agents(*hosts: str) -> dict[str, AgentSpec]:
    quiet = [*LIGHT_AGENT, "--interval", "600"]
    return {
        "quiet": AgentSpec(name="quiet", protocol="acp", command=quiet, hosts=hosts),
        "flood": AgentSpec(name="flood", protocol="acp", command=LIGHT_AGENT, hosts=hosts),
    }


async def _first_word(session: AnySession, prompt: str) -> None:
    async with session.subscribe() as events:
        await session.prompt(prompt)
        async for event in events:
            if event.kind == "message.delta":
                return


async def _flooding(sup: Supervisor, count: int) -> list[AnySession]:
    sessions: list[AnySession] = []

    async def one() -> None:
        session = await sup.start_session("flood", cwd="/")
        await _first_word(session, "flood forever")
        sessions.append(session)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return sessions


async def _cancel_times(session: AnySession, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        await _first_word(session, "go")
        began = time.monotonic()
        receipt = await session.cancel()
        times.append(time.monotonic() - began)
        assert receipt.outcome == "cancelled", receipt
    return times


async def test_a_quiet_cancel_is_prompt_while_twenty_sessions_on_its_host_flood(
    tmp_path: Path,
) -> None:
    """One link carries all 21 sessions. Before the fix a cancel's receipt waited behind the
    node's buffered events of every flooder (~1.2 s median with 10 flooders on this machine);
    now it waits for its own session's events only, and the link's flow control keeps what
    is in flight to 64 KiB, so the median is tens of ms. The bound is generous (shared CPUs),
    and still well below what the old behaviour gave."""
    with trio.fail_after(BOUND):
        async with open_supervisor(agents=_agents("h"), hosts={"h": _host("h", tmp_path)}) as sup:
            quiet = await sup.start_session("quiet", cwd="/")
            await _cancel_times(quiet, 2)  # warm
            flooders = await _flooding(sup, 20)
            before = sum(f.last_seq for f in flooders)
            times = await _cancel_times(quiet, 9)
            assert statistics.median(times) < 0.4, times
            assert sum(f.last_seq for f in flooders) > before + 1000  # they flooded meanwhile
            for session in flooders:
                assert isinstance(session, RemoteSession) and session.state == "running"


async def test_a_front_subscriber_that_reads_nothing_never_holds_the_link(tmp_path: Path) -> None:
    """A subscriber of the front that stops reading is cut off (lagged) at twice its buffer;
    the link's reader goes on at once: the same flooding session's events keep arriving on
    the front, and another session on the host cancels promptly."""
    with trio.fail_after(BOUND):
        async with open_supervisor(agents=_agents("h"), hosts={"h": _host("h", tmp_path)}) as sup:
            quiet = await sup.start_session("quiet", cwd="/")
            (flooder,) = await _flooding(sup, 1)
            stalled = await flooder.open_subscription(max_buffer=64, stall_s=5.0)
            start = flooder.last_seq
            with trio.fail_after(30):
                while not stalled.lagged:  # (nothing to wait on: the fan-out has no event)
                    await trio.sleep(0.01)
            assert flooder.last_seq > start + 128  # the link read on, past the stalled one
            times = await _cancel_times(quiet, 3)
            assert statistics.median(times) < 0.4, times
            moving = flooder.last_seq
            with trio.fail_after(30):
                while flooder.last_seq < moving + 1000:  # (polled: the mirror's seq)
                    await trio.sleep(0.01)
            stalled.close()
            receipt = await flooder.cancel()
            assert receipt.outcome == "cancelled"


async def test_two_fronts_race_for_the_last_place_and_only_one_wins(tmp_path: Path) -> None:
    """Two fronts, one node, ``max_sessions = 2``: one session is already there (from the
    first front); both fronts start one at once: the node counts both fronts' sessions and
    refuses the second start over the limit with ``capacity``. Once one stops, the loser
    gets the place."""
    hosts = {"h": _host("h", tmp_path, max_sessions=2)}
    with trio.fail_after(BOUND):
        async with (
            open_supervisor(agents=_agents("h"), hosts=hosts) as one,
            open_supervisor(agents=_agents("h"), hosts=hosts) as two,
        ):
            first = await one.start_session("quiet", cwd="/")
            results: dict[str, AnySession | Exception] = {}

            async def start(name: str, sup: Supervisor) -> None:
                try:
                    results[name] = await sup.start_session("quiet", cwd="/")
                except HostCapacity as exc:
                    results[name] = exc

            async with trio.open_nursery() as nursery:
                nursery.start_soon(start, "one", one)
                nursery.start_soon(start, "two", two)
            won = [name for name, result in results.items() if not isinstance(result, Exception)]
            lost = [result for result in results.values() if isinstance(result, HostCapacity)]
            assert len(won) == 1 and len(lost) == 1, results
            assert "max_sessions" in str(lost[0])
            assert isinstance(first, RemoteSession) and isinstance(results[won[0]], RemoteSession)
            assert first.link.node_pid == results[won[0]].link.node_pid  # type: ignore[union-attr]
            with pytest.raises(HostCapacity):
                await two.start_session("quiet", cwd="/")
            await one.stop_session(first.id)
            third = await two.start_session("quiet", cwd="/")
            assert third.state == "ready"


async def test_an_unreachable_host_is_skipped_and_named_when_none_fits(tmp_path: Path) -> None:
    """Placement asks each candidate's node: a host that cannot be reached is skipped (the
    session goes to the other); when the other is full, the error names both: the full one
    and the unreachable one with its cause."""
    hosts = {
        "gone": HostSpec(name="gone", transport=["env"], command=["/nonexistent/agent-supervisor"]),
        "h": _host("h", tmp_path, max_sessions=1),
    }
    with trio.fail_after(BOUND):
        async with open_supervisor(agents=_agents("gone", "h"), hosts=hosts) as sup:
            session = await sup.start_session("quiet", cwd="/")
            assert session.host == "h"
            with pytest.raises(HostCapacity) as raised:
                await sup.start_session("quiet", cwd="/")
            message = str(raised.value)
            assert "h holds 1 sessions, its max_sessions is 1" in message, message
            assert "gone unreachable (not_installed)" in message, message


async def test_a_front_that_stops_reading_is_resubscribed_from_seq_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The front reads nothing for longer than the node waits for a stalled subscriber
    (``subscriber_stall_s``, 5 s): the node holds the agent back meanwhile (its buffer for the
    link is full), then cuts the link's subscription off (``subscription.lagged``) rather than
    grow; the front resubscribes from the last seq it has, on the same connection, and the
    node's history fills the hole: every word once, seq contiguous, one ``turn.ended``."""
    words = 8000  # within the node's history (10,000): what was not sent is still there
    with trio.fail_after(BOUND):
        async with open_supervisor(agents=_agents("h"), hosts={"h": _host("h", tmp_path)}) as sup:
            session = await sup.start_session("flood", cwd="/")
            assert isinstance(session, RemoteSession)
            notices: list[str] = []
            on_notice = session._on_notice

            def spy(kind: str) -> None:
                notices.append(kind)
                on_notice(kind)

            session._on_notice = spy  # type: ignore[method-assign]
            async with session.subscribe() as events:
                turn = await session.prompt(f"flood words={words}")
                async for event in events:
                    if event.kind == "message.delta":
                        break
            # A front that does not run at all (a stopped process, a starved CPU): the whole
            # event loop blocks, so the link reads nothing. This sleep is the fault itself.
            time.sleep(6.5)  # noqa: ASYNC251
            async with session.subscribe(since_seq=0) as events:
                async for event in events:
                    if event.kind == "turn.ended" and event.turn_id == turn.id:
                        break
            async with session.subscribe(since_seq=0) as replay:
                seen = []
                while len(seen) < session.last_seq:
                    seen.append(await replay.__anext__())
            assert notices == ["subscription.lagged"]
            assert session.link.connects == 1  # no reconnection: the same link converged
            assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
            assert sum(e.kind == "message.delta" for e in seen) == words
            assert sum(e.kind == "turn.ended" for e in seen) == 1
