"""A shadow git store per working directory: snapshots, what changed between two, a restore.

The store is a git directory of the supervisor's own, under the state directory, named after
the working directory's path; its work tree is the working directory, its index its own. Git
is run as ``git --git-dir=<store> --work-tree=<cwd>`` with the user's git environment and
global configuration left out, so the user's ``.git`` is never read for writing: no commit,
branch, stash, index change or ref there. What git ignores in the work tree (``.gitignore``
files, and the repository's ``.git/info/exclude``, given as the store's ``core.excludesFile``)
is not kept; neither are ``.git`` directories, which git never adds.

A snapshot is ``git add -A`` into the store's index, ``git write-tree``, and a commit of that
tree on the store's one branch, which keeps every snapshot's objects reachable. Files larger
than ``max_file_bytes`` are left out of the tree and named, with their size and mtime, so a
change to one is still seen. Paths are bytes throughout (a file name need not be UTF-8 and may
hold a newline): git is asked with ``-z``.

Every git call is a subprocess run by ``trio.run_process`` within :data:`GIT_TIMEOUT_S`; file
work (stats, a restore's writes) runs in a worker thread: the event loop never waits on disk.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import trio
from attrs import field, frozen

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "GIT_TIMEOUT_S",
    "Change",
    "CheckpointError",
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
#: The store's branch: its commits chain every snapshot, so none is ever unreachable.
_BRANCH: Final = b"refs/heads/checkpoints"
#: git's modes, as a change's detail names them
_KINDS: Final = {
    "100644": "file",
    "100755": "executable file",
    "120000": "symlink",
    "160000": "git repository",
}
_SYMLINK: Final = "120000"
_GITLINK: Final = "160000"


class CheckpointError(Exception):
    """A snapshot, a diff or a restore could not be made; the message says why."""


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


def _git_env() -> dict[str, str]:
    """The environment git runs in: none of the user's ``GIT_*`` (a ``GIT_DIR`` or
    ``GIT_INDEX_FILE`` would point it at their repository) and none of their global or system
    configuration (hooks, filters, autocrlf: what is kept must be the bytes on disk)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME="agent-supervisor",
        GIT_AUTHOR_EMAIL="checkpoints@agent-supervisor.invalid",
        GIT_COMMITTER_NAME="agent-supervisor",
        GIT_COMMITTER_EMAIL="checkpoints@agent-supervisor.invalid",
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
    ) -> None:
        self.cwd = os.path.realpath(cwd)
        name = hashlib.sha256(os.fsencode(self.cwd)).hexdigest()[:24]
        self.git_dir = Path(root) / name
        self.max_file_bytes = max_file_bytes
        self.timeout_s = timeout_s
        self._env = _git_env()
        self._lock = trio.Lock()
        self._ready = False
        #: the store branch's newest commit (the next snapshot's parent)
        self._head: str | None = None
        #: the newest snapshot's big files: they are not in the index, so not listed as
        #: changed by it, and are looked at again each time
        self._last_big: Mapping[bytes, tuple[int, int]] = {}

    # -- git ----------------------------------------------------------------------------------

    async def _git(
        self, *args: str | bytes, stdin: bytes | None = None, store: bool = True
    ) -> bytes:
        """``store``: run on the store and the working directory (else plain git)."""
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
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise CheckpointError(f"git {args[0]!s} failed: {why[-1] if why else done.returncode}")
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
            "core.untrackedCache": "true",
            "gc.auto": "0",  # a snapshot never waits for a collection
            "commit.gpgSign": "false",
        }
        exclude = Path(self.cwd) / ".git" / "info" / "exclude"
        if exclude.is_file():
            settings["core.excludesFile"] = str(exclude)
        for key, value in settings.items():
            await self._git("config", key, value)
        try:
            head = await self._git("rev-parse", "--verify", "--quiet", _BRANCH.decode())
        except CheckpointError:  # a new store: no snapshot yet
            self._head = None
        else:
            self._head = head.strip().decode()
        self._ready = True

    # -- snapshots ----------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """The working directory now, kept."""
        async with self._lock:
            await self._ensure()
            candidates = await self._git(
                "ls-files", "-z", "--others", "--modified", "--exclude-standard"
            )
            names = [name for name in candidates.split(b"\0") if name]
            names.extend(self._last_big)
            too_big = await trio.to_thread.run_sync(self._big_files, names)
            if too_big:
                specs = [b"."] + [b":(exclude,literal)" + path for path in too_big]
                await self._git(
                    "add",
                    "-A",
                    "--pathspec-from-file=-",
                    "--pathspec-file-nul",
                    stdin=b"\0".join(specs),
                )
                await self._git(
                    "update-index", "-z", "--force-remove", "--stdin", stdin=b"\0".join(too_big)
                )
            else:
                await self._git("add", "-A")
            tree = (await self._git("write-tree")).strip().decode()
            message = json.dumps({"too_big": {os.fsdecode(p): v for p, v in too_big.items()}})
            args = ["commit-tree", tree, "-m", message]
            if self._head is not None:
                args += ["-p", self._head]
            commit = (await self._git(*args)).strip().decode()
            await self._git("update-ref", _BRANCH.decode(), commit)
            self._head = commit
            self._last_big = too_big
            return Snapshot(commit, tree, too_big)

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
        return [found[path] for path in sorted(found)]

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

    async def restore(self, target: Snapshot) -> Restored:
        """Put the working directory back as it was at ``target``, a file at a time, each
        written aside and renamed into place. The state before is snapshotted first."""
        before = await self.snapshot()
        async with self._lock:
            raw = await self._diff(before.tree, target.tree)
            not_restored: list[tuple[bytes, str]] = []
            writes: list[tuple[bytes, str, str]] = []
            deletes: list[bytes] = []
            for _old_mode, new_mode, sha, status, path in raw:
                if path in before.too_big:
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
            restored, failed = await trio.to_thread.run_sync(
                _put_back, os.fsencode(self.cwd), deletes, writes, blobs
            )
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


def _put_back(
    root: bytes,
    deletes: list[bytes],
    writes: list[tuple[bytes, str, str]],
    blobs: dict[str, bytes],
) -> tuple[list[bytes], list[tuple[bytes, str]]]:
    """A restore's file work (in a worker thread): removals first (a directory they empty goes
    too, so a file may take its place), then each file written aside and renamed into place.
    Never half a file: a write that fails leaves the old one."""
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
