"""A session's per-turn checkpoints, as the core keeps track of them.

The files are the shell's (``supervisor/checkpoints/``); the core decides when: a turn starts
only once its working directory is snapshotted (it waits at the queue's front meanwhile, so a
cancel drops it at once, never waiting for the snapshot); a turn's ``turn.ended`` and its
receipt are held until the snapshot at its end says what it changed (the session is ready
meanwhile, and no next turn starts before); a rewind runs only while no turn does. One of
these at a time: :attr:`Checkpoints.under_way`.
"""

from __future__ import annotations

from typing import Any, Final

from attrs import define

from supervisor.core.ladder import CancelJob
from supervisor.core.waiter import Waiter
from supervisor.receipt import CancelReceipt

__all__ = ["CHECKPOINTS_KEPT", "Checkpoints", "HeldEnd"]

#: Checkpoints a session can rewind to (the newest; a rewind's own counts as one). Each is a
#: few ids in memory; the store keeps their files, deduplicated, whatever the number.
CHECKPOINTS_KEPT: Final = 256


@define
class HeldEnd:
    """A turn that has ended, its ``turn.ended`` and receipt waiting for its changes."""

    turn_id: str
    outcome: str
    stop_reason: str | None
    error: str | None
    reason: str | None
    #: the cancel's receipt and its job (None: nobody cancelled the turn)
    receipt: CancelReceipt | None
    job: CancelJob | None


class Checkpoints:
    """What the core knows of the session's checkpoints (see the module docstring)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        #: what the shell is doing for the session: ``start`` (of :attr:`starting`), ``end``
        #: (of :attr:`held`'s turn), ``rewind``; None: nothing
        self.under_way: str | None = None
        #: the turn whose start snapshot is under way or taken, until that turn starts
        self.starting: str | None = None
        #: the snapshot of :attr:`starting` is taken (or failed: the turn starts without one)
        self.taken = False
        self.held: HeldEnd | None = None
        #: a rewind's caller, until it is done
        self.rewinding: Waiter[dict[str, Any]] | None = None
        #: ids a rewind may name, oldest first: turns' starts and rewinds' own states
        self._kept: dict[str, None] = {}
        self._rewinds = 0

    def keep(self, checkpoint_id: str) -> None:
        self._kept[checkpoint_id] = None
        while len(self._kept) > CHECKPOINTS_KEPT:
            del self._kept[next(iter(self._kept))]

    def has(self, checkpoint_id: str) -> bool:
        return checkpoint_id in self._kept

    def forgotten(self, kept: set[str]) -> list[str]:
        """Of ``kept`` (the shell's), the ids no longer kept here: the shell forgets them."""
        return [checkpoint_id for checkpoint_id in kept if checkpoint_id not in self._kept]

    def next_rewind_id(self) -> str:
        """``r1``, ``r2``, ...: the state before each rewind, itself a checkpoint."""
        self._rewinds += 1
        return f"r{self._rewinds}"
