"""What the front door keeps beside the session store, and the JSON records it imports into it.

The front door's sessions are the store's (``supervisor/store/``): ``session/list`` lists the
stored sessions, ``session/load`` replays one's stored prompts and answers and a prompt starts
its agent again, resuming the agent's own session. Beside the store, ``<state dir>/acp-sessions/``
holds ``prompt-carries.json``: what each agent last said it takes in a prompt besides text (an
ACP agent says it only once it runs), for the next ``initialize`` to promise.

A session record kept there as a JSON file (``acp-<hex>.json``: the agent, the cwd, the
agent's session id, a title, the last activity and a transcript of ``[role, text]`` pairs) is
imported into the store once, at start (:func:`import_records`): the session keeps its id, its
transcript becomes its turns, and the file is renamed ``.json.imported`` (kept, never read
again). A file that cannot be read as a record is said in one line and renamed
``.json.unreadable``; a session the store has already is not imported twice.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from attrs import define, field

from protocols import events as ev
from supervisor.store.backend import Backend, Batch, EventRun, StoredSession, TextRow
from supervisor.wire.codec import event_json

__all__ = ["ImportReport", "Records", "import_records"]

log = logging.getLogger(__name__)

#: What an imported file is renamed to: kept beside the others, never imported again.
IMPORTED_SUFFIX: Final = ".imported"
#: What a file that is no record is renamed to: said once, kept for a person to look at.
UNREADABLE_SUFFIX: Final = ".unreadable"


class Records:
    """``prompt-carries.json`` in ``directory`` (None: nothing is kept); every failure to
    write is logged, never raised (a read-only home loses the hint, not the session)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    @property
    def _carries_path(self) -> Path | None:
        return self.directory / "prompt-carries.json" if self.directory is not None else None

    def carries(self, agent: str) -> frozenset[str] | None:
        """What a session of ``agent`` last said it takes in a prompt besides text (an ACP
        agent says it only once it runs), or None if none ran here yet."""
        path = self._carries_path
        if path is None:
            return None
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        words = known.get(agent) if isinstance(known, dict) else None
        if not isinstance(words, list):
            return None
        return frozenset(word for word in words if isinstance(word, str))

    def remember_carries(self, agent: str, carries: frozenset[str]) -> None:
        path = self._carries_path
        if path is None or self.carries(agent) == carries:
            return
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        if not isinstance(known, dict):
            known = {}
        known[agent] = sorted(carries)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            scratch = path.with_suffix(f".tmp{os.getpid()}")
            scratch.write_text(json.dumps(known))
            os.replace(scratch, path)
        except OSError as exc:
            log.warning("cannot record what %s takes in a prompt: %s", agent, exc)


@define
class _Record:
    """One JSON record, as read."""

    session_id: str
    agent: str
    cwd: str
    agent_session_id: str | None
    updated_at: float
    #: [role, text] pairs, role ``user`` or ``agent``
    transcript: list[tuple[str, str]] = field(factory=list)


def _read(path: Path) -> _Record | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        transcript = [(str(role), str(text)) for role, text in data.get("transcript") or []]
        session_id = str(data["session_id"])
        agent, cwd = str(data["agent"]), str(data["cwd"])
        updated_at = float(data.get("updated_at") or 0.0)
    except (KeyError, TypeError, ValueError):
        return None
    if session_id != path.name.removesuffix(".json") or not cwd.startswith("/"):
        return None
    own = data.get("agent_session_id")
    own = own if isinstance(own, str) and own else None
    return _Record(session_id, agent, cwd, own, updated_at, transcript)


@define
class ImportReport:
    imported: list[str] = field(factory=list)
    #: already in the store (a file renamed back, an import the process died in)
    present: list[str] = field(factory=list)
    #: files that are no record (renamed ``.unreadable``)
    unreadable: list[str] = field(factory=list)


def pending_records(directory: Path) -> list[Path]:
    """The JSON records in ``directory`` not imported yet (none if it cannot be read)."""
    try:
        return sorted(directory.glob("acp-*.json"))
    except OSError:
        return []


def import_records(
    directory: Path,
    backend: Backend,
    protocols: Mapping[str, str],
    *,
    say: Callable[[str], None] = log.warning,
) -> ImportReport:
    """Import the JSON records of ``directory`` into ``backend`` (open), in one transaction,
    then rename each file (:data:`IMPORTED_SUFFIX`, :data:`UNREADABLE_SUFFIX`): a process that
    dies between the two imports the same records again at its next start, and the store
    keeps them once. ``protocols``: each configured agent's protocol (stored with the session;
    an agent not configured any more is taken to be an ACP one). Blocking: a worker thread's."""
    report = ImportReport()
    stored = {session.id for session in backend.sessions()}
    batch = Batch()
    done: list[Path] = []
    for path in pending_records(directory):
        record = _read(path)
        if record is None:
            say(
                f"ACP session record {path} cannot be read: skipped, kept as"
                f" {path.name}{UNREADABLE_SUFFIX}"
            )
            report.unreadable.append(path.name)
            _rename(path, UNREADABLE_SUFFIX)
            continue
        done.append(path)
        if record.session_id in stored:
            report.present.append(record.session_id)
            continue
        stored.add(record.session_id)
        _add(batch, record, protocols.get(record.agent, "acp"))
        report.imported.append(record.session_id)
    if batch:
        backend.write(batch)
    for path in done:
        _rename(path, IMPORTED_SUFFIX)
    return report


def _rename(path: Path, suffix: str) -> None:
    try:
        os.replace(path, path.with_name(path.name + suffix))
    except OSError as exc:
        log.warning("cannot rename %s: %s", path, exc)


def _add(batch: Batch, record: _Record, protocol: str) -> None:
    """The record's session as the store keeps one: each prompt a turn (``t1``, ``t2``, ...)
    that started with it and completed, the agent's reply its answer."""
    sid, at = record.session_id, record.updated_at or time.time()
    events: list[ev.Event] = []
    turn: str | None = None
    answer: list[str] = []
    seq = 0

    def stamp() -> dict[str, Any]:
        nonlocal seq
        seq += 1
        return {"session_id": sid, "seq": seq, "timestamp": at}

    def end_turn() -> None:
        if turn is None:
            return
        ended = ev.TurnEnded(**stamp(), turn_id=turn, outcome="completed")
        events.append(ended)
        if answer:
            text = "".join(answer)
            batch.texts.append(
                TextRow(session_id=sid, turn_id=turn, seq=ended.seq, kind="answer", text=text)
            )

    turns = 0
    for role, text in record.transcript:
        if role == "user":
            end_turn()
            turns += 1
            turn, answer = f"t{turns}", []
            started = ev.TurnStarted(**stamp(), turn_id=turn, text=text)
            events.append(started)
            batch.texts.append(
                TextRow(session_id=sid, turn_id=turn, seq=started.seq, kind="prompt", text=text)
            )
        elif turn is not None:
            events.append(ev.MessageDelta(**stamp(), turn_id=turn, text=text))
            answer.append(text)
    end_turn()
    events.append(ev.SessionState(**stamp(), state="stopped"))
    batch.events.append(
        EventRun(session_id=sid, first_seq=1, payloads=[event_json(e) for e in events])
    )
    batch.sessions.append(
        StoredSession(
            id=sid,
            agent=record.agent,
            protocol=protocol,
            host=None,
            cwd=record.cwd,
            mcp_servers="[]",
            agent_session_id=record.agent_session_id,
            created=at,
            last_active=at,
            state="stopped",
            clean=True,
            turns=turns,
        )
    )
