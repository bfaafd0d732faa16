"""A session's events as the core makes them: numbered, stamped, published.

Every event of a session has its ``seq`` (contiguous from 1), its ``session_id`` and a wall-clock
``timestamp``. Protocol machines make a fresh, unstamped event for each thing that happens and
hand it over: that one is stamped in place (a frozen instance nobody else has seen yet, its slots
set through their descriptors: ``attrs.evolve`` would build a second one per event, and a
stream makes them by the thousand). One already stamped is copied, never changed.
"""

from __future__ import annotations

import operator
import time
from typing import Any

import attrs

from protocols import events as ev
from supervisor.core.states import State

__all__ = ["EventLog"]

#: The stamp's slots set through their descriptors (what ``object.__setattr__`` does on a
#: frozen instance, without looking the name up each time).
_SET_STAMP = tuple(ev.Event.__dict__[name].__set__ for name in ("session_id", "seq", "timestamp"))
_SEQ_OF = operator.attrgetter("seq")


class EventLog:
    def __init__(self, session_id: str, publish: Any, publish_many: Any) -> None:
        self.session_id = session_id
        #: the newest event's seq (0 before the first)
        self.seq = 0
        self._publish = publish
        self._publish_many = publish_many

    def emit(self, event: ev.Event) -> None:
        self.seq = seq = self.seq + 1
        if event.seq:
            event = attrs.evolve(event, session_id=self.session_id, seq=seq, timestamp=time.time())
        else:
            set_session_id, set_seq, set_timestamp = _SET_STAMP
            set_session_id(event, self.session_id)
            set_seq(event, seq)
            set_timestamp(event, time.time())
        self._publish(event)

    @staticmethod
    def fresh(events: list[ev.Event]) -> bool:
        """None of the run is stamped yet, and none is in it twice: it may be stamped in place,
        at once (:meth:`emit_run`)."""
        return not any(map(_SEQ_OF, events)) and len(set(map(id, events))) == len(events)

    def emit_run(self, events: list[ev.Event]) -> None:
        """:meth:`emit` each of a :meth:`fresh` run: one clock read, published at once."""
        session_id = self.session_id
        seq = self.seq
        now = time.time()
        set_session_id, set_seq, set_timestamp = _SET_STAMP
        for event in events:
            seq += 1
            set_session_id(event, session_id)
            set_seq(event, seq)
            set_timestamp(event, now)
        self.seq = seq
        self._publish_many(events)

    def state(self, state: State, detail: str | None) -> None:
        """``session.state``, made stamped (a cancel's cold path makes two)."""
        self.seq = seq = self.seq + 1
        self._publish(
            ev.new_session_state(
                session_id=self.session_id,
                seq=seq,
                timestamp=time.time(),
                state=state,
                detail=detail,
            )
        )

    def turn_ended(
        self,
        turn_id: str,
        outcome: str,
        stop_reason: str | None,
        error: str | None,
        receipt: dict[str, Any] | None,
        reason: str | None,
        changes: list[dict[str, Any]] | None = None,
    ) -> None:
        """``turn.ended``, made stamped (every turn's last event; a cancel's carries its
        receipt)."""
        self.seq = seq = self.seq + 1
        self._publish(
            ev.new_turn_ended(
                session_id=self.session_id,
                seq=seq,
                timestamp=time.time(),
                turn_id=turn_id,
                outcome=outcome,
                stop_reason=stop_reason,
                error=error,
                receipt=receipt,
                reason=reason,
                changes=changes,
            )
        )
