"""The chaos soak's schedule: which fault happens when, and which pods come and go — a pure function of
``(seed, seconds, nodes)``.

Nothing here looks at the machine, the clock or the cluster: the same arguments give the same plan, byte
for byte (``Plan.digest``), so a failing seed is replayed with exactly the same faults at the same time
offsets. What cannot be replayed exactly is the interleaving of the processes (the OS schedules them);
docs/testing.md, "Chaos soak", says what that means for a replay.

Every fault kind has its own random stream (``random.Random("<seed>:<kind>")``), so changing the rate of one
kind does not move the others. Each kind is a Poisson process at its rate from the start of the run; a
kind that draws no occurrence at all (a short run) gets one at a uniform time. Faults that act on the same
thing (the API server being up, one node's NVML, the extender pair, ...) share a *lane* and never overlap:
an event whose lane is busy is moved to the moment the lane is free. Every fault window ends by
``seconds``; after that comes the quiet period (no faults, no new pods).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

# Non-ignored XIDs (NVIDIA's plugin and HAMi mark the GPU unhealthy) and ignored ones (application errors:
# the GPU must stay healthy): NVIDIA k8s-device-plugin internal/rm/health.go.
CRITICAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95)
IGNORED_XIDS = (13, 31, 43, 45, 68, 109)


@dataclass(frozen=True)
class FaultKind:
    name: str
    per_minute: float  # mean rate over the whole cluster
    lane: str  # "{node}" is replaced by the target node
    per_node: bool
    duration: tuple[float, float] = (0.0, 0.0)  # seconds the fault lasts (0: instantaneous)
    busy: float = 0.0  # extra seconds the lane stays busy after the fault (let the system react)


KINDS: tuple[FaultKind, ...] = (
    FaultKind("nvml_hang", 1.5, "nvml/{node}", True, (2.0, 20.0), 2.0),
    FaultKind("nvml_hang_unkillable", 1.0, "nvml/{node}", True, (3.0, 25.0), 2.0),
    FaultKind("gpu_lost", 0.7, "nvml/{node}", True, (3.0, 20.0), 2.0),
    FaultKind("xid", 1.0, "xid/{node}", True),
    FaultKind("plugin_restart", 0.7, "plugin/{node}", True, busy=8.0),
    FaultKind("kubelet_restart", 1.0, "kubelet/{node}", True, busy=4.0),
    FaultKind("stream_drop", 1.0, "kubelet/{node}", True, busy=4.0),
    FaultKind("lock_holder_dies", 1.0, "lock", False, (5.0, 20.0), 1.0),
    FaultKind("api_outage", 0.7, "api-up", False, (1.0, 8.0), 3.0),
    FaultKind("api_slow", 1.0, "api-slow", False, (3.0, 15.0), 1.0),
    FaultKind("api_errors", 1.5, "api-errors", False, busy=2.0),
    FaultKind("extender_kill_leader", 0.5, "extenders", False, (1.0, 5.0), 4.0),
    FaultKind("extender_term", 0.5, "extenders", False, (0.0, 5.0), 4.0),
)
KIND_NAMES = tuple(k.name for k in KINDS)

# API fault scopes: which requests a slow/error window hits (path regex, method or None = any)
API_SCOPES: dict[str, tuple[str | None, str | None]] = {
    "all": (None, None),
    "pods": (r"/pods", None),
    "pod-writes": (r"/namespaces/[^/]+/pods/[^/]+$", "PATCH"),
    "nodes": (r"^/api/v1/nodes", None),
    "bindings": (r"/binding$", "POST"),
    "leases": (r"/leases", None),
}

# Pod shapes of the churn: (name, weight)
SHAPES = (("shared", 40), ("whole", 10), ("multi", 15), ("init", 15), ("percent", 10), ("cores-only", 10))
NAMESPACES = ("chaos-a", "chaos-b")
POD_RATE_PER_S = 4.0  # pods created per second: the soak admits >= 2/s on its default 4 nodes
LIFETIME_S = (3.0, 12.0)  # short lives: 4 nodes x 4 GPUs x 4 slots turn over fast enough for that rate


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the chaos phase began
    kind: str
    target: str  # node name, "api", "extenders"
    duration: float
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.at + self.duration


@dataclass(frozen=True)
class PodPlan:
    name: str
    namespace: str
    at: float  # created at
    delete_at: float | None  # deleted at (None: stays until the end)
    shape: str
    init: tuple[dict[str, int], ...]  # per init container: {"gpus", "mem", "cores", "percent"} (0 = unset)
    containers: tuple[dict[str, int], ...]


@dataclass(frozen=True)
class Plan:
    seed: int
    seconds: float
    nodes: tuple[str, ...]
    faults: tuple[Fault, ...]
    pods: tuple[PodPlan, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KIND_NAMES, 0)
        for f in self.faults:
            out[f.kind] += 1
        return out


def node_names(n: int) -> tuple[str, ...]:
    return tuple(f"chaos-node-{i}" for i in range(n))


def _times(rng: random.Random, rate_per_s: float, seconds: float) -> list[float]:
    """A Poisson process at ``rate_per_s`` over the run; when it draws nothing (short runs, rare kinds),
    one occurrence at a uniform time."""
    out: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < seconds:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out or [rng.uniform(0.0, seconds * 0.9)]


def _params(kind: str, rng: random.Random, n_gpus: int) -> dict[str, Any]:
    if kind in ("xid", "gpu_lost"):
        p: dict[str, Any] = {"gpu": rng.randrange(n_gpus)}
        if kind == "xid":
            critical = rng.random() < 0.75
            p["xid"] = rng.choice(CRITICAL_XIDS if critical else IGNORED_XIDS)
        return p
    if kind == "api_slow":
        return {"delay_s": round(rng.uniform(0.1, 2.0), 3), "scope": rng.choice(sorted(API_SCOPES))}
    if kind == "api_errors":
        code = rng.choice((500, 500, 503, 429, 504))
        return {"code": code, "times": rng.randint(3, 30), "scope": rng.choice(sorted(API_SCOPES)),
                "retry_after": 1 if code == 429 else None}
    if kind == "extender_term":
        return {"which": rng.choice(("leader", "follower", "replica-0", "replica-1"))}
    if kind == "plugin_restart":
        return {"signal": "SIGTERM"}
    if kind in ("nvml_hang", "nvml_hang_unkillable"):
        return {"how": rng.choice(("all-calls", "all-calls", "memory-info"))}
    return {}


def _place(busy: list[tuple[float, float]], at: float, length: float) -> float:
    """The earliest start >= ``at`` at which ``[start, start + length)`` overlaps no interval of the lane."""
    for lo, hi in sorted(busy):
        if at + length <= lo:
            break
        at = max(at, hi)
    return at


def _faults(seed: int, seconds: float, nodes: tuple[str, ...], n_gpus: int) -> list[Fault]:
    """Each kind's occurrences; every kind's first one claims its lane first, so that each kind happens
    at least once when the run is long enough, however busy its lane."""
    wanted: list[tuple[bool, float, int, Fault, FaultKind]] = []
    for order, kind in enumerate(KINDS):
        rng = random.Random(f"{seed}:{kind.name}")
        for n, t in enumerate(_times(rng, kind.per_minute / 60.0, seconds)):
            if kind.per_node:
                target = rng.choice(nodes)
            else:
                target = kind.lane.split("-")[0]  # "api", "extenders", "lock"
            lo, hi = kind.duration
            duration = round(rng.uniform(lo, hi), 3) if hi else 0.0
            wanted.append((n > 0, t, order, Fault(round(t, 3), kind.name, target, duration,
                                                  _params(kind.name, rng, n_gpus)), kind))
    wanted.sort(key=lambda w: (w[0], w[1], w[2]))
    lanes: dict[str, list[tuple[float, float]]] = {}
    out: list[Fault] = []
    for _later, _t, _order, f, kind in wanted:
        busy = lanes.setdefault(kind.lane.format(node=f.target), [])
        at = _place(busy, f.at, f.duration + kind.busy)
        if at >= seconds - 1.0:
            continue  # no room left before the quiet period
        duration = min(f.duration, seconds - at)
        busy.append((at, at + duration + kind.busy))
        out.append(Fault(round(at, 3), f.kind, f.target, round(duration, 3), f.params))
    out.sort(key=lambda f: (f.at, f.kind, f.target))
    return out


def _container(rng: random.Random, shape: str) -> dict[str, int]:
    if shape == "shared":
        return {"gpus": 1, "mem": rng.choice((2000, 4000, 8000, 16000)), "cores": rng.choice((0, 10, 25, 50))}
    if shape == "whole":
        return {"gpus": 1, "mem": 0, "cores": 100}
    if shape == "multi":
        return {"gpus": 2, "mem": rng.choice((2000, 8000)), "cores": rng.choice((0, 20))}
    if shape == "percent":
        return {"gpus": 1, "percent": rng.choice((25, 50)), "cores": rng.choice((0, 30))}
    if shape == "cores-only":
        return {"gpus": 1, "cores": rng.choice((20, 40))}
    raise ValueError(shape)


def _pods(seed: int, seconds: float) -> list[PodPlan]:
    rng = random.Random(f"{seed}:pods")
    names, weights = zip(*SHAPES, strict=True)
    out: list[PodPlan] = []
    t = rng.uniform(0.0, 1.0)
    i = 0
    while t < seconds:
        shape = rng.choices(names, weights)[0]
        init: tuple[dict[str, int], ...] = ()
        if shape == "init":
            init = ({"gpus": 1, "mem": rng.choice((1000, 4000)), "cores": 10},)
            main = {"gpus": 1, "mem": rng.choice((2000, 6000)), "cores": 20}
            containers: tuple[dict[str, int], ...] = (main,)
        else:
            containers = (_container(rng, shape),)
        life = rng.uniform(*LIFETIME_S)
        out.append(PodPlan(f"chaos-{i:05d}", rng.choice(NAMESPACES), round(t, 3),
                           round(t + life, 3) if t + life < seconds else None, shape, init, containers))
        i += 1
        t += rng.expovariate(POD_RATE_PER_S)
    return out


def make_plan(seed: int, seconds: float, nodes: int, gpus_per_node: int = 4) -> Plan:
    """The whole schedule of a run. Pure: same arguments, same plan."""
    if seconds <= 0 or nodes <= 0:
        raise ValueError("seconds and nodes must be positive")
    names = node_names(nodes)
    return Plan(seed, float(seconds), names, tuple(_faults(seed, seconds, names, gpus_per_node)),
                tuple(_pods(seed, seconds)))


def pod_object(p: PodPlan, scheduler: str = "hami-scheduler") -> dict[str, Any]:
    """The Pod as a tenant submits it (the webhook's work done: schedulerName set)."""

    def ctr(name: str, want: dict[str, int]) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": str(want.get("gpus", 1))}
        if want.get("mem"):
            limits["nvidia.com/gpumem"] = str(want["mem"])
        if want.get("percent"):
            limits["nvidia.com/gpumem-percentage"] = str(want["percent"])
        if want.get("cores"):
            limits["nvidia.com/gpucores"] = str(want["cores"])
        return {"name": name, "image": "cuda:12", "resources": {"limits": limits}}

    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [ctr(f"main-{i}", c) for i, c in enumerate(p.containers)]}
    if p.init:
        spec["initContainers"] = [ctr(f"init-{i}", c) for i, c in enumerate(p.init)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace,
                         "labels": {"app": "chaos", "shape": p.shape}},
            "spec": spec}
