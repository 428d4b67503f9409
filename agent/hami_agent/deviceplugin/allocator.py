# Over 500 lines on purpose: Allocate's checks (lock, pod, devices, over-commit) are one chain.
"""GetPreferredAllocation and Allocate (HAMi semantics, reference: HAMi ``pkg/device-plugin/nvidiadevice``
``plugin.go`` Allocate / GetPreferredAllocation), with three rules HAMi does not have:

1. **The pod is the node lock's owner, pinned by uid** (``owner.py``): no fallback to "the oldest
   binding pod"; a refusal writes nothing.
2. **One deadline budget, and no success after an error answer** (``budget.py``): every API call gets
   what is left of the RPC's deadline; the success write is the last step and goes through
   ``RpcBudget.commit``; everything written after the answer (lock release, ``bind-phase=failed``) goes
   to the background ``LateWriter``, so nothing on the kubelet's path sleeps or retries.
3. **Only what the scheduler allocated, never more than the node has**: the kubelet's device IDs must
   match the owner's ``hami.io/vgpu-devices-to-allocate`` for the container served (except devices the
   kubelet re-uses from the pod's own init containers), that entry must equal the scheduler's
   ``hami.io/vgpu-devices-allocated``, and the pod's allocation plus the other allocated pods must fit
   the node's registered capacity (``capacity.py``).

No NVML and no unbounded I/O: device facts come from the current ``ResourcePlan`` (built from the
in-memory NVML snapshot), pods from ``PodSource`` caches. Responses are plain dataclasses
(``ContainerResponse``) so this module stays free of gRPC.
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.deviceplugin.budget import BudgetExhausted, LateCommit, RpcBudget
from hami_agent.deviceplugin.capacity import check_capacity, held_by_others, registered_devices
from hami_agent.deviceplugin.devices import KIND_MIG, ResourcePlan, physical_id
from hami_agent.deviceplugin.dynmig import DynamicMig, MigAllocateError
from hami_agent.deviceplugin.errors import AllocationError, Refused
from hami_agent.deviceplugin.latewriter import LateWriter
from hami_agent.deviceplugin.owner import LockOwner, annotations, find_lock_owner, rivals
from hami_agent.deviceplugin.podsource import PodChanged, PodSource, PodSourceError
from hami_agent.deviceplugin.settings import MODE_MIG, MODE_MPS, PluginSettings
from hami_agent.protocol import keys
from hami_agent.protocol.devices import ContainerDevice, decode_pod_devices, encode_pod_devices
from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations

logger = logging.getLogger(__name__)

OVERLAY_TTL_S = 600.0
MEMORY_LIMIT = 4096  # pods remembered (overlay, settled uids, handed device IDs): bounded

__all__ = ["AllocationError", "Allocator", "ContainerResponse", "MountSpec", "PreferredRequest", "Refused",
           "hami_core_response"]


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass
class ContainerResponse:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[MountSpec] = field(default_factory=list)


@dataclass(frozen=True)
class PreferredRequest:
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def _is_nvidia(d: ContainerDevice) -> bool:
    return keys.NVIDIA_DEVICE in d.type


def _pod_key(pod: dict) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', 'default')}/{md.get('name', '?')}"


def container_at(pod: dict, index: int) -> dict:
    """The container behind entry ``index`` of a pod device string (init containers first)."""
    spec = pod.get("spec") or {}
    inits = spec.get("initContainers") or []
    ctrs = spec.get("containers") or []
    if index < len(inits):
        return inits[index]
    if index - len(inits) < len(ctrs):
        return ctrs[index - len(inits)]
    raise AllocationError(f"pod {_pod_key(pod)}: device entry {index} in {keys.DEVICES_TO_ALLOCATE} has no "
                          f"matching container ({len(inits)} init + {len(ctrs)} containers)")


def _env_value(container: dict, name: str) -> str | None:
    for item in container.get("env") or []:
        if item.get("name") == name:
            return str(item.get("value", ""))
    return None


def _shape(devices: Sequence[ContainerDevice]) -> list[tuple[str, int, int]]:
    return sorted((d.uuid, d.usedmem, d.usedcores) for d in devices if _is_nvidia(d))


def _may_have_landed(exc: BaseException) -> bool:
    """After the success write was sent and failed: could it have been applied anyway?"""
    if isinstance(exc, LateCommit):
        return True  # it was applied, after the error answer
    if isinstance(exc, PodChanged):
        return False  # a precondition failed: the server applied nothing
    if isinstance(exc, PodSourceError):
        return exc.unknown
    return True  # anything else (a bug mid-write): assume the worst, restoring is harmless


def _remember_bounded(store: collections.OrderedDict, key: str, value: object) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > MEMORY_LIMIT:
        store.popitem(last=False)


class MigRealizer:
    """Allocate's MIG half for one pod (HAMi ``GetContainerDeviceStrArray`` + ``annotateMigRuntimeInfo``,
    Project-HAMi/HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/util.go`` and ``server.go``):
    the container's reservations (by container index, in device order) must match its devices; each gets
    its instance, within what is left of the budget after the success write's margin; the MIG UUIDs are
    the container's devices, and the runtime identity goes into the annotation the success write sets."""

    def __init__(self, mig: DynamicMig | None, pod: dict, who: object, budget: RpcBudget | None,
                 settings: PluginSettings, created: list | None) -> None:
        if mig is None:
            raise AllocationError("operatingmode mig: dynamic MIG is not running on this plugin")
        self.mig, self.who, self.budget, self.settings = mig, who, budget, settings
        self.created = created if created is not None else []
        try:
            self.allocs = decode_mig_allocations(annotations(pod).get(keys.MIG_ALLOCATIONS) or "")
        except ProtocolError as exc:
            raise AllocationError(f"decode scheduler MIG allocations: pod {who}: {exc}") from exc

    def _timeout(self) -> float:
        if self.budget is None:
            return 10.0
        s = self.settings
        left = self.budget.remaining() - s.commit_margin_s - s.rpc_reply_margin_s
        if left < 0.05:
            raise BudgetExhausted(f"{self.budget.what}: no time left to create the MIG instance")
        return left

    def realize(self, index: int, ctr: dict, devreq: Sequence[ContainerDevice]) -> list[str]:
        mine = sorted((a for a in self.allocs if a.container_index == index), key=lambda a: a.device_index)
        name = ctr.get("name")
        if len(mine) != len(devreq):
            raise AllocationError(f"container {name} has {len(mine)} MIG reservations, requested "
                                  f"{len(devreq)} devices")
        out = []
        for a, d in zip(mine, devreq, strict=True):
            if a.gpu_uuid != d.uuid:
                raise AllocationError(f"MIG reservation GPU {a.gpu_uuid} does not match allocated GPU "
                                      f"{d.uuid}")
            try:
                inst = self.mig.ensure(a, self._timeout(), self.created)
            except MigAllocateError as exc:
                raise AllocationError(f"pod {self.who} container {name}: {exc}") from exc
            self.allocs = [MigAllocation(x.container_index, x.device_index, x.gpu_uuid, x.profile,
                                         x.placement, inst.mig_uuid, inst.gi_id, inst.ci_id) if x == a else x
                           for x in self.allocs]
            out.append(str(inst.mig_uuid))
        return out

    def annotation(self) -> str:
        return encode_mig_allocations(self.allocs)


def hami_core_response(s: PluginSettings, devreq: Sequence[ContainerDevice], cache_dir_name: str, *,
                       disable_control: bool = False, who: str = "container") -> ContainerResponse:
    """HAMi-core's envs and mounts for ``devreq`` (HAMi ``plugin.go`` Allocate): shared by the device
    plugin's Allocate (``cache_dir_name`` = ``<podUID>_<container>``) and the DRA driver's prepared claims
    (``<claimUID>_<request>``), so the same memory and cores give the same limits either way."""
    vgpu = os.path.join(s.hook_path, "vgpu")
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in devreq)}
    for i, d in enumerate(devreq):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{d.usedmem}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(devreq[0].usedcores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(vgpu, f"{uuidlib.uuid4()}.cache")
    if s.device_memory_scaling > 1:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    if s.lib_cuda_log_level:
        envs["LIBCUDA_LOG_LEVEL"] = s.lib_cuda_log_level
    if s.disable_core_limit:
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"

    lib = os.path.join(vgpu, "libvgpu.so")
    host_lib = f"{lib}.{s.plugin_version}" if s.plugin_version else lib
    if not os.path.exists(host_lib):
        host_lib = lib
    cache_dir = os.path.join(vgpu, "containers", cache_dir_name)
    for d in (cache_dir, s.vgpu_lock_dir):
        try:
            os.makedirs(d, exist_ok=True)
            os.chmod(d, 0o777)  # containers run as any uid and must write their cache/lock files
        except OSError as exc:
            raise AllocationError(f"cannot create host directory {d} for {who}: {exc}") from exc
    mounts = [
        MountSpec(lib, host_lib, True),
        MountSpec(vgpu, cache_dir, False),
        MountSpec("/tmp/vgpulock", s.vgpu_lock_dir, False),
    ]
    if not disable_control:
        mounts.append(MountSpec("/etc/ld.so.preload", os.path.join(vgpu, "ld.so.preload"), True))
    license_path = os.path.join(vgpu, "license")
    if os.path.exists(license_path):
        mounts.append(MountSpec("/tmp/license", license_path, True))
        mounts.append(MountSpec("/usr/bin/vgpuvalidator", os.path.join(vgpu, "vgpuvalidator"), True))
    return ContainerResponse(envs, mounts)


class Allocator:
    """Serves one node. Thread-safe; Allocate calls are serialized (as in HAMi)."""

    def __init__(self, settings: PluginSettings, pods: PodSource,
                 clock: Callable[[], float] = time.monotonic, writer: LateWriter | None = None,
                 mig: DynamicMig | None = None) -> None:
        """``mig``: the node's dynamic-MIG instances (``operatingmode: mig``)."""
        self.settings = settings
        self.pods = pods
        self.mig = mig
        self._clock = clock
        self.writer = writer or LateWriter(settings.late_write_timeout_s)
        self._serial = threading.Lock()
        self._memory_lock = threading.Lock()
        # Annotations we wrote (or are writing in the background), applied over cached pods until the
        # informer catches up: otherwise a multi-container pod whose second Allocate arrives before the
        # watch event would get its first container's devices again.
        self._overlay: collections.OrderedDict[str, tuple[float, dict[str, str]]] = collections.OrderedDict()
        # uid -> "success" / "failed": pods whose admission this plugin has answered (never rivals again)
        self._settled: collections.OrderedDict[str, str] = collections.OrderedDict()
        # uid -> replica IDs handed to the pod's containers: the kubelet re-uses init containers' devices
        self._handed: collections.OrderedDict[str, frozenset[str]] = collections.OrderedDict()

    def new_budget(self, what: str) -> RpcBudget:
        s = self.settings
        return RpcBudget(what, s.rpc_deadline_s, reply_margin_s=s.rpc_reply_margin_s,
                         commit_margin_s=s.commit_margin_s, api_timeout_s=s.api_timeout_s)

    def close(self) -> None:
        self.writer.stop()

    # ------------------------------------------------------------------------------ plugin memory
    def _with_overlay(self, pod: dict) -> dict:
        uid = (pod.get("metadata") or {}).get("uid") or _pod_key(pod)
        with self._memory_lock:
            entry = self._overlay.get(uid)
            if entry is None:
                return pod
            at, patch = entry
            ann = annotations(pod)
            if self._clock() - at > OVERLAY_TTL_S or all(ann.get(k) == v for k, v in patch.items()):
                del self._overlay[uid]  # cache caught up (or entry too old to matter)
                return pod
        pod = copy.deepcopy(pod)
        pod.setdefault("metadata", {}).setdefault("annotations", {}).update(patch)
        return pod

    def _remember(self, uid: str, patch: dict[str, str]) -> None:
        with self._memory_lock:
            old = self._overlay.get(uid, (0.0, {}))[1]
            _remember_bounded(self._overlay, uid, (self._clock(), {**old, **patch}))

    def _settle(self, uid: str, outcome: str) -> None:
        with self._memory_lock:
            _remember_bounded(self._settled, uid, outcome)

    def _settled_uids(self) -> frozenset[str]:
        with self._memory_lock:
            return frozenset(self._settled)

    def _handed_to(self, uid: str) -> frozenset[str]:
        with self._memory_lock:
            return self._handed.get(uid, frozenset())

    def _viewed_pods(self) -> list[dict]:
        return [self._with_overlay(p) for p in self.pods.pods_on_node()]

    # ---------------------------------------------------------------------------------- identity
    def _owner(self, plan: ResourcePlan, budget: RpcBudget) -> LockOwner:
        """The lock owner, if the kubelet cannot be admitting anyone else (``owner.py``)."""
        node = self.settings.node_name
        owner = find_lock_owner(self.pods, node, budget, self._with_overlay)
        others = rivals(self._viewed_pods(), owner, plan.resource_name, self._settled_uids())
        if others:
            raise Refused(
                f"ambiguous admission on node {node}: the node lock names {owner.ref}, but "
                f"{', '.join(others)} also wait(s) for '{plan.resource_name}' on this node without an "
                "allocation, and Allocate cannot tell which pod the kubelet is admitting; refusing and "
                "writing nothing (pods that request GPUs must reach the node through the HAMi scheduler)")
        return owner

    # ---------------------------------------------------------------------- GetPreferredAllocation
    def preferred(self, plan: ResourcePlan, requests: Sequence[PreferredRequest],
                  budget: RpcBudget | None = None) -> list[list[str]]:
        budget = budget or self.new_budget("GetPreferredAllocation")
        pod_devices: list[list[ContainerDevice]] = []
        if plan.kind != KIND_MIG:
            try:
                owner = self._owner(plan, budget)
                decoded = decode_pod_devices(annotations(owner.pod).get(keys.DEVICES_TO_ALLOCATE, ""))
                pod_devices = [[d for d in c if _is_nvidia(d)] for c in decoded]
                pod_devices = [c for c in pod_devices if c]
            except (AllocationError, ProtocolError, BudgetExhausted, PodSourceError) as exc:
                # advisory call: answer with a valid subset; Allocate decides (and explains) for real
                log.v(logger, 3, "GetPreferredAllocation for '%s' without scheduler hint: %s",
                      plan.resource_name, exc)
        out = []
        for n, req in enumerate(requests):
            wanted = pod_devices[n] if n < len(pod_devices) else []
            out.append(self._prefer(req, [d.uuid for d in wanted]))
        return out

    @staticmethod
    def _prefer(req: PreferredRequest, wanted_uuids: Sequence[str]) -> list[str]:
        chosen: list[str] = []
        pool = list(req.must_include) + [a for a in req.available if a not in req.must_include]
        for u in wanted_uuids:
            for cand in pool:
                if cand not in chosen and physical_id(cand) == u:
                    chosen.append(cand)
                    break
        for cand in list(req.must_include) + list(req.available):
            if len(chosen) >= req.size:
                break
            if cand not in chosen:
                chosen.append(cand)
        missing = [m for m in req.must_include if m not in chosen]
        if missing:  # must_include wins over the hint
            chosen = missing + [c for c in chosen if c not in missing]
        return chosen[: max(req.size, len(req.must_include))]

    # ------------------------------------------------------------------------------------ Allocate
    def allocate(self, plan: ResourcePlan, requests: Sequence[Sequence[str]],
                 budget: RpcBudget | None = None) -> list[ContainerResponse]:
        budget = budget or self.new_budget("Allocate")
        known = plan.by_id()
        for ids in requests:
            for i in ids:
                if i not in known:
                    raise AllocationError(
                        f"invalid allocation request for '{plan.resource_name}': unknown device: {i}")
        if plan.kind == KIND_MIG:
            return [ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}) for ids in requests]
        # the kubelet admits one pod at a time; a body still running after its deadline holds this
        # lock for at most one API timeout, and the wait is bounded by this RPC's own budget
        if not self._serial.acquire(timeout=max(0.0, budget.wait_timeout())):
            raise AllocationError(f"another Allocate on node {self.settings.node_name} is still finishing "
                                  "(its API call outlived its deadline); nothing written, retry the pod")
        try:
            return self._allocate_locked(plan, requests, budget)
        finally:
            self._serial.release()

    def _allocate_locked(self, plan: ResourcePlan, requests: Sequence[Sequence[str]],
                         budget: RpcBudget) -> list[ContainerResponse]:
        try:
            owner = self._owner(plan, budget)
        except (BudgetExhausted, PodSourceError) as exc:
            raise AllocationError(f"failed to get pending pod: {exc}") from exc
        raw = annotations(owner.pod).get(keys.DEVICES_TO_ALLOCATE, "")
        raw_mig = annotations(owner.pod).get(keys.MIG_ALLOCATIONS)
        sent = False
        created: list = []  # MIG instances this call made: given back unless it commits
        try:
            responses, changes, done = self._prepare(plan, owner, requests, budget, created)
            expect = {keys.DEVICES_TO_ALLOCATE: raw, keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING}
            if keys.MIG_ALLOCATIONS in changes and raw_mig is not None:
                expect[keys.MIG_ALLOCATIONS] = raw_mig

            def write(timeout_s: float) -> None:
                nonlocal sent
                sent = True
                # conditional on the uid and on exactly what the allocation was computed from: a late
                # arrival after a failure record (bind-phase=failed) is refused by the API server
                self.pods.patch_pod_if(owner.ref, expect, changes, timeout_s)

            result = budget.commit(write, responses)
        except BaseException as exc:
            landed = sent and _may_have_landed(exc)
            if self.mig is not None:
                self.mig.abandon(created, f"Allocate for pod {owner.ref} failed: {exc}")
            self._record_failure(owner, raw if landed else None, exc,
                                 raw_mig if landed and raw_mig is not None else None)
            if isinstance(exc, AllocationError):
                raise
            if isinstance(exc, (BudgetExhausted, LateCommit, PodSourceError)):
                raise AllocationError(f"pod {owner.ref}: {exc}") from exc
            raise
        self._committed(owner, changes, requests, done)
        return result

    def _prepare(self, plan: ResourcePlan, owner: LockOwner, requests: Sequence[Sequence[str]],
                 budget: RpcBudget | None = None, created: list | None = None
                 ) -> tuple[list[ContainerResponse], dict[str, str], bool]:
        """Everything but the write: checks, the responses, and the annotations to commit. In mig mode
        the MIG instances are created here (``created`` collects them for a rollback)."""
        pod, who, node = owner.pod, owner.ref, self.settings.node_name
        ann = annotations(pod)
        try:
            containers = decode_pod_devices(ann.get(keys.DEVICES_TO_ALLOCATE, ""))
            allocated = decode_pod_devices(ann.get(keys.DEVICES_ALLOCATED, ""))
        except ProtocolError as exc:
            raise AllocationError(f"failed to decode pod devices: pod {who}: {exc}") from exc
        if len(allocated) != len(containers):
            raise AllocationError(f"pod {who}: {keys.DEVICES_TO_ALLOCATE} has {len(containers)} container "
                                  f"entries but {keys.DEVICES_ALLOCATED} has {len(allocated)}; the scheduler "
                                  "writes both alike: refusing")
        check_capacity(pod, registered_devices(owner.node, node),
                       held_by_others(self._viewed_pods(), node, who.uid), node)
        node_uuids = {d.physical_uuid for d in plan.devices}
        reusable = self._handed_to(who.uid)
        responses = []
        mig = None
        if self.settings.mode == MODE_MIG:
            mig = MigRealizer(self.mig, pod, who, budget, self.settings, created)
        for ids in requests:
            idx = next((i for i, c in enumerate(containers) if any(_is_nvidia(d) for d in c)), None)
            if idx is None:
                raise AllocationError(f"device number not matched: pod {who} has no container left in "
                                      f"{keys.DEVICES_TO_ALLOCATE}, kubelet asked for {len(ids)} device(s)")
            devreq = [d for d in containers[idx] if _is_nvidia(d)]
            containers[idx] = [d for d in containers[idx] if not _is_nvidia(d)]
            ctr = container_at(pod, idx)
            if len(devreq) != len(ids):
                raise AllocationError(
                    f"device number not matched: pod {who} container {ctr.get('name')!r} has "
                    f"{len(devreq)} device(s) in {keys.DEVICES_TO_ALLOCATE}, kubelet asked for {len(ids)}")
            if _shape(devreq) != _shape(allocated[idx]):
                raise AllocationError(
                    f"pod {who} container {ctr.get('name')!r}: {keys.DEVICES_TO_ALLOCATE} "
                    f"({_shape(devreq)}) differs from the scheduler's {keys.DEVICES_ALLOCATED} "
                    f"({_shape(allocated[idx])}); refusing an allocation the scheduler did not make")
            for d in devreq:
                if d.uuid not in node_uuids:
                    raise AllocationError(
                        f"pod {who}: device {d.uuid} in {keys.DEVICES_TO_ALLOCATE} is not a "
                        f"'{plan.resource_name}' device of node {node}")
            self._check_kubelet_choice(who, ctr, ids, devreq, reusable)
            if mig is not None:
                responses.append(ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(
                    mig.realize(idx, ctr, devreq))}))
            elif self.settings.mode == MODE_MPS:
                responses.append(self._mps_response(plan, devreq))
            else:
                responses.append(self._hami_core_response(pod, ctr, devreq))
        changes = {keys.DEVICES_TO_ALLOCATE: encode_pod_devices(containers)}
        if mig is not None:
            changes[keys.MIG_ALLOCATIONS] = mig.annotation()
        done = not any(_is_nvidia(d) for c in containers for d in c)
        if done:
            changes[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
        return responses, changes, done

    @staticmethod
    def _check_kubelet_choice(who: object, ctr: dict, ids: Sequence[str], devreq: Sequence[ContainerDevice],
                              reusable: frozenset[str]) -> None:
        """The kubelet's device IDs must be replicas of the GPUs the scheduler allocated to this container.
        Exception: IDs the kubelet already gave this same pod (it re-uses init containers' devices for
        later containers without asking GetPreferredAllocation: ``devicesToReuse`` in kubelet
        ``pkg/kubelet/cm/devicemanager/manager.go``); they cannot belong to another pod."""
        wanted = collections.Counter(d.uuid for d in devreq)
        fresh = collections.Counter(physical_id(i) for i in ids if i not in reusable)
        if fresh - wanted:
            raise AllocationError(
                f"pod {who} container {ctr.get('name')!r}: the kubelet chose {sorted(ids)} (GPUs "
                f"{sorted(fresh)}), but the scheduler allocated {sorted(wanted)} to it in "
                f"{keys.DEVICES_TO_ALLOCATE}; refusing rather than handing out devices the kubelet did not "
                "choose (GetPreferredAllocation had no hint for this pod, or a topology policy overrode it)")

    def _committed(self, owner: LockOwner, changes: dict[str, str], requests: Sequence[Sequence[str]],
                   done: bool) -> None:
        """Bookkeeping after a committed success (runs before the next Allocate: same serial lock)."""
        uid = owner.ref.uid
        self._remember(uid, changes)
        with self._memory_lock:
            handed = set(self._handed.get(uid, frozenset()))
            handed.update(i for ids in requests for i in ids)
            _remember_bounded(self._handed, uid, frozenset(handed))
        if done:
            self._settle(uid, keys.BIND_PHASE_SUCCESS)
            self._release_later(owner)
            log.v(logger, 4, "pod %s: all devices allocated, bind-phase=success", owner.ref)

    def _record_failure(self, owner: LockOwner, restore: str | None, exc: BaseException,
                        restore_mig: str | None = None) -> None:
        """After an error answer for the lock owner: ``bind-phase=failed`` (with ``to-allocate`` and the
        MIG reservations restored when a success write may have landed) and the lock released, both off
        the RPC path."""
        ref = owner.ref
        logger.error("Allocate failed for pod %s: %s", ref, exc)
        changes = {keys.BIND_PHASE: keys.BIND_PHASE_FAILED}
        if restore is not None:
            changes[keys.DEVICES_TO_ALLOCATE] = restore
        if restore_mig is not None:
            changes[keys.MIG_ALLOCATIONS] = restore_mig
        self._remember(ref.uid, changes)
        self._settle(ref.uid, keys.BIND_PHASE_FAILED)

        def mark_failed(timeout_s: float) -> None:
            try:
                self.pods.patch_pod_if(ref, {}, changes, timeout_s)
            except PodChanged as gone:  # deleted or re-created: nothing left to record
                log.v(logger, 3, "pod %s changed before its failure was recorded: %s", ref, gone)

        self.writer.submit(f"record {keys.BIND_PHASE}=failed on pod {ref}", mark_failed)
        self._release_later(owner)

    def _release_later(self, owner: LockOwner) -> None:
        value = owner.lock_value

        def release(timeout_s: float) -> None:
            if self.pods.release_lock_if(value, timeout_s):
                log.v(logger, 3, "node lock on %s released by %s", self.settings.node_name, owner.ref)
            else:
                log.v(logger, 4, "node lock %r of %s already gone", value, owner.ref)

        self.writer.submit(f"release node lock of pod {owner.ref}", release)

    # ------------------------------------------------------------------------------ responses
    def _hami_core_response(self, pod: dict, ctr: dict, devreq: list[ContainerDevice]) -> ContainerResponse:
        md = pod.get("metadata") or {}
        opt_out = (_env_value(ctr, "CUDA_DISABLE_CONTROL") or "").lower() == "true"
        return hami_core_response(self.settings, devreq, f"{md.get('uid', '')}_{ctr.get('name', '')}",
                                  disable_control=opt_out, who=f"container {ctr.get('name')!r}")

    def _mps_response(self, plan: ResourcePlan, devreq: list[ContainerDevice]) -> ContainerResponse:
        s = self.settings
        res = plan.resource_name
        cores = devreq[0].usedcores
        pct = cores if 0 < cores <= 100 else max(1, 100 // s.device_split_count)
        envs = {
            "NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in devreq),
            "CUDA_MPS_PIPE_DIRECTORY": f"/mps/{res}/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct),
        }
        limits = [f"{i}={d.usedmem}M" for i, d in enumerate(devreq) if d.usedmem > 0]
        if limits:
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
        mounts = [
            MountSpec(f"/mps/{res}/pipe", os.path.join(s.mps_root, res, "pipe"), False),
            MountSpec("/dev/shm", os.path.join(s.mps_root, "shm"), False),
        ]
        return ContainerResponse(envs, mounts)
