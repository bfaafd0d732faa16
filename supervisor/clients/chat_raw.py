"""``agent-supervisor chat`` attached raw to a terminal agent (``protocol = "terminal"``).

The person uses the agent's own interface: the chat puts their terminal in raw mode, draws the
agent's screen (the ``terminal.screen`` picture, then each ``terminal.output``), passes their
keys on as they are (``session.input``) and keeps the agent's terminal the size of theirs
(``session.resize``, at the start and on each SIGWINCH). A line typed while no turn runs and
sent with Enter becomes a turn (``agent.prompt``): what was typed is erased from the agent's
input line and the prompt is written as every prompt is, so the turn has an id the stop can
name. One key is the chat's own, :data:`STOP_KEY` (Ctrl-], telnet's escape: no TUI needs it):
it stops the running turn through the ladder and prints the receipt on one line; pressed twice
within :data:`DOUBLE_KEY_S` it detaches. The terminal's mode and the modes the agent set on it
(the alternate screen, mouse reporting, bracketed paste, a hidden cursor) are put back however
the chat ends.

As in ``chat.py``, :class:`RawCore` does no I/O (bytes, events and answers in; bytes to show
and commands out) and :func:`converse_raw` is the shell.
"""

from __future__ import annotations

import base64
import codecs
import math
import os
import signal
import termios
import tty

import trio
from attrs import frozen

from protocols import events as ev
from protocols.terminal import MAX_COLS, MAX_ROWS
from supervisor.clients.chat import (
    STOP_BOUND_S,
    CancelDone,
    CancelFailed,
    ChatBackend,
    ChatError,
    EventsEnded,
    InputEnded,
    PromptAccepted,
    PromptFailed,
    Quit,
    Screen,
    SendCancel,
    SendPrompt,
    Terminate,
    _clean,
    _Console,
    _summary,
    cancel_answer,
    forward_events,
    prompt_answer,
    terminal_mode,
)

__all__ = ["DOUBLE_KEY_S", "STOP_KEY", "RawCore", "converse_raw"]

#: The chat's own key: Ctrl-] (GS), telnet's escape key. Terminal programs leave it alone;
#: Esc and Ctrl-C are the agent's (its own interrupt, its menus), so they pass through.
STOP_KEY = "\x1d"
STOP_KEY_NAME = "Ctrl-]"
#: The stop key twice within this detaches (the first press stops the turn, if one runs).
DOUBLE_KEY_S = 1.0
#: Inputs waiting for the UI loop; senders wait when it is full (the loop never does).
_INBOX_SIZE = 64

_PASTE_START = "\x1b[200~"
_PASTE_END = "\x1b[201~"
#: What erases one character of a TUI's input line: DEL, the Backspace key of every terminal.
_ERASE = "\x7f"
#: Put back on the way out what an agent may have turned on in the person's terminal: styles,
#: the cursor shown, the normal screen, no bracketed paste, no mouse reporting, normal cursor
#: keys and keypad.
RESTORE_MODES = (
    b"\x1b[0m\x1b[?25h\x1b[?1049l\x1b[?2004l"
    b"\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1l\x1b>"
)


# -- inputs and commands ---------------------------------------------------------------------


@frozen
class RawKeys:
    """Bytes the person typed, read at ``at`` on trio's clock."""

    data: bytes
    at: float


@frozen
class Resized:
    """The person's terminal is now ``cols`` x ``rows``."""

    cols: int
    rows: int


@frozen
class InputFailed:
    """Keys or a size the session did not take."""

    message: str


RawInput = (
    RawKeys
    | Resized
    | Screen
    | InputFailed
    | InputEnded
    | Terminate
    | EventsEnded
    | PromptAccepted
    | PromptFailed
    | CancelDone
    | CancelFailed
    | ev.Event
)


@frozen
class SendInput:
    data: str


@frozen
class SendResize:
    cols: int
    rows: int


#: Carried out one after the other, in order: keys and prompts reach the agent as typed.
Ordered = SendInput | SendResize | SendPrompt
RawCommand = Ordered | SendCancel | Quit


# -- the core --------------------------------------------------------------------------------


class RawCore:
    """The raw chat's state, without I/O: ``feed`` inputs, ``take_output`` bytes to show."""

    def __init__(self) -> None:
        self.quitting = False
        self._out: list[bytes] = []
        self._commands: list[RawCommand] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        #: what was typed since the last Enter while no turn ran (None: not known, keys other
        #: than characters and Backspace were typed, so Enter goes to the agent as a key)
        self._line: list[str] | None = []
        self._in_paste = False
        #: the session's running turn, as its events tell
        self._running: str | None = None
        #: our prompt: "" while it is sent, then its turn id until that turn starts or ends
        self._waiting: str | None = None
        self._stop_wanted = False  # the stop key came before our prompt had its id
        self._cancelling: str | None = None
        self._last_stop_key: float | None = None
        #: output up to this seq is in the picture drawn
        self._drawn_to = 0

    def start(self, label: str) -> None:
        self._status(
            f"attached to {label} · keys go to the agent · a line typed and Enter runs as a"
            f" turn · {STOP_KEY_NAME} stops the turn · {STOP_KEY_NAME} twice detaches"
        )

    def take_output(self) -> bytes:
        data = b"".join(self._out)
        self._out.clear()
        return data

    def feed(self, item: RawInput) -> list[RawCommand]:
        if self.quitting:
            return []
        if isinstance(item, RawKeys):
            self._on_keys(self._decoder.decode(item.data), item.at)
        elif isinstance(item, Resized):
            cols, rows = min(max(item.cols, 1), MAX_COLS), min(max(item.rows, 1), MAX_ROWS)
            self._commands.append(SendResize(cols, rows))
        elif isinstance(item, Screen):
            self._out.append(item.data)
            self._drawn_to = item.last_seq
        elif isinstance(item, InputFailed):
            self._status(f"✗ {item.message}")
        elif isinstance(item, InputEnded):
            self._quit(0)  # the terminal hung up: nobody is watching any more
        elif isinstance(item, Terminate):
            self._quit(128 + item.signum)
        elif isinstance(item, EventsEnded):
            self._status("✗ the session's events stopped coming")
            self._quit(1)
        elif isinstance(item, ev.Event):
            self._on_event(item)
        else:
            self._on_result(item)
        commands, self._commands = self._commands, []
        return commands

    # -- keys --------------------------------------------------------------------------------

    @property
    def _busy(self) -> bool:
        return self._running is not None or self._waiting is not None

    def _on_keys(self, text: str, at: float) -> None:
        keys: list[str] = []  # passed on as they are, in one write
        i = 0
        while i < len(text):
            if text[i] == STOP_KEY:
                self._send_keys(keys)
                self._stop_key(at)
                i += 1
                continue
            if self._busy:
                keys.append(text[i])
                i += 1
                continue
            # No turn runs: follow the line being typed, so that Enter can make it a turn.
            for mark, pasting in ((_PASTE_START, True), (_PASTE_END, False)):
                if text.startswith(mark, i):
                    self._in_paste = pasting
                    keys.append(mark)
                    i += len(mark)
                    break
            else:
                char = text[i]
                i += 1
                if char == "\r" and not self._in_paste and self._line:
                    self._send_keys(keys)
                    self._submit("".join(self._line))
                    continue
                self._follow(char)
                keys.append(char)
        self._send_keys(keys)

    def _follow(self, char: str) -> None:
        line = self._line
        if self._in_paste:
            if line is not None:
                line.append(char)
        elif char == "\r":
            self._line = []  # an empty line, or one not known: the agent's to take
        elif char in ("\x7f", "\b"):
            if line:
                line.pop()
        elif char < " " or char == "\x1b":
            self._line = None  # an arrow, a completion, history: the line is the agent's now
        elif line is not None:
            line.append(char)

    def _send_keys(self, keys: list[str]) -> None:
        if keys:
            self._commands.append(SendInput("".join(keys)))
            keys.clear()

    def _submit(self, text: str) -> None:
        """The line typed becomes a turn: erased from the agent's input line, then written
        as a prompt (so the session knows the turn and a stop can name it)."""
        self._line = []
        self._waiting = ""
        self._stop_wanted = False
        self._commands.append(SendInput(_ERASE * len(text)))
        self._commands.append(SendPrompt(text))

    def _stop_key(self, at: float) -> None:
        last, self._last_stop_key = self._last_stop_key, at
        if last is not None and at - last < DOUBLE_KEY_S:
            self._quit(0)
            return
        target = self._running or self._waiting
        if self._cancelling is not None:
            self._status(f"■ stopping… ({STOP_KEY_NAME} again detaches)")
        elif target:
            self._cancel(target)
        elif self._waiting == "":
            self._stop_wanted = True  # sent once the prompt has its turn id
            self._status(f"■ stopping… ({STOP_KEY_NAME} again detaches)")
        else:
            self._status(f"no turn is running · {STOP_KEY_NAME} again detaches")

    def _cancel(self, turn_id: str) -> None:
        self._cancelling = turn_id
        self._stop_wanted = False
        self._status(f"■ stopping {_clean(turn_id)}… ({STOP_KEY_NAME} again detaches)")
        self._commands.append(SendCancel(turn_id))

    def _quit(self, code: int) -> None:
        self.quitting = True
        self._commands.append(Quit(code))

    # -- answers and events --------------------------------------------------------------------

    def _on_result(self, item: PromptAccepted | PromptFailed | CancelDone | CancelFailed) -> None:
        if isinstance(item, PromptAccepted):
            if self._waiting == "":
                self._waiting = item.turn_id
                if self._stop_wanted:
                    self._cancel(item.turn_id)
        elif isinstance(item, PromptFailed):
            self._waiting = None
            self._status(f"✗ {item.message}")
        elif isinstance(item, CancelDone):
            self._cancelling = None
            self._status(f"■ {item.receipt.summary()}")
        else:
            self._cancelling = None
            self._status(f"✗ stop failed: {item.message} ({STOP_KEY_NAME} tries again)")

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.TerminalOutput):
            if event.seq > self._drawn_to:
                self._out.append(base64.b64decode(event.data))
        elif isinstance(event, ev.TurnStarted):
            self._running = event.turn_id
            if self._waiting == event.turn_id:
                self._waiting = None
        elif isinstance(event, ev.TurnEnded):
            if self._waiting == event.turn_id:
                self._waiting = None
            if self._running == event.turn_id:
                self._running = None
                self._line = []
            if event.turn_id == self._cancelling or event.stop_reason == "dropped":
                return  # (our stop's receipt is its answer)
            if event.receipt is not None:  # stopped by someone else, or the watchdog
                self._status(f"■ {_summary(event.receipt)}")
            elif event.outcome == "failed":
                self._status("✗ turn failed" + (f": {_clean(event.error)}" if event.error else ""))
        elif isinstance(event, ev.SessionState):
            if event.state == "failed":
                self._status(f"✗ session failed: {_clean(event.detail or 'no detail')}")
                self._quit(1)
            elif event.state == "stopped":
                self._status("✗ the session was stopped")
                self._quit(1)
        elif isinstance(event, ev.AgentExited) and not event.expected:
            how = f"code {event.exit_code}" if event.exit_code is not None else "a signal"
            self._status(f"agent exited unexpectedly ({how})")
        elif isinstance(event, ev.StreamGap):
            lost = event.to_seq - event.from_seq + 1
            self._status(f"{lost} event(s) lost: the screen may be out of date")

    def _status(self, text: str) -> None:
        """A line of the chat's own, among what the agent draws (raw mode: CR LF)."""
        self._out.append(f"\r\n{text}\r\n".encode())


# -- the shell -------------------------------------------------------------------------------


def _raw(fd: int) -> None:
    """Raw mode: no echo, no line editing, no signals from keys (Ctrl-C and Ctrl-Z are the
    agent's)."""
    tty.setraw(fd, termios.TCSANOW)


def _size(*fds: int) -> Resized | None:
    for fd in fds:
        try:
            cols, rows = os.get_terminal_size(fd)
        except OSError:
            continue
        if cols and rows:
            return Resized(cols, rows)
    return None


async def converse_raw(backend: ChatBackend, console: _Console, stdout_fd: int) -> int:
    """The raw chat's loop; returns the exit code. The terminal (``console``'s stdin) is in raw
    mode meanwhile; the modes the agent set on it are put back on the way out."""
    core = RawCore()
    send, receive = trio.open_memory_channel[RawInput](_INBOX_SIZE)
    # A person's keys: never dropped, and never holding the UI loop back.
    ordered_send, ordered_receive = trio.open_memory_channel[Ordered](math.inf)
    code = 0
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH)
    with (
        trio.open_signal_receiver(*signals) as received,
        terminal_mode(console.stdin_fd, _raw),
    ):
        try:
            core.start(backend.label)
            await console.write_bytes(core.take_output())
            async with trio.open_nursery() as nursery:

                async def follow_signals() -> None:
                    async for signum in received:
                        if signum == signal.SIGWINCH:
                            size = _size(stdout_fd, console.stdin_fd)
                            if size is not None:
                                await send.send(size)
                        else:
                            await send.send(Terminate(signum))

                async def read_keys() -> None:
                    while data := await console.read_raw():
                        await send.send(RawKeys(data, trio.current_time()))
                    await send.send(InputEnded())

                async def write_in_order() -> None:
                    async for command in ordered_receive:
                        await _perform(backend, command, send)

                size = _size(stdout_fd, console.stdin_fd)
                if size is not None:
                    ordered_send.send_nowait(SendResize(size.cols, size.rows))
                nursery.start_soon(follow_signals)
                nursery.start_soon(forward_events, backend.terminal_events(), send)
                nursery.start_soon(read_keys)
                nursery.start_soon(write_in_order)
                async for item in receive:
                    commands = core.feed(item)
                    await console.write_bytes(core.take_output())
                    for command in commands:
                        if isinstance(command, Quit):
                            code = command.code
                        elif isinstance(command, SendCancel):
                            nursery.start_soon(_cancel, backend, command.turn_id, send)
                        else:
                            ordered_send.send_nowait(command)
                    if core.quitting:
                        break
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_BOUND_S):
                await console.write_bytes(RESTORE_MODES + b"\r\n")
    return code


async def _perform(
    backend: ChatBackend, command: Ordered, send: trio.MemorySendChannel[RawInput]
) -> None:
    result: RawInput | None = None
    try:
        if isinstance(command, SendInput):
            await backend.input(command.data)
        elif isinstance(command, SendResize):
            await backend.resize(command.cols, command.rows)
        else:
            result = await prompt_answer(backend, command.text)
    except ChatError as exc:
        what = "keys" if isinstance(command, SendInput) else "the new size"
        result = InputFailed(f"{what} not taken: {exc}")
    if result is not None:
        await send.send(result)


async def _cancel(
    backend: ChatBackend, turn_id: str, send: trio.MemorySendChannel[RawInput]
) -> None:
    await send.send(await cancel_answer(backend, turn_id))
