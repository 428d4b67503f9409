"""A realistic /filter workload: a SIMULATED fleet with mixed GPU nodes and load, and a request trace drawn
from a few hundred distinct pod shapes with a long-tailed popularity (a few shapes are most of the
traffic, many are rare — the rare ones are the cold requests).

Shapes combine: 1-8 GPUs; memory in MiB or in percent, or none (the whole GPU); gpucores; exclusive
(gpucores 100); static MIG profiles (``nvidia.com/mig-<profile>``); an init container; and the
scheduling annotations (``nvidia.com/numa-bind``, ``hami.io/gpu-scheduler-policy``,
``hami.io/node-scheduler-policy``, ``nvidia.com/use-gputype``). The fleet: A100-80GB nodes (most),
H100-80GB nodes, and A100 nodes in static MIG mode; each node starts with 0-12 running pods.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hami_agent.protocol import MigPlacement, MigProfile, keys
from hami_agent.scheduler.core.model import DeviceUsage, Picked, PodUsage
from hami_agent.scheduler.core.nodes import mig_capacity
from hami_agent.scheduler.state.cache import UsageCache, collapse

GPUS_PER_NODE = 8
A100, H100 = "NVIDIA-NVIDIA A100-SXM4-80GB", "NVIDIA-NVIDIA H100 80GB HBM3"
# A100-80GB GPU-instance profiles as a node in ``mig`` mode publishes them (NVIDIA MIG user guide, "A100
# MIG profiles": memory, slices, legal placements)
MIG_PROFILES = tuple(
    MigProfile(name, mem, core, slices, tuple(MigPlacement(s, size) for s in starts), len(starts))
    for name, mem, core, slices, starts, size in (("1g.10gb", 9728, 15, 1, range(7), 1),
                                                  ("2g.20gb", 19968, 29, 2, (0, 2, 4), 2),
                                                  ("3g.40gb", 40192, 43, 3, (0, 4), 4)))


def node_kind(i: int) -> str:
    return "mig" if i % 10 == 9 else "h100" if i % 10 == 8 else "a100"


def build_fleet(n_nodes: int, seed: int = 1) -> UsageCache:
    rng = random.Random(seed)
    cache = UsageCache()
    for i in range(n_nodes):
        name = f"gpu-node-{i:05d}"
        kind = node_kind(i)
        devs = [DeviceUsage(id=f"GPU-{i:08x}-{g:04x}-4000-8000-000000000000", index=g,
                            type=H100 if kind == "h100" else A100, count=10, totalmem=81920, totalcore=100,
                            numa=g // 4, health=True, mode=keys.MODE_MIG if kind == "mig" else "hami-core",
                            mig_profiles=MIG_PROFILES if kind == "mig" else ())
                for g in range(GPUS_PER_NODE)]
        cache.set_node(name, devs, mig_capacity=mig_capacity(devs))
        if kind == "mig":
            continue
        for k in range(rng.randrange(0, 13)):
            g = rng.randrange(GPUS_PER_NODE)
            mem, cores = rng.choice(((4096, 10), (8192, 20), (16384, 0), (2048, 5), (40960, 50)))
            cache.add_pod(PodUsage(uid=f"run-{i}-{k}", namespace="default", name=f"run-{i}-{k}", node=name,
                                   devices=collapse([[Picked(devs[g].id, "NVIDIA", mem, cores)]], 0)))
    return cache


@dataclass(frozen=True)
class Shape:
    gpus: int
    mem: int | None  # MiB
    pct: int | None  # gpumem-percentage
    cores: int | None
    mig: tuple[tuple[str, int], ...]
    init: bool
    annotations: tuple[tuple[str, str], ...]

    def pod(self, j: int) -> dict:
        limits: dict[str, str] = {}
        if self.mig:
            for profile, n in self.mig:
                limits[f"nvidia.com/mig-{profile}"] = str(n)
        else:
            limits["nvidia.com/gpu"] = str(self.gpus)
            if self.mem is not None:
                limits["nvidia.com/gpumem"] = str(self.mem)
            if self.pct is not None:
                limits["nvidia.com/gpumem-percentage"] = str(self.pct)
            if self.cores is not None:
                limits["nvidia.com/gpucores"] = str(self.cores)
        spec: dict = {"schedulerName": "hami-scheduler", "containers": [
            {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3", "command": ["python", "train.py"],
             "resources": {"limits": {**limits, "cpu": "8", "memory": "32Gi"}}}]}
        if self.init:
            spec["initContainers"] = [{"name": "warmup", "image": "cuda", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "5"}}}]
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"trace-{j}", "namespace": f"team-{j % 7}", "uid": f"trace-uid-{j}",
                             "labels": {"app": "trace"}, "annotations": dict(self.annotations)},
                "spec": spec, "status": {"phase": "Pending"}}


def shapes(n: int, seed: int = 2) -> list[Shape]:
    """``n`` distinct shapes."""
    rng = random.Random(seed)
    out: dict[Shape, None] = {}
    while len(out) < n:
        r = rng.random()
        if r < 0.06:  # static MIG
            profile = rng.choice(("1g.10gb", "2g.20gb", "3g.40gb"))
            out[Shape(0, None, None, None, ((profile, rng.choice((1, 1, 2))),), False, ())] = None
            continue
        gpus = rng.choices((1, 2, 3, 4, 6, 8), weights=(60, 15, 2, 12, 1, 10))[0]
        mem = pct = cores = None
        form = rng.random()
        if form < 0.6:
            mem = rng.choice((1024, 2048, 3072, 4096, 6144, 8192, 10240, 12288, 16384, 20480, 24576, 32768,
                              40960, 61440, 81920))
        elif form < 0.8:
            pct = rng.choice((10, 20, 25, 30, 40, 50, 60, 75, 100))
        cores = rng.choice((None, None, 5, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100))
        ann: list[tuple[str, str]] = []
        if rng.random() < 0.06:
            ann.append((keys.NUMA_BIND, "true"))
        if rng.random() < 0.12:
            ann.append((keys.GPU_SCHEDULER_POLICY, rng.choice(("spread", "binpack", "topology-aware"))))
        if rng.random() < 0.08:
            ann.append((keys.NODE_SCHEDULER_POLICY, rng.choice(("spread", "binpack"))))
        if rng.random() < 0.08:
            ann.append((keys.USE_GPUTYPE, rng.choice(("A100", "H100"))))
        out[Shape(gpus, mem, pct, cores, (), rng.random() < 0.1, tuple(sorted(ann)))] = None
    return list(out)


def trace(all_shapes: list[Shape], n_requests: int, seed: int = 3, zipf_s: float = 1.1) -> list[Shape]:
    """Requests with Zipf popularity over the shapes (shape i has weight 1 / (i+1)^s)."""
    rng = random.Random(seed)
    order = list(all_shapes)
    rng.shuffle(order)
    weights = [1.0 / (i + 1) ** zipf_s for i in range(len(order))]
    return rng.choices(order, weights=weights, k=n_requests)


__all__ = ["GPUS_PER_NODE", "Shape", "build_fleet", "shapes", "trace"]
