"""Install the real agent CLIs from npm (and PyPI), pinned, once, into ``.cache/npm-agents/``
(git-ignored).

Each package goes to its own folder ``.cache/npm-agents/<key>@<version>/``, installed with a
plain ``npm install --no-audit --no-fund`` (a PyPI package: ``uv pip install`` into a virtual
environment of its own, ``venv/``, so that none of its dependencies meets the project's) into a
scratch folder that is renamed into place only once the install succeeded and its entry point
checks out; a marker file records that
(plus the time it took and the size), so later runs reuse it at no cost. A lock file per package
makes two test runs that install at once wait for each other instead of racing.

Install scripts always run (never ``--ignore-scripts``: OpenCode links its native binary in
``postinstall``, and without it only a stub remains). npm 11 asks for dependency install
scripts to be approved: the scratch ``package.json`` approves, by name, exactly the packages
below that need theirs.

Without npm (for a PyPI package: without uv, the test extra's), or when an install fails or
runs out of time, :func:`ensure` raises :class:`Unavailable` with the reason; the tests turn
that into a skip (a failure when ``AGENT_SUPERVISOR_STRICT_SKIPS=1``).

Run it by hand to pre-install everything: ``python tests/realagents/install.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attrs import frozen

__all__ = ["CACHE_DIR", "PACKAGES", "Installed", "Package", "Unavailable", "ensure", "ensure_all"]

REPO_ROOT = Path(__file__).resolve().parents[2]
#: ``AGENT_SUPERVISOR_AGENT_CACHE`` moves it (e.g. to a CI cache); git ignores ``.cache/``.
CACHE_DIR = Path(
    os.environ.get("AGENT_SUPERVISOR_AGENT_CACHE") or REPO_ROOT / ".cache" / "npm-agents"
)
#: The npm client to install with (``AGENT_SUPERVISOR_NPM``; a missing one means "skip").
NPM = os.environ.get("AGENT_SUPERVISOR_NPM") or "npm"
#: One package's install, downloads included. Measured here on a cold npm cache: 9-19 s each
#: (all four in parallel: 19 s; Amp, 101 MB: 3.5 s warm); aider from PyPI with uv, 540 MB
#: (its 572 MB of wheels downloaded): 3-25 s with uv's cache cold, 1.1-1.7 s warm (the files
#: are hard links into the cache), then 6-10 s writing the bytecode its start needs (``warm``);
#: all of it 11.5 s warm, 36 s cold, on 2 cores under a load of 11.
#: Five minutes leaves room for a slow registry day (aider's wheels at 2 MB/s: ~5 min); the
#: four run in parallel, so the whole setup stays within that bound too.
INSTALL_TIMEOUT_S = 300.0
MARKER = ".installed.json"
#: Node major version the CLIs need (Gemini CLI: >= 20).
MIN_NODE_MAJOR = 20
#: Where a PyPI package's interpreter is, in its install folder. It runs the package as
#: ``python -m MODULE``: a virtual environment's interpreter finds its packages wherever the
#: folder was renamed to, where the console scripts' ``#!`` lines name the scratch folder.
VENV_PYTHON = "venv/bin/python"


@frozen
class Package:
    key: str  # our name for it, and the folder name
    npm: str  # the package's name in its registry (npm's, or PyPI's for ``registry="pypi"``)
    version: str
    #: how to start it, relative to the install folder; a ``.js`` entry is run with ``node``.
    #: A PyPI package's is the module its install's interpreter runs (``python -m``).
    entry: str
    #: packages (this one or dependencies) whose install scripts must run
    scripts: tuple[str, ...] = ()
    #: dependencies pinned below the package's own ranges (npm ``overrides``): name, version
    overrides: tuple[tuple[str, str], ...] = ()
    registry: str = "npm"  # or "pypi"
    #: a PyPI package's modules imported once after its install, so that their bytecode is
    #: written (uv compiles none): the package's first start does not pay for compiling them
    warm: tuple[str, ...] = ()

    @property
    def folder(self) -> Path:
        return CACHE_DIR / f"{self.key}@{self.version}"


PACKAGES: dict[str, Package] = {
    package.key: package
    for package in (
        Package(
            "gemini-cli",
            "@google/gemini-cli",
            "0.61.0",
            "node_modules/@google/gemini-cli/bundle/gemini.js",
            scripts=("node-pty", "@github/keytar"),
        ),
        Package(
            "codex-acp",
            "@agentclientprotocol/codex-acp",
            "2.6.0",
            # a TypeScript bridge (one bundled .js) that starts `codex app-server` itself: the
            # @openai/codex it depends on (^0.166.0, pinned here). agents.py points CODEX_PATH
            # at that package's native binary, so the tree is node -> codex -> tools (without
            # it, node runs codex's .js shim, one process more).
            "node_modules/@agentclientprotocol/codex-acp/dist/index.js",
            overrides=(("@openai/codex", "0.166.0"),),
        ),
        Package(
            "claude-agent-acp",
            "@agentclientprotocol/claude-agent-acp",
            "0.101.0",
            "node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js",
        ),
        Package(
            "opencode",
            "opencode-ai",
            "1.18.33",
            # the native binary, linked by opencode-ai's postinstall
            "node_modules/opencode-linux-x64/bin/opencode",
            scripts=("opencode-ai",),
        ),
        Package(
            "claude-code",
            "@anthropic-ai/claude-code",
            "2.1.332",
            # the native binary, which the package's postinstall puts in place of a stub; run
            # in stream-json mode by tests/real/test_real_claude.py (not an ACP agent)
            "node_modules/@anthropic-ai/claude-code/bin/claude.exe",
            scripts=("@anthropic-ai/claude-code",),
        ),
        Package(
            "codex",
            "@openai/codex",
            "0.171.0",
            # Codex app-server (tests/real/test_real_codex.py, tests/machines/test_schemas.py): the native
            # binary, not the npm .js shim, which runs it as a child and does not forward signals
            "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
        ),
        Package(
            "amp",
            "@sourcegraph/amp",
            "0.0.1790142911-g7618fb",
            # Amp's CLI (tests/real/test_real_amp.py): the platform package's Bun executable, run
            # directly. @ampcode/cli's postinstall only links it to bin/amp.exe.
            "node_modules/@ampcode/cli-linux-x64/amp",
            scripts=("@ampcode/cli",),
        ),
        Package(
            "qwen-code",
            "@qwen-code/qwen-code",
            "0.24.4",
            # the CLI itself, not the bin entry (cli-entry.js), which runs it as a child
            # (spawnSync, for --expose-gc) and forwards no signal; it declares node >= 22 but
            # runs on 20 (tier 4 runs it on the machine's node)
            "node_modules/@qwen-code/qwen-code/cli.js",
        ),
        Package(
            "aider",
            "aider-chat",
            "0.86.2",
            # aider's TUI (tests/real/test_real_tuis.py): ~570 MB with its dependencies (litellm,
            # tree-sitter grammars, numpy, ...), which stay in the install's own venv
            "aider",
            registry="pypi",
            # what its start imports (its Python bytecode: ~2700 files of ~6800; all of them,
            # uv's --compile-bytecode, take twice as long)
            warm=(
                *("aider.main", "aider.coders", "aider.models", "aider.repomap", "litellm"),
                *("networkx", "numpy", "openai", "tiktoken"),
            ),
        ),
        Package(
            "acp-sdk",
            "@agentclientprotocol/sdk",
            "2.4.0",
            # only its schema/v1/*.json are used (tests/machines/test_schemas.py); the entry (the
            # package's main module) proves the install is whole
            "node_modules/@agentclientprotocol/sdk/dist/v1/stable/acp.js",
        ),
    )
}


class Unavailable(Exception):
    """The package cannot be installed or used here; the message says why."""


@frozen
class Installed:
    package: Package
    argv: tuple[str, ...]  # the command that starts it, before its own arguments
    seconds: float  # how long the install took (when it was done)
    bytes: int  # size of the install folder
    fresh: bool  # installed by this call (False: reused)


def _node_problem() -> str | None:
    node = shutil.which("node")
    if node is None:
        return "node is not installed"
    try:
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        major = int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"node --version failed: {exc}"
    if major < MIN_NODE_MAJOR:
        return f"node {out.strip()} is too old (need >= {MIN_NODE_MAJOR})"
    return None


def _argv(package: Package, folder: Path) -> tuple[str, ...]:
    if package.registry == "pypi":
        return (os.fspath(folder / VENV_PYTHON), "-m", package.entry)
    entry = folder / package.entry
    if entry.suffix in (".js", ".mjs", ".cjs"):
        node = shutil.which("node")
        assert node is not None
        return (node, os.fspath(entry))
    return (os.fspath(entry),)


def _check(package: Package, folder: Path) -> str | None:
    if package.registry == "pypi":
        if not os.access(folder / VENV_PYTHON, os.X_OK):
            return f"{VENV_PYTHON} is missing after install"
        if not list(folder.glob(f"venv/lib/python*/site-packages/{package.entry}/__main__.py")):
            return f"the module {package.entry} is missing after install"
        return None
    entry = folder / package.entry
    if not entry.is_file():
        return f"{package.entry} is missing after install"
    if entry.suffix not in (".js", ".mjs", ".cjs"):
        if not os.access(entry, os.X_OK):
            return f"{package.entry} is not executable"
        if entry.stat().st_size < 1_000_000:
            return (
                f"{package.entry} is a stub ({entry.stat().st_size} bytes), not the native binary"
            )
    return None


def _size(folder: Path) -> int:
    """Bytes on disk, like ``du``: hard links (OpenCode's postinstall makes one) count once."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def ensure(key: str, *, timeout: float = INSTALL_TIMEOUT_S) -> Installed:
    """The installed package ``key``, installing it first if needed; or :class:`Unavailable`."""
    package = PACKAGES[key]
    # every npm package needs node: to install, or to run
    problem = _node_problem() if package.registry == "npm" else _venv_problem()
    if problem is not None:
        raise Unavailable(problem)
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        lock = open(CACHE_DIR / f".{key}.lock", "w")  # noqa: SIM115 (the with just below)
    except OSError as exc:
        raise Unavailable(f"cannot use the install folder {CACHE_DIR}: {exc}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = package.folder / MARKER
        if marker.is_file():
            record = json.loads(marker.read_text())
            if _check(package, package.folder) is None:
                return Installed(
                    package,
                    _argv(package, package.folder),
                    record["seconds"],
                    record["bytes"],
                    False,
                )
            shutil.rmtree(package.folder, ignore_errors=True)  # damaged: start over
        if package.registry == "npm" and shutil.which(NPM) is None:
            raise Unavailable(
                f"{NPM} is not installed: cannot install {package.npm}@{package.version}"
            )
        return _install(package, timeout)


def _uv() -> str | None:
    """uv's executable (the test extra's ``uv`` package), or None."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return None


def _venv_problem() -> str | None:
    if _uv() is None:
        return "uv is not installed (pip install -e '.[test]')"
    return None


def _install(package: Package, timeout: float) -> Installed:
    scratch = package.folder.with_name(package.folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if package.registry == "pypi":
        uv = _uv()
        assert uv is not None  # ensure() checked
        commands = [
            [uv, "venv", "--quiet", "--python", sys.executable, "venv"],
            [
                *(uv, "pip", "install", "--quiet", "--python", VENV_PYTHON),
                f"{package.npm}=={package.version}",
            ],
        ]
        if package.warm:
            # written even where the environment says not to (PYTHONDONTWRITEBYTECODE)
            imports = (
                f"import sys; sys.dont_write_bytecode = False; import {', '.join(package.warm)}"
            )
            commands.append([os.fspath(scratch / VENV_PYTHON), "-c", imports])
    else:
        commands = [_npm_install(package, scratch)]
    return _run_install(package, scratch, commands, timeout)


def _npm_install(package: Package, scratch: Path) -> list[str]:
    """The npm command that installs ``package`` in ``scratch``, after its ``package.json``."""
    manifest = {
        "name": f"agent-supervisor-tier4-{package.key}",
        "private": True,
        "dependencies": {package.npm: package.version},
        "allowScripts": {name: True for name in (package.npm, *package.scripts)},
    }
    if package.overrides:
        manifest["overrides"] = dict(package.overrides)
    (scratch / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return [NPM, "install", "--no-audit", "--no-fund", "--loglevel=error"]


def _run_install(
    package: Package, scratch: Path, commands: list[list[str]], timeout: float
) -> Installed:
    """Run ``commands`` in ``scratch``, one after the other within ``timeout`` in all, check
    the result and rename it into place."""
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false"}
    how = f"{package.registry} install {package.npm}@{package.version}"
    started = time.monotonic()
    log = scratch / f"{package.registry}-install.log"
    try:
        with open(log, "wb") as out:
            for command in commands:
                process = subprocess.Popen(
                    command,
                    cwd=scratch,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    code = process.wait(timeout=max(0.0, started + timeout - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    raise Unavailable(f"{how} took over {timeout:.0f} s") from None
                if code != 0:
                    tail = log.read_text(errors="replace").strip().splitlines()[-8:]
                    raise Unavailable(f"{how} failed (exit {code}): " + " | ".join(tail))
        seconds = time.monotonic() - started
        problem = _check(package, scratch)  # e.g. a postinstall that did not run
        if problem is not None:
            raise Unavailable(f"{package.npm}@{package.version}: {problem}")
        size = _size(scratch)
        (scratch / MARKER).write_text(
            json.dumps(
                {
                    "package": package.npm,
                    "version": package.version,
                    "seconds": round(seconds, 1),
                    "bytes": size,
                }
            )
        )
        shutil.rmtree(package.folder, ignore_errors=True)
        scratch.rename(package.folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Installed(package, _argv(package, package.folder), round(seconds, 1), size, True)


def ensure_all(keys: Iterable[str] | None = None) -> dict[str, Installed | Unavailable]:
    """Install several packages in parallel; each entry is the result or why it failed."""
    wanted = list(keys if keys is not None else PACKAGES)

    def one(key: str) -> Installed | Unavailable:
        try:
            return ensure(key)
        except Unavailable as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(wanted) or 1) as pool:
        return dict(zip(wanted, pool.map(one, wanted), strict=True))


if __name__ == "__main__":
    started = time.monotonic()
    results = ensure_all(sys.argv[1:] or None)
    for key, result in results.items():
        if isinstance(result, Installed):
            state = "installed" if result.fresh else "cached"
            print(
                f"{key:18} {state:9} {result.seconds:6.1f} s {result.bytes / 1e6:7.0f} MB  {' '.join(result.argv)}"
            )
        else:
            print(f"{key:18} UNAVAILABLE {result}")
    print(f"total {time.monotonic() - started:.1f} s")
    sys.exit(0 if all(isinstance(r, Installed) for r in results.values()) else 1)
