"""The cancel receipt: what a stop really did, given only once the turn has ended."""

from __future__ import annotations

from typing import Any

from attrs import field, frozen

__all__ = ["ESCALATION_STEPS", "OUTCOMES", "CancelReceipt", "DroppedPrompt"]

#: Receipt outcomes. ``completed`` is honest: the agent finished before the stop took hold.
#: ``failed`` only answers a cancel naming a turn that had already failed (the agent crashed).
OUTCOMES = ("cancelled", "completed", "killed", "no_active_turn", "failed")

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


@frozen
class DroppedPrompt:
    """A queued prompt the cancel threw away (it gets its own ``turn.ended`` too)."""

    turn_id: str
    text: str


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
    reason: str | None = None
    #: what the protocol adapter did beyond the ladder (children interrupted, terminals cleaned)
    details: dict[str, Any] = field(factory=dict)
    #: ``{"pid", "command"}`` of processes of the agent's tree still alive after SIGKILL (in
    #: uninterruptible sleep, or not ours to signal). Never empty while a member lives after a
    #: kill: the session then fails instead of starting an agent on top of them.
    survivors: list[dict[str, Any]] = field(factory=list)

    def summary(self) -> str:
        """One line a person reads: "Killed after 3.0 s grace, session resumed"."""
        if self.outcome == "no_active_turn":
            text = "Nothing to stop"
        elif self.outcome == "completed":
            text = "Turn had already completed"
        elif self.outcome == "failed":
            text = "Turn had already failed"
        elif self.outcome == "cancelled":
            text = f"Cancelled in {self.elapsed_ms:.0f} ms"
        else:
            grace = f" after {self.grace_s:.1f} s grace" if self.grace_s is not None else ""
            text = f"Killed{grace}"
            if self.resumed is True:
                text += ", session resumed"
            elif self.resumed is False:
                text += ", session could not be resumed (fresh session)"
        if self.survivors:
            text += (
                f"; {len(self.survivors)} process(es) survived SIGKILL"
                f" (pid {', '.join(str(s['pid']) for s in self.survivors)}): session failed"
            )
        if self.dropped_prompts:
            text += f"; {len(self.dropped_prompts)} queued prompt(s) dropped"
        return text
