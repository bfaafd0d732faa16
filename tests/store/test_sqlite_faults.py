"""A store file that cannot be used gets one line naming the file and what to do."""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_directory(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        assert "not writable" in _refused(directory / "sessions.db")
    finally:
        directory.chmod(0o700)


def test_a_read_only_file(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)
    backend.open()
    backend.close()
    path.chmod(0o400)
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only file")
    assert "not writable" in _refused(path)
