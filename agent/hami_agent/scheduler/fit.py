"""HAMi's device fit and scoring, as pure functions (reference/hami.md §4.3, §4.4).

``fit_node`` answers "can this pod go on this node, on which GPUs, and if not why" for one node's
device list; it never mutates the caller's devices (it works on clones).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.protocol import ProtocolError, keys
from hami_agent.protocol import annotations as annotations_mod
from hami_agent.protocol import reasons as R
from hami_agent.protocol.annotations import mode_allowed, type_allowed, uuid_allowed
from hami_agent.protocol.reasons import gen_reason
from hami_agent.scheduler.model import NVIDIA, ContainerDeviceRequest, DeviceUsage, Picked, PodRequest

logger = logging.getLogger(__name__)

WEIGHT = 10.0  # HAMi util.Weight
_NVIDIA_LOWER = NVIDIA.lower()  # getNodeResources: device types containing the vendor word, any case


@dataclass(frozen=True)
class PodContext:
    """Everything in a pod (besides its requests) that changes where it fits. Hashable: part of the
    fit memo key, so namespace/name are excluded from equality."""

    # use/nouse lists as split by the protocol; matched by protocol.annotations.*_allowed
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    numa_bind: bool = False
    vgpu_mode: str | None = None
    gpu_policy: tuple[str, ...] = (annotations_mod.DEFAULT_GPU_POLICY,)
    node_policy: str = annotations_mod.DEFAULT_NODE_POLICY
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


def pod_context(annotations: dict[str, str], node_policy: str = annotations_mod.DEFAULT_NODE_POLICY,
                gpu_policy: str = annotations_mod.DEFAULT_GPU_POLICY) -> PodContext:
    """Read the scheduling annotations of reference §3.3 once per pod (the protocol parses them).

    Unknown policies fall back to the flag defaults, as HAMi does (``ValidGPUSchedulerPolicy`` /
    ``ValidNodeSchedulerPolicy``). Bad ``hami.io/device-scoring-weights`` raise ``ProtocolError``:
    HAMi refuses to score the pod until the annotation is fixed."""
    a = annotations or {}
    try:
        npol = annotations_mod.node_scheduler_policy(a, node_policy)
    except ProtocolError as exc:
        log.v(logger, 3, "%s; using %s", exc, node_policy)
        npol = node_policy
    try:
        gpol = annotations_mod.gpu_scheduler_policy(a, gpu_policy)
    except ProtocolError as exc:
        log.v(logger, 3, "%s; using %s", exc, gpu_policy)
        gpol = _default_gpu_policy(gpu_policy)
    return PodContext(
        use_types=annotations_mod.split_list(a.get(keys.USE_GPUTYPE)),
        nouse_types=annotations_mod.split_list(a.get(keys.NOUSE_GPUTYPE)),
        use_uuids=frozenset(annotations_mod.split_list(a.get(keys.USE_GPUUUID))),
        nouse_uuids=frozenset(annotations_mod.split_list(a.get(keys.NOUSE_GPUUUID))),
        numa_bind=annotations_mod.numa_bind(a),
        vgpu_mode=a.get(keys.VGPU_MODE) or None,
        gpu_policy=gpol, node_policy=npol, weights=parse_weights(a.get(keys.DEVICE_SCORING_WEIGHTS)))


def _default_gpu_policy(gpu_policy: str) -> tuple[str, ...]:
    try:
        return annotations_mod.gpu_scheduler_policy({}, gpu_policy)
    except ProtocolError:  # a bad --gpu-scheduler-policy flag: HAMi's own default
        return (annotations_mod.DEFAULT_GPU_POLICY,)


def parse_weights(value: str | None) -> tuple[int, int, int]:
    """``hami.io/device-scoring-weights`` as the (slot, core, memory) tuple the score uses; the
    protocol's parser decides validity (raises ``ProtocolError``, a ValueError)."""
    w = annotations_mod.parse_scoring_weights(value)
    return w.slot, w.core, w.memory


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
    return (req.type == NVIDIA and type_allowed(d.type, ctx.use_types, ctx.nouse_types)
            and mode_allowed(ctx.vgpu_mode, d.mode))


def _uuid_ok(d: DeviceUsage, ctx: PodContext) -> bool:
    return uuid_allowed(d.id, ctx.use_uuids, ctx.nouse_uuids)


def _mig_fit(d: DeviceUsage, memreq: int) -> bool:
    """Dynamic-MIG custom rule, simplified: some allowed profile must be at least ``memreq`` MiB."""
    if d.mode != keys.MODE_MIG:
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
    # Hot loop: the protocol's matching rules pass every device when the pod gives no use/nouse list
    # and no vgpu-mode, so they are only called when it does. memreq depends on the device only
    # through its total memory: computed again only when that changes.
    type_filter = req.type != NVIDIA or bool(ctx.use_types or ctx.nouse_types or ctx.vgpu_mode)
    uuid_filter = bool(ctx.use_uuids or ctx.nouse_uuids)
    memreq, memreq_total = 0, None
    for i in range(len(ordered) - 1, -1, -1):
        d = ordered[i]
        if not d.health:
            reasons[R.CARD_NOT_HEALTH] = reasons.get(R.CARD_NOT_HEALTH, 0) + 1
            continue
        if d.id in extras.cordoned:
            reasons[R.CARD_CORDONED] = reasons.get(R.CARD_CORDONED, 0) + 1
            continue
        if type_filter and not _type_ok(d, req, ctx):
            reasons[R.CARD_TYPE_MISMATCH] = reasons.get(R.CARD_TYPE_MISMATCH, 0) + 1
            continue
        if ctx.numa_bind and prevnuma != d.numa:
            if picked:
                reasons[R.NUMA_NOT_FIT] = reasons.get(R.NUMA_NOT_FIT, 0) + len(picked)
            nums = req.nums
            prevnuma = d.numa
            picked = []
        if uuid_filter and not _uuid_ok(d, ctx):
            reasons[R.CARD_UUID_MISMATCH] = reasons.get(R.CARD_UUID_MISMATCH, 0) + 1
            continue
        if d.count <= d.used:
            reasons[R.CARD_TIME_SLICING_EXHAUSTED] = reasons.get(R.CARD_TIME_SLICING_EXHAUSTED, 0) + 1
            continue
        if mutex and d.used > 0:
            reasons[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] = \
                reasons.get(R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, 0) + 1
            continue
        if d.totalmem != memreq_total:
            memreq, memreq_total = req.memory_for(d.totalmem), d.totalmem
        if quota is not None:
            pm = sum(p.usedmem for p in picked)
            pc = sum(p.usedcores for p in picked)
            if not quota.fits(pm + memreq, pc + cores):
                reasons[R.RESOURCE_QUOTA_NOT_FIT] = reasons.get(R.RESOURCE_QUOTA_NOT_FIT, 0) + 1
                continue
        if d.totalmem - d.usedmem < memreq:
            reasons[R.CARD_INSUFFICIENT_MEMORY] = reasons.get(R.CARD_INSUFFICIENT_MEMORY, 0) + 1
            continue
        if d.totalcore - d.usedcores < cores:
            reasons[R.CARD_INSUFFICIENT_CORE] = reasons.get(R.CARD_INSUFFICIENT_CORE, 0) + 1
            continue
        if d.totalcore == 100 and cores == 100 and d.used > 0:
            reasons[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] = \
                reasons.get(R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, 0) + 1
            continue
        if d.totalcore != 0 and d.usedcores == d.totalcore and cores == 0:
            reasons[R.CARD_COMPUTE_UNITS_EXHAUSTED] = reasons.get(R.CARD_COMPUTE_UNITS_EXHAUSTED, 0) + 1
            continue
        if not _mig_fit(d, memreq):
            reasons[R.CARD_MIG_TOPOLOGY_INFEASIBLE] = reasons.get(R.CARD_MIG_TOPOLOGY_INFEASIBLE, 0) + 1
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
        reasons[R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picked)
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
    ordered = [d for d in sort_devices(devs, ctx) if _NVIDIA_LOWER in d.type.lower()]
    if req.nums > len(ordered) and not any(d.mode == keys.MODE_MIG for d in ordered):
        return None, R.NODE_INSUFFICIENT_DEVICE, f"requested {req.nums} GPUs but the node has {len(ordered)}"
    reasons: dict[str, int] = {}
    picked = fit_devices(ordered, req, ctx, extras, quota, reasons=reasons)
    if picked is None:
        return None, gen_reason(reasons, len(ordered)), _detail(reasons, ordered, req)
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
    main = max(sorted(reasons), key=lambda r: reasons[r]) if reasons else R.NODE_UNFIT_POD
    healthy = [d for d in devs if d.health]
    if main == R.CARD_INSUFFICIENT_MEMORY and healthy:
        best = max(healthy, key=lambda d: d.totalmem - d.usedmem)
        return (f"{main}, requested {req.memory_for(best.totalmem)}Mi but available "
                f"{best.totalmem - best.usedmem}Mi")
    if main == R.CARD_INSUFFICIENT_CORE and healthy:
        return (f"{main}, requested {min(req.coresreq, 100)} cores but available "
                f"{max(d.totalcore - d.usedcores for d in healthy)}")
    if main == R.CARD_TIME_SLICING_EXHAUSTED:
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
