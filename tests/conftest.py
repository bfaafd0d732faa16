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
from hypothesis import HealthCheck, settings

# Tests import the fakes as a package (tests/fakes/...).
sys.path.insert(0, os.path.dirname(__file__))

from helpers import require_cgroups  # noqa: E402
from pg import PostgresServer, start_postgresql  # noqa: E402
from supervisor.agents.containment import CONTAINMENT_VARIABLE  # noqa: E402
from supervisor.agents.statefile import STATE_DIR_VARIABLE  # noqa: E402

CONTAINMENTS = ("cgroup", "shim")

# The property tests check what a machine does with any input, never how fast: on a loaded
# machine an example past hypothesis's 200 ms deadline, or its data made slowly, must not fail.
settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("suite")


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


@pytest.fixture(scope="session", autouse=True)
def _state_dir_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What the run's supervisors keep (the state files, the session store of ``serve``) goes
    to a folder of the run's own, never the user's: for what a test's fixtures of a wider
    scope start before :func:`_state_dir_of_the_test` applies."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE_DIR_VARIABLE, os.fspath(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(autouse=True)
def _state_dir_of_the_test(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test's ``serve`` keeps its sessions apart: a session another test stored is not
    listed in this one's. A test that names a state directory itself still does."""
    monkeypatch.setenv(STATE_DIR_VARIABLE, os.fspath(tmp_path_factory.mktemp("state")))


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
