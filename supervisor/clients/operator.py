"""``agent-supervisor pause`` and ``resume``: an operator's actions on a running gateway.

They connect as any client does (``supervisor.client``): the gateway's URL, and its token from
that URL (``?token=``, as ``serve`` prints it), ``--token-file`` or ``$AGENT_SUPERVISOR_TOKEN``.
Each sends one request (``gateway.pause``, ``gateway.resume``), prints what it answered, and
exits 0; anything that keeps it from the answer is one line on stderr and exit 1 (2: the
command line itself).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Final, TextIO
from urllib.parse import parse_qs, urlsplit

from supervisor.client import CONNECT_ERRORS, GatewayError, connect, not_connected

__all__ = [
    "DEFAULT_URL",
    "URL_VARIABLE",
    "OperatorError",
    "default_url",
    "describe",
    "run_operator",
    "token_for",
]

#: Where ``serve`` listens unless told otherwise.
DEFAULT_URL: Final = "http://127.0.0.1:8765/"
#: The gateway's URL when ``--url`` is not given.
URL_VARIABLE: Final = "AGENT_SUPERVISOR_URL"
#: The token when neither the URL nor ``--token-file`` has one (``serve`` reads it too).
TOKEN_VARIABLE: Final = "AGENT_SUPERVISOR_TOKEN"


class OperatorError(Exception):
    """Why the command got no answer (its message is the line it prints)."""


def token_for(url: str, token_file_token: str | None, env: Mapping[str, str]) -> str:
    """The token to show: ``--token-file``'s, else the URL's, else ``$AGENT_SUPERVISOR_TOKEN``;
    :class:`OperatorError` when there is none."""
    if token_file_token is not None:
        return token_file_token
    from_url = parse_qs(urlsplit(url).query).get("token")
    if from_url:
        return from_url[0]
    from_env = env.get(TOKEN_VARIABLE)
    if from_env:
        return from_env
    raise OperatorError(
        f"no token for {_where(url)}: give --url with the URL `agent-supervisor serve` printed"
        f" (it ends in ?token=...), --token-file PATH, or ${TOKEN_VARIABLE}"
    )


async def run_operator(
    action: str,
    url: str,
    token: str,
    out: TextIO,
    *,
    deadline_s: float | None = None,
    as_json: bool = False,
) -> None:
    """``action`` (``pause`` or ``resume``) on the gateway at ``url``; what it answered is
    written to ``out``. Raises :class:`OperatorError` with the line to print."""
    where = _where(url)
    try:
        async with connect(url, token=token) as client:
            if action == "pause":
                answer = await client.pause(deadline_s)
            else:
                answer = await client.resume()
    except CONNECT_ERRORS as exc:
        raise OperatorError(not_connected(url, exc)) from None
    except GatewayError as exc:
        if exc.code == "unknown_action":
            raise OperatorError(
                f"the gateway at {where} has no gateway.{action}: it runs an older agent-supervisor"
            ) from None
        raise OperatorError(f"the gateway at {where} refused: {exc}") from None
    out.write(json.dumps(answer) + "\n" if as_json else describe(action, answer))
    out.flush()


def _duration(seconds: float) -> str:
    """What is left of a deadline, as a person reads it: the answer says how much was left as
    it was made (29.996 s of a 30 s deadline), not the deadline asked for."""
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}"


def describe(action: str, answer: dict[str, Any]) -> str:
    """The answer as a person reads it, a line each."""
    held, running, pending = answer["held"], answer["running"], answer["pending"]
    lines = []
    if action == "pause":
        lines.append(f"paused: no new turn starts ({_sessions(held)} hold their prompts)")
        if running:
            deadline = answer.get("deadline_s")
            fate = (
                f"cancelled (reason paused) in {_duration(deadline)} s if still running"
                if deadline is not None
                else "they finish by themselves"
            )
            lines.append(f"still running: {', '.join(running)}: {fate}")
        else:
            lines.append("no turn is running")
    else:
        lines.append("resumed: held prompts start, in order, in every session")
        if running:
            lines.append(f"running now: {', '.join(running)}")
    if pending:
        lines.append(
            f"not told yet (their host's link is down; told first thing once it is back):"
            f" {', '.join(pending)}"
        )
    return "".join(line + "\n" for line in lines)


def _sessions(ids: list[str]) -> str:
    if not ids:
        return "no session yet: those started now"
    return f"{len(ids)} session{'s' if len(ids) != 1 else ''} ({', '.join(ids)})"


def _where(url: str) -> str:
    """The gateway's address, never its token."""
    return urlsplit(url).netloc or url


def default_url() -> str:
    return os.environ.get(URL_VARIABLE) or DEFAULT_URL
