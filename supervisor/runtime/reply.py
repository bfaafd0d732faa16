"""A one-shot answer slot: how the session actor answers a mailbox call exactly once.

Built on ``trio.lowlevel`` parking rather than a one-slot memory channel: every mailbox call
(each prompt, cancel and subscribe) makes one, and a channel is six container objects (its
state, a deque, two ordered dicts, two ends) that, with thousands of sessions answered in one
burst, live long enough to be promoted and then walked by full cyclic-GC collections. A
``Reply`` is one small object with no references back to its caller.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import outcome
import trio

__all__ = ["Reply"]

T = TypeVar("T")


class Reply(Generic[T]):
    """A one-shot answer slot: the actor fills it once, the caller awaits it (once)."""

    __slots__ = ("_result", "_task", "done")

    def __init__(self) -> None:
        self._result: outcome.Outcome[T] | None = None
        self._task: trio.lowlevel.Task | None = None  # the caller, while it waits
        self.done = False

    def resolve(self, value: T) -> None:
        if self.done:
            return
        self.done = True  # (what _put does, not called: every cancel's receipt comes this way)
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task, outcome.Value(value))
        else:
            self._result = outcome.Value(value)

    def fail(self, error: BaseException) -> None:
        self._put(outcome.Error(error))

    def _put(self, result: outcome.Outcome[T]) -> None:
        if self.done:
            return
        self.done = True
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task, result)
        else:
            self._result = result  # not waiting yet, or the caller went away: work done anyway

    async def wait(self) -> T:
        """The answer (or the actor's error, raised here). A checkpoint, like any trio wait."""
        if self.done:
            await trio.lowlevel.checkpoint()
            result, self._result = self._result, None
            assert result is not None
            return result.unwrap()
        self._task = trio.lowlevel.current_task()
        value: T = await trio.lowlevel.wait_task_rescheduled(self._abort)
        return value

    def _abort(self, _: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        self._task = None  # cancelled while waiting: a later answer is dropped
        return trio.lowlevel.Abort.SUCCEEDED
