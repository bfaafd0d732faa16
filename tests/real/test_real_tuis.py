"""Tier 4: real agents' own TUIs in a pseudo-terminal (``protocol = "terminal"``), against a fake
model, each in its own loopback-only network namespace.

Claude Code's, Codex's and Gemini CLI's TUIs (the npm packages of ``tests/realagents/install.py``)
and aider's (its PyPI package there), their first-run screens answered by configuration files
and switches (``tests/realagents/agents.py``), with the settings ``agents.toml.example`` gives
them. For each:

(a) a ``quick`` turn completes and is detected (the prompt back, the screen still);
(b) a stop while the model streams (aider: while it waits for the whole answer, ``--no-stream``)
    is ``cancelled`` (the interrupt key), and the TUI hung up on the model; the next turn
    completes;
(c) a turn past its grace (0 s here) is ``killed`` with the TUI's whole tree, the TUI started
    again with its resume command, and the next turn's request to the model still holds the
    conversation from before the kill;
(d) 20 prompt/stop cycles, then the session closed: no process of the TUI is left.

(a), (b) and (d) share one session per TUI ((b) is the first of the 20 stops), (c) has its own
(its grace is 0 s). Each test runs the four TUIs at once (``each_tui``): their scenarios wait on
the real clock, not the CPU. Real clock, generous bounds. Cancel and kill times go into the tier-4 table (``.cache/
tier4-results.json``) as agents ``*-tui``.
"""

from __future__ import annotations

import base64
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from attrs import frozen

from paths import REPO
from protocols import events as ev
from protocols._screen import Screen, Stream
from protocols.terminal import TerminalSettings
from realagents import install, scenarios
from realagents.agents import Prepared, RealAgent
from realagents.conftest import GRACE_S, Harness, real_agent_session, skip_or_fail
from realagents.scenarios import is_holder, ms_after
from supervisor import AgentSpec
from supervisor.config import load_agents

pytestmark = pytest.mark.real_process

#: One TUI's bound for (c): a TUI starts in 2-17 s on 2 loaded cores (aider's first start
#: after its install, which writes its bytecode, the longest), each turn a few.
BOUND_S = 120.0
CYCLES = 20
#: (a), (b) and (d): each cycle is a stream's first tokens, the stop and the screen's
#: stillness (~3 s).
CYCLES_BOUND_S = 600.0
#: ``AGENT_TIER4_TUIS=aider-tui,codex-tui``: only those TUIs (a run that looks at one of them)
ONLY_VARIABLE = "AGENT_TIER4_TUIS"


@frozen
class Tui:
    key: str
    package: str
    args: tuple[str, ...]
    resume_args: tuple[str, ...]
    settings: TerminalSettings

    @property
    def agent(self) -> RealAgent:
        return RealAgent(self.key, self.package, self.args)

    def spec(self, prepared: Prepared, *, grace_s: float, tee_dir: Path | None = None) -> AgentSpec:
        entry = prepared.argv[: len(prepared.argv) - len(self.args)]
        env = {k: v for k, v in prepared.env.items() if k not in ("TERM", "NO_COLOR")}
        spec = self.agent.spec(prepared, grace_s=grace_s)
        return spec.with_options(
            protocol="terminal",
            env=env,
            terminal=self.settings,
            resume_command=(*entry, *self.resume_args),
        )


#: aider without colours or prompt_toolkit (a plain input line), its answers not streamed (why:
#: agents.toml.example), no git repository, and nothing asked or fetched at start: its model,
#: endpoint and key come from the environment.
AIDER_ARGS = (
    "--no-pretty",
    "--no-fancy-input",
    "--no-stream",
    "--no-git",
    "--no-check-update",
    "--no-show-release-notes",
    "--analytics-disable",
    "--no-show-model-warnings",
)

#: Gemini CLI ready (why: agents.toml.example): its input box, nothing saying it works, and
#: above them its header, which it draws once its configuration has loaded.
GEMINI_STARTED = r"\A(?![\s\S]*esc to cancel)[\s\S]*Gemini CLI v[\s\S]*^ >   Type your message"
#: Gemini CLI resumed and ready: the same, with a prompt of the conversation it resumed (a line
#: `` > text``) drawn above the input box.
GEMINI_RESUMED = r"\A(?![\s\S]*esc to cancel)[\s\S]*^ > \S[\s\S]*^ >   Type your message"

#: The settings of agents.toml.example. A prompt line showing while nothing on the screen says
#: the TUI works (its "esc to interrupt" / "esc to cancel" hint): each TUI draws its input box
#: during a turn too.
TUIS = [
    Tui(
        "claude-tui",
        "claude-code",
        ("--model", "claude-sonnet-4-5"),
        ("--continue", "--model", "claude-sonnet-4-5"),
        TerminalSettings(prompt_pattern=r"\A(?![\s\S]*esc to interrupt)[\s\S]*^❯[ \u00a0]*$"),
    ),
    Tui(
        "codex-tui",
        "codex",
        ("--no-daemon",),
        ("resume", "--last", "--no-daemon"),
        TerminalSettings(prompt_pattern=r"\A(?![\s\S]*esc to interrupt)[\s\S]*^› "),
    ),
    Tui(
        "gemini-tui",
        "gemini-cli",
        (),
        ("--resume", "latest"),
        TerminalSettings(
            prompt_pattern=r"\A(?![\s\S]*esc to cancel)[\s\S]*^ >   Type your message",
            start_pattern=GEMINI_STARTED,
            resume_pattern=GEMINI_RESUMED,
            submit_delay_s=0.5,
        ),
    ),
    Tui(
        "aider-tui",
        "aider",
        AIDER_ARGS,
        ("--restore-chat-history", *AIDER_ARGS),
        # Its plain input line (--no-fancy-input) is "> " below the last output, and it takes
        # no bracketed paste: typed keys. Ctrl-C stops a reply; a second one within 2 s of it
        # exits aider, so a stop's receipt waits 2 s of stillness: the next stop's Ctrl-C
        # cannot come sooner.
        TerminalSettings(
            prompt_pattern=r"^>\s*\Z", idle_s=2.0, interrupt=("\u0003",), submit="type"
        ),
    ),
]


@pytest.fixture
def installed() -> dict[Tui, install.Installed | install.Unavailable]:
    """Each TUI's package, installed (or why not), before the test's Trio run."""
    found: dict[Tui, install.Installed | install.Unavailable] = {}
    only = os.environ.get(ONLY_VARIABLE)
    named = only.split(",") if only else [t.key for t in TUIS]
    for tui in [t for t in TUIS if t.key in named]:
        try:
            found[tui] = install.ensure(tui.package)
        except install.Unavailable as exc:
            found[tui] = exc
    return found


async def each_tui(
    installed: dict[Tui, install.Installed | install.Unavailable],
    root: Path,
    scenario: Callable[[Tui, Callable[..., Any]], Awaitable[None]],
) -> None:
    """``scenario(tui, open_tui)`` for every installed TUI, all at once: a TUI's scenario mostly
    waits on the real clock (its start, the model's tokens, ``idle_s``), so four run in the time
    of the slowest. A failure names its TUI. A TUI not installed is a skip (a failure with
    ``AGENT_SUPERVISOR_STRICT_SKIPS=1``) once the others have run."""

    async def one(tui: Tui, ready: install.Installed) -> None:
        def open_tui(**options: Any) -> Any:
            return real_agent_session(
                tui.agent, root / tui.key, ready, spec_of=tui.spec, catch_up=True, **options
            )

        try:
            await scenario(tui, open_tui)
        except BaseException as exc:
            exc.add_note(f"({tui.key})")
            raise

    async with trio.open_nursery() as nursery:
        for tui, ready in installed.items():
            if isinstance(ready, install.Installed):
                nursery.start_soon(one, tui, ready)
    missing = [f"{t.key}: {r}" for t, r in installed.items() if isinstance(r, install.Unavailable)]
    if missing:
        skip_or_fail("not available: " + "; ".join(missing))


def row(h: Harness, tui: Tui, scenario: str, receipt: Any, **extra: Any) -> None:
    scenarios.record_receipt(h, tui.key, tui.package, scenario, receipt, extra)


async def quick_completes(h: Harness, text: str = "quick") -> ev.TurnEnded:
    turn = await h.session.prompt(text)
    ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert ended.outcome == "completed", (ended, h.model.describe())
    return ended


async def stream_started(h: Harness, after: int) -> Any:
    """A ``stream`` turn whose model has made tokens (streamed them, or holds them for the
    whole answer): the turn and the model's request."""
    turn = await h.session.prompt("stream")
    stream = await h.model.wait_for(
        lambda e: e.id > after and e.slow_tokens and e.tokens_sent >= 3, timeout=60
    )
    return turn, stream


def last_id(h: Harness) -> int:
    return max((e.id for e in h.model.snapshot()), default=0)


@contextmanager
def screen_noted(h: Harness) -> Iterator[None]:
    """A failure inside notes the TUI's screen (drawn from its ``terminal.output``) and the
    model's log: what the TUI showed when its scenario went wrong."""
    try:
        yield
    except BaseException as exc:
        screen = Screen(TerminalSettings().cols, TerminalSettings().rows)
        output = b"".join(
            base64.b64decode(e.data)
            for e in h.recorder.of_kind("terminal.output")
            if isinstance(e, ev.TerminalOutput)
        )
        Stream(screen).feed(output.decode(errors="replace"))
        rows = "\n".join(line.rstrip() for line in screen.display).strip("\n")
        exc.add_note(f"screen:\n{rows}\nmodel:\n{h.model.describe()}")
        raise


def slow(e: Any) -> bool:
    return bool(e.slow_tokens)


def hung_up(e: Any) -> bool:
    """A slow answer the TUI hung up on before its end (each of the cycles' stops)."""
    return bool(e.slow_tokens and e.disconnected_at is not None)


def tui_tree(h: Harness) -> list[psutil.Process]:
    """The processes of ``h``'s TUI (their ``HOME`` is its test's), not the other TUIs' that
    run beside it."""
    home = str(h.prepared.home)
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if not is_holder(p) and _environ(p).get("HOME") == home
    ]


async def test_turns_stops_and_cycles_leave_no_process(
    installed: dict[Tui, install.Installed | install.Unavailable], tmp_path: Path
) -> None:
    """(a), (b) and (d) in one session per TUI: the first of the stops is (b)'s."""

    async def scenario(tui: Tui, open_tui: Callable[..., Any]) -> None:
        with trio.fail_after(CYCLES_BOUND_S):
            async with open_tui() as h:
                with screen_noted(h):
                    receipt, elapsed, tree = await turns_and_stops(h, tui)
            row(
                h,
                tui,
                "cycles",
                receipt,
                notes=[
                    f"cycles={CYCLES}",
                    f"cancel_ms_max={max(elapsed):.0f}",
                    f"hung_up={len(h.model.find(hung_up))}/{len(h.model.find(slow))}",
                ],
            )
            left = await scenarios.wait_gone(tree)
            assert left == [], [scenarios.command_of(p) for p in left]
            home = str(h.prepared.home)
            strays = [
                p.pid
                for p in psutil.process_iter()
                if home in " ".join(_cmdline(p)) or _cwd(p) == home
            ]
            assert strays == [], strays

    await each_tui(installed, tmp_path, scenario)


async def turns_and_stops(h: Harness, tui: Tui) -> tuple[Any, list[float], list[psutil.Process]]:
    """(a), then CYCLES stops of a streaming turn, (b) the first: the last receipt, each
    stop's time and the TUI's processes."""
    await quick_completes(h)
    assert h.model.find(lambda e: e.scenario == "quick" and e.has_tools), h.model.describe()
    elapsed = []
    for cycle in range(CYCLES):
        turn, stream = await stream_started(h, last_id(h))
        cancelled_at = time.monotonic()
        receipt = await h.session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
        assert receipt.escalation == ["interrupt"], receipt  # the TUI did not exit
        assert receipt.elapsed_ms < GRACE_S * 1000
        elapsed.append(receipt.elapsed_ms)
        if cycle == 0:
            await stopped(h, tui, stream, cancelled_at, receipt)
            await quick_completes(h)
    tree = tui_tree(h)
    assert tree, "no TUI process while the session runs"
    return receipt, elapsed, tree


async def stopped(h: Harness, tui: Tui, stream: Any, cancelled_at: float, receipt: Any) -> None:
    """(b): the TUI hung up on the model."""
    gone = await scenarios.stream_ended(h, stream, timeout=30)
    row(h, tui, "stream", receipt, model_gone_ms=ms_after(cancelled_at, gone.disconnected_at))
    scenarios.assert_stream_abandoned(h, gone, cancelled_at)


async def test_killed_past_the_grace_and_resumed(
    installed: dict[Tui, install.Installed | install.Unavailable], tmp_path: Path
) -> None:
    async def scenario(tui: Tui, open_tui: Callable[..., Any]) -> None:
        with trio.fail_after(BOUND_S):
            async with open_tui(grace_s=0.0, keep_bodies=True) as h:
                with screen_noted(h):
                    turn, stream, _ = await scenarios.killed_mid_stream(h)
                    tree = tui_tree(h)
                    cancelled_at = time.monotonic()
                    receipt = await h.session.cancel()
                    alive = await scenarios.wait_gone(tree)
                    gone = await scenarios.stream_ended(h, stream)
                    row(
                        h,
                        tui,
                        "kill",
                        receipt,
                        model_gone_ms=ms_after(cancelled_at, gone.disconnected_at),
                        notes=[f"resumed={receipt.resumed}", *scenarios.respawn_notes(h, "tui")],
                    )
                    scenarios.assert_killed_and_resumed(h, receipt, turn.id, alive, gone)
                    await quick_completes(h)
                    scenarios.assert_history_kept(h)

    await each_tui(installed, tmp_path, scenario)


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _cwd(proc: psutil.Process) -> str | None:
    try:
        return proc.cwd()
    except psutil.Error:
        return None


def test_packages_are_pinned() -> None:
    assert {t.package for t in TUIS} <= set(install.PACKAGES)


def test_agents_toml_example_has_the_settings_tested_here() -> None:
    agents = load_agents(REPO / "agents.toml.example")
    for tui in TUIS:
        spec = agents[tui.key]
        assert (spec.protocol, spec.terminal) == ("terminal", tui.settings), tui.key
        assert spec.command[1:] == tui.args[: len(spec.command) - 1] or tui.key == "claude-tui"
        assert (
            spec.resume_command[1 : len(tui.resume_args) + 1]
            == tui.resume_args[: len(spec.resume_command) - 1]
        )


#: Gemini CLI 0.61.0's screens at a start (as the terminal machine reads them; the footer cut):
#: its input box, drawn before its configuration has loaded, and its header, drawn once it has.
GEMINI_BOX = (
    "⚠  Warning: 256-color support not detected. Using a terminal with at least 256-color"
    " support is recommended for a better\n   visual experience.\n\n\n\n"
    + " " * 104
    + "? for shortcuts\n"
    + "─" * 120
    + "\n Shift+Tab to accept edits\n\n >   Type your message or @path/to/file\n"
)
GEMINI_HEADER = (
    " ▝▜▄     Gemini CLI v0.61.0\n   ▝▜▄\n  ▗▟▀    Authenticated with gemini-api-key /auth\n ▝▀\n"
)
GEMINI_CONVERSATION = " > quick\n✦ Quick answer from the fake model.\n"


@pytest.mark.parametrize(
    ("screen", "started", "resumed"),
    [
        (GEMINI_BOX, False, False),  # typed now, a prompt would wait unseen (resumed: lost)
        (GEMINI_HEADER + GEMINI_BOX, True, False),
        (GEMINI_HEADER + GEMINI_CONVERSATION + GEMINI_BOX, True, True),
    ],
)
def test_gemini_starts_once_its_configuration_has_loaded(
    screen: str, started: bool, resumed: bool
) -> None:
    [settings] = [t.settings for t in TUIS if t.key == "gemini-tui"]
    assert re.search(settings.prompt_pattern, screen, re.MULTILINE)  # the box shows throughout
    assert settings.start_pattern is not None and settings.resume_pattern is not None
    assert bool(re.search(settings.start_pattern, screen, re.MULTILINE)) is started
    assert bool(re.search(settings.resume_pattern, screen, re.MULTILINE)) is resumed
