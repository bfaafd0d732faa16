"""A scripted fake ``amp`` CLI for tier-3 tests (stdlib only).

    fake_amp.py [threads continue T-ID] --execute --stream-json --stream-json-input
                [--state-dir DIR] [--ignore-sigint] [--delay S]

Reads user messages on stdin (Amp's stream-json input), answers each with ``system/init``, one
``assistant`` message per word and a ``result``, like Amp. SIGINT ends the whole run (exit 130),
as it does for Amp; ``--ignore-sigint`` makes it ignore SIGINT. ``threads continue`` with a
thread it does not know fails at start (exit 1). Prompt words: ``words=N``; ``shell`` starts a
helper in its own session first (as Amp's shell tool would) and reports its pid in a tool_use.

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

CRASH_AFTER_WORDS = 3
WORDS = "Amp here: streaming a reply one word at a time until told to stop".split()


def emit(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    state_dir = None
    delay = 0.02
    thread = None
    args = list(argv)
    if args[:2] == ["threads", "continue"]:
        thread = args[2]
        args = args[3:]
    if "--ignore-sigint" in args:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "--ignore-sigterm" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--state-dir" in args:
        state_dir = args[args.index("--state-dir") + 1]
    if "--delay" in args:
        delay = float(args[args.index("--delay") + 1])
    if thread is not None:
        if state_dir is None or not os.path.exists(os.path.join(state_dir, thread)):
            sys.stderr.write(f"fake-amp: thread {thread} not found\n")
            return 1
        sys.stderr.write(f"fake-amp: continuing {thread}\n")
    else:
        thread = f"T-{uuid.uuid4().hex[:12]}"
        if state_dir is not None:
            open(os.path.join(state_dir, thread), "w").close()
    sys.stderr.write(f"fake-amp: argv {json.dumps(argv)}\n")
    sys.stderr.flush()
    for line in sys.stdin:
        message = json.loads(line)
        text = "".join(b.get("text", "") for b in message["message"]["content"])
        words = 30
        for token in text.split():
            if token.startswith("words="):
                words = int(token[6:])
        tokens = text.split()
        if "mute" in tokens:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        emit({"type": "system", "subtype": "init", "session_id": thread, "tools": []})
        if "shell" in text.split():
            helper = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
            )
            emit(
                {
                    "type": "assistant",
                    "session_id": thread,
                    "message": {
                        "id": "m0",
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "tu1",
                                "name": "Bash",
                                "input": {"pid": helper.pid},
                            }
                        ],
                    },
                }
            )
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
            emit(
                {
                    "type": "assistant",
                    "session_id": thread,
                    "message": {
                        "id": f"m{index + 1}",
                        "role": "assistant",
                        "content": [{"type": "text", "text": WORDS[index % len(WORDS)] + " "}],
                    },
                }
            )
        emit(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "session_id": thread,
                "num_turns": 1,
                "result": "done",
            }
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
