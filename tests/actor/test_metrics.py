"""Tier 2: the metrics agree with what clients saw, on virtual time with in-memory agents.

Sessions of four protocols are driven to every outcome a turn can have (completed, cancelled,
killed, failed, a queued prompt dropped, a stall, a recycle, a memory-limit stop); a recorder
per session keeps every event, as any client would get them. The counts the recorders saw and
what ``Metrics`` renders are compared exactly: turns by outcome, cancels and their latencies
(histogram buckets, counts and sums), escalation steps, the interrupt's delivery where the
protocol says, stalls, recycles, memory stops; and the figures read at scrape time (sessions
by state, subscribers, events published, a stopped session's events still counted).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from protocols import events as ev
from supervisor.observe import LATENCY_BUCKETS, Metrics
from supervisor.testing import FakeAgent, Recorder, open_test_supervisor, record

LONG = "word " * 200


def reply(prompt: str) -> str:
    return "short answer" if prompt.startswith("short") else LONG


def scrape(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``GET /metrics``' text, parsed as Prometheus would."""
    text = metrics.render().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def labelled(samples: dict[Any, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name``, by label set, leaving out counters at 0 (a label child made
    when a session's observer was, that counted nothing)."""
    return {labels: value for (n, labels), value in samples.items() if n == name and value}


def seen(recorders: dict[str, tuple[str, Recorder]]) -> dict[str, Any]:
    """What the clients saw, counted as the metrics count it (``docs/metrics.md``)."""
    turns: Counter[tuple[str, str]] = Counter()
    cancels: dict[tuple[str, str], list[float]] = {}
    delivery: dict[str, list[float]] = {}
    steps: Counter[str] = Counter()
    stalls: Counter[str] = Counter()
    recycles: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    for protocol, recorder in recorders.values():
        for event in recorder.events:
            if isinstance(event, ev.TurnEnded):
                turns[protocol, event.outcome] += 1
                receipt = event.receipt
                if receipt is None or receipt["stop_reason"] == "dropped":
                    continue
                cancels.setdefault((protocol, event.outcome), []).append(
                    receipt["elapsed_ms"] / 1000
                )
                steps.update(receipt["escalation"])
                answered = receipt["timeline"].get("interrupt_answered")
                if answered is not None:
                    delivery.setdefault(protocol, []).append(answered / 1000)
            elif isinstance(event, ev.TurnStalled):
                stalls[protocol] += 1
            elif isinstance(event, ev.SessionRecycled):
                recycles[protocol] += 1
            elif isinstance(event, ev.ErrorEvent) and event.code == "memory_limit":
                memory[protocol] += 1
    return {
        "turns": turns,
        "cancels": cancels,
        "delivery": delivery,
        "steps": steps,
        "stalls": stalls,
        "recycles": recycles,
        "memory": memory,
    }


def assert_histogram(
    samples: dict[Any, float], name: str, observed: dict[frozenset[tuple[str, str]], list[float]]
) -> None:
    """Count, sum and every bucket of histogram ``name`` are those of the values observed."""
    counts = labelled(samples, name + "_count")
    assert counts == {labels: len(values) for labels, values in observed.items()}
    for labels, values in observed.items():
        assert samples[name + "_sum", labels] == pytest.approx(sum(values))
        for bound in LATENCY_BUCKETS:
            le = frozenset({*labels, ("le", str(bound))})
            assert samples[name + "_bucket", le] == sum(1 for v in values if v <= bound)
        assert samples[name + "_bucket", frozenset({*labels, ("le", "+Inf")})] == len(values)


async def test_the_counts_agree_exactly_with_what_the_clients_saw(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agents = {
        # completes one turn; a second is cancelled 250 ms after the interrupt (its {} at
        # once), with a third queued behind it and dropped
        "codex": FakeAgent("codex", reply=reply, on_cancel=0.25),
        # ignores the interrupt (acknowledged at once): killed at the grace, resumed
        "claude": FakeAgent("claude", reply=reply, on_cancel="ignore", grace_s=1.0),
        # fails every turn: two in a row recycle it
        "acp": FakeAgent("acp", reply=reply, fail_turn=True, max_failed_turns=2),
        # falls silent after a word: the watchdog stops the turn; then over its memory limit
        "opencode": FakeAgent(
            "opencode", reply=reply, silent_after=1, stall_s=5.0, max_memory_mb=500.0
        ),
    }
    metrics = Metrics()
    with trio.fail_after(600):
        async with open_test_supervisor(agents=agents, metrics=metrics) as sup:
            sessions = {name: await sup.start_session(name) for name in agents}
            async with (
                record(sessions["codex"]) as codex,
                record(sessions["claude"]) as claude,
                record(sessions["acp"]) as acp,
                record(sessions["opencode"]) as opencode,
            ):
                recorders = {
                    "codex": ("codex", codex),
                    "claude": ("claude", claude),
                    "acp": ("acp", acp),
                    "opencode": ("opencode", opencode),
                }
                session = sessions["codex"]
                done = await session.prompt("short")
                await codex.wait_kind("turn.ended", turn_id=done.id)
                running = await session.prompt("long")
                await session.prompt("queued")
                await codex.wait_kind("message.delta", turn_id=running.id)
                cancelled = await session.cancel()
                assert (cancelled.outcome, cancelled.elapsed_ms) == ("cancelled", 250.0)

                session = sessions["claude"]
                turn = await session.prompt("long")
                await claude.wait_kind("message.delta", turn_id=turn.id)
                killed = await session.cancel()
                assert (killed.outcome, killed.elapsed_ms) == ("killed", 1000.0)

                session = sessions["acp"]
                for _ in range(2):
                    turn = await session.prompt("short")
                    await acp.wait_kind("turn.ended", turn_id=turn.id)
                await acp.wait_kind("session.recycled")
                await session.wait_ready()

                session = sessions["opencode"]
                turn = await session.prompt("long")
                await opencode.wait_kind("turn.ended", turn_id=turn.id)
                agents["opencode"].processes[0].memory_mb = 700.0
                await opencode.wait_kind("session.recycled")
                await session.wait_ready()

                for _, recorder in recorders.values():
                    await recorder.catch_up()
                    recorder.check_invariants()
                saw = seen(recorders)
                samples = scrape(metrics)
                # while the four recorders are subscribed
                assert samples["agent_supervisor_subscribers", frozenset()] == 4
            live = scrape(metrics)

        # Every kind of ending was there to be counted (else the comparison proves little).
        assert set(saw["turns"]) == {
            ("codex", "completed"),
            ("codex", "cancelled"),
            ("claude", "killed"),
            ("acp", "failed"),
            ("opencode", "cancelled"),
        }
        assert saw["turns"]["codex", "cancelled"] == 2  # the one cancelled, the one dropped
        assert saw["stalls"] == {"opencode": 1} and saw["memory"] == {"opencode": 1}
        assert saw["recycles"] == {"acp": 1, "opencode": 1}
        assert set(saw["delivery"]) == {"codex", "claude", "opencode"}  # ACP's: never known

        def by(*names: str) -> Any:
            return lambda key: frozenset(
                zip(names, key if isinstance(key, tuple) else (key,), strict=True)
            )

        turns = by("protocol", "outcome")
        assert labelled(samples, "agent_supervisor_turns_total") == {
            turns(key): count for key, count in saw["turns"].items()
        }
        assert_histogram(
            samples,
            "agent_supervisor_cancel_seconds",
            {turns(key): values for key, values in saw["cancels"].items()},
        )
        assert_histogram(
            samples,
            "agent_supervisor_interrupt_delivery_seconds",
            {by("protocol")(key): values for key, values in saw["delivery"].items()},
        )
        assert labelled(samples, "agent_supervisor_escalations_total") == {
            by("step")(step): count for step, count in saw["steps"].items()
        }
        for name, key in (("stalls", "stalls"), ("recycles", "recycles")):
            assert labelled(samples, f"agent_supervisor_{name}_total") == {
                by("protocol")(p): n for p, n in saw[key].items()
            }
        assert labelled(samples, "agent_supervisor_memory_limit_stops_total") == {
            by("protocol")(p): n for p, n in saw["memory"].items()
        }
        # Read at the scrape: the sessions as listed, every event they published.
        published = sum(len(recorder.events) for _, recorder in recorders.values())
        assert samples["agent_supervisor_events_total", frozenset()] == published
        assert samples["agent_supervisor_sessions", frozenset({("state", "ready")})] == 4
        assert samples["agent_supervisor_history_bytes", frozenset()] > 0
        assert live["agent_supervisor_subscribers", frozenset()] == 0


async def test_a_stopped_session_stays_counted_and_the_states_are_read_at_the_scrape(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = Metrics()
    agents = {"acp": FakeAgent("acp", reply=reply)}
    async with open_test_supervisor(agents=agents, metrics=metrics) as sup:
        first = await sup.start_session("acp")
        second = await sup.start_session("acp")
        async with record(first) as events:
            turn = await first.prompt("long")
            await events.wait_kind("message.delta", turn_id=turn.id)
            samples = scrape(metrics)
            assert samples["agent_supervisor_sessions", frozenset({("state", "running")})] == 1
            assert samples["agent_supervisor_sessions", frozenset({("state", "ready")})] == 1
            await first.cancel()
        published = first.last_seq + second.last_seq
        assert scrape(metrics)["agent_supervisor_events_total", frozenset()] == published
        await sup.stop_session(first.id)
        stopped = first.last_seq + second.last_seq  # its stop published more
        samples = scrape(metrics)
        assert samples["agent_supervisor_events_total", frozenset()] == stopped > published
        assert samples["agent_supervisor_sessions", frozenset({("state", "ready")})] == 1
        assert sum(v for (n, _), v in samples.items() if n == "agent_supervisor_sessions") == 1


async def test_without_metrics_or_traces_no_observer_is_set(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Off, a session's publish costs one test of None: nothing is made for it."""
    async with open_test_supervisor(agents={"acp": FakeAgent("acp")}) as sup:
        session = await sup.start_session("acp")
        assert session.fanout.observer is None and sup.metrics is None


async def test_one_metrics_is_fed_by_one_supervisor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = Metrics()
    agents = {"acp": FakeAgent("acp")}
    async with open_test_supervisor(agents=agents, metrics=metrics) as sup:
        assert sup.metrics is metrics
        with pytest.raises(ValueError, match="one supervisor"):
            async with open_test_supervisor(agents=agents, metrics=metrics):
                pass
