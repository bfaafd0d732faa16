"""An in-memory ``opencode serve`` for tests on virtual time.

The sibling of ``_acp.AcpAgent``: it plugs into the session through the same ``_memory.py``
machinery (a kill is a cancel scope, every delay is virtual), but speaks what the HTTP link
delivers for OpenCode (``supervisor/agents/http_link.py``): it receives request envelopes
``{"http": {...}}`` and posts ``{"transport": "ready"}``, ``{"http_response": ...}`` and
``{"sse": event}``, in the shapes the real server 1.18.33 produced (``tests/golden/opencode``):
``prompt_async`` answered 204 at once and ``session.status busy`` when the turn runs; an abort
answered ``200 true`` whatever happens, an idle session's abort emitting an idle pair, a running
turn's abort emitting ``session.error`` MessageAbortedError, an idle pair, the late part and
message updates, and a second idle pair; ``GET /session/{id}`` 404 for a session it does not
have; ``GET /session/status`` (``{}``, or the running turn's session ``busy``); a permission
``reject`` ending the turn (``finish: "tool-calls"``); a reply to a request that is gone
answered 404. A permission is a ``bash`` ``permission.asked``; a tool call a ``bash`` tool part,
``running`` then ``completed``; a failed turn (``fail_turn``) the model's ``APIError``, as
``session.error`` and on the assistant message, before the idle pair. A server that cannot
``resume`` has lost its sessions (``GET /session/{id}`` is 404). OpenCode has no way to steer a
running turn.

Prompt tokens beyond the shared ones (``_memory.Behaviour``): ``wedged`` (the abort is answered
``true`` but the stream never goes idle, edge case 25), ``busy-delay=S`` (prompt accepted →
busy), ``second-idle=S`` (the abort's second idle pair this late), ``duplicate-idles`` (a natural
end emits two idle pairs), ``abort-first`` (an abort drops the turn's pending permission
requests at once, before a reply sent with it is read: that reply is answered 404, the order the
real server can take), ``fail-late`` (the prompt fails inside the server: ``busy``, the idle
pair, then ``session.error`` ``UnknownError`` and no reply, the order of the real server's
``prompt_async``; the status says busy until the error is out, as the real server publishes it
before it could serve our question).
"""

from __future__ import annotations

import math
from typing import Any

import trio
from attrs import define, field

from supervisor.config import AgentSpec
from supervisor.testing._memory import (
    TOOL_CALL_ID,
    TOOL_COMMAND,
    Behaviour,
    MemoryAgent,
    MemoryLauncher,
    MemoryLink,
    never,
    on,
)

ABORTED = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
#: What ``fail_turn`` fails with: the model provider's error, as the loop reports it.
MODEL_ERROR = {
    "name": "APIError",
    "data": {"message": "Overloaded", "statusCode": 529, "isRetryable": False},
}
FAILED = {
    "name": "UnknownError",
    "data": {"message": "Error: All fibers interrupted without error"},
}


@define
class OpenCodeBehaviour(Behaviour):
    busy_delay: float = 0.0
    second_idle: float = 0.0
    duplicate_idles: bool = False
    abort_first: bool = False
    fail_late: bool = False

    TOKENS = {
        **Behaviour.TOKENS,
        "wedged": ("stop_delay", never),  # the abort is acknowledged and ignored
        "busy-delay": ("busy_delay", float),
        "second-idle": ("second_idle", float),
        "duplicate-idles": ("duplicate_idles", on),
        "abort-first": ("abort_first", on),
        "fail-late": ("fail_late", on),
    }


@define
class _Running:
    number: int
    session: str
    behaviour: OpenCodeBehaviour
    scope: trio.CancelScope = field(factory=trio.CancelScope)
    aborted: bool = False


@define
class Request:
    at: float
    generation: int
    method: str
    path: str
    json: Any


class OpenCodeLauncher(MemoryLauncher[OpenCodeBehaviour, "OpenCodeServer"]):
    """A ``Launcher`` that starts :class:`OpenCodeServer` tasks; records what happened.

    Its ``violations``: rules the client broke (a request before the event stream was open,
    the blocking ``/message`` route).
    """

    behaviour_type = OpenCodeBehaviour

    def __init__(self, behaviour: OpenCodeBehaviour | None = None, **kwargs: Any) -> None:
        super().__init__(behaviour, **kwargs)
        self.requests: list[Request] = []
        #: permission request ids whose reply was answered 404 (gone)
        self.replies_gone: list[str] = []

    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> OpenCodeServer:
        return OpenCodeServer(link, self)

    @property
    def servers(self) -> list[OpenCodeServer]:
        return self.agents

    def sent(self, path_end: str, generation: int | None = None) -> list[Request]:
        """Our requests whose path ends with ``path_end``, to every server or to one."""
        return [
            r
            for r in self.requests
            if r.path.endswith(path_end) and (generation is None or r.generation == generation)
        ]


class OpenCodeServer(MemoryAgent[OpenCodeBehaviour]):
    def __init__(self, link: MemoryLink, launcher: OpenCodeLauncher):
        super().__init__(link, launcher)
        self.requests = launcher.requests
        self.replies_gone = launcher.replies_gone
        self.ready = False
        self.active: _Running | None = None
        self.pending: dict[str, trio.MemorySendChannel[str]] = {}
        self.counter = 0

    async def boot(self) -> bool:
        if not await super().boot():
            return False
        await self.link.post({"transport": "ready", "url": "http://memory.invalid"})
        self.ready = True
        await self.event("server.connected", {})
        return True

    # -- plumbing ----------------------------------------------------------------------------

    async def event(self, kind: str, properties: dict[str, Any]) -> None:
        self.counter += 1
        await self.link.post(
            {"sse": {"id": f"evt_{self.counter}", "type": kind, "properties": properties}}
        )

    async def status(self, session: str, kind: str) -> None:
        await self.event("session.status", {"sessionID": session, "status": {"type": kind}})

    async def idle_pair(self, session: str) -> None:
        await self.status(session, "idle")
        await self.event("session.idle", {"sessionID": session})

    async def respond(self, request_id: Any, status: int, body: Any = None) -> None:
        await self.link.post({"http_response": {"id": request_id, "status": status, "json": body}})

    def new_id(self, prefix: str) -> str:
        self.store.counter += 1
        return f"{prefix}_{self.store.counter}"

    # -- routes ------------------------------------------------------------------------------

    async def handle(self, envelope: dict[str, Any], nursery: trio.Nursery) -> None:
        request = envelope.get("http")
        if not isinstance(request, dict):
            self.launcher.violations.append(f"not a request envelope: {envelope}")
            return
        method, path, body = request.get("method"), str(request.get("path")), request.get("json")
        request_id = request.get("id")
        self.requests.append(
            Request(trio.current_time(), self.link.generation, str(method), path, body)
        )
        parts = path.strip("/").split("/")
        if path.endswith("/message"):
            self.launcher.violations.append(f"the blocking route: {path}")
        if method == "POST" and parts == ["session"]:
            session = self.new_id("ses")
            self.store.sessions[session] = []
            await self.respond(request_id, 200, {"id": session, "title": "New session"})
            await self.event("session.created", {"sessionID": session, "info": {"id": session}})
        elif method == "GET" and parts == ["session", "status"]:
            running = self.active
            await self.respond(
                request_id, 200, {running.session: {"type": "busy"}} if running else {}
            )
        elif method == "GET" and len(parts) == 2 and parts[0] == "session":
            if not self.behaviour.resumes or parts[1] not in self.store.sessions:
                message = f"Session not found: {parts[1]}"
                await self.respond(
                    request_id, 404, {"name": "NotFoundError", "data": {"message": message}}
                )
            else:
                await self.respond(request_id, 200, {"id": parts[1]})
        elif method == "POST" and len(parts) == 3 and parts[2] == "prompt_async":
            text = "".join(p.get("text", "") for p in (body or {}).get("parts", []))
            self.turns.append(text)
            self.store.sessions.setdefault(parts[1], []).append(text)
            await self.respond(request_id, 204)
            nursery.start_soon(self.turn, parts[1], text, self.behaviour.for_prompt(text))
        elif method == "POST" and len(parts) == 3 and parts[2] == "abort":
            if self.active is not None and self.active.behaviour.abort_first:
                self.pending.clear()  # the turn waits on its channel until the abort lands
            nursery.start_soon(self.abort, request_id, parts[1])
        elif method == "POST" and len(parts) == 3 and parts[0] == "permission":
            answer = self.pending.pop(parts[1], None)
            if answer is None:
                self.replies_gone.append(parts[1])
                message = f"Permission request not found: {parts[1]}"
                await self.respond(
                    request_id, 404, {"_tag": "PermissionNotFoundError", "message": message}
                )
                return
            await self.respond(request_id, 200, True)
            answer.send_nowait(str((body or {}).get("reply")))
        else:
            await self.respond(
                request_id, 404, {"name": "NotFoundError", "data": {"message": path}}
            )

    async def abort(self, request_id: Any, session: str) -> None:
        running = self.active
        await self.respond(request_id, 200, True)  # whatever happens (edge case 24)
        if running is None:
            await self.idle_pair(session)  # an idle session's abort: a leftover pair
            return
        if running.behaviour.crash_on_cancel:
            await self.crash()
            return
        if running.behaviour.stop_delay is None:
            return  # wedged: acknowledged, and the stream never goes idle (edge case 25)
        await trio.sleep(running.behaviour.stop_delay)
        running.aborted = True
        running.scope.cancel()

    # -- a turn ------------------------------------------------------------------------------

    async def turn(self, session: str, text: str, behaviour: OpenCodeBehaviour) -> None:
        user, assistant, part = self.new_id("msg"), self.new_id("msg"), self.new_id("prt")
        await self.event(
            "message.updated",
            {"sessionID": session, "info": {"id": user, "role": "user", "sessionID": session}},
        )
        await self.event(
            "message.part.updated",
            {
                "sessionID": session,
                "part": {
                    "id": self.new_id("prt"),
                    "messageID": user,
                    "sessionID": session,
                    "type": "text",
                    "text": text,
                },
            },
        )
        await trio.sleep(behaviour.busy_delay)
        running = _Running(len(self.turns), session, behaviour)
        self.active = running
        await self.status(session, "busy")
        if behaviour.fail_late:
            await self.idle_pair(session)
            await self.event("session.error", {"sessionID": session, "error": FAILED})
            self.active = None
            return
        info = {
            "id": assistant,
            "parentID": user,
            "role": "assistant",
            "sessionID": session,
            "time": {"created": 1},
        }
        await self.event("message.updated", {"sessionID": session, "info": info})
        await self.event(
            "message.part.updated",
            {
                "sessionID": session,
                "part": {
                    "id": part,
                    "messageID": assistant,
                    "sessionID": session,
                    "type": "text",
                    "text": "",
                },
            },
        )
        said = ""
        rejected = False
        with running.scope:

            async def say(word: str) -> None:
                nonlocal said
                said += word
                await self.event(
                    "message.part.delta",
                    {
                        "sessionID": session,
                        "messageID": assistant,
                        "partID": part,
                        "field": "text",
                        "delta": word,
                    },
                )

            async def ask() -> bool:
                return await self.ask_permission(session, assistant) != "reject"

            async def tool(seconds: float) -> None:
                await self.run_tool(session, assistant, seconds)

            rejected = not await self.speak(behaviour, say, ask=ask, tool=tool)
        self.active = None
        final = {
            "id": part,
            "messageID": assistant,
            "sessionID": session,
            "type": "text",
            "text": said,
        }
        if running.aborted:
            # The order the real server used: error, idle pair, late updates, second pair.
            await self.event("session.error", {"sessionID": session, "error": ABORTED})
            await self.idle_pair(session)
            await self.event("message.part.updated", {"sessionID": session, "part": final})
            done = {**info, "time": {"created": 1, "completed": 2}, "error": ABORTED}
            await self.event("message.updated", {"sessionID": session, "info": done})
            await trio.sleep(behaviour.second_idle)
            await self.idle_pair(session)
            return
        finish = "tool-calls" if rejected else "stop"
        await self.event("message.part.updated", {"sessionID": session, "part": final})
        done = {**info, "time": {"created": 1, "completed": 2}, "finish": finish}
        if behaviour.fail_turn and not rejected:
            # The model's error, as the loop reports one: on the stream and on the message.
            await self.event("session.error", {"sessionID": session, "error": MODEL_ERROR})
            done = {**info, "time": {"created": 1, "completed": 2}, "error": MODEL_ERROR}
        await self.event("message.updated", {"sessionID": session, "info": done})
        await self.idle_pair(session)
        if behaviour.duplicate_idles:
            await self.idle_pair(session)

    async def run_tool(self, session: str, message: str, seconds: float) -> None:
        tool = {
            "id": self.new_id("prt"),
            "messageID": message,
            "sessionID": session,
            "type": "tool",
            "tool": "bash",
            "callID": TOOL_CALL_ID,
        }
        for status in ("running", "completed"):
            state = {"status": status, "input": {"command": TOOL_COMMAND}}
            await self.event(
                "message.part.updated", {"sessionID": session, "part": {**tool, "state": state}}
            )
            if status == "running":
                await trio.sleep(seconds)

    async def ask_permission(self, session: str, message: str) -> str:
        request, call = self.new_id("per"), self.new_id("call")
        send, receive = trio.open_memory_channel[str](math.inf)
        self.pending[request] = send
        command = "rm -rf build"
        tool = {
            "id": self.new_id("prt"),
            "messageID": message,
            "sessionID": session,
            "type": "tool",
            "tool": "bash",
            "callID": call,
        }
        await self.event(
            "message.part.updated",
            {
                "sessionID": session,
                "part": {**tool, "state": {"status": "running", "input": {"command": command}}},
            },
        )
        await self.event(
            "permission.asked",
            {
                "id": request,
                "sessionID": session,
                "permission": "bash",
                "patterns": [command],
                "metadata": {"command": command},
                "always": ["rm *"],
                "tool": {"messageID": message, "callID": call},
            },
        )
        try:
            reply = await receive.receive()
        finally:
            # An abort leaves the request orphaned on the server; we drop it here.
            self.pending.pop(request, None)
        await self.event(
            "permission.replied", {"sessionID": session, "requestID": request, "reply": reply}
        )
        status = "error" if reply == "reject" else "completed"
        await self.event(
            "message.part.updated",
            {
                "sessionID": session,
                "part": {**tool, "state": {"status": status, "input": {"command": command}}},
            },
        )
        return reply
