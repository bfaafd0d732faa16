"""``agent-supervisor sessions list|show|export``, reading a store a supervisor filled: the
sessions newest first with their first prompts, a session's turns and receipts, its events as
the wire bytes stored; read beside a running supervisor; one line for a missing store, an
unknown session. In-memory agents, on the real clock."""

from __future__ import annotations

import io
import json
import os
import socket
from pathlib import Path

import pytest
import trio

from helpers import run_turn, stored_row
from supervisor import AgentSpec, open_supervisor
from supervisor.cli import main
from supervisor.clients.sessions import run_sessions
from supervisor.store.backend import Batch
from supervisor.store.url import backend_for
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

BOUND = 30.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


async def fill(url: str) -> dict[str, list[bytes]]:
    """Two sessions: s1 answered "the zebra crossed"; s2's turn cancelled mid-answer. Returns
    each session's history as clients got it (wire bytes)."""
    launcher = AcpLauncher(AcpBehaviour(text="the zebra crossed", word_interval=0))
    with trio.fail_after(BOUND):
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            one = await sup.start_session("fake")
            await run_turn(one, "tell me\nabout a zebra")
            launcher.behaviour = AcpBehaviour(words=1000, word_interval=0.05)
            two = await sup.start_session("fake")
            async with two.subscribe() as events:
                await two.prompt("count " + "to a thousand " * 10)
                async for event in events:
                    if event.kind == "message.delta":
                        break
                await two.cancel(reason="enough")
        return {s.id: [bytes(b) for b in s.fanout.history] for s in (one, two)}


def run(url: str, command: str, session_id: str | None = None) -> tuple[str, bytes]:
    out, raw = io.StringIO(), io.BytesIO()
    run_sessions(command, url, session_id, out, raw)
    return out.getvalue(), raw.getvalue()


async def test_list_show_and_export(store_url: str) -> None:
    seen = await fill(store_url)
    listed, _ = run(store_url, "list")
    header, second, first = listed.splitlines()
    assert header.split() == ["ID", "AGENT", "CREATED", "LAST", "ACTIVE", "FIRST", "PROMPT"]
    assert second.startswith("s2 ") and " fake " in second
    assert second.endswith("  " + ("count " + "to a thousand " * 10)[:57] + "...")
    assert first.startswith("s1 ") and first.endswith("tell me about a zebra")

    shown, _ = run(store_url, "show", "s1")
    assert shown.startswith("session s1: fake (acp), in ")
    assert "-- turn t1\nprompt (seq " in shown
    assert "  tell me\n  about a zebra\n" in shown
    assert "answer (seq " in shown and "  the zebra crossed\n" in shown
    assert "receipt" not in shown  # (a turn that ends by itself has none)
    shown, _ = run(store_url, "show", "s2")
    assert "-- turn t1\nprompt (seq " in shown
    assert "\nreceipt (seq " in shown and ": cancelled, " in shown and "reason enough" in shown

    for sid, history in seen.items():
        _, exported = run(store_url, "export", sid)
        assert exported.split(b"\n")[:-1] == history  # the wire bytes, one per line
        assert [json.loads(line)["seq"] for line in exported.splitlines()] == list(
            range(1, len(history) + 1)
        )


def test_list_is_newest_created_first_whatever_was_active_last(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    backend = backend_for(url)
    assert backend is not None
    backend.open()
    rows = [("s1", 100.0, 900.0), ("s2", 200.0, 300.0), ("s10", 300.0, 400.0)]
    backend.write(
        Batch(
            sessions=[
                stored_row(sid, created=created, last_active=active, state="stopped")
                for sid, created, active in rows
            ]
        )
    )
    backend.close()
    listed, _ = run(url, "list")
    assert [line.split()[0] for line in listed.splitlines()[1:]] == ["s10", "s2", "s1"]


async def test_the_commands_through_main_and_their_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    await fill(url)
    assert main(["sessions", "--store", url, "list"]) == 0
    assert capsys.readouterr().out.count("\n") == 3

    assert main(["sessions", "--store", url, "show", "s9"]) == 1
    err = capsys.readouterr().err
    assert (
        err == f"agent-supervisor sessions: no session 's9' in the store {tmp_path}/sessions.db\n"
    )

    missing = f"sqlite:///{tmp_path / 'nothing.db'}"
    assert main(["sessions", "--store", missing, "list"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "nothing.db").exists()  # never created by reading

    # Read beside a running supervisor: its session is said to run there.
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=AcpLauncher(AcpBehaviour()), store=url
        ) as sup:
            session = await sup.start_session("fake")
            assert sup.store is not None
            await sup.store.flushed()  # (its row is written a few ms after it starts)
            code = await trio.to_thread.run_sync(
                main, ["sessions", "--store", url, "show", session.id]
            )
            assert code == 0, capsys.readouterr().err
            said = capsys.readouterr().out.splitlines()[1]
            assert f"in serve pid {os.getpid()} on {socket.gethostname()}" in said, said
