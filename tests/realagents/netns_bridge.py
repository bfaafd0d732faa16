"""``netns_bridge.py NETNS -- COMMAND...``: run an HTTP server in a network namespace and relay
it to a port of ours (standard library only: it is started as a script, as the agent's command).

``opencode serve`` announces where it listens; in a loopback-only namespace of the tests' own,
nothing outside could reach it, so the relay listens here and connects there.
"""

from __future__ import annotations

import os
import sys


def bridge(argv: list[str]) -> int:
    """``bridge NETNS -- COMMAND...``: run COMMAND in the network namespace NETNS (a path like
    ``/proc/PID/ns/net``) and relay the HTTP server it announces to a port of ours.

    The relay's listening socket is made before we enter the namespace, so it stays in ours
    (a socket belongs to the namespace it was created in); everything after, the command and
    the relay's connections to it, is in NETNS. The ``listening on`` line is rewritten to name
    the relay. Bytes are copied as they come, so the event stream is not held back.
    """
    import ctypes
    import re
    import socket
    import subprocess
    import threading

    netns_path, separator, *command = argv
    assert separator == "--" and command, "usage: bridge NETNS -- COMMAND..."
    relay = socket.create_server(("127.0.0.1", 0))
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns_path, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns {netns_path}")
    os.close(fd)
    child = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert child.stdout is not None

    def copy(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve(port: int) -> None:
        while True:
            incoming, _ = relay.accept()
            try:
                outgoing = socket.create_connection(("127.0.0.1", port))
            except OSError:
                incoming.close()
                continue
            for pair in ((incoming, outgoing), (outgoing, incoming)):
                threading.Thread(target=copy, args=pair, daemon=True).start()

    listening = re.compile(rb"listening on http://[^\s:/]+:(\d+)")
    relayed = False
    for line in child.stdout:
        match = listening.search(line)
        if match is not None and not relayed:
            relayed = True
            threading.Thread(target=serve, args=(int(match.group(1)),), daemon=True).start()
            ours = f"listening on http://127.0.0.1:{relay.getsockname()[1]}".encode()
            line = line[: match.start()] + ours + line[match.end() :]
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(bridge(sys.argv[1:]))
