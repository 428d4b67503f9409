"""HAMi's device fit and scoring, as pure functions (reference/hami.md §4.3, §4.4).

``fit_node`` answers "can this pod go on this node, on which GPUs, and if not why" for one node's
device list; it never mutates the caller's devices (it works on clones).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.scheduler import wire
from hami_agent.scheduler.model import NVIDIA, ContainerDeviceRequest, DeviceUsage, Picked, PodRequest

logger = logging.getLogger(__name__)

WEIGHT = 10.0  # HAMi util.Weight
GPU_POLICIES = ("spread", "binpack", "topology-aware", "mutex", "numa")
NODE_POLICIES = ("binpack", "spread")


@dataclass(frozen=True)
class PodContext:
    """Everything in a pod (besides its requests) that changes where it fits. Hashable: part of the
    fit memo key, so namespace/name are excluded from equality."""

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    numa_bind: bool = False
    vgpu_mode: str | None = None
    gpu_policy: tuple[str, ...] = ("spread",)
    node_policy: str = "binpack"
    weights: tuple[int, int, int] = (1, 1, 1)  # slot, core, memory


@dataclass
class QuotaBudget:
    """Room left in the namespace's ResourceQuota (``limits.nvidia.com/gpumem|gpucores``); None = no limit."""

    mem_left: int | None = None
    cores_left: int | None = None

    def fits(self, mem: int, cores: int) -> bool:
        return ((self.mem_left is None or mem <= self.mem_left)
                and (self.cores_left is None or cores <= self.cores_left))

    def take(self, mem: int, cores: int) -> None:
        if self.mem_left is not None:
            self.mem_left -= mem
        if self.cores_left is not None:
            self.cores_left -= cores


@dataclass
class NodeExtras:
    """Per-node inputs besides the devices: cordoned UUIDs and topology pair scores."""

    cordoned: frozenset[str] = frozenset()
    pair_scores: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class NodeFit:
    ok: bool
    containers: list[list[Picked]]
    reason: str = ""
    detail: str = ""  # for the -v=4 "filtered out" line


def _split_list(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())


def pod_context(annotations: dict[str, str], node_policy: str = "binpack",
                gpu_policy: str = "spread") -> PodContext:
    """Read the scheduling annotations of reference §3.3; bad values fall back to the defaults."""
    a = annotations or {}
    npol = a.get("hami.io/node-scheduler-policy", node_policy).strip() or node_policy
    if npol not in NODE_POLICIES:
        log.v(logger, 3, "unknown hami.io/node-scheduler-policy %r, using %s", npol, node_policy)
        npol = node_policy
    gpol = tuple(p.lower() for p in _split_list(a.get("hami.io/gpu-scheduler-policy", gpu_policy)))
    if not gpol or any(p not in GPU_POLICIES for p in gpol):
        log.v(logger, 3, "unknown hami.io/gpu-scheduler-policy %r, using %s", gpol, gpu_policy)
        gpol = tuple(_split_list(gpu_policy)) or ("spread",)
    weights = (1, 1, 1)
    raw_w = a.get("hami.io/device-scoring-weights")
    if raw_w:
        try:
            weights = parse_weights(raw_w)
        except ValueError as exc:
            log.v(logger, 3, "%s; using slot=1,core=1,memory=1", exc)
    return PodContext(
        use_types=tuple(t.lower() for t in _split_list(a.get("nvidia.com/use-gputype"))),
        nouse_types=tuple(t.lower() for t in _split_list(a.get("nvidia.com/nouse-gputype"))),
        use_uuids=frozenset(_split_list(a.get("nvidia.com/use-gpuuuid"))),
        nouse_uuids=frozenset(_split_list(a.get("nvidia.com/nouse-gpuuuid"))),
        numa_bind=a.get("nvidia.com/numa-bind", "").strip().lower() == "true",
        vgpu_mode=a.get("nvidia.com/vgpu-mode") or None,
        gpu_policy=gpol, node_policy=npol, weights=weights)


def parse_weights(value: str) -> tuple[int, int, int]:
    """``slot=<int>,core=<int>,memory=<int>``: all three, non-negative, at least one > 0."""
    got: dict[str, int] = {}
    for part in value.split(","):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in ("slot", "core", "memory"):
            raise ValueError(f"hami.io/device-scoring-weights {value!r}: bad entry {part!r} "
                             "(want slot=<int>,core=<int>,memory=<int>)")
        try:
            got[k] = int(v.strip())
        except ValueError as exc:
            raise ValueError(f"hami.io/device-scoring-weights {value!r}: {k} is not an integer") from exc
    if len(got) != 3 or any(n < 0 for n in got.values()) or not any(got.values()):
        raise ValueError(f"hami.io/device-scoring-weights {value!r}: need all of slot, core, memory, "
                         "non-negative, at least one > 0")
    return got["slot"], got["core"], got["memory"]


# ----------------------------------------------------------------------------------------- scoring
def device_score(d: DeviceUsage, req: ContainerDeviceRequest | None, weights=(1, 1, 1)) -> float:
    """HAMi ``DeviceListsScore.ComputeScore``. The request term only counts when the request type
    equals the device type (reference §4.4 quirk: real devices carry the model name, so it is 0)."""
    if d.count == 0 or d.totalcore == 0 or d.totalmem == 0:
        return 0.0
    n = core = mem = 0
    if req is not None and req.type == d.type:
        n = 1  # §10: one per matching request, not nums
        core = req.coresreq
        mem = req.memory_for(d.totalmem)
    ws, wc, wm = weights
    return WEIGHT * (ws * (n + d.used) / d.count + wc * (core + d.usedcores) / d.totalcore
                     + wm * (mem + d.usedmem) / d.totalmem)


def node_score(devices: list[DeviceUsage]) -> float:
    """HAMi ``NodeScore.ComputeDefaultScore`` on the usage before the pod is added."""
    used = count = ucores = tcores = umem = tmem = 0
    for d in devices:
        used += d.used
        count += d.count
        ucores += d.usedcores
        tcores += d.totalcore
        umem += d.usedmem
        tmem += d.totalmem
    if count == 0 or tcores == 0 or tmem == 0:
        return 0.0
    return WEIGHT * (used / count + ucores / tcores + umem / tmem)


def sort_devices(devs: list[DeviceUsage], ctx: PodContext) -> list[DeviceUsage]:
    """Device order of reference §4.4; Fit walks the result from the END."""
    pol = ctx.gpu_policy
    if len(pol) == 1 and pol[0] != "numa":
        p = pol[0]
        if ctx.numa_bind and p in ("binpack", "spread"):
            if p == "binpack":
                return sorted(devs, key=lambda d: (-d.numa, d.score, d.index))
            return sorted(devs, key=lambda d: (d.numa, -d.score, d.index))
        if p == "binpack":
            return sorted(devs, key=lambda d: (d.score, d.numa, d.index))
        if p == "mutex":
            return sorted(devs, key=lambda d: (-d.used, d.numa, d.index))
        return sorted(devs, key=lambda d: (-d.score, d.numa, d.index))  # spread, topology-aware
    keys = [k for k in pol if k in ("binpack", "spread", "numa")]
    if ctx.numa_bind and "numa" in keys:
        keys.remove("numa")
    if ctx.numa_bind:
        keys.insert(0, "numa")

    def key(d: DeviceUsage) -> tuple:
        out = []
        for k in keys:
            out.append(d.score if k == "binpack" else -d.score if k == "spread" else d.numa)
        out.append(d.index)
        return tuple(out)

    return sorted(devs, key=key)


# --------------------------------------------------------------------------------------------- fit
def _type_ok(d: DeviceUsage, req: ContainerDeviceRequest, ctx: PodContext) -> bool:
    if req.type != NVIDIA:
        return False
    t = d.type.lower()
    if ctx.use_types and not any(u in t for u in ctx.use_types):
        return False
    if ctx.nouse_types and any(u in t for u in ctx.nouse_types):
        return False
    if ctx.vgpu_mode is not None and d.mode and d.mode not in ctx.vgpu_mode:
        return False
    return True


def _uuid_ok(d: DeviceUsage, ctx: PodContext) -> bool:
    if ctx.use_uuids and d.id not in ctx.use_uuids:
        return False
    return not (ctx.nouse_uuids and d.id in ctx.nouse_uuids)


def _mig_fit(d: DeviceUsage, memreq: int) -> bool:
    """Dynamic-MIG custom rule, simplified: some allowed profile must be at least ``memreq`` MiB."""
    if d.mode != "mig":
        return True
    return any(int(p.get("memoryMB", 0)) >= memreq for p in d.mig_profiles)


def fit_devices(ordered: list[DeviceUsage], req: ContainerDeviceRequest, ctx: PodContext,
                extras: NodeExtras, quota: QuotaBudget | None, *,
                reasons: dict[str, int]) -> list[Picked] | None:
    """HAMi ``Fit`` for one container request on an ordered device list (walked from the end).
    Returns the picked devices, or None with ``reasons`` filled in."""
    nums = req.nums
    prevnuma: int | None = None
    picked: list[Picked] = []
    cores = min(req.coresreq, 100)
    mutex = "mutex" in ctx.gpu_policy
    topo = ctx.gpu_policy == ("topology-aware",)
    for i in range(len(ordered) - 1, -1, -1):
        d = ordered[i]
        if not d.health:
            reasons[wire.CardNotHealth] = reasons.get(wire.CardNotHealth, 0) + 1
            continue
        if d.id in extras.cordoned:
            reasons[wire.CardCordoned] = reasons.get(wire.CardCordoned, 0) + 1
            continue
        if not _type_ok(d, req, ctx):
            reasons[wire.CardTypeMismatch] = reasons.get(wire.CardTypeMismatch, 0) + 1
            continue
        if ctx.numa_bind and prevnuma != d.numa:
            if picked:
                reasons[wire.NumaNotFit] = reasons.get(wire.NumaNotFit, 0) + len(picked)
            nums = req.nums
            prevnuma = d.numa
            picked = []
        if not _uuid_ok(d, ctx):
            reasons[wire.CardUuidMismatch] = reasons.get(wire.CardUuidMismatch, 0) + 1
            continue
        if d.count <= d.used:
            reasons[wire.CardTimeSlicingExhausted] = reasons.get(wire.CardTimeSlicingExhausted, 0) + 1
            continue
        if mutex and d.used > 0:
            reasons[wire.ExclusiveDeviceAllocateConflict] = \
                reasons.get(wire.ExclusiveDeviceAllocateConflict, 0) + 1
            continue
        memreq = req.memory_for(d.totalmem)
        if quota is not None:
            pm = sum(p.usedmem for p in picked)
            pc = sum(p.usedcores for p in picked)
            if not quota.fits(pm + memreq, pc + cores):
                reasons[wire.ResourceQuotaNotFit] = reasons.get(wire.ResourceQuotaNotFit, 0) + 1
                continue
        if d.totalmem - d.usedmem < memreq:
            reasons[wire.CardInsufficientMemory] = reasons.get(wire.CardInsufficientMemory, 0) + 1
            continue
        if d.totalcore - d.usedcores < cores:
            reasons[wire.CardInsufficientCore] = reasons.get(wire.CardInsufficientCore, 0) + 1
            continue
        if d.totalcore == 100 and cores == 100 and d.used > 0:
            reasons[wire.ExclusiveDeviceAllocateConflict] = \
                reasons.get(wire.ExclusiveDeviceAllocateConflict, 0) + 1
            continue
        if d.totalcore != 0 and d.usedcores == d.totalcore and cores == 0:
            reasons[wire.CardComputeUnitsExhausted] = reasons.get(wire.CardComputeUnitsExhausted, 0) + 1
            continue
        if not _mig_fit(d, memreq):
            reasons[wire.CardMigTopologyInfeasible] = reasons.get(wire.CardMigTopologyInfeasible, 0) + 1
            continue
        picked.append(Picked(d.id, NVIDIA, memreq, cores))
        if topo:
            continue  # collect every candidate, choose below
        nums -= 1
        if nums == 0:
            return picked
    if topo and len(picked) >= req.nums:
        return _topology_choice(picked, req.nums, extras.pair_scores)
    if picked:
        reasons[wire.AllocatedCardsInsufficientRequest] = len(picked)
    return None


def _topology_choice(cands: list[Picked], n: int, pairs: dict[str, dict[str, int]]) -> list[Picked]:
    """topology-aware: n==1 → the worst-connected card; n>1 → the best-connected n-combination."""
    if len(cands) == n:
        return cands

    def pair(a: str, b: str) -> int:
        return pairs.get(a, {}).get(b, 0)

    if n == 1:
        return [min(cands, key=lambda c: sum(pair(c.uuid, o.uuid) for o in cands if o is not c))]
    best, best_score = None, -1
    for combo in itertools.combinations(cands, n):
        s = sum(pair(a.uuid, b.uuid) for a, b in itertools.combinations(combo, 2))
        if s > best_score:
            best, best_score = list(combo), s
    return best or cands[:n]


def fit_container(devs: list[DeviceUsage], req: ContainerDeviceRequest, ctx: PodContext,
                  extras: NodeExtras, quota: QuotaBudget | None) -> tuple[list[Picked] | None, str, str]:
    """HAMi ``fitInDevices`` for one container: score, sort, fit, then add the usage to ``devs``.
    Returns (picked or None, reason string, log detail)."""
    for d in devs:
        d.score = device_score(d, req, ctx.weights)
    ordered = [d for d in sort_devices(devs, ctx) if "nvidia" in d.type.lower()]
    if req.nums > len(ordered) and not any(d.mode == "mig" for d in ordered):
        return None, wire.NodeInsufficientDevice, f"requested {req.nums} GPUs but the node has {len(ordered)}"
    reasons: dict[str, int] = {}
    picked = fit_devices(ordered, req, ctx, extras, quota, reasons=reasons)
    if picked is None:
        return None, wire.gen_reason(reasons, len(ordered)), _detail(reasons, ordered, req)
    by_id = {d.id: d for d in devs}
    for p in picked:
        d = by_id[p.uuid]
        d.used += 1
        d.usedmem += p.usedmem
        d.usedcores += p.usedcores
    if quota is not None:
        quota.take(sum(p.usedmem for p in picked), sum(p.usedcores for p in picked))
    return picked, "", ""


def _detail(reasons: dict[str, int], devs: list[DeviceUsage], req: ContainerDeviceRequest) -> str:
    """The seed's -v=4 wording: ``CardInsufficientMemory, requested 8192Mi but available 4096Mi``."""
    main = max(sorted(reasons), key=lambda r: reasons[r]) if reasons else wire.NodeUnfitPod
    healthy = [d for d in devs if d.health]
    if main == wire.CardInsufficientMemory and healthy:
        best = max(healthy, key=lambda d: d.totalmem - d.usedmem)
        return (f"{main}, requested {req.memory_for(best.totalmem)}Mi but available "
                f"{best.totalmem - best.usedmem}Mi")
    if main == wire.CardInsufficientCore and healthy:
        return (f"{main}, requested {min(req.coresreq, 100)} cores but available "
                f"{max(d.totalcore - d.usedcores for d in healthy)}")
    if main == wire.CardTimeSlicingExhausted:
        return f"{main}, all {len(devs)} GPUs have every slot in use"
    return main


def fit_node(base: list[DeviceUsage], preq: PodRequest, ctx: PodContext, extras: NodeExtras,
             quota: QuotaBudget | None = None) -> NodeFit:
    """Fit every container of a pod on one node (reference §4.3 step 2). Init containers are fitted
    one at a time against the node's usage (they run before the app containers and one after
    another); app containers are fitted cumulatively."""
    out: list[list[Picked]] = [[] for _ in preq.containers]
    for i, req in enumerate(preq.containers):
        if i >= preq.n_init:
            break
        if req is None or req.nums <= 0:
            continue
        devs = [d.clone() for d in base]
        picked, reason, detail = fit_container(devs, req, ctx, extras, quota)
        if picked is None:
            return NodeFit(False, out, reason, detail)
        out[i] = picked
    devs = [d.clone() for d in base]
    for i in range(preq.n_init, len(preq.containers)):
        req = preq.containers[i]
        if req is None or req.nums <= 0:
            continue
        log.v(logger, 5, "fitInDevices container %d", i)
        picked, reason, detail = fit_container(devs, req, ctx, extras, quota)
        if picked is None:
            return NodeFit(False, out, reason, detail)
        out[i] = picked
    return NodeFit(True, out)
