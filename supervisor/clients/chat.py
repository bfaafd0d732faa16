"""``agent-supervisor chat``: a terminal chat with one agent session, and a real Stop key.

Three layers, so the embedded and the remote chat share every line of the user interface:

- :class:`KeyDecoder` and :class:`ChatCore` do no I/O. The decoder turns terminal bytes into
  keys; the core turns inputs (keys or lines, signals, session events, answers of the backend)
  into text to show and :data:`Command` values to carry out. Tests feed them and compare.
- A :class:`ChatBackend` runs the commands: :class:`EmbeddedBackend` on a session of an
  in-process supervisor, :class:`RemoteBackend` on a gateway session over WebSocket.
- :func:`run_chat` is the shell: it puts the terminal in cbreak mode while the chat runs (and
  always puts it back), reads stdin with trio, owns SIGINT, and loops ``input -> core ->
  output + commands``. Backend calls run as child tasks that post their answer back as an
  input, so a stop that takes a whole grace window never freezes the screen.

Keys: Enter sends the line; Esc or Ctrl-C stops the running turn and shows the receipt; a
second Ctrl-C within a second quits; Ctrl-D or ``/quit`` on an empty line quits; ``y``/``n``
answer a permission request. Typing while a turn runs writes a *steer*: Enter sends it to the
running turn (``session.steer``: joined natively where the agent can, else the turn makes way),
and the chat says which way it went; the keys are not echoed meanwhile, so the agent's output
stays whole. When stdin is not a terminal the chat reads plain lines instead (``/stop`` stands
for Esc, ``/steer TEXT`` steers), so it can be scripted. ``/rewind [TURN]`` puts the working
directory's files back as they were before a turn (the last one by default; ``design/
checkpoints.md``), and says what it restored and how to undo it.
"""

from __future__ import annotations

import base64
import codecs
import os
import re
import signal
import termios
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import cattrs
import trio
from attrs import define, frozen
from trio_websocket import ConnectionClosed

from protocols import events as ev
from supervisor.agents.statefile import default_state_dir
from supervisor.client import CONNECT_ERRORS, GatewayClient, GatewayError, connect, not_connected
from supervisor.config import builtin_agents, load_agents
from supervisor.errors import SupervisorError
from supervisor.receipt import CancelReceipt
from supervisor.remote.hosts import load_hosts
from supervisor.remote.session import RemoteSession
from supervisor.runtime.session import Session, Subscription
from supervisor.steering import SteerResult
from supervisor.supervisor import AnySession, open_supervisor
from supervisor.wire.codec import converter, known_event

E = TypeVar("E")

__all__ = [
    "ChatBackend",
    "ChatCore",
    "ChatError",
    "EmbeddedBackend",
    "Key",
    "KeyDecoder",
    "RemoteBackend",
    "join_remote",
    "open_embedded",
    "open_remote",
    "run_chat",
]

#: How long a lone ESC byte waits for the rest of an escape sequence before it counts as the
#: Esc key. Terminals write a whole sequence (arrow keys: ``ESC [ A``) at once, so the wait
#: only matters over slow links; vim's ``ttimeoutlen`` is 100 ms, tmux's ``escape-time`` 10 ms
#: (3.5+). 50 ms feels instant and still joins a sequence split across two reads.
ESC_TIMEOUT_S = 0.05
#: A second Ctrl-C within this window quits; the first one only stops the turn.
DOUBLE_INTERRUPT_S = 1.0
#: Bound on stopping the session on the way out (the supervisor's own bound per session).
STOP_BOUND_S = 10.0
#: For a gateway to replay a joined session's history (``--session``): at most 10,000 events
#: in memory and more from its store, well under a second on loopback.
HISTORY_BOUND_S = 30.0
#: Inputs waiting for the UI loop; senders wait when it is full (the loop never does).
_INBOX_SIZE = 64

# -- keys ----------------------------------------------------------------------------------

CHAR = "char"
ENTER = "enter"
BACKSPACE = "backspace"
ESC = "esc"
CTRL_C = "ctrl-c"
CTRL_D = "ctrl-d"
CTRL_U = "ctrl-u"

_CONTROL_KEYS = {
    0x0D: ENTER,
    0x0A: ENTER,
    0x7F: BACKSPACE,
    0x08: BACKSPACE,
    0x03: CTRL_C,
    0x04: CTRL_D,
    0x15: CTRL_U,
}


@frozen
class Key:
    """One key press: ``name`` is one of the constants above; ``char`` is set for CHAR."""

    name: str
    char: str = ""


class KeyDecoder:
    """Terminal bytes (cbreak mode) to keys, without I/O.

    Escape sequences (arrows, function keys, bracketed-paste marks) are swallowed whole. A lone
    ESC at the end of the input is held (:attr:`escape_pending`): the caller waits
    :data:`ESC_TIMEOUT_S` for more bytes and calls :meth:`flush` if none come.
    """

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._state = "plain"  # plain | esc | csi | ss3

    @property
    def escape_pending(self) -> bool:
        return self._state == "esc"

    def feed(self, data: bytes) -> list[Key]:
        keys: list[Key] = []
        for byte in data:
            if self._state == "csi":
                if 0x40 <= byte <= 0x7E:  # the final byte of a CSI sequence
                    self._state = "plain"
                continue
            if self._state == "ss3":
                self._state = "plain"
                continue
            if self._state == "esc":
                self._state = "plain"
                if byte == 0x5B:  # ESC [
                    self._state = "csi"
                    continue
                if byte == 0x4F:  # ESC O
                    self._state = "ss3"
                    continue
                keys.append(Key(ESC))  # Alt+x arrives as ESC x: an Esc, then the x
            key = self._plain(byte)
            if key is not None:
                keys.append(key)
        return keys

    def flush(self) -> list[Key]:
        """No more bytes came: a held ESC is the Esc key; a cut-off sequence is dropped."""
        pending = self._state == "esc"
        self._state = "plain"
        return [Key(ESC)] if pending else []

    def _plain(self, byte: int) -> Key | None:
        if byte == 0x1B:
            self._state = "esc"
            return None
        name = _CONTROL_KEYS.get(byte)
        if name is not None:
            return Key(name)
        if byte < 0x20:
            return None  # other control keys do nothing
        text = self._text.decode(bytes([byte]))
        return Key(CHAR, text) if text else None


# -- inputs and commands of the core ---------------------------------------------------------


@frozen
class Line:
    """A line of stdin when it is not a terminal."""

    text: str


@frozen
class InputEnded:
    """End of stdin (or the terminal hung up)."""


@frozen
class Interrupt:
    """Ctrl-C (SIGINT) at ``at`` on trio's clock."""

    at: float


@frozen
class Terminate:
    """SIGTERM or SIGHUP: quit now, cleanly."""

    signum: int


@frozen
class EventsEnded:
    """The session's event stream ended (session gone, connection lost)."""


@frozen
class PromptAccepted:
    turn_id: str


@frozen
class PromptFailed:
    message: str


@frozen
class CancelDone:
    receipt: CancelReceipt


@frozen
class CancelFailed:
    message: str


@frozen
class PermissionFailed:
    message: str


@frozen
class SteerDone:
    result: SteerResult


@frozen
class SteerFailed:
    message: str


@frozen
class RewindDone:
    """``session.rewind``'s answer: ``turn_id``, ``restored``, ``not_restored``, ``undo``."""

    result: dict[str, Any]


@frozen
class RewindFailed:
    message: str


@frozen
class Screen:
    """A terminal agent's screen as a subscribe brought it (``terminal.screen``): drawn from
    ``data``, as it stood after event ``last_seq`` (``chat_raw.py`` draws it)."""

    data: bytes
    last_seq: int


Input = (
    Key
    | Line
    | InputEnded
    | Interrupt
    | Terminate
    | EventsEnded
    | PromptAccepted
    | PromptFailed
    | CancelDone
    | CancelFailed
    | PermissionFailed
    | SteerDone
    | SteerFailed
    | RewindDone
    | RewindFailed
    | ev.Event
)


@frozen
class SendPrompt:
    text: str


@frozen
class SendCancel:
    turn_id: str


@frozen
class SendSteer:
    text: str


@frozen
class SendPermission:
    request_id: str
    option_id: str | None  # None: answer "cancelled"


@frozen
class SendRewind:
    turn_id: str


@frozen
class Quit:
    code: int


Command = SendPrompt | SendCancel | SendSteer | SendPermission | SendRewind | Quit

# -- the core --------------------------------------------------------------------------------

#: C0 (but tab and newline), DEL and C1 controls drive the terminal; the bidi embeddings,
#: overrides and isolates reorder what follows on screen (``supervisor/labels.py`` says why).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _clean(text: str) -> str:
    """Text from the wire without control characters or bidi controls: it must not drive
    our terminal, nor make one line read as another."""
    return _UNSAFE.sub("", text)


@define
class _TurnView:
    """What the chat knows of the turn it started."""

    text: str
    turn_id: str | None = None
    accepted: bool = False
    ended: ev.TurnEnded | None = None
    stop_requested: bool = False
    cancel_sent: bool = False
    cancel_settled: bool = False
    receipt: CancelReceipt | None = None


class ChatCore:
    """The chat's state and rendering, without I/O: ``feed`` inputs, ``take_output`` text.

    ``interactive`` means keys from a terminal (line editing, prompt marker, y/n keys);
    otherwise whole lines arrive and lines typed during a turn wait for it to end, except
    ``/stop``, ``/quit`` and the answer to a permission request. There is one turn at a time.
    """

    def __init__(self, *, interactive: bool, color: bool) -> None:
        self.interactive = interactive
        self.color = color
        self.quitting = False
        self._out: list[str] = []
        self._commands: list[Command] = []
        self._buffer: list[str] = []
        self._turn: _TurnView | None = None
        self._permissions: deque[ev.PermissionRequested] = deque()
        self._lines: deque[str] = deque()
        self._input_ended = False
        self._session_over: str | None = None
        self._last_interrupt: float | None = None
        self._at_line_start = True
        self._stream: str | None = None  # "message" or "thought" while text streams
        self._prompt_visible = False
        self._steer_buffer: list[str] = []  # a steer typed while a turn runs (not echoed)
        self._steers_in_flight = 0
        #: the session's newest turn (what ``/rewind`` alone rewinds)
        self._last_turn: str | None = None
        #: a ``/rewind`` is under way: lines and the prompt wait for its answer, as for a turn
        self._rewinding = False

    # -- public ----------------------------------------------------------------------------

    def starting(self, what: str) -> None:
        self._status(what)

    def start(self, label: str) -> None:
        if self.interactive:
            help_text = (
                "Enter sends · type while a turn runs to steer it · Esc or Ctrl-C stops the"
                " turn · /rewind [TURN] undoes files · /help · Ctrl-D or /quit quits"
            )
        else:
            help_text = (
                "/stop stops the turn · /steer TEXT steers it · /rewind [TURN] undoes files"
                " · /help · /quit or end of input quits"
            )
        self._status(f"chat with {label} · {help_text}")
        self._show_prompt()

    def _help(self) -> None:
        """The chat's own commands; any other line, a ``/word`` too, is the agent's."""
        if self.interactive:
            stop, steer, end = "Esc or Ctrl-C", "type while a turn runs", "Ctrl-D"
        else:
            stop, steer, end = "/stop", "/steer TEXT", "end of input"
        for line in (
            "the chat's commands:",
            f"  {stop:<22} stops the running turn",
            f"  {steer:<22} steers the running turn",
            f"  {'/rewind [TURN]':<22} puts the files back as before TURN (default: the last)",
            f"  {'/help':<22} this",
            f"  {'/quit or ' + end:<22} quits",
            "any other line is a prompt to the agent, a /word too (agents have slash commands"
            " of their own)",
        ):
            self._status(line)

    def error(self, message: str) -> None:
        self._status(f"✗ {message}")

    def earlier(self, transcript: list[tuple[str, str]]) -> None:
        """What the session said before the chat joined it: each prompt or steer (``user``)
        as typed, each answer (``agent``) as streamed, and what is missing (``note``)."""
        if not transcript:
            return
        self._status("earlier in this session:")
        for role, text in transcript:
            if role == "user":
                self._finish_line(f"› {_clean(text)}")
            elif role == "note":
                self._status(text)
            else:
                self._write_stream("message", _clean(text))
                self._end_line()

    def take_output(self) -> str:
        text = "".join(self._out)
        self._out.clear()
        return text

    def feed(self, item: Input) -> list[Command]:
        if self.quitting:
            return []
        if isinstance(item, Key):
            self._on_key(item)
        elif isinstance(item, Line):
            self._lines.append(item.text)
        elif isinstance(item, InputEnded):
            self._input_ended = True
            if self.interactive:  # the terminal hung up: nobody is watching any more
                self._quit(0)
        elif isinstance(item, Interrupt):
            self._on_interrupt(item.at)
        elif isinstance(item, Terminate):
            self._quit(128 + item.signum)
        elif isinstance(item, EventsEnded):
            self._session_over = self._session_over or "the session's events stopped coming"
            self._turn = None  # no turn.ended will come
        elif isinstance(item, ev.Event):
            self._on_event(item)
        else:
            self._on_result(item)
        if not self.quitting:
            self._drain_lines()
            while self._input_ended and self._permissions and not self._lines:
                self._answer(False, why=" at the end of input")
            self._quit_when_idle()
            self._show_prompt()  # again, if a status line pushed it up
        commands, self._commands = self._commands, []
        return commands

    # -- input -------------------------------------------------------------------------------

    def _on_key(self, key: Key) -> None:
        if self._turn is not None:
            if key.name == ESC:
                self._stop()
            elif (
                key.name == CHAR
                and self._permissions
                and not self._steer_buffer
                and key.char.lower() in ("y", "n")
            ):
                self._finish_line(key.char)
                self._answer(key.char.lower() == "y")
            else:
                self._on_steer_key(key)
            return
        if key.name == CHAR:
            self._buffer.append(key.char)
            self._write(key.char)
        elif key.name == BACKSPACE:
            if self._buffer:
                self._buffer.pop()
                self._write("\b \b")
        elif key.name == CTRL_U:
            self._write("\b \b" * len(self._buffer))
            self._buffer.clear()
        elif key.name == ENTER:
            text = "".join(self._buffer)
            self._buffer.clear()
            self._finish_line()
            self._submit(text)
        elif key.name == CTRL_D and not self._buffer:
            self._quit(0)

    def _on_steer_key(self, key: Key) -> None:
        """Keys while a turn runs write a steer, unechoed (the agent's output keeps the
        screen); a status line says it is being typed, Enter sends it."""
        if key.name == CHAR:
            if not self._steer_buffer:
                self._status("↪ steering the running turn: Enter sends, Ctrl-U clears")
            self._steer_buffer.append(key.char)
        elif key.name == BACKSPACE and self._steer_buffer:
            self._steer_buffer.pop()
        elif key.name == CTRL_U:
            self._steer_buffer.clear()
        elif key.name == ENTER and self._steer_buffer:
            text = "".join(self._steer_buffer)
            self._steer_buffer.clear()
            if text.split(maxsplit=1)[:1] == ["/rewind"]:  # a command, never a steer
                self._status("a turn is running: stop it first (Esc), then /rewind")
            elif text.strip() == "/help":
                self._help()
            else:
                self._steer(text)

    def _steer(self, text: str) -> None:
        if not text.strip():
            return
        self._status(f"↪ {_clean(text.strip())}")
        self._steers_in_flight += 1
        if self._turn is None:
            self._turn = _TurnView(text)  # the turn it starts is adopted at its turn.steered
        self._commands.append(SendSteer(text))

    def _submit(self, text: str) -> None:
        command = text.strip()
        if not command:
            pass  # the prompt comes back by itself
        elif command == "/quit":
            self._quit(0)
        elif command == "/stop":
            self._status("no turn is running")
        elif command == "/help":
            self._help()
        elif command.startswith("/steer ") or command == "/steer":
            self._steer(command.removeprefix("/steer").strip())
        elif command.split(maxsplit=1)[0] == "/rewind":
            self._rewind(command.removeprefix("/rewind").strip())
        else:
            self._turn = _TurnView(text)
            self._commands.append(SendPrompt(text))

    def _rewind(self, turn_id: str) -> None:
        target = turn_id or self._last_turn
        if target is None:
            self._status("no turn to rewind yet")
            return
        self._rewinding = True
        self._status(f"↶ rewinding the files to before {_clean(target)}…")
        self._commands.append(SendRewind(target))

    def _rewound(self, item: RewindDone | RewindFailed) -> None:
        self._rewinding = False
        if isinstance(item, RewindFailed):
            self._status(f"✗ rewind failed: {item.message}")
            return
        result = item.result
        restored = [_clean(str(path)) for path in result.get("restored", [])]
        turn = _clean(str(result.get("turn_id", "")))
        self._status(
            f"↶ files as they were before {turn}: "
            + (f"restored {', '.join(restored)}" if restored else "nothing to restore")
        )
        for missed in result.get("not_restored", []):
            why = _clean(str(missed.get("why", "")))
            self._status(f"  ✗ not restored: {_clean(str(missed.get('path', '')))} ({why})")
        if result.get("undo"):
            self._status(f"  /rewind {_clean(str(result['undo']))} undoes this rewind")

    def _drain_lines(self) -> None:
        """Lines (non-interactive stdin) in order: prompts wait for the turn (or the rewind)
        to end."""
        while self._lines and not self.quitting:
            line = self._lines[0].strip()
            if self._rewinding:
                return
            if self._turn is None:
                self._lines.popleft()
                if line:
                    self._finish_line(f"› {line}")
                self._submit(line)
            elif line == "/stop":
                self._lines.popleft()
                self._stop()
            elif line.startswith("/steer "):
                self._lines.popleft()
                self._steer(line.removeprefix("/steer").strip())
            elif line == "/quit":
                self._lines.popleft()
                self._quit(0)
            elif self._permissions and line[:1].lower() in ("y", "n") and line:
                self._lines.popleft()
                self._answer(line[:1].lower() == "y")
            else:
                return

    def _quit_when_idle(self) -> None:
        if self._turn is not None or self._lines or self._rewinding:
            return
        if self._session_over is not None:
            self._status(f"✗ {self._session_over}")
            self._quit(1)
        elif self._input_ended:
            self._quit(0)

    def _on_interrupt(self, at: float) -> None:
        last, self._last_interrupt = self._last_interrupt, at
        if last is not None and at - last < DOUBLE_INTERRUPT_S:
            self._quit(0)
        elif self._turn is not None:
            self._stop()
        else:
            if self.interactive:
                self._finish_line("^C")
            self._buffer.clear()
            hint = "Ctrl-C again or Ctrl-D to quit" if self.interactive else "Ctrl-C again to quit"
            self._status(hint)

    def _stop(self) -> None:
        turn = self._turn
        if turn is None or turn.stop_requested:
            return
        turn.stop_requested = True
        if turn.accepted and turn.turn_id is not None:
            self._send_cancel(turn, turn.turn_id)
        # else: sent as soon as the prompt is accepted (a cancel names its turn)

    def _send_cancel(self, turn: _TurnView, turn_id: str) -> None:
        turn.cancel_sent = True
        self._commands.append(SendCancel(turn_id))

    def _answer(self, allow: bool, why: str = "") -> None:
        request = self._permissions[0]
        wanted = "allow" if allow else "reject"
        option = next((o for o in request.options if o.option_kind.startswith(wanted)), None)
        if option is None and allow:
            self._status("this request offers no allow option; answer n")
            self._ask_permission(request)
            return
        self._permissions.popleft()
        chosen = f" ({_clean(option.name)})" if option else ""
        self._status(f"{'allowed' if allow else 'rejected'}{chosen}{why}")
        option_id = option.option_id if option is not None else None  # None: cancelled
        self._commands.append(SendPermission(request.request_id, option_id))
        if self._permissions:
            self._ask_permission(self._permissions[0])

    def _quit(self, code: int) -> None:
        self._end_line()
        self.quitting = True
        self._commands.append(Quit(code))

    # -- answers of the backend ----------------------------------------------------------------

    def _on_result(
        self,
        item: PromptAccepted
        | PromptFailed
        | CancelDone
        | CancelFailed
        | PermissionFailed
        | SteerDone
        | SteerFailed
        | RewindDone
        | RewindFailed,
    ) -> None:
        turn = self._turn
        if isinstance(item, RewindDone | RewindFailed):
            self._rewound(item)
        elif isinstance(item, PermissionFailed):
            self._status(f"✗ permission answer failed: {item.message}")
        elif isinstance(item, SteerDone | SteerFailed):
            self._steer_answered(item)
        elif turn is None:
            return
        elif isinstance(item, PromptAccepted):
            turn.accepted = True
            turn.turn_id = item.turn_id
            if turn.stop_requested and not turn.cancel_sent:
                self._send_cancel(turn, item.turn_id)
            self._maybe_finish_turn()
        elif isinstance(item, PromptFailed):
            self._status(f"✗ {item.message}")
            self._turn = None
        elif isinstance(item, CancelDone):
            turn.receipt = item.receipt
            turn.cancel_settled = True
            self._maybe_finish_turn()
        else:  # CancelFailed: say so, and let Esc try again
            self._status(f"✗ stop failed: {item.message}")
            turn.stop_requested = turn.cancel_sent = False
            self._maybe_finish_turn()

    def _steer_answered(self, item: SteerDone | SteerFailed) -> None:
        self._steers_in_flight = max(0, self._steers_in_flight - 1)
        if isinstance(item, SteerFailed):
            self._status(f"✗ steer failed: {item.message}")
            turn = self._turn
            if turn is not None and turn.turn_id is None and not turn.accepted:
                self._turn = None  # the placeholder of a steer that started nothing
            return
        result = item.result
        if result.mode == "injected":
            self._status("↪ the running turn took it")
        elif result.mode == "started":
            self._status("↪ no turn was running: it started one")
        else:
            how = f" ({result.receipt.summary()})" if result.receipt is not None else ""
            self._status(f"↪ the agent cannot steer: the turn stopped{how}; yours runs next")
        self._adopt(result.turn_id)

    def _adopt(self, turn_id: str) -> None:
        """The chat follows the turn a steer went to (the old one has ended by now)."""
        turn = self._turn
        if turn is not None and turn.turn_id == turn_id:
            turn.accepted = True
            self._maybe_finish_turn()
            return
        if turn is not None and turn.ended is None and turn.turn_id is not None:
            return  # still on the old turn: its turn.ended comes, then the steered turn's events
        self._turn = _TurnView("", turn_id=turn_id, accepted=True)

    # -- session events ----------------------------------------------------------------------

    def _mine(self, turn_id: str | None) -> bool:
        turn = self._turn
        if turn is None or turn.ended is not None:
            return False
        return turn.turn_id is None or turn_id is None or turn_id == turn.turn_id

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.MessageDelta):
            if event.role == "assistant" and self._mine(event.turn_id):
                self._write_stream("message", _clean(event.text))
        elif isinstance(event, ev.ThoughtDelta):
            if self._mine(event.turn_id):
                self._write_stream("thought", _clean(event.text))
        elif isinstance(event, ev.TurnStarted):
            self._last_turn = event.turn_id
            if self._turn is not None and self._turn.turn_id is None:
                self._turn.turn_id = event.turn_id
        elif isinstance(event, ev.TurnSteered):
            if self._steers_in_flight and event.mode != "injected":
                # Our steer starts this turn: follow it from its first event on.
                turn = self._turn
                if turn is None or turn.ended is not None or turn.turn_id in (None, event.turn_id):
                    if turn is not None and turn.ended is not None:
                        self._maybe_finish_turn()
                    self._turn = _TurnView(event.text, turn_id=event.turn_id, accepted=True)
        elif isinstance(event, ev.ToolCall):
            if self._mine(event.turn_id):
                self._status(f"⚙ {_clean(event.title or event.tool_kind or 'tool call')}")
        elif isinstance(event, ev.ToolUpdate):
            if self._mine(event.turn_id) and event.status in ("completed", "failed"):
                self._status(f"  {'✓' if event.status == 'completed' else '✗'} {event.status}")
        elif isinstance(event, ev.PermissionRequested):
            if self._mine(event.turn_id):
                self._permissions.append(event)
                if len(self._permissions) == 1:
                    self._ask_permission(event)
        elif isinstance(event, ev.PermissionResolved):
            self._permission_resolved(event)
        elif isinstance(event, ev.TurnEnded):
            turn = self._turn
            if event.stop_reason != "dropped" and self._mine(event.turn_id) and turn is not None:
                turn.ended = event
                self._maybe_finish_turn()
        elif isinstance(event, ev.SessionState):
            if event.state == "cancelling" and event.detail:
                self._status(_clean(event.detail))
            elif event.state == "failed":
                self._session_over = f"session failed: {_clean(event.detail or 'no detail')}"
            elif event.state == "stopped":
                self._session_over = "the session was stopped"
        elif isinstance(event, ev.SessionHeld):
            if event.held is not None:
                self._status(f"the supervisor is {event.held}: prompts wait until it is resumed")
            else:
                self._status("the supervisor is resumed: waiting prompts start in order")
        elif isinstance(event, ev.AgentExited):
            if not event.expected:
                how = f"code {event.exit_code}" if event.exit_code is not None else "a signal"
                self._status(f"agent exited unexpectedly ({how})")
        elif isinstance(event, ev.ErrorEvent):
            self._status(f"error: {_clean(event.message)}")
        elif isinstance(event, ev.StreamGap):
            lost = event.to_seq - event.from_seq + 1
            self._status(
                f"{lost} event(s) lost ({event.from_seq}-{event.to_seq}): {_clean(event.cause)}"
            )

    def _ask_permission(self, request: ev.PermissionRequested) -> None:
        self._end_line()
        title = _clean(str(request.tool_call.get("title") or "a tool call"))
        question = f"? {title} — allow? [y/n] "
        if self.interactive:
            self._write(question)
            self._at_line_start = False
        else:
            self._finish_line(question)

    def _permission_resolved(self, event: ev.PermissionResolved) -> None:
        for request in self._permissions:
            if request.request_id == event.request_id:
                shown = request is self._permissions[0]
                self._permissions.remove(request)
                who = {"supervisor": "the stop", "agent": "the agent"}.get(
                    event.by, "another client"
                )
                self._status(f"permission request {event.outcome} by {who}")
                if shown and self._permissions:
                    self._ask_permission(self._permissions[0])
                return

    def _maybe_finish_turn(self) -> None:
        """The turn is over for the screen once it ended, was accepted, and any stop answered."""
        turn = self._turn
        if turn is None or turn.ended is None or not turn.accepted:
            return
        if turn.cancel_sent and not turn.cancel_settled:
            return  # terminate-then-respond: the receipt follows the turn's end
        ended = turn.ended
        if turn.receipt is not None:
            self._status(f"■ {turn.receipt.summary()}")
        elif ended.receipt is not None:  # stopped by someone else
            self._status(f"■ {_summary(ended.receipt)}")
        elif ended.outcome == "failed":
            self._status("✗ turn failed" + (f": {_clean(ended.error)}" if ended.error else ""))
        elif ended.outcome != "completed":
            self._status(f"■ turn {ended.outcome}")
        self._end_line()
        self._turn = None
        self._permissions.clear()

    # -- rendering ---------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        self._out.append(text)

    def _dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[22m" if self.color else text

    def _finish_line(self, text: str = "") -> None:
        self._write(text + "\n")
        self._at_line_start = True
        self._prompt_visible = False
        self._stream = None

    def _end_line(self) -> None:
        if not self._at_line_start:
            self._finish_line()
        self._stream = None

    def _status(self, text: str) -> None:
        self._end_line()
        self._finish_line(self._dim(text))

    def _write_stream(self, kind: str, text: str) -> None:
        if not text:
            return
        if self._stream != kind:
            self._end_line()
            self._stream = kind
        self._write(self._dim(text) if kind == "thought" else text)
        self._at_line_start = text.endswith("\n")

    def _show_prompt(self) -> None:
        """The prompt and the line typed so far, unless they are on screen already."""
        if self._prompt_visible or not self.interactive or self.quitting:
            return
        if self._turn is not None or self._session_over is not None or self._rewinding:
            return
        self._end_line()
        self._write("› " + "".join(self._buffer))
        self._at_line_start = False
        self._prompt_visible = True


def _summary(receipt: dict[str, Any]) -> str:
    try:
        return converter.structure(receipt, CancelReceipt).summary()
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError):
        return f"turn {receipt.get('outcome', 'stopped')}"


# -- backends --------------------------------------------------------------------------------


class ChatError(Exception):
    """A backend call failed; the message is for the person at the terminal."""


class ChatBackend(Protocol):
    """One agent session, wherever it runs. Every method raises :class:`ChatError` on failure."""

    label: str
    #: a running terminal agent's session: the chat attaches to it raw (``chat_raw.py``)
    terminal: bool

    async def prompt(self, text: str) -> str:
        """Send a prompt; returns the turn id once the session accepted it."""
        ...

    async def cancel(self, turn_id: str) -> CancelReceipt:
        """Stop that turn; returns once it has ended (terminate-then-respond)."""
        ...

    async def steer(self, text: str) -> SteerResult:
        """Redirect the running turn (or start one); returns which way it went."""
        ...

    async def respond_permission(self, request_id: str, option_id: str | None) -> None:
        """Answer a permission request with an option, or as cancelled (``None``)."""
        ...

    async def rewind(self, turn_id: str) -> dict[str, Any]:
        """Put the files back as they were before ``turn_id`` (``session.rewind``'s answer)."""
        ...

    def events(self) -> AsyncIterator[ev.Event]:
        """The session's events, in order, from when the backend was opened."""
        ...

    async def input(self, data: str) -> None:
        """Keys for a terminal agent's terminal, as typed (``session.input``)."""
        ...

    async def resize(self, cols: int, rows: int) -> None:
        """Resize a terminal agent's terminal (``session.resize``)."""
        ...

    def terminal_events(self) -> AsyncIterator[ev.Event | Screen]:
        """As :meth:`events`, with the agent's screen first (and again after each subscribe
        that brings one): the events that follow it are those after its ``last_seq``."""
        ...


class EmbeddedBackend:
    """A session of an in-process supervisor (:func:`open_embedded`)."""

    def __init__(self, session: AnySession, subscription: Subscription, label: str) -> None:
        self._session = session
        #: opened before the first prompt, so no event of a turn is missed; closed by the opener
        self.subscription = subscription
        self.label = label
        self.terminal = session.spec.protocol == "terminal"

    async def prompt(self, text: str) -> str:
        try:
            return (await self._session.prompt(text)).id
        except SupervisorError as exc:
            raise ChatError(str(exc)) from exc

    async def cancel(self, turn_id: str) -> CancelReceipt:
        try:
            return await self._session.cancel(turn_id=turn_id, reason="chat")
        except SupervisorError as exc:
            raise ChatError(str(exc)) from exc

    async def steer(self, text: str) -> SteerResult:
        try:
            return await self._session.steer(text)
        except SupervisorError as exc:
            raise ChatError(str(exc)) from exc

    async def respond_permission(self, request_id: str, option_id: str | None) -> None:
        try:
            await self._session.respond_permission(
                request_id, option_id, cancelled=option_id is None
            )
        except SupervisorError as exc:
            raise ChatError(str(exc)) from exc

    async def rewind(self, turn_id: str) -> dict[str, Any]:
        if not isinstance(self._session, Session | RemoteSession):
            raise ChatError("a rewind is for running sessions: this one's agent runs nowhere")
        try:
            return await self._session.rewind(turn_id)
        except SupervisorError as exc:
            raise ChatError(str(exc)) from exc

    async def events(self) -> AsyncIterator[ev.Event]:
        async for item in self.terminal_events():
            if isinstance(item, ev.Event):
                yield item

    async def input(self, data: str) -> None:
        try:
            await self._session.input(data)
        except SupervisorError as exc:
            raise ChatError(str(exc)) from exc

    async def resize(self, cols: int, rows: int) -> None:
        try:
            await self._session.resize(cols, rows)
        except SupervisorError as exc:
            raise ChatError(str(exc)) from exc

    async def terminal_events(self) -> AsyncIterator[ev.Event | Screen]:
        while True:
            screen = self.subscription.screen
            if screen is not None:
                yield Screen(screen.data, self.subscription.head_seq)
            async for event in self.subscription:
                yield event
            if not self.subscription.lagged:
                return
            # Cut off for falling behind: catch up from where we were.
            last_seq = self.subscription.last_seq
            self.subscription.close()
            self.subscription = await self._session.open_subscription(since_seq=last_seq)


@asynccontextmanager
async def open_embedded(agent: str, config: str | None) -> AsyncIterator[EmbeddedBackend]:
    """A session of ``agent`` (from ``config`` or the built-ins) in an in-process supervisor;
    leaving stops the session and its whole process tree."""
    agents = load_agents(config) if config else builtin_agents()
    hosts = load_hosts(config) if config else None
    async with open_supervisor(
        agents=agents, state_dir=default_state_dir(), gc_policy=True, hosts=hosts
    ) as supervisor:
        try:
            session = await supervisor.start_session(agent)
        except SupervisorError as exc:
            raise ChatError(f"cannot start {agent}: {exc}") from exc
        on = f" on {session.host}" if session.host is not None else ""
        backend = EmbeddedBackend(
            session, await session.open_subscription(), f"{agent}{on} (embedded supervisor)"
        )
        try:
            yield backend
        finally:
            backend.subscription.close()
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_BOUND_S):
                try:
                    await session.stop()
                except SupervisorError:
                    pass  # already stopped or failed


@contextmanager
def _gateway_errors() -> Iterator[None]:
    """A failed gateway call as a :class:`ChatError` for the person at the terminal."""
    try:
        yield
    except GatewayError as exc:
        raise ChatError(exc.message if exc.code == "connection_closed" else str(exc)) from exc
    except ConnectionClosed as exc:
        raise ChatError("the connection to the gateway is closed") from exc


class RemoteBackend:
    """A session on a gateway (:func:`open_remote`); events arrive as wire dicts."""

    def __init__(
        self,
        client: GatewayClient,
        session_id: str,
        channel: trio.MemoryReceiveChannel[dict[str, Any]],
        label: str,
        *,
        stored: bool = False,
        terminal: bool = False,
    ) -> None:
        self._client = client
        self._session_id = session_id
        self._channel = channel
        self.label = label
        #: (a stored session's agent runs nowhere: the line chat starts it again)
        self.terminal = terminal and not stored
        #: the screen the subscribe brought (``terminal.screen``), read with the history
        self._screen: Screen | None = None
        #: what the session said before the chat joined it (``read_history``): role (``user``,
        #: ``agent``, or ``note``: what is missing), text
        self.transcript: list[tuple[str, str]] = []
        #: the seq of the last event had (the history's, for one joined)
        self._last_seq = 0
        #: its agent is not running (a stored session): its events end with its history,
        #: and go on once a prompt or steer starts it again
        self._dormant = stored
        self._revived = trio.Event()
        #: the gateway ended the subscription (``subscription.closed`` was read)
        self._ended = False

    async def read_history(self, head: int) -> None:
        """Take the replayed events up to ``head`` off the channel as :attr:`transcript`;
        a session whose replay ends there (``subscription.closed``) is a stored one."""
        while self._last_seq < head:
            try:
                message = await self._channel.receive()
            except trio.EndOfChannel:
                raise ChatError("the connection ended while the history was read") from None
            if message.get("event") == "subscription.closed":
                self._ended = True
                return
            if message.get("event") == "terminal.screen":
                self._screen = _screen(message)
                continue
            event = known_event(message)
            if event is None:
                continue
            self._last_seq = event.seq
            if isinstance(event, ev.StreamGap):
                lost = event.to_seq - event.from_seq + 1
                self.transcript.append(("note", f"({lost} earlier event(s) are not replayed here)"))
            elif isinstance(event, ev.TurnStarted) or (
                # (A steer that starts a turn is that turn's prompt: shown once.)
                isinstance(event, ev.TurnSteered) and event.mode == "injected"
            ):
                self.transcript.append(("user", event.text))
            elif isinstance(event, ev.MessageDelta) and event.role != "user" and event.text:
                if self.transcript and self.transcript[-1][0] == "agent":
                    self.transcript[-1] = ("agent", self.transcript[-1][1] + event.text)
                else:
                    self.transcript.append(("agent", event.text))

    def _started(self) -> None:
        """A prompt or steer was taken: a stored session's agent runs again."""
        if self._dormant:
            self._revived.set()

    async def _request(self, action: str, payload: dict[str, Any]) -> dict[str, Any]:
        with _gateway_errors():
            return await self._client.request(action, {"session_id": self._session_id, **payload})

    async def prompt(self, text: str) -> str:
        result = await self._request("agent.prompt", {"text": text})
        self._started()
        return str(result["turn_id"])

    async def cancel(self, turn_id: str) -> CancelReceipt:
        result = await self._request("agent.cancel", {"task_id": turn_id, "reason": "chat"})
        try:
            return converter.structure(result, CancelReceipt)
        except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
            raise ChatError(f"the gateway sent a receipt we cannot read: {result!r}") from exc

    async def steer(self, text: str) -> SteerResult:
        result = await self._request("agent.steer", {"text": text})
        self._started()
        try:
            return converter.structure({"session_id": self._session_id, **result}, SteerResult)
        except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
            raise ChatError(f"the gateway sent a steer answer we cannot read: {result!r}") from exc

    async def respond_permission(self, request_id: str, option_id: str | None) -> None:
        with _gateway_errors():
            await self._client.respond_permission(self._session_id, request_id, option_id)

    async def rewind(self, turn_id: str) -> dict[str, Any]:
        return await self._request("session.rewind", {"turn_id": turn_id})

    async def input(self, data: str) -> None:
        await self._request("session.input", {"data": data})

    async def resize(self, cols: int, rows: int) -> None:
        await self._request("session.resize", {"cols": cols, "rows": rows})

    async def terminal_events(self) -> AsyncIterator[ev.Event | Screen]:
        """The screen and the events of a running session (a stored one's: see
        :meth:`events`), renewed from the last event had when the gateway cuts the
        subscription off for falling behind (the renewal brings a new screen)."""
        if self._screen is not None:
            yield self._screen
            self._screen = None
        async for message in self._channel:
            kind = message.get("event")
            if kind == "terminal.screen":
                screen = _screen(message)
                if screen is not None:
                    yield screen
            elif kind == "subscription.lagged":
                payload = {"session_id": self._session_id, "since_seq": self._last_seq}
                try:
                    await self._client.request("session.subscribe", payload)
                except (GatewayError, ConnectionClosed):
                    return
            elif kind == "subscription.closed":
                return
            else:
                event = known_event(message)
                if event is not None and event.seq > self._last_seq:
                    self._last_seq = event.seq
                    yield event

    async def events(self) -> AsyncIterator[ev.Event]:
        while True:
            if not self._ended:
                after = self._last_seq
                channel = self._channel
                async for event in self._client.events(self._session_id, channel, after_seq=after):
                    self._last_seq = event.seq
                    yield event
            if not self._dormant or self._client.closed.is_set():
                return
            # A stored session: the prompt that starts its agent again has its events.
            await self._revived.wait()
            self._dormant = self._ended = False
            payload = {"session_id": self._session_id, "since_seq": self._last_seq}
            with _gateway_errors():
                await self._client.request("session.subscribe", payload)


def _screen(message: dict[str, Any]) -> Screen | None:
    """A ``terminal.screen`` notice's picture (None: one this client cannot read)."""
    data = message.get("data")
    if not isinstance(data, dict):
        return None
    picture, last_seq = data.get("data"), data.get("last_seq")
    if not isinstance(picture, str) or not isinstance(last_seq, int):
        return None
    try:
        return Screen(base64.b64decode(picture, validate=True), last_seq)
    except ValueError:
        return None


async def _is_terminal(client: GatewayClient, agent: object) -> bool:
    """Whether the gateway's agent ``agent`` runs in a terminal (``protocol = "terminal"``)."""
    with _gateway_errors():
        agents = await client.agents()
    return any(a.get("name") == agent and a.get("protocol") == "terminal" for a in agents)


async def _connect(stack: AsyncExitStack, url: str) -> GatewayClient:
    try:
        return await stack.enter_async_context(connect(url))
    except CONNECT_ERRORS as exc:
        raise ChatError(not_connected(url, exc)) from exc


@asynccontextmanager
async def join_remote(url: str, session_id: str) -> AsyncIterator[RemoteBackend]:
    """The session ``session_id`` of the gateway at ``url``, running or stored (a prompt starts
    a stored one's agent again, resuming its own session), its history read first
    (:attr:`RemoteBackend.transcript`); leaving leaves it as it is."""
    where = urlsplit(url).netloc or url
    async with AsyncExitStack() as stack:
        client = await _connect(stack, url)
        with _gateway_errors():
            listed = await client.sessions()
        summary = next((s for s in listed if s.get("session_id") == session_id), None)
        if summary is None:
            raise ChatError(f"the gateway at {where} has no session {session_id!r}")
        try:
            channel = await stack.enter_async_context(client.subscribe(session_id, since_seq=0))
        except (GatewayError, ConnectionClosed) as exc:
            raise ChatError(f"cannot follow session {session_id}: {exc}") from exc
        host = summary.get("host")
        on = f" on {host}" if isinstance(host, str) else ""
        label = f"{summary.get('agent')}{on} (session {session_id} at {where})"
        stored = summary.get("state") == "stopped"
        terminal = await _is_terminal(client, summary.get("agent"))
        backend = RemoteBackend(
            client, session_id, channel, label, stored=stored, terminal=terminal
        )
        head = int(client.subscribed.get(session_id, {}).get("last_seq") or 0)
        with trio.fail_after(HISTORY_BOUND_S):
            await backend.read_history(head)
        yield backend


@asynccontextmanager
async def open_remote(url: str, agent: str) -> AsyncIterator[RemoteBackend]:
    """A new session of ``agent`` on the gateway at ``url`` (the ``ready`` URL of ``serve``);
    leaving stops that session on the gateway."""
    where = urlsplit(url).netloc or url  # not the token
    async with AsyncExitStack() as stack:
        client = await _connect(stack, url)
        try:
            started = await client.start_session(agent)
            session_id = str(started["session_id"])
        except ConnectionClosed as exc:
            raise ChatError(f"cannot start {agent}: the connection to {where} closed") from exc
        except GatewayError as exc:
            raise ChatError(f"cannot start {agent}: {exc.message}") from exc

        async def stop_session() -> None:
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_BOUND_S):
                try:
                    await client.stop(session_id)
                except (GatewayError, ConnectionClosed):
                    pass

        stack.push_async_callback(stop_session)
        try:
            channel = await stack.enter_async_context(client.subscribe(session_id))
        except (GatewayError, ConnectionClosed) as exc:
            raise ChatError(f"cannot follow session {session_id}: {exc}") from exc
        host = started.get("host")
        on = f" on {host}" if isinstance(host, str) else ""
        label = f"{agent}{on} (session {session_id} at {where})"
        terminal = await _is_terminal(client, agent)
        yield RemoteBackend(client, session_id, channel, label, terminal=terminal)


# -- the terminal shell ------------------------------------------------------------------------


@contextmanager
def terminal_mode(fd: int, set_mode: Callable[[int], object]) -> Iterator[None]:
    """The terminal ``fd`` in the mode ``set_mode`` puts it in; its mode before always put
    back."""
    saved = termios.tcgetattr(fd)
    try:
        set_mode(fd)
        yield
    finally:
        # TCSANOW, not TCSADRAIN: draining could wait forever on a terminal nobody reads.
        try:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
        except termios.error:
            pass  # the terminal hung up: there is nothing left to restore


def _cbreak(fd: int) -> None:
    """No echo, no line buffering, signals still on (Ctrl-C stays SIGINT)."""
    mode = termios.tcgetattr(fd)
    mode[3] &= ~(termios.ECHO | termios.ICANON)
    mode[6][termios.VMIN] = 1
    mode[6][termios.VTIME] = 0
    termios.tcsetattr(fd, termios.TCSANOW, mode)


class _Console:
    """stdin and stdout as trio streams. trio makes the descriptors non-blocking, and a
    terminal's stdin and stdout share one open file description with the shell: close()
    puts the original blocking flags back."""

    def __init__(self, stdin_fd: int, stdout_fd: int) -> None:
        self.stdin_fd = stdin_fd
        self.interactive = os.isatty(stdin_fd)
        self.color = os.isatty(stdout_fd) and not os.environ.get("NO_COLOR")
        self._blocking = {fd: os.get_blocking(fd) for fd in (stdin_fd, stdout_fd)}
        self._out = trio.lowlevel.FdStream(os.dup(stdout_fd))
        self._in = trio.lowlevel.FdStream(os.dup(stdin_fd))
        self._out_broken = False

    def close(self) -> None:
        self._in.close()
        self._out.close()
        for fd, blocking in self._blocking.items():
            try:
                os.set_blocking(fd, blocking)
            except OSError:
                pass

    async def write(self, text: str) -> None:
        if not text or self._out_broken:
            return
        try:
            await self._out.send_all(text.encode("utf-8", errors="replace"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._out_broken = True  # the terminal is gone; the chat ends on input EOF

    async def write_bytes(self, data: bytes) -> None:
        if not data or self._out_broken:
            return
        try:
            await self._out.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._out_broken = True

    async def read_raw(self) -> bytes:
        """What the terminal sent next, as it is (b"": it hung up)."""
        return await self._receive()

    async def read_input(self, send: trio.MemorySendChannel[Input]) -> None:
        if self.interactive:
            await self._read_keys(send)
        else:
            await self._read_lines(send)
        await send.send(InputEnded())

    async def _receive(self) -> bytes:
        try:
            return await self._in.receive_some(4096)
        except trio.BrokenResourceError:  # EIO: the terminal hung up
            return b""

    async def _read_keys(self, send: trio.MemorySendChannel[Input]) -> None:
        decoder = KeyDecoder()
        while True:
            data: bytes | None = None
            if decoder.escape_pending:
                with trio.move_on_after(ESC_TIMEOUT_S):
                    data = await self._receive()
            else:
                data = await self._receive()
            keys = decoder.flush() if data is None else decoder.feed(data)
            for key in keys:
                # Ctrl-C is SIGINT in cbreak mode; the byte only comes with ISIG off.
                await send.send(Interrupt(trio.current_time()) if key.name == CTRL_C else key)
            if data == b"":
                return

    async def _read_lines(self, send: trio.MemorySendChannel[Input]) -> None:
        pending = b""
        while True:
            data = await self._receive()
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                await send.send(Line(line.rstrip(b"\r").decode("utf-8", errors="replace")))
        if pending:
            await send.send(Line(pending.decode("utf-8", errors="replace")))


async def _converse(core: ChatCore, backend: ChatBackend, console: _Console) -> int:
    """The UI loop: one owner of the core; everything else posts inputs to it."""
    send, receive = trio.open_memory_channel[Input](_INBOX_SIZE)
    code = 0
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    with trio.open_signal_receiver(*signals) as received:
        async with trio.open_nursery() as nursery:

            async def follow_signals() -> None:
                async for signum in received:
                    if signum == signal.SIGINT:
                        await send.send(Interrupt(trio.current_time()))
                    else:
                        await send.send(Terminate(signum))

            nursery.start_soon(follow_signals)
            nursery.start_soon(forward_events, backend.events(), send)
            nursery.start_soon(console.read_input, send)
            async for item in receive:
                commands = core.feed(item)
                await console.write(core.take_output())
                for command in commands:
                    if isinstance(command, Quit):
                        code = command.code
                    else:
                        nursery.start_soon(_perform, backend, command, send)
                if core.quitting:
                    break
            nursery.cancel_scope.cancel()
    return code


async def forward_events(
    events: AsyncIterator[E], send: trio.MemorySendChannel[E | EventsEnded]
) -> None:
    """Posts the session's events to the UI loop, then :class:`EventsEnded`."""
    async for event in events:
        await send.send(event)
    await send.send(EventsEnded())


async def prompt_answer(backend: ChatBackend, text: str) -> PromptAccepted | PromptFailed:
    try:
        return PromptAccepted(await backend.prompt(text))
    except ChatError as exc:
        return PromptFailed(str(exc))


async def cancel_answer(backend: ChatBackend, turn_id: str) -> CancelDone | CancelFailed:
    try:
        return CancelDone(await backend.cancel(turn_id))
    except ChatError as exc:
        return CancelFailed(str(exc))


async def _perform(
    backend: ChatBackend,
    command: SendPrompt | SendCancel | SendSteer | SendPermission | SendRewind,
    send: trio.MemorySendChannel[Input],
) -> None:
    """Carry out one command and post its answer back to the UI loop."""
    result: Input
    if isinstance(command, SendPrompt):
        result = await prompt_answer(backend, command.text)
    elif isinstance(command, SendCancel):
        result = await cancel_answer(backend, command.turn_id)
    elif isinstance(command, SendSteer):
        try:
            result = SteerDone(await backend.steer(command.text))
        except ChatError as exc:
            result = SteerFailed(str(exc))
    elif isinstance(command, SendRewind):
        try:
            result = RewindDone(await backend.rewind(command.turn_id))
        except ChatError as exc:
            result = RewindFailed(str(exc))
    else:
        try:
            await backend.respond_permission(command.request_id, command.option_id)
            return
        except ChatError as exc:
            result = PermissionFailed(str(exc))
    await send.send(result)


async def run_chat(
    agent: str,
    url: str | None = None,
    config: str | None = None,
    *,
    session: str | None = None,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
) -> int:
    """``agent-supervisor chat``: returns the exit code (0 when the person quit); with
    ``session`` (and ``url``), the chat joins that session of the gateway instead of starting
    one, and shows what it said so far."""
    console = _Console(stdin_fd, stdout_fd)
    try:
        core = ChatCore(interactive=console.interactive, color=console.color)
        where = (urlsplit(url).netloc or url) if url else None
        core.starting(f"connecting to {where}…" if where else f"starting {agent}…")
        await console.write(core.take_output())
        failure: str | None = None
        code = 1
        try:
            backend_cm: AbstractAsyncContextManager[ChatBackend]
            if url and session:
                backend_cm = join_remote(url, session)
            else:
                backend_cm = open_remote(url, agent) if url else open_embedded(agent, config)
            async with backend_cm as backend:
                if console.interactive and backend.terminal:
                    # The agent's own interface, attached raw (that module imports this one).
                    from supervisor.clients.chat_raw import converse_raw

                    code = await converse_raw(backend, console, stdout_fd)
                else:
                    if isinstance(backend, RemoteBackend):
                        core.earlier(backend.transcript)
                    with terminal_mode(stdin_fd, _cbreak) if console.interactive else nullcontext():
                        core.start(backend.label)  # the prompt shows once keys can be read
                        await console.write(core.take_output())
                        code = await _converse(core, backend, console)
        except* ChatError as group:
            failure = str(group.exceptions[0])
        if failure is not None:
            core.error(failure)
            code = 1
        await console.write(core.take_output())
        return code
    finally:
        console.close()
