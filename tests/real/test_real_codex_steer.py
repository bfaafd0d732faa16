"""Tier 4: steering the real ``codex app-server`` 0.171.0 (``turn/steer``) under the supervisor.

Set up as in ``test_real_codex.py`` (whose harness this reuses: the native binary, a fresh
``CODEX_HOME`` per test, a loopback-only network namespace, the fake model of
``tests/realagents/fake_model.py``; a skip, or a failure under
``AGENT_SUPERVISOR_STRICT_SKIPS=1``, when the binary cannot be installed). ``session.steer``:

(a) while the model streams: ``injected`` into the running turn; Codex drops the model's stream
    at once and sends a request whose newest user message is the steer (the prompt still in
    its history); the same turn ends ``completed`` (one ``turn/started``, one ``turn.ended``),
    and the next prompt completes;
(b) with no turn running: ``started``, and that turn completes;
(c) while an approved command runs: ``injected``; Codex lets the command finish, then the next
    request carries its output and the steer, and the turn completes;
(d) a steer Codex holds while the command runs, then a cancel: the receipt comes after the
    command is gone, the held steer never reaches the model, and no turn runs by itself after
    the cancel.

Timings (``steer()`` to its ``SteerResult``, and to the model request carrying the text) go into
the tier-4 table as agent ``codex-app-server``, scenarios ``steer-*``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import test_real_codex as base
import trio
from test_real_codex import BOUND_S, approve_permissions, second_prompt_completes

from protocols import events as ev
from realagents import scenarios, steering
from realagents.conftest import GRACE_S, Harness
from realagents.fake_model import BRIEF_SHELL_COMMAND, SHELL_COMMAND
from realagents.scenarios import TOOL_LEAF, family, sample_until
from realagents.steering import MARK, STEER_QUICK

pytestmark = pytest.mark.real_process

# test_real_codex.py's fixtures, shared: pytest finds them as attributes of this module.
codex_install = base.codex_install
open_codex = base.open_codex

KEY = base.KEY


def _codex_turns(h: Harness) -> list[str]:
    """The ids of the turns Codex started (``turn/started``), in order."""
    return [
        e.data["turn"]["id"]
        for e in h.recorder.of_kind("session.info")
        if isinstance(e, ev.SessionInfo) and e.info_kind == "turn/started"
    ]


async def _command_running(
    h: Harness, prompt: str, nursery: trio.Nursery, command: str
) -> tuple[Any, list[Any]]:
    """A turn whose (approved) ``command`` runs; the approvals go on in ``nursery``. Sampled
    until a process of the tree runs that very command (the shell that starts it may be seen
    first, before its command line says what it runs)."""
    turn = await h.session.prompt(prompt)
    nursery.start_soon(approve_permissions, h, turn.id, [])

    def running() -> list[Any]:
        tools = h.tool_processes(TOOL_LEAF)
        return tools if any(command in scenarios.command_of(p) for p in tools) else []

    tools = await sample_until(running)
    return turn, list({p.pid: p for t in tools for p in [t, *family(t)]}.values())


async def test_steer_while_streaming_joins_the_running_turn(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex(keep_bodies=True) as h:
            mid = await steering.steer_mid_stream(h)
            steering.steer_row(
                h, KEY, "steer-mid", mid.steered, mid.request, notes=[mid.dropped_note]
            )
            # One turn, in Codex too: no cancel, no second turn; Codex dropped the stream for
            # the steer, and the steer's request holds the prompt.
            steering.assert_one_turn_took_it(h, mid, "completed")
            assert len(_codex_turns(h)) == 1, _codex_turns(h)
            await second_prompt_completes(h)
            assert len(steering.requests_carrying(h)) == 1, h.model.describe()


async def test_steer_with_no_turn_running_starts_one(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex() as h:
            await steering.steer_starts_a_turn(h, KEY, "completed", second_prompt_completes)


async def test_steer_while_a_command_runs_waits_for_it(open_codex: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_codex(keep_bodies=True) as h:
            async with trio.open_nursery() as nursery:
                turn, tools = await _command_running(h, "briefshell", nursery, BRIEF_SHELL_COMMAND)
                assert any(BRIEF_SHELL_COMMAND in scenarios.command_of(p) for p in tools), tools
                steered = await steering.steer(h, STEER_QUICK)
                assert (steered.result.mode, steered.result.turn_id) == ("injected", turn.id)
                await steering.assert_steered_event(h, steered, STEER_QUICK)
                request = await steering.request_carrying(h, steered.sent_at)
                ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
                nursery.cancel_scope.cancel()
            tool_ended = [e for e in h.model.snapshot() if e.tool_call is not None]
            steering.steer_row(h, KEY, "steer-tool", steered, request)
            assert isinstance(ended, ev.TurnEnded)
            assert (ended.outcome, ended.stop_reason, ended.receipt) == (
                "completed",
                "completed",
                None,
            )
            assert steering.turns_started(h) == [turn.id] and len(_codex_turns(h)) == 1
            assert not steering.ever_cancelling(h)
            # The command ran to its end (exit 124) and was not interrupted: the request that
            # carries the steer carries the command's output before it.
            body = request.body["input"]
            kinds = [item.get("type") for item in body]
            assert "function_call_output" in kinds, kinds
            last_output = max(i for i, k in enumerate(kinds) if k == "function_call_output")
            assert MARK in str(body[last_output + 1 :]), body[last_output:]
            assert all(not scenarios.is_alive(p) for p in tools)
            assert tool_ended and tool_ended[0].tool_call["args"]["cmd"] == BRIEF_SHELL_COMMAND
            await second_prompt_completes(h)


async def test_cancel_after_a_steer_leaves_nothing_running(open_codex: Any) -> None:
    """The steer is held by Codex while the command runs (it waits for the command's end);
    a cancel then ends the turn and the command, and the held steer never runs."""
    with trio.fail_after(BOUND_S):
        async with open_codex(keep_bodies=True) as h:
            async with trio.open_nursery() as nursery:
                turn, tools = await _command_running(h, "shell", nursery, SHELL_COMMAND)
                assert any(SHELL_COMMAND in scenarios.command_of(p) for p in tools), tools
                steered = await steering.steer(h, STEER_QUICK)
                assert (steered.result.mode, steered.result.turn_id) == ("injected", turn.id)
                cancelled_at = time.monotonic()
                receipt, alive_at_receipt, gone_ms, still = await scenarios.cancel_while_tools_run(
                    h, tools
                )
                nursery.cancel_scope.cancel()
            steering.steer_row(
                h,
                KEY,
                "steer-stop",
                steered,
                None,
                notes=[
                    f"receipt={receipt.outcome}",
                    f"receipt_ms={receipt.elapsed_ms}",
                    f"escalation={','.join(receipt.escalation)}",
                    f"cancel_after_steer_ms={scenarios.ms_after(steered.answered_at, cancelled_at)}",
                ],
            )
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.stop_reason == "interrupted", receipt
            assert receipt.elapsed_ms < GRACE_S * 1000 + 2000  # + the sweep's settle/term
            scenarios.assert_tools_gone(receipt, alive_at_receipt, still)
            # The next prompt is the next turn, in the supervisor and in Codex alike.
            second = await second_prompt_completes(h)
            assert steering.turns_started(h) == [turn.id, second.turn_id]
            assert len(_codex_turns(h)) == 2, _codex_turns(h)
            # The held steer never reached the model: no request asked about it.
            assert steering.requests_carrying(h) == [], h.model.describe()
            [last] = h.model.find(lambda e: e.has_tools)[-1:]
            scenarios.note_result(f"steer_in_next_history={MARK in steering.body_text(last)}")
            assert h.tool_processes(TOOL_LEAF) == []
