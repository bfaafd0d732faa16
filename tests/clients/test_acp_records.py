"""The front door's sessions are the store's: JSON session records left in ``acp-sessions/`` are
imported into it once (``supervisor/clients/acp_front/records.py``), a file that is no record is
said in one line and skipped, and ``session/list`` answers from the store."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import trio
import trio.testing
from test_acp_front_io import OneSession, line

from acp_harness import front_env, run_ts
from supervisor.clients.acp_front.records import import_records
from supervisor.clients.acp_front.server import AcpFront
from supervisor.store.sqlite import SqliteBackend
from supervisor.wire.codec import event_from_json

#: One ``acp`` process's start, a few requests and its stop, on a loaded machine.
FRONT_RUN_S = 60.0


def _write_record(directory: Path, session_id: str, cwd: Path, **extra: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "session_id": session_id,
        "agent": "demo",
        "cwd": os.fspath(cwd),
        "agent_session_id": None,
        "title": None,
        "updated_at": 1_700_000_000.0,
        "transcript": [],
        **extra,
    }
    (directory / f"{session_id}.json").write_text(json.dumps(record))


def _stored(path: Path) -> SqliteBackend:
    backend = SqliteBackend(path)
    backend.open()
    return backend


def test_records_are_imported_once_with_their_turns(tmp_path: Path) -> None:
    records = tmp_path / "acp-sessions"
    transcript = [["user", "fix it"], ["agent", "Fixed"], ["agent", "."], ["user", "thanks"]]
    _write_record(records, "acp-0a1b", tmp_path, transcript=transcript, agent_session_id="x9")
    _write_record(records, "acp-2c3d", tmp_path)
    (records / "acp-9f9f.json").write_text("{not json")
    said: list[str] = []
    backend = _stored(tmp_path / "sessions.db")
    try:
        report = import_records(records, backend, {"demo": "acp"}, say=said.append)
        assert sorted(report.imported) == ["acp-0a1b", "acp-2c3d"]
        assert len(said) == 1 and "acp-9f9f.json cannot be read" in said[0]
        assert sorted(p.name for p in records.iterdir()) == [
            "acp-0a1b.json.imported",
            "acp-2c3d.json.imported",
            "acp-9f9f.json.unreadable",
        ]
        # A second import finds nothing to do, even with a file renamed back.
        os.replace(records / "acp-0a1b.json.imported", records / "acp-0a1b.json")
        again = import_records(records, backend, {"demo": "acp"}, say=said.append)
        assert again.imported == [] and again.present == ["acp-0a1b"] and len(said) == 1
        sessions = {s.id: s for s in backend.sessions()}
        assert sorted(sessions) == ["acp-0a1b", "acp-2c3d"]
        first = sessions["acp-0a1b"]
        assert (first.agent, first.cwd, first.agent_session_id) == ("demo", str(tmp_path), "x9")
        assert (first.state, first.last_active, first.turns) == ("stopped", 1_700_000_000.0, 2)
        texts = [(t.turn_id, t.kind, t.text) for t in backend.texts("acp-0a1b")]
        assert texts == [
            ("t1", "prompt", "fix it"),
            ("t1", "answer", "Fixed."),
            ("t2", "prompt", "thanks"),
        ]
        events = [event_from_json(p) for _, p in backend.events("acp-0a1b", 0, 100)]
        assert [(e.kind, e.seq) for e in events] == [
            ("turn.started", 1),
            ("message.delta", 2),
            ("message.delta", 3),
            ("turn.ended", 4),
            ("turn.started", 5),
            ("turn.ended", 6),
            ("session.state", 7),
        ]
    finally:
        backend.close()


async def _front_door(tmp_path: Path, requests: list[dict[str, Any]]) -> tuple[dict[int, Any], str]:
    """``agent-supervisor acp`` run once: ``initialize``, then ``requests`` (ids from 2), then
    the end of its stdin. Returns the answers by id and what it wrote on stderr."""
    argv = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]
    messages = [{"id": 1, "method": "initialize", "params": {"protocolVersion": 1}}]
    messages += [{"id": n, **request} for n, request in enumerate(requests, start=2)]
    with trio.fail_after(FRONT_RUN_S):
        done = await trio.run_process(
            [*argv, "acp"],
            stdin=b"".join(line(message) for message in messages),
            capture_stdout=True,
            capture_stderr=True,
            env=front_env(tmp_path),
            cwd=os.fspath(tmp_path),
        )
    answers = {}
    for raw in done.stdout.splitlines():
        got = json.loads(raw)
        if "method" not in got:
            answers[got["id"]] = got
    return answers, done.stderr.decode()


async def test_the_front_door_imports_old_records_once_and_lists_them_from_the_store(
    tmp_path: Path,
) -> None:
    """Old records: imported at the first start (a corrupt one said in one line, the others
    imported), listed from the store with their titles; the second start imports nothing and
    lists each once; a load replays an imported session and its next prompt is answered."""
    records = tmp_path / "state" / "acp-sessions"
    transcript = [["user", "remember banana"], ["agent", "Hello! banana"]]
    _write_record(records, "acp-0a1b", tmp_path, transcript=transcript)
    _write_record(records, "acp-2c3d", tmp_path, updated_at=1_600_000_000.0)
    (records / "acp-9f9f.json").write_text("[1, 2")
    listing = [{"method": "session/list", "params": {}}]
    answers, errors = await _front_door(tmp_path, listing)
    listed = answers[2]["result"]["sessions"]
    assert [(s["sessionId"], s.get("title")) for s in listed] == [
        ("acp-0a1b", "remember banana"),
        ("acp-2c3d", None),
    ]
    assert listed[0]["updatedAt"].startswith("2023-11-14T22:13:20")
    unreadable = [line for line in errors.splitlines() if "cannot be read" in line]
    assert len(unreadable) == 1 and "acp-9f9f.json" in unreadable[0]
    assert not list(records.glob("*.json"))
    answers, errors = await _front_door(tmp_path, listing)
    assert [s["sessionId"] for s in answers[2]["result"]["sessions"]] == ["acp-0a1b", "acp-2c3d"]
    assert "cannot be read" not in errors
    result = await run_ts(tmp_path, "reload", env={"ACP_TEST_SESSION": "acp-0a1b"})
    assert result["replayed"] == 2  # the prompt and the reply
    assert result["next"]["stopReason"] == "end_turn"
    store = _stored(tmp_path / "state" / "sessions.db")
    try:
        prompts = [t.text for t in store.texts("acp-0a1b") if t.kind == "prompt"]
        assert prompts == ["remember banana", "again words=3 fast"]
        assert len(store.sessions()) == 2
    finally:
        store.close()


class _Stored(OneSession):
    persistent_ids = True

    async def list(self) -> list[dict[str, Any]]:
        return [
            {
                "session_id": "s1",
                "agent": "demo",
                "cwd": "/w",
                "state": "stopped",
                "title": "fix \u202eexe.txt\x1b[2J please",
                "updated_at": 0.0,
            }
        ]


class _OverAGateway(OneSession):
    async def list(self) -> list[dict[str, Any]]:
        return [{"session_id": "s1\u202e@h", "agent": "demo\x1b[2J", "cwd": "/w", "state": "ready"}]


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


async def test_session_titles_are_listed_with_control_and_bidi_characters_escaped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A title (the first prompt's first line; over a gateway, the agent and the session's id)
    is shown in the editor's list among the others: its control characters and bidi controls
    are escaped there; a stored session is listed stopped too (a prompt brings it back)."""
    listed = await _listed(AcpFront(_Stored()))
    assert [s["title"] for s in listed] == [r"fix \u202eexe.txt\x1b[2J please"]
    assert listed[0]["updatedAt"] == "1970-01-01T00:00:00+00:00"
    assert [s["title"] for s in await _listed(AcpFront(_OverAGateway()))] == [
        r"demo\x1b[2J (s1\u202e@h)"
    ]
