"""Remote hosts in the configuration: ``[hosts.NAME]`` tables, beside ``[agents.NAME]``.

```toml
[hosts.build1]
transport = ["ssh", "-p", "2222", "-i", "~/.ssh/agents", "agents@build1", "--"]
max_sessions = 40
command = ["agent-supervisor"]      # how agent-supervisor is run there (the default)
detach_s = 300                      # the node stops its sessions after this long undriven
request_timeout_s = 30              # an answer to a request, on top of what the agent may take
history = 10000                     # events a session keeps that this front has not seen
state_dir = "/srv/agents/state"     # the node's state there (default ~/.local/state/...)

[agents.claude]
protocol = "claude"
command = ["claude", "-p", "--output-format", "stream-json", "--input-format", "stream-json"]
hosts = ["build1"]                  # where this agent may run; absent = this machine
```
``transport`` is an argument list that runs a command on the host: what follows it is the
command. Errors name the file and the key, as for agents.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import Any, Final

from attrs import field, frozen

from supervisor.config import AgentSpec, ConfigError, read_toml

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_DETACH_S",
    "DEFAULT_NODE_COMMAND",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "HostSpec",
    "local_node",
    "check_agent_hosts",
    "load_hosts",
    "parse_hosts",
]

#: A node nobody has driven (no bridge connected) for this long stops every session it owns,
#: whole trees, and exits: nothing is left running on a host nobody controls. Five minutes
#: outlasts what a link usually loses (a Wi-Fi hand-over, a VPN reconnecting, a laptop lid
#: closed for a coffee: seconds to a few minutes); meanwhile a turn goes on and its events wait
#: in the node's history (10,000 per session) for the front to resubscribe. Longer, and a
#: front that is gone for good leaves agents spending tokens for longer; it is the same five
#: minutes the stall watchdog gives a silent model (``DEFAULT_STALL_S``).
DEFAULT_DETACH_S: Final = 300.0
#: From starting the transport to a node that answers: an SSH handshake (~0.2 s on a LAN, a
#: few seconds over a slow VPN), the bridge's start (~0.05 s: the standard library only) and,
#: the first time, the node's own start (~0.5-1 s). 30 s is what OpenSSH users commonly set
#: ConnectTimeout to.
DEFAULT_CONNECT_TIMEOUT_S: Final = 30.0
#: From a request to its node's answer. A node answers at once (its gateway serves each
#: request as it comes; a session's actor answers a call between two pieces of work, in
#: milliseconds); what waits for the agent gets the agent's own bounds on top of this (a
#: start its ``start_timeout_s``; a cancel, a steer that interrupts and a stop the turn's grace,
#: the kill and the restart: ``RemoteSession``). So this only has to outlast a slow network
#: and a busy host: 30 s, as ``connect_timeout_s``, is a hundred times a slow VPN's round trip.
DEFAULT_REQUEST_TIMEOUT_S: Final = 30.0
#: How agent-supervisor is run on the host: the console script of a ``pip install``.
DEFAULT_NODE_COMMAND: Final = ("agent-supervisor",)
#: events of history per node session (``supervisor.runtime.session.DEFAULT_HISTORY``, not imported:
#: the node's CLI reads it before it loads the runtime)
DEFAULT_HISTORY: Final = 10_000


def _to_args(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@frozen(kw_only=True)
class HostSpec:
    """How to reach one host, and how much it may hold."""

    name: str
    #: argv prefix that runs a command on the host (``ssh ... user@host --``)
    transport: tuple[str, ...] = field(converter=_to_args)
    #: sessions this front may place there (None: no limit)
    max_sessions: int | None = None
    #: agent-supervisor on the host
    command: tuple[str, ...] = field(default=DEFAULT_NODE_COMMAND, converter=_to_args)
    detach_s: float = DEFAULT_DETACH_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    #: a request's answer from the node, beyond what its agent may take (see the default)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    #: the node's state directory on the host (its files go in ``STATE_DIR/node``; None: its
    #: user's ``~/.local/state/agent-supervisor``); two directories: two nodes of one account
    state_dir: str | None = None
    #: events each of the node's sessions keeps that the front has not acknowledged; with that
    #: many the node holds the agent back (None: the node's default; the first bridge's wins)
    history: int | None = None

    def bridge_argv(self, instance: str | None = None) -> list[str]:
        """The local command that opens a bridge to this host's node (starting it if need be);
        ``instance``: to that node while it lives (the front has sessions there), else to the
        host's current one.

        OpenSSH joins the words after the destination into one shell command line on the
        host, so for ``ssh`` they are quoted; other transports (``docker exec``, ``kubectl
        exec``) run an argv as it is."""
        remote = [*self.command, "node", "--bridge", "--detach", f"{self.detach_s:g}"]
        if self.state_dir is not None:
            remote += ["--state-dir", self.state_dir]
        if self.history is not None:
            remote += ["--history", str(self.history)]
        if instance is not None:
            remote += ["--instance", instance]
        if self.speaks_shell:
            import shlex

            remote = [shlex.quote(word) for word in remote]
        return [*self.local_transport(), *remote]

    def local_transport(self) -> list[str]:
        return [
            os.path.expanduser(word) if word.startswith("~/") else word for word in self.transport
        ]

    @property
    def speaks_shell(self) -> bool:
        return bool(self.transport) and os.path.basename(self.transport[0]) == "ssh"


def local_node(
    name: str,
    *,
    state_dir: str | os.PathLike[str] | None,
    max_sessions: int | None = None,
    detach_s: float | None = None,
) -> HostSpec:
    """A node on this machine, reached with no transport at all (the bridge is run directly,
    by this Python): ``serve --local-node`` runs its local sessions there, so they outlive a
    restart of ``serve``. ``detach_s``: how long its node keeps them once no ``serve``
    drives it (``[gateway] local_node_detach_s``; None: the default)."""
    import sys

    return HostSpec(
        name=name,
        transport=(),
        command=(sys.executable, "-m", "supervisor"),
        max_sessions=max_sessions,
        state_dir=os.fspath(state_dir) if state_dir is not None else None,
        detach_s=detach_s if detach_s is not None else DEFAULT_DETACH_S,
    )


def load_hosts(path: str | os.PathLike[str]) -> dict[str, HostSpec]:
    """Every ``[hosts.NAME]`` table of a TOML file (none: an empty dict)."""
    document, where = read_toml(path)
    return parse_hosts(document, where)


_FIELDS = {
    "transport",
    "max_sessions",
    "command",
    "detach_s",
    "connect_timeout_s",
    "request_timeout_s",
    "state_dir",
    "history",
}


def parse_hosts(document: Mapping[str, Any], where: str = "<config>") -> dict[str, HostSpec]:
    tables = document.get("hosts", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{where}: 'hosts' must be a table of [hosts.NAME] tables")
    return {name: _parse_host(name, table, where) for name, table in tables.items()}


def _argv(value: Any, at: str, key: str) -> list[str]:
    if isinstance(value, str):
        raise ConfigError(
            f"{at}: '{key}' must be a list of arguments, not a shell string"
            f" (e.g. {value.split()!r})"
        )
    if not isinstance(value, list) or not value or not all(isinstance(w, str) for w in value):
        raise ConfigError(f"{at}: '{key}' must be a non-empty list of strings")
    return value


def _seconds(value: Any, at: str, key: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{at}: '{key}' must be a number of seconds > 0, not {value!r}")
    return float(value)


def _parse_host(name: str, table: Any, where: str) -> HostSpec:
    at = f"{where}: [hosts.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{at} must be a table")
    unknown = set(table) - _FIELDS
    if unknown:
        raise ConfigError(
            f"{at}: unknown key(s) {', '.join(sorted(unknown))}"
            f" (allowed: {', '.join(sorted(_FIELDS))})"
        )
    if "transport" not in table:
        raise ConfigError(
            f"{at}: 'transport' is required: the argv that runs a command on the host,"
            ' e.g. ["ssh", "user@host", "--"]'
        )
    transport = _argv(table["transport"], at, "transport")
    command = _argv(table.get("command", list(DEFAULT_NODE_COMMAND)), at, "command")
    max_sessions = table.get("max_sessions")
    if max_sessions is not None and (
        isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1
    ):
        raise ConfigError(f"{at}: 'max_sessions' must be a whole number >= 1, not {max_sessions!r}")
    history = table.get("history")
    if history is not None and (
        isinstance(history, bool) or not isinstance(history, int) or history < 1
    ):
        raise ConfigError(f"{at}: 'history' must be a whole number >= 1, not {history!r}")
    state_dir = table.get("state_dir")
    if state_dir is not None and (not isinstance(state_dir, str) or not state_dir):
        raise ConfigError(f"{at}: 'state_dir' must be a path on the host")
    return HostSpec(
        name=name,
        state_dir=state_dir,
        history=history,
        transport=transport,
        max_sessions=max_sessions,
        command=command,
        detach_s=_seconds(table.get("detach_s", DEFAULT_DETACH_S), at, "detach_s"),
        connect_timeout_s=_seconds(
            table.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S), at, "connect_timeout_s"
        ),
        request_timeout_s=_seconds(
            table.get("request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S), at, "request_timeout_s"
        ),
    )


def check_agent_hosts(agents: Mapping[str, AgentSpec], hosts: Mapping[str, HostSpec]) -> None:
    """Every host an agent names is configured."""
    for agent in agents.values():
        missing = [h for h in agent.hosts if h not in hosts]
        if missing:
            known = ", ".join(sorted(hosts)) or "none"
            raise ConfigError(
                f"agent {agent.name!r} names unknown host(s) {', '.join(missing)}"
                f" (configured: {known})"
            )
