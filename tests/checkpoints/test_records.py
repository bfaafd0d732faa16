"""A node's record of its sessions' checkpoints, beside their snapshots: rows applied as the
session store applies them, kept bounded, and had back by key."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from supervisor.checkpoints import ShadowStore
from supervisor.checkpoints.records import COMPACT_AFTER_LINES, CheckpointRecords
from supervisor.core.checkpoints import CHECKPOINTS_KEPT
from supervisor.remote.revival import Revival, first_node_id
from supervisor.store.backend import CheckpointRow


def row(checkpoint_id: str, n: int, start: str, end: str | None = None) -> CheckpointRow:
    return CheckpointRow(session_id="s1", checkpoint_id=checkpoint_id, n=n, start=start, end=end)


async def test_rows_are_had_back_by_key_merged_and_bounded(tmp_path: Path) -> None:
    store = ShadowStore(tmp_path / "checkpoints", tmp_path)
    records = CheckpointRecords()
    path, other = records.path(store, "s1"), records.path(store, "s2")
    turns = COMPACT_AFTER_LINES // 2 + 10  # two rows a turn: compacted once at least
    async with trio.open_nursery() as nursery:
        nursery.start_soon(records.run)
        for n in range(1, turns + 1):
            records.keep(path, row(f"t{n}", n, f"start{n}"))
            records.keep(path, row(f"t{n}", 0, f"start{n}", end=f"end{n}"))
        records.keep(path, row("r1", turns + 1, "before-r1"))
        records.keep(other, row("t1", 1, "another session's"))
        records.close()  # (its run ends once all is written)
    kept = await records.read(path, "s1")
    assert len(kept) == CHECKPOINTS_KEPT
    assert kept[-1] == CheckpointRow(
        session_id="s1", checkpoint_id="r1", n=turns + 1, start="before-r1"
    )
    newest = turns
    assert kept[-2] == CheckpointRow(
        session_id="s1",
        checkpoint_id=f"t{newest}",
        n=newest,
        start=f"start{newest}",
        end=f"end{newest}",
    )
    assert len(path.read_bytes().splitlines()) <= COMPACT_AFTER_LINES
    assert [r.start for r in await records.read(other, "s2")] == ["another session's"]
    path.write_bytes(path.read_bytes() + b'{"id": "t99", "n"')  # a line cut by a kill
    assert len(await records.read(path, "s1")) == CHECKPOINTS_KEPT
    assert await records.read(tmp_path / "none.jsonl", "s3") == []


def test_a_revive_names_the_key_of_the_sessions_recorded_checkpoints() -> None:
    """The front names the node's id of the session as first started (``s1`` of ``s1@h``);
    a node reads it back, and refuses what is no id; a revive without it has none."""
    revival = Revival(None, 7, 2, checkpoints_of=first_node_id("s1@h"))
    assert revival.to_wire()["checkpoints_of"] == "s1"
    assert Revival.from_wire(revival.to_wire()) == revival
    assert "checkpoints_of" not in Revival(None, 7, 2).to_wire()
    assert Revival.from_wire({"last_seq": 0, "turns": 0}).checkpoints_of is None
    with pytest.raises(ValueError, match="checkpoints_of"):
        Revival.from_wire({"last_seq": 0, "turns": 0, "checkpoints_of": 3})
