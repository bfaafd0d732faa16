"""What the OpenCode tests check of a server the supervisor started: its password (in its
environment, asked on every route, shown nowhere), where it listens, what it said on stderr.
Shared by the scripted fake's tests (``tests/process/``) and the real CLI's (``tests/real/``).
"""

from __future__ import annotations

import httpx
import psutil

from helpers import Recorder
from protocols import events as ev
from protocols.opencode import SERVER_USERNAME


def stderr_lines(rec: Recorder) -> list[str]:
    return [e.line for e in rec.of_kind("agent.stderr") if isinstance(e, ev.AgentStderr)]


def server_password(tree: list[psutil.Process]) -> str:
    """The password the supervisor gave the server: in the environment of its processes (the
    shim and the server, the bridge too), one value."""
    found: set[str] = set()
    for process in tree:
        try:
            value = process.environ().get("OPENCODE_SERVER_PASSWORD")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if value:
            found.add(value)
    assert len(found) == 1, f"expected one server password, found {len(found)}"
    [password] = found
    return password


def listening_url(rec: Recorder) -> str:
    """Where the server listens, from its ``listening on`` line (shown like a stderr line)."""
    [line] = [line for line in stderr_lines(rec) if "server listening on http://" in line]
    return line.split("listening on ")[1].strip()


async def assert_refused_without_the_password(url: str, password: str) -> None:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=10.0) as client:
        bare = await client.get("/session")
        assert bare.status_code == 401, bare
        assert bare.headers["www-authenticate"].startswith("Basic")
        wrong = await client.get("/event", auth=(SERVER_USERNAME, password + "x"))
        assert wrong.status_code == 401, wrong
        right = await client.get("/session/ses_nosuchsession", auth=(SERVER_USERNAME, password))
        assert right.status_code == 404, right  # past the password: a session it does not have


def assert_secret_nowhere(secret: str, rec: Recorder, *texts: str) -> None:
    for event in rec.events:
        assert secret not in repr(event), event
    for text in texts:
        assert secret not in text
