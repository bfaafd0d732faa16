"""What every session offers, whether it runs here (:class:`~supervisor.runtime.session.Session`)
or on another host (:class:`~supervisor.remote.session.RemoteSession`): the one interface the
supervisor, the gateway, the ACP front door and the chat use."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

from protocols.content import Part
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus
from supervisor.core.session import TurnHandle
from supervisor.receipt import CancelReceipt
from supervisor.runtime.fanout import DEFAULT_SUBSCRIBER_BUFFER, Fanout, Subscription
from supervisor.steering import SteerResult

__all__ = ["SessionHandle", "Subscribable"]


class SessionHandle(Protocol):
    #: ``s1``, or ``s1@HOST`` for a session on another host
    id: str
    spec: AgentSpec

    @property
    def host(self) -> str | None:
        """The ``[hosts.NAME]`` it runs on; None: this machine."""

    @property
    def cwd(self) -> str | None: ...

    @property
    def state(self) -> str: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def fanout(self) -> Fanout:
        """Its history and subscribers: what metrics read at a scrape, and whose ``observer``
        is told of the session's own events (``supervisor/observe/``)."""

    @property
    def turn_id(self) -> str | None: ...

    @property
    def held(self) -> str | None:
        """Why no new turn starts (``paused``), else None."""

    @property
    def exit_status(self) -> ExitStatus | None: ...

    @property
    def prompt_carries(self) -> frozenset[str]: ...

    @property
    def modes(self) -> dict[str, Any] | None: ...

    @property
    def agent_session_id(self) -> str | None:
        """The agent's own id of its session (what a resume names), once it has one."""

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether its turns are checkpointed where its files are (``design/checkpoints.md``)."""

    def summary(self) -> Any: ...

    async def prompt(self, text: str, parts: Sequence[Part] = ()) -> TurnHandle: ...

    async def set_mode(self, mode_id: str) -> None: ...

    async def input(self, data: str) -> None: ...

    async def resize(self, cols: int, rows: int) -> None: ...

    async def cancel(
        self, *, turn_id: str | None = None, reason: str | None = None
    ) -> CancelReceipt: ...

    async def steer(self, text: str) -> SteerResult: ...

    async def respond_permission(
        self, request_id: str, option_id: str | None = None, *, cancelled: bool = False
    ) -> None: ...

    def subscribe(
        self,
        *,
        since_seq: int | None = None,
        max_buffer: int = ...,
        stall_s: float | None = None,
        max_buffer_bytes: int | None = None,
    ) -> AbstractAsyncContextManager[Subscription]: ...

    async def open_subscription(
        self,
        *,
        since_seq: int | None = None,
        max_buffer: int = ...,
        stall_s: float | None = None,
        wire: bool = False,
        max_buffer_bytes: int | None = None,
    ) -> Subscription: ...

    async def pause(self, deadline: float = math.inf) -> None: ...

    async def resume(self) -> None: ...

    async def wait_ready(self) -> None: ...

    async def stop(self) -> ExitStatus | None: ...


class Subscribable:
    """:meth:`subscribe` over the handle's own ``open_subscription`` (for callers that manage
    the lifetime: they call ``close()``), the same for every kind of session."""

    @asynccontextmanager
    async def subscribe(
        self: SessionHandle,
        *,
        since_seq: int | None = None,
        max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        stall_s: float | None = None,
        max_buffer_bytes: int | None = None,
    ) -> AsyncIterator[Subscription]:
        """Events from now on (or replayed after ``since_seq``), in order, until you leave.

        A subscriber a full buffer behind (``max_buffer`` events, or ``max_buffer_bytes`` of
        them, the supervisor's ``buffer_bytes`` by default) is cut off (``lagged``); with
        ``stall_s`` it holds the agent back instead (its output is not read meanwhile) and is
        cut off only once it has taken nothing for ``stall_s`` (see
        ``supervisor/runtime/fanout.py``)."""
        subscription = await self.open_subscription(
            since_seq=since_seq,
            max_buffer=max_buffer,
            stall_s=stall_s,
            max_buffer_bytes=max_buffer_bytes,
        )
        try:
            yield subscription
        finally:
            subscription.close()
