"""Exact feasibility of one pod on one node, as an integer program (PuLP + its bundled CBC solver).

The extender decides greedily, container by container and device by device, as HAMi does. This model
asks the question without any greedy choice: is there *any* assignment of the pod's containers to this
node's GPUs, given what the node's GPUs already hold, that respects every rule the extender enforces?

* a hami-core GPU: per GPU, the app containers placed on it fit its free memory, free cores and free
  sharing slots; a container asking for 100 cores takes an empty GPU alone; a container asking for no
  cores may not go to a GPU whose cores are all taken; a container's GPUs are distinct;
* a dynamic-MIG GPU: each requested device is one instance of an allowlisted profile with at least the
  memory asked, at one of its legal placements, on memory slices no other instance (running or new)
  uses; at most ``count - used`` new instances per GPU;
* init containers run before the app containers, one after another: each must fit the node alone.

Hand-written only in the modelling: the solving is CBC's. Used on small instances (one node, a few
GPUs), where CBC answers in tens of milliseconds.
"""

from __future__ import annotations

import pulp

from hami_agent.scheduler.core import migfit
from hami_agent.scheduler.core.model import DeviceUsage, PodRequest


def _solve(problem: pulp.LpProblem) -> bool:
    status = problem.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=20))
    return pulp.LpStatus[status] == "Optimal"


def _containers_fit(devices: list[DeviceUsage], reqs: list) -> bool:
    """Can the containers ``reqs`` (ContainerDeviceRequest) run together on ``devices``?"""
    prob = pulp.LpProblem("fit", pulp.LpMinimize)
    prob += 0
    x: dict[tuple[int, int], pulp.LpVariable] = {}  # container c on hami-core GPU d (distinct GPUs)
    y: dict[tuple[int, int, int, str, int], pulp.LpVariable] = {}  # unit u of c: GPU d, profile, start
    for c, r in enumerate(reqs):
        cores = min(r.coresreq, 100)
        for di, d in enumerate(devices):
            if not d.healthy:
                continue
            mem = r.memory_for(d.totalmem)
            if d.mode == "mig":
                for u in range(r.nums):
                    for prof in d.mig_profiles:
                        if prof.memory_mb < mem:
                            continue
                        for pl in prof.placements:
                            if not any(migfit.overlaps(pl, o) for o in d.mig_used):
                                tag = prof.name.replace(".", "_").replace("+", "_")
                                y[(c, u, di, prof.name, pl.start)] = pulp.LpVariable(
                                    f"y_{c}_{u}_{di}_{tag}_{pl.start}", cat="Binary")
                continue
            excluded = (d.count <= d.used or d.totalmem - d.usedmem < mem
                        or d.totalcore - d.usedcores < cores
                        or (d.totalcore == 100 and cores == 100 and d.used > 0)
                        or (d.totalcore != 0 and d.usedcores == d.totalcore and cores == 0))
            if not excluded:
                x[(c, di)] = pulp.LpVariable(f"x_{c}_{di}", cat="Binary")
    for c, r in enumerate(reqs):
        prob += (pulp.lpSum(v for (cc, _d), v in x.items() if cc == c)
                 + pulp.lpSum(v for k, v in y.items() if k[0] == c)) == r.nums
        for u in range(r.nums):
            prob += pulp.lpSum(v for k, v in y.items() if k[0] == c and k[1] == u) <= 1
    for di, d in enumerate(devices):
        here = [(c, v) for (c, dd), v in x.items() if dd == di]
        if here:
            prob += pulp.lpSum(v * reqs[c].memory_for(d.totalmem) for c, v in here) <= d.totalmem - d.usedmem
            prob += pulp.lpSum(v * min(reqs[c].coresreq, 100) for c, v in here) <= d.totalcore - d.usedcores
            prob += pulp.lpSum(v for _c, v in here) <= d.count - d.used
            for c, v in here:  # an exclusive container (100 cores) shares its GPU with nobody
                if d.totalcore == 100 and min(reqs[c].coresreq, 100) == 100:
                    prob += pulp.lpSum(w for cc, w in here if cc != c) <= len(here) * (1 - v)
        mine = [(k, v) for k, v in y.items() if k[2] == di]
        if mine:
            prob += pulp.lpSum(v for _k, v in mine) <= max(d.count - d.used, 0)
            sizes = {p.name: {pl.start: pl.size for pl in p.placements} for p in d.mig_profiles}
            for s in range(max((pl.start + pl.size for p in d.mig_profiles for pl in p.placements),
                               default=0)):
                prob += pulp.lpSum(v for (_c, _u, _d, name, start), v in mine
                                   if start <= s < start + sizes[name][start]) <= 1
    return _solve(prob)


def pod_fits_node(devices: list[DeviceUsage], preq: PodRequest) -> bool:
    """Exact: does ``preq`` fit a node whose GPUs are ``devices`` (with their current usage)?"""
    init = [r for i, r in enumerate(preq.containers) if i < preq.n_init and r is not None and r.nums > 0]
    app = [r for i, r in enumerate(preq.containers) if i >= preq.n_init and r is not None and r.nums > 0]
    if any(not _containers_fit(devices, [r]) for r in init):
        return False
    return not app or _containers_fit(devices, app)
