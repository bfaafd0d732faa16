"""A turn's checkpoint: a snapshot's time against the floor git itself sets, in one run.

A repository of ``--files`` small files (in directories of 100, committed) is snapshotted into
the shadow store (``supervisor/checkpoints/``) once (the first snapshot: every file hashed),
then ``--repeats`` times with ``--changed`` files rewritten before each (a turn's start after
a turn that edited a few files). The floor is what any git-based snapshot must do: ``git add
-A && git write-tree`` into a separate git directory and index of the same tree, with the
same files changed, timed the same way. Printed: p50 (and p90) of each, and their ratio, the
CPU time of each (this process and its git processes: steadier on a loaded machine), and how
many of the snapshots were told what changed by the store's watcher (the store is held as a
session holds it; ``--no-watch``: every snapshot is git's full pass).

Then what a user waits for: a session started on the repository (a supervisor with its own
state directory, so a fresh checkpoint store; an in-memory agent), its first prompt sent
``--prompt-after`` seconds later with ``--changed`` files edited meanwhile, timed from the call
to its ``turn.started`` (its start snapshot taken), ``--first-turns`` times: the session's own
first snapshot, taken as it starts, is under way or done by then.

    python -m bench.checkpoint_snapshot --files 10000 --changed 3 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import trio

from supervisor import AgentSpec, open_supervisor
from supervisor.checkpoints import ShadowStore
from supervisor.checkpoints.shadow import _git_env
from supervisor.testing import Recorder
from supervisor.testing._acp import AcpBehaviour, AcpLauncher


def _make_repo(root: Path, files: int) -> list[Path]:
    paths = []
    for index in range(files):
        directory = root / f"d{index // 100:03d}"
        directory.mkdir(exist_ok=True)
        path = directory / f"f{index:05d}.py"
        path.write_text(f"# file {index}\n" + "x = 1\n" * 20)
        paths.append(path)
    env = {**_git_env(), "HOME": str(root)}
    # no collection after the commit: git would start one in the background (10,000 new loose
    # objects are past its threshold), which packs them while the snapshots are timed
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "files"]):
        subprocess.run(["git", "-c", "gc.auto=0", *args], cwd=root, check=True, env=env)
    return paths


def _change(paths: list[Path], count: int, round_: int) -> None:
    for path in paths[round_ * count % len(paths) :][:count]:
        path.write_text(f"# changed in round {round_}\n")


def _floor(root: Path, git_dir: Path) -> float:
    """``git add -A && git write-tree`` into a separate git directory: its seconds."""
    env = _git_env()
    where = ["git", f"--git-dir={git_dir}", f"--work-tree={root}"]
    started = time.perf_counter()
    subprocess.run([*where, "add", "-A"], cwd=root, check=True, env=env)
    subprocess.run([*where, "write-tree"], cwd=root, check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def _cpu() -> float:
    """CPU seconds of this process and of its children waited for (git)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _pcts(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[int(len(ms) * 0.9) - 1], 2),
    }


async def _first_turn_wait(
    root: Path, state_dir: Path, paths: list[Path], changed: int, round_: int, prompt_after: float
) -> float:
    """Seconds from a new session's first prompt, ``prompt_after`` s after its start, to its
    ``turn.started``."""
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"])
    launcher = AcpLauncher(AcpBehaviour(words=1, word_interval=0.0))
    async with open_supervisor(
        agents={"fake": spec}, launcher=launcher, state_dir=state_dir
    ) as sup:
        session = await sup.start_session("fake", cwd=str(root))
        recorder = Recorder(session)
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            await trio.sleep(prompt_after)  # the user reads, edits a few files, types
            _change(paths, changed, round_)
            started = time.perf_counter()
            await session.prompt("go")
            await recorder.wait_kind("turn.started")
            waited = time.perf_counter() - started
            await recorder.wait_kind("turn.ended")
            nursery.cancel_scope.cancel()
        await session.stop()
    return waited


async def _run(
    files: int, changed: int, repeats: int, first_turns: int, prompt_after: float, watch: bool
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        paths = _make_repo(root, files)
        store = ShadowStore(Path(tmp) / "state", root, watch=watch)
        store.hold()  # as a session does: a watching store watches the directory meanwhile
        floor_dir = Path(tmp) / "floor.git"
        subprocess.run(["git", "init", "-q", "--bare", str(floor_dir)], check=True)
        # a first snapshot writes an object per file: neither is to pay for the other's, or the
        # repository's, writes still on their way to the disk
        os.sync()
        started = time.perf_counter()
        await store.snapshot()
        first = time.perf_counter() - started
        os.sync()
        first_floor = _floor(root, floor_dir)
        ours: list[float] = []
        floor: list[float] = []
        ours_cpu: list[float] = []
        floor_cpu: list[float] = []
        told = 0

        async def snapshot() -> None:
            nonlocal told
            cpu, started = _cpu(), time.perf_counter()
            await store.snapshot()
            ours.append(time.perf_counter() - started)
            ours_cpu.append(_cpu() - cpu)
            told += store.last_look == "events"

        def plain() -> None:
            cpu = _cpu()
            floor.append(_floor(root, floor_dir))
            floor_cpu.append(_cpu() - cpu)

        for round_ in range(repeats):
            _change(paths, changed, round_)
            # each side sees the same changed files: alternate which goes first
            if round_ % 2:
                plain()
                await snapshot()
            else:
                await snapshot()
                plain()
        store.release()
        waits = [
            await _first_turn_wait(
                root, Path(tmp) / f"sup{n}", paths, changed, repeats + n, prompt_after
            )
            for n in range(first_turns)
        ]
        snapshot, plain = _pcts(ours), _pcts(floor)
        return {
            "files": files,
            "changed": changed,
            "repeats": repeats,
            "first_ms": round(first * 1000, 1),
            "first_floor_ms": round(first_floor * 1000, 1),
            "first_ratio": round(first / first_floor, 2),
            "snapshot": snapshot,
            "floor": plain,
            "p50_ratio": round(snapshot["p50_ms"] / plain["p50_ms"], 2),
            "snapshot_cpu_p50_ms": _pcts(ours_cpu)["p50_ms"],
            "floor_cpu_p50_ms": _pcts(floor_cpu)["p50_ms"],
            "watched": watch,
            "told_by_watcher": told,
            "prompt_after_s": prompt_after,
            "first_turn_wait_ms": [round(wait * 1000, 1) for wait in waits],
            "first_turn_wait_p50_ms": round(statistics.median(waits) * 1000, 1),
            "cores": os.cpu_count(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--changed", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--first-turns", type=int, default=3, help="new sessions' first turns")
    parser.add_argument("--prompt-after", type=float, default=1.0, help="s after the start")
    parser.add_argument(
        "--no-watch", action="store_true", help="no watcher: every snapshot git's full pass"
    )
    parser.add_argument("--json", action="store_true", help="the figures as one JSON line too")
    args = parser.parse_args()
    result = trio.run(
        _run,
        args.files,
        args.changed,
        args.repeats,
        args.first_turns,
        args.prompt_after,
        not args.no_watch,
    )
    print(json.dumps(result, indent=2))
    if args.json:  # flat, as bench/run_all.py reads them
        snapshot, floor = result["snapshot"], result["floor"]
        assert isinstance(snapshot, dict) and isinstance(floor, dict)
        flat = {
            "snapshot_p50_ms": snapshot["p50_ms"],
            "snapshot_p90_ms": snapshot["p90_ms"],
            "floor_p50_ms": floor["p50_ms"],
            "p50_ratio": result["p50_ratio"],
            "snapshot_cpu_p50_ms": result["snapshot_cpu_p50_ms"],
            "floor_cpu_p50_ms": result["floor_cpu_p50_ms"],
            "told_by_watcher": result["told_by_watcher"],
            "first_ms": result["first_ms"],
            "first_floor_ms": result["first_floor_ms"],
            "first_ratio": result["first_ratio"],
            "first_turn_wait_p50_ms": result["first_turn_wait_p50_ms"],
            "prompt_after_s": result["prompt_after_s"],
            "files": result["files"],
        }
        print(json.dumps(flat))


if __name__ == "__main__":
    main()
