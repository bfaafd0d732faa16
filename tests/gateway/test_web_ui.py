"""The web UI end to end: the real gateway and demo agent, driven through headless Chromium.

The gateway runs on trio in a background thread (its own ``trio.run``), Playwright's sync API
drives the browser from the test thread; both on the real clock. Every wait is on a page
condition (Playwright's ``expect``), never a sleep.

Needs Debian's chromium (``scripts/ensure-chromium.sh``; another binary with
``AGENT_SUPERVISOR_CHROMIUM=PATH``); without it the tests skip, unless
``AGENT_SUPERVISOR_STRICT_SKIPS=1`` (CI), where a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from hosts import env_node

from supervisor.config import AgentSpec
from supervisor.demo_agent import DEMO_WORDS
from supervisor.gateway import Gateway
from supervisor.supervisor import open_supervisor

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - reported by the browser fixture
    sync_playwright = None  # type: ignore[assignment]

pytestmark = pytest.mark.real_process

TOKEN = "web-ui-test-token"
CHROMIUM = (
    os.environ.get("AGENT_SUPERVISOR_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)
SCREENSHOT = "/tmp/web-ui.png"
STOPS_SCREENSHOT = "/tmp/web-ui-stops.png"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
#: Generous bound for one page condition; a healthy run meets each in well under a second,
#: except the stubborn agent's kill (1 s grace, then respawn and resume).
WAIT_MS = 15_000


def words(n: int) -> list[str]:
    """The first ``n`` words the demo agent streams."""
    return [DEMO_WORDS[i % len(DEMO_WORDS)] for i in range(n)]


# -- the gateway, in a thread of its own ---------------------------------------------------------


class GatewayThread:
    """``open_supervisor`` + ``Gateway`` under ``trio.run`` in a daemon thread."""

    def __init__(self) -> None:
        self.url = ""
        self._started: queue.Queue[BaseException | None] = queue.Queue()
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()
        failure = self._started.get(timeout=30)
        if failure is not None:
            raise RuntimeError("the gateway did not start") from failure

    def stop(self) -> None:
        if self._trio_token is not None and self._stop is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._trio_token)
        self._thread.join(timeout=20)
        assert not self._thread.is_alive(), "the gateway thread did not stop"
        if not self._started.empty():
            raise RuntimeError("the gateway failed while serving") from self._started.get()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._started.put(exc)

    async def _main(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        demo = AgentSpec.from_config("demo")
        agents = {
            "demo": demo.with_args("--delay", "0.03"),
            # The spec's own name is what agents.list reports, so it matches the key here.
            "stubborn": demo.with_args("--delay", "0.03", "--ignore-cancel").with_options(
                name="stubborn", grace_s=1.0
            ),
            # Stubborn, and it cannot resume: its fresh session gets the conversation so far.
            "forgetful": demo.with_args(
                "--delay", "0.03", "--ignore-cancel", "--no-load"
            ).with_options(name="forgetful", grace_s=1.0),
            # The demo agent without steering: a steer makes the turn stop and go first.
            "plain": demo.with_args("--delay", "0.03", "--no-steering").with_options(name="plain"),
            # On a "host" reached through the env transport: this machine, through a node.
            "remote-demo": demo.with_args("--delay", "0.03").with_options(
                name="remote-demo", hosts=("here",)
            ),
        }
        hosts = {"here": env_node(tempfile.mkdtemp(prefix="web-ui-node-"), detach_s=5.0)}
        async with (
            open_supervisor(agents=agents, hosts=hosts) as sup,
            trio.open_nursery() as nursery,
        ):
            server = Gateway(sup, port=0, token=TOKEN)
            self.url = await nursery.start(server.serve)
            self._started.put(None)
            await self._stop.wait()
            nursery.cancel_scope.cancel()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    reason = None
    if sync_playwright is None:
        reason = "the playwright package is not installed"
    elif not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        reason = f"chromium is not installed at {CHROMIUM} (run scripts/ensure-chromium.sh)"
    if reason is not None:
        if os.environ.get("AGENT_SUPERVISOR_STRICT_SKIPS") == "1":
            pytest.fail(
                f"{reason}; AGENT_SUPERVISOR_STRICT_SKIPS=1, so this fails instead of skipping"
            )
        pytest.skip(reason)
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server(browser: Browser) -> Iterator[GatewayThread]:
    gateway = GatewayThread()
    gateway.start()
    yield gateway
    gateway.stop()


def watch_for_problems(page: Page, problems: list[str]) -> None:
    """Uncaught exceptions and console errors (CSP violations among them) fail the test."""
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}") if message.type == "error" else None
        ),
    )


@pytest.fixture
def page(browser: Browser, server: GatewayThread) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    problems: list[str] = []
    watch_for_problems(page, problems)
    page.problems = problems  # type: ignore[attr-defined]
    page.expected_problem = None  # type: ignore[attr-defined]
    yield page
    context.close()
    expected = page.expected_problem  # type: ignore[attr-defined]
    unexpected = [p for p in problems if expected is None or expected not in p]
    assert unexpected == [], unexpected


# -- helpers -------------------------------------------------------------------------------------


def open_app(page: Page, server: GatewayThread) -> None:
    response = page.goto(server.url)
    assert response is not None and response.status == 200
    assert "connect-src 'self'" in response.headers["content-security-policy"]
    expect(page.get_by_test_id("connection")).to_have_text("Connected")


def start_session(page: Page, agent: str) -> str:
    page.get_by_test_id("agent-select").select_option(agent)
    page.get_by_test_id("start-session").click()
    expect(page.get_by_test_id("status")).to_have_text("ready")
    expect(page.locator("[data-testid=session-item][aria-current=true]")).to_contain_text(agent)
    session_id: str = page.evaluate("window.__agentSupervisorTestHooks.info().sessionId")
    return session_id


def send(page: Page, text: str) -> None:
    prompt = page.get_by_test_id("prompt")
    expect(prompt).to_be_enabled()
    prompt.fill(text)
    prompt.press("Enter")
    expect(prompt).to_have_value("")


def turn(page: Page, index: int) -> Any:
    return page.get_by_test_id("turn").nth(index)


def assistant_words(page: Page, index: int) -> list[str]:
    texts = turn(page, index).get_by_test_id("assistant-message").all_text_contents()
    return " ".join(texts).split()


def expect_completed(page: Page, index: int, n_words: int) -> None:
    expect(turn(page, index).get_by_test_id("turn-outcome")).to_contain_text("Completed")
    assert assistant_words(page, index) == words(n_words)


# -- scenarios -----------------------------------------------------------------------------------


def test_stop_mid_stream_then_prompt_again(page: Page, server: GatewayThread) -> None:
    open_app(page, server)
    session_id = start_session(page, "demo")
    stop = page.get_by_test_id("stop")
    expect(stop).to_be_hidden()
    # A second tab watches the same session: it sees the turn and the other tab's receipt.
    observer = page.context.new_page()
    watch_for_problems(observer, page.problems)  # type: ignore[attr-defined]
    open_app(observer, server)
    observer.locator(f"[data-testid=session-item][data-session-id={session_id}]").click()
    expect(observer.get_by_test_id("status")).to_have_text("ready")
    send(page, "tell me a long story words=400")
    expect(stop).to_be_visible()
    expect(observer.get_by_test_id("stop")).to_be_visible()
    expect(page.get_by_test_id("status")).to_have_text("running")
    expect(turn(page, 0).get_by_test_id("user-message")).to_have_text(
        "tell me a long story words=400"
    )
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo agent")
    stop.click()
    expect(page.get_by_test_id("receipt")).to_have_text(re.compile(r"^Cancelled in \d+ ms$"))
    expect(stop).to_be_hidden()
    expect(page.get_by_test_id("prompt")).to_be_enabled()
    expect(turn(page, 0).get_by_test_id("turn-outcome")).to_have_text(
        re.compile(r"^Cancelled in \d+ ms$")
    )
    streamed = assistant_words(page, 0)
    assert 4 <= len(streamed) < 400 and streamed == words(len(streamed))
    expect(page.get_by_test_id("status")).to_have_text("ready")
    expect(observer.get_by_test_id("receipt")).to_have_text(
        page.get_by_test_id("receipt").inner_text()
    )
    expect(observer.get_by_test_id("stop")).to_be_hidden()
    assert turn(observer, 0).get_by_test_id("assistant-message").text_content() == (
        turn(page, 0).get_by_test_id("assistant-message").text_content()
    )
    observer.close()

    send(page, "and now a short one words=6")
    expect_completed(page, 1, 6)
    expect(stop).to_be_hidden()
    expect(page.get_by_test_id("status")).to_have_text("ready")


def steer(page: Page, text: str) -> None:
    prompt = page.get_by_test_id("prompt")
    expect(page.get_by_test_id("steer")).to_be_visible()
    prompt.fill(text)
    prompt.press("Control+Enter")
    expect(prompt).to_have_value("")


def test_steer_a_running_turn_natively_then_by_interrupting(
    page: Page, server: GatewayThread
) -> None:
    open_app(page, server)
    start_session(page, "demo")
    expect(page.get_by_test_id("steer")).to_be_hidden()
    send(page, "tell me a long story words=400")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo agent")
    steer(page, "make it about trio")
    expect(page.get_by_test_id("receipt")).to_have_text("Steered: the running turn took your text")
    # One turn took both: the steered text inside it, the agent's answer to it after.
    expect(page.get_by_test_id("turn")).to_have_count(1)
    expect(turn(page, 0).get_by_test_id("steered-message")).to_contain_text("make it about trio")
    expect(turn(page, 0)).to_contain_text("Steered: make it about trio.")
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("stop")).to_be_hidden()

    start_session(page, "plain")
    send(page, "tell me a long story words=400")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo agent")
    steer(page, "shorter please words=5")
    expect(page.get_by_test_id("receipt")).to_have_text(
        re.compile(
            r"^Steered: this agent cannot take text mid-turn, so the turn was stopped"
            r" \(Cancelled in \d+ ms\) and your text started the next one$"
        )
    )
    expect(turn(page, 0).get_by_test_id("turn-outcome")).to_have_text(
        re.compile(r"^Cancelled in \d+ ms$")
    )
    expect(turn(page, 1).get_by_test_id("user-message")).to_contain_text("shorter please")
    expect(turn(page, 1).get_by_test_id("steer-badge")).to_have_text("steered · interrupted")
    expect_completed(page, 1, 5)


def test_a_session_on_another_host_shows_its_host(page: Page, server: GatewayThread) -> None:
    open_app(page, server)
    page.get_by_test_id("agent-select").select_option("remote-demo")
    page.get_by_test_id("start-session").click()
    expect(page.get_by_test_id("status")).to_have_text("ready")
    current = page.locator("[data-testid=session-item][aria-current=true]")
    expect(current.get_by_test_id("session-agent")).to_have_text("remote-demo @ here")
    expect(current).to_have_attribute("aria-label", re.compile(r"\(remote-demo @ here, "))
    send(page, "hello from afar words=5")
    expect_completed(page, 0, 5)


def test_stop_a_stubborn_agent_kills_and_resumes(page: Page, server: GatewayThread) -> None:
    open_app(page, server)
    start_session(page, "stubborn")
    send(page, "ignore my stop words=400")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo agent")
    stop = page.get_by_test_id("stop")
    stop.click()
    # Terminate-then-respond: the cancel is in flight for the whole 1 s grace, then the kill.
    expect(stop).to_contain_text("Stopping…")
    expect(stop.locator(".spinner")).to_be_visible()
    expect(stop).to_be_disabled()
    expect(page.get_by_test_id("prompt")).to_be_disabled()
    expect(page.get_by_test_id("receipt")).to_have_text("Killed after 1.0 s grace, session resumed")
    expect(turn(page, 0).get_by_test_id("turn-outcome")).to_have_text(
        "Killed after 1.0 s grace, session resumed"
    )
    expect(stop).to_be_hidden()
    expect(page.get_by_test_id("prompt")).to_be_enabled()
    expect(page.get_by_test_id("status")).to_have_text("ready")

    send(page, "are you back words=6")
    expect_completed(page, 1, 6)


def test_an_agent_that_cannot_resume_is_given_the_conversation_and_the_page_says_so(
    page: Page, server: GatewayThread
) -> None:
    open_app(page, server)
    start_session(page, "forgetful")
    send(page, "remember the word kumquat words=400")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo agent")
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("receipt")).to_contain_text("Killed after 1.0 s grace")
    expect(turn(page, 0).get_by_test_id("context-note")).to_have_count(0)
    send(page, "what did I say words=6")
    expect(turn(page, 1).get_by_test_id("turn-outcome")).to_contain_text("Completed")
    # The demo agent shows it read the conversation: it names what was said before.
    expect(turn(page, 1).get_by_test_id("assistant-message")).to_contain_text("kumquat")
    note = turn(page, 1).get_by_test_id("context-note")
    expect(note).to_have_text(re.compile(r"^earlier conversation given to the agent as context"))
    # The transcript shows the user's own prompt, never the context put in front of it.
    expect(turn(page, 1).get_by_test_id("user-message")).to_have_text("what did I say words=6")


def stop_marks(page: Page, chart: str, session_id: str) -> Any:
    return page.locator(
        f"[data-testid={chart}] [data-testid=stop-mark][data-session-id={session_id}]"
    )


def test_the_stops_are_charted_for_the_session_and_the_gateway(
    page: Page, server: GatewayThread
) -> None:
    """A cancel and a kill: a mark each, in the shown session's chart and in every session's,
    the kill a triangle of another colour, each titled with its receipt's summary; drawn on the
    page itself (no request leaves the gateway)."""
    base = server.url.split("/?")[0]
    elsewhere: list[str] = []
    page.on("request", lambda r: elsewhere.append(r.url) if not r.url.startswith(base) else None)
    open_app(page, server)
    session_chart = page.get_by_test_id("stops-session")
    gateway_chart = page.get_by_test_id("stops-gateway")
    polite = start_session(page, "demo")
    expect(session_chart).to_have_attribute("aria-label", f"Stops of session {polite}: none yet")
    send(page, "tell me a long story words=400")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo agent")
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("receipt")).to_have_text(re.compile(r"^Cancelled in \d+ ms$"))
    cancelled = stop_marks(page, "stops-session", polite)
    expect(cancelled).to_have_count(1)
    expect(cancelled).to_have_attribute("data-outcome", "cancelled")
    expect(cancelled.locator("title")).to_have_text(
        re.compile(r"^Cancelled in \d+ ms\nturn t1\n[\d.]+ ms, reason: web\ninterrupt\n")
    )
    expect(session_chart).to_have_attribute(
        "aria-label", f"Stops of session {polite}: 1 (1 cancelled)"
    )
    expect(stop_marks(page, "stops-gateway", polite)).to_have_count(1)

    stubborn = start_session(page, "stubborn")
    expect(session_chart).to_have_attribute("aria-label", f"Stops of session {stubborn}: none yet")
    send(page, "ignore my stop words=400")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo agent")
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("receipt")).to_have_text("Killed after 1.0 s grace, session resumed")
    killed = stop_marks(page, "stops-session", stubborn)
    expect(killed).to_have_count(1)
    expect(killed).to_have_attribute("data-outcome", "killed")
    expect(session_chart).to_have_attribute(
        "aria-label", f"Stops of session {stubborn}: 1 (1 killed)"
    )
    # Every session's chart: both stops, told apart by shape and by colour, each titled.
    in_gateway = {
        "cancelled": stop_marks(page, "stops-gateway", polite),
        "killed": stop_marks(page, "stops-gateway", stubborn),
    }
    expect(in_gateway["killed"]).to_have_count(1)
    expect(in_gateway["killed"].locator("title")).to_contain_text(
        f"Killed after 1.0 s grace, session resumed\nsession {stubborn} (stubborn), turn t1\n"
    )
    expect(in_gateway["cancelled"].locator("title")).to_contain_text(f"session {polite} (demo)")
    look = {
        outcome: marks.evaluate(
            "m => [m.tagName, m.dataset.shape, getComputedStyle(m).fill, m.getBBox().x]"
        )
        for outcome, marks in in_gateway.items()
    }
    assert look["cancelled"][:2] == ["circle", "dot"] and look["killed"][:2] == [
        "polygon",
        "triangle",
    ]
    assert look["cancelled"][2] != look["killed"][2]
    assert look["killed"][3] > look["cancelled"][3]  # a second, against milliseconds
    # (the other tests' stops are there too: the text alternative counts what is drawn)
    kills = gateway_chart.locator("[data-testid=stop-mark][data-outcome=killed]").count()
    marks = gateway_chart.get_by_test_id("stop-mark").count()
    expect(gateway_chart).to_have_attribute(
        "aria-label", re.compile(rf"^Stops of all sessions: {marks} \(.*\b{kills} killed\)$")
    )
    page.locator("section.stops").screenshot(path=STOPS_SCREENSHOT)

    # Back to the first session: its chart again, from its history.
    page.locator(f"[data-testid=session-item][data-session-id={polite}]").click()
    expect(stop_marks(page, "stops-session", polite)).to_have_count(1)
    expect(stop_marks(page, "stops-session", stubborn)).to_have_count(0)
    assert elsewhere == []


def test_permission_allow_then_a_cancel_resolves_the_card(
    page: Page, server: GatewayThread
) -> None:
    open_app(page, server)
    start_session(page, "demo")
    send(page, "run it with permission words=40")
    card = turn(page, 0).get_by_test_id("permission")
    expect(card).to_contain_text("Run `echo hello`")
    tool = turn(page, 0).get_by_test_id("tool-call")
    expect(tool.locator(".status")).to_have_text("pending")
    allow = card.locator("[data-testid=permission-option][data-option-kind=allow_once]")
    expect(allow).to_have_text("Allow once")
    expect(
        card.locator("[data-testid=permission-option][data-option-kind=reject_once]")
    ).to_have_text("Reject")
    allow.click()
    expect(card.get_by_test_id("permission-outcome")).to_have_text("✓ Allow once")
    for button in card.get_by_test_id("permission-option").all():
        expect(button).to_be_disabled()
    expect(tool.locator(".status")).to_have_text("completed")
    expect(tool).to_contain_text("hello")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I need no keys")
    expect(page.get_by_test_id("stop")).to_be_visible()
    page.screenshot(path=SCREENSHOT)  # mid-turn: thought, plan, tool, answered card, streaming
    expect_completed(page, 0, 40)

    # A stop while a permission is pending: the supervisor answers it, the card says so.
    send(page, "permission again")
    card = turn(page, 1).get_by_test_id("permission")
    expect(card.get_by_test_id("permission-option").first).to_be_enabled()
    page.get_by_test_id("stop").click()
    expect(card.get_by_test_id("permission-outcome")).to_have_text(
        re.compile("Cancelled by the supervisor")
    )
    for button in card.get_by_test_id("permission-option").all():
        expect(button).to_be_disabled()
    expect(page.get_by_test_id("receipt")).to_have_text(re.compile(r"^Cancelled in \d+ ms$"))
    expect(page.get_by_test_id("prompt")).to_be_enabled()


def test_reconnect_replays_missed_events_without_duplicates(
    page: Page, server: GatewayThread
) -> None:
    sent: list[list[dict[str, Any]]] = []  # the frames the page sent, per WebSocket

    def on_websocket(ws: Any) -> None:
        frames: list[dict[str, Any]] = []
        sent.append(frames)
        ws.on("framesent", lambda payload: frames.append(json.loads(payload)))

    page.on("websocket", on_websocket)
    open_app(page, server)
    session_id = start_session(page, "demo")
    send(page, "stream while I drop words=60")
    expect(turn(page, 0).get_by_test_id("assistant-message")).to_contain_text("I am the demo")
    page.evaluate("window.__agentSupervisorTestHooks.dropConnection()")
    # The turn goes on while the page is away; it reconnects and asks for what it missed.
    connection = page.get_by_test_id("connection")
    expect(connection).to_have_attribute("data-connects", "2")
    expect(connection).to_have_text("Connected")
    # A replay of everything from seq 0 must not show anything twice either.
    page.evaluate("window.__agentSupervisorTestHooks.resubscribe(0)")
    expect_completed(page, 0, 60)
    one_turn = turn(page, 0)
    expect(one_turn.get_by_test_id("assistant-message")).to_have_count(1)
    expect(one_turn.get_by_test_id("user-message")).to_have_count(1)
    expect(one_turn.get_by_test_id("thought")).to_have_count(1)
    expect(one_turn.get_by_test_id("plan")).to_have_count(1)
    expect(page.get_by_test_id("turn")).to_have_count(1)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    info = page.evaluate("window.__agentSupervisorTestHooks.info()")
    assert info["connected"] and info["runningTurn"] is None and info["state"] == "ready"
    # The new socket resumed from the last seq the page had seen, not from scratch.
    assert len(sent) == 2
    resumed = next(f["payload"] for f in sent[1] if f["action"] == "session.subscribe")
    assert resumed["session_id"] == session_id and 0 < resumed["since_seq"] < info["lastSeq"]

    # Cut off for lagging: the page resubscribes from its last seq.
    lagged = {
        "event": "subscription.lagged",
        "session_id": session_id,
        "seq": None,
        "data": {"last_seq": info["lastSeq"]},
    }
    page.evaluate("message => window.__agentSupervisorTestHooks.inject(message)", lagged)
    send(page, "after the drop words=5")
    expect_completed(page, 1, 5)
    subscribes = [f["payload"] for f in sent[1] if f["action"] == "session.subscribe"]
    assert {"session_id": session_id, "since_seq": info["lastSeq"]} in subscribes
    expect(page.get_by_test_id("assistant-message")).to_have_count(2)


def test_a_store_that_cannot_be_written_is_said_until_it_recovers(
    page: Page, server: GatewayThread
) -> None:
    """The gateway's ``store.error`` (sent for real by ``tests/store/test_store_notices.py``)
    shows a banner naming the store, what waits and whether agents are held back, with the
    error as text; ``store.recovered`` takes it away."""
    open_app(page, server)
    banner = page.get_by_test_id("store-banner")
    expect(banner).to_be_hidden()
    error = {
        "event": "store.error",
        "session_id": None,
        "seq": None,
        "data": {
            "where": "/state/sessions.db",
            "error": "/state/sessions.db: <b>disk full</b>",
            "since": 1.0,
            "retrying": True,
            "waiting": 12,
            "held": True,
            "sessions": [{"session_id": "s1", "from_seq": 3, "to_seq": 14}],
        },
    }
    page.evaluate("message => window.__agentSupervisorTestHooks.inject(message)", error)
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("The session store (/state/sessions.db) cannot be written")
    expect(banner).to_contain_text("<b>disk full</b>")  # as text, never as markup
    expect(banner).to_contain_text("12 events wait; retrying. Agents are held back")
    recovered = {
        "event": "store.recovered",
        "session_id": None,
        "seq": None,
        "data": {"where": "/state/sessions.db", "failed_s": 2.5},
    }
    page.evaluate("message => window.__agentSupervisorTestHooks.inject(message)", recovered)
    expect(banner).to_be_hidden()


def test_without_a_token_the_page_asks_for_one(page: Page, server: GatewayThread) -> None:
    # Chromium logs each 401 (the page, its favicon) as a console error, whenever it likes.
    page.expected_problem = "status of 401"  # type: ignore[attr-defined]
    base = server.url.split("?")[0]
    for url in (base, base + "?token=wrong"):
        response = page.goto(url)
        assert response is not None and response.status == 401
        expect(page).to_have_title("Token needed")
        expect(page.locator("body")).to_contain_text("?token=")


def test_the_token_leaves_the_address_bar_and_history(page: Page, server: GatewayThread) -> None:
    open_app(page, server)
    base = server.url.split("?")[0]
    assert page.url == base
    # A reload still works (this tab keeps the token; a cookie lets the page itself load)...
    response = page.reload()
    assert response is not None and response.status == 200
    expect(page.get_by_test_id("connection")).to_have_text("Connected")
    assert page.url == base
    # ...and the history holds the page without it.
    page.goto("about:blank")
    page.go_back()
    assert page.url == base
    expect(page.get_by_test_id("connection")).to_have_text("Connected")
