"""Pause all, resume all: a supervisor's pause, brought to every session (``Supervisor.pause``).

While a supervisor is paused no new turn starts in any of its sessions: each session holds its
prompts (``supervisor/core/pause.py``), and a session started meanwhile starts held. Turns
already running go on; with a deadline, those still running then are cancelled through the
ladder, ``reason: "paused"``. The resume releases every session: what each held starts in
order. Sessions that run in a node are held by their node's session, told over the link
(``session.pause``); a link that is down is told first thing once it is back, before any other
call uses it (``supervisor/remote/session.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import trio
from attrs import frozen

from supervisor.core.pause import PAUSED, Pause
from supervisor.errors import BadRequest, SupervisorError
from supervisor.runtime.handle import SessionHandle

__all__ = ["PauseStatus", "Pausing", "check_deadline_s"]

#: States in which a session holds no agent process: nothing to pause.
_ENDED = ("stopped", "failed")


@frozen(kw_only=True)
class PauseStatus:
    """Where a supervisor's pause stands: what ``pause``, ``resume`` and ``pause_status``
    answer (``gateway.pause``, ``gateway.resume`` on the wire)."""

    paused: bool
    #: seconds until the turns still running are cancelled; None: they finish by themselves
    deadline_s: float | None = None
    #: the sessions that hold new turns
    held: tuple[str, ...] = ()
    #: the sessions with a turn running (paused: those the deadline stops if they run on)
    running: tuple[str, ...] = ()
    #: sessions on another host whose node has not taken the pause (or the resume) yet: the
    #: link is down, and tells it first thing once it is back
    pending: tuple[str, ...] = ()


def check_deadline_s(deadline_s: float | None) -> None:
    """A pause's deadline is a number of seconds from now, at least 0 (None: no deadline)."""
    if deadline_s is not None and (
        isinstance(deadline_s, bool) or not math.isfinite(deadline_s) or deadline_s < 0
    ):
        raise BadRequest(f"deadline_s must be a number of seconds >= 0, not {deadline_s!r}")


class Pausing:
    """The pause a supervisor holds, and how it reaches its sessions."""

    def __init__(self) -> None:
        self.pause = Pause()
        #: one more at every pause and resume: a session placed meanwhile is brought up to date
        self.changes = 0

    @property
    def held(self) -> bool:
        return self.pause.held

    def hold(self, deadline_s: float | None) -> None:
        """Paused from now on; a deadline brings an earlier one forward, never back."""
        check_deadline_s(deadline_s)
        deadline = math.inf if deadline_s is None else trio.current_time() + deadline_s
        self.pause.hold(deadline)
        self.changes += 1

    def release(self) -> None:
        self.pause.release()
        self.changes += 1

    def for_new_session(self) -> Pause | None:
        """What a session started now holds (its own copy), or None: not paused."""
        if not self.pause.held:
            return None
        return Pause(held=True, deadline=self.pause.deadline)

    async def bring(self, sessions: Iterable[SessionHandle]) -> None:
        """Every live session of ``sessions`` to the supervisor's pause, concurrently."""
        async with trio.open_nursery() as nursery:
            for session in list(sessions):
                if session.state not in _ENDED:
                    nursery.start_soon(self.bring_one, session)

    async def bring_one(self, session: SessionHandle) -> None:
        """``session`` held as the supervisor is (with its deadline), or released."""
        try:
            if self.pause.held:
                await session.pause(self.pause.deadline)
            else:
                await session.resume()
        except SupervisorError:
            pass  # it ended meanwhile: nothing of it to hold

    def status(self, sessions: Iterable[SessionHandle]) -> PauseStatus:
        live = [s for s in sessions if s.state not in _ENDED]
        want = PAUSED if self.pause.held else None
        deadline_s = None
        if self.pause.held and self.pause.deadline != math.inf:
            deadline_s = round(max(0.0, self.pause.deadline - trio.current_time()), 3)
        return PauseStatus(
            paused=self.pause.held,
            deadline_s=deadline_s,
            held=tuple(s.id for s in live if s.held is not None),
            running=tuple(s.id for s in live if s.turn_id is not None),
            pending=tuple(s.id for s in live if s.held != want),
        )
