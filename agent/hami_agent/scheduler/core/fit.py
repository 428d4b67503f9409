"""HAMi's device fit and scoring, as pure functions (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``
``Fit``, ``pkg/scheduler/policy/gpu_policy.go``, ``node_policy.go``).

``fit_node`` answers "can this pod go on this node, on which GPUs, and if not why" for one node's
device list; it never mutates the caller's devices (it works on clones).
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.protocol import ProtocolError, keys
from hami_agent.protocol import annotations as annotations_mod
from hami_agent.protocol import reasons as R
from hami_agent.protocol.annotations import mode_allowed, type_allowed, uuid_allowed
from hami_agent.protocol.reasons import gen_reason
from hami_agent.scheduler.core import migfit
from hami_agent.scheduler.core.model import (
    NVIDIA,
    PCT_UNSET,
    ContainerDeviceRequest,
    DeviceUsage,
    Picked,
    PodRequest,
)

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
    vgpu_mode: str | None = None  # None: annotation absent (present but empty matches no mode, as in Go)
    gpu_policy: tuple[str, ...] = (annotations_mod.DEFAULT_GPU_POLICY,)
    node_policy: str = annotations_mod.DEFAULT_NODE_POLICY
    weights: tuple[int, int, int] = (1, 1, 1)  # slot, core, memory


@dataclass
class QuotaBudget:
    """Room left in the namespace's ResourceQuota (``limits.nvidia.com/gpumem|gpucores``, the memory limit
    already multiplied by ``memoryFactor`` as HAMi's ``FitQuota`` does); None = no limit."""

    mem_left: int | None = None
    cores_left: int | None = None

    def fits(self, mem: int, cores: int) -> bool:
        return ((self.mem_left is None or mem <= self.mem_left)
                and (self.cores_left is None or cores <= self.cores_left))


def collapsed_totals(containers: list[tuple[bool, list[Picked]]]) -> tuple[int, int]:
    """Memory and cores a pod holds, summed over GPUs, with HAMi's ``CollapseInitContainerUsage``
    (Project-HAMi/HAMi ``pkg/device/initContainer.go``): per GPU the larger of the init containers' peak
    (they run one after another) and the app containers' sum (they run together)."""
    init: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}
    for is_init, picks in containers:
        for p in picks:
            if is_init:
                a = init.setdefault(p.uuid, [0, 0])
                a[0], a[1] = max(a[0], p.usedmem), max(a[1], p.usedcores)
            else:
                a = app.setdefault(p.uuid, [0, 0])
                a[0] += p.usedmem
                a[1] += p.usedcores
    mem = cores = 0
    for uuid in init.keys() | app.keys():
        i, a = init.get(uuid, (0, 0)), app.get(uuid, (0, 0))
        mem += max(i[0], a[0])
        cores += max(i[1], a[1])
    return mem, cores


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
    """Read the scheduling annotations (``pkg/device/nvidia/device.go``) once per pod (the protocol parses
    them).

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
        vgpu_mode=a[keys.VGPU_MODE] if isinstance(a.get(keys.VGPU_MODE), str) else None,
        gpu_policy=gpol, node_policy=npol, weights=parse_weights(a.get(keys.DEVICE_SCORING_WEIGHTS)))


def _default_gpu_policy(gpu_policy: str) -> tuple[str, ...]:
    try:
        return annotations_mod.gpu_scheduler_policy({}, gpu_policy)
    except ProtocolError:  # a bad --gpu-scheduler-policy flag: HAMi's own default
        return (annotations_mod.DEFAULT_GPU_POLICY,)


def parse_weights(value: str | None) -> tuple[int, int, int]:
    """``hami.io/device-scoring-weights`` as the (slot, core, memory) tuple the score uses; None = the
    annotation is absent. The protocol's parser decides validity (raises ``ProtocolError``, a
    ValueError), an empty value included."""
    w = annotations_mod.parse_scoring_weights(value)
    return w.slot, w.core, w.memory


# ----------------------------------------------------------------------------------------- scoring
def device_score(d: DeviceUsage, req: ContainerDeviceRequest | None, weights=(1, 1, 1)) -> float:
    """HAMi ``DeviceListsScore.ComputeScore`` (Project-HAMi/HAMi ``pkg/scheduler/policy/gpu_policy.go``).
    The request term only counts when the request type equals the device type (HAMi
    ``pkg/scheduler/policy/gpu_policy.go`` quirk:
    real devices carry the model name, so it is 0). Its memory is the percentage of the device when
    one is set, even if a MiB request is given too (``MemPercentagereq`` wins there, unlike in Fit)."""
    if d.count == 0 or d.totalcore == 0 or d.totalmem == 0:
        return 0.0
    n = core = mem = 0
    if req is not None and req.type == d.type:
        n = 1  # §10: one per matching request, not nums
        core = req.coresreq
        pct = req.mem_percentage
        mem = d.totalmem * pct // 100 if pct not in (0, PCT_UNSET) else req.memreq
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


_SORT_KEYS = ("binpack", "spread", "numa")


def sort_devices(devs: list[DeviceUsage], ctx: PodContext) -> list[DeviceUsage]:
    """HAMi ``DeviceUsageList.Less`` (``pkg/scheduler/policy/gpu_policy.go``); Fit walks the result from
    the END. One policy: mutex = busy first; numa-bind groups NUMA nodes (descending for binpack);
    binpack = score ascending; anything else (spread, topology-aware) = score descending; NUMA breaks
    ties. A chain (or bare ``numa``): its binpack/spread/numa keys in the written order, spread when it
    names none (``mutex,topology-aware``), NUMA first under numa-bind, then the index. Go's ``sort.Sort``
    leaves equal keys in no fixed order; the index settles them here."""
    pol = ctx.gpu_policy
    if len(pol) == 1 and pol[0] != "numa":
        p = pol[0]
        if p == "mutex":
            return sorted(devs, key=lambda d: (-d.used, d.numa, d.index))
        if ctx.numa_bind:
            if p == "binpack":
                return sorted(devs, key=lambda d: (-d.numa, d.score, d.index))
            return sorted(devs, key=lambda d: (d.numa, -d.score, d.index))
        if p == "binpack":
            return sorted(devs, key=lambda d: (d.score, d.numa, d.index))
        return sorted(devs, key=lambda d: (-d.score, d.numa, d.index))
    chain: list[str] = []
    for k in pol:
        if k in _SORT_KEYS and k not in chain:
            chain.append(k)
    if not chain:
        chain = ["spread"]
    if ctx.numa_bind and chain[0] != "numa":
        chain = ["numa"] + [k for k in chain if k != "numa"]

    def key(d: DeviceUsage) -> tuple:
        out = [d.score if k == "binpack" else -d.score if k == "spread" else d.numa for k in chain]
        out.append(d.index)
        return tuple(out)

    return sorted(devs, key=key)


# --------------------------------------------------------------------------------------------- fit
def _type_ok(d: DeviceUsage, req: ContainerDeviceRequest, ctx: PodContext) -> bool:
    return (req.type == NVIDIA and type_allowed(d.type, ctx.use_types, ctx.nouse_types)
            and mode_allowed(ctx.vgpu_mode, d.mode))


def _uuid_ok(d: DeviceUsage, ctx: PodContext) -> bool:
    return uuid_allowed(d.id, ctx.use_uuids, ctx.nouse_uuids)


def _count(reasons: dict[str, int], reason: str, n: int = 1) -> None:
    reasons[reason] = reasons.get(reason, 0) + n


def fit_devices(ordered: list[DeviceUsage], req: ContainerDeviceRequest, ctx: PodContext,
                extras: NodeExtras, quota: QuotaBudget | None, *, reasons: dict[str, int],
                earlier: list[tuple[bool, list[Picked]]] | None = None,
                is_init: bool = False) -> list[Picked] | None:
    """HAMi ``NvidiaGPUDevices.Fit`` (``pkg/device/nvidia/device.go``) for one container request on an
    ordered device list, walked from the end. Returns the picked devices, or None with ``reasons``
    filled in. ``earlier``: the pod's containers fitted before this one (for the quota check)."""
    nums = req.nums
    prevnuma = -1  # HAMi's initial value
    picked: list[Picked] = []
    cores = min(req.coresreq, 100)
    mutex = "mutex" in ctx.gpu_policy
    topo = "topology-aware" in ctx.gpu_policy  # PolicyContains: also inside a chain
    # Hot loop: the protocol's matching rules pass every device when the pod gives no use/nouse list
    # and no vgpu-mode, so they are only called when it does. memreq depends on the device only
    # through its total memory: computed again only when that changes.
    type_filter = req.type != NVIDIA or bool(ctx.use_types or ctx.nouse_types) or ctx.vgpu_mode is not None
    uuid_filter = bool(ctx.use_uuids or ctx.nouse_uuids)
    memreq, memreq_total = 0, None
    i = len(ordered) - 1
    while i >= 0:
        d = ordered[i]
        i -= 1
        if not d.healthy:
            _count(reasons, R.CARD_NOT_HEALTH)
            continue
        if d.id in extras.cordoned:
            _count(reasons, R.CARD_CORDONED)
            continue
        if type_filter and not _type_ok(d, req, ctx):
            _count(reasons, R.CARD_TYPE_MISMATCH)
            continue
        if ctx.numa_bind and prevnuma != d.numa:
            if nums != req.nums:
                _count(reasons, R.NUMA_NOT_FIT, len(picked))
            nums = req.nums
            prevnuma = d.numa
            picked = []
        if uuid_filter and not _uuid_ok(d, ctx):
            _count(reasons, R.CARD_UUID_MISMATCH)
            continue
        if d.count <= d.used:
            _count(reasons, R.CARD_TIME_SLICING_EXHAUSTED)
            continue
        if mutex and d.used > 0:
            _count(reasons, R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT)
            continue
        if d.totalmem != memreq_total:
            memreq, memreq_total = req.memory_for(d.totalmem), d.totalmem
        if quota is not None:
            hypo = [*(earlier or []), (is_init, [*picked, Picked(d.id, NVIDIA, memreq, cores)])]
            if not quota.fits(*collapsed_totals(hypo)):
                _count(reasons, R.RESOURCE_QUOTA_NOT_FIT)
                continue
        if d.totalmem - d.usedmem < memreq:
            _count(reasons, R.CARD_INSUFFICIENT_MEMORY)
            continue
        if d.totalcore - d.usedcores < cores:
            _count(reasons, R.CARD_INSUFFICIENT_CORE)
            continue
        if d.totalcore == 100 and cores == 100 and d.used > 0:
            _count(reasons, R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT)
            continue
        if d.totalcore != 0 and d.usedcores == d.totalcore and cores == 0:
            _count(reasons, R.CARD_COMPUTE_UNITS_EXHAUSTED)
            continue
        is_mig = d.mode == keys.MODE_MIG
        if is_mig and not migfit.custom_filter(d.mig_profiles, d.mig_used,
                                               [p.usedmem for p in picked if p.uuid == d.id], memreq):
            _count(reasons, R.CARD_MIG_TOPOLOGY_INFEASIBLE)
            continue
        if nums > 0:
            if not topo:
                nums -= 1
            picked.append(Picked(d.id, NVIDIA, memreq, cores))
        if nums == 0 and not topo:
            return picked
        if is_mig:
            i += 1  # HAMi: a MIG GPU is examined again, for another instance of the same container
    if topo:
        if len(picked) == req.nums:
            return picked
        if len(picked) > req.nums:
            return _topology_choice(picked, req.nums, extras.pair_scores)
    if picked:
        reasons[R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picked)
    return None


# HAMi's computeBestCombination scores every n-combination of the candidates. A pod chooses topology-aware
# and n itself (``hami.io/gpu-scheduler-policy`` is a pod annotation), and a MIG GPU is a candidate once per
# instance it can still take, so an 8-GPU request on a node of MIG GPUs meets tens of candidates: C(56, 8)
# is 1.4e9 combinations, minutes of one /filter for every node. Up to this many combinations the choice is
# HAMi's, exactly; beyond it a greedy choice bounds the work (tests/unit/scheduler/test_fit_topology.py).
MAX_COMBINATIONS = 20_000


def _topology_choice(cands: list[Picked], n: int, pairs: dict[str, dict[str, int]]) -> list[Picked]:
    """topology-aware: n==1 → the worst-connected card (``computeWorstSingleCard``); n>1 → the
    best-connected n-combination (``computeBestCombination``), the first one generated when scores tie
    and whatever the scores are (HAMi keeps the first combination even when every score is below -1)."""

    def pair(a: str, b: str) -> int:
        return pairs.get(a, {}).get(b, 0)

    if n == 1:
        return [min(cands, key=lambda c: sum(pair(c.uuid, o.uuid) for o in cands if o.uuid != c.uuid))]
    if math.comb(len(cands), n) > MAX_COMBINATIONS:
        return _greedy_combination(cands, n, pair)
    best: list[Picked] | None = None
    best_score = 0
    for combo in itertools.combinations(cands, n):
        s = sum(pair(a.uuid, b.uuid) for a, b in itertools.combinations(combo, 2))
        if best is None or s > best_score:
            best, best_score = list(combo), s
    return best if best is not None else cands[:n]


def _greedy_combination(cands: list[Picked], n: int, pair) -> list[Picked]:  # noqa: ANN001
    """The best-connected pair, then one card at a time the one that adds most to the set's score (the
    first in candidate order when tied): O(len(cands)^2 * n) pair lookups instead of C(len(cands), n)."""
    first = max(itertools.combinations(range(len(cands)), 2),
                key=lambda ij: (pair(cands[ij[0]].uuid, cands[ij[1]].uuid), -ij[0], -ij[1]))
    chosen = list(first)
    while len(chosen) < n:
        rest = [i for i in range(len(cands)) if i not in chosen]
        add = max(rest, key=lambda i: (sum(pair(cands[i].uuid, cands[j].uuid) for j in chosen), -i))
        chosen.append(add)
    return [cands[i] for i in sorted(chosen)]


def is_mig_request(req: ContainerDeviceRequest, devices: list[DeviceUsage], ctx: PodContext) -> bool:
    """HAMi ``isMIGRequest`` (``pkg/scheduler/score.go``): an NVIDIA request, from a pod whose
    ``nvidia.com/vgpu-mode`` (when set) contains ``mig``, on a node with a GPU in MIG mode."""
    if req.type != NVIDIA:
        return False
    if ctx.vgpu_mode is not None and keys.MODE_MIG not in ctx.vgpu_mode:
        return False
    return any(d.mode == keys.MODE_MIG for d in devices)


def _add_usage(devs: list[DeviceUsage], picked: list[Picked]) -> tuple[list[Picked] | None, str]:
    """HAMi ``AddResourceUsage``: a MIG GPU's pick becomes the profile and placement chosen now (its
    memory and cores are the profile's); every pick adds to its GPU's usage."""
    by_id = {d.id: d for d in devs}
    out = []
    for pick in picked:
        d = by_id[pick.uuid]
        p = pick
        if d.mode == keys.MODE_MIG:
            got = migfit.select_candidate(d.mig_profiles, d.mig_used, pick.usedmem)
            if got is None:
                return None, (f"AddResourceUsage failed for device {d.id}: MIG profile and placement "
                              "allocation failed")
            prof, placement = got
            p = Picked(pick.uuid, pick.type, prof.memory_mb, prof.core, prof.name, placement)
            d.mig_used = (*d.mig_used, placement)
        d.used += 1
        d.usedmem += p.usedmem
        d.usedcores += p.usedcores
        out.append(p)
    return out, ""


def fit_container(devs: list[DeviceUsage], req: ContainerDeviceRequest, ctx: PodContext,
                  extras: NodeExtras, quota: QuotaBudget | None,
                  earlier: list[tuple[bool, list[Picked]]] | None = None,
                  is_init: bool = False) -> tuple[list[Picked] | None, str, str]:
    """HAMi ``fitInDevices`` for one container: score, sort, fit, then add the usage to ``devs``.
    Returns (picked or None, reason string, log detail)."""
    for d in devs:
        d.score = device_score(d, req, ctx.weights)
    ordered = [d for d in sort_devices(devs, ctx) if _NVIDIA_LOWER in d.type.lower()]
    if req.nums > len(ordered) and not is_mig_request(req, ordered, ctx):
        return None, R.NODE_INSUFFICIENT_DEVICE, f"requested {req.nums} GPUs but the node has {len(ordered)}"
    reasons: dict[str, int] = {}
    picked = fit_devices(ordered, req, ctx, extras, quota, reasons=reasons, earlier=earlier, is_init=is_init)
    if picked is None:
        return None, gen_reason(reasons, len(ordered)), _detail(reasons, ordered, req)
    added, why = _add_usage(devs, picked)
    if added is None:
        return None, why, why
    return added, "", ""


def _detail(reasons: dict[str, int], devs: list[DeviceUsage], req: ContainerDeviceRequest) -> str:
    """The seed's -v=4 wording: ``CardInsufficientMemory, requested 8192Mi but available 4096Mi``."""
    main = max(sorted(reasons), key=lambda r: reasons[r]) if reasons else R.NODE_UNFIT_POD
    healthy = [d for d in devs if d.healthy]
    if main == R.CARD_INSUFFICIENT_MEMORY and healthy:
        best = max(healthy, key=lambda d: d.totalmem - d.usedmem)
        return (f"{main}, requested {req.memory_for(best.totalmem)}Mi but available "
                f"{best.totalmem - best.usedmem}Mi")
    if main == R.CARD_INSUFFICIENT_CORE and healthy:
        return (f"{main}, requested {min(req.coresreq, 100)} cores but available "
                f"{max(d.totalcore - d.usedcores for d in healthy)}")
    if main == R.CARD_TIME_SLICING_EXHAUSTED:
        return f"{main}, all {len(devs)} GPUs have every slot in use"
    if main == R.CARD_MIG_TOPOLOGY_INFEASIBLE:
        return f"{main}, no allowlisted MIG profile large enough has a free placement"
    return main


def fit_node(base: list[DeviceUsage], preq: PodRequest, ctx: PodContext, extras: NodeExtras,
             quota: QuotaBudget | None = None) -> NodeFit:
    """Fit every container of a pod on one node (HAMi ``scoreNode``, ``pkg/scheduler/score.go``). Init
    containers are fitted one at a time against the node's usage (they run before the app containers
    and one after another); app containers are fitted cumulatively. The quota counts the whole pod
    collapsed as it will be counted once admitted (init containers at their per-GPU peak)."""
    out: list[list[Picked]] = [[] for _ in preq.containers]
    earlier: list[tuple[bool, list[Picked]]] = []
    for i, req in enumerate(preq.containers):
        if i >= preq.n_init:
            break
        if req is None or req.nums <= 0:
            continue
        devs = [d.clone() for d in base]
        picked, reason, detail = fit_container(devs, req, ctx, extras, quota, earlier, True)
        if picked is None:
            return NodeFit(False, out, reason, detail)
        out[i] = picked
        earlier.append((True, picked))
    devs = [d.clone() for d in base]
    for i in range(preq.n_init, len(preq.containers)):
        req = preq.containers[i]
        if req is None or req.nums <= 0:
            continue
        log.v(logger, 5, "fitInDevices container %d", i)
        picked, reason, detail = fit_container(devs, req, ctx, extras, quota, earlier, False)
        if picked is None:
            return NodeFit(False, out, reason, detail)
        out[i] = picked
        earlier.append((False, picked))
    return NodeFit(True, out)
