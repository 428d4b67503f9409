"""Evidence of NVML workers that were killed and cannot exit: stuck in the driver, SIGKILL pending.

hami-agent runs NVML in ``python -m hami_agent.nvml.worker`` child processes and SIGKILLs one whose call
misses its deadline. A thread stuck inside the driver sleeps uninterruptibly (state ``D``), so the SIGKILL
stays pending (``SigPnd``/``ShdPnd`` in ``/proc/<pid>/status``) and the process stays, holding its
``/dev/nvidia*`` handles and memory, until the driver returns. The agent starts no new worker while its
limit of such processes is alive (``nvml-stuck-unkillable``); this collector names them from ``/proc``
(state, ``wchan``), which needs no NVML and so still answers while the driver is stuck.
"""

from __future__ import annotations

import os

from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.model import Facts
from hami_agent.nvml.reaper import read_proc_info

WORKER_MARK = b"hami_agent.nvml.worker"
MAX_PROCESSES = 100_000  # /proc entries looked at, at most


def find_nvml_workers(proc_root: str) -> list[dict[str, object]]:
    """Every NVML worker process visible under ``proc_root``: pid, parent, state, wchan, SIGKILL pending."""
    out: list[dict[str, object]] = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return out
    for name in sorted(entries[:MAX_PROCESSES], key=lambda n: (len(n), n)):
        if not name.isdigit():
            continue
        base = os.path.join(proc_root, name)
        try:
            with open(os.path.join(base, "cmdline"), "rb") as fh:
                cmdline = fh.read(4096)
        except OSError:
            continue  # gone, or not ours to read
        if WORKER_MARK not in cmdline:
            continue
        info = read_proc_info(int(name), proc_root)
        ppid = None
        try:
            with open(os.path.join(base, "stat"), encoding="ascii", errors="replace") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            pass
        out.append({"pid": info.pid, "ppid": ppid, "state": info.state, "wchan": info.wchan,
                    "sigkill_pending": bool(info.sigkill_pending)})
    return out


def unkillable(workers: list[dict[str, object]]) -> list[dict[str, object]]:
    """Workers that were sent SIGKILL and are still there (not a zombie: it would be gone already)."""
    return [w for w in workers if w["sigkill_pending"] and w["state"] not in ("Z", "X", None)]


def collect_nvml_workers(ctx: Context, facts: Facts) -> None:
    proc = ctx.proc()
    workers = find_nvml_workers(proc)
    stuck = unkillable(workers)
    facts.set("nvml.workers.count", len(workers), f"{proc}: {len(workers)} NVML worker process(es)")
    facts.set("nvml.workers.unkillable", stuck, *(
        f"{proc}/{w['pid']}: NVML worker (parent {w['ppid']}) state {w['state']}, wchan {w['wchan'] or '?'}, "
        "SIGKILL pending: killed, cannot exit (stuck in the driver)" for w in stuck))
    facts.set("nvml.workers.unkillable_count", len(stuck))
    facts.set("nvml.workers.unkillable_pids",
              ", ".join(f"pid {w['pid']} state {w['state']} wchan {w['wchan'] or '?'}" for w in stuck))
