"""The shadow store on real directories: what a snapshot keeps, what changed, a restore."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from unprivileged import child_main, run_unprivileged
from worktrees import fingerprint as _fingerprint
from worktrees import git as _git
from worktrees import tree as _tree

from supervisor.checkpoints import Change, ShadowStore, Snapshot


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    (root / "keep.txt").write_text("kept\n")
    (root / "gone.txt").write_text("to be deleted\n")
    (root / "sub").mkdir()
    (root / "sub" / "edit.py").write_text("print(1)\n")
    (root / "bin.dat").write_bytes(bytes(range(256)) * 4)
    return root


def _store(tmp_path: Path, work: Path, **options: int) -> ShadowStore:
    return ShadowStore(tmp_path / "state" / "checkpoints", work, **options)


async def test_a_turns_changes_in_a_directory_that_is_no_repository(
    tmp_path: Path, work: Path
) -> None:
    store = _store(tmp_path, work)
    before = await store.snapshot()
    (work / "gone.txt").unlink()
    (work / "sub" / "edit.py").write_text("print(2)\n")
    (work / "new.md").write_text("new\n")
    (work / "bin.dat").write_bytes(b"\0\xff" * 100)
    after = await store.snapshot()
    assert await store.changes(before, after) == [
        Change(b"bin.dat", "modified"),
        Change(b"gone.txt", "deleted"),
        Change(b"new.md", "added"),
        Change(b"sub/edit.py", "modified"),
    ]
    assert await store.changes(after, after) == []
    assert not (work / ".git").exists()


async def test_the_users_git_is_byte_identical_after_snapshots_and_a_restore(
    tmp_path: Path, work: Path
) -> None:
    _git(work, "init", "-q")
    _git(work, "add", "keep.txt")
    _git(work, "commit", "-qm", "first")
    (work / "staged.txt").write_text("staged\n")
    _git(work, "add", "staged.txt")
    git_before = _fingerprint(work / ".git")
    store = _store(tmp_path, work)
    start = await store.snapshot()
    (work / "keep.txt").write_text("changed\n")
    (work / "other.txt").write_text("other\n")
    await store.changes(start, await store.snapshot())
    await store.restore(start)
    assert _fingerprint(work / ".git") == git_before
    assert not str(store.git_dir).startswith(str(work))


async def test_ignored_files_are_neither_kept_nor_changes(tmp_path: Path, work: Path) -> None:
    _git(work, "init", "-q")
    (work / ".gitignore").write_text("*.log\nbuild/\n")
    (work / ".git" / "info" / "exclude").write_text("secret.env\n")
    store = _store(tmp_path, work)
    before = await store.snapshot()
    (work / "run.log").write_text("noise\n")
    (work / "build").mkdir()
    (work / "build" / "out.o").write_bytes(b"\x7fELF")
    (work / "secret.env").write_text("TOKEN=1\n")
    (work / "real.txt").write_text("real\n")
    after = await store.snapshot()
    assert await store.changes(before, after) == [Change(b"real.txt", "added")]


async def test_a_file_over_the_limit_is_named_not_kept(tmp_path: Path, work: Path) -> None:
    store = _store(tmp_path, work, max_file_bytes=1500)
    before = await store.snapshot()
    (work / "huge.bin").write_bytes(b"x" * 5000)
    (work / "keep.txt").write_bytes(b"y" * 2000)  # grows past the limit
    after = await store.snapshot()
    assert await store.changes(before, after) == [
        Change(b"huge.bin", "added", "too big to keep (5000 bytes)"),
        Change(b"keep.txt", "modified", "too big to keep (2000 bytes)"),
    ]
    assert set(after.too_big) == {b"huge.bin", b"keep.txt"}
    (work / "huge.bin").write_bytes(b"z" * 6000)
    later = await store.snapshot()
    assert await store.changes(after, later) == [
        Change(b"huge.bin", "modified", "too big to keep (6000 bytes)")
    ]
    # A restore never destroys what it could not keep: the big files stay as they are.
    result = await store.restore(before)
    assert (work / "huge.bin").read_bytes() == b"z" * 6000
    assert {path for path, _why in result.not_restored} == {b"huge.bin", b"keep.txt"}


async def test_paths_with_newlines_and_bytes_that_are_not_utf8(tmp_path: Path, work: Path) -> None:
    store = _store(tmp_path, work)
    before = await store.snapshot()
    odd = os.path.join(os.fsencode(work), b"line\nbreak \xff.txt")
    with open(odd, "wb") as f:
        f.write(b"odd\n")
    after = await store.snapshot()
    changes = await store.changes(before, after)
    assert changes == [Change(b"line\nbreak \xff.txt", "added")]
    wire = changes[0].to_wire()
    assert wire["path"] == "line\nbreak \\xff.txt"
    assert wire["path_b64"] == "bGluZQpicmVhayD/LnR4dA=="
    result = await store.restore(before)
    assert result.restored == [b"line\nbreak \xff.txt"]
    assert not os.path.exists(odd)


async def test_modes_and_symlinks_are_changes_and_are_restored(tmp_path: Path, work: Path) -> None:
    (work / "link").symlink_to("keep.txt")
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o644)
    store = _store(tmp_path, work)
    before = await store.snapshot()
    tree_before = _tree(work)
    (work / "run.sh").chmod(0o755)
    (work / "link").unlink()
    (work / "link").symlink_to("sub/edit.py")
    (work / "keep.txt").unlink()
    (work / "keep.txt").symlink_to("bin.dat")
    after = await store.snapshot()
    assert await store.changes(before, after) == [
        Change(b"keep.txt", "modified", "file -> symlink"),
        Change(b"link", "modified"),
        Change(b"run.sh", "modified", "file -> executable file"),
    ]
    result = await store.restore(before)
    assert result.restored == [b"keep.txt", b"link", b"run.sh"]
    assert result.not_restored == []
    assert _tree(work) == tree_before


async def test_a_restore_puts_back_byte_for_byte_and_is_itself_undoable(
    tmp_path: Path, work: Path
) -> None:
    store = _store(tmp_path, work)
    start = await store.snapshot()
    tree_start = _tree(work)
    (work / "gone.txt").unlink()
    (work / "sub" / "edit.py").write_bytes(b"\x00\x01binary now")
    (work / "deep" / "er").mkdir(parents=True)
    (work / "deep" / "er" / "new.txt").write_text("new\n")
    (work / "sub2").mkdir()
    (work / "sub2" / "x").write_text("x\n")
    tree_turn = _tree(work)
    result = await store.restore(start)
    assert result.restored == [b"deep/er/new.txt", b"gone.txt", b"sub/edit.py", b"sub2/x"]
    assert _tree(work) == tree_start
    assert not (work / "deep").exists() and not (work / "sub2").exists()
    assert not [p for p in work.rglob(".*rewind*")]
    # the rewind's own checkpoint undoes it
    await store.restore(result.before)
    assert _tree(work) == tree_turn


async def test_a_file_where_a_directory_was_and_back(tmp_path: Path, work: Path) -> None:
    store = _store(tmp_path, work)
    start = await store.snapshot()
    tree_start = _tree(work)
    (work / "sub" / "edit.py").unlink()
    (work / "sub").rmdir()
    (work / "sub").write_text("a file now\n")
    result = await store.restore(start)
    assert result.not_restored == []
    assert _tree(work) == tree_start


async def test_a_file_that_cannot_be_written_is_said_and_the_rest_restored(
    tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path, work)
    start = await store.snapshot()
    (work / "sub" / "edit.py").write_text("changed\n")
    (work / "keep.txt").write_text("changed\n")
    # A directory nobody may write in (a permission bits check would not stop root, who runs
    # these tests in CI): what the kernel answers there, for each file created in it.
    real_open = os.open
    denied = os.fsencode(work / "sub") + b"/"

    def open_denying(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and os.fsencode(path).startswith(denied):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_denying)
    result = await store.restore(start)
    monkeypatch.undo()
    assert result.restored == [b"keep.txt"]
    assert result.not_restored == [(b"sub/edit.py", "could not be written: Permission denied")]
    assert (work / "keep.txt").read_text() == "kept\n"
    assert (work / "sub" / "edit.py").read_text() == "changed\n"  # whole, never half
    assert sorted(p.name for p in (work / "sub").iterdir()) == ["edit.py"]  # nothing aside


async def test_a_working_directory_that_is_gone_is_said(tmp_path: Path, work: Path) -> None:
    from supervisor.checkpoints import CheckpointError

    store = _store(tmp_path, work)
    await store.snapshot()
    for path in sorted(work.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    work.rmdir()
    with pytest.raises(CheckpointError, match="is gone"):
        await store.snapshot()


async def test_a_diff_is_cut_at_its_limit_and_names_odd_paths_literally(
    tmp_path: Path, work: Path
) -> None:
    store = _store(tmp_path, work, max_file_bytes=100_000)
    (work / "*.py").write_text("star\n")  # a pathspec would match every .py: taken literally
    before = await store.snapshot()
    (work / "sub" / "edit.py").write_text("".join(f"line {n}\n" for n in range(2000)))
    (work / "*.py").write_text("still a star\n")
    (work / "huge.bin").write_bytes(b"x" * 200_000)
    after = await store.snapshot()
    star = await store.diff(before, after, b"*.py")
    assert "-star\n+still a star\n" in star.text and "edit.py" not in star.text
    whole = await store.diff(before, after, b"sub/edit.py")
    cut = await store.diff(before, after, b"sub/edit.py", max_bytes=1000)
    assert not whole.truncated and len(whole.text) > 1000
    assert cut.truncated and cut.text == whole.text[:1000]
    assert (await store.diff(before, after, b"huge.bin")).too_big


async def test_each_snapshot_sees_what_changed_since_the_last_one(
    tmp_path: Path, work: Path
) -> None:
    """Snapshots in a row: files new in old directories, in new ones, a file where a directory
    was and the reverse, a file touched but not changed, and nothing changed at all."""
    store = _store(tmp_path, work)
    first = await store.snapshot()
    same = await store.snapshot()  # nothing changed: the same tree, a snapshot of its own
    assert same.tree == first.tree and same.commit != first.commit
    (work / "sub" / "new.py").write_text("new\n")
    (work / "a" / "b").mkdir(parents=True)
    (work / "a" / "b" / "deep.txt").write_text("deep\n")
    os.utime(work / "keep.txt", ns=(1, 1))  # touched, same bytes
    second = await store.snapshot()
    assert await store.changes(first, second) == [
        Change(b"a/b/deep.txt", "added"),
        Change(b"sub/new.py", "added"),
    ]
    (work / "sub" / "edit.py").unlink()
    (work / "sub" / "new.py").unlink()
    (work / "sub").rmdir()
    (work / "sub").write_text("a file now\n")
    (work / "gone.txt").unlink()
    (work / "gone.txt").mkdir()
    (work / "gone.txt" / "inside").write_text("inside\n")
    third = await store.snapshot()
    assert await store.changes(second, third) == [
        Change(b"gone.txt", "deleted"),
        Change(b"gone.txt/inside", "added"),
        Change(b"sub", "added"),
        Change(b"sub/edit.py", "deleted"),
        Change(b"sub/new.py", "deleted"),
    ]
    # a new store object on the same store (a restarted supervisor) carries on from it
    again = _store(tmp_path, work)
    (work / "sub").write_text("changed\n")
    fourth = await again.snapshot()
    assert await again.changes(third, fourth) == [Change(b"sub", "modified")]
    # the commits and refs the store writes itself are git's own, each snapshot's kept
    store_git = ["git", "--git-dir", str(store.git_dir)]
    subprocess.run([*store_git, "fsck", "--strict", "--no-dangling"], check=True)
    shown = subprocess.run(
        [*store_git, "show", "-s", "--format=%H %T", "HEAD", "refs/checkpoints/" + first.commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert shown == [f"{s.commit} {s.tree}" for s in (fourth, first)]
    assert await store.load([same.commit]) == {same.commit: Snapshot(same.commit, same.tree)}


async def test_a_snapshot_that_failed_halfway_is_made_whole_by_the_next(
    tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.checkpoints import CheckpointError

    store = _store(tmp_path, work)
    first = await store.snapshot()
    (work / "keep.txt").write_text("changed\n")
    real_git = store._git

    async def failing_write_tree(*args: Any, **kwargs: Any) -> bytes:
        if args[0] == "write-tree":  # the index has the change; no tree, no commit
            raise CheckpointError("git write-tree failed: no space left on device")
        return await real_git(*args, **kwargs)

    monkeypatch.setattr(store, "_git", failing_write_tree)
    with pytest.raises(CheckpointError, match="no space"):
        await store.snapshot()
    monkeypatch.undo()
    assert await store.changes(first, await store.snapshot()) == [Change(b"keep.txt", "modified")]


async def test_a_nested_repositorys_files_are_kept_and_restored_like_any_other(
    tmp_path: Path, work: Path
) -> None:
    """A clone inside the working directory (its own ``.git``) is a gitlink to git: its files
    are looked into, by the ignore rules, and its ``.git`` is left alone. A store that holds
    it as a gitlink (made by ``git add -A``) looks into it from its next snapshot."""
    lib = work / "lib"
    (lib / "d").mkdir(parents=True)
    (lib / "a.txt").write_text("a\n")
    (lib / "d" / "t.txt").write_text("t\n")
    (lib / ".gitignore").write_text("*.log\n")
    _git(lib, "init", "-q")
    _git(lib, "add", "-A")
    _git(lib, "commit", "-qm", "lib")
    (lib / "untracked.txt").write_text("u\n")
    store = _store(tmp_path, work)
    _git(work, "init", "-q", "--bare", str(store.git_dir))
    _git(work, f"--git-dir={store.git_dir}", f"--work-tree={work}", "add", "-A")
    gitlinked = subprocess.run(
        ["git", f"--git-dir={store.git_dir}", "write-tree"], check=True, capture_output=True
    ).stdout.decode()
    start = await store.snapshot()
    tree_start, lib_git = _tree(work), _fingerprint(lib / ".git")
    (lib / "a.txt").write_text("changed\n")
    (lib / "d" / "t.txt").unlink()
    (lib / "new.txt").write_text("new\n")
    (lib / "noise.log").write_text("ignored\n")
    (work / "empty" / "repo").mkdir(parents=True)  # a repository with no files yet
    _git(work / "empty" / "repo", "init", "-q")
    after = await store.snapshot()
    assert await store.changes(start, after) == [
        Change(b"lib/a.txt", "modified"),
        Change(b"lib/d/t.txt", "deleted"),
        Change(b"lib/new.txt", "added"),
    ]
    result = await store.restore(start)
    assert result.restored == [b"lib/a.txt", b"lib/d/t.txt", b"lib/new.txt"]
    assert result.not_restored == []
    assert _tree(work) == {**tree_start, b"lib/noise.log": (0o100644, b"ignored\n")}
    assert _fingerprint(lib / ".git") == lib_git
    # a snapshot that held it as a gitlink has none of its files: they stay as they are
    result = await store.restore(Snapshot("0" * 40, gitlinked.strip()))
    assert _tree(work) == {**tree_start, b"lib/noise.log": (0o100644, b"ignored\n")}
    assert [path for path, _why in result.not_restored] == [
        b"lib",
        b"lib/.gitignore",
        b"lib/a.txt",
        b"lib/d/t.txt",
        b"lib/untracked.txt",
    ]


def test_a_file_that_cannot_be_read_is_skipped_named_and_left_by_a_rewind(tmp_path: Path) -> None:
    """A turn makes one file unreadable and a new one too, and changes others: the snapshot
    keeps the others, names the unreadable ones, and a rewind restores the others and leaves
    them as they are. As root (who reads every file) the store runs as nobody, in a child
    process."""
    run_unprivileged(__file__, unreadable, 60)


async def unreadable(tmp_path: Path) -> None:
    """(Plain asserts: run by a child process, whose failure the test shows.)"""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_bytes(b"a\n\xff")
    (work / "secret.txt").write_text("s\n")
    store = _store(tmp_path, work)
    start = await store.snapshot()
    (work / "a.txt").write_text("changed\n")
    (work / "new.txt").write_text("new\n")
    (work / "secret.txt").write_text("the turn's secret\n")
    (work / "secret.txt").chmod(0)
    (work / "fresh.txt").write_text("never readable\n")
    (work / "fresh.txt").chmod(0)
    end = await store.snapshot()
    why = "cannot be read (permission denied): its content is not kept"
    found = await store.changes(start, end)
    assert found == [
        Change(b"a.txt", "modified"),
        Change(b"fresh.txt", "added", why),
        Change(b"new.txt", "added"),
        Change(b"secret.txt", "modified", why),
    ], found
    assert await store.changes(end, await store.snapshot()) == []  # still so: nothing new

    result = await store.restore(start)
    assert result.restored == [b"a.txt", b"new.txt"], result
    assert result.not_restored == [
        (b"fresh.txt", "cannot be read now: left as it is"),
        (b"secret.txt", "cannot be read now: left as it is"),
    ], result.not_restored
    assert (work / "a.txt").read_bytes() == b"a\n\xff"
    assert not (work / "new.txt").exists()
    for name, size in (("secret.txt", 18), ("fresh.txt", 15)):  # left as they are
        assert (work / name).stat().st_size == size and (work / name).stat().st_mode & 0o777 == 0

    (work / "secret.txt").chmod(0o600)  # readable again: kept as any file
    again = await store.snapshot()
    assert again.unreadable.keys() == {b"fresh.txt"}
    assert (await store.load([again.commit]))[again.commit].unreadable == again.unreadable
    assert b"secret.txt" in [c.path for c in await store.changes(end, again)]


if __name__ == "__main__":  # a test's child process (test_a_file_that_cannot_be_read_...)
    child_main(globals())
