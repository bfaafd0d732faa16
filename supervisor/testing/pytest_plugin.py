"""pytest fixtures for the testing kit; opt in with ``pytest_plugins`` in a test module or the
root ``conftest.py``:

```python
pytest_plugins = ["supervisor.testing.pytest_plugin"]

@pytest.fixture
def fake_agents() -> dict[str, FakeAgent]:
    return {"claude": FakeAgent("claude", on_cancel="ignore", grace_s=3)}

async def test_stop(autojump_clock: MockClock, test_supervisor: Supervisor) -> None:
    session = await test_supervisor.start_session("claude")
    ...
```

They run on pytest-trio (``trio_mode``, or ``@pytest.mark.trio``). Its ``autojump_clock``
fixture gives the virtual clock, to the test that asks for it by name (pytest-trio runs a test
on a clock among the test's own arguments only): ``test_supervisor`` raises without it. This
module is the only part of the kit that imports pytest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from supervisor.supervisor import Supervisor
from supervisor.testing._fake import FakeAgent, open_test_supervisor

__all__ = ["fake_agents", "test_supervisor"]


@pytest.fixture
def fake_agents() -> dict[str, FakeAgent]:
    """The agents ``test_supervisor`` runs, by name: one ACP agent, ``"fake"``, as
    ``FakeAgent()`` makes it. Override the fixture to give your own."""
    return {"fake": FakeAgent()}


@pytest.fixture
async def test_supervisor(fake_agents: dict[str, FakeAgent]) -> AsyncIterator[Supervisor]:
    """``open_test_supervisor(agents=fake_agents)`` for the length of the test (which asks for
    ``autojump_clock`` too)."""
    async with open_test_supervisor(fake_agents) as supervisor:
        yield supervisor
