"""A supervisor started again on the same store: every session listed with its id and agent
(stopped), its whole history replayed with the same seqs, a turn that ran when the first went
away ended once (failed), and new session ids past the stored ones. In-memory agents, on the
real clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from helpers import run_turn
from protocols import events as ev
from protocols.mcp import McpServer, NameValue
from supervisor import AgentSpec, open_supervisor
from supervisor.errors import AgentNotRunning, BadRequest
from supervisor.remote import HostSpec, HostUnreachable
from supervisor.store.backend import Batch, EventRun, StoredSession, TextRow
from supervisor.store.sqlite import SqliteBackend
from supervisor.store.writer import UNCLEAN_SKIP
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import event_json, event_to_wire

BOUND = 30.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


async def history(session: Any) -> list[dict[str, Any]]:
    async with session.subscribe(since_seq=0) as events:
        got = []
        with trio.move_on_after(0.5):  # a live session's replay, then whatever comes
            async for event in events:
                got.append(event_to_wire(event))
        return got


async def test_sessions_and_their_history_come_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    launcher = AcpLauncher(AcpBehaviour(words=5, word_interval=0.01))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            one = await sup.start_session("fake")
            two = await sup.start_session("fake")
            await run_turn(one, "first prompt")
            launcher.behaviour = AcpBehaviour(words=1000, word_interval=0.05)
            async with two.subscribe() as events:
                await two.prompt("a long one " + "x" * 20_000)
                async for event in events:
                    if event.kind == "message.delta":
                        break
                receipt = await two.cancel()
            assert receipt.outcome == "cancelled"
            before = {s.id: s.spec.name for s in (one, two)}
        seen = {"s1": one.fanout.history, "s2": two.fanout.history}
        seen_wire = {sid: [bytes(b) for b in h] for sid, h in seen.items()}

        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            listed = {s.session_id: (s.agent, s.state) for s in sup.list()}
            assert listed == {sid: (agent, "stopped") for sid, agent in before.items()}
            for sid in ("s1", "s2"):
                session = sup.get(sid)
                async with session.subscribe(since_seq=0) as events:
                    replay = [event async for event in events]
                assert [e.seq for e in replay] == list(range(1, len(replay) + 1))
                stored = await sup.store.events(sid, 0, 100_000)  # type: ignore[union-attr]
                assert [payload for _, payload in stored] == seen_wire[sid]
                assert replay[-1].kind in ("session.state", "agent.exited", "turn.ended")
            with pytest.raises(AgentNotRunning):
                await sup.get("s1").cancel()
            texts = await trio.to_thread.run_sync(sup.store.backend.texts, "s2")  # type: ignore[union-attr]
            assert [(t.kind, len(t.text)) for t in texts if t.kind == "prompt"] == [
                ("prompt", len("a long one ") + 20_000)
            ]
            hits = await sup.store.search("first", 10)  # type: ignore[union-attr]
            assert [(h.session_id, h.kind) for h in hits] == [("s1", "prompt")]
            three = await sup.start_session("fake")
            assert three.id == "s3"


async def test_a_start_that_failed_is_not_kept_as_a_session(tmp_path: Path) -> None:
    # Its starter has the reason; listed or stored, it would be a past session without a
    # prompt, forever.
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    gone = AgentSpec(name="gone", protocol="acp", command=[str(tmp_path / "no-such-agent")])
    agents = {"gone": gone, "fake": SPEC}
    launcher = AcpLauncher(AcpBehaviour())
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"gone": gone}, store=url) as sup:
            with pytest.raises(AgentNotRunning, match="no-such-agent"):
                await sup.start_session("gone")
            assert sup.list() == []
            assert sup.store is not None
            assert await sup.store.stored("s1") is None
        async with open_supervisor(agents=agents, launcher=launcher, store=url) as sup:
            assert sup.list() == []
            assert (await sup.start_session("fake")).id == "s2"  # (its id is not given again)


async def test_a_turn_running_when_the_supervisor_went_away_ends_once(tmp_path: Path) -> None:
    url = _store_running_turn(tmp_path, "s7", "/")
    launcher = AcpLauncher(AcpBehaviour())
    with trio.fail_after(BOUND):
        for number in (8, 9):  # the second start finds the turn ended: nothing more is added
            async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
                session = sup.get("s7")
                assert session.last_seq == 3
                async with session.subscribe(since_seq=0) as events:
                    replay = [event async for event in events]
                assert [e.kind for e in replay] == ["session.state", "turn.started", "turn.ended"]
                ended = replay[-1]
                assert (ended.seq, ended.turn_id, ended.outcome) == (3, "t1", "failed")
                assert "supervisor went away" in (ended.error or "")
                assert (await sup.start_session("fake")).id == f"s{number}"


async def test_a_prompt_to_a_stored_session_starts_its_agent_again_resumed(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    launcher = AcpLauncher(AcpBehaviour(words=3, word_interval=0.01))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            first = await sup.start_session("fake")
            await run_turn(first, "remember this")
            own_id = first.agent_session_id
            assert own_id is not None
        last = first.last_seq
        launcher.resumes.clear()
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            stored = sup.get("s1")
            assert stored.state == "stopped"
            handle = await stored.prompt("and now this")
            assert handle.id == "t2"  # turn ids go on
            live = sup.get("s1")
            assert live is not stored and live.state in ("running", "ready")
            assert launcher.resumes == [own_id]  # the agent's own session, resumed
            async with live.subscribe(since_seq=last) as events:
                seqs = []
                async for event in events:
                    seqs.append(event.seq)
                    if event.kind == "turn.ended":
                        break
            assert seqs[0] == last + 1  # seqs go on
            assert [s.session_id for s in sup.list()] == ["s1"]
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            async with sup.get("s1").subscribe(since_seq=0) as events:
                replay = [event async for event in events]
            assert [e.seq for e in replay] == list(range(1, len(replay) + 1))
            turns = [e.turn_id for e in replay if e.kind == "turn.ended"]
            assert turns == ["t1", "t2"]


async def test_a_session_not_closed_cleanly_skips_what_clients_may_have_seen(
    tmp_path: Path,
) -> None:
    """A writer that never closed (a SIGKILL): events clients saw past seq 2 may not be
    stored; their seqs and turn ids are a gap, never used again."""
    url = _store_running_turn(tmp_path, "s1", str(tmp_path), clean=False)
    launcher = AcpLauncher(AcpBehaviour(words=2, word_interval=0.01))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            session = sup.get("s1")
            async with session.subscribe(since_seq=0) as events:
                replay = [event async for event in events]
            assert [e.kind for e in replay] == [
                "session.state",
                "turn.started",
                "stream.gap",
                "turn.ended",
            ]
            gap = replay[2]
            assert isinstance(gap, ev.StreamGap)
            assert (gap.from_seq, gap.to_seq, gap.seq) == (3, 2 + UNCLEAN_SKIP, 2 + UNCLEAN_SKIP)
            assert replay[3].seq == 3 + UNCLEAN_SKIP
            assert sup.store is not None
            (stored,) = await sup.store.sessions()
            assert stored.last_seq == 3 + UNCLEAN_SKIP  # what the next start goes on from
            assert await sup.store.events("s1", 2 + UNCLEAN_SKIP, 10) == [
                (3 + UNCLEAN_SKIP, event_json(replay[3]))
            ]
            handle = await session.prompt("again")
            assert int(handle.id[1:]) > 1 + UNCLEAN_SKIP  # turn ids past any unstored one
            live = sup.get("s1")
            async with live.subscribe(since_seq=replay[-1].seq) as events:
                async for event in events:
                    assert event.seq > replay[-1].seq
                    if event.kind == "turn.ended":
                        break
        # Closed cleanly: a second start adds no gap.
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            async with sup.get("s1").subscribe(since_seq=0) as events:
                kinds = [event.kind async for event in events]
            assert kinds.count("stream.gap") == 1


async def test_a_restarted_session_gets_the_mcp_servers_it_was_started_with(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    launcher = AcpLauncher(AcpBehaviour(words=2, word_interval=0.01))
    files = McpServer(name="files", command="/bin/true", args=("--root", "/"))
    web = McpServer(name="web", command="/bin/cat", env=[NameValue("TOKEN", "x")])
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            session = await sup.start_session("fake", mcp_servers=[files, web])
            assert launcher.links[-1].spec.mcp_servers == (files, web)
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            await sup.get(session.id).prompt("again")
            assert launcher.links[-1].spec.mcp_servers == (files, web)


async def test_a_stored_session_of_a_host_not_to_be_had_stays_stored(tmp_path: Path) -> None:
    """A prompt to a stored session of a host that is no longer configured, or that cannot be
    reached, is one error naming the host; the session stays stored (and listed so)."""
    url = _store_running_turn(tmp_path, "s1@h", "/", host="h")
    remote = SPEC.with_options(hosts=("h",))
    unreachable = HostSpec(name="h", transport=("false",), connect_timeout_s=10.0)
    with trio.fail_after(BOUND):
        for hosts, error, words in (
            ({}, BadRequest, "ran on host h, which is not configured here"),
            ({"h": unreachable}, HostUnreachable, "host h: "),
        ):
            agents = {"fake": remote if hosts else SPEC}
            async with open_supervisor(agents=agents, hosts=hosts, store=url) as sup:
                with pytest.raises(error, match=words):
                    await sup.get("s1@h").prompt("again")
                assert [(s.session_id, s.state) for s in sup.list()] == [("s1@h", "stopped")]


def _store_running_turn(
    tmp_path: Path, session_id: str, cwd: str, *, clean: bool = True, host: str | None = None
) -> str:
    """A store (its URL) as a supervisor leaves it when it goes away with ``session_id``'s turn
    ``t1`` (prompt "go") running: ``clean`` False as a SIGKILL leaves it (never closed);
    ``host``: a session of that host's node."""
    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)
    backend.open()
    stamp = {"session_id": session_id}
    state = event_json(ev.SessionState(**stamp, seq=1, timestamp=1.0, state="ready"))
    started = event_json(ev.TurnStarted(**stamp, seq=2, timestamp=2.0, turn_id="t1", text="go"))
    backend.write(
        Batch(
            sessions=[
                StoredSession(
                    id=session_id,
                    agent="fake",
                    protocol="acp",
                    host=host,
                    cwd=cwd,
                    mcp_servers="[]",
                    agent_session_id="agent-own-id",
                    created=1.0,
                    last_active=2.0,
                    state="running",
                    open_turn_id="t1",
                    clean=clean,
                )
            ],
            events=[EventRun(session_id=session_id, first_seq=1, payloads=[state, started])],
            texts=[TextRow(session_id=session_id, turn_id="t1", seq=2, kind="prompt", text="go")],
        )
    )
    backend.close()
    return f"sqlite:///{path}"


class Interrupted(Exception):
    """What an application's Ctrl-C, or any error, raises inside the supervisor's block."""


async def test_an_exception_leaving_the_block_still_stores_the_close(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    launcher = AcpLauncher(AcpBehaviour(words=1000, word_interval=0.01))
    with trio.fail_after(BOUND):
        with pytest.raises(Interrupted):
            async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
                session = await sup.start_session("fake")
                async with session.subscribe() as events:
                    await session.prompt("stream until the application gives up")
                    async for event in events:
                        if event.kind == "message.delta":
                            break
                raise Interrupted
        backend = SqliteBackend(tmp_path / "sessions.db", kind="acp")
        await trio.to_thread.run_sync(backend.open)
        try:
            (row,) = await trio.to_thread.run_sync(backend.sessions)
            stored = await trio.to_thread.run_sync(backend.events, row.id, 0, 100_000)
        finally:
            await trio.to_thread.run_sync(backend.close)
    # The turn stopped by the close is in the store as it ended, not left for the next start.
    assert (row.state, row.open_turn_id, row.clean) == ("stopped", None, True)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    assert [seq for seq, _ in stored] == list(range(1, len(session.fanout.history) + 1))
    kinds = [json.loads(payload)["event"] for _, payload in stored]
    assert "turn.ended" in kinds
