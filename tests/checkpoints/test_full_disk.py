"""A disk that fills: under the checkpoint store during a turn's snapshots, and under the
working directory during a rewind. Each test runs in a child process with a mount namespace
of its own, where a small tmpfs is the full disk (``unshare -m`` as root, ``unshare -Urm`` as a
user where user namespaces are allowed; skipped where neither is)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

#: The small disk: room for the store's first snapshots, not for the payload below.
DISK_BYTES = 2 * 1024 * 1024
#: Whatever the machine's load, a test that takes longer is stuck.
BOUND_S = 60.0


@functools.cache
def _unshare() -> list[str] | None:
    """The command that runs a process in a mount namespace of its own, where it may mount."""
    if shutil.which("unshare") is None:
        return None
    for command in (["unshare", "-m"], ["unshare", "-Urm"]):
        if command == ["unshare", "-m"] and os.geteuid() != 0:
            continue
        probe = [*command, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return command
    return None


def _on_small_disk(scenario: str, tmp_path: Path, small: Path) -> None:
    """Run ``scenario`` (an async function of this module, given ``tmp_path``) in a child
    process whose ``small`` is a tmpfs of :data:`DISK_BYTES`."""
    command = _unshare()
    if command is None:
        pytest.skip("no mount namespace can be made here (unshare)")
    small.mkdir(parents=True, exist_ok=True)
    mount = 'mount -t tmpfs -o size="$1" tmpfs "$2" && exec "$3" "$4" "$5" "$6"'
    done = subprocess.run(
        [*command, "sh", "-c", mount, "sh", str(DISK_BYTES), str(small)]
        + [sys.executable, __file__, scenario, str(tmp_path)],
        capture_output=True,
        timeout=BOUND_S * 2,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def test_a_store_that_fills_ends_the_turn_says_why_and_the_next_works_once_space_is_back(
    tmp_path: Path,
) -> None:
    _on_small_disk("store_fills", tmp_path, tmp_path / "s" / "checkpoints")


def test_a_rewind_the_disk_has_no_room_for_touches_nothing_and_says_why(tmp_path: Path) -> None:
    _on_small_disk("work_fills", tmp_path, tmp_path / "disk")


# -- in the child process (no pytest there to say what differed) --------------------------


def _same(got: object, wanted: object) -> None:
    """Equal, whichever of the snapshot's git commands met the full disk first."""
    if _GIT_STEP.sub("git failed", repr(got)) != _GIT_STEP.sub("git failed", repr(wanted)):
        raise AssertionError(f"{got!r} != {wanted!r}")


_GIT_STEP = re.compile(r"git [a-z-]+ failed")


def _fill(disk: Path, leave: int) -> Path:
    """A file that leaves ``leave`` bytes free on ``disk``."""
    info = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, info.f_bavail * info.f_frsize - leave))
    return filler


async def store_fills(tmp_path: Path) -> None:
    from checkpoints.test_session_checkpoints import session_in
    from worktrees import tree

    from protocols import events as ev
    from supervisor import AgentSpec
    from supervisor.errors import BadRequest, CheckpointFailed
    from supervisor.testing import record
    from supervisor.testing._acp import AcpAgent, AcpBehaviour, AcpLauncher

    class WritingAgent(AcpAgent):
        """Its tool writes the launcher's payload to ``out.bin``."""

        async def run_tool(self, seconds: float) -> None:
            assert isinstance(self.launcher, WritingLauncher)
            (self.launcher.work / "out.bin").write_bytes(self.launcher.payload)

    class WritingLauncher(AcpLauncher):
        def __init__(self, work: Path) -> None:
            super().__init__(AcpBehaviour(tool=0.01, words=2, word_interval=0.0))
            self.work = work
            self.payload = b"small\n"

        def launch(self, link: Any, spec: AgentSpec, resume: str | None) -> AcpAgent:
            return WritingAgent(link, self)

    store_disk = tmp_path / "s" / "checkpoints"
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    launcher = WritingLauncher(work)
    async with (
        session_in(work, launcher, tmp_path) as session,
        record(session) as recorder,
    ):

        async def turn(payload: bytes) -> tuple[ev.TurnEnded, list[str]]:
            launcher.payload = payload
            handle = await session.prompt("write")
            ended = await recorder.wait_for(
                lambda e: e.kind == "turn.ended" and e.turn_id == handle.id
            )
            assert isinstance(ended, ev.TurnEnded)
            said = [
                e.message
                for e in recorder.events
                if isinstance(e, ev.ErrorEvent) and e.code == "checkpoint_failed"
            ]
            recorder.events.clear()
            return ended, said

        first, said = await turn(b"small\n")
        _same(
            (first.outcome, first.changes, said),
            ("completed", [{"path": "out.bin", "change": "added"}], []),
        )
        filler = _fill(store_disk, 64 * 1024)
        big = os.urandom(1024 * 1024)  # does not compress: needs its size in the store
        full = f"no space left on the checkpoint store's disk ({store_disk}): git add failed"

        # The disk fills during the turn: its end's snapshot fails, the turn still ends.
        second, said = await turn(big)
        _same((second.outcome, second.changes), ("completed", None))
        _same(said, [f"what turn {second.turn_id} changed is not known: {full}"])
        # Still full at the next turn's start: it runs without a checkpoint.
        third, said = await turn(big)
        _same((third.outcome, third.changes), ("completed", None))
        _same(said, [f"turn {third.turn_id} starts without a checkpoint: {full}"])
        try:
            await session.rewind(third.turn_id)
            raise AssertionError("a turn without a checkpoint was rewound")
        except BadRequest as exc:
            assert "has no checkpoint" in str(exc)
        # A rewind keeps the state before it first: with no room for that, it is
        # refused and nothing is touched.
        still = tree(work)
        try:
            await session.rewind(second.turn_id)
            raise AssertionError("a rewind went ahead without keeping the state before")
        except CheckpointFailed as exc:
            _same(str(exc), f"session {session.id} could not rewind: {full}")
        _same(tree(work), still)
        # What git had half written is gone: the space is the filler's to give back.
        assert not list(store_disk.rglob("tmp_obj_*"))

        filler.unlink()
        fourth, said = await turn(b"small again\n")
        _same((fourth.changes, said), ([{"path": "out.bin", "change": "modified"}], []))
        before = tree(work)
        await session.rewind(fourth.turn_id)
        assert (work / "out.bin").read_bytes() == big
        assert tree(work) != before


async def work_fills(tmp_path: Path) -> None:
    from worktrees import tree

    from supervisor.checkpoints import CheckpointError, ShadowStore

    disk = tmp_path / "disk"
    work = disk / "work"
    work.mkdir()
    (work / "keep.txt").write_text("kept\n")
    (work / "data.bin").write_bytes(os.urandom(600 * 1024))
    (work / "gone.txt").write_text("to be deleted\n")
    store = ShadowStore(tmp_path / "state", work)
    start = await store.snapshot()
    (work / "data.bin").write_bytes(b"shrunk\n")
    (work / "gone.txt").unlink()
    (work / "new.txt").write_text("new\n")
    (work / "keep.txt").write_text("changed\n")
    filler = _fill(disk, 256 * 1024)
    turned = tree(work)
    try:
        await store.restore(start)
        raise AssertionError("a restore with no room for it went ahead")
    except CheckpointError as exc:
        assert "not enough space on the working directory's disk" in str(exc)
        assert str(exc).endswith("nothing was restored")
    _same(tree(work), turned)  # not one file put back, none half
    filler.unlink()
    result = await store.restore(start)
    _same(
        (result.restored, result.not_restored),
        ([b"data.bin", b"gone.txt", b"keep.txt", b"new.txt"], []),
    )
    assert len((work / "data.bin").read_bytes()) == 600 * 1024


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).parent.parent)]
    trio.run(globals()[sys.argv[1]], Path(sys.argv[2]))
