"""agent-supervisor: run coding agents and stop any turn, instantly, certainly and honestly.

```python
from supervisor import open_supervisor, AgentSpec

async with open_supervisor() as sup:
    session = await sup.start_session(AgentSpec.from_config("demo"), cwd=path)
    async with session.subscribe() as events:
        turn = await session.prompt("refactor the parser")
        receipt = await session.cancel(reason="user")   # returns once the turn has ended
```

The names below are imported lazily, so ``python -m supervisor.demo_agent`` and the
containment shim start without loading the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.config import AgentSpec, ConfigError, load_agents
    from supervisor.errors import (
        AgentNotRunning,
        AtCapacity,
        BadRequest,
        SessionNotFound,
        SupervisorError,
    )
    from supervisor.pausing import PauseStatus
    from supervisor.receipt import CancelReceipt, DroppedPrompt
    from supervisor.runtime.handle import SessionHandle
    from supervisor.runtime.session import Session, SessionSummary, Subscription, TurnHandle
    from supervisor.steering import SteerResult
    from supervisor.supervisor import Supervisor, open_supervisor

_EXPORTS = {
    "AgentSpec": "supervisor.config",
    "ConfigError": "supervisor.config",
    "load_agents": "supervisor.config",
    "AgentNotRunning": "supervisor.errors",
    "AtCapacity": "supervisor.errors",
    "BadRequest": "supervisor.errors",
    "SessionNotFound": "supervisor.errors",
    "SupervisorError": "supervisor.errors",
    "CancelReceipt": "supervisor.receipt",
    "DroppedPrompt": "supervisor.receipt",
    "PauseStatus": "supervisor.pausing",
    "Session": "supervisor.runtime.session",
    "SessionHandle": "supervisor.runtime.handle",
    "SteerResult": "supervisor.steering",
    "SessionSummary": "supervisor.runtime.session",
    "Subscription": "supervisor.runtime.session",
    "TurnHandle": "supervisor.runtime.session",
    "Supervisor": "supervisor.supervisor",
    "open_supervisor": "supervisor.supervisor",
}

__all__ = [
    "AgentNotRunning",
    "AgentSpec",
    "AtCapacity",
    "BadRequest",
    "CancelReceipt",
    "ConfigError",
    "DroppedPrompt",
    "PauseStatus",
    "Session",
    "SessionHandle",
    "SessionNotFound",
    "SessionSummary",
    "SteerResult",
    "Subscription",
    "Supervisor",
    "SupervisorError",
    "TurnHandle",
    "load_agents",
    "open_supervisor",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
