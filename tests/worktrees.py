"""Working directories as tests look at them: a user's git, every file's bytes and mode."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

__all__ = ["fingerprint", "git", "tree"]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "u",
            "GIT_AUTHOR_EMAIL": "u@x",
            "GIT_COMMITTER_NAME": "u",
            "GIT_COMMITTER_EMAIL": "u@x",
        },
    )


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` (a user's ``.git``), by path: its bytes' hash and mode."""
    seen: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        seen[str(path.relative_to(directory))] = f"{info.st_mode:o} {digest}"
    return seen


def tree(root: Path) -> dict[bytes, tuple[int, bytes]]:
    """The work tree as (mode, bytes or link target) by path, ``.git`` left out."""
    found: dict[bytes, tuple[int, bytes]] = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        if b".git" in dirnames:
            dirnames.remove(b".git")
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, base)
            info = os.lstat(full)
            if os.path.islink(full):
                found[rel] = (0o120000, os.readlink(full))
            else:
                with open(full, "rb") as f:
                    found[rel] = (info.st_mode, f.read())
    return found
