"""The protocols' own published JSON schemas, loaded and applied: what ``test_schemas.py`` checks
the goldens against, and what the front door's and the real agents' tests check live wire with.

How each schema is obtained, and how a message is matched to its part of it, is said in
``tests/machines/test_schemas.py``.
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
from jsonschema import Draft7Validator, Draft202012Validator, ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT7, DRAFT202012

from realagents import install

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
    """Member names in ``value``, not looking inside ``_meta``: ACP reserves it for free-form
    extension data (the schema's ``additionalProperties: true``), like the steering extension's
    ``_meta.steering``."""
    if isinstance(value, dict):
        inner = (_member_names(v) for k, v in value.items() if k != "_meta")
        return set(value).union(*inner)
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
    or :class:`install.Unavailable`. ``tests/real/test_real_codex.py`` checks the real wire with it."""
    installed = install.ensure("codex")
    folder = installed.package.folder / "app-server-schema"
    _generate_codex_schemas(installed.argv[0], folder)
    return CodexSchema.load(folder)


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
