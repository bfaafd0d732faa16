"""Tier-4 test support: installs, skips, the per-test harness, the latency table.

The ``tests/test_real_*.py`` modules use these, as do the scenario steps of ``scenarios.py`` (this
folder holds no tests of its own). The latency table is printed by ``tests/conftest.py``'s
hooks, which pytest loads for every run (serial or parallel, one module or all).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio

from helpers import Recorder
from realagents import install, netns
from realagents.agents import AGENTS, TEE_VARIABLE, Prepared, RealAgent
from realagents.fake_model import FakeModel
from supervisor import AgentSpec, Session, open_supervisor
from supervisor.supervisor import Supervisor

STRICT_VARIABLE = "AGENT_SUPERVISOR_STRICT_SKIPS"
RESULTS_FILE = install.REPO_ROOT / ".cache" / "tier4-results.json"
#: The grace the supervisor gives an agent to end a cancelled turn: the default of every real
#: agent's configuration (``supervisor.config.DEFAULT_GRACE_S``).
GRACE_S = 3.0

results: list[dict[str, Any]] = []
_installs: dict[str, install.Installed | install.Unavailable] = {}
_namespace_note: list[str] = []


def strict() -> bool:
    return os.environ.get(STRICT_VARIABLE) == "1"


def skip_or_fail(reason: str) -> None:
    """A skip, or with ``AGENT_SUPERVISOR_STRICT_SKIPS=1`` (CI) a failure."""
    if strict():
        pytest.fail(f"{reason} ({STRICT_VARIABLE}=1 turns this skip into a failure)")
    pytest.skip(reason)


def installed_agents() -> dict[str, install.Installed | install.Unavailable]:
    """Every agent package, installed once per run (all in parallel), or why it is not."""
    if not _installs:
        _installs.update(install.ensure_all(sorted({agent.package for agent in AGENTS.values()})))
    return _installs


def record(**fields: Any) -> None:
    """One row of the summary table printed at the end of the run."""
    results.append(fields)


@attrs.define
class Harness:
    """One real agent under the supervisor, its fake model, and what the test watches."""

    agent: RealAgent
    session: Session
    recorder: Recorder
    model: FakeModel
    prepared: Prepared
    ready_s: float
    namespace: bool
    #: the supervisor the session runs under (a test may start more sessions of the agent)
    supervisor: Supervisor

    @property
    def work(self) -> Path:
        return self.prepared.cwd

    def tool_processes(self, needle: str) -> list[psutil.Process]:
        """Live processes running in this test's work folder whose command line has ``needle``."""
        found = []
        for proc in psutil.process_iter(["cmdline", "cwd"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [])
                if (
                    needle in cmdline
                    and proc.info["cwd"] == os.fspath(self.work)
                    and proc.status() != psutil.STATUS_ZOMBIE
                ):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found


@contextmanager
def noted_namespace(how: str = "nsenter") -> Iterator[netns.Namespace | None]:
    """``netns.open_namespace()``, noted for the table's "network namespace:" line (the first
    test's; ``how``: how the agent gets into it)."""
    with netns.open_namespace() as namespace:
        if not _namespace_note:
            _namespace_note.append(
                f"none ({netns.unavailable_reason()})"
                if namespace is None
                else f"loopback-only, per test ({'unshare -rn' if namespace.user else 'unshare -n'} + {how})"
            )
        yield namespace


@asynccontextmanager
async def supervised(
    spec: AgentSpec,
    agent: RealAgent,
    model: FakeModel,
    prepared: Prepared,
    namespaced: bool,
    *,
    catch_up: bool = False,
    checks: Callable[[Recorder], None] | None = None,
    state_dir: Path | None = None,
) -> AsyncIterator[Harness]:
    """The agent of ``spec`` started under a supervisor, its events recorded, as a ``Harness``.
    Afterwards the recorder's invariants hold (once it has ``catch_up``, when asked), and then
    ``checks`` (the module's own). ``state_dir``: the supervisor's (its sessions' turns are
    then checkpointed, ``design/checkpoints.md``)."""
    async with open_supervisor(agents={spec.name: spec}, state_dir=state_dir) as sup:
        started = time.monotonic()
        session = await sup.start_session(spec.name)
        ready_s = time.monotonic() - started
        recorder = Recorder(session)
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            yield Harness(agent, session, recorder, model, prepared, ready_s, namespaced, sup)
            if catch_up:
                await recorder.catch_up()
            recorder.check_invariants()
            if checks is not None:
                checks(recorder)
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def real_agent_session(
    agent: RealAgent,
    root: Path,
    installed: install.Installed,
    *,
    grace_s: float = GRACE_S,
    keep_bodies: bool = False,
    tee: bool = False,
    spec_of: Callable[..., AgentSpec] | None = None,
    prepare: Callable[[Prepared], None] | None = None,
    catch_up: bool = False,
    checks: Callable[[Recorder], None] | None = None,
    state_dir: Path | None = None,
) -> AsyncIterator[Harness]:
    """``agent`` under a supervisor in its own network namespace, against a fake model.

    ``tee``: log the wire even without ``AGENT_TIER4_TEE=1``; ``spec_of(prepared, grace_s=...,
    tee_dir=...)``: its spec (default: the agent's ACP one); ``prepare``: a last change to its
    prepared setup; ``catch_up``, ``checks`` and ``state_dir``: as :func:`supervised` takes
    them."""
    spec_of = spec_of or agent.spec
    with noted_namespace() as namespace:
        listener = namespace.listener if namespace is not None else None
        with FakeModel(listener, keep_bodies=keep_bodies) as model:
            prepared = agent.prepare(installed.argv, root, model.base_url)
            if prepare is not None:
                prepare(prepared)
            tee_dir = root / "wire" if tee or os.environ.get(TEE_VARIABLE) == "1" else None
            spec = spec_of(prepared, grace_s=grace_s, tee_dir=tee_dir)
            if namespace is not None:
                spec = spec.with_options(command=tuple(namespace.wrap(list(spec.command))))
                if spec.resume_command:
                    resume = tuple(namespace.wrap(list(spec.resume_command)))
                    spec = spec.with_options(resume_command=resume)
            namespaced = namespace is not None
            async with supervised(
                spec,
                agent,
                model,
                prepared,
                namespaced,
                catch_up=catch_up,
                checks=checks,
                state_dir=state_dir,
            ) as h:
                yield h


def agent_opener(key: str, root: Path) -> Callable[..., AbstractAsyncContextManager[Harness]]:
    """What ``async with opener(**options) as h:`` starts for agent ``key`` (options:
    ``grace_s``, ``keep_bodies``), or a skip (a failure under
    ``AGENT_SUPERVISOR_STRICT_SKIPS=1``) when it is not installed. Call it from a plain
    (non-async) fixture, so the reason reaches pytest's report intact."""
    result = installed_agents()[AGENTS[key].package]
    if isinstance(result, install.Unavailable):
        skip_or_fail(f"{key} is not available: {result}")
    assert isinstance(result, install.Installed)
    return lambda **options: real_agent_session(AGENTS[key], root, result, **options)


#: What workers of a parallel run (pytest-xdist, ``make test``) sent back, merged on the
#: controller: the table is printed once, for the whole run.
_from_workers: list[dict[str, Any]] = []


def _report() -> dict[str, Any]:
    """This process's installs, namespace note and rows, as plain JSON-able data."""
    return {
        "installs": {
            key: attrs.asdict(r, filter=lambda a, _: a.name != "package")
            | {"package": r.package.npm}
            if isinstance(r, install.Installed)
            else {"unavailable": str(r)}
            for key, r in _installs.items()
        },
        "namespace": _namespace_note[0] if _namespace_note else None,
        "results": results,
    }


def worker_report() -> str:
    """What a worker of a parallel run sends its controller (``tests/conftest.py``)."""
    return json.dumps(_report(), default=str)


def take_worker_report(output: str) -> None:
    _from_workers.append(json.loads(output))


def _merged() -> dict[str, Any]:
    merged = json.loads(json.dumps(_report(), default=str))
    for part in _from_workers:
        merged["installs"].update(part["installs"])
        merged["namespace"] = merged["namespace"] or part["namespace"]
        merged["results"].extend(part["results"])
    return merged


def print_summary(terminalreporter: Any) -> None:
    """The latency table of the whole run, and ``.cache/tier4-results.json``."""
    report = _merged()
    if not report["results"] and not report["installs"]:
        return
    write = terminalreporter.write_line
    terminalreporter.section("tier 4: real agents")
    for key, result in sorted(report["installs"].items()):
        if "unavailable" in result:
            write(f"install {key:18} UNAVAILABLE: {result['unavailable']}")
            continue
        how = "installed now" if result["fresh"] else "cached"
        write(
            f"install {key:18} {how:13} took {result['seconds']:5.1f} s"
            f"  {result['bytes'] / 1e6:5.0f} MB"
        )
    if report["namespace"]:
        write(f"network namespace: {report['namespace']}")
    header = f"{'agent':18} {'scenario':10} {'outcome':10} {'cancel ms':>9} {'ready s':>7} {'model gone ms':>13}  notes"
    write(header)
    write("-" * len(header))
    for row in report["results"]:
        gone = row.get("model_gone_ms")
        write(
            f"{row['agent']:18} {row['scenario']:10} {row.get('outcome') or '-':10}"
            f" {row.get('elapsed_ms', float('nan')):9.1f} {row.get('ready_s', float('nan')):7.1f}"
            f" {gone if gone is not None else '-':>13}  {row.get('notes', '')}"
        )
    RESULTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_FILE.write_text(json.dumps(report, indent=2, default=str) + "\n")
    write(f"(written to {RESULTS_FILE.relative_to(install.REPO_ROOT)})")
