"""Tests for supervisor.config: [agents.NAME] tables in TOML, the built-in demo, error messages.

Tier 1: plain pytest; the only I/O is writing small TOML files to ``tmp_path``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from supervisor.config import (
    DEFAULT_GRACE_S,
    DEFAULT_KILL_TIMEOUT_S,
    DEFAULT_STALL_S,
    DEFAULT_START_TIMEOUT_S,
    AgentSpec,
    ConfigError,
    GatewaySettings,
    builtin_agents,
    default_max_sessions,
    load_agents,
    load_config,
    parse_agents,
)

VALID = """
[agents.codex]
protocol = "acp"
command = ["codex", "app-server"]
description = "Codex"
grace_s = 2
kill_timeout_s = 0.5
env = { CODEX_HOME = "~/.codex", PLAIN = "x" }
cwd = "/srv/work"

[agents.minimal]
protocol = "acp"
command = ["agent"]
"""


def write(tmp_path: Path, text: str, name: str = "agents.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(tmp_path: Path, text: str) -> tuple[str, Path]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_agents(path)
    return str(info.value), path


# --- A valid file ----------------------------------------------------------------------


def test_valid_file(tmp_path: Path) -> None:
    agents = load_agents(write(tmp_path, VALID))
    assert set(agents) == {"codex", "minimal", *builtin_agents()}
    codex = agents["codex"]
    assert codex == AgentSpec(
        name="codex",
        protocol="acp",
        command=("codex", "app-server"),
        description="Codex",
        grace_s=2.0,
        kill_timeout_s=0.5,
        start_timeout_s=DEFAULT_START_TIMEOUT_S,
        env={"CODEX_HOME": "~/.codex", "PLAIN": "x"},
        cwd="/srv/work",
    )
    assert isinstance(codex.command, tuple)
    assert type(codex.grace_s) is float, "an integer grace_s is accepted and stored as float"


def test_defaults(tmp_path: Path) -> None:
    minimal = load_agents(write(tmp_path, VALID))["minimal"]
    assert minimal.command == ("agent",)
    assert minimal.description == ""
    assert minimal.grace_s == DEFAULT_GRACE_S
    assert minimal.kill_timeout_s == DEFAULT_KILL_TIMEOUT_S
    assert minimal.start_timeout_s == DEFAULT_START_TIMEOUT_S
    assert minimal.env == {}
    assert minimal.cwd is None
    assert minimal.tell_rewind is True
    assert minimal.worktree is False


def test_worktree_gives_the_agents_sessions_one(tmp_path: Path) -> None:
    text = '[agents.a]\nprotocol = "acp"\ncommand = ["a"]\nworktree = true\n'
    assert load_agents(write(tmp_path, text))["a"].worktree is True


def test_zero_seconds_is_allowed(tmp_path: Path) -> None:
    text = '[agents.a]\nprotocol = "acp"\ncommand = ["a"]\ngrace_s = 0\nkill_timeout_s = 0.0\n'
    agent = load_agents(write(tmp_path, text))["a"]
    assert (agent.grace_s, agent.kill_timeout_s) == (0.0, 0.0)


def test_process_env_expands_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SUPERVISOR_TEST_INHERITED", "yes")
    monkeypatch.setenv("PLAIN", "overridden by the spec")
    monkeypatch.delenv("CODEX_HOME", raising=False)
    codex = load_agents(write(tmp_path, VALID))["codex"]
    env = codex.process_env()
    assert env["CODEX_HOME"] == str(tmp_path / "home" / ".codex")
    assert env["PLAIN"] == "x"
    assert env["SUPERVISOR_TEST_INHERITED"] == "yes"
    # the spec itself keeps what the file says, and our own environment is untouched
    assert codex.env["CODEX_HOME"] == "~/.codex"
    assert "CODEX_HOME" not in os.environ
    assert os.environ["PLAIN"] == "overridden by the spec"


def test_empty_file_has_only_the_demo(tmp_path: Path) -> None:
    assert load_agents(write(tmp_path, "")) == builtin_agents()
    assert load_agents(write(tmp_path, "[agents]\n")) == builtin_agents()


def test_demo_is_built_in() -> None:
    demo = builtin_agents()["demo"]
    assert demo.name == "demo"
    assert demo.protocol == "acp"
    assert demo.command == (sys.executable, "-m", "supervisor.demo_agent")
    assert demo.description


def test_demo_can_be_overridden(tmp_path: Path) -> None:
    text = '[agents.demo]\nprotocol = "acp"\ncommand = ["my-demo", "--fast"]\ngrace_s = 0.25\n'
    agents = load_agents(write(tmp_path, text))
    assert set(agents) == set(builtin_agents())
    assert agents["demo"].command == ("my-demo", "--fast")
    assert agents["demo"].grace_s == 0.25
    assert builtin_agents()["demo"].command[0] == sys.executable, "the built-in is untouched"


def test_parse_agents_directly() -> None:
    agents = parse_agents({"agents": {"x": {"protocol": "acp", "command": ["x"]}}}, "inline")
    assert list(agents) == ["x"], "parse_agents does not add the built-ins"
    assert parse_agents({}) == {}
    with pytest.raises(ConfigError, match=r"^inline: \[agents\.x\]"):
        parse_agents({"agents": {"x": {"protocol": "acp"}}}, "inline")
    with pytest.raises(ConfigError, match=r"^<config>: "):
        parse_agents({"agents": {"x": {}}})


# --- Errors: each names the file and the table -----------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_agents(path)
    assert str(path) in str(info.value)
    assert "no such" in str(info.value)


def test_unreadable_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_agents(tmp_path)  # a directory
    assert str(tmp_path) in str(info.value)
    assert "cannot read" in str(info.value)


def test_invalid_toml(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, '[agents.a]\nprotocol = "acp\n')
    assert message.startswith(f"{path}: not valid TOML")
    assert "line 2" in message


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_command_as_a_shell_string(tmp_path: Path) -> None:
    message, path = config_error(
        tmp_path, '[agents.codex]\nprotocol = "acp"\ncommand = "codex app-server --x"\n'
    )
    assert message.startswith(f"{path}: [agents.codex]: ")
    assert "list of arguments" in message
    assert "not a shell string" in message
    assert "['codex', 'app-server', '--x']" in message, "suggests the list form"


TABLE_ERRORS = [
    pytest.param(
        'protocol = "acp"\ncommand = []', "'command' must be a non-empty list", id="empty-command"
    ),
    pytest.param('protocol = "acp"', "'command' must be a non-empty list", id="no-command"),
    pytest.param(
        'protocol = "acp"\ncommand = [""]', "'command' must be a non-empty list", id="empty-program"
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nmax_sessions = 0',
        "'max_sessions' must be a whole number >= 1, not 0",
        id="max-sessions-zero",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nmax_sessions = true',
        "'max_sessions' must be a whole number >= 1, not True",
        id="max-sessions-bool",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a", 1]', "'command' must be a non-empty list", id="int-arg"
    ),
    pytest.param(
        'protocol = "carrier-pigeon"\ncommand = ["a"]',
        "unknown protocol 'carrier-pigeon' (one of ",
        id="unknown-protocol",
    ),
    pytest.param('command = ["a"]', "'protocol' is required (one of ", id="missing-protocol"),
    pytest.param(
        'protocol = 1\ncommand = ["a"]', "'protocol' is required", id="protocol-not-string"
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ngrace_s = -1',
        "'grace_s' must be a number of seconds >= 0, not -1",
        id="negative-grace",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ngrace_s = -0.5',
        "'grace_s' must be a number of seconds >= 0, not -0.5",
        id="negative-float-grace",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ngrace_s = true',
        "'grace_s' must be a number of seconds >= 0, not True",
        id="bool-grace",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ngrace_s = "3"',
        "'grace_s' must be a number of seconds >= 0, not '3'",
        id="string-grace",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nkill_timeout_s = -2',
        "'kill_timeout_s' must be a number",
        id="negative-kill",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nstart_timeout_s = false',
        "'start_timeout_s' must be a number",
        id="bool-start",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ncommmand = ["a"]',
        "unknown key(s) commmand (allowed: ",
        id="unknown-key",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nenv = { A = 1 }',
        "'env' must be a table of string values",
        id="env-int-value",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nenv = { A = { B = "c" } }',
        "'env' must be a table of string values",
        id="env-nested",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nenv = ["A=1"]',
        "'env' must be a table of string values",
        id="env-list",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ndescription = 3',
        "'description' must be a string",
        id="description",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ncwd = ["/w"]', "'cwd' must be a string", id="cwd"
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\ntell_rewind = "no"',
        "'tell_rewind' must be true or false",
        id="tell-rewind",
    ),
    pytest.param(
        'protocol = "acp"\ncommand = ["a"]\nworktree = "yes"',
        "'worktree' must be true or false",
        id="worktree",
    ),
]


@pytest.mark.parametrize(("body", "expected"), TABLE_ERRORS)
def test_table_errors_name_file_and_table(tmp_path: Path, body: str, expected: str) -> None:
    message, path = config_error(
        tmp_path, f'[agents.ok]\nprotocol = "acp"\ncommand = ["ok"]\n\n[agents.bad]\n{body}\n'
    )
    assert message.startswith(f"{path}: [agents.bad]: "), message
    assert expected in message


def test_unknown_protocol_lists_the_known_ones(tmp_path: Path) -> None:
    message, _ = config_error(tmp_path, '[agents.x]\nprotocol = "nope"\ncommand = ["a"]\n')
    assert "acp" in message


def test_unknown_key_lists_the_allowed_ones(tmp_path: Path) -> None:
    message, _ = config_error(
        tmp_path, '[agents.x]\nprotocol = "acp"\ncommand = ["a"]\ngrace = 1\nzzz = 2\n'
    )
    assert "unknown key(s) grace, zzz" in message
    for key in (
        "command",
        "cwd",
        "description",
        "env",
        "grace_s",
        "kill_timeout_s",
        "protocol",
        "start_timeout_s",
    ):
        assert key in message


def test_agent_entry_not_a_table(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, "[agents]\nfoo = 3\n")
    assert message == f"{path}: [agents.foo] must be a table"


@pytest.mark.parametrize("value", ["3", "[1, 2]", '"codex"'])
def test_agents_not_a_table(tmp_path: Path, value: str) -> None:
    message, path = config_error(tmp_path, f"agents = {value}\n")
    assert message.startswith(f"{path}: ")
    assert "'agents' must be a table of [agents.NAME] tables" in message


def test_a_misspelt_table_is_named_not_left_out(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, '[agent.x]\nprotocol = "acp"\ncommand = ["a"]\n')
    assert message == (
        f"{path}: unknown table(s) [agent] (allowed: [agents.NAME], [gateway], [store],"
        " [checkpoints], [hosts.NAME])"
    )


# --- AgentSpec.from_config ------------------------------------------------------------------


def test_from_config_builtin() -> None:
    demo = AgentSpec.from_config("demo")
    assert demo == builtin_agents()["demo"]


def test_from_config_unknown_lists_known_agents() -> None:
    with pytest.raises(ConfigError) as info:
        AgentSpec.from_config("nope")
    assert str(info.value) == "no agent named 'nope' (known: demo, demo-stubborn)"


def test_from_config_with_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    assert AgentSpec.from_config("codex", path).command == ("codex", "app-server")
    assert AgentSpec.from_config("demo", path) == builtin_agents()["demo"]
    with pytest.raises(ConfigError) as info:
        AgentSpec.from_config("nope", path)
    assert (
        str(info.value)
        == f"no agent named 'nope' in {path} (known: codex, demo, demo-stubborn, minimal)"
    )
    with pytest.raises(ConfigError, match="no such configuration file"):
        AgentSpec.from_config("demo", tmp_path / "missing.toml")


def test_with_args_and_options() -> None:
    demo = AgentSpec.from_config("demo")
    slow = demo.with_args("--slow").with_options(grace_s=0.5)
    assert slow.command == (*demo.command, "--slow")
    assert slow.grace_s == 0.5
    assert demo.grace_s == DEFAULT_GRACE_S


# --- Bugs found while writing these tests (left failing on purpose) -----------------------


def test_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """tomllib decodes the bytes itself and raises UnicodeDecodeError, which load_agents does
    not catch: the CLI (which catches ConfigError only) would print a traceback that does not
    name the file."""
    path = tmp_path / "latin1.toml"
    path.write_bytes('[agents.a]\nprotocol = "acp"\ncommand = ["caf\xe9"]\n'.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_agents(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("key", ["grace_s", "kill_timeout_s", "start_timeout_s"])
def test_nan_seconds_are_rejected(tmp_path: Path, key: str) -> None:
    """TOML has ``nan``; ``nan < 0`` is False, so it passes the ">= 0" check. In the session
    actor a NaN grace deadline reaches ``trio.move_on_at`` ("deadline must not be NaN") at the
    first cancel, and ``min(math.inf, nan)`` is ``inf``, which silently disables the start
    timeout."""
    message, path = config_error(
        tmp_path, f'[agents.a]\nprotocol = "acp"\ncommand = ["a"]\n{key} = nan\n'
    )
    assert message.startswith(f"{path}: [agents.a]: '{key}' must be a number of seconds >= 0")


def test_stall_limits_are_configurable_and_checked() -> None:
    """The stall watchdog's limits (``tests/actor/test_session_watchdog.py``): seconds, 0 never."""
    table = {"protocol": "acp", "command": ["x"]}
    spec = parse_agents({"agents": {"a": table}})["a"]
    assert (spec.stall_s, spec.tool_stall_s) == (DEFAULT_STALL_S, None) == (300.0, None)
    spec = parse_agents({"agents": {"a": {**table, "stall_s": 60, "tool_stall_s": 1800.5}}})["a"]
    assert (spec.stall_s, spec.tool_stall_s) == (60.0, 1800.5)
    spec = parse_agents({"agents": {"a": {**table, "stall_s": 0, "tool_stall_s": 0}}})["a"]
    assert (spec.stall_s, spec.tool_stall_s) == (None, None)  # 0: never (TOML has no null)
    assert spec.first_snapshot_wait_s == 30.0
    spec = parse_agents({"agents": {"a": {**table, "first_snapshot_wait_s": 0}}})["a"]
    assert spec.first_snapshot_wait_s is None  # 0: a turn waits as long as it takes
    for key in ("stall_s", "tool_stall_s", "first_snapshot_wait_s"):
        for bad in (-1, True, "300", float("inf"), float("nan")):
            with pytest.raises(ConfigError, match=key):
                parse_agents({"agents": {"a": {**table, key: bad}}})


# --- Empty arguments, caps, the [gateway] table ---------------------------------------------


def test_an_empty_string_is_an_argument(tmp_path: Path) -> None:
    # The tests' own Claude run passes `--setting-sources ""`.
    text = '[agents.claude]\nprotocol = "claude"\ncommand = ["claude", "--setting-sources", ""]\n'
    assert load_agents(write(tmp_path, text))["claude"].command == (
        "claude",
        "--setting-sources",
        "",
    )


def test_max_sessions_per_agent_and_for_the_gateway(tmp_path: Path) -> None:
    text = (
        '[agents.a]\nprotocol = "acp"\ncommand = ["a"]\nmax_sessions = 2\n'
        "[gateway]\nmax_sessions = 8\nmax_connections = 32\nrequest_timeout_s = 2.5\n"
    )
    config = load_config(write(tmp_path, text))
    assert config.agents["a"].max_sessions == 2
    assert config.agents["demo"].max_sessions is None
    assert config.gateway == GatewaySettings(
        max_sessions=8, max_connections=32, request_timeout_s=2.5
    )
    assert load_config(write(tmp_path, "")).gateway == GatewaySettings()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("max_sessions = 0", "'max_sessions' must be a whole number >= 1, not 0"),
        ("max_connections = 1.5", "'max_connections' must be a whole number >= 1, not 1.5"),
        ("request_timeout_s = 0", "'request_timeout_s' must be a number of seconds > 0"),
        ("max_session = 3", "unknown key(s) max_session (allowed: "),
    ],
)
def test_gateway_table_errors(tmp_path: Path, body: str, expected: str) -> None:
    path = write(tmp_path, f"[gateway]\n{body}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: [gateway]: {expected}")


def test_the_checkpoints_watcher_is_on_unless_the_table_turns_it_off(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")).checkpoints.watch is True
    assert load_config(write(tmp_path, "[checkpoints]\nwatch = false\n")).checkpoints.watch is False
    for body, expected in [
        ('watch = "no"', "'watch' must be true or false"),
        ("watched = false", "unknown key(s) watched (allowed: watch)"),
    ]:
        path = write(tmp_path, f"[checkpoints]\n{body}\n")
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}: [checkpoints]: {expected}"


GIB = 1024**3


@pytest.mark.parametrize(
    ("memory", "files", "expected"),
    [
        (24 * GIB, 1_048_576, 48),  # the 24 GB host: one session per 512 MiB
        (8 * GIB, 1_048_576, 16),
        (1 * GIB, 1_048_576, 4),  # never fewer than four
        (24 * GIB, 1024, 48),  # (1024 - 64) / 16 = 60 by files: memory is the bound
        (24 * GIB, 512, 28),  # (512 - 64) / 16: the file descriptors are
        (24 * GIB, 100, 4),
    ],
)
def test_default_max_sessions(memory: int, files: int, expected: int) -> None:
    assert default_max_sessions(memory, files) == expected


def test_terminal_agent_table() -> None:
    from protocols.terminal import DEFAULT_IDLE_S, TerminalSettings

    table = {
        "protocol": "terminal",
        "command": ["aider"],
        "prompt_pattern": "^> $",
        "interrupt": ["\u0003"],
        "resume_command": ["aider", "--restore-chat-history"],
        "cols": 100,
        "rows": 30,
    }
    spec = parse_agents({"agents": {"aider": table}}, "inline")["aider"]
    assert spec.terminal == TerminalSettings(
        prompt_pattern="^> $", interrupt=("\x03",), cols=100, rows=30, idle_s=DEFAULT_IDLE_S
    )
    assert spec.resume_command == ("aider", "--restore-chat-history")
    plain = parse_agents({"agents": {"t": {"protocol": "terminal", "command": ["t"]}}})["t"]
    assert plain.terminal == TerminalSettings() and plain.resume_command == ()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"prompt_pattern": "("}, "'prompt_pattern' is not a regular expression"),
        ({"idle_s": 0}, "'idle_s' must be a number of seconds > 0"),
        ({"interrupt": "\u001b"}, "'interrupt' must be a list"),
        ({"cols": 5000}, "'cols' must be a whole number from 1 to 500"),
        ({"submit": "shout"}, "'submit' must be one of paste, type"),
    ],
)
def test_bad_terminal_settings(extra: dict[str, object], message: str) -> None:
    table = {"protocol": "terminal", "command": ["t"], **extra}
    with pytest.raises(ConfigError, match=message):
        parse_agents({"agents": {"t": table}}, "inline")


def test_terminal_settings_only_for_terminal_agents() -> None:
    table = {"protocol": "acp", "command": ["x"], "prompt_pattern": "> "}
    with pytest.raises(ConfigError, match="those of protocol terminal only"):
        parse_agents({"agents": {"x": table}}, "inline")
