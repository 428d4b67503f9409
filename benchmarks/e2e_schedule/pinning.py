"""Each process of the simulated cluster on cores of its own (issue 31 item 6: "real cores").

On the two shared cores of a build machine the benchmark's ratio is a CPU ratio: the simulated API server,
the node hosts and the kube-scheduler simulator take the cores the extender would use, and each pod's
extra work anywhere slows every pod. In a cluster they run on different machines. ``--pin`` gives each
part its own cores on a machine that has enough (the lent 16-core GPU machine): the benchmark's process
(the kube-scheduler simulator and its observers), the API server, the extender and every node host, two
cores each (a Python process is mostly one thread at a time, plus gRPC's and the kernel's work beside it).

Pinned with ``sched_setaffinity(2)`` on every thread of a process right after it starts; the threads it
starts later inherit the mask from the thread that starts them. ``verify`` reads every thread's mask back
at the end of a run, so the report says whether the pinning held.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CORES_EACH = 2


@dataclass(frozen=True)
class CorePlan:
    bench: tuple[int, ...]
    apiserver: tuple[int, ...]
    extender: tuple[int, ...]
    hosts: tuple[tuple[int, ...], ...]

    def as_dict(self) -> dict[str, list[int] | list[list[int]]]:
        return {"bench (kube-scheduler sim)": list(self.bench), "apiserver": list(self.apiserver),
                "extender": list(self.extender), "node hosts": [list(h) for h in self.hosts]}


def plan_cores(available: Iterable[int], hosts: int, each: int = CORES_EACH) -> CorePlan:
    """Disjoint cores for every part, lowest first; ValueError naming what is needed when too few."""
    cores = sorted(available)
    parts = 3 + max(1, hosts)
    needed = parts * each
    if len(cores) < needed:
        raise ValueError(f"--pin needs {needed} cores ({each} each for the benchmark, the API server, the "
                         f"extender and {max(1, hosts)} node host(s)); this process may use {len(cores)} "
                         f"({cores}). Run without --pin, or with fewer --hosts")
    chunks = [tuple(cores[i * each:(i + 1) * each]) for i in range(parts)]
    return CorePlan(bench=chunks[0], apiserver=chunks[1], extender=chunks[2], hosts=tuple(chunks[3:]))


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin(pid: int, cores: Sequence[int]) -> None:
    """Every thread ``pid`` has now; later ones inherit from their creator."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def verify(pid: int, cores: Sequence[int]) -> list[str]:
    """Threads of ``pid`` whose mask is not ``cores`` (empty: the pinning held)."""
    want, off = set(cores), []
    for tid in _threads(pid):
        try:
            got = os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue
        if got != want:
            off.append(f"{pid}/{tid}: {sorted(got)}")
    return off


__all__ = ["CORES_EACH", "CorePlan", "pin", "plan_cores", "verify"]
