"""How long the store keeps stopped sessions (``[store] keep_days``, ``keep_sessions``,
``keep_bytes``), and which ones a sweep deletes.

Nothing is deleted unless asked: the store is the user's history, and what is worth keeping
is theirs to say (a store grows ~1 MB per 10,000 stream events; a disk that fills is said at
run time and the sessions go on, held back: ``design/store.md``). A sweep deletes whole
sessions (the row, its events, receipts, prompts and answers, their search index), the least
recently active first, never one that runs or is being started again. It runs at start and
every :data:`SWEEP_EVERY_S` (``Supervisor.sweep_store``), on the store's worker thread.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from attrs import frozen

from supervisor.store.backend import StoredSession

__all__ = ["SWEEP_EVERY_S", "Retention", "expired", "parse_bytes"]

#: A sweep every hour: retention is a matter of days and sizes, and a sweep reads every
#: session's row (and, with ``keep_bytes``, the sizes of its rows) on the writer's thread.
SWEEP_EVERY_S = 3600.0
_DAY_S = 86_400.0
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


@frozen(kw_only=True)
class Retention:
    """What a sweep keeps (None: no bound of that kind). A session goes when any bound says
    so: it was last active more than ``keep_days`` ago; more than ``keep_sessions`` sessions
    are stored (the least recently active go); the stored sessions take more than
    ``keep_bytes`` (their events, receipts and texts as stored: the database's indexes and
    free pages come on top)."""

    keep_days: float | None = None
    keep_sessions: int | None = None
    keep_bytes: int | None = None

    def __bool__(self) -> bool:
        return (
            self.keep_days is not None
            or self.keep_sessions is not None
            or self.keep_bytes is not None
        )


def expired(
    sessions: Sequence[StoredSession],
    sizes: Mapping[str, int],
    keep: Retention,
    now: float,
    protected: Collection[str],
) -> list[str]:
    """The ids of the sessions ``keep`` lets go, of ``sessions`` (the most recently active
    first, as :meth:`Backend.sessions` gives them), each of ``sizes`` bytes; ``protected``
    (running, being started again) are never among them, though they count towards
    ``keep_sessions`` and ``keep_bytes``."""
    gone: set[str] = set()
    oldest_first = [s for s in reversed(sessions) if s.id not in protected]
    if keep.keep_days is not None:
        cutoff = now - keep.keep_days * _DAY_S
        gone.update(s.id for s in oldest_first if s.last_active < cutoff)
    if keep.keep_sessions is not None:
        excess = len(sessions) - len(gone) - keep.keep_sessions
        for s in oldest_first:
            if excess <= 0:
                break
            if s.id not in gone:
                gone.add(s.id)
                excess -= 1
    if keep.keep_bytes is not None:
        total = sum(sizes.get(s.id, 0) for s in sessions if s.id not in gone)
        for s in oldest_first:
            if total <= keep.keep_bytes:
                break
            if s.id not in gone:
                gone.add(s.id)
                total -= sizes.get(s.id, 0)
    return [s.id for s in oldest_first if s.id in gone]


def parse_bytes(value: object) -> int | None:
    """``keep_bytes``: a whole number of bytes, or a size with its unit (``"500 MB"``,
    ``"2GiB"``); None if it is neither, or not above zero."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if not isinstance(value, str):
        return None
    match = _SIZE.fullmatch(value)
    if match is None or match.group(2).lower() not in _UNITS:
        return None
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    return size if size > 0 else None
