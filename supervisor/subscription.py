"""A subscriber's view of one session's events."""

from __future__ import annotations

import trio

from protocols import events as ev

__all__ = ["Subscription"]


class Subscription:
    """Events of one session, in order, from one subscribe call.

    If the subscriber falls more than its buffer behind, the session cuts it off: iteration
    ends and :attr:`lagged` is true; subscribe again with ``since_seq=last_seq`` to catch up.
    :attr:`gap` is true when history no longer reached back to the ``since_seq`` asked for.
    """

    def __init__(
        self,
        receive: trio.MemoryReceiveChannel[ev.Event],
        *,
        last_seq: int,
        head_seq: int,
        gap: bool,
    ):
        self._receive = receive
        self.last_seq = last_seq
        #: the session's newest seq when this subscription began
        self.head_seq = head_seq
        self.gap = gap
        self.lagged = False

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> ev.Event:
        try:
            event = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        self.last_seq = event.seq
        return event

    async def receive(self) -> ev.Event:
        """The next event; raises ``trio.EndOfChannel`` when the session is done or cut us off."""
        event = await self._receive.receive()
        self.last_seq = event.seq
        return event

    def close(self) -> None:
        self._receive.close()
