"""What became of a steer: the answer to ``session.steer(text)`` and the ``agent.steer`` action.

A person redirects a running turn without losing it. The text goes the best way the agent has:

- ``injected``: it joined the running turn natively (Codex ``turn/steer``, ACP
  ``_session/steering``, Claude Code's mid-turn user message, Amp's ``"steer": true``);
- ``started``: no turn was running (or it ended before the text got there): the text starts a
  turn now, ahead of any queued prompt;
- ``interrupted``: the agent cannot steer, so the running turn was cancelled through the whole
  ladder (``receipt``) and the text starts the next turn, ahead of the queue.

``turn_id`` is the turn the text is part of: the running one when injected, else the new one.
``held``: the new one waits, first in the queue, though nothing runs ahead of it (``paused``:
until the supervisor is resumed; ``supervisor/core/pause.py``).
"""

from __future__ import annotations

from typing import Final, Literal

from attrs import frozen

from supervisor.receipt import CancelReceipt

__all__ = ["STEER_MODES", "SteerMode", "SteerResult"]

SteerMode = Literal["injected", "started", "interrupted"]
STEER_MODES: Final = ("injected", "started", "interrupted")


@frozen(kw_only=True)
class SteerResult:
    session_id: str
    mode: SteerMode
    turn_id: str
    #: the cancel of the turn that made way (``interrupted`` only)
    receipt: CancelReceipt | None = None
    #: why the text did not join the running turn, when it could have (the agent refused)
    detail: str | None = None
    #: why the turn the text starts waits (``paused``), else None
    held: str | None = None
