"""CPU time of one process as Linux accounts it (``/proc/<pid>/stat``), for the benchmarks that charge
CPU to the parts of a simulated cluster."""

from __future__ import annotations

import os


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process in seconds: its threads included, its reaped children not.
    Raises OSError when the process is gone."""
    return process_start_and_cpu_s(pid)[1]


def process_start_and_cpu_s(pid: int | str) -> tuple[int, float]:
    """(start time in clock ticks after boot, utime + stime in seconds) of a live process: the start time
    tells a process from a later one that reuses its pid. Raises OSError when the process is gone."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()  # the command name may hold spaces and ")"
    return int(fields[19]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_or_zero(pid: int) -> float:
    """``process_cpu_s``, 0 for a process that is gone (a helper that exited counts nothing more)."""
    try:
        return process_cpu_s(pid)
    except OSError:
        return 0.0


def thread_wakeups(tid: int | str) -> int:
    """Voluntary context switches of one thread (``/proc/<tid>/status`` answers for any thread id): each is
    the thread blocking (a sleep, a poll, a lock) and so waking once more. 0 for a thread that has ended."""
    try:
        with open(f"/proc/{tid}/status") as fh:
            for line in fh:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def process_wakeups(pid: int) -> int:
    """Wakeups of a live process, its threads added up (:func:`thread_wakeups`). Unlike CPU time, this count
    is the code's own: an idle process's CPU is mostly what the machine charges per wakeup, which differs
    several-fold between machines and, on a shared VM, between runs minutes apart (docs/performance.md).
    Raises OSError when the process is gone."""
    return sum(thread_wakeups(tid) for tid in os.listdir(f"/proc/{pid}/task"))
