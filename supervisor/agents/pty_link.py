"""An agent in a pseudo-terminal (``protocol = "terminal"``), as a link.

The agent runs contained like every agent (``ProcessLink``), with a pseudo-terminal for its
stdin, stdout and stderr and as its controlling terminal (``AgentProcess.spawn``'s
``terminal``). Its machine (``protocols/terminal.py``) reads the screen; this link carries bytes
and time to it and keys from it:

- *reader*: each read of the terminal's master end is posted as ``{"output": bytes, "now":
  t}`` (one frame a read, at most ``_READ_SIZE`` bytes; while the actor's inbox is full the
  reader waits, the terminal's buffer fills and the agent blocks on its writes: a flood is
  paced, never buffered here). The end of the terminal (EIO once no process holds it) and the
  process's exit are reported as for a piped agent: one :class:`AgentGone`, last.
- *clock*: the machine asks ``{"wake_at": t}``; at ``t`` (trio's clock, which ``now`` is read
  from too) ``{"tick": True, "now": t}`` is posted. One wake-up is pending at a time; a later
  ask replaces it.
- *writes*: ``{"keys": text}`` is written as its UTF-8 bytes at once, without blocking (what
  the terminal does not take waits for the writer task, in order), ``{"resize": [cols, rows]}``
  sets the terminal's size (the agent gets SIGWINCH).

Closing the session hangs the terminal up as closing a terminal window does (SIGHUP to the
agent's tree), then kills what is left after the timeout. Error messages quote the last lines
the agent drew, as a piped agent's quote its stderr.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
from collections import deque
from typing import Any, Final

import trio

from protocols.framing import Message
from protocols.terminal import TerminalSettings
from supervisor.agents.containment import Containment
from supervisor.agents.link import AgentFrame, Inbox
from supervisor.agents.process import AgentProcess, KillError, set_terminal_size
from supervisor.agents.process_link import (
    _READ_SIZE,
    LINK_TYPES,
    STDERR_LINE_CHARS,
    STDOUT_EOF_GRACE_S,
    ProcessLink,
    read_pipe,
)
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus

__all__ = ["DEFAULT_TERM", "PtyLink"]

log = logging.getLogger(__name__)

#: ``TERM`` for an agent whose environment sets none (a supervisor started by systemd has
#: none): what the screen model understands, and what TUIs expect of a modern terminal.
DEFAULT_TERM: Final = "xterm-256color"
#: The output kept for error messages: the last lines drawn, escape sequences removed.
TAIL_BYTES: Final = 8192
TAIL_LINES: Final = 5
_ESCAPES: Final = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.)")


class PtyLink(ProcessLink):
    """One agent in a pseudo-terminal."""

    def __init__(
        self,
        process: AgentProcess,
        spec: AgentSpec,
        generation: int,
        inbox: Inbox,
        *,
        secret: str | None = None,
    ) -> None:
        super().__init__(process, spec, generation, inbox, secret=secret)
        self._wake_at: float | None = None
        self._clock = trio.lowlevel.ParkingLot()
        self._output_tail: deque[bytes] = deque()
        self._tail_bytes = 0

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
        settings = spec.terminal or TerminalSettings()
        env.setdefault("TERM", DEFAULT_TERM)
        return await AgentProcess.spawn(
            argv,
            env=env,
            cwd=cwd,
            containment=containment,
            terminal=(settings.cols, settings.rows),
        )

    # -- AgentLink -----------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        keys = message.get("keys")
        if isinstance(keys, str):
            if self._stdin_state != "open":
                return  # closing: the agent is going away and AgentGone will say so
            data = keys.encode("utf-8", "replace")
            if self._held is not None:
                self._held.append(data)
            else:
                self._write(data)
            return
        wake = message.get("wake_at")
        if isinstance(wake, float | int):
            self._wake_at = float(wake)
            self._clock.unpark_all()
            return
        size = message.get("resize")
        if isinstance(size, list) and len(size) == 2:
            stdout = self.process.stdout
            fd = stdout.fileno() if isinstance(stdout, trio.lowlevel.FdStream) else -1
            if fd >= 0:  # (-1 once closed: never a number some other file reuses)
                with contextlib.suppress(OSError):  # the terminal is gone: so is the agent
                    set_terminal_size(fd, int(size[0]), int(size[1]))
            return
        log.warning("terminal link: unknown message %r", sorted(message))

    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        self._close_stdin()
        # What closing a terminal window sends; TUIs save their state and exit on it.
        self.process.signal(signal.SIGHUP)
        with trio.move_on_after(timeout):
            status = await self.process.wait()
            await self.process.aclose()
            return status, self.process.exit_steps
        steps = await self.process.kill_tree(self._spec.kill_timeout_s)
        return self.process.returncode, steps

    @property
    def stderr_tail(self) -> list[str]:
        """The last lines the agent drew (its stderr is the terminal too)."""
        text = _ESCAPES.sub(b"", b"".join(self._output_tail)).replace(b"\r", b"\n")
        lines = [line.strip() for line in text.decode("utf-8", "replace").split("\n")]
        return [line[:STDERR_LINE_CHARS] for line in lines if line][-TAIL_LINES:]

    # -- pumps ---------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as pumps:
                pumps.start_soon(self.write_stdin)
                pumps.start_soon(self.watch_exit)
                pumps.start_soon(self._tick)
                await self.read_stdout()
                pumps.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(KillError):
                await self.process.aclose()

    async def read_stdout(self) -> None:
        """One frame a read of the terminal, then (at its end) the exit report."""
        stdout = self.process.stdout
        try:
            drained = False
            while True:
                data = await read_pipe(stdout, drained)
                if not data:
                    break
                drained = len(data) < _READ_SIZE
                self._keep_tail(data)
                output = {"output": data, "now": trio.current_time()}
                await self.post_output(AgentFrame(self.generation, Message(output)), self._inbox)
            with trio.move_on_after(STDOUT_EOF_GRACE_S):
                status = await self.process.wait()
                await self._inbox.send(self.gone(status))
                return
            # The terminal is gone but the agent runs on: nothing it draws can reach us.
            log.warning("agent %s lost its terminal but kept running: killing it", self.process.pid)
            with contextlib.suppress(KillError):
                await self.process.kill_tree(self._spec.kill_timeout_s)
            status = await self.process.wait()
            await self._inbox.send(self.gone(status))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the session is gone

    async def _tick(self) -> None:
        """Post a tick when the wake-up the machine asked for comes due."""
        try:
            while True:
                wake = self._wake_at
                if wake is None:
                    await self._clock.park()
                    continue
                with trio.move_on_at(wake) as timer:
                    await self._clock.park()  # asked again meanwhile: look again
                if not timer.cancelled_caught or self._wake_at != wake:
                    continue
                self._wake_at = None
                tick = {"tick": True, "now": trio.current_time()}
                await self.post_output(AgentFrame(self.generation, Message(tick)), self._inbox)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the session is gone

    def _keep_tail(self, data: bytes) -> None:
        self._output_tail.append(data[-TAIL_BYTES:])
        self._tail_bytes += min(len(data), TAIL_BYTES)
        while self._tail_bytes - len(self._output_tail[0]) >= TAIL_BYTES:
            self._tail_bytes -= len(self._output_tail.popleft())


LINK_TYPES["terminal"] = PtyLink
