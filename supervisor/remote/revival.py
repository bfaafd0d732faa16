"""A stored session of another host started again there: what its node's new session goes on
from.

The front's store keeps a remote session (its host, cwd, agent, the agent's own session id,
its events with the node's seqs). When its node no longer has it (the host rebooted, the node
was killed), a prompt starts it again on the same host: ``session.start`` carries ``revive``
(nodes only), and the node's new session resumes the agent's own session, numbers its events
after ``last_seq`` and its turns after ``turns``, and has ``earlier`` (what was said, from the
front's store) to give an agent that cannot resume, as a local session started again does
(``supervisor/runtime/context.py``). The front keeps the session's id (``s1@h``) for the
node's new session, whatever the node calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from protocols.framing import is_text
from supervisor.runtime.context import Said

__all__ = ["Revival"]

_ROLES = ("user", "assistant")


@frozen
class Revival:
    #: the agent's own session id to resume (None: it had none: it starts afresh)
    resume: str | None
    #: the seq of the session's last stored event: the node's new session goes on after it
    last_seq: int
    #: the turns it had: the new session's turn ids go on after them
    turns: int
    #: the conversation so far (bounded, the newest kept), for an agent that cannot resume
    earlier: tuple[Said, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "resume": self.resume,
            "last_seq": self.last_seq,
            "turns": self.turns,
            "earlier": [{"role": said.role, "text": said.text} for said in self.earlier],
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Revival:
        """``session.start``'s ``revive``; raises ValueError saying what is wrong with it."""
        resume = data.get("resume")
        if resume is not None and not (isinstance(resume, str) and is_text(resume)):
            raise ValueError("'revive.resume' must be text or null")
        last_seq, turns = data.get("last_seq"), data.get("turns")
        if not (isinstance(last_seq, int) and isinstance(turns, int)) or not all(
            n.__class__ is int and n >= 0 for n in (last_seq, turns)
        ):
            raise ValueError("'revive.last_seq' and 'revive.turns' must be whole numbers >= 0")
        earlier = data.get("earlier", [])
        if not isinstance(earlier, list) or not all(
            isinstance(said, dict)
            and said.get("role") in _ROLES
            and isinstance(said.get("text"), str)
            and is_text(said["text"])
            for said in earlier
        ):
            raise ValueError("'revive.earlier' must be a list of {role: user|assistant, text}")
        return cls(
            resume,
            last_seq,
            turns,
            tuple(Said(said["role"], said["text"]) for said in earlier),
        )
