"""Tier 4: steering the real Claude Code 2.1.332 in stream-json mode under the supervisor.

Set up as in ``test_real_claude.py`` (whose harness this reuses: the native binary with the
adapter's command line, a fresh ``HOME`` per test, a loopback-only network namespace, the fake
model's ``POST /v1/messages``; a skip, or a failure under ``AGENT_SUPERVISOR_STRICT_SKIPS=1``,
when the CLI cannot be installed). The machine steers with a further ``user`` line carrying a
``uuid`` and ``priority: "now"`` (``protocols/claude.py``, "Steering"). ``session.steer``:

(a) while the model streams: ``injected`` (the CLI's ``command_lifecycle`` ``queued``); the
    machine writes it ``priority: "now"``: the CLI aborts the stream, writes a ``result`` for the
    old prompt (a handover: ``session.info``) and runs the steer, whose request holds the prompt
    too; the same turn ends ``completed`` with the ``result`` naming the steer, and the next
    prompt completes;
(b) with no turn running: ``started``, and that turn completes;
(c) while an approved Bash runs: ``injected``, written ``priority: "next"``; the Bash runs to its
    end, the request after it carries its result with the steer in it, and the one ``result``
    names both (no handover);
(d) a steer the CLI still holds (queued behind a running Bash), then a cancel: the interrupt
    asks ``cancel_queued``, the CLI cancels the steer with the turn (``command_lifecycle``
    ``cancelled``) and kills the Bash at once, and no turn runs for the steer afterwards. With
    ``priority: "now"`` (what the machine wrote before this test) the interrupt could not stop
    the Bash at all: the receipt was ``killed`` after the grace (see ``protocols/claude.py``);
(e) a steer that took over the turn (the model streams for it), then a cancel: ``cancelled``,
    the stream dropped, nothing runs after.

Every test also checks that the adapter understood every line the CLI wrote. Timings go into
the tier-4 table as agent ``claude-stream-json``, scenarios ``steer-*``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import test_real_claude
import trio
from test_real_claude import BOUND_S, approve_permissions, second_prompt_completes

from protocols import events as ev
from realagents import scenarios, steering
from realagents.conftest import Harness
from realagents.fake_model import BRIEF_SHELL_COMMAND, SHELL_COMMAND
from realagents.scenarios import TOOL_LEAF, family
from realagents.steering import MARK, STEER_QUICK, STEER_STREAM

pytestmark = pytest.mark.real_process

#: The fixtures of ``test_real_claude.py`` (pytest finds them by these names).
claude_install = test_real_claude.claude_install
open_claude = test_real_claude.open_claude

KEY = test_real_claude.KEY


def _infos(h: Harness, kind: str) -> list[dict[str, Any]]:
    return [
        e.data
        for e in h.recorder.of_kind("session.info")
        if isinstance(e, ev.SessionInfo) and e.info_kind == kind
    ]


def _lifecycle(h: Harness, command_uuid: str) -> list[str]:
    """The ``command_lifecycle`` states the CLI reported for one user line, in order."""
    return [
        str(d.get("state"))
        for d in _infos(h, "command_lifecycle")
        if d.get("command_uuid") == command_uuid
    ]


async def _steer_uuid(h: Harness, steered: steering.Steered) -> str:
    """The uuid the machine gave the steer's user line: the CLI's lifecycle names it (its
    ``queued`` comes just before the ``turn.steered`` it answers)."""
    await h.recorder.wait_kind("turn.steered", turn_id=steered.result.turn_id)
    queued = [
        d["command_uuid"]
        for d in _infos(h, "command_lifecycle")
        if d.get("state") == "queued" and d.get("command_uuid")
    ]
    assert queued, _infos(h, "command_lifecycle")
    return str(queued[-1])


async def _bash_running(h: Harness, prompt: str, nursery: trio.Nursery) -> tuple[Any, list[Any]]:
    """A turn whose Bash (approved) runs; the approvals go on in ``nursery``."""
    turn = await h.session.prompt(prompt)
    nursery.start_soon(approve_permissions, h, turn.id, [])
    tools = await scenarios.command_running(h)
    return turn, list({p.pid: p for t in tools for p in [t, *family(t)]}.values())


def _handovers(h: Harness) -> list[str]:
    """The ``terminal_reason`` of each result that handed the turn over (``session.info``)."""
    return [str(d.get("terminal_reason")) for d in _infos(h, "result")]


async def test_steer_while_streaming_joins_the_running_turn(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude(keep_bodies=True) as h:
            mid = await steering.steer_mid_stream(h)
            steer_uuid = await _steer_uuid(h, mid.steered)
            steering.steer_row(
                h,
                KEY,
                "steer-mid",
                mid.steered,
                mid.request,
                notes=[
                    mid.dropped_note,
                    f"handovers={','.join(_handovers(h)) or '-'}",
                    f"lifecycle={','.join(_lifecycle(h, steer_uuid))}",
                ],
            )
            steering.assert_one_turn_took_it(h, mid, "completed")
            # The CLI dropped the stream, handed the old prompt over with a result of its own,
            # and asked the model about the steer in the same conversation.
            assert _handovers(h) == ["aborted_streaming"], _infos(h, "result")
            assert _lifecycle(h, steer_uuid)[0] == "queued", _infos(h, "command_lifecycle")
            await second_prompt_completes(h)
            assert len(steering.requests_carrying(h)) == 1, h.model.describe()


async def test_steer_with_no_turn_running_starts_one(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude() as h:
            await steering.steer_starts_a_turn(h, KEY, "completed", second_prompt_completes)


async def test_steer_while_bash_runs_waits_for_it(open_claude: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_claude(keep_bodies=True) as h:
            async with trio.open_nursery() as nursery:
                turn, tools = await _bash_running(h, "briefshell", nursery)
                assert any(BRIEF_SHELL_COMMAND in scenarios.command_of(p) for p in tools), tools
                steered = await steering.steer(h, STEER_QUICK)
                assert (steered.result.mode, steered.result.turn_id) == ("injected", turn.id)
                await steering.assert_steered_event(h, steered, STEER_QUICK)
                request = await steering.request_carrying(h, steered.sent_at)
                ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
                nursery.cancel_scope.cancel()
            steering.steer_row(
                h,
                KEY,
                "steer-tool",
                steered,
                request,
                notes=[f"handovers={','.join(_handovers(h)) or '-'}"],
            )
            assert isinstance(ended, ev.TurnEnded)
            assert (ended.outcome, ended.stop_reason, ended.receipt) == (
                "completed",
                "completed",
                None,
            )
            assert steering.turns_started(h) == [turn.id]
            assert not steering.ever_cancelling(h)
            # The steer joined the running cycle: the Bash ran to its end (exit 124), and the
            # request after it carries its result with the steer inside; one result named both.
            assert request.tool_result is not None, request
            output = request.tool_result["output"]
            assert output.startswith("Exit code 124") and MARK in output, request.tool_result
            assert _handovers(h) == [], _infos(h, "result")
            assert all(not scenarios.is_alive(p) for p in tools)
            await second_prompt_completes(h)


async def test_cancel_with_a_steer_queued_runs_nothing_after(
    open_claude: Any, tmp_path: Path
) -> None:
    """A steer waits for the running Bash (the CLI holds it queued); a cancel then interrupts
    with ``cancel_queued: true``: the CLI cancels the steer with the turn and kills the Bash."""
    with trio.fail_after(BOUND_S):
        async with open_claude(keep_bodies=True, tee=True) as h:
            async with trio.open_nursery() as nursery:
                turn, tools = await _bash_running(h, "shell", nursery)
                assert any(SHELL_COMMAND in scenarios.command_of(p) for p in tools), tools
                steered = await steering.steer(h, STEER_QUICK)
                assert (steered.result.mode, steered.result.turn_id) == ("injected", turn.id)
                steer_uuid = await _steer_uuid(h, steered)
                cancelled_at = time.monotonic()
                receipt, alive_at_receipt, gone_ms, still = await scenarios.cancel_while_tools_run(
                    h, tools
                )
                nursery.cancel_scope.cancel()
            # The next prompt: were the steer still queued, the CLI would run it first.
            second = await second_prompt_completes(h)
            await h.recorder.catch_up()
            lifecycle = _lifecycle(h, steer_uuid)
            wire = _wire(tmp_path)
            [interrupt] = [
                m["request"]
                for ours, m in wire
                if ours
                and m.get("type") == "control_request"
                and m["request"].get("subtype") == "interrupt"
            ]
            [answer] = [
                m["response"]
                for ours, m in wire
                if not ours
                and m.get("type") == "control_response"
                and m["response"].get("request_id") == _request_id(wire, "interrupt")
            ]
            steering.steer_row(
                h,
                KEY,
                "steer-stop",
                steered,
                None,
                notes=[
                    "steer_queued=1",
                    f"receipt={receipt.outcome}",
                    f"receipt_ms={receipt.elapsed_ms}",
                    f"escalation={','.join(receipt.escalation)}",
                    f"cancel_after_steer_ms={scenarios.ms_after(steered.answered_at, cancelled_at)}",
                    f"lifecycle={','.join(lifecycle)}",
                    f"interrupt_answer={json.dumps(answer.get('response'), separators=(',', ':'))}",
                ],
            )
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "aborted_tools", receipt
            assert receipt.escalation in (["interrupt"], ["interrupt", "tools_killed"]), receipt
            scenarios.assert_tools_gone(receipt, alive_at_receipt, still)
            [steer_line] = [
                m for ours, m in wire if ours and m.get("type") == "user" and m.get("uuid")
            ]
            assert (steer_line["uuid"], steer_line["priority"]) == (steer_uuid, "next"), steer_line
            assert interrupt.get("cancel_queued") is True, interrupt
            # This CLI says it honours cancel_queued (system/init capabilities), and does.
            capabilities = _infos(h, "init")[0].get("capabilities") or []
            assert "interrupt_cancel_queued_v1" in capabilities, capabilities
            # The CLI cancelled the steer with the turn: it never started, no result names it,
            # and the model never heard it.
            assert "started" not in lifecycle and lifecycle[-1] == "cancelled", lifecycle
            results = [m for ours, m in wire if not ours and m.get("type") == "result"]
            assert all(steer_uuid not in (m.get("user_message_uuids") or []) for m in results)
            assert len(results) == 2, results  # the cancelled turn's, the next prompt's
            assert steering.requests_carrying(h) == [], h.model.describe()
            assert steering.turns_started(h) == [turn.id, second.turn_id]
            assert _handovers(h) == [], _infos(h, "result")
            assert h.tool_processes(TOOL_LEAF) == []


async def test_cancel_after_a_steer_took_over_the_turn(open_claude: Any) -> None:
    """The steer took the turn over (the model streams for it); a cancel stops it like any
    turn, and nothing runs after."""
    with trio.fail_after(BOUND_S):
        async with open_claude(keep_bodies=True) as h:
            turn, stream = await steering.streaming(h)
            steered = await steering.steer(h, STEER_STREAM)
            assert (steered.result.mode, steered.result.turn_id) == ("injected", turn.id)
            steer_uuid = await _steer_uuid(h, steered)
            steer_stream = await h.model.wait_for(
                lambda e: steering.carries(e) and e.streaming_tokens and e.tokens_sent >= 3
            )
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            gone = await scenarios.stream_ended(h, steer_stream, timeout=30)
            second = await second_prompt_completes(h)
            await h.recorder.catch_up()
            steering.steer_row(
                h,
                KEY,
                "steer-stop",
                steered,
                steer_stream,
                notes=[
                    "steer_took_over=1",
                    f"receipt={receipt.outcome}",
                    f"receipt_ms={receipt.elapsed_ms}",
                    f"model_gone_ms={scenarios.ms_after(cancelled_at, gone.disconnected_at)}",
                    f"handovers={','.join(_handovers(h)) or '-'}",
                    f"lifecycle={','.join(_lifecycle(h, steer_uuid))}",
                ],
            )
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "aborted_streaming", receipt
            assert receipt.escalation == ["interrupt"], receipt
            scenarios.assert_stream_abandoned(h, gone, cancelled_at)
            # The first stream was dropped for the steer, the steer's for the cancel: no other.
            streams = h.model.find(lambda e: e.streaming_tokens)
            assert [e.id for e in streams] == [stream.id, steer_stream.id], h.model.describe()
            assert _handovers(h) == ["aborted_streaming"], _infos(h, "result")
            assert _lifecycle(h, steer_uuid)[-1] == "cancelled", _lifecycle(h, steer_uuid)
            assert steering.turns_started(h) == [turn.id, second.turn_id]


def _wire(root: Path) -> list[tuple[bool, dict[str, Any]]]:
    """Every line of the tee's log: ``(ours, message)``."""
    out = []
    for line in (root / "wire" / "wire.log").read_text().splitlines():
        _, mark, payload = line.split(" ", 2)
        try:
            message = json.loads(payload)
        except ValueError:
            continue
        if isinstance(message, dict):
            out.append((mark == ">", message))
    return out


def _request_id(wire: list[tuple[bool, dict[str, Any]]], subtype: str) -> str:
    [request_id] = [
        m["request_id"]
        for ours, m in wire
        if ours and m.get("type") == "control_request" and m["request"].get("subtype") == subtype
    ]
    return str(request_id)
