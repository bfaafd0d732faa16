"""A scripted fake ``amp`` CLI for tier-3 tests (stdlib only), behaving as the real one does.

    fake_amp.py [threads continue T-ID] --execute --stream-json --stream-json-input
                [--state-dir DIR] [--ignore-sigint] [--delay S]

Like Amp 0.0.1790142911 (``protocols/amp.py``): reads user messages on stdin; ``system/init``
once, after the first; per prompt a ``user`` echo and one whole ``assistant`` message per word,
the last with ``stop_reason: end_turn``, and no ``result`` per turn. SIGINT or SIGTERM writes
the ``error_during_execution`` result ("User cancelled (SIGINT/SIGTERM)") and exits 0; stdin EOF
writes the ``success`` result and exits 0. ``--ignore-sigint`` makes it ignore SIGINT (SIGTERM
still ends it, as above). ``threads continue`` with a thread it does not know exits 1 at start,
with Amp's words on stderr. Prompt words: ``words=N``; ``init-delay=S`` (the first ``system/init`` S seconds
late); ``shell`` starts a helper in its own
session first (as Amp's shell tool would) and reports its pid in a ``tool_use``.

Fault modes (for ``tests/faults``): ``--ignore-sigterm`` ignores SIGTERM from the start; prompt
words ``flood`` (no pause between words), ``crash`` (exit 3 after the third word) and ``mute``
(ignore SIGINT for the turn, and after the third word close stdout and hang, alive).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

CRASH_AFTER_WORDS = 3
WORDS = "Amp here: streaming a reply one word at a time until told to stop".split()
CANCELLED = "User cancelled (SIGINT/SIGTERM)"


class Run:
    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.turns = 0
        self.started = time.monotonic()
        self.last_text = ""

    def emit(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def result(self, **fields: Any) -> None:
        self.emit(
            {
                "type": "result",
                **fields,
                "duration_ms": int((time.monotonic() - self.started) * 1000),
                "num_turns": self.turns,
                "session_id": self.thread,
            }
        )

    def on_signal(self, signum: int, frame: object) -> None:
        try:
            self.result(subtype="error_during_execution", is_error=True, error=CANCELLED)
        except (OSError, ValueError):
            pass  # stdout is closed ("mute")
        os._exit(0)

    def assistant(self, content: list[dict[str, Any]], stop_reason: str | None) -> None:
        body = {"type": "message", "role": "assistant", "content": content}
        self.emit(
            {
                "type": "assistant",
                "message": {**body, "stop_reason": stop_reason},
                "session_id": self.thread,
            }
        )


def main(argv: list[str]) -> int:
    state_dir = None
    delay = 0.02
    thread = None
    args = list(argv)
    if args[:2] == ["threads", "continue"]:
        thread = args[2]
        args = args[3:]
    if "--state-dir" in args:
        state_dir = args[args.index("--state-dir") + 1]
    if "--delay" in args:
        delay = float(args[args.index("--delay") + 1])
    if thread is not None:
        if state_dir is None or not os.path.exists(os.path.join(state_dir, thread)):
            sys.stderr.write(f"Thread http://127.0.0.1/threads/{thread} does not exist.\n")
            return 1
        sys.stderr.write(f"fake-amp: continuing {thread}\n")
    else:
        thread = f"T-{uuid.uuid4()}"
        if state_dir is not None:
            open(os.path.join(state_dir, thread), "w").close()
    run = Run(thread)
    signal.signal(signal.SIGINT, run.on_signal)
    signal.signal(signal.SIGTERM, run.on_signal)
    if "--ignore-sigint" in args:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "--ignore-sigterm" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stderr.write(f"fake-amp: argv {json.dumps(argv)}\n")
    sys.stderr.flush()
    for line in sys.stdin:
        message = json.loads(line)
        text = "".join(b.get("text", "") for b in message["message"]["content"])
        words, init_delay = 30, 0.0
        for token in text.split():
            if token.startswith("words="):
                words = int(token[6:])
            elif token.startswith("init-delay="):
                init_delay = float(token[11:])
        tokens = text.split()
        if "mute" in tokens:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if run.turns == 0:
            time.sleep(init_delay)  # a thread named late: a cancel before it finds no thread
            run.emit({"type": "system", "subtype": "init", "session_id": thread, "tools": []})
        run.emit({"type": "user", "message": message["message"], "session_id": thread})
        if "shell" in tokens:
            helper = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
            )
            tool = {"type": "tool_use", "id": "TU-1", "name": "Bash", "input": {"pid": helper.pid}}
            run.assistant([tool], "tool_use")
        for index in range(words):
            if index == CRASH_AFTER_WORDS and "crash" in tokens:
                sys.stderr.write("fake-amp: crashing as asked\n")
                sys.stderr.flush()
                os._exit(3)
            if index == CRASH_AFTER_WORDS and "mute" in tokens:
                sys.stdout.flush()
                os.close(1)
                sys.stderr.write("fake-amp: stdout closed; staying alive\n")
                sys.stderr.flush()
                while True:
                    time.sleep(3600)
            if "flood" not in tokens:
                time.sleep(delay)
            word = {"type": "text", "text": WORDS[index % len(WORDS)] + " "}
            run.assistant([word], "end_turn" if index == words - 1 else None)
        run.turns += 1
        run.last_text = "done"
    run.result(subtype="success", is_error=False, result=run.last_text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
