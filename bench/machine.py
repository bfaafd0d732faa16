"""What the benchmarks say about the machine they ran on: these machines are shared and noisy,
so every figure comes with how busy the machine was, and the limits a benchmark raised."""

from __future__ import annotations

import os
import resource
import time

__all__ = ["free_cpu", "load_average", "mem_available", "raise_fd_limit", "vmstat_interval"]


def free_cpu(seconds: float = 0.5) -> float:
    """The share of one core a busy loop gets right now: near 1.0 on a quiet machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        pass
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def load_average() -> float:
    """The 1-minute load average: runnable processes, ours and everybody else's."""
    return os.getloadavg()[0]


def mem_available() -> int:
    """``MemAvailable`` of /proc/meminfo, in bytes: what the kernel could still hand out."""
    with open("/proc/meminfo") as meminfo:
        for entry in meminfo:
            if entry.startswith("MemAvailable:"):
                return int(entry.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def vmstat_interval() -> float:
    """How often the kernel folds its per-CPU memory counters into the global ones that
    /proc/meminfo shows (``vm.stat_interval``): a reading can lag a change by this long."""
    try:
        with open("/proc/sys/vm/stat_interval") as interval:
            return float(interval.read())
    except OSError:
        return 1.0


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE to its hard limit (hundreds of sessions hold thousands of fds)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard
