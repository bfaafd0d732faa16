"""A session's per-turn checkpoints, as the core keeps track of them.

The files are the shell's (``supervisor/checkpoints/``); the core decides when: as the session
starts, a first snapshot kept by no turn (:attr:`Checkpoints.baseline`), so that the first
turn's own is an incremental one; a turn starts only once its working directory is
snapshotted (it waits at the queue's front meanwhile, so a cancel drops it at once, never
waiting for the snapshot); a turn's ``turn.ended`` and its receipt are held until the snapshot
at its end says what it changed (the session is ready meanwhile, and no next turn starts
before); a rewind runs only while no turn does. One of these at a time:
:attr:`Checkpoints.under_way`; a turn's start snapshot waits for the first one too, a rewind
does not (the shell's store takes its calls in turn).
"""

from __future__ import annotations

from typing import Any, Final

from attrs import define

from supervisor.core.ladder import CancelJob
from supervisor.core.waiter import Waiter
from supervisor.receipt import CancelReceipt

__all__ = ["CHECKPOINTS_KEPT", "REWIND_NOTICE_PATHS", "Checkpoints", "HeldEnd", "rewind_notice"]

#: Checkpoints a session can rewind to (the newest; a rewind's own counts as one). Each is a
#: few ids in memory; the store keeps their files, deduplicated, whatever the number.
CHECKPOINTS_KEPT: Final = 256
#: Paths a rewind notice names (then "and N more"): it is one line in front of a prompt, and
#: a rewind of a generated tree can restore thousands.
REWIND_NOTICE_PATHS: Final = 10
#: Characters of one path in a rewind notice (longer ones are cut, ``...`` after).
_NOTICE_PATH_CHARS: Final = 200


def rewind_notice(checkpoint_id: str, paths: list[str]) -> str:
    """The line an agent gets in front of its next prompt after a rewind: its picture of the
    files is the one the rewind undid."""
    before = f"the rewind {checkpoint_id}" if checkpoint_id.startswith("r") else checkpoint_id
    shown = [p if len(p) <= _NOTICE_PATH_CHARS else p[:_NOTICE_PATH_CHARS] + "..." for p in paths]
    named = ", ".join(shown[:REWIND_NOTICE_PATHS])
    if len(paths) > REWIND_NOTICE_PATHS:
        named += f" and {len(paths) - REWIND_NOTICE_PATHS} more"
    return (
        f"[The user rewound the files to how they were before {before}: {named} were restored;"
        " your changes to them since are undone. Read them again before relying on them.]\n\n"
    )


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
        #: the session's first snapshot is under way: a turn's start snapshot is asked for
        #: once it is taken (the store's index then holds every file: only what changed since
        #: is hashed, where a first snapshot of 100,000 files takes tens of seconds)
        self.baseline = False
        #: when the turn waiting for the first snapshot starts without a checkpoint
        #: (``spec.first_snapshot_wait_s`` after it began to wait); None: no turn waits
        self.baseline_until: float | None = None
        #: the first snapshot outlasted that wait: the turns until it is done start at once,
        #: without a checkpoint
        self.baseline_overdue = False
        #: a rewind's caller, until it is done
        self.rewinding: Waiter[dict[str, Any]] | None = None
        #: ids a rewind may name, oldest first: turns' starts and rewinds' own states
        self._kept: dict[str, None] = {}
        self._rewinds = 0
        #: what the agent is told with its next prompt after a rewind (``tell_rewind``): the
        #: newest rewind's id and every path the rewinds since its last prompt restored
        self.told: tuple[str, list[str]] | None = None

    def rewound(self, checkpoint_id: str, restored: list[str]) -> None:
        """A rewind restored ``restored``: the agent is told at its next prompt."""
        if not restored:
            return
        earlier = self.told[1] if self.told is not None else []
        self.told = (checkpoint_id, list(dict.fromkeys([*earlier, *restored])))

    def take_notice(self) -> str:
        """The rewind notice due (``""``: none), once."""
        told, self.told = self.told, None
        return rewind_notice(*told) if told is not None else ""

    def keep(self, checkpoint_id: str) -> None:
        self._kept[checkpoint_id] = None
        while len(self._kept) > CHECKPOINTS_KEPT:
            del self._kept[next(iter(self._kept))]

    def seed(self, checkpoint_ids: list[str]) -> None:
        """Checkpoints an earlier process kept (oldest first), back for a rewind; the rewinds'
        own ids go on after theirs."""
        for checkpoint_id in checkpoint_ids:
            self.keep(checkpoint_id)
            if checkpoint_id[:1] == "r" and checkpoint_id[1:].isdigit():
                self._rewinds = max(self._rewinds, int(checkpoint_id[1:]))

    def has(self, checkpoint_id: str) -> bool:
        return checkpoint_id in self._kept

    def forgotten(self, kept: set[str]) -> list[str]:
        """Of ``kept`` (the shell's), the ids no longer kept here: the shell forgets them."""
        return [checkpoint_id for checkpoint_id in kept if checkpoint_id not in self._kept]

    def next_rewind_id(self) -> str:
        """``r1``, ``r2``, ...: the state before each rewind, itself a checkpoint."""
        self._rewinds += 1
        return f"r{self._rewinds}"
