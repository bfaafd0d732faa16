"""Tier 4: per-turn checkpoints and rewind with real agent CLIs (``design/checkpoints.md``).

Codex app-server (protocol ``codex``), Claude Code in stream-json mode (protocol ``claude``) and
Gemini CLI (``gemini --acp``), each under a supervisor with a state directory (so every turn is
checkpointed), in a loopback-only network namespace against ``tests/realagents/fake_model.py``,
in a working directory that is a user's git repository: a committed file, an uncommitted edit
of a committed file, an untracked file and a file ``.gitignore`` ignores. The fake model's tool
call (``editshell``: :data:`~realagents.fake_model.EDIT_SHELL_COMMAND`, approved by the test
wherever the agent asks) appends to the edited file, creates one, deletes one, appends to the
ignored one, then waits; the test stops the turn while it waits. Then:

- the receipt's ``changes`` (and the turn's ``turn.ended``) are exactly the three paths, with
  their kinds, and nothing of the ignored file;
- ``Session.rewind(turn_id)`` puts the three back byte for byte (the user's uncommitted edit
  included, the deleted file's mode too) and leaves the ignored file as the turn left it (it is
  never kept);
- the user's ``.git`` is byte for byte what it was (HEAD, index, refs, every file), and so is
  ``git status --porcelain``.

The same holds for a turn that completes by itself (``editbrief``: the edits and no wait), and
for a turn killed with the agent's whole tree (a grace of 0 s: the tool's writes made before
the kill are in the receipt).

Two sessions of Claude Code started with a worktree each on the user's repository each edit
their own worktree, never the other's nor the user's checkout.

Real clock, generous bounds. Each stop's receipt latency, and how long the rewind took, go
into the tier-4 table (scenario ``ckpt-stop``, ``ckpt-kill``, ``ckpt-done``; ``ckpt-rw``: a
stop and rewind in one call, ``cancel(rewind=True)``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from worktrees import fingerprint, git, tree

from helpers import Recorder
from protocols import events as ev
from realagents import scenarios
from realagents.agents import (
    AGENTS,
    CLAUDE_STREAM_JSON,
    CODEX_APP_SERVER,
    Prepared,
    RealAgent,
    claude_stream_json_spec,
    codex_app_server_spec,
)
from realagents.conftest import Harness, real_agent_session, record
from supervisor import AgentSpec

pytestmark = pytest.mark.real_process

#: Whole-test bound: start (Gemini's ~5 s here), a turn with an approval, the stop (a kill
#: ladder at most), a checkpoint at each end, a rewind.
BOUND_S = 120.0

#: The agents under test: their key, how they start, and their spec (None: the ACP one).
UNDER_TEST: dict[str, tuple[RealAgent, Callable[..., AgentSpec] | None]] = {
    CODEX_APP_SERVER.key: (CODEX_APP_SERVER, codex_app_server_spec),
    CLAUDE_STREAM_JSON.key: (CLAUDE_STREAM_JSON, claude_stream_json_spec),
    "gemini": (AGENTS["gemini"], None),
}

#: The user's repository before the turn (``_lay_out``), by path.
COMMITTED = {"keep.txt": b"kept as committed\n", "edit-me.txt": b"line one\nline two\n"}
#: Binary, no final newline, executable: what a rewind must put back exactly.
DOOMED = b"\x00\x01binary \xff\xfe to be deleted by the turn"
USERS_EDIT = b"line one\nline two, edited by the user and not committed\n"
UNTRACKED = b"the user's untracked notes\n"
IGNORED = b"an ignored log line\n"
#: What the tool call's edits are, in the receipt's words.
EXPECTED_CHANGES = [
    {"path": "created.txt", "change": "added"},
    {"path": "doomed.txt", "change": "deleted"},
    {"path": "edit-me.txt", "change": "modified"},
]


def _lay_out(prepared: Prepared) -> None:
    """The session's working directory as a user's repository (``prepare`` hook)."""
    work = prepared.cwd
    git(work, "init", "-q", "-b", "main")
    (work / ".gitignore").write_bytes(b"*.log\n")
    for name, data in COMMITTED.items():
        (work / name).write_bytes(data)
    (work / "doomed.txt").write_bytes(DOOMED)
    (work / "doomed.txt").chmod(0o755)
    git(work, "add", ".gitignore", "doomed.txt", *COMMITTED)
    git(work, "commit", "-q", "-m", "the user's commit")
    (work / "edit-me.txt").write_bytes(USERS_EDIT)
    (work / "notes.txt").write_bytes(UNTRACKED)
    (work / "build.log").write_bytes(IGNORED)
    _status(work)  # the index's stat data fresh, as after any `git status` of the user's


def _status(work: Path) -> str:
    """``git status --porcelain``, without refreshing the index (which would write it)."""
    return subprocess.run(
        ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=all"],
        cwd=work,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _users_git(work: Path) -> tuple[dict[str, str], str]:
    """Every file of the user's ``.git`` (HEAD, index, refs, objects, ...) and the status."""
    return fingerprint(work / ".git"), _status(work)


def _kept(work: Path) -> dict[bytes, tuple[int, bytes]]:
    """The work tree but the ignored file (which a rewind leaves as the turn left it)."""
    return {path: entry for path, entry in tree(work).items() if path != b"build.log"}


def _changes(changes: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return sorted(changes or [], key=lambda change: str(change["path"]))


def _described(requested: ev.PermissionRequested, option: ev.PermissionOption) -> str:
    return json.dumps(requested.tool_call, default=str)[:400]


async def approve(h: Harness, turn_id: str, approved: list[str]) -> None:
    """Allow every permission request of the turn once (Codex, Claude Code and Gemini all ask
    before this command here), noting each."""
    await scenarios.approve_permissions(h, turn_id, approved, approved_as=_described)


@pytest.fixture
def open_agent(key: str, tmp_path: Path) -> Callable[..., AbstractAsyncContextManager[Harness]]:
    """``async with open_agent(grace_s=...) as h:`` the agent ``key`` in a user's repository,
    under a supervisor whose state directory is the test's (checkpoints on)."""
    agent, spec_of = UNDER_TEST[key]
    installed = scenarios.ensure_installed(agent.package, key)
    return lambda **options: real_agent_session(
        agent,
        tmp_path,
        installed,
        spec_of=spec_of,
        prepare=_lay_out,
        state_dir=tmp_path / "state",
        catch_up=True,
        **options,
    )


async def _edits_made_and_waiting(h: Harness, prompt: str) -> tuple[str, list[str]]:
    """Prompt ``prompt`` and approve its tool call until the command's wait runs (its edits
    made): the turn's id and what was approved."""
    approved: list[str] = []
    async with trio.open_nursery() as nursery:
        turn = await h.session.prompt(prompt)
        nursery.start_soon(approve, h, turn.id, approved)
        await scenarios.command_running(h)
        nursery.cancel_scope.cancel()
    return turn.id, approved


async def _rewind_restores(
    h: Harness,
    turn_id: str,
    kept: dict[bytes, tuple[int, bytes]],
    users_git: tuple[dict[str, str], str],
) -> float:
    """Rewind ``turn_id``: the three paths restored byte for byte, the ignored file as the turn
    left it, the user's git untouched. How long the rewind took, in ms."""
    work = h.work
    assert (work / "created.txt").read_bytes() == b"made by the turn\n"
    assert not (work / "doomed.txt").exists()
    started = time.monotonic()
    rewound = await h.session.rewind(turn_id)
    rewind_ms = round((time.monotonic() - started) * 1000, 1)
    assert sorted(rewound["restored"]) == [c["path"] for c in EXPECTED_CHANGES], rewound
    assert rewound["not_restored"] == [], rewound
    assert _kept(work) == kept
    assert (work / "edit-me.txt").read_bytes() == USERS_EDIT
    assert (work / "doomed.txt").read_bytes() == DOOMED
    assert (work / "doomed.txt").stat().st_mode & 0o777 == 0o755
    assert (work / "build.log").read_bytes() == IGNORED + b"logged by the turn\n"
    assert _users_git(work) == users_git
    rewound_event = await h.recorder.wait_kind("session.rewound")
    assert isinstance(rewound_event, ev.SessionRewound) and rewound_event.turn_id == turn_id
    return rewind_ms


def _row(
    h: Harness, key: str, scenario: str, outcome: str, elapsed_ms: float, notes: list[str]
) -> None:
    record(
        agent=key,
        scenario=scenario,
        outcome=outcome,
        elapsed_ms=elapsed_ms,
        ready_s=round(h.ready_s, 1),
        namespace=h.namespace,
        notes=" ".join(notes),
    )


@pytest.mark.parametrize("key", list(UNDER_TEST))
async def test_a_stopped_turns_edits_are_listed_and_rewound(key: str, open_agent: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_agent() as h:
            kept, users_git = _kept(h.work), _users_git(h.work)
            turn_id, approved = await _edits_made_and_waiting(h, "editshell")
            assert approved, "the agent ran the command without asking"
            started = time.monotonic()
            receipt = await h.session.cancel()
            cancel_ms = round((time.monotonic() - started) * 1000, 1)
            ended = await h.recorder.wait_kind("turn.ended", turn_id=turn_id)
            assert isinstance(ended, ev.TurnEnded)
            assert (receipt.turn_id, receipt.outcome) == (turn_id, "cancelled"), receipt
            assert _changes(receipt.changes) == EXPECTED_CHANGES, receipt.changes
            assert _changes(ended.changes) == EXPECTED_CHANGES, ended.changes
            assert fingerprint(h.work / ".git") == users_git[0]  # the status differs: the edits
            rewind_ms = await _rewind_restores(h, turn_id, kept, users_git)
            _row(
                h,
                key,
                "ckpt-stop",
                receipt.outcome,
                receipt.elapsed_ms,
                [
                    f"cancel_call_ms={cancel_ms}",
                    f"rewind_ms={rewind_ms}",
                    f"escalation={','.join(receipt.escalation)}",
                ],
            )
            await scenarios.second_prompt_completes(h)


@pytest.mark.parametrize("key", list(UNDER_TEST))
async def test_stop_and_rewind_in_one_call(key: str, open_agent: Any) -> None:
    """``cancel(rewind=True)`` (the web UI's Stop & rewind): the receipt lists the changes and
    what the rewind restored, and the directory is as before the turn."""
    with trio.fail_after(BOUND_S):
        async with open_agent() as h:
            kept, users_git = _kept(h.work), _users_git(h.work)
            turn_id, _ = await _edits_made_and_waiting(h, "editshell")
            started = time.monotonic()
            receipt = await h.session.cancel(rewind=True)
            cancel_ms = round((time.monotonic() - started) * 1000, 1)
            assert (receipt.turn_id, receipt.outcome) == (turn_id, "cancelled"), receipt
            assert _changes(receipt.changes) == EXPECTED_CHANGES, receipt.changes
            assert receipt.restored is not None, receipt
            restored = receipt.restored
            assert sorted(restored["restored"]) == [c["path"] for c in EXPECTED_CHANGES], restored
            assert restored["not_restored"] == [], restored
            assert _kept(h.work) == kept
            assert (h.work / "build.log").read_bytes() == IGNORED + b"logged by the turn\n"
            assert _users_git(h.work) == users_git
            _row(
                h,
                key,
                "ckpt-rw",
                receipt.outcome,
                receipt.elapsed_ms,
                [f"cancel_call_ms={cancel_ms}", f"escalation={','.join(receipt.escalation)}"],
            )


@pytest.mark.parametrize("key", list(UNDER_TEST))
async def test_a_killed_turns_edits_are_listed_and_rewound(key: str, open_agent: Any) -> None:
    """No grace at all: the agent's whole tree is killed (the tool's shell with it), and what
    the tool wrote before is the turn's change all the same."""
    with trio.fail_after(BOUND_S):
        async with open_agent(grace_s=0.0) as h:
            kept, users_git = _kept(h.work), _users_git(h.work)
            turn_id, _ = await _edits_made_and_waiting(h, "editshell")
            started = time.monotonic()
            receipt = await h.session.cancel()
            cancel_ms = round((time.monotonic() - started) * 1000, 1)
            assert (receipt.turn_id, receipt.outcome) == (turn_id, "killed"), receipt
            assert _changes(receipt.changes) == EXPECTED_CHANGES, receipt.changes
            assert fingerprint(h.work / ".git") == users_git[0]  # the status differs: the edits
            assert h.tool_processes(scenarios.TOOL_LEAF) == []
            rewind_ms = await _rewind_restores(h, turn_id, kept, users_git)
            _row(
                h,
                key,
                "ckpt-kill",
                receipt.outcome,
                receipt.elapsed_ms,
                [
                    f"cancel_call_ms={cancel_ms}",
                    f"rewind_ms={rewind_ms}",
                    f"escalation={','.join(receipt.escalation)}",
                    f"resumed={receipt.resumed}",
                ],
            )


@pytest.mark.parametrize("key", list(UNDER_TEST))
async def test_a_completed_turns_edits_are_listed_and_rewound(key: str, open_agent: Any) -> None:
    with trio.fail_after(BOUND_S):
        async with open_agent() as h:
            kept, users_git = _kept(h.work), _users_git(h.work)
            approved: list[str] = []
            started = time.monotonic()
            async with trio.open_nursery() as nursery:
                turn = await h.session.prompt("editbrief")
                nursery.start_soon(approve, h, turn.id, approved)
                ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
                nursery.cancel_scope.cancel()
            turn_ms = round((time.monotonic() - started) * 1000, 1)
            assert isinstance(ended, ev.TurnEnded)
            assert ended.outcome == "completed", (ended, h.model.describe())
            assert approved, "the agent ran the command without asking"
            assert _changes(ended.changes) == EXPECTED_CHANGES, ended.changes
            assert fingerprint(h.work / ".git") == users_git[0]  # the status differs: the edits
            rewind_ms = await _rewind_restores(h, turn.id, kept, users_git)
            _row(
                h,
                key,
                "ckpt-done",
                ended.outcome,
                float("nan"),
                [f"turn_ms={turn_ms}", f"rewind_ms={rewind_ms}"],
            )


@pytest.mark.parametrize("key", [CLAUDE_STREAM_JSON.key])
async def test_two_sessions_in_worktrees_of_one_repository_never_see_each_others_edits(
    key: str, open_agent: Any
) -> None:
    """Two sessions of Claude Code started with ``worktree=True`` on the user's repository:
    each turn's edits land in its own worktree (one append to the committed file each, never
    two), each receipt lists exactly its own, and the user's checkout is as it was."""
    with trio.fail_after(BOUND_S):
        async with open_agent() as h:
            kept, status = _kept(h.work), _status(h.work)
            spec = h.session.spec.name
            both = [
                await h.supervisor.start_session(spec, cwd=str(h.work), worktree=True)
                for _ in range(2)
            ]
            ended: list[ev.TurnEnded] = []
            async with trio.open_nursery() as nursery:
                for session in both:
                    nursery.start_soon(_edit_briefly, attrs.evolve(h, session=session), ended)
            assert [e.outcome for e in ended] == ["completed", "completed"], h.model.describe()
            assert all(_changes(e.changes) == EXPECTED_CHANGES for e in ended), ended
            paths = {Path(s.worktree.path) for s in both if s.worktree is not None}
            assert len(paths) == 2 and h.work not in paths
            for path in paths:
                assert (path / "created.txt").read_bytes() == b"made by the turn\n"
                assert not (path / "doomed.txt").exists()
                edited = (path / "edit-me.txt").read_bytes()
                assert edited.startswith(COMMITTED["edit-me.txt"])
                assert edited.count(b"\n") == COMMITTED["edit-me.txt"].count(b"\n") + 1
            assert _kept(h.work) == kept and _status(h.work) == status


async def _edit_briefly(h: Harness, ended: list[ev.TurnEnded]) -> None:
    """Run ``editbrief`` in ``h.session`` (approved wherever asked) to its end."""
    recorder = Recorder(h.session)
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        h = attrs.evolve(h, recorder=recorder)
        turn = await h.session.prompt("editbrief")
        nursery.start_soon(approve, h, turn.id, [])
        done = await recorder.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(done, ev.TurnEnded)
        ended.append(done)
        nursery.cancel_scope.cancel()
