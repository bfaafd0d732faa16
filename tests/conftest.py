"""Shared fixtures: nothing global; see tests/helpers.py for the event recorder.

``containment``: a test that takes it runs once per containment (a cgroup per agent, and the
shim), with ``AGENT_SUPERVISOR_CONTAINMENT`` set accordingly. Where cgroups cannot serve, the
cgroup run skips with the reason (fails under ``AGENT_SUPERVISOR_STRICT_SKIPS=1``, as in CI).
"""

from __future__ import annotations

import os
import sys

import pytest

# Tests import the fakes as a package (tests/fakes/...).
sys.path.insert(0, os.path.dirname(__file__))

from helpers import require_cgroups  # noqa: E402
from supervisor.containment import CONTAINMENT_VARIABLE  # noqa: E402

CONTAINMENTS = ("cgroup", "shim")


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
