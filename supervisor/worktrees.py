"""A git worktree per session (``design/worktrees.md``): sessions started with ``worktree``
run in a worktree of their directory's repository, on a branch of their own, so that agents
working on one repository in parallel never write over each other.

The worktrees live under the state directory (``<state>/worktrees/<repo>-<session>``), each
with a record beside it (``<repo>-<session>.json``: its repository, branch, base commit and
session, and the supervisor running it while it runs). The record is what
``agent-supervisor worktrees`` lists and prunes, with or without a session store; the store
keeps the same with the session, so a session revived later gets its worktree back.

Git runs in the user's repository as the user would run it (their configuration, hooks and
filters: the checkout is theirs), with their ``GIT_*`` environment left out (a ``GIT_DIR``
would point it elsewhere). It adds a branch and a worktree entry; nothing else of the
repository is touched. Every git call is a subprocess run by ``trio.run_process`` within
:data:`GIT_TIMEOUT_S`; the records are read and written in a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import trio
from attrs import evolve, frozen

from supervisor.agents import tree

__all__ = [
    "BRANCH_PREFIX",
    "GIT_TIMEOUT_S",
    "Left",
    "Status",
    "Worktree",
    "WorktreeError",
    "Worktrees",
]

log = logging.getLogger(__name__)

#: A git call that takes longer is stopped and said. ``worktree add`` checks every file of the
#: repository out: seconds for 100,000 files on a slow disk, not minutes.
GIT_TIMEOUT_S: Final = 120.0
#: Branches of session worktrees are ``agent-supervisor/<session id>``: named after the
#: session, and apart from the user's own.
BRANCH_PREFIX: Final = "agent-supervisor/"
#: What a branch or directory name keeps of a session id or a repository's name.
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")
#: Names tried for one session's worktree when earlier ones are taken (a store-less
#: supervisor numbers its sessions from ``s1`` again, beside worktrees kept from before).
_MAX_NAMES: Final = 100


class WorktreeError(Exception):
    """A worktree could not be made, found or removed; the message says why."""


@frozen
class Worktree:
    """A session's worktree: where it is, its branch, the repository it belongs to (the top
    of the checkout it was made from) and the commit it was made off."""

    path: str
    branch: str
    repo: str
    base: str
    session_id: str
    #: the session's directory inside it (the cwd's place in its repository; "": the top)
    prefix: str = ""

    @property
    def cwd(self) -> str:
        return os.path.join(self.path, self.prefix) if self.prefix else self.path

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": self.path,
                "branch": self.branch,
                "repo": self.repo,
                "base": self.base,
                "session_id": self.session_id,
                "prefix": self.prefix,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Worktree:
        """Raises :class:`WorktreeError` for what is no worktree's JSON."""
        try:
            data = json.loads(text)
            return cls(
                path=str(data["path"]),
                branch=str(data["branch"]),
                repo=str(data["repo"]),
                base=str(data["base"]),
                session_id=str(data["session_id"]),
                prefix=str(data.get("prefix", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise WorktreeError(f"not a worktree's record: {exc}") from None


@frozen
class Status:
    """Whether a worktree holds work: changes not committed, or commits beyond its base."""

    #: its directory is there and is a worktree
    exists: bool
    #: no change and no untracked file (what git ignores is no work)
    clean: bool
    #: commits on its branch beyond its base
    ahead: int
    #: its branch is there
    branch_exists: bool

    @property
    def has_work(self) -> bool:
        return not self.clean or self.ahead > 0


@frozen
class Left:
    """What a session's stop left of its worktree."""

    worktree: Worktree
    #: kept (it holds work, or could not be removed), else removed with its branch
    kept: bool
    why: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "path": self.worktree.path,
            "branch": self.worktree.branch,
            "kept": self.kept,
            "why": self.why,
        }


def _git_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


class Worktrees:
    """The session worktrees under ``root`` (``<state>/worktrees``)."""

    def __init__(self, root: str | os.PathLike[str], *, timeout_s: float = GIT_TIMEOUT_S) -> None:
        self.root = Path(root)
        self.timeout_s = timeout_s
        self._env = _git_env()
        #: one change at a time per worktree (a stop and a revive racing)
        self._locks: dict[str, trio.Lock] = {}
        pid = os.getpid()
        self._me = {"pid": pid, "started": tree.start_ticks(pid)}

    # -- git ----------------------------------------------------------------------------------

    async def _git(self, where: str, *args: str) -> str:
        command = ["git", "-C", where, *args]
        try:
            with trio.fail_after(self.timeout_s):
                done = await trio.run_process(
                    command,
                    stdin=b"",
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    env=self._env,
                )
        except trio.TooSlowError:
            raise WorktreeError(
                f"git {args[0]} took longer than {self.timeout_s:g} s: stopped"
            ) from None
        except FileNotFoundError:
            raise WorktreeError("git is not installed") from None
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise WorktreeError(f"git {args[0]} failed: {why[-1] if why else done.returncode}")
        return done.stdout.decode("utf-8", "surrogateescape")

    async def _branch_exists(self, repo: str, branch: str) -> bool:
        try:
            await self._git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        except WorktreeError:
            return False
        return True

    # -- a session's worktree -----------------------------------------------------------------

    async def create(self, session_id: str, cwd: str) -> Worktree:
        """A new worktree of the repository ``cwd`` is in, on a new branch named after the
        session, off the commit checked out there. Raises :class:`WorktreeError` for a
        ``cwd`` in no git repository, or one with no commit yet."""
        try:
            top, prefix = (
                await self._git(cwd, "rev-parse", "--show-toplevel", "--show-prefix")
            ).split("\n")[:2]
        except WorktreeError:
            raise WorktreeError(
                f"{cwd} is not in a git repository: a worktree is made of one (start the"
                " session without worktree, or in a repository)"
            ) from None
        try:
            base = (await self._git(top, "rev-parse", "--verify", "HEAD^{commit}")).strip()
        except WorktreeError:
            raise WorktreeError(
                f"the repository {top} has no commit yet: a worktree is made off one"
            ) from None
        await trio.to_thread.run_sync(lambda: self.root.mkdir(parents=True, exist_ok=True))
        root = await trio.to_thread.run_sync(os.path.realpath, self.root)
        name = _UNSAFE.sub("-", os.path.basename(top)) or "repo"
        own = _UNSAFE.sub("-", session_id)
        for number in range(1, _MAX_NAMES + 1):
            suffix = "" if number == 1 else f"-{number}"
            path = os.path.join(root, f"{name}-{own}{suffix}")
            branch = f"{BRANCH_PREFIX}{own}{suffix}"
            taken = await trio.to_thread.run_sync(_taken, path)
            if not taken and not await self._branch_exists(top, branch):
                break
        else:
            raise WorktreeError(
                f"no free name for session {session_id}'s worktree in {root}: prune old ones"
                " (agent-supervisor worktrees --prune)"
            )
        worktree = Worktree(
            path=path,
            branch=branch,
            repo=top,
            base=base,
            session_id=session_id,
            prefix=prefix.rstrip("/"),
        )
        async with self._lock(path):
            try:
                await self._git(top, "worktree", "add", "--quiet", "-b", branch, path, base)
                await self._record(worktree, live=True)
            except BaseException:
                # Cancelled (its caller went away) or failed part way: git may have made the
                # branch, the directory or both; neither is left in the user's repository.
                with trio.CancelScope(shield=True):
                    await self._unmake(worktree)
                raise
        log.info("session %s works in the worktree %s (branch %s)", session_id, path, branch)
        return worktree

    async def _unmake(self, worktree: Worktree) -> None:
        """What :meth:`create` made of ``worktree`` before it was stopped, removed: its name
        was free (no directory, no branch), so all of it is its own. Never raises."""
        with contextlib.suppress(WorktreeError):
            await self._git(worktree.repo, "worktree", "remove", "--force", worktree.path)
        await trio.to_thread.run_sync(lambda: shutil.rmtree(worktree.path, ignore_errors=True))
        with contextlib.suppress(WorktreeError):
            await self._git(worktree.repo, "worktree", "prune")
        if await self._branch_exists(worktree.repo, worktree.branch):
            with contextlib.suppress(WorktreeError):
                await self._git(worktree.repo, "branch", "-D", "--quiet", worktree.branch)
        await trio.to_thread.run_sync(_unlink, worktree.path + ".json")

    async def reopen(self, worktree: Worktree) -> Worktree:
        """``worktree`` again, for its session revived: as it is if its directory is there;
        made again on its branch if the worktree was removed but the branch is there; else
        made anew, on a branch of the same name, off the repository's commit checked out
        now (a worktree with no work was removed with its branch when its session stopped)."""
        async with self._lock(worktree.path):
            status = await self.status(worktree)
            if status.exists:
                await self._record(worktree, live=True)
                return worktree
            repo = worktree.repo
            if not await trio.to_thread.run_sync(os.path.isdir, repo):
                raise WorktreeError(f"the repository {repo} of {worktree.path} is gone")
            await self._git(repo, "worktree", "prune")  # its entry, if it was deleted by hand
            if status.branch_exists:
                await self._git(repo, "worktree", "add", "--quiet", worktree.path, worktree.branch)
            else:
                base = (await self._git(repo, "rev-parse", "--verify", "HEAD^{commit}")).strip()
                await self._git(
                    repo, "worktree", "add", "--quiet", "-b", worktree.branch, worktree.path, base
                )
                worktree = evolve(worktree, base=base)
            await self._record(worktree, live=True)
        return worktree

    async def status(self, worktree: Worktree) -> Status:
        """Whether ``worktree`` holds work (raises :class:`WorktreeError` when git cannot
        say)."""
        branch_exists = await self._branch_exists(worktree.repo, worktree.branch)
        ahead = 0
        if branch_exists:
            ahead = int(
                await self._git(
                    worktree.repo, "rev-list", "--count", f"{worktree.base}..{worktree.branch}"
                )
            )
        exists = await trio.to_thread.run_sync(os.path.isfile, os.path.join(worktree.path, ".git"))
        if not exists:
            return Status(exists=False, clean=True, ahead=ahead, branch_exists=branch_exists)
        changes = await self._git(
            worktree.path, "status", "--porcelain", "-z", "--untracked-files=all"
        )
        return Status(exists=True, clean=not changes, ahead=ahead, branch_exists=branch_exists)

    async def release(self, worktree: Worktree) -> Left:
        """Its session stopped: removed with its branch if it holds no work, else kept (and
        said). Never raises: what cannot be looked at or removed is kept."""
        async with self._lock(worktree.path):
            try:
                status = await self.status(worktree)
            except WorktreeError as exc:
                left = Left(worktree, kept=True, why=f"its state is unknown ({exc})")
            else:
                if status.has_work:
                    left = Left(worktree, kept=True, why=_work(status))
                else:
                    try:
                        await self._remove(worktree, status)
                    except WorktreeError as exc:
                        left = Left(worktree, kept=True, why=f"it could not be removed ({exc})")
                    else:
                        left = Left(worktree, kept=False, why="no changes and no commits")
            if left.kept:
                await self._record(worktree, live=False)
        if left.kept:
            log.info(
                "session %s's worktree %s (branch %s) is kept: %s",
                worktree.session_id,
                worktree.path,
                worktree.branch,
                left.why,
            )
        else:
            log.info(
                "session %s's worktree %s and branch %s are removed: no changes and no commits",
                worktree.session_id,
                worktree.path,
                worktree.branch,
            )
        return left

    async def _remove(self, worktree: Worktree, status: Status) -> None:
        if status.exists:
            await self._git(worktree.repo, "worktree", "remove", worktree.path)
        else:
            await self._git(worktree.repo, "worktree", "prune")
        if status.branch_exists:
            await self._git(worktree.repo, "branch", "-D", "--quiet", worktree.branch)
        await trio.to_thread.run_sync(_unlink, worktree.path + ".json")

    # -- every worktree here ------------------------------------------------------------------

    async def recorded(self) -> list[tuple[Worktree, bool]]:
        """Every worktree recorded here, with whether a live supervisor runs its session."""
        return await trio.to_thread.run_sync(self._read_records)

    async def prune(self, running: Sequence[Worktree] = ()) -> list[Left]:
        """Remove every recorded worktree that holds no work and whose session runs in no
        supervisor; what each was left as."""
        gone = []
        busy = {worktree.path for worktree in running}
        for worktree, live in await self.recorded():
            if live or worktree.path in busy:
                continue
            try:
                status = await self.status(worktree)
            except WorktreeError:
                continue
            if not status.has_work:
                gone.append(await self.release(worktree))
        return gone

    def _read_records(self) -> list[tuple[Worktree, bool]]:
        found = []
        for path in sorted(self.root.glob("*.json")):
            try:
                text = path.read_text()
                worktree = Worktree.from_json(text)
                owner = json.loads(text).get("owner")
            except (OSError, ValueError, WorktreeError):
                log.warning("ignoring an unreadable worktree record %s", path)
                continue
            found.append((worktree, isinstance(owner, dict) and _alive(owner)))
        return found

    async def _record(self, worktree: Worktree, *, live: bool) -> None:
        data = json.loads(worktree.to_json())
        data["owner"] = self._me if live else None
        path = Path(worktree.path + ".json")

        def write() -> None:
            aside = path.with_suffix(".tmp")
            aside.write_text(json.dumps(data))
            os.replace(aside, path)

        try:
            await trio.to_thread.run_sync(write)
        except OSError as exc:  # the worktree works without it; only the listing misses it
            log.warning("cannot write the worktree record %s: %s", path, exc.strerror or exc)

    def _lock(self, path: str) -> trio.Lock:
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = trio.Lock()
        return lock


def _work(status: Status) -> str:
    parts = []
    if not status.clean:
        parts.append("changes not committed")
    if status.ahead:
        parts.append(f"{status.ahead} commit{'s' if status.ahead != 1 else ''} beyond its base")
    return " and ".join(parts)


def _alive(owner: dict[str, Any]) -> bool:
    """The supervisor that recorded it runs still (the same pid and start time)."""
    pid, started = owner.get("pid"), owner.get("started")
    return isinstance(pid, int) and isinstance(started, int) and tree.running(pid, started)


def _taken(path: str) -> bool:
    return os.path.lexists(path) or os.path.lexists(path + ".json")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
