"""Debugging aid: run an agent and log every line between it and the supervisor.

    python -S -E tee.py LOG_DIR -- CMD ARGS...

Appends to ``LOG_DIR/wire.log`` one line per message, ``>`` for what the supervisor wrote to the
agent's stdin and ``<`` for what the agent wrote to stdout, each with a monotonic timestamp.
stderr is passed through untouched. The tests use it when ``AGENT_TIER4_TEE=1``.
Stdlib only (it runs with ``-S``).
"""

import os
import subprocess
import sys
import threading
import time


def _pump(source, sink, log, lock, mark):  # type: ignore[no-untyped-def]
    for line in iter(source.readline, b""):
        with lock:
            try:
                stamp = b"%.3f %s " % (time.monotonic(), mark)
                log.write(stamp + (line if line.endswith(b"\n") else line + b"\n"))
                log.flush()
            except ValueError:  # the log closed: the agent is gone and we are exiting
                pass
        try:
            sink.write(line)
            sink.flush()
        except (BrokenPipeError, ValueError):
            break
    try:
        sink.close()
    except (BrokenPipeError, ValueError):
        pass


def main() -> None:
    log_dir, dashdash, *argv = sys.argv[1:]
    assert dashdash == "--" and argv, "usage: tee.py LOG_DIR -- CMD ARGS..."
    os.makedirs(log_dir, exist_ok=True)
    lock = threading.Lock()
    with open(os.path.join(log_dir, "wire.log"), "ab") as log:
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        pump_in = (sys.stdin.buffer, child.stdin, log, lock, b">")
        threading.Thread(target=_pump, args=pump_in, daemon=True).start()
        out = threading.Thread(
            target=_pump, args=(child.stdout, sys.stdout.buffer, log, lock, b"<")
        )
        out.start()
        code = child.wait()
        out.join(timeout=2)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
