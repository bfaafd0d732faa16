"""What the terminal machine's screen model costs per byte of a TUI's output, beside a raw pipe
read of the same bytes as its floor, interleaved in one run.

The output is a TUI's kind (``make_output``): answer lines of text, some in colour, a spinner
redrawn in place with cursor moves, a status line rewritten at the bottom, wide characters.
Each way reads it from ``cat FILE`` through a pipe in the link's reads of 64 KiB
(``supervisor/agents/pty_link.py``'s most):

- **floor**: the reads alone;
- **machine**: each read handed to ``TerminalClient.receive`` as the link hands it (the screen
  fed, the ``terminal.output`` event's base64, the lines told, turn detection), a turn running
  so the answer's lines are followed as they are in a turn.

Reported: MB/s and ns per byte of each (the median of ``--repeats`` runs), and the machine's
per-byte cost as a multiple of the floor's.

Usage: ``python -m bench.terminal_cost [--mb 4] [--repeats 5] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from protocols.terminal import TerminalClient, TerminalSettings

#: The link's largest read (``supervisor/agents/pty_link.py``).
READ_BYTES = 65536
COLS, ROWS = 120, 40


def make_output(size: int) -> bytes:
    """About ``size`` bytes of what a TUI draws while it answers."""
    parts: list[str] = []
    total = 0
    i = 0
    spinner = "|/-\\"
    while total < size:
        if i % 10 == 0:
            # The status line at the bottom, rewritten; the spinner redrawn; back again.
            piece = (
                f"\x1b7\x1b[{ROWS};1H\x1b[2K\x1b[7m working {spinner[i % 4]} {i} tokens \x1b[0m"
                "\x1b8"
            )
        elif i % 7 == 0:
            piece = f"\x1b[1;32m✓\x1b[0m step {i}: \x1b[38;5;{i % 256}mwrote file_{i}.py\x1b[0m\r\n"
        elif i % 13 == 0:
            piece = f"中文字符 wide characters in line {i} — and an em dash\r\n"
        else:
            piece = f"answer line {i}: the quick brown fox jumps over the lazy dog, again.\r\n"
        parts.append(piece)
        total += len(piece.encode())
        i += 1
    return "".join(parts).encode()


def read_all(path: Path, machine: TerminalClient | None) -> float:
    """Seconds to read ``path`` through a pipe from ``cat``, each read fed to ``machine``."""
    process = subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE)
    assert process.stdout is not None
    fd = process.stdout.fileno()
    start = time.perf_counter()
    while data := os.read(fd, READ_BYTES):
        if machine is not None:
            machine.receive({"output": data, "now": time.perf_counter() - start})
    elapsed = time.perf_counter() - start
    process.stdout.close()
    process.wait()
    return elapsed


def fresh_machine() -> TerminalClient:
    """A machine in a running turn, its screen showing a prompt."""
    client = TerminalClient(TerminalSettings(cols=COLS, rows=ROWS, idle_s=1.0))
    client.start(cwd="/")
    client.receive({"output": b"> ", "now": 0.0})
    client.receive({"tick": True, "now": 2.0})
    client.prompt("t1", "go")
    return client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    output = make_output(int(args.mb * 1_000_000))
    floors: list[float] = []
    machines: list[float] = []
    with tempfile.TemporaryDirectory(prefix="terminal-cost-") as folder:
        path = Path(folder) / "output"
        path.write_bytes(output)
        read_all(path, None)  # the file in the page cache, cat in memory
        for _ in range(args.repeats):
            floors.append(read_all(path, None))
            machines.append(read_all(path, fresh_machine()))
    size = len(output)
    floor, machine = statistics.median(floors), statistics.median(machines)
    figures: dict[str, Any] = {
        "bytes": size,
        "floor_mb_s": size / floor / 1e6,
        "floor_ns_per_byte": floor / size * 1e9,
        "machine_mb_s": size / machine / 1e6,
        "machine_ns_per_byte": machine / size * 1e9,
        "ratio": machine / floor,
    }
    summary = (
        f"terminal screen model: {figures['machine_mb_s']:.2f} MB/s"
        f" ({figures['machine_ns_per_byte']:.0f} ns/byte) vs a raw pipe read"
        f" {figures['floor_mb_s']:.0f} MB/s ({figures['floor_ns_per_byte']:.2f} ns/byte):"
        f" {figures['ratio']:.0f}x the floor ({size / 1e6:.1f} MB of TUI output,"
        f" median of {args.repeats})"
    )
    print(summary)
    if args.json:  # as bench/run_all.py reads them
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
