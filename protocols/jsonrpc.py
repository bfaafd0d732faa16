"""JSON-RPC 2.0 bookkeeping for one connection, without I/O.

Both sides of an agent connection send requests: we ask the agent to ``session/prompt``, the
agent asks us to ``session/request_permission``. The two id spaces are independent (the agent
numbers its own requests from 0 just like we do), so a response is only ever matched against
*our* pending table, and an incoming request's id is only ever used to answer it. Codex's
app-server speaks the same shape without the ``"jsonrpc"`` member; ``with_version=False``
covers it.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from attrs import define, field, frozen

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "REQUEST_CANCELLED",
    "RESOURCE_NOT_FOUND",
    "Incoming",
    "IncomingNotification",
    "IncomingRequest",
    "IncomingResponse",
    "InvalidMessage",
    "JsonRpcPeer",
    "RequestId",
    "RpcError",
    "UnknownResponse",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: ACP's "Resource not found": a session (or file) a request names that is not there.
RESOURCE_NOT_FOUND = -32002
#: ACP's ``$/cancel_request`` answer ("Request cancelled"), from LSP.
REQUEST_CANCELLED = -32800

RequestId = int | str
C = TypeVar("C")


@frozen
class RpcError:
    code: int
    message: str
    data: Any = None

    def describe(self) -> str:
        return f"{self.message} (code {self.code})"


@frozen
class IncomingRequest:
    """The peer asks us something; answer with :meth:`JsonRpcPeer.respond`."""

    id: RequestId
    method: str
    params: Any


@frozen
class IncomingNotification:
    method: str
    params: Any


@define  # made on a cancel's cold path: see protocols.events.quick_constructor
class IncomingResponse(Generic[C]):
    """The answer to one of our requests, with the context we attached when sending it."""

    id: RequestId
    method: str
    context: C
    result: Any = None
    error: RpcError | None = None


@frozen
class UnknownResponse:
    """A response to an id we never sent or already had answered (a stray or duplicate)."""

    id: Any
    raw: dict[str, Any]


@frozen
class InvalidMessage:
    """Not a request, notification or response: the caller decides how loud to be."""

    reason: str
    raw: dict[str, Any]


Incoming = (
    IncomingRequest
    | IncomingNotification
    | IncomingResponse[Any]
    | UnknownResponse
    | InvalidMessage
)


@frozen
class _Pending(Generic[C]):
    method: str
    context: C


@define
class JsonRpcPeer(Generic[C]):
    """Our end of a JSON-RPC connection: numbers our requests and matches their answers."""

    with_version: bool = True
    _next_id: int = 0
    _pending: dict[RequestId, _Pending[C]] = field(factory=dict)

    def _envelope(self) -> dict[str, Any]:
        return {"jsonrpc": "2.0"} if self.with_version else {}

    def request(self, method: str, params: Any, context: C) -> tuple[int, dict[str, Any]]:
        """Build a request; ``context`` comes back on its :class:`IncomingResponse`."""
        request_id = self._next_id
        self._next_id += 1
        self._pending[request_id] = _Pending(method, context)
        message = self._envelope()
        message.update(id=request_id, method=method)
        if params is not None:
            message["params"] = params
        return request_id, message

    def notify(self, method: str, params: Any = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0"} if self.with_version else {}  # (_envelope)
        message["method"] = method
        if params is not None:
            message["params"] = params
        return message

    def respond(self, request_id: RequestId, result: Any) -> dict[str, Any]:
        message = self._envelope()
        message.update(id=request_id, result=result)
        return message

    def respond_error(
        self, request_id: RequestId | None, code: int, message: str, data: Any = None
    ) -> dict[str, Any]:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        envelope = self._envelope()
        envelope.update(id=request_id, error=error)
        return envelope

    def is_pending(self, request_id: RequestId) -> bool:
        return request_id in self._pending

    def forget(self, request_id: RequestId) -> None:
        """Stop waiting for an answer: a late one will then be an :class:`UnknownResponse`."""
        self._pending.pop(request_id, None)

    def receive(self, message: dict[str, Any]) -> Incoming:
        """Classify one decoded message from the peer."""
        if self.with_version and message.get("jsonrpc") != "2.0":
            return InvalidMessage("missing or wrong 'jsonrpc' member", message)
        method = message.get("method")
        has_id = "id" in message
        if method is not None:
            if not isinstance(method, str):
                return InvalidMessage("'method' is not a string", message)
            params = message.get("params")
            if has_id:
                request_id = message["id"]
                if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
                    return InvalidMessage("request id is not a string or integer", message)
                return IncomingRequest(request_id, method, params)
            return IncomingNotification(method, params)
        if not has_id or ("result" not in message and "error" not in message):
            return InvalidMessage("neither a request, a notification nor a response", message)
        response_id = message["id"]
        if isinstance(response_id, bool) or not isinstance(response_id, (int, str)):
            return UnknownResponse(response_id, message)
        pending = self._pending.pop(response_id, None)
        if pending is None:
            return UnknownResponse(response_id, message)
        raw_error = message.get("error")
        if raw_error is not None:
            return IncomingResponse(
                response_id, pending.method, pending.context, error=_parse_error(raw_error)
            )
        return IncomingResponse(
            response_id, pending.method, pending.context, result=message.get("result")
        )


def _parse_error(raw: Any) -> RpcError:
    if isinstance(raw, dict):
        code = raw.get("code")
        text = raw.get("message")
        return RpcError(
            code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
            text if isinstance(text, str) else repr(raw),
            raw.get("data"),
        )
    return RpcError(INTERNAL_ERROR, repr(raw))
