"""Per-agent setup: a fresh home, config files and environment pointing at the fake model.

Each :class:`RealAgent` knows its npm package (``install.PACKAGES``), how to start it in ACP
mode, and what to write into a test's temporary folder so that it

- talks only to the fake model at ``base_url`` (no login, no vendor endpoint, no update check,
  no telemetry: ``shared/real-agents.md``);
- asks before :data:`fake_model.PERMISSION_COMMAND` (so the permission test has something to
  cancel), and runs :data:`fake_model.SHELL_COMMAND` without asking where its configuration
  allows that: Gemini (a user policy) and OpenCode (a bash rule). Claude Code asks anyway (the
  command reads ``/dev/null``, outside the project: neither an allow rule nor
  ``additionalDirectories`` avoided the prompt), and Codex is asked for an escalated command
  (its sandbox needs bubblewrap, which is not on every machine); the test approves those.

Everything lives under the test's ``root``: ``home/`` (HOME and the XDG folders) and
``work/`` (the session's cwd, where project config files go).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from attrs import frozen

from protocols.amp import AMP_COMMAND
from realagents.fake_model import AGENT_LOOP_MODEL, PERMISSION_COMMAND, SHELL_COMMAND
from supervisor import AgentSpec

__all__ = ["AGENTS", "Prepared", "RealAgent"]

#: Where a test can find the raw stdout of an agent when ``AGENT_TIER4_TEE=1`` (see ``tee.py``).
TEE_VARIABLE = "AGENT_TIER4_TEE"
_TEE = Path(__file__).with_name("tee.py")


@frozen
class Prepared:
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: Path
    home: Path


@frozen
class RealAgent:
    key: str  # test id
    package: str  # key into install.PACKAGES
    args: tuple[str, ...]  # after the package's entry point

    def prepare(self, entry: tuple[str, ...], root: Path, base_url: str) -> Prepared:
        home = root / "home"
        work = root / "work"
        for folder in (
            home,
            work,
            home / ".config",
            home / ".local/share",
            home / ".cache",
            home / ".local/state",
        ):
            folder.mkdir(parents=True, exist_ok=True)
        env = {
            "HOME": os.fspath(home),
            "XDG_CONFIG_HOME": os.fspath(home / ".config"),
            "XDG_DATA_HOME": os.fspath(home / ".local/share"),
            "XDG_CACHE_HOME": os.fspath(home / ".cache"),
            "XDG_STATE_HOME": os.fspath(home / ".local/state"),
            # Nothing of the host's proxies: everything goes to 127.0.0.1.
            "NO_PROXY": "*",
            "no_proxy": "*",
            "HTTP_PROXY": "",
            "HTTPS_PROXY": "",
            "http_proxy": "",
            "https_proxy": "",
            "CI": "1",
            "TERM": "dumb",
            "NO_COLOR": "1",
        }
        env.update(_SETUPS[self.key](home, work, base_url))
        return Prepared((*entry, *self.args), env, work, home)

    def spec(self, prepared: Prepared, *, grace_s: float, tee_dir: Path | None = None) -> AgentSpec:
        argv = list(prepared.argv)
        if tee_dir is not None:
            argv = [sys.executable, "-S", "-E", os.fspath(_TEE), os.fspath(tee_dir), "--", *argv]
        return AgentSpec(
            name=self.key,
            protocol="acp",
            command=tuple(argv),
            env=prepared.env,
            cwd=os.fspath(prepared.cwd),
            grace_s=grace_s,
            kill_timeout_s=1.0,
            start_timeout_s=90.0,
        )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _gemini(home: Path, work: Path, base_url: str) -> dict[str, str]:
    settings = {
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        # its banner kept: the TUI's start pattern waits for its header (agents.toml.example)
        "ui": {"hideTips": True},
    }
    _write(home / ".gemini/settings.json", json.dumps(settings, indent=2))
    # A user-tier policy: the test's long command runs without asking; anything else asks.
    prefix = SHELL_COMMAND.rsplit(" ", 1)[0]  # "timeout 29.7 tail -f"
    _write(
        home / ".gemini/policies/tier4.toml",
        f'[[rule]]\ntoolName = "run_shell_command"\ncommandPrefix = {json.dumps(prefix)}\n'
        'decision = "allow"\npriority = 900\n',
    )
    return {
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_API_KEY": "fake-key",
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GEMINI_TELEMETRY_ENABLED": "false",
    }


def _codex(home: Path, work: Path, base_url: str) -> dict[str, str]:
    codex_home = home / ".codex"
    _write(
        codex_home / "config.toml",
        f"""model = "gpt-5.5"
model_provider = "fake"
approval_policy = "on-request"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[model_providers.fake]
name = "fake"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "FAKE_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"
""",
    )
    return {"CODEX_HOME": os.fspath(codex_home), "FAKE_API_KEY": "fake-key", "RUST_LOG": "warn"}


def _claude(home: Path, work: Path, base_url: str) -> dict[str, str]:
    # Project settings in the session's cwd. "default" mode: without it the adapter may pick
    # "auto" (a classifier decides). The allow rule documents intent; Claude still asks for
    # SHELL_COMMAND because it reads /dev/null, outside the project (see the module docstring).
    settings = {
        "permissions": {
            "defaultMode": "default",
            "allow": [f"Bash({SHELL_COMMAND})"],
        }
    }
    _write(work / ".claude/settings.json", json.dumps(settings, indent=2))
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "fake-key",
        "ANTHROPIC_MODEL": "claude-sonnet-4-5",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        # As root, claude-agent-acp 0.101.0 still passes --allow-dangerously-skip-permissions
        # and the CLI refuses to start ("cannot be used with root/sudo privileges",
        # startupFailureReason bypass_root) unless it is told it runs in a sandbox. It does:
        # a loopback-only network namespace. The permission mode stays "default".
        "IS_SANDBOX": "1",
    }


def _opencode(home: Path, work: Path, base_url: str) -> dict[str, str]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": "fake/fake-model",
        "small_model": "fake/fake-model",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "fake-key"},
                "models": {"fake-model": {"name": "Fake model", "tool_call": True}},
            }
        },
        # The last matching rule wins: "ask" for everything, then the one exception.
        "permission": {"bash": {"*": "ask", SHELL_COMMAND: "allow"}},
    }
    _write(work / "opencode.json", json.dumps(config, indent=2))
    return {
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    }


#: codex-acp 2.x's own Codex (its @openai/codex dependency, install.PACKAGES["codex-acp"]): the
#: native binary, through CODEX_PATH. Without it the bridge runs ``node .../codex.js app-server``,
#: a shim that (on Node 20, which has no ``process.execve``) keeps a node process between the
#: bridge and Codex.
CODEX_ACP_CODEX = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"


def _codex_acp(home: Path, work: Path, base_url: str) -> dict[str, str]:
    from realagents.install import PACKAGES

    return {
        **_codex(home, work, base_url),
        "CODEX_PATH": os.fspath(PACKAGES["codex-acp"].folder / CODEX_ACP_CODEX),
        # The bridge's own default mode is "agent" ("Auto review": a guardian sub-agent asks
        # the model whether to approve, instead of the client): read-only is what config.toml
        # says (on-request approvals, answered by the user, a read-only sandbox).
        "INITIAL_AGENT_MODE": "read-only",
    }


def _qwen(home: Path, work: Path, base_url: str) -> dict[str, str]:
    # Qwen Code (a Gemini CLI fork) with its OpenAI-compatible provider: the fake model's
    # chat completions. The rule lets the test's long command run without asking (its shell
    # tool is "Bash" in rules, run_shell_command on the wire); anything else asks.
    settings = {
        "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
        "model": {"name": "fake-model"},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False},
        # Its default mode is "auto" (a classifier, the model, approves or blocks each call):
        # "default" asks the client, as every other agent here does.
        "tools": {"approvalMode": "default"},
        "permissions": {"allow": [f"Bash({SHELL_COMMAND})"]},
        # Model requests of its own after a turn (a follow-up suggestion, memory upkeep) off:
        # the fake model's log then holds the turns only.
        "ui": {"enableFollowupSuggestions": False},
        "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
    }
    _write(home / ".qwen/settings.json", json.dumps(settings, indent=2))
    return {
        "OPENAI_BASE_URL": f"{base_url}/v1",
        "OPENAI_API_KEY": "fake-key",
        "OPENAI_MODEL": "fake-model",
        # without it the CLI starts itself again as a child (for heap flags)
        "QWEN_CODE_NO_RELAUNCH": "true",
        "QWEN_USAGE_STATISTICS_ENABLED": "false",
    }


_SETUPS = {
    "gemini": _gemini,
    "qwen": _qwen,
    "codex-acp": _codex_acp,
    "claude-agent-acp": _claude,
    "opencode": _opencode,
}

AGENTS: dict[str, RealAgent] = {
    agent.key: agent
    for agent in (
        RealAgent("gemini", "gemini-cli", ("--acp",)),
        RealAgent("codex-acp", "codex-acp", ()),
        RealAgent("claude-agent-acp", "claude-agent-acp", ()),
        RealAgent("opencode", "opencode", ("acp",)),
        RealAgent("qwen", "qwen-code", ("--acp",)),
    )
}

assert PERMISSION_COMMAND != SHELL_COMMAND


# -- Claude Code in stream-json mode (protocol "claude"; tests/real/test_real_claude.py) ------------
# Not an ACP agent, so not in AGENTS (test_real_acp_agents.py runs every entry of that table).

#: After the native binary: the adapter's command line (protocols.claude.CLAUDE_COMMAND), a
#: known model slug, and no settings files at all (``--setting-sources ""``: nothing of the
#: host's ~/.claude or the project's .claude leaks in; every Bash command asks first).
CLAUDE_STREAM_JSON_ARGS: tuple[str, ...] = (
    "-p",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
    "--include-partial-messages",
    "--permission-prompt-tool",
    "stdio",
    "--model",
    "claude-sonnet-4-5",
    "--setting-sources",
    "",
)


def _claude_stream_json(home: Path, work: Path, base_url: str) -> dict[str, str]:
    # shared/real-agents.md "Claude Code (stream-json)": no settings file is needed (none is
    # read anyway), no login, and no IS_SANDBOX (only --dangerously-skip-permissions wants it).
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "fake-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


_SETUPS["claude-stream-json"] = _claude_stream_json
#: ``claude -p`` in stream-json mode, the native binary of @anthropic-ai/claude-code
#: (``install.PACKAGES["claude-code"]``). Prepare it like the others; take its spec from
#: :func:`claude_stream_json_spec` (protocol ``claude``, not ``acp``).
CLAUDE_STREAM_JSON = RealAgent("claude-stream-json", "claude-code", CLAUDE_STREAM_JSON_ARGS)


def claude_stream_json_spec(
    prepared: Prepared, *, grace_s: float, tee_dir: Path | None = None
) -> AgentSpec:
    """The supervisor's spec for :data:`CLAUDE_STREAM_JSON`: the supervisor adds
    ``--resume <session_id>`` itself when it respawns the CLI."""
    spec = CLAUDE_STREAM_JSON.spec(prepared, grace_s=grace_s, tee_dir=tee_dir)
    return spec.with_options(protocol="claude")


# -- Codex app-server (protocol "codex"; tests/real/test_real_codex.py) ------------------------------
# Not an ACP agent, so not in AGENTS. The same CODEX_HOME config.toml as codex-acp (_codex).
# ``--strict-config``: without it a bad config.toml silently falls back to the real provider.

_SETUPS["codex-app-server"] = _codex
#: ``codex app-server``, the native binary of @openai/codex (``install.PACKAGES["codex"]``).
#: Prepare it like the others; take its spec from :func:`codex_app_server_spec`.
CODEX_APP_SERVER = RealAgent("codex-app-server", "codex", ("app-server", "--strict-config"))


def codex_app_server_spec(
    prepared: Prepared, *, grace_s: float, tee_dir: Path | None = None
) -> AgentSpec:
    """The supervisor's spec for :data:`CODEX_APP_SERVER` (protocol ``codex``, not ``acp``)."""
    spec = CODEX_APP_SERVER.spec(prepared, grace_s=grace_s, tee_dir=tee_dir)
    return spec.with_options(protocol="codex")


def codex_enable_features(prepared: Prepared, *features: str) -> None:
    """Turn on ``[features]`` flags in a prepared Codex's ``config.toml`` (before it starts).

    ``multi_agent_v2``: the sub-agent tools (``spawn_agent``, ``wait_agent``, ... in the
    ``collaboration`` namespace). With Codex 0.171.0's default, the deprecated v1
    ``multi_agent``, the fake model's requests list no sub-agent tool (only ``tool_search``,
    whose deferred tools may include it: not tried), and a direct ``spawn_agent`` call is an
    ``unsupported call``.
    """
    config = Path(prepared.env["CODEX_HOME"]) / "config.toml"
    text = config.read_text()
    assert text.count("[features]\n") == 1, text
    flags = "".join(f"{feature} = true\n" for feature in features)
    config.write_text(text.replace("[features]\n", f"[features]\n{flags}"))


# -- Amp (protocol "amp"; tests/real/test_real_amp.py) -----------------------------------------------
# Not an ACP agent, so not in AGENTS. Amp's CLI calls no model: its agent loop is on Amp's server,
# which the tests replace with ``fake_amp.FakeAmp`` (``base_url`` is that server's). On
# loopback the CLI needs no credentials for the actor endpoint; any API key is accepted.


def _amp(home: Path, work: Path, base_url: str) -> dict[str, str]:
    return {"AMP_URL": base_url, "AMP_API_KEY": "dummy"}


_SETUPS["amp"] = _amp
#: ``amp --execute --stream-json --stream-json-input --no-archive-after-execute``
#: (``protocols.amp.AMP_COMMAND``), the native binary of @sourcegraph/amp
#: (``install.PACKAGES["amp"]``). Prepare it like the others; take its spec from
#: :func:`amp_spec`. The supervisor adds ``threads continue <T-id>`` itself when it respawns it.
AMP = RealAgent("amp", "amp", AMP_COMMAND[1:])


def amp_spec(prepared: Prepared, *, grace_s: float, tee_dir: Path | None = None) -> AgentSpec:
    """The supervisor's spec for :data:`AMP` (protocol ``amp``, not ``acp``)."""
    return AMP.spec(prepared, grace_s=grace_s, tee_dir=tee_dir).with_options(protocol="amp")


# -- TUIs in a pseudo-terminal (protocol "terminal"; tests/real/test_real_tuis.py) --------------------
# Each agent's own interactive interface, its first-run screens answered by its configuration
# files: Claude Code's onboarding, API-key approval and folder trust (``~/.claude.json``);
# Codex's folder trust and model-upgrade notice (``config.toml``); Gemini CLI's as for --acp;
# aider's by its command-line switches (``tests/real/test_real_tuis.py``).

#: Claude Code's TUI takes an API key only once approved; it keeps the last 20 characters.
CLAUDE_TUI_KEY = "sk-ant-fake-key-0123456789abcdefghij"


def _claude_tui(home: Path, work: Path, base_url: str) -> dict[str, str]:
    state = {
        "hasCompletedOnboarding": True,  # else it checks api.anthropic.com first and stops
        "theme": "dark",
        "numStartups": 1,
        "customApiKeyResponses": {"approved": [CLAUDE_TUI_KEY[-20:]], "rejected": []},
        "projects": {
            os.fspath(work): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
        },
    }
    _write(home / ".claude.json", json.dumps(state, indent=2))
    return {**_claude_stream_json(home, work, base_url), "ANTHROPIC_API_KEY": CLAUDE_TUI_KEY}


def _codex_tui(home: Path, work: Path, base_url: str) -> dict[str, str]:
    env = _codex(home, work, base_url)
    config = Path(env["CODEX_HOME"]) / "config.toml"
    config.write_text(
        config.read_text()
        # the model-upgrade notice, as if already seen: else its menu takes the first prompt
        + '\n[notice]\nhide_rate_limit_model_nudge = true\nmodel_migrations = { "gpt-5.5" = "gpt-6-sol" }\n'
        + f'\n[projects."{work}"]\ntrust_level = "trusted"\n'
    )
    return env


_SETUPS["claude-tui"] = _claude_tui
_SETUPS["codex-tui"] = _codex_tui
_SETUPS["gemini-tui"] = _gemini


def _aider(home: Path, work: Path, base_url: str) -> dict[str, str]:
    # Its model-metadata cache, fresh and empty: else aider fetches litellm's price list from
    # GitHub at start (and again each day).
    _write(home / ".aider/caches/model_prices_and_context_window.json", "{}")
    return {
        "OPENAI_API_BASE": f"{base_url}/v1",
        "OPENAI_API_KEY": "fake-key",
        # The agent's turns go to the fake model's agent loop; side requests (summaries of a
        # long history) to another name, so they stay quick.
        "AIDER_MODEL": f"openai/{AGENT_LOOP_MODEL}",
        "AIDER_WEAK_MODEL": "openai/fake-weak",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # Its install holds the bytecode of the modules its start imports (``install.py``,
        # ``warm``), not of those it imports later: the first run writes theirs, even where
        # the environment says not to (empty: unset).
        "PYTHONDONTWRITEBYTECODE": "",
    }


_SETUPS["aider-tui"] = _aider
