"""Which snapshots are a node session's checkpoints, recorded beside them.

A session of this machine has its checkpoints' rows in the session store (table
``checkpoints``), and a session revived from it gets them back. A node keeps no session store,
yet its sessions' snapshots outlive it in the checkpoint store of their working directory: a
front's stored session started again on its host (``supervisor/remote/revival.py``) must find
them. So a node records each row where the snapshots are: appended, one JSON object a line, to
``<store>/sessions/<hash of the key>.jsonl``. The key is the node's id of the session as first
started: a session started again goes on recording under the key its front names
(``Revival.checkpoints_of``), so its earlier turns and its own are one list.

The rows are applied in order as the session store applies them (:data:`UPSERT_CHECKPOINT
<supervisor.store.backend.UPSERT_CHECKPOINT>`): one without an end is a new checkpoint, one
with an end sets its turn's end. One task appends them in the order the sessions told them, in
a worker thread; a file past :data:`COMPACT_AFTER_LINES` lines is written again with the newest
:data:`~supervisor.core.checkpoints.CHECKPOINTS_KEPT` checkpoints, aside and renamed into place.
A row told in the last milliseconds before the node is killed may be lost: that checkpoint is
then not had back, the others are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import trio

from supervisor.checkpoints.shadow import ShadowStore
from supervisor.core.checkpoints import CHECKPOINTS_KEPT
from supervisor.store.backend import CheckpointRow

__all__ = ["COMPACT_AFTER_LINES", "CheckpointRecords"]

log = logging.getLogger(__name__)

#: Lines a record may have before it is written again with only the checkpoints a session
#: keeps: a turn appends two, so a file stays within a few tens of KB however long it runs.
COMPACT_AFTER_LINES: Final = 4 * CHECKPOINTS_KEPT
#: below a store's git directory
_DIRECTORY: Final = "sessions"


class CheckpointRecords:
    """A node's record of its sessions' checkpoints (see the module docstring)."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[tuple[Path, CheckpointRow]](math.inf)
        #: lines of each record written by this process, once counted
        self._lines: dict[Path, int] = {}
        #: set once :meth:`run` has written all that was told before :meth:`close`
        self.drained = trio.Event()

    @staticmethod
    def path(store: ShadowStore, key: str) -> Path:
        """Where the checkpoints recorded under ``key`` in ``store`` are (any text names a
        file: the key comes from a front)."""
        name = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
        return store.git_dir / _DIRECTORY / f"{name}.jsonl"

    def keep(self, path: Path, row: CheckpointRow) -> None:
        """A session's new checkpoint, or its turn's end (a session's ``on_checkpoint``):
        appended soon, in the order told (after :meth:`close`: nowhere)."""
        with contextlib.suppress(trio.ClosedResourceError):
            self._send.send_nowait((path, row))

    def close(self) -> None:
        """Nothing more is told: :meth:`run` ends once what was is written."""
        self._send.close()

    async def run(self) -> None:
        """Append what is told, until :meth:`close` (or cancelled)."""
        async for first in self._receive:
            batch = [first]
            while True:
                try:
                    batch.append(self._receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            try:
                await trio.to_thread.run_sync(self._append, batch)
            except OSError as exc:  # (a full disk: the checkpoints are kept all the same)
                log.warning("checkpoint records cannot be written: %s", exc.strerror or exc)
        self.drained.set()

    @staticmethod
    async def read(path: Path, key: str, limit: int = CHECKPOINTS_KEPT) -> list[CheckpointRow]:
        """The newest ``limit`` checkpoints recorded at ``path``, oldest first (none: no
        record); a line that cannot be read is left out."""
        return await trio.to_thread.run_sync(_read, path, key, limit)

    def _append(self, batch: list[tuple[Path, CheckpointRow]]) -> None:
        by_path: dict[Path, list[CheckpointRow]] = {}
        for path, row in batch:
            by_path.setdefault(path, []).append(row)
        for path, rows in by_path.items():
            lines = self._lines.get(path)
            if lines is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                lines = _count_lines(path)
            with open(path, "ab") as file:
                file.write(b"".join(_line(row) for row in rows))
            lines += len(rows)
            if lines > COMPACT_AFTER_LINES:
                kept = _read(path, "", CHECKPOINTS_KEPT)
                _write_aside(path, b"".join(_line(row) for row in kept))
                lines = len(kept)
            self._lines[path] = lines


def _line(row: CheckpointRow) -> bytes:
    data = {"id": row.checkpoint_id, "n": row.n, "start": row.start, "end": row.end}
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as file:
            return sum(1 for _ in file)
    except FileNotFoundError:
        return 0


def _read(path: Path, key: str, limit: int) -> list[CheckpointRow]:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return []
    found: dict[str, CheckpointRow] = {}
    for row in _rows(text.splitlines(), key):
        earlier = found.get(row.checkpoint_id)
        if row.end is None or earlier is None:
            found[row.checkpoint_id] = row  # a new checkpoint (its id may be a forgotten one's)
        else:  # its turn's end
            found[row.checkpoint_id] = CheckpointRow(
                session_id=key,
                checkpoint_id=row.checkpoint_id,
                n=earlier.n,
                start=earlier.start,
                end=row.end,
            )
    newest = sorted(found.values(), key=lambda row: row.n)[-limit:]
    return newest


def _rows(lines: Iterable[bytes], key: str) -> Iterable[CheckpointRow]:
    for line in lines:
        try:
            data: Any = json.loads(line)
            checkpoint_id, n, start, end = data["id"], data["n"], data["start"], data["end"]
        except (ValueError, TypeError, KeyError):
            continue  # (a line cut by a kill as it was written)
        if (
            isinstance(checkpoint_id, str)
            and type(n) is int
            and isinstance(start, str)
            and (end is None or isinstance(end, str))
        ):
            yield CheckpointRow(
                session_id=key, checkpoint_id=checkpoint_id, n=n, start=start, end=end
            )


def _write_aside(path: Path, content: bytes) -> None:
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        with open(aside, "wb") as file:
            file.write(content)
        os.replace(aside, path)
    except BaseException:
        aside.unlink(missing_ok=True)
        raise
