"""The terminal machine without I/O: bytes and times in, keys, wake-ups and events out."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from protocols import events as ev
from protocols import new_machine
from protocols.machine import SessionEstablished, Step, TurnFinished
from protocols.terminal import (
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


def test_input_and_resize() -> None:
    client = machine()
    assert client.input("y").send == [{"keys": "y"}]
    assert client.resize(80, 24).send == [{"resize": [80, 24]}]
    assert client.size == (80, 24)
    with pytest.raises(ValueError):
        client.resize(0, 24)


def test_snapshot_is_the_screen_bounded() -> None:
    client = machine()
    out(client, b"hello\r\n> ", 0.0)
    picture = client.snapshot()
    assert picture.startswith(b"\x1b[H\x1b[2J") and b"hello\r\n>\r\n" in picture
    assert picture.endswith(b"\x1b[2;3H")
    big = TerminalClient(TerminalSettings(cols=500, rows=200))
    big.start(cwd="/")
    out(big, "\u20ac".encode() * 100_000, 0.0)
    assert len(big.snapshot()) <= MAX_SNAPSHOT_BYTES + 64
