"""Amp's machine (``protocols/amp.py``): golden transcripts and properties, no I/O.

The golden files (``tests/golden/amp/*.json``, format in ``tests/golden.py``) hold lines the
real CLI (``@sourcegraph/amp@0.0.1790142911-g7618fb``) printed against the tests' fake Amp
server, trimmed. The session actor with the in-memory Amp is ``tests/actor/test_amp_session.py``,
a scripted fake CLI through the real supervisor ``tests/process/test_amp_process.py``, the real
CLI ``tests/real/test_real_amp.py``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import golden
from paths import REPO, TESTS
from protocols.amp import AMP_COMMAND, AmpClient
from protocols.machine import AgentExiting, SessionEstablished, TurnFinished

FAKE_AMP = TESTS / "fakes" / "fake_amp.py"
BASE = list(AMP_COMMAND)
GOLDEN_DIR = TESTS / "golden" / "amp"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
CHECKS = {"pending_permissions", "agent_session_id"}


# -- tier 1 ----------------------------------------------------------------------------------


def check_wire(message: dict[str, Any], where: str) -> None:
    """All we ever write is a user line: content blocks, and ``steer`` when steering."""
    assert set(message) <= {"type", "message", "steer"}, where
    assert message["type"] == "user", where
    assert set(message["message"]) == {"role", "content"}, where
    assert message["message"]["role"] == "user", where
    assert isinstance(message["message"]["content"], list), where  # Amp wants a list
    assert message.get("steer", True) is True, where


def test_golden_files_exist() -> None:
    assert len(GOLDEN_FILES) >= 10


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_transcript(path: Path) -> None:
    golden.replay(path, AmpClient(), checks=CHECKS, check_sent=check_wire)


CONTINUE = ["threads", "continue", "T-1"]


def test_command_continues_the_thread_on_resume() -> None:
    assert AmpClient.command(BASE, None) == BASE
    assert AmpClient.command(BASE, "T-1") == ["amp", "threads", "continue", "T-1", *BASE[1:]]
    wrapped = ["node", "amp.js", "--execute"]
    assert AmpClient.command(wrapped, "T-1") == ["node", "amp.js", *CONTINUE, "--execute"]
    # A wrapper's own options stay in front (the tier-4 tests run it under nsenter).
    entered = ["nsenter", "--net=/proc/7/ns/net", "--", "amp", "--stream-json", "-x"]
    assert AmpClient.command(entered, "T-1") == [*entered[:5], *CONTINUE, "-x"]
    assert AmpClient.command(["amp", "--verbose"], "T-1") == ["amp", *CONTINUE, "--verbose"]
    assert AmpClient.command(["amp"], "T-1") == ["amp", *CONTINUE]


@pytest.mark.parametrize("announced", ["--help", "", "T-\0", "T-\ud800"])
def test_a_thread_id_no_command_line_can_carry_is_not_continued_and_says_so(
    announced: str,
) -> None:
    assert AmpClient.command(BASE, announced) == BASE
    [established] = AmpClient().start(cwd="/w", resume=announced).events
    assert isinstance(established, SessionEstablished)
    assert established.resumed is False and "fresh session" in (established.detail or "")


def test_example_config_runs_the_adapters_command_line() -> None:
    """``agents.toml.example``'s Amp entry is the command line the machine is written for."""
    import tomllib

    example = REPO / "agents.toml.example"
    entry = tomllib.loads(example.read_text())["agents"]["amp"]
    assert (entry["protocol"], tuple(entry["command"])) == ("amp", AMP_COMMAND)


json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
blocks = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "x"])},
        optional={
            "text": json_scalars,
            "thinking": json_scalars,
            "id": json_scalars,
            "name": st.sampled_from(["shell_command", "Read"]) | json_scalars,
            "tool_use_id": json_scalars,
            "is_error": json_scalars,
        },
    ),
    max_size=3,
)
lines = st.fixed_dictionaries(
    {"type": st.sampled_from(["system", "user", "assistant", "result", "x"]) | json_scalars},
    optional={
        "subtype": st.sampled_from(["init", "success", "error_during_execution"]) | json_scalars,
        "session_id": st.sampled_from(["T-1", "T-2"]) | json_scalars,
        "message": st.fixed_dictionaries(
            {},
            optional={
                "content": blocks | json_scalars,
                "stop_reason": st.sampled_from(["end_turn", "tool_use"]) | json_scalars,
            },
        )
        | json_scalars,
        "is_error": json_scalars,
        "error": st.sampled_from(["User cancelled (SIGINT/SIGTERM)", "boom"]) | json_scalars,
    },
)
calls = st.sampled_from(["prompt", "cancel", "steer"])


@settings(max_examples=300, deadline=None)
@given(script=st.lists(st.one_of(lines, calls), max_size=12), resume=st.sampled_from([None, "T-1"]))
def test_any_output_never_crashes_and_ends_each_turn_at_most_once(
    script: list[Any], resume: str | None
) -> None:
    """Whatever the CLI writes, in whatever order with our calls: no exception, each turn ends
    at most once, the exit is announced at most once, and nothing but user lines goes out."""
    amp = AmpClient()
    amp.start(cwd="/", resume=resume)
    turns = 0
    running_turn: str | None = None
    ended: list[str] = []
    exits = 0
    for item in script:
        if item == "prompt":
            if running_turn is not None or exits:
                continue
            turns += 1
            running_turn = f"t{turns}"
            step = amp.prompt(running_turn, "hi")
        elif item == "cancel":
            step = amp.cancel()
        elif item == "steer":
            try:
                step = amp.steer(running_turn or "t0", turns, "left")
            except RuntimeError:
                continue
        else:
            step = amp.receive(json.loads(json.dumps(item)))
        for message in step.send:
            check_wire(message, str(item))
        for out in step.events:
            if isinstance(out, TurnFinished):
                assert out.turn_id == running_turn
                ended.append(out.turn_id)
                running_turn = None
            elif isinstance(out, AgentExiting):
                exits += 1
        assert all(s == signal.SIGINT for s in step.signals)
    assert len(ended) == len(set(ended)) and exits <= 1
