"""AgentProcess under both containments (a cgroup per agent, the shim), real processes, real clock.

Most tests run once per containment (the ``containment`` fixture, ``tests/conftest.py``); what
only one of them can do or suffer (the shim's lifeline, a shim that is stuck or killed, a process
that leaves its cgroup) is tested for that one. Every test that grows a tree checks afterwards,
with psutil, that none of its processes is alive. Waits are on events (the ready line the fake
agent prints once its tree is set up, EOF, process exit), bounded by ``trio.fail_after``;
nothing sleeps to wait for a state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest
import trio

from paths import REPO, TESTS
from supervisor.agents import process as process_module
from supervisor.agents import tree as tree_module
from supervisor.agents.process import (
    SHIM_PATH,
    AgentProcess,
    CgroupProcess,
    ExitStatus,
    KillError,
    ShimProcess,
    SpawnError,
)
from unkillable import require_freezer, unkillable

pytestmark = pytest.mark.real_process

TREE_AGENT = TESTS / "fakes" / "tree_agent.py"
LIMIT_S = 10  # generous: real processes on a loaded CI box


class Lines:
    """Newline-framed reads over a trio stream (the caller does framing, as the API says)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def next(self) -> bytes:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                raise EOFError(bytes(self._buffer))
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        return line + b"\n"

    async def rest(self) -> bytes:
        """Everything up to EOF."""
        while chunk := await self._stream.receive_some(65536):
            self._buffer += chunk
        data, self._buffer = bytes(self._buffer), bytearray()
        return data


class Tree:
    """A spawned tree_agent: the AgentProcess, its stdout lines, and every process it reported."""

    def __init__(self, agent: AgentProcess, lines: Lines, ready: dict[str, object]) -> None:
        self.agent = agent
        self.lines = lines
        self.agent_pid = int(str(ready["pid"]))
        pids = ready["pids"]
        assert isinstance(pids, list)
        self.descendant_pids = [int(pid) for pid in pids]
        roles = ready["roles"]
        assert isinstance(roles, dict)
        self.roles: dict[str, list[int]] = roles
        # psutil.Process pins each pid's start time: is_running() is False after reuse.
        self.procs = [psutil.Process(pid) for pid in self.all_pids]

    @property
    def all_pids(self) -> list[int]:
        """Our child (the shim, or the agent itself in a cgroup), the agent, its descendants."""
        return list(dict.fromkeys([self.agent.pid, self.agent_pid, *self.descendant_pids]))

    async def send(self, line: str) -> None:
        await self.agent.stdin.send_all(line.encode() + b"\n")

    def assert_all_gone(self) -> None:
        if isinstance(self.agent, ShimProcess):
            # The shim reaps every descendant before it exits: not even a zombie is left.
            alive = [proc for proc in self.procs if proc.is_running()]
        else:
            # In a cgroup, orphans are re-parented to init, which reaps them when it likes;
            # a zombie runs nothing and holds nothing open.
            alive = [proc for proc in self.procs if not _dead(proc)]
        assert not alive, f"still alive: {alive}"


@asynccontextmanager
async def tree_agent(*args: str) -> AsyncIterator[Tree]:
    """Spawn tree_agent.py with ``args``, wait for its ready line; aclose on the way out."""
    async with await AgentProcess.spawn([sys.executable, str(TREE_AGENT), *args]) as agent:
        lines = Lines(agent.stdout)
        ready = json.loads(await lines.next())
        assert ready["ready"] is True
        yield Tree(agent, lines, ready)


HARD_TREE = (
    "--spawn", "child-ignore-term",
    "--spawn", "setsid-ignore-term",
    "--spawn", "double-fork-ignore-term",
)  # fmt: skip
COOPERATIVE_TREE = ("--spawn", "child", "--spawn", "setsid", "--spawn", "double-fork")


# --- ExitStatus ------------------------------------------------------------------------------


def test_exit_status_from_returncode() -> None:
    assert ExitStatus.from_returncode(0) == ExitStatus(code=0, signal=None)
    assert ExitStatus.from_returncode(3).description == "exit 3"
    assert ExitStatus.from_returncode(-9) == ExitStatus(code=None, signal=9)
    assert ExitStatus.from_returncode(-9).description == "killed by SIGKILL"
    assert ExitStatus(code=None, signal=99).description == "killed by signal 99"


# --- stdio and exit status -------------------------------------------------------------------

both = pytest.mark.usefixtures("containment")
shim_only = pytest.mark.usefixtures("shim_containment")
cgroup_only = pytest.mark.usefixtures("cgroup_containment")


@both
async def test_stdio_round_trip() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent() as tree:
            await tree.send("hello agent")
            assert await tree.lines.next() == b"hello agent\n"
            await tree.send("and again")
            assert await tree.lines.next() == b"and again\n"
        tree.assert_all_gone()


@both
async def test_env_cwd_and_stdout_eof_on_exit(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "AGENT_TEST_VAR": "forty-two"}
    with trio.fail_after(LIMIT_S):
        async with await AgentProcess.spawn(
            ["sh", "-c", 'pwd; echo "$AGENT_TEST_VAR"; echo oops >&2'], env=env, cwd=tmp_path
        ) as agent:
            out = await Lines(agent.stdout).rest()  # EOF comes: containment holds no copy
            err = await Lines(agent.stderr).rest()
            assert await agent.wait() == ExitStatus(code=0, signal=None)
    assert out.decode().splitlines() == [str(tmp_path), "forty-two"]
    assert err == b"oops\n"


@both
async def test_exit_code_propagates() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent() as tree:
            await tree.send("exit 3")
            status = await tree.agent.wait()
        assert status == ExitStatus(code=3, signal=None)
        assert tree.agent.returncode == status
        tree.assert_all_gone()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1, signal.SIGTERM])
@both
async def test_death_by_signal_propagates(signum: signal.Signals) -> None:
    # SIGUSR1 is one the shim catches for itself; it must still die of it like the agent did.
    with trio.fail_after(LIMIT_S):
        async with tree_agent() as tree:
            await tree.send(f"kill {int(signum)}")
            status = await tree.agent.wait()
        assert status == ExitStatus(code=None, signal=int(signum))
        assert status.description == f"killed by {signum.name}"
        tree.assert_all_gone()


@shim_only
async def test_lifeline_is_private_to_the_shim() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*COOPERATIVE_TREE) as tree:
            assert isinstance(tree.agent, ShimProcess)
            shim = psutil.Process(tree.agent.pid)
            cmdline = shim.cmdline()
            fd = cmdline[cmdline.index("--lifeline-fd") + 1]
            lifeline = os.readlink(f"/proc/{tree.agent.pid}/fd/{fd}")
            assert lifeline.startswith("socket:")
            for pid in tree.all_pids[1:]:
                fds = os.listdir(f"/proc/{pid}/fd")
                assert lifeline not in {os.readlink(f"/proc/{pid}/fd/{n}") for n in fds}
            assert {proc.pid for proc in tree.agent.members()} >= set(tree.all_pids[1:])
        tree.assert_all_gone()


@cgroup_only
async def test_a_cgroup_holds_exactly_the_tree() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*COOPERATIVE_TREE, *HARD_TREE) as tree:
            assert isinstance(tree.agent, CgroupProcess)
            assert tree.agent.pid == tree.agent_pid  # no helper process: the agent is our child
            assert sorted(tree.agent.cgroup.pids()) == sorted(tree.all_pids)
            assert {proc.pid for proc in tree.agent.members()} == set(tree.descendant_pids)
            # Every member carries the tree's mark, whatever session or parent it has now.
            marked = {proc.pid for proc in tree_module.marked(tree.agent.mark)}
            assert marked == set(tree.all_pids)
            path = tree.agent.cgroup.path
        tree.assert_all_gone()
    assert not path.exists()  # removed once empty


# --- the kill ladder -------------------------------------------------------------------------


@both
async def test_cooperative_tree_goes_on_sigterm() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*COOPERATIVE_TREE) as tree:
            started = time.monotonic()
            steps = await tree.agent.kill_tree(term_timeout=5.0)
            elapsed = time.monotonic() - started
            assert steps == ["sigterm"]
            tree.assert_all_gone()
            assert elapsed < 1.0  # no waiting out any timeout; ~10 ms when measured
            assert tree.agent.returncode == ExitStatus(code=None, signal=signal.SIGTERM)


@both
async def test_kill_right_after_spawn() -> None:
    # SIGTERM may reach the shim before it has started the agent (it forwards it afterwards),
    # or the wrapper shell before it has exec'd the agent (it dies of it).
    with trio.fail_after(LIMIT_S):
        async with await AgentProcess.spawn([sys.executable, str(TREE_AGENT)]) as agent:
            assert await agent.kill_tree(term_timeout=5.0) == ["sigterm"]
            assert agent.returncode == ExitStatus(code=None, signal=signal.SIGTERM)


#: An agent whose "tools", once it reads a line, keep the sweep busy: a loop that starts a new
#: process every 20 ms, and one that answers SIGTERM by starting another and exiting.
_RESTLESS_AGENT = """
echo ready
read go
( while :; do sleep 300 & sleep 0.02; done ) &
( trap 'sleep 301 & exit 0' TERM; while :; do sleep 0.05; done ) &
echo started
exec sleep 600
"""


@both
async def test_the_sweep_of_a_turns_leftovers_finds_what_appears_meanwhile() -> None:
    """What a turn left running is killed, and so is what appears while the sweep runs: the
    processes a loop keeps starting, one forked in answer to SIGTERM. The agent lives on."""
    with trio.fail_after(LIMIT_S):
        async with await AgentProcess.spawn(["sh", "-c", _RESTLESS_AGENT]) as agent:
            lines = Lines(agent.stdout)
            assert await lines.next() == b"ready\n"  # the agent runs (the shim starts it)
            # A turn starts well after its agent (start times are in 10 ms ticks, compared
            # with slack): time passes, which is what is waited for here.
            await trio.sleep(0.1)
            since = process_module.tree_clock()
            before = set(agent.members())  # the agent (under the shim, its process too)
            await agent.stdin.send_all(b"go\n")
            assert await lines.next() == b"started\n"
            # The handler forks only once its shell runs: on a loaded machine that may take
            # longer than the default wait for SIGTERM, and a SIGKILL first leaves nothing to
            # find. Whatever goes by itself ends the wait at once.
            killed = await agent.kill_descendants_since(since, term_timeout=LIMIT_S / 2)
            left = [proc for proc in agent.members() if proc not in before and not _dead(proc)]
            assert left == [], f"alive after the sweep: {left}"
            commands = [entry["command"] for entry in killed]
            assert "sleep 301" in commands, commands  # forked by a SIGTERM's handler
            assert sum(c == "sleep 300" for c in commands) >= 2, commands  # a loop's
            assert not any(_dead(proc) for proc in before)  # the agent is spared
            await agent.kill_tree()


#: An agent that, on "go", starts a tool that ends a moment later and is never reaped: a
#: zombie, from while the sweep waits for the turn's processes to settle.
_UNREAPING_AGENT = """
import os, sys, time
print("ready", flush=True)
sys.stdin.readline()
if os.fork() == 0:
    time.sleep(0.3)
    os._exit(0)
print("started", flush=True)
sys.stdin.readline()
"""


@both
async def test_a_zombie_a_turn_left_is_dead_for_the_sweep_at_once() -> None:
    """A tool that ended but that its parent never reaped (an agent that does not reap, an
    init in a container that reaps slowly) runs nothing: the sweep neither waits the settle
    time for it nor lists it as killed."""
    settle = 30.0  # what a sweep that took the zombie for alive would wait
    with trio.fail_after(LIMIT_S + settle):
        command = [sys.executable, "-c", _UNREAPING_AGENT]
        async with await AgentProcess.spawn(command) as agent:
            lines = Lines(agent.stdout)
            assert await lines.next() == b"ready\n"
            await trio.sleep(0.1)  # a turn starts well after its agent (10 ms start ticks)
            since = process_module.tree_clock()
            await agent.stdin.send_all(b"go\n")
            assert await lines.next() == b"started\n"
            started = time.monotonic()
            killed = await agent.kill_descendants_since(since, settle=settle)
            assert killed == []
            assert time.monotonic() - started < settle / 2, "the sweep waited for a zombie"
            await agent.kill_tree()


@both
async def test_agent_ignoring_sigterm_is_killed() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent("--ignore-sigterm") as tree:
            assert await tree.agent.kill_tree(term_timeout=0.2) == ["sigterm", "sigkill"]
            tree.assert_all_gone()
            assert tree.agent.returncode == ExitStatus(code=None, signal=signal.SIGKILL)


@pytest.mark.parametrize(
    ("agent_args", "term_timeout", "expected"),
    [
        # The agent goes on SIGTERM; its leftovers, deaf to it, are SIGKILLed after the cleanup
        # grace (0.5 s: the shim's, or ours in a cgroup), and the steps say so.
        ((), 2.0, ["sigterm", "sigkill"]),
        # Nothing goes on SIGTERM: the supervisor freezes and kills the lot.
        (("--ignore-sigterm",), 0.2, ["sigterm", "sigkill"]),
    ],
)
@both
async def test_setsid_double_fork_and_term_ignoring_descendants_all_go(
    agent_args: tuple[str, ...], term_timeout: float, expected: list[str]
) -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*agent_args, *HARD_TREE) as tree:
            [daemon] = tree.roles["daemon"]
            if isinstance(tree.agent, ShimProcess):
                # The double-forked daemon was re-parented to the shim, not to init.
                assert psutil.Process(daemon).ppid() == tree.agent.pid
            else:
                # Re-parented to init, and still in the agent's cgroup.
                assert isinstance(tree.agent, CgroupProcess)
                assert daemon in tree.agent.cgroup.pids()
            [setsid] = tree.roles["setsid"]
            assert os.getsid(setsid) == setsid != os.getsid(tree.agent_pid)
            assert await tree.agent.kill_tree(term_timeout=term_timeout) == expected
            tree.assert_all_gone()


# Stands in for a shim that is wedged: it ignores SIGTERM and never reaps or exits.
STUCK_SHIM = """
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
argv = sys.argv[sys.argv.index("--") + 1:]
os.posix_spawn(argv[0], argv, os.environ, setsigdef=(signal.SIGTERM,))
while True:
    signal.pause()
"""


@shim_only
async def test_ladder_kills_a_stuck_shim_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_module, "_SHIM_PREFIX", (sys.executable, "-c", STUCK_SHIM))
    with trio.fail_after(LIMIT_S):
        async with tree_agent(
            "--ignore-sigterm", "--spawn", "child-ignore-term", "--spawn", "setsid-ignore-term"
        ) as tree:
            assert await tree.agent.kill_tree(term_timeout=0.2) == ["sigterm", "sigkill"]
            assert tree.agent.returncode == ExitStatus(code=None, signal=signal.SIGKILL)
            # Without a reaping shim the dead become init's zombies; dead all the same.
            assert all(_dead(proc) for proc in tree.procs)


@both
async def test_agent_exiting_by_itself_leaves_nothing_behind() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*COOPERATIVE_TREE, *HARD_TREE) as tree:
            await tree.send("exit 0")
            assert await tree.agent.wait() == ExitStatus(code=0, signal=None)
            tree.assert_all_gone()  # before aclose: containment cleaned up on its own
            assert await tree.lines.rest() == b""  # and stdout reached EOF
            # Nothing to do now; what the cleanup took (the hard tree deaf to SIGTERM) is said.
            assert tree.agent.cleanup_killed
            assert await tree.agent.kill_tree() == ["sigkill"]


@both
async def test_kill_tree_is_idempotent() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*COOPERATIVE_TREE) as tree:
            assert await tree.agent.kill_tree() == ["sigterm"]
            started = time.monotonic()
            assert await tree.agent.kill_tree() == []
            assert await tree.agent.kill_tree() == []
            assert time.monotonic() - started < 0.1
            assert tree.agent.members() == []
        tree.assert_all_gone()


@both
async def test_concurrent_kill_tree_calls_agree() -> None:
    results: list[list[str]] = []

    async def kill(agent: AgentProcess) -> None:
        results.append(await agent.kill_tree(term_timeout=0.2))

    with trio.fail_after(LIMIT_S):
        async with tree_agent("--ignore-sigterm", *HARD_TREE) as tree:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill, tree.agent)
                nursery.start_soon(kill, tree.agent)
            tree.assert_all_gone()
    assert sorted(results) == [[], ["sigterm", "sigkill"]]


@both
async def test_aclose_finishes_the_ladder_under_cancellation() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent("--ignore-sigterm", *HARD_TREE) as tree:
            started = time.monotonic()
            with trio.move_on_after(0.05) as scope:  # fires while aclose waits out SIGTERM
                await tree.agent.aclose()
            assert scope.cancel_called
            assert time.monotonic() - started >= 0.9  # the 1 s SIGTERM wait was not cut short
            tree.assert_all_gone()
            assert tree.agent.returncode == ExitStatus(code=None, signal=signal.SIGKILL)

            with trio.CancelScope() as already_cancelled:
                already_cancelled.cancel()
                await tree.agent.aclose()  # again, under a cancelled scope: still fine


# --- containment lost, and processes that will not die ---------------------------------------


@shim_only
@pytest.mark.parametrize("agent_args", [(), ("--ignore-sigterm",)])
async def test_a_killed_shim_is_containment_lost_and_the_tree_is_killed(
    agent_args: tuple[str, ...],
) -> None:
    # The OOM killer or a `pkill -9 python` takes the shim: its tree is re-parented to init,
    # out of the shim's reach. We notice the shim's death, find the loose tree (mark, session,
    # members seen before) and kill it ourselves, a setsid'd daemon that ignores SIGTERM too.
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*agent_args, *HARD_TREE) as tree:
            os.kill(tree.agent.pid, signal.SIGKILL)
            status = await tree.agent.wait()
            assert status == ExitStatus(code=None, signal=signal.SIGKILL)
            assert tree.agent.lost_steps == ["containment_lost", "sigkill"]
            assert tree.agent.survivors == []
            # At once, not at some later kill (zombies now: init reaps the loose tree).
            assert all(_dead(proc) for proc in tree.procs)
            assert await tree.agent.kill_tree() == ["containment_lost", "sigkill"]


@shim_only
async def test_kill_tree_after_the_shim_was_killed_kills_the_tree_itself() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent("--ignore-sigterm", *HARD_TREE) as tree:
            os.kill(tree.agent.pid, signal.SIGKILL)
            # The ladder finds the shim dead: it does not return early, it kills what is loose.
            # (Whether trio had reaped the shim before the ladder began is a race.)
            steps = await tree.agent.kill_tree(term_timeout=0.2)
            assert steps in (
                ["containment_lost", "sigkill"],
                ["sigterm", "containment_lost", "sigkill"],
            )
            assert all(_dead(proc) for proc in tree.procs)


@shim_only
async def test_a_healthy_shim_exit_is_not_containment_lost() -> None:
    with trio.fail_after(LIMIT_S):
        async with tree_agent(*COOPERATIVE_TREE) as tree:
            await tree.send("kill 9")  # the agent dies of SIGKILL; the shim mirrors it
            assert await tree.agent.wait() == ExitStatus(code=None, signal=signal.SIGKILL)
            assert tree.agent.lost_steps == []
        tree.assert_all_gone()


@cgroup_only
async def test_a_process_that_left_its_cgroup_is_found_by_its_mark() -> None:
    # Only a process allowed to write another cgroup's cgroup.procs can leave (root here): the
    # cgroup no longer lists it, the mark still names it.
    with trio.fail_after(LIMIT_S):
        async with tree_agent("--ignore-sigterm", *HARD_TREE) as tree:
            assert isinstance(tree.agent, CgroupProcess)
            [daemon] = tree.roles["daemon"]
            (tree.agent.cgroup.path.parent.parent / "cgroup.procs").write_text(str(daemon))
            assert daemon not in tree.agent.cgroup.pids()
            steps = await tree.agent.kill_tree(term_timeout=0.2)
            assert steps == ["sigterm", "containment_lost", "sigkill"]
            assert tree.agent.lost_steps == ["containment_lost", "sigkill"]
            assert all(_dead(proc) for proc in tree.procs)


@both
async def test_a_member_that_survives_sigkill_is_reported_not_hidden(
    monkeypatch: pytest.MonkeyPatch, containment: str
) -> None:
    # A daemon of the tree in uninterruptible sleep (frozen: ``tests/unkillable.py``).
    require_freezer()
    monkeypatch.setattr(process_module, "VERIFY_S", 0.3)
    with trio.fail_after(LIMIT_S):
        async with tree_agent("--ignore-sigterm", *HARD_TREE) as tree:
            [daemon] = tree.roles["daemon"]
            with unkillable(daemon):
                with pytest.raises(KillError) as raised:
                    await tree.agent.kill_tree(term_timeout=0.2)
                assert raised.value.pids == (daemon,)
                # The shim cannot exit with a child left: we kill it too, and take over.
                lost = ["containment_lost"] if containment == "shim" else []
                assert raised.value.steps == ["sigterm", *lost, "sigkill"]
                assert [s["pid"] for s in tree.agent.survivors] == [daemon]
                # Everything else is dead; asking again does not pretend otherwise.
                others = [p for p in tree.procs if p.pid != daemon]
                assert all(_dead(p) for p in others) and not _dead(psutil.Process(daemon))
                with pytest.raises(KillError):
                    await tree.agent.kill_tree()
            # Thawed, it dies of the SIGKILL it had pending.


# --- supervisor death ------------------------------------------------------------------------

# A stand-in supervisor: spawns the tree, reports every pid, then idles until SIGKILLed.
FAKE_SUPERVISOR = """
import json, sys, trio
from supervisor.agents.process import AgentProcess

async def main():
    agent = await AgentProcess.spawn(sys.argv[1:])
    line = b""
    while not line.endswith(b"\\n"):
        line += await agent.stdout.receive_some(65536)
    ready = json.loads(line)
    ready["shim"] = agent.pid
    print(json.dumps(ready), flush=True)
    await trio.sleep_forever()

trio.run(main)
"""


@both
async def test_supervisor_death_kills_the_tree() -> None:
    argv = [sys.executable, str(TREE_AGENT), "--ignore-sigterm", *HARD_TREE]
    with trio.fail_after(LIMIT_S):
        supervisor = await trio.lowlevel.open_process(
            [sys.executable, "-c", FAKE_SUPERVISOR, *argv],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        try:
            assert supervisor.stdout is not None
            ready = json.loads(await Lines(supervisor.stdout).next())
            shim = psutil.Process(ready["shim"])
            tree = [psutil.Process(pid) for pid in [ready["pid"], *ready["pids"]]]
            supervisor.kill()
            await supervisor.wait()
            # Waiting on other processes' deaths, not on our own state: a bounded poll.
            _, alive = await trio.to_thread.run_sync(
                lambda: psutil.wait_procs([shim, *tree], timeout=LIMIT_S / 2)
            )
        finally:
            supervisor.kill()
            await supervisor.wait()
    # The shim reaps the whole tree before it exits. The shim itself is reaped by init,
    # which in some containers does so only every few seconds: a zombie shim is dead enough.
    assert not [proc for proc in tree if proc.is_running()]
    assert not [proc for proc in alive if proc is not shim] and _dead(shim)


def _dead(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- commands that cannot run ----------------------------------------------------------------


@both
async def test_spawn_of_a_missing_command_raises() -> None:
    with pytest.raises(SpawnError, match="cannot execute 'no-such-agent-xyz': not found on PATH"):
        await AgentProcess.spawn(["no-such-agent-xyz", "--help"])
    with pytest.raises(SpawnError, match="empty command"):
        await AgentProcess.spawn([])


@both
async def test_spawn_checks_paths_relative_to_cwd(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    with pytest.raises(SpawnError, match="'./agent.sh': Permission denied"):
        await AgentProcess.spawn(["./agent.sh"], cwd=tmp_path)
    with pytest.raises(SpawnError, match="'./missing': No such file or directory"):
        await AgentProcess.spawn(["./missing"], cwd=tmp_path)
    script.chmod(0o755)
    with trio.fail_after(LIMIT_S):
        async with await AgentProcess.spawn(["./agent.sh"], cwd=tmp_path) as agent:
            assert await Lines(agent.stdout).rest() == b"ran\n"
            assert await agent.wait() == ExitStatus(code=0, signal=None)


@pytest.mark.parametrize(
    ("make_argv", "code", "reasons"),
    [
        (lambda tmp: ["no-such-agent-xyz"], 127, ("No such file or directory", "not found")),
        (lambda tmp: [str(tmp / "not-executable")], 126, ("Permission denied",) * 2),
    ],
)
@both
async def test_a_command_that_vanished_after_the_check_is_reported(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    containment: str,
    make_argv: object,
    code: int,
    reasons: tuple[str, str],
) -> None:
    # The race spawn's own check cannot close: the shim answers like a shell would, and the
    # cgroup wrapper is a shell.
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    monkeypatch.setattr(process_module, "_check_executable", lambda *args: None)
    assert callable(make_argv)
    argv: Sequence[str] = make_argv(tmp_path)
    with trio.fail_after(LIMIT_S):
        async with await AgentProcess.spawn(argv) as agent:
            err = await Lines(agent.stderr).rest()
            assert await agent.wait() == ExitStatus(code=code, signal=None)
    if containment == "shim":
        expected = f"agent-supervisor shim: cannot execute {argv[0]!r}: {reasons[0]}\n"
        assert err.decode() == expected
    else:
        assert argv[0] in err.decode() and reasons[1] in err.decode()


def test_shim_is_a_plain_script_path() -> None:
    # The shim is run by path with -S -E: it must not import the supervisor package.
    assert SHIM_PATH.is_file()
    source = SHIM_PATH.read_text()
    assert "import supervisor" not in source and "from supervisor" not in source
