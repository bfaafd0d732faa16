"""``agent-supervisor chat``: the core without I/O, then the real command in a pseudo-terminal.

The pty tests run the CLI as a subprocess on the real clock. They never sleep to wait for a
state: they read the terminal until a pattern shows up, each read bounded by a deadline.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import pty
import re
import signal
import struct
import sys
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from paths import REPO
from protocols import events as ev
from served import serve
from supervisor.client import connect
from supervisor.clients.chat import (
    CHAR,
    ENTER,
    ESC,
    CancelDone,
    ChatCore,
    InputEnded,
    Interrupt,
    Key,
    KeyDecoder,
    Line,
    PromptAccepted,
    Quit,
    RewindDone,
    RewindFailed,
    Screen,
    SendCancel,
    SendPermission,
    SendPrompt,
    SendRewind,
    SendSteer,
    SteerDone,
)
from supervisor.clients.chat_raw import RESTORE_MODES, RawCore, RawKeys, SendInput
from supervisor.receipt import CancelReceipt
from supervisor.steering import SteerResult

ROOT = REPO
#: Bound on any one expected output; generous for a loaded CI machine.
EXPECT_S = 15.0
#: Bound on a process's exit once asked to quit.
EXIT_S = 10.0
#: What the chat shows once a stop cancelled the turn: the receipt, then the prompt again.
CANCELLED = r"■ Cancelled in \d+ ms\n› "

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# Make the pty the child's controlling terminal, so a Ctrl-C typed into it is a real SIGINT
# for the chat's process group (start_new_session made the child a session leader).
_WITH_CTTY = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


# -- the core, without I/O ------------------------------------------------------------------


def test_key_decoder_swallows_sequences_and_holds_a_lone_esc() -> None:
    decoder = KeyDecoder()
    assert decoder.feed(b"a\x1b[A\x1bOPb") == [Key(CHAR, "a"), Key(CHAR, "b")]
    assert decoder.feed("é".encode()[:1]) == []
    assert decoder.feed("é".encode()[1:] + b"\r") == [Key(CHAR, "é"), Key(ENTER)]
    assert decoder.feed(b"\x1b") == []
    assert decoder.escape_pending
    assert decoder.flush() == [Key(ESC)]
    assert decoder.feed(b"\x1b\x1b") == [Key(ESC)]
    assert decoder.feed(b"[B") == []  # the held ESC joined an arrow key after all


def _type(core: ChatCore, text: str) -> list[object]:
    commands: list[object] = []
    for char in text:
        commands += core.feed(Key(ENTER) if char == "\n" else Key(CHAR, char))
    return commands


def test_stop_before_the_prompt_is_accepted_waits_for_the_turn_id() -> None:
    core = ChatCore(interactive=True, color=False)
    core.start("fake")
    assert _type(core, "hi\n") == [SendPrompt("hi")]
    assert core.feed(Key(ESC)) == []  # no turn id yet: a cancel must name its turn
    assert core.feed(PromptAccepted("t1")) == [SendCancel("t1")]
    assert core.feed(Key(ESC)) == []  # one stop per turn
    core.feed(ev.TurnEnded(turn_id="t1", outcome="cancelled", stop_reason="cancelled"))
    assert not core.take_output().endswith("› ")  # terminate-then-respond: wait for it
    receipt = CancelReceipt(session_id="s1", turn_id="t1", outcome="cancelled", elapsed_ms=4.2)
    core.feed(CancelDone(receipt))
    assert core.take_output().endswith("■ Cancelled in 4 ms\n› ")


def test_permission_keys_pick_the_first_allow_or_reject_option() -> None:
    core = ChatCore(interactive=True, color=False)
    _type(core, "go\n")
    core.feed(PromptAccepted("t1"))
    options = [
        ev.PermissionOption("reject-once", "Reject", "reject_once"),
        ev.PermissionOption("allow-always", "Always", "allow_always"),
        ev.PermissionOption("allow-once", "Once", "allow_once"),
    ]
    for request_id in ("r1", "r2"):
        core.feed(ev.PermissionRequested(turn_id="t1", request_id=request_id, options=options))
    assert "allow? [y/n] " in core.take_output()
    assert core.feed(Key(CHAR, "y")) == [SendPermission("r1", "allow-always")]
    assert core.feed(Key(CHAR, "n")) == [SendPermission("r2", "reject-once")]
    assert core.feed(Key(CHAR, "y")) == []  # nothing is pending any more


def test_lines_wait_for_the_turn_but_stop_and_end_of_input_do_not() -> None:
    core = ChatCore(interactive=False, color=False)
    assert core.feed(Line("one")) == [SendPrompt("one")]
    assert core.feed(Line("two")) == []
    core.feed(InputEnded())
    assert core.feed(PromptAccepted("t1")) == []
    assert core.feed(ev.TurnEnded(turn_id="t1", outcome="completed")) == [SendPrompt("two")]
    assert core.feed(Line("/stop")) == []
    assert core.feed(PromptAccepted("t2")) == [SendCancel("t2")]
    core.feed(ev.TurnEnded(turn_id="t2", outcome="cancelled"))
    receipt = CancelReceipt(session_id="s1", turn_id="t2", outcome="cancelled")
    assert core.feed(CancelDone(receipt)) == [Quit(0)]


def test_rewind_defaults_to_the_last_turn_and_says_what_it_restored() -> None:
    core = ChatCore(interactive=False, color=False)
    assert core.feed(Line("/rewind")) == []
    assert "no turn to rewind yet" in core.take_output()
    core.feed(Line("one"))
    core.feed(PromptAccepted("t1"))
    core.feed(ev.TurnStarted(turn_id="t1", text="one"))
    core.feed(ev.TurnEnded(turn_id="t1", outcome="completed"))
    assert core.feed(Line("/rewind")) == [SendRewind("t1")]
    # A prompt waits for the rewind's answer, as it waits for a turn.
    assert core.feed(Line("two")) == []
    answer = {
        "turn_id": "t1",
        "restored": ["a.txt", "b\x1b[2Jc.txt"],
        "not_restored": [{"path": "big.bin", "why": "too big"}],
        "undo": "r1",
    }
    assert core.feed(RewindDone(answer)) == [SendPrompt("two")]
    shown = core.take_output()
    assert "↶ files as they were before t1: restored a.txt, b[2Jc.txt\n" in shown
    assert "✗ not restored: big.bin (too big)" in shown
    assert "/rewind r1 undoes this rewind" in shown
    core.feed(PromptAccepted("t2"))
    core.feed(ev.TurnEnded(turn_id="t2", outcome="completed"))
    assert core.feed(Line("/rewind t1")) == [SendRewind("t1")]
    core.feed(RewindFailed("session s1 cannot rewind now: busy"))
    assert "✗ rewind failed: session s1 cannot rewind now: busy" in core.take_output()


def test_help_lists_the_chat_commands_and_any_other_slash_word_is_the_agents() -> None:
    core = ChatCore(interactive=True, color=False)
    core.start("fake")
    assert "/help" in core.take_output()
    assert _type(core, "/help\n") == []
    shown = core.take_output()
    for command in ("Esc or Ctrl-C", "/rewind [TURN]", "/quit or Ctrl-D"):
        assert command in shown
    assert "a /word too (agents have slash commands of their own)" in shown
    assert shown.endswith("› ")
    assert _type(core, "/compact\n") == [SendPrompt("/compact")]
    core.feed(PromptAccepted("t1"))
    assert _type(core, "/help\n") == []  # while a turn runs: not a steer either
    assert "the chat's commands:" in core.take_output()


def test_a_status_line_at_the_prompt_redraws_the_line_being_typed() -> None:
    core = ChatCore(interactive=True, color=False)
    core.start("fake")
    _type(core, "ab")
    core.take_output()
    core.feed(ev.ErrorEvent(code="agent_bad_line", message="agent wrote \x1b[2Jgarbage"))
    assert core.take_output() == "\nerror: agent wrote [2Jgarbage\n› ab"


def test_bidi_controls_from_the_wire_do_not_reorder_the_screen() -> None:
    core = ChatCore(interactive=False, color=False)
    core.feed(Line("go"))
    core.feed(PromptAccepted("t1"))
    core.take_output()
    core.feed(ev.MessageDelta(turn_id="t1", text="rm \u202etxt.exe\u202c done \u2066x\u2069"))
    core.feed(ev.ErrorEvent(code="agent_bad_line", message="a\u202eb"))
    assert core.take_output() == "rm txt.exe done x\nerror: ab\n"


def test_a_pause_and_the_resume_are_status_lines() -> None:
    core = ChatCore(interactive=False, color=False)
    core.feed(ev.SessionHeld(held="paused"))
    assert "the supervisor is paused: prompts wait until it is resumed" in core.take_output()
    core.feed(ev.SessionHeld(held=None))
    assert "resumed: waiting prompts start in order" in core.take_output()


def test_typing_while_a_turn_runs_steers_it_unechoed() -> None:
    core = ChatCore(interactive=True, color=False)
    core.start("fake")
    _type(core, "go\n")
    core.feed(PromptAccepted("t1"))
    core.feed(ev.MessageDelta(turn_id="t1", text="one "))
    core.take_output()
    assert _type(core, "go left") == []
    shown = core.take_output()
    assert "go left" not in shown and "steering the running turn" in shown
    assert core.feed(Key(ENTER)) == [SendSteer("go left")]
    assert "↪ go left" in core.take_output()
    core.feed(ev.TurnSteered(turn_id="t1", mode="injected", text="go left"))
    result = SteerResult(session_id="s1", mode="injected", turn_id="t1")
    core.feed(SteerDone(result))
    assert "the running turn took it" in core.take_output()
    core.feed(ev.MessageDelta(turn_id="t1", text="two "))
    assert core.take_output() == "two "  # still the same turn on screen
    core.feed(ev.TurnEnded(turn_id="t1", outcome="completed"))
    assert core.take_output().endswith("› ")


def test_a_steer_the_agent_cannot_take_follows_the_turn_it_starts() -> None:
    core = ChatCore(interactive=False, color=False)
    assert core.feed(Line("go")) == [SendPrompt("go")]
    core.feed(PromptAccepted("t1"))
    assert core.feed(Line("/steer do this instead")) == [SendSteer("do this instead")]
    receipt = {"session_id": "s1", "turn_id": "t1", "outcome": "cancelled", "elapsed_ms": 3.0}
    core.feed(ev.TurnEnded(turn_id="t1", outcome="cancelled", receipt=receipt))
    core.feed(
        ev.TurnSteered(
            turn_id="t2", mode="interrupted", text="do this instead", interrupted_turn_id="t1"
        )
    )
    core.feed(ev.TurnStarted(turn_id="t2", text="do this instead"))
    core.feed(ev.MessageDelta(turn_id="t2", text="new words "))
    result = SteerResult(
        session_id="s1",
        mode="interrupted",
        turn_id="t2",
        receipt=CancelReceipt(session_id="s1", turn_id="t1", outcome="cancelled", elapsed_ms=3),
    )
    core.feed(SteerDone(result))
    shown = core.take_output()
    assert "■ Cancelled in 3 ms" in shown and "new words " in shown
    assert "the agent cannot steer: the turn stopped (Cancelled in 3 ms); yours runs next" in shown
    assert core.feed(Line("after")) == []  # waits for the steered turn
    assert core.feed(ev.TurnEnded(turn_id="t2", outcome="completed")) == [SendPrompt("after")]


def test_two_interrupts_within_a_second_quit() -> None:
    core = ChatCore(interactive=True, color=False)
    _type(core, "go\n")
    core.feed(PromptAccepted("t1"))
    assert core.feed(Interrupt(at=10.0)) == [SendCancel("t1")]
    assert core.feed(Interrupt(at=12.0)) == []  # too late to count as a double press
    assert core.feed(Interrupt(at=12.5)) == [Quit(0)]


# -- the real command in a pseudo-terminal -----------------------------------------------------


class Terminal:
    """The master side of a pty running the chat: type into it, read what it shows."""

    def __init__(self, master: int, slave: int, process: trio.Process) -> None:
        self.stream = trio.lowlevel.FdStream(master)
        self.slave = slave
        self.process = process
        self.raw = b""
        self._pos = 0

    @property
    def text(self) -> str:
        """Everything shown so far, without colours and carriage returns."""
        return _ANSI.sub("", self.raw.decode("utf-8", errors="replace")).replace("\r", "")

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _read(self) -> None:
        data = await self.stream.receive_some(4096)
        if not data:
            raise AssertionError(f"terminal closed; it showed:\n{self.text}")
        self.raw += data

    async def expect(self, pattern: str, timeout: float = EXPECT_S) -> re.Match[str]:
        """Wait for ``pattern`` after the previous match; return the match."""
        regex = re.compile(pattern)
        try:
            with trio.fail_after(timeout):
                while True:
                    match = regex.search(self.text, self._pos)
                    if match is not None:
                        self._pos = match.end()
                        return match
                    await self._read()
        except trio.TooSlowError:
            raise AssertionError(
                f"no {pattern!r} within {timeout} s; after the last match it showed:\n"
                f"{self.text[self._pos :]!r}"
            ) from None

    async def wait_exit(self, timeout: float = EXIT_S) -> int:
        """The exit code, reading the terminal meanwhile so the chat never blocks on it."""
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:

                async def drain() -> None:
                    while True:
                        await self._read()

                nursery.start_soon(drain)
                code = await self.process.wait()
                nursery.cancel_scope.cancel()
        return code

    def local_modes(self) -> int:
        return int(termios.tcgetattr(self.slave)[3])

    async def stop_with_esc(self, said: str = CANCELLED) -> None:
        """Esc stops the running turn: the receipt ``said``, then the prompt again."""
        await self.send(b"\x1b")
        await self.expect(said)

    async def quit_with_ctrl_d(self) -> None:
        await self.send(b"\x04")
        assert await self.wait_exit() == 0


async def _reap(process: trio.Process, first: signal.Signals) -> None:
    """Ask the process (group) to go, then make sure; bounded, and safe when cancelled."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            for signum, wait in ((first, EXIT_S), (signal.SIGKILL, EXIT_S)):
                try:
                    os.killpg(process.pid, signum)
                except ProcessLookupError:
                    pass
                with trio.move_on_after(wait):
                    await process.wait()
                if process.returncode is not None:
                    break


@asynccontextmanager
async def chat_in_pty(*args: str) -> AsyncIterator[Terminal]:
    master, slave = pty.openpty()
    process: trio.Process | None = None
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", _WITH_CTTY, "-m", "supervisor.cli", "chat", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            cwd=ROOT,
        )
        terminal = Terminal(master, slave, process)
        master = -1  # the terminal's stream owns it now
        try:
            yield terminal
        finally:
            await _reap(process, signal.SIGTERM)
            terminal.stream.close()
    finally:
        if process is None and master >= 0:
            os.close(master)
        os.close(slave)


@pytest.fixture
def config(tmp_path: Path) -> str:
    """The demo agent, and one that ignores cancels. A turn a test stops asks for
    ``words=10000`` (five minutes at 0.03 s a word): it cannot end by itself before the stop,
    however late a loaded machine lets the stop come."""
    demo = [
        sys.executable,
        "-m",
        "supervisor.demo_agent",
        "--delay",
        "0.03",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    path = tmp_path / "agents.toml"
    path.write_text(
        "[agents.demo]\n"
        'protocol = "acp"\n'
        f"command = {json.dumps(demo)}\n"
        "\n"
        "[agents.stubborn]\n"
        'protocol = "acp"\n'
        f"command = {json.dumps([*demo, '--ignore-cancel'])}\n"
        "grace_s = 1.0\n"
    )
    return str(path)


async def test_esc_stops_the_turn_and_the_next_one_completes(config: str) -> None:
    async with chat_in_pty("--agent", "demo", "--config", config) as terminal:
        await terminal.expect(r"› ")
        modes = terminal.local_modes()
        assert not modes & termios.ECHO and not modes & termios.ICANON  # cbreak while chatting
        await terminal.send(b"tell me about supervisors words=10000\r")
        await terminal.expect(r"Hello! I am the demo")
        await terminal.stop_with_esc()
        await terminal.send(b"are you still there? words=5\r")
        await terminal.expect(r"Hello! I am the demo \n› ")
        await terminal.quit_with_ctrl_d()
        modes = terminal.local_modes()
        assert modes & termios.ECHO and modes & termios.ICANON  # the terminal is given back
        assert os.get_blocking(terminal.slave)  # and so is the blocking mode it shares


async def test_ctrl_c_stops_the_turn_and_a_second_one_quits(config: str) -> None:
    async with chat_in_pty("--agent", "demo", "--config", config) as terminal:
        await terminal.expect(r"› ")
        await terminal.send(b"count to forty words=10000\r")
        await terminal.expect(r"Hello! I am")
        await terminal.send(b"\x03")  # ISIG: the line discipline sends SIGINT
        await terminal.expect(CANCELLED)
        assert terminal.process.returncode is None  # one Ctrl-C only stops the turn
        await terminal.send(b"\x03")  # within a second of the first
        assert await terminal.wait_exit() == 0
        modes = terminal.local_modes()
        assert modes & termios.ECHO and modes & termios.ICANON


async def test_a_stubborn_agent_is_killed_after_its_grace_and_resumed(config: str) -> None:
    async with chat_in_pty("--agent", "stubborn", "--config", config) as terminal:
        await terminal.expect(r"› ")
        await terminal.send(b"refactor the parser words=10000\r")
        await terminal.expect(r"Hello! I am")
        await terminal.stop_with_esc(r"■ Killed after 1\.0 s grace, session resumed\n› ")
        await terminal.send(b"still there? words=3\r")
        await terminal.expect(r"Hello! I am \n› ")
        await terminal.send(b"/quit\r")
        assert await terminal.wait_exit() == 0


async def test_permission_answered_with_y_lets_the_turn_complete(config: str) -> None:
    async with chat_in_pty("--agent", "demo", "--config", config) as terminal:
        await terminal.expect(r"› ")
        await terminal.send(b"run a tool, permission words=4\r")
        await terminal.expect(r"Run `echo hello` — allow\? \[y/n\] ")
        await terminal.send(b"y")
        await terminal.expect(r"allowed \(Allow once\)")
        await terminal.expect(r"Hello! I am the \n› ")
        await terminal.quit_with_ctrl_d()


async def test_steer_the_running_turn_from_the_terminal(config: str) -> None:
    async with chat_in_pty("--agent", "demo", "--config", config) as terminal:
        await terminal.expect(r"› ")
        await terminal.send(b"tell me a long story words=10000\r")
        await terminal.expect(r"Hello! I am the demo")
        await terminal.send(b"make it short")
        await terminal.expect(r"steering the running turn")
        await terminal.send(b"\r")
        await terminal.expect(r"↪ make it short")
        await terminal.expect(r"the running turn took it")
        await terminal.expect(r"Steered: make it short\.")
        await terminal.stop_with_esc()
        await terminal.quit_with_ctrl_d()


async def test_remote_chat_through_a_gateway(tmp_path: Path, config: str) -> None:
    async with serve(tmp_path, "--config", config) as served:
        async with chat_in_pty("--url", served.url) as terminal:
            await terminal.expect(r"› ")
            await terminal.send(b"hello over the wire words=10000\r")
            await terminal.expect(r"Hello! I am the demo")
            await terminal.stop_with_esc()
            await terminal.quit_with_ctrl_d()
        async with connect(served.url) as client:
            # quitting stopped the chat's session (kept in the store, as stopped)
            assert [s["state"] for s in await client.sessions()] == ["stopped"]


async def test_rewind_in_the_terminal_puts_the_files_back(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_bytes(b"mine\n")
    demo = [sys.executable, "-m", "supervisor.demo_agent", "--delay", "0.01"]
    demo += ["--state-dir", str(tmp_path / "state")]
    config = tmp_path / "agents.toml"
    config.write_text(
        f'[agents.writer]\nprotocol = "acp"\ncommand = {json.dumps(demo)}\n'
        f"cwd = {json.dumps(str(work))}\n"
    )
    async with chat_in_pty("--agent", "writer", "--config", str(config)) as terminal:
        await terminal.expect(r"› ")
        await terminal.send(b"write=notes.txt write=new.txt words=2\r")
        await terminal.expect(r"Hello! I \n› ")
        assert (work / "notes.txt").read_bytes() == b"write=notes.txt write=new.txt words=2\n"
        await terminal.send(b"/rewind\r")
        await terminal.expect(r"files as they were before t1: restored new\.txt, notes\.txt\n")
        await terminal.expect(r"/rewind r1 undoes this rewind\n› ")
        assert (work / "notes.txt").read_bytes() == b"mine\n"
        assert not (work / "new.txt").exists()
        await terminal.send(b"/rewind r1\r")
        await terminal.expect(r"before r1: restored new\.txt, notes\.txt\n")
        assert (work / "new.txt").exists()
        await terminal.quit_with_ctrl_d()


async def test_piped_stdin_is_read_as_lines(config: str) -> None:
    with trio.fail_after(EXPECT_S):
        process = await trio.run_process(
            [sys.executable, "-m", "supervisor.cli", "chat", "--config", config],
            stdin=b"hello words=10000\n/stop\nagain words=2\n",
            capture_stdout=True,
            capture_stderr=True,
            cwd=ROOT,
        )
    out = process.stdout.decode()
    assert "\x1b[" not in out  # no colours when nobody looks
    assert re.search(r"■ Cancelled in \d+ ms\n› again words=2\n.*\nHello! I \n", out), out


async def test_a_chat_with_a_session_on_another_host_names_the_host(tmp_path: Path) -> None:
    """An agent placed on a host (here: this machine through the ``env`` transport and a node)
    is chatted with like a local one, and the chat says where it runs."""
    demo = [sys.executable, "-m", "supervisor.demo_agent", "--delay", "0.01"]
    config = tmp_path / "agents.toml"
    config.write_text(
        "[hosts.here]\n"
        'transport = ["env"]\n'
        f"command = {json.dumps([sys.executable, '-m', 'supervisor.cli'])}\n"
        "detach_s = 2.0\n"
        f"state_dir = {json.dumps(str(tmp_path / 'node'))}\n"
        "\n"
        "[agents.demo]\n"
        'protocol = "acp"\n'
        f"command = {json.dumps([*demo, '--state-dir', str(tmp_path / 'state')])}\n"
        'hosts = ["here"]\n'
    )
    with trio.fail_after(EXPECT_S * 2):
        process = await trio.run_process(
            [sys.executable, "-m", "supervisor.cli", "chat", "--config", str(config)],
            stdin=b"hello words=2\n",
            capture_stdout=True,
            capture_stderr=True,
            cwd=ROOT,
        )
    out = process.stdout.decode()
    assert "chat with demo on here (embedded supervisor)" in out, out
    assert re.search(r"Hello! I \n", out), out


async def _one_turn(url: str, text: str, cwd: Path) -> str:
    """A session of the demo agent on the gateway at ``url`` that answered ``text``; its id."""
    async with connect(url) as client:
        session_id = str((await client.start_session("demo", str(cwd)))["session_id"])
        async with client.subscribe(session_id) as channel:
            await client.prompt(session_id, text)
            with trio.fail_after(EXPECT_S):
                async for event in client.events(session_id, channel):
                    if isinstance(event, ev.TurnEnded):
                        assert event.outcome == "completed"
                        return session_id
    raise AssertionError("the session's events ended before its turn did")


async def test_chat_joins_a_stored_session_shows_its_conversation_and_brings_it_back(
    tmp_path: Path, config: str
) -> None:
    """``chat --session ID`` on a session an earlier ``serve`` stored: its conversation is
    shown, and a prompt starts its agent again and is answered; joined again while it runs,
    its turn is shown; quitting leaves it running."""
    async with serve(tmp_path, "--config", config) as served:
        session_id = await _one_turn(served.url, "remember kiwi words=3", tmp_path)
    async with serve(tmp_path, "--config", config) as served:
        async with chat_in_pty("--url", served.url, "--session", session_id) as terminal:
            await terminal.expect(r"earlier in this session:\n› remember kiwi words=3\nHello! I am")
            await terminal.expect(rf"chat with demo \(session {session_id} at [^\n]*\n› ")
            await terminal.send(b"and again words=3\r")
            await terminal.expect(r"Hello! I am \n› ")
            await terminal.quit_with_ctrl_d()
        async with chat_in_pty("--url", served.url, "--session", session_id) as terminal:
            # The turns from before the restart come from the store, the later from memory.
            await terminal.expect(
                r"earlier in this session:\n› remember kiwi words=3\nHello! I am[^›]*"
                r"› and again words=3\n"
            )
            await terminal.expect(r"Hello! I am \nchat with demo [^\n]*\n› ")
            await terminal.quit_with_ctrl_d()
        async with connect(served.url) as client:
            (summary,) = [s for s in await client.sessions() if s["session_id"] == session_id]
            assert summary["state"] == "ready"


# -- attached raw to a terminal agent -----------------------------------------------------------


def _tui_config(tmp_path: Path) -> tuple[str, Path]:
    """A terminal agent (the fake TUI), and the file where it writes each prompt it takes."""
    state = tmp_path / "prompts.txt"
    command = [sys.executable, str(REPO / "tests" / "fakes" / "fake_tui.py"), "--state", str(state)]
    path = tmp_path / "agents.toml"
    path.write_text(
        "[agents.tui]\n"
        'protocol = "terminal"\n'
        f"command = {json.dumps(command)}\n"
        "idle_s = 0.3\n"
        "grace_s = 5.0\n"
    )
    return str(path), state


async def test_chat_attaches_raw_to_a_terminal_session_and_its_key_stops_the_turn(
    tmp_path: Path,
) -> None:
    """Joined late, the chat draws the agent's screen first; it makes the agent's terminal the
    size of the person's; a line typed is a turn; Ctrl-] stops it through the ladder and prints
    the receipt; Ctrl-] twice detaches, the terminal given back as it was."""
    config, prompts = _tui_config(tmp_path)
    async with serve(tmp_path, "--config", config) as served, connect(served.url) as client:
        session_id = str((await client.start_session("tui", str(tmp_path)))["session_id"])
        async with client.subscribe(session_id) as channel:
            await client.prompt(session_id, "before the chat")
            with trio.fail_after(EXPECT_S):
                async for event in client.events(session_id, channel):
                    if isinstance(event, ev.TurnEnded):
                        break
        async with chat_in_pty("--url", served.url, "--session", session_id) as terminal:
            fcntl.ioctl(terminal.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 90, 0, 0))
            await terminal.expect(r"attached to tui .* Ctrl-\] stops the turn")
            await terminal.expect(r"answer: before the chat")  # the picture: no history replayed
            await terminal.expect(r"resized 90x30")  # the agent's terminal follows the person's
            fcntl.ioctl(terminal.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 35, 100, 0, 0))
            await terminal.expect(r"resized 100x35")  # (SIGWINCH)
            modes = terminal.local_modes()
            assert not modes & (termios.ECHO | termios.ICANON | termios.ISIG)  # raw
            await terminal.send(b"slow one\r")
            await terminal.expect(r"answer: slow one\nmore 0\nmore 1\n")
            await terminal.send(b"\x1d")
            await terminal.expect(r"■ Cancelled in \d+ ms")
            assert prompts.read_text() == "before the chat\nslow one\n"  # typed text erased
            await terminal.send(b"\x1d\x1d")
            assert await terminal.wait_exit() == 0
            modes = terminal.local_modes()
            assert modes & termios.ECHO and modes & termios.ICANON and modes & termios.ISIG
            assert RESTORE_MODES in terminal.raw  # and the modes the agent may have set
        (summary,) = await client.sessions()
        assert summary["state"] == "ready"  # leaving a joined session leaves it running


def _raw_keys(core: RawCore, data: bytes, at: float = 0.0) -> list[object]:
    return list(core.feed(RawKeys(data, at)))


def test_raw_a_line_typed_is_a_turn_other_keys_pass_through() -> None:
    core = RawCore()
    assert _raw_keys(core, b"hi\x7fey\r") == [
        SendInput("hi\x7fey"),
        SendInput("\x7f\x7f\x7f"),  # what the agent's input line holds, erased
        SendPrompt("hey"),
    ]
    assert core.feed(PromptAccepted("t1")) == []
    core.feed(ev.TurnStarted(turn_id="t1", text="hey"))
    assert _raw_keys(core, b"\x1b\r\x03") == [SendInput("\x1b\r\x03")]  # the agent's keys
    core.feed(ev.TurnEnded(turn_id="t1", outcome="completed"))
    # An arrow (history, say) makes the line the agent's: Enter is then only a key.
    assert _raw_keys(core, b"\x1b[Ax\r") == [SendInput("\x1b[Ax\r")]
    pasted = b"\x1b[200~two\nlines\x1b[201~\r"
    assert _raw_keys(core, pasted)[-1] == SendPrompt("two\nlines")


def test_raw_the_stop_key_cancels_the_turn_once_it_has_an_id_and_twice_detaches() -> None:
    core = RawCore()
    _raw_keys(core, b"go\r")
    assert _raw_keys(core, b"\x1d", at=0.0) == []  # the prompt has no turn id yet
    assert core.feed(PromptAccepted("t1")) == [SendCancel("t1")]
    receipt = CancelReceipt(session_id="s1", turn_id="t1", outcome="cancelled", elapsed_ms=12.0)
    core.feed(ev.TurnEnded(turn_id="t1", outcome="cancelled"))
    core.take_output()
    core.feed(CancelDone(receipt))
    assert core.take_output() == f"\r\n■ {receipt.summary()}\r\n".encode()
    assert _raw_keys(core, b"\x1d", at=5.0) == []
    assert b"no turn is running" in core.take_output()
    assert _raw_keys(core, b"\x1d", at=5.5) == [Quit(0)]


def test_raw_the_picture_first_then_only_the_output_after_it() -> None:
    core = RawCore()
    core.feed(Screen(b"\x1b[2Jpicture", last_seq=7))
    for seq, data in ((7, b"old"), (8, b"new")):
        core.feed(ev.TerminalOutput(seq=seq, data=base64.b64encode(data).decode()))
    assert core.take_output() == b"\x1b[2Jpicturenew"
