"""The front's record of its remote sessions, so the front that starts after a crash finds them.

A remote session lives in its node, not in the front: when ``serve`` (or an embedding app with
a ``state_dir``) dies, its sessions go on on their hosts for the node's ``detach_s``. Each
front writes the sessions it has placed to ``remote-PID.json`` in its state directory (which
host, the node's session id and the node's ``instance``). A front that starts adopts the
files of fronts that are gone (a pid that is not alive with that start time: exact, as for the
crash-safety sweep), reconnects to their hosts and resubscribes each session from seq 0: the
node's history rebuilds the front's, under the same ids and the same ``seq``, so a client that
reconnects resubscribes from its last ``seq`` and sees every event once. A session the node no
longer has, or a node that was replaced meanwhile, fails with that cause.

A front that exits cleanly but keeps its node sessions (``keep_node_sessions``: ``serve``'s
default) *releases* its record: ``remote-released-PID-N.json``, adoptable by the next front at
once, even one in the same process. A record is claimed by renaming it (one front wins).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Any

from supervisor.agents import tree

__all__ = ["RemoteRecord"]

log = logging.getLogger(__name__)

_names = itertools.count(1)


class RemoteRecord:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        pid = os.getpid()
        self._me = {"pid": pid, "started": tree.start_ticks(pid)}
        self.path = directory / f"remote-{pid}.json"
        self._sessions: dict[str, dict[str, Any]] = {}

    def adopt(self) -> list[dict[str, Any]]:
        """The sessions of fronts that are gone, or that released them at a clean exit (their
        files are taken over: claimed, removed, and what they held is ours now)."""
        found: list[dict[str, Any]] = []
        if not self.directory.is_dir():
            return found
        for path in sorted(self.directory.glob("remote-*.json")):
            if path == self.path:
                continue
            try:
                data = json.loads(path.read_text())
                owner, sessions = data["front"], data["sessions"]
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable remote-session record %s", path)
                continue
            if not data.get("released") and _alive(owner):
                continue  # another front, running beside us: its sessions are its own
            claimed = self.directory / f"claimed-{os.getpid()}-{next(_names)}.tmp"
            try:
                os.rename(path, claimed)  # one front wins the record
            except FileNotFoundError:
                continue
            found.extend(s for s in sessions if isinstance(s, dict))
            with contextlib.suppress(FileNotFoundError):
                claimed.unlink()
        for entry in found:
            self._sessions[str(entry.get("session_id"))] = entry
        if found:
            self._write()
        return found

    def add(self, entry: dict[str, Any]) -> None:
        self._sessions[str(entry["session_id"])] = entry
        self._write()

    def remove(self, session_id: str) -> None:
        if self._sessions.pop(session_id, None) is not None:
            self._write()

    def close(self, *, release: bool = False) -> None:
        """At a clean exit every remote session was stopped (nothing for anyone to adopt), or,
        ``release``, kept in its node: the record is handed to the next front."""
        if not self._sessions:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        if release:
            released = self.directory / f"remote-released-{os.getpid()}-{next(_names)}.json"
            self._write(released, released=True)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._sessions.clear()

    def _write(self, path: Path | None = None, *, released: bool = False) -> None:
        path = path if path is not None else self.path
        if not self._sessions:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        data = {"front": self._me, "released": released, "sessions": list(self._sessions.values())}
        temporary = path.with_suffix(".tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            temporary.write_text(json.dumps(data))
            os.replace(temporary, path)
        except OSError as exc:  # best effort, like the crash-safety state file
            log.warning("cannot write %s: %s", path, exc)


def _alive(owner: Any) -> bool:
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    started = owner.get("started")
    return tree.running(owner["pid"], started if isinstance(started, int) else None)
