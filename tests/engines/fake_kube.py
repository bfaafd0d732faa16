"""A fake Kubernetes API server: just what the real ``kubectl exec -i POD -- CMD...`` asks.

Point the real CLI at it with a kubeconfig of the test's own (:meth:`FakeKube.kubeconfig`:
``http://127.0.0.1:PORT``, no credentials). It implements, of the API (kubernetes.io/docs,
"Pod" and the ``exec`` subresource; the channel protocol of
``k8s.io/apimachinery/pkg/util/remotecommand`` and ``pkg/util/httpstream/wsstream``):

- ``GET /version``, ``/api``, ``/apis``, ``/api/v1``: the version and discovery documents
  kubectl reads first (one group, ``v1``, with ``pods`` and ``pods/exec``);
- ``GET /api/v1/namespaces/{ns}/pods/{name}``: the pod kubectl reads first (one container,
  ``main``, phase ``Running``; 404 ``NotFound`` Status for a pod it does not know);
- ``GET /api/v1/namespaces/{ns}/pods/{name}/exec?command=...&stdin=true&...`` upgraded to a
  WebSocket with the ``v5.channel.k8s.io`` subprotocol (what kubectl 1.30+ tries first and
  the only one it offers: v4 cannot close stdin; an older server gets SPDY): binary messages whose first byte is the channel, 0 stdin,
  1 stdout, 2 stderr, 3 the exit status (a ``Status`` JSON: ``Success``, or ``Failure`` with
  reason ``NonZeroExitCode`` and the code), and ``[255, N]`` closing stream N (the
  client closing stdin). The socket closes once the command has exited; pings are answered.

A "pod" is a name, an environment and a working directory on this machine; its commands run
as this user, each in a process group of its own, marked with ``FAKE_ENGINE_CONTAINER=POD@ENGINE``.
As on a real kubelet (kubernetes#89031), a client that goes away (``kubectl`` killed, its
connection dropped) does not kill the command: its stdin closes and it runs on.

Left out: SPDY (an exec request that is not a WebSocket upgrade gets 400, so kubectl's
fallback fails loudly instead of passing unnoticed), TTYs and resize (channel 4),
authentication, TLS, every other resource and verb (404, logged in :attr:`Engine.requests`),
containers other than ``main``, watch, and any isolation at all.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs

import wsproto
import wsproto.events as ws

from engines._engine import Engine, Exec, Reader, Request, response, runtime_error

__all__ = ["FakeKube", "start_fake_kube"]

PROTOCOLS: Final = ("v5.channel.k8s.io",)
CONTAINER: Final = "main"
_STDIN, _STDOUT, _STDERR, _STATUS, _CLOSE = 0, 1, 2, 3, 255


def _status(code: int, reason: str, message: str) -> bytes:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    phrase = {400: "Bad Request", 404: "Not Found"}[code]
    return response(f"{code} {phrase}", json.dumps(body).encode())


class FakeKube(Engine):
    def __init__(self, listener: socket.socket, pods: Mapping[str, Mapping[str, Any]]) -> None:
        #: name -> {"env": {...}, "workdir": "..."} (namespace ``default``)
        self.pods = dict(pods)
        super().__init__(listener)

    @property
    def url(self) -> str:
        host, port = self.listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig whose only context is this server (JSON is valid YAML)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": "default"},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    def handle(self, sock: socket.socket) -> None:
        reader = Reader(sock)
        while (request := reader.request()) is not None:
            self.log(request)
            parts = request.path.strip("/").split("/")
            if request.method == "GET" and request.path in _DISCOVERY:
                sock.sendall(response("200 OK", json.dumps(_DISCOVERY[request.path]).encode()))
                continue
            if parts[:3] != ["api", "v1", "namespaces"] or len(parts) not in (6, 7):
                sock.sendall(_status(404, "NotFound", f"the fake has no {request.path}"))
                continue
            namespace, kind, name = parts[3:6]
            pod = self.pods.get(name) if namespace == "default" and kind == "pods" else None
            if pod is None:
                sock.sendall(_status(404, "NotFound", f'pods "{name}" not found'))
            elif len(parts) == 6 and request.method == "GET":
                sock.sendall(response("200 OK", json.dumps(_pod(name, pod)).encode()))
            elif parts[6:] == ["exec"] and request.wants("upgrade", "websocket"):
                self._exec(sock, reader, request, name, pod)
                return
            elif parts[6:] == ["exec"]:
                sock.sendall(_status(400, "BadRequest", "the fake speaks WebSocket only, not SPDY"))
            else:
                sock.sendall(_status(404, "NotFound", f"the fake has no {request.path}"))

    def _exec(
        self, sock: socket.socket, reader: Reader, request: Request, name: str, pod: Any
    ) -> None:
        query = parse_qs(request.query)
        command = query.get("command", [])
        offered = [p.strip() for p in request.headers.get("sec-websocket-protocol", "").split(",")]
        chosen = next((p for p in PROTOCOLS if p in offered), None)
        if chosen is None or not command or query.get("tty") == ["true"]:
            sock.sendall(_status(400, "BadRequest", f"no command, a tty, or none of {PROTOCOLS}"))
            return
        connection = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        connection.receive_data(request.head + reader.buffer)
        lock = threading.Lock()

        def send(event: ws.Event) -> None:
            with lock:
                sock.sendall(connection.send(event))

        running: Exec | None = None
        try:
            for event in connection.events():
                if isinstance(event, ws.Request):
                    send(ws.AcceptConnection(subprotocol=chosen))
            running = self.run(command, dict(pod.get("env", {})), pod.get("workdir"), name)
        except OSError as exc:  # as the kubelet passes it on: runc's words, then exit 126
            send(ws.BytesMessage(bytes([_STDOUT]) + runtime_error(command, exc)))
            send(ws.BytesMessage(bytes([_STATUS]) + _failure(126, "")))
            send(ws.CloseConnection(code=1000))
            _linger(sock)
            return
        wanted = {
            _STDOUT: query.get("stdout") == ["true"],
            _STDERR: query.get("stderr") == ["true"],
        }

        def on_output(stream: int, data: bytes) -> None:
            if data and wanted[stream]:
                send(ws.BytesMessage(bytes([stream]) + data))

        running.start(on_output)
        receiver = threading.Thread(
            target=self._receive, args=(sock, connection, running, send), daemon=True
        )
        receiver.start()
        running.finished.wait()
        code = running.exit_code
        status = {"metadata": {}, "status": "Success"} if code == 0 else None
        try:
            payload = json.dumps(status).encode() if status else _failure(code, "")
            send(ws.BytesMessage(bytes([_STATUS]) + payload))
            send(ws.CloseConnection(code=1000))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the client went away; the command had run on regardless
        receiver.join(_LINGER_S)  # until the client's close (closing first resets the socket)
        running.detach()

    @staticmethod
    def _receive(sock: socket.socket, connection: Any, running: Exec, send: Any) -> None:
        """Client messages: stdin bytes, v5 stream closes, pings; a drop closes stdin."""
        try:
            while True:
                for event in connection.events():
                    if isinstance(event, ws.BytesMessage) and event.data:
                        data = bytes(event.data)
                        if data[0] == _STDIN:
                            running.write_stdin(data[1:])
                        elif data[0] == _CLOSE and data[1:2] == bytes([_STDIN]):
                            running.close_stdin()
                    elif isinstance(event, ws.Ping):
                        send(event.response())
                    elif isinstance(event, ws.CloseConnection):
                        running.detach()
                        return
                data = sock.recv(65536)
                if not data:
                    break
                connection.receive_data(data)
        except (OSError, wsproto.utilities.LocalProtocolError):
            pass
        running.detach()


#: How long a closing socket waits for the client's side of the close.
_LINGER_S: Final = 5.0


def _linger(sock: socket.socket) -> None:
    """Half-close, then read to the client's end: a socket closed with unread bytes (the
    client's close frame) sends a reset, and the client would report that instead."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(_LINGER_S)
        while sock.recv(65536):
            pass
    except OSError:
        pass


def _failure(code: int | None, message: str) -> bytes:
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": message or f"command terminated with non-zero exit code: exit code {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    ).encode()


#: What kubectl (and the gcloud kubectl dispatcher, which picks a kubectl by ``/version``)
#: reads before it looks up a pod: the version and the discovery documents.
_DISCOVERY: Final[dict[str, Any]] = {
    "/version": {
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-fake",
        "platform": "linux/amd64",
    },
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get"],
                "shortNames": ["po"],
            },
            {
                "name": "pods/exec",
                "singularName": "",
                "namespaced": True,
                "kind": "PodExecOptions",
                "verbs": ["create", "get"],
            },
        ],
    },
}


def _pod(name: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": CONTAINER, "image": "fake"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": CONTAINER, "ready": True, "state": {"running": {}}, "image": "fake"}
            ],
        },
    }


def start_fake_kube(pods: Mapping[str, Mapping[str, Any]]) -> FakeKube:
    """A fake API server on a free port of 127.0.0.1; ``pods``: name -> {"env": {...},
    "workdir": "..."}. :meth:`FakeKube.close` stops it and kills what its pods still run."""
    listener = socket.create_server(("127.0.0.1", 0))
    return FakeKube(listener, pods)
