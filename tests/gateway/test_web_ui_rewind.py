"""The web UI's checkpoints, end to end: a real ``serve`` (checkpoints on: it has a state
directory) whose demo agent writes files in a directory of the test's (``write=NAME``), the page
driven through headless Chromium (``test_web_ui.py`` says what it needs). Each ended turn lists
what it changed, a file's diff opens on a click, Rewind and its Undo put the files back on disk
byte for byte, and Stop & rewind stops a running turn and undoes what it wrote. Every wait is
on a page condition or on the file itself, never a sleep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_web_ui import (  # noqa: F401 - browser: the module's Chromium, a fixture
    browser,
    expect_completed,
    send,
    turn,
)
from test_web_ui_past import opened, serving, start_session

from served import demo_command, write_config

try:
    from playwright.sync_api import Browser, Dialog, Page, expect
except ImportError:  # pragma: no cover - reported by the browser fixture
    pass

pytestmark = pytest.mark.real_process

SCREENSHOT = "/tmp/web-ui-rewind.png"
FIRST = "write=notes.txt words=3"
SECOND = "write=notes.txt write=extra.txt words=2 again"


def _serve_in(tmp_path: Path, work: Path) -> tuple[Path, str]:
    config = write_config(
        tmp_path,
        {"talker": {"command": demo_command(tmp_path, "--delay", "0.01"), "cwd": str(work)}},
    )
    return config, f"sqlite:///{tmp_path / 'sessions.db'}"


def _changes(page: Page, index: int) -> list[tuple[str | None, str | None]]:
    files = turn(page, index).get_by_test_id("change-file")
    return [(f.get_attribute("data-path"), f.get_attribute("data-change")) for f in files.all()]


def _accept(dialogs: list[str]) -> object:
    def answer(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    return answer


def test_each_turn_lists_its_changes_a_diff_opens_and_rewind_and_undo_restore_the_bytes(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_bytes(b"mine\n")
    config, store = _serve_in(tmp_path, work)
    notes = work / "notes.txt"
    with serving(tmp_path, config, store) as url, opened(browser, url) as page:
        start_session(page, 1)
        send(page, FIRST)
        expect_completed(page, 0, 3)
        expect(turn(page, 0).get_by_test_id("turn-changes")).to_contain_text("Changed 1 file")
        assert _changes(page, 0) == [("notes.txt", "added")]
        assert notes.read_bytes() == FIRST.encode() + b"\n"

        send(page, SECOND)
        expect_completed(page, 1, 2)
        expect(turn(page, 1).get_by_test_id("turn-changes")).to_contain_text("Changed 2 files")
        assert _changes(page, 1) == [("extra.txt", "added"), ("notes.txt", "modified")]
        after_second = notes.read_bytes()
        assert after_second == SECOND.encode() + b"\n"

        # A click on a file opens its diff (text, never markup); a second click closes it.
        edited = turn(page, 1).locator("[data-testid=change-file][data-path='notes.txt']")
        edited.click()
        diff = turn(page, 1).get_by_test_id("diff")
        expect(diff).to_contain_text(f"-{FIRST}")
        expect(diff).to_contain_text(f"+{SECOND}")
        expect(diff).to_contain_text("diff --git a/notes.txt b/notes.txt")
        page.screenshot(path=SCREENSHOT, full_page=True)
        edited.click()
        expect(diff).to_have_count(0)

        # Rewind the second turn, once confirmed: the files are as the first turn left them.
        dialogs: list[str] = []
        page.on("dialog", _accept(dialogs))
        turn(page, 1).get_by_test_id("rewind").click()
        result = turn(page, 1).get_by_test_id("rewind-result")
        expect(result).to_contain_text("2 files restored")
        assert len(dialogs) == 1 and "before t2" in dialogs[0]
        assert notes.read_bytes() == FIRST.encode() + b"\n"
        assert not (work / "extra.txt").exists()
        assert (work / "keep.txt").read_bytes() == b"mine\n"
        expect(page.get_by_test_id("note").last).to_contain_text("before t2: 2 restored")

        # Undo puts back what the rewind replaced (no question: it loses nothing).
        result.get_by_test_id("rewind-undo").click()
        expect(result.get_by_test_id("rewind-undo")).to_have_count(1)
        expect(page.get_by_test_id("note").last).to_contain_text("before r1: 2 restored")
        assert notes.read_bytes() == after_second
        assert (work / "extra.txt").exists()

        # Rewound to before the first turn: only the user's own file is left.
        turn(page, 0).get_by_test_id("rewind").click()
        expect(turn(page, 0).get_by_test_id("rewind-result")).to_contain_text("2 files restored")
        assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]
        assert len(dialogs) == 2
        expect(page.get_by_test_id("error-banner")).to_be_hidden()


def test_stop_and_rewind_stops_a_running_turn_and_removes_what_it_wrote(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "draft.txt").write_bytes(b"the user's draft\n")
    config, store = _serve_in(tmp_path, work)
    with serving(tmp_path, config, store) as url, opened(browser, url) as page:
        start_session(page, 1)
        stop_rewind = page.get_by_test_id("stop-rewind")
        expect(stop_rewind).to_be_hidden()
        send(page, "write=draft.txt write=new.txt slow")
        # Its words stream once its files are written.
        expect(turn(page, 0).get_by_test_id("assistant-message")).to_be_visible()
        assert (work / "new.txt").exists()
        assert (work / "draft.txt").read_bytes() != b"the user's draft\n"

        expect(stop_rewind).to_be_visible()
        stop_rewind.click()
        expect(turn(page, 0).get_by_test_id("turn-outcome")).to_contain_text("Cancelled")
        expect(page.get_by_test_id("receipt")).to_contain_text("Cancelled")
        expect(turn(page, 0).get_by_test_id("turn-changes")).to_contain_text("Changed 2 files")
        expect(turn(page, 0).get_by_test_id("rewind-result")).to_contain_text("2 files restored")
        assert (work / "draft.txt").read_bytes() == b"the user's draft\n"
        assert not (work / "new.txt").exists()
        expect(stop_rewind).to_be_hidden()
        expect(page.get_by_test_id("error-banner")).to_be_hidden()


def test_a_rewind_while_a_turn_runs_is_refused_in_the_banner(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    config, store = _serve_in(tmp_path, work)
    with serving(tmp_path, config, store) as url, opened(browser, url) as page:
        start_session(page, 1)
        send(page, "write=one.txt words=2")
        expect_completed(page, 0, 2)
        send(page, "slow")
        expect(turn(page, 1).get_by_test_id("assistant-message")).to_be_visible()
        page.on("dialog", _accept([]))
        turn(page, 0).get_by_test_id("rewind").click()
        expect(page.get_by_test_id("error-banner")).to_contain_text("busy")
        expect(page.get_by_test_id("error-banner")).to_contain_text("stop it first")
        assert (work / "one.txt").exists()
        page.get_by_test_id("stop").click()
        expect(turn(page, 1).get_by_test_id("turn-outcome")).to_contain_text("Cancelled")


def test_a_session_in_a_worktree_shows_its_path_and_branch(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
) -> None:
    from worktrees import git

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "keep.txt").write_bytes(b"mine\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "start")
    config = write_config(
        tmp_path,
        {
            "talker": {
                "command": demo_command(tmp_path, "--delay", "0.01"),
                "cwd": str(repo),
                "worktree": True,
            }
        },
    )
    with serving(tmp_path, config, f"sqlite:///{tmp_path / 'sessions.db'}") as url:
        with opened(browser, url) as page:
            session_id = start_session(page, 1)
            branch = page.get_by_test_id("session-branch")
            expect(branch).to_have_text(f"agent-supervisor/{session_id}")
            shown = page.get_by_test_id("session-worktree")
            expect(shown).to_be_visible()
            expect(shown).to_contain_text(f"(branch agent-supervisor/{session_id})")
            path = (shown.text_content() or "").removeprefix("worktree ").split(" (branch")[0]
            assert branch.get_attribute("title") == path
            assert Path(path, "keep.txt").read_bytes() == b"mine\n" and Path(path) != repo
            # the page reloaded: from session.list alone
            page.reload()
            expect(page.get_by_test_id("session-branch")).to_have_text(
                f"agent-supervisor/{session_id}"
            )
            expect(page.get_by_test_id("session-worktree")).to_contain_text(path)
