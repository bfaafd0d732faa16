"""An agent that is a local HTTP server (``opencode serve``), as a link.

The process runs under the containment shim like every agent (``ProcessLink``); what differs is
how we talk to it. ``run()`` owns these tasks, all in one nursery:

- *stderr*, as for every agent (a bounded tail, each line posted);
- *stdout*: lines up to ``listening on http://HOST:PORT`` (the URL is parsed from it; the
  server is never polled), and every later line, are posted like stderr lines;
- the *event stream*: ``GET /event`` (server-sent events) is opened before anything is sent, and
  once it delivers its first event ``{"transport": "ready", "url": ...}`` is posted, then every
  event as ``{"sse": event}``. The protocol machine sends nothing before ``ready``, so no event
  of ours can be missed (OpenCode edge case 24);
- *authentication*: the process was started with a secret of its own as its server password
  (``AgentProtocol.environment``; OpenCode's ``OPENCODE_SERVER_PASSWORD``), and every request,
  the event stream too, carries it as HTTP basic auth. Nothing else on the machine can drive
  the server; the secret is in no event, log line or receipt;
- *requests*: ``send()`` queues ``{"http": {"id", "method", "path", "json"?}}`` envelopes
  without blocking the actor; a worker runs them concurrently (an abort never waits behind a
  slow permission reply) and posts each answer as ``{"http_response": {"id", "status", "json",
  ...}}``. A request that gets no answer is answered ``status: 0`` with an ``error`` text.

The event stream is the only way a turn ends, so a stream that ends while the server runs makes
the server useless: its tree is killed and the exit reported. When the process exits,
:class:`AgentGone` is posted exactly once, after the stream and the stderr pipe had
``EXIT_DRAIN_S`` to deliver their last words and every other task was stopped: nothing follows
it. Whatever happens, ``run()`` returns with no process of the tree alive.

Frames from the stream decode like agent stdout lines (``protocols.framing``): bad JSON becomes
a ``FramingError`` frame (an ``error`` event), an oversize event is dropped with bounded memory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import signal
from collections.abc import Awaitable
from typing import Any

import httpx
import trio

from protocols.framing import (
    EXCERPT_CHARS,
    MAX_LINE_BYTES,
    Frame,
    FramingError,
    Message,
    decode_line,
    too_deep,
)
from protocols.opencode import SERVER_USERNAME
from supervisor.agents.link import AgentFrame, Inbox
from supervisor.agents.process import AgentProcess, KillError
from supervisor.agents.process_link import LINK_TYPES, STDERR_LINE_CHARS, ProcessLink
from supervisor.config import AgentSpec
from supervisor.core.exit import ExitStatus

__all__ = ["HttpLink", "SseDecoder"]

log = logging.getLogger(__name__)

#: ``opencode server listening on http://127.0.0.1:4096`` (opencode 1.18.33 prints it on stdout
#: once it accepts connections; before it, a warning if no server password is set).
_LISTENING = re.compile(rb"listening on (https?://[^\s\"'<>]+)")
_READ_SIZE = 65536
#: A connection to a server on the loopback interface takes well under a millisecond; this only
#: bounds a server that accepts nothing (then the request is answered ``status: 0``).
CONNECT_TIMEOUT_S = 5.0
#: Whole request. Measured against opencode 1.18.33 on 2 cores: ``POST /session`` 20-90 ms,
#: ``prompt_async`` 17-220 ms (longest while it still loads plugins), the first ``abort`` up to
#: 530 ms, later ones 5-30 ms. Nothing here waits on a request (a cancel races the grace timer,
#: not the abort's answer), so this only has to be long enough not to cut a slow answer short.
REQUEST_TIMEOUT_S = 30.0
#: Requests in flight at once; the machine has at most a handful outstanding (a prompt, an
#: abort, a few permission replies).
MAX_CONCURRENT_REQUESTS = 8
#: The largest response body kept; OpenCode's answers are session records of a few hundred
#: bytes. Same bound as an agent's stdout line.
MAX_RESPONSE_BYTES = MAX_LINE_BYTES
#: Body text quoted when a response is not JSON.
_TEXT_EXCERPT = 2000
#: After the process exited: how long the event stream and stderr get to deliver what the
#: server said before it died (both end within milliseconds of the exit).
EXIT_DRAIN_S = 1.0
#: Closing the HTTP client after the server is gone.
_CLIENT_CLOSE_S = 1.0


class SseDecoder:
    """``text/event-stream`` (WHATWG HTML, server-sent events) as frames, without I/O.

    The ``data:`` lines of one event, joined by newlines, decode as one JSON object exactly as
    an agent's stdout line does: ``Message``, or a ``FramingError`` (``invalid_utf8``,
    ``invalid_json``, ``not_an_object``). An event over ``max_event_bytes`` is dropped and
    reported once as ``oversize``; memory stays within ``max_event_bytes`` plus one line's
    excerpt. Comments and the ``event``, ``id`` and ``retry`` fields are ignored (the event's
    JSON carries its own ``type`` and ``id``). Lines end with LF or CRLF.
    """

    def __init__(self, max_event_bytes: int = MAX_LINE_BYTES) -> None:
        if max_event_bytes < 1:
            raise ValueError(f"max_event_bytes must be positive, got {max_event_bytes}")
        self._max = max_event_bytes
        self._line = bytearray()
        self._data = bytearray()
        self._has_data = False
        #: the rest of the current line is counted, not kept (it made the event oversize)
        self._skipping_line = False
        #: bytes of the current event dropped, or None while it is within bounds
        self._dropped: int | None = None
        self._head = b""

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the event in progress, so tests can check the memory bound."""
        return len(self._line) + len(self._data) + len(self._head)

    def feed(self, chunk: bytes) -> list[Frame]:
        """Take the next chunk of the stream; return the events it completed, in order."""
        frames: list[Frame] = []
        start = 0
        newline = chunk.find(b"\n")
        while newline != -1:
            self._hold(chunk[start:newline])
            frame = self._end_of_line()
            if frame is not None:
                frames.append(frame)
            start = newline + 1
            newline = chunk.find(b"\n", start)
        self._hold(chunk[start:])
        return frames

    def _hold(self, piece: bytes) -> None:
        if self._skipping_line:
            assert self._dropped is not None
            self._dropped += len(piece)
            return
        self._line += piece
        if len(self._line) + len(self._data) > self._max + len(b"data: \r"):
            self._drop()
            self._skipping_line = True

    def _drop(self) -> None:
        """The event is over the bound: keep an excerpt and a count, nothing else."""
        if self._dropped is None:
            self._head = bytes((self._data or self._line)[: 4 * EXCERPT_CHARS])
            self._dropped = 0
        self._dropped += len(self._data) + len(self._line)
        self._data.clear()
        self._line.clear()
        self._has_data = False

    def _end_of_line(self) -> Frame | None:
        if self._skipping_line:
            self._skipping_line = False  # a long line is never the blank one
            return None
        line = bytes(self._line)
        self._line.clear()
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            return self._dispatch()
        if line.startswith(b":"):
            return None  # a comment (a keep-alive)
        name, _, value = line.partition(b":")
        if name != b"data":
            return None
        if self._dropped is not None:
            self._dropped += len(line)
            return None
        if value.startswith(b" "):
            value = value[1:]
        if self._has_data:
            self._data += b"\n"
        self._data += value
        self._has_data = True
        if len(self._data) > self._max:
            self._drop()
        return None

    def _dispatch(self) -> Frame | None:
        if self._dropped is not None:
            size, head = self._dropped, self._head
            self._dropped, self._head = None, b""
            return FramingError(
                kind="oversize",
                detail=f"event over {self._max} bytes",
                excerpt=_excerpt(head),
                size=size,
            )
        if not self._has_data:
            return None
        data = bytes(self._data)
        self._data.clear()
        self._has_data = False
        return _decode(data)


def _excerpt(data: bytes) -> str:
    return data[: 4 * EXCERPT_CHARS].decode("utf-8", errors="replace")[:EXCERPT_CHARS]


def _decode(data: bytes) -> Frame:
    """An event's data, judged as an agent's stdout line is (the same kinds of error)."""
    frame = decode_line(data, max_line_bytes=len(data))
    if frame is None:  # only blanks
        return FramingError(
            kind="invalid_json",
            detail="event data is blank",
            excerpt=_excerpt(data),
            size=len(data),
        )
    return frame


class HttpLink(ProcessLink):
    """An agent process that serves HTTP; messages are request/response envelopes and events."""

    def __init__(
        self,
        process: AgentProcess,
        spec: AgentSpec,
        generation: int,
        inbox: Inbox,
        *,
        secret: str | None = None,
    ) -> None:
        super().__init__(process, spec, generation, inbox, secret=secret)
        self._requests_send, self._requests = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._stdout_pending = bytearray()
        self._stream_done = trio.Event()
        self._closing = False
        #: the server's base URL, once it said where it listens
        self.url: str | None = None

    # -- AgentLink -----------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._requests_send.send_nowait(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # closing: the agent is going away and AgentGone will say so

    async def close(self, timeout: float) -> tuple[ExitStatus | None, list[str]]:
        # A server ignores stdin EOF; SIGTERM is its polite request (the shim forwards it).
        self._closing = True
        self._requests_send.close()
        self.signal(signal.SIGTERM)
        with trio.move_on_after(timeout):
            status = await self.process.wait()
            await self.process.aclose()
            return status, self.process.exit_steps
        steps = await self.process.kill_tree(self._spec.kill_timeout_s)
        return self.process.returncode, steps

    # -- tasks -----------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as tasks:
                tasks.start_soon(self.read_stderr)
                tasks.start_soon(self._serve)
                status = await self.process.wait()
                with trio.move_on_after(EXIT_DRAIN_S):
                    await self._stream_done.wait()
                    await self._stderr_done.wait()
                tasks.cancel_scope.cancel()
            await self._inbox.send(self.gone(status))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the session is gone
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(KillError):
                await self.process.aclose()  # survivors are reported by whoever killed

    async def _serve(self) -> None:
        """Every task but stderr; each one swallows a closed inbox (the session is gone)."""
        try:
            client = await self._connect()
            if client is None:
                return  # no usable server: the process is going, run() reports it
            try:
                async with trio.open_nursery() as tasks:
                    tasks.start_soon(self._forward_stdout)
                    tasks.start_soon(self._run_requests, client)
                    try:
                        await self._read_events(client)
                    finally:
                        self._stream_done.set()
                    if self.process.returncode is None and not self._closing:
                        await self._quietly(
                            self._note("the event stream ended while the server runs: killing it")
                        )
                        await self._kill_quietly()
                    await trio.sleep_forever()  # until run() has reported the exit
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLIENT_CLOSE_S):
                    await client.aclose()
        finally:
            self._stream_done.set()

    async def _connect(self) -> httpx.AsyncClient | None:
        try:
            url = await self._await_listening()
            if url is None:
                return None  # stdout closed first
            self.url = url
            return httpx.AsyncClient(
                base_url=url,
                # The server's password (AgentProtocol.environment), on every request.
                auth=httpx.BasicAuth(SERVER_USERNAME, self._secret) if self._secret else None,
                timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                limits=httpx.Limits(max_connections=MAX_CONCURRENT_REQUESTS + 1),
                trust_env=False,  # never through a proxy from the environment
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None  # the session is gone
        except (httpx.InvalidURL, ValueError) as exc:
            await self._quietly(self._note(f"cannot use the server's address: {exc}: killing it"))
        await self._kill_quietly()
        return None

    async def _kill_quietly(self) -> None:
        """The ladder from a pump: survivors are reported with the exit, not raised here."""
        with contextlib.suppress(KillError):
            await self.process.kill_tree(self._spec.kill_timeout_s)

    async def _quietly(self, posting: Awaitable[None]) -> None:
        """Post to the inbox, unless the session is gone."""
        try:
            await posting
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _await_listening(self) -> str | None:
        while True:
            line = await self._stdout_line()
            if line is None:
                return None
            await self._stderr_lines([line])
            match = _LISTENING.search(line)
            if match is not None:
                return match.group(1).decode("ascii", errors="replace").rstrip(".,;")

    async def _forward_stdout(self) -> None:
        while (line := await self._stdout_line()) is not None:
            await self._quietly(self._stderr_lines([line]))

    async def _stdout_line(self) -> bytes | None:
        """The next line of stdout (a line over the stderr bound comes in pieces); None at EOF."""
        pending = self._stdout_pending
        while True:
            newline = pending.find(b"\n")
            if newline != -1:
                line = bytes(pending[:newline])
                del pending[: newline + 1]
                return line
            if len(pending) > STDERR_LINE_CHARS * 4:
                line = bytes(pending)
                pending.clear()
                return line
            try:
                data = await self.process.stdout.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                if pending:
                    line = bytes(pending)
                    pending.clear()
                    return line
                return None
            pending += data

    async def _note(self, text: str) -> None:
        """A line of our own among the agent's stderr lines (and in its tail)."""
        log.warning("agent %s: %s", self.process.pid, text)
        await self._stderr_lines([f"agent-supervisor: {text}".encode()])

    async def _read_events(self, client: httpx.AsyncClient) -> None:
        decoder = SseDecoder()
        ready = False
        try:
            async with client.stream(
                "GET",
                "/event",
                # No compression: it would hold events back until a block fills.
                headers={"Accept": "text/event-stream", "Accept-Encoding": "identity"},
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            ) as response:
                if response.status_code != 200:
                    await self._note(f"GET /event answered HTTP {response.status_code}")
                    return
                async for chunk in response.aiter_bytes():
                    for frame in decoder.feed(chunk):
                        if not ready:
                            # The subscription is live: the first event proves it.
                            ready = True
                            await self._post({"transport": "ready", "url": self.url})
                        if isinstance(frame, Message):
                            frame = Message({"sse": frame.payload})
                        await self.post_output(AgentFrame(self.generation, frame), self._inbox)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the session is gone
        except httpx.HTTPError as exc:
            if self.process.returncode is None and not self._closing:
                await self._quietly(self._note(f"event stream failed: {_describe(exc)}"))

    async def _post(self, payload: dict[str, Any]) -> None:
        await self._inbox.send(AgentFrame(self.generation, Message(payload)))

    async def _run_requests(self, client: httpx.AsyncClient) -> None:
        limiter = trio.CapacityLimiter(MAX_CONCURRENT_REQUESTS)
        async with trio.open_nursery() as running, self._requests:
            async for envelope in self._requests:
                running.start_soon(self._execute, client, limiter, envelope)

    async def _execute(
        self, client: httpx.AsyncClient, limiter: trio.CapacityLimiter, envelope: dict[str, Any]
    ) -> None:
        request = envelope.get("http")
        request_id = request.get("id") if isinstance(request, dict) else None
        if (
            not isinstance(request, dict)
            or not isinstance(request.get("method"), str)
            or not isinstance(request.get("path"), str)
            or not request["path"].startswith("/")
        ):
            answer = {"id": request_id, "status": 0, "json": None, "error": "malformed request"}
            await self._quietly(self._post({"http_response": answer}))
            return
        options: dict[str, Any] = {}
        if "json" in request:
            options["json"] = request["json"]
        try:
            async with (
                limiter,
                client.stream(request["method"], request["path"], **options) as response,
            ):
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE_BYTES:
                        raise _TooLarge(f"response over {MAX_RESPONSE_BYTES} bytes")
            answer = {"id": request_id, "status": response.status_code, **_body(bytes(body))}
        except Exception as exc:  # noqa: BLE001 (any failure is an answer: "no response")
            # httpx errors, a body httpx cannot encode, a path it cannot parse, a huge answer
            answer = {"id": request_id, "status": 0, "json": None, "error": _describe(exc)}
        await self._quietly(self._post({"http_response": answer}))


class _TooLarge(Exception):
    pass


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _body(data: bytes) -> dict[str, Any]:
    if not data.strip():
        return {"json": None}
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        body = _NOT_JSON
    if body is _NOT_JSON or too_deep(data, body) is not None:  # too deep: as the stdio door
        return {"json": None, "text": data[:_TEXT_EXCERPT].decode("utf-8", errors="replace")}
    return {"json": body}


_NOT_JSON: Any = object()


LINK_TYPES["http"] = HttpLink
