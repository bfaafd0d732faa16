"""A stored session of another host started again there: what its node's new session goes on
from.

The front's store keeps a remote session (its host, cwd, agent, the agent's own session id,
its events with the node's seqs). When its node no longer has it (the host rebooted, the node
was killed), a prompt starts it again on the same host: ``session.start`` carries ``revive``
(nodes only), and the node's new session resumes the agent's own session, numbers its events
after ``last_seq`` and its turns after ``turns``, and has ``earlier`` (what was said, from the
front's store) to give an agent that cannot resume, as a local session started again does
(``supervisor/runtime/context.py``). The front keeps the session's id (``s1@h``) for the
node's new session, whatever the node calls it. The snapshots of its earlier turns are in the
node's checkpoint store of its cwd, recorded under the node's id of the session as first
started (``supervisor/checkpoints/records.py``): ``checkpoints_of`` names it, and the new
session has them back (a rewind to a turn from before goes on working) and records its own
under it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from protocols.framing import is_text
from supervisor.runtime.context import Said

__all__ = ["Revival", "first_node_id"]

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
    #: what the node recorded its checkpoints under (:func:`first_node_id`; None: nothing)
    checkpoints_of: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "resume": self.resume,
            "last_seq": self.last_seq,
            "turns": self.turns,
            "earlier": [{"role": said.role, "text": said.text} for said in self.earlier],
        }
        if self.checkpoints_of is not None:  # (a node older than it ignores it)
            wire["checkpoints_of"] = self.checkpoints_of
        return wire

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
        checkpoints_of = data.get("checkpoints_of")
        if checkpoints_of is not None and not (
            isinstance(checkpoints_of, str) and is_text(checkpoints_of) and checkpoints_of
        ):
            raise ValueError("'revive.checkpoints_of' must be a session id or null")
        return cls(
            resume,
            last_seq,
            turns,
            tuple(Said(said["role"], said["text"]) for said in earlier),
            checkpoints_of,
        )


def first_node_id(session_id: str) -> str:
    """The node's id of a front's session as first started: the front names it
    ``NODE_ID@HOST`` (``RemoteSession``) and keeps that name for the node's later sessions
    of it."""
    return session_id.partition("@")[0]
