"""A real agent process as a link: pumps between its pipes and the session actor's inbox.

Three tasks per process, all in the session's nursery: the *writer* drains an unbounded queue of
outgoing messages into stdin (so the actor never blocks on a wedged agent), the *reader* frames
stdout and posts each frame (blocking when the actor's inbox is full: backpressure on a flooding
agent), and the *stderr* pump keeps a bounded tail and posts lines. When stdout is drained and
the process has exited, the reader posts exactly one :class:`AgentGone`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections import deque
from typing import Any

import trio

from protocols import PROTOCOLS
from protocols.framing import LineDecoder, encode_message
from supervisor.config import AgentSpec
from supervisor.containment import Containment, choose
from supervisor.link import AgentFrame, AgentGone, AgentLink, AgentStderrLine
from supervisor.process import AgentProcess, ExitStatus, KillError
from supervisor.statefile import StateFile

__all__ = ["ProcessLauncher", "ProcessLink", "launch_process"]

log = logging.getLogger(__name__)

#: Lines of stderr kept for error messages, and the longest line kept whole.
STDERR_TAIL_LINES = 50
STDERR_LINE_CHARS = 2000
_READ_SIZE = 65536
#: An agent that closed its stdout gets this long to exit before it is killed (it can no longer
#: say anything, so a turn could never end). Agents exit within ~50 ms of their stdout closing.
STDOUT_EOF_GRACE_S = 2.0


class ProcessLink(AgentLink):
    def __init__(
        self,
        process: AgentProcess,
        spec: AgentSpec,
        generation: int,
        inbox: trio.MemorySendChannel[Any],
        *,
        secret: str | None = None,
    ) -> None:
        self.process = process
        self.generation = generation
        self._spec = spec
        self._inbox = inbox
        #: the process's own secret (``AgentProtocol.environment``); never logged
        self._secret = secret
        self._outgoing_send, self._outgoing = trio.open_memory_channel[bytes](math.inf)
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._stderr_done = trio.Event()

    # -- AgentLink -----------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._outgoing_send.send_nowait(encode_message(message))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # stdin is closed: the agent is going away and AgentGone will say so

    def signal(self, signum: int) -> None:
        self.process.signal(signum)

    async def kill(self) -> list[str]:
        # No stdin EOF first: that is close()'s polite request; a kill is the ladder alone.
        return await self.process.kill_tree(self._spec.kill_timeout_s)

    async def kill_turn_processes(self, since: float) -> list[dict[str, Any]]:
        return await self.process.kill_descendants_since(since)

    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        self._outgoing_send.close()  # the writer flushes what is queued, then closes stdin
        with trio.move_on_after(timeout):
            status = await self.process.wait()
            await self.process.aclose()  # nothing is left of the tree by now; make sure
            return status, list(self.process.lost_steps)
        steps = await self.process.kill_tree(self._spec.kill_timeout_s)
        return self.process.returncode, steps

    @property
    def stderr_tail(self) -> list[str]:
        return list(self._tail)

    # -- pumps -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """The link's pumps; whatever happens, the process tree is gone when this returns.

        Subclasses for other transports (HTTP, per-turn processes) override this and ``send``.
        """
        try:
            async with trio.open_nursery() as pumps:
                pumps.start_soon(self.write_stdin)
                pumps.start_soon(self.read_stderr)
                pumps.start_soon(self.watch_exit)
                await self.read_stdout()
                pumps.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(KillError):
                await self.process.aclose()  # survivors are reported by whoever killed

    async def watch_exit(self) -> None:
        """As soon as our child exits, make sure the rest of its tree goes too: what the agent
        left behind, or the whole tree if the shim was killed (then the agent's stdout may
        never close by itself)."""
        await self.process.wait()

    def gone(self, status: ExitStatus) -> AgentGone:
        """The exit report, with what containment had to do and what survived."""
        return AgentGone(
            self.generation,
            status,
            steps=list(self.process.lost_steps),
            survivors=list(self.process.survivors),
        )

    async def write_stdin(self) -> None:
        try:
            async with self._outgoing:
                async for data in self._outgoing:
                    await self.process.stdin.send_all(data)
            await self.process.close_stdin()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the agent closed its stdin or died; the reader reports the exit

    async def read_stdout(self) -> None:
        decoder = LineDecoder()
        try:
            while True:
                try:
                    data = await self.process.stdout.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                frames = decoder.feed(bytes(data)) if data else decoder.end_of_input()
                for frame in frames:
                    await self._inbox.send(AgentFrame(self.generation, frame))
                if not data:
                    break
            with trio.move_on_after(1.0):
                await self._stderr_done.wait()  # so the tail holds the last words
            with trio.move_on_after(STDOUT_EOF_GRACE_S):
                status = await self.process.wait()
                await self._inbox.send(self.gone(status))
                return
            # Alive but mute: nothing it does can reach us any more, so it is as good as dead.
            log.warning("agent %s closed stdout but kept running: killing it", self.process.pid)
            with contextlib.suppress(KillError):  # the survivors are in the report
                await self.process.kill_tree(self._spec.kill_timeout_s)
            status = await self.process.wait()
            await self._inbox.send(self.gone(status))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the session is gone

    async def read_stderr(self) -> None:
        pending = b""
        try:
            while True:
                try:
                    data = await self.process.stderr.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    if pending:
                        await self._stderr_line(pending)
                    return
                pending += data
                *lines, pending = pending.split(b"\n")
                if len(pending) > STDERR_LINE_CHARS * 4:
                    lines.append(pending)
                    pending = b""
                for line in lines:
                    await self._stderr_line(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._stderr_done.set()

    async def _stderr_line(self, raw: bytes) -> None:
        line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
        if len(line) > STDERR_LINE_CHARS:
            line = line[:STDERR_LINE_CHARS] + "…"
        if not line.strip():
            return
        self._tail.append(line)
        await self._inbox.send(AgentStderrLine(self.generation, line))


class ProcessLauncher:
    """The default :class:`supervisor.link.Launcher`: the agent, contained (a cgroup of its
    own, or the shim: ``supervisor/containment.py``).

    With a :class:`StateFile`, every tree is recorded while it runs, so a supervisor that
    starts after a crash can sweep what this one left behind.
    """

    def __init__(
        self, state: StateFile | None = None, *, containment: Containment | str | None = None
    ) -> None:
        self.state = state
        self.containment = containment

    async def __call__(
        self,
        spec: AgentSpec,
        *,
        cwd: str,
        resume: str | None,
        generation: int,
        inbox: trio.MemorySendChannel[Any],
        nursery: trio.Nursery,
    ) -> AgentLink:
        protocol = PROTOCOLS[spec.protocol]
        argv = protocol.command(spec.command, resume)
        env = spec.process_env()
        # One secret per process, for the protocol's environment and the link alone.
        secret = secrets.token_urlsafe(32)
        env.update(protocol.environment(secret))
        containment = self.containment
        if not isinstance(containment, Containment):
            containment = await choose(containment)  # cheap once detected
        process = await AgentProcess.spawn(argv, env=env, cwd=cwd, containment=containment)
        if self.state is not None:
            self.state.record(process, argv)
        link = LINK_TYPES[protocol.transport](process, spec, generation, inbox, secret=secret)
        nursery.start_soon(self._run_link, link)
        return link

    async def _run_link(self, link: ProcessLink) -> None:
        try:
            await link.run()
        finally:
            if self.state is not None:
                self.state.forget(link.process.pid)


#: How each transport (``AgentProtocol.transport``) talks to its process.
LINK_TYPES: dict[str, type[ProcessLink]] = {"stdio": ProcessLink}

#: A launcher without a state file, for embedding and tests.
launch_process = ProcessLauncher()
