"""``serve --store postgresql://...`` killed (SIGKILL) while a session streams, and started
again on the same database: the session is there, its history contiguous and the same as
what the client saw, the running turn ended once; another ``serve`` on the database meanwhile
is refused in one line. Real processes (serve, the demo agent, PostgreSQL) on the real clock."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import trio

from pg import PostgresServer
from served import (
    ROOT,
    _env,
    check_replay,
    demo_command,
    read_deltas,
    serve,
    whole_history,
    write_config,
)
from supervisor.client import connect

BOUND = 90.0
#: message.delta events the client sees before serve is killed: mid-stream.
KILL_AFTER = 30


def stored_up_to(url: str, session_id: str, seq: int) -> None:
    """Returns once the store at ``url`` holds the session's events up to ``seq``."""
    with psycopg.connect(url, autocommit=True) as connection:
        while True:
            (stored,) = connection.execute(
                "SELECT coalesce(max(last_seq), 0) FROM events WHERE session_id = %s",
                (session_id,),
            ).fetchone() or (0,)
            if stored >= seq:
                return
            time.sleep(0.005)  # rows that appear: nothing to wait on but the table


async def test_serve_killed_mid_stream_comes_back_on_postgresql(
    tmp_path: Path, postgresql: PostgresServer
) -> None:
    url = postgresql.database()
    config = write_config(
        tmp_path,
        {"talker": {"command": demo_command(tmp_path, "--words", "2000", "--delay", "0.005")}},
    )
    seen: dict[int, dict[str, Any]] = {}
    with trio.fail_after(BOUND):
        async with serve(tmp_path, "--config", str(config), "--store", url) as first:
            assert "sessions are stored in" in first.stderr
            async with connect(first.url) as client:
                sid = (await client.start_session("talker"))["session_id"]
                async with client.subscribe(sid) as events:
                    await client.prompt(sid, "keep talking")
                    seen.update((e["seq"], e) for e in await read_deltas(events, KILL_AFTER))
                # Killed once the store holds what the client saw (the writer flushes every few
                # ms, after the clients got the events).
                await trio.to_thread.run_sync(stored_up_to, url, sid, max(seen))
                first.signal(signal.SIGKILL)
                await first.wait_exit()
        async with serve(tmp_path, "--config", str(config), "--store", url) as second:
            # The first serve's lock went with its connection; the second holds it now.
            third = await trio.run_process(
                [sys.executable, "-m", "supervisor.cli", "serve", "--port", "0"]
                + ["--config", str(config), "--store", url],
                env=_env(tmp_path, None),
                cwd=ROOT,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            said = third.stderr.decode()
            assert third.returncode == 2, said
            assert "is in use by another process" in said.splitlines()[-1], said
            assert "Traceback" not in said
            async with connect(second.url) as client:
                (listed,) = await client.sessions()
                assert (listed["session_id"], listed["agent"]) == (sid, "talker")
                history = await whole_history(client, sid)
    # What was stored is what the client saw, byte for byte the same events; after the
    # kill, a gap for what may have been sent unstored (here: nothing was).
    check_replay(history, seen)
    (gap,) = [e for e in history if e["event"] == "stream.gap"]
    assert gap["data"]["from_seq"] > max(seen)
    (ended,) = [e for e in history if e["event"] == "turn.ended"]
    assert ended["data"]["outcome"] == "failed" and "supervisor went away" in ended["data"]["error"]
    assert ended is history[-1]
