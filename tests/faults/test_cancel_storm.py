"""A cancel storm: 100 sessions, random prompts and cancels, nothing lost, nothing leaked.

Default mode: in-memory ACP agents (``supervisor/testing/_acp.py``) on the real clock for about
a dozen seconds. Long mode (``AGENT_SUPERVISOR_LONG_FAULTS=1``): real demo-agent subprocesses
under the containment shim, for a minute. The network is loopback only: a gateway on 127.0.0.1
carries a share of the prompts and cancels, and one client watches some sessions' events on
the wire while the storm runs.

Every session is driven by its own seeded ``random.Random`` (the seed is printed; set
``AGENT_SUPERVISOR_STORM_SEED`` to replay it; timing still varies). At the end:
- every accepted prompt ended in exactly one ``turn.ended``, and no other turn ended;
- every cancel call got exactly one receipt (no error), concurrent ones equal, each equal to the
  receipt its turn's ``turn.ended`` carries;
- ``seq`` is contiguous in every session, in process and on the wire;
- no session failed; no process is left (psutil children of this process); no file descriptor
  is leaked (``/proc/self/fd`` counted before and after, with a small allowance).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from faults.harness import LONG, FaultRecorder, living, tree, wait_gone
from protocols import events as ev
from supervisor import AgentSpec, BadRequest, CancelReceipt, Session, open_supervisor
from supervisor.client import GatewayClient, GatewayError, connect
from supervisor.gateway import Gateway
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import receipt_to_wire

pytestmark = [pytest.mark.real_process] if LONG else []

SESSIONS = 100
STORM_S = 60.0 if LONG else 12.0
#: Bound on the drain after the storm: the last cancels and the turns they end.
DRAIN_S = 60.0
CLIENTS = 4
WATCHED = 10
GRACE = 0.3
#: Descriptors the run may hold on to after the supervisor is gone (trio's own, lazily made).
FD_ALLOWANCE = 8
#: Only turns this recent are named by a cancel (a session remembers its last 64).
RECENT_TURNS = 20
SEED = int(os.environ.get("AGENT_SUPERVISOR_STORM_SEED", "0")) or 20_240_611


@attrs.frozen
class Prompts:
    """The storm's prompt texts, for one kind of agent."""

    normal: Callable[[random.Random], str]
    slow_stop: str
    ignores_cancel: str
    permission: str
    crash: str
    flood: str

    def pick(self, rng: random.Random) -> str:
        kind = rng.choices(
            ["normal", "slow_stop", "ignores_cancel", "permission", "crash", "flood"],
            weights=[50, 20, 10, 8, 2, 10],
        )[0]
        if kind == "normal":
            return self.normal(rng)
        text: str = getattr(self, kind)
        return text


MEMORY_PROMPTS = Prompts(
    normal=lambda rng: f"words={rng.randint(1, 40)} interval={rng.choice([0.005, 0.01, 0.02])}",
    slow_stop="stop-delay=0.05 words=300 interval=0.01",
    ignores_cancel="ignore-cancel words=300 interval=0.01",
    permission="permission words=50 interval=0.01",
    crash="crash=3 words=10 interval=0.01",
    flood="flood words=3000",
)
DEMO_PROMPTS = Prompts(
    normal=lambda rng: f"words={rng.randint(1, 40)} delay={rng.choice([0.01, 0.02, 0.05])}",
    slow_stop="stop-delay=0.05 words=300",
    ignores_cancel="ignore-cancel words=300",
    permission="permission",
    crash="crash words=10",
    flood="flood words=3000",
)


@attrs.define
class Driven:
    """One session and what the storm did to it."""

    session: Session
    rec: FaultRecorder
    rng: random.Random
    accepted: list[str] = attrs.field(factory=list)
    cancel_calls: int = 0
    receipts: list[dict[str, Any]] = attrs.field(factory=list)
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = attrs.field(factory=list)
    rejected_prompts: int = 0
    final_state: str | None = None

    def started_recently(self) -> list[str]:
        started = [
            e.turn_id for e in self.rec.of_kind("turn.started") if isinstance(e, ev.TurnStarted)
        ]
        return started[-RECENT_TURNS:]


def wire(receipt: CancelReceipt | dict[str, Any]) -> dict[str, Any]:
    if isinstance(receipt, CancelReceipt):
        return receipt_to_wire(receipt)
    return {k: v for k, v in receipt.items() if k != "success"}


async def drive(d: Driven, clients: list[GatewayClient], prompts: Prompts, until: float) -> None:
    """Random prompts and cancels until ``until``, through the API or a gateway client."""
    rng = d.rng
    while trio.current_time() < until:
        client = rng.choice(clients) if rng.random() < 0.35 else None
        action = rng.choices(["prompt", "cancel", "named", "double"], weights=[50, 30, 12, 8])[0]
        if action == "prompt":
            text = prompts.pick(rng)
            try:
                if client is None:
                    d.accepted.append((await d.session.prompt(text)).id)
                else:
                    d.accepted.append((await client.prompt(d.session.id, text))["turn_id"])
            except (BadRequest, GatewayError) as error:  # the queue is full: refused, not lost
                assert "too many queued prompts" in str(error), error
                d.rejected_prompts += 1
        elif action == "double":
            # Two cancels at once (both in the mailbox before the actor looks): one receipt.
            got: list[dict[str, Any]] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_into, got, d)
                nursery.start_soon(cancel_into, got, d)
            d.pairs.append((got[0], got[1]))
        else:
            # "named": a turn that has started (running or ended: never a queued one, see
            # test_cancel_edges.py for those), so never a newer turn than the one named.
            recent = d.started_recently() if action == "named" else []
            turn_id = rng.choice(recent) if recent else None
            await cancel(d, client, turn_id)
        await trio.sleep(rng.uniform(0, 0.03))


async def cancel(
    d: Driven, client: GatewayClient | None, turn_id: str | None = None
) -> dict[str, Any]:
    d.cancel_calls += 1
    if client is None:
        receipt = wire(await d.session.cancel(turn_id=turn_id, reason="storm"))
    else:
        receipt = wire(await client.cancel(d.session.id, task_id=turn_id, reason="storm"))
    d.receipts.append(receipt)
    if turn_id is not None:
        assert receipt["turn_id"] == turn_id, receipt
    return receipt


@attrs.define
class Watched:
    """One session's events as a gateway client sees them."""

    session_id: str
    seqs: list[int] = attrs.field(factory=list)
    lagged: int = 0
    changed: trio.Event = attrs.field(factory=trio.Event)

    async def watch(
        self,
        client: GatewayClient,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A slow reader is cut off (``subscription.lagged``) and resubscribes from its last
        seq; the replay must continue where it left off (the history reaches back far enough)."""
        since = 0
        while True:
            async with client.subscribe(self.session_id, since_seq=since) as events:
                if since == 0:
                    task_status.started()
                async for event in events:
                    if event["event"] in ("subscription.lagged", "subscription.closed"):
                        self.lagged += 1
                        since = event["data"]["last_seq"]
                        break
                    self.seqs.append(event["seq"])
                    self.changed.set()
                    self.changed = trio.Event()
                else:
                    return

    async def wait_for(self, seq: int) -> None:
        while not self.seqs or self.seqs[-1] < seq:
            await self.changed.wait()


async def cancel_into(got: list[dict[str, Any]], d: Driven) -> None:
    got.append(await cancel(d, None))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_cancel_storm(tmp_path: Path) -> None:
    print(
        f"\ncancel storm: seed {SEED}, {SESSIONS} sessions, {STORM_S:g} s, {'demo agent processes' if LONG else 'in-memory agents'}"
    )
    fds_before = open_fds()
    if LONG:
        demo = AgentSpec.from_config("demo")
        spec = demo.with_args("--state-dir", str(tmp_path)).with_options(
            grace_s=GRACE, kill_timeout_s=0.5, start_timeout_s=120.0
        )
        launcher = None
        prompts = DEMO_PROMPTS
    else:
        spec = AgentSpec(name="storm", protocol="acp", command=["memory"], grace_s=GRACE)
        launcher = AcpLauncher(AcpBehaviour(words=10, word_interval=0.01))
        prompts = MEMORY_PROMPTS
    spec = spec.with_options(name="storm")
    driven: list[Driven] = []
    watched: list[Watched] = []
    seen_processes = []
    started = time.monotonic()
    with trio.fail_after(STORM_S + DRAIN_S + 120):
        async with open_supervisor(agents={"storm": spec}, launcher=launcher) as sup:
            async with trio.open_nursery() as nursery:
                server = Gateway(sup, port=0, token="storm-token")
                url = await nursery.start(server.serve)
                async with AsyncExitStack() as stack:
                    clients = [
                        await stack.enter_async_context(connect(url)) for _ in range(CLIENTS)
                    ]

                    async def start(index: int) -> None:
                        session = await sup.start_session("storm", cwd=str(tmp_path))
                        rec = FaultRecorder(session)
                        await nursery.start(rec.run)
                        driven.append(Driven(session, rec, random.Random(SEED * 1000 + index)))

                    async with trio.open_nursery() as starting:
                        for index in range(SESSIONS):
                            starting.start_soon(start, index)
                    driven.sort(key=lambda d: int(d.session.id[1:]))
                    async with trio.open_nursery() as watchers:
                        for d in driven[:WATCHED]:
                            watched.append(Watched(d.session.id))
                            await watchers.start(watched[-1].watch, clients[0])
                        until = trio.current_time() + STORM_S
                        async with trio.open_nursery() as storm:
                            for d in driven:
                                storm.start_soon(drive, d, clients, prompts, until)
                        stormed = time.monotonic()
                        # The end: a last cancel everywhere, then every accepted turn ends.
                        async with trio.open_nursery() as last:
                            for d in driven:
                                last.start_soon(cancel, d, None)
                        with trio.fail_after(DRAIN_S):
                            for d in driven:
                                for turn_id in d.accepted:
                                    await d.rec.wait_kind("turn.ended", turn_id=turn_id)
                                await d.session.wait_ready()  # a crash may still respawn
                                await d.rec.catch_up()
                                d.final_state = d.session.state
                            for d, w in zip(driven, watched, strict=False):
                                await w.wait_for(d.session.last_seq)
                        watchers.cancel_scope.cancel()
                    seen_processes = tree()
                nursery.cancel_scope.cancel()
        drained = time.monotonic()
    for d in driven:
        check_session(d)
    for w in watched:
        assert w.seqs == list(range(1, len(w.seqs) + 1)), f"{w.session_id}: wire seq not contiguous"
    assert await wait_gone(seen_processes, 5.0) == []
    assert living(tree()) == [], "processes left after the storm"
    fds_after = open_fds()
    assert fds_after <= fds_before + FD_ALLOWANCE, (
        f"file descriptors: {fds_before} before, {fds_after} after"
    )
    turns = sum(len(d.accepted) for d in driven)
    cancels = sum(d.cancel_calls for d in driven)
    outcomes: dict[str, int] = {}
    for d in driven:
        for r in d.receipts:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    print(
        f"cancel storm: {turns} turns, {cancels} cancels {outcomes},"
        f" {sum(d.rejected_prompts for d in driven)} prompts refused (queue full);"
        f" start and storm {stormed - started:.1f} s, drain {drained - stormed:.1f} s;"
        f" fds {fds_before} -> {fds_after}; wire cut-offs {sum(w.lagged for w in watched)}"
    )


def check_session(d: Driven) -> None:
    rec = d.rec
    rec.check_invariants()
    assert d.final_state == "ready", f"{d.session.id} was {d.final_state} after the storm"
    ended: dict[str, ev.TurnEnded] = {}
    for event in rec.of_kind("turn.ended"):
        assert isinstance(event, ev.TurnEnded)
        assert event.turn_id not in ended, f"{d.session.id}: two turn.ended for {event.turn_id}"
        ended[event.turn_id] = event
    assert sorted(ended) == sorted(d.accepted), f"{d.session.id}: turns accepted vs ended differ"
    assert len(d.receipts) == d.cancel_calls
    # A turn ended by a cancel is one a caller asked about: a cancel never stops a newer turn.
    asked = {r["turn_id"] for r in d.receipts} | {
        p["turn_id"] for r in d.receipts for p in r["dropped_prompts"]
    }
    stopped = {t for t, e in ended.items() if e.receipt is not None}
    assert stopped <= asked, f"{d.session.id}: turns stopped that no cancel named or ran into"
    for first, second in d.pairs:
        if first["outcome"] == "no_active_turn" or second["outcome"] == "no_active_turn":
            # No turn to share: the session had none (it may be respawning), or two callers at
            # once are still two calls, and the actor may serve one, see its turn end (the
            # agent's answer was already on its way), then the other. Either way only one of
            # them may drop the queue.
            assert not (first["dropped_prompts"] and second["dropped_prompts"]), (first, second)
        else:
            assert first == second, f"{d.session.id}: concurrent cancels got different receipts"
    for receipt in d.receipts:
        if receipt["outcome"] == "no_active_turn":
            assert receipt["turn_id"] is None
            for dropped in receipt["dropped_prompts"]:
                assert ended[dropped["turn_id"]].stop_reason == "dropped"
            continue
        end = ended[receipt["turn_id"]]
        if end.receipt is not None:
            assert receipt == end.receipt, f"{d.session.id}: receipt differs from turn.ended's"
        else:
            # The cancel named a turn that had ended without one: it says how it ended.
            expected = "failed" if end.outcome == "failed" else "completed"
            assert receipt["outcome"] == expected, (receipt, end)
            assert end.outcome in ("completed", "failed"), end
