"""A loopback-only network namespace shared by one test's agent and its fake model.

How it works (the design is explained in ``tests/realagents/__init__.py``):

1. :func:`open_namespace` starts a small *holder* process under ``unshare -n`` (as root) or
   ``unshare -rn`` (as a user, where user namespaces are allowed): ``python netns.py hold``.
2. The holder brings ``lo`` up with an ioctl (no dependency on ``ip``), creates a TCP socket
   listening on 127.0.0.1 *inside the namespace*, and passes it back to the test process over
   a Unix socket pair (SCM_RIGHTS). A socket belongs to the namespace it was created in, not to
   the process that holds it, so the test's in-process :class:`FakeModel` serves from it.
3. Agents are started with :meth:`Namespace.wrap`: ``nsenter --net=/proc/HOLDER/ns/net -- CMD``
   (``nsenter`` execs: the agent keeps nsenter's pid, under the supervisor's shim). Every
   respawn of the agent lands in the same namespace and finds the same port.
4. The holder exits when its end of the socket pair closes (the test ended, or died).

If no namespace can be made, :func:`open_namespace` returns ``None`` with the reason and the
agent runs in the host's network namespace against a model on the host's 127.0.0.1.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator

__all__ = ["Namespace", "open_namespace", "unavailable_reason"]

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_HOLD_TIMEOUT_S = 10.0


class Namespace:
    """A live holder process and the listening socket it made inside its namespace."""

    def __init__(
        self,
        holder: subprocess.Popen[bytes],
        control: socket.socket,
        listener: socket.socket,
        user: bool,
    ) -> None:
        self.holder = holder
        self.listener = listener
        self._control = control
        self.user = user  # a user namespace too (unshare -rn): nsenter must enter it first

    @property
    def path(self) -> str:
        return f"/proc/{self.holder.pid}/ns/net"

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        if self.user:
            return [
                "nsenter",
                "--preserve-credentials",
                "-t",
                str(self.holder.pid),
                "-U",
                "-n",
                "--",
                *argv,
            ]
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def close(self) -> None:
        self._control.close()  # the holder sees EOF and exits
        try:
            self.holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()


_reason: str | None = None


def unavailable_reason() -> str | None:
    """Why the last :func:`open_namespace` could not make a namespace (None if it could)."""
    return _reason


@contextlib.contextmanager
def open_namespace() -> Iterator[Namespace | None]:
    """A fresh loopback-only namespace for one test, or ``None`` (see :func:`unavailable_reason`)."""
    namespace = _start()
    try:
        yield namespace
    finally:
        if namespace is not None:
            namespace.listener.close()
            namespace.close()


#: ``auto`` (default): ``unshare -n`` as root, else ``unshare -rn``; ``root`` or ``user`` force
#: one of them; ``none`` runs the agents in the host's network namespace.
MODE_VARIABLE = "AGENT_TIER4_NETNS"


def _start() -> Namespace | None:
    global _reason
    mode = os.environ.get(MODE_VARIABLE, "auto")
    if mode == "none":
        _reason = f"{MODE_VARIABLE}=none"
        return None
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        _reason = "unshare or nsenter (util-linux) is not installed"
        return None
    attempts = []
    if mode == "root" or (mode == "auto" and os.geteuid() == 0):
        attempts.append((["unshare", "-n"], False))
    if mode in ("user", "auto"):
        attempts.append((["unshare", "-rn"], True))
    errors = []
    for prefix, user in attempts:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            holder = subprocess.Popen(
                [
                    *prefix,
                    "--",
                    sys.executable,
                    "-S",
                    "-E",
                    os.path.abspath(__file__),
                    "hold",
                    str(theirs.fileno()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        ours.settimeout(_HOLD_TIMEOUT_S)
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        except OSError as exc:
            fds = []
            errors.append(f"{' '.join(prefix)}: {exc}")
        if fds:
            ours.settimeout(None)
            listener = socket.socket(fileno=fds[0])
            _reason = None
            return Namespace(holder, ours, listener, user)
        ours.close()
        try:
            _, err = holder.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            holder.kill()
            _, err = holder.communicate()
        errors.append(
            f"{' '.join(prefix)}: {err.decode(errors='replace').strip() or holder.returncode}"
        )
    _reason = "cannot make a network namespace: " + "; ".join(errors)
    return None


# -- the holder (runs inside the namespace) ----------------------------------------------------


def _bring_lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _hold(control_fd: int) -> None:
    control = socket.socket(fileno=control_fd)
    _bring_lo_up()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    control.sendmsg(
        [b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [listener.fileno()]))]
    )
    listener.close()
    while control.recv(64):  # until the test closes its end
        pass


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "hold":
        _hold(int(sys.argv[2]))
    else:
        sys.exit("usage: netns.py hold FD")
