"""A one-shot answer slot: how the session actor answers a mailbox call exactly once."""

from __future__ import annotations

from typing import Generic, TypeVar

import outcome
import trio

__all__ = ["Reply"]

T = TypeVar("T")


class Reply(Generic[T]):
    """A one-shot answer slot: the actor fills it once, the caller awaits it."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[outcome.Outcome[T]](1)
        self.done = False

    def resolve(self, value: T) -> None:
        self._put(outcome.Value(value))

    def fail(self, error: BaseException) -> None:
        self._put(outcome.Error(error))

    def _put(self, result: outcome.Outcome[T]) -> None:
        if self.done:
            return
        self.done = True
        try:
            self._send.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller went away; the work was done anyway

    async def wait(self) -> T:
        result = await self._receive.receive()
        return result.unwrap()
