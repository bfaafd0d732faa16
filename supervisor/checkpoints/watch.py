"""What changed in a working directory since the last look, from Linux's inotify.

A :class:`Watcher` holds an inotify watch on every directory of the working directory (``.git``
directories left out: git never keeps them) and, when asked (:meth:`Watcher.changed`), reads
everything queued. The kernel queues an event inside the write, create, delete or rename that
caused it, before that call returns, so a queue read until it is empty holds every change
made before :meth:`~Watcher.changed` was called: nothing is in flight (a sentinel file written
and waited for would prove no more, and would be a write into the user's directory).

It answers (:class:`Changes`) with the paths of the files (and symlinks) that changed and of
the directories created or deleted, relative to the directory, or ``None``: it cannot say, and
the caller must look at every file. A directory created is watched when its event is read and
then listed, its files named as changed: what was written in it before its watch existed is
found by the listing, what after, by the events. A directory deleted had each of its files
deleted first, under its watch. ``None`` comes for anything whose paths the events do not give:

- the kernel's queue overflowed (events were dropped), or could not be read: the watches are
  set up again;
- a directory moved within, into or out of the tree (its files' paths changed with no event
  of theirs; the watches below it name its old place): the watches are set up again;
- a ``.gitignore``, ``.gitattributes`` or ``.git`` changed (what git keeps, or how, changed,
  or a repository was nested), or a new directory holds a ``.git``;
- more changed paths than :data:`MAX_PATHS` (memory stays bounded), or a writer still going
  after :data:`_READS` reads;
- a watch that could not be added (the system's limit, ``fs.inotify.max_user_watches``, or a
  directory that cannot be read), more directories than :data:`MAX_WATCHES`, a working
  directory on a file system whose changes inotify does not see (a network one), or a libc
  without inotify: the watcher gives up for good and every call answers ``None``.

What inotify does not report is a write through a hard link from outside the directory, or
through a shared memory map; such a file's change is seen at the next full look.

The events are read only when asked, by the caller's thread, with no thread or task of its
own: between two looks the kernel's queue (``fs.inotify.max_queued_events``) holds them, and
an overflow only means a full look. ``inotify_simple`` is the binding: a few ctypes calls over
``inotify_init1``, ``inotify_add_watch`` and ``read``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from typing import Final

from attrs import frozen
from inotify_simple import INotify, flags  # type: ignore[import-untyped]

__all__ = ["MAX_PATHS", "MAX_WATCHES", "Changes", "Watcher"]

#: Changed paths remembered between two looks; past it, the next look is a full one (a turn
#: that rewrote a tree of generated files: git's own pass is then as cheap as any).
MAX_PATHS: Final = 10_000
#: Directories watched at most. Each watch holds about 1 KiB of kernel memory and counts
#: against the user's ``fs.inotify.max_user_watches``, which their editor's and build tools'
#: watchers share: a tree with more (a large ``node_modules``) gets full looks only.
MAX_WATCHES: Final = 10_000
#: Reads of the queue per look: a writer faster than the reads would otherwise keep one going.
_READS: Final = 64

_MASK: Final = (
    flags.MODIFY
    | flags.ATTRIB
    | flags.CLOSE_WRITE
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.CREATE
    | flags.DELETE
    | flags.DELETE_SELF
    | flags.MOVE_SELF
    | flags.ONLYDIR
    | flags.DONT_FOLLOW
)
#: events after which the watches no longer match the tree (set up again)
_REBUILD: Final = flags.Q_OVERFLOW | flags.UNMOUNT
#: names whose change is a change of what git keeps, or of how, not just of a file
_GIT_NAMES: Final = frozenset({b".git", b".gitignore", b".gitattributes"})
#: file systems whose every change the kernel sees (a network or FUSE one may change elsewhere)
_LOCAL_FS: Final = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "bcachefs",
     "jfs", "reiserfs", "nilfs2", "ramfs", "hfsplus", "vfat", "exfat", "ntfs3"}
)  # fmt: skip


@frozen
class Changes:
    """What changed since the last look, relative to the root."""

    #: files and symlinks written, created, deleted, renamed or given another mode
    files: frozenset[bytes]
    #: directories created (or found in a created one) or deleted
    dirs: frozenset[bytes]


class Watcher:
    """inotify watches on a directory tree (see the module docstring). Not thread-safe: one
    caller at a time (the store calls it under its lock, in a worker thread)."""

    def __init__(
        self,
        root: str | bytes,
        *,
        max_paths: int = MAX_PATHS,
        max_watches: int = MAX_WATCHES,
        skip: Collection[bytes] = frozenset(),
    ) -> None:
        """``skip``: directories (relative to ``root``) never watched, nor anything below
        them: what no snapshot records (the supervisor's own state directory)."""
        self.root = os.fsencode(root)
        self.skip = frozenset(skip)
        self.max_paths = max_paths
        self.max_watches = max_watches
        self._inotify: INotify | None = None
        #: watch descriptor -> its directory, relative to the root (b"": the root)
        self._dirs: dict[int, bytes] = {}
        self._paths: set[bytes] = set()
        self._dir_changes: set[bytes] = set()
        #: the paths since the last look cannot be told: the next answer is None
        self._full = True
        #: the watches must be set up again before the next look
        self._rebuild = True
        #: why the watcher gave up for good (None: it has not)
        self.broken: str | None = None

    @property
    def watching(self) -> bool:
        return self._inotify is not None and not self._rebuild

    def changed(self) -> Changes | None:
        """What changed since the last call (the first: ``None``); ``None``: not known, look
        at every file. The watches are set up (again) here when
        needed, before returning: a full look after this call misses nothing."""
        if self.broken is not None:
            return None
        if not self._rebuild:
            self._read()
        if self._rebuild:
            self._setup()
        full, paths, dirs = self._full, self._paths, self._dir_changes
        self._full, self._paths, self._dir_changes = self.broken is not None, set(), set()
        return None if full else Changes(frozenset(paths), frozenset(dirs))

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._dirs.clear()
        self._paths = set()
        self._dir_changes = set()
        self._full = self._rebuild = True

    # -- events -------------------------------------------------------------------------------

    def _read(self) -> None:
        inotify = self._inotify
        assert inotify is not None
        for _ in range(_READS):
            try:
                events = inotify.read(timeout=0)
            except OSError:  # what it held is lost: watched afresh, and a full look
                self._full = self._rebuild = True
                return
            if not events:
                return
            for event in events:
                self._event(event.wd, event.mask, os.fsencode(event.name))
                if self._rebuild:
                    self._drain(inotify)
                    return
        self._full = True  # still writing: what is left is read by the next look

    def _drain(self, inotify: INotify) -> None:
        """The rest of the queue, unread: the watches are set up again, a full look follows."""
        while inotify.read(timeout=0):
            pass

    def _event(self, wd: int, mask: int, name: bytes) -> None:
        if mask & _REBUILD:
            self._full = self._rebuild = True
            return
        directory = self._dirs.get(wd)
        if mask & flags.IGNORED:  # a watch gone: its directory deleted, said by its parent
            self._dirs.pop(wd, None)
            return
        if directory is None:  # an event of a watch already gone
            self._full = True
            return
        if mask & (flags.DELETE_SELF | flags.MOVE_SELF):
            if directory == b"" or mask & flags.MOVE_SELF:
                self._full = self._rebuild = True  # the root itself, or a move (its parent's)
            return
        if not name:  # the directory's own attributes: git keeps none
            return
        if name in _GIT_NAMES:
            self._full = True
            if name == b".git":
                return  # a repository nested or no longer: never watched inside
        path = os.path.join(directory, name) if directory else name
        if path in self.skip:
            return
        if mask & flags.ISDIR:
            if mask & (flags.MOVED_FROM | flags.MOVED_TO):
                # its files' paths changed with no event of theirs, and the watches below it
                # name its old place
                self._full = self._rebuild = True
                return
            if mask & flags.CREATE:
                self._watch_tree(path, new=True)  # watched even when the look is a full one
            if mask & (flags.CREATE | flags.DELETE):
                # (a deleted one's files were each deleted first, under its watch)
                self._add(path, self._dir_changes)
            return
        self._add(path, self._paths)

    def _add(self, path: bytes, into: set[bytes]) -> None:
        if self._full:
            return
        into.add(path)
        if len(self._paths) + len(self._dir_changes) > self.max_paths:
            self._full = True
            self._paths, self._dir_changes = set(), set()

    # -- watches ------------------------------------------------------------------------------

    def _setup(self) -> None:
        """A new inotify instance watching every directory, each watched before it is listed
        (what is written in it after its listing has an event)."""
        self.close()
        self._full = True
        why = _not_local(self.root)
        if why is not None:
            self.broken = why
            return
        try:
            self._inotify = INotify(nonblocking=True)
        except (OSError, AttributeError) as exc:  # AttributeError: a libc without inotify
            self.broken = f"inotify is not available: {getattr(exc, 'strerror', None) or exc}"
            return
        self._rebuild = False
        self._watch_tree(b"", new=False)

    def _watch_tree(self, top: bytes, *, new: bool) -> None:
        """Watch ``top`` and every directory below it, each before it is listed; ``new``: a
        directory created since the last look, whose files are all named as changed (a
        ``.git`` in it means a nested repository: a full look)."""
        inotify = self._inotify
        assert inotify is not None
        pending = [top]
        while pending and self.broken is None:
            relative = pending.pop()
            full = os.path.join(self.root, relative) if relative else self.root
            try:
                wd = inotify.add_watch(full, _MASK)
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone (or replaced by a file) meanwhile: its parent's event says so
            except OSError as exc:
                self._give_up(f"a directory cannot be watched ({exc.strerror or exc})")
                return
            self._dirs[wd] = relative
            if len(self._dirs) > self.max_watches:
                self._give_up(f"more than {self.max_watches} directories")
                return
            try:
                entries = list(os.scandir(full))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                self._give_up(f"a directory cannot be listed ({exc.strerror or exc})")
                return
            for entry in entries:
                name = os.fsencode(entry.name)
                path = os.path.join(relative, name) if relative else name
                if name == b".git":
                    if new:
                        self._full = True
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    if path in self.skip:
                        continue
                    pending.append(path)
                    if new:
                        self._add(path, self._dir_changes)
                elif new:
                    if name in _GIT_NAMES:
                        self._full = True
                    self._add(path, self._paths)

    def _give_up(self, why: str) -> None:
        self.close()
        self.broken = why


def _not_local(root: bytes) -> str | None:
    """Why changes below ``root`` may not all be seen by inotify (None: they are): its file
    system, from the mount table, is not one of :data:`_LOCAL_FS`."""
    try:
        with open("/proc/self/mountinfo", "rb") as table:
            mounts = table.read().splitlines()
    except OSError:
        return "the mount table cannot be read"
    best, kind = b"", ""
    for line in mounts:
        fields = line.split(b" ")
        try:
            after = fields.index(b"-")
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), fields[4])
            fs = fields[after + 1].decode("ascii", "replace")
        except (IndexError, ValueError):
            continue
        inside = root == point or root.startswith(point.rstrip(b"/") + b"/")
        if inside and len(point) >= len(best):
            best, kind = point, fs
    if kind in _LOCAL_FS:
        return None
    return f"its file system ({kind or 'unknown'}) may change where inotify does not see"
