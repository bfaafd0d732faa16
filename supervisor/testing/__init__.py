"""Test an application that embeds the supervisor, on trio's virtual clock, with no process.

```python
import trio.testing
from supervisor.testing import FakeAgent, open_test_supervisor, record

async def test_stop_button(autojump_clock: trio.testing.MockClock) -> None:
    claude = FakeAgent("claude", reply="word " * 100, on_cancel="ignore", grace_s=3)
    async with open_test_supervisor(agents={"claude": claude}) as sup:
        session = await sup.start_session("claude")
        async with record(session) as events:
            await session.prompt("refactor the parser")
            await events.wait_kind("message.delta")
            receipt = await session.cancel()     # or: press the app's own Stop button
        assert (receipt.outcome, receipt.elapsed_ms) == ("killed", 3000.0)
        assert claude.kills == 1 and claude.starts == 2
```

:class:`FakeAgent` is an in-memory agent that speaks one protocol's real wire (ACP, Codex,
Claude Code, OpenCode, Amp), scripted by keyword arguments; :func:`open_test_supervisor` gives
a real :class:`~supervisor.supervisor.Supervisor` whose sessions run those agents;
:func:`record` keeps a session's events for the test to wait on. Only the agent processes are
fake: their every delay is virtual, so outcomes and times are exact and the same on every run.
What is real and what is not, and how each protocol's fake speaks: ``docs/testing.md``.
Fixtures for pytest: ``supervisor.testing.pytest_plugin`` (this package needs no pytest).
"""

from __future__ import annotations

from supervisor.testing._fake import (
    DEFAULT_REPLY,
    DEFAULT_WORD_DELAY,
    FakeAgent,
    FakeProcess,
    open_test_supervisor,
)
from supervisor.testing._recorder import Recorder, record

__all__ = [
    "DEFAULT_REPLY",
    "DEFAULT_WORD_DELAY",
    "FakeAgent",
    "FakeProcess",
    "Recorder",
    "open_test_supervisor",
    "record",
]
