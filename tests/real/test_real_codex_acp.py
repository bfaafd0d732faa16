"""Tier 4: codex-acp 2.x (``@agentclientprotocol/codex-acp``), what only it has among the ACP agents.

The maintained codex-acp is a TypeScript bridge that starts ``codex app-server`` itself: its own
``@openai/codex`` dependency (pinned to 0.166.0 in ``install.py``), the native binary through
``CODEX_PATH`` (``realagents/agents.py``), so the tree under the supervisor is node -> codex ->
the commands. What every ACP agent does runs for it in ``test_real_acp_agents.py`` (stream,
shell: the command ends before the receipt and node and codex live on; permission; kill +
respawn, reopened with ``session/resume``; ``session/close`` on stop). This module adds what only
codex-acp 2.x offers there:

- **steering**: its ``initialize`` says ``_meta.steering.supported``, so ``session.steer`` while
  the model streams goes as ``_session/steering`` and comes back ``injected``. Codex
  (``turn/steer`` underneath) drops the model's stream and asks the model again with the text, in
  the same turn, which then ends with the one ``session/prompt`` answer (``end_turn``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from protocols import events as ev
from realagents import install, scenarios
from realagents.agents import AGENTS, CODEX_ACP_CODEX
from realagents.conftest import agent_opener, record
from realagents.scenarios import ms_after

pytestmark = pytest.mark.real_process

KEY = "codex-acp"
#: Whole-test bound: start (~1 s), one streaming turn that a steer redirects.
BOUND_S = 60.0
STEER_MARKER = "marker-s7eer"


@pytest.fixture
def open_agent(tmp_path: Path) -> Any:
    return agent_opener(KEY, tmp_path)


def test_the_maintained_line() -> None:
    """Tier 4 runs the maintained bridge (not the frozen ``@zed-industries/codex-acp`` 0.16),
    with its own Codex pinned, and starts that Codex's native binary."""
    package = install.PACKAGES[AGENTS[KEY].package]
    assert (package.npm, package.version) == ("@agentclientprotocol/codex-acp", "2.6.0")
    assert dict(package.overrides) == {"@openai/codex": "0.166.0"}
    assert package.entry.endswith("/dist/index.js")
    assert CODEX_ACP_CODEX.endswith("/vendor/x86_64-unknown-linux-musl/bin/codex")


async def test_steer_while_streaming_is_injected(open_agent: Any, tmp_path: Path) -> None:
    with trio.fail_after(BOUND_S):
        async with open_agent(tee=True, keep_bodies=True) as h:
            turn, stream = await scenarios.streaming(h)
            asked = time.monotonic()
            result = await h.session.steer(f"quick, and remember {STEER_MARKER}")
            answered = time.monotonic()
            assert (result.mode, result.turn_id) == ("injected", turn.id), result
            steered = await h.model.wait_for(lambda e: STEER_MARKER in json.dumps(e.body))
            ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
            assert isinstance(ended, ev.TurnEnded)
            gone = await scenarios.stream_ended(h, stream)
            told = await h.recorder.wait_kind("turn.steered", turn_id=turn.id)
            assert isinstance(told, ev.TurnSteered) and told.mode == "injected", told
            # The same turn went on with the text: it ended by itself, completed.
            assert (ended.outcome, ended.stop_reason) == ("completed", "end_turn"), ended
            started = h.recorder.of_kind("turn.started")
            assert [e.turn_id for e in started if isinstance(e, ev.TurnStarted)] == [turn.id]
            # Codex left the stream it was reading for the steered request.
            assert gone.disconnected_at is not None, h.model.describe()
            assert steered.scenario == "quick" and steered.id > stream.id, h.model.describe()
            partial_kept = "token1 " in json.dumps(steered.body)
            record(
                agent=KEY,
                install=scenarios.installed_as(AGENTS[KEY].package),
                scenario="steer",
                outcome=result.mode,
                elapsed_ms=round((answered - asked) * 1000, 1),
                ready_s=round(h.ready_s, 1),
                namespace=h.namespace,
                model_gone_ms=ms_after(asked, gone.disconnected_at),
                notes=f"steered_request_after_ms={ms_after(asked, steered.started_at)}"
                f" partial_answer_in_steered_request={partial_kept}"
                f" turn_end={ended.stop_reason}",
            )
    # On the wire: one _session/steering, answered injected; one answer to the turn's prompt.
    wire = scenarios.read_wire(tmp_path / "wire" / "wire.log")
    [run] = scenarios.acp_processes(wire)
    [init] = scenarios.acp_answer(run, "initialize")
    assert init["result"]["_meta"]["steering"] == {"supported": True}, init
    assert [m["result"] for m in scenarios.acp_answer(run, "_session/steering")] == [
        {"outcome": "injected"}
    ]
    assert [m["result"]["stopReason"] for m in scenarios.acp_answer(run, "session/prompt")] == [
        "end_turn"
    ]
