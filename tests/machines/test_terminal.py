"""The terminal machine without I/O: bytes and times in, keys, wake-ups and events out."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from protocols import events as ev
from protocols import new_machine
from protocols.machine import SessionEstablished, Step, TurnFinished
from protocols.terminal import (
    ECHO_WAIT_S,
    MAX_SEQUENCE_CHARS,
    MAX_SNAPSHOT_BYTES,
    TERMINAL_SESSION,
    TerminalClient,
    TerminalSettings,
)

IDLE = 0.5


def machine(**settings: Any) -> TerminalClient:
    client = TerminalClient(TerminalSettings(idle_s=IDLE, cols=40, rows=10, **settings))
    assert client.start(cwd="/").events == []
    return client


def out(client: TerminalClient, data: bytes, now: float) -> Step:
    return client.receive({"output": data, "now": now})


def tick(client: TerminalClient, now: float) -> Step:
    return client.receive({"tick": True, "now": now})


def controls(step: Step) -> list[Any]:
    return [e for e in step.events if not isinstance(e, ev.Event)]


def deltas(step: Step) -> str:
    return "".join(e.text for e in step.events if isinstance(e, ev.MessageDelta))


def ready(client: TerminalClient) -> None:
    step = out(client, b"welcome\r\n> ", 0.0)
    assert step.send == [{"wake_at": IDLE}]
    assert controls(step) == []
    step = tick(client, IDLE)
    assert controls(step) == [SessionEstablished(None, resumed=None)]


def test_registered_and_configured() -> None:
    settings = TerminalSettings(prompt_pattern="^\\$ $")
    client = new_machine("terminal", settings)
    assert isinstance(client, TerminalClient) and client.settings is settings
    assert isinstance(new_machine("terminal"), TerminalClient)
    with pytest.raises(TypeError):
        new_machine("terminal", object())


@pytest.mark.parametrize(
    "bad",
    [
        {"prompt_pattern": "("},
        {"resume_pattern": "["},
        {"idle_s": 0},
        {"interrupt": ()},
        {"submit": "shout"},
        {"cols": 0},
        {"rows": 10_000},
    ],
)
def test_bad_settings_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        TerminalClient(TerminalSettings(**bad))


def test_start_waits_for_the_pattern_to_hold_still() -> None:
    client = machine()
    assert controls(out(client, b"loading...", 0.0)) == []
    step = tick(client, 5.0)
    assert controls(step) == [] and step.send == []  # no prompt: nothing to wait for
    step = out(client, b"\r\n> ", 5.0)
    assert step.send == [{"wake_at": 5.0 + IDLE}]
    assert controls(out(client, b"\x1b[1m", 5.1)) == []  # no change on screen: still due then
    out(client, b"x\x08 \x08", 5.1)  # drawn and erased within a read: no change either
    out(client, b"x", 5.2)  # a change: due later
    assert controls(tick(client, 5.0 + IDLE)) == []
    assert controls(tick(client, 5.2 + IDLE)) == [SessionEstablished(None, resumed=None)]


def test_start_pattern_and_resume() -> None:
    client = TerminalClient(TerminalSettings(idle_s=IDLE, start_pattern="READY"))
    client.start(cwd="/", resume=TERMINAL_SESSION)
    out(client, b"> ", 0.0)
    assert controls(tick(client, 1.0)) == []
    out(client, b"READY", 1.0)
    assert controls(tick(client, 2.0)) == [SessionEstablished(TERMINAL_SESSION, resumed=True)]


def test_a_resumed_start_waits_for_the_resume_pattern() -> None:
    """The input box a TUI draws before it has loaded the conversation it resumes does not
    establish a resumed start; the same box does a fresh start."""
    settings = TerminalSettings(idle_s=IDLE, resume_pattern="(?s)^said: .*^>")
    resumed = TerminalClient(settings)
    resumed.start(cwd="/", resume=TERMINAL_SESSION)
    out(resumed, b"> ", 0.0)
    assert controls(tick(resumed, 5.0)) == []
    out(resumed, b"\x1b[2J\x1b[Hsaid: hello\r\n> ", 5.0)
    assert controls(tick(resumed, 5.0 + IDLE)) == [
        SessionEstablished(TERMINAL_SESSION, resumed=True)
    ]
    fresh = TerminalClient(settings)
    fresh.start(cwd="/")
    out(fresh, b"> ", 0.0)
    assert controls(tick(fresh, IDLE)) == [SessionEstablished(None, resumed=None)]


def test_a_turn_paste_lines_and_end() -> None:
    client = machine()
    ready(client)
    step = client.prompt("t1", "two\nlines")
    assert step.send == [{"keys": "\x1b[200~two\nlines\x1b[201~\r"}]
    # the screen has not answered the keys yet: the prompt showing says nothing
    assert controls(tick(client, 10.0)) == []
    step = out(client, b"two lines\r\nfirst ans", 10.0)
    assert deltas(step) == ""  # the line being drawn is not finished
    step = out(client, b"wer\r\nsecond\r\n> ", 10.1)
    assert deltas(step) == "first answer\nsecond\n"
    assert step.send == []  # woken at 10.0 + IDLE already: one wake-up asked at a time
    step = tick(client, 10.0 + IDLE)
    assert controls(step) == [] and step.send == [{"wake_at": 10.1 + IDLE}]
    assert controls(tick(client, 10.1 + IDLE)) == [TurnFinished("t1", "end_turn", False)]
    assert client.prompt("t2", "again").send  # ready for the next


def test_typed_submit() -> None:
    client = machine(submit="type")
    ready(client)
    assert client.prompt("t1", "a\nb").send == [{"keys": "a\rb\r"}]


def test_paste_cannot_be_ended_by_the_text() -> None:
    client = machine()
    ready(client)
    keys = client.prompt("t1", "x\x1b[201~rm -rf /\r").send[0]["keys"]
    assert keys.count("\x1b[201~") == 1 and keys.endswith("\x1b[201~\r")


def test_lines_scrolled_off_are_followed() -> None:
    client = machine()
    ready(client)
    client.prompt("t1", "go")
    out(client, b"go\r\n", 1.0)
    text = deltas(out(client, b"".join(b"line %d\r\n" % i for i in range(25)), 1.1))
    assert text == "".join(f"line {i}\n" for i in range(25))


def test_cancel_sends_the_keys_at_once_and_ends_cancelled() -> None:
    client = machine(interrupt=["\x1b", "\x03"])
    ready(client)
    client.prompt("t1", "go")
    out(client, b"go\r\nworking", 1.0)
    step = client.cancel()
    assert step.send == [{"keys": "\x1b"}, {"keys": "\x03"}]
    assert client.cancel().send == []  # once
    # the prompt still showing from before the keys says nothing about them
    out(client, b"", 1.1)
    assert controls(tick(client, 5.0)) == []
    out(client, b"\r\ninterrupted\r\n> ", 5.0)
    assert controls(tick(client, 5.0 + IDLE)) == [TurnFinished("t1", "cancelled", True)]


def test_a_screen_that_never_settles_never_ends_the_turn() -> None:
    client = machine()
    ready(client)
    client.prompt("t1", "go")
    now = 1.0
    for i in range(50):
        out(client, b"\r> spinner %d" % i, now)
        now += IDLE / 2
        assert controls(tick(client, now)) == []


def test_output_is_passed_on_as_read() -> None:
    client = machine()
    raw = b"\xff\xfe garbage \x1b[31mred\x1b[0m \xe2\x82"
    step = out(client, raw, 0.0)
    sent = [e for e in step.events if isinstance(e, ev.TerminalOutput)]
    assert [base64.b64decode(e.data) for e in sent] == [raw]


def test_invalid_utf8_across_reads() -> None:
    client = machine()
    out(client, b"\xff ok \xe2\x82", 0.0)  # the euro sign split across reads
    out(client, b"\xac", 0.1)
    assert client.screen_text.splitlines()[0] == "\ufffd ok \u20ac"


def test_an_endless_escape_sequence_is_dropped_in_bounded_memory() -> None:
    client = machine()
    step = out(client, b"\x1b]0;" + b"t" * (MAX_SEQUENCE_CHARS * 4), 0.0)
    errors = [e for e in step.events if isinstance(e, ev.ErrorEvent)]
    assert errors and errors[0].code == "terminal_garbage"
    out(client, b"after", 0.1)
    assert "after" in client.screen_text
    step = out(client, b"\x1b[" + b";" * 100_000 + b"m", 0.2)
    out(client, b" fine", 0.3)
    assert "fine" in client.screen_text


def test_garbage_and_flood_keep_the_screen_its_size() -> None:
    client = machine()
    junk = bytes(range(256)) * 64 + b"\x1b[?1049h\x1b[999;999H\x1b[8;500;500t"
    for i in range(20):
        out(client, junk, i * 0.01)
    assert len(client.screen_text.splitlines()) <= 10
    assert all(len(line) <= 40 for line in client.screen_text.splitlines())


def test_terminal_queries_are_answered() -> None:
    client = machine()
    step = out(client, b"ab\x1b[6n", 0.0)
    assert {"keys": "\x1b[1;3R"} in step.send


def test_a_sequence_the_screen_cannot_take_loses_nothing_after_it() -> None:
    """Gemini CLI's first bytes: xterm's key-modifier query (``CSI > 4 ; ? m``) is no
    rendition, and the device-attributes query after it still gets its answer."""
    client = machine()
    step = out(
        client, b"\x1b[8m\x1b[?u\x1b]11;?\x1b\\\x1b[>q\x1b[>4;?m\x1b[c\x1b[2K\r\x1b[0mok", 0.0
    )
    assert [e for e in step.events if isinstance(e, ev.ErrorEvent)] == []
    assert {"keys": "\x1b[?6c"} in step.send
    assert client.screen_text.splitlines()[0] == "ok"
    step = out(client, b"\x1b[?5W\x1b[5;?z then", 0.1)  # unknown to pyte: dropped alone
    assert client.screen_text.splitlines()[0] == "ok then"


def test_input_and_resize() -> None:
    client = machine()
    assert client.input("y").send == [{"keys": "y"}]
    assert client.resize(80, 24).send == [{"resize": [80, 24]}]
    assert client.size == (80, 24)
    with pytest.raises(ValueError):
        client.resize(0, 24)


def test_fewer_rows_keep_what_is_drawn_as_a_terminal_does() -> None:
    # A view (xterm.js) keeps the rows above the cursor when it gets fewer rows: so does the
    # screen, or a picture taken after the agent's resize would lose them.
    client = machine()
    out(client, b"banner\r\n> ", 0.0)
    client.resize(40, 6)
    assert client.screen_text == "banner\n>\n\n\n\n"
    assert (client._screen.cursor.x, client._screen.cursor.y) == (2, 1)
    assert redrawn(client.snapshot(), 40, 6).screen_text == client.screen_text
    # The cursor on the last rows: the rows below it go, then the top rows scroll off.
    client = machine()
    out(client, b"".join(b"row %d\r\n" % i for i in range(8)) + b"> ", 0.0)
    out(client, b"\x1b[10;1Hbottom\x1b[9;3H", 0.0)
    client.resize(40, 4)
    assert client.screen_text.splitlines() == ["row 5", "row 6", "row 7", ">"]
    assert (client._screen.cursor.x, client._screen.cursor.y) == (2, 3)


def redrawn(picture: bytes, cols: int, rows: int) -> TerminalClient:
    """A fresh screen of that size, fed the picture (as a terminal view draws it)."""
    view = TerminalClient(TerminalSettings(cols=cols, rows=rows))
    view.start(cwd="/")
    out(view, b"junk that the picture clears\r\n\x1b[7mreversed", 0.0)
    out(view, picture, 0.0)
    return view


def test_snapshot_redraws_the_screen_with_its_styles() -> None:
    client = machine()
    drawn = (
        "plain\r\n\x1b[1;31mbold red\x1b[0m then \x1b[4;38;5;100mindexed\x1b[0m"
        " \x1b[48;2;1;2;3;7mtrue\x1b[0m\r\n\x1b[94;105mbright\x1b[0m \u20ac\u4e2d\u6587 x\r\n> "
    )
    out(client, drawn.encode(), 0.0)
    screen = client.screen()
    assert (screen.cols, screen.rows) == (40, 10) and screen.data == client.snapshot()
    view = redrawn(screen.data, 40, 10)
    theirs, ours = client._screen, view._screen
    assert view.screen_text == client.screen_text
    assert [theirs.buffer[y][x] for y in range(10) for x in range(40)] == [
        ours.buffer[y][x] for y in range(10) for x in range(40)
    ]
    assert (ours.cursor.x, ours.cursor.y) == (theirs.cursor.x, theirs.cursor.y) == (2, 3)
    assert not ours.cursor.hidden


def test_snapshot_keeps_a_hidden_cursor_and_the_modes_keys_depend_on() -> None:
    client = machine()
    out(client, b"\x1b[?1h\x1b[?2004h\x1b[?1006h\x1b[?7l> \x1b[?25l", 0.0)
    view = redrawn(client.snapshot(), 40, 10)._screen
    assert view.cursor.hidden
    assert {1 << 5, 2004 << 5, 1006 << 5} <= view.mode


def test_snapshot_is_bounded_its_text_kept_first() -> None:
    big = TerminalClient(TerminalSettings(cols=500, rows=200))
    big.start(cwd="/")
    # Every cell a new style: over the bound with its styles.
    cells = "".join(
        f"\x1b[1;3;4;38;2;{i % 256};7;9;48;2;{i % 199};8;9m{i % 10}" for i in range(100_000)
    )
    out(big, cells.encode(), 0.0)
    picture = big.snapshot()
    assert len(picture) <= MAX_SNAPSHOT_BYTES
    view = redrawn(picture, 500, 200)
    assert view.screen_text == big.screen_text  # the text whole, the styles left out
    assert view._screen.buffer[0][0].fg == "default"


def test_enter_after_a_pause_for_a_tui_that_takes_quick_input_as_a_paste() -> None:
    client = machine(submit_delay_s=0.3)
    ready(client)
    step = client.prompt("t1", "hi")
    assert step.send == [{"keys": "\x1b[200~hi\x1b[201~"}, {"wake_at": 0.0}]
    step = out(client, b"hi", 5.0)  # the TUI draws the text: the Enter is due 0.3 s later
    assert {"wake_at": 5.3} in step.send and {"keys": "\r"} not in step.send
    assert controls(tick(client, 5.3)) == []
    assert tick(client, 5.3).send == []  # once
    step = out(client, b"\r\nanswer\r\n> ", 6.0)
    assert {"wake_at": 6.0 + IDLE} in step.send
    [finished] = controls(tick(client, 6.0 + IDLE))
    assert finished == TurnFinished("t1", "end_turn", interrupted=False)


def test_the_pause_runs_from_when_a_busy_tui_shows_the_text() -> None:
    # A TUI busy when the text comes reads it late: an Enter due 0.3 s after the text would
    # reach it with the text, as part of the paste.
    client = machine(submit_delay_s=0.3)
    ready(client)
    client.prompt("t1", "hi")
    assert {"wake_at": 1.0 + ECHO_WAIT_S + 0.3} in tick(client, 1.0).send
    assert {"keys": "\r"} not in tick(client, 1.3).send
    step = out(client, b"hi", 2.5)  # it reads the text now
    assert {"wake_at": 2.8} in step.send and {"keys": "\r"} not in step.send
    assert tick(client, 2.8).send == [{"keys": "\r"}]


def test_enter_at_the_latest_echo_wait_after_a_text_never_shown() -> None:
    client = machine(submit_delay_s=0.3)
    ready(client)
    client.prompt("t1", "hi")
    tick(client, 1.0)
    assert {"keys": "\r"} not in tick(client, 1.0 + ECHO_WAIT_S).send
    assert tick(client, 1.0 + ECHO_WAIT_S + 0.3).send == [{"keys": "\r"}]


def test_no_enter_after_a_stop_during_the_pause() -> None:
    client = machine(submit_delay_s=0.3)
    ready(client)
    client.prompt("t1", "hi")
    assert client.cancel().send == [{"keys": "\x1b"}]
    assert {"keys": "\r"} not in tick(client, 9.0).send
