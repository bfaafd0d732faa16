"""Tier 1: the ACP agent-side machine (``protocols/acp_agent.py``) on its own, no I/O.

The races and corner cases the front door's real-process tests cannot time on purpose: a turn
that ends before its prompt's acceptance is told, a permission answered after it was withdrawn,
another client's prompt on a shared session, the stop reasons, the content blocks.
"""

from __future__ import annotations

from typing import Any

from protocols import events as ev
from protocols.acp_agent import (
    AcpAgentSide,
    CancelRequested,
    NewSession,
    Output,
    PermissionAnswered,
    PromptRequested,
    SteerRequested,
    prompt_text,
)
from protocols.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND


def machine() -> AcpAgentSide:
    return AcpAgentSide(agent_info={"name": "agent-supervisor", "version": "0"})


def request(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def prompt(m: AcpAgentSide, rid: int, text: str, session: str = "S") -> PromptRequested:
    out = m.receive(
        request(
            rid,
            "session/prompt",
            {"sessionId": session, "prompt": [{"type": "text", "text": text}]},
        )
    )
    (action,) = out.actions
    assert isinstance(action, PromptRequested)
    return action


def test_initialize_advertises_what_the_supervisor_does() -> None:
    m = machine()
    (answer,) = m.receive(request(0, "initialize", {"protocolVersion": 1})).send
    result = answer["result"]
    assert result["protocolVersion"] == 1
    assert result["agentCapabilities"]["loadSession"] is True
    assert result["agentCapabilities"]["sessionCapabilities"] == {
        "list": {},
        "resume": {},
        "close": {},
    }
    assert result["authMethods"] == []
    assert result["_meta"] == {"steering": {"supported": True}}


def test_session_new_needs_an_absolute_cwd_and_passes_the_mcp_servers() -> None:
    m = machine()
    (error,) = m.receive(request(1, "session/new", {"cwd": "rel", "mcpServers": []})).send
    assert error["error"]["code"] == INVALID_PARAMS
    servers = [{"name": "fs", "command": "mcp-fs", "args": [], "env": []}]
    (action,) = m.receive(request(2, "session/new", {"cwd": "/w", "mcpServers": servers})).actions
    assert action == NewSession(2, "/w", servers)


def test_the_answer_waits_for_the_turn_end_even_when_it_came_first() -> None:
    m = machine()
    action = prompt(m, 5, "hi")
    # The session's events can overtake the acceptance: the turn starts and ends first.
    started = m.event("S", ev.TurnStarted(turn_id="t1", text="hi"))
    assert started.send == []  # our own prompt: not echoed back
    assert (
        m.event("S", ev.TurnEnded(turn_id="t1", outcome="completed", stop_reason="end_turn")).send
        == []
    )
    (answer,) = m.prompt_accepted(action.rpc_id, "S", "hi", "t1").send
    assert answer["id"] == 5 and answer["result"]["stopReason"] == "end_turn"


def test_stop_reasons_are_honest() -> None:
    cases = {
        ("completed", "max_tokens"): "max_tokens",
        ("completed", "whatever"): "end_turn",
        ("completed", None): "end_turn",
        ("cancelled", "cancelled"): "cancelled",
        ("killed", "killed"): "cancelled",
    }
    for (outcome, reason), expected in cases.items():
        m = machine()
        action = prompt(m, 1, "x")
        m.prompt_accepted(action.rpc_id, "S", "x", "t1")
        (answer,) = m.event(
            "S", ev.TurnEnded(turn_id="t1", outcome=outcome, stop_reason=reason)
        ).send
        assert answer["result"]["stopReason"] == expected, (outcome, reason)
    m = machine()
    action = prompt(m, 1, "x")
    m.prompt_accepted(action.rpc_id, "S", "x", "t1")
    (answer,) = m.event("S", ev.TurnEnded(turn_id="t1", outcome="failed", error="boom")).send
    assert "boom" in answer["error"]["message"]


def test_a_killed_turn_is_answered_when_its_tree_is_gone_not_after_the_respawn() -> None:
    m = machine()
    action = prompt(m, 3, "x")
    m.event("S", ev.TurnStarted(turn_id="t1", text="x"))
    m.prompt_accepted(action.rpc_id, "S", "x", "t1")
    out = m.receive({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "S"}})
    assert out.actions == [CancelRequested("S")]
    (answer,) = m.event("S", ev.AgentExited(exit_code=None, expected=True, killed=True)).send
    assert answer["id"] == 3 and answer["result"]["stopReason"] == "cancelled"
    assert answer["result"]["_meta"]["agentSupervisor"]["outcome"] == "killed"
    # The turn's own end, after the respawn and resume: nothing more to answer.
    assert m.event("S", ev.TurnEnded(turn_id="t1", outcome="killed")).send == []


def test_an_agent_that_exits_as_its_way_of_stopping_is_answered_by_its_turn_end() -> None:
    """Amp ends its process on the SIGINT that stops its turn: that exit is no kill, and the
    answer waits for the turn's end (once the next process runs), with its outcome."""
    m = machine()
    action = prompt(m, 3, "x")
    m.event("S", ev.TurnStarted(turn_id="t1", text="x"))
    m.prompt_accepted(action.rpc_id, "S", "x", "t1")
    m.receive({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "S"}})
    m.event("S", ev.SessionState(state="cancelling"))
    assert m.event("S", ev.AgentExited(exit_code=0, expected=True)).send == []
    (answer,) = m.event(
        "S", ev.TurnEnded(turn_id="t1", outcome="cancelled", stop_reason="cancelled")
    ).send
    assert answer["id"] == 3 and answer["result"]["stopReason"] == "cancelled"
    assert answer["result"]["_meta"]["agentSupervisor"]["outcome"] == "cancelled"


def test_a_withdrawn_permission_is_cancelled_at_the_client_and_its_late_answer_ignored() -> None:
    m = machine()
    option = ev.PermissionOption(option_id="ok", name="Allow", option_kind="allow_once")
    (asked,) = m.event(
        "S",
        ev.PermissionRequested(turn_id="t1", request_id="p1", options=[option], tool_call={}),
    ).send
    assert asked["method"] == "session/request_permission"
    assert asked["params"]["toolCall"]["toolCallId"] == "p1"
    (withdrawn,) = m.event(
        "S",
        ev.PermissionResolved(turn_id="t1", request_id="p1", outcome="cancelled", by="supervisor"),
    ).send
    assert withdrawn == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": asked["id"]},
    }
    late = {
        "jsonrpc": "2.0",
        "id": asked["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "ok"}},
    }
    assert m.receive(late).actions == [] and m.receive(late).send == []


def test_a_permission_answer_offers_only_the_options_asked() -> None:
    m = machine()
    option = ev.PermissionOption(option_id="ok", name="Allow", option_kind="allow_once")
    (asked,) = m.event(
        "S", ev.PermissionRequested(turn_id="t1", request_id="p1", options=[option])
    ).send
    forged = {"outcome": {"outcome": "selected", "optionId": "rm -rf"}}
    out = m.receive({"jsonrpc": "2.0", "id": asked["id"], "result": forged})
    assert out.actions == [PermissionAnswered("S", "p1", None)]


def test_another_clients_prompt_on_a_shared_session_is_shown() -> None:
    m = machine()
    (shown,) = m.event("S", ev.TurnStarted(turn_id="t9", text="from the web UI")).send
    update = shown["params"]["update"]
    assert update == {
        "sessionUpdate": "user_message_chunk",
        "content": {"type": "text", "text": "from the web UI"},
    }


def test_steering_when_idle_is_prompt_required_without_asking_the_session() -> None:
    m = machine()
    params = {
        "sessionId": "S",
        "prompt": [{"type": "text", "text": "left"}],
        "_meta": {"steering": {"idleBehavior": "promptRequired"}},
    }
    out = m.receive(request(4, "_session/steering", params))
    assert out.actions == [] and out.send[0]["result"] == {"outcome": "promptRequired"}
    m.event("S", ev.TurnStarted(turn_id="t1", text="go"))
    assert m.receive(request(5, "_session/steering", params)).actions == [
        SteerRequested(5, "S", "left")
    ]


def test_unknown_methods_and_content() -> None:
    m = machine()
    (error,) = m.receive(request(1, "fs/read_text_file", {})).send
    assert error["error"]["code"] == METHOD_NOT_FOUND
    image = {"sessionId": "S", "prompt": [{"type": "image", "data": "", "mimeType": "image/png"}]}
    (refused,) = m.receive(request(2, "session/prompt", image)).send
    assert refused["error"]["code"] == INVALID_PARAMS
    text = prompt_text(
        [
            {"type": "text", "text": "look at"},
            {"type": "resource_link", "uri": "file:///a.py", "name": "a.py"},
            {"type": "resource", "resource": {"uri": "file:///b.py", "text": "x = 1"}},
        ]
    )
    assert text == 'look at\n@a.py <file:///a.py>\n<context uri="file:///b.py">\nx = 1\n</context>'


def test_tool_calls_and_plans_in_acp_shape_whatever_the_agent_said() -> None:
    m = machine()
    (call,) = m.event(
        "S",
        ev.ToolCall(
            turn_id="t1",
            tool_call_id="c1",
            title="",
            tool_kind="execute",
            status="weird",
            raw={"x": 1},
        ),
    ).send
    assert call["params"]["update"] == {
        "sessionUpdate": "tool_call",
        "toolCallId": "c1",
        "title": "execute",
        "kind": "execute",
    }
    (plan,) = m.event(
        "S", ev.Plan(turn_id="t1", entries=[{"step": "read", "status": "inProgress"}])
    ).send
    assert plan["params"]["update"]["entries"] == [
        {"content": "read", "priority": "medium", "status": "in_progress"}
    ]


def test_a_closed_session_answers_its_waiting_prompts_and_withdraws_its_requests() -> None:
    m = machine()
    action = prompt(m, 7, "x")
    m.prompt_accepted(action.rpc_id, "S", "x", "t1")
    option = ev.PermissionOption(option_id="ok", name="Allow", option_kind="allow_once")
    (asked,) = m.event(
        "S", ev.PermissionRequested(turn_id="t1", request_id="p1", options=[option])
    ).send
    answer, withdrawn = m.session_ended("S").send
    assert answer["id"] == 7 and answer["result"]["stopReason"] == "cancelled"
    assert withdrawn["method"] == "$/cancel_request"
    assert withdrawn["params"] == {"requestId": asked["id"]}
    # Lost rather than closed: an error, not a stop reason.
    action = prompt(m, 8, "y")
    m.prompt_accepted(action.rpc_id, "S", "y", "t2")
    (lost,) = m.session_ended("S", error="gone").send
    assert lost["error"]["message"] == "gone"


def test_a_prompt_accepted_by_a_session_already_replaced_is_answered_at_once() -> None:
    m = machine()
    action = prompt(m, 9, "x")
    (answer,) = m.turn_abandoned(action.rpc_id, "S", "x", "t1").send
    assert answer["result"]["stopReason"] == "cancelled"
    # Its text no longer counts as ours: the same words from another client are shown.
    assert m.event("S", ev.TurnStarted(turn_id="t2", text="x")).send != []


def test_a_refused_resume_is_told_once() -> None:
    m = machine()
    m.expect_resume("S")
    (notice,) = m.event("S", ev.SessionState(state="ready", detail="session/load failed")).send
    update = notice["params"]["update"]
    assert update["_meta"]["agentSupervisor"]["notice"] == "resume_failed"
    assert "session/load failed" in update["content"]["text"]
    assert m.event("S", ev.SessionState(state="ready", detail="later")).send == []
    m.expect_resume("R")
    assert m.event("R", ev.SessionState(state="ready")).send == []  # resumed: nothing to say


def test_a_pause_and_the_resume_are_told_as_notices() -> None:
    m = machine()
    (held,) = m.event("S", ev.SessionHeld(held="paused", deadline_s=30.0)).send
    update = held["params"]["update"]
    assert update["_meta"]["agentSupervisor"]["notice"] == "paused"
    assert "prompts wait until it is resumed" in update["content"]["text"]
    (released,) = m.event("S", ev.SessionHeld(held=None)).send
    assert released["params"]["update"]["_meta"]["agentSupervisor"]["notice"] == "resumed"


def test_a_request_with_a_wrong_jsonrpc_version_is_refused_under_its_own_id() -> None:
    m = machine()
    for version in ("1.0", 2, None):
        message: dict[str, Any] = {"id": 7, "method": "session/list", "params": {}}
        if version is not None:
            message["jsonrpc"] = version
        [answer] = m.receive(message).send
        assert answer["id"] == 7 and answer["error"]["code"] == -32600, answer
    # An id that cannot be one is not echoed.
    [answer] = m.receive({"jsonrpc": "1.0", "id": [1], "method": "session/list"}).send
    assert answer["id"] is None


def test_mcp_servers_the_front_door_cannot_read_are_refused_not_dropped() -> None:
    """A session started without servers its client believes it gave would fail later, and
    silently: an ``mcpServers`` that is not a list, or holds a non-object, is invalid params."""
    m = machine()
    for servers, why in (
        ({"name": "fs"}, "mcpServers must be a list"),
        ([{"name": "fs", "command": "mcp-fs", "args": [], "env": []}, "fs"], "mcpServers[1]"),
    ):
        for rid, method, params in (
            (1, "session/new", {"cwd": "/w", "mcpServers": servers}),
            (2, "session/load", {"sessionId": "S", "cwd": "/w", "mcpServers": servers}),
            (3, "session/resume", {"sessionId": "S", "cwd": "/w", "mcpServers": servers}),
        ):
            out = m.receive(request(rid, method, params))
            assert out.actions == [], method
            [error] = out.send
            assert error["id"] == rid and error["error"]["code"] == INVALID_PARAMS, error
            assert why in error["error"]["message"]
    (action,) = m.receive(request(4, "session/new", {"cwd": "/w"})).actions
    assert action == NewSession(4, "/w", [])  # absent: none


def test_an_object_with_an_id_and_no_method_is_an_invalid_request() -> None:
    """JSON-RPC 2.0: neither a request nor a response is an invalid request, answered
    ``-32600`` under its id (a response to a withdrawn request is still ignored)."""
    m = machine()
    [answer] = m.receive({"jsonrpc": "2.0", "id": 9}).send
    assert answer["id"] == 9 and answer["error"]["code"] == -32600, answer
    [answer] = m.receive({"jsonrpc": "2.0", "id": 10, "params": {}}).send
    assert answer["id"] == 10 and answer["error"]["code"] == -32600, answer
    assert m.receive({"jsonrpc": "2.0", "id": 11, "result": {}}).send == []  # a stray answer


def test_a_conversation_lost_in_a_kill_is_told_to_the_editor() -> None:
    """Gemini killed past its grace comes back with a fresh session (``resumed: false``): the
    editor hears that the agent no longer has the conversation, once, with the turn's end."""
    m = machine()
    action = prompt(m, 3, "x")
    m.event("S", ev.TurnStarted(turn_id="t1", text="x"))
    m.prompt_accepted(action.rpc_id, "S", "x", "t1")
    m.receive({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "S"}})
    m.event("S", ev.AgentExited(exit_code=None, expected=True, killed=True))
    receipt = {
        "outcome": "killed",
        "escalation": ["interrupt", "grace_expired", "sigterm", "respawned"],
        "resumed": False,
        "session_failed": None,
    }
    [notice] = m.event("S", ev.TurnEnded(turn_id="t1", outcome="killed", receipt=receipt)).send
    update = notice["params"]["update"]
    assert update["_meta"]["agentSupervisor"]["notice"] == "resume_failed"
    assert "without this conversation" in update["content"]["text"]
    resumed = {**receipt, "escalation": [*receipt["escalation"], "resumed"], "resumed": True}
    assert m.event("S", ev.TurnEnded(turn_id="t2", outcome="killed", receipt=resumed)).send == []


def test_ids_a_client_makes_up_cost_no_memory() -> None:
    # Each cancel or refused prompt naming an unknown session once kept a view of it for good
    # (2,000 cancels with 500 KB ids grew the front door by ~1 GB).
    m = machine()
    for n in range(100):
        note = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": f"x{n}"}}
        assert m.receive(note) == Output()
        action = prompt(m, n, "hello", session=f"y{n}")
        m.prompt_failed(action.rpc_id, f"y{n}", "hello", "no such session here")
    assert m._sessions == {}
    # A session that was ready here keeps its view through a refused prompt.
    m.session_opened(1, "S", config_options=[], new=True)
    action = prompt(m, 200, "hello")
    m.prompt_failed(action.rpc_id, "S", "hello", "too many queued")
    assert list(m._sessions) == ["S"]


def test_a_long_prompt_of_ours_is_known_by_its_preview() -> None:
    """``turn.started`` carries a long prompt's first characters: still ours, not another
    client's prompt to echo back."""
    m = machine()
    text = "x" * (ev.PREVIEW_CHARS + 10)
    action = prompt(m, 1, text)
    shown, size = ev.preview(text)
    started = ev.TurnStarted(turn_id="t1", text=shown, text_bytes=size)
    assert m.event("S", started).send == []
    m.prompt_accepted(action.rpc_id, "S", text, "t1")
    (answer,) = m.event("S", ev.TurnEnded(turn_id="t1", outcome="completed")).send
    assert answer["id"] == 1


def test_authenticate_with_a_method_never_advertised_is_invalid_params() -> None:
    """``authMethods`` is empty (no agent here needs a login through the editor): the spec's
    ``methodId`` "must be one of the methods advertised", so none can succeed."""
    m = machine()
    m.receive(request(0, "initialize", {"protocolVersion": 1}))
    (error,) = m.receive(request(1, "authenticate", {"methodId": "oauth"})).send
    assert error["error"]["code"] == INVALID_PARAMS
    assert "'oauth'" in error["error"]["message"]
