"""A node that breaks the protocol on purpose: a host's ``transport`` for the front's tests.

Run as ``[sys.executable, "fake_node.py", "--fault", KIND, "--at", POINT, "--"]`` (the front
appends the bridge's command line, which is ignored). Like ``node --bridge`` it writes the
hello line on stdout, then speaks the gateway's WebSocket protocol, server side, over its
stdio (wsproto): it answers what a front asks (``session.list``, ``session.start``,
``session.subscribe``, ``agent.prompt``, ``agent.cancel``, ``session.stop``, pings) just well
enough for one session's life, and does ``KIND`` at ``POINT`` instead of what a node would do.

Points: ``connect`` (a frame right after the WebSocket handshake, before any answer),
``start`` (``session.start``), ``subscribe`` (``session.subscribe``), ``turn`` (the prompt's
answer, or a frame once its turn streams) and ``cancel`` (``agent.cancel``, its turn running).

Kinds, a bad frame in place of what the point would send (for ``turn``: after the prompt's
answer and the turn's first events):

- ``not_json``: ``{not json``;
- ``deep``: an event whose data nests ``DEEP`` levels;
- ``not_object``: a JSON array;
- ``invalid_utf8``: a text frame that is not UTF-8 (written byte for byte, as wsproto would not);
- ``surrogate``: an event whose ``session_id`` is a lone surrogate (``"\\ud800"``);
- ``oversize``: a frame one byte over the front's ``MAX_MESSAGE_BYTES``;
- ``bad_event``: ``"event": ["list"]``;
- ``bad_state``: a ``session.state`` event whose state is no state but markup
  (:data:`BAD_STATE`); at ``start``, the start's answer says that state;

and an answer that is wrong (the point's request is answered with it):

- ``no_result``: ``{"id", "ok": true}`` and nothing else;
- ``bad_result``: a result without what its action gives (``session_id``, ``last_seq``,
  ``turn_id``), or, for a cancel, a malformed receipt;
- ``silent``: no answer at all (pings are still answered);

and ``handshake``: bytes that are not HTTP where the WebSocket handshake's answer belongs;
``late`` (``start`` only): the start answered after ``--late-s`` seconds, and the process
exits once that session is stopped (what the test waits for). ``none``: no fault.

``--once FILE``: do it only if ``FILE`` does not exist, and create it (the next connection is
a well-behaved node); ``--armed FILE``: do it only if ``FILE`` exists; ``--log FILE``: append
each request's action and session id to ``FILE``, as they come; ``--keep-turn``: a bad answer
to a cancel leaves its turn running (no ``turn.ended`` says how it went).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Request,
    TextMessage,
)

from protocols import events as ev
from supervisor.receipt import CancelReceipt
from supervisor.remote.frames import MAX_MESSAGE_BYTES
from supervisor.remote.handshake import Hello, package_version
from supervisor.wire.codec import event_to_wire, receipt_to_wire

FRAMES = (
    "not_json",
    "deep",
    "not_object",
    "invalid_utf8",
    "surrogate",
    "oversize",
    "bad_event",
    "bad_state",
)
ANSWERS = ("no_result", "bad_result", "silent")
POINTS = ("connect", "start", "subscribe", "turn", "cancel")
#: As deep as the audit's frame: far past what a recursive decoder follows.
DEEP = 200_000
#: What a broken (or hostile) node says its session's state is.
BAD_STATE = "<img src=x onerror=alert(1)>"
#: The fake's node id: the same on every connection, so a front that reconnects finds "its" node.
INSTANCE = "fake-node"


class FakeNode:
    def __init__(
        self,
        fault: str,
        at: str,
        late_s: float = 0.0,
        log: Path | None = None,
        keep_turn: bool = False,
    ) -> None:
        self.fault = fault
        self.at = at
        self.late_s = late_s
        self.log = log
        self.keep_turn = keep_turn
        self.ws = WSConnection(ConnectionType.SERVER)
        self.out = sys.stdout.buffer
        #: per session (``s1-PID``, ``s2-PID``, ... as started): its last seq, its running turn
        self.seqs: dict[str, int] = {}
        self.running: dict[str, str | None] = {}
        #: the session the last request was about: the one bad frames are for
        self.current = "s0"
        self.turns = 0
        self.parts: list[str | bytes] = []

    # -- writing -------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.write(self.ws.send(TextMessage(data=json.dumps(message))))

    def answer(self, request_id: object, result: dict[str, Any]) -> None:
        self.send({"id": request_id, "ok": True, "result": result})

    def event(self, event: ev.Event) -> None:
        self.seqs[self.current] = self.seq + 1
        stamped = {**event_to_wire(event), "session_id": self.current, "seq": self.seq}
        self.send(stamped)

    @property
    def seq(self) -> int:
        return self.seqs.get(self.current, 0)

    @property
    def turn(self) -> str | None:
        return self.running.get(self.current)

    def bad_frame(self) -> None:
        """The fault's frame, as the node's next message."""
        seq, sid = self.seq + 1, self.current
        if self.fault == "not_json":
            self.write(self.ws.send(TextMessage(data="{not json")))
        elif self.fault == "deep":
            event = {"event": "message.delta", "session_id": sid, "seq": seq, "timestamp": 1.0}
            head = json.dumps({**event, "data": {"turn_id": None, "text": "x"}})
            nest = "[" * DEEP + "]" * DEEP
            self.write(self.ws.send(TextMessage(data=f'{head[:-2]}, "nest": {nest}}}}}')))
        elif self.fault == "not_object":
            self.write(self.ws.send(TextMessage(data=json.dumps(["event", sid]))))
        elif self.fault == "invalid_utf8":
            payload = b'{"event": "message.delta", "text": "\xff\xfe"}'
            self.write(bytes([0x81, len(payload)]) + payload)  # FIN + text, unmasked, < 126
        elif self.fault == "surrogate":  # (json.dumps writes it as the escape "\ud800")
            self.send(
                {
                    "event": "message.delta",
                    "session_id": "\ud800",
                    "seq": seq,
                    "timestamp": 1.0,
                    "data": {"turn_id": None, "text": "x"},
                }
            )
        elif self.fault == "oversize":
            self.write(self.ws.send(TextMessage(data="x" * (MAX_MESSAGE_BYTES + 1))))
        elif self.fault == "bad_event":
            self.send(
                {"event": ["list"], "session_id": sid, "seq": seq, "timestamp": 1.0, "data": {}}
            )
        elif self.fault == "bad_state":
            self.seqs[sid] = seq
            data = {"state": BAD_STATE, "detail": None}
            self.send(
                {
                    "event": "session.state",
                    "session_id": sid,
                    "seq": seq,
                    "timestamp": 1.0,
                    "data": data,
                }
            )
        else:
            raise AssertionError(self.fault)

    def bad_answer(self, request_id: object, action: str) -> None:
        if self.fault == "silent":
            return
        if self.fault == "no_result":
            self.send({"id": request_id, "ok": True})
            return
        assert self.fault == "bad_result", self.fault
        if action == "agent.cancel":
            self.answer(request_id, {"outcome": ["cancelled"], "turn_id": self.turn})
        elif action == "session.subscribe":
            self.answer(request_id, {"last_seq": "many"})
        elif action == "agent.prompt":
            self.answer(request_id, {"queued": False})
        else:
            self.answer(request_id, {"state": "ready"})

    # -- the session's life --------------------------------------------------------------

    def at_fault(self, point: str) -> bool:
        return self.at == point and self.fault != "none"

    def on_request(self, message: dict[str, Any]) -> None:
        request_id, action = message.get("id"), message.get("action")
        payload = message.get("payload") or {}
        if self.log is not None:
            with self.log.open("a") as log:
                log.write(f"{action} {payload.get('session_id')}\n")
        if isinstance(payload.get("session_id"), str):
            self.current = payload["session_id"]
        elif action == "session.start":
            # (unique across the fake's processes, as a node's ids are in its directory)
            self.current = f"s{len(self.seqs) + 1}-{os.getpid()}"
            self.seqs[self.current] = 0
        point = {
            "session.start": "start",
            "session.subscribe": "subscribe",
            "agent.prompt": "turn",
            "agent.cancel": "cancel",
        }.get(str(action))
        if self.fault == "late" and action == "session.start":
            time.sleep(self.late_s)  # (the fake's own behaviour: a node that starts too slowly)
        elif point is not None and self.at_fault(point):
            if self.fault in ANSWERS:
                if action == "agent.cancel" and self.turn is not None and not self.keep_turn:
                    self.end_turn("cancelled")
                self.bad_answer(request_id, str(action))
                return
            if action == "agent.prompt":  # mid-turn: its answer, its first events, the frame
                self.prompt(request_id, payload)
            if self.fault == "bad_state" and action == "session.start":
                self.answer(request_id, {"session_id": self.current, "state": BAD_STATE})
                return
            self.bad_frame()
            return
        if action == "session.list":
            self.answer(request_id, {"sessions": []})
        elif action == "session.start":
            self.answer(request_id, {"session_id": self.current, "state": "ready"})
        elif action == "session.subscribe":
            self.answer(
                request_id,
                {"last_seq": self.seq, "gap": False, "prompt_carries": [], "modes": None},
            )
        elif action == "agent.prompt":
            self.prompt(request_id, payload)
        elif action == "agent.cancel":
            receipt = self.end_turn("cancelled")
            self.answer(request_id, {**receipt, "success": True})
        elif action == "session.stop":
            if self.turn is not None:
                self.end_turn("cancelled")
            self.answer(request_id, {"exit_code": 0})
            self.send(
                {
                    "event": "subscription.closed",
                    "session_id": self.current,
                    "seq": None,
                    "data": {"last_seq": self.seq},
                }
            )
            if self.fault == "late":
                raise SystemExit(0)
        else:
            self.send(
                {
                    "id": request_id,
                    "ok": False,
                    "error": {"code": "unknown_action", "message": f"not faked: {action}"},
                }
            )

    def prompt(self, request_id: object, payload: dict[str, Any]) -> None:
        self.turns += 1
        turn = self.running[self.current] = f"t{self.turns}"
        self.answer(request_id, {"turn_id": turn, "queued": False})
        stamp = {"session_id": self.current, "seq": 0, "timestamp": time.time()}
        self.event(ev.TurnStarted(turn_id=turn, text=str(payload.get("text")), **stamp))
        self.event(ev.MessageDelta(turn_id=turn, text="one ", **stamp))
        self.event(ev.MessageDelta(turn_id=turn, text="two ", **stamp))

    def end_turn(self, outcome: str) -> dict[str, Any]:
        turn = self.turn
        assert turn is not None
        receipt = receipt_to_wire(
            CancelReceipt(session_id=self.current, turn_id=turn, outcome=outcome, reason="user")
        )
        stamp = {"session_id": self.current, "seq": 0, "timestamp": time.time()}
        self.event(ev.TurnEnded(turn_id=turn, outcome=outcome, receipt=receipt, **stamp))
        self.running[self.current] = None
        return receipt

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        hello = Hello(version=package_version(), instance=INSTANCE, pid=os.getpid(), token="t")
        self.write(hello.line())
        if self.fault == "handshake":
            head = b""
            while b"\r\n\r\n" not in head:
                data = os.read(0, 65536)
                if not data:
                    return
                head += data
            self.write(b"\x00\x01 this is no HTTP \xff\r\n\r\n")
            os.read(0, 65536)  # until the front gives up
            return
        while True:
            data = os.read(0, 65536)
            if not data:
                return
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, Request):
                    self.write(self.ws.send(AcceptConnection()))
                    if self.at_fault("connect"):
                        self.bad_frame()
                elif isinstance(event, Ping):
                    self.write(self.ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self.write(self.ws.send(event.response()))
                    return
                elif isinstance(event, TextMessage | BytesMessage):
                    self.parts.append(event.data)
                    if event.message_finished:
                        text = "".join(str(p) for p in self.parts)
                        self.parts.clear()
                        self.on_request(json.loads(text))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="none")
    parser.add_argument("--at", default="connect", choices=POINTS)
    parser.add_argument("--once", type=Path)
    parser.add_argument("--armed", type=Path)
    parser.add_argument("--late-s", type=float, default=0.0)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--keep-turn", action="store_true")
    args, _ = parser.parse_known_args()  # the bridge's own command line follows "--"
    fault = args.fault
    if args.once is not None:
        if args.once.exists():
            fault = "none"
        else:
            args.once.touch()
    if args.armed is not None and not args.armed.exists():
        fault = "none"
    try:
        FakeNode(fault, args.at, args.late_s, args.log, args.keep_turn).run()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the front went away


if __name__ == "__main__":
    main()
