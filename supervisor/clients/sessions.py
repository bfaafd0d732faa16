"""``agent-supervisor sessions``: the stored sessions (``design/store.md``), read from the store
itself, without a gateway.

- ``list``: every stored session, the newest first: id, agent, created, last active, its
  first prompt;
- ``show ID``: one session's turns (prompt, steers, answer) and receipts, for a person;
- ``export ID``: its events as JSONL, each the wire JSON the store keeps, byte for byte.

The store is opened as ``serve`` opens it (``--store``, default the state directory's
``sessions.db``), as one more process sharing it (an owner of kind ``sessions``, which owns no
session): it reads beside a running ``serve`` or ACP front door, and ``show`` says which live
process runs a session, or that the process a session was left running by is gone. A store
that does not exist is said to be missing, not created. Anything that keeps a command from its
answer is one line on stderr: exit 1 (2: the store cannot be opened).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, BinaryIO, Final, TextIO

from supervisor.store.backend import Backend, ReceiptRow, StoredSession, StoreError, TextRow
from supervisor.store.url import backend_for

__all__ = ["SessionsError", "run_sessions"]

#: How much of a session's first prompt ``list`` shows: one line of a terminal.
FIRST_PROMPT_CHARS: Final = 60
#: What this command is as an owner of the store (``Owner.kind``): not exclusive, so it opens
#: a store a running ``serve`` holds.
READER_KIND: Final = "sessions"
#: Events read from the store at a time by ``export``: a few MB at most, whatever the session.
EXPORT_PAGE: Final = 10_000


class SessionsError(Exception):
    """One line on stderr; ``code``: the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def run_sessions(
    command: str, url: str, session_id: str | None, out: TextIO, raw: BinaryIO
) -> None:
    """Run ``command`` (``list``, ``show``, ``export``) on the store at ``url``: text to
    ``out``, ``export``'s bytes to ``raw``. Raises :class:`SessionsError`."""
    backend = _open(url)
    try:
        if command == "list":
            _list(backend, out)
        else:
            assert session_id is not None
            stored = _session(backend, session_id)
            if command == "show":
                _show(backend, stored, out)
            else:
                _export(backend, stored, raw)
    except StoreError as exc:
        raise SessionsError(str(exc)) from None
    finally:
        backend.close()


def _open(url: str) -> Backend:
    try:
        backend = backend_for(url, kind=READER_KIND)
    except StoreError as exc:
        raise SessionsError(str(exc), 2) from None
    if backend is None:
        raise SessionsError("no store: --store none keeps no sessions", 2)
    if url.strip().startswith("sqlite:///"):
        path = Path(url.strip()[len("sqlite:///") :]).expanduser()
        if not path.is_file():
            raise SessionsError(f"no store at {path} (give --store, as serve was given)", 2)
    try:
        backend.open()
    except StoreError as exc:
        raise SessionsError(str(exc), 2) from None
    return backend


def _session(backend: Backend, session_id: str) -> StoredSession:
    for stored in backend.sessions():
        if stored.id == session_id:
            return stored
    raise SessionsError(f"no session {session_id!r} in the store {backend.where}")


def _list(backend: Backend, out: TextIO) -> None:
    sessions = sorted(backend.sessions(), key=lambda s: (s.created, _number(s.id)), reverse=True)
    if not sessions:
        out.write("no stored sessions\n")
        return
    prompts = backend.first_prompts(FIRST_PROMPT_CHARS + 1)
    rows = [
        (s.id, s.agent, _when(s.created), _when(s.last_active), _line(prompts.get(s.id, "")))
        for s in sessions
    ]
    header = ("ID", "AGENT", "CREATED", "LAST ACTIVE", "FIRST PROMPT")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[4]]).rstrip() + "\n")


def _show(backend: Backend, stored: StoredSession, out: TextIO) -> None:
    where = f" on {stored.host}" if stored.host else ""
    out.write(f"session {stored.id}: {stored.agent} ({stored.protocol}){where}, in {stored.cwd}\n")
    out.write(
        f"created {_when(stored.created)}, last active {_when(stored.last_active)}, "
        f"{_state(backend, stored)}, {stored.last_seq} events\n"
    )
    turns: dict[str, list[TextRow | ReceiptRow]] = {}
    every: list[TextRow | ReceiptRow] = [*backend.texts(stored.id), *backend.receipts(stored.id)]
    for row in every:
        turns.setdefault(row.turn_id, []).append(row)
    for turn_id, rows in sorted(turns.items(), key=lambda item: min(r.seq for r in item[1])):
        out.write(f"\n-- turn {turn_id}\n")
        # A turn's text and its receipt at one seq (its end): the answer first, then how it
        # ended.
        for row in sorted(rows, key=lambda r: (r.seq, isinstance(r, ReceiptRow))):
            if isinstance(row, ReceiptRow):
                out.write(_receipt(row) + "\n")
            else:
                out.write(f"{row.kind} (seq {row.seq}):\n{_indented(row.text)}\n")
    if not turns:
        out.write("\nno turns stored\n")


def _state(backend: Backend, stored: StoredSession) -> str:
    """The stored state, and whose the session is: the live process that runs it, or the one
    that left it so and is gone (the next supervisor to open the store ends its turn)."""
    owner = backend.owners().get(stored.owner) if stored.owner else None
    if owner is None:
        return stored.state
    process, alive = owner
    if alive:
        return f"{stored.state} in {process.describe()}"
    return f"{stored.state} when {process.describe()} went away"


def _receipt(row: ReceiptRow) -> str:
    try:
        receipt: dict[str, Any] = json.loads(row.payload)
    except ValueError:
        return f"receipt (seq {row.seq}): not readable"
    parts = [f"receipt (seq {row.seq}): {receipt.get('outcome')}"]
    if receipt.get("stop_reason"):
        parts.append(f"stop_reason {receipt['stop_reason']}")
    if receipt.get("reason"):
        parts.append(f"reason {receipt['reason']}")
    if isinstance(receipt.get("elapsed_ms"), int | float):
        parts.append(f"{receipt['elapsed_ms']:.1f} ms")
    if receipt.get("escalation"):
        parts.append("escalation " + " > ".join(map(str, receipt["escalation"])))
    return ", ".join(parts)


def _export(backend: Backend, stored: StoredSession, raw: BinaryIO) -> None:
    after = 0
    while True:
        page = backend.events(stored.id, after, EXPORT_PAGE)
        for _seq, payload in page:
            raw.write(payload + b"\n")
        if len(page) < EXPORT_PAGE:
            break
        after = page[-1][0]
    raw.flush()


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _line(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= FIRST_PROMPT_CHARS else one[: FIRST_PROMPT_CHARS - 3] + "..."


def _indented(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines() or [""])


def _number(session_id: str) -> int:
    """``s12``'s 12, so that ``s10`` comes after ``s9`` among sessions created at once."""
    digits = session_id[1:]
    return int(digits) if digits.isdigit() else 0
