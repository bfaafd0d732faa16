"""A real OpenSSH server on 127.0.0.1 for the remote-host tests, and a throwaway user on it.

``start_ssh_host()`` (as a module-scoped fixture: ``ssh_host``) starts Debian's ``sshd`` on a
free port of 127.0.0.1 with a host key made for it, creates a non-root user (``asup`` + hex)
that logs in with a key made for it (no password, key auth only), and gives the ``transport``
argv that runs a command there as that user, checking the host key against a known_hosts
file of its own. The user runs this checkout's Python by absolute path (the venv's), which the
repository's permissions let any user read. Teardown kills whatever the user still runs (it is
ours: the node, agents a failed test left) and removes the user.

Where this cannot be done (not root, no sshd: ``scripts/ensure-openssh.sh`` installs it), the
tests skip with the reason; ``AGENT_SUPERVISOR_STRICT_SKIPS=1`` makes that a failure.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import psutil
import pytest

from helpers import skip_or_fail

SSHD = "/usr/sbin/sshd"
#: Bounds the server's start and the first login.
START_BOUND_S = 20.0


@attrs.frozen
class SshHost:
    user: str
    uid: int
    home: Path
    port: int
    key: Path
    known_hosts: Path
    python: str
    #: ``["ssh", ..., "user@127.0.0.1", "--"]``: runs a command on the host as the user
    transport: list[str]
    #: the listening sshd (a test stops it to make the host unreachable)
    sshd_pid: int
    directory: Path

    def with_option(self, option: str) -> list[str]:
        """The transport with one more ``-o`` option (it wins over the ones after it)."""
        return [self.transport[0], "-o", option, *self.transport[1:]]

    def node_command(self) -> list[str]:
        """agent-supervisor on the host: this checkout's, by absolute path."""
        return [self.python, "-m", "supervisor"]

    def run(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        import shlex

        return subprocess.run(
            [*self.transport, " ".join(shlex.quote(c) for c in command)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def processes(self) -> list[psutil.Process]:
        """Every process the user runs now (not the dead ones waiting to be reaped)."""
        found = []
        for process in psutil.process_iter(["uids", "status"]):
            uids = process.info["uids"]
            if (
                uids is not None
                and uids.real == self.uid
                and process.info["status"] != psutil.STATUS_ZOMBIE
            ):
                found.append(process)
        return found


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "the sshd tests need root (to start sshd and create a throwaway user)"
    if (
        not os.path.exists(SSHD)
        or shutil.which("ssh") is None
        or shutil.which("ssh-keygen") is None
    ):
        return "OpenSSH is not installed (scripts/ensure-openssh.sh installs it as root)"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "no useradd/userdel to make a throwaway user"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "agent-supervisor-test", "-f", path],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def start_ssh_host(directory: Path) -> Iterator[SshHost]:
    reason = why_not()
    if reason is not None:
        skip_or_fail(reason)
    user = f"asup{secrets.token_hex(4)}"
    subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/sh", user], check=True, capture_output=True
    )
    sshd: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(["usermod", "-p", "*", user], check=True)  # not locked; no password
        entry = pwd.getpwnam(user)
        home = Path(entry.pw_dir)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        client_key = directory / "client_key"
        (ssh_dir / "authorized_keys").write_text(_keygen(client_key) + "\n")
        os.chmod(ssh_dir / "authorized_keys", 0o600)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        host_key = directory / "host_key"
        host_public = _keygen(host_key)
        port = _free_port()
        known_hosts = directory / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_public}\n")
        config = directory / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"PidFile {directory / 'sshd.pid'}",
                    f"AllowUsers {user}",
                    "AuthorizedKeysFile .ssh/authorized_keys",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin no",
                    "UsePAM no",
                    "StrictModes yes",
                    "X11Forwarding no",
                    "AllowTcpForwarding no",
                    "PrintMotd no",
                    "MaxStartups 50",
                    "MaxSessions 50",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege-separation directory
        log = open(directory / "sshd.log", "wb")  # noqa: SIM115 (the server's lifetime)
        sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=log)
        transport = [
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            str(port),
            "-i",
            str(client_key),
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            f"{user}@127.0.0.1",
            "--",
        ]
        host = SshHost(
            user=user,
            uid=entry.pw_uid,
            home=home,
            port=port,
            key=client_key,
            known_hosts=known_hosts,
            python=sys.executable,
            transport=transport,
            sshd_pid=sshd.pid,
            directory=directory,
        )
        _wait_for_login(host, sshd, directory)
        yield attrs.evolve(host, python=_python_for(host))
    finally:
        _cleanup(user, sshd)


def _wait_for_login(host: SshHost, sshd: subprocess.Popen[bytes], directory: Path) -> None:
    """The server listens (its port accepts), then one login runs this checkout's Python."""
    deadline = time.monotonic() + START_BOUND_S
    while True:
        if sshd.poll() is not None:
            log = (directory / "sshd.log").read_text(errors="replace")
            pytest.fail(f"sshd exited ({sshd.returncode}): {log}")
        try:
            socket.create_connection(("127.0.0.1", host.port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"sshd did not listen on 127.0.0.1:{host.port}")
            time.sleep(0.02)  # a port that starts to accept: nothing to wait on but the port


def _probe(host: SshHost, python: str) -> subprocess.CompletedProcess[str]:
    return host.run(python, "-c", "import supervisor.remote; print('ok')")


def _python_for(host: SshHost) -> str:
    """A Python the user can run with this checkout importable: the tests' own if its path is
    readable to the user; else a venv of the user's own, from a system Python of the same
    version, that adds this checkout's site-packages (pyenv keeps its Pythons under /root)."""
    probe = _probe(host, sys.executable)
    if probe.returncode == 0 and probe.stdout.strip() == "ok":
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = next(
        (p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.path.exists(p)),
        None,
    )
    if system is None:
        skip_or_fail(
            f"user {host.user} cannot run {sys.executable} ({probe.stderr.strip()[-300:]}) and"
            f" there is no system {version} to make one from"
        )
        raise AssertionError  # (unreachable)
    venv = host.home / "venv"
    made = host.run(system, "-m", "venv", "--without-pip", str(venv))
    if made.returncode != 0:
        skip_or_fail(f"cannot make a venv for {host.user}: {made.stderr.strip()[-300:]}")
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and sys.prefix in p)
    pth = venv / "lib" / version / "site-packages" / "agent_supervisor_checkout.pth"
    pth.write_text(f"import site; site.addsitedir({site_packages!r})\n")
    python = str(venv / "bin" / "python")
    probe = _probe(host, python)
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        skip_or_fail(
            f"user {host.user} cannot run this checkout with {python}"
            f" (exit {probe.returncode}): {probe.stderr.strip()[-500:]}"
        )
    return python


def _cleanup(user: str, sshd: subprocess.Popen[bytes] | None) -> None:
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        uid = None
    if uid is not None:
        mine = [
            p
            for p in psutil.process_iter(["uids"])
            if p.info["uids"] and p.info["uids"].real == uid
        ]
        for process in mine:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(mine, timeout=5)
    if sshd is not None:
        sshd.terminate()
        try:
            sshd.wait(timeout=5)
        except subprocess.TimeoutExpired:
            sshd.kill()
            sshd.wait()
    subprocess.run(["userdel", "--remove", user], capture_output=True)
