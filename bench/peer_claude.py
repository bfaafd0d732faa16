"""Benchmark 3a: stopping a Claude Code turn: the official Python SDK against our adapter.

Both sides drive the *same* fake ``claude`` CLI (``tests/fakes/fake_claude.py`` through
``bench/fake_claude_cli.py``, which only drops the SDK's extra flags and fills in the fields the
SDK's parser requires), on trio, in this one process, round by round in turn:

- **SDK** (``claude-agent-sdk``, ``ClaudeSDKClient`` on trio): ``await client.interrupt()``
  (returns on the CLI's ``control_response``, an acknowledgement) and then reading messages up
  to the turn's ``ResultMessage``: that ``result`` is the turn's end.
- **ours** (``protocol = "claude"``, the CLI under the containment shim): ``await
  session.cancel()`` until the receipt (interrupt, the ``result``, the session ready again).

Cooperative CLI: timed from the stop call to the turn's end, p50/p99, and the ratio ours/SDK.
Wedged CLI (``wedged``: acknowledges the interrupt and never writes the ``result``): how long
each takes to get the turn ended. Ours escalates after its grace window (kill the tree, respawn
with ``--resume``, receipt); the SDK has no escalation, so its wait is capped (``--sdk-cap``) and
reported as "not ended"; the caller's only way out is ``disconnect()``, timed as well (the turn
and the CLI process are then gone, the conversation is not resumed).

Last line: the ratio ours/SDK, p50, cooperative.
Usage: ``python -m bench.peer_claude [--rounds 100] [--wedged-rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, ResultMessage, StreamEvent

from bench.cancel_overhead import percentile
from bench.fake_claude_cli import write_launcher
from protocols.claude import CLAUDE_COMMAND
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.config import DEFAULT_GRACE_S

WRAPPER = str(Path(__file__).with_name("fake_claude_cli.py").resolve())
#: The fake streams a word every 20 ms (its default) and reacts to the interrupt at once.
CLI_ARGS = {"words": "100000", "word-interval": "0.02"}
WEDGED_PROMPT = "go wedged"  # a prompt token: this turn is wedged, the CLI's others are not


def sdk_options(cli: str, state_dir: str, debug: list[str]) -> ClaudeAgentOptions:
    return ClaudeAgentOptions(
        cli_path=cli,
        include_partial_messages=True,  # the deltas, as our adapter asks for them
        extra_args={**CLI_ARGS, "state-dir": state_dir},
        stderr=debug.append,
    )


async def sdk_first_delta(client: ClaudeSDKClient) -> None:
    async for message in client.receive_messages():
        if isinstance(message, StreamEvent) and message.event.get("type") == "content_block_delta":
            return


async def sdk_cooperative(client: ClaudeSDKClient) -> tuple[float, float]:
    """One turn stopped through the SDK: (interrupt acknowledged, result read), seconds."""
    await client.query("go")
    await sdk_first_delta(client)
    start = time.perf_counter()
    await client.interrupt()
    acked = time.perf_counter() - start
    async for message in client.receive_messages():
        if isinstance(message, ResultMessage):
            assert message.subtype == "error_during_execution", message
            break
    return acked, time.perf_counter() - start


async def sdk_wedged(cli: str, state_dir: str, cap: float) -> dict[str, Any]:
    """A wedged turn through the SDK: interrupt, wait for the result up to ``cap``, disconnect."""
    debug: list[str] = []
    client = ClaudeSDKClient(sdk_options(cli, state_dir, debug))
    await client.connect()
    try:
        await client.query(WEDGED_PROMPT)
        await sdk_first_delta(client)
        start = time.perf_counter()
        await client.interrupt()
        acked = time.perf_counter() - start
        ended: float | None = None
        with trio.move_on_after(cap):
            async for message in client.receive_messages():
                if isinstance(message, ResultMessage):
                    ended = time.perf_counter() - start
                    break
        waited = time.perf_counter() - start
    finally:
        before = time.perf_counter()
        await client.disconnect()
        disconnect = time.perf_counter() - before
    return {"acked": acked, "ended": ended, "waited": waited, "disconnect": disconnect}


async def ours_cancel(session: Session, text: str = "go") -> tuple[float, Any]:
    async with session.subscribe() as events:
        await session.prompt(text)
        async for event in events:
            if event.kind == "message.delta":
                break
        start = time.perf_counter()
        receipt = await session.cancel()
        elapsed = time.perf_counter() - start
    return elapsed, receipt


async def main(rounds: int, wedged_rounds: int, grace: float, cap: float) -> dict[str, Any]:
    logging.getLogger("claude_agent_sdk").setLevel(logging.ERROR)
    workdir = tempfile.mkdtemp(prefix="bench-peer-claude-")
    cli = write_launcher(workdir)
    state_dir = tempfile.mkdtemp(prefix="state-", dir=workdir)
    cli_flags = [f"--{key}={value}" for key, value in CLI_ARGS.items()]
    command = [sys.executable, WRAPPER, *CLAUDE_COMMAND[1:], *cli_flags, f"--state-dir={state_dir}"]
    spec = AgentSpec(name="fake-claude", protocol="claude", command=command, grace_s=grace)
    sdk_ack: list[float] = []
    sdk_end: list[float] = []
    ours: list[float] = []
    wedged_ours: list[float] = []
    wedged_sdk: list[dict[str, Any]] = []
    escalation: list[str] = []
    debug: list[str] = []
    async with open_supervisor(agents={"fake-claude": spec}) as sup:
        session = await sup.start_session("fake-claude", cwd=workdir)
        async with ClaudeSDKClient(sdk_options(cli, state_dir, debug)) as client:
            for _ in range(5):  # warm-up, both sides
                await sdk_cooperative(client)
                await ours_cancel(session)
            for _ in range(rounds):
                acked, ended = await sdk_cooperative(client)
                sdk_ack.append(acked)
                sdk_end.append(ended)
                elapsed, receipt = await ours_cancel(session)
                assert receipt.outcome == "cancelled", receipt
                ours.append(elapsed)
        for _ in range(wedged_rounds):
            wedged_sdk.append(await sdk_wedged(cli, state_dir, cap))
            elapsed, receipt = await ours_cancel(session, WEDGED_PROMPT)
            assert receipt.outcome == "killed" and receipt.resumed is True, receipt
            escalation = receipt.escalation
            wedged_ours.append(elapsed)
    sdk_ended = [r["ended"] for r in wedged_sdk if r["ended"] is not None]
    result: dict[str, Any] = {
        "rounds": rounds,
        "sdk_interrupt_ack_p50_ms": percentile(sdk_ack, 0.5) * 1000,
        "sdk_turn_end_p50_ms": percentile(sdk_end, 0.5) * 1000,
        "sdk_turn_end_p99_ms": percentile(sdk_end, 0.99) * 1000,
        "ours_receipt_p50_ms": percentile(ours, 0.5) * 1000,
        "ours_receipt_p99_ms": percentile(ours, 0.99) * 1000,
        "wedged_rounds": wedged_rounds,
        "wedged_grace_s": grace,
        "wedged_escalation": escalation,
        "wedged_ours_receipt_p50_ms": percentile(wedged_ours, 0.5) * 1000,
        "wedged_ours_receipt_max_ms": max(wedged_ours) * 1000,
        "wedged_ours_beyond_grace_p50_ms": (percentile(wedged_ours, 0.5) - grace) * 1000,
        "wedged_sdk_cap_s": cap,
        "wedged_sdk_ended_within_cap": f"{len(sdk_ended)}/{wedged_rounds}",
        "wedged_sdk_interrupt_ack_p50_ms": percentile([r["acked"] for r in wedged_sdk], 0.5) * 1000,
        "wedged_sdk_disconnect_p50_ms": percentile([r["disconnect"] for r in wedged_sdk], 0.5)
        * 1000,
    }
    result["ratio_p50"] = result["ours_receipt_p50_ms"] / result["sdk_turn_end_p50_ms"]
    result["ratio_p99"] = result["ours_receipt_p99_ms"] / result["sdk_turn_end_p99_ms"]
    # Wedged: ours ended the turn; the SDK had not by the cap, so this is an upper bound.
    result["wedged_ratio_vs_cap"] = result["wedged_ours_receipt_p50_ms"] / (cap * 1000)
    return result


def report(f: dict[str, Any]) -> None:
    print(
        f"Claude Code turn stop, same fake CLI, {f['rounds']} cooperative rounds interleaved"
        " (claude-agent-sdk 0.2.189 on trio vs our claude adapter)"
    )
    print(f"  SDK  interrupt() ack:                     p50 {f['sdk_interrupt_ack_p50_ms']:.2f} ms")
    print(
        f"  SDK  interrupt() + read to the result:    p50 {f['sdk_turn_end_p50_ms']:.2f} ms  p99 {f['sdk_turn_end_p99_ms']:.2f} ms"
    )
    print(
        f"  ours session.cancel() -> receipt:         p50 {f['ours_receipt_p50_ms']:.2f} ms  p99 {f['ours_receipt_p99_ms']:.2f} ms"
    )
    print(
        f"wedged CLI (acknowledges the interrupt, never writes the result), {f['wedged_rounds']} rounds:"
    )
    print(
        f"  ours: receipt p50 {f['wedged_ours_receipt_p50_ms']:.0f} ms (max {f['wedged_ours_receipt_max_ms']:.0f} ms)"
        f" = grace {f['wedged_grace_s']:g} s + {f['wedged_ours_beyond_grace_p50_ms']:.0f} ms;"
        f" {' -> '.join(f['wedged_escalation'])}"
    )
    print(
        f"  SDK:  interrupt() acked in {f['wedged_sdk_interrupt_ack_p50_ms']:.2f} ms, then no result:"
        f" turn ended within the {f['wedged_sdk_cap_s']:g} s cap in {f['wedged_sdk_ended_within_cap']} rounds"
        " (it has no escalation; the wait was capped by this benchmark)"
    )
    print(
        f"        its only way out, disconnect() (CLI gone, conversation not resumed): p50 {f['wedged_sdk_disconnect_p50_ms']:.0f} ms"
    )
    print(
        f"  wedged: ours / SDK cap = {f['wedged_ratio_vs_cap']:.2f} (the SDK's true time is unbounded)"
    )
    print(f"  ratio ours/SDK p99 (cooperative): {f['ratio_p99']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--wedged-rounds", type=int, default=3)
    parser.add_argument(
        "--grace", type=float, default=DEFAULT_GRACE_S, help="our grace window (default: ours)"
    )
    parser.add_argument(
        "--sdk-cap", type=float, default=10.0, help="how long the SDK side waits for a result"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = trio.run(main, args.rounds, args.wedged_rounds, args.grace, args.sdk_cap)
    report(figures)
    if args.json:
        print(json.dumps(figures))
    print(f"ratio ours/SDK p50 (cooperative, stop call -> turn ended): {figures['ratio_p50']:.2f}")
