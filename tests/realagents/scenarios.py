"""Tier-4 scenario scaffolding shared by the ``tests/test_real_*.py`` modules.

The steps every real-agent test module takes the same way: the ``quick`` prompt after a cancel,
answering permission requests, watching a tool's processes with psutil, and the receipt's row in
the tier-4 table. Where the agents differ (the stop reason of a completed turn, where a
permission request names its command, which notes a row carries) the caller says so.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import trio

from helpers import Recorder
from protocols import events as ev
from realagents import install
from realagents.conftest import Harness, record, results, skip_or_fail
from realagents.fake_model import Exchange

#: How long a tool process may take to vanish after the receipt before we call it leaked
#: (a signal in flight, a reap): far below the shell command's own 29.7 s.
TOOL_GONE_S = 1.0
#: psutil sampling period: there is no event for "a process appeared" or "a process was never
#: started", so these waits sample.
SAMPLE_S = 0.02
#: How long the shell command has run when a test cancels it.
RUNNING_FOR_S = 1.0
#: How soon after the cancel the agent must have hung up on the model's stream. Most hang up
#: before they answer the cancel; codex-acp answers first and drops the connection when the
#: next token arrives (one 200 ms token interval later).
MODEL_GONE_S = 1.0
PERMISSION_MARKER = "permission-command-ran"  # the file PERMISSION_COMMAND touches first
RESUME_MARKER = "marker-7f3a9"  # in the turn before a kill: the resumed session must know it
KILLED_MARKER = "marker-k1113"  # in the killed turn's prompt: kept by some agents, not all
#: What the shell scenario's tool runs (its leaf process).
TOOL_LEAF = "tail -f /dev/null"


def ensure_installed(package: str, name: str) -> install.Installed:
    """The package ``package`` installed, or a skip naming ``name`` (a failure under
    ``AGENT_SUPERVISOR_STRICT_SKIPS=1``)."""
    try:
        return install.ensure(package)
    except install.Unavailable as exc:
        skip_or_fail(f"{name} is not available: {exc}")
        raise  # not reached


def installed_as(package: str) -> str:
    """``npm-name@version`` of a pinned package: the ``install`` column of the JSON file."""
    pinned = install.PACKAGES[package]
    return f"{pinned.npm}@{pinned.version}"


async def second_prompt_completes(h: Harness, stop_reason: str | None = None) -> ev.TurnEnded:
    """(d): the session takes a new prompt after the cancel, and it completes (with
    ``stop_reason``, when given)."""
    turn = await h.session.prompt("quick")
    ended = await h.recorder.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    if stop_reason is None:
        assert ended.outcome == "completed", (ended, h.model.describe())
    else:
        assert (ended.outcome, ended.stop_reason) == ("completed", stop_reason), (
            ended,
            h.model.describe(),
        )
    return ended


async def sample_until(check: Callable[[], Any]) -> Any:
    """Call ``check()`` every SAMPLE_S until it returns something truthy (bounded by the caller)."""
    while not (found := check()):
        await trio.sleep(SAMPLE_S)
    return found


async def command_running(h: Harness) -> list[psutil.Process]:
    """The shell command's processes, once the command itself runs (its ``tail``): a shell
    caught between its fork and its exec still carries the command in its own command line,
    and on a loaded machine a sample may fall in between."""

    def sample() -> list[psutil.Process]:
        found = h.tool_processes(TOOL_LEAF)
        return found if any(_named(p, "tail") for p in found) else []

    return list(await sample_until(sample))


def _named(proc: psutil.Process, name: str) -> bool:
    try:
        return bool(proc.name() == name)
    except psutil.Error:
        return False


async def approve_permissions(
    h: Harness,
    turn_id: str,
    approved: list[str],
    *,
    approved_as: Callable[[ev.PermissionRequested, ev.PermissionOption], str],
) -> None:
    """Answer every permission request of the turn "allow once", as a person would, and note
    each in ``approved`` as ``approved_as(request, option)`` says (its command, mostly)."""
    seen = 0
    while True:
        requested = await h.recorder.wait_kind(
            "permission.requested", turn_id=turn_id, count=seen + 1
        )
        seen += 1
        assert isinstance(requested, ev.PermissionRequested)
        option = next(o for o in requested.options if o.option_kind == "allow_once")
        approved.append(approved_as(requested, option))
        await h.session.respond_permission(requested.request_id, option.option_id)


async def watch_for(h: Harness, needle: str, seen: list[psutil.Process]) -> None:
    """Until cancelled: remember every process running ``needle`` in the work folder."""
    while True:
        seen.extend(p for p in h.tool_processes(needle) if p not in seen)
        await trio.sleep(SAMPLE_S)


async def time_until_gone(procs: list[psutil.Process], bound: float) -> float | None:
    """Milliseconds until none of ``procs`` is alive (sampled), or None after ``bound`` s."""
    start = trio.current_time()
    with trio.move_on_after(bound):
        while any(is_alive(p) for p in procs):
            await trio.sleep(SAMPLE_S / 4)
        return round((trio.current_time() - start) * 1000, 1)
    return None


def receipt_notes(receipt: Any) -> list[str]:
    """The first notes of a receipt's row: how the turn stopped and how the cancel got there
    (and what the sweep killed, if anything)."""
    notes = [f"stop_reason={receipt.stop_reason}", f"escalation={','.join(receipt.escalation)}"]
    swept = receipt.details.get("tool_processes_killed")
    if swept:
        notes.append("swept=" + ";".join(p["command"][:60] for p in swept))
    return notes


def record_receipt(
    h: Harness,
    key: str,
    package: str,
    scenario: str,
    receipt: Any,
    extra: dict[str, Any],
    *,
    details: bool = False,
    unparsed: Iterable[str] = (),
) -> None:
    """One row of the tier-4 table for a receipt (plus ``extra``: fields only the JSON file
    shows, and ``notes``, a list added to the row's notes). ``details``: the receipt's details
    go into the notes too (but the killed tool processes: a field of their own); ``unparsed``:
    what the adapter did not understand, named as the protocol names it."""
    notes = [
        *receipt_notes(receipt),
        *(
            f"{k}={v}"
            for k, v in (sorted(receipt.details.items()) if details else [])
            if k != "tool_processes_killed"
        ),
        *extra.pop("notes", []),
    ]
    if unparsed := sorted(unparsed):
        notes.append(f"unparsed={','.join(unparsed)}")
    record(
        agent=key,
        install=installed_as(package),
        scenario=scenario,
        outcome=receipt.outcome,
        elapsed_ms=receipt.elapsed_ms,
        ready_s=round(h.ready_s, 1),
        namespace=h.namespace,
        notes=" ".join(notes),
        **extra,
    )


def understood_everything(recorder: Recorder) -> None:
    """The adapter understood every line the agent wrote (no ``agent.unparsed``), and the agent
    every request (no ``error``)."""
    assert recorder.of_kind("error") == [], recorder.of_kind("error")
    assert recorder.of_kind("agent.unparsed") == [], recorder.of_kind("agent.unparsed")


# --- steps of the scenarios ----------------------------------------------------------------------


async def streaming(h: Harness) -> tuple[Any, Exchange]:
    """(a)'s start: a ``stream`` turn whose tokens reach the model's stream and the session.
    The turn and the model's stream."""
    turn = await h.session.prompt("stream")
    stream = await h.model.wait_for(lambda e: e.slow_tokens and e.tokens_sent >= 3)
    await h.recorder.wait_kind("message.delta", turn_id=turn.id)
    return turn, stream


async def stream_ended(h: Harness, stream: Exchange, timeout: float = 60.0) -> Exchange:
    """The model's ``stream`` once it has ended (its agent hung up, or it ran out)."""
    return await h.model.wait_for(
        lambda e: e.id == stream.id and e.ended_at is not None, timeout=timeout
    )


def ms_after(start: float, end: float | None) -> float | None:
    """Milliseconds from ``start`` to ``end`` (monotonic seconds), or None without an end."""
    return round((end - start) * 1000, 1) if end is not None else None


def assert_stream_abandoned(h: Harness, gone: Exchange, cancelled_at: float) -> None:
    """The model saw the agent hang up on the stream soon after the cancel, before its end."""
    assert gone.disconnected_at is not None, f"stream not abandoned:\n{h.model.describe()}"
    assert gone.disconnected_at - cancelled_at < MODEL_GONE_S, h.model.describe()
    assert gone.tokens_sent < 200, "the stream ran to its end"


def assert_only_stream(h: Harness, stream: Exchange) -> None:
    """Nothing streamed again for the cancelled turn: the only token stream is ``stream``."""
    streams = h.model.find(lambda e: e.streaming_tokens)
    assert [e.id for e in streams] == [stream.id], h.model.describe()


async def shell_running(
    h: Harness, approve: Callable[[Harness, str, list[str]], Awaitable[None]] | None = None
) -> tuple[Any, list[psutil.Process], list[str]]:
    """(b)'s start: a ``shell`` turn whose command has run for RUNNING_FOR_S, each permission
    request answered by ``approve`` (when the agent asks). The turn, the command's processes
    and what was approved."""
    approved: list[str] = []
    async with trio.open_nursery() as nursery:
        turn = await h.session.prompt("shell")
        if approve is not None:
            nursery.start_soon(approve, h, turn.id, approved)
        tools = await command_running(h)
        seen_at = trio.current_time()
        nursery.cancel_scope.cancel()
    # Stop a command that has been running for a while, as a person would.
    await trio.sleep_until(seen_at + RUNNING_FOR_S)
    return turn, tools, approved


async def cancel_while_tools_run(
    h: Harness, watched: list[psutil.Process]
) -> tuple[Any, list[psutil.Process], float | None, list[psutil.Process]]:
    """Cancel while ``watched`` run: the receipt, which of them were alive at the receipt, the
    milliseconds until all were gone (None after TOOL_GONE_S), and which still live then."""
    receipt = await h.session.cancel()
    alive_at_receipt = [p for p in watched if is_alive(p)]
    gone_ms = await time_until_gone(watched, TOOL_GONE_S)
    still = [p for p in watched if is_alive(p)]
    return receipt, alive_at_receipt, gone_ms, still


def tool_notes(
    watched: list[psutil.Process],
    alive_at_receipt: list[psutil.Process],
    gone_ms: float | None,
    killed: list[Any],
) -> list[str]:
    """The notes of (b)'s row: the tool's processes at the receipt, and after."""
    return [
        f"tool_alive_at_receipt={len(alive_at_receipt)}/{len(watched)}",
        f"supervisor_killed={len(killed)}",
    ] + ([f"tool_gone_after_receipt_ms={gone_ms}"] if alive_at_receipt else [])


def assert_tools_gone(
    receipt: Any, alive_at_receipt: list[psutil.Process], still: list[psutil.Process]
) -> None:
    """Terminate-then-respond: the receipt came after the tool was gone, whether the agent
    stopped it or the supervisor's sweep had to (then the receipt says ``tools_killed``)."""
    assert alive_at_receipt == [], (
        f"receipt {receipt.outcome!r} ({receipt.escalation}, {receipt.details}) while"
        f" the tool still ran: {[(p.pid, command_of(p)) for p in alive_at_receipt]}"
    )
    assert still == [], f"the tool still runs: {[(p.pid, command_of(p)) for p in still]}"


@asynccontextmanager
async def permission_pending(
    h: Harness, asked_for: str = "permission"
) -> AsyncIterator[tuple[Any, ev.PermissionRequested]]:
    """(c): ``async with permission_pending(h) as (turn, requested):`` a ``permission`` turn
    whose request is pending. Afterwards the command never ran: no marker file, no process."""
    marker = h.work / PERMISSION_MARKER
    seen: list[psutil.Process] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_for, h, "29.3", seen)
        turn = await h.session.prompt("permission")
        requested = await h.recorder.wait_kind("permission.requested", turn_id=turn.id)
        assert isinstance(requested, ev.PermissionRequested)
        yield turn, requested
        nursery.cancel_scope.cancel()
    assert not marker.exists(), f"the command ran although its {asked_for} was cancelled"
    assert seen == [], f"the command ran: {[p.info for p in seen]}"


def assert_permissions_cancelled(receipt: Any) -> None:
    """(c)'s receipt: the interrupt, and the pending request answered cancelled. A process the
    agent started during the turn for itself (not the command: ``permission_pending`` checks
    that it never ran) and still running when the turn ended is swept too, as designed
    (``tools_killed``: ``design/actor.md``); on a loaded machine one may outlive the sweep's
    settling time."""
    assert receipt.escalation[:2] == ["interrupt", "permissions_cancelled"], receipt
    assert receipt.escalation[2:] in ([], ["tools_killed"]), receipt


def assert_cancelled_by_supervisor(h: Harness, requested: ev.PermissionRequested) -> None:
    """The supervisor resolved the pending request ``cancelled``, once."""
    resolved = [
        e
        for e in h.recorder.of_kind("permission.resolved")
        if isinstance(e, ev.PermissionResolved) and e.request_id == requested.request_id
    ]
    assert [(e.outcome, e.by) for e in resolved] == [("cancelled", "supervisor")]


async def killed_mid_stream(h: Harness) -> tuple[Any, Exchange, list[psutil.Process]]:
    """(e)'s start: a finished turn (what the resumed session must still know), then a
    ``stream`` turn naming KILLED_MARKER, streaming. That turn, its model stream and the
    process tree the kill must end."""
    first = await h.session.prompt(f"quick: remember {RESUME_MARKER}")
    await h.recorder.wait_kind("turn.ended", turn_id=first.id)
    turn = await h.session.prompt(f"stream, and remember {KILLED_MARKER}")
    stream = await h.model.wait_for(lambda e: e.slow_tokens and e.tokens_sent >= 3)
    tree = [p for p in psutil.Process().children(recursive=True) if not is_holder(p)]
    return turn, stream, tree


async def wait_gone(tree: list[psutil.Process]) -> list[psutil.Process]:
    """Which of ``tree`` still live after 5 s."""
    _, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(tree, timeout=5))
    return list(alive)


def respawn_notes(h: Harness, exited: str) -> list[str]:
    """Where a kill's time went: the old ``exited``'s exit on SIGTERM, then the new one's start
    (notes for the table)."""
    states = [e for e in h.recorder.of_kind("session.state") if isinstance(e, ev.SessionState)]
    asked = next(e.timestamp for e in states if e.state == "cancelling")
    gone = next(e.timestamp for e in h.recorder.of_kind("agent.exited"))
    ready = next(e.timestamp for e in states if e.state == "ready" and e.timestamp > gone)
    return [
        f"{exited}_exit_ms={(gone - asked) * 1000:.0f}",
        f"respawn_ready_ms={(ready - gone) * 1000:.0f}",
    ]


def assert_killed_and_resumed(
    h: Harness, receipt: Any, turn_id: str, alive: list[psutil.Process], gone: Exchange
) -> None:
    """The turn was killed with the agent's whole tree and the session resumed by a new one."""
    assert (receipt.outcome, receipt.turn_id) == ("killed", turn_id), receipt
    assert receipt.escalation[:3] == ["interrupt", "grace_expired", "sigterm"], receipt
    assert receipt.escalation[-2:] == ["respawned", "resumed"], receipt
    assert receipt.resumed is True, receipt
    assert alive == [], f"still alive: {alive}"
    assert gone.disconnected_at is not None, h.model.describe()


def assert_history_kept(h: Harness, what: str = "session") -> None:
    """The last ``quick`` request to the model still holds the turn before the killed one (and
    the table notes whether the killed turn's prompt is there too)."""
    [last] = h.model.find(lambda e: e.scenario == "quick" and e.has_tools)[-1:]
    history = json.dumps(last.body)
    assert RESUME_MARKER in history, f"the resumed {what} lost its history"
    note_result(f"killed_prompt_kept={KILLED_MARKER in history}")


def note_result(note: str) -> None:
    """Append to the notes of the newest row of the table."""
    row = results[-1]
    row["notes"] = f"{row.get('notes', '')} {note}".strip()


# --- the wire log (``tee.py``) ------------------------------------------------------------------


#: A ``tee.py`` log read back: ``(ours, message)`` per line, in order.
Wire = list[tuple[bool, dict[str, Any]]]


def read_wire(path: Path) -> Wire:
    """The ``tee.py`` log at ``path`` (``STAMP > JSON`` is ours); a respawned agent appends to
    the same log."""
    wire = []
    for line in path.read_text().splitlines():
        _, mark, payload = line.split(" ", 2)
        wire.append((mark == ">", json.loads(payload)))
    return wire


def acp_processes(wire: Wire) -> list[Wire]:
    """An ACP wire log cut into one part per agent process (each starts with our
    ``initialize``)."""
    runs: list[Wire] = []
    for ours, message in wire:
        if ours and message.get("method") == "initialize":
            runs.append([])
        if runs:
            runs[-1].append((ours, message))
    return runs


def acp_answer(run: Wire, method: str) -> list[dict[str, Any]]:
    """The agent's answers (result or error) to each of our ``method`` requests in ``run``."""
    asked = {m["id"] for ours, m in run if ours and m.get("method") == method and "id" in m}
    return [m for ours, m in run if not ours and "method" not in m and m.get("id") in asked]


# --- processes ----------------------------------------------------------------------------------


def is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def is_holder(proc: psutil.Process) -> bool:
    """The network namespace's holder process (``netns.py``), which no kill ladder ends."""
    try:
        return "netns.py" in " ".join(proc.cmdline())
    except psutil.Error:
        return True


def children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def family(proc: psutil.Process) -> list[psutil.Process]:
    """The tool's shell (its parent, when it runs the command too) and its children:
    everything that runs the command."""
    found = []
    try:
        found.extend(proc.children(recursive=True))
        parent = proc.parent()
        if parent is not None and TOOL_LEAF in " ".join(parent.cmdline()):
            found.append(parent)
    except psutil.Error:
        pass
    return found


def ancestry(proc: psutil.Process, stop: psutil.Process) -> list[psutil.Process]:
    """``proc`` and its parents, up to (not including) ``stop``, nearest first."""
    chain = [proc]
    try:
        for parent in proc.parents():
            if parent.pid == stop.pid:
                break
            chain.append(parent)
    except psutil.Error:
        pass
    return chain


def short_name(proc: psutil.Process) -> str:
    """A process's program name (``node``, ``codex``, ``bash``), for the table's notes."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return "?"
    return Path(argv[0]).name if argv else "?"


def command_of(proc: psutil.Process) -> str:
    """A process's command line, cut to 120 characters, for an assertion's message."""
    try:
        return " ".join(proc.cmdline())[:120]
    except psutil.Error:
        return "?"
