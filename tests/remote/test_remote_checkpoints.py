"""Checkpoints of a session on another host, taken by its node where the files are: a real
node on this machine (the ``env`` transport), its demo agent writing files in a turn (its
``write=NAME``, then a tool call that runs until it is stopped); and a node too old to keep
any (the fake node, which says nothing of checkpoints)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from hosts import env_node
from test_remote_faults import FAR, fake_host

from helpers import Recorder
from protocols import events as ev
from supervisor import open_supervisor
from supervisor.client import GatewayError, connect
from supervisor.config import builtin_agents
from supervisor.errors import BadRequest, Busy
from supervisor.gateway import Gateway
from supervisor.remote import RemoteSession
from supervisor.supervisor import Supervisor
from supervisor.testing import record

BOUND = 60.0
#: a turn that writes two files, then runs a tool until it is stopped
EDITS = "write=notes.txt write=new.txt tool=100"
BEFORE = b"the notes as they were\n\x00\xff raw bytes\n"
CHANGES = [
    {"path": "new.txt", "change": "added"},
    {"path": "notes.txt", "change": "modified"},
]


@asynccontextmanager
async def remote_session(tmp_path: Path) -> AsyncIterator[tuple[Supervisor, RemoteSession, Path]]:
    """A front whose agent runs in a real node on this machine, in ``work``."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_bytes(BEFORE)
    here = env_node(tmp_path / "node")
    demo = builtin_agents()["demo"].with_args("--state-dir", str(tmp_path / "demo"))
    agents = {"far": demo.with_options(name="far", hosts=("here",))}
    async with open_supervisor(agents=agents, hosts={"here": here}) as sup:
        session = await sup.start_session("far", cwd=str(work))
        assert isinstance(session, RemoteSession)
        yield sup, session, work


async def test_a_cancelled_remote_turn_lists_its_changes_and_rewinds_byte_for_byte(
    tmp_path: Path,
) -> None:
    with trio.fail_after(BOUND):
        async with remote_session(tmp_path) as (_, session, work):
            assert session.keeps_checkpoints
            async with record(session) as recorder:
                turn = await session.prompt(EDITS)
                await recorder.wait_kind("tool.call", turn_id=turn.id)  # (the files are written)
                written = (work / "notes.txt").read_bytes()
                assert written == EDITS.encode() + b"\n"

                with pytest.raises(Busy, match="runs"):
                    await session.rewind(turn.id)
                with pytest.raises(BadRequest, match="no changes of"):
                    await session.diff(turn.id, "notes.txt")  # (not ended)

                receipt = await session.cancel()
                assert receipt.outcome == "cancelled"
                assert receipt.changes == CHANGES
                assert receipt.host == "here"
                ended = await recorder.wait_kind("turn.ended", turn_id=turn.id)
                assert isinstance(ended, ev.TurnEnded) and ended.changes == CHANGES

                diff = await session.diff(turn.id, "notes.txt")
                assert (diff["turn_id"], diff["path"], diff["binary"]) == (
                    turn.id,
                    "notes.txt",
                    True,  # (BEFORE has a NUL)
                )
                added = await session.diff(turn.id, "new.txt")
                assert f"+{EDITS}" in added["diff"], added
                assert not added["binary"] and not added["truncated"]

                result = await session.rewind(turn.id)
                assert result["restored"] == ["new.txt", "notes.txt"]
                assert result["not_restored"] == []
                assert (work / "notes.txt").read_bytes() == BEFORE
                assert not (work / "new.txt").exists()
                rewound = await recorder.wait_kind("session.rewound")
                assert isinstance(rewound, ev.SessionRewound)
                assert rewound.restored == result["restored"]
                assert rewound.session_id == session.id

                await session.rewind(result["undo"])  # the rewind is itself undoable
                assert (work / "notes.txt").read_bytes() == written
                with pytest.raises(BadRequest, match="no checkpoint of 'nope'"):
                    await session.rewind("nope")


async def test_stop_and_rewind_of_a_remote_turn_in_one_call_and_through_the_gateway(
    tmp_path: Path,
) -> None:
    """``agent.cancel {rewind: true}`` of the front's gateway stops the node's turn and
    rewinds it there; ``session.rewind`` while a turn runs is ``busy``, and a diff is one."""
    with trio.fail_after(BOUND):
        async with remote_session(tmp_path) as (sup, session, work), trio.open_nursery() as n:
            url = await n.start(Gateway(sup, port=0).serve)
            async with connect(url) as client:
                recorder = Recorder(session)  # type: ignore[arg-type]
                await n.start(recorder.run)
                turn = await session.prompt(EDITS)
                await recorder.wait_kind("tool.call", turn_id=turn.id)
                assert (work / "new.txt").exists()
                with pytest.raises(GatewayError) as raised:
                    await client.request(
                        "session.rewind", {"session_id": session.id, "turn_id": turn.id}
                    )
                assert raised.value.code == "busy", raised.value

                receipt = await client.request(
                    "agent.cancel", {"session_id": session.id, "rewind": True}
                )
                assert (receipt["outcome"], receipt["changes"]) == ("cancelled", CHANGES)
                assert receipt["restored"]["restored"] == ["new.txt", "notes.txt"]
                assert (work / "notes.txt").read_bytes() == BEFORE
                assert not (work / "new.txt").exists()

                diff = await client.request(
                    "session.diff",
                    {"session_id": session.id, "turn_id": turn.id, "path": "new.txt"},
                )
                assert f"+{EDITS}" in diff["diff"], diff
                with pytest.raises(GatewayError) as raised:
                    await client.request(
                        "session.rewind", {"session_id": session.id, "turn_id": "nope"}
                    )
                assert raised.value.code == "bad_request", raised.value
            n.cancel_scope.cancel()


async def test_a_node_too_old_to_keep_checkpoints_is_never_asked_and_says_so(
    tmp_path: Path,
) -> None:
    """A node whose subscribe answer says nothing of checkpoints (one from before them): a
    rewind or a diff is ``bad_request`` naming its version, and a stop-and-rewind stops the
    turn and says in ``restored`` why nothing was rewound; the node is asked neither."""
    asked = tmp_path / "asked.log"
    host = fake_host("none", "start", "--log", str(asked))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"far": FAR}, hosts={"h": host}) as sup:
            session = await sup.start_session("far")
            assert isinstance(session, RemoteSession)
            assert not session.keeps_checkpoints
            async with record(session) as recorder:
                turn = await session.prompt("hi")
                await recorder.wait_kind("message.delta", turn_id=turn.id)
                with pytest.raises(BadRequest, match="too old to keep checkpoints"):
                    await session.rewind(turn.id)
                with pytest.raises(BadRequest, match="too old to keep checkpoints"):
                    await session.diff(turn.id, "a.txt")
                receipt = await session.cancel(rewind=True)
                assert receipt.outcome == "cancelled"
                assert receipt.restored is not None
                assert receipt.restored["code"] == "bad_request"
                assert "too old to keep checkpoints" in receipt.restored["error"]
    actions = asked.read_text()
    assert "agent.cancel" in actions
    assert "session.rewind" not in actions and "session.diff" not in actions


async def test_a_remote_rewind_that_would_undo_another_sessions_edit_is_a_conflict_until_forced(
    tmp_path: Path,
) -> None:
    """Two sessions of one node in one directory: the node's refusal comes back as the
    front's ``conflict``, naming the other session, and ``force`` goes over the link."""
    from supervisor.errors import Conflict

    async def turn(session: RemoteSession, text: str) -> None:
        async with record(session) as recorder:
            handle = await session.prompt(text)
            await recorder.wait_kind("turn.ended", turn_id=handle.id)

    with trio.fail_after(BOUND):
        async with remote_session(tmp_path) as (sup, first, work):
            second = await sup.start_session("far", cwd=str(work))
            assert isinstance(second, RemoteSession)
            await turn(first, "write=notes.txt words=2 first")
            await turn(second, "write=notes.txt words=2 second")
            # (named as the node knows its sessions)
            with pytest.raises(Conflict, match=f"session {second.node_id} changed notes.txt"):
                await first.rewind("t1")
            assert (work / "notes.txt").read_bytes() == b"write=notes.txt words=2 second\n"
            result = await first.rewind("t1", force=True)
            assert result["restored"] == ["notes.txt"]
            assert (work / "notes.txt").read_bytes() == BEFORE


async def test_a_stored_remote_sessions_rewind_starts_it_again_on_its_host(
    tmp_path: Path,
) -> None:
    """A session an earlier front kept on another host, its agent not running: a rewind (and a
    diff) over the wire starts it again there, as a prompt would, and is answered by the
    node: never a hint to prompt it first."""
    from typing import Any, cast

    from supervisor.gateway.actions import Actions
    from supervisor.store.backend import Batch, StoredSession
    from supervisor.store.sqlite import SqliteBackend
    from supervisor.wire.requests import Diff, Rewind

    backend = SqliteBackend(tmp_path / "sessions.db")
    backend.open()
    stored = StoredSession(
        id="s1",
        agent="far",
        protocol="acp",
        host="here",
        cwd=str(tmp_path),
        mcp_servers="[]",
        agent_session_id=None,
        created=1.0,
        last_active=2.0,
        state="stopped",
        open_turn_id=None,
        clean=True,
    )
    backend.write(Batch(sessions=[stored]))
    backend.close()
    here = env_node(tmp_path / "node")
    demo = builtin_agents()["demo"]
    agents = {"far": demo.with_options(name="far", hosts=("here",))}
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents=agents, hosts={"here": here}, store=f"sqlite:///{tmp_path / 'sessions.db'}"
        ) as sup:
            actions = Actions(sup)
            client = cast(Any, None)
            answers = {
                Rewind(session_id="s1", turn_id="t1"): "session s1 has no checkpoint of 't1'",
                Diff("s1", "t1", "a.txt"): "session s1 has no changes of 't1' (a turn that has"
                " ended, whose checkpoints are kept)",
            }
            for call, answer in answers.items():
                with pytest.raises(BadRequest) as refused:
                    await actions.run(1, call, client)
                assert str(refused.value) == answer  # the node's: it has no such turn
            session = sup.get("s1")
            assert session.state == "ready"  # started again on its host, for the rewind
            assert isinstance(session, RemoteSession)
            node_pid = session.link.node_pid
            await sup.stop_session("s1")
    # stopped and undriven for detach_s, the node exits: nothing is left after the test
    import psutil

    assert node_pid is not None
    _, alive = psutil.wait_procs([psutil.Process(node_pid)], timeout=BOUND)
    assert alive == []
