"""Agent configuration: ``[agents.NAME]`` tables in TOML, plus the built-in demo agent.

```toml
[agents.codex]
protocol = "codex"
command = ["codex", "app-server"]
grace_s = 3.0
env = { CODEX_HOME = "~/.codex" }
```
``command`` is an argument list, never a shell string. Errors name the file and the key.

MCP servers the agent gets in every session, in ACP's ``McpServer`` shape
(``protocols/mcp.py``), passed the way its protocol takes them:
```toml
[[agents.codex.mcp_servers]]
name = "files"
command = "/usr/local/bin/mcp-files"
args = ["--root", "/srv"]
env = [{ name = "LOG", value = "debug" }]

[[agents.codex.mcp_servers]]
type = "http"
name = "docs"
url = "https://mcp.example.com/mcp"
headers = [{ name = "Authorization", value = "Bearer ..." }]
```

The ``[gateway]`` table holds the settings of ``agent-supervisor serve`` (:class:`GatewaySettings`:
``max_sessions``, ``max_connections``, ``request_timeout_s``, ``local_node``,
``local_node_detach_s``); ``load_config`` reads
both.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
from attrs import field, frozen

from protocols import PROTOCOLS
from protocols.mcp import McpServer, McpUnsupported, mcp_servers_from_acp, merge_mcp_servers
from protocols.terminal import TerminalSettings

__all__ = [
    "DEFAULT_CONTEXT_BYTES",
    "DEFAULT_GRACE_S",
    "DEFAULT_KILL_TIMEOUT_S",
    "DEFAULT_MAX_FAILED_TURNS",
    "DEFAULT_STALL_S",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_TOOL_STALL_S",
    "KNOWN_PROTOCOLS",
    "SESSION_MEMORY_BYTES",
    "AgentSpec",
    "Config",
    "ConfigError",
    "GatewaySettings",
    "builtin_agents",
    "default_max_sessions",
    "load_agents",
    "load_config",
]

#: How long an agent may take to end a turn after the interrupt before its tree is killed.
#: The real agents measured here stop in 5-130 ms (``shared/real-agents.md``: Codex 8-30 ms,
#: Claude ~8 ms ack, OpenCode acp 70-110 ms, Gemini 25-115 ms); 3 s is 20x the slowest, and
#: short enough that a person waiting on a Stop button does not give up.
DEFAULT_GRACE_S = 3.0
#: Between SIGTERM and SIGKILL of the tree. Well-behaved CLIs exit on SIGTERM in well under
#: 100 ms; the SDKs wait 5 s, but by then a person has already waited a whole grace window.
DEFAULT_KILL_TIMEOUT_S = 1.0
#: From spawn to a session that takes prompts. OpenCode's ACP ``initialize`` takes ~2 s here,
#: the Claude SDK allows 60 s for its own; a slower start is a broken install.
DEFAULT_START_TIMEOUT_S = 60.0
#: Turns in a row that may fail (the agent answers, but with an error) before the agent is
#: recycled: restarted, and the session resumed. One failure is the agent's answer; three in a
#: row is an agent stuck in a bad state (opencode 1.18.33 after an early abort failed every
#: prompt from then on until restarted). 0 never recycles.
DEFAULT_MAX_FAILED_TURNS = 3
#: A running turn from which nothing came (no text, thought, tool call, plan or permission
#: request; stderr does not count) for this long is stalled: the watchdog cancels it through
#: the ladder with ``reason: "stalled"``. A live agent is silent this long only while the model
#: has not answered yet, and its first token can take minutes, not seconds: a slow or
#: overloaded provider, a local model being loaded into memory, a reasoning model that thinks
#: without streaming its thoughts, an agent backing off from a rate limit between retries.
#: Five minutes leaves room for all of that, and it is where kandev gives up waiting (it shows
#: a notice then; nobody stops the turn). 0 (or None): never.
DEFAULT_STALL_S = 300.0
#: The same limit while a tool call the agent reported is in progress (started, not finished):
#: None, never. Builds, test suites and dev servers run for as long as they run, silently;
#: only the user knows how long is too long for theirs.
DEFAULT_TOOL_STALL_S: float | None = None
#: How long a turn's start waits for its session's first snapshot (``design/checkpoints.md``).
#: A first snapshot hashes every file: 10,000 files take 2-6 s here, 100,000 about 30 s (both
#: in ``bench/results.md``), a directory the size of a disk minutes, during which nothing
#: reaches the agent. Past this the turn starts without a checkpoint (said), as a prompt
#: should not wait minutes for a record of it. 0 (or None): as long as it takes.
DEFAULT_FIRST_SNAPSHOT_WAIT_S: float | None = 30.0
#: The conversation so far, given to an agent whose session could not be resumed (a respawn
#: or a restart got a fresh one), at most this many bytes of UTF-8 with its preamble: the
#: newest kept, the oldest left out first. 64 KiB is ~16K tokens, a small share of any coding
#: agent's context window (Claude's and Codex's ~200K tokens, Gemini's 1M), and room for the
#: last dozens of exchanges; a transcript of tool output would crowd the work out of it.
DEFAULT_CONTEXT_BYTES = 64 * 1024

KNOWN_PROTOCOLS = frozenset(PROTOCOLS)

#: Memory one session is assumed to take, for the default of ``serve``'s ``max_sessions``:
#: the demo agent and its shim take ~35 MB, Codex (Rust) ~50-100 MB, the Node agents (Gemini,
#: OpenCode, claude-agent-acp) 150-400 MB, and Claude Code users report up to ~3 GB. 512 MiB a
#: session keeps a host full of typical agents out of swap; set ``max_sessions`` for yours.
SESSION_MEMORY_BYTES = 512 * 1024 * 1024
#: File descriptors one session may hold in the supervisor (three pipes, the lifeline or the
#: cgroup's files, a pidfd, sockets to an HTTP agent), with room to spare.
SESSION_FDS = 16
#: Never fewer sessions than this by default, however small the machine.
MIN_DEFAULT_SESSIONS = 4


class ConfigError(ValueError):
    """A configuration file or entry that cannot be used; the message says where and why."""


def _to_args(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _freeze_env(value: Mapping[str, str]) -> dict[str, str]:
    return dict(value)


def _to_servers(value: Iterable[McpServer]) -> tuple[McpServer, ...]:
    return tuple(value)


@frozen(kw_only=True)
class AgentSpec:
    """How to start one kind of agent."""

    name: str
    protocol: str
    command: tuple[str, ...] = field(converter=_to_args)
    description: str = ""
    grace_s: float = DEFAULT_GRACE_S
    kill_timeout_s: float = DEFAULT_KILL_TIMEOUT_S
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    #: failed turns in a row before the agent is restarted and the session resumed (0: never)
    max_failed_turns: int = DEFAULT_MAX_FAILED_TURNS
    #: seconds a running turn may go without an event from the agent before it is cancelled
    #: (``reason: "stalled"``); None or 0: never
    stall_s: float | None = DEFAULT_STALL_S
    #: the same while a tool call is in progress; None or 0: a running tool is never a stall
    tool_stall_s: float | None = DEFAULT_TOOL_STALL_S
    #: the agent's whole process tree may hold this much memory (resident, MB); above it the
    #: turn is stopped (``reason: "memory_limit"``) and the agent restarted, the session
    #: resumed. None or 0: no limit
    max_memory_mb: float | None = None
    #: each turn's start is snapshotted in the supervisor's own store, its changes told on its
    #: ``turn.ended``, and it can be rewound (``design/checkpoints.md``); local sessions of a
    #: supervisor with a state directory
    checkpoints: bool = True
    #: how long a turn's start waits for the session's first snapshot (a directory of 100,000
    #: files takes ~30 s here, a whole disk's worth minutes): past it the turn starts without
    #: a checkpoint and says so; the turns after it have theirs once it is done. None: as long
    #: as it takes
    first_snapshot_wait_s: float | None = DEFAULT_FIRST_SNAPSHOT_WAIT_S
    #: after a rewind, the next prompt the agent gets starts with a line saying the files were
    #: put back to an earlier state, and which (its picture of them is the one undone)
    tell_rewind: bool = True
    #: each session runs in a git worktree of its directory's repository, on a branch of its
    #: own (``design/worktrees.md``); local sessions of a supervisor with a state directory
    worktree: bool = False
    env: dict[str, str] = field(factory=dict, converter=_freeze_env)
    cwd: str | None = None
    #: sessions of this agent that may run at once (None: only the supervisor's cap applies)
    max_sessions: int | None = None
    #: the ``[hosts.NAME]`` this agent may run on (``supervisor/remote/``); empty: this machine
    hosts: tuple[str, ...] = field(default=(), converter=_to_args)
    #: MCP servers the agent is given in every session (a session may add its own)
    mcp_servers: tuple[McpServer, ...] = field(default=(), converter=_to_servers)
    #: bytes of the conversation so far an agent gets with the next prompt when its session
    #: could not be resumed (``design/store.md``, "Context for an agent that cannot resume");
    #: 0: none
    context_bytes: int = DEFAULT_CONTEXT_BYTES
    #: ``protocol = "terminal"``: its screen's settings (None: the defaults)
    terminal: TerminalSettings | None = None
    #: the command that starts the agent again where it left off, after a kill or an exit
    #: (``claude --continue``); empty: ``command`` again. Terminal agents only: the others
    #: resume by the session id their protocol gives.
    resume_command: tuple[str, ...] = field(default=(), converter=_to_args)

    @classmethod
    def from_config(cls, name: str, path: str | os.PathLike[str] | None = None) -> AgentSpec:
        """The agent ``name`` from ``path`` (or the built-ins when no file is given)."""
        agents = load_agents(path) if path is not None else builtin_agents()
        try:
            return agents[name]
        except KeyError:
            known = ", ".join(sorted(agents)) or "none"
            where = f" in {path}" if path is not None else ""
            raise ConfigError(f"no agent named {name!r}{where} (known: {known})") from None

    def with_args(self, *args: str) -> AgentSpec:
        """The same agent with extra command-line arguments (the demo's fault switches)."""
        return attrs.evolve(self, command=(*self.command, *args))

    def with_options(self, **changes: Any) -> AgentSpec:
        """The same agent with other settings, e.g. ``grace_s=0.5``."""
        return attrs.evolve(self, **changes)

    def with_mcp_servers(self, extra: Iterable[McpServer]) -> AgentSpec:
        """The same agent with a session's MCP servers on top of its own: one of the same name
        replaces the agent's. Raises :class:`~protocols.mcp.McpUnsupported` for a server its
        protocol cannot take."""
        merged = merge_mcp_servers(self.mcp_servers, tuple(extra))
        PROTOCOLS[self.protocol].check_mcp_servers(merged)
        return attrs.evolve(self, mcp_servers=merged)

    def process_env(self) -> dict[str, str]:
        """The environment to start the agent with: ours, plus the spec's (``~`` expanded)."""
        env = dict(os.environ)
        env.update({k: os.path.expanduser(v) for k, v in self.env.items()})
        return env


def builtin_agents() -> dict[str, AgentSpec]:
    """Agents that work with no configuration file, no keys and no network."""
    demo = (sys.executable, "-m", "supervisor.demo_agent")
    return {
        "demo": AgentSpec(
            name="demo",
            protocol="acp",
            command=demo,
            description="Built-in demo agent (ACP): streams a reply word by word; no keys needed",
        ),
        "demo-stubborn": AgentSpec(
            name="demo-stubborn",
            protocol="acp",
            command=(*demo, "--ignore-cancel", "--words", "200"),
            description="The demo agent ignoring the interrupt: Stop shows the grace window,"
            " the kill, the respawn and the resumed session",
        ),
    }


@frozen(kw_only=True)
class GatewaySettings:
    """The ``[gateway]`` table: what ``serve`` takes beyond its flags (None: the default)."""

    #: sessions that may run at once (default: :func:`default_max_sessions`)
    max_sessions: int | None = None
    #: TCP connections (``GatewayLimits.max_connections``)
    max_connections: int | None = None
    #: for a request's head and body to arrive (``GatewayLimits.request_timeout_s``)
    request_timeout_s: float | None = None
    #: run this machine's sessions in a node here, so they outlive a restart (``--local-node``)
    local_node: bool = False
    #: how long that node keeps its sessions once no ``serve`` drives it (None: the node's
    #: default, ``DEFAULT_DETACH_S``)
    local_node_detach_s: float | None = None


@frozen(kw_only=True)
class StoreSettings:
    """The ``[store]`` table: where ``serve`` keeps its sessions (``design/store.md``)."""

    #: ``sqlite:///PATH``, ``postgresql://...`` or ``none``; None: ``sessions.db`` in the
    #: state directory
    url: str | None = None
    #: stopped sessions last active longer ago than this many days are deleted (None: kept;
    #: ``supervisor/store/retention.py`` says why nothing is deleted unless asked)
    keep_days: float | None = None
    #: the most sessions kept, the least recently active stopped ones deleted past it
    keep_sessions: int | None = None
    #: the most bytes the stored sessions take (``"500 MB"``, ``"2 GiB"``, or a number)
    keep_bytes: int | None = None
    #: what writes the batches: ``"process"`` (a child process of its own) or ``"thread"``
    #: (the store's worker thread: no second process; slower under floods of many sessions)
    writer: str = "process"


@frozen(kw_only=True)
class CheckpointSettings:
    """The ``[checkpoints]`` table: how local sessions' per-turn checkpoints are taken
    (``design/checkpoints.md``)."""

    #: a snapshot is told what changed by an inotify watcher of the directory, rather than
    #: having git look at every file (false: git's full pass each time)
    watch: bool = True


@frozen(kw_only=True)
class Config:
    agents: dict[str, AgentSpec]
    gateway: GatewaySettings = GatewaySettings()
    store: StoreSettings = StoreSettings()
    checkpoints: CheckpointSettings = CheckpointSettings()


def default_max_sessions(memory_bytes: int | None = None, open_files: int | None = None) -> int:
    """``serve``'s default cap on sessions: one per :data:`SESSION_MEMORY_BYTES` of the
    machine's memory (or of our cgroup's ``memory.max``, if lower), and no more than the file
    descriptors we may open allow, but at least :data:`MIN_DEFAULT_SESSIONS`."""
    if memory_bytes is None:
        memory_bytes = _memory_bytes()
    if open_files is None:
        import resource

        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    by_memory = memory_bytes // SESSION_MEMORY_BYTES
    by_files = max(0, open_files - 64) // SESSION_FDS  # 64: the gateway's own, and clients'
    return max(MIN_DEFAULT_SESSIONS, min(by_memory, by_files))


def _memory_bytes() -> int:
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/self/cgroup") as cgroup:
            own = next((line[3:].strip() for line in cgroup if line.startswith("0::")), None)
        if own is not None:
            limit = Path("/sys/fs/cgroup", own.lstrip("/"), "memory.max").read_text().strip()
            if limit.isdigit():
                total = min(total, int(limit))
    except OSError:
        pass
    return total


def load_agents(path: str | os.PathLike[str]) -> dict[str, AgentSpec]:
    """The built-in agents overlaid with every ``[agents.NAME]`` table of a TOML file."""
    return load_config(path).agents


#: The tables a configuration file may have: each is read by what it configures.
TABLES: Final = {
    "agents": "[agents.NAME]",
    "gateway": "[gateway]",
    "store": "[store]",
    "checkpoints": "[checkpoints]",
    "hosts": "[hosts.NAME]",
}


def load_config(path: str | os.PathLike[str]) -> Config:
    """The agents (built-ins overlaid with ``[agents.NAME]``) and ``[gateway]`` of a file."""
    document, where = read_toml(path)
    unknown = sorted(set(document) - set(TABLES))
    if unknown:  # a misspelt table would be left out without a word
        raise ConfigError(
            f"{where}: unknown table(s) {', '.join(f'[{name}]' for name in unknown)} (allowed:"
            f" {', '.join(TABLES.values())})"
        )
    agents = {**builtin_agents(), **parse_agents(document, where)}
    return Config(
        agents=agents,
        gateway=parse_gateway(document, where),
        store=parse_store(document, where),
        checkpoints=parse_checkpoints(document, where),
    )


def parse_checkpoints(document: Mapping[str, Any], where: str = "<config>") -> CheckpointSettings:
    table = document.get("checkpoints", {})
    at = f"{where}: [checkpoints]"
    if not isinstance(table, dict):
        raise ConfigError(f"{at} must be a table")
    unknown = set(table) - {"watch"}
    if unknown:
        raise ConfigError(f"{at}: unknown key(s) {', '.join(sorted(unknown))} (allowed: watch)")
    watch = table.get("watch", True)
    if not isinstance(watch, bool):
        raise ConfigError(f"{at}: 'watch' must be true or false")
    return CheckpointSettings(watch=watch)


def parse_store(document: Mapping[str, Any], where: str = "<config>") -> StoreSettings:
    table = document.get("store", {})
    at = f"{where}: [store]"
    if not isinstance(table, dict):
        raise ConfigError(f"{at} must be a table")
    allowed = ("url", "keep_days", "keep_sessions", "keep_bytes", "writer")
    unknown = set(table) - set(allowed)
    if unknown:
        raise ConfigError(
            f"{at}: unknown key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(allowed)})"
        )
    url = table.get("url")
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ConfigError(f"{at}: 'url' must be sqlite:///PATH, postgresql://... or \"none\"")
    days = table.get("keep_days")
    if days is not None and (
        isinstance(days, bool) or not isinstance(days, int | float) or not days > 0
    ):
        raise ConfigError(f"{at}: 'keep_days' must be a number of days above 0")
    count = table.get("keep_sessions")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ConfigError(f"{at}: 'keep_sessions' must be a whole number >= 1")
    size = table.get("keep_bytes")
    keep_bytes = None
    if size is not None:
        from supervisor.store.retention import parse_bytes

        keep_bytes = parse_bytes(size)
        if keep_bytes is None:
            raise ConfigError(
                f"{at}: 'keep_bytes' must be a size above 0: a number of bytes, or \"500 MB\","
                ' "2 GiB"'
            )
    writer = table.get("writer", "process")
    if writer not in ("process", "thread"):
        raise ConfigError(f'{at}: \'writer\' must be "process" (the default) or "thread"')
    return StoreSettings(
        url=url,
        keep_days=None if days is None else float(days),
        keep_sessions=count,
        keep_bytes=keep_bytes,
        writer=writer,
    )


def read_toml(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    """A configuration file's document and the name errors give it; every way it can be
    unreadable is a :class:`ConfigError` that says which."""
    import tomllib  # only with a file: ~3 ms of serve's start otherwise

    source = Path(path)
    try:
        with source.open("rb") as file:
            return tomllib.load(file), str(source)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such configuration file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def parse_gateway(document: Mapping[str, Any], where: str = "<config>") -> GatewaySettings:
    table = document.get("gateway", {})
    at = f"{where}: [gateway]"
    if not isinstance(table, dict):
        raise ConfigError(f"{at} must be a table")
    allowed = {
        "max_sessions",
        "max_connections",
        "request_timeout_s",
        "local_node",
        "local_node_detach_s",
    }
    unknown = set(table) - allowed
    if unknown:
        raise ConfigError(
            f"{at}: unknown key(s) {', '.join(sorted(unknown))}"
            f" (allowed: {', '.join(sorted(allowed))})"
        )
    timeout = table.get("request_timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigError(f"{at}: 'request_timeout_s' must be a number of seconds > 0")
    detach = table.get("local_node_detach_s")
    if detach is not None and (
        isinstance(detach, bool)
        or not isinstance(detach, int | float)
        or not math.isfinite(detach)
        or detach <= 0
    ):
        raise ConfigError(f"{at}: 'local_node_detach_s' must be a number of seconds > 0")
    local_node = table.get("local_node", False)
    if not isinstance(local_node, bool):
        raise ConfigError(f"{at}: 'local_node' must be true or false, not {local_node!r}")
    return GatewaySettings(
        local_node=local_node,
        local_node_detach_s=float(detach) if detach is not None else None,
        max_sessions=_count(table, "max_sessions", at),
        max_connections=_count(table, "max_connections", at),
        request_timeout_s=float(timeout) if timeout is not None else None,
    )


def _count(table: Mapping[str, Any], key: str, at: str) -> int | None:
    value = table.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{at}: '{key}' must be a whole number >= 1, not {value!r}")
    return value


def parse_agents(document: Mapping[str, Any], where: str = "<config>") -> dict[str, AgentSpec]:
    tables = document.get("agents", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{where}: 'agents' must be a table of [agents.NAME] tables")
    return {name: _parse_agent(name, table, where) for name, table in tables.items()}


_FIELDS = {
    "protocol",
    "command",
    "description",
    "grace_s",
    "kill_timeout_s",
    "start_timeout_s",
    "max_failed_turns",
    "stall_s",
    "tool_stall_s",
    "max_memory_mb",
    "checkpoints",
    "first_snapshot_wait_s",
    "tell_rewind",
    "worktree",
    "env",
    "cwd",
    "max_sessions",
    "hosts",
    "mcp_servers",
    "context_bytes",
}
#: The keys of a terminal agent's table (``protocol = "terminal"``; ``design/terminal.md``).
_TERMINAL_FIELDS = {
    "prompt_pattern",
    "idle_s",
    "interrupt",
    "submit",
    "submit_delay_s",
    "start_pattern",
    "resume_pattern",
    "cols",
    "rows",
    "resume_command",
}


def _parse_agent(name: str, table: Any, where: str) -> AgentSpec:
    at = f"{where}: [agents.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{at} must be a table")
    allowed = _FIELDS | _TERMINAL_FIELDS if table.get("protocol") == "terminal" else _FIELDS
    unknown = set(table) - allowed
    if unknown:
        only = " (those of protocol terminal only)" if unknown <= _TERMINAL_FIELDS else ""
        raise ConfigError(
            f"{at}: unknown key(s) {', '.join(sorted(unknown))}{only}"
            f" (allowed: {', '.join(sorted(allowed))})"
        )
    protocol = table.get("protocol")
    if not isinstance(protocol, str):
        raise ConfigError(f"{at}: 'protocol' is required (one of {_known()})")
    if protocol not in KNOWN_PROTOCOLS:
        raise ConfigError(f"{at}: unknown protocol {protocol!r} (one of {_known()})")
    command = table.get("command")
    if isinstance(command, str):
        raise ConfigError(
            f"{at}: 'command' must be a list of arguments, not a shell string"
            f" (e.g. {command.split()!r})"
        )
    if not isinstance(command, list) or not command or not all(isinstance(p, str) for p in command):
        raise ConfigError(f"{at}: 'command' must be a non-empty list of strings")
    if not command[0]:
        # An empty argument is an argument (``["claude", "--setting-sources", ""]``); an empty
        # program name is not.
        raise ConfigError(f"{at}: 'command' must be a non-empty list of strings, naming a program")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError(f"{at}: 'env' must be a table of string values")
    numbers = {}
    for key, default in (
        ("grace_s", DEFAULT_GRACE_S),
        ("kill_timeout_s", DEFAULT_KILL_TIMEOUT_S),
        ("start_timeout_s", DEFAULT_START_TIMEOUT_S),
    ):
        value = table.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ConfigError(f"{at}: '{key}' must be a number of seconds >= 0, not {value!r}")
        numbers[key] = float(value)
    stall = {}
    for key, default_limit in (
        ("stall_s", DEFAULT_STALL_S),
        ("tool_stall_s", DEFAULT_TOOL_STALL_S),
        ("first_snapshot_wait_s", DEFAULT_FIRST_SNAPSHOT_WAIT_S),
    ):
        limit = table.get(key, default_limit)
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit < 0
        ):
            raise ConfigError(
                f"{at}: '{key}' must be a number of seconds >= 0 (0: never), not {limit!r}"
            )
        stall[key] = float(limit) if limit else None  # TOML has no null: 0 is "never"
    max_memory = table.get("max_memory_mb")
    if max_memory is not None and (
        isinstance(max_memory, bool)
        or not isinstance(max_memory, int | float)
        or not math.isfinite(max_memory)
        or max_memory < 0
    ):
        raise ConfigError(
            f"{at}: 'max_memory_mb' must be a number of megabytes >= 0 (0: no limit),"
            f" not {max_memory!r}"
        )
    max_failed = table.get("max_failed_turns", DEFAULT_MAX_FAILED_TURNS)
    if isinstance(max_failed, bool) or not isinstance(max_failed, int) or max_failed < 0:
        raise ConfigError(
            f"{at}: 'max_failed_turns' must be a whole number >= 0 (0: never recycle),"
            f" not {max_failed!r}"
        )
    context_bytes = table.get("context_bytes", DEFAULT_CONTEXT_BYTES)
    if isinstance(context_bytes, bool) or not isinstance(context_bytes, int) or context_bytes < 0:
        raise ConfigError(
            f"{at}: 'context_bytes' must be a whole number of bytes >= 0 (0: none),"
            f" not {context_bytes!r}"
        )
    description = table.get("description", "")
    cwd = table.get("cwd")
    if not isinstance(description, str):
        raise ConfigError(f"{at}: 'description' must be a string")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{at}: 'cwd' must be a string")
    hosts = table.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise ConfigError(f"{at}: 'hosts' must be a list of [hosts.NAME] names")
    mcp_servers = _parse_mcp_servers(protocol, table.get("mcp_servers", []), at)
    terminal = _parse_terminal(table, at) if protocol == "terminal" else None
    resume_command = table.get("resume_command", [])
    if not isinstance(resume_command, list) or not all(isinstance(p, str) for p in resume_command):
        raise ConfigError(f"{at}: 'resume_command' must be a list of strings")
    if resume_command and not resume_command[0]:
        raise ConfigError(f"{at}: 'resume_command' must name a program first")
    checkpoints = table.get("checkpoints", True)
    if not isinstance(checkpoints, bool):
        raise ConfigError(f"{at}: 'checkpoints' must be true or false")
    tell_rewind = table.get("tell_rewind", True)
    if not isinstance(tell_rewind, bool):
        raise ConfigError(f"{at}: 'tell_rewind' must be true or false")
    worktree = table.get("worktree", False)
    if not isinstance(worktree, bool):
        raise ConfigError(f"{at}: 'worktree' must be true or false")
    return AgentSpec(
        name=name,
        protocol=protocol,
        command=command,
        description=description,
        grace_s=numbers["grace_s"],
        kill_timeout_s=numbers["kill_timeout_s"],
        start_timeout_s=numbers["start_timeout_s"],
        max_failed_turns=max_failed,
        stall_s=stall["stall_s"],
        tool_stall_s=stall["tool_stall_s"],
        max_memory_mb=float(max_memory) if max_memory else None,
        checkpoints=checkpoints,
        first_snapshot_wait_s=stall["first_snapshot_wait_s"],
        tell_rewind=tell_rewind,
        worktree=worktree,
        env=env,
        cwd=cwd,
        max_sessions=_count(table, "max_sessions", at),
        hosts=hosts,
        mcp_servers=mcp_servers,
        context_bytes=context_bytes,
        terminal=terminal,
        resume_command=resume_command,
    )


def _parse_terminal(table: Mapping[str, Any], at: str) -> TerminalSettings:
    options = {key: table[key] for key in _TERMINAL_FIELDS - {"resume_command"} if key in table}
    for key in ("prompt_pattern", "start_pattern", "resume_pattern", "submit"):
        if key in options and not isinstance(options[key], str):
            raise ConfigError(f"{at}: '{key}' must be a string")
    interrupt = options.get("interrupt")
    if interrupt is not None and not isinstance(interrupt, list):
        raise ConfigError(f"{at}: 'interrupt' must be a list of strings (keys)")
    for key in ("idle_s", "submit_delay_s"):
        seconds = options.get(key)
        if seconds is not None and (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
        ):
            raise ConfigError(f"{at}: '{key}' must be a number of seconds, not {seconds!r}")
    settings = TerminalSettings(**options)
    try:
        settings.check()
    except ValueError as exc:
        raise ConfigError(f"{at}: {exc}") from None
    return settings


def _parse_mcp_servers(protocol: str, raw: Any, at: str) -> tuple[McpServer, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{at}: 'mcp_servers' must be a list of [[...mcp_servers]] tables")
    try:
        servers = mcp_servers_from_acp(raw)
    except ValueError as exc:
        raise ConfigError(f"{at}: mcp_servers{exc}") from None  # "[i]: ..." names the entry
    if servers:
        try:
            PROTOCOLS[protocol].check_mcp_servers(servers)
        except McpUnsupported as exc:
            raise ConfigError(f"{at}: {exc}") from None
    return servers


def _known() -> str:
    return ", ".join(sorted(KNOWN_PROTOCOLS))
