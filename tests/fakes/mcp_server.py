"""A tiny stdio MCP server for the tests: proves an agent really started it and called it.

``python tests/fakes/mcp_server.py MARKER``: newline-delimited JSON-RPC 2.0 on stdin/stdout
(the MCP stdio transport). On ``initialize`` it appends one JSON line to ``MARKER`` (its pid,
the client's ``clientInfo``, the protocol version asked for, and ``FAKE_MCP_WORD`` from its
environment: the env the agent was told to give it); on ``tools/call`` of its one tool,
``marker_ping``, it appends another line and answers ``pong <FAKE_MCP_WORD>``. Standard library
only, so any agent can start it with the tests' interpreter; exits on stdin EOF.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SERVER_INFO = {"name": "fake-mcp", "version": "1.0"}
TOOL = {
    "name": "marker_ping",
    "description": "Answers pong; the tests call it to prove the agent reached this server.",
    "inputSchema": {"type": "object", "properties": {}},
}


def _mark(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as marker:
        marker.write(json.dumps(entry) + "\n")


def _answer(message: dict[str, Any], marker: str) -> dict[str, Any] | None:
    method = message.get("method")
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    word = os.environ.get("FAKE_MCP_WORD", "")
    if "id" not in message:
        return None  # notifications (notifications/initialized, cancelled) need no answer
    if method == "initialize":
        _mark(
            marker,
            {
                "event": "initialize",
                "pid": os.getpid(),
                "client": params.get("clientInfo"),
                "protocol": params.get("protocolVersion"),
                "word": word,
            },
        )
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion") or "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": SERVER_INFO,
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call" and params.get("name") == TOOL["name"]:
        _mark(marker, {"event": "call", "pid": os.getpid(), "word": word})
        result = {"content": [{"type": "text", "text": f"pong {word}".strip()}]}
    elif method == "ping":
        result = {}
    else:
        return {
            "jsonrpc": "2.0",
            "id": message["id"],
            "error": {"code": -32601, "message": f"Method not found: {method}"},
        }
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main() -> int:
    marker = sys.argv[1]
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        answer = _answer(message, marker)
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
