"""Checkpoints of sessions that share one directory, and of a session over many turns: a
rewind that would undo another session's changes is refused (``conflict``) unless forced;
over 1,000 turns a session's checkpoints stay as many as it keeps, in memory and in the
checkpoint store. In-memory agents, real git, on the real clock."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio
from editing_agent import EditingLauncher
from worktrees import git, tree

import supervisor.checkpoints.shadow as shadow
import supervisor.core.checkpoints as core_checkpoints
from supervisor import AgentSpec, open_supervisor
from supervisor.checkpoints.shadow import CHANGES_KEPT
from supervisor.errors import Conflict
from supervisor.runtime.session import Session
from supervisor.testing._acp import AcpBehaviour

BOUND_S = 60.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
#: a turn that runs its tool (the launcher's next edit) and answers at once
FAST = AcpBehaviour(tool=0.0, words=2, word_interval=0.0)


async def _turn(session: Session, text: str) -> str:
    async with session.subscribe() as events:
        turn = await session.prompt(text)
        async for event in events:
            if event.kind == "turn.ended" and event.turn_id == turn.id:
                return turn.id
    raise AssertionError("no turn.ended")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    (root / "b.txt").write_text("b\n")
    git(root, "init", "-q")
    return root


async def test_a_rewind_that_would_undo_another_sessions_changes_is_refused_unless_forced(
    tmp_path: Path, work: Path
) -> None:
    launcher = EditingLauncher(FAST)
    launcher.edits.extend(
        [
            lambda: (work / "a.txt").write_text("a by one\n"),
            lambda: (work / "b.txt").write_text("b by two\n"),
            lambda: (work / "a.txt").write_text("a by one, again\n"),
        ]
    )
    before = tree(work)
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, state_dir=tmp_path / "s"
        ) as sup:
            one = await sup.start_session("fake", cwd=str(work))
            two = await sup.start_session("fake", cwd=str(work))
            assert isinstance(one, Session) and isinstance(two, Session)
            first = await _turn(one, "edit a")
            await _turn(two, "edit b")
            second = await _turn(one, "edit a again")

            # its own changes alone: no question
            result = await one.rewind(second)
            assert result["restored"] == ["a.txt"]
            assert (work / "a.txt").read_text() == "a by one\n"

            # back before the other session's turn: refused, naming it and the path
            untouched = tree(work)
            with pytest.raises(Conflict) as refused:
                await one.rewind(first)
            assert refused.value.code == "conflict"
            assert f"session {two.id} changed b.txt (turn t1)" in str(refused.value)
            assert tree(work) == untouched

            result = await one.rewind(first, force=True)
            assert result["restored"] == ["a.txt", "b.txt"]
            assert tree(work) == before


async def test_over_many_turns_the_checkpoints_kept_stay_bounded(
    tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten times the kept checkpoints, with the bounds made small (the real ones, 256 kept and a
    housekeeping every 100 snapshots, need over a thousand turns: a minute of the suite) so that
    each is passed many times over."""
    monkeypatch.setattr(core_checkpoints, "CHECKPOINTS_KEPT", 24)
    monkeypatch.setattr(shadow, "HOUSEKEEP_EVERY", 10)
    turns = 240
    launcher = EditingLauncher(FAST)
    done = 0

    def edit() -> None:
        nonlocal done
        done += 1
        (work / "a.txt").write_text(f"turn {done}\n")

    launcher.every = edit
    state = tmp_path / "s"
    with trio.fail_after(BOUND_S * 10):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, state_dir=state
        ) as sup:
            session = await sup.start_session("fake", cwd=str(work))
            assert isinstance(session, Session)
            store = session._checkpoints
            assert store is not None
            most = {"snapshots": 0, "ends": 0, "changed": 0, "dropped": 0}
            async with session.subscribe() as events:
                for _ in range(turns):
                    turn = await session.prompt("edit")
                    async for event in events:
                        if event.kind == "turn.ended" and event.turn_id == turn.id:
                            break
                    for name, size in (
                        ("snapshots", len(session._snapshots)),
                        ("ends", len(session._ends)),
                        ("changed", len(store._changed)),
                        ("dropped", len(store._dropped)),
                    ):
                        most[name] = max(most[name], size)
            assert done == turns
            # the oldest kept turn still rewinds and shows its diff
            oldest = f"t{turns - core_checkpoints.CHECKPOINTS_KEPT + 1}"
            diff = await session.diff(oldest, "a.txt")
            assert f"+turn {turns - core_checkpoints.CHECKPOINTS_KEPT + 1}\n" in diff["diff"]
            with pytest.raises(Exception, match="no checkpoint"):
                await session.rewind(f"t{turns - core_checkpoints.CHECKPOINTS_KEPT}")
            await session.rewind(oldest)
            assert (
                work / "a.txt"
            ).read_text() == f"turn {turns - core_checkpoints.CHECKPOINTS_KEPT}\n"
            await store.housekept()
    assert most["snapshots"] <= core_checkpoints.CHECKPOINTS_KEPT + 1
    assert (
        most["ends"] <= core_checkpoints.CHECKPOINTS_KEPT + 1
    )  # (the newest forgotten goes at the next)
    assert most["changed"] <= CHANGES_KEPT
    # Refs of forgotten snapshots go at each housekeeping (a period of shadow.HOUSEKEEP_EVERY
    # snapshots after the last began): during the turns, not only at the end (how many wait at
    # most depends on how long git's collection takes on this machine, not on the turns).
    assert most["dropped"] < turns // 2
    assert store._dropped == []  # (the last housekeeping, below, deleted them all)
    refs = _git_out(store.git_dir, "for-each-ref", "refs/checkpoints/").splitlines()
    assert len(refs) <= 2 * core_checkpoints.CHECKPOINTS_KEPT + 2
    # what no kept snapshot holds can be collected: the store holds the kept turns' objects
    # (a blob, a tree and two commits each), not the thousand's
    _git_out(store.git_dir, "gc", "--prune=now", "--quiet")
    counts = dict(
        line.split(": ") for line in _git_out(store.git_dir, "count-objects", "-v").splitlines()
    )
    objects = int(counts["count"]) + int(counts["in-pack"])
    assert objects <= 4 * (core_checkpoints.CHECKPOINTS_KEPT + shadow.HOUSEKEEP_EVERY) + 16, objects


def _git_out(git_dir: Path, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout
