"""A fake interactive agent (a TUI) for terminal sessions: draws ``> ``, takes a prompt, answers.

    python fake_tui.py [--mode MODE] [--resume] [--state FILE]

It puts its terminal in raw mode, as TUIs do, and reads keys: a bracketed paste
(``ESC [200~ ... ESC [201~``) or typed characters (Backspace erases one), then Enter
(``\\r``), submit a prompt; Escape alone stops the running answer (``interrupted``, then the
prompt); Ctrl-C too. An answer is ``answer: TEXT`` and, for a prompt with ``slow`` in it, a
hundred more lines ten a second (a turn to stop). On SIGWINCH it writes ``resized COLSxROWS``
below the prompt. ``--resume`` writes ``resumed`` first (what a resume command would restore);
``--state FILE`` appends each prompt's text to FILE (how the tests see what reached the agent).
``exit-after`` exits after its first answer unless resumed.

Modes: ``normal``; ``ignore-esc`` (Escape and Ctrl-C do nothing: the answer runs on; SIGTERM
too is ignored, so only the kill ends it); ``flood`` (a prompt with ``flood`` in it is answered
with ~2 MB of lines at once); ``garbage`` (invalid UTF-8 and escape-sequence junk around every
answer, and an endless OSC title); ``no-prompt`` (draws a spinner forever and never the
prompt); ``exit`` (exits at once, status 3); ``exit-after`` (exits after its first answer).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time
import tty

PASTE_START = b"\x1b[200~"
PASTE_END = b"\x1b[201~"


class Tui:
    def __init__(self, mode: str, state: str | None, resumed: bool) -> None:
        self.mode = mode
        self.resumed = resumed
        self.state = state
        self.pending: list[bytes] = []  # answer lines still to draw
        self.next_at = 0.0
        self.interval = 0.0
        self.answering = False
        self.keys = b""
        self.line = b""
        self.resized = False
        self.answers = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(1, view)
            except BlockingIOError:
                select.select([], [1], [])
                continue
            view = view[written:]

    def prompt(self) -> None:
        self.write(b"\r\n> ")

    def submit(self, text: bytes) -> None:
        if self.answering:
            return
        if self.state:
            with open(self.state, "ab") as file:
                file.write(text + b"\n")
        self.write(text.replace(b"\n", b"\r\n") + b"\r\n")
        words = text.decode("utf-8", "replace")
        lines = [f"answer: {words}".encode()]
        self.interval = 0.0
        if "slow" in words:
            lines += [f"more {i}".encode() for i in range(100)]
            self.interval = 0.1
        if self.mode == "flood" and "flood" in words:
            lines += [b"x" * 90 + b" %d" % i for i in range(20_000)]
        if self.mode == "garbage":
            lines = [b"\xff\xfe\xc3(\x1b[999;999;999m\x1b[?1049h\x1b]2;" + b"t" * 20_000, *lines]
            lines.append(b"\x1b[1;1r\x1b[5n\x9b\xe2\x82 \x1b[0m\x1b[?1049l")
        self.pending = lines
        self.answering = True
        self.next_at = time.monotonic()

    def interrupt(self) -> None:
        if self.mode == "ignore-esc" or not self.answering:
            return
        self.pending = []
        self.answering = False
        self.write(b"\r\ninterrupted")
        self.prompt()

    def keys_in(self, data: bytes) -> None:
        self.keys += data
        while self.keys:
            keys = self.keys
            if keys.startswith(PASTE_START):
                end = keys.find(PASTE_END)
                if end < 0:
                    return  # the rest of the paste is coming
                self.line += keys[len(PASTE_START) : end]
                self.keys = keys[end + len(PASTE_END) :]
            elif keys.startswith(b"\x1b"):
                if len(keys) == 1:
                    self.interrupt()
                self.keys = keys[1:]
            elif keys.startswith(b"\x03"):
                self.interrupt()
                self.keys = keys[1:]
            elif keys[:1] in (b"\x7f", b"\b"):  # Backspace: erases the line's last character
                self.line = self.line[:-1]
                self.keys = keys[1:]
            elif keys.startswith(b"\r"):
                line, self.line = self.line, b""
                self.keys = keys[1:]
                self.submit(line)
            else:
                self.line += keys[:1]
                self.keys = keys[1:]

    def step(self) -> None:
        if self.resized:
            self.resized = False
            cols, rows = os.get_terminal_size(0)
            self.write(f"\r\nresized {cols}x{rows}".encode())
            self.prompt()
        if not self.answering or time.monotonic() < self.next_at:
            return
        if self.interval:
            self.write(self.pending.pop(0) + b"\r\n")
            self.next_at = time.monotonic() + self.interval
        else:
            self.write(b"\r\n".join(self.pending) + b"\r\n")
            self.pending = []
        if not self.pending:
            if self.mode == "ignore-esc" and self.interval:
                self.pending = [b"still going"]  # an answer that never ends
                return
            self.answering = False
            self.answers += 1
            if self.mode == "exit-after" and not self.resumed:
                sys.exit(0)
            self.write(b"> ")

    def timeout(self) -> float | None:
        if self.answering:
            return max(0.0, self.next_at - time.monotonic())
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="normal")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--state")
    args = parser.parse_args()
    if args.mode == "exit":
        sys.exit(3)
    tty.setraw(0)
    tui = Tui(args.mode, args.state, args.resume)

    def on_winch(signum: int, frame: object) -> None:
        tui.resized = True

    # The handler runs between select()'s retries; the wake-up pipe makes select() return.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGWINCH, on_winch)
    if args.mode == "ignore-esc":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    tui.write(b"fake tui\r\n")
    if args.resume:
        tui.write(b"resumed\r\n")
    if args.mode == "no-prompt":
        frames = b"|/-\\"
        i = 0
        while True:
            tui.write(b"\rloading " + frames[i % 4 : i % 4 + 1])
            i += 1
            time.sleep(0.1)
    if args.mode == "garbage":
        junk = b"\xc0\xc1\xf5\xff\x1b[\x1b]\x07\x1b[?25l\x1bP" + b"q" * 5000 + b"\x1b\\"
        tui.write(junk + b"\r\n")
    tui.write(b"> ")
    while True:
        try:
            ready, _, _ = select.select([0, wake_r], [], [], tui.timeout())
        except InterruptedError:
            ready = []
        if wake_r in ready:
            os.read(wake_r, 512)
        if 0 in ready:
            try:
                data = os.read(0, 65536)
            except OSError:
                return  # the terminal is gone
            if not data:
                return
            tui.keys_in(data)
        tui.step()


if __name__ == "__main__":
    main()
