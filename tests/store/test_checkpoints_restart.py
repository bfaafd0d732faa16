"""Checkpoints outlive the supervisor: a turn's checkpoints are in the session store (each
backend), and a session revived by the next supervisor on the same store and state directory
rewinds to a turn from before the restart, byte for byte, and shows its diff. In-memory
agent, real git, on the real clock."""

from __future__ import annotations

from pathlib import Path

import trio
from editing_agent import EditingLauncher
from worktrees import fingerprint, git, tree

from supervisor import AgentSpec, open_supervisor
from supervisor.runtime.session import Session
from supervisor.store.dormant import DormantSession
from supervisor.testing._acp import AcpBehaviour

BOUND_S = 60.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


async def _turn(session: Session, text: str) -> None:
    async with session.subscribe() as events:
        turn = await session.prompt(text)
        async for event in events:
            if event.kind == "turn.ended" and event.turn_id == turn.id:
                return


async def test_a_rewind_after_a_restart_restores_a_turn_from_before_it(
    tmp_path: Path, store_url: str
) -> None:
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "app.py").write_text("print('first')\n")
    (work / "notes.txt").write_bytes(b"notes\x00\xff\n")
    (work / "run.sh").write_text("echo hi\n")
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "start")
    user_git = fingerprint(work / ".git")

    def edit_one() -> None:
        (work / "src" / "app.py").write_text("print('rewritten')\n")
        (work / "notes.txt").unlink()
        (work / "run.sh").chmod(0o755)
        (work / "made").mkdir()
        (work / "made" / "new.bin").write_bytes(bytes(range(256)))

    def edit_two() -> None:
        (work / "src" / "app.py").write_text("print('third')\n")

    launcher = EditingLauncher(AcpBehaviour(tool=0.0, words=2, word_interval=0.0))
    launcher.edits.extend([edit_one, edit_two])
    state = tmp_path / "state"
    before_t1 = tree(work)
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, store=store_url, state_dir=state
        ) as sup:
            session = await sup.start_session("fake", cwd=str(work))
            assert isinstance(session, Session)
            await _turn(session, "edit")
            after_t1 = tree(work)
            await _turn(session, "edit again")
        assert tree(work) != before_t1

        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, store=store_url, state_dir=state
        ) as sup:
            stored = sup.get(session.id)
            assert isinstance(stored, DormantSession)
            live = await stored.revive()
            assert isinstance(live, Session)
            diff = await live.diff("t1", "src/app.py")
            assert "-print('first')\n+print('rewritten')\n" in diff["diff"]
            result = await live.rewind("t2")
            assert result["restored"] == ["src/app.py"]
            assert tree(work) == after_t1
            result = await live.rewind("t1")
            assert result["restored"] == ["made/new.bin", "notes.txt", "run.sh", "src/app.py"]
            assert tree(work) == before_t1
            undo = result["undo"]
            assert undo == "r2"  # the rewinds' ids go on

        # and once more: the rewinds made after the first restart are kept too
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, store=store_url, state_dir=state
        ) as sup:
            stored = sup.get(session.id)
            assert isinstance(stored, DormantSession)
            live = await stored.revive()
            assert isinstance(live, Session)
            await live.rewind(undo)
            assert tree(work) == after_t1
    assert fingerprint(work / ".git") == user_git
