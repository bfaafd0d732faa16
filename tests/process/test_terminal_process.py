"""Terminal agents through the real supervisor: a fake TUI (``tests/fakes/fake_tui.py``) in a
pseudo-terminal, real clock, generous bounds. The machine alone: ``tests/machines/test_terminal.py``.
"""

from __future__ import annotations

import base64
import os
import select
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import trio

from helpers import KILLED_HARD, process_session
from paths import REPO, TESTS
from protocols import events as ev
from protocols.terminal import TerminalSettings
from supervisor import AgentSpec
from supervisor.errors import AgentNotRunning, BadRequest
from supervisor.testing import Recorder

pytestmark = pytest.mark.real_process

FAKE_TUI = TESTS / "fakes" / "fake_tui.py"
#: What runs a terminal agent's command (``supervisor/agents/process.py``).
CTTY = [sys.executable, "-S", "-E", "-P", str(REPO / "supervisor" / "agents" / "ctty.py")]
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


def texts(rec: Recorder) -> str:
    return "".join(e.text for e in rec.of_kind("message.delta") if isinstance(e, ev.MessageDelta))


async def until_screen_shows(rec: Recorder, needle: bytes) -> None:
    await rec.wait_for(
        lambda e: isinstance(e, ev.TerminalOutput) and needle in screen_of(rec.events)
    )


async def test_escape_stops_the_turn_and_the_next_one_runs(tmp_path: Path) -> None:
    async with process_session(tui_spec(tmp_path), str(tmp_path)) as (session, rec):
        turn = await session.prompt("slow one")
        await rec.wait_kind("message.delta", turn_id=turn.id)
        receipt = await session.cancel()
        await rec.catch_up()
        assert receipt.outcome == "cancelled", receipt
        assert "killed" not in receipt.escalation
        assert b"interrupted" in screen_of(rec.events)
        second = await session.prompt("quick")
        ended = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended


async def test_a_tui_that_ignores_escape_is_killed_past_the_grace_and_resumed(
    tmp_path: Path,
) -> None:
    spec = tui_spec(tmp_path, "ignore-esc", grace_s=1.0)
    # Only the agent's tree: what this test process ran before (a database of another test in
    # the same worker) is not the agent's.
    before = set(psutil.Process().children(recursive=True))
    async with process_session(spec, str(tmp_path)) as (session, rec):
        turn = await session.prompt("slow one")
        await rec.wait_kind("message.delta", turn_id=turn.id)
        tree = [p for p in psutil.Process().children(recursive=True) if p not in before]
        started = trio.current_time()
        receipt = await session.cancel()
        took = trio.current_time() - started
        assert receipt.outcome == "killed", receipt
        assert receipt.escalation == KILLED_HARD
        # the grace, the kill ladder (SIGTERM is ignored: kill_timeout_s), the restart
        assert spec.grace_s <= took < spec.grace_s + spec.kill_timeout_s + 10.0
        _, alive = psutil.wait_procs(tree, timeout=5)
        assert alive == []
        await until_screen_shows(rec, b"resumed")  # the resume_command runs
        second = await session.prompt("quick")
        ended = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
        assert (tmp_path / "got").read_text() == "slow one\nquick\n"


async def test_an_agent_that_exits_is_restarted_resumed(tmp_path: Path) -> None:
    async with process_session(tui_spec(tmp_path, "exit-after"), str(tmp_path)) as (
        session,
        rec,
    ):
        first = await session.prompt("one")
        exited = await rec.wait_kind("agent.exited")
        assert isinstance(exited, ev.AgentExited) and exited.expected is False
        await until_screen_shows(rec, b"resumed")
        second = await session.prompt("two")
        ended = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
        assert first.id != second.id


async def test_input_and_resize_reach_the_agent(tmp_path: Path) -> None:
    async with process_session(tui_spec(tmp_path), str(tmp_path)) as (session, rec):
        await session.wait_ready()
        await session.resize(80, 24)
        await until_screen_shows(rec, b"resized 80x24")  # SIGWINCH: its controlling terminal
        await session.input("typed by hand\r")
        # The fake keeps the line before it answers on its screen (outside a turn: no event).
        await until_screen_shows(rec, b"answer: typed by hand")
        assert "typed by hand" in (tmp_path / "got").read_text(errors="replace")
        with pytest.raises(BadRequest):
            await session.resize(0, 24)


async def test_input_is_refused_for_other_protocols(tmp_path: Path) -> None:
    spec = AgentSpec.from_config("demo")
    async with process_session(spec, str(tmp_path)) as (session, _):
        await session.wait_ready()
        with pytest.raises(BadRequest, match="no terminal"):
            await session.input("x")


async def test_a_flood_is_paced_and_the_turn_still_ends(tmp_path: Path) -> None:
    async with process_session(tui_spec(tmp_path, "flood"), str(tmp_path), bound=120) as (
        session,
        rec,
    ):
        turn = await session.prompt("flood please")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
        assert "x" * 90 + " 19999\n" in texts(rec)


async def test_garbage_on_the_screen_does_not_stop_the_session(tmp_path: Path) -> None:
    async with process_session(tui_spec(tmp_path, "garbage"), str(tmp_path)) as (session, rec):
        turn = await session.prompt("through junk")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed", ended
        assert "answer: through junk" in texts(rec)


async def test_a_tui_that_never_shows_its_prompt_fails_with_the_reason(tmp_path: Path) -> None:
    spec = tui_spec(tmp_path, "no-prompt", start_timeout_s=2.0)
    with pytest.raises(AgentNotRunning, match="in 2.0 s"):
        async with process_session(spec, str(tmp_path)):
            pass


async def test_a_tui_that_exits_at_once_fails_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(AgentNotRunning, match="exited unexpectedly \\(exit 3\\)"):
        async with process_session(tui_spec(tmp_path, "exit"), str(tmp_path)):
            pass


async def test_twenty_prompt_and_stop_cycles_leave_no_process(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    async with process_session(tui_spec(tmp_path), str(tmp_path), bound=120) as (session, rec):
        for _ in range(20):
            turn = await session.prompt("slow cycle")
            await rec.wait_kind("message.delta", turn_id=turn.id)
            receipt = await session.cancel()
            assert receipt.outcome == "cancelled", receipt
        await session.stop()
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(leftover, timeout=5)
    assert alive == []


def test_the_terminal_keys_signals_reach_an_agent_the_supervisor_ignores_them_in() -> None:
    """A supervisor that a script ran in the background (``&``: SIGINT and SIGQUIT ignored,
    which exec hands on) still starts a terminal agent that Ctrl-C interrupts."""
    probe = (
        "import signal as s;"
        " print(s.getsignal(s.SIGINT) is s.default_int_handler, s.getsignal(s.SIGQUIT) == s.SIG_DFL)"
    )
    ignoring = ["sh", "-c", 'trap "" INT QUIT; exec "$@"', "sh"]
    master, slave = os.openpty()
    try:
        subprocess.run(
            [*ignoring, *CTTY, sys.executable, "-c", probe],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            timeout=30,
            check=True,
        )
        os.close(slave)
        slave = -1
        shown = b""
        while select.select([master], [], [], 5)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    assert shown.split() == [b"True", b"True"], shown
