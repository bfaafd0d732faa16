"""Where a throughput run's passes go: an opt-in diagnostic of ``bench/throughput.py``
(``--diagnose``), never part of its timed figures.

Inside the window it records, per pass of trio's run loop, how long the pass was, whether it
blocked in epoll (and for how long) and which tasks stepped; and at the seams of the flood's
path, how many lines each pipe read brought (the agent reader's ``read_pipe``), how many lines
each actor run handled (``Session._work_through_lines``) and how many frames each socket write
carried (the gateway's ``send_frames``). Two runs of the same bench that differ by half in
CPU per event are then told apart by their histograms, not guessed at.

The wrappers cost a few hundred nanoseconds a call, the instrument a little per task step: a
traced run is a little slower than an untraced one, alike for fast and slow runs.
"""

from __future__ import annotations

import collections
import gc
import resource
import time
from collections.abc import Callable
from typing import Any

import trio

import supervisor.agents.process_link as agent_link
from supervisor.gateway.websocket import ServerWebSocket
from supervisor.runtime.session import Session


class PassTrace(trio.abc.Instrument):
    """Run-loop passes, their length, their epoll waits and their task steps."""

    def __init__(self) -> None:
        self.passes = 0
        self.blocking_waits = 0  # passes whose epoll wait had a timeout > 0
        self.waited_s = 0.0  # time spent inside epoll waits
        self.steps: collections.Counter[str] = collections.Counter()
        self.steps_per_pass: collections.Counter[int] = collections.Counter()
        self._wait_start = 0.0
        self._pass_steps = 0

    def before_io_wait(self, timeout: float) -> None:
        if timeout > 0:
            self.blocking_waits += 1
        self._wait_start = time.perf_counter()

    def after_io_wait(self, timeout: float) -> None:
        self.waited_s += time.perf_counter() - self._wait_start
        self.passes += 1
        self.steps_per_pass[self._pass_steps] += 1
        self._pass_steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._pass_steps += 1
        self.steps[task.name.rsplit(".", 1)[-1]] += 1


class SeamTrace:
    """Histograms at the flood's seams: lines per read, lines per actor run, frames per write."""

    def __init__(self) -> None:
        self.lines_per_read: collections.Counter[int] = collections.Counter()
        self.lines_per_run: collections.Counter[int] = collections.Counter()
        self.frames_per_write: collections.Counter[int] = collections.Counter()


class Traced:
    """``with Traced() as trace: ...`` traces the run loop and the seams while inside (the
    wrappers undone on leaving), and counts the server's context switches and collections."""

    def __init__(self) -> None:
        self.passes, self.seams = PassTrace(), SeamTrace()
        self.gc_runs: collections.Counter[int] = collections.Counter()
        self.gc_s = 0.0
        self._gc_start = 0.0
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> Traced:
        seams = self.seams
        read_pipe = agent_link.read_pipe
        work_through_lines = Session._work_through_lines
        send_frames = ServerWebSocket.send_frames

        async def traced_read(stream: trio.abc.ReceiveStream, drained: bool = False) -> bytes:
            data = await read_pipe(stream, drained)
            seams.lines_per_read[data.count(b"\n")] += 1
            return data

        def traced_lines(self: Session, lines: list[Any], allowed: int) -> int:
            start = self._batch_at
            spent = work_through_lines(self, lines, allowed)
            seams.lines_per_run[self._batch_at - start] += 1
            return spent

        async def traced_send(self: ServerWebSocket, frames: list[bytes]) -> None:
            seams.frames_per_write[len(frames)] += 1
            await send_frames(self, frames)

        def undo() -> None:
            agent_link.read_pipe = read_pipe
            Session._work_through_lines = work_through_lines  # type: ignore[method-assign]
            ServerWebSocket.send_frames = send_frames  # type: ignore[method-assign]

        agent_link.read_pipe = traced_read  # type: ignore[assignment]
        Session._work_through_lines = traced_lines  # type: ignore[method-assign]
        ServerWebSocket.send_frames = traced_send  # type: ignore[method-assign]
        self._undo.append(undo)
        trio.lowlevel.add_instrument(self.passes)
        self._undo.append(lambda: trio.lowlevel.remove_instrument(self.passes))
        gc.callbacks.append(self._on_gc)
        self._undo.append(lambda: gc.callbacks.remove(self._on_gc))
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self._children = _children_cpu()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.voluntary = usage.ru_nvcsw - self._usage.ru_nvcsw
        self.involuntary = usage.ru_nivcsw - self._usage.ru_nivcsw
        self.cpu_s = (usage.ru_utime + usage.ru_stime) - (
            self._usage.ru_utime + self._usage.ru_stime
        )
        self.system_s = usage.ru_stime - self._usage.ru_stime
        self.faults = usage.ru_minflt - self._usage.ru_minflt
        after = _children_cpu()
        self.children_s = {name: after[name] - self._children.get(name, 0.0) for name in after}
        while self._undo:
            self._undo.pop()()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_runs[info["generation"]] += 1
            self.gc_s += time.perf_counter() - self._gc_start

    def report(self, events: int) -> str:
        per_k = 1000 / max(events, 1)
        passes, seams = self.passes, self.seams
        common = passes.steps.most_common(6)
        steps = ", ".join(f"{name} {count * per_k:.0f}" for name, count in common)
        return "\n".join(
            [
                f"      per event: wall {self.wall_s * 1e6 / events:.2f} us, CPU"
                f" {self.cpu_s * 1e6 / events:.2f} us (system {self.system_s * 1e6 / events:.2f}),"
                f" in epoll {passes.waited_s * 1e6 / events:.2f} us, in gc"
                f" {self.gc_s * 1e6 / events:.2f} us (runs by generation {dict(self.gc_runs)});"
                f" context switches {self.voluntary} voluntary, {self.involuntary} involuntary;"
                f" page faults {self.faults * per_k:.1f} per 1,000 events",
                "      the other processes' CPU per event: "
                + ", ".join(
                    f"{name} {cpu * 1e6 / events:.2f} us" for name, cpu in self.children_s.items()
                ),
                f"      passes per 1,000 events {passes.passes * per_k:.1f}"
                f" (blocking epoll waits {passes.blocking_waits * per_k:.1f})",
                f"      task steps per 1,000 events: {steps}",
                f"      steps per pass: {summary(passes.steps_per_pass)}",
                f"      lines per pipe read: {summary(seams.lines_per_read)}",
                f"      lines per actor run: {summary(seams.lines_per_run)}",
                f"      frames per socket write: {summary(seams.frames_per_write)}",
            ]
        )


def _children_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's children, by what they run."""
    import psutil

    cpu: dict[str, float] = collections.defaultdict(float)
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            name = "agent" if "fake_light_agent" in " ".join(child.cmdline()) else "receivers"
        except psutil.Error:
            continue
        cpu[name] += times.user + times.system
    return dict(cpu)


def summary(histogram: collections.Counter[int]) -> str:
    """Count, mean and a few quantiles of a histogram, weighted by the values (what share of
    the lines went through reads of at most that size) and by the calls."""
    calls = sum(histogram.values())
    total = sum(size * count for size, count in histogram.items())
    if not calls:
        return "none"

    def quantile(q: float, weight: Callable[[int, int], int]) -> int:
        whole = sum(weight(size, count) for size, count in histogram.items())
        seen = 0
        for size in sorted(histogram):
            seen += weight(size, histogram[size])
            if seen >= q * whole:
                return size
        return max(histogram)

    by_call = [quantile(q, lambda size, count: count) for q in (0.1, 0.5, 0.9)]
    by_item = [quantile(q, lambda size, count: size * count) for q in (0.1, 0.5, 0.9)]
    return (
        f"{calls} calls, mean {total / calls:.1f}; p10/p50/p90 per call {by_call},"
        f" per item {by_item}"
    )
