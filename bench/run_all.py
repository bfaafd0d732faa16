"""Run every benchmark, side by side with its baseline, and write ``bench/results.md``.

Each benchmark runs in its own interpreter and prints its figures as a JSON line (``--json``);
this collects them into one table a reader can trust: the ratios are measured in the same run,
the absolute times are reported but are only this machine's. ``--only NAME`` runs one of them
again and replaces its section, keeping the others.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from bench.machine import free_cpu

HERE = Path(__file__).parent
BENCHMARKS = [
    ("cancel_overhead", ["--rounds", "200"]),
    ("transport_floor", ["--rounds", "200"]),
    ("wedged_agent", ["--rounds", "20"]),
    ("peer_claude", ["--rounds", "100", "--wedged-rounds", "3"]),
    ("peer_acp", ["--rounds", "100", "--wedged-rounds", "3"]),
    ("throughput", ["--words", "20000", "--repeats", "5"]),
    ("fairness", ["--k", "0,10,100,300", "--rounds", "200"]),
    ("session_cost", ["--sessions", "40", "--cycles", "5", "--rounds", "30"]),
    ("scale", []),
    ("remote_cancel", ["--rounds", "50"]),
    ("remote_fairness", ["--k", "0,10,50", "--rounds", "100"]),
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


def section(name: str, figures: dict[str, object], text: str, load: str) -> list[str]:
    body = [f"## {name}", "", "```", text, "```", "", load, ""]
    body += ["| figure | value |", "|---|---|"]
    for key, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        body.append(f"| {key} | {shown} |")
    body.append("")
    return body


def main() -> None:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    sections = []
    for name, args in BENCHMARKS:
        if only is not None and name != only:
            continue
        print(f"running bench/{name}.py ...", flush=True)
        before, free = os.getloadavg()[0], free_cpu()
        figures, text = run(name, args)
        load = (
            f"Machine just before: load average (1 min) {before:.2f}, a busy loop got"
            f" {free:.0%} of a core."
        )
        print(text, flush=True)
        sections.append((name, figures, text, load))
    header = [
        "# Benchmark results",
        "",
        f"Written by `make bench` on {datetime.date.today()}: {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, {platform.system()} {platform.release()}.",
        "Ratios are measured side by side in the same run; absolute times are this machine's.",
        "Each section says how busy the machine was just before it: anything else running shows",
        "there (both sides of a ratio share the same conditions; absolute figures do not).",
        "",
    ]
    if only is not None:
        # One benchmark again (``--only NAME``): its section replaced (or added), the rest kept.
        results = (HERE / "results.md").read_text()
        name, figures, text, load = sections[0]
        new = "\n".join(section(name, figures, text, load))
        start = results.find(f"## {name}\n")
        if start < 0:
            results = results.rstrip("\n") + "\n\n" + new
        else:
            end = results.find("\n## ", start + 1)
            results = results[:start] + new + (results[end:] if end >= 0 else "\n")
        (HERE / "results.md").write_text(results)
        print(f"updated {name} in {HERE / 'results.md'}")
        return
    body = []
    for name, figures, text, load in sections:
        body += section(name, figures, text, load)
    (HERE / "results.md").write_text("\n".join(header + body))
    print(f"wrote {HERE / 'results.md'}")


if __name__ == "__main__":
    main()
