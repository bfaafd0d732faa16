"""The web UI's terminal view, end to end: the real gateway and a fake TUI
(``tests/fakes/fake_tui.py``) in a pseudo-terminal, driven through headless Chromium
(``test_web_ui.py`` says what it needs). Keys typed in the view reach the TUI through
``session.input``, the view's size through ``session.resize``, and a page opened late draws
the screen from its picture. Every wait is on a page condition, never a sleep.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from test_web_ui import (  # noqa: F401 - browser: the module's Chromium, a fixture
    GatewayThread,
    browser,
    open_app,
    send,
    start_session,
    turn,
    watch_for_problems,
)

from paths import TESTS
from protocols.terminal import TerminalSettings
from supervisor.config import AgentSpec
from supervisor.gateway import Gateway
from supervisor.supervisor import open_supervisor

try:
    from playwright.sync_api import Browser, Page, expect
except ImportError:  # pragma: no cover - reported by the browser fixture
    pass

pytestmark = pytest.mark.real_process

SCREENSHOT = "/tmp/web-ui-terminal.png"
#: Events a session keeps: few, so that a page opened after a few turns cannot rebuild the
#: screen from the replay (the first answer's output is gone from it) and needs the picture.
HISTORY = 12
TOKEN = "web-ui-test-token"


class TerminalGateway(GatewayThread):
    """The gateway with one agent: the fake TUI, as a terminal agent."""

    async def _main(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        command = [sys.executable, str(TESTS / "fakes" / "fake_tui.py")]
        tui = AgentSpec(
            name="tui",
            protocol="terminal",
            command=command,
            resume_command=(*command, "--resume"),
            terminal=TerminalSettings(idle_s=0.3, cols=100, rows=30),
            grace_s=2.0,
        )
        async with (
            open_supervisor(agents={"tui": tui}, history_size=HISTORY) as sup,
            trio.open_nursery() as nursery,
        ):
            self.url = await nursery.start(Gateway(sup, port=0, token=TOKEN).serve)
            self._started.put(None)
            await self._stop.wait()
            nursery.cancel_scope.cancel()


@pytest.fixture(scope="module")
def server(browser: Browser) -> Iterator[GatewayThread]:  # noqa: F811
    gateway = TerminalGateway()
    gateway.start()
    yield gateway
    gateway.stop()


@pytest.fixture
def page(browser: Browser, server: GatewayThread) -> Iterator[Page]:  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    problems: list[str] = []
    watch_for_problems(page, problems)
    page.problems = problems
    yield page
    page.screenshot(path=SCREENSHOT)
    context.close()
    assert problems == [], problems


def screen(page: Page) -> Any:
    """What xterm.js draws: its rows, as text."""
    return expect(page.get_by_test_id("terminal").locator(".xterm-rows"))


def fitted(page: Page) -> str:
    """The size the view fits its pane to, as the fake TUI prints it on SIGWINCH."""
    terminal = page.get_by_test_id("terminal")
    expect(terminal).to_have_attribute("data-cols", re.compile(r"^\d+$"))
    cols, rows = terminal.get_attribute("data-cols"), terminal.get_attribute("data-rows")
    return f"resized {cols}x{rows}"


def test_keys_typed_in_the_terminal_reach_the_tui_and_its_size_follows_the_page(
    page: Page, server: GatewayThread
) -> None:
    open_app(page, server)
    start_session(page, "tui")
    expect(page.get_by_test_id("terminal-pane")).to_be_visible()
    screen(page).to_contain_text("fake tui")
    # The view fits its pane, and the TUI is told (SIGWINCH: it prints its new size).
    size = fitted(page)
    assert size != "resized 100x30"
    screen(page).to_contain_text(size)

    page.get_by_test_id("terminal").click()
    page.keyboard.type("typed by hand")
    page.keyboard.press("Enter")
    screen(page).to_contain_text("answer: typed by hand")

    cols = page.get_by_test_id("terminal").get_attribute("data-cols")
    page.set_viewport_size({"width": 900, "height": 640})
    expect(page.get_by_test_id("terminal")).not_to_have_attribute("data-cols", str(cols))
    screen(page).to_contain_text(fitted(page))


def test_stop_mid_turn_in_a_terminal_session(page: Page, server: GatewayThread) -> None:
    open_app(page, server)
    start_session(page, "tui")
    screen(page).to_contain_text("fake tui")
    send(page, "a slow one")
    stop = page.get_by_test_id("stop")
    expect(stop).to_be_visible()
    screen(page).to_contain_text("more 3")
    stop.click()
    expect(page.get_by_test_id("receipt")).to_have_text(re.compile(r"^Cancelled in \d+ ms$"))
    screen(page).to_contain_text("interrupted")
    expect(stop).to_be_hidden()
    expect(turn(page, 0).get_by_test_id("turn-outcome")).to_have_text(
        re.compile(r"^Cancelled in \d+ ms$")
    )


def test_a_page_opened_late_draws_the_current_screen(
    page: Page,
    server: GatewayThread,
    browser: Browser,  # noqa: F811
) -> None:
    open_app(page, server)
    session_id = start_session(page, "tui")
    screen(page).to_contain_text("fake tui")
    for i, text in enumerate(["the first words", "two", "three", "four"]):
        send(page, text)
        expect(turn(page, i).get_by_test_id("turn-outcome")).to_contain_text("Completed")
    screen(page).to_contain_text("answer: four")

    late = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    watch_for_problems(late, page.problems)
    open_app(late, server)
    late.locator(f"[data-testid=session-item][data-session-id={session_id}]").click()
    # The replay no longer reaches the first answer: only the picture can show it.
    expect(late.get_by_test_id("transcript")).to_contain_text("no longer available")
    rows = expect(late.get_by_test_id("terminal").locator(".xterm-rows"))
    rows.to_contain_text("answer: the first words")
    rows.to_contain_text("answer: four")
    late.context.close()
