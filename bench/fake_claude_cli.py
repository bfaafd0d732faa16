"""The project's fake ``claude`` CLI (``tests/fakes/fake_claude.py``), made to accept any flags.

``claude-agent-sdk`` starts its CLI with flags the fake does not know (``--system-prompt ""``,
``--setting-sources=...``, ``--max-turns N``, ...) and its message parser requires fields the
real CLI writes but the fake leaves out (``uuid`` on ``stream_event``/``user``, ``model`` on an
``assistant`` message, ``duration_ms``/``duration_api_ms`` on a ``result``). This wrapper drops
every option the fake does not declare, fills those fields in as the real CLI would, and
otherwise runs the fake unchanged (read-only use of ``tests/``). Both sides of
``bench/peer_claude.py`` start the CLI through this same wrapper, so they talk to byte-identical
behaviour.

``write_launcher(dir)`` writes an executable ``claude`` into ``dir`` that runs this file with the
current interpreter: the SDK's ``cli_path`` must name one executable file.
"""

from __future__ import annotations

import os
import stat
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The CLI version the fake follows (``tests/fakes/fake_claude.py``'s docstring).
CLI_VERSION = "2.1.332"
FAKES = HERE.parent / "tests" / "fakes"

#: The fake's own options: those that take a value, and the switches.
_VALUED = {
    "--resume",
    "--state-dir",
    "--mode",
    "--words",
    "--word-interval",
    "--stop-delay",
    "--init-delay",
    "--input-format",
    "--output-format",
    "--permission-prompt-tool",
    "--model",
    "--setting-sources",
}
_SWITCHES = {"-p", "--print", "--verbose", "--include-partial-messages", "--drop-early-interrupt"}


def filter_argv(argv: list[str]) -> list[str]:
    """Keep the options the fake declares; drop the rest (with their value, if any)."""
    kept: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        name, has_value, _ = arg.partition("=")
        if name in _SWITCHES:
            kept.append(arg)
            index += 1
        elif name in _VALUED:
            if has_value:
                kept.append(arg)
                index += 1
            else:
                kept += argv[index : index + 2]
                index += 2
        elif arg.startswith("-"):
            # Unknown: drop it, and its value when the next word is not an option.
            follows = index + 1 < len(argv) and not argv[index + 1].startswith("--")
            index += 2 if (follows and not has_value) else 1
        else:
            index += 1  # a stray positional: the fake takes none
    return kept


def complete(message: dict[str, Any]) -> dict[str, Any]:
    """Add what the real CLI (2.1.332) writes and the SDK's parser requires."""
    kind = message.get("type")
    if kind in ("stream_event", "user", "assistant", "result"):
        message.setdefault("uuid", str(uuid.uuid4()))
    if kind == "assistant":
        message["message"].setdefault("model", "claude-sonnet-4-5")
    elif kind == "result":
        message.setdefault("duration_ms", 0)
        message.setdefault("duration_api_ms", 0)
    elif kind == "control_response":
        answer = message["response"].get("response")
        if isinstance(answer, dict) and answer.get("claude_code_version") == "fake":
            answer["claude_code_version"] = CLI_VERSION  # else the SDK warns "too old"
    return message


def write_launcher(directory: str | os.PathLike[str]) -> str:
    """An executable ``claude`` in ``directory`` that runs this wrapper; returns its path."""
    path = Path(directory) / "claude"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def main() -> int:
    if str(FAKES) not in sys.path:
        sys.path.insert(0, str(FAKES))
    import fake_claude

    emit = fake_claude.emit
    fake_claude.emit = lambda message: emit(complete(message))
    sys.argv = [sys.argv[0], *filter_argv(sys.argv[1:])]
    result: int = fake_claude.main()
    return result


if __name__ == "__main__":
    sys.exit(main())
