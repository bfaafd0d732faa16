"""Amp's ``--execute --stream-json --stream-json-input`` mode, as a sans-IO machine.

Amp writes Claude-Code-compatible JSONL (``system/init`` naming the thread ``T-...``,
``assistant``, ``user``, then one ``result`` per turn; ``shared/protocols.md`` section 5), so
this machine is :class:`ClaudeClient` with three differences:

- **No handshake**: there is no control protocol, so the session is established as soon as the
  process runs; the thread id arrives with the first turn's ``system/init``.
- **No in-band interrupt**: the cancel is SIGINT to the agent's tree (``Step.signals``). Amp
  ends its whole run on it, so the turn ends with the process; the actor then starts
  ``amp threads continue <T-id> ...`` (``command``) and the session goes on in the same thread.
  An Amp that ignores SIGINT meets the grace timer and the kill ladder like any other agent.
- **No permission protocol** in stream-json mode: nothing to answer.

``resumed=True`` after a respawn means we asked Amp to continue the thread and it started; Amp
has no handshake in which to refuse, so a lost thread shows at the next turn's ``system/init``
(an ``error`` event, ``resume_mismatch``).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import ClassVar

from attrs import define

from protocols.claude import ClaudeClient
from protocols.machine import SessionEstablished, Step

__all__ = ["AmpClient"]


@define
class AmpClient(ClaudeClient):
    name: ClassVar[str] = "amp"

    @classmethod
    def command(cls, base: Sequence[str], resume: str | None) -> list[str]:
        """``amp --execute ...`` becomes ``amp threads continue T-... --execute ...``.

        The subcommand goes before the first option, so a wrapper's own arguments
        (``node amp.js --execute``) stay in front of it.
        """
        argv = list(base)
        if resume is None:
            return argv
        at = next((i for i, arg in enumerate(argv) if i > 0 and arg.startswith("-")), len(argv))
        return [*argv[:at], "threads", "continue", resume, *argv[at:]]

    @property
    def can_steer(self) -> bool:
        return False  # Amp's own ``"steer": true`` line: not Claude Code's priority

    def start(self, *, cwd: str, resume: str | None = None) -> Step:
        if self._phase != "idle":
            raise RuntimeError("start() called twice")
        self._phase = "ready"
        self._resume = resume
        return Step(
            events=[SessionEstablished(resume, resumed=True if resume is not None else None)]
        )

    def prompt(self, turn_id: str, text: str) -> Step:
        step = super().prompt(turn_id, text)
        # Amp's input format wants content blocks, and no Claude session fields.
        step.send = [
            {
                "type": "user",
                "message": {"role": "user", "content": [{"type": "text", "text": text}]},
            }
        ]
        return step

    def cancel(self) -> Step:
        if self._turn_id is None or self._interrupt_sent:
            return Step()
        self._interrupt_sent = True
        return Step(signals=[signal.SIGINT])
