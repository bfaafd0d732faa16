"""Our adapters' wire messages against the protocols' own published JSON schemas.

Both schemas are obtained by this file's setup, at pinned versions (``tests/realagents/install.py``;
a skip with the reason when that is impossible, a failure under
``AGENT_SUPERVISOR_STRICT_SKIPS=1``):

- **Codex app-server**: ``@openai/codex@0.171.0``; its native binary writes the schema bundle
  offline (``codex app-server generate-json-schema --out DIR``), once, into the package's cache
  folder (``app-server-schema/``; a marker file says it is complete). We opt into
  ``experimentalApi`` (for ``thread/backgroundTerminals/clean``), so the ``--experimental``
  bundle is the reference; the stable one is generated too, to check we only use experimental
  methods after opting in. The bundle is ``codex_app_server_protocol.schemas.json``: draft-07,
  ``definitions`` holding the v1 types (``ClientRequest``, ``ServerRequest``,
  ``ClientNotification``, ``ServerNotification``, ``InitializeResponse``, the server requests'
  ``*Response`` types, ``JSONRPCResponse``/``JSONRPCError``) and ``definitions.v2`` the v2 ones.
  The four unions are ``oneOf`` lists of ``{method: {enum: [M]}, params: {$ref: ...Params}}``,
  so a message is checked against the branch of its own method; a response is checked against
  the envelope (``JSONRPCResponse`` / ``JSONRPCError``) and its result against the request's
  ``<Name>Params`` -> ``<Name>Response`` type (the bundle's naming; every pair we need is
  asserted to exist).
- **ACP v1**: ``@agentclientprotocol/sdk@2.4.0`` ships ``schema/v1/schema.json`` (draft 2020-12;
  no ``meta.json``). The top level is ``anyOf`` ``Agent`` / ``Client`` / ``ProtocolLevel``
  envelopes (messages *sent by* that side); their ``params``/``result`` are an ``anyOf`` of
  every type, not tied to the method. So each message is checked twice: the whole message
  against its sender's envelope, and its params or result against the one ``$def`` that the
  sender's union (``ClientRequest``, ``AgentResponse``, ...) references with
  ``x-method == method``.

Every message **we** send in every golden transcript (``tests/golden/{codex,acp}``) must be
valid, completely, and use only member names the schema declares somewhere (most objects of
both schemas allow unknown members, so a misspelt optional field would pass otherwise). Every
message the goldens say the **agent** sends must be valid except for
required fields it leaves out (the transcripts abbreviate: a ``thread`` with only its ``id``);
whatever is present must have the schema's names, types and values. Messages that are off-schema
on purpose (the robustness transcripts) are listed in ``*_DELIBERATE`` and must really be
invalid; every other message of the goldens must be one the real agent can send.

Responses are matched to their request by id in the sender's own id space (Codex numbers its
requests from 0 like we do); which request a response answers is the last unanswered one with
that id (and that id type: ``1`` and ``"1"`` differ).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from paths import TESTS
from realagents import install
from realagents.conftest import skip_or_fail
from schemas import (
    AcpSchema,
    CodexSchema,
    Wire,
    load_codex_schema,
    violations,
    walk,
)

GOLDEN = TESTS / "golden"
CODEX_GOLDENS = sorted((GOLDEN / "codex").glob("*.json"))
ACP_GOLDENS = sorted((GOLDEN / "acp").glob("*.json"))


@pytest.fixture(scope="module")
def codex_schema() -> CodexSchema:
    try:
        return load_codex_schema()
    except install.Unavailable as exc:
        skip_or_fail(f"the Codex app-server schema is not available: {exc}")
        raise  # unreachable: skip_or_fail raises


#: Agent messages of the Codex goldens that are off-schema on purpose: (golden, step) -> why.
CODEX_DELIBERATE = {
    ("messages_and_unparsed", 6): "a legacy codex/event/* notification (not in 0.171.0)",
    ("messages_and_unparsed", 9): "params not an object",
    ("messages_and_unparsed", 14): "a notification newer than 0.171.0 (must stay agent.unparsed)",
    ("messages_and_unparsed", 10): "a delta that is not a string",
    ("messages_and_unparsed", 12): "an item id that is not a string",
    ("messages_and_unparsed", 20): "no id, no method",
    ("messages_and_unparsed", 21): "an id without result or error",
    ("messages_and_unparsed", 22): "a request id that is a boolean",
    ("messages_and_unparsed", 23): "a method that is not a string",
    ("thread_start_no_id", 1): "initialize answered null",
    ("thread_start_no_id", 3): "a thread id that is a number",
    ("unsupported_requests", 6): "a server request with null params",
}

#: Agent messages of the Codex goldens that claim to be what 0.171.0 sends but cannot be.


def codex_wires(path: Path) -> list[Wire]:
    return list(walk(path))


def test_codex_goldens_exist() -> None:
    assert len(CODEX_GOLDENS) >= 20 and len(ACP_GOLDENS) >= 20


@pytest.mark.parametrize("path", CODEX_GOLDENS, ids=lambda p: p.stem)
def test_codex_messages_we_send_match_the_schema(path: Path, codex_schema: CodexSchema) -> None:
    found: list[str] = []
    checked = 0
    for wire in codex_wires(path):
        if not wire.ours:
            continue
        checks = codex_schema.checks(wire)
        if isinstance(checks, str):
            found.append(f"{wire.where}: {checks}: {json.dumps(wire.message)[:300]}")
            continue
        found += violations(codex_schema.schema, checks, wire, lenient=False)
        checked += 1
    assert found == [], "\n".join(found)
    assert checked > 0


@pytest.mark.parametrize("path", CODEX_GOLDENS, ids=lambda p: p.stem)
def test_codex_messages_the_server_sends_match_the_schema(
    path: Path, codex_schema: CodexSchema
) -> None:
    found: list[str] = []
    for wire in codex_wires(path):
        if wire.ours:
            continue
        key = (wire.golden, wire.step)
        checks = codex_schema.checks(wire)
        problems = (
            [f"{wire.where}: {checks}"]
            if isinstance(checks, str)
            else violations(codex_schema.schema, checks, wire, lenient=True)
        )
        if key in CODEX_DELIBERATE:
            assert problems, f"{wire.where} is listed as off-schema but is valid: drop the entry"
            continue
        found += problems
    assert found == [], "\n".join(found)


def test_codex_experimental_methods_only_after_opting_in(codex_schema: CodexSchema) -> None:
    """We send methods outside the stable API only in conversations whose ``initialize``
    asked for ``experimentalApi`` (else the server rejects them)."""
    experimental_used: set[str] = set()
    for path in CODEX_GOLDENS:
        opted_in = False
        for wire in codex_wires(path):
            if not wire.ours or wire.kind != "request":
                continue
            if wire.method == "initialize":
                capabilities = wire.message["params"].get("capabilities") or {}
                opted_in = capabilities.get("experimentalApi") is True
            elif wire.method not in codex_schema.stable_client_methods:
                experimental_used.add(str(wire.method))
                assert opted_in, f"{wire.where}: experimental without experimentalApi"
    assert experimental_used == {"thread/backgroundTerminals/clean"}


def test_codex_every_method_we_send_has_a_schema(codex_schema: CodexSchema) -> None:
    """The methods the adapter can send, and the answers it gives, all exist in 0.171.0."""
    from protocols import codex

    sent = {"initialize", "thread/start", "thread/resume", "turn/start", "turn/interrupt"}
    sent.add("thread/backgroundTerminals/clean")
    for method in sent:
        assert codex_schema.branch("ClientRequest", method), method
        codex_schema.response_type("ClientRequest", method)
    assert codex_schema.branch("ClientNotification", "initialized")
    for method in [*codex._APPROVALS, "mcpServer/elicitation/request"]:
        assert codex_schema.branch("ServerRequest", method), method
        codex_schema.response_type("ServerRequest", method)
    # The notifications the adapter reads as session info are real ones.
    known = set(codex_schema.unions["ServerNotification"])
    read = set(codex._INFO_NOTIFICATIONS) | codex._MESSAGE_DELTAS | codex._THOUGHT_DELTAS
    read |= codex._TOOL_PROGRESS | {"turn/completed", "serverRequest/resolved", "error"}
    read |= {"item/started", "item/completed", "item/reasoning/summaryPartAdded"}
    read |= {"turn/plan/updated"}
    assert read - known == set(), "the adapter names notifications 0.171.0 does not have"


@pytest.fixture(scope="module")
def acp_schema() -> AcpSchema:
    try:
        installed = install.ensure("acp-sdk")
    except install.Unavailable as exc:
        skip_or_fail(f"the ACP schema (@agentclientprotocol/sdk) is not available: {exc}")
        raise
    folder = installed.package.folder / "node_modules/@agentclientprotocol/sdk/schema/v1"
    if not (folder / "schema.json").is_file():
        skip_or_fail(f"{folder}/schema.json is missing from the installed SDK")
    return AcpSchema.load(folder / "schema.json")


#: Agent messages of the ACP goldens that are off-schema on purpose: (golden, step) -> why.
ACP_DELIBERATE = {
    ("cancel_request", 9): "$/cancel_request without params",
    ("initialize_null_result", 1): "initialize answered null",
    ("permissions", 11): "permission options that are not PermissionOption objects",
    ("prompt_turn_all_updates", 13): "a plan entry that is a string",
    ("prompt_turn_all_updates", 22): "state_update, an update kind of the v2 draft, not of v1",
    ("prompt_turn_all_updates", 23): "an update without sessionUpdate",
    ("resume_load_null_result", 2): "session/load answered null, as the ACP docs' example "
    "shows (the schema's LoadSessionResponse is an object)",
    ("session_new_no_id", 2): "a sessionId that is a number",
    ("unparsed", 4): "session/request_permission sent as a notification",
    ("unparsed", 7): "no jsonrpc member",
    ("unparsed", 8): 'jsonrpc "1.0" and no params',
    ("unparsed", 11): "an update that is a list",
    ("unparsed", 12): "params that are a string",
    ("unparsed", 13): "neither method nor id",
    ("unparsed", 14): "a method that is a number",
    ("unparsed", 16): "an id without result or error",
}

#: Agent messages of the ACP goldens that claim to be realistic but are not valid ACP v1.


#: Which side handles the methods of each union (the ``x-side`` of its ``$defs``).
ACP_HANDLED_BY = {
    "ClientRequest": "agent",
    "ClientNotification": "agent",
    "ClientResponse": "client",
    "AgentRequest": "client",
    "AgentNotification": "client",
    "AgentResponse": "agent",
    "ProtocolLevel": "protocol",
}


def test_acp_method_tables(acp_schema: AcpSchema) -> None:
    """The per-method types picked from the unions agree with the ``x-side`` keys, and cover
    every method the adapter sends, answers or reads."""
    defs = acp_schema.schema.document["$defs"]
    for (union, method), name in acp_schema.types.items():
        assert defs[name].get("x-side") == ACP_HANDLED_BY[union], (union, method, name)
    used = {
        ("ClientRequest", "initialize"): "InitializeRequest",
        ("ClientRequest", "session/new"): "NewSessionRequest",
        ("ClientRequest", "session/load"): "LoadSessionRequest",
        ("ClientRequest", "session/resume"): "ResumeSessionRequest",
        ("ClientRequest", "session/close"): "CloseSessionRequest",
        ("ClientRequest", "session/prompt"): "PromptRequest",
        ("ClientNotification", "session/cancel"): "CancelNotification",
        ("ClientResponse", "session/request_permission"): "RequestPermissionResponse",
        ("AgentRequest", "session/request_permission"): "RequestPermissionRequest",
        ("AgentNotification", "session/update"): "SessionNotification",
        ("AgentResponse", "initialize"): "InitializeResponse",
        ("AgentResponse", "session/new"): "NewSessionResponse",
        ("AgentResponse", "session/load"): "LoadSessionResponse",
        ("AgentResponse", "session/prompt"): "PromptResponse",
        ("ProtocolLevel", "$/cancel_request"): "CancelRequestNotification",
    }
    assert {key: acp_schema.types.get(key) for key in used} == used


@pytest.mark.parametrize("path", ACP_GOLDENS, ids=lambda p: p.stem)
def test_acp_messages_we_send_match_the_schema(path: Path, acp_schema: AcpSchema) -> None:
    found: list[str] = []
    checked = 0
    for wire in walk(path):
        if not wire.ours:
            continue
        checks = acp_schema.checks(wire)
        if isinstance(checks, str):
            found.append(f"{wire.where}: {checks}: {json.dumps(wire.message)[:300]}")
            continue
        found += violations(acp_schema.schema, checks, wire, lenient=False)
        checked += 1
    assert found == [], "\n".join(found)
    assert checked > 0


@pytest.mark.parametrize("path", ACP_GOLDENS, ids=lambda p: p.stem)
def test_acp_messages_the_agent_sends_match_the_schema(path: Path, acp_schema: AcpSchema) -> None:
    found: list[str] = []
    for wire in walk(path):
        if wire.ours:
            continue
        key = (wire.golden, wire.step)
        checks = acp_schema.checks(wire)
        problems = (
            [f"{wire.where}: {checks}"]
            if isinstance(checks, str)
            else violations(acp_schema.schema, checks, wire, lenient=True)
        )
        if key in ACP_DELIBERATE:
            assert problems, f"{wire.where} is listed as off-schema but is valid: drop the entry"
            continue
        found += problems
    assert found == [], "\n".join(found)


def _enum_values(node: Any) -> set[str]:
    """The strings a schema node allows (``enum``, or ``oneOf`` of ``const``s)."""
    values = set(node.get("enum", ()))
    for option in node.get("oneOf", node.get("anyOf", ())):
        if "const" in option:
            values.add(option["const"])
    return values


def test_the_universal_tool_vocabulary_is_acps(acp_schema: AcpSchema) -> None:
    """``protocols/tools.py`` speaks ACP's words, and every protocol maps into them (each
    machine's :class:`ToolVocabulary` refuses a word outside them when it is built)."""
    from protocols import codex, opencode
    from protocols.tools import TOOL_KINDS, TOOL_STATUSES

    defs = acp_schema.schema.document["$defs"]
    assert _enum_values(defs["ToolKind"]) == TOOL_KINDS
    assert _enum_values(defs["ToolCallStatus"]) == TOOL_STATUSES
    assert codex._TOOLS.status("inProgress") == "in_progress"
    assert opencode._TOOLS.status("error") == "failed" and opencode._TOOLS.kind("nope") == "other"
