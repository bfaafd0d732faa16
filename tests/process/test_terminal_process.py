"""Terminal agents through the real supervisor: a fake TUI (``tests/fakes/fake_tui.py``) in a
pseudo-terminal, real clock, generous bounds. The machine alone: ``tests/machines/test_terminal.py``.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import psutil
import pytest
import trio

from helpers import process_session
from paths import TESTS
from protocols import events as ev
from protocols.terminal import TerminalSettings
from supervisor import AgentSpec

pytestmark = pytest.mark.real_process

FAKE_TUI = TESTS / "fakes" / "fake_tui.py"
IDLE_S = 0.3


def tui_spec(tmp_path: Path, mode: str = "normal", **options: object) -> AgentSpec:
    command = [sys.executable, str(FAKE_TUI), "--mode", mode, "--state", str(tmp_path / "got")]
    settings = {"idle_s": IDLE_S, "interrupt": ("\x1b",), "cols": 100, "rows": 30}
    spec_options: dict[str, object] = {"grace_s": 2.0, "kill_timeout_s": 0.5}
    for key, value in options.items():
        (settings if key in TerminalSettings.__attrs_attrs__.__dict__ else spec_options)[key] = (
            value
        )
    return AgentSpec(
        name="tui",
        protocol="terminal",
        command=command,
        resume_command=(*command, "--resume"),
        terminal=TerminalSettings(**settings),  # type: ignore[arg-type]
        **spec_options,  # type: ignore[arg-type]
    )


def screen_of(events: list[ev.Event]) -> bytes:
    return b"".join(base64.b64decode(e.data) for e in events if isinstance(e, ev.TerminalOutput))


async def test_a_turn_completes_with_its_answer(tmp_path: Path) -> None:
    async with process_session(tui_spec(tmp_path), str(tmp_path)) as (session, rec):
        handle = await session.prompt("hello\nworld")
        ended = await rec.wait_kind("turn.ended", turn_id=handle.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
        await rec.catch_up()
        text = "".join(
            e.text for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta)
        )
        assert "answer: hello" in text
        assert b"answer: hello" in screen_of(rec.events)
        assert (tmp_path / "got").read_text() == "hello\nworld\n"  # pasted whole: one prompt
