"""A scripted fake ``codex app-server``: the Codex protocol on stdio, for tier-3 tests.

Run as ``python fake_codex.py --state-dir DIR [--delay S] [--stop-delay S]``. It speaks what
``shared/protocols.md`` section 2 describes (no ``"jsonrpc"`` member, server request ids from 0,
the ``turn/start`` reply before ``turn/started``, ``turn/interrupt`` answered ``{}`` only when
the turn aborts, and rejected at once for a stale id or before the turn runs) and keeps its
threads as files in ``--state-dir`` so that a new process can ``thread/resume`` them.

Words in the prompt script one turn:

``wedged``        ignore ``turn/interrupt`` (never answered, never obeyed)
``stale``         the ``turn/start`` reply names a phantom turn; another id runs (edge case 8)
``late-started``  ``turn/started`` only 0.3 s after an interrupt was rejected (nothing runs
                  before it), so the client's interrupt always comes too early, and its retry
                  is accepted only if it waited for ``turn/started``
``approval``      ask ``item/commandExecution/requestApproval`` before the second word
``terminal``      start a "background terminal" (a sleeping child in its own session) that
                  survives ``turn/interrupt`` and dies on ``thread/backgroundTerminals/clean``
``words=N``       stream N words (default 20)

Fault modes (for ``tests/faults``):

``flood``               stream with no delay between words (bounded by the stdout pipe)
``crash``               exit with status 3 after the third word
``crash-on-interrupt``  exit with status 3 when ``turn/interrupt`` arrives
``mute``                after the third word close stdout and hang, alive, ignoring interrupts
``reply-delay=S``       the ``turn/start`` reply S seconds late (the turn id is not yet known)

``--ignore-sigterm`` ignores SIGTERM from the start (only SIGKILL ends it).

What it decides is logged to stderr (the supervisor turns that into ``agent.stderr`` events).
Standard library and trio only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
from typing import Any

import trio

LATE_STARTED_S = 0.3
DEFAULT_WORDS = 20
CRASH_AFTER_WORDS = 3
#: A flood waits while this many messages are queued for stdout (bounded memory).
FLOOD_BACKLOG = 256


def log(text: str) -> None:
    print(f"fake-codex: {text}", file=sys.stderr, flush=True)


class Running:
    def __init__(self, real_id: str, wedged: bool, crash_on_interrupt: bool = False) -> None:
        self.real_id = real_id
        self.wedged = wedged
        self.crash_on_interrupt = crash_on_interrupt
        self.scope = trio.CancelScope()
        self.interrupts: list[Any] = []
        self.requests: list[int] = []


class FakeCodex:
    def __init__(
        self,
        options: argparse.Namespace,
        stdin: trio.abc.ReceiveStream,
        stdout: trio.abc.SendStream,
    ) -> None:
        self.options = options
        self.stdin = stdin
        self.stdout = stdout
        self.out_send, self.out_receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self.initialized = False
        self.experimental = False
        self.thread_id: str | None = None
        self.active: Running | None = None
        #: set when an interrupt came while no turn ran (what a ``late-started`` turn waits for)
        self.refused = trio.Event()
        self.next_request = 0
        self.answers: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.terminals: list[subprocess.Popen[bytes]] = []
        self.nursery: trio.Nursery | None = None

    # -- plumbing ----------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.out_send.send_nowait(message)
        except trio.ClosedResourceError:
            pass  # muted: stdout is closed

    def reply(self, request_id: Any, result: Any) -> None:
        self.send({"id": request_id, "result": result})

    def error(self, request_id: Any, message: str, code: int = -32600) -> None:
        self.send({"id": request_id, "error": {"code": code, "message": message}})

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.send({"method": method, "params": params})

    async def write_stdout(self) -> None:
        async for message in self.out_receive:
            await self.stdout.send_all(json.dumps(message).encode() + b"\n")
        # Muted (the channel was closed): close every descriptor of the stdout pipe.
        await self.stdout.aclose()
        os.close(1)
        log("stdout closed; staying alive")

    async def go_mute(self, running: Running) -> None:
        running.wedged = True
        log("going mute: closing stdout, ignoring interrupts")
        self.out_send.close()
        await trio.sleep_forever()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.write_stdout)
            pending = b""
            while True:
                data = await self.stdin.receive_some(65536)
                if not data:
                    break
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self.handle(json.loads(line))
            log("stdin closed; exiting")
            nursery.cancel_scope.cancel()

    def thread_file(self, thread_id: str) -> str:
        return os.path.join(self.options.state_dir, f"{thread_id}.json")

    def next_number(self) -> int:
        path = os.path.join(self.options.state_dir, "counter")
        number = 1
        if os.path.exists(path):
            with open(path) as file:
                number = int(file.read()) + 1
        with open(path, "w") as file:
            file.write(str(number))
        return number

    # -- requests from the client ----------------------------------------------------------

    def handle(self, message: dict[str, Any]) -> None:
        if "jsonrpc" in message:
            log(f"client sent a jsonrpc member: {message}")
        method = message.get("method")
        params = message.get("params") or {}
        request_id = message.get("id")
        assert self.nursery is not None
        if method is None:
            answer = self.answers.pop(request_id, None)
            if answer is not None:
                answer.send_nowait(message)
            return
        if method == "initialize":
            self.experimental = bool(params.get("capabilities", {}).get("experimentalApi"))
            self.reply(
                request_id,
                {
                    "userAgent": "fake-codex/0",
                    "codexHome": "/nowhere",
                    "platformFamily": "unix",
                    "platformOs": "linux",
                },
            )
        elif method == "initialized":
            self.initialized = True
        elif not self.initialized:
            self.error(request_id, "Not initialized")
        elif method == "thread/start":
            self.thread_id = f"thr_{self.next_number()}"
            with open(self.thread_file(self.thread_id), "w") as file:
                json.dump([], file)
            self.reply(request_id, {"thread": {"id": self.thread_id}, "cwd": params.get("cwd")})
            self.notify("thread/started", {"thread": {"id": self.thread_id}})
        elif method == "thread/resume":
            thread_id = str(params.get("threadId"))
            if not os.path.exists(self.thread_file(thread_id)):
                self.error(request_id, f"no rollout found for thread id {thread_id}")
                return
            self.thread_id = thread_id
            log(f"resumed {thread_id}")
            self.reply(request_id, {"thread": {"id": thread_id}})
        elif method == "turn/start":
            text = "".join(part.get("text", "") for part in params.get("input", []))
            assert self.thread_id is not None
            path = self.thread_file(self.thread_id)
            with open(path) as file:
                history = json.load(file)
            with open(path, "w") as file:
                json.dump([*history, text], file)
            self.nursery.start_soon(self.turn, request_id, text)
        elif method == "turn/interrupt":
            self.interrupt(request_id, params.get("turnId"))
        elif method == "thread/backgroundTerminals/clean":
            if not self.experimental:
                self.error(request_id, f"{method} requires experimentalApi capability")
                return
            for terminal in self.terminals:
                terminal.kill()
                terminal.wait()
            log(f"cleaned {len(self.terminals)} background terminal(s)")
            self.terminals.clear()
            self.reply(request_id, {})
        elif request_id is not None:
            self.error(request_id, f"Method not found: {method}", code=-32601)

    def interrupt(self, request_id: Any, turn_id: Any) -> None:
        active = self.active
        if active is None:
            log(f"interrupt {turn_id} rejected: no active turn to interrupt")
            self.error(request_id, "no active turn to interrupt")
            self.refused.set()
        elif turn_id != active.real_id:
            log(f"interrupt {turn_id} rejected: stale, {active.real_id} is running")
            self.error(request_id, f"expected active turn id {turn_id} but found {active.real_id}")
        elif active.crash_on_interrupt:
            log(f"interrupt {turn_id}: crashing as asked")
            os._exit(3)
        elif active.wedged:
            log(f"interrupt {turn_id} ignored (wedged)")
        else:
            log(f"interrupt {turn_id} accepted")
            active.interrupts.append(request_id)
            assert self.nursery is not None
            self.nursery.start_soon(self.stop_after, active)

    async def stop_after(self, running: Running) -> None:
        await trio.sleep(self.options.stop_delay)
        running.scope.cancel()

    # -- a turn ------------------------------------------------------------------------------

    async def turn(self, request_id: Any, text: str) -> None:
        words = text.split()
        count = DEFAULT_WORDS
        reply_delay = 0.0
        for word in words:
            if word.startswith("words="):
                count = int(word.partition("=")[2])
            elif word.startswith("reply-delay="):
                reply_delay = float(word.partition("=")[2])
        flood = "flood" in words
        number = self.next_number()
        real_id = f"turn_{number}"
        named = f"phantom_{number}" if "stale" in words else real_id
        running = Running(
            real_id, wedged="wedged" in words, crash_on_interrupt="crash-on-interrupt" in words
        )
        if reply_delay:
            await trio.sleep(reply_delay)
        late = "late-started" in words
        if late:
            self.refused = trio.Event()
        else:
            self.active = running
        self.reply(
            request_id, {"turn": {"id": named, "status": "inProgress", "items": [], "error": None}}
        )
        ids = {"threadId": self.thread_id, "turnId": real_id}
        status = "completed"
        with running.scope:
            if late:
                await self.refused.wait()
                await trio.sleep(LATE_STARTED_S)  # time for a retry that did not wait
                self.active = running
            self.notify(
                "turn/started",
                {"threadId": self.thread_id, "turn": {"id": real_id, "status": "inProgress"}},
            )
            if "terminal" in words:
                self.start_terminal(ids)
            for index in range(count):
                asks = "approval" in words and index == 1
                if asks and await self.ask_approval(running, ids) == "cancel":
                    status = "interrupted"  # "the turn will also be immediately interrupted"
                    break
                self.notify(
                    "item/agentMessage/delta", {**ids, "itemId": "msg_1", "delta": f"w{index} "}
                )
                if index + 1 == CRASH_AFTER_WORDS and "crash" in words:
                    log("crashing as asked")
                    os._exit(3)
                if index + 1 == CRASH_AFTER_WORDS and "mute" in words:
                    await self.go_mute(running)
                if flood:
                    await trio.sleep(0)
                    while self.out_receive.statistics().current_buffer_used > FLOOD_BACKLOG:
                        await trio.sleep(0.001)
                else:
                    await trio.sleep(self.options.delay)
        if running.scope.cancelled_caught:
            status = "interrupted"
        self.active = None
        for pending in running.requests:
            if self.answers.pop(pending, None) is not None:
                self.notify(
                    "serverRequest/resolved", {"threadId": self.thread_id, "requestId": pending}
                )
        for interrupt_id in running.interrupts:
            self.reply(interrupt_id, {})
        log(f"turn {real_id} {status}")
        self.notify(
            "turn/completed",
            {
                "threadId": self.thread_id,
                "turn": {"id": real_id, "status": status, "items": [], "error": None},
            },
        )

    def start_terminal(self, ids: dict[str, Any]) -> None:
        # Its own session, like a dev server a command left running: only the supervisor's
        # tree kill or thread/backgroundTerminals/clean ends it.
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.terminals.append(child)
        item = {
            "id": "term_1",
            "type": "commandExecution",
            "command": "npm run dev",
            "status": "inProgress",
            "processId": str(child.pid),
        }
        self.notify("item/started", {**ids, "item": item})

    async def ask_approval(self, running: Running, ids: dict[str, Any]) -> str:
        request_id = self.next_request
        self.next_request += 1
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self.answers[request_id] = send
        running.requests.append(request_id)
        item = {
            "id": "call_1",
            "type": "commandExecution",
            "command": "rm -rf build",
            "status": "inProgress",
        }
        self.notify("item/started", {**ids, "item": item})
        self.send(
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
        log(f"approval {request_id} answered {decision}")
        self.notify("serverRequest/resolved", {"threadId": self.thread_id, "requestId": request_id})
        done = "completed" if decision.startswith("accept") else "declined"
        self.notify("item/completed", {**ids, "item": {**item, "status": done}})
        return decision


async def amain(options: argparse.Namespace) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    async with stdin, stdout:
        await FakeCodex(options, stdin, stdout).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app_server", nargs="?", help="ignored: 'app-server', as codex takes it")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--stop-delay", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    options = parser.parse_args()
    os.makedirs(options.state_dir, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if options.ignore_sigterm else signal.SIG_DFL)
    log(f"started (pid {os.getpid()})")
    trio.run(amain, options)


if __name__ == "__main__":
    main()
