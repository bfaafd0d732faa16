"""Tier 4: real agents' own TUIs in a pseudo-terminal (``protocol = "terminal"``), against a fake
model, each in its own loopback-only network namespace.

Claude Code's, Codex's and Gemini CLI's TUIs (the npm packages of ``tests/realagents/install.py``)
and aider's (its PyPI package there), their first-run screens answered by configuration files
and switches (``tests/realagents/agents.py``), with the settings ``agents.toml.example`` gives
them. For each:

(a) a ``quick`` turn completes and is detected (the prompt back, the screen still);
(b) a stop while the model streams is ``cancelled`` (the interrupt key), and the TUI hung up on
    the model (aider: not always, ``Tui.hangs_up``); the next turn completes;
(c) a turn past its grace (0 s here) is ``killed`` with the TUI's whole tree, the TUI started
    again with its resume command, and the next turn's request to the model still holds the
    conversation from before the kill;
(d) 20 prompt/stop cycles, then the session closed: no process of the TUI is left.

Real clock, generous bounds. Cancel and kill times go into the tier-4 table (``.cache/
tier4-results.json``) as agents ``*-tui``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from attrs import frozen

from paths import REPO
from protocols import events as ev
from protocols.terminal import TerminalSettings
from realagents import install, scenarios
from realagents.agents import Prepared, RealAgent
from realagents.conftest import GRACE_S, Harness, real_agent_session
from realagents.scenarios import is_holder, ms_after
from supervisor import AgentSpec
from supervisor.config import load_agents

pytestmark = pytest.mark.real_process

#: Whole-test bound for (a)-(c): a TUI starts in 2-8 s on 2 loaded cores, each turn a few.
BOUND_S = 120.0
CYCLES = 20
#: (d): each cycle is a stream's first tokens, the stop and the screen's stillness (~3 s).
CYCLES_BOUND_S = 600.0


@frozen
class Tui:
    key: str
    package: str
    args: tuple[str, ...]
    resume_args: tuple[str, ...]
    settings: TerminalSettings
    #: whether a stop hangs up on the model's stream. aider's Ctrl-C leaves the response in a
    #: reference cycle (the re-raised KeyboardInterrupt's traceback): the connection closes
    #: when Python's garbage collector runs, mostly within milliseconds, about one stop in ten
    #: not before a later turn.
    hangs_up: bool = True

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


#: aider without colours or prompt_toolkit (a plain input line), no git repository, and nothing
#: asked or fetched at start: its model, endpoint and key come from the environment.
AIDER_ARGS = (
    "--no-pretty",
    "--no-fancy-input",
    "--no-git",
    "--no-check-update",
    "--no-show-release-notes",
    "--analytics-disable",
    "--no-show-model-warnings",
)

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
        hangs_up=False,
    ),
]


@pytest.fixture(params=TUIS, ids=[t.key for t in TUIS])
def tui(request: pytest.FixtureRequest) -> Tui:
    result: Tui = request.param
    return result


@pytest.fixture
def open_tui(tui: Tui, tmp_path: Path) -> Callable[..., Any]:
    installed = scenarios.ensure_installed(tui.package, tui.key)
    return lambda **options: real_agent_session(
        tui.agent, tmp_path, installed, spec_of=tui.spec, catch_up=True, **options
    )


def row(h: Harness, tui: Tui, scenario: str, receipt: Any, **extra: Any) -> None:
    scenarios.record_receipt(h, tui.key, tui.package, scenario, receipt, extra)


async def quick_completes(h: Harness, text: str = "quick") -> ev.TurnEnded:
    turn = await h.session.prompt(text)
    ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert ended.outcome == "completed", (ended, h.model.describe())
    return ended


async def stream_started(h: Harness, after: int) -> Any:
    """A ``stream`` turn whose model stream has sent tokens: the turn and the stream."""
    turn = await h.session.prompt("stream")
    stream = await h.model.wait_for(
        lambda e: e.id > after and e.streaming_tokens and e.tokens_sent >= 3, timeout=60
    )
    return turn, stream


def last_id(h: Harness) -> int:
    return max((e.id for e in h.model.snapshot()), default=0)


async def test_turn_completes_and_a_stop_cancels(open_tui: Any, tui: Tui) -> None:
    with trio.fail_after(BOUND_S):
        async with open_tui() as h:
            await quick_completes(h)
            assert h.model.find(lambda e: e.scenario == "quick" and e.has_tools), h.model.describe()
            turn, stream = await stream_started(h, last_id(h))
            cancelled_at = time.monotonic()
            receipt = await h.session.cancel()
            if tui.hangs_up:
                gone = await scenarios.stream_ended(h, stream, timeout=30)
            else:
                [gone] = h.model.find(lambda e: e.id == stream.id)
            row(
                h,
                tui,
                "stream",
                receipt,
                model_gone_ms=ms_after(cancelled_at, gone.disconnected_at),
                notes=[] if tui.hangs_up else [f"hung_up={gone.disconnected_at is not None}"],
            )
            assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
            assert receipt.escalation == ["interrupt"], receipt
            assert receipt.elapsed_ms < GRACE_S * 1000
            if tui.hangs_up:
                scenarios.assert_stream_abandoned(h, gone, cancelled_at)
            await quick_completes(h)


async def test_killed_past_the_grace_and_resumed(open_tui: Any, tui: Tui) -> None:
    with trio.fail_after(BOUND_S):
        async with open_tui(grace_s=0.0, keep_bodies=True) as h:
            turn, stream, tree = await scenarios.killed_mid_stream(h)
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


async def test_prompt_stop_cycles_leave_no_process(open_tui: Any, tui: Tui) -> None:
    with trio.fail_after(CYCLES_BOUND_S):
        async with open_tui() as h:
            elapsed = []
            for _ in range(CYCLES):
                turn, _stream = await stream_started(h, last_id(h))
                receipt = await h.session.cancel()
                assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id), receipt
                assert receipt.escalation == ["interrupt"], receipt  # the TUI did not exit
                elapsed.append(receipt.elapsed_ms)
            tree = [p for p in psutil.Process().children(recursive=True) if not is_holder(p)]
            assert tree, "no TUI process while the session runs"
        row(
            h,
            tui,
            "cycles",
            receipt,
            notes=[f"cycles={CYCLES}", f"cancel_ms_max={max(elapsed):.0f}"],
        )
        left = await scenarios.wait_gone(tree)
        assert left == [], [scenarios.command_of(p) for p in left]
        home = str(h.prepared.home)
        strays = [
            p.pid for p in psutil.process_iter() if home in " ".join(_cmdline(p)) or _cwd(p) == home
        ]
        assert strays == [], strays


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
