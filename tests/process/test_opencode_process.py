"""Tier 3 and 4 for OpenCode: the whole supervisor driving ``opencode serve`` over HTTP.

Tier 3: a scripted fake server (``fakes/fake_opencode.py``: stdlib HTTP and server-sent events)
as a real process, the real ``HttpLink`` and the real clock, no autojump: its password, a
cancel behind a flood, leftover idles and garbage, an error after the idle, a crash, a lost
event stream, a stop. What every protocol's agent does when a cancel is obeyed, ignored, or meets a pending
permission is the contract, ``test_cancel_contract_process.py``. Bounds are generous; exact timing is the virtual-time tests'
job. What the fake decided reaches us as its stderr lines.

Tier 4, the real ``opencode serve`` (streaming, shell, permission, kill and resume), is
``tests/real/test_real_opencode_serve.py``; it shares the password checks defined here.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest
import trio

from helpers import Recorder, process_session
from opencode_server import (
    assert_refused_without_the_password,
    assert_secret_nowhere,
    listening_url,
    server_password,
    stderr_lines,
)
from paths import TESTS
from protocols import events as ev
from supervisor import AgentSpec, Session, open_supervisor

pytestmark = pytest.mark.real_process

GRACE = 1.0
#: The flood's backlog takes 0.6 s to read alone, 4 s beside 8 busy loops on 2 cores, and more
#: than 10 s once on CI (npm installs and real agents beside it): the grace must out-last any of
#: these, as the test is about order and count, not about the kill ladder.
FLOOD_GRACE = 60.0
BOUND = 30.0  # a stuck test fails instead of hanging the suite
FAKE_OPENCODE = TESTS / "fakes" / "fake_opencode.py"


def opencode_spec(state_dir: Path, *extra: str, grace_s: float = GRACE) -> AgentSpec:
    return AgentSpec(
        name="opencode",
        protocol="opencode",
        command=[
            sys.executable,
            str(FAKE_OPENCODE),
            "serve",
            "--state-dir",
            str(state_dir),
            *extra,
        ],
        grace_s=grace_s,
        kill_timeout_s=0.5,
        start_timeout_s=10.0,
    )


def tree_of_this_test() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == [], f"still alive: {alive}"


@asynccontextmanager
async def opencode_session(
    tmp_path: Path, *extra: str, grace_s: float = GRACE
) -> AsyncIterator[tuple[Session, Recorder]]:
    spec = opencode_spec(tmp_path, *extra, grace_s=grace_s)
    async with process_session(spec, str(tmp_path), bound=BOUND + grace_s) as (session, rec):
        yield session, rec
        seen = tree_of_this_test()
    assert_all_gone(seen)  # leaving the supervisor left nothing behind


def is_delta(event: ev.Event) -> bool:
    return event.kind == "message.delta"


async def said(rec: Recorder, prefix: str) -> str:
    """The agent's stderr line starting with ``prefix``; waits, as stderr is a pipe of its own
    (and stdout lines after the listening line are read by a task of their own)."""
    event = await rec.wait_for(
        lambda e: isinstance(e, ev.AgentStderr) and e.line.startswith(prefix)
    )
    assert isinstance(event, ev.AgentStderr)
    return event.line


async def second_prompt_completes(session: Session, rec: Recorder) -> None:
    turn = await session.prompt("again words=3")
    ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.outcome, ended.stop_reason) == ("completed", "stop"), ended
    texts = [
        e.text
        for e in rec.of_kind("message.delta")
        if isinstance(e, ev.MessageDelta) and e.turn_id == turn.id
    ]
    assert texts == ["w0 ", "w1 ", "w2 "]


async def test_normal_turns_over_http(tmp_path: Path) -> None:
    async with opencode_session(tmp_path, "--chatter") as (session, rec):
        await second_prompt_completes(session, rec)
        await second_prompt_completes(session, rec)
        # stdout lines (before and after the listening line) are shown like stderr lines
        await said(rec, "INFO  later chatter on stdout")
        lines = stderr_lines(rec)
        assert any(
            line.startswith("opencode server listening on http://127.0.0.1:") for line in lines
        )
        assert "{not json at all" in lines
        assert session.state == "ready" and rec.of_kind("error") == []


async def test_server_password_guards_every_route(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server is started with a password of its own (``AgentProtocol.environment``), which
    the link sends as basic auth on every request and the event stream: the session works, a
    request without the password (or with another) is refused, and the password shows nowhere."""
    caplog.set_level(logging.DEBUG)
    async with opencode_session(tmp_path) as (session, rec):
        password = server_password(tree_of_this_test())
        await second_prompt_completes(session, rec)
        await rec.wait_kind("session.state", state="ready", count=2)
        turn = await session.prompt("words=10000")
        await rec.wait_for(is_delta, count=2)
        receipt = await session.cancel()
        assert (receipt.outcome, receipt.turn_id) == ("cancelled", turn.id)
        await assert_refused_without_the_password(listening_url(rec), password)
        await said(rec, "fake-opencode: refused GET /session: no valid credentials")
        await said(rec, "fake-opencode: refused GET /event: no valid credentials")
        await rec.catch_up()
        lines = stderr_lines(rec)
        assert not any("OPENCODE_SERVER_PASSWORD is not set" in line for line in lines)
        assert_secret_nowhere(password, rec, repr(receipt), caplog.text)


async def test_a_new_password_for_every_process(tmp_path: Path) -> None:
    """A respawned server gets a fresh password; the old one opens nothing."""
    async with opencode_session(tmp_path) as (session, rec):
        first = server_password(tree_of_this_test())
        await session.prompt("wedged words=10000")
        await rec.wait_for(is_delta)
        receipt = await session.cancel()
        assert receipt.outcome == "killed" and receipt.resumed is True
        second = server_password(tree_of_this_test())
        assert second != first
        await second_prompt_completes(session, rec)


async def test_cancel_behind_a_flood_one_receipt_and_every_event(tmp_path: Path) -> None:
    """The server streams deltas as fast as its socket takes them, so thousands are queued
    (mostly in its socket buffer) when the cancel comes: the turn's end is read behind all of
    them. Two concurrent cancels share the one receipt, every delta before the end reaches the
    subscriber in order with no gap, and exactly one ``turn.ended`` follows them. (How long the
    backlog takes is measured, not asserted: ``design/protocols.md``.)"""
    async with opencode_session(tmp_path, grace_s=FLOOD_GRACE) as (session, rec):
        turn = await session.prompt("flood words=100000000")
        await rec.wait_for(is_delta, count=2000)
        receipts = []

        async def cancel() -> None:
            receipts.append(await session.cancel(reason="flood"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            nursery.start_soon(cancel)
        first, second = receipts
        assert first == second
        assert (first.outcome, first.turn_id, first.stop_reason) == (
            "cancelled",
            turn.id,
            "aborted",
        )
        assert first.escalation == ["interrupt"]
        await rec.catch_up()
        texts = [
            e.text
            for e in rec.of_kind("message.delta")
            if isinstance(e, ev.MessageDelta) and e.turn_id == turn.id
        ]
        assert len(texts) >= 2000
        assert texts == [f"w{i} " for i in range(len(texts))]  # in order, none lost
        [ended] = [e for e in rec.of_kind("turn.ended") if isinstance(e, ev.TurnEnded)]
        assert ended.turn_id == turn.id and ended.receipt is not None
        assert (ended.receipt["outcome"], ended.receipt["elapsed_ms"]) == (
            "cancelled",
            first.elapsed_ms,
        )
        last_delta = max(e.seq for e in rec.of_kind("message.delta"))
        assert ended.seq > last_delta
        await second_prompt_completes(session, rec)


async def test_leftover_idle_and_garbage_do_not_end_the_next_turn(tmp_path: Path) -> None:
    async with opencode_session(tmp_path) as (session, rec):
        first = await session.prompt("leftover garbage words=10000")
        await rec.wait_for(is_delta, count=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.cancel)
            await rec.wait_kind("session.state", state="cancelling")
            second = await session.prompt("again words=3 interval=0.1")
            assert second.queued
        ended = await rec.wait_kind("turn.ended", turn_id=second.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        texts = [
            e.text
            for e in rec.of_kind("message.delta")
            if isinstance(e, ev.MessageDelta) and e.turn_id == second.id
        ]
        assert texts == ["w0 ", "w1 ", "w2 "]
        [first_end] = [
            e
            for e in rec.of_kind("turn.ended")
            if isinstance(e, ev.TurnEnded) and e.turn_id == first.id
        ]
        assert first_end.outcome == "cancelled"
        errors = [e for e in rec.of_kind("error") if isinstance(e, ev.ErrorEvent)]
        assert [e.code for e in errors] == ["agent_invalid_json"]


async def test_error_after_the_idle_fails_the_turn(tmp_path: Path) -> None:
    """A prompt that fails inside the server: busy, the idle pair, and only then its
    ``session.error`` (the real ``prompt_async``'s order). The turn ends ``failed`` with that
    error, never ``completed``; nothing is left over as a stray error; the next turn completes."""
    async with opencode_session(tmp_path) as (session, rec):
        turn = await session.prompt("fail-late")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded)
        assert (ended.outcome, ended.stop_reason) == ("failed", "error"), ended
        assert ended.error == "UnknownError: Error: All fibers interrupted without error"
        await said(rec, "fake-opencode: failing ses_")
        await second_prompt_completes(session, rec)
        assert rec.of_kind("error") == []


async def test_server_crash_mid_turn_is_respawned_and_resumed(tmp_path: Path) -> None:
    async with opencode_session(tmp_path) as (session, rec):
        turn = await session.prompt("crash words=100")
        ended = await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "failed"
        assert ended.error is not None and "exit 3" in ended.error
        exited = [e for e in rec.of_kind("agent.exited") if isinstance(e, ev.AgentExited)]
        assert [(e.exit_code, e.expected) for e in exited] == [(3, False)]
        await rec.wait_kind("session.state", state="ready", count=2)
        await second_prompt_completes(session, rec)
        await said(rec, "fake-opencode: resumed ses_")


async def test_event_stream_lost_while_the_server_runs(tmp_path: Path) -> None:
    """Turns end only on the stream: a server that drops it is useless, so it is killed and
    replaced, and the session resumed."""
    async with opencode_session(tmp_path, "--drop-stream-once", "0.3") as (session, rec):
        first = tree_of_this_test()
        exited = await rec.wait_kind("agent.exited")
        assert isinstance(exited, ev.AgentExited) and exited.expected is False
        assert_all_gone(first)
        await rec.wait_kind("session.state", state="ready", count=2)
        lines = stderr_lines(rec)
        assert "fake-opencode: dropping the event stream" in lines
        assert "agent-supervisor: the event stream ended while the server runs: killing it" in lines
        await second_prompt_completes(session, rec)
        await said(rec, "fake-opencode: resumed ses_")


async def test_stop_ends_the_server(tmp_path: Path) -> None:
    async with open_supervisor(agents={"opencode": opencode_spec(tmp_path)}) as sup:
        session = await sup.start_session("opencode", cwd=str(tmp_path))
        tree = tree_of_this_test()
        assert tree
        with trio.fail_after(5):
            status = await session.stop()
        # SIGTERM is a server's polite request: it ends at once, no kill ladder needed.
        assert status is not None and status.signal is not None
        assert_all_gone(tree)


# Tier 4, the real ``opencode serve``, is ``tests/real/test_real_opencode_serve.py``.
