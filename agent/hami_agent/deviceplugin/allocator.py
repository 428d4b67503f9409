"""GetPreferredAllocation and Allocate logic (HAMi semantics, reference/hami.md §6.2-6.4).

No NVML and no unbounded I/O: device facts come from the current ``ResourcePlan`` (built from the
in-memory NVML snapshot), pods from ``PodSource`` caches; the only network calls are the
short-timeout fallbacks and write-backs of ``PodSource``. The server runs these methods under a hard
per-RPC deadline on top of that.

Responses are plain dataclasses (``ContainerResponse``) so this module stays free of gRPC.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.deviceplugin.devices import KIND_MIG, ResourcePlan, physical_id
from hami_agent.deviceplugin.podsource import PodSource, PodSourceError
from hami_agent.deviceplugin.settings import MODE_MPS, PluginSettings
from hami_agent.protocol import keys
from hami_agent.protocol.devices import ContainerDevice, decode_pod_devices, encode_pod_devices
from hami_agent.protocol.errors import ProtocolError

logger = logging.getLogger(__name__)

OVERLAY_TTL_S = 600.0


class AllocationError(RuntimeError):
    """Allocate/GetPreferredAllocation cannot be answered; the message is what the kubelet shows."""


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


def _annotations(pod: dict) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


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


class Allocator:
    """Serves one node. Thread-safe; Allocate calls are serialized (as in HAMi)."""

    def __init__(self, settings: PluginSettings, pods: PodSource,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.pods = pods
        self._clock = clock
        self._lock = threading.Lock()
        # Annotations we patched, applied over cached pods until the informer catches up: otherwise a
        # multi-container pod whose second Allocate arrives before the watch event would get its first
        # container's devices again.
        self._overlay: dict[str, tuple[float, dict[str, str | None]]] = {}
        self._overlay_lock = threading.Lock()

    # ---------------------------------------------------------------------------------- pod lookup
    def _with_overlay(self, pod: dict) -> dict:
        uid = (pod.get("metadata") or {}).get("uid") or _pod_key(pod)
        with self._overlay_lock:
            entry = self._overlay.get(uid)
            if entry is None:
                return pod
            at, patch = entry
            ann = _annotations(pod)
            if self._clock() - at > OVERLAY_TTL_S or all(ann.get(k) == v for k, v in patch.items()):
                del self._overlay[uid]  # cache caught up (or entry too old to matter)
                return pod
        pod = copy.deepcopy(pod)
        ann = pod.setdefault("metadata", {}).setdefault("annotations", {})
        for k, v in patch.items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        return pod

    def _remember(self, pod: dict, patch: dict[str, str | None]) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or _pod_key(pod)
        now = self._clock()
        with self._overlay_lock:
            old = self._overlay.get(uid, (0.0, {}))[1]
            self._overlay[uid] = (now, {**old, **patch})
            for key in [k for k, (at, _) in self._overlay.items() if now - at > OVERLAY_TTL_S]:
                del self._overlay[key]  # pods deleted before the cache caught up

    def _is_binding(self, pod: dict) -> bool:
        ann = _annotations(pod)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        return (phase == "Pending" and keys.BIND_TIME in ann
                and ann.get(keys.BIND_PHASE) in (keys.BIND_PHASE_ALLOCATING, keys.BIND_PHASE_SUCCESS)
                and ann.get(keys.VGPU_NODE) == self.settings.node_name)

    @staticmethod
    def _has_work(pod: dict) -> bool:
        try:
            containers = decode_pod_devices(_annotations(pod).get(keys.DEVICES_TO_ALLOCATE, ""))
            return any(_is_nvidia(d) for c in containers for d in c)
        except ProtocolError:
            return True  # let Allocate report the decode error

    def find_pending_pod(self, use_api: bool = True) -> dict:
        """HAMi's GetPendingPod: the node lock's owner first, then the oldest binding pod on the node.
        Cache first; the API (short timeout) only when the cache has no answer yet (informer lag)."""
        node = self.settings.node_name
        pods = [self._with_overlay(p) for p in self.pods.pods_on_node()]
        cands = [p for p in pods if self._is_binding(p) and self._has_work(p)]
        owner = self.pods.lock_owner()
        if owner:
            for p in cands:
                md = p.get("metadata") or {}
                if (md.get("namespace", "default"), md.get("name")) == owner:
                    return p
        if cands:
            def bind_time(p: dict) -> int:
                try:
                    return int(_annotations(p).get(keys.BIND_TIME, "0"))
                except ValueError:
                    return 0

            return min(cands, key=bind_time)
        if use_api:
            try:
                owner = owner or self.pods.fetch_lock_owner()
                if owner:
                    pod = self.pods.fetch_pod(*owner)
                    if pod is not None:
                        pod = self._with_overlay(pod)
                        if self._is_binding(pod) and self._has_work(pod):
                            return pod
            except PodSourceError as exc:
                raise AllocationError(f"failed to get pending pod: {exc}") from exc
        raise AllocationError(f"no binding pod found on node {node}")

    # ---------------------------------------------------------------------- GetPreferredAllocation
    def preferred(self, plan: ResourcePlan, requests: Sequence[PreferredRequest]) -> list[list[str]]:
        pod_devices: list[list[ContainerDevice]] = []
        if plan.kind != KIND_MIG:
            try:
                pod = self.find_pending_pod(use_api=True)
                decoded = decode_pod_devices(_annotations(pod).get(keys.DEVICES_TO_ALLOCATE, ""))
                pod_devices = [[d for d in c if _is_nvidia(d)] for c in decoded]
                pod_devices = [c for c in pod_devices if c]
            except (AllocationError, ProtocolError) as exc:
                # advisory call: answer with a valid subset instead of failing the pod here
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
    def allocate(self, plan: ResourcePlan, requests: Sequence[Sequence[str]]) -> list[ContainerResponse]:
        known = plan.by_id()
        for ids in requests:
            for i in ids:
                if i not in known:
                    raise AllocationError(
                        f"invalid allocation request for '{plan.resource_name}': unknown device: {i}")
        if plan.kind == KIND_MIG:
            return [ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}) for ids in requests]
        with self._lock:
            pod = self.find_pending_pod(use_api=True)
            try:
                return self._allocate_pod(plan, pod, requests)
            except (AllocationError, PodSourceError) as exc:
                self._mark_failed(pod, exc)
                if isinstance(exc, AllocationError):
                    raise
                raise AllocationError(str(exc)) from exc

    def _allocate_pod(self, plan: ResourcePlan, pod: dict,
                      requests: Sequence[Sequence[str]]) -> list[ContainerResponse]:
        md = pod.get("metadata") or {}
        ns, name = md.get("namespace", "default"), md.get("name", "")
        raw = _annotations(pod).get(keys.DEVICES_TO_ALLOCATE)
        if raw is None:
            raise AllocationError(f"failed to decode pod devices: pod {ns}/{name} has no "
                                  f"{keys.DEVICES_TO_ALLOCATE} annotation")
        try:
            containers = decode_pod_devices(raw)
        except ProtocolError as exc:
            raise AllocationError(f"failed to decode pod devices: pod {ns}/{name}: {exc}") from exc
        node_uuids = {d.physical_uuid for d in plan.devices}
        responses = []
        for ids in requests:
            idx = next((i for i, c in enumerate(containers) if any(_is_nvidia(d) for d in c)), None)
            if idx is None:
                raise AllocationError(f"device number not matched: pod {ns}/{name} has no container left in "
                                      f"{keys.DEVICES_TO_ALLOCATE}, kubelet asked for {len(ids)} device(s)")
            devreq = [d for d in containers[idx] if _is_nvidia(d)]
            containers[idx] = [d for d in containers[idx] if not _is_nvidia(d)]
            ctr = container_at(pod, idx)
            if len(devreq) != len(ids):
                raise AllocationError(
                    f"device number not matched: pod {ns}/{name} container {ctr.get('name')!r} has "
                    f"{len(devreq)} device(s) in {keys.DEVICES_TO_ALLOCATE}, kubelet asked for {len(ids)}")
            for d in devreq:
                if d.uuid not in node_uuids:
                    raise AllocationError(
                        f"pod {ns}/{name}: device {d.uuid} in {keys.DEVICES_TO_ALLOCATE} is not a "
                        f"'{plan.resource_name}' device of node {self.settings.node_name}")
            kubelet_uuids = sorted(physical_id(i) for i in ids)
            if kubelet_uuids != sorted(d.uuid for d in devreq):
                log.v(logger, 3, "kubelet chose %s for %s/%s but the scheduler annotated %s; using the "
                      "scheduler's devices", list(ids), ns, name, [d.uuid for d in devreq])
            if self.settings.mode == MODE_MPS:
                responses.append(self._mps_response(plan, devreq))
            else:
                responses.append(self._hami_core_response(pod, ctr, devreq))
        patch: dict[str, str | None] = {keys.DEVICES_TO_ALLOCATE: encode_pod_devices(containers)}
        done = not any(_is_nvidia(d) for c in containers for d in c)
        if done:
            patch[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
        self.pods.patch_pod_annotations(ns, name, patch)
        self._remember(pod, patch)
        if done:
            try:
                self.pods.release_node_lock(ns, name)
            except PodSourceError as exc:
                # the allocation itself succeeded; an unreleased lock expires after 5 minutes
                logger.error("%s (pod %s/%s allocated; lock expires on its own)", exc, ns, name)
            log.v(logger, 4, "pod %s/%s: all devices allocated, bind-phase=success", ns, name)
        return responses

    def _mark_failed(self, pod: dict, exc: Exception) -> None:
        md = pod.get("metadata") or {}
        ns, name = md.get("namespace", "default"), md.get("name", "")
        logger.error("Allocate failed for pod %s/%s: %s", ns, name, exc)
        patch: dict[str, str | None] = {keys.BIND_PHASE: keys.BIND_PHASE_FAILED}
        try:
            self.pods.patch_pod_annotations(ns, name, patch)
            self._remember(pod, patch)
        except PodSourceError as perr:
            logger.error("%s (while marking pod %s/%s failed)", perr, ns, name)
        try:
            self.pods.release_node_lock(ns, name)
        except PodSourceError as lerr:
            logger.error("%s (while releasing node lock for %s/%s)", lerr, ns, name)

    # ------------------------------------------------------------------------------ responses
    def _hami_core_response(self, pod: dict, ctr: dict, devreq: list[ContainerDevice]) -> ContainerResponse:
        s = self.settings
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
        md = pod.get("metadata") or {}
        cache_dir = os.path.join(vgpu, "containers", f"{md.get('uid', '')}_{ctr.get('name', '')}")
        for d in (cache_dir, s.vgpu_lock_dir):
            try:
                os.makedirs(d, exist_ok=True)
                os.chmod(d, 0o777)  # containers run as any uid and must write their cache/lock files
            except OSError as exc:
                raise AllocationError(f"cannot create host directory {d} for container "
                                      f"{ctr.get('name')!r}: {exc}") from exc
        mounts = [
            MountSpec(lib, host_lib, True),
            MountSpec(vgpu, cache_dir, False),
            MountSpec("/tmp/vgpulock", s.vgpu_lock_dir, False),
        ]
        if (_env_value(ctr, "CUDA_DISABLE_CONTROL") or "").lower() != "true":
            mounts.append(MountSpec("/etc/ld.so.preload", os.path.join(vgpu, "ld.so.preload"), True))
        license_path = os.path.join(vgpu, "license")
        if os.path.exists(license_path):
            mounts.append(MountSpec("/tmp/license", license_path, True))
            mounts.append(MountSpec("/usr/bin/vgpuvalidator", os.path.join(vgpu, "vgpuvalidator"), True))
        return ContainerResponse(envs, mounts)

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
