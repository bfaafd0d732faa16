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


def test_an_id_our_clients_cannot_send_back_is_given_as_its_escape() -> None:
    desk: PermissionDesk[int] = PermissionDesk()
    request_id = desk.unique_id("p\udfff")  # the agent's "p\udfff" escape, decoded
    assert request_id == "p\\udfff"
    request_id.encode("utf-8")  # text a client can send back
    desk.hold(request_id, "t1", [ALLOW], {}, 1)
    assert desk.take(request_id).ticket == 1


def test_one_id_sent_many_times_gets_a_fresh_id_each_time() -> None:
    # Each try once began at #1 again: N requests under one id cost N^2 probes, and an agent
    # sending 8,000 held the run loop for seconds.
    desk: PermissionDesk[int] = PermissionDesk()
    held = []
    for n in range(2_000):
        request_id = desk.unique_id("1")
        desk.hold(request_id, "t1", [ALLOW], {}, n)
        held.append(request_id)
    assert held[:3] == ["1", "1#1", "1#2"] and len(set(held)) == 2_000
    desk.take("1#1")
    assert desk.unique_id("1") not in desk  # still free of every pending one
    desk.take_all()
    assert desk.unique_id("1") == "1"  # nothing pending: the count starts again
