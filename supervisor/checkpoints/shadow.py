"""A shadow git store per working directory: snapshots, what changed between two, a restore.

The store is a git directory of the supervisor's own, under the state directory, named after
the working directory's path; its work tree is the working directory, its index its own. Git
is run as ``git --git-dir=<store> --work-tree=<cwd>`` with the user's git environment and
global configuration left out, so the user's ``.git`` is never read for writing: no commit,
branch, stash, index change or ref there. What git ignores in the work tree (``.gitignore``
files, and the repository's ``.git/info/exclude``, given as the store's ``core.excludesFile``)
is not kept; neither are ``.git`` directories, which git never adds. A git repository nested
in the working directory (a clone, a submodule's checkout) is kept as its files, like any
other directory's, not as git's one entry for it (a gitlink, whose files' changes nobody would
see); its own ``.git`` is not kept, so a restore puts its files back, not its history.

A snapshot is one ``git status`` (what differs from the store's index, and what is new: one
pass over the work tree, with the untracked cache), those paths put in the index, ``git
write-tree`` (not run when nothing changed), and a commit of that tree with a ref of its own
(``refs/checkpoints/<commit>``), both written by the store itself as git writes them. The ref
keeps the snapshot's objects reachable until the session forgets it
(:meth:`ShadowStore.forget`): then the ref goes, and the store's housekeeping
(:meth:`ShadowStore.housekeep`, a ``git gc --auto`` every :data:`HOUSEKEEP_EVERY` snapshots,
off the turns' path) prunes what no kept one holds. ``HEAD`` is the newest snapshot, which
``git status`` compares the index with. Files larger than ``max_file_bytes`` are left out of
the tree and named, with their size and mtime, so a change to one is still seen. A file the
supervisor may not read (its permissions) is skipped: its entry stays as the store last had it
(none, for a new one), and it is named the same way, so a snapshot never fails for it and a
restore never writes over it. Paths are
bytes throughout (a file name need not be UTF-8 and may hold a newline): git is asked with
``-z``.

While a session holds the store (:meth:`ShadowStore.hold`), an inotify watcher
(:mod:`supervisor.checkpoints.watch`) names the files changed since the last snapshot, and a
snapshot skips ``git status`` (its ``lstat`` of every file is most of its cost): the named
paths git does not ignore are put in the index as they are, and the tree written
(:meth:`ShadowStore._named`). Whatever the events cannot tell exactly means the full pass
above, so the tree is the one it would write.

Every git call is a subprocess run by ``trio.run_process`` within :data:`GIT_TIMEOUT_S`; file
work (stats, a restore's writes) runs in a worker thread: the event loop never waits on disk.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import signal
import stat
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import trio
from attrs import field, frozen

from supervisor.checkpoints.watch import Changes, Watcher

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DIFF_MAX_BYTES",
    "GIT_TIMEOUT_S",
    "Change",
    "CheckpointError",
    "Diff",
    "RewindConflict",
    "Restored",
    "ShadowStore",
    "Snapshot",
    "shown_path",
]

#: Files larger than this are not copied into a checkpoint (named instead): a turn that writes
#: a model file or a build artifact of gigabytes must not double the disk it uses per turn.
DEFAULT_MAX_FILE_BYTES: Final = 10 * 1024 * 1024
#: A git call that takes longer is killed and the checkpoint fails with why. A first snapshot
#: of a 100,000-file tree hashes every file: seconds on a slow disk, not minutes.
GIT_TIMEOUT_S: Final = 60.0
#: A diff longer than this is cut there (and says so): it is for a person to read on a page,
#: and a rewritten data file can differ by megabytes.
DIFF_MAX_BYTES: Final = 256 * 1024
#: Where each kept snapshot's ref is (``<commit>`` below it): a snapshot reachable as long as a
#: session keeps it, and prunable once forgotten.
_REFS: Final = "refs/checkpoints/"
#: Snapshots between two housekeepings (:meth:`ShadowStore.housekeep`): each turn takes two,
#: and a ``git gc --auto`` that finds little to do costs a few ms.
HOUSEKEEP_EVERY: Final = 100
#: Loose objects past which a housekeeping packs them and prunes the unreachable (git's
#: ``gc.auto``, whose own default is 6,700): a turn writes a few, and a store per working
#: directory should stay near the size of what its sessions keep.
GC_LOOSE_OBJECTS: Final = 2000
#: How old an unreachable object must be before a housekeeping deletes it (git's
#: ``gc.pruneExpire``): a snapshot being taken meanwhile has written objects no ref holds yet,
#: and they must survive the collection running beside it.
PRUNE_EXPIRE: Final = "1.hour.ago"
#: Turns of any session whose changed paths a store remembers (for a rewind's check that it
#: would not undo another session's changes: :class:`RewindConflict`); older ones are not
#: checked. Each is a set of paths.
CHANGES_KEPT: Final = 1024
#: Paths a conflict's message names per session (then how many more).
_CONFLICT_PATHS: Final = 10
#: git's modes, as a change's detail names them
_KINDS: Final = {
    "100644": "file",
    "100755": "executable file",
    "120000": "symlink",
    "160000": "git repository",
}
_SYMLINK: Final = "120000"
_GITLINK: Final = "160000"
#: what a change says of a file that could not be read
_UNREADABLE: Final = "cannot be read (permission denied): its content is not kept"
#: paths one git command line names at most (an argv has a limit of its own)
_ARGV_PATHS: Final = 1000
#: who the store's commits are by
_NAME: Final = "agent-supervisor"
_EMAIL: Final = "checkpoints@agent-supervisor.invalid"
#: ``git status --porcelain=v2`` records of paths in the index: how many spaces precede the path
_TRACKED_FIELDS: Final = {b"1 ": 8, b"2 ": 9, b"u ": 10}
#: the index entry that opens a nested repository (:meth:`ShadowStore._open_nested`): a name
#: no one's file has, pointing at the empty file
_NESTED_PROBE: Final = b".agent-supervisor-nested-repository"
_EMPTY_BLOB: Final = b"e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
_NO_OBJECT: Final = b"0" * 40


class _CannotTell(Exception):
    """The watcher's paths cannot give this snapshot: the full pass gives it."""


class CheckpointError(Exception):
    """A snapshot, a diff or a restore could not be made; the message says why."""


class RewindConflict(CheckpointError):
    """A restore would undo what other sessions in the same directory changed (the message
    names them and the paths); nothing was restored."""


def shown_path(path: bytes) -> str:
    """A path as text: UTF-8, with bytes that are not shown as ``\\xNN``."""
    return path.decode("utf-8", "backslashreplace")


@frozen
class Snapshot:
    """The working directory at one moment."""

    commit: str
    tree: str
    #: files left out for their size: path -> (size, mtime in ns)
    too_big: Mapping[bytes, tuple[int, int]] = field(factory=dict)
    #: its place among the store's snapshots in this process (0: one taken before it,
    #: :meth:`ShadowStore.load`), for what other sessions changed since
    n: int = 0
    #: files that could not be read (permissions): path -> (size, mtime in ns); their entry
    #: in the tree is the one the store had before (none: they had none), not what is on disk
    unreadable: Mapping[bytes, tuple[int, int]] = field(factory=dict)


@frozen
class Change:
    """One path that differs between two snapshots."""

    path: bytes
    #: ``added``, ``modified`` or ``deleted``
    change: str
    #: what changed beyond the content: a mode or a kind (``file -> symlink``), or that the
    #: file is too big to be kept
    detail: str | None = None

    def to_wire(self) -> dict[str, Any]:
        shown = shown_path(self.path)
        wire: dict[str, Any] = {"path": shown, "change": self.change}
        if self.detail is not None:
            wire["detail"] = self.detail
        if shown.encode("utf-8") != self.path:  # not UTF-8: the bytes themselves too
            wire["path_b64"] = base64.b64encode(self.path).decode("ascii")
        return wire


@frozen
class Restored:
    """What a restore did: the paths put back, those that could not be (and why), and the
    state before it (a restore to that undoes this one)."""

    restored: list[bytes]
    not_restored: list[tuple[bytes, str]]
    before: Snapshot

    def to_wire(self) -> dict[str, Any]:
        return {
            "restored": [shown_path(path) for path in self.restored],
            "not_restored": [
                {"path": shown_path(path), "why": why} for path, why in self.not_restored
            ],
        }


@frozen
class _Changed:
    """What one turn of a session changed in the directory, and when (its end's ``n``)."""

    owner: str
    turn_id: str
    n: int
    paths: frozenset[bytes]


@frozen
class Diff:
    """One path's difference between two snapshots, as a unified diff."""

    #: git's unified diff (``""``: no difference), cut at the limit
    text: str
    #: the diff was longer than the limit: ``text`` is its beginning
    truncated: bool = False
    #: git found the content binary: ``text`` says only that it differs
    binary: bool = False
    #: too big to keep: its content is in neither snapshot, so there is no diff to show
    too_big: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "diff": self.text,
            "truncated": self.truncated,
            "binary": self.binary,
            "too_big": self.too_big,
        }


#: Seconds a git stopped by a cancel (a closing session's housekeeping) has to remove its lock
#: files and end, before it and its children are killed
_STOP_GRACE_S: Final = 5.0


async def _stop_group(process: trio.Process) -> None:
    """A cancelled git's end: SIGTERM to its process group, so that the children it runs (a
    collection's ``pack-refs``) end too, each removing its lock files, rather than go on holding
    them after it; SIGKILL if they linger."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        await trio.sleep(_STOP_GRACE_S)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _git_env() -> dict[str, str]:
    """The environment git runs in: none of the user's ``GIT_*`` (a ``GIT_DIR`` or
    ``GIT_INDEX_FILE`` would point it at their repository) and none of their global or system
    configuration (hooks, filters, autocrlf: what is kept must be the bytes on disk)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME=_NAME,
        GIT_AUTHOR_EMAIL=_EMAIL,
        GIT_COMMITTER_NAME=_NAME,
        GIT_COMMITTER_EMAIL=_EMAIL,
        LC_ALL="C",
    )
    return env


class ShadowStore:
    """The checkpoints of one working directory. One object per directory in a process: its
    calls take turns (they share the store's index)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        cwd: str | os.PathLike[str],
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        timeout_s: float = GIT_TIMEOUT_S,
        prune_expire: str = PRUNE_EXPIRE,
        watch: bool = True,
        own: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        """``watch``: while sessions hold the store (:meth:`hold`), snapshots are told what
        changed by an inotify watcher instead of looking at every file (the module docstring);
        false: each is the full pass. ``own``: directories of the supervisor's own (its state
        directory), never snapshotted nor watched when they are below ``cwd``: a supervisor
        started in the project it supervises would otherwise record its own writes (this
        store's among them) as every turn's changes."""
        self.cwd = os.path.realpath(cwd)
        name = hashlib.sha256(os.fsencode(self.cwd)).hexdigest()[:24]
        self.git_dir = Path(root) / name
        #: ``own`` and ``root`` below the work tree, relative to it
        self.own = _below(self.cwd, [root, *own])
        self.max_file_bytes = max_file_bytes
        self.timeout_s = timeout_s
        self._env = _git_env()
        self._lock = trio.Lock()
        self.prune_expire = prune_expire
        self._ready = False
        #: snapshots taken in this process (the newest's ``n``)
        self._taken = 0
        #: snapshots no session keeps, their refs not deleted yet (:meth:`housekeep` does)
        self._dropped: list[str] = []
        self._housekeeping = False
        #: ``_taken`` when the last housekeeping began: the next is due a period after it, so
        #: one that outlasts a period (a slow disk's gc) delays the next, never skips it
        self._housekept_at = 0
        #: set when a housekeeping ends (:meth:`housekept`)
        self._housekeeping_done = trio.Event()
        #: what the sessions' turns changed here, the newest last (:meth:`conflicts`)
        self._changed: deque[_Changed] = deque(maxlen=CHANGES_KEPT)
        #: the tree of the store's index, while it is known (None: changed since written)
        self._tree: str | None = None
        #: the newest snapshot's big files: they are not in the index, so not listed as
        #: changed by it, and are looked at again each time
        self._last_big: Mapping[bytes, tuple[int, int]] = {}
        #: the newest snapshot's unreadable files: tried first at the next (one git call, not
        #: a failed one and another)
        self._last_unreadable: Mapping[bytes, tuple[int, int]] = {}
        self.watch = watch
        #: sessions holding the store: the watcher lives while there are any
        self._holders = 0
        self._watcher: Watcher | None = None
        #: a worker thread reads the watcher's queue: it is not to be closed under it
        self._reading = False
        #: the index is the work tree as it was when the watcher's queue was last read (the
        #: newest snapshot was whole, and the watcher was watching before it looked)
        self._exact = False
        #: the ignore files outside the work tree, as they were at the last snapshot
        self._excludes: list[tuple[int, int, int] | None] = []
        #: how the newest snapshot knew what changed: ``"events"`` (the watcher's paths) or
        #: ``"full"`` (git's pass over every file)
        self.last_look = "full"

    # -- git ----------------------------------------------------------------------------------

    async def _git(
        self,
        *args: str | bytes,
        stdin: bytes | None = None,
        store: bool = True,
        ok: tuple[int, ...] = (0,),
    ) -> bytes:
        """``store``: run on the store and the working directory (else plain git); ``ok``: the
        exit statuses that are answers, not failures."""
        where = [f"--git-dir={self.git_dir}", f"--work-tree={self.cwd}"] if store else []
        command = ["git", *where, *args]
        try:
            with trio.fail_after(self.timeout_s):
                done = await trio.run_process(
                    command,
                    stdin=stdin if stdin is not None else b"",
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    cwd=self.cwd,
                    env=self._env,
                    start_new_session=True,
                    deliver_cancel=_stop_group,
                )
        except trio.TooSlowError:
            raise CheckpointError(
                f"git {args[0]!s} took longer than {self.timeout_s:g} s: stopped"
            ) from None
        except FileNotFoundError:
            if not os.path.isdir(self.cwd):
                raise CheckpointError(f"the working directory {self.cwd} is gone") from None
            raise CheckpointError("git is not installed") from None
        except NotADirectoryError:
            raise CheckpointError(f"the working directory {self.cwd} is gone") from None
        if done.returncode not in ok:
            if b"No space left on device" in done.stderr:
                await trio.to_thread.run_sync(_drop_temporary_objects, self.git_dir)
                raise CheckpointError(
                    f"no space left on the checkpoint store's disk ({self.git_dir.parent}):"
                    f" git {args[0]!s} failed"
                )
            lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
            # git's first error names the cause (a file it cannot read); its last line is
            # often only that it gave up ("fatal: adding files failed")
            why = [line for line in lines if line.startswith("error: ")][:1] or lines[-1:]
            raise CheckpointError(f"git {args[0]!s} failed: {why[0] if why else done.returncode}")
        return done.stdout

    async def _ensure(self) -> None:
        if self._ready:
            return
        if not os.path.isdir(self.cwd):
            raise CheckpointError(f"the working directory {self.cwd} is gone")
        if not (self.git_dir / "HEAD").exists():
            try:
                self.git_dir.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(
                    f"the checkpoint store {self.git_dir.parent} cannot be made:"
                    f" {exc.strerror or exc}"
                ) from None
            await self._git("init", "--quiet", "--bare", str(self.git_dir), store=False)
        settings = {
            "core.bare": "false",
            "core.autocrlf": "false",
            "core.safecrlf": "false",
            "core.fileMode": "true",
            "core.symlinks": "true",
            # what ``git status`` lists untracked is cached per directory in the index, and
            # checked against each directory's mtime: only changed directories are read again
            "core.untrackedCache": "true",
            "status.showUntrackedFiles": "all",  # the cache is kept for this listing only
            # each snapshot's three git calls read the index and two write it: with a split
            # index they write only the entries changed since the shared part (which is
            # written again past 20% of them), in version 4 paths are prefix-compressed
            "core.splitIndex": "true",
            "index.version": "4",
            "gc.auto": "0",  # a snapshot never waits for a collection: housekeep() runs it
            "core.logAllRefUpdates": "false",  # a reflog would keep forgotten snapshots
            "commit.gpgSign": "false",
        }
        exclude = Path(self.cwd) / ".git" / "info" / "exclude"
        if exclude.is_file():
            settings["core.excludesFile"] = str(exclude)
        for key, value in settings.items():
            await self._git("config", key, value)
        # The store's own excludes (git reads them beside the user's): the supervisor's
        # directories below the work tree, anchored at its root.
        info = trio.Path(self.git_dir / "info")
        await info.mkdir(exist_ok=True)
        await (info / "exclude").write_bytes(b"".join(_pattern(path) for path in self.own))
        self._ready = True

    # -- snapshots ----------------------------------------------------------------------------

    def hold(self) -> None:
        """A session keeps checkpoints here: the store watches the directory until the last
        one lets go (:meth:`release`). The watches are set up by the next snapshot, before it
        looks at any file: nothing that changes after is missed."""
        self._holders += 1

    def release(self) -> None:
        self._holders -= 1
        if self._holders <= 0 and not self._reading:
            self._close_watcher()  # else the snapshot reading it closes it

    def _close_watcher(self) -> None:
        self._holders = max(self._holders, 0)
        self._exact = False
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    async def snapshot(self) -> Snapshot:
        """The working directory now, kept."""
        async with self._lock:
            await self._ensure()
            changes = None
            if self.watch:
                self._reading = True
                try:
                    changes = await trio.to_thread.run_sync(self._watched)
                finally:
                    self._reading = False
            # until this snapshot is whole, the index may be anywhere between the two states
            exact, self._exact = self._exact, False
            try:
                snapshot = None
                if changes is not None and exact:
                    try:
                        snapshot = await self._take(*await self._named(changes))
                        self.last_look = "events"
                    except (_CannotTell, CheckpointError, OSError):
                        pass  # the full pass says what is wrong, if anything is
                if snapshot is None:
                    snapshot = await self._take(*await self._everything())
                    self.last_look = "full"
            finally:
                if self._holders <= 0:
                    self._close_watcher()
            self._exact = self._watcher is not None and self._watcher.watching
            return snapshot

    def _watched(self) -> Changes | None:
        """The paths the watcher saw change since the last snapshot (run in a worker thread);
        None: not known (no watcher, or it cannot tell, or an ignore file outside the work tree
        changed). Its watches are set up here the first time, before any file is looked at."""
        if self._holders > 0 and self._watcher is None:
            self._watcher = Watcher(self.cwd, skip=self.own)
        if self._watcher is None:
            return None
        try:
            changes = self._watcher.changed()
        except OSError:  # unforeseen: this snapshot the full pass, the next one watches afresh
            self._watcher.close()
            return None
        excludes = [_identity(path) for path in self._outside_excludes()]
        if excludes != self._excludes:
            self._excludes = excludes
            return None
        return changes

    def _outside_excludes(self) -> list[str]:
        """The ignore files outside the work tree, which the watcher does not see: the
        repository's own excludes (the store's ``core.excludesFile``) and git's per-user one
        (``$XDG_CONFIG_HOME/git/ignore``, read when no ``core.excludesFile`` is set)."""
        config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(
            os.path.expanduser("~"), ".config"
        )
        return [
            os.path.join(self.cwd, ".git", "info", "exclude"),
            os.path.join(config, "git", "ignore"),
        ]

    async def _everything(
        self,
    ) -> tuple[list[bytes], list[bytes], dict[bytes, tuple[int, int]]]:
        """The full pass: what to put in the index (as it is on disk), what to take out of it
        (kept files grown past the limit), and the files too big to keep."""
        changed, tracked = await self._differing()
        names = [*changed, *(path for path in self._last_big if path not in changed)]
        too_big = await trio.to_thread.run_sync(self._big_files, names)
        adds = [path for path in changed if path not in too_big]
        grown = [path for path in too_big if path in tracked]
        return adds, grown, too_big

    async def _named(
        self, changes: Changes
    ) -> tuple[list[bytes], list[bytes], dict[bytes, tuple[int, int]]]:
        """What :meth:`_everything` finds, from the watcher's ``changes`` (every file changed
        since the index was the work tree): each is looked at (``lstat``), those that are there
        asked of ``git check-ignore`` (which answers for the ones not in the index: a kept file
        stays kept when a rule comes to match it, as with ``git status``), and the rest are put
        in the index, or taken out if gone. Anything but a file, a symlink or nothing at a
        path (a directory where a file was, a fifo) is the full pass's to judge.

        The directories created or deleted are taken out of the index too, which holds no
        entry of that name: what that does is drop the untracked cache's listing of the
        directory holding each. That listing is trusted while the directory's mtime is the one
        it was read at, to the second, unless the index was written in that same second; a
        directory changed just after a ``git status`` read it, and an index written a second
        later by a snapshot that ran no ``git status``, would otherwise leave a stale listing
        (a new directory never looked into) to the next full pass. A file put in the index or
        taken out drops its own directory's listing likewise."""
        # the last snapshot's unreadable files: listed by every git status (their stat is
        # not the index's), so looked at again each time here too
        paths = changes.files | self._last_unreadable.keys()
        names = sorted(paths)
        others = [path for path in self._last_big if path not in paths]
        found = await trio.to_thread.run_sync(_lstat_all, os.fsencode(self.cwd), names + others)
        there = []
        for path in names:
            info = found[path]
            if info is not None:
                if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                    raise _CannotTell
                there.append(path)
        ignored: set[bytes] = set()
        if there:
            out = await self._git(
                "check-ignore", "-z", "--stdin", stdin=b"\0".join(there) + b"\0", ok=(0, 1)
            )
            ignored = set(out.split(b"\0")[:-1])
        wanted = [path for path in names if path not in ignored]
        too_big = {
            path: (info.st_size, info.st_mtime_ns)
            for path in [*wanted, *(p for p in names if p in self._last_big), *others]
            if (info := found.get(path)) is not None
            and stat.S_ISREG(info.st_mode)
            and info.st_size > self.max_file_bytes
        }
        adds = [path for path in wanted if path not in too_big]
        # a file grown past the limit out of the index (one that is not in it: nothing to do)
        removes = [path for path in wanted if path in too_big]
        return adds, [*removes, *sorted(changes.dirs)], too_big

    async def _take(
        self, adds: list[bytes], removes: list[bytes], too_big: dict[bytes, tuple[int, int]]
    ) -> Snapshot:
        """The index rid of ``removes`` and given ``adds`` as they are on disk (but those that
        cannot be read: :meth:`_add`), its tree, and a commit of it."""
        unreadable: dict[bytes, tuple[int, int]] = {}
        if self._last_unreadable:  # (still so, as the last snapshot found them: not added)
            unreadable = await trio.to_thread.run_sync(
                self._unreadable, [path for path in adds if path in self._last_unreadable]
            )
            adds = [path for path in adds if path not in unreadable]
        tree = self._tree
        if adds or removes or tree is None:
            self._tree = None  # the index is changing: its tree is unknown until written
            if removes:  # files grown past the limit; directories made or removed (_named)
                await self._git(
                    "update-index", "-z", "--force-remove", "--stdin", stdin=b"\0".join(removes)
                )
            if adds:
                unreadable.update(await self._add(adds))
            tree = (await self._git("write-tree")).strip().decode()
        # Each snapshot its own commit (``taken``: two of one tree in one second differ),
        # so a ref forgotten by one session never drops another's.
        kept: dict[str, Any] = {
            "too_big": {os.fsdecode(p): v for p, v in too_big.items()},
            "taken": secrets.token_hex(8),
        }
        if unreadable:
            kept["unreadable"] = {os.fsdecode(p): v for p, v in unreadable.items()}
        commit = await trio.to_thread.run_sync(self._commit, tree, json.dumps(kept))
        self._tree = tree
        self._last_big = too_big
        self._last_unreadable = unreadable
        self._taken += 1
        return Snapshot(commit, tree, too_big, self._taken, unreadable)

    async def _add(self, paths: list[bytes]) -> dict[bytes, tuple[int, int]]:
        """``paths`` put in the index as they are on disk, but those that cannot be read
        (permissions), returned: their entries stay as they were. git's ``update-index``
        stops at the first it cannot open and writes nothing, so only then is each tried."""
        add = ["update-index", "-z", "--add", "--remove", "--replace", "--stdin"]
        try:
            await self._git(*add, stdin=b"\0".join(paths))
            return {}
        except CheckpointError as exc:
            if "Permission denied" not in str(exc):
                raise
            unreadable = await trio.to_thread.run_sync(self._unreadable, paths)
            if not unreadable:
                raise
        rest = [path for path in paths if path not in unreadable]
        if rest:
            await self._git(*add, stdin=b"\0".join(rest))
        return unreadable

    async def _differing(self) -> tuple[dict[bytes, None], set[bytes]]:
        """The paths whose state on disk is not the index's (in git's order), and which of them
        are in the index. ``git status`` finds both in one pass over the work tree, with the
        untracked cache and the stat data of the index: a file whose stat data is unchanged is
        not read. Its comparison of the index with ``HEAD`` (the newest snapshot) is of two
        equal trees, which the index's cache tree makes cheap.

        A nested git repository (a directory with its own ``.git``: a clone, a submodule's
        checkout) is one entry to git, a gitlink, and its files' changes would be nobody's: it
        is opened instead (:meth:`_open_nested`), and its files are listed like any other."""
        opened: set[bytes] = set()
        while True:
            changed, tracked, nested = await self._status()
            nested -= opened
            if not nested:
                return changed, tracked
            await self._open_nested(nested)
            opened |= nested

    async def _status(self) -> tuple[dict[bytes, None], set[bytes], set[bytes]]:
        """One ``git status``: the changed paths, those of them in the index, and the nested
        repositories it did not look into."""
        out = await self._git(
            "status",
            "--porcelain=v2",
            "-z",
            "--untracked-files=all",
            "--no-renames",
        )
        records = iter(out.split(b"\0"))
        changed: dict[bytes, None] = {}
        tracked: set[bytes] = set()
        nested: set[bytes] = set()
        for record in records:
            kind = record[:2]
            if kind == b"? ":
                if record.endswith(b"/"):  # all untracked files listed: a directory is a repository
                    nested.add(record[2:-1])
                else:
                    changed[record[2:]] = None
            elif kind in _TRACKED_FIELDS:
                fields = record.split(b" ", _TRACKED_FIELDS[kind])
                path = fields[-1]
                if fields[4] == _GITLINK.encode():  # in the index as a gitlink
                    nested.add(path)
                elif fields[1][1:2] != b".":  # the work tree's side differs from the index
                    changed[path] = None
                    tracked.add(path)
                if kind == b"2 ":
                    next(records, None)  # a rename's old path
        return changed, tracked, nested

    async def _open_nested(self, nested: Iterable[bytes]) -> None:
        """Nested repositories looked into from now on: each gets an index entry below it (a
        file that is not there, :data:`_NESTED_PROBE`, which the next ``git status`` finds
        deleted, and so the snapshot removes). git walks a directory it has entries below as
        any other, its ``.git`` left out, and lists its files by the ignore rules. A gitlink
        the index has there goes. (A repository with no file to list is opened again at each
        snapshot: two git calls more.)"""
        self._tree = None
        lines = []
        for path in nested:
            lines.append(b"0 %s\t%s" % (_NO_OBJECT, path))
            lines.append(b"100644 %s\t%s/%s" % (_EMPTY_BLOB, path, _NESTED_PROBE))
        await self._git("update-index", "-z", "--index-info", stdin=b"\0".join(lines) + b"\0")

    def _commit(self, tree: str, message: str) -> str:
        """A commit of ``tree``, its ref, and ``HEAD`` (what the next ``git status`` compares the
        index with) at it, written as git writes them: a loose object, then each ref through its
        lock file, renamed into place. Two git processes fewer at each turn's start than
        ``commit-tree`` and ``update-ref`` (run in a worker thread)."""
        ident = f"{_NAME} <{_EMAIL}> {int(time.time())} +0000"
        body = f"tree {tree}\nauthor {ident}\ncommitter {ident}\n\n{message}\n".encode()
        raw = b"commit %d\0%s" % (len(body), body)
        commit = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
        line = f"{commit}\n".encode()
        try:
            _write_aside(self.git_dir / "objects" / commit[:2] / commit[2:], zlib.compress(raw))
            _write_ref(self.git_dir / (_REFS + commit), line)
            _write_ref(self.git_dir / "HEAD", line)
        except OSError as exc:
            raise CheckpointError(
                f"the checkpoint store {self.git_dir} cannot be written: {exc.strerror or exc}"
            ) from None
        return commit

    async def load(self, commits: Iterable[str]) -> dict[str, Snapshot]:
        """The snapshots of ``commits`` (taken by an earlier process: a session revived from
        the session store), by commit; one the store no longer has is left out."""
        wanted = list(dict.fromkeys(commits))
        if not wanted:
            return {}
        await self._ensure()
        out = await self._git("cat-file", "--batch", stdin="\n".join(wanted).encode() + b"\n")
        found: dict[str, Snapshot] = {}
        at = 0
        while at < len(out):
            end = out.index(b"\n", at)
            header = out[at:end].decode("ascii", "replace").split(" ")
            if len(header) != 3:  # "<name> missing"
                at = end + 1
                continue
            sha, kind, size = header
            start = end + 1
            body = out[start : start + int(size)]
            at = start + int(size) + 1
            if kind != "commit":
                continue
            head, _, message = body.partition(b"\n\n")
            tree = head.split(b"\n", 1)[0].removeprefix(b"tree ").decode("ascii")
            try:
                kept = json.loads(message)
                too_big = _sizes(kept.get("too_big", {}))
                unreadable = _sizes(kept.get("unreadable", {}))
            except (ValueError, AttributeError, TypeError):
                continue  # not a snapshot of ours
            found[sha] = Snapshot(sha, tree, too_big, unreadable=unreadable)
        return found

    def forget(self, snapshots: Iterable[Snapshot]) -> None:
        """Snapshots no session keeps: their refs go at the next :meth:`housekeep`."""
        self._dropped.extend(snapshot.commit for snapshot in snapshots)

    @property
    def housekeeping_due(self) -> bool:
        return not self._housekeeping and self._taken - self._housekept_at >= HOUSEKEEP_EVERY

    async def housekeep(self) -> None:
        """Delete the refs of forgotten snapshots, then ``git gc --auto``: past
        :data:`GC_LOOSE_OBJECTS` loose objects, they are packed and what no ref holds (older
        than :attr:`prune_expire`) deleted. Runs beside the snapshots (without the store's
        lock: git's own collection is safe beside writers), never in a turn's way; one at a
        time. A failure is logged by the caller and tried again next time."""
        if self._housekeeping:
            return
        self._housekeeping = True
        self._housekept_at = self._taken
        try:
            await self._ensure()
            dropped, self._dropped = self._dropped, []
            if dropped:
                lines = b"".join(b"delete %s%s\n" % (_REFS.encode(), c.encode()) for c in dropped)
                try:
                    await self._git("update-ref", "--stdin", stdin=lines)
                except CheckpointError:
                    self._dropped[:0] = dropped
                    raise
            await self._git(
                "-c",
                f"gc.auto={GC_LOOSE_OBJECTS}",
                "-c",
                f"gc.pruneExpire={self.prune_expire}",
                "-c",
                "gc.autoDetach=false",
                "gc",
                "--auto",
                "--quiet",
            )
        finally:
            self._housekeeping = False
            self._housekeeping_done.set()
            self._housekeeping_done = trio.Event()

    async def housekept(self) -> None:
        """Wait for the housekeeping under way, if any, then keep house once more: every
        snapshot forgotten so far has its ref deleted."""
        while self._housekeeping:
            await self._housekeeping_done.wait()
        await self.housekeep()

    # -- other sessions in the same directory ---------------------------------------------------

    def changed(self, owner: str, turn_id: str, end: Snapshot, paths: Iterable[bytes]) -> None:
        """``owner``'s turn ``turn_id`` ended at ``end`` having changed ``paths``."""
        found = frozenset(paths)
        if found:
            self._changed.append(_Changed(owner, turn_id, end.n, found))

    def conflicts(self, owner: str, since: Snapshot, paths: Iterable[bytes]) -> str | None:
        """Why a restore of ``paths`` to ``since`` by ``owner`` would undo what other sessions
        changed after it was taken (None: it would not)."""
        wanted = set(paths)
        theirs: dict[str, set[bytes]] = {}
        turns: dict[str, list[str]] = {}
        for changed in self._changed:
            if changed.owner == owner or changed.n <= since.n:
                continue
            hit = wanted.intersection(changed.paths)
            if hit:
                theirs.setdefault(changed.owner, set()).update(hit)
                turns.setdefault(changed.owner, []).append(changed.turn_id)
        if not theirs:
            return None
        said = []
        for other, hit in theirs.items():
            shown = [shown_path(path) for path in sorted(hit)]
            named = ", ".join(shown[:_CONFLICT_PATHS])
            if len(shown) > _CONFLICT_PATHS:
                named += f" and {len(shown) - _CONFLICT_PATHS} more"
            said.append(f"session {other} changed {named} (turn {', '.join(turns[other])})")
        return (
            "it would also undo what other sessions in this directory changed since: "
            + "; ".join(said)
            + " (rewind with force to undo them too)"
        )

    def _big_files(self, names: Iterable[bytes]) -> dict[bytes, tuple[int, int]]:
        """Of ``names``, the regular files larger than the limit (run in a worker thread)."""
        root = os.fsencode(self.cwd)
        big: dict[bytes, tuple[int, int]] = {}
        for name in names:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size > self.max_file_bytes:
                big[name] = (info.st_size, info.st_mtime_ns)
        return big

    def _unreadable(self, names: Iterable[bytes]) -> dict[bytes, tuple[int, int]]:
        """Of ``names``, the regular files that cannot be opened for reading for their
        permissions, with their size and mtime (run in a worker thread)."""
        root = os.fsencode(self.cwd)
        found: dict[bytes, tuple[int, int]] = {}
        for name in names:
            full = os.path.join(root, name)
            try:
                info = os.lstat(full)
            except OSError:
                continue  # (gone meanwhile, or in a directory it may not enter: git says so)
            if not stat.S_ISREG(info.st_mode):
                continue
            try:
                os.close(os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
            except PermissionError:
                found[name] = (info.st_size, info.st_mtime_ns)
            except OSError:
                continue
        return found

    # -- changes ------------------------------------------------------------------------------

    async def changes(self, old: Snapshot, new: Snapshot) -> list[Change]:
        """What differs from ``old`` to ``new``, by path."""
        raw = await self._diff(old.tree, new.tree)
        found: dict[bytes, Change] = {}
        for old_mode, new_mode, _sha, status, path in raw:
            kind = {"A": "added", "D": "deleted"}.get(status, "modified")
            detail = None
            if kind == "modified" and old_mode != new_mode:
                detail = f"{_KINDS.get(old_mode, old_mode)} -> {_KINDS.get(new_mode, new_mode)}"
            found[path] = Change(path, kind, detail)
        for path, (size, mtime) in new.too_big.items():
            was = old.too_big.get(path)
            detail = f"too big to keep ({size} bytes)"
            seen = found.get(path)
            if was is not None:
                if was != (size, mtime):
                    found[path] = Change(path, "modified", detail)
            elif seen is not None and seen.change == "deleted":  # in the old tree: grown
                found[path] = Change(path, "modified", detail)
            else:
                found[path] = Change(path, "added", detail)
        for path in old.too_big.keys() - new.too_big.keys():
            seen = found.get(path)
            if seen is not None and seen.change == "added":  # shrunk back under the limit
                found[path] = Change(path, "modified", None)
            elif seen is None:
                found[path] = Change(path, "deleted", None)
        await self._name_unreadable(old, new, found)
        return [found[path] for path in sorted(found)]

    async def _name_unreadable(
        self, old: Snapshot, new: Snapshot, found: dict[bytes, Change]
    ) -> None:
        """``new``'s unreadable files in ``found``, as a change: each that was not so in
        ``old`` or whose size or mtime changed since (one still unreadable and untouched is
        nothing new). ``added`` when ``old`` had no such file."""
        named = [path for path, now in new.unreadable.items() if old.unreadable.get(path) != now]
        if not named:
            return
        had = old.unreadable.keys() | old.too_big.keys()
        for at in range(0, len(named), _ARGV_PATHS):
            some = named[at : at + _ARGV_PATHS]
            listed = await self._git("ls-tree", "-z", "--name-only", old.tree, "--", *some)
            had |= set(listed.split(b"\0"))
        for path in named:
            change = "modified" if path in had else "added"
            found[path] = Change(path, change, _UNREADABLE)

    async def diff(
        self, old: Snapshot, new: Snapshot, path: bytes, *, max_bytes: int = DIFF_MAX_BYTES
    ) -> Diff:
        """``path``'s unified diff from ``old`` to ``new`` (read from the store's objects: the
        working directory is not looked at, and the index is not used)."""
        if path in old.too_big or path in new.too_big:
            return Diff("", too_big=True)
        out = await self._git(
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-renames",
            old.tree,
            new.tree,
            "--",
            b":(literal)" + path,
        )
        binary = any(line.startswith(b"Binary files ") for line in out.splitlines()[:8])
        truncated = len(out) > max_bytes
        text = out[:max_bytes].decode("utf-8", "replace")
        return Diff(text, truncated=truncated, binary=binary)

    async def _diff(self, old: str, new: str) -> list[tuple[str, str, str, str, bytes]]:
        """``git diff-tree -r --raw -z``: (old mode, new mode, new blob, status, path)."""
        out = await self._git("diff-tree", "-r", "-z", "--raw", "--no-renames", old, new)
        fields = out.split(b"\0")
        records = []
        for index in range(0, len(fields) - 1, 2):
            meta = fields[index].decode("ascii")
            if not meta.startswith(":"):
                break
            old_mode, new_mode, _old_sha, new_sha, status = meta[1:].split(" ")
            records.append((old_mode, new_mode, new_sha, status[:1], fields[index + 1]))
        return records

    # -- restore ------------------------------------------------------------------------------

    async def restore(
        self, target: Snapshot, refuse: Callable[[list[bytes]], str | None] | None = None
    ) -> Restored:
        """Put the working directory back as it was at ``target``, a file at a time, each
        written aside and renamed into place. The state before is snapshotted first.
        ``refuse(paths)``: why the paths the restore would put back must be left alone
        (:class:`RewindConflict`, nothing restored; the state before is forgotten)."""
        before = await self.snapshot()
        async with self._lock:
            raw = await self._diff(before.tree, target.tree)
            if refuse is not None:
                why = refuse([record[4] for record in raw])
                if why is not None:
                    self.forget([before])
                    raise RewindConflict(why)
            not_restored: list[tuple[bytes, str]] = []
            writes: list[tuple[bytes, str, str]] = []
            deletes: list[bytes] = []
            # a nested repository that ``target`` holds as one entry (a gitlink: a snapshot
            # of an earlier version of the store) has no files there to go back to
            gitlinks = tuple(
                path + b"/" for _m, new_mode, _s, status, path in raw if new_mode == _GITLINK
            )
            # files that could not be read, now or then: what they hold is not known, so they
            # are never written over nor removed
            unknown = {
                path: "cannot be read now: left as it is"
                for path, now in before.unreadable.items()
                if target.unreadable.get(path) != now
            }
            for path in target.unreadable.keys() - before.unreadable.keys():
                unknown[path] = (
                    "could not be read when that checkpoint was taken: its content was not kept"
                )
            not_restored.extend(unknown.items())
            untouched = unknown.keys() | before.unreadable.keys()  # (unchanged since: unnamed)
            for _old_mode, new_mode, sha, status, path in raw:
                if path in untouched:
                    continue
                if gitlinks and path.startswith(gitlinks):
                    not_restored.append(
                        (path, "in a nested git repository that checkpoint did not look into")
                    )
                elif path in before.too_big:
                    not_restored.append(
                        (
                            path,
                            "larger than the checkpoint limit now: its content could not"
                            " be kept, so it is left as it is",
                        )
                    )
                elif status == "D":
                    deletes.append(path)
                elif new_mode == _GITLINK:
                    not_restored.append((path, "a nested git repository: not kept"))
                else:
                    writes.append((path, new_mode, sha))
            for path in target.too_big.keys() - before.too_big.keys():
                not_restored.append(
                    (path, "was larger than the checkpoint limit: its content was not kept")
                )
            listed = {path for path, _why in not_restored}
            for path, now in before.too_big.items():
                if path not in listed and target.too_big.get(path) != now:
                    not_restored.append(
                        (
                            path,
                            "larger than the checkpoint limit now: its content could not"
                            " be kept, so it is left as it is",
                        )
                    )
            blobs = await self._blobs([sha for _path, _mode, sha in writes])
            try:
                restored, failed = await trio.to_thread.run_sync(
                    _put_back, os.fsencode(self.cwd), deletes, writes, blobs
                )
            except CheckpointError:
                self.forget([before])
                raise
        not_restored.extend(failed)
        return Restored(sorted(restored), sorted(not_restored), before)

    async def _blobs(self, shas: list[str]) -> dict[str, bytes]:
        if not shas:
            return {}
        out = await self._git("cat-file", "--batch", stdin="\n".join(shas).encode() + b"\n")
        blobs: dict[str, bytes] = {}
        at = 0
        while at < len(out):
            end = out.index(b"\n", at)
            sha, _kind, size = out[at:end].decode("ascii").split(" ")
            start = end + 1
            blobs[sha] = out[start : start + int(size)]
            at = start + int(size) + 1
        return blobs


def _sizes(kept: Mapping[str, Any]) -> dict[bytes, tuple[int, int]]:
    """A snapshot's commit message's ``too_big`` or ``unreadable``: path -> (size, mtime)."""
    return {os.fsencode(path): (int(size), int(mtime)) for path, (size, mtime) in kept.items()}


#: Tries at a write into the store whose directory a collection beside it removes (it deletes
#: the directories it empties, a ref's or an object's, which the write then makes again)
_WRITE_TRIES: Final = 3


def _lstat_all(root: bytes, paths: list[bytes]) -> dict[bytes, os.stat_result | None]:
    """Each path's ``lstat`` (None: nothing there), in a worker thread."""
    found: dict[bytes, os.stat_result | None] = {}
    for path in paths:
        try:
            found[path] = os.lstat(os.path.join(root, path))
        except (FileNotFoundError, NotADirectoryError):
            found[path] = None
    return found


def _identity(path: str) -> tuple[int, int, int] | None:
    """What tells a file's change without reading it: inode, size, mtime (None: none there)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def _write_aside(path: Path, content: bytes) -> None:
    """``content`` at ``path``, written aside and renamed into place (a reader sees the old file
    or the new one, never a part)."""
    _in_place(path, path.with_name(f".{path.name}.{secrets.token_hex(4)}"), content)


def _write_ref(path: Path, content: bytes) -> None:
    """A ref of the store's, as git writes one: through its lock file, which a git process
    changing the same ref meanwhile (a collection packing it) holds, so that this fails rather
    than be lost."""
    _in_place(path, path.with_name(path.name + ".lock"), content)


def _in_place(path: Path, aside: Path, content: bytes) -> None:
    for attempt in range(_WRITE_TRIES):
        try:
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            if attempt == _WRITE_TRIES - 1:
                raise
            path.parent.mkdir(exist_ok=True)
            continue
        break
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(aside, path)
    except BaseException:
        aside.unlink(missing_ok=True)
        raise


def _put_back(
    root: bytes,
    deletes: list[bytes],
    writes: list[tuple[bytes, str, str]],
    blobs: dict[str, bytes],
) -> tuple[list[bytes], list[tuple[bytes, str]]]:
    """A restore's file work (in a worker thread): removals first (a directory they empty goes
    too, so a file may take its place), then each file written aside and renamed into place.
    Never half a file: a write that fails leaves the old one. A restore the disk has no room
    for is refused before anything is touched (:func:`_check_room`)."""
    _check_room(root, deletes, writes, blobs)
    restored: list[bytes] = []
    failed: list[tuple[bytes, str]] = []
    for path in deletes:
        full = os.path.join(root, path)
        try:
            os.unlink(full)
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed.append((path, f"could not be removed: {exc.strerror}"))
            continue
        restored.append(path)
        _remove_empty_parents(root, full)
    for path, mode, sha in writes:
        full = os.path.join(root, path)
        try:
            _write_atomically(full, mode, blobs[sha])
        except OSError as exc:
            failed.append((path, f"could not be written: {exc.strerror}"))
            continue
        restored.append(path)
    return restored, failed


def _check_room(
    root: bytes, deletes: list[bytes], writes: list[tuple[bytes, str, str]], blobs: dict[str, bytes]
) -> None:
    """Refuse (:class:`CheckpointError`) a restore whose writes would fill the working
    directory's disk: each file is written aside before the old one goes, so the most it needs
    at once is what the writes before it grew the tree by, plus its own size, less what the
    removals free. A restore that fails for space anyway (another writer meanwhile) still
    leaves every file whole and names those it could not write."""
    try:
        disk = os.statvfs(root)
    except OSError:
        return  # the writes will say why
    block = disk.f_frsize or 4096

    def used(size: int) -> int:
        return -(-size // block) * block

    def held(path: bytes) -> int:
        try:
            info = os.lstat(os.path.join(root, path))
        except OSError:
            return 0
        return info.st_blocks * 512 if info.st_nlink == 1 else 0

    grown = -sum(held(path) for path in deletes)
    needed = 0
    for path, _mode, sha in writes:
        size = used(len(blobs[sha]))
        needed = max(needed, grown + size)
        grown += size - held(path)
    # root may write into the blocks a file system reserves for it
    free = (disk.f_bfree if os.geteuid() == 0 else disk.f_bavail) * block
    if needed > free:
        raise CheckpointError(
            f"not enough space on the working directory's disk: the restore needs {needed} bytes,"
            f" {free} are free; nothing was restored"
        )


def _drop_temporary_objects(git_dir: Path) -> None:
    """The half-written objects a git that ran out of space leaves (``objects/xx/tmp_obj_*``):
    they would hold on to the space the next snapshot needs (git's own prune waits weeks)."""
    try:
        folders = list(os.scandir(git_dir / "objects"))
    except OSError:
        return
    for folder in folders:
        if len(folder.name) != 2 or not folder.is_dir(follow_symlinks=False):
            continue
        try:
            entries = list(os.scandir(folder.path))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("tmp_obj_"):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


def _remove_empty_parents(root: bytes, full: bytes) -> None:
    parent = os.path.dirname(full)
    while parent != root and parent.startswith(root):
        try:
            os.rmdir(parent)
        except OSError:
            return
        parent = os.path.dirname(parent)


def _write_atomically(full: bytes, mode: str, content: bytes) -> None:
    """``content`` at ``full`` as a file of git's ``mode`` (or a symlink), renamed into place."""
    directory, name = os.path.split(full)
    os.makedirs(directory, exist_ok=True)
    aside = os.path.join(directory, b".%s.rewind-%s" % (name[:64], secrets.token_hex(4).encode()))
    try:
        if mode == _SYMLINK:
            os.symlink(content, aside)
        else:
            try:
                info = os.lstat(full)
            except OSError:
                kept = 0o644
            else:  # a file's own permissions stay (git keeps only whether it is executable)
                kept = stat.S_IMODE(info.st_mode) & 0o666 if stat.S_ISREG(info.st_mode) else 0o644
            wanted = kept | ((kept & 0o444) >> 2) if mode == "100755" else kept
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(content)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, wanted)
            finally:
                os.close(fd)
        if os.path.isdir(full) and not os.path.islink(full):
            os.rmdir(full)  # an empty directory where the file was (its files went first)
        os.replace(aside, full)
    except BaseException:
        try:
            os.unlink(aside)
        except OSError:
            pass
        raise


def _below(top: str, paths: Sequence[str | os.PathLike[str]]) -> frozenset[bytes]:
    """Those of ``paths`` strictly below ``top``, relative to it (a state directory that is the
    working directory itself leaves nothing out: its files are then the session's)."""
    found = set()
    for path in paths:
        relative = os.path.relpath(os.path.realpath(path), top)
        if (
            relative != os.curdir
            and relative != os.pardir
            and not relative.startswith(os.pardir + os.sep)
        ):
            found.add(os.fsencode(relative))
    return frozenset(found)


def _pattern(relative: bytes) -> bytes:
    """The gitignore line that leaves out the directory ``relative`` (to the work tree) and
    everything below it, its glob characters and trailing spaces taken literally."""
    escaped = re.sub(rb"([\\*?\[\]!# ])", rb"\\\1", relative)
    return b"/" + escaped + b"/\n"
