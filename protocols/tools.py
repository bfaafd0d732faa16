"""Tool calls in the universal vocabulary, for every protocol: one home.

Universal events speak ACP's words for a tool call (``ToolKind``, ``ToolCallStatus`` of the ACP
v1 schema), whatever the agent said: Codex ``commandExecution``/``inProgress``, OpenCode
``bash``/``running``, Claude Code ``Bash``. Each protocol machine declares its own words once in
a :class:`ToolVocabulary`; ``tests/machines/test_schemas.py`` checks every one of them against
the schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from attrs import field, frozen

__all__ = ["TOOL_KINDS", "TOOL_STATUSES", "ToolVocabulary"]

#: ACP ``ToolKind``: what UIs draw tool calls by.
TOOL_KINDS: Final = frozenset(
    {
        "read",
        "edit",
        "delete",
        "move",
        "search",
        "execute",
        "think",
        "fetch",
        "switch_mode",
        "other",
    }
)
#: ACP ``ToolCallStatus``.
TOOL_STATUSES: Final = frozenset({"pending", "in_progress", "completed", "failed"})


def _check(table: Mapping[str, str], allowed: frozenset[str], what: str) -> None:
    wrong = sorted(set(table.values()) - allowed)
    if wrong:
        raise ValueError(f"{what} outside the universal vocabulary: {wrong}")


@frozen
class ToolVocabulary:
    """One protocol's tool names and statuses, mapped to the universal ones."""

    kinds: Mapping[str, str] = field(factory=dict)
    statuses: Mapping[str, str] = field(factory=dict)

    def __attrs_post_init__(self) -> None:
        _check(self.kinds, TOOL_KINDS, "tool kinds")
        _check(self.statuses, TOOL_STATUSES, "tool statuses")

    def kind(self, name: Any, default: str | None = "other") -> str | None:
        """The universal kind of tool ``name``; ``default`` for one we do not know."""
        return self.kinds.get(name, default) if isinstance(name, str) else default

    def status(self, value: Any, default: str | None = None) -> str | None:
        """The universal status; an unknown word passes through as is (newer agents), a
        missing one is ``default``."""
        if not isinstance(value, str):
            return default
        return self.statuses.get(value, value)
