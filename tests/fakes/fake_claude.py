"""A scripted fake ``claude`` CLI speaking headless stream-json, for real-process tests.

Stdlib only. Run it like the real CLI (``fake_claude.py -p --input-format stream-json
--output-format stream-json ... [--resume ID]``); the real flags are accepted and ignored. What
it does follows Claude Code 2.1.332 as observed against a fake model server:

- ``initialize`` is answered at once; ``system/init`` (with a session id) follows every user
  message; text streams as ``stream_event`` ``text_delta``s, then the whole ``assistant``
  message, then a ``result`` (``success``/``completed``).
- ``interrupt`` is acknowledged at once (``still_queued: []``); the turn then ends with a
  ``result`` ``error_during_execution``, ``is_error: true``, ``terminal_reason``
  ``aborted_streaming`` (or ``aborted_tools`` while a permission is pending, which is first
  withdrawn with ``control_cancel_request``). While idle it is acknowledged and nothing else.
- ``--resume ID`` continues a conversation saved under ``--state-dir``; an unknown ID gets a
  ``result`` with ``errors: ["No conversation found with session ID: ID"]`` and exit 1.
- stdin EOF: exit 0.

Modes (``--mode`` sets the default, tokens in a prompt override it for that turn):
``cooperative``; ``wedged`` (acknowledges the interrupt, stops, and never writes the result: the
"lost result" of edge case 22); ``ignore-interrupt`` (acknowledges it and streams on);
``permission`` (asks ``can_use_tool`` for a Bash command before the second word). Other tokens:
``words=N``, ``child`` (starts a helper in its own session, like Claude's Bash tool shells, and
reports its pid in a ``tool_use``). ``--drop-early-interrupt`` loses an interrupt that arrives
before the turn's ``system/init`` (older CLIs, edge case 16); ``--init-delay S`` delays it.
Every control request received is logged to stderr as ``fake_claude: got <subtype>``.

Fault modes (prompt tokens, for ``tests/faults``): ``flood`` (no pause between words),
``crash`` (exit 3 after the third word), ``crash-on-interrupt`` (exit 3 when the interrupt
arrives), ``mute`` (after the third word close stdout and hang, alive, ignoring interrupts),
``init-delay=S`` (this turn's ``system/init`` S seconds late). ``--ignore-sigterm`` ignores
SIGTERM from the start.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

_write_lock = threading.Lock()
_muted = threading.Event()
CRASH_AFTER_WORDS = 3


def emit(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":")) + "\n"
    with _write_lock:
        if _muted.is_set():
            return
        sys.stdout.write(line)
        sys.stdout.flush()


def go_mute() -> None:
    """Close stdout (every descriptor of the pipe) and stay alive."""
    with _write_lock:
        sys.stdout.flush()
        _muted.set()
        os.close(1)
    log("stdout closed; staying alive")


def log(text: str) -> None:
    with _write_lock:
        sys.stderr.write(f"fake_claude: {text}\n")
        sys.stderr.flush()


class Turn:
    def __init__(self, text: str, mode: str, words: int) -> None:
        self.text = text
        self.mode = mode
        self.words = words
        self.child = False
        self.flood = False
        self.crash = False
        self.crash_on_interrupt = False
        self.mute = False
        self.init_delay: float | None = None
        for token in text.split():
            key, _, value = token.partition("=")
            if key in ("cooperative", "wedged", "ignore-interrupt", "permission"):
                self.mode = key
            elif key == "words":
                self.words = int(value)
            elif key == "child":
                self.child = True
            elif key == "flood":
                self.flood = True
            elif key == "crash":
                self.crash = True
            elif key == "crash-on-interrupt":
                self.crash_on_interrupt = True
            elif key == "mute":
                self.mute = True
            elif key == "init-delay":
                self.init_delay = float(value)
        self.interrupted = threading.Event()
        self.init_sent = False
        self.permission_id: str | None = None
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.aborted = "aborted_streaming"


class FakeClaude:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state_dir = Path(args.state_dir) if args.state_dir else None
        self.session_id: str | None = args.resume
        self.turn: Turn | None = None
        self.lock = threading.Lock()
        self.children: list[subprocess.Popen[bytes]] = []
        self.message_count = 0

    # -- conversations on disk, so --resume works across processes --------------------------

    def _history_path(self, session_id: str) -> Path | None:
        return self.state_dir / f"{session_id}.json" if self.state_dir else None

    def load(self, session_id: str) -> list[str] | None:
        path = self._history_path(session_id)
        if path is None or not path.exists():
            return None
        history: list[str] = json.loads(path.read_text())
        return history

    def save(self, text: str) -> None:
        assert self.session_id is not None
        path = self._history_path(self.session_id)
        if path is None:
            return
        history = self.load(self.session_id) or []
        path.write_text(json.dumps([*history, text]))

    # -- stdin ----------------------------------------------------------------------------

    def run(self) -> int:
        if self.args.resume is not None and self.load(self.args.resume) is None:
            log(f"No conversation found with session ID: {self.args.resume}")
            emit(
                {
                    "type": "result",
                    "subtype": "error_during_execution",
                    "is_error": True,
                    "num_turns": 0,
                    "session_id": self.args.resume,
                    "errors": [f"No conversation found with session ID: {self.args.resume}"],
                }
            )
            return 1
        for line in sys.stdin:
            if not line.strip():
                continue
            self.handle(json.loads(line))
        return 0

    def handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "control_request":
            subtype = message["request"]["subtype"]
            log(f"got {subtype}")
            if subtype == "initialize":
                self.ack(
                    message["request_id"],
                    {"commands": [], "models": [], "claude_code_version": "fake"},
                )
            elif subtype == "interrupt":
                self.on_interrupt(message["request_id"])
            else:
                emit(
                    {
                        "type": "control_response",
                        "response": {
                            "subtype": "error",
                            "request_id": message["request_id"],
                            "error": f"unsupported: {subtype}",
                        },
                    }
                )
        elif kind == "control_response":
            response = message["response"]
            with self.lock:
                turn = self.turn
                if turn is None or turn.permission_id != response.get("request_id"):
                    log(f"late answer to {response.get('request_id')}")
                    return
                turn.permission_id = None
            turn.answers.put(response.get("response", {}))
        elif kind == "user":
            text = message["message"]["content"]
            with self.lock:
                if self.turn is not None:
                    log("user message while a turn runs")
                    return
                turn = Turn(text, self.args.mode, self.args.words)
                self.turn = turn
            threading.Thread(target=self.run_turn, args=(turn,), daemon=True).start()

    def ack(self, request_id: str, response: dict[str, Any]) -> None:
        emit(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request_id, "response": response},
            }
        )

    def on_interrupt(self, request_id: str) -> None:
        self.ack(request_id, {"still_queued": []})
        with self.lock:
            turn = self.turn
            if turn is None:
                log("interrupt while idle")
                return
            if turn.crash_on_interrupt:
                log("interrupted: crashing as asked")
                os._exit(3)
            if self.args.drop_early_interrupt and not turn.init_sent:
                log("interrupt before init: dropped")
                return
            withdrawn, turn.permission_id = turn.permission_id, None
        if withdrawn is not None:
            emit({"type": "control_cancel_request", "request_id": withdrawn})
            turn.aborted = "aborted_tools"
            turn.answers.put({"behavior": "withdrawn"})
        turn.interrupted.set()

    # -- a turn ---------------------------------------------------------------------------

    def run_turn(self, turn: Turn) -> None:
        time.sleep(self.args.init_delay if turn.init_delay is None else turn.init_delay)
        if self.session_id is None:
            self.session_id = str(uuid.uuid4())
        self.save(turn.text)
        emit(
            {
                "type": "system",
                "subtype": "init",
                "session_id": self.session_id,
                "argv": sys.argv[1:],
                "pid": os.getpid(),
                "tools": ["Bash"],
            }
        )
        turn.init_sent = True
        self.message_count += 1
        message_id = f"msg_{os.getpid()}_{self.message_count}"
        self.stream({"type": "message_start", "message": {"id": message_id}})
        if turn.child:
            self.start_child(turn)
        words: list[str] = []
        finished = True
        for index in range(turn.words):
            if turn.mode == "permission" and index == 1 and not self.ask_permission(turn):
                finished = False
                break
            if self.stopping(turn):
                finished = False
                break
            words.append(f"w{index} ")
            self.stream(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": words[-1]},
                }
            )
            if index + 1 == CRASH_AFTER_WORDS and turn.crash:
                log("crashing as asked")
                os._exit(3)
            if index + 1 == CRASH_AFTER_WORDS and turn.mute:
                go_mute()
                threading.Event().wait()  # alive and silent until killed
            if turn.flood:
                continue
            if turn.mode == "ignore-interrupt":
                time.sleep(self.args.word_interval)
            else:
                turn.interrupted.wait(self.args.word_interval)
        if turn.mode == "wedged" and not finished:
            log("interrupted; the result is lost")
            return  # the turn stays "running" forever: only a kill ends it
        time.sleep(self.args.stop_delay if not finished else 0)
        emit(
            {
                "type": "assistant",
                "session_id": self.session_id,
                "parent_tool_use_id": None,
                "message": {
                    "id": message_id,
                    "role": "assistant",
                    "content": [{"type": "text", "text": "".join(words)}],
                },
            }
        )
        with self.lock:
            self.turn = None
        if finished:
            emit(
                self.result(
                    subtype="success",
                    is_error=False,
                    terminal_reason="completed",
                    result="".join(words),
                )
            )
        else:
            emit(
                {
                    "type": "user",
                    "session_id": self.session_id,
                    "parent_tool_use_id": None,
                    "message": {
                        "role": "user",
                        "content": [{"type": "text", "text": "[Request interrupted by user]"}],
                    },
                }
            )
            emit(
                self.result(
                    subtype="error_during_execution",
                    is_error=True,
                    terminal_reason=turn.aborted,
                    errors=["[ede_diagnostic] result_type=user"],
                )
            )

    def stopping(self, turn: Turn) -> bool:
        return turn.interrupted.is_set() and turn.mode != "ignore-interrupt"

    def result(self, **fields: Any) -> dict[str, Any]:
        return {"type": "result", "num_turns": 1, "session_id": self.session_id, **fields}

    def stream(self, event: dict[str, Any]) -> None:
        emit(
            {
                "type": "stream_event",
                "event": event,
                "session_id": self.session_id,
                "parent_tool_use_id": None,
            }
        )

    def start_child(self, turn: Turn) -> None:
        """A helper in its own session, as Claude's Bash tool runs commands."""
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        self.children.append(child)
        emit(
            {
                "type": "assistant",
                "session_id": self.session_id,
                "parent_tool_use_id": None,
                "message": {
                    "id": f"msg_child_{child.pid}",
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": f"toolu_child_{child.pid}",
                            "name": "Bash",
                            "input": {"command": "sleep 60 &", "pid": child.pid},
                        }
                    ],
                },
            }
        )

    def ask_permission(self, turn: Turn) -> bool:
        """Ask for a Bash command; False when the turn must stop here."""
        request_id = str(uuid.uuid4())
        tool_input = {"command": "touch ran-the-tool"}
        emit(
            {
                "type": "assistant",
                "session_id": self.session_id,
                "parent_tool_use_id": None,
                "message": {
                    "id": f"msg_tool_{request_id}",
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": tool_input}
                    ],
                },
            }
        )
        with self.lock:
            turn.permission_id = request_id
        emit(
            {
                "type": "control_request",
                "request_id": request_id,
                "request": {
                    "subtype": "can_use_tool",
                    "tool_name": "Bash",
                    "input": tool_input,
                    "tool_use_id": "toolu_1",
                },
            }
        )
        answer = turn.answers.get()
        behavior = answer.get("behavior")
        if behavior == "allow":
            self.tool_result("ran the tool", is_error=False)
            return True
        self.tool_result(str(answer.get("message", behavior)), is_error=True)
        if behavior == "deny" and answer.get("interrupt") is True:
            turn.aborted = "aborted_tools"
            turn.interrupted.set()
            return False
        return behavior == "deny"

    def tool_result(self, text: str, *, is_error: bool) -> None:
        emit(
            {
                "type": "user",
                "session_id": self.session_id,
                "parent_tool_use_id": None,
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": text,
                            "is_error": is_error,
                        }
                    ],
                },
            }
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resume")
    parser.add_argument("--state-dir")
    parser.add_argument(
        "--mode",
        default="cooperative",
        choices=["cooperative", "wedged", "ignore-interrupt", "permission"],
    )
    parser.add_argument("--words", type=int, default=1000)
    parser.add_argument("--word-interval", type=float, default=0.02)
    parser.add_argument("--stop-delay", type=float, default=0.0)
    parser.add_argument("--init-delay", type=float, default=0.0)
    parser.add_argument("--drop-early-interrupt", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    # The real CLI's flags, accepted and ignored.
    for flag in (
        "--input-format",
        "--output-format",
        "--permission-prompt-tool",
        "--model",
        "--setting-sources",
    ):
        parser.add_argument(flag)
    for flag in ("-p", "--print", "--verbose", "--include-partial-messages"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        return FakeClaude(args).run()
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
