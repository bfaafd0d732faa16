"""Benchmark: is a stop still instant while other sessions flood? One quiet session's cancel,
with K other sessions of the same supervisor streaming as fast as their pipes take it.

All sessions run ``bench/fake_light_agent.py`` (stdlib ACP agent) through the public API
(``open_supervisor``, ``Session.prompt/cancel/subscribe``). The K flooders each run a
``flood forever`` turn: one-word ``agent_message_chunk`` lines written as fast as the pipe takes
them, until cancelled; nobody subscribes to them, so what they cost the supervisor is reading,
parsing and recording their events (no fan-out). K grows within one run (default 0, 10, 100,
300; the flooders of a level keep flooding through the next), and at each level the quiet
session does ``--rounds`` turns: prompt, wait for its first word, then
``t0 = time.monotonic(); receipt = await session.cancel()``.

Two figures per round, both from ``t0``, both on CLOCK_MONOTONIC (system-wide):

- **receipt**: until ``session.cancel()`` returns its receipt: the interrupt going out, the
  agent answering at once, its answer coming back in through the flood, the receipt;
- **interrupt delivery**: until the quiet agent *read* the ``session/cancel`` line, as the agent
  itself timestamps it (``time.monotonic()`` just after its ``read()``) and appends to its
  ``--log`` file, out of band: the supervisor, which is what is measured, never carries it.
  This is the "instant" of the promise: how long the interrupt waits behind other sessions'
  traffic inside the supervisor, plus one pipe write and the agent's wake-up.

Per level also: the flood the supervisor absorbed meanwhile (events/s over all flooders, from
their ``last_seq``), the supervisor process's CPU share over the rounds (near 100 %: the flood
saturates it, which is the point), its cyclic-GC pauses (share of the span, full collections,
the longest: a full collection stops every session at once), and the machine's load: the
1-minute load average before and after the level's rounds (it counts our own processes too),
and, before anything starts, the share of a core a busy loop gets (what other people's work
leaves us). Left out: start-up of the flooders (not
timed), any subscriber fan-out (none), and the gateway (the cancel is a direct API call).
``RLIMIT_NOFILE`` is raised to its hard limit (300 sessions hold ~1500 descriptors).

Last line: interrupt delivery and receipt p99 at the largest K, against the targets
(K=100: delivery p99 <= 3 ms, receipt p99 <= 10 ms; K=300: receipt p99 <= 25 ms).
Usage: ``python -m bench.fairness [--k 0,10,100,300] [--rounds 200]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.cancel_overhead import percentile
from bench.machine import free_cpu, load_average, raise_fd_limit
from supervisor import AgentSpec, Supervisor, open_supervisor
from supervisor.supervisor import AnySession

HERE = Path(__file__).resolve().parent
LIGHT_AGENT = [sys.executable, "-S", str(HERE / "fake_light_agent.py")]
#: The quiet agent's first word comes at once; the next would only after this long.
QUIET_INTERVAL_S = 600.0
WARM_UP_ROUNDS = 5
TARGETS = {
    100: {"delivery_p99_ms": 3.0, "receipt_p99_ms": 10.0},
    300: {"receipt_p99_ms": 25.0},
}


class GcPauses:
    """The supervisor process's cyclic-GC collections (``gc.callbacks``): a long full
    collection stops every session at once, so it shows in the tails."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._began))

    def take(self) -> list[tuple[int, float]]:
        pauses, self.pauses = self.pauses, []
        return pauses

    def figures(self, span: float) -> dict[str, float]:
        """The collections since the last :meth:`take`, over ``span`` seconds: their share of
        it, the full ones, the longest."""
        pauses = self.take()
        return {
            "gc_share": sum(seconds for _, seconds in pauses) / span,
            "gc_full_collections": sum(generation == 2 for generation, _ in pauses),
            "gc_longest_ms": max((seconds for _, seconds in pauses), default=0.0) * 1000,
        }


class CancelLog:
    """The quiet agent's own record of when it read each ``session/cancel``."""

    def __init__(self, path: Path) -> None:
        path.touch()
        self._file = path.open()

    def next_read_at(self) -> float:
        """The read time of the next cancel; its line is written before the agent replies, so
        it is there once the receipt is."""
        entry = self._file.readline()
        if not entry.endswith("\n"):
            raise RuntimeError(f"the quiet agent logged no cancel read (got {entry!r})")
        return float(entry.split()[1])


def agents(log_path: Path) -> dict[str, AgentSpec]:
    """The quiet agent (its cancels' reads logged to ``log_path``) and the flooding one."""
    quiet = AgentSpec(
        name="quiet",
        protocol="acp",
        command=[*LIGHT_AGENT, "--interval", str(QUIET_INTERVAL_S), "--log", str(log_path)],
    )
    return {"quiet": quiet, "flood": AgentSpec(name="flood", protocol="acp", command=LIGHT_AGENT)}


async def flood(sessions: list[AnySession]) -> None:
    """Get each of ``sessions`` flooding (its first word seen)."""

    async def one(session: AnySession) -> None:
        async with session.subscribe() as events:
            await session.prompt("flood forever")
            async for event in events:
                if event.kind == "message.delta":
                    break

    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(one, session)


async def stop_flooding(sessions: list[AnySession]) -> None:
    """Cancel each of ``sessions``' flood (the receipts are not timed)."""
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(session.cancel)


async def start_flooders(sup: Supervisor, count: int) -> list[AnySession]:
    """Start ``count`` sessions of the flooding agent, idle."""
    sessions: list[AnySession] = []

    async def one() -> None:
        sessions.append(await sup.start_session("flood", cwd="/"))

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return sessions


async def start_flooding(sup: Supervisor, count: int) -> list[AnySession]:
    """Start ``count`` sessions and get each one flooding (its first word seen)."""
    sessions = await start_flooders(sup, count)
    await flood(sessions)
    return sessions


async def quiet_round(
    session: AnySession, log: CancelLog, words: list[float] | None = None
) -> tuple[float, float]:
    """One turn of the quiet session, cancelled: (receipt, interrupt delivery) in seconds;
    ``words``: given the time from the prompt to its first word seen, too."""
    async with session.subscribe() as events:
        prompted = time.monotonic()
        await session.prompt("go")
        async for event in events:
            if event.kind == "message.delta":
                break
        began = time.monotonic()
        if words is not None:
            words.append(began - prompted)
        receipt = await session.cancel()
        ended = time.monotonic()
    if receipt.outcome != "cancelled":
        raise RuntimeError(f"the quiet turn was not cancelled: {receipt}")
    return ended - began, log.next_read_at() - began


def tails(name: str, values: list[float]) -> dict[str, float]:
    """``name``'s p50, p99 and max, in ms (``values`` in seconds)."""
    return {
        f"{name}_{label}_ms": percentile(values, fraction) * 1000
        for label, fraction in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
    }


async def main(levels: list[int], rounds: int) -> dict[str, Any]:
    fd_limit = raise_fd_limit()
    result: dict[str, Any] = {
        "levels": levels,
        "rounds": rounds,
        "fd_limit": fd_limit,
        "free_cpu_before": free_cpu(),
        "load_before": load_average(),
    }
    log_path = Path(tempfile.mkdtemp(prefix="bench-fairness-")) / "cancels.log"
    log = CancelLog(log_path)
    collections = GcPauses()
    async with open_supervisor(agents=agents(log_path)) as sup:
        session = await sup.start_session("quiet", cwd="/")
        for _ in range(WARM_UP_ROUNDS):
            await quiet_round(session, log)
        flooders: list[AnySession] = []
        for k in levels:
            flooders += await start_flooding(sup, k - len(flooders))
            load = load_average()
            seqs = sum(f.last_seq for f in flooders)
            wall, cpu = time.monotonic(), time.process_time()
            collections.take()
            receipts, deliveries = [], []
            for _ in range(rounds):
                receipt, delivery = await quiet_round(session, log)
                receipts.append(receipt)
                deliveries.append(delivery)
            span = time.monotonic() - wall
            level = {
                **collections.figures(span),
                "load_before": load,
                "load_after": load_average(),
                "supervisor_cpu": (time.process_time() - cpu) / span,
                "flood_events_per_s": (sum(f.last_seq for f in flooders) - seqs) / span,
            }
            level.update(tails("receipt", receipts) | tails("delivery", deliveries))
            result.update({f"k{k}_{key}": value for key, value in level.items()})
        # Stopping 300 flooding sessions at the exit is not part of any figure.
    return result


def report(f: dict[str, Any]) -> None:
    print(
        f"fairness: one quiet session's cancel while K sessions flood, {f['rounds']} cancels per K"
        f" (machine before: load {f['load_before']:.2f}, a busy loop got"
        f" {f['free_cpu_before']:.0%} of a core; RLIMIT_NOFILE {f['fd_limit']})"
    )
    print(
        f"  {'K':>4}  {'receipt p50':>11} {'p99':>7} {'max':>7}  {'delivery p50':>12} {'p99':>7}"
        f" {'max':>7}  {'flood events/s':>14}  {'sup. CPU':>8}  {'GC share, full, longest':>23}"
        f"  {'load before/after':>17}"
    )
    for k in f["levels"]:
        g = {key[len(f"k{k}_") :]: v for key, v in f.items() if key.startswith(f"k{k}_")}
        print(
            f"  {k:>4}  {g['receipt_p50_ms']:>8.2f} ms {g['receipt_p99_ms']:>7.2f}"
            f" {g['receipt_max_ms']:>7.2f}  {g['delivery_p50_ms']:>9.2f} ms"
            f" {g['delivery_p99_ms']:>7.2f} {g['delivery_max_ms']:>7.2f}"
            f"  {g['flood_events_per_s']:>14.0f}  {g['supervisor_cpu']:>8.0%}"
            f"  {g['gc_share']:>9.0%} {g['gc_full_collections']:>4}x {g['gc_longest_ms']:>6.1f} ms"
            f"  {g['load_before']:>8.2f}/{g['load_after']:.2f}"
        )


def summary(f: dict[str, Any]) -> str:
    parts = []
    for k, targets in TARGETS.items():
        for key, bound in targets.items():
            if f"k{k}_{key}" in f:
                what = key.removesuffix("_ms").replace("_", " ")
                parts.append(f"K={k} {what} {f[f'k{k}_{key}']:.2f} ms (target <= {bound:g})")
    top = max(f["levels"])
    if not parts:
        parts.append(
            f"K={top} delivery p99 {f[f'k{top}_delivery_p99_ms']:.2f} ms,"
            f" receipt p99 {f[f'k{top}_receipt_p99_ms']:.2f} ms"
        )
    if "k0_delivery_p99_ms" in f and top:
        ratio = f[f"k{top}_delivery_p99_ms"] / f["k0_delivery_p99_ms"]
        parts.append(f"delivery p99 K={top}/K=0 {ratio:.1f}")
    return "fairness: " + ", ".join(parts)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="0,10,100,300", help="flooding sessions, ascending")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    levels = sorted(int(part) for part in args.k.split(","))
    figures = trio.run(main, levels, args.rounds)
    report(figures)
    if args.json:
        print(json.dumps(figures))
    print(summary(figures))
