"""An in-memory Claude Code CLI (stream-json) for tests on virtual time.

The same trick as ``_acp.py`` (the plumbing of ``_memory.py``): the "process" is a trio task,
messages are dicts, a kill is a cancel scope, every delay is virtual. It speaks what
``protocols/claude.py`` expects of Claude Code 2.1.332: ``initialize`` answered at start;
``system/init`` after each user message; partial ``stream_event`` deltas; the ``interrupt``
acknowledged at once and the turn ended by a ``result`` (``aborted_streaming``, or
``aborted_tools`` while a permission is pending, which it withdraws with
``control_cancel_request``); ``--resume`` of an unknown session refused with a ``result`` and
exit 1; an interrupt while idle acknowledged and otherwise ignored. A permission is a
``can_use_tool`` request for ``Bash``; a tool call an ``assistant`` ``tool_use`` and its
``tool_result``. A steer (a ``user`` line with a ``uuid`` mid-turn) is taken into the running
turn as the CLI takes one while a tool runs: ``command_lifecycle`` ``queued``, the text said
back as ``steered:<text>``, and the turn's ``result`` naming its uuid; with ``steer_answer``
``refuse`` the CLI says ``command_lifecycle`` ``cancelled`` instead. A conversation it cannot
``resume`` is not kept, so ``--resume`` finds nothing.

Prompt tokens beyond the shared ones (``_memory.Behaviour``): ``ignore-cancel``, ``lost-result``
(acknowledges the interrupt, stops, never writes the result), ``deaf`` (ignores interrupt
requests entirely), ``drop-early-interrupt`` and ``init-delay=0.3`` (an interrupt before
``system/init`` is lost, like older CLIs), ``withdraw=0.5`` (the CLI withdraws its own
permission request), ``background`` (a second ``result`` after the turn's, like a background
task). ``fail-turn``: the turn ends on an API error (``success``/``completed`` with
``is_error``).

Background tasks, as 2.1.332 runs them (``tests/real/test_real_claude_tasks.py``): ``tasks=N``
starts N background shells (``system/task_started``, ids like the CLI's: ``b`` and eight of
``[0-9a-z]``) when the turn starts; like the CLI's, they survive the interrupt and run until
stopped. ``stop_task`` ends a running task (``task_updated`` ``killed``, ``task_notification``
``stopped``, ``background_tasks_changed``) and is answered success ``{}``, also for a task that
is gone, after ``task-stop-delay=S``; ``task-deaf`` never answers it, ``task-refuse`` answers an
error (what the CLI's bridge contexts say). ``interrupt-kills-tasks`` makes the tasks sub-agents
(``local_agent``, ids ``a`` and 16 hex digits), which the interrupt ends itself before it is
acknowledged (the CLI's way when the host does not declare ``perTaskStopAffordance``).
"""

from __future__ import annotations

from typing import Any

import trio
from attrs import define, field

from protocols.claude import ClaudeClient
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


@define
class ClaudeBehaviour(Behaviour):
    lost_result: bool = False
    deaf: bool = False
    drop_early_interrupt: bool = False
    init_delay: float = 0.0
    withdraw_after: float | None = None
    background: bool = False
    tasks: int = 0
    task_stop_delay: float | None = 0.0  # None: stop_task is never answered
    task_refuse: bool = False
    interrupt_kills_tasks: bool = False
    steer_answer: str = "injected"  # or "refuse": the steer's command_lifecycle is cancelled

    TOKENS = {
        **Behaviour.TOKENS,
        "ignore-cancel": ("stop_delay", never),
        "lost-result": ("lost_result", on),
        "deaf": ("deaf", on),
        "drop-early-interrupt": ("drop_early_interrupt", on),
        "init-delay": ("init_delay", float),
        "withdraw": ("withdraw_after", float),
        "background": ("background", on),
        "tasks": ("tasks", int),
        "task-stop-delay": ("task_stop_delay", float),
        "task-deaf": ("task_stop_delay", never),
        "task-refuse": ("task_refuse", on),
        "interrupt-kills-tasks": ("interrupt_kills_tasks", on),
    }


class ClaudeLauncher(MemoryLauncher[ClaudeBehaviour, "ClaudeCli"]):
    """A ``Launcher`` starting :class:`ClaudeCli` tasks from the argv the protocol builds."""

    behaviour_type = ClaudeBehaviour

    def __init__(self, behaviour: ClaudeBehaviour | None = None, **kwargs: Any) -> None:
        super().__init__(behaviour, **kwargs)
        self.argvs: list[list[str]] = []

    def launch(self, link: MemoryLink, spec: AgentSpec, resume: str | None) -> ClaudeCli:
        argv = ClaudeClient.command(spec.command, resume)
        self.argvs.append(argv)
        return ClaudeCli(link, self, argv)

    @property
    def clis(self) -> list[ClaudeCli]:
        return self.agents

    def sent_subtypes(self) -> list[str]:
        """Our control requests and user messages, in order: "initialize", "user", ..."""
        out = []
        for kind, _, message in self.log:
            if kind != "to_agent":
                continue
            if message.get("type") == "control_request":
                out.append(str(message["request"].get("subtype")))
            else:
                out.append(str(message.get("type")))
        return out


@define
class _Turn:
    text: str
    behaviour: ClaudeBehaviour
    interrupted: trio.Event = field(factory=trio.Event)
    init_sent: bool = False
    pending_permission: str | None = None
    permission_answer: trio.MemorySendChannel[dict[str, Any]] | None = None
    aborted: str = "aborted_streaming"
    #: what it said so far, and the uuids of the steers it took
    said: list[str] = field(factory=list)
    steers: list[str] = field(factory=list)


class ClaudeCli(MemoryAgent[ClaudeBehaviour]):
    def __init__(self, link: MemoryLink, launcher: ClaudeLauncher, argv: list[str]):
        super().__init__(link, launcher)
        self.argv = argv
        self.session_id: str | None = None
        self.turn: _Turn | None = None
        self.idle_interrupts = 0
        self.dropped_interrupts = 0
        self.late_answers: list[dict[str, Any]] = []
        self.next_request = 0
        self.message_count = 0
        #: every task started, in order, with the behaviour of the turn that started it
        self.tasks: dict[str, ClaudeBehaviour] = {}
        self.live: set[str] = set()
        self.stop_requests: list[str] = []

    def running_tasks(self) -> list[str]:
        return [task_id for task_id in self.tasks if task_id in self.live]

    # -- process ------------------------------------------------------------------------

    async def boot(self) -> bool:
        if "--resume" in self.argv:
            wanted = self.argv[self.argv.index("--resume") + 1]
            if wanted not in self.store.sessions:
                await self.post(
                    {
                        "type": "result",
                        "subtype": "error_during_execution",
                        "is_error": True,
                        "num_turns": 0,
                        "session_id": wanted,
                        "errors": [f"No conversation found with session ID: {wanted}"],
                    }
                )
                await self.exit(1)
                return False
            self.session_id = wanted
        return not await self.crashed_at_launch()  # start_delay: initialize answered late

    async def post(self, message: dict[str, Any]) -> None:
        await self.link.post(message)

    async def handle(self, message: dict[str, Any], nursery: trio.Nursery) -> None:
        kind = message.get("type")
        if kind == "control_request":
            request = message["request"]
            if request["subtype"] == "initialize":
                if self.behaviour.start_delay:
                    await trio.sleep(self.behaviour.start_delay)
                await self.ack(message["request_id"], {"commands": [], "models": []})
            elif request["subtype"] == "interrupt":
                await self.on_interrupt(message["request_id"])
            elif request["subtype"] == "stop_task":
                await self.on_stop_task(message["request_id"], request["task_id"], nursery)
        elif kind == "control_response":
            await self.on_permission_answer(message["response"])
        elif kind == "user":
            text = message["message"]["content"]
            if self.turn is not None and "uuid" in message:
                await self.on_steer(self.turn, message["uuid"], text)
                return
            if self.turn is not None:
                self.launcher.violations.append(f"a user message while a turn runs: {text!r}")
                return
            self.turns.append(text)
            turn = _Turn(text, self.behaviour.for_prompt(text))
            self.turn = turn
            nursery.start_soon(self.run_turn, turn)

    async def ack(self, request_id: str, response: dict[str, Any]) -> None:
        await self.post(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request_id, "response": response},
            }
        )

    async def on_stop_task(self, request_id: str, task_id: str, nursery: trio.Nursery) -> None:
        self.stop_requests.append(task_id)
        behaviour = self.tasks.get(task_id, self.behaviour)
        if behaviour.task_refuse:
            await self.post(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "error",
                        "request_id": request_id,
                        "error": "stop_task is not supported in this context"
                        " (callback not registered)",
                    },
                }
            )
        elif behaviour.task_stop_delay is not None:
            nursery.start_soon(
                self._stop_task_after, request_id, task_id, behaviour.task_stop_delay
            )

    async def _stop_task_after(self, request_id: str, task_id: str, delay: float) -> None:
        await trio.sleep(delay)
        await self.end_task(task_id, "stopped")
        await self.ack(request_id, {})

    async def end_task(self, task_id: str, status: str) -> None:
        if task_id not in self.live:
            return
        self.live.discard(task_id)
        patch = {"status": "killed" if status == "stopped" else status, "end_time": 0}
        for message in (
            {"subtype": "task_updated", "task_id": task_id, "patch": patch},
            {
                "subtype": "task_notification",
                "task_id": task_id,
                "status": status,
                "output_file": f"/tmp/tasks/{task_id}.output",
                "summary": "sleep 1000",
            },
            {
                "subtype": "background_tasks_changed",
                "tasks": [{"task_id": t, "task_type": _task_type(t)} for t in self.running_tasks()],
            },
        ):
            await self.post({"type": "system", **message, "session_id": self.session_id})

    async def on_steer(self, turn: _Turn, message_uuid: str, text: str) -> None:
        if turn.behaviour.steer_answer == "refuse":
            await self.lifecycle(message_uuid, "cancelled")
            return
        await self.lifecycle(message_uuid, "queued")
        self.steers.append(text)
        turn.steers.append(message_uuid)
        await self.say(turn, f"steered:{text} ")

    async def lifecycle(self, message_uuid: str, state: str) -> None:
        await self.post({"type": "command_lifecycle", "command_uuid": message_uuid, "state": state})

    async def on_interrupt(self, request_id: str) -> None:
        turn = self.turn
        if turn is not None and turn.behaviour.deaf:
            return
        if turn is not None and turn.behaviour.crash_on_cancel:
            await self.crash()
            return
        if turn is not None and turn.behaviour.interrupt_kills_tasks:
            for task_id in self.running_tasks():
                await self.end_task(task_id, "stopped")
        await self.ack(request_id, {"still_queued": []})
        if turn is None:
            self.idle_interrupts += 1
        elif turn.behaviour.drop_early_interrupt and not turn.init_sent:
            self.dropped_interrupts += 1  # a normal-looking receipt, and nothing happens
        else:
            await self.interrupt(turn)

    async def interrupt(self, turn: _Turn) -> None:
        if turn.pending_permission is not None:
            # Withdraw the prompt; any late answer to it is ignored.
            withdrawn, turn.pending_permission = turn.pending_permission, None
            await self.post({"type": "control_cancel_request", "request_id": withdrawn})
            turn.aborted = "aborted_tools"
            if turn.permission_answer is not None:
                turn.permission_answer.send_nowait({"behavior": "withdrawn"})
        turn.interrupted.set()

    async def on_permission_answer(self, response: dict[str, Any]) -> None:
        turn = self.turn
        if (
            turn is None
            or turn.pending_permission != response.get("request_id")
            or turn.permission_answer is None
        ):
            self.late_answers.append(response)
            return
        turn.pending_permission = None
        turn.permission_answer.send_nowait(response.get("response", {}))

    # -- a turn ---------------------------------------------------------------------------

    async def run_turn(self, turn: _Turn) -> None:
        behaviour = turn.behaviour
        if behaviour.init_delay:
            await trio.sleep(behaviour.init_delay)
        if self.session_id is None:
            self.store.counter += 1
            self.session_id = f"sess-{self.store.counter}"
        if behaviour.resumes:
            self.store.sessions.setdefault(self.session_id, []).append(turn.text)
        await self.post(
            {"type": "system", "subtype": "init", "session_id": self.session_id, "argv": self.argv}
        )
        turn.init_sent = True
        self.message_count += 1
        message_id = f"msg_{self.link.generation}_{self.message_count}"
        await self.stream({"type": "message_start", "message": {"id": message_id}})
        for _ in range(behaviour.tasks):
            self.store.counter += 1
            if behaviour.interrupt_kills_tasks:
                task_id = f"a{self.store.counter:016x}"
            else:
                task_id = f"b{self.store.counter:08d}"
            self.tasks[task_id] = behaviour
            self.live.add(task_id)
            await self.post(
                {
                    "type": "system",
                    "subtype": "task_started",
                    "task_id": task_id,
                    "description": "sleep 1000",
                    "task_type": _task_type(task_id),
                    "is_backgrounded": True,
                    "session_id": self.session_id,
                }
            )
        finished = False
        async with trio.open_nursery() as nursery:

            async def watch_interrupt() -> None:
                await turn.interrupted.wait()
                if behaviour.stop_delay is None:
                    return  # wedged: acknowledged, and it goes on as if nothing happened
                await trio.sleep(behaviour.stop_delay)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_interrupt)

            async def say(word: str) -> None:
                await self.say(turn, word)

            async def ask() -> bool:
                return await self.ask_permission(turn, nursery)

            finished = await self.speak(behaviour, say, ask=ask, tool=self.run_tool)
            nursery.cancel_scope.cancel()
        if not finished and behaviour.lost_result:
            return  # stopped, but the result never comes (edge case 22)
        if turn.said:
            await self.post(
                {
                    "type": "assistant",
                    "session_id": self.session_id,
                    "parent_tool_use_id": None,
                    "message": {
                        "id": message_id,
                        "role": "assistant",
                        "content": [{"type": "text", "text": "".join(turn.said)}],
                    },
                }
            )
        self.turn = None
        # The result names the steers the turn took (the CLI's ``user_message_uuids``).
        named = {"user_message_uuids": turn.steers} if turn.steers else {}
        if finished and behaviour.fail_turn:
            # An API error: the CLI still says success/completed, with is_error.
            await self.post(
                self.result(
                    subtype="success",
                    is_error=True,
                    terminal_reason="completed",
                    result="API Error: 500 internal",
                    **named,
                )
            )
        elif finished:
            await self.post(
                self.result(
                    subtype="success",
                    is_error=False,
                    terminal_reason="completed",
                    result="".join(turn.said),
                    **named,
                )
            )
        else:
            await self.post(
                {
                    "type": "user",
                    "session_id": self.session_id,
                    "parent_tool_use_id": None,
                    "message": {
                        "role": "user",
                        "content": [{"type": "text", "text": "[Request interrupted by user]"}],
                    },
                }
            )
            await self.post(
                self.result(
                    subtype="error_during_execution",
                    is_error=True,
                    terminal_reason=turn.aborted,
                    errors=["[ede_diagnostic] result_type=user"],
                )
            )
        if behaviour.background:
            await trio.sleep(0.5)
            await self.post(
                self.result(
                    subtype="success",
                    is_error=False,
                    terminal_reason="completed",
                    result="background done",
                )
            )

    async def say(self, turn: _Turn, text: str) -> None:
        turn.said.append(text)
        await self.stream(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            }
        )

    async def run_tool(self, seconds: float) -> None:
        tool_input = {"command": TOOL_COMMAND}
        await self.post(
            {
                "type": "assistant",
                "session_id": self.session_id,
                "parent_tool_use_id": None,
                "message": {
                    "id": f"msg_{TOOL_CALL_ID}",
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": TOOL_CALL_ID,
                            "name": "Bash",
                            "input": tool_input,
                        }
                    ],
                },
            }
        )
        await trio.sleep(seconds)
        await self.post(self.tool_result("ok", is_error=False, tool_use_id=TOOL_CALL_ID))

    def result(self, **fields: Any) -> dict[str, Any]:
        return {"type": "result", "num_turns": 1, "session_id": self.session_id, **fields}

    async def stream(self, event: dict[str, Any]) -> None:
        await self.post(
            {
                "type": "stream_event",
                "event": event,
                "session_id": self.session_id,
                "parent_tool_use_id": None,
            }
        )

    async def ask_permission(self, turn: _Turn, nursery: trio.Nursery) -> bool:
        """Ask for the Bash tool; False when the turn must end here."""
        self.next_request += 1
        request_id = f"perm-{self.link.generation}-{self.next_request}"
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        turn.pending_permission = request_id
        turn.permission_answer = send
        tool_input = {"command": "rm -rf build"}
        await self.post(
            {
                "type": "assistant",
                "session_id": self.session_id,
                "parent_tool_use_id": None,
                "message": {
                    "id": f"msg_tool_{request_id}",
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": tool_input}
                    ],
                },
            }
        )
        await self.post(
            {
                "type": "control_request",
                "request_id": request_id,
                "request": {
                    "subtype": "can_use_tool",
                    "tool_name": "Bash",
                    "input": tool_input,
                    "tool_use_id": "toolu_1",
                },
            }
        )
        if turn.behaviour.withdraw_after is not None:

            async def withdraw() -> None:
                await trio.sleep(turn.behaviour.withdraw_after or 0)
                if turn.pending_permission == request_id:
                    turn.pending_permission = None
                    await self.post({"type": "control_cancel_request", "request_id": request_id})
                    send.send_nowait({"behavior": "withdrawn"})

            nursery.start_soon(withdraw)
        with trio.CancelScope(shield=True):  # the CLI waits on the answer, not the interrupt
            answer = await receive.receive()
        turn.permission_answer = None
        behaviour = answer.get("behavior")
        if behaviour == "allow":
            assert answer.get("updatedInput") == tool_input
            await self.post(self.tool_result("done", is_error=False))
            return True
        if behaviour == "deny" and answer.get("interrupt") is True:
            # What the SDK's deny+interrupt does: the turn stops as if interrupted.
            await self.post(self.tool_result("denied", is_error=True))
            turn.aborted = "aborted_tools"
            turn.interrupted.set()
            return False
        if behaviour == "deny":
            await self.post(self.tool_result(str(answer.get("message")), is_error=True))
            return True
        # withdrawn: by the CLI itself, or because of an interrupt
        await self.post(self.tool_result("withdrawn", is_error=True))
        return not turn.interrupted.is_set()

    def tool_result(
        self, text: str, *, is_error: bool, tool_use_id: str = "toolu_1"
    ) -> dict[str, Any]:
        return {
            "type": "user",
            "session_id": self.session_id,
            "parent_tool_use_id": None,
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_use_id,
                        "content": text,
                        "is_error": is_error,
                    }
                ],
            },
        }


def _task_type(task_id: str) -> str:
    return "local_agent" if task_id.startswith("a") else "local_bash"
