"""A git worktree per session, end to end on the real clock with real git on temporary
repositories: in-memory ACP agents whose tool writes a file in the session's directory."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from worktrees import git as _git
from worktrees import tree as _tree

from supervisor import AgentSpec, open_supervisor
from supervisor.client import GatewayError, connect
from supervisor.errors import BadRequest
from supervisor.gateway import Gateway
from supervisor.runtime.session import Session
from supervisor.supervisor import Supervisor
from supervisor.testing import record
from supervisor.testing._acp import AcpAgent, AcpBehaviour, AcpLauncher
from supervisor.worktrees import Worktree, Worktrees

#: Whatever the machine's load, a test that takes longer is stuck.
BOUND_S = 60.0


class WritingAgent(AcpAgent):
    """Its tool writes ``same.txt`` in its session's directory, holding the prompt's text."""

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        if message.get("method") in ("session/new", "session/load"):
            self.cwd = Path(message["params"]["cwd"])
        await super().handle(message, nursery)

    async def run_tool(self, seconds: float) -> None:
        (self.cwd / "same.txt").write_text(self.turns[-1])
        await super().run_tool(seconds)


class WritingLauncher(AcpLauncher):
    def launch(self, link: Any, spec: AgentSpec, resume: str | None) -> AcpAgent:
        return WritingAgent(link, self)


def _launcher() -> WritingLauncher:
    return WritingLauncher(AcpBehaviour(words=2, word_interval=0.0, tool=0.0))


SPEC = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=1.0)


@asynccontextmanager
async def worktree_supervisor(tmp_path: Path, spec: AgentSpec = SPEC) -> AsyncIterator[Supervisor]:
    """A supervisor of the writing agent ``fake`` (``spec``), its state under ``tmp_path``; a
    test that takes longer than :data:`BOUND_S` is stuck."""
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": spec}, launcher=_launcher(), state_dir=tmp_path / "state"
        ) as sup:
            yield sup


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('first')\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "start")
    return root


def _out(where: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(where), *args], check=True, capture_output=True, text=True
    ).stdout


def _branches(repo: Path) -> list[str]:
    return _out(repo, "branch", "--format=%(refname:short)").split()


def _worktree_paths(repo: Path) -> list[str]:
    listed = _out(repo, "worktree", "list", "--porcelain").splitlines()
    return [line.split(" ", 1)[1] for line in listed if line.startswith("worktree ")]


async def _prompt_and_wait(sup: Supervisor, session_id: str, text: str) -> None:
    """Prompt the session (a stored one is revived by it) and wait for the turn's end."""
    turn = await sup.get(session_id).prompt(text)
    async with record(sup.get(session_id)) as recorder:  # its history holds the turn's events
        await recorder.wait_for(lambda e: e.kind == "turn.ended" and e.turn_id == turn.id)


async def test_two_sessions_on_one_repository_never_see_each_others_edits(
    tmp_path: Path, repo: Path
) -> None:
    before = _tree(repo)
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=_launcher(), state_dir=tmp_path / "state"
        ) as sup:
            one = await sup.start_session("fake", cwd=str(repo / "src"), worktree=True)
            two = await sup.start_session("fake", cwd=str(repo / "src"), worktree=True)
            assert isinstance(one, Session) and isinstance(two, Session)
            assert one.worktree is not None and two.worktree is not None
            root = (tmp_path / "state" / "worktrees").resolve()
            assert one.worktree.path == str(root / f"repo-{one.id}")
            assert one.worktree.branch == f"agent-supervisor/{one.id}"
            assert one.cwd == str(root / f"repo-{one.id}" / "src")  # the cwd's place in it
            await _prompt_and_wait(sup, one.id, "from one")
            await _prompt_and_wait(sup, two.id, "from two")
            assert (Path(one.cwd) / "same.txt").read_text() == "from one"
            assert (Path(two.cwd) / "same.txt").read_text() == "from two"
            assert _tree(repo) == before  # the user's checkout: untouched
            listed = {s.session_id: s for s in sup.list()}
            assert listed[one.id].worktree == one.worktree.path
            assert listed[one.id].branch == one.worktree.branch
            assert listed[one.id].cwd == one.cwd

            await sup.stop_session(one.id)
            left = one.worktree_left
            assert left is not None and left.kept and "changes not committed" in left.why
            assert Path(one.worktree.path).is_dir()
        # the supervisor's close leaves the other's work too
        assert two.worktree_left is not None and two.worktree_left.kept
    assert sorted(_branches(repo)) == sorted(["main", one.worktree.branch, two.worktree.branch])
    assert _out(repo, "status", "--porcelain") == ""


async def test_a_stopped_sessions_worktree_without_work_is_removed_with_its_branch(
    tmp_path: Path, repo: Path
) -> None:
    async with worktree_supervisor(tmp_path) as sup:
        session = await sup.start_session("fake", cwd=str(repo), worktree=True)
        assert isinstance(session, Session) and session.worktree is not None
        path = session.worktree.path
        assert _worktree_paths(repo) == [str(repo.resolve()), path]
        await sup.stop_session(session.id)
        assert session.worktree_left is not None and not session.worktree_left.kept
    assert not Path(path).exists() and not Path(path + ".json").exists()
    assert _branches(repo) == ["main"]
    assert _worktree_paths(repo) == [str(repo.resolve())]


async def test_a_worktree_with_a_commit_is_kept(tmp_path: Path, repo: Path) -> None:
    async with worktree_supervisor(tmp_path) as sup:
        session = await sup.start_session("fake", cwd=str(repo), worktree=True)
        assert isinstance(session, Session) and session.worktree is not None
        (Path(session.cwd) / "more.txt").write_text("more\n")
        _git(Path(session.cwd), "add", "-A")
        _git(Path(session.cwd), "commit", "-qm", "more")
        await sup.stop_session(session.id)
        left = session.worktree_left
        assert left is not None and left.kept and left.why == "1 commit beyond its base"


async def test_a_cwd_in_no_repository_is_a_bad_request(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=_launcher(), state_dir=tmp_path / "state"
        ) as sup:
            with pytest.raises(BadRequest, match="not in a git repository"):
                await sup.start_session("fake", cwd=str(plain), worktree=True)
            assert sup.list() == []
        async with open_supervisor(agents={"fake": SPEC}, launcher=_launcher()) as sup:
            with pytest.raises(BadRequest, match="state directory"):
                await sup.start_session("fake", cwd=str(plain), worktree=True)


async def test_an_agents_worktree_setting_gives_its_sessions_one(
    tmp_path: Path, repo: Path
) -> None:
    spec = SPEC.with_options(worktree=True)
    async with worktree_supervisor(tmp_path, spec) as sup:
        session = await sup.start_session("fake", cwd=str(repo))
        assert isinstance(session, Session) and session.worktree is not None
        plain = await sup.start_session("fake", cwd=str(repo), worktree=False)
        assert isinstance(plain, Session) and plain.worktree is None


@pytest.mark.parametrize("pruned", [False, True], ids=["kept", "pruned"])
async def test_a_session_revived_from_the_store_gets_its_worktree_back(
    tmp_path: Path, repo: Path, pruned: bool
) -> None:
    state = tmp_path / "state"
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with trio.fail_after(BOUND_S):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=_launcher(), state_dir=state, store=store
        ) as sup:
            session = await sup.start_session("fake", cwd=str(repo), worktree=True)
            assert isinstance(session, Session) and session.worktree is not None
            worktree = session.worktree
            await _prompt_and_wait(sup, session.id, "first")
            _git(Path(session.cwd), "add", "-A")
            _git(Path(session.cwd), "commit", "-qm", "the agent's work")
        if pruned:  # the worktree removed by hand; its branch stays
            _git(repo, "worktree", "remove", worktree.path)
            assert not Path(worktree.path).exists()
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=_launcher(), state_dir=state, store=store
        ) as sup:
            (stored,) = sup.list()
            assert (stored.state, stored.worktree, stored.branch) == (
                "stopped",
                worktree.path,
                worktree.branch,
            )
            await _prompt_and_wait(sup, session.id, "second")
            revived = sup.get(session.id)
            assert isinstance(revived, Session)
            assert revived.worktree is not None and revived.worktree.path == worktree.path
            assert revived.cwd == worktree.path
            assert (Path(worktree.path) / "same.txt").read_text().endswith("second")
            assert _out(Path(worktree.path), "log", "-1", "--format=%s").strip() == (
                "the agent's work"
            )
    assert not (repo / "same.txt").exists()


async def test_worktrees_prune_removes_those_without_work_whose_session_is_not_live(
    tmp_path: Path, repo: Path
) -> None:
    worktrees = Worktrees(tmp_path / "state" / "worktrees")
    idle = await worktrees.create("s1", str(repo))
    busy = await worktrees.create("s2", str(repo))
    live = await worktrees.create("s3", str(repo))
    for worktree in (idle, busy):
        (Path(worktree.path) / "wip.txt").write_text("wip\n")
        assert (await worktrees.release(worktree)).kept
    (Path(idle.path) / "wip.txt").unlink()  # its work undone: nothing left in it
    listed = {w.session_id: alive for w, alive in await worktrees.recorded()}
    assert listed == {"s1": False, "s2": False, "s3": True}
    gone = await worktrees.prune()
    assert [left.worktree.session_id for left in gone] == ["s1"]
    assert not Path(idle.path).exists() and Path(busy.path).exists()
    assert Path(live.path).exists()
    assert sorted(_branches(repo)) == ["agent-supervisor/s2", "agent-supervisor/s3", "main"]


async def test_a_worktree_cancelled_while_git_makes_it_leaves_nothing_behind(
    tmp_path: Path, repo: Path
) -> None:
    # Its caller went away (a client closing while its session.start runs): the branch and
    # the directory git had made by then go too.
    started, finish = tmp_path / "started", tmp_path / "finish"
    os.mkfifo(started)  # the hook's write waits for the test's read: git is then mid-way
    hook = repo / ".git" / "hooks" / "post-checkout"  # git runs it once both are made
    hook.write_text(
        f"#!/bin/sh\necho made > '{started}'\nwhile [ ! -e '{finish}' ]; do sleep 0.05; done\n"
    )
    hook.chmod(0o755)
    root = tmp_path / "state" / "worktrees"
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Worktrees(root).create, "s1", str(repo))
            await trio.to_thread.run_sync(started.read_text, abandon_on_cancel=True)
            assert "agent-supervisor/s1" in _branches(repo)
            nursery.cancel_scope.cancel()
    finish.touch()
    assert _branches(repo) == ["main"]
    assert len(_worktree_paths(repo)) == 1  # the repository's own
    assert list(root.iterdir()) == []


def test_the_worktrees_command_lists_and_prunes(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from supervisor.cli import main

    state = tmp_path / "state"
    monkeypatch.setenv("AGENT_SUPERVISOR_STATE_DIR", str(state))
    worktrees = Worktrees(state / "worktrees")

    async def made() -> tuple[Worktree, Worktree]:
        idle = await worktrees.create("s1", str(repo))
        busy = await worktrees.create("s2", str(repo))
        (Path(busy.path) / "wip.txt").write_text("wip\n")
        await worktrees.release(busy)
        # idle's record says a supervisor that is gone runs it
        record = Path(idle.path + ".json")
        data = json.loads(record.read_text())
        data["owner"]["started"] = -1
        record.write_text(json.dumps(data))
        return idle, busy

    idle, busy = trio.run(made)
    assert main(["worktrees"]) == 0
    out = capsys.readouterr().out
    assert idle.path in out and idle.branch in out and busy.path in out
    assert "dirty" in out and "clean" in out
    assert main(["worktrees", "--prune"]) == 0
    out = capsys.readouterr().out
    assert f"removed {idle.path}" in out and busy.path not in out.split("removed")[-1]
    assert not Path(idle.path).exists() and Path(busy.path).exists()


async def test_over_the_wire_start_list_and_stop_say_the_worktree(
    tmp_path: Path, repo: Path
) -> None:
    before = _tree(repo)
    async with worktree_supervisor(tmp_path) as sup:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(Gateway(sup, port=0, token="secret-token").serve)
            async with connect(url) as client:
                started = await client.request(
                    "session.start", {"agent": "fake", "cwd": str(repo), "worktree": True}
                )
                session_id = started["session_id"]
                path = started["worktree"]
                assert started["branch"] == f"agent-supervisor/{session_id}"
                assert started["cwd"] == path
                (listed,) = (await client.request("session.list"))["sessions"]
                assert (listed["worktree"], listed["branch"], listed["cwd"]) == (
                    path,
                    started["branch"],
                    path,
                )
                await _prompt_and_wait(sup, session_id, "over the wire")
                stopped = await client.request("session.stop", {"session_id": session_id})
                assert stopped["worktree"] == {
                    "path": path,
                    "branch": started["branch"],
                    "kept": True,
                    "why": "changes not committed",
                }
                with pytest.raises(GatewayError) as refused:
                    await client.request(
                        "session.start",
                        {"agent": "fake", "cwd": str(tmp_path), "worktree": True},
                    )
                assert refused.value.code == "bad_request"
            nursery.cancel_scope.cancel()
    assert (Path(path) / "same.txt").read_text() == "over the wire"
    assert _tree(repo) == before
