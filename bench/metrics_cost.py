"""What keeping metrics costs: the cancel latency and the event throughput with metrics on,
beside the same with metrics off, in the same run (target: within 3 %).

Metrics are counted from the events sessions publish (``supervisor/observe/``): a session's
fan-out tells its observer of each event it publishes one at a time (states, a turn's start and
end: a cancel's ``turn.ended`` carries the receipt the observer reads), never of a stream's
runs. Off, the observer is None and a publish tests it; on, a ``turn.ended`` is counted
(turns, the cancel's latency, its steps, the interrupt's delivery) on the cancel's way to its
receipt. So the two figures it could move:

- **cancel latency**: ``session.cancel()`` to its receipt, a cooperative agent (the demo agent,
  stopping 1 ms after the cancel: ``bench/cancel_overhead.py``'s), and the same through the
  WebSocket gateway (``agent.cancel`` to its answer). Two supervisors side by side, one
  keeping metrics; rounds interleaved, the order swapped every round, so machine noise hits
  both alike. p50 and p99 of each, and the ratio on/off of the p50s;
- **throughput**: ``bench/throughput.py``'s "ours" run (the light agent's flood through a
  session and the gateway to one WebSocket subscriber in a process of its own) with and
  without metrics, runs alternated, each of 100,000 events, five times ``throughput.py``'s (a
  run of its 20,000 takes ~0.1 s, and on a shared machine two runs side by side then differ
  by half); the median events/s and server CPU per event of each, the ratio of the medians,
  and the median of the ratios of the runs side by side (the machine's speed drifts over
  seconds: ``bench/throughput.py``).

Also, since a shared machine's noise is larger than what is measured here, counts that load
does not move (``bench/opcount.py``): the Python bytecodes the server runs per streamed event, one
run each side (``--ops-words`` events); and what the observer itself runs for a cancel's
``turn.ended`` and for any other event (bytecodes, and microseconds warm). (A whole cancel's
bytecodes are no such count: its wait for the agent's answer takes as many passes of trio's
run loop as the wait lasts, and two cancels of the same side differ by thousands.)

Left out: a scrape (``GET /metrics`` reads every session once, when Prometheus asks, every 15 s
or so; not on any event's way). Usage: ``python -m bench.metrics_cost [--rounds 200]
[--words 100000] [--repeats 7] [--ops-words 5000]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import timeit
from typing import Any

import trio

from bench.cancel_overhead import AGENT_ARGS, gateway_cancel, percentile, supervisor_cancel
from bench.opcount import OpCount
from bench.throughput import run_ours
from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.client import connect
from supervisor.gateway import Gateway
from supervisor.observe import Metrics

SIDES = ("off", "on")
#: The target: metrics on within this much of metrics off.
TARGET = 0.03


async def cancels(rounds: int) -> dict[str, Any]:
    """``rounds`` cooperative cancels on each side, directly and through the gateway."""
    state_dir = tempfile.mkdtemp(prefix="bench-metrics-")
    argv = [sys.executable, "-m", "supervisor.demo_agent", "--state-dir", state_dir, *AGENT_ARGS]
    agents = {"bench": AgentSpec(name="bench", protocol="acp", command=argv)}
    metrics = Metrics()
    times: dict[str, list[float]] = {f"{s}_{w}": [] for s in SIDES for w in ("sup", "gw")}
    async with (
        open_supervisor(agents=agents) as off,
        open_supervisor(agents=agents, metrics=metrics) as on,
        trio.open_nursery() as nursery,
    ):
        sides = {"off": off, "on": on}
        sessions = {side: await sup.start_session("bench", cwd="/") for side, sup in sides.items()}
        urls = {
            side: await nursery.start(Gateway(sup, port=0).serve) for side, sup in sides.items()
        }
        async with connect(urls["off"]) as off_client, connect(urls["on"]) as on_client:
            clients = {"off": off_client, "on": on_client}
            remote = {
                side: (await client.start_session("bench"))["session_id"]
                for side, client in clients.items()
            }

            async def one(side: str, record: bool) -> None:
                sup_time = await supervisor_cancel(sessions[side])
                gw_time = await gateway_cancel(clients[side], remote[side])
                if record:
                    times[f"{side}_sup"].append(sup_time)
                    times[f"{side}_gw"].append(gw_time)

            for index in range(5 + rounds):  # 5 of warm-up
                order = SIDES if index % 2 == 0 else SIDES[::-1]
                for side in order:
                    await one(side, record=index >= 5)
        nursery.cancel_scope.cancel()
    counted = [
        s.value
        for family in metrics.registry.collect()
        if family.name == "agent_supervisor_cancel_seconds"
        for s in family.samples
        if s.name.endswith("_count")
    ]
    # Every cancel of the "on" side (its warm-up too) was counted, and nothing else.
    assert sum(counted) == 2 * (5 + rounds), counted
    result: dict[str, Any] = {"rounds": rounds}
    for key, values in times.items():
        result[f"cancel_{key}_p50_ms"] = percentile(values, 0.5) * 1000
        result[f"cancel_{key}_p99_ms"] = percentile(values, 0.99) * 1000
    for way in ("sup", "gw"):
        result[f"cancel_{way}_ratio_p50"] = (
            result[f"cancel_on_{way}_p50_ms"] / result[f"cancel_off_{way}_p50_ms"]
        )
    return result


async def throughput(words: int, repeats: int, ops_words: int) -> dict[str, Any]:
    """``repeats`` floods on each side, alternated (the order swapped every repeat)."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for index in range(repeats):
        for side in SIDES if index % 2 == 0 else SIDES[::-1]:
            runs[side].append(await run_ours(1, words, 1, memory=False, metrics=side == "on"))
    result: dict[str, Any] = {"words": words, "repeats": repeats}
    for side, values in runs.items():
        for key in ("events_per_s", "server_us_per_event"):
            result[f"throughput_{side}_{key}"] = statistics.median(v[key] for v in values)
        result[f"throughput_{side}_lost"] = max(v["lost"] for v in values)
    result["throughput_ratio"] = (
        result["throughput_on_events_per_s"] / result["throughput_off_events_per_s"]
    )
    result["throughput_cpu_ratio"] = (
        result["throughput_on_server_us_per_event"] / result["throughput_off_server_us_per_event"]
    )
    pairs = [
        on["events_per_s"] / off["events_per_s"]
        for on, off in zip(runs["on"], runs["off"], strict=True)
    ]
    result["throughput_paired_ratio"] = statistics.median(pairs)
    result["throughput_paired_range"] = (min(pairs), max(pairs))
    result["ops_words"] = ops_words
    for side in SIDES:
        count = OpCount()
        await run_ours(1, ops_words, 1, memory=False, window=count, metrics=side == "on")
        result[f"throughput_{side}_ops_per_event"] = count.ops / ops_words
    result["throughput_ops_ratio"] = (
        result["throughput_on_ops_per_event"] / result["throughput_off_ops_per_event"]
    )
    return result


def observer_cost() -> dict[str, Any]:
    """What the observer runs for one event: a cancel's ``turn.ended`` (its receipt counted:
    the turn, the latency, a step, the delivery) and a ``session.state`` (looked up, not
    counted)."""
    observe = Metrics().observer("codex")
    receipt = {
        "outcome": "cancelled",
        "escalation": ["interrupt"],
        "stop_reason": "interrupted",
        "elapsed_ms": 3.0,
        "timeline": {"interrupt": 0.0, "interrupt_answered": 1.0, "turn_ended": 3.0},
    }
    events = {
        "turn_ended": ev.TurnEnded(turn_id="t1", outcome="cancelled", receipt=receipt),
        "state": ev.SessionState(state="ready"),
    }
    result: dict[str, Any] = {}
    for name, event in events.items():
        observe(event)  # its label children made
        count = OpCount()
        with count:
            observe(event)
        result[f"observer_{name}_ops"] = count.ops
        times = timeit.repeat(functools.partial(observe, event), number=10_000, repeat=5)
        result[f"observer_{name}_us"] = min(times) / 10_000 * 1e6
    return result


async def main(rounds: int, words: int, repeats: int, ops_words: int) -> dict[str, Any]:
    return {
        **await cancels(rounds),
        **await throughput(words, repeats, ops_words),
        **observer_cost(),
    }


def report(f: dict[str, Any]) -> None:
    print(f"metrics on beside metrics off, in one run (target: within {TARGET:.0%})")
    print(
        f"  cancel latency, {f['rounds']} cooperative cancels each (demo agent, stops after 1 ms):"
    )
    for way, name in (("sup", "session.cancel -> receipt"), ("gw", "WebSocket -> receipt    ")):
        print(
            f"    {name}: off p50 {f[f'cancel_off_{way}_p50_ms']:.3f} ms"
            f" p99 {f[f'cancel_off_{way}_p99_ms']:.3f} ms;"
            f" on p50 {f[f'cancel_on_{way}_p50_ms']:.3f} ms"
            f" p99 {f[f'cancel_on_{way}_p99_ms']:.3f} ms;"
            f" ratio on/off p50 {f[f'cancel_{way}_ratio_p50']:.3f}"
        )
    low, high = f["throughput_paired_range"]
    print(
        f"  throughput, {f['words']} one-word deltas to 1 WebSocket subscriber, median of"
        f" {f['repeats']} runs each:"
    )
    for side in SIDES:
        print(
            f"    metrics {side:<3}: {f[f'throughput_{side}_events_per_s']:>7.0f} events/s,"
            f" server CPU {f[f'throughput_{side}_server_us_per_event']:.2f} us/event"
            + (f", lost {f[f'throughput_{side}_lost']:.0%}" if f[f"throughput_{side}_lost"] else "")
        )
    print(
        f"    ratio on/off events/s {f['throughput_ratio']:.3f} (runs side by side: median"
        f" {f['throughput_paired_ratio']:.3f}, {low:.3f}-{high:.3f}); server CPU per event"
        f" {f['throughput_cpu_ratio']:.3f}"
    )
    print(
        f"    Python bytecodes per streamed event ({f['ops_words']} events): off"
        f" {f['throughput_off_ops_per_event']:.1f}, on {f['throughput_on_ops_per_event']:.1f},"
        f" ratio {f['throughput_ops_ratio']:.3f}"
    )
    print(
        f"  the observer itself, warm: a cancel's turn.ended {f['observer_turn_ended_ops']}"
        f" bytecodes, {f['observer_turn_ended_us']:.2f} us; any other event"
        f" {f['observer_state_ops']} bytecodes, {f['observer_state_us']:.3f} us"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--words", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ops-words", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = trio.run(main, args.rounds, args.words, args.repeats, args.ops_words)
    report(figures)
    if args.json:
        print(json.dumps(figures))
    print(
        f"ratio metrics on/off: cancel p50 {figures['cancel_sup_ratio_p50']:.3f}"
        f" (gateway {figures['cancel_gw_ratio_p50']:.3f}), throughput events/s"
        f" {figures['throughput_ratio']:.3f} (target within {TARGET:.0%}); bytecodes per event"
        f" {figures['throughput_ops_ratio']:.3f}; the observer, per cancel's turn.ended"
        f" {figures['observer_turn_ended_ops']} bytecodes"
    )
