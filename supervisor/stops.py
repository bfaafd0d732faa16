"""The supervisor's recent stops: the receipts of the last turns it stopped, in every session.

Every stop of a running turn ends in a receipt (``supervisor/receipt.py``): a caller's cancel,
the stall watchdog's, a memory limit's, a steer that had to interrupt, a shutdown's, here or in
a node on another host. The supervisor keeps the last :data:`RECENT_STOPS` of them for a picture
of how stops go (the web UI's chart, ``receipts.list``, ``GET /v1/receipts``). A stop costs one
append in the step that answers the cancel: a plain receipt is kept as it came, and the compact
:class:`Stop` record and its summary are made when asked for; one that carries more (the previews
of the prompts it dropped, the adapter's details, survivors) is made a record at once, so the
ring holds at most a few hundred bytes a stop. Nothing is added per event.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Final, NamedTuple

from supervisor.receipt import CancelReceipt

__all__ = ["RECENT_STOPS", "RecentStops", "Stop"]

#: Stops kept. A chart a few hundred pixels wide shows about this many marks apart, and it is
#: hours of a busy gateway's stops (a person presses Stop a few times an hour; watchdogs rarely
#: fire). A record is a few hundred bytes: the ring stays under ~100 KB whatever happens.
RECENT_STOPS: Final = 200
#: The most escalation steps a record keeps: a receipt names each step at most once (nine
#: words), and a node of another version is cut there too.
_MOST_STEPS: Final = 16


class Stop(NamedTuple):
    """One stop: its receipt's fields a picture of stops needs (not what it dropped, nor the
    adapter's details), what it was a stop of, and the receipt's one-line summary."""

    #: numbered from 1 over the supervisor's life: ``since_seq`` asks for the newer ones
    seq: int
    #: when the turn ended (wall clock, seconds since the epoch)
    time: float
    session_id: str
    turn_id: str | None
    #: the ``[hosts.NAME]`` the session runs on; None: this machine
    host: str | None
    agent: str
    protocol: str
    outcome: str
    #: the stop's own latency: from the cancel to the turn's end
    elapsed_ms: float
    escalation: tuple[str, ...]
    reason: str | None
    stop_reason: str | None
    #: :meth:`CancelReceipt.summary`: "Killed after 3.0 s grace, session resumed"
    summary: str

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "time": self.time,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "agent": self.agent,
            "protocol": self.protocol,
            "outcome": self.outcome,
            "elapsed_ms": self.elapsed_ms,
            "escalation": list(self.escalation),
            "reason": self.reason,
            "stop_reason": self.stop_reason,
            "summary": self.summary,
        }
        if self.host is not None:
            out["host"] = self.host  # absent: this machine, as in a receipt
        return out


class RecentStops:
    """The last ``kept`` stops, oldest first."""

    def __init__(self, kept: int = RECENT_STOPS) -> None:
        self.kept = kept
        #: a :class:`Stop`, or ``(seq, time, agent, protocol, receipt)`` to make one of
        self._stops: deque[Stop | _Kept] = deque(maxlen=kept)
        self._seq = itertools.count(1)

    @property
    def last_seq(self) -> int:
        """The newest stop's ``seq`` (0 before the first)."""
        return self._stops[-1][0] if self._stops else 0

    def add(self, agent: str, protocol: str, receipt: CancelReceipt, time: float) -> None:
        """Record ``receipt``, the stop of a turn of an ``agent`` session, ended at ``time``."""
        kept = (next(self._seq), time, agent, protocol, receipt)
        plain = not (receipt.dropped_prompts or receipt.details or receipt.survivors)
        self._stops.append(kept if plain else _record(*kept))

    def recent(self, limit: int | None = None, since_seq: int | None = None) -> list[Stop]:
        """The newest ``limit`` stops (all kept: None) after ``since_seq``, oldest first."""
        kept = [s for s in self._stops if since_seq is None or s[0] > since_seq]
        if limit is not None:
            kept = kept[len(kept) - min(limit, len(kept)) :]
        return [s if isinstance(s, Stop) else _record(*s) for s in kept]


#: A plain stop as :meth:`RecentStops.add` keeps it.
_Kept = tuple[int, float, str, str, CancelReceipt]


def _record(seq: int, time: float, agent: str, protocol: str, receipt: CancelReceipt) -> Stop:
    return Stop(
        seq,
        time,
        receipt.session_id,
        receipt.turn_id,
        receipt.host,
        agent,
        protocol,
        receipt.outcome,
        receipt.elapsed_ms,
        tuple(receipt.escalation[:_MOST_STEPS]),
        receipt.reason,
        receipt.stop_reason,
        receipt.summary(),
    )
