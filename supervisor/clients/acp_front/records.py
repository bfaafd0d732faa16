"""What the front door remembers of its sessions, so an editor finds them again.

An editor restarts its agent server and then asks ``session/list`` and ``session/load`` for a
session it had. The agent behind can resume it (its own session id: an ACP ``sessionId``, a
Codex thread, a Claude session); what is needed to ask it is kept here, one small JSON file
per session in ``<state dir>/acp-sessions/``: the agent, the cwd, the agent's session id, a
title, the last activity, and a transcript (the prompts and the replies, capped) that
``session/load`` replays, since an agent resumed with ``session/resume`` replays nothing and
the editor wants to show the conversation.

The directory is bounded (:meth:`Records.prune`, when the front door starts and whenever it
records a new session): a record untouched for :data:`MAX_AGE_S` goes, and beyond the
:data:`MAX_RECORDS` newest the rest go too; the sessions open on this connection are kept
whatever their age.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, Final

from attrs import define, field

__all__ = ["Record", "Records", "new_session_id"]

log = logging.getLogger(__name__)

#: Entries of a transcript kept (a prompt or a reply each): the newest are kept.
MAX_TRANSCRIPT_ENTRIES: Final = 200
#: Characters of one entry kept: a replay shows the conversation, not every byte of it.
MAX_ENTRY_CHARS: Final = 16_000
#: A record whose session was last active this long ago is pruned (30 days).
MAX_AGE_S: Final = 30 * 24 * 3600.0
#: Records kept at most: the newest (by last activity).
MAX_RECORDS: Final = 500
#: Characters of a title (the first prompt's first line).
MAX_TITLE_CHARS: Final = 80


def new_session_id() -> str:
    return f"acp-{secrets.token_hex(8)}"


@define
class Record:
    session_id: str
    agent: str
    cwd: str
    agent_session_id: str | None = None
    title: str | None = None
    updated_at: float = field(factory=time.time)
    #: [role, text] pairs, role ``user`` or ``agent``
    transcript: list[list[str]] = field(factory=list)

    def add(self, role: str, text: str) -> None:
        if not text:
            return
        if role == "user" and self.title is None:
            self.title = text.strip().splitlines()[0][:MAX_TITLE_CHARS] if text.strip() else None
        if self.transcript and self.transcript[-1][0] == role == "agent":
            merged = self.transcript[-1][1] + text
            self.transcript[-1][1] = merged[:MAX_ENTRY_CHARS]
        else:
            self.transcript.append([role, text[:MAX_ENTRY_CHARS]])
        del self.transcript[:-MAX_TRANSCRIPT_ENTRIES]
        self.updated_at = time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "agent": self.agent,
            "cwd": self.cwd,
            "agent_session_id": self.agent_session_id,
            "title": self.title,
            "updated_at": self.updated_at,
            "transcript": self.transcript,
        }

    @classmethod
    def from_json(cls, data: Any) -> Record | None:
        if not isinstance(data, dict):
            return None
        try:
            transcript = [[str(role), str(text)] for role, text in data.get("transcript") or []]
            return cls(
                session_id=str(data["session_id"]),
                agent=str(data["agent"]),
                cwd=str(data["cwd"]),
                agent_session_id=data.get("agent_session_id") or None,
                title=data.get("title") or None,
                updated_at=float(data.get("updated_at") or 0.0),
                transcript=transcript,
            )
        except (KeyError, TypeError, ValueError):
            return None


class Records:
    """The records in one directory; every failure to write is logged, never raised (a
    read-only home loses the list, not the session)."""

    def __init__(
        self,
        directory: Path | None,
        *,
        max_age_s: float = MAX_AGE_S,
        max_records: int = MAX_RECORDS,
    ) -> None:
        self.directory = directory
        self.max_age_s = max_age_s
        self.max_records = max_records

    def _path(self, session_id: str) -> Path | None:
        if self.directory is None or not session_id.startswith("acp-"):
            return None
        if not session_id[4:].isalnum():
            return None  # an id we did not make: never a path
        return self.directory / f"{session_id}.json"

    def save(self, record: Record) -> None:
        path = self._path(record.session_id)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            scratch = path.with_suffix(f".tmp{os.getpid()}")
            scratch.write_text(json.dumps(record.to_json()))
            os.replace(scratch, path)
        except OSError as exc:
            log.warning("cannot record ACP session %s: %s", record.session_id, exc)

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

    def load(self, session_id: str) -> Record | None:
        path = self._path(session_id)
        if path is None:
            return None
        try:
            return Record.from_json(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def all(self) -> list[Record]:
        if self.directory is None:
            return []
        records = []
        try:
            paths = sorted(self.directory.glob("acp-*.json"))
        except OSError:
            return []
        for path in paths:
            record = self.load(path.stem)
            if record is not None:
                records.append(record)
        return sorted(records, key=lambda r: r.updated_at, reverse=True)

    def prune(self, keep: Collection[str] = (), *, now: float | None = None) -> list[str]:
        """Remove the records older than :attr:`max_age_s` and those beyond the
        :attr:`max_records` newest, except ``keep`` (sessions open now); an unreadable record
        goes too (nothing could load it). Returns the session ids removed."""
        if self.directory is None:
            return []
        now = time.time() if now is None else now
        try:
            paths = sorted(self.directory.glob("acp-*.json"))
        except OSError:
            return []
        dated: list[tuple[float, Path]] = []
        for path in paths:
            record = self.load(path.stem)
            dated.append((record.updated_at if record is not None else -1.0, path))
        dated.sort(key=lambda item: item[0], reverse=True)
        removed = []
        kept = sum(1 for _, path in dated if path.stem in keep)  # the open ones count first
        for updated_at, path in dated:
            if path.stem in keep:
                continue
            if updated_at >= 0 and now - updated_at <= self.max_age_s and kept < self.max_records:
                kept += 1
                continue
            try:
                path.unlink()
            except OSError as exc:
                log.warning("cannot prune ACP session record %s: %s", path.name, exc)
                continue
            removed.append(path.stem)
        return removed
