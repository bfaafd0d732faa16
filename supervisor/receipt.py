"""The cancel receipt: what a stop really did, given only once the turn has ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import field, frozen

from protocols.events import preview, quick_constructor

__all__ = [
    "ESCALATION_STEPS",
    "OUTCOMES",
    "REASON_MEMORY_LIMIT",
    "REASON_PAUSED",
    "REASON_STALLED",
    "REASON_STEER",
    "REASON_USER",
    "CancelReceipt",
    "DroppedPrompt",
    "new_cancel_receipt",
]

#: Receipt outcomes. ``completed`` is honest: the agent finished before the stop took hold.
#: ``failed`` only answers a cancel naming a turn that had already failed (the agent crashed).
#: ``unreachable``: a remote session's host could not be reached within the node's whole
#: ladder; what became of the turn is unknown (``supervisor/remote/``).
OUTCOMES = ("cancelled", "completed", "killed", "no_active_turn", "failed", "unreachable")

#: The escalation vocabulary, in the order the steps can happen.
ESCALATION_STEPS = (
    "interrupt",
    "permissions_cancelled",
    "tools_killed",  # the agent ended the turn but left its tools running: we killed them
    "containment_lost",  # the shim died and left the tree loose: we killed it ourselves
    "grace_expired",
    "sigterm",
    "sigkill",
    "respawned",
    "resumed",
)

#: Why a turn was stopped: the receipt's ``reason``, also on its ``turn.ended``. ``user`` is a
#: caller's cancel that gave no reason of its own (callers may: the HTTP abort says ``http``);
#: ``stalled`` is the stall watchdog's (the agent said nothing for ``stall_s``). The field is
#: open: other stops of the supervisor's own (a memory limit) add their word, and a client
#: shows a word it does not know as it is.
REASON_USER = "user"
REASON_STALLED = "stalled"
#: the agent's tree went over ``max_memory_mb``: the turn stopped, the agent restarted
REASON_MEMORY_LIMIT = "memory_limit"
#: a steer the agent could not take made the running turn make way (``supervisor/steering.py``)
REASON_STEER = "steer"
#: the supervisor was paused, and the turn still ran at the pause's deadline
#: (``supervisor/core/pause.py``)
REASON_PAUSED = "paused"


#: How :meth:`CancelReceipt.summary` names a stop the supervisor made by itself.
_REASON_PREFIXES = {
    REASON_STALLED: "Stalled: ",
    REASON_MEMORY_LIMIT: "Over its memory limit: ",
    REASON_PAUSED: "Paused: ",
}


@frozen
class DroppedPrompt:
    """A queued prompt the cancel threw away (it gets its own ``turn.ended`` too). ``text`` is
    its preview when ``text_bytes`` is set (``protocols.events.preview``): a receipt lists what
    a cancel dropped, not megabytes of it."""

    turn_id: str
    text: str
    text_bytes: int | None = None

    @classmethod
    def of(cls, turn_id: str, text: str) -> DroppedPrompt:
        shown, size = preview(text)
        return cls(turn_id, shown, size)


@frozen(kw_only=True)
class CancelReceipt:
    session_id: str
    turn_id: str | None
    outcome: str
    escalation: list[str] = field(factory=list)
    stop_reason: str | None = None
    dropped_prompts: list[DroppedPrompt] = field(factory=list)
    resumed: bool | None = None
    elapsed_ms: float = 0.0
    grace_s: float | None = None
    #: why the turn was stopped: ``user``, ``stalled`` or the caller's own word (see above)
    reason: str | None = None
    #: what the protocol adapter did beyond the ladder (children interrupted, terminals cleaned)
    details: dict[str, Any] = field(factory=dict)
    #: ``{"pid", "command"}`` of processes of the agent's tree still alive after SIGKILL (in
    #: uninterruptible sleep, or not ours to signal). Never empty while a member lives after a
    #: kill: the session then fails instead of starting an agent on top of them.
    survivors: list[dict[str, Any]] = field(factory=list)
    #: why the session failed while the stop ran (its tree outlived SIGKILL, or the agent could
    #: not be started again after the kill); None: it did not. A failed session takes no more
    #: prompts, whatever ``resumed`` would have said.
    session_failed: str | None = None
    #: the ``[hosts.NAME]`` whose node stopped the turn (``supervisor/remote/``); None: here
    host: str | None = None
    #: when each step of ``escalation`` was taken, in ms after the cancel began (a kill's
    #: ``sigterm`` and ``sigkill`` at the kill's end: the kill ladder reports once), and when
    #: the agent answered the interrupt (``interrupt_answered``: only protocols whose interrupt
    #: is a request with an answer), ended the turn (``turn_ended``) or exited
    #: (``agent_exited``)
    timeline: dict[str, float] = field(factory=dict)
    #: what the turn changed in the working directory, ``{"path", "change", "detail"?}`` by
    #: path (``supervisor/checkpoints/``); None: not known (checkpoints off, or not taken)
    changes: list[dict[str, Any]] | None = None
    #: a stop-and-rewind's answer: ``{"restored": [...], "not_restored": [{"path", "why"}]}``,
    #: or ``{"error": ...}`` when the rewind could not be made; None: no rewind was asked
    restored: dict[str, Any] | None = None

    def summary(self) -> str:
        """One line a person reads: "Killed after 3.0 s grace, session resumed"."""
        if self.outcome == "no_active_turn":
            text = "Nothing to stop"
        elif self.outcome == "completed":
            text = "Turn had already completed"
        elif self.outcome == "failed":
            text = "Turn had already failed"
        elif self.outcome == "unreachable":
            text = f"Host {self.host} unreachable: the turn's fate is unknown"
        elif self.outcome == "cancelled":
            text = f"Cancelled in {self.elapsed_ms:.0f} ms"
        else:
            grace = f" after {self.grace_s:.1f} s grace" if self.grace_s is not None else ""
            text = f"Killed{grace}"
            if self.resumed is True:
                text += ", session resumed"
            elif self.resumed is False and self.session_failed is None:
                text += ", session could not be resumed (fresh session)"
        prefix = _REASON_PREFIXES.get(self.reason or "")
        if prefix is not None and self.outcome in ("cancelled", "killed"):
            text = prefix + text[0].lower() + text[1:]
        if self.survivors:
            text += (
                f"; {len(self.survivors)} process(es) survived SIGKILL"
                f" (pid {', '.join(str(s['pid']) for s in self.survivors)}): session failed"
            )
        elif self.session_failed is not None:
            text += "; the agent could not be started again: session failed"
        if self.dropped_prompts:
            text += f"; {len(self.dropped_prompts)} queued prompt(s) dropped"
        return text


#: ``CancelReceipt(...)``, as a cancel makes it on its cold path: :func:`quick_constructor`
#: (the frozen ``__init__`` took 15-16 us of a cancel's ~300 there, measured).
new_cancel_receipt: Callable[..., CancelReceipt] = quick_constructor(CancelReceipt)
