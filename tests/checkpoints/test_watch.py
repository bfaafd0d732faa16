"""Snapshots told what changed by the inotify watcher: the same tree as git's full pass, over
random edits, and a full pass whenever the events cannot tell."""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from inotify_simple import INotify, flags  # type: ignore[import-untyped]

from supervisor.checkpoints import Change, ShadowStore
from supervisor.checkpoints import watch as watch_module
from supervisor.checkpoints.watch import Changes, Watcher


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    (root / "a" / "b").mkdir(parents=True)
    (root / "top.txt").write_text("top\n")
    (root / "a" / "one.txt").write_text("one\n")
    (root / "a" / "b" / "two.txt").write_text("two\n")
    return root


def _files(watcher: Watcher) -> frozenset[bytes] | None:
    changes = watcher.changed()
    return None if changes is None else changes.files


def _watching(work: Path, **options: int) -> Watcher:
    watcher = Watcher(str(work), **options)
    assert watcher.changed() is None  # the first look: the watches are set up, a full look
    return watcher


# -- the watcher ------------------------------------------------------------------------------


def test_writes_creations_deletions_renames_and_new_trees_are_named(work: Path) -> None:
    watcher = _watching(work)
    assert watcher.changed() == Changes(frozenset(), frozenset())
    (work / "a" / "one.txt").write_text("one, again\n")
    (work / "top.txt").unlink()
    (work / "a" / "b" / "two.txt").rename(work / "moved.txt")
    os.chmod(work / "moved.txt", 0o755)
    os.symlink("moved.txt", work / "link")
    # a tree written before its watch exists: listed when its event is read
    (work / "n" / "m").mkdir(parents=True)
    (work / "n" / "m" / "early.txt").write_text("early\n")
    (work / "n" / "x.txt").write_text("x\n")
    files = {b"a/one.txt", b"top.txt", b"a/b/two.txt", b"moved.txt", b"link"}
    assert watcher.changed() == Changes(
        frozenset({*files, b"n/m/early.txt", b"n/x.txt"}), frozenset({b"n", b"n/m"})
    )
    assert watcher.changed() == Changes(frozenset(), frozenset())  # each change told once
    (work / "n" / "m" / "later.txt").write_text("later\n")  # and the new tree is watched
    shutil.rmtree(work / "a")  # a deleted tree: each file's own event
    assert watcher.changed() == Changes(
        frozenset({b"n/m/later.txt", b"a/one.txt"}), frozenset({b"a", b"a/b"})
    )
    watcher.close()


def test_directories_it_skips_are_neither_watched_nor_named(work: Path) -> None:
    """The supervisor's own state directory below the tree: what is written there, made
    there before or after the watches, is never a change."""
    (work / "a" / "state").mkdir()
    watcher = Watcher(str(work), skip={b"a/state", b"later"})
    assert watcher.changed() is None
    (work / "a" / "state" / "sessions.db").write_text("rows\n")
    (work / "later" / "checkpoints").mkdir(parents=True)
    (work / "later" / "checkpoints" / "HEAD").write_text("ref\n")
    (work / "a" / "one.txt").write_text("one, again\n")
    assert watcher.changed() == Changes(frozenset({b"a/one.txt"}), frozenset())
    (work / "later" / "checkpoints" / "index").write_text("entries\n")
    assert watcher.changed() == Changes(frozenset(), frozenset())
    watcher.close()


@pytest.mark.parametrize(
    "change",
    [
        "move a directory",
        "edit .gitignore",
        "edit .gitattributes",
        "nest a repository",
        "a new tree holding a repository",
        "more paths than the bound",
        "the queue overflowed",
    ],
)
def test_what_the_events_cannot_tell_exactly_means_a_full_look(work: Path, change: str) -> None:
    watcher = _watching(work, max_paths=5)
    if change == "move a directory":
        (work / "a").rename(work / "z")
    elif change == "edit .gitignore":
        (work / "a" / ".gitignore").write_text("*.log\n")
    elif change == "edit .gitattributes":
        (work / ".gitattributes").write_text("*.txt text\n")
    elif change == "nest a repository":
        subprocess.run(["git", "init", "-q", str(work / "a")], check=True)
    elif change == "a new tree holding a repository":
        subprocess.run(["git", "init", "-q", str(work / "fresh")], check=True)
    elif change == "more paths than the bound":
        for n in range(6):
            (work / f"n{n}.txt").write_text("x")
    else:  # the kernel's own overflow event, as it queues one (wd -1)
        watcher._event(-1, flags.Q_OVERFLOW, b"")
    assert watcher.changed() is None
    # and the watches are right again afterwards: a later write is named exactly
    (work / "later.txt").write_text("x")
    if change == "move a directory":
        (work / "z" / "b" / "two.txt").write_text("moved and written\n")
        assert _files(watcher) == frozenset({b"later.txt", b"z/b/two.txt"})
    else:
        assert _files(watcher) == frozenset({b"later.txt"})
    watcher.close()


def test_a_watch_over_the_systems_limit_gives_up_for_good(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def over_the_limit(self: INotify, path: bytes, mask: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(INotify, "add_watch", over_the_limit)
    watcher = Watcher(str(work))
    assert watcher.changed() is None
    assert watcher.broken is not None and "No space left on device" in watcher.broken
    (work / "top.txt").write_text("changed\n")
    assert watcher.changed() is None
    assert watcher._inotify is None  # its descriptor closed


def test_more_directories_than_the_bound_gives_up(work: Path) -> None:
    watcher = Watcher(str(work), max_watches=2)
    assert watcher.changed() is None
    assert watcher.broken == "more than 2 directories" and watcher._inotify is None


def test_no_inotify_in_libc_or_a_file_system_it_does_not_see_gives_up(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_inotify(*args: object, **kwargs: object) -> None:
        raise AttributeError("undefined symbol: inotify_init1")

    with monkeypatch.context() as patch:
        patch.setattr(watch_module, "INotify", no_inotify)
        watcher = Watcher(str(work))
        assert watcher.changed() is None
        assert watcher.broken is not None and "inotify is not available" in watcher.broken
    monkeypatch.setattr(watch_module, "_LOCAL_FS", frozenset())
    watcher = Watcher(str(work))
    assert watcher.changed() is None
    assert watcher.broken is not None and "may change where inotify does not see" in watcher.broken


# -- the store ----------------------------------------------------------------------------------

#: the size past which the stores under test leave a file out (small: big files come up often)
_BIG = 64


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


class _Tree:
    """Random changes to a working directory, of every kind a snapshot must keep right."""

    NAMES = ["f.txt", "g.py", "x.log", "caf\udce9", "two\nlines", "sp ace", "keep.log", "k"]

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def _dirs(self) -> list[Path]:
        found = [self.root]
        for here, dirs, _files in os.walk(self.root):
            dirs[:] = [d for d in dirs if d != ".git"]
            found.extend(Path(here) / d for d in dirs)
        return found

    def _files(self) -> list[Path]:
        found: list[Path] = []
        for here, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if d != ".git"]
            found.extend(Path(here) / f for f in files)
        return found

    def _content(self) -> bytes:
        size = self.rng.choice([0, 5, 20, _BIG + 10])
        return bytes(self.rng.randrange(256) for _ in range(size))

    def change(self) -> str:
        """One random change (its kind); one the tree does not allow (a rename over a
        directory) is skipped."""
        try:
            return self._change()
        except OSError:
            return "none"

    def _change(self) -> str:
        rng = self.rng
        files, dirs = self._files(), self._dirs()
        kind = rng.choice(
            ["edit", "edit", "add", "add", "new tree", "delete", "delete tree", "rename",
             "rename tree", "mode", "symlink", "touch", "ignore", "exclude", "nest",
             "file to tree", "fifo"]
        )  # fmt: skip
        target = rng.choice(files) if files else self.root / "f.txt"
        if kind == "edit" and files:
            target.unlink()  # a symlink's target is not to be written through
            target.write_bytes(self._content())
        elif kind == "add":
            (rng.choice(dirs) / rng.choice(self.NAMES)).write_bytes(self._content())
        elif kind == "new tree":
            deep = rng.choice(dirs) / f"t{rng.randrange(99)}" / "u"
            deep.mkdir(parents=True, exist_ok=True)
            (deep / rng.choice(self.NAMES)).write_bytes(self._content())
            (deep.parent / "v.txt").write_bytes(self._content())
        elif kind == "delete" and files:
            target.unlink()
        elif kind == "delete tree" and len(dirs) > 1:
            shutil.rmtree(rng.choice(dirs[1:]))
        elif kind == "rename" and files and not target.is_fifo():  # a fifo .gitignore hangs git
            target.rename(rng.choice(dirs) / rng.choice(self.NAMES))
        elif kind == "rename tree" and len(dirs) > 1:
            moved = rng.choice(dirs[1:])
            moved.rename(self.root / f"r{rng.randrange(99)}")
        elif kind == "mode" and files and not target.is_symlink():
            target.chmod(target.stat().st_mode ^ 0o100)
        elif kind == "symlink":
            link = rng.choice(dirs) / rng.choice(self.NAMES)
            if link.is_dir() and not link.is_symlink():
                return kind
            link.unlink(missing_ok=True)
            os.symlink(rng.choice(["f.txt", "../a", "nowhere", "b"]), link)
        elif kind == "touch" and files and not target.is_symlink():
            os.utime(target)
        elif kind == "ignore":
            rules = rng.sample(["*.log", "b/", "!keep.log", "sp*", "t1*/", "/k"], 2)
            (rng.choice(dirs) / ".gitignore").write_text("\n".join(rules) + "\n")
        elif kind == "exclude":
            (self.root / ".git" / "info" / "exclude").write_text(rng.choice(["*.py\n", "f*\n"]))
        elif kind == "nest" and rng.random() < 0.3 and len(dirs) > 1:
            nested = rng.choice(dirs[1:])
            if not (nested / ".git").exists():
                _git("init", "-q", cwd=nested)
        elif kind == "file to tree" and files:
            target.unlink()
            target.mkdir()
            (target / "inside.txt").write_bytes(self._content())
        elif kind == "fifo":
            fifo = rng.choice(dirs) / "pipe"
            if not fifo.exists():
                os.mkfifo(fifo)
        return kind


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_watched_snapshot_is_the_tree_the_full_pass_records(
    tmp_path: Path, work: Path, seed: int
) -> None:
    """Two stores of one directory, one held (its snapshots from the watcher's events), one
    not (git's full pass each time), after random changes of every kind: the same tree and
    the same files left out for their size, every time, and most of the watched snapshots
    from the events alone."""
    _git("init", "-q", cwd=work)
    (work / ".git" / "info" / "exclude").write_text("")
    watched = ShadowStore(tmp_path / "watched", work, max_file_bytes=_BIG)
    watched.hold()
    full = ShadowStore(tmp_path / "full", work, max_file_bytes=_BIG, watch=False)
    tree = _Tree(work, random.Random(seed))
    looks = []
    for round_ in range(40):
        kinds = [tree.change() for _ in range(tree.rng.randrange(1, 4))]
        ours, theirs = await watched.snapshot(), await full.snapshot()
        looks.append(watched.last_look)
        assert full.last_look == "full"
        assert (ours.tree, dict(ours.too_big)) == (theirs.tree, dict(theirs.too_big)), (
            round_,
            kinds,
        )
    assert looks.count("events") >= 12, looks
    watched.release()
    assert watched._watcher is None


async def test_the_watcher_lives_while_a_session_holds_the_store(
    tmp_path: Path, work: Path
) -> None:
    store = ShadowStore(tmp_path / "state", work)
    store.hold()
    first = await store.snapshot()  # sets the watches up, then looks at every file
    assert store.last_look == "full" and store._watcher is not None
    (work / "a" / "one.txt").write_text("edited\n")
    (work / "new.txt").write_text("new\n")
    second = await store.snapshot()
    assert store.last_look == "events"
    assert await store.changes(first, second) == [
        Change(b"a/one.txt", "modified"),
        Change(b"new.txt", "added"),
    ]
    store.release()
    assert store._watcher is None
    (work / "top.txt").write_text("changed\n")
    third = await store.snapshot()  # no holder: no watcher, a full look every time
    assert store.last_look == "full" and store._watcher is None
    assert await store.changes(second, third) == [Change(b"top.txt", "modified")]


async def test_a_snapshot_that_failed_is_followed_by_a_full_look(
    tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher's paths are consumed by a snapshot that then fails: the next one cannot
    rely on the events alone, and looks at every file."""
    store = ShadowStore(tmp_path / "state", work)
    store.hold()
    first = await store.snapshot()
    (work / "top.txt").write_text("changed\n")

    async def failing(*args: object) -> object:
        raise OSError(errno.EIO, "injected")

    with monkeypatch.context() as patch:
        patch.setattr(store, "_take", failing)
        with pytest.raises(OSError):
            await store.snapshot()
    second = await store.snapshot()
    assert store.last_look == "full"
    assert await store.changes(first, second) == [Change(b"top.txt", "modified")]
    (work / "top.txt").write_text("changed again\n")
    await store.snapshot()
    assert store.last_look == "events"
    store.release()


async def test_an_excludes_file_outside_the_tree_changed_means_a_full_look(
    tmp_path: Path, work: Path
) -> None:
    _git("init", "-q", cwd=work)
    (work / ".git" / "info" / "exclude").write_text("*.log\n")
    (work / "out.log").write_text("log\n")
    store = ShadowStore(tmp_path / "state", work)
    store.hold()
    first = await store.snapshot()
    (work / ".git" / "info" / "exclude").write_text("")
    second = await store.snapshot()
    assert store.last_look == "full"
    assert await store.changes(first, second) == [Change(b"out.log", "added")]
    store.release()


async def test_a_directory_made_just_after_a_full_look_is_not_lost_to_gits_cache(
    tmp_path: Path, work: Path
) -> None:
    """git trusts its cached listing of a directory whose mtime is the one it read, to the
    second, once the index was written in a later second: a directory made in the second of
    a full look, then a snapshot from the events a second later (which writes the index), must
    not leave the next full look blind to what is put in that new directory after."""
    store = ShadowStore(tmp_path / "state", work)
    store.hold()
    await store.snapshot()
    (work / "a" / ".gitignore").write_text("")  # the next snapshot: a full look
    first = await store.snapshot()
    assert store.last_look == "full"
    # in the same second as that look: the root's mtime stays what git read, to the second
    os.utime(work, ns=(work.stat().st_atime_ns, work.stat().st_mtime_ns))
    mtime = work.stat().st_mtime_ns
    (work / "new").mkdir()
    (work / "new" / "one.txt").write_text("one\n")
    os.utime(work, ns=(mtime, mtime))
    await trio.sleep(1.1)  # (a second later is the point: not a wait for a state)
    await store.snapshot()  # from the events: writes the index
    assert store.last_look == "events"
    (work / "new" / "two.txt").write_text("two\n")
    (work / "a" / ".gitignore").write_text("*.log\n")  # a full look again
    last = await store.snapshot()
    assert store.last_look == "full"
    assert [change.path for change in await store.changes(first, last)] == [
        b"a/.gitignore",
        b"new/one.txt",
        b"new/two.txt",
    ]
    store.release()


async def test_a_queue_that_cannot_be_read_means_a_full_look_and_a_new_watcher(
    tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ShadowStore(tmp_path / "state", work)
    store.hold()
    first = await store.snapshot()
    (work / "top.txt").write_text("changed\n")

    def unreadable(self: INotify, timeout: int | None = None) -> list[object]:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as patch:
        patch.setattr(INotify, "read", unreadable)
        second = await store.snapshot()
    assert store.last_look == "full"
    assert await store.changes(first, second) == [Change(b"top.txt", "modified")]
    (work / "a" / "one.txt").write_text("changed\n")
    third = await store.snapshot()  # watched again from the full look on
    assert store.last_look == "events"
    assert await store.changes(second, third) == [Change(b"a/one.txt", "modified")]
    store.release()
