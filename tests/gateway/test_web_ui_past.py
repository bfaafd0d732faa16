"""The web UI's past sessions and search, end to end: a real ``serve`` with the demo agent and a
SQLite store in the test's directory, stopped and started again on the same store, the page
driven through headless Chromium (``test_web_ui.py`` says what it needs). Every wait is on a
page condition, never a sleep.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_web_ui import (  # noqa: F401 - browser: the module's Chromium, a fixture
    browser,
    expect_completed,
    send,
    turn,
    watch_for_problems,
)

from served import ROOT, demo_command, write_config

try:
    from playwright.sync_api import Browser, Page, expect
except ImportError:  # pragma: no cover - reported by the browser fixture
    pass

pytestmark = pytest.mark.real_process

SCREENSHOT = "/tmp/web-ui-past.png"
SEARCH_SCREENSHOT = "/tmp/web-ui-search.png"
#: Generous: a loaded 2-core machine starts and stops ``serve`` in well under a second.
SERVE_S = 30.0

#: The first prompts: one word in each that no other transcript holds; markup and brackets of
#: the text's own (shown as text, never as markup or as a found word), and a bidi override
#: (shown as its escape: it reorders nothing around it).
FIRST = "tell me about <b>zebras</b> [striped] words=5"
SECOND = "and giraffes \u202eevil words=4"


@contextmanager
def serving(tmp_path: Path, config: Path, store: str) -> Iterator[str]:
    """``agent-supervisor serve`` on a free port and ``store``: its ``ready`` URL; stopped
    gracefully (SIGTERM) on leaving, as Ctrl-C stops it."""
    env = dict(os.environ)
    env.pop("AGENT_SUPERVISOR_TOKEN", None)
    env["AGENT_SUPERVISOR_STATE_DIR"] = str(tmp_path / "supervisor-state")
    with (tmp_path / "serve.err").open("ab") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "serve", "--port", "0"]
            + ["--config", str(config), "--store", store],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    lines: queue.Queue[bytes] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None

    def read() -> None:  # (a thread: a pipe read has no timeout of its own)
        for line in stdout:
            lines.put(line)
        lines.put(b"")  # it exited

    threading.Thread(target=read, daemon=True).start()
    try:
        line = lines.get(timeout=SERVE_S)
        match = re.match(rb"ready (\S+)\n", line)
        assert match, (line, (tmp_path / "serve.err").read_text())
        yield match.group(1).decode()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=SERVE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def opened(chromium: Browser, url: str) -> Iterator[Page]:
    """A fresh page on ``url``, connected; its uncaught errors fail the test."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    problems: list[str] = []
    watch_for_problems(page, problems)
    response = page.goto(url)
    assert response is not None and response.status == 200
    expect(page.get_by_test_id("connection")).to_have_text("Connected")
    yield page
    context.close()
    assert problems == [], problems


def start_session(page: Page, n: int) -> str:
    """Start the page's ``n``-th session of the demo agent (``talker``); its id."""
    page.get_by_test_id("agent-select").select_option("talker")
    page.get_by_test_id("start-session").click()
    expect(page.get_by_test_id("session-item")).to_have_count(n)
    current = page.locator("[data-testid=session-item][aria-current=true]")
    expect(current).to_have_attribute("data-session-id", f"s{n}")
    expect(page.get_by_test_id("status")).to_have_text("ready")
    return f"s{n}"


def past(page: Page, session_id: str) -> Any:
    return page.locator(f"[data-testid=past-session][data-session-id={session_id}]")


@pytest.fixture
def two_stored_sessions(tmp_path: Path, browser: Browser) -> tuple[Path, str, str, str]:  # noqa: F811
    """Two sessions of the demo agent, a turn each, through the page; then ``serve`` stops.
    (config, store URL, first session id, second session id)"""
    config = write_config(
        tmp_path, {"talker": {"command": demo_command(tmp_path, "--delay", "0.01")}}
    )
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with serving(tmp_path, config, store) as url, opened(browser, url) as page:
        one = start_session(page, 1)
        send(page, FIRST)
        expect_completed(page, 0, 5)
        two = start_session(page, 2)
        send(page, SECOND)
        expect_completed(page, 0, 4)
        # Running sessions are no past ones.
        expect(page.get_by_test_id("past-sessions")).to_be_hidden()
    return config, store, one, two


def test_past_sessions_are_listed_opened_and_brought_back(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    two_stored_sessions: tuple[Path, str, str, str],
) -> None:
    config, store, one, two = two_stored_sessions
    with serving(tmp_path, config, store) as url, opened(browser, url) as page:
        # Both, under today, the newest first, each with its agent and first prompt.
        listed = page.get_by_test_id("past-session")
        expect(listed).to_have_count(2)
        expect(page.get_by_test_id("past-day")).to_have_text(["Today"])
        assert [item.get_attribute("data-session-id") for item in listed.all()] == [two, one]
        expect(past(page, one).get_by_test_id("past-prompt")).to_have_text(FIRST)
        expect(past(page, two).get_by_test_id("past-prompt")).to_have_text(
            "and giraffes \\u202eevil words=4"
        )
        expect(past(page, one)).to_contain_text("talker")
        expect(page.get_by_test_id("session-item")).to_have_count(0)  # none running
        page.screenshot(path=SCREENSHOT)

        # Opened: its transcript and receipt from the store, the agent not running.
        past(page, one).click()
        expect(turn(page, 0).get_by_test_id("user-message")).to_have_text(FIRST)
        expect_completed(page, 0, 5)
        expect(page.get_by_test_id("status")).to_have_text("stopped")
        expect(page.get_by_test_id("note")).to_have_count(0)  # no "closed its stream"

        # A prompt there starts it again: the turn streams on the same page.
        send(page, "are you back words=3")
        expect_completed(page, 1, 3)
        expect(page.get_by_test_id("status")).to_have_text("ready")
        expect(turn(page, 0).get_by_test_id("user-message")).to_have_text(FIRST)
        # Running again: listed with the live sessions, no more with the past ones.
        expect(page.locator(f"[data-testid=session-item][data-session-id={one}]")).to_be_visible()
        expect(past(page, one)).to_have_count(0)
        expect(past(page, two)).to_have_count(1)

        # Reloaded, the page opens it afresh: its whole transcript, before and after the restart.
        page.reload()
        expect(page.get_by_test_id("connection")).to_have_text("Connected")
        expect(turn(page, 0).get_by_test_id("user-message")).to_have_text(FIRST)
        expect_completed(page, 0, 5)
        expect_completed(page, 1, 3)
        expect(page.get_by_test_id("note")).to_have_count(0)  # no "no longer available"
        expect(page.get_by_test_id("error-note")).to_have_count(0)


def test_the_search_box_finds_words_of_one_transcript(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    two_stored_sessions: tuple[Path, str, str, str],
) -> None:
    config, store, one, two = two_stored_sessions
    with serving(tmp_path, config, store) as url, opened(browser, url) as page:
        search = page.get_by_test_id("search")
        hits = page.get_by_test_id("search-hit")
        search.fill("Zebras")
        expect(hits).to_have_count(1)
        expect(hits).to_have_attribute("data-session-id", one)
        snippet = hits.get_by_test_id("search-snippet")
        # The word found is marked; the text's own markup and brackets are text.
        expect(snippet.locator("mark")).to_have_text(["zebras"])
        expect(snippet).to_contain_text("<b>zebras</b> [striped]")
        expect(snippet.locator("b")).to_have_count(0)
        page.screenshot(path=SEARCH_SCREENSHOT)

        search.fill("giraffes")
        expect(hits).to_have_count(1)
        expect(hits).to_have_attribute("data-session-id", two)
        expect(hits.get_by_test_id("search-snippet").locator("mark")).to_have_text(["giraffes"])

        search.fill("okapi")
        expect(hits).to_have_count(0)
        expect(page.get_by_test_id("search-note")).to_have_text("No matches for “okapi”.")

        # A hit opens its session, the turn it names shown and marked.
        search.fill("zebras")
        expect(hits).to_have_count(1)
        hits.click()
        found = page.locator("[data-testid=turn][data-turn-id=t1].found")
        expect(found).to_be_visible()
        expect(found.get_by_test_id("user-message")).to_have_text(FIRST)
        assert page.evaluate("window.__agentSupervisorTestHooks.info().sessionId") == one
