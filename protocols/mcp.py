"""MCP servers given to an agent for a session, as data.

One server is an :class:`McpServer` in the shape ACP's ``session/new`` takes (schema v1
``McpServer``): ``stdio`` (``name``, ``command``, ``args``, ``env: [{name, value}]``, no ``type``
field), ``http`` or ``sse`` (``type``, ``name``, ``url``, ``headers: [{name, value}]``). The
configuration, the gateway and the ACP front door all read that one shape
(:func:`mcp_server_from_acp`); each protocol module turns the servers into its own form: ACP
passes them as they are, Codex as ``-c mcp_servers.NAME=...`` overrides, Claude Code as
``--mcp-config`` JSON, OpenCode in ``OPENCODE_CONFIG_CONTENT``, Amp as ``--mcp-config`` JSON.

A protocol that cannot take a kind of server says so with :class:`McpUnsupported` before
anything starts; nothing is ever dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from attrs import field, frozen

from protocols.framing import is_text

__all__ = [
    "MCP_TRANSPORTS",
    "McpServer",
    "McpUnsupported",
    "NameValue",
    "check_transports",
    "merge_mcp_servers",
    "mcp_server_from_acp",
    "mcp_server_to_acp",
    "mcp_servers_from_acp",
]

#: The kinds of MCP server ACP v1 knows; ``stdio`` is the one every ACP agent must take.
MCP_TRANSPORTS: Final = ("stdio", "http", "sse")


class McpUnsupported(ValueError):
    """The agent's protocol cannot take one of the servers (its kind, or its name)."""


@frozen
class NameValue:
    """An environment variable of a stdio server, or a header of an http/sse one."""

    name: str
    value: str


def _pairs(value: Iterable[NameValue]) -> tuple[NameValue, ...]:
    return tuple(value)


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _check_transport(instance: McpServer, attribute: Any, value: str) -> None:
    if value not in MCP_TRANSPORTS:
        raise ValueError(f"MCP server transport must be one of {', '.join(MCP_TRANSPORTS)}")


@frozen(kw_only=True)
class McpServer:
    """One MCP server: a program to start (``stdio``) or a URL to connect to."""

    name: str
    #: ``stdio``, ``http`` (streamable HTTP) or ``sse``
    transport: str = field(default="stdio", validator=_check_transport)
    #: stdio: the program (ACP asks for an absolute path; agents look a bare name up in PATH)
    command: str | None = None
    args: tuple[str, ...] = field(default=(), converter=_strings)
    env: tuple[NameValue, ...] = field(default=(), converter=_pairs)
    #: http/sse
    url: str | None = None
    headers: tuple[NameValue, ...] = field(default=(), converter=_pairs)

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise ValueError("an MCP server needs a non-empty name")
        if self.transport == "stdio" and not self.command:
            raise ValueError(f"stdio MCP server {self.name!r} needs a command")
        if self.transport != "stdio" and not self.url:
            raise ValueError(f"{self.transport} MCP server {self.name!r} needs a url")
        # Each string goes to the agent in UTF-8 JSON, and a command, its arguments and its
        # environment into an exec: a lone surrogate (JSON's "\ud800") or a NUL cannot.
        strings = [("name", self.name), ("command", self.command or ""), ("url", self.url or "")]
        strings += [(f"args[{i}]", arg) for i, arg in enumerate(self.args)]
        for key, pairs in (("env", self.env), ("headers", self.headers)):
            strings += [(f"{key} {pair.name!r}", pair.name + pair.value) for pair in pairs]
        for what, text in strings:
            if "\0" in text or not is_text(text):
                raise ValueError(
                    f"MCP server {self.name!r}: {what} holds a NUL or a lone surrogate"
                )

    @property
    def env_dict(self) -> dict[str, str]:
        return {pair.name: pair.value for pair in self.env}

    @property
    def headers_dict(self) -> dict[str, str]:
        return {pair.name: pair.value for pair in self.headers}


def mcp_server_to_acp(server: McpServer) -> dict[str, Any]:
    """The ACP ``McpServer`` object (valid against schema v1: every required field present)."""
    if server.transport == "stdio":
        return {
            "name": server.name,
            "command": server.command,
            "args": list(server.args),
            "env": [{"name": p.name, "value": p.value} for p in server.env],
        }
    return {
        "type": server.transport,
        "name": server.name,
        "url": server.url,
        "headers": [{"name": p.name, "value": p.value} for p in server.headers],
    }


_STDIO_KEYS: Final = frozenset({"type", "name", "command", "args", "env", "_meta"})
_REMOTE_KEYS: Final = frozenset({"type", "name", "url", "headers", "_meta"})


def mcp_server_from_acp(raw: Any) -> McpServer:
    """One server from its ACP form (a TOML table, a gateway payload, an ACP client's
    ``mcpServers`` entry); ``ValueError`` says what is wrong. ``type: "stdio"`` is accepted
    too (some clients send it); ``args``, ``env`` and ``headers`` may be omitted."""
    if not isinstance(raw, Mapping):
        raise ValueError("an MCP server must be an object (a table)")
    kind = raw.get("type", "stdio")
    if kind not in MCP_TRANSPORTS:
        raise ValueError(f"'type' must be one of {', '.join(MCP_TRANSPORTS)}, not {kind!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("'name' must be a non-empty string")
    where = f"MCP server {name!r}"
    allowed = _STDIO_KEYS if kind == "stdio" else _REMOTE_KEYS
    unknown = set(raw) - allowed
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} for a {kind} server"
            f" (allowed: {', '.join(sorted(allowed - {'_meta'}))})"
        )
    if kind == "stdio":
        command = raw.get("command")
        if not isinstance(command, str) or not command:
            raise ValueError(f"{where}: 'command' must be a non-empty string (the program)")
        args = raw.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"{where}: 'args' must be a list of strings")
        env = _name_values(raw.get("env", []), f"{where}: 'env'")
        return McpServer(name=name, command=command, args=args, env=env)
    url = raw.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}: 'url' must be an http:// or https:// URL")
    headers = _name_values(raw.get("headers", []), f"{where}: 'headers'")
    return McpServer(name=name, transport=kind, url=url, headers=headers)


def mcp_servers_from_acp(raw: Any) -> tuple[McpServer, ...]:
    """A list of servers; a name may appear once. Errors start ``[i]: `` (the entry's index),
    or name the list itself."""
    if not isinstance(raw, list | tuple):
        raise ValueError(": must be a list of MCP server objects")
    servers = []
    for index, entry in enumerate(raw):
        try:
            servers.append(mcp_server_from_acp(entry))
        except ValueError as exc:
            raise ValueError(f"[{index}]: {exc}") from None
    seen: set[str] = set()
    for index, server in enumerate(servers):
        if server.name in seen:
            raise ValueError(f"[{index}]: a second MCP server named {server.name!r}")
        seen.add(server.name)
    return tuple(servers)


def _name_values(raw: Any, where: str) -> list[NameValue]:
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a list of {{name, value}} objects")
    pairs = []
    for item in raw:
        if (
            not isinstance(item, Mapping)
            or not isinstance(item.get("name"), str)
            or not item["name"]
            or not isinstance(item.get("value"), str)
            or set(item) - {"name", "value", "_meta"}
        ):
            raise ValueError(f"{where} must be a list of {{name, value}} objects (strings)")
        pairs.append(NameValue(item["name"], item["value"]))
    return pairs


def merge_mcp_servers(
    base: Sequence[McpServer], extra: Sequence[McpServer]
) -> tuple[McpServer, ...]:
    """The agent's own servers and a session's: a session's server replaces the agent's of the
    same name, in place; the others follow in their order."""
    extra_by_name = {server.name: server for server in extra}
    merged = [extra_by_name.pop(server.name, server) for server in base]
    merged.extend(extra_by_name.values())  # the last of a name given twice
    return tuple(merged)


def check_transports(
    servers: Sequence[McpServer], allowed: Iterable[str], agent: str, why: str = ""
) -> None:
    """Raise :class:`McpUnsupported` for the first server whose kind ``agent`` cannot take."""
    allowed = frozenset(allowed)
    for server in servers:
        if server.transport not in allowed:
            takes = ", ".join(t for t in MCP_TRANSPORTS if t in allowed) or "none"
            raise McpUnsupported(
                f"{agent} cannot take {server.transport} MCP server {server.name!r}"
                f" (it takes: {takes}){f'; {why}' if why else ''}"
            )
