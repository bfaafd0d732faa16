"""A gateway URL given on the command line (``chat --url``, ``acp --connect``, ``pause`` and
``resume``'s ``--url`` or ``$AGENT_SUPERVISOR_URL``) that is not one: one line saying what is
wanted, exit 2, before anything connects."""

from __future__ import annotations

import pytest

from supervisor.cli import main

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
