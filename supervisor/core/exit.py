"""How an agent process ended: an exit code or a fatal signal."""

from __future__ import annotations

import signal

from attrs import frozen

__all__ = ["ExitStatus"]


@frozen
class ExitStatus:
    """How the agent ended, as the shim mirrors it: an exit code or a fatal signal."""

    code: int | None
    signal: int | None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """Subprocess convention: negative means killed by that signal."""
        if returncode < 0:
            return cls(code=None, signal=-returncode)
        return cls(code=returncode, signal=None)

    @property
    def description(self) -> str:
        """For humans and logs: ``exit 0`` or ``killed by SIGKILL``."""
        if self.signal is None:
            return f"exit {self.code}"
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        return f"killed by {name}"
