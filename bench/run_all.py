"""Run every benchmark, side by side with its baseline, and write ``bench/results.md``.

Each benchmark runs in its own interpreter and prints its figures as a JSON line (``--json``);
this collects them into one table a reader can trust: the ratios are measured in the same run,
the absolute times are reported but are only this machine's.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHMARKS = [
    ("cancel_overhead", ["--rounds", "200"]),
    ("wedged_agent", ["--rounds", "20"]),
]


def run(name: str, args: list[str]) -> tuple[dict[str, object], str]:
    command = [sys.executable, "-m", f"bench.{name}", "--json", *args]
    result = subprocess.run(
        command, cwd=HERE.parent, capture_output=True, text=True, check=True, timeout=1800
    )
    lines = result.stdout.strip().splitlines()
    figures = next(json.loads(line) for line in reversed(lines) if line.startswith("{"))
    text = "\n".join(line for line in lines if not line.startswith("{"))
    return figures, text


def main() -> None:
    sections = []
    for name, args in BENCHMARKS:
        print(f"running bench/{name}.py ...", flush=True)
        figures, text = run(name, args)
        print(text, flush=True)
        sections.append((name, figures, text))
    header = [
        "# Benchmark results",
        "",
        f"Written by `make bench` on {datetime.date.today()}: {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, {platform.system()} {platform.release()}.",
        "Ratios are measured side by side in the same run; absolute times are this machine's.",
        "",
    ]
    body = []
    for name, figures, text in sections:
        body += [f"## {name}", "", "```", text, "```", "", "| figure | value |", "|---|---|"]
        for key, value in figures.items():
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            body.append(f"| {key} | {shown} |")
        body.append("")
    (HERE / "results.md").write_text("\n".join(header + body))
    print(f"wrote {HERE / 'results.md'}")


if __name__ == "__main__":
    main()
