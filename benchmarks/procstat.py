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
