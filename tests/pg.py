"""A throwaway PostgreSQL cluster for the store tests: Debian's PostgreSQL 15, our own initdb.

``start_postgresql()`` (as a session-scoped fixture: ``postgresql``) makes a cluster in a fresh
temporary directory and runs ``postgres`` on a Unix socket in that directory and on a free port
of 127.0.0.1, with fsync off (nothing here must survive a power cut). The superuser logs in
over the socket without a password (``trust``) and over TCP with a password (``scram``), so a
test can give bad credentials. PostgreSQL refuses to run as root: as root, the cluster belongs
to Debian's ``postgres`` user. The server is started through ``setpriv --pdeathsig SIGQUIT``: if
pytest itself dies, the postmaster gets an immediate shutdown instead of outliving it.
Teardown shuts it down immediately, kills any backend left, and removes the directory.

``PostgresServer.database()`` gives each test a store of its own (a schema of the ``postgres``
database); ``stop()``/``start()`` restart the same cluster on the same port.

Where this cannot be done (no PostgreSQL 15: ``scripts/ensure-postgresql.sh`` installs it),
the tests skip with the reason; ``AGENT_SUPERVISOR_STRICT_SKIPS=1`` makes that a failure.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import attrs
import psutil
import pytest

from helpers import skip_or_fail

BIN = Path("/usr/lib/postgresql/15/bin")
#: The unprivileged account the cluster runs as when the tests run as root.
SERVER_USER = "postgres"
#: The cluster's superuser (the role the tests and the backend connect as).
ROLE = "asup"
#: Bounds initdb, and the server's start and stop (both take well under a second here).
START_BOUND_S = 30.0
STOP_BOUND_S = 10.0
#: What the server runs with: fsync and friends off (a test cluster need not survive a crash of
#: the machine, and fsync is most of a commit's cost; synchronous_commit off is a server's
#: setting the backend must override for itself); small shared memory (several workers of a
#: parallel run each start one); no logging collector (its log is the server's stderr).
SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "50",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


#: The servers this process started, by their postmasters' pids: a server's processes (the
#: postmaster and its children) are below the test process too, and never an agent's
#: (``tests/faults/harness.py`` counts an agent's tree below the test process).
SERVER_PIDS: set[int] = set()


def why_not() -> str | None:
    if not (BIN / "initdb").exists() or not (BIN / "postgres").exists():
        return f"PostgreSQL 15 is not installed in {BIN} (scripts/ensure-postgresql.sh installs it)"
    if shutil.which("setpriv") is None:
        return "no setpriv (util-linux) to start postgres"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} user to run postgres as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@attrs.define
class PostgresServer:
    directory: Path
    port: int
    password: str
    #: ``setpriv`` arguments that run a command as the server's user (empty when not root)
    as_user: list[str]
    process: subprocess.Popen[bytes] | None = None
    #: seconds from nothing to a server that accepts connections (initdb included)
    start_time: float = 0.0

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "postgres.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def url(self, database: str = "postgres") -> str:
        """Over the Unix socket, no password."""
        return f"postgresql://{ROLE}@/{database}?host={quote(str(self.directory))}&port={self.port}"

    def tcp_url(self, database: str = "postgres", password: str | None = None) -> str:
        """Over 127.0.0.1 with the password (or another one, to be refused)."""
        secret = quote(self.password if password is None else password, safe="")
        return f"postgresql://{ROLE}:{secret}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """An empty store of its own: a new schema, first in the URL's search_path (a few
        milliseconds; a new database takes a few hundred)."""
        import psycopg

        name = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE SCHEMA "{name}"')
        return f"{self.url()}&options=-csearch_path%3D{name}"

    def start(self) -> None:
        """Start the server (again). From the main thread only: the server's parent-death
        signal follows the thread that started it, and a worker thread that ends (trio's
        idle ones do) would take the server with it."""
        assert threading.current_thread() is threading.main_thread()
        assert not self.running
        options = [arg for key, value in SETTINGS.items() for arg in ("-c", f"{key}={value}")]
        log = open(self.log, "ab")  # noqa: SIM115 (the server's lifetime; the child holds it)
        try:
            self.process = subprocess.Popen(
                [
                    "setpriv",
                    "--pdeathsig",
                    "SIGQUIT",
                    *self.as_user,
                    str(BIN / "postgres"),
                    "-D",
                    str(self.data),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"port={self.port}",
                    "-c",
                    f"unix_socket_directories={self.directory}",
                    *options,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        SERVER_PIDS.add(self.process.pid)
        self._wait_ready()

    def _wait_ready(self) -> None:
        """postgres writes "ready" as the status line of its pid file once it accepts
        connections; pg_ctl waits on the same line."""
        assert self.process is not None
        pid_file = self.data / "postmaster.pid"
        deadline = time.monotonic() + START_BOUND_S
        while True:
            if self.process.poll() is not None:
                pytest.fail(
                    f"postgres exited ({self.process.returncode}):"
                    f" {self.log.read_text(errors='replace')[-2000:]}"
                )
            try:
                lines = pid_file.read_text().splitlines()
            except FileNotFoundError:
                lines = []
            if len(lines) >= 8 and lines[7].strip() == "ready":
                return
            if time.monotonic() > deadline:
                pytest.fail(f"postgres was not ready in {START_BOUND_S} s")
            time.sleep(0.005)  # a file that changes: nothing to wait on but the file

    def stop(self, *, immediate: bool = False) -> None:
        """Fast shutdown (SIGINT: sessions are ended, a clean checkpoint), or immediate
        (SIGQUIT: as if the server crashed; it recovers from its WAL at the next start)."""
        process = self.process
        if process is None or not self.running:
            return
        try:
            children = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        process.send_signal(signal.SIGQUIT if immediate else signal.SIGINT)
        try:
            process.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # The postmaster ends its backends before it exits; any left is killed.
        _, alive = psutil.wait_procs(children, timeout=STOP_BOUND_S)
        for child in alive:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def start_postgresql() -> Iterator[PostgresServer]:
    reason = why_not()
    if reason is not None:
        skip_or_fail(reason)
    begun = time.monotonic()
    # Not under pytest's basetemp: that is private to root, and the server's user must reach
    # its directory. /tmp keeps the socket's path short (a Unix socket's path has ~100 bytes).
    directory = Path(tempfile.mkdtemp(prefix="asup-pg-"))
    server: PostgresServer | None = None
    try:
        as_user: list[str] = []
        password = secrets.token_hex(16)
        password_file = directory / "password"
        password_file.write_text(password + "\n")
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SERVER_USER)
            for path in (directory, password_file):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            as_user = [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
        made = subprocess.run(
            [
                "setpriv",
                *as_user,
                str(BIN / "initdb"),
                "-D",
                str(directory / "data"),
                "-U",
                ROLE,
                f"--pwfile={password_file}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            timeout=START_BOUND_S,
        )
        password_file.unlink()
        if made.returncode != 0:
            pytest.fail(f"initdb failed ({made.returncode}): {made.stdout}{made.stderr}")
        server = PostgresServer(
            directory=directory, port=_free_port(), password=password, as_user=as_user
        )
        server.start()
        server.start_time = time.monotonic() - begun
        yield server
    finally:
        if server is not None:
            server.stop(immediate=True)
        shutil.rmtree(directory, ignore_errors=True)
