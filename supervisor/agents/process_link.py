"""A real agent process as a link: pumps between its pipes and the session actor's inbox.

Writing: ``send`` writes the message to the agent's stdin at once, from the actor's own step,
without blocking (the pipe is non-blocking): an interrupt reaches the agent in the same pass of
trio's run loop as the cancel that sent it, whatever else runs. Only what the pipe does not
take (an agent that stopped reading) is queued, unbounded, for the *writer* task, which waits
for the pipe to drain; so a wedged agent never blocks the actor, and order is kept.

Reading: the *reader* splits stdout into lines and posts one :class:`AgentLines` per read
(blocking while the actor's inbox is full: backpressure on a flooding agent); the actor decodes
them. The *stderr* pump keeps a bounded tail and posts a batch of lines per read. When stdout
is drained and the process has exited, the reader posts exactly one :class:`AgentGone`. A
fourth task watches the process's exit, so a dead shim's loose tree is killed at once.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import secrets
from collections import deque
from typing import Any

import trio

from protocols import PROTOCOLS
from protocols.framing import LineDecoder, encode_message
from supervisor.agents.containment import Containment, choose
from supervisor.agents.link import AgentGone, AgentLines, AgentLink, AgentStderrLines, Inbox
from supervisor.agents.process import AgentProcess, KillError
from supervisor.agents.statefile import StateFile
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus

__all__ = ["ProcessLauncher", "ProcessLink", "launch_process", "link_type"]

#: waitid's flags for "has it exited?" that leave the child to be reaped by its waiter
_EXITED_UNREAPED = os.WEXITED | os.WNOHANG | os.WNOWAIT

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
        inbox: Inbox,
        *,
        secret: str | None = None,
    ) -> None:
        self.process = process
        self.generation = generation
        self._spec = spec
        self._inbox = inbox
        #: the process's own secret (``AgentProtocol.environment``); never logged
        self._secret = secret
        self._stdin_fd = process.stdin_fd
        #: what the pipe did not take yet, in order (the writer task's)
        self._unsent: deque[bytes] = deque()
        #: sent while writes are held (``hold_writes``), in order; None: not held
        self._held: list[bytes] | None = None
        self._writer = trio.lowlevel.ParkingLot()
        self._stdin_state = "open"  # open, closing (flush, then EOF), closed
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._stderr_done = trio.Event()

    @classmethod
    async def spawn_process(
        cls,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        containment: Containment,
        spec: AgentSpec,
    ) -> AgentProcess:
        """Start the agent's process as this transport needs it (piped stdio here)."""
        return await AgentProcess.spawn(argv, env=env, cwd=cwd, containment=containment)

    # -- AgentLink -----------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        if self._stdin_state != "open":
            return  # stdin is closed: the agent is going away and AgentGone will say so
        data = encode_message(message)
        if self._held is not None:
            self._held.append(data)
        else:
            self._write(data)

    def hold_writes(self) -> None:
        if self._held is None:
            self._held = []

    def release_writes(self) -> None:
        held, self._held = self._held, None
        if held:
            self._write(b"".join(held))

    def _write(self, data: bytes) -> None:
        """Write at once what the pipe takes; the writer task writes the rest when it can."""
        if self._stdin_state == "closed":
            return
        if not self._unsent:
            try:
                written = os.write(self._stdin_fd, data)
            except BlockingIOError:
                written = 0
            except OSError:  # EPIPE: it closed its stdin or died; the reader reports the exit
                self._stdin_state = "closed"
                return
            if written == len(data):
                return
            data = data[written:]
        self._unsent.append(data)
        self._writer.unpark()

    def signal(self, signum: int) -> None:
        if self._held:
            self.release_writes()  # what was sent before it is written before it
            self.hold_writes()
        self.process.signal(signum)

    async def kill(self) -> list[str]:
        # No stdin EOF first: that is close()'s polite request; a kill is the ladder alone.
        return await self.process.kill_tree(self._spec.kill_timeout_s)

    async def kill_turn_processes(self, since: float) -> list[dict[str, Any]]:
        return await self.process.kill_descendants_since(since)

    async def memory_mb(self) -> float | None:
        try:
            used = await trio.to_thread.run_sync(self.process.memory_bytes)
        except OSError:
            return None
        return used / (1024 * 1024)

    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        self._close_stdin()  # the writer flushes what is queued, then closes stdin
        with trio.move_on_after(timeout):
            status = await self.process.wait()
            await self.process.aclose()  # nothing is left of the tree by now; make sure
            return status, self.process.exit_steps
        steps = await self.process.kill_tree(self._spec.kill_timeout_s)
        return self.process.returncode, steps

    @property
    def stderr_tail(self) -> list[str]:
        return list(self._tail)

    @property
    def leader_exited(self) -> bool:
        # One waitid that leaves it unreaped (trio's wait still collects it), not
        # ``process.returncode``: five Python calls and a lock, on a cancel's cold path. Once
        # reaped, the pid is no child of ours (ChildProcessError) unless a child of ours started
        # since got it after the pid space wrapped around, in the few passes before the exit is
        # handled: then it says alive, as it would have a moment before.
        try:
            status = os.waitid(os.P_PID, self.process.pid, _EXITED_UNREAPED)
        except ChildProcessError:
            return True
        return status is not None

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

    def _close_stdin(self) -> None:
        if self._stdin_state == "open":
            self._stdin_state = "closing"
            self._writer.unpark()

    async def write_stdin(self) -> None:
        """What ``send`` could not write at once, when the pipe has room; then stdin's EOF."""
        try:
            while self._stdin_state != "closed":
                if not self._unsent:
                    if self._stdin_state == "closing":
                        break
                    await self._writer.park()
                    continue
                await trio.lowlevel.wait_writable(self._stdin_fd)
                data = self._unsent[0]
                try:
                    written = os.write(self._stdin_fd, data)
                except BlockingIOError:
                    continue
                if written == len(data):
                    self._unsent.popleft()
                else:
                    self._unsent[0] = data[written:]
        except OSError:
            pass  # the agent closed its stdin or died; the reader reports the exit
        finally:
            self._stdin_state = "closed"
            self._unsent.clear()
            with trio.CancelScope(shield=True):
                await self.process.close_stdin()

    async def read_stdout(self) -> None:
        """One :class:`AgentLines` per read. A read that drained the pipe (it took less than
        it could) is followed by a wait for the pipe in the same step: one step a read, and on
        a cancel's answer no step of ours between the actor's and its caller's. A full read
        gives the actor its turn first (a pass), then reads again at once: two steps a read,
        where ``receive_some`` and ``send`` take three (each checkpoints first)."""
        decoder = LineDecoder()
        stdout = self.process.stdout
        try:
            drained = False
            while True:
                data = await read_pipe(stdout, drained)
                drained = False
                lines = decoder.feed_lines(data) if data else decoder.end_lines()
                if lines:
                    item = AgentLines(self.generation, lines)
                    take = self.take_now
                    at_once = True
                    if take is None or not take(item):
                        try:
                            self._inbox.send_nowait(item)
                        except trio.WouldBlock:
                            await self._inbox.send(item)  # full: the agent waits on its pipe
                            at_once = False
                    if at_once:
                        if len(data) < _READ_SIZE:
                            drained = True
                        else:
                            await trio.lowlevel.checkpoint()  # the actor's turn, then ours
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
                        await self._stderr_lines([pending])
                    return
                pending += data
                *lines, pending = pending.split(b"\n")
                if len(pending) > STDERR_LINE_CHARS * 4:
                    lines.append(pending)
                    pending = b""
                await self._stderr_lines(lines)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._stderr_done.set()

    async def _stderr_lines(self, raw_lines: list[bytes]) -> None:
        lines = []
        for raw in raw_lines:
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if len(line) > STDERR_LINE_CHARS:
                line = line[:STDERR_LINE_CHARS] + "…"
            if line.strip():
                lines.append(line)
        if lines:
            self._tail.extend(lines)
            await self._inbox.send(AgentStderrLines(self.generation, lines))


class ProcessLauncher:
    """The default :class:`supervisor.agents.link.Launcher`: the agent, contained (a cgroup of its
    own, or the shim: ``supervisor/agents/containment.py``).

    With a :class:`StateFile`, every tree is recorded while it runs, so a supervisor that
    starts after a crash can sweep what this one left behind.
    """

    def __init__(
        self, state: StateFile | None = None, *, containment: Containment | str | None = None
    ) -> None:
        self.state = state
        self.containment = containment
        #: the trees of links still running, by their leader's pid (for :meth:`kill_all`)
        self._live: dict[int, AgentProcess] = {}

    async def __call__(
        self,
        spec: AgentSpec,
        *,
        cwd: str,
        resume: str | None,
        generation: int,
        inbox: Inbox,
        nursery: trio.Nursery,
    ) -> AgentLink:
        protocol = PROTOCOLS[spec.protocol]
        base = spec.resume_command if resume is not None and spec.resume_command else spec.command
        argv = protocol.command(base, resume, mcp_servers=spec.mcp_servers)
        env = spec.process_env()
        # One secret per process, for the protocol's environment and the link alone.
        secret = secrets.token_urlsafe(32)
        env.update(protocol.environment(secret, mcp_servers=spec.mcp_servers, configured=env))
        containment = self.containment
        if not isinstance(containment, Containment):
            containment = await choose(containment)  # cheap once detected
        kind = link_type(protocol.transport)
        process = await kind.spawn_process(
            argv, env=env, cwd=cwd, containment=containment, spec=spec
        )
        if self.state is not None:
            self.state.record(process, argv)
        self._live[process.pid] = process
        link = kind(process, spec, generation, inbox, secret=secret)
        nursery.start_soon(self._run_link, link)
        return link

    async def _run_link(self, link: ProcessLink) -> None:
        try:
            await link.run()
        finally:
            self._live.pop(link.process.pid, None)
            if self.state is not None:
                self.state.forget(link.process.pid)

    async def kill_all(self) -> None:
        """Kill every tree this launcher started that still runs, at once: SIGTERM and SIGKILL
        with no wait between (a second Ctrl-C of ``serve``). Bounded by the ladder's verify."""
        async with trio.open_nursery() as nursery:
            for process in list(self._live.values()):
                nursery.start_soon(_kill_now, process)


async def _kill_now(process: AgentProcess) -> None:
    with contextlib.suppress(KillError):  # whoever waits on the link reports survivors
        await process.kill_tree(0)


async def read_pipe(stream: trio.abc.ReceiveStream, drained: bool = False) -> bytes:
    """The next bytes of an agent's output pipe, ``b""`` at its end or once it is closed.
    Unlike ``receive_some``, what the pipe already holds is read without waiting a pass of the
    run loop first (the reader has just had one). ``drained``: the last read emptied the pipe,
    so it is waited on before it is read (a read now would only find it empty)."""
    if not isinstance(stream, trio.lowlevel.FdStream):
        try:
            return bytes(await stream.receive_some(_READ_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""
    while True:
        fd = stream.fileno()  # -1 once closed: never a number some other file reuses
        if fd < 0:
            return b""
        if drained:
            drained = False
            try:
                await trio.lowlevel.wait_readable(fd)
            except trio.ClosedResourceError:
                return b""
            continue
        try:
            return os.read(fd, _READ_SIZE)
        except BlockingIOError:
            pass
        except OSError:
            return b""  # the pipe broke: as its end
        try:
            await trio.lowlevel.wait_readable(fd)
        except trio.ClosedResourceError:
            return b""


#: How each transport (``AgentProtocol.transport``) talks to its process.
LINK_TYPES: dict[str, type[ProcessLink]] = {"stdio": ProcessLink}
#: Transports whose link is in a module of its own, imported (and so registered) when an agent
#: first needs it: the HTTP link needs httpx, ~35 ms to import, which only OpenCode should pay.
_LINK_MODULES: dict[str, str] = {
    "http": "supervisor.agents.http_link",
    "terminal": "supervisor.agents.pty_link",
}


def link_type(transport: str) -> type[ProcessLink]:
    link = LINK_TYPES.get(transport)
    if link is None:
        importlib.import_module(_LINK_MODULES[transport])
        link = LINK_TYPES[transport]
    return link


#: A launcher without a state file, for embedding and tests.
launch_process = ProcessLauncher()
