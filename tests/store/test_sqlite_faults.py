"""A store file that cannot be used gets one line naming the file and what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from supervisor.store.backend import StoreError
from supervisor.store.sqlite import SqliteBackend


def _refused(path: Path) -> str:
    backend = SqliteBackend(path)
    with pytest.raises(StoreError) as raised:
        backend.open()
    message = str(raised.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    path.write_bytes(b"this is not a database, it is a note" * 200)
    assert "not a valid SQLite database" in _refused(path)


def test_a_file_in_use_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from supervisor.store.sqlite import SqliteBackend as B; "
            f"b = B({str(path)!r}); b.open(); print('open', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"open\n"
        assert "in use by another process" in _refused(path)
    finally:
        holder.communicate(b"", timeout=30)
    SqliteBackend(path).open()  # free again once it is gone


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` made read-only, also for root: the immutable attribute (``chattr +i``), which
    root's writes obey where they ignore the mode bits."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o500 if path.is_dir() else 0o400)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    subprocess.run(["chattr", "+i", os.fspath(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", os.fspath(path)], check=True)


def test_a_read_only_directory(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    with read_only(directory):
        assert "not writable" in _refused(directory / "sessions.db")


def test_a_read_only_file(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)
    backend.open()
    backend.close()
    with read_only(path):
        assert "not writable" in _refused(path)
