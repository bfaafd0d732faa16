"""The front door's session records (``supervisor/clients/acp_front/records.py``) stay bounded: old
ones and those beyond the newest N are pruned, the sessions open now are kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import trio.testing
from test_acp_front_io import OneSession, line

from supervisor.clients.acp_front.records import MAX_AGE_S, Record, Records
from supervisor.clients.acp_front.server import AcpFront

DAY = 24 * 3600.0


def _record(records: Records, session_id: str, updated_at: float) -> None:
    record = Record(session_id, "demo", "/w")
    record.updated_at = updated_at
    records.save(record)


def _ids(directory: Path) -> set[str]:
    return {path.stem for path in directory.glob("acp-*.json")}


def test_records_older_than_the_bound_are_pruned(tmp_path: Path) -> None:
    now = 1_000_000_000.0
    records = Records(tmp_path)
    _record(records, "acp-fresh", now - DAY)
    _record(records, "acp-stale", now - MAX_AGE_S - DAY)
    _record(records, "acp-openstale", now - MAX_AGE_S - DAY)
    removed = records.prune(keep={"acp-openstale"}, now=now)
    assert removed == ["acp-stale"]
    assert _ids(tmp_path) == {"acp-fresh", "acp-openstale"}
    assert records.load("acp-fresh") is not None


def test_only_the_newest_records_are_kept(tmp_path: Path) -> None:
    now = 1_000_000_000.0
    records = Records(tmp_path, max_records=3)
    for n in range(6):
        _record(records, f"acp-s{n}", now - n * 60)  # s0 newest
    removed = records.prune(keep={"acp-s5"}, now=now)
    # The session open now counts toward the bound and is kept; the two newest others stay.
    assert sorted(removed) == ["acp-s2", "acp-s3", "acp-s4"]
    assert _ids(tmp_path) == {"acp-s0", "acp-s1", "acp-s5"}
    assert [r.session_id for r in records.all()] == ["acp-s0", "acp-s1", "acp-s5"]


def test_an_unreadable_record_is_pruned_and_other_files_are_left(tmp_path: Path) -> None:
    records = Records(tmp_path)
    _record(records, "acp-good", 2_000_000_000.0)
    (tmp_path / "acp-broken.json").write_text("{not json")
    (tmp_path / "notes.txt").write_text("mine")
    assert records.prune(now=2_000_000_000.0) == ["acp-broken"]
    assert _ids(tmp_path) == {"acp-good"}
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_no_directory_prunes_nothing() -> None:
    assert Records(None).prune() == []


class _Recorded(OneSession):
    persistent_ids = True


async def test_the_front_door_prunes_at_start_and_keeps_the_session_it_opens(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    records = Records(tmp_path, max_records=2)
    _record(records, "acp-old1", 1.0)  # 1970: far beyond the age bound
    _record(records, "acp-old2", 2.0)
    front = AcpFront(_Recorded(), records=records)
    to_front, from_client = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(front.serve, from_client, from_client)
        new = {"id": 1, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}
        await to_front.send_all(line(new))
        received = b""
        answer: dict[str, Any] | None = None
        with trio.fail_after(5):
            while answer is None:
                received += await to_front.receive_some(65536)
                for raw in received.split(b"\n")[:-1]:
                    message = json.loads(raw)
                    if message.get("id") == 1:
                        answer = message
        session_id = answer["result"]["sessionId"]
        assert _ids(tmp_path) == {session_id}
        await to_front.aclose()


async def _listed(front: AcpFront) -> list[dict[str, Any]]:
    """The sessions the front door's ``session/list`` answers."""
    to_front, from_client = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(front.serve, from_client, from_client)
        await to_front.send_all(line({"id": 1, "method": "session/list", "params": {}}))
        received = b""
        with trio.fail_after(5):
            while True:
                received += await to_front.receive_some(65536)
                for raw in received.split(b"\n")[:-1]:
                    message = json.loads(raw)
                    if message.get("id") == 1:
                        await to_front.aclose()
                        sessions: list[dict[str, Any]] = message["result"]["sessions"]
                        return sessions


class _OverAGateway(OneSession):
    async def list(self) -> list[dict[str, Any]]:
        return [{"session_id": "s1\u202e@h", "agent": "demo\x1b[2J", "cwd": "/w", "state": "ready"}]


async def test_session_titles_are_listed_with_control_and_bidi_characters_escaped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A title (the first prompt's first line; over a gateway, the agent and the session's id)
    is shown in the editor's list among the others: its control characters and bidi controls
    are escaped there. The record keeps the prompt as it was (a load replays it)."""
    prompt = "fix \u202eexe.txt\x1b[2J please"
    records = Records(tmp_path)
    record = Record("acp-s1", "demo", "/w")
    record.add("user", prompt)
    records.save(record)
    assert [s["title"] for s in await _listed(AcpFront(_Recorded(), records=records))] == [
        r"fix \u202eexe.txt\x1b[2J please"
    ]
    assert [s["title"] for s in await _listed(AcpFront(_OverAGateway(), records=records))] == [
        r"demo\x1b[2J (s1\u202e@h)"
    ]
    kept = records.load("acp-s1")
    assert kept is not None and kept.transcript == [["user", prompt]]
