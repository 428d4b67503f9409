"""Evidence of NVML workers that were killed and cannot exit: stuck in the driver, SIGKILL pending.

hami-agent runs NVML in ``python -m hami_agent.nvml.worker`` child processes and SIGKILLs one whose call
misses its deadline. A thread stuck inside the driver sleeps uninterruptibly (state ``D``), so the SIGKILL
stays pending (``SigPnd``/``ShdPnd`` in ``/proc/<pid>/status``) and the process stays, holding its
``/dev/nvidia*`` handles and memory, until the driver returns. The agent starts no new worker while its
limit of such processes is alive (``nvml-stuck-unkillable``); this collector names them from ``/proc``
(state, ``wchan``), which needs no NVML and so still answers while the driver is stuck.
"""

from __future__ import annotations

from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.model import Facts
from hami_agent.nvml.reaper import find_workers


def find_nvml_workers(proc_root: str) -> list[dict[str, object]]:
    """Every NVML worker process visible under ``proc_root``: pid, parent, state, wchan, SIGKILL pending."""
    return [{"pid": w.info.pid, "ppid": w.ppid, "state": w.info.state, "wchan": w.info.wchan,
             "sigkill_pending": bool(w.info.sigkill_pending)} for w in find_workers(proc_root)]


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
