"""Python bytecodes executed: a count of the work a stretch of code does, which machine load
does not move (a run on a busy hour counts the same as on a quiet one, give or take the order
trio picks for tasks woken together).

``sys.settrace`` with opcode events, for the thread trio runs in: every frame that runs or is
resumed inside the window counts, whichever task it belongs to. What it leaves out: work done
in C (msgspec, the kernel's pipe and epoll calls, attrs' slots) counts as the one bytecode that
called it, and the count says nothing about cache misses. Tracing makes the code ~50x slower:
count in rounds of their own, never in timed ones.
"""

from __future__ import annotations

import sys
from types import FrameType, TracebackType
from typing import Any


class OpCount:
    """``with counter: ...`` adds the bytecodes run inside to ``counter.ops``."""

    def __init__(self) -> None:
        self.ops = 0

    def __enter__(self) -> OpCount:
        sys.settrace(self._call)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sys.settrace(None)

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return self._step

    def _step(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.ops += 1
        return self._step
