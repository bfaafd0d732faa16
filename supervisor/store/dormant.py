"""A stored session whose agent is not running: what an earlier supervisor left in the store.

It is listed (``stopped``), and a subscribe replays its whole history from the store with the
seqs clients saw then, and ends (as for any stopped session). A prompt or a steer starts its
agent again (its supervisor's ``revive``: the agent resumes its own session, the session keeps
its id, and its seqs and turn ids go on); a cancel or a permission answer finds no agent
(:class:`~supervisor.errors.AgentNotRunning`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any

from protocols.content import Part
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus
from supervisor.core.session import TurnHandle
from supervisor.core.states import State
from supervisor.errors import AgentNotRunning
from supervisor.receipt import CancelReceipt
from supervisor.runtime.fanout import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_SUBSCRIBER_BUFFER,
    Fanout,
    Subscription,
)
from supervisor.runtime.handle import SessionHandle, Subscribable
from supervisor.runtime.session import SessionSummary
from supervisor.steering import SteerResult
from supervisor.store.backend import Owner, StoredSession
from supervisor.store.writer import SessionStore
from supervisor.wire.codec import event_from_json
from supervisor.wire.frames import text_frames
from supervisor.worktrees import Worktree, WorktreeError

__all__ = ["DormantSession"]

#: Events read from the store at once for a replay.
_READ_EVENTS = 10_000


class DormantSession(Subscribable):
    """A stored session (``stored``) whose agent runs nowhere; ``spec`` is its agent's."""

    def __init__(
        self,
        stored: StoredSession,
        spec: AgentSpec,
        store: SessionStore,
        revive: Callable[[DormantSession], Awaitable[SessionHandle]] | None = None,
    ) -> None:
        self.id = stored.id
        self.spec = spec
        self.stored = stored
        self._store = store
        #: starts its agent again, as a live session of the same id (None: it cannot be)
        self._revive = revive
        self._fanout = Fanout(1)
        self._fanout.close()
        #: the other live process of the store that runs it (None: none, as last read): a
        #: prompt here is refused, naming it
        self.elsewhere: Owner | None = None

    @property
    def host(self) -> str | None:
        return self.stored.host

    @property
    def cwd(self) -> str | None:
        return self.stored.cwd

    @property
    def state(self) -> str:
        return State.STOPPED

    @property
    def last_seq(self) -> int:
        return self.stored.last_seq

    @property
    def fanout(self) -> Fanout:
        return self._fanout

    @property
    def turn_id(self) -> str | None:
        return None

    @property
    def held(self) -> str | None:
        return None

    @property
    def exit_status(self) -> ExitStatus | None:
        return None

    @property
    def agent_session_id(self) -> str | None:
        return self.stored.agent_session_id

    @property
    def prompt_carries(self) -> frozenset[str]:
        return frozenset()

    @property
    def modes(self) -> dict[str, Any] | None:
        return None

    @property
    def keeps_checkpoints(self) -> bool:
        return False  # (none taken while its agent runs nowhere: revived, it may)

    def summary(self) -> SessionSummary:
        worktree = None
        if self.stored.worktree is not None:
            with suppress(WorktreeError):  # a record it cannot read: shown without
                worktree = Worktree.from_json(self.stored.worktree)
        return SessionSummary(
            self.id,
            self.spec.name,
            State.STOPPED,
            None,
            host=self.host,
            cwd=self.cwd,
            created=self.stored.created,
            last_active=self.stored.last_active,
            first_prompt=self.stored.first_prompt,
            worktree=worktree.path if worktree is not None else None,
            branch=worktree.branch if worktree is not None else None,
            elsewhere=self.elsewhere.describe() if self.elsewhere is not None else None,
        )

    def _not_running(self) -> AgentNotRunning:
        if self.elsewhere is not None:
            return AgentNotRunning(
                f"session {self.id} runs in another process on this store"
                f" ({self.elsewhere.describe()}): use it there"
            )
        return AgentNotRunning(
            f"session {self.id}'s agent is not running (the session was stored by an earlier"
            " supervisor)"
        )

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> TurnHandle:
        if self._revive is None:
            raise self._not_running()
        live = await self._revive(self)
        return await live.prompt(text, parts)

    async def set_mode(self, mode_id: str) -> None:
        raise self._not_running()

    async def input(self, data: str) -> None:
        raise self._not_running()

    async def resize(self, cols: int, rows: int) -> None:
        raise self._not_running()

    async def cancel(
        self, *, turn_id: str | None = None, reason: str | None = None
    ) -> CancelReceipt:
        raise self._not_running()

    async def revive(self) -> SessionHandle:
        """Its agent started again, as a live session of the same id (with the checkpoints it
        kept: a rewind or a diff of its turns works on it)."""
        if self._revive is None:
            raise self._not_running()
        return await self._revive(self)

    async def steer(self, text: str) -> SteerResult:
        if self._revive is None:
            raise self._not_running()
        live = await self._revive(self)
        return await live.steer(text)

    async def respond_permission(
        self, request_id: str, option_id: str | None = None, *, cancelled: bool = False
    ) -> None:
        raise self._not_running()

    async def open_subscription(
        self,
        *,
        since_seq: int | None = None,
        max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        stall_s: float | None = None,
        wire: bool = False,
        max_buffer_bytes: int | None = None,
    ) -> Subscription:
        """Its history after ``since_seq`` (None: nothing, as for a live session's "from
        now on"), read from the store, then the end."""
        head = self.stored.last_seq
        payloads: list[bytes] = []
        if since_seq is not None:
            after = since_seq
            while after < head:
                rows = await self._store.events(self.id, after, _READ_EVENTS)
                if not rows:
                    break
                payloads.extend(payload for _, payload in rows)
                after = rows[-1][0]
        replay: list[Any] = (
            text_frames(payloads) if wire else [event_from_json(p) for p in payloads]
        )
        subscription = Subscription(
            replay,
            last_seq=head - len(payloads) if since_seq is not None else head,
            head_seq=head,
            gap=False,
            max_buffer=max_buffer,
            stall_s=stall_s,
            wire=wire,
            sizes=[len(p) for p in payloads],
            max_bytes=DEFAULT_BUFFER_BYTES if max_buffer_bytes is None else max_buffer_bytes,
        )
        subscription._end()
        return subscription

    async def pause(self, deadline: float = math.inf) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def wait_ready(self) -> None:
        raise self._not_running()

    async def stop(self) -> ExitStatus | None:
        return None
