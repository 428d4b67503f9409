"""Dynamic MIG (``operatingmode: mig``): the GPU and compute instances this node's pods reserved.

HAMi v2.10's model (Project-HAMi/HAMi PR #2378, ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/
migmgr.go``, ``mig_startup.go``, ``server.go``): the scheduler reserves a profile and a placement per
container in ``hami.io/vgpu-mig-allocations``; at Allocate the plugin creates exactly that GI and a CI
over all of it, hands out the MIG device and records its UUID and GI/CI IDs in the same annotation; the
instance is destroyed when the pod is gone; after a restart the annotations and NVML's instance list are
matched again. What this module adds to that model:

* **Deadlines.** Every NVML call runs in the NVML worker (``hami_agent.nvml.mig.MigNvml``). A create at
  Allocate gets what is left of the RPC's budget minus the time the success write needs; a hung create
  fails the admission in time, and the worker is abandoned, never waited for.
* **No leaked instance, no success after an error answer.** Instances an Allocate created are destroyed
  in the background when that Allocate did not commit (``abandon``); a create whose outcome is unknown
  (it hung: the driver may still make the instance) leaves its placement *doomed*: whatever appears
  there without an owner is destroyed.
* **Never destroy a busy instance, never reset a GPU.** Nothing is destroyed while NVML lists a process
  on it (or cannot tell); whole GPUs are never reset (HAMi resets idle ones at start-up and turns MIG
  mode on by itself; here MIG mode belongs to the ``nvidia_mig`` role).
* **Orphans are reported, and destroyed only when provably unused**: not referenced by any pod of this
  node (pod cache synced), no process, and still so at the next check.
* **Bounded retries.** A failed destroy is tried again at later checks with exponential backoff (5 s
  doubling to 5 min); the check itself runs every ``interval_s`` and when Allocate asks for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hami_agent import log
from hami_agent.nvml.errors import NvmlError, NvmlTimeout
from hami_agent.nvml.mig import DiscoveredProfile, LiveInstance, MigInUse, MigNvml, MigNvmlError
from hami_agent.protocol import MigPlacement, MigProfile, ProtocolError, keys
from hami_agent.protocol.mig import MigAllocation, decode_mig_allocations

logger = logging.getLogger(__name__)

Key = tuple[str, str, int, int]  # (GPU UUID, profile, placement start, placement size): HAMi's allocation key
NVML_ERROR_INSUFFICIENT_RESOURCES = 23


class MigAllocateError(RuntimeError):
    """The instance for a reservation could not be created in time; the message names it and why."""


@dataclass
class _Retry:
    failures: int = 0
    due: float = 0.0

    def failed(self, now: float) -> None:
        self.failures += 1
        self.due = now + min(300.0, 5.0 * 2 ** (self.failures - 1))


@dataclass
class MigStatus:
    """What the last check found (logs, metrics, tests)."""

    checked_at: float = 0.0
    destroyed: int = 0
    orphans: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    skipped: str = ""


def allocation_key(a: MigAllocation) -> Key:
    return (a.gpu_uuid, a.profile, a.placement.start, a.placement.size)


def _finished(pod: dict) -> bool:
    md = pod.get("metadata") or {}
    return bool(md.get("deletionTimestamp")) or (pod.get("status") or {}).get("phase") in ("Succeeded",
                                                                                             "Failed")


def reservations(pod: dict) -> list[MigAllocation]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.MIG_ALLOCATIONS)
    return decode_mig_allocations(raw) if raw else []


class DynamicMig:
    """Thread-safe. ``pods``: the plugin's ``PodSource`` (pods of this node from the informer)."""

    def __init__(self, nvml: MigNvml, pods: Any, allowlist: Callable[[str], list[str]], *,
                 interval_s: float = 5.0, nvml_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``allowlist(model) -> profile names`` (the config's ``migProfileAllowlist`` for a GPU model)."""
        self.nvml = nvml
        self.pods = pods
        self.allowlist = allowlist
        self.interval_s = interval_s
        self.nvml_timeout_s = nvml_timeout_s
        self._clock = clock
        self._lock = threading.RLock()  # one GI/CI mutation at a time on this node (HAMi: per GPU)
        self._profiles: dict[str, tuple[MigProfile, ...]] = {}
        self._owned: dict[Key, LiveInstance] = {}  # created or adopted by this process
        self._inflight: set[Key] = set()
        self._doomed: dict[Key, str] = {}  # placements to clear: an unowned instance there is destroyed
        self._orphans_seen: dict[tuple[str, int, str | None], int] = {}
        self._retry: dict[tuple[str, int], _Retry] = {}
        self._wake = threading.Event()
        self.status = MigStatus()
        self.created = 0
        self.destroyed = 0

    # ------------------------------------------------------------------------------ discovery
    def discover(self, gpus: list[Any]) -> dict[str, str]:
        """Profiles of every MIG-enabled GPU of the inventory, limited to the allowlist (HAMi's
        ``discoverMigProfiles``). Returns ``{uuid: why}`` for GPUs left out."""
        skipped: dict[str, str] = {}
        found: dict[str, tuple[MigProfile, ...]] = {}
        for gpu in gpus:
            allowed = self.allowlist(gpu.name)
            if not allowed:
                skipped[gpu.uuid] = f"model {gpu.name!r} has no entry in nvidia.migProfileAllowlist"
                continue
            if not gpu.mig_enabled:
                skipped[gpu.uuid] = ("MIG mode is not enabled: enable it with the nvidia_mig role (the "
                                     "device plugin never changes MIG mode)")
                continue
            try:
                discovered = self.nvml.profiles(gpu.uuid, self.nvml_timeout_s)
            except NvmlError as exc:
                skipped[gpu.uuid] = f"MIG profile discovery failed: {exc}"
                continue
            by_name = {p.name: p for p in discovered}
            profiles = tuple(_profile(by_name[n]) for n in allowed if n in by_name)
            if not profiles:
                skipped[gpu.uuid] = f"none of the allowlisted profiles {allowed} exists on {gpu.name!r}"
                continue
            found[gpu.uuid] = profiles
            logger.info("discovered MIG profile capabilities: gpu %s model %s profiles %s", gpu.uuid,
                        gpu.name, [p.name for p in profiles])
        with self._lock:
            self._profiles = found
        return skipped

    def profiles(self, gpu_uuid: str) -> tuple[MigProfile, ...]:
        with self._lock:
            return self._profiles.get(gpu_uuid, ())

    def gpus(self) -> list[str]:
        with self._lock:
            return list(self._profiles)

    # ------------------------------------------------------------------------------ Allocate
    def ensure(self, a: MigAllocation, timeout_s: float, created: list[LiveInstance]) -> LiveInstance:
        """The instance for reservation ``a``, created at exactly its placement (HAMi's
        ``EnsureAllocation``: never another placement). An instance this process already holds for the
        same key is reused (a later container of the pod on the same reservation). A new one is appended
        to ``created`` so the caller can give it back if its Allocate does not commit."""
        key = allocation_key(a)
        if not self.profiles(a.gpu_uuid):
            raise MigAllocateError(f"GPU {a.gpu_uuid} is not a dynamic-MIG GPU of this node")
        if timeout_s < 0.05:
            raise MigAllocateError(f"no time left to create MIG {a.profile} on {a.gpu_uuid}")
        if not self._lock.acquire(timeout=timeout_s):
            raise MigAllocateError(f"another MIG operation on this node is still running; not creating "
                                   f"{a.profile} on {a.gpu_uuid}")
        try:
            have = self._owned.get(key)
            if have is not None:
                return have
            self._inflight.add(key)
            try:
                got = self.nvml.create(a.gpu_uuid, a.profile, a.placement.start, a.placement.size, timeout_s)
            except NvmlTimeout as exc:
                # the driver may still make the instance: clear the placement once nobody owns it
                self._doomed[key] = f"create timed out ({exc})"
                self._wake.set()
                raise MigAllocateError(f"create MIG {a.profile} at {{start:{a.placement.start} size:"
                                       f"{a.placement.size}}} on {a.gpu_uuid}: {exc}") from exc
            except MigNvmlError as exc:
                found = (self._adopt_at(key, timeout_s) if exc.code == NVML_ERROR_INSUFFICIENT_RESOURCES
                         else None)
                if found is not None:
                    return found
                raise MigAllocateError(f"create GI profile={a.profile} placement={{start:{a.placement.start} "
                                       f"size:{a.placement.size}}} on {a.gpu_uuid}: {exc}") from exc
            except NvmlError as exc:
                raise MigAllocateError(f"create MIG {a.profile} on {a.gpu_uuid}: {exc}") from exc
            finally:
                self._inflight.discard(key)
            inst = LiveInstance(a.gpu_uuid, int(got["gi"]), a.profile, a.placement.start, a.placement.size,
                                int(got["ci"]), str(got["uuid"]))
            self._owned[key] = inst
            self._doomed.pop(key, None)
            self.created += 1
            created.append(inst)
            logger.info("created scheduler-reserved MIG allocation uuid %s gpu %s profile %s start %d "
                        "size %d gpuInstanceID %d computeInstanceID %d", inst.mig_uuid, inst.gpu_uuid,
                        inst.profile, inst.start, inst.size, inst.gi_id, inst.ci_id)
            return inst
        finally:
            self._lock.release()

    def _adopt_at(self, key: Key, timeout_s: float) -> LiveInstance | None:
        """The placement is taken: if by an idle instance of exactly this profile that no active pod has
        recorded (one a crashed Allocate made for this reservation), it is this reservation's instance
        (HAMi: "repeated allocation requests converge on the same managed instance")."""
        active, why = self._active()
        if why:
            return None
        try:
            live = self.nvml.instances(key[0], timeout_s)
        except NvmlError:
            return None
        recorded = {a.mig_uuid for a in active.values() if a.has_runtime}
        for inst in live:
            if (inst.key == key and inst.mig_uuid and inst.ci_id is not None and inst.processes == 0
                    and inst.mig_uuid not in recorded):
                self._owned[key] = inst
                logger.info("adopted idle MIG instance %s at the reserved placement of %s", inst.mig_uuid,
                            key)
                return inst
        return None

    def abandon(self, instances: list[LiveInstance], why: str) -> None:
        """Instances created by an Allocate that did not commit: destroyed at the next check, whatever
        the pod's annotation says (its admission failed; no container will ever use them)."""
        if not instances:
            return
        with self._lock:
            for inst in instances:
                self._doomed[inst.key] = why
        logger.warning("MIG instances %s of a failed admission will be destroyed: %s",
                       [i.mig_uuid for i in instances], why)
        self._wake.set()

    # ------------------------------------------------------------------------------ reconcile
    def _pods_synced(self) -> bool:
        synced = getattr(self.pods, "pods_synced", None)
        return bool(synced()) if callable(synced) else True

    def _active(self) -> tuple[dict[Key, MigAllocation], str]:
        """Reservations of the pods of this node that may still run; "" or why none can be trusted."""
        if not self._pods_synced():
            return {}, "pod cache not synced: nothing is destroyed until it is"
        active: dict[Key, MigAllocation] = {}
        for pod in self.pods.pods_on_node():
            if _finished(pod):
                continue
            try:
                allocs = reservations(pod)
            except ProtocolError as exc:
                md = pod.get("metadata") or {}
                # fail closed (HAMi: a decode error skips the destructive reconciliation)
                return {}, f"pod {md.get('namespace')}/{md.get('name')}: {keys.MIG_ALLOCATIONS}: {exc}"
            for a in allocs:
                active[allocation_key(a)] = a
        return active, ""

    def reconcile(self) -> MigStatus:
        """One check: adopt what active pods reserve, destroy what nobody does (see the module doc)."""
        now = self._clock()
        st = MigStatus(checked_at=now)
        with self._lock:
            active, why = self._active()
            if why:
                st.skipped = why
                self.status = st
                log.v(logger, 3, "MIG reconciliation skipped: %s", why)
                return st
            for gpu in list(self._profiles):
                try:
                    live = self.nvml.instances(gpu, self.nvml_timeout_s)
                except NvmlError as exc:
                    st.skipped = f"cannot list MIG instances of {gpu}: {exc}"
                    logger.warning("%s", st.skipped)
                    continue
                self._reconcile_gpu(gpu, live, active, now, st)
            for key, a in active.items():
                if a.has_runtime and key not in self._owned:
                    st.missing.append(f"{a.mig_uuid} ({a.profile} at {a.placement.start} on {a.gpu_uuid})")
            if st.missing and st.missing != self.status.missing:  # once per change, not every check
                logger.error("expected MIG instance(s) missing: %s", ", ".join(st.missing))
            self.status = st
            return st

    def _reconcile_gpu(self, gpu: str, live: list[LiveInstance], active: dict[Key, MigAllocation],
                       now: float, st: MigStatus) -> None:
        live_keys = {i.key for i in live}
        for key in [k for k in self._owned if k[0] == gpu and k not in live_keys]:
            del self._owned[key]  # gone (destroyed by someone, or the GPU was reset)
        for inst in live:
            a = active.get(inst.key)
            wanted = a is not None and (not a.has_runtime or a.mig_uuid == inst.mig_uuid)
            if inst.key in self._inflight or (wanted and inst.key not in self._doomed):
                if inst.key not in self._owned:
                    log.v(logger, 2, "adopted MIG instance %s (%s at %d) on %s", inst.mig_uuid, inst.profile,
                          inst.start, gpu)
                self._owned[inst.key] = inst
                self._orphans_seen.pop((gpu, inst.gi_id, inst.mig_uuid), None)
                continue
            ident = (gpu, inst.gi_id, inst.mig_uuid)
            label = f"{inst.mig_uuid or 'GI ' + str(inst.gi_id)} ({inst.profile} at {inst.start} on {gpu})"
            if inst.processes != 0:
                st.busy.append(label)
                logger.warning("MIG instance %s is not reserved by any active pod but has running processes "
                               "(or NVML cannot tell): not destroyed", label)
                continue
            mine = inst.key in self._owned or inst.key in self._doomed
            if not mine and self._orphans_seen.get(ident, 0) < 1:
                self._orphans_seen[ident] = 1
                st.orphans.append(label)
                logger.warning("orphaned MIG instance %s: no pod of this node reserves it; destroyed at the "
                               "next check if still unused", label)
                continue
            retry = self._retry.setdefault((gpu, inst.gi_id), _Retry())
            if retry.due > now:
                continue
            try:
                self.nvml.destroy(inst, self.nvml_timeout_s)
            except MigInUse as exc:
                st.busy.append(label)
                retry.failed(now)
                logger.warning("MIG instance %s not destroyed: %s", label, exc)
                continue
            except NvmlError as exc:
                retry.failed(now)
                logger.error("destroy MIG instance %s failed (attempt %d, next in %.0fs): %s", label,
                             retry.failures, retry.due - now, exc)
                continue
            self._retry.pop((gpu, inst.gi_id), None)
            self._orphans_seen.pop(ident, None)
            self._owned.pop(inst.key, None)
            self._doomed.pop(inst.key, None)
            self.destroyed += 1
            st.destroyed += 1
            logger.info("released MIG allocation %s", label)
        for key in [k for k in self._doomed if k[0] == gpu and k not in live_keys]:
            del self._doomed[key]  # nothing there (any more): the placement is clear

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Check every ``interval_s`` (HAMi: 5 s) and whenever woken, until ``stop``."""
        while not stop.is_set():
            try:
                self.reconcile()
            except Exception:  # a bug must not stop the cleanup of instances
                logger.exception("MIG reconciliation failed")
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name="dynamic-mig", daemon=True)
        t.start()
        return t


def _profile(p: DiscoveredProfile) -> MigProfile:
    return MigProfile(name=p.name, memory_mb=p.memory_mb, core=p.core, slice_count=p.slices,
                      placements=tuple(MigPlacement(s, z) for s, z in p.placements),
                      instance_count=p.instances)
