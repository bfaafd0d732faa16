"""Shared fixtures: nothing global; see tests/helpers.py for the event recorder.

``postgresql``: a throwaway PostgreSQL cluster for the whole run (tests/pg.py); a test takes a
store of its own (a schema) with ``postgresql.database()``.

``containment``: a test that takes it runs once per containment (a cgroup per agent, and the
shim), with ``AGENT_SUPERVISOR_CONTAINMENT`` set accordingly. Where cgroups cannot serve, the
cgroup run skips with the reason (fails under ``AGENT_SUPERVISOR_STRICT_SKIPS=1``, as in CI).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Tests import the fakes as a package (tests/fakes/...).
sys.path.insert(0, os.path.dirname(__file__))

from helpers import require_cgroups  # noqa: E402
from pg import PostgresServer, start_postgresql  # noqa: E402
from supervisor.agents.containment import CONTAINMENT_VARIABLE  # noqa: E402

CONTAINMENTS = ("cgroup", "shim")


# -- the tier-4 latency table, once per run: a worker of a parallel run (``make test`` runs
# pytest-xdist) sends its rows to the controller, which prints them all.


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from realagents import conftest as tier4

        workeroutput["tier4"] = tier4.worker_report()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    output = getattr(node, "workeroutput", {}).get("tier4")
    if output:
        from realagents import conftest as tier4

        tier4.take_worker_report(output)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not hasattr(terminalreporter.config, "workeroutput"):
        from realagents import conftest as tier4

        tier4.print_summary(terminalreporter)


@pytest.fixture(params=CONTAINMENTS)
def containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    mode: str = request.param
    if mode == "cgroup":
        require_cgroups()
    monkeypatch.setenv(CONTAINMENT_VARIABLE, mode)
    return mode


@pytest.fixture
def shim_containment(monkeypatch: pytest.MonkeyPatch) -> str:
    """Only the shim: for what only a shim can do (or fail at)."""
    monkeypatch.setenv(CONTAINMENT_VARIABLE, "shim")
    return "shim"


@pytest.fixture
def cgroup_containment(monkeypatch: pytest.MonkeyPatch) -> str:
    require_cgroups()
    monkeypatch.setenv(CONTAINMENT_VARIABLE, "cgroup")
    return "cgroup"


@pytest.fixture(scope="session")
def postgresql() -> Iterator[PostgresServer]:
    yield from start_postgresql()
