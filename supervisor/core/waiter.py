"""How the core answers a caller: an opaque slot it resolves or fails, once.

The core never waits for anyone; it holds the slot of each call it has not answered yet (a
cancel's receipt, a ``wait_ready``, a mode the agent has not taken) and fills it when the answer
is known. The runtime's :class:`~supervisor.runtime.reply.Reply` is one; a test of the core can
pass anything with these two methods. Filling a slot twice does nothing the second time.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

__all__ = ["Waiter"]

T_contra = TypeVar("T_contra", contravariant=True)


class Waiter(Protocol[T_contra]):
    def resolve(self, value: T_contra) -> None: ...

    def fail(self, error: BaseException) -> None: ...
