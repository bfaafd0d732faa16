"""The store's writer process (``supervisor/store/writer_process.py``): killed mid-stream, it
is started again and no event is lost; it goes away with its supervisor however that goes; a
Ctrl-C at the terminal reaches the supervisor, which writes what is left through it; one that
cannot be started is one clear error at open. And the backends' ``open_writes``, the
connection it writes on. Real processes (the supervisors of the last ones are programs of
their own), in-memory agents, the real clock."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from helpers import stored_row
from protocols import events as ev
from served import demo_command, serve, write_config
from supervisor import AgentSpec, open_supervisor
from supervisor.client import connect
from supervisor.config import ConfigError
from supervisor.store.backend import Batch, EventRun, StoreError
from supervisor.store.sqlite import SqliteBackend
from supervisor.store.url import backend_for
from supervisor.store.writer import SessionStore, StoreFault, StoreNotice, StoreRecovered
from supervisor.testing._acp import AcpBehaviour, AcpLauncher
from supervisor.wire.codec import event_json

BOUND = 60.0
SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)
#: message.delta events seen before the writer process is killed: mid-stream, more to come.
KILL_AFTER = 40
#: "seen" lines the program prints before its process group gets a SIGINT.
INTERRUPT_AFTER = 40

#: A supervisor of its own on the store ``argv[1]``: prints ``writer PID`` once open; then,
#: ``wait``, waits to be killed, or, ``stream``, streams a long turn (a line ``seen SID SEQ``
#: for each event its subscriber sees) until a SIGINT, which it takes as ``serve`` does (a
#: graceful stop: the block ends and the supervisor closes).
PROGRAM = """\
import signal
import sys

import trio

from supervisor import AgentSpec, open_supervisor
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

SPEC = AgentSpec(name="fake", protocol="acp", command=["fake"], grace_s=0.5)


async def main(url: str, mode: str) -> None:
    launcher = AcpLauncher(AcpBehaviour(words=100_000, word_interval=0.002))
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with open_supervisor(agents={"fake": SPEC}, launcher=launcher, store=url) as sup:
            print("writer", sup.store.writer_process.pid, flush=True)
            if mode == "wait":
                await trio.sleep_forever()
            session = await sup.start_session("fake")
            async with trio.open_nursery() as nursery:

                async def interrupted() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(interrupted)
                async with session.subscribe() as events:
                    await session.prompt("stream until Ctrl-C")
                    async for event in events:
                        print("seen", session.id, event.seq, flush=True)
    print("closed", flush=True)


trio.run(main, sys.argv[1], sys.argv[2])
"""


class Program:
    """A :data:`PROGRAM` running in a session of its own (as a terminal's foreground process
    group: a signal to its group reaches nothing of the test's)."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        assert process.stdout is not None
        self._stdout = process.stdout
        self._buffer = b""

    @classmethod
    async def start(cls, tmp_path: Path, url: str, mode: str) -> Program:
        script = tmp_path / "program.py"
        script.write_text(PROGRAM)
        process = await trio.lowlevel.open_process(
            [sys.executable, str(script), url, mode],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        return cls(process)

    async def line(self) -> str | None:
        """Its next line of output (None: it closed its stdout)."""
        while b"\n" not in self._buffer:
            chunk = await self._stdout.receive_some()
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    async def writer_pid(self) -> int:
        first = await self.line()
        assert first is not None and first.startswith("writer "), first
        return int(first.split()[1])

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
            await self._stdout.aclose()


async def gone(pid_fd: int, within: float) -> None:
    """Return once the process of ``pid_fd`` exited (its pidfd is readable: an event, whoever
    its parent is); killed first if it still runs after ``within`` seconds, and the test fails."""
    try:
        with trio.fail_after(within):
            await trio.lowlevel.wait_readable(pid_fd)
    except trio.TooSlowError:
        signal.pidfd_send_signal(pid_fd, signal.SIGKILL)
        raise


def runs(path: Path, session_id: str) -> list[tuple[int, int]]:
    """The session's stored runs of events, ``(first_seq, last_seq)`` in order, as the file
    holds them (``events()`` gives each seq once even where runs overlap)."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT first_seq, last_seq FROM events WHERE session_id = ? ORDER BY first_seq",
            (session_id,),
        ).fetchall()
    finally:
        db.close()
    return [(first, last) for first, last in rows]


def each_once(stored: list[tuple[int, int]]) -> int:
    """The highest seq of runs that hold every seq from 1 once (none overlaps another, none
    is missing); fails otherwise."""
    expected = 1
    for first, last in stored:
        assert first == expected, stored
        expected = last + 1
    return expected - 1


async def test_a_writer_process_killed_mid_stream_loses_no_event(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    launcher = AcpLauncher(AcpBehaviour(words=300, word_interval=0.003))
    notices: list[StoreNotice] = []
    with trio.fail_after(BOUND):
        async with open_supervisor(
            agents={"fake": SPEC}, launcher=launcher, store=f"sqlite:///{path}"
        ) as sup:
            store = sup.store
            assert store is not None and store.writer_process is not None
            store.watch(notices.append)
            first = store.writer_process.pid
            assert first is not None
            # Not the supervisor's stdio (an ACP front door's stdout is its editor's channel).
            assert [os.readlink(f"/proc/{first}/fd/{fd}") for fd in (0, 1)] == ["/dev/null"] * 2
            session = await sup.start_session("fake")
            seen: list[int] = []
            async with session.subscribe() as events:
                await session.prompt("stream through a kill")
                deltas = 0
                async for event in events:
                    seen.append(event.seq)
                    if event.kind == "message.delta":
                        deltas += 1
                        if deltas == KILL_AFTER:
                            os.kill(first, signal.SIGKILL)
                    if event.kind == "turn.ended":
                        break
            assert deltas > KILL_AFTER  # (the kill was mid-stream)
            # A second child writes: the first's batch again, and the rest of the turn.
            assert store.writer_process.started == 2
            assert store.writer_process.pid not in (None, first)
            stored = await store.events(session.id, 0, 1_000_000)
            history = [bytes(b) for b in session.fanout.history]
            assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
            assert set(seen) <= {seq for seq, _ in stored}
            assert [payload for _, payload in stored] == history[: len(stored)]
            # The turn's answer is whole: the second child read back what the first wrote.
            said = [json.loads(payload) for _, payload in stored]
            words = "".join(e["data"]["text"] for e in said if e["event"] == "message.delta")
            texts = await store.texts(session.id)
            assert [(t.kind, t.text) for t in texts if t.kind == "answer"] == [("answer", words)]
        assert [type(notice) for notice in notices] == [StoreFault, StoreRecovered]
        fault = notices[0]
        assert isinstance(fault, StoreFault)
        assert "writer process" in fault.error and "went away" in fault.error, fault.error
        assert str(path) in fault.where
        # Each event once in the file, to the session's last (what its close recorded too).
        assert each_once(runs(path, session.id)) == len(session.fanout.history)


async def test_the_writer_process_goes_away_with_its_supervisor_killed(tmp_path: Path) -> None:
    with trio.fail_after(BOUND):
        program = await Program.start(tmp_path, f"sqlite:///{tmp_path / 'sessions.db'}", "wait")
        try:
            pid = await program.writer_pid()
            pid_fd = os.pidfd_open(pid)  # (before the kill: the pid is not reused meanwhile)
        finally:
            await program.aclose()  # SIGKILL: nothing of it closes the child's socket
        try:
            assert program.process.returncode == -signal.SIGKILL
            # Not this process's child (waitpid cannot): its exit is its pidfd's readability.
            await gone(pid_fd, within=10.0)
        finally:
            os.close(pid_fd)


async def test_a_ctrl_c_reaches_the_supervisor_which_writes_what_is_left(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    url = f"sqlite:///{path}"
    with trio.fail_after(BOUND):
        program = await Program.start(tmp_path, url, "stream")
        try:
            pid = await program.writer_pid()
            pid_fd = os.pidfd_open(pid)
            try:
                # A session of its own: a Ctrl-C at the terminal (SIGINT to the foreground
                # process group) reaches the supervisor alone, which says when it is to go.
                assert os.getsid(pid) != os.getsid(program.process.pid)
                assert os.getpgid(pid) != os.getpgid(program.process.pid)
                seen: dict[str, list[int]] = {}
                lines: list[str] = []
                while (line := await program.line()) is not None:
                    lines.append(line)
                    if line.startswith("seen "):
                        _, sid, seq = line.split()
                        seen.setdefault(sid, []).append(int(seq))
                        if len(seen[sid]) == INTERRUPT_AFTER:
                            os.killpg(program.process.pid, signal.SIGINT)
                assert await program.process.wait() == 0, lines[-3:]
                assert lines[-1] == "closed"
                await gone(pid_fd, within=10.0)  # (the supervisor closed it)
            finally:
                os.close(pid_fd)
        finally:
            await program.aclose()
    [(sid, seqs)] = seen.items()
    assert len(seqs) >= INTERRUPT_AFTER
    # Everything its subscriber saw is stored, each once, and what the close recorded after
    # it; the session was closed cleanly (nothing of it went unwritten).
    highest = each_once(runs(path, sid))
    assert highest >= max(seqs)
    backend = backend_for(url)  # (a serve's: its lock was let go)
    assert backend is not None
    backend.open()
    try:
        stored = backend.session(sid)
        assert stored is not None and stored.clean
        assert [seq for seq, _ in backend.events(sid, 0, 1_000_000)] == list(range(1, highest + 1))
    finally:
        backend.close()


async def test_a_writer_process_that_cannot_start_is_one_error_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sessions.db"
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # (its child's interpreter)
    with trio.fail_after(BOUND):
        with pytest.raises(StoreError) as raised:
            async with open_supervisor(
                agents={"fake": SPEC}, launcher=AcpLauncher(), store=f"sqlite:///{path}"
            ):
                raise AssertionError("opened without a writer process")
    message = str(raised.value)
    assert "writer process" in message and str(path) in message, message
    assert "\n" not in message
    monkeypatch.undo()
    # Nothing left open: the lock was let go at once (a serve's open would wait for it and
    # fail), and the owners row went with it.
    again = SqliteBackend(path, "serve")
    again.open()
    try:
        assert list(again.owners()) == [again.owner.token]
    finally:
        again.close()


def test_open_writes_writes_beside_the_owner(store_url: str) -> None:
    owner = backend_for(store_url)
    assert owner is not None
    owner.open()
    try:
        writes = backend_for(store_url)
        assert writes is not None
        writes.open_writes()
        try:
            payloads = [b'{"event":"message.delta","seq":%d}' % seq for seq in (1, 2, 3)]
            writes.write(
                Batch(
                    sessions=[stored_row()],
                    events=[EventRun(session_id="s1", first_seq=1, payloads=payloads)],
                )
            )
            assert [s.id for s in owner.sessions()] == ["s1"]
            assert [payload for _, payload in owner.events("s1", 0, 10)] == payloads
            assert list(owner.owners()) == [owner.owner.token]  # (no row of its own)
        finally:
            writes.close()
        # Its close leaves the owner's row and lock alone: another process sees it alive.
        other = backend_for(store_url, "acp")
        assert other is not None
        other.open()
        try:
            owners = other.owners()
            assert set(owners) == {owner.owner.token, other.owner.token}
            assert owners[owner.owner.token][1]
        finally:
            other.close()
        assert len(owner.events("s1", 0, 10)) == 3  # (and its connection goes on)
    finally:
        owner.close()


def test_open_writes_of_a_missing_sqlite_file_creates_none(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(StoreError, match="cannot open the store"):
        SqliteBackend(path, "serve").open_writes()
    assert not path.exists()


async def test_an_unknown_store_writer_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    with pytest.raises(ConfigError, match="bogus"):
        async with open_supervisor(
            agents={"fake": SPEC},
            launcher=AcpLauncher(),
            store=f"sqlite:///{path}",
            store_writer="bogus",
        ):
            raise AssertionError("opened with store_writer='bogus'")
    assert not path.exists()  # (refused before the store was opened)


def _writer_children(pid: int) -> list[int]:
    """The store's writer processes among ``pid``'s children."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # (gone meanwhile)
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"writer_child" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_serve_writes_through_the_writer_its_config_names(
    tmp_path: Path, writer: str
) -> None:
    config = write_config(tmp_path, {"talker": {"command": demo_command(tmp_path)}})
    with config.open("a") as toml:
        toml.write(f'[store]\nurl = "sqlite:///{tmp_path / "sessions.db"}"\nwriter = "{writer}"\n')
    with trio.fail_after(BOUND):
        async with serve(tmp_path, "--config", str(config)) as served:
            async with connect(served.url) as client:
                session = (await client.start_session("talker"))["session_id"]
                assert [s["session_id"] for s in await client.sessions()] == [session]
            children = _writer_children(served.process.pid)
            assert len(children) == (writer == "process"), children


async def test_a_search_has_the_writer_process_index_what_waits(tmp_path: Path) -> None:
    """A text the child wrote waits for an idle store to be indexed; a search
    (``SessionStore.search``) has the child index it first: found as soon as it is written."""
    path = tmp_path / "sessions.db"
    store = SessionStore(SqliteBackend(path), apart=True)
    said = ev.MessageDelta(session_id="s1", seq=1, timestamp=1.0, turn_id=None, text="hi")
    started = ev.TurnStarted(session_id="s1", seq=2, timestamp=1.0, turn_id="t1", text="okapi")

    def indexed() -> int:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return int(db.execute("SELECT count(*) FROM texts_fts_docsize").fetchone()[0])

    with trio.fail_after(BOUND):
        await store.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            # (the child's first write leaves settle what a writer before it left: nothing)
            store.record([said], [event_json(said)])
            await store.flushed()
            store.record([started], [event_json(started)])
            await store.flushed()
            assert indexed() == 0  # (its index waits for an idle store, or a search)
            hits = await store.search("okapi", 5)
            await store.aclose()
    assert [(hit.session_id, hit.kind, hit.seq) for hit in hits] == [("s1", "prompt", 2)]


async def test_a_batchs_event_bytes_go_beside_its_pickle_and_come_out_whole(
    tmp_path: Path,
) -> None:
    """The writer process gets a batch's large pieces of event bytes out of band (the event
    loop never copies them into the pickle), more pieces than one ``sendmsg`` takes, and
    small pieces in the pickle: every event is stored as it was."""
    from supervisor.store.backend import OUT_OF_BAND_BYTES
    from supervisor.store.writer_child import frame
    from supervisor.store.writer_process import WriterProcess

    path = tmp_path / "sessions.db"
    backend = SqliteBackend(path)  # (the supervisor's: a writer process writes beside it)
    backend.open()
    payload = b'{"kind":"message.delta","text":"' + b"w" * 200 + b'"}'
    per_run = OUT_OF_BAND_BYTES // len(payload) + 1  # (a run's joined bytes: out of band)
    runs = [
        EventRun(
            session_id="s1",
            first_seq=1 + index * per_run,
            payloads=[b"\n".join([payload] * per_run)],
            counts=[per_run],
        )
        for index in range(1100)  # (more than the kernel takes in one sendmsg: IOV_MAX)
    ]
    small = EventRun(session_id="s2", first_seq=1, payloads=[b'{"kind":"a"}', b'{"kind":"b"}'])
    batch = Batch(events=[*runs, small])
    pieces = frame(("write", batch))
    assert len(pieces) == 2 + len(runs)  # (the head, the pickle, each run's bytes)
    assert len(pieces[1]) < sum(map(len, pieces[2:])) / 10  # the bytes are not in the pickle
    writer = WriterProcess(f"sqlite:///{path}", str(path))
    try:
        with trio.fail_after(BOUND):
            try:
                await writer.write(batch)
            finally:
                await writer.aclose()
        stored = backend.events("s1", 0, len(runs) * per_run + 10)
        assert [seq for seq, _ in stored] == list(range(1, len(runs) * per_run + 1))
        assert {data for _, data in stored} == {payload}
        assert backend.events("s2", 0, 10) == [(1, b'{"kind":"a"}'), (2, b'{"kind":"b"}')]
    finally:
        backend.close()
