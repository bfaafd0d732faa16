"""A test's body run as a user who cannot read what its files' modes forbid: root reads every
file, so as root the body runs as ``nobody`` in a child process (util-linux's ``setpriv``).

The module holding the body ends with :func:`child_main` under ``if __name__ == "__main__"``:
the child runs the body by name, with plain asserts whose failure the test shows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

#: ``nobody``'s uid and gid on Debian (and most systems)
NOBODY = 65534


def run_unprivileged(
    module_file: str, body: Callable[[Path], Awaitable[None]], bound_s: float
) -> None:
    """Run ``body(directory)`` (a module-level async function of ``module_file``) in a fresh
    temporary directory, as ``nobody`` when this process is root."""
    if os.geteuid() != 0:
        with tempfile.TemporaryDirectory() as tmp:
            trio.run(body, Path(tmp))
        return
    if shutil.which("setpriv") is None:
        pytest.skip(
            "running as root without util-linux's setpriv: root reads every file, so a file"
            " that cannot be read needs another user"
        )
    # (pytest's own directories are root's alone: one that nobody may enter)
    with tempfile.TemporaryDirectory(prefix="unprivileged-") as shared:
        os.chmod(shared, 0o777)
        done = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            + [sys.executable, module_file, body.__name__, shared],
            capture_output=True,
            timeout=bound_s,
            env={**os.environ, "HOME": shared, "PYTHONPATH": str(Path(__file__).parent)},
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def child_main(bodies: dict[str, object]) -> None:
    """The child's side: run the body ``argv[1]`` names (from ``bodies``, its module's
    globals) in the directory ``argv[2]``."""
    body = bodies[sys.argv[1]]
    assert callable(body)
    trio.run(body, Path(sys.argv[2]))
