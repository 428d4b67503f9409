"""CPU time of one process as Linux accounts it (``/proc/<pid>/stat``), for the benchmarks that charge
CPU to the parts of a simulated cluster."""

from __future__ import annotations

import os


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process in seconds: its threads included, its reaped children not.
    Raises OSError when the process is gone."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()  # the command name may hold spaces and ")"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_or_zero(pid: int) -> float:
    """``process_cpu_s``, 0 for a process that is gone (a helper that exited counts nothing more)."""
    try:
        return process_cpu_s(pid)
    except OSError:
        return 0.0


def process_wakeups(pid: int) -> int:
    """Voluntary context switches of a live process, its threads added up: each is a thread that blocked
    (a sleep, a poll, a lock) and so woke once more. Unlike CPU time, this count is the code's own: an idle
    process's CPU is mostly what the machine charges per wakeup, which differs several-fold between machines
    and, on a shared VM, between runs minutes apart (docs/performance.md). Raises OSError when the process is
    gone."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                for line in fh:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
                        break
        except FileNotFoundError:  # a thread that ended between the listing and the read
            continue
    return total
