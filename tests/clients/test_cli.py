"""The command line as a newcomer meets it: what it prints and its errors, each one line.

A gateway URL given on the command line (``chat --url``, ``acp --connect``, ``pause`` and
``resume``'s ``--url`` or ``$AGENT_SUPERVISOR_URL``) that is not one: one line saying what is
wanted, exit 2, before anything connects; a wrong token is said as such. ``agents`` lines its
columns up, and its output may be cut short (``| head``) without a traceback.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio

from served import ROOT
from supervisor import AgentSpec, open_supervisor
from supervisor.cli import _parser, main
from supervisor.clients.acp_front.backends import BackendError
from supervisor.gateway import Gateway
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

WANTED = "is not a gateway URL: give the one `agent-supervisor serve` printed"


@pytest.mark.parametrize(
    "argv",
    [
        ["chat", "--url", "127.0.0.1:8765"],
        ["acp", "--connect", "localhost:8765/?token=T"],
        ["pause", "--url", "ftp://127.0.0.1:8765/"],
        ["resume", "--url", "http:///?token=T"],
    ],
    ids=["chat", "acp", "pause", "resume"],
)
def test_a_url_without_scheme_or_host_is_refused_naming_what_is_wanted(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert WANTED in err and "Traceback" not in err


def test_one_from_the_environment_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENT_SUPERVISOR_URL", "127.0.0.1:8765")
    monkeypatch.setenv("AGENT_SUPERVISOR_TOKEN", "T")
    assert main(["resume"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("agent-supervisor resume: $AGENT_SUPERVISOR_URL: '127.0.0.1:8765'")
    assert WANTED in line


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_serve_refuses_a_port_out_of_range(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["serve", "--port", port])  # (not main: it would serve)
    assert exited.value.code == 2
    said = f"argument --port: {port!r} is not a port: 1 to 65535, or 0 for a free one"
    assert said in capsys.readouterr().err


def test_the_store_of_sessions_may_be_named_before_or_after_the_command() -> None:
    for argv in (["sessions", "--store", "none", "list"], ["sessions", "list", "--store", "none"]):
        assert _parser().parse_args(argv).store == "none", argv
    assert _parser().parse_args(["sessions", "show", "s1"]).store is None


def test_the_store_help_says_where_a_sqlite_path_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve = next(
        a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["serve"]
    said = " ".join(serve.format_help().split())
    assert "sqlite:///x.db is x.db in the working directory" in said
    assert "sqlite:////var/lib/x.db is absolute" in said
    # As said: from the working directory, and its missing directories are made.
    from supervisor.store.url import backend_for

    monkeypatch.chdir(tmp_path)
    backend = backend_for("sqlite:///a/b/x.db")
    assert backend is not None
    backend.open()
    backend.close()
    assert (tmp_path / "a" / "b" / "x.db").is_file()


def test_every_commands_help_says_what_it_does() -> None:
    def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, Any]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    yield name, command
                    yield from commands(command)

    described = {name: bool(command.description) for name, command in commands(_parser())}
    assert {"serve", "demo", "agents", "worktrees", "list", "show"} <= set(described)
    assert all(described.values()), described


def test_every_option_names_its_value_in_words() -> None:
    # (argparse's own placeholder is the option's name in capitals: --detach DETACH.)
    def options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, Any]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    yield from options(command, f"{path} {name}")
            elif action.option_strings and action.nargs != 0:
                yield f"{path} {action.option_strings[-1]}", action.metavar

    unnamed = [option for option, metavar in options(_parser(), "agent-supervisor") if not metavar]
    assert unnamed == []


def test_agents_lines_its_columns_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agents"]) == 0
    listed = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in listed] == ["demo", "demo-stubborn"]
    assert len({line.index(" acp ") for line in listed}) == 1


def test_output_cut_short_is_no_traceback() -> None:
    # The reader takes nothing and goes: the write finds the pipe closed.
    done = subprocess.run(
        f"{sys.executable} -m supervisor.cli agents | true",
        shell=True,
        env={**os.environ, "PYTHONUNBUFFERED": ""},  # block-buffered, as for most users
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


@pytest.mark.real_process
def test_the_demo_stops_both_agents_and_says_so(tmp_path: Path) -> None:
    # What `make demo` runs, with a short grace for the stubborn agent.
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "demo", "--grace", "0.3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "AGENT_SUPERVISOR_STATE_DIR": str(tmp_path)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "started session s1: python" in out and " -m supervisor.demo_agent" in out
    assert re.search(r"receipt: Cancelled in \d+ ms\n", out)
    assert "[agent process exited, as asked]\n" in out
    assert "receipt: Killed after 0.3 s grace, session resumed\n" in out
    assert "[turn t2 ended: completed]" in out
    assert "Traceback" not in done.stderr


async def test_chat_the_front_door_and_pause_say_a_gateway_not_there_alike() -> None:
    from supervisor.clients import acp_front, chat
    from supervisor.clients.operator import OperatorError, run_operator

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/?token=T"
    said = []
    with trio.fail_after(30):
        for connect, error in ((chat._connect, chat.ChatError), (acp_front._connect, BackendError)):
            async with AsyncExitStack() as stack:
                with pytest.raises(error) as refused:
                    await connect(stack, url)
            said.append(str(refused.value))
        with pytest.raises(OperatorError) as refused:
            await run_operator("pause", url, "T", io.StringIO())
        said.append(str(refused.value))
    assert said[0].startswith(f"cannot connect to 127.0.0.1:{port}: ")
    assert said[0].endswith(" (is `agent-supervisor serve` running there?)")
    assert said == [said[0]] * 3


async def test_chat_and_the_front_door_say_a_wrong_token_in_words() -> None:
    from supervisor.clients import acp_front, chat

    spec = AgentSpec(name="fake", protocol="acp", command=["fake"])
    with trio.fail_after(30):
        async with open_supervisor(
            agents={"fake": spec}, launcher=AcpLauncher(AcpBehaviour())
        ) as sup:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(Gateway(sup, port=0, token="right").serve)
                wrong = url.replace("token=right", "token=wrong")
                where = urlsplit(url).netloc
                for connect, error in (
                    (chat._connect, chat.ChatError),
                    (acp_front._connect, BackendError),
                ):
                    async with AsyncExitStack() as stack:
                        with pytest.raises(error) as refused:
                            await connect(stack, wrong)
                    assert str(refused.value) == f"{where} refused the token (HTTP 401)"
                nursery.cancel_scope.cancel()
