"""An agent's own interactive interface (a TUI) in a pseudo-terminal, as a sans-IO machine.

Such an agent speaks no protocol: it draws a screen. The machine keeps that screen (``pyte``, a
VT100/xterm emulator, fed the bytes as read) and reads it to tell where the conversation stands;
it never reads the raw stream for that. What comes and goes, as the link
(``supervisor/agents/pty_link.py``) and this machine exchange it:

- from the link: ``{"output": bytes, "now": t}``, each read of the terminal, and
  ``{"tick": True, "now": t}`` when a wake-up the machine asked for comes due. ``now`` is the
  link's clock (trio's); the machine has no clock of its own.
- to the link: ``{"keys": text}`` (written to the terminal as its UTF-8 bytes, nothing added),
  ``{"resize": [cols, rows]}`` and ``{"wake_at": t}`` (post a tick at ``t``; a later one
  replaces it).

**A turn ends** when the screen shows ``prompt_pattern`` (a regular expression searched,
multiline, in the screen's text: its lines, trailing blanks removed, joined by newlines) and has
not changed for ``idle_s``, *and* it changed after the keys that started the turn (the prompt,
or the interrupt) were written: a screen that shows the pattern but never answers the keys says
nothing about them. Then the turn is ``end_turn``, or ``cancelled`` after an interrupt; a
screen that never settles is the stall watchdog's (after a prompt) or the grace's (after an
interrupt) to end. The session is established once ``start_pattern`` (default: the prompt
pattern) shows, stable, the same way: a TUI that never shows it meets ``start_timeout_s``. A
resumed start waits for ``resume_pattern`` instead where one is set: a TUI that draws its input
box before it has loaded the conversation it resumes (Gemini CLI) ignores or loses a prompt
typed meanwhile, and its screen tells the difference only by the conversation drawn.

**A prompt** is written as a bracketed paste (``ESC [200~ text ESC [201~``, so a TUI takes its
newlines as text, not as Enter) followed by Enter (``\\r``), or (``submit = "type"``) as typed
keys and Enter. **The interrupt** is ``interrupt``: keys written at once, in order (Escape for
Claude Code, Codex and Gemini CLI; Ctrl-C for aider).

**Events**: every read becomes a ``terminal.output`` event, the bytes as read in base64, enough
for a terminal view to draw the same screen. While a turn runs, the lines that appear below the
line the prompt was written on become ``message.delta`` text, each once the cursor has left it
(a line the TUI is still drawing is not finished); that is what the screen tells of the
answer, and no more: a full-screen TUI that redraws in place gives less. Queries the screen
answers as a terminal does (the cursor position, device attributes) go back to the agent as
keys: some TUIs wait for them.

**Bounds**: the screen is ``cols`` x ``rows`` cells whatever comes, and the size is bounded
(:data:`MAX_COLS`, :data:`MAX_ROWS`); the emulator's parser keeps an escape sequence's
parameters until it ends, so a sequence longer than :data:`MAX_SEQUENCE_CHARS` is dropped and the
parser reset. Invalid UTF-8 becomes U+FFFD, across reads. A late subscriber's picture of the
screen (:meth:`TerminalClient.snapshot`) is bounded by :data:`MAX_SNAPSHOT_BYTES`.
"""

from __future__ import annotations

import base64
import codecs
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from attrs import field, frozen

from protocols import events as ev
from protocols.content import Part
from protocols.machine import (
    AgentProtocol,
    Output,
    SessionEstablished,
    Step,
    TerminalScreen,
    TurnFinished,
    check_answer,
)
from protocols.mcp import McpServer

if TYPE_CHECKING:
    from protocols._screen import Screen, Stream

__all__ = [
    "DEFAULT_COLS",
    "DEFAULT_IDLE_S",
    "DEFAULT_INTERRUPT",
    "DEFAULT_PROMPT_PATTERN",
    "DEFAULT_ROWS",
    "MAX_COLS",
    "MAX_ROWS",
    "MAX_SEQUENCE_CHARS",
    "MAX_SNAPSHOT_BYTES",
    "MAX_SUBMIT_DELAY_S",
    "SUBMIT_MODES",
    "TERMINAL_SESSION",
    "TerminalClient",
    "TerminalSettings",
]

#: The size a terminal agent starts with: wide enough that TUIs do not wrap their own lines,
#: and what kandev's passthrough mode and most terminal windows use.
DEFAULT_COLS: Final = 120
DEFAULT_ROWS: Final = 40
#: The largest size a terminal may be given: the screen holds every cell (a few hundred bytes
#: each in the emulator), so this bounds its memory (~500 x 200 cells, tens of MB at worst);
#: larger than any screen a person uses.
MAX_COLS: Final = 500
MAX_ROWS: Final = 200
#: A line that is only a prompt character (``>``, ``❯``, ``›``), maybe inside a box's borders:
#: what Claude Code, Codex, Gemini CLI and aider draw where they take input.
DEFAULT_PROMPT_PATTERN: Final = r"^[\s│┃|]*[>❯›][ \t\u00a0]?.{0,200}$"
#: How long the screen must stay unchanged, the prompt showing, for a turn to count as ended.
#: TUIs redraw a spinner or a timer several times a second while they work, so a second of
#: stillness is an idle TUI; shorter risks taking the pause before a model's first token for
#: the end.
DEFAULT_IDLE_S: Final = 1.0
#: Escape: the key that stops a turn in Claude Code, Codex and Gemini CLI.
DEFAULT_INTERRUPT: Final = ("\x1b",)
#: How a prompt is written: ``paste`` (bracketed paste, then Enter) or ``type`` (the keys, then
#: Enter: for programs that do not understand bracketed paste; a newline in the text is then
#: an Enter).
SUBMIT_MODES: Final = ("paste", "type")
#: The longest pause between a prompt's text and its Enter (``submit_delay_s``): a TUI tells a
#: paste from typing within tens of milliseconds; more than this is a mistake.
MAX_SUBMIT_DELAY_S: Final = 5.0
#: With ``submit_delay_s``, the pause runs from the screen's first change after the text (the
#: TUI read it): a TUI that is busy when the text comes (starting, on a loaded machine) reads
#: the text and an Enter sent meanwhile at once, as one paste. A screen that shows no change
#: gets its Enter this long after the text, plus the pause.
ECHO_WAIT_S: Final = 2.0
#: A terminal agent has no session id of its own; this stands for "the conversation it ran",
#: which its ``resume_command`` restores after a kill.
TERMINAL_SESSION: Final = "terminal"
#: The longest escape sequence kept: real ones are a few dozen characters (a window title, a
#: hyperlink's URL: a few hundred). Past this the emulator's parser drops it.
MAX_SEQUENCE_CHARS: Final = 8192
#: The emulator is fed this many characters at a time, so that a sequence over the bound is
#: caught within this much more.
_FEED_CHARS: Final = 4096
#: The most a picture of the screen takes (one frame to a late subscriber). Its text alone
#: always fits: every cell of the largest screen as four bytes of UTF-8 and each row's cursor
#: move is ~400 KB. Colours and styles come with it while they fit too (a 120 x 40 screen
#: whose every cell changes style is ~250 KB); past that the picture is its text.
MAX_SNAPSHOT_BYTES: Final = 1024 * 1024
#: Bracketed paste (xterm's mode 2004): what a terminal wraps pasted text in.
_PASTE_START: Final = "\x1b[200~"
_PASTE_END: Final = "\x1b[201~"
_ENTER: Final = "\r"


@frozen(kw_only=True)
class TerminalSettings:
    """A terminal agent's settings (its ``[agents.NAME]`` table: ``design/terminal.md``)."""

    prompt_pattern: str = DEFAULT_PROMPT_PATTERN
    idle_s: float = DEFAULT_IDLE_S
    interrupt: tuple[str, ...] = field(default=DEFAULT_INTERRUPT, converter=tuple)
    submit: str = "paste"
    #: seconds between the text and its Enter: a TUI that takes input arriving at once as one
    #: paste (Gemini CLI) takes an Enter in it for a newline. 0: Enter with the text.
    submit_delay_s: float = 0.0
    #: what the first screen shows once the agent takes input; None: ``prompt_pattern``
    start_pattern: str | None = None
    #: what the first screen of a resumed start shows once the agent takes input (the
    #: conversation it resumed drawn); None: ``start_pattern``
    resume_pattern: str | None = None
    cols: int = DEFAULT_COLS
    rows: int = DEFAULT_ROWS

    def check(self) -> None:
        """Raise ValueError naming the first setting that cannot be used."""
        for name in ("prompt_pattern", "start_pattern", "resume_pattern"):
            pattern = getattr(self, name)
            if pattern is None:
                continue
            try:
                re.compile(pattern, re.MULTILINE)
            except re.error as exc:
                raise ValueError(f"'{name}' is not a regular expression: {exc}") from None
        if not self.idle_s > 0:
            raise ValueError(f"'idle_s' must be a number of seconds > 0, not {self.idle_s!r}")
        if not self.interrupt or not all(isinstance(k, str) and k for k in self.interrupt):
            raise ValueError("'interrupt' must be a list of non-empty strings (keys)")
        if not 0 <= self.submit_delay_s <= MAX_SUBMIT_DELAY_S:
            raise ValueError(
                f"'submit_delay_s' must be a number of seconds from 0 to {MAX_SUBMIT_DELAY_S}"
            )
        if self.submit not in SUBMIT_MODES:
            raise ValueError(f"'submit' must be one of {', '.join(SUBMIT_MODES)}")
        check_size(self.cols, self.rows)


def check_size(cols: Any, rows: Any) -> None:
    """Raise ValueError unless ``cols`` x ``rows`` is a terminal size we take."""
    for name, value, top in (("cols", cols, MAX_COLS), ("rows", rows, MAX_ROWS)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"'{name}' must be a whole number from 1 to {top}, not {value!r}")


class TerminalClient(AgentProtocol):
    """Our side of one agent running in a pseudo-terminal."""

    name: ClassVar[str] = "terminal"
    transport: ClassVar[str] = "terminal"
    #: a TUI takes MCP servers in its own configuration, not from us
    mcp_transports: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, settings: TerminalSettings | None = None) -> None:
        self.settings = settings = settings or TerminalSettings()
        settings.check()
        self._prompt = re.compile(settings.prompt_pattern, re.MULTILINE)
        self._start = re.compile(settings.start_pattern or settings.prompt_pattern, re.MULTILINE)
        from protocols._screen import Screen, Stream  # pyte: ~25 ms, for terminal agents only

        self._screen: Screen = Screen(settings.cols, settings.rows)
        self._stream: Stream = Stream(self._screen)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        #: the screen's lines, trailing blanks removed (kept up to date from pyte's dirty set)
        self._lines = [""] * settings.rows
        self._text = ""
        #: characters fed while the parser was inside one escape sequence
        self._sequence_chars = 0
        self._phase = "idle"  # idle (before start), starting, ready, closed
        self._resume: str | None = None
        self._turn_id: str | None = None
        self._interrupted = False
        #: when the screen last changed, on the link's clock (None: not since the last keys)
        self._changed_at: float | None = None
        #: the screen changed after the last keys that started or stopped a turn
        self._answered = False
        #: the wake-up asked of the link and not come yet
        self._wake_at: float | None = None
        #: a prompt's Enter waits (``submit_delay_s``): 0.0 until the link's next frame gives
        #: the time, then when it is due; None: none waits
        self._enter_at: float | None = None
        #: the screen changed since the waiting Enter's text went (its pause runs from then)
        self._echoed = False

    @classmethod
    def configured(cls, settings: object | None) -> TerminalClient:
        if settings is not None and not isinstance(settings, TerminalSettings):
            raise TypeError(f"terminal settings expected, got {type(settings).__name__}")
        return cls(settings)

    # -- calls from the actor -------------------------------------------------------------

    def start(
        self, *, cwd: str, resume: str | None = None, mcp_servers: Sequence[McpServer] = ()
    ) -> Step:
        # cwd: the launcher starts the program there. The session counts as established once
        # the first screen shows the start pattern, stable (_settle).
        if self._phase != "idle":
            raise RuntimeError("start() called twice")
        self._phase = "starting"
        self._resume = resume
        if resume is not None and self.settings.resume_pattern is not None:
            self._start = re.compile(self.settings.resume_pattern, re.MULTILINE)
        return Step()

    def prompt(self, turn_id: str, text: str, parts: Sequence[Part] = ()) -> Step:
        if self._phase != "ready" or self._turn_id is not None:
            raise RuntimeError(f"prompt() while {self._phase} with turn {self._turn_id}")
        self._turn_id = turn_id
        self._interrupted = False
        self._keys_written()
        screen = self._screen
        screen.following = True
        screen.prompt_row = screen.told_row = screen.cursor.y + 1
        if self.settings.submit == "paste":
            keys = f"{_PASTE_START}{_no_paste_end(text)}{_PASTE_END}"
        else:
            keys = text.replace("\r\n", _ENTER).replace("\n", _ENTER)
        if not self.settings.submit_delay_s:
            return Step(send=[{"keys": keys + _ENTER}])
        # The machine has no clock: a wake-up at once tells the time the text went, and
        # the Enter is due submit_delay_s after that (_submit).
        self._enter_at = 0.0
        self._echoed = False
        self._wake_at = 0.0
        return Step(send=[{"keys": keys}, {"wake_at": 0.0}])

    def cancel(self) -> Step:
        if self._turn_id is None or self._interrupted:
            return Step()
        self._interrupted = True
        self._keys_written()
        return Step(send=[{"keys": key} for key in self.settings.interrupt])

    def input(self, data: str) -> Step:
        """A person's keys, written as they are (answering the TUI's own menu, say)."""
        if self._phase == "closed":
            return Step()
        return Step(send=[{"keys": data}])

    def resize(self, cols: int, rows: int) -> Step:
        """The terminal is now ``cols`` x ``rows``: the screen and the pseudo-terminal (the
        agent gets SIGWINCH and redraws)."""
        check_size(cols, rows)
        self._screen.resize(rows, cols)
        self._lines = [self._screen.row_text(y) for y in range(rows)]
        self._screen.dirty.clear()
        self._text = "\n".join(self._lines)
        self._screen.prompt_row = min(self._screen.prompt_row, rows)
        self._screen.told_row = min(self._screen.told_row, rows)
        return Step(send=[{"resize": [cols, rows]}])

    def close(self) -> Step:
        self._phase = "closed"
        return Step()

    def respond_permission(self, request_id: str, option_id: str | None) -> Step:
        check_answer(request_id, None, option_id)  # a TUI asks on its screen: session.input
        return Step()

    def cancel_permissions(self) -> Step:
        return Step()

    @property
    def pending_permissions(self) -> list[str]:
        return []

    @property
    def agent_session_id(self) -> str | None:
        return TERMINAL_SESSION

    @property
    def screen_text(self) -> str:
        """The screen's text as turn detection reads it."""
        return self._text

    @property
    def size(self) -> tuple[int, int]:
        return int(self._screen.columns), int(self._screen.lines)

    def snapshot(self) -> bytes:
        """The screen as bytes a terminal draws it from (cleared, each row with its colours
        and styles, the cursor put back), for a view that joins late: at most
        :data:`MAX_SNAPSHOT_BYTES`."""
        return self._screen.picture(MAX_SNAPSHOT_BYTES)

    def screen(self) -> TerminalScreen:
        cols, rows = self.size
        return TerminalScreen(data=self.snapshot(), cols=cols, rows=rows)

    # -- what the link says -----------------------------------------------------------------

    def receive(self, message: dict[str, Any]) -> Step:
        now = message.get("now")
        if not isinstance(now, int | float):
            return Step(events=[ev.AgentUnparsed(raw=_shown(message))])
        data = message.get("output")
        if isinstance(data, bytes):
            return self._output(data, float(now))
        if message.get("tick") is True:
            if self._wake_at is not None and now >= self._wake_at:
                self._wake_at = None
            step = Step()
            self._submit(float(now), step)
            self._settle(float(now), step)
            return step
        return Step(events=[ev.AgentUnparsed(raw=_shown(message))])

    def _output(self, data: bytes, now: float) -> Step:
        step = Step(events=[ev.TerminalOutput(data=base64.b64encode(data).decode("ascii"))])
        if self._phase == "closed":
            return step
        screen = self._screen
        self._feed(self._decoder.decode(data), step)
        if screen.answers:
            step.send.extend({"keys": answer} for answer in screen.answers)
            screen.answers.clear()
        if screen.dirty:
            for y in screen.dirty:
                if y < len(self._lines):
                    self._lines[y] = screen.row_text(y)
            screen.dirty.clear()
            text = "\n".join(self._lines)
            if text != self._text:
                self._text = text
                self._changed_at = now
                self._answered = True
        if self._turn_id is not None:
            self._tell_lines(step)
        self._submit(now, step)
        self._settle(now, step)
        return step

    def _submit(self, now: float, step: Step) -> None:
        """The waiting Enter of a prompt, once due: ``submit_delay_s`` after the screen first
        changed since the text went, at the latest :data:`ECHO_WAIT_S` after the text."""
        if self._enter_at is None or self._turn_id is None or self._interrupted:
            self._enter_at = None
            return
        delay = self.settings.submit_delay_s
        if not self._enter_at:  # the first frame since the text: about when it went
            self._enter_at = now + ECHO_WAIT_S + delay
        if self._answered and not self._echoed:  # _answered: changed since the keys
            self._echoed = True
            self._enter_at = min(self._enter_at, now + delay)
        if now < self._enter_at:
            self._wake(self._enter_at, now, step)
            return
        self._enter_at = None
        self._keys_written()
        step.send.append({"keys": _ENTER})

    def _wake(self, due: float, now: float, step: Step) -> None:
        """Ask the link for a tick at ``due``, unless one comes by then anyway (one that was
        due already comes at once: it is replaced)."""
        if self._wake_at is None or due < self._wake_at or self._wake_at <= now:
            self._wake_at = due
            step.send.append({"wake_at": due})

    def _feed(self, text: str, step: Step) -> None:
        """Feed the emulator, a slice at a time, dropping an escape sequence over the bound."""
        stream = self._stream
        for at in range(0, len(text), _FEED_CHARS):
            piece = text[at : at + _FEED_CHARS]
            try:
                stream.feed(piece)
            except Exception as exc:  # pyte resets its parser; the screen stays as it was
                step.events.append(
                    ev.ErrorEvent(code="terminal_garbage", message=f"escape sequence: {exc!r}")
                )
            if stream.in_sequence:
                self._sequence_chars += len(piece)
                if self._sequence_chars > MAX_SEQUENCE_CHARS:
                    stream.reset_parser()
                    self._sequence_chars = 0
                    step.events.append(
                        ev.ErrorEvent(
                            code="terminal_garbage",
                            message=f"an escape sequence over {MAX_SEQUENCE_CHARS} characters"
                            " was dropped",
                        )
                    )
            else:
                self._sequence_chars = 0

    def _tell_lines(self, step: Step) -> None:
        """The lines below the prompt line the cursor has left, as the turn's text."""
        screen = self._screen
        below = screen.cursor.y
        start = max(screen.told_row, screen.prompt_row)
        lines = screen.scrolled_off
        if below > start:
            lines += self._lines[start:below]
            screen.told_row = below
        if lines:
            text = "".join(line + "\n" for line in lines)
            lines.clear()
            step.events.append(ev.MessageDelta(turn_id=self._turn_id, text=text))

    def _keys_written(self) -> None:
        self._answered = False
        self._changed_at = None

    def _settle(self, now: float, step: Step) -> None:
        """End the start or the turn if the screen says so; else ask to be woken when it
        may."""
        if self._phase == "starting":
            pattern = self._start
        elif self._phase == "ready" and self._turn_id is not None and self._answered:
            pattern = self._prompt
        else:
            return
        changed = self._changed_at
        if changed is None or self._enter_at is not None or pattern.search(self._text) is None:
            return
        due = changed + self.settings.idle_s
        if now < due:
            self._wake(due, now, step)
            return
        if self._phase == "starting":
            self._phase = "ready"
            resumed = True if self._resume is not None else None
            step.events.append(SessionEstablished(self._resume, resumed=resumed))
            return
        turn, self._turn_id = self._turn_id, None
        assert turn is not None
        self._keys_written()
        self._screen.following = False
        finished: Output
        if self._interrupted:
            finished = TurnFinished(turn, "cancelled", interrupted=True)
        else:
            finished = TurnFinished(turn, "end_turn", interrupted=False)
        step.events.append(finished)


def _no_paste_end(text: str) -> str:
    """The text, unable to end the paste early: a pasted ``ESC [201~`` would let the rest be
    taken as keys (what terminals guard against too)."""
    return text.replace(_PASTE_END, "")


def _shown(message: dict[str, Any]) -> dict[str, Any]:
    """A message as an ``agent.unparsed`` event carries it (bytes cannot go on the wire)."""
    return {k: (repr(v[:200]) if isinstance(v, bytes) else v) for k, v in message.items()}
