"""Cheap pre-checks of the exact fit, for the usage cache's best-first walk and its fit counts.

Fitting a pod on a node (``fit.fit_node``: score, sort, walk, clone) costs 0.1-0.4 ms in Python; at 5,000
nodes a request shape seen for the first time would cost a second. Most nodes can be decided far cheaper:

* ``may_fit`` is a *necessary* condition (False: the pod cannot fit). It first compares the request with
  a per-node summary (free devices, the ``nums``-th largest free memory and cores, idle devices: O(1)),
  then counts the devices that pass every per-device test of ``fit_devices`` that does not depend on the
  other picks.
* ``screen_is_exact`` says when ``may_fit`` is also *sufficient*: one container asking for GPUs, no NUMA
  binding, no GPU in MIG mode on the node. ``fit_devices`` then takes the first ``nums`` devices that pass
  those same independent tests (or, topology-aware, all of them and chooses among them), so the count
  decides. The picks themselves are only computed for the node that is chosen.
* ``CapacityIndex`` keeps the nodes sorted by the k-th largest free memory and free cores of their
  devices: a container asking for ``nums`` GPUs with ``m`` MiB each can only fit a node whose
  ``nums``-th largest free memory is at least ``m``, so a bisection bounds the walk of a demanding new
  shape (8 whole GPUs at 5,000 nodes: the few empty nodes) instead of screening every node, whenever it
  rules out at least half of them. A GPU in MIG mode counts no more free memory than the largest profile
  it can still place (``migfit.custom_filter`` refuses more). (The usage cache bounds a shape asking for
  static MIG resources to the nodes offering the profile the same way.)

Both are checked against the exact fit by property tests (``tests/unit/scheduler/test_may_fit.py``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import Protocol

from hami_agent.protocol import keys
from hami_agent.protocol.annotations import mode_allowed, type_allowed, uuid_allowed
from hami_agent.scheduler.core.fit import NodeExtras, PodContext
from hami_agent.scheduler.core.migfit import largest_free_profile
from hami_agent.scheduler.core.model import NVIDIA, PCT_UNSET, DeviceUsage, PodRequest

_NVIDIA_LOWER = NVIDIA.lower()  # fit_container keeps devices whose type contains it, any case
_name = itemgetter(1)  # of an index entry (value, node name)


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """What any request needs at least, over the node's usable (healthy, NVIDIA) devices."""

    has_mig: bool  # a GPU in MIG mode: one device may serve several instances; no summary check
    free: int  # devices with a free slot
    idle: int  # devices nobody uses (exclusive requests need them on 100-core devices)
    all_full_core: bool  # every device has totalcore 100 (the exclusivity rule applies to all)
    max_free_mem: int
    max_free_cores: int
    min_totalmem: int  # a request's memory is linear in the device's total: least at one of the ends
    max_totalmem: int
    free_mems: tuple[int, ...] = ()  # free memory of the devices with a free slot, largest first
    free_cores: tuple[int, ...] = ()


def _free_mem(d: DeviceUsage) -> int:
    """What a container can get of the device's free memory: on a GPU in MIG mode no more than the
    largest instance that can still be placed (an idle A100-80GB whose largest allowed profile is
    3g.40gb serves 40 GiB, not 80), so the capacity index rules MIG nodes out for larger requests."""
    free = d.totalmem - d.usedmem
    if d.mode == keys.MODE_MIG:
        return min(free, largest_free_profile(d.mig_profiles, d.mig_used))
    return free


class NodeView(Protocol):
    """What the pre-checks read of a node (``core.nodes.NodeState`` is one): its devices, extras, MIG
    capacity and use, and the summary they cache on it."""

    devices: list[DeviceUsage]
    extras: NodeExtras
    mig_capacity: dict[str, int]
    mig_used: dict[str, int]
    summary: NodeSummary | None


def summarize(devices: list[DeviceUsage]) -> NodeSummary:
    usable = [d for d in devices if d.healthy and _NVIDIA_LOWER in d.type.lower()]
    free = [d for d in usable if d.count > d.used]
    mems = sorted(map(_free_mem, free), reverse=True)
    return NodeSummary(
        has_mig=any(d.mode == keys.MODE_MIG for d in devices),
        free=len(free),
        idle=sum(1 for d in free if d.used == 0),
        all_full_core=all(d.totalcore == 100 for d in usable),
        max_free_mem=mems[0] if mems else 0,
        max_free_cores=max((d.totalcore - d.usedcores for d in free), default=0),
        min_totalmem=min((d.totalmem for d in free), default=0),
        max_totalmem=max((d.totalmem for d in free), default=0),
        free_mems=tuple(mems),
        free_cores=tuple(sorted((d.totalcore - d.usedcores for d in free), reverse=True)))


def screen_is_exact(preq: PodRequest, ctx: PodContext) -> bool:
    """``may_fit`` decides this shape exactly on nodes without MIG-mode GPUs (see the module doc)."""
    asking = [c for c in preq.containers if c is not None and c.nums > 0]
    return len(asking) <= 1 and not ctx.numa_bind and all(c.type == NVIDIA for c in asking)


def may_fit(st: NodeView, preq: PodRequest, ctx: PodContext) -> bool:
    """A necessary condition of ``UsageCache.evaluate`` (False only when the pod cannot fit). Each
    container needs ``nums`` devices that pass, on the node as it is, every per-device test of
    ``fit_devices`` that does not depend on the other picks (health, cordon, type, mode, UUID lists, a
    free slot, memory, cores, exclusivity, mutex); under NUMA binding all on one NUMA node. What
    ``fit_node`` adds only removes candidates: other containers take capacity away, the MIG placement
    check and the topology choice refuse more. A GPU in MIG mode is examined again for each instance of
    a container (HAMi's ``Fit``), so it alone may satisfy ``nums``."""
    for profile, n in preq.mig:
        if st.mig_capacity.get(profile, 0) - st.mig_used.get(profile, 0) < n:
            return False
    s = st.summary
    if s is None:
        s = st.summary = summarize(st.devices)
    for c in preq.containers:
        if c is None or c.nums <= 0:
            continue
        if c.type != NVIDIA:
            return False  # fit_devices matches no device to another vendor's request
        if s.has_mig:
            break
        cores = min(c.coresreq, 100)
        least_mem = min(c.memory_for(s.min_totalmem), c.memory_for(s.max_totalmem))
        if c.nums > s.free or (cores == 100 and s.all_full_core and c.nums > s.idle):
            return False
        # the container needs ``nums`` devices with that much free memory and cores: the nums-th largest
        # free memory and cores must do (as the capacity index, but per node: 8 GPUs of 60 GiB on a node
        # whose largest free GPU has them, but not its eighth, are refused here and not counted)
        if least_mem > s.free_mems[c.nums - 1] or cores > s.free_cores[c.nums - 1]:
            return False
    return _count_devices(st, preq, ctx)


def _count_devices(st: NodeView, preq: PodRequest, ctx: PodContext) -> bool:
    typed = bool(ctx.use_types or ctx.nouse_types) or ctx.vgpu_mode is not None
    by_uuid = bool(ctx.use_uuids or ctx.nouse_uuids)
    mutex = "mutex" in ctx.gpu_policy
    cordoned = st.extras.cordoned
    for c in preq.containers:
        if c is None or c.nums <= 0:
            continue
        cores = min(c.coresreq, 100)
        per_numa: dict[int, int] = {}
        for d in st.devices:
            if not d.healthy or d.count <= d.used or (mutex and d.used > 0) or d.id in cordoned:
                continue
            if _NVIDIA_LOWER not in d.type.lower():
                continue
            if typed and not (type_allowed(d.type, ctx.use_types, ctx.nouse_types)
                              and mode_allowed(ctx.vgpu_mode, d.mode)):
                continue
            if by_uuid and not uuid_allowed(d.id, ctx.use_uuids, ctx.nouse_uuids):
                continue
            if d.totalmem - d.usedmem < c.memory_for(d.totalmem) or d.totalcore - d.usedcores < cores:
                continue
            if d.totalcore == 100 and cores == 100 and d.used > 0:
                continue
            if d.totalcore != 0 and d.usedcores == d.totalcore and cores == 0:
                continue
            per_numa[d.numa] = per_numa.get(d.numa, 0) + (c.nums if d.mode == keys.MODE_MIG else 1)
        enough = max(per_numa.values(), default=0) if ctx.numa_bind else sum(per_numa.values())
        if enough < c.nums:
            return False
    return True


class CapacityIndex:
    """Nodes by the k-th largest free memory / free cores of their devices (k = 1, 2, ...), for a superset
    of the nodes a shape can fit (``candidates``). A node with a GPU in MIG mode is indexed by its largest
    free memory and cores only (k = 1): one MIG device may serve every instance a container asks for, but
    only a device that passes the memory and cores tests counts at all (``_count_devices``), so a node
    whose best device is too small cannot fit. Not thread-safe: the cache's lock."""

    def __init__(self) -> None:
        self._tables: tuple[dict[int, list[tuple[int, str]]], dict[int, list[tuple[int, str]]]] = ({}, {})
        self._keys: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        # nodes with a MIG-mode GPU: (largest free memory, name) and (largest free cores, name), sorted
        self._mig_tables: tuple[list[tuple[int, str]], list[tuple[int, str]]] = ([], [])
        self._mig_keys: dict[str, tuple[int, int]] = {}
        self._min_total: int | None = None  # over every device seen: bounds a percentage's MiB from below
        self._max_total: int | None = None

    def update(self, name: str, s: NodeSummary | None) -> None:
        """The node's new summary (None: the node is gone)."""
        old = self._keys.pop(name, None)
        if old is not None:
            for table, values in zip(self._tables, old, strict=True):
                for k, v in enumerate(values, 1):
                    lst = table[k]
                    i = bisect.bisect_left(lst, (v, name))
                    if i < len(lst) and lst[i] == (v, name):
                        del lst[i]
        old_mig = self._mig_keys.pop(name, None)
        if old_mig is not None:
            for lst, v in zip(self._mig_tables, old_mig, strict=True):
                i = bisect.bisect_left(lst, (v, name))
                if i < len(lst) and lst[i] == (v, name):
                    del lst[i]
        if s is None:
            return
        if s.free_mems:
            self._min_total = min(s.min_totalmem, self._min_total or s.min_totalmem)
            self._max_total = max(s.max_totalmem, self._max_total or 0)
        if s.has_mig:
            if s.free_mems:  # no device with a free slot: no GPU container fits
                best = (s.free_mems[0], s.free_cores[0])
                for lst, v in zip(self._mig_tables, best, strict=True):
                    bisect.insort(lst, (v, name))
                self._mig_keys[name] = best
            return
        for table, values in zip(self._tables, (s.free_mems, s.free_cores), strict=True):
            for k, v in enumerate(values, 1):
                bisect.insort(table.setdefault(k, []), (v, name))
        self._keys[name] = (s.free_mems, s.free_cores)

    def _least_mem(self, memreq: int, pct: int) -> int:
        if memreq > 0:
            return memreq
        if pct == PCT_UNSET or self._min_total is None or self._max_total is None:
            return 0
        return min(self._min_total * pct // 100, self._max_total * pct // 100)

    def candidates(self, preq: PodRequest, min_gain: int = 2) -> set[str] | None:
        """A superset of the nodes ``preq`` can fit; None (every node may) when it would keep more than
        1/``min_gain`` of them: the walk's early stop is then cheaper than building the set (a set of
        half the nodes, built in C, costs less than screening the nodes it rules out)."""
        best: tuple[int, list[tuple[int, str]], int] | None = None
        mig: tuple[int, list[tuple[int, str]], int] | None = None
        for c in preq.containers:
            if c is None or c.nums <= 0:
                continue
            needs = (self._least_mem(c.memreq, c.mem_percentage), min(c.coresreq, 100))
            for table, need in zip(self._tables, needs, strict=True):
                lst = table.get(c.nums, [])
                i = bisect.bisect_left(lst, (need, ""))
                if best is None or len(lst) - i < best[0]:
                    best = (len(lst) - i, lst, i)
            for lst, need in zip(self._mig_tables, needs, strict=True):
                i = bisect.bisect_left(lst, (need, ""))
                if mig is None or len(lst) - i < mig[0]:
                    mig = (len(lst) - i, lst, i)
        if best is None or mig is None:
            return None
        if (best[0] + mig[0]) * min_gain > len(self._keys) + len(self._mig_keys):
            return None
        # C loops: at 5,000 nodes half of them may be kept, a Python loop over them cost a millisecond
        out = set(map(_name, islice(best[1], best[2], None)))
        out.update(map(_name, islice(mig[1], mig[2], None)))
        return out
