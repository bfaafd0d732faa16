"""An in-memory ``codex app-server`` for tests on virtual time.

The sibling of ``_acp.AcpAgent``: it plugs into the session through the same ``_memory.py``
machinery (a kill is a cancel scope, every delay is virtual), but speaks the Codex app-server
protocol as ``shared/protocols.md`` section 2 describes it: no ``"jsonrpc"`` member, server
request ids from 0 (colliding with the client's), the ``turn/start`` reply naming the turn
before ``turn/started``, ``turn/interrupt`` answered ``{}`` only when the turn aborts and
rejected at once for a stale id or before the turn runs, approvals retracted with
``serverRequest/resolved`` at the turn's end. A permission is a ``commandExecution`` approval
request; a tool call a ``commandExecution`` item, started and completed; ``turn/steer`` joins
the running turn (the text said back as ``steered:<text>``), or with ``steer_answer`` ``refuse``
is answered -32601, as by a server without it; a thread it cannot ``resume`` is answered "no
rollout found".

Prompt tokens beyond the shared ones (``_memory.Behaviour``): ``wedged`` (ignore
``turn/interrupt``: never answered, never stops), ``reply-delay=S`` (the turn/start reply this
late), ``started-delay=S`` (turn/started this long after the reply), ``stale`` (the reply names
a phantom turn; another id runs), ``approval`` (``permission``). ``fail-turn``: once its words
are out the turn fails: an ``error`` notification that will not be retried, then
``turn/completed`` ``failed`` with the same error, the real server's order.

Sub-agents and goals (shapes from the 0.171.0 schema): ``children=N`` makes the turn spawn N
child threads as the multi-agent tool does (a ``collabAgentToolCall`` ``spawnAgent`` item on our
thread, the child's ``thread/started`` naming ``parentThreadId``), each running its own turn
(``turn/started``/deltas/``turn/completed`` on the child thread) for as many words as the root.
A child's ``turn/interrupt`` works like the root's, after ``child-stop-delay=S``;
``child-wedged`` children never answer it, ``child-refuse`` children reject it with an error.
``goal`` gives the thread an active goal when the turn starts (``thread/goal/updated``), as the
model's ``create_goal`` does. When a turn *completes* while the goal is active the server starts
the next goal turn by itself ``GOAL_TURN_DELAY_S`` later (as Codex 0.171 does; an interrupted
turn is followed by none): ``turn/started`` with a new id, the same words, ``turn/completed``;
``goal_turns`` counts them. During goal turn ``goal-turns=N`` (default 2; 0: the person's own
turn) the model marks the goal ``complete`` (``thread/goal/updated``) before the turn ends, or
just after its ``turn/completed`` with ``goal-late``; ``goal-turns=-1``: never.
``thread/goal/set|get|clear`` work on that goal (a pause does not stop a running goal turn, the
goal turn ends as it would; ``clear`` sends ``thread/goal/cleared``).
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

#: How long after a turn completes with the goal active Codex starts the next goal turn
#: (measured ~10 ms on 0.171.0, ``tests/real/test_real_codex_children.py``).
GOAL_TURN_DELAY_S = 0.01
#: What ``fail-turn`` fails with: the real server's words for an HTTP 500 from the model.
FAILURE = {
    "message": "We're currently experiencing high demand, which may cause temporary errors.",
    "codexErrorInfo": "internalServerError",
    "additionalDetails": None,
}


@define
class CodexBehaviour(Behaviour):
    reply_delay: float = 0.0
    started_delay: float = 0.0
    stale: bool = False
    steer_answer: str = "injected"  # or "refuse": turn/steer is answered -32601
    clean_delay: float = 0.0
    children: int = 0
    child_stop_delay: float | None = 0.0  # None: a child ignores turn/interrupt
    child_refuse: bool = False
    goal: bool = False
    goal_turns: int = 2  # the goal turn in which the goal completes (0: the person's turn)
    goal_late: bool = False  # the goal's "complete" comes after that turn's turn/completed

    TOKENS = {
        **Behaviour.TOKENS,
        "wedged": ("stop_delay", never),  # turn/interrupt neither answered nor obeyed
        "reply-delay": ("reply_delay", float),
        "started-delay": ("started_delay", float),
        "stale": ("stale", on),
        "approval": ("permission", on),
        "goal": ("goal", on),
        "goal-turns": ("goal_turns", int),
        "goal-late": ("goal_late", on),
        "children": ("children", int),
        "child-stop-delay": ("child_stop_delay", float),
        "child-wedged": ("child_stop_delay", never),
        "child-refuse": ("child_refuse", on),
    }


@define
class _RunningTurn:
    real_id: str
    behaviour: CodexBehaviour
    scope: trio.CancelScope = field(factory=trio.CancelScope)
    interrupts: list[Any] = field(factory=list)  # turn/interrupt ids answered {} at the end
    requests: list[int] = field(factory=list)  # server requests retracted at the end
    decided_cancel: bool = False


class CodexLauncher(MemoryLauncher[CodexBehaviour, "CodexServer"]):
    """A ``Launcher`` that starts :class:`CodexServer` tasks; records what happened."""

    behaviour_type = CodexBehaviour

    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> CodexServer:
        return CodexServer(link, self)

    @property
    def servers(self) -> list[CodexServer]:
        return self.agents

    def sent(self, method: str, generation: int | None = None) -> list[dict[str, Any]]:
        """Our messages with ``method``, to every server or to one generation."""
        return [
            m
            for kind, gen, m in self.log
            if kind == "to_agent"
            and m.get("method") == method
            and (generation is None or gen == generation)
        ]


class CodexServer(MemoryAgent[CodexBehaviour]):
    def __init__(self, link: MemoryLink, launcher: CodexLauncher):
        super().__init__(link, launcher)
        self.initialized = False
        self.experimental = False
        self.thread_id: str | None = None
        self.active: _RunningTurn | None = None  # the turn Codex considers running
        self.next_request = 0
        self.answers: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.cleaned = 0
        self.children: list[str] = []  # child thread ids, in spawn order
        self.child_active: dict[str, _RunningTurn] = {}
        self.goal: dict[str, Any] | None = None
        self.goal_behaviour = CodexBehaviour()  # of the turn that created the goal
        self.goal_turns = 0  # turns the server started by itself for an active goal

    async def reply(self, request_id: Any, result: Any) -> None:
        await self.link.post({"id": request_id, "result": result})

    async def error(self, request_id: Any, code: int, message: str) -> None:
        await self.link.post({"id": request_id, "error": {"code": code, "message": message}})

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.link.post({"method": method, "params": params})

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        if "jsonrpc" in message:
            self.launcher.violations.append(f"jsonrpc member in {message}")
        method = message.get("method")
        params = message.get("params") or {}
        request_id = message.get("id")
        if method is None:  # the client answers one of our requests
            answer = self.answers.pop(request_id, None)
            if answer is not None:
                answer.send_nowait(message)
            return  # after a turn transition a late answer is simply dropped
        if method == "initialize":
            self.experimental = bool(params.get("capabilities", {}).get("experimentalApi"))
            await self.reply(
                request_id,
                {
                    "userAgent": "fake/0",
                    "codexHome": "/h",
                    "platformFamily": "unix",
                    "platformOs": "linux",
                },
            )
        elif method == "initialized":
            self.initialized = True
        elif not self.initialized:
            self.launcher.violations.append(f"{method} before initialized")
            await self.error(request_id, -32600, "Not initialized")
        elif method == "thread/start":
            self.store.counter += 1
            self.thread_id = f"thr_{self.store.counter}"
            self.store.sessions[self.thread_id] = []
            await self.reply(
                request_id, {"thread": {"id": self.thread_id}, "cwd": params.get("cwd")}
            )
            await self.notify("thread/started", {"thread": {"id": self.thread_id}})
        elif method == "thread/resume":
            thread_id = params.get("threadId")
            if not self.behaviour.resumes or thread_id not in self.store.sessions:
                await self.error(request_id, -32600, f"no rollout found for thread id {thread_id}")
                return
            self.thread_id = thread_id
            await self.reply(request_id, {"thread": {"id": thread_id}})
        elif method == "turn/start":
            text = "".join(part.get("text", "") for part in params.get("input", []))
            self.turns.append(text)
            assert self.thread_id is not None and params.get("threadId") == self.thread_id
            self.store.sessions[self.thread_id].append(text)
            nursery.start_soon(self.turn, request_id, self.behaviour.for_prompt(text))
        elif method == "turn/steer":
            # As turn_steer_inner: the expected turn must be the active one; the input joins it.
            active = self.active
            expected = params.get("expectedTurnId")
            if self.behaviour.steer_answer == "refuse":
                await self.error(request_id, -32601, f"Method not found: {method}")
            elif active is None:
                await self.error(request_id, -32600, "no active turn to steer")
            elif expected != active.real_id:
                await self.error(
                    request_id,
                    -32600,
                    f"expected active turn id `{expected}` but found `{active.real_id}`",
                )
            else:
                text = "".join(part.get("text", "") for part in params.get("input", []))
                self.steers.append(text)
                await self.reply(request_id, {"turnId": active.real_id})
                await self.notify(
                    "item/agentMessage/delta",
                    {
                        "threadId": self.thread_id,
                        "turnId": active.real_id,
                        "itemId": "msg_1",
                        "delta": f"steered:{text} ",
                    },
                )
        elif method == "turn/interrupt":
            thread_id = params.get("threadId")
            if thread_id in self.children:
                await self.interrupt_child(request_id, thread_id, params.get("turnId"), nursery)
            else:
                await self.interrupt(request_id, params.get("turnId"), nursery)
        elif method == "thread/goal/set":
            if self.goal is None:
                await self.error(request_id, -32600, "cannot update goal: no goal")
                return
            for key in ("status", "objective"):
                if params.get(key) is not None:
                    self.goal[key] = params[key]
            await self.reply(request_id, {"goal": dict(self.goal)})
            await self.notify(
                "thread/goal/updated",
                {"threadId": self.thread_id, "turnId": None, "goal": dict(self.goal)},
            )
        elif method == "thread/goal/get":
            await self.reply(request_id, {"goal": None if self.goal is None else dict(self.goal)})
        elif method == "thread/goal/clear":
            cleared, self.goal = self.goal is not None, None
            await self.reply(request_id, {"cleared": cleared})
            if cleared:
                await self.notify("thread/goal/cleared", {"threadId": self.thread_id})
        elif method == "thread/backgroundTerminals/clean":
            if not self.experimental:
                await self.error(
                    request_id, -32600, f"{method} requires experimentalApi capability"
                )
                return
            await trio.sleep(self.behaviour.clean_delay)
            self.cleaned += 1
            await self.reply(request_id, {})
        elif request_id is not None:
            await self.error(request_id, -32601, f"Method not found: {method}")

    async def interrupt(self, request_id: Any, turn_id: Any, nursery: trio.Nursery) -> None:
        active = self.active
        if active is None:
            await self.error(request_id, -32600, "no active turn to interrupt")
        elif turn_id != active.real_id:
            await self.error(
                request_id, -32600, f"expected active turn id {turn_id} but found {active.real_id}"
            )
        elif active.behaviour.crash_on_cancel:
            await self.crash()
        elif active.behaviour.stop_delay is None:
            pass  # wedged: queued forever, like openai/codex#36926
        else:
            active.interrupts.append(request_id)
            nursery.start_soon(self._stop_after, active, active.behaviour.stop_delay)

    async def interrupt_child(
        self, request_id: Any, thread_id: str, turn_id: Any, nursery: trio.Nursery
    ) -> None:
        active = self.child_active.get(thread_id)
        if active is None:
            await self.error(request_id, -32600, "no active turn to interrupt")
        elif turn_id != active.real_id:
            await self.error(
                request_id, -32600, f"expected active turn id {turn_id} but found {active.real_id}"
            )
        elif active.behaviour.child_refuse:
            await self.error(request_id, -32600, "thread runtime is no longer accepting interrupts")
        elif active.behaviour.child_stop_delay is None:
            pass  # wedged: queued forever
        else:
            active.interrupts.append(request_id)
            nursery.start_soon(self._stop_after, active, active.behaviour.child_stop_delay)

    async def spawn_child(self, ids: dict[str, Any], behaviour: CodexBehaviour) -> None:
        """What the multi-agent ``spawn_agent`` tool shows: its item, the child's thread."""
        self.store.counter += 1
        child = f"thr_{self.store.counter}"
        item: dict[str, Any] = {
            "type": "collabAgentToolCall",
            "id": f"call_spawn_{child}",
            "tool": "spawnAgent",
            "status": "inProgress",
            "senderThreadId": self.thread_id,
            "receiverThreadIds": [],
            "prompt": "help",
            "model": None,
            "reasoningEffort": None,
            "agentsStates": {},
        }
        await self.notify("item/started", {**ids, "startedAtMs": 0, "item": item})
        self.children.append(child)
        self.store.sessions[child] = []
        await self.notify(
            "thread/started",
            {
                "thread": {
                    "id": child,
                    "parentThreadId": self.thread_id,
                    "source": {
                        "subAgent": {
                            "thread_spawn": {"parent_thread_id": self.thread_id, "depth": 1}
                        }
                    },
                    "status": {"type": "idle"},
                    "turns": [],
                }
            },
        )
        done = {
            **item,
            "status": "completed",
            "receiverThreadIds": [child],
            "agentsStates": {child: {"status": "pendingInit", "message": None}},
        }
        await self.notify("item/completed", {**ids, "completedAtMs": 0, "item": done})
        assert self.nursery is not None
        self.nursery.start_soon(self.child_turn, child, behaviour)

    async def child_turn(self, child: str, behaviour: CodexBehaviour) -> None:
        self.store.counter += 1
        real_id = f"turn_{self.store.counter}"
        running = _RunningTurn(real_id, behaviour)
        self.child_active[child] = running
        turn: dict[str, Any] = {"id": real_id, "status": "inProgress", "items": [], "error": None}
        await self.notify("turn/started", {"threadId": child, "turn": turn})
        with running.scope:
            for index in range(behaviour.words):
                await self.notify(
                    "item/agentMessage/delta",
                    {"threadId": child, "turnId": real_id, "itemId": "m", "delta": f"c{index} "},
                )
                await trio.sleep(behaviour.word_interval)
        status = "interrupted" if running.scope.cancelled_caught else "completed"
        del self.child_active[child]
        for interrupt_id in running.interrupts:
            await self.reply(interrupt_id, {})
        await self.notify("turn/completed", {"threadId": child, "turn": {**turn, "status": status}})

    async def goal_turn(self) -> None:
        """The next goal turn, started by the server itself while the goal is active."""
        await trio.sleep(GOAL_TURN_DELAY_S)
        if self.goal is None or self.goal["status"] != "active" or self.active is not None:
            return
        self.goal_turns += 1
        self.store.counter += 1
        running = _RunningTurn(f"turn_{self.store.counter}", self.goal_behaviour)
        self.active = running
        await self.run_turn(running)

    async def set_goal(self, status: str, turn_id: str | None) -> None:
        assert self.goal is not None
        self.goal["status"] = status
        await self.notify(
            "thread/goal/updated",
            {"threadId": self.thread_id, "turnId": turn_id, "goal": dict(self.goal)},
        )

    async def _stop_after(self, turn: _RunningTurn, delay: float) -> None:
        await trio.sleep(delay)
        turn.scope.cancel()

    async def turn(self, request_id: Any, behaviour: CodexBehaviour) -> None:
        self.store.counter += 1
        real_id = f"turn_{self.store.counter}"
        named = f"phantom_{self.store.counter}" if behaviour.stale else real_id
        running = _RunningTurn(real_id, behaviour)
        await trio.sleep(behaviour.reply_delay)
        if not behaviour.started_delay:
            self.active = running  # running before the client can read the reply
        await self.reply(
            request_id, {"turn": {"id": named, "status": "inProgress", "items": [], "error": None}}
        )
        if behaviour.started_delay:
            await trio.sleep(behaviour.started_delay)  # nothing can interrupt it yet
            self.active = running
        await self.run_turn(running, person=True)

    async def run_turn(self, running: _RunningTurn, *, person: bool = False) -> None:
        """A running turn from ``turn/started`` to ``turn/completed``; the person's, or a goal
        turn the server started by itself (then the goal's behaviour)."""
        behaviour = running.behaviour
        real_id = running.real_id
        ids = {"threadId": self.thread_id, "turnId": real_id}
        status = "completed"
        # The goal turn in which the model marks the goal complete.
        completes = self.goal_turns == behaviour.goal_turns and (behaviour.goal or not person)
        with running.scope:
            await self.notify(
                "turn/started",
                {"threadId": self.thread_id, "turn": {"id": real_id, "status": "inProgress"}},
            )
            if person and behaviour.goal and self.goal is None:
                self.goal_behaviour = behaviour
                self.goal = {
                    "threadId": self.thread_id,
                    "objective": "finish",
                    "status": "active",
                    "tokenBudget": None,
                    "tokensUsed": 0,
                    "timeUsedSeconds": 0,
                    "createdAt": 0,
                    "updatedAt": 0,
                }
                await self.notify(
                    "thread/goal/updated",
                    {"threadId": self.thread_id, "turnId": real_id, "goal": dict(self.goal)},
                )
            for _ in range(behaviour.children if person else 0):
                await self.spawn_child(ids, behaviour)

            async def say(word: str) -> None:
                await self.notify(
                    "item/agentMessage/delta", {**ids, "itemId": "msg_1", "delta": word}
                )

            async def ask() -> bool:
                # "cancel": "the turn will also be immediately interrupted"
                return await self.ask_approval(running, ids) != "cancel"

            async def tool(seconds: float) -> None:
                await self.run_tool(ids, seconds)

            if not await self.speak(behaviour, say, ask=ask, tool=tool):
                status = "interrupted"
            goal_active = self.goal is not None and self.goal["status"] == "active"
            if completes and goal_active and not behaviour.goal_late:
                await self.set_goal("complete", real_id)
        if running.scope.cancelled_caught:
            status = "interrupted"
        error = None
        if status == "completed" and behaviour.fail_turn:
            # The real 0.171.0 order (tests/golden/codex/turn_failed_real.json): the error
            # notification, then turn/completed failed with the same error.
            status, error = "failed", dict(FAILURE)
            await self.notify("error", {**ids, "error": dict(FAILURE), "willRetry": False})
        # The abort as turn_processor.rs orders it: retract pending requests, answer every
        # pending interrupt, then turn/completed.
        self.active = None
        for pending in running.requests:
            if self.answers.pop(pending, None) is not None:
                await self.notify(
                    "serverRequest/resolved", {"threadId": self.thread_id, "requestId": pending}
                )
        for interrupt_id in running.interrupts:
            await self.reply(interrupt_id, {})
        await self.notify(
            "turn/completed",
            {
                "threadId": self.thread_id,
                "turn": {"id": real_id, "status": status, "items": [], "error": error},
            },
        )
        goal_active = self.goal is not None and self.goal["status"] == "active"
        if completes and goal_active and behaviour.goal_late and status == "completed":
            await self.set_goal("complete", None)
        elif goal_active and status == "completed":
            assert self.nursery is not None
            self.nursery.start_soon(self.goal_turn)

    async def run_tool(self, ids: dict[str, Any], seconds: float) -> None:
        item = {
            "id": TOOL_CALL_ID,
            "type": "commandExecution",
            "command": TOOL_COMMAND,
            "status": "inProgress",
        }
        await self.notify("item/started", {**ids, "item": item})
        await trio.sleep(seconds)
        await self.notify("item/completed", {**ids, "item": {**item, "status": "completed"}})

    async def ask_approval(self, running: _RunningTurn, ids: dict[str, Any]) -> str:
        request_id = self.next_request
        self.next_request += 1
        send, receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self.answers[request_id] = send
        running.requests.append(request_id)
        item = {
            "id": "call_1",
            "type": "commandExecution",
            "command": "rm -rf build",
            "status": "inProgress",
        }
        await self.notify("item/started", {**ids, "item": item})
        await self.link.post(
            {
                "id": request_id,
                "method": "item/commandExecution/requestApproval",
                "params": {
                    **ids,
                    "itemId": "call_1",
                    "command": "rm -rf build",
                    "cwd": "/",
                    "reason": "cleanup",
                },
            }
        )
        answer = await receive.receive()
        decision = str(answer.get("result", {}).get("decision"))
        await self.notify(
            "serverRequest/resolved", {"threadId": self.thread_id, "requestId": request_id}
        )
        done = "completed" if decision.startswith("accept") else "declined"
        await self.notify("item/completed", {**ids, "item": {**item, "status": done}})
        return decision
