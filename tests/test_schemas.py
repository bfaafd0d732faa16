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

import fcntl
import functools
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from jsonschema import Draft7Validator, Draft202012Validator, ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT7, DRAFT202012

from realagents import install
from realagents.conftest import skip_or_fail

GOLDEN = Path(__file__).parent / "golden"
CODEX_GOLDENS = sorted((GOLDEN / "codex").glob("*.json"))
ACP_GOLDENS = sorted((GOLDEN / "acp").glob("*.json"))
SCHEMA_TIMEOUT_S = 60.0


# --- walking a golden transcript ---------------------------------------------------------


@attrs.frozen
class Wire:
    """One message of a transcript, who sent it and what it is."""

    golden: str  # file stem
    step: int
    ours: bool  # sent by the supervisor (else by the agent)
    message: Any
    kind: str  # request | notification | response | error | invalid
    method: str | None  # for responses: the method of the request answered (None: unknown)

    @property
    def where(self) -> str:
        sender = "we send" if self.ours else "agent sends"
        name = self.golden if "." in self.golden else f"{self.golden}.json"  # or a wire log
        return f"{name} step {self.step} ({sender} {self.kind} {self.method})"


def walk(path: Path) -> Iterator[Wire]:
    """Every message of the transcript at ``path``, in order, classified."""

    def messages() -> Iterator[tuple[int, bool, Any]]:
        for index, step in enumerate(json.loads(path.read_text())["steps"]):
            if "agent" in step:
                yield index, False, step["agent"]
            for message in step.get("send", []):
                yield index, True, message

    return walk_messages(path.stem, messages())


def walk_messages(name: str, messages: Iterable[tuple[int, bool, Any]]) -> Iterator[Wire]:
    """``(step, ours, message)`` of one conversation, in order, classified (responses matched
    to their requests)."""
    pending: dict[bool, dict[tuple[type, Any], list[str]]] = {True: {}, False: {}}
    for step, ours, message in messages:
        yield _classify(name, step, ours, message, pending)


def _classify(
    golden: str,
    step: int,
    ours: bool,
    message: Any,
    pending: dict[bool, dict[tuple[type, Any], list[str]]],
) -> Wire:
    def wire(kind: str, method: str | None) -> Wire:
        return Wire(golden, step, ours, message, kind, method)

    if not isinstance(message, dict):
        return wire("invalid", None)
    method = message.get("method")
    if "method" in message:
        if not isinstance(method, str):
            return wire("invalid", None)
        if "id" in message:
            key = (type(message["id"]), message["id"])
            pending[ours].setdefault(key, []).append(method)
            return wire("request", method)
        return wire("notification", method)
    if "id" not in message or not ("result" in message or "error" in message):
        return wire("invalid", None)
    # A response answers a request of the other side.
    waiting = pending[not ours].get((type(message["id"]), message["id"]))
    answered = waiting.pop() if waiting else None
    return wire("error" if "error" in message else "response", answered)


# --- validation ------------------------------------------------------------------------------


def describe(error: ValidationError) -> str:
    path = "/".join(str(p) for p in error.absolute_path) or "(top)"
    return f"at {path}: {error.message[:300]} [schema {'/'.join(map(str, error.schema_path))}]"


def only_missing_required(error: ValidationError) -> bool:
    """True when the only thing wrong is a required field left out (in some branch of every
    union on the way): what an abbreviated golden does, as opposed to a wrong name, type or
    value."""
    if error.validator == "required":
        # A union's tag (a property with a single allowed value) is never left out.
        properties = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        missing = [name for name in error.validator_value if name not in error.instance]
        return not any(_is_tag(properties.get(name)) for name in missing)
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict[Any, list[ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        return any(all(only_missing_required(s) for s in subs) for subs in branches.values())
    return False


def _member_names(value: Any) -> set[str]:
    """Every member name in ``value``, but inside ``_meta``: ACP's extension object, whose
    keys are the extension's own (``_meta.steering.idleBehavior``), never the schema's."""
    if isinstance(value, dict):
        return set(value).union(*(_member_names(v) for k, v in value.items() if k != "_meta"))
    if isinstance(value, list):
        return set().union(*(_member_names(v) for v in value))
    return set()


def _is_tag(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    return "const" in schema or len(schema.get("enum", ())) == 1


@attrs.frozen
class Check:
    """Which schema a message (or a part of it) must satisfy."""

    label: str  # the schema's name, for messages
    ref: str  # a URI into the registry
    part: str | None = None  # "params" or "result": check only that member


@attrs.define
class Schema:
    """A schema document in a registry, with validators by ``$ref``."""

    uri: str
    document: dict[str, Any]
    draft: str  # "7" or "2020-12"
    _registry: Registry = attrs.field(init=False)
    _validators: dict[str, Any] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        spec = DRAFT7 if self.draft == "7" else DRAFT202012
        self._registry = Registry().with_resource(self.uri, spec.create_resource(self.document))

    def errors(self, check: Check, message: dict[str, Any]) -> list[ValidationError]:
        validator = self._validators.get(check.ref)
        if validator is None:
            cls = Draft7Validator if self.draft == "7" else Draft202012Validator
            validator = cls({"$ref": check.ref}, registry=self._registry)
            self._validators[check.ref] = validator
        instance = message if check.part is None else message.get(check.part)
        return list(validator.iter_errors(instance))

    @functools.cached_property
    def declared_names(self) -> frozenset[str]:
        """Every property name the document declares anywhere."""
        names: set[str] = set()

        def visit(node: Any) -> None:
            if isinstance(node, dict):
                properties = node.get("properties")
                if isinstance(properties, dict):
                    names.update(properties)
                for value in node.values():
                    visit(value)
            elif isinstance(node, list):
                for value in node:
                    visit(value)

        visit(self.document)
        return frozenset(names)

    def resolve(self, pointer: str) -> Any:
        node: Any = self.document
        for part in pointer.removeprefix("#/").split("/"):
            node = node[part]
        return node


def violations(schema: Schema, checks: list[Check], wire: Wire, *, lenient: bool) -> list[str]:
    """Why ``wire`` fails ``checks``. Strict (``lenient=False``, for what we send) also rejects
    member names the protocol never declares: neither schema forbids unknown members in most
    objects, so a misspelt optional field would otherwise pass unnoticed."""
    found = []
    if not lenient:
        found += [
            f"{wire.where}: member {name!r} is declared nowhere in the schema"
            for name in sorted(_member_names(wire.message) - schema.declared_names)
        ]
    for check in checks:
        for error in schema.errors(check, wire.message):
            if lenient and only_missing_required(error):
                continue
            found.append(f"{wire.where} against {check.label}: {describe(error)}")
    return found


# --- Codex app-server ------------------------------------------------------------------------


def _generate_codex_schemas(binary: str, folder: Path) -> None:
    """``generate-json-schema`` into ``folder`` (stable) and ``folder/experimental``, once."""
    marker = folder / ".generated.json"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".app-server-schema.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return
        scratch = folder.with_name(folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            for out, extra in ((scratch, []), (scratch / "experimental", ["--experimental"])):
                run = subprocess.run(
                    [binary, "app-server", "generate-json-schema", *extra, "--out", str(out)],
                    capture_output=True,
                    text=True,
                    timeout=SCHEMA_TIMEOUT_S,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "CODEX_HOME": str(scratch / "codex-home")},
                )
                if run.returncode != 0:
                    raise install.Unavailable(
                        f"codex app-server generate-json-schema failed ({run.returncode}): "
                        f"{run.stderr.strip()[-500:]}"
                    )
            shutil.rmtree(scratch / "codex-home", ignore_errors=True)
            (scratch / marker.name).write_text(json.dumps({"binary": binary}) + "\n")
            shutil.rmtree(folder, ignore_errors=True)
            scratch.rename(folder)
        except (OSError, subprocess.SubprocessError) as exc:
            raise install.Unavailable(f"codex app-server generate-json-schema: {exc}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


@attrs.define
class CodexSchema:
    schema: Schema  # the --experimental bundle
    stable_client_methods: frozenset[str]
    unions: dict[str, dict[str, int]]  # union name -> method -> index of its oneOf branch

    @classmethod
    def load(cls, folder: Path) -> CodexSchema:
        bundle_name = "codex_app_server_protocol.schemas.json"
        document = json.loads((folder / "experimental" / bundle_name).read_text())
        schema = Schema("urn:codex-app-server", document, "7")
        unions = {
            name: {
                branch["properties"]["method"]["enum"][0]: index
                for index, branch in enumerate(document["definitions"][name]["oneOf"])
            }
            for name in (
                "ClientRequest",
                "ClientNotification",
                "ServerRequest",
                "ServerNotification",
            )
        }
        stable = json.loads((folder / bundle_name).read_text())["definitions"]["ClientRequest"]
        stable_methods = frozenset(b["properties"]["method"]["enum"][0] for b in stable["oneOf"])
        return cls(schema, stable_methods, unions)

    def branch(self, union: str, method: str) -> Check | None:
        index = self.unions[union].get(method)
        if index is None:
            return None
        return Check(f"{union} {method!r}", f"{self.schema.uri}#/definitions/{union}/oneOf/{index}")

    def response_type(self, union: str, method: str) -> Check:
        """``<Name>Response`` for a request whose params are ``<Name>Params``."""
        index = self.unions[union][method]
        params = self.schema.document["definitions"][union]["oneOf"][index]["properties"]["params"]
        ref = params.get("$ref", "")
        assert ref.endswith("Params"), f"{union} {method}: params are {params}, not a named type"
        pointer = ref.removesuffix("Params") + "Response"
        self.schema.resolve(pointer)  # KeyError: the naming does not hold for this method
        return Check(pointer.rsplit("/", 1)[-1], self.schema.uri + pointer, part="result")

    def checks(self, wire: Wire) -> list[Check] | str:
        """What ``wire`` must satisfy, or why it cannot be checked."""
        side_requests = "ClientRequest" if wire.ours else "ServerRequest"
        if wire.kind in ("request", "notification"):
            assert wire.method is not None
            union = (
                side_requests
                if wire.kind == "request"
                else ("ClientNotification" if wire.ours else "ServerNotification")
            )
            check = self.branch(union, wire.method)
            return [check] if check else f"no method {wire.method!r} in {union}"
        if wire.kind == "invalid":
            return "not a JSON-RPC message"
        envelope = "JSONRPCError" if wire.kind == "error" else "JSONRPCResponse"
        checks = [Check(envelope, f"{self.schema.uri}#/definitions/{envelope}")]
        if wire.method is None:
            return checks  # a response to no request (stray, or a duplicate): the envelope only
        if wire.kind == "response":
            answered = "ServerRequest" if wire.ours else "ClientRequest"
            checks.append(self.response_type(answered, wire.method))
        return checks


def load_codex_schema() -> CodexSchema:
    """The schema of the pinned ``@openai/codex`` (installed and generated first if need be),
    or :class:`install.Unavailable`. ``tests/test_real_codex.py`` checks the real wire with it."""
    installed = install.ensure("codex")
    folder = installed.package.folder / "app-server-schema"
    _generate_codex_schemas(installed.argv[0], folder)
    return CodexSchema.load(folder)


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


# --- ACP v1 ----------------------------------------------------------------------------------

ACP_SIDES = {True: "Client", False: "Agent"}  # the envelope of messages sent by that side


@attrs.define
class AcpSchema:
    schema: Schema
    #: (union, method) -> $def name, e.g. ("ClientRequest", "initialize") -> "InitializeRequest"
    types: dict[tuple[str, str], str]
    envelopes: dict[str, int]  # "Agent" | "Client" | "ProtocolLevel" -> index in anyOf

    @classmethod
    def load(cls, path: Path) -> AcpSchema:
        document = json.loads(path.read_text())
        defs = document["$defs"]
        types: dict[tuple[str, str], str] = {}
        unions = [
            f"{side}{kind}"
            for side in ("Client", "Agent")
            for kind in ("Request", "Response", "Notification")
        ]
        for union in [*unions, "ProtocolLevel"]:
            node = defs.get(union) or next(b for b in document["anyOf"] if b.get("title") == union)
            for name in _refs(node):
                method = defs[name].get("x-method")
                if method is not None:
                    previous = types.setdefault((union, method), name)
                    assert previous == name, f"{union} {method}: {previous} and {name}"
        envelopes = {b["title"]: i for i, b in enumerate(document["anyOf"])}
        return cls(Schema("urn:acp-v1", document, "2020-12"), types, envelopes)

    def type_of(self, union: str, method: str) -> Check | None:
        name = self.types.get((union, method))
        if name is None:
            return None
        part = "result" if union.endswith("Response") else "params"
        return Check(name, f"{self.schema.uri}#/$defs/{name}", part=part)

    def checks(self, wire: Wire) -> list[Check] | str:
        side = ACP_SIDES[wire.ours]
        other = ACP_SIDES[not wire.ours]
        if wire.kind == "invalid":
            return "not a JSON-RPC message"
        envelope = side
        if wire.kind == "notification" and ("ProtocolLevel", wire.method) in self.types:
            envelope = "ProtocolLevel"  # $/cancel_request: either side may send it
        checks = [
            Check(f"{envelope} envelope", f"{self.schema.uri}#/anyOf/{self.envelopes[envelope]}")
        ]
        if wire.method is None or wire.kind == "error" or wire.method.startswith("_"):
            # A response to no request (stray, or a duplicate), an error ({code, message,
            # data?}), an extension method (``_vendor/...``, free-form): the envelope only.
            return checks
        if wire.kind == "request":
            union = f"{side}Request"
        elif wire.kind == "notification":
            union = "ProtocolLevel" if envelope == "ProtocolLevel" else f"{side}Notification"
        else:
            union = f"{side}Response"
        check = self.type_of(union, wire.method)
        if check is None:
            return f"no {union} for {wire.method!r} (the {other.lower()} side's method?)"
        return [*checks, check]


def _refs(node: Any) -> Iterator[str]:
    """The ``$def`` names a schema node references, directly or through anyOf/allOf."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            yield ref.removeprefix("#/$defs/")
        for key, value in node.items():
            if key != "$ref":
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


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
