"""The agents of the fault suite: one per protocol, with its words for every fault.

ACP is the built-in demo agent; Codex, Claude, OpenCode and Amp are the scripted fake CLIs of
``tests/fakes`` (their fault modes are described in each fake's docstring). A fault missing
from an agent's ``words`` is not meaningful for its protocol; the comment beside it says why.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import psutil
import trio

from faults.harness import BOUND, FAKES, FaultRecorder, living, tree, wait_gone
from protocols import events as ev
from protocols.claude import CLAUDE_COMMAND
from supervisor import AgentSpec, Session, Supervisor, open_supervisor

#: Between SIGTERM and SIGKILL of the tree: short, the cells wait for it.
KILL_TIMEOUT = 0.3
#: Long enough that a turn never ends by itself during a cell.
MANY = "words=100000"


@attrs.frozen
class Agent:
    """How to run one protocol's agent, and its words for each fault."""

    protocol: str
    command: Callable[[Path], list[str]]
    #: prompt words of each fault (a fault missing here is not meaningful for the protocol)
    words: dict[str, str]
    #: command-line flags of each fault
    flags: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: the interrupt ends the process (Amp: SIGINT ends the whole run)
    interrupt_exits: bool = False

    def prompt(self, fault: str) -> str:
        return self.words[SAME_AGENT_AS.get(fault, fault)]

    def has(self, fault: str) -> bool:
        return SAME_AGENT_AS.get(fault, fault) in self.words

    def spec(self, state_dir: Path, fault: str, grace: float) -> AgentSpec:
        fault = SAME_AGENT_AS.get(fault, fault)
        return AgentSpec(
            name=self.protocol,
            protocol=self.protocol,
            command=[*self.command(state_dir), *self.flags.get(fault, ())],
            grace_s=grace,
            kill_timeout_s=KILL_TIMEOUT,
            start_timeout_s=30.0,
        )


def demo_command(state_dir: Path) -> list[str]:
    demo = AgentSpec.from_config("demo").command
    return [*demo, "--delay", "0.02", "--state-dir", str(state_dir)]


def codex_command(state_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(FAKES / "fake_codex.py"),
        "app-server",
        "--state-dir",
        str(state_dir),
    ]


def claude_command(state_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(FAKES / "fake_claude.py"),
        *CLAUDE_COMMAND[1:],
        "--state-dir",
        str(state_dir),
    ]


def opencode_command(state_dir: Path) -> list[str]:
    return [sys.executable, str(FAKES / "fake_opencode.py"), "serve", "--state-dir", str(state_dir)]


def amp_command(state_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(FAKES / "fake_amp.py"),
        "--execute",
        "--stream-json",
        "--stream-json-input",
        "--state-dir",
        str(state_dir),
    ]


AGENTS: dict[str, Agent] = {
    "acp": Agent(
        "acp",
        demo_command,
        words={
            "ignores_interrupt": f"ignore-cancel {MANY}",
            "ignores_sigterm": f"ignore-cancel {MANY}",
            "crash": "crash words=10",
            # The demo agent has no crash-on-cancel directive (and supervisor/ is not ours to
            # change): it ignores the cancel and crashes after its third word, 1.5 s in, while
            # the cancel sent after the first word (0.5 s) is in flight.
            "crash_during_cancel": "crash ignore-cancel delay=0.5 words=10",
            "mute": f"mute ignore-cancel {MANY}",
            "flood": "flood words=10000000",
            "grandchild": f"grandchildren ignore-cancel {MANY}",
            "permission": "permission",
            # ACP names the turn by our own request, so it is never unidentified; this is the
            # race of a cancel right behind its prompt, before the agent has said anything.
            "early_cancel": MANY,
            "concurrent_cancels": f"stop-delay=0.3 {MANY}",
            "client_disconnect": f"ignore-cancel {MANY}",
        },
        flags={"ignores_sigterm": ("--ignore-sigterm",)},
    ),
    "codex": Agent(
        "codex",
        codex_command,
        words={
            "ignores_interrupt": f"wedged {MANY}",
            "ignores_sigterm": f"wedged {MANY}",
            "crash": "crash words=10",
            "crash_during_cancel": f"crash-on-interrupt {MANY}",
            "mute": f"mute {MANY}",
            "flood": "flood words=10000000",
            "grandchild": f"wedged terminal {MANY}",
            "permission": f"approval {MANY}",
            # No turn id until the turn/start reply: the interrupt waits for it.
            "early_cancel": f"reply-delay=0.3 {MANY}",
            "concurrent_cancels": MANY,
            "client_disconnect": f"wedged {MANY}",
        },
        flags={
            "ignores_sigterm": ("--ignore-sigterm",),
            "concurrent_cancels": ("--stop-delay", "0.3"),
        },
    ),
    "claude": Agent(
        "claude",
        claude_command,
        words={
            "ignores_interrupt": f"ignore-interrupt {MANY}",
            "ignores_sigterm": f"ignore-interrupt {MANY}",
            "crash": "crash words=10",
            "crash_during_cancel": f"crash-on-interrupt {MANY}",
            "mute": f"mute {MANY}",
            "flood": "flood words=10000000",
            "grandchild": f"ignore-interrupt child {MANY}",
            "permission": "permission",
            # The turn is identified by its system/init: the interrupt is written before it.
            "early_cancel": f"init-delay=0.3 {MANY}",
            "concurrent_cancels": MANY,
            "client_disconnect": f"ignore-interrupt {MANY}",
        },
        flags={
            "ignores_sigterm": ("--ignore-sigterm",),
            "concurrent_cancels": ("--stop-delay", "0.3"),
        },
    ),
    "opencode": Agent(
        "opencode",
        opencode_command,
        words={
            "ignores_interrupt": f"wedged {MANY}",
            "ignores_sigterm": f"wedged {MANY}",
            "crash": "crash words=10",
            "crash_during_cancel": f"crash-on-abort {MANY}",
            # A server's stdout is not its protocol channel: "mute" is a hung server, stdout
            # closed and the event stream silent (heartbeats too) while it stays alive.
            "mute": f"mute {MANY}",
            "flood": "flood words=10000000",
            "grandchild": f"wedged grandchild {MANY}",
            "permission": f"permission {MANY}",
            # The abort is held until the session goes busy (an earlier one is a no-op).
            "early_cancel": f"busy-delay=0.3 {MANY}",
            # The fake stops at once; the abort's round trip is what the cancels overlap.
            "concurrent_cancels": MANY,
            "client_disconnect": f"wedged {MANY}",
        },
        flags={"ignores_sigterm": ("--ignore-sigterm",)},
    ),
    # Amp's interrupt is SIGINT, which ends the whole run: every Amp cancel is an exit during
    # the cancel, then a respawn that continues the thread. Left out: "permission" (Amp's
    # stream-json has no permission protocol) and "crash_during_cancel" (no different from its
    # ordinary cancel, which every other Amp cell makes).
    "amp": Agent(
        "amp",
        amp_command,
        words={
            "ignores_interrupt": MANY,
            "ignores_sigterm": MANY,
            "crash": "crash words=10",
            "mute": f"mute {MANY}",
            "flood": "flood words=10000000",
            "grandchild": f"shell {MANY}",
            # Before its system/init the thread of this turn is not known to us.
            "early_cancel": MANY,
            "concurrent_cancels": MANY,
            "client_disconnect": MANY,
        },
        flags={
            "ignores_interrupt": ("--ignore-sigint",),
            "ignores_sigterm": ("--ignore-sigint", "--ignore-sigterm"),
            "grandchild": ("--ignore-sigint",),
            "client_disconnect": ("--ignore-sigint",),
        },
        interrupt_exits=True,
    ),
}

FAULTS = [
    "ignores_interrupt",
    "ignores_sigterm",
    "crash",
    "crash_during_cancel",
    "mute",
    "flood",
    "grandchild",
    "permission",
    "early_cancel",
    "concurrent_cancels",
    "client_disconnect",
    "shim_killed",
    "keeper_killed",
]

#: Faults of one containment only (the shim, or the cgroup keeper, is what gets killed), and
#: the fault whose words and flags they reuse (an agent that ignores the interrupt and SIGTERM).
CONTAINMENT_FAULTS = {"shim_killed": "shim", "keeper_killed": "cgroup"}
SAME_AGENT_AS = {"shim_killed": "ignores_sigterm", "keeper_killed": "ignores_sigterm"}


@asynccontextmanager
async def agent_session(
    protocol: str, fault: str, state_dir: Path, grace: float
) -> AsyncIterator[tuple[Supervisor, Session, FaultRecorder, trio.Nursery]]:
    """A session of the protocol's agent, started for ``fault`` (its flags), recorded from its
    start; leaving it leaves no process behind. Bounded by :data:`BOUND`."""
    spec = AGENTS[protocol].spec(state_dir, fault, grace)
    seen: list[psutil.Process] = []
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={protocol: spec}) as sup:
            session = await sup.start_session(protocol, cwd=str(state_dir))
            rec = FaultRecorder(session)
            async with trio.open_nursery() as nursery:
                await nursery.start(rec.run)
                yield sup, session, rec, nursery
                seen = tree()
                nursery.cancel_scope.cancel()
        assert await wait_gone(seen, 5.0) == [], "leaving the supervisor left processes"
    assert living(tree()) == []


#: What each agent says on stderr as it goes on with a session it was started to resume.
RESUMING = {
    "acp": "demo-agent: loading session ",
    "codex": "fake-codex: resumed thr_",
    "opencode": "fake-opencode: resumed ses_",
    "amp": "fake-amp: continuing T-",
}


def said_it_resumed(protocol: str, rec: FaultRecorder) -> bool:
    """Whether the agent's newest process went on with the session, in its own words (the
    fakes and the demo agent log it; the Claude CLI's ``system/init`` echoes its argv)."""
    if protocol == "claude":
        inits = [
            e.data
            for e in rec.of_kind("session.info")
            if isinstance(e, ev.SessionInfo) and e.info_kind == "init"
        ]
        argv = inits[-1]["argv"]
        return isinstance(argv, list) and argv[-2:] == ["--resume", inits[0]["session_id"]]
    return any(line.startswith(RESUMING[protocol]) for line in rec.stderr())


async def grandchild_pid(protocol: str, rec: FaultRecorder, turn_id: str) -> int:
    """The pid of the helper the agent started in its own session, as the agent reports it."""
    if protocol == "opencode":
        line = await rec.wait_for(
            lambda e: (
                isinstance(e, ev.AgentStderr) and e.line.startswith("fake-opencode: grandchild ")
            )
        )
        assert isinstance(line, ev.AgentStderr)
        return int(line.line.split()[-1])
    tool = await rec.wait_kind("tool.call", turn_id=turn_id)
    assert isinstance(tool, ev.ToolCall)
    raw = tool.raw
    if protocol == "acp":
        return int(raw["rawOutput"]["setsidGrandchild"])
    if protocol == "codex":
        return int(raw["processId"])
    return int(raw["input"]["pid"])  # claude, amp
