"""The permission requests an agent is waiting on, for every protocol: one home.

Every agent asks before some tool calls (ACP ``session/request_permission``, Codex approvals,
Claude Code ``can_use_tool``, OpenCode ``permission.asked``) and each protocol answers in its own
words, but what the supervisor promises about them is the same everywhere: each request is
announced once (``permission.requested``) under an id our clients can send back, answered at
most once, with an option it offered (or *cancelled*), and its end is told once
(``permission.resolved``, by ``client``, ``supervisor`` or ``agent``). A :class:`PermissionDesk`
keeps that bookkeeping; the machine keeps only its protocol's *ticket* (what it needs to answer:
a JSON-RPC id, the kind of answer, the tool input to echo) and writes the answer itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from attrs import define, field, frozen

from protocols import events as ev
from protocols.machine import Step, check_answer

__all__ = ["DeskPermissions", "Held", "PermissionDesk"]

T = TypeVar("T")


@frozen
class Held(Generic[T]):
    """One request the agent waits on: ``request_id`` is what our clients answer."""

    request_id: str
    turn_id: str | None
    option_ids: frozenset[str]
    ticket: T


@define
class PermissionDesk(Generic[T]):
    """The pending requests of one agent, in the order they came."""

    _held: dict[str, Held[T]] = field(factory=dict)
    #: what every id :meth:`unique_id` makes ends with (``AgentProtocol.number_requests``)
    tag: str = ""
    #: the next ``#n`` to try for an id that collided, while any request is pending
    _suffixes: dict[str, int] = field(factory=dict)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    @property
    def pending(self) -> list[str]:
        return list(self._held)

    def unique_id(self, raw: str) -> str:
        """``raw``, or ``raw#n`` if that is pending already: JSON-RPC ids 1 and "1" are two
        requests, but one string for our clients. An id that is not text our clients can
        send back (a lone surrogate, from the agent's ``\\ud800`` escape) is given as its
        escape, ``\\ud800`` spelled out: the machine answers the agent under its own id.
        An agent that sends one id many times pays once a request, not once per earlier one."""
        if not raw.isascii():
            raw = raw.encode("utf-8", "backslashreplace").decode("utf-8")
        raw += self.tag
        if raw not in self._held:
            return raw
        suffix = self._suffixes.get(raw, 1)
        while f"{raw}#{suffix}" in self._held:
            suffix += 1
        self._suffixes[raw] = suffix + 1
        return f"{raw}#{suffix}"

    def hold(
        self,
        request_id: str,
        turn_id: str | None,
        options: Sequence[ev.PermissionOption],
        tool_call: dict[str, Any],
        ticket: T,
    ) -> ev.PermissionRequested:
        """Keep the request until it is answered or withdrawn; its announcement."""
        self._held[request_id] = Held(
            request_id, turn_id, frozenset(o.option_id for o in options), ticket
        )
        return ev.PermissionRequested(
            turn_id=turn_id, request_id=request_id, tool_call=tool_call, options=list(options)
        )

    def check(self, request_id: str, option_id: str | None) -> None:
        """Refuse an answer to a request not pending, or with an option it did not offer."""
        held = self._held.get(request_id)
        check_answer(request_id, held.option_ids if held is not None else None, option_id)

    def take(self, request_id: str) -> Held[T]:
        held = self._held.pop(request_id)
        self._forget_suffixes()
        return held

    def pop(self, request_id: str) -> Held[T] | None:
        held = self._held.pop(request_id, None)
        self._forget_suffixes()
        return held

    def take_where(self, match: Callable[[Held[T]], bool]) -> list[Held[T]]:
        """The pending requests ``match`` picks, no longer pending, in order."""
        taken = [held for held in self._held.values() if match(held)]
        for held in taken:
            del self._held[held.request_id]
        self._forget_suffixes()
        return taken

    def _forget_suffixes(self) -> None:
        if self._suffixes and not self._held:
            self._suffixes.clear()  # nothing pending: every id is free again

    def take_all(self) -> list[Held[T]]:
        return self.take_where(lambda _: True)

    @staticmethod
    def resolved(held: Held[T], option_id: str | None, *, by: str) -> ev.PermissionResolved:
        """The request's end: ``option_id`` chosen, or ``None`` (cancelled), ``by`` whom."""
        return ev.PermissionResolved(
            turn_id=held.turn_id,
            request_id=held.request_id,
            outcome="cancelled" if option_id is None else "selected",
            option_id=option_id,
            by=by,
        )


class DeskPermissions(ABC, Generic[T]):
    """The permission methods of an :class:`~protocols.machine.AgentProtocol` whose pending
    requests are at a :class:`PermissionDesk` (``_desk``): the same for every protocol but the
    answer itself, which the machine writes in :meth:`_answer_permission`. Listed before
    ``AgentProtocol`` among the machine's bases."""

    __slots__ = ()

    _desk: PermissionDesk[T]

    @abstractmethod
    def _answer_permission(self, held: Held[T], option_id: str | None, *, by: str) -> Step:
        """The agent's answer to ``held`` (``option_id``, or None: cancelled) and its
        ``permission.resolved``, ``by`` whom."""

    def respond_permission(self, request_id: str, option_id: str | None) -> Step:
        self._desk.check(request_id, option_id)
        return self._answer_permission(self._desk.take(request_id), option_id, by="client")

    def cancel_permissions(self) -> Step:
        step = Step()
        for held in self._desk.take_all():
            step.extend(self._answer_permission(held, None, by="supervisor"))
        return step

    @property
    def pending_permissions(self) -> list[str]:
        return self._desk.pending
