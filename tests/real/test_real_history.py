"""Tier 4: what each real agent remembers of a cancelled turn (``design/protocols.md``).

For every real CLI of the tier, one session against the fake model (``keep_bodies``: every
request's body is kept), two cancels, each followed by a ``quick`` prompt that completes:

1. **cancelled while streaming**: a prompt naming :data:`STREAM_MARKER` whose answer streams
   (the user has seen ``token1 token2 ...``), cancelled mid-stream;
2. **cancelled at once**: a prompt naming :data:`EARLY_MARKER`, cancelled as soon as the session
   accepted it, which is usually before the agent called the model (whether it did is measured:
   ``model_reached``, from the fake model's log).

The measurement is read from the fake model's request bodies, the only place that shows what the
agent sends its model: the ``quick`` turn's request after each cancel either holds the cancelled
prompt's marker (the agent kept the prompt in its history) or not, and the streamed tokens (it
kept the partial answer) or not. The results go into the tier-4 table and
``.cache/tier4-results.json`` (scenario ``history``, field ``history``). The first case is
deterministic and asserted against :data:`REMEMBERS` (the table in ``design/protocols.md``): an
agent that changes its mind fails here and the table must change with it. The second is a race
between the cancel and the agent's first model request, so it is reported, not asserted.

Not measured: Auggie (it cannot start a session without ``auggie login``) and Amp (its CLI calls
no model: the conversation lives on Amp's server, here the tests' own fake of it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import trio

from realagents import scenarios
from realagents.agents import (
    AGENTS,
    CLAUDE_STREAM_JSON,
    CODEX_APP_SERVER,
    claude_stream_json_spec,
)
from realagents.conftest import Harness, agent_opener, real_agent_session, record
from realagents.fake_model import Exchange

pytestmark = pytest.mark.real_process

BOUND_S = 120.0
STREAM_MARKER = "marker-h1st0"
EARLY_MARKER = "marker-e4rly"
#: What the fake model streams (``token1 token2 ...``): in a later request, the partial answer.
PARTIAL = "token1 "
#: What some agents add to the history to tell their model the turn was stopped.
INTERRUPTION_NOTES = {
    "[Request interrupted by user]": "claude",  # Claude Code, as a user text
    "<turn_aborted>": "codex",  # Codex, a user message "The user interrupted the previous turn"
}

#: The agents: the ACP ones of ``test_real_acp_agents.py``, and the three other protocols' CLIs.
KEYS = [*AGENTS, "codex-app-server", "claude-stream-json", "opencode-serve"]

#: After a turn cancelled while streaming: (the prompt kept, the partial answer kept, the
#: interruption note added) in the history the agent sends its model next. Measured (the same in
#: every run); ``design/protocols.md`` has the table.
REMEMBERS: dict[str, tuple[bool, bool, str | None]] = {
    "gemini": (False, False, None),
    "codex-acp": (True, False, "codex"),
    "claude-agent-acp": (True, True, "claude"),
    "opencode": (True, True, None),
    "qwen": (True, True, None),
    "codex-app-server": (True, False, "codex"),
    "claude-stream-json": (True, True, "claude"),
    "opencode-serve": (True, True, None),
}


def _opener(key: str, root: Path) -> Callable[..., AbstractAsyncContextManager[Harness]]:
    if key in AGENTS:
        return agent_opener(key, root)
    if key == "codex-app-server":
        from test_real_codex import codex_session

        installed = scenarios.ensure_installed(CODEX_APP_SERVER.package, key)
        return lambda **options: codex_session(root, installed, **options)
    if key == "claude-stream-json":
        installed = scenarios.ensure_installed(CLAUDE_STREAM_JSON.package, key)
        return lambda **options: real_agent_session(
            CLAUDE_STREAM_JSON,
            root,
            installed,
            spec_of=claude_stream_json_spec,
            catch_up=True,
            checks=scenarios.understood_everything,
            **options,
        )
    assert key == "opencode-serve"
    from test_real_opencode_serve import AGENT, serve_session

    installed = scenarios.ensure_installed(AGENT.package, "opencode-ai")
    return lambda **options: serve_session(root, installed, **options)


@pytest.fixture
def open_agent(key: str, tmp_path: Path) -> Any:
    return _opener(key, tmp_path)


async def _next_request(h: Harness) -> tuple[Exchange, str]:
    """Send ``quick`` and wait for its turn to complete: its first request with tools (the
    turn's own, not a title or a router call), and that request's body as text."""
    before = max((e.id for e in h.model.snapshot()), default=0)
    await scenarios.second_prompt_completes(h)
    [request, *_] = h.model.find(lambda e: e.id > before and e.scenario == "quick" and e.has_tools)
    return request, json.dumps(request.body)


def _mentions(exchanges: list[Exchange], marker: str) -> list[Exchange]:
    return [e for e in exchanges if marker in json.dumps(e.body)]


def _note(body: str) -> str | None:
    """Which agent's interruption note ``body`` holds, if any (:data:`INTERRUPTION_NOTES`)."""
    return next(
        (who for note, who in INTERRUPTION_NOTES.items() if json.dumps(note)[1:-1] in body), None
    )


@pytest.mark.parametrize("key", KEYS)
async def test_history_after_cancel(key: str, open_agent: Any, tmp_path: Path) -> None:
    with trio.fail_after(BOUND_S):
        async with open_agent(keep_bodies=True) as h:
            # 1. Cancelled while the answer streams.
            turn = await h.session.prompt(f"stream, and remember {STREAM_MARKER}")
            stream = await h.model.wait_for(lambda e: e.streaming_tokens and e.tokens_sent >= 3)
            await h.recorder.wait_kind("message.delta", turn_id=turn.id)
            streamed = await h.session.cancel()
            assert (streamed.outcome, streamed.turn_id) == ("cancelled", turn.id), streamed
            after_stream, body = await _next_request(h)
            stream_case = {
                "prompt_kept": STREAM_MARKER in body,
                "partial_kept": PARTIAL in body,
                "note": _note(body),
                "tokens_streamed": stream.tokens_sent,
                "cancel_ms": streamed.elapsed_ms,
            }

            # 2. Cancelled as soon as the session took the prompt.
            before = max(e.id for e in h.model.snapshot())
            turn = await h.session.prompt(f"stream, and remember {EARLY_MARKER}")
            early = await h.session.cancel()
            assert (early.outcome, early.turn_id) == ("cancelled", turn.id), early
            after_early, body = await _next_request(h)
            # What the model heard of that prompt before the quick one: the turn's own request
            # (with tools), or only a side request (Gemini's router, a title).
            heard = [
                e
                for e in _mentions(
                    h.model.find(lambda e: before < e.id < after_early.id), EARLY_MARKER
                )
                if EARLY_MARKER in e.user_text
            ]
            early_case = {
                "model_reached": any(e.has_tools for e in heard),
                "side_request_only": bool(heard) and not any(e.has_tools for e in heard),
                "prompt_kept": EARLY_MARKER in body,
                "partial_kept": any(e.tokens_sent for e in heard),
                "note": _note(body.split(EARLY_MARKER, 1)[-1]) if EARLY_MARKER in body else None,
                "cancel_ms": early.elapsed_ms,
            }
            record(
                agent=key,
                scenario="history",
                outcome=streamed.outcome,
                elapsed_ms=streamed.elapsed_ms,
                ready_s=round(h.ready_s, 1),
                namespace=h.namespace,
                history={"streaming": stream_case, "early": early_case},
                notes=f"streaming: prompt_kept={stream_case['prompt_kept']}"
                f" partial_kept={stream_case['partial_kept']} note={stream_case['note']};"
                f" at_once: model_reached={early_case['model_reached']}"
                f"{' (side request only)' if early_case['side_request_only'] else ''}"
                f" prompt_kept={early_case['prompt_kept']} cancel_ms={early.elapsed_ms}",
            )
    measured = (stream_case["prompt_kept"], stream_case["partial_kept"], stream_case["note"])
    assert measured == REMEMBERS[key], (
        f"{key} now remembers {measured} of a turn cancelled while streaming, not"
        f" {REMEMBERS[key]}: update REMEMBERS and the table in design/protocols.md"
    )
