"""A session's checkpoints, end to end on the real clock (git runs as processes): an in-memory
ACP agent whose tool edits, creates and deletes files in the session's directory."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from unprivileged import child_main, run_unprivileged
from worktrees import fingerprint as _fingerprint
from worktrees import git as _git
from worktrees import tree as _tree

from protocols import events as ev
from supervisor import AgentSpec, open_supervisor
from supervisor.errors import BadRequest, Busy
from supervisor.supervisor import AnySession
from supervisor.testing import Recorder, record
from supervisor.testing._acp import AcpAgent, AcpBehaviour, AcpLauncher

#: Whatever the machine's load, a test that takes longer is stuck.
BOUND_S = 60.0


class FileToolAgent(AcpAgent):
    """Its tool call edits, creates and deletes files, then runs on until it is stopped."""

    async def run_tool(self, seconds: float) -> None:
        launcher = self.launcher
        assert isinstance(launcher, FileToolLauncher)
        await self.update(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "call_files",
                "title": "edit files",
                "kind": "edit",
                "status": "in_progress",
            }
        )
        work = launcher.work
        (work / "src" / "app.py").write_text("print('rewritten')\n")
        (work / "notes.txt").unlink(missing_ok=True)
        (work / "new" / "dir").mkdir(parents=True, exist_ok=True)
        (work / "new" / "dir" / "made.bin").write_bytes(b"\x00\xff" * 64)
        for name in launcher.hide:  # written, then made unreadable
            (work / name).write_text("the tool's secret\n")
            (work / name).chmod(0)
        launcher.wrote.set()
        await trio.sleep(seconds)


class FileToolLauncher(AcpLauncher):
    def __init__(self, behaviour: AcpBehaviour, work: Path, hide: tuple[str, ...] = ()) -> None:
        super().__init__(behaviour)
        self.work = work
        self.wrote = trio.Event()
        #: files the tool writes, then makes unreadable
        self.hide = hide

    def launch(self, link: Any, spec: AgentSpec, resume: str | None) -> AcpAgent:
        return FileToolAgent(link, self)


EXPECTED = [
    {"path": "new/dir/made.bin", "change": "added"},
    {"path": "notes.txt", "change": "deleted"},
    {"path": "src/app.py", "change": "modified"},
]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('first')\n")
    (root / "notes.txt").write_text("notes\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "start")
    return root


def _spec(**changes: Any) -> AgentSpec:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    return spec.with_options(**changes) if changes else spec


@asynccontextmanager
async def session_in(
    work: Path, launcher: AcpLauncher, tmp_path: Path, **changes: Any
) -> AsyncIterator[AnySession]:
    """A session of the agent ``fake`` (:func:`_spec` with ``changes``) in ``work``, its
    checkpoints kept under ``tmp_path``; a test that takes longer than :data:`BOUND_S` is
    stuck."""
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": _spec(**changes)}, launcher=launcher, state_dir=tmp_path / "s"
        ) as sup:
            yield await sup.start_session("fake", cwd=str(work))


async def _turn_ended(recorder: Recorder, turn_id: str) -> ev.TurnEnded:
    event = await recorder.wait_for(lambda e: e.kind == "turn.ended" and e.turn_id == turn_id)
    assert isinstance(event, ev.TurnEnded)
    return event


@pytest.mark.parametrize(
    ("stop_delay", "grace_s", "outcome"),
    [(0.0, 2.0, "cancelled"), (None, 0.2, "killed")],
    ids=["cancelled", "killed"],
)
async def test_a_stopped_turns_receipt_lists_what_its_tool_changed_and_rewind_undoes_it(
    tmp_path: Path, work: Path, stop_delay: float | None, grace_s: float, outcome: str
) -> None:
    launcher = FileToolLauncher(AcpBehaviour(tool=100.0, stop_delay=stop_delay), work)
    git_before = _fingerprint(work / ".git")
    tree_before = _tree(work)
    async with (
        session_in(work, launcher, tmp_path, grace_s=grace_s) as session,
        record(session) as recorder,
    ):
        turn = await session.prompt("edit the files")
        await launcher.wrote.wait()
        tree_turn = _tree(work)
        receipt = await session.cancel()
        assert receipt.outcome == outcome
        assert receipt.changes == EXPECTED
        ended = await _turn_ended(recorder, turn.id)
        assert ended.changes == EXPECTED
        assert ended.receipt is not None and ended.receipt["changes"] == EXPECTED

        result = await session.rewind(turn.id)
        assert result["restored"] == ["new/dir/made.bin", "notes.txt", "src/app.py"]
        assert result["not_restored"] == []
        assert _tree(work) == tree_before
        assert not (work / "new").exists()
        rewound = await recorder.wait_for(lambda e: e.kind == "session.rewound")
        assert isinstance(rewound, ev.SessionRewound)
        assert rewound.restored == result["restored"]

        # the rewind is itself undoable
        await session.rewind(result["undo"])
        assert _tree(work) == tree_turn
    assert _fingerprint(work / ".git") == git_before


async def test_stop_and_rewind_in_one_call_and_a_rewind_while_a_turn_runs_is_busy(
    tmp_path: Path, work: Path
) -> None:
    launcher = FileToolLauncher(AcpBehaviour(tool=100.0), work)
    tree_before = _tree(work)
    async with session_in(work, launcher, tmp_path) as session:
        turn = await session.prompt("edit the files")
        await launcher.wrote.wait()
        with pytest.raises(Busy, match=f"turn {turn.id} runs"):
            await session.rewind(turn.id)
        receipt = await session.cancel(rewind=True)
        assert receipt.changes == EXPECTED
        assert receipt.restored is not None
        assert receipt.restored["restored"] == [
            "new/dir/made.bin",
            "notes.txt",
            "src/app.py",
        ]
        assert _tree(work) == tree_before


async def test_a_completed_turn_carries_its_changes_and_an_agent_may_keep_none(
    tmp_path: Path, work: Path
) -> None:
    launcher = FileToolLauncher(AcpBehaviour(tool=0.01, words=2, word_interval=0.0), work)
    agents = {"fake": _spec(), "plain": _spec(name="plain", checkpoints=False)}
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents=agents, launcher=launcher, state_dir=tmp_path / "s"
        ) as sup:
            session = await sup.start_session("fake", cwd=str(work))
            async with record(session) as recorder:
                turn = await session.prompt("edit the files")
                ended = await _turn_ended(recorder, turn.id)
                assert (ended.outcome, ended.changes) == ("completed", EXPECTED)
                # the next turn's changes are its own
                second = await session.prompt("again")
                ended = await _turn_ended(recorder, second.id)
                assert ended.changes == []
            plain = await sup.start_session("plain", cwd=str(work))
            turn = await plain.prompt("again")
            with pytest.raises(BadRequest, match="keeps no checkpoints"):
                await plain.rewind(turn.id)
    assert not os.path.exists(work / ".git" / "refs" / "heads" / "checkpoints")
    subprocess.run(["git", "status"], cwd=work, check=True, capture_output=True)


async def test_a_turns_diff_of_one_path_from_its_checkpoints(tmp_path: Path, work: Path) -> None:
    launcher = FileToolLauncher(AcpBehaviour(tool=100.0), work)
    async with session_in(work, launcher, tmp_path) as session:
        turn = await session.prompt("edit the files")
        await launcher.wrote.wait()
        with pytest.raises(BadRequest, match="has no changes of"):
            await session.diff(turn.id, "src/app.py")  # still running
        await session.cancel(rewind=True)

        modified = await session.diff(turn.id, "src/app.py")
        assert "-print('first')\n+print('rewritten')\n" in modified["diff"]
        assert modified["diff"].startswith("diff --git a/src/app.py b/src/app.py\n")
        assert (modified["binary"], modified["truncated"]) == (False, False)
        deleted = await session.diff(turn.id, "notes.txt")
        assert "deleted file mode" in deleted["diff"] and "-notes\n" in deleted["diff"]
        binary = await session.diff(turn.id, "new/dir/made.bin")
        assert binary["binary"] is True
        assert "Binary files /dev/null and b/new/dir/made.bin differ" in binary["diff"]
        untouched = await session.diff(turn.id, "other.txt")
        assert untouched["diff"] == ""


async def test_a_working_directory_that_disappears_ends_the_turn_and_is_said(
    tmp_path: Path, work: Path
) -> None:
    """The turn still ends and answers; what it changed is not known, and a rewind says why
    it cannot be made."""

    from supervisor.errors import CheckpointFailed

    launcher = FileToolLauncher(AcpBehaviour(tool=100.0), work)
    async with (
        session_in(work, launcher, tmp_path) as session,
        record(session) as recorder,
    ):
        turn = await session.prompt("edit the files")
        await launcher.wrote.wait()
        shutil.rmtree(work)
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.changes) == ("cancelled", None)
        said = await recorder.wait_kind("error")
        assert isinstance(said, ev.ErrorEvent) and said.code == "checkpoint_failed"
        gone = f"the working directory {work} is gone"
        assert said.message == f"what turn {turn.id} changed is not known: {gone}"
        ended = await _turn_ended(recorder, turn.id)
        assert (ended.outcome, ended.changes) == ("cancelled", None)
        with pytest.raises(CheckpointFailed, match=f"could not rewind: {gone}"):
            await session.rewind(turn.id)


async def test_the_first_snapshot_runs_as_the_session_starts_and_a_stop_ends_its_git(
    tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's first snapshot is under way before any prompt; a prompt waits for it, a
    cancel does not, and a stop ends it with its git process. Here its walk of the tree
    (``git status``) never finishes (a ``git`` first on the PATH that sleeps instead)."""

    pid_fifo = tmp_path / "status.pid"
    os.mkfifo(pid_fifo)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_git = bin_dir / "git"
    fake_git.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        f'  if [ "$arg" = status ]; then echo $$ > "{pid_fifo}"; exec sleep 300; fi\n'
        "done\n"
        f'exec "{shutil.which("git")}" "$@"\n'
    )
    fake_git.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    launcher = FileToolLauncher(AcpBehaviour(tool=0.01, words=2, word_interval=0.0), work)
    async with session_in(work, launcher, tmp_path) as session:
        said = await trio.to_thread.run_sync(pid_fifo.read_text, abandon_on_cancel=True)
        git_walk = int(said)
        turn = await session.prompt("edit the files")
        assert not turn.queued
        receipt = await session.cancel()
        assert (receipt.turn_id, receipt.outcome) == (turn.id, "cancelled")
        os.kill(git_walk, 0)  # still at work
        await session.stop()
    assert not launcher.wrote.is_set()
    with pytest.raises(ProcessLookupError):  # ended and reaped
        os.kill(git_walk, 0)


async def test_a_cancel_never_waits_for_a_snapshot_under_way(tmp_path: Path, work: Path) -> None:
    """However long a turn's start snapshot takes (a first one of 100,000 files takes tens of
    seconds, ``bench/checkpoint_snapshot_100k.py``), a cancel of that turn answers at once:
    here the snapshot cannot even begin, the store held by the test."""
    launcher = FileToolLauncher(AcpBehaviour(tool=0.01, words=2, word_interval=0.0), work)
    async with (
        session_in(work, launcher, tmp_path) as session,
        record(session) as recorder,
    ):
        store = session._checkpoints  # type: ignore[attr-defined]
        async with store._lock:
            turn = await session.prompt("edit the files")
            assert not turn.queued
            receipt = await session.cancel()
            assert (receipt.turn_id, receipt.outcome) == (turn.id, "cancelled")
            ended = await _turn_ended(recorder, turn.id)
            assert ended.outcome == "cancelled"
        assert not launcher.wrote.is_set()  # it never reached the agent
        # the snapshot taken once the store is free is the next turn's
        second = await session.prompt("edit the files")
        ended = await _turn_ended(recorder, second.id)
        assert (ended.outcome, ended.changes) == ("completed", EXPECTED)


def test_a_turn_that_makes_a_file_unreadable_names_it_and_its_rewind_leaves_it() -> None:
    """The tool changes files and makes one unreadable: the turn's changes name it (and list
    the others), and a rewind restores the others and leaves it as it is. As root (who reads
    every file) the supervisor runs as nobody, in a child process."""
    run_unprivileged(__file__, unreadable_turn, BOUND_S)


async def unreadable_turn(tmp_path: Path) -> None:
    """(Plain asserts: run by a child process, whose failure the test shows.)"""
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "app.py").write_text("print('first')\n")
    (work / "notes.txt").write_text("notes\n")
    (work / "secret.txt").write_text("s\n")
    launcher = FileToolLauncher(
        AcpBehaviour(tool=0.01, words=2, word_interval=0.0), work, hide=("secret.txt",)
    )
    async with (
        session_in(work, launcher, tmp_path) as session,
        record(session) as recorder,
    ):
        turn = await session.prompt("edit the files")
        ended = await _turn_ended(recorder, turn.id)
        why = "cannot be read (permission denied): its content is not kept"
        assert ended.changes == [
            *EXPECTED[:2],
            {"path": "secret.txt", "change": "modified", "detail": why},
            EXPECTED[2],
        ], ended.changes
        result = await session.rewind(turn.id)
        assert result["restored"] == ["new/dir/made.bin", "notes.txt", "src/app.py"]
        assert result["not_restored"] == [
            {"path": "secret.txt", "why": "cannot be read now: left as it is"}
        ], result
        assert (work / "src" / "app.py").read_text() == "print('first')\n"
        assert (work / "notes.txt").read_text() == "notes\n"
        assert not (work / "new").exists()
        secret = (work / "secret.txt").stat()
        assert (secret.st_size, secret.st_mode & 0o777) == (18, 0)  # as the tool left it


def _inotify_instances() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if _readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify")


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


async def test_the_directory_is_watched_while_a_session_runs_there_and_no_longer(
    tmp_path: Path, work: Path
) -> None:
    """A turn's end snapshot comes from the watcher's events, and the watcher (its inotify
    descriptor) is closed with the session."""
    launcher = FileToolLauncher(AcpBehaviour(tool=0.01, words=2, word_interval=0.0), work)
    before = _inotify_instances()
    async with (
        session_in(work, launcher, tmp_path) as session,
        record(session) as recorder,
    ):
        turn = await session.prompt("edit the files")
        ended = await _turn_ended(recorder, turn.id)
        assert (ended.outcome, ended.changes) == ("completed", EXPECTED)
        store = session._checkpoints  # type: ignore[attr-defined]
        assert store.last_look == "events"
        assert _inotify_instances() == before + 1
    # (the session's task has ended with the supervisor's block)
    assert store._watcher is None
    assert _inotify_instances() == before


if __name__ == "__main__":  # a test's child process (test_a_turn_that_makes_a_file_...)
    child_main(globals())


async def test_a_state_directory_inside_the_working_directory_is_never_recorded(
    work: Path,
) -> None:
    """A supervisor started in the project it supervises keeps its state there (its
    checkpoint store included): a turn's changes are its tool's alone, and a rewind leaves the
    state directory as it is. The directory's name has glob characters, taken literally."""
    launcher = FileToolLauncher(AcpBehaviour(tool=0.01, words=2, word_interval=0.0), work)
    state = work / "run" / "state [*]"
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": _spec()}, launcher=launcher, state_dir=state
        ) as sup:
            session = await sup.start_session("fake", cwd=str(work))
            async with record(session) as recorder:
                for n in range(2):  # (the second: after the store wrote the first's refs)
                    turn = await session.prompt("edit the files")
                    ended = await _turn_ended(recorder, turn.id)
                    assert ended.changes == (EXPECTED if n == 0 else []), ended.changes
                stored = _tree(state)
                result = await session.rewind(turn.id)
                assert result["restored"] == [] and result["not_restored"] == [], result
                result = await session.rewind("t1")
                assert result["restored"] == ["new/dir/made.bin", "notes.txt", "src/app.py"]
                assert _tree(state).keys() >= stored.keys()  # nothing of its own undone
