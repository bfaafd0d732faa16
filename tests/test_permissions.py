"""Tier 1: the permission desk and the tool vocabulary every protocol machine shares."""

from __future__ import annotations

import pytest

from protocols import events as ev
from protocols.machine import UnknownPermission
from protocols.permissions import PermissionDesk
from protocols.tools import ToolVocabulary

ALLOW = ev.PermissionOption(option_id="allow", name="Allow", option_kind="allow_once")


def test_a_request_is_held_answered_once_and_told_once() -> None:
    desk: PermissionDesk[int] = PermissionDesk()
    first = desk.hold(desk.unique_id("1"), "t1", [ALLOW], {"title": "rm"}, 1)
    second = desk.hold(desk.unique_id("1"), "t1", [ALLOW], {}, 2)  # JSON-RPC "1" and 1
    assert (first.request_id, second.request_id) == ("1", "1#1")
    assert first.options == [ALLOW] and desk.pending == ["1", "1#1"]
    with pytest.raises(UnknownPermission):
        desk.check("1", "deny")  # not offered
    desk.check("1", "allow")
    held = desk.take("1")
    assert held.ticket == 1 and "1" not in desk
    with pytest.raises(UnknownPermission):
        desk.check("1", None)  # answered already
    resolved = PermissionDesk.resolved(held, "allow", by="client")
    assert (resolved.outcome, resolved.option_id, resolved.by) == ("selected", "allow", "client")
    [rest] = desk.take_all()
    assert PermissionDesk.resolved(rest, None, by="supervisor").outcome == "cancelled"
    assert desk.pending == []


def test_a_vocabulary_outside_acps_words_is_refused() -> None:
    with pytest.raises(ValueError, match="tool kinds"):
        ToolVocabulary(kinds={"Bash": "shell"})
    with pytest.raises(ValueError, match="tool statuses"):
        ToolVocabulary(statuses={"running": "busy"})
    words = ToolVocabulary(kinds={"Bash": "execute"}, statuses={"running": "in_progress"})
    assert words.kind("Bash") == "execute" and words.kind("Zap") == "other"
    assert words.kind(None, None) is None
    assert words.status("running") == "in_progress" and words.status("newer") == "newer"
    assert words.status(None, "pending") == "pending"


def test_a_tagged_desk_makes_ids_a_respawned_agents_requests_cannot_share() -> None:
    from protocols.acp import AcpClient
    from protocols.codex import CodexClient

    for machine in (AcpClient(), CodexClient()):
        machine.number_requests("@2")
        assert machine._desk.unique_id("0") == "0@2"
