"""NodePrepareResources / NodeUnprepareResources: from an allocated claim to CDI devices, never NVML.

Everything a prepare reads is in memory (the published devices, the prepared claims) or in the claim
informer's cache, with at most one API read per claim within the RPC's deadline budget
(``deviceplugin/budget.py``, the device plugin's rule): no NVML call, no retry, no sleep. Per claim:

1. already prepared (checkpoint) -> the same answer again; the kubelet retries prepares and calls them
   again for running pods after it restarts (kubernetes ``pkg/kubelet/cm/dra/claiminfo.go``: a claim
   read back from the kubelet's checkpoint is not "prepared");
2. the claim's ``status.allocation`` must name devices of this driver in this node's pool, and each must
   be a device this driver publishes (a tenant cannot write a claim's status: it is the scheduler's,
   through ``resourceclaims/status``);
3. consumed capacity (KEP-5075 ``consumedCapacity``; the whole device when absent) within the device's
   capacity, and, added to every claim already prepared on that device, not more than it has (an
   exclusive MIG instance: no other claim) -- defence in depth against a forged or stale allocation;
4. HAMi-core's envs and mounts per claim request, built by the device plugin's Allocate code
   (``hami_core_response``), as one CDI device per request.

Decide, then write, all or nothing: every claim of the call is decided first; then one commit writes the
claims' CDI specs and the checkpoint, through ``RpcBudget.commit`` -- started only while the RPC is
unanswered and enough of its deadline is left. A write that loses the race with the deadline's error
answer is rolled back (specs removed, checkpoint restored), so the kubelet is never told "failed" for a
claim we recorded as prepared.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hami_agent.deviceplugin.allocator import AllocationError, hami_core_response
from hami_agent.deviceplugin.budget import BudgetExhausted, LateCommit, RpcBudget
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.dra import cdi
from hami_agent.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from hami_agent.dra.claims import ClaimError, ClaimRef, ClaimSource
from hami_agent.dra.devices import DraDevice
from hami_agent.dra.settings import DraSettings
from hami_agent.protocol.devices import ContainerDevice
from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.quantity import parse_quantity

logger = logging.getLogger(__name__)

MIB = 2**20


class PrepareError(RuntimeError):
    """This claim cannot be prepared; the message says why and is what the kubelet reports."""


class PrepareBusy(RuntimeError):
    """Another prepare/unprepare still holds the lock past this RPC's budget."""


@dataclass(frozen=True)
class ClaimResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


def _results(claim: dict) -> list[dict]:
    return ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")) or []


def _ceil_mib(value: object, what: str) -> int:
    try:
        q = parse_quantity(value, what)
    except ProtocolError as exc:
        raise PrepareError(str(exc)) from None
    return math.ceil(q / MIB)


def _ceil_int(value: object, what: str) -> int:
    try:
        return math.ceil(parse_quantity(value, what))
    except ProtocolError as exc:
        raise PrepareError(str(exc)) from None


class Preparer:
    """Prepared claims of one node. Thread-safe; one prepare/unprepare at a time."""

    def __init__(self, settings: DraSettings, claims: ClaimSource,
                 devices: Callable[[], Mapping[str, DraDevice]], checkpoint: Checkpoint) -> None:
        self.settings = settings
        self.claims = claims
        self.devices = devices
        self.checkpoint = checkpoint
        self.prepared: dict[str, PreparedClaim] = checkpoint.load()
        self._lock = threading.Lock()
        # the device plugin's HAMi-core settings, so both paths build identical envs and mounts
        self.hami = PluginSettings(node_name=settings.node_name, hook_path=settings.hook_path,
                                   vgpu_lock_dir=settings.vgpu_lock_dir,
                                   device_memory_scaling=settings.device_memory_scaling,
                                   lib_cuda_log_level=settings.lib_cuda_log_level,
                                   disable_core_limit=settings.disable_core_limit,
                                   plugin_version=settings.plugin_version)

    # ------------------------------------------------------------------------------ bookkeeping
    def snapshot(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self.prepared)

    def consumed(self, exclude: str | None = None,
                 extra: Mapping[str, PreparedClaim] | None = None) -> dict[str, tuple[int, int, int]]:
        """device name -> (memory MiB, cores, claims) held by prepared claims (and ``extra``)."""
        out: dict[str, tuple[int, int, int]] = {}
        for uid, claim in [*self.prepared.items(), *(extra or {}).items()]:
            if uid == exclude:
                continue
            for d in claim.devices:
                mem, cores, n = out.get(d.device, (0, 0, 0))
                out[d.device] = (mem + d.memory_mib, cores + d.cores, n + 1)
        return out

    def _acquire(self, budget: RpcBudget) -> None:
        if not self._lock.acquire(timeout=max(0.0, budget.wait_timeout())):
            raise PrepareBusy(f"another NodePrepareResources/NodeUnprepareResources on node "
                              f"{self.settings.node_name} is still finishing; nothing written, the kubelet "
                              "retries")

    # ---------------------------------------------------------------------------------- prepare
    def prepare(self, refs: Sequence[ClaimRef], budget: RpcBudget) -> dict[str, ClaimResult]:
        self._acquire(budget)
        try:
            return self._prepare_locked(refs, budget)
        finally:
            self._lock.release()

    def _prepare_locked(self, refs: Sequence[ClaimRef], budget: RpcBudget) -> dict[str, ClaimResult]:
        results: dict[str, ClaimResult] = {}
        new: dict[str, PreparedClaim] = {}
        rewrite: dict[str, PreparedClaim] = {}  # prepared before, but its spec file is gone
        for ref in refs:
            done = self.prepared.get(ref.uid) or new.get(ref.uid)
            if done is not None:
                results[ref.uid] = ClaimResult(done.devices)
                if ref.uid in self.prepared and not _spec_exists(self.settings, ref.uid):
                    rewrite[ref.uid] = done
                continue
            try:
                claim = self.claims.claim(ref, budget)
                new[ref.uid] = self._plan(ref, claim, new)
            except (PrepareError, ClaimError, AllocationError) as exc:
                logger.error("NodePrepareResources: claim %s (%s): %s", ref, ref.uid, exc)
                results[ref.uid] = ClaimResult(error=f"claim {ref}: {exc}")
        if not new and not rewrite:
            return results
        to_write = {**rewrite, **new}

        def write(_timeout_s: float) -> None:
            for uid, pc in to_write.items():
                cdi.write_spec(self.settings.cdi_dir, self.settings.driver_name, uid, list(pc.cdi))
            self.checkpoint.store({**self.prepared, **new})

        try:
            budget.commit(write, None)
        except BudgetExhausted as exc:  # not started: nothing written
            for uid, pc in new.items():
                results[uid] = ClaimResult(error=f"claim {_ref_of(pc)}: {exc}")
            return results
        except BaseException as exc:
            self._roll_back(new)
            if isinstance(exc, LateCommit):
                raise
            for uid, pc in new.items():
                results[uid] = ClaimResult(error=f"claim {_ref_of(pc)}: writing its CDI spec or the "
                                                 f"checkpoint failed: {exc}")
            logger.error("NodePrepareResources: writing CDI specs/checkpoint failed: %s", exc)
            return results
        self.prepared.update(new)
        for uid, pc in new.items():
            results[uid] = ClaimResult(pc.devices)
            logger.info("prepared claim %s/%s (%s): %s", pc.namespace, pc.name, uid,
                        ", ".join(f"{d.device} {d.memory_mib}MiB {d.cores}%" for d in pc.devices))
        return results

    def _roll_back(self, new: Mapping[str, PreparedClaim]) -> None:
        """A commit that failed or lost the race with the deadline: as if it never happened."""
        for uid in new:
            cdi.remove_spec(self.settings.cdi_dir, self.settings.driver_name, uid)
        try:
            self.checkpoint.store(self.prepared)
        except OSError as exc:  # the old checkpoint may still be in place; log and carry on
            logger.error("restoring the DRA checkpoint after a failed prepare: %s", exc)

    def _plan(self, ref: ClaimRef, claim: dict, pending: Mapping[str, PreparedClaim]) -> PreparedClaim:
        s = self.settings
        mine = [r for r in _results(claim) if r.get("driver") == s.driver_name]
        if not (claim.get("status") or {}).get("allocation"):
            raise PrepareError("is not allocated (status.allocation is empty)")
        if not mine:
            raise PrepareError(f"its allocation has no device of driver {s.driver_name}")
        foreign = sorted({r.get("pool") for r in mine if r.get("pool") != s.node_name})
        if foreign:
            raise PrepareError(f"its {s.driver_name} devices are in pool(s) {foreign}, not in this node's "
                               f"pool {s.node_name!r}: the claim is allocated to another node")
        published = self.devices()
        held = self.consumed(exclude=ref.uid, extra=pending)
        prepared: list[PreparedDevice] = []
        by_request: dict[str, list[tuple[dict, DraDevice, int, int]]] = {}
        seen: dict[str, tuple[int, int]] = {}
        for r in mine:
            name = str(r.get("device") or "")
            dev = published.get(name)
            if dev is None:
                raise PrepareError(f"device {name} is not published by node {s.node_name} (anymore); "
                                   "the claim must be allocated again")
            mem, cores = self._consumed(r, dev)
            used_mem, used_cores, holders = held.get(name, (0, 0, 0))
            also_mem, also_cores = seen.get(name, (0, 0))
            if not dev.shared and (holders or name in seen):
                raise PrepareError(f"refusing to over-commit {dev.kind} device {name} ({dev.uuid}): it is "
                                   "exclusive and already prepared for another claim")
            if (used_mem + also_mem + mem > dev.memory_mib or used_cores + also_cores + cores > dev.cores) \
                    and dev.shared:
                raise PrepareError(
                    f"refusing to over-commit GPU {name} ({dev.uuid}): {mem}MiB/{cores}% requested, "
                    f"{used_mem + also_mem}MiB/{used_cores + also_cores}% already prepared for other claims, "
                    f"capacity {dev.memory_mib}MiB/{dev.cores}%")
            seen[name] = (also_mem + mem, also_cores + cores)
            by_request.setdefault(str(r.get("request") or ""), []).append((r, dev, mem, cores))
        cdi_devices: list[cdi.CdiDevice] = []
        for request, items in by_request.items():
            cdev = self._cdi_device(ref, request, items)
            cdi_devices.append(cdev)
            ident = cdi.device_id(s.driver_name, cdev.name)
            for i, (r, dev, mem, cores) in enumerate(items):
                # one CDI ID per request (on its first device): a container that uses the request must get
                # the request's edits once; more IDs would repeat the same mounts
                prepared.append(PreparedDevice(request=request, pool=s.node_name, device=dev.name,
                                               uuid=dev.uuid, memory_mib=mem, cores=cores,
                                               share_id=r.get("shareID"),
                                               cdi_ids=(ident,) if i == 0 else ()))
        return PreparedClaim(ref.uid, ref.namespace, ref.name, tuple(prepared), tuple(cdi_devices))

    @staticmethod
    def _consumed(result: dict, dev: DraDevice) -> tuple[int, int]:
        """(memory MiB, cores %) this allocation consumes of ``dev``."""
        if not dev.shared:
            return dev.memory_mib, 0
        used = result.get("consumedCapacity") or {}
        mem = _ceil_mib(used["memory"], "consumedCapacity.memory") if "memory" in used else dev.memory_mib
        cores = _ceil_int(used["cores"], "consumedCapacity.cores") if "cores" in used else dev.cores
        if not 1 <= mem <= dev.memory_mib:
            raise PrepareError(f"consumed memory {used.get('memory')} of device {dev.name} is outside "
                               f"1Mi..{dev.memory_mib}Mi")
        if not 1 <= cores <= dev.cores:
            raise PrepareError(f"consumed cores {used.get('cores')} of device {dev.name} are outside "
                               f"1..{dev.cores}")
        return mem, cores

    def _cdi_device(self, ref: ClaimRef, request: str,
                    items: list[tuple[dict, DraDevice, int, int]]) -> cdi.CdiDevice:
        name = cdi.device_name(ref.uid, request)
        kinds = {dev.kind for _r, dev, _m, _c in items}
        if kinds == {"mig"}:
            uuids = ",".join(d.uuid for _r, d, _m, _c in items)
            return cdi.CdiDevice(name, {"NVIDIA_VISIBLE_DEVICES": uuids}, ())
        if len(kinds) > 1:
            raise PrepareError(f"request {request!r} mixes MIG instances and full GPUs; HAMi-core limits "
                               "cannot describe both for one container")
        devreq = [ContainerDevice(dev.uuid, dev.product, mem, cores) for _r, dev, mem, cores in items]
        # HAMi-core cache dir <claimUID>_<request>: the monitor reads such dirs as <podUID>_<container>, so a
        # claim's shared region shows under the claim's UID (docs/dra.md)
        cache_dir = f"{ref.uid}_{name[len(ref.uid) + 1:]}"
        resp = hami_core_response(self.hami, devreq, cache_dir, who=f"claim {ref} request {request!r}")
        mounts = tuple((m.container_path, m.host_path, m.read_only) for m in resp.mounts)
        return cdi.CdiDevice(name, dict(resp.envs), mounts)

    # -------------------------------------------------------------------------------- unprepare
    def unprepare(self, refs: Sequence[ClaimRef], budget: RpcBudget) -> dict[str, str]:
        """uid -> error ("" = unprepared). Unknown claims are fine: unprepare is idempotent."""
        self._acquire(budget)
        try:
            gone = {r.uid: self.prepared[r.uid] for r in refs if r.uid in self.prepared}
            remaining = {uid: c for uid, c in self.prepared.items() if uid not in gone}

            def write(_timeout_s: float) -> None:
                self.checkpoint.store(remaining)
                for r in refs:  # also for claims we do not know: a spec may survive a lost checkpoint
                    cdi.remove_spec(self.settings.cdi_dir, self.settings.driver_name, r.uid)

            try:
                budget.commit(write, None)
            except BudgetExhausted as exc:
                return {r.uid: str(exc) for r in refs}
            except LateCommit:
                # removed on disk after the kubelet was told "failed": it will call again, and a second
                # unprepare of a claim we no longer hold is a success; keep memory consistent with disk
                self.prepared = remaining
                raise
            except OSError as exc:
                logger.error("NodeUnprepareResources: %s", exc)
                return {r.uid: f"claim {r}: removing its CDI spec or updating the checkpoint failed: {exc}"
                        for r in refs}
            self.prepared = remaining
            for uid, c in gone.items():
                logger.info("unprepared claim %s/%s (%s)", c.namespace, c.name, uid)
            return {r.uid: "" for r in refs}
        finally:
            self._lock.release()

    def forget(self, uids: Sequence[str]) -> None:
        """Drop claims that no longer exist in the API (``driver`` checks that first): their specs and
        checkpoint entries, so the capacity they held is free again."""
        with self._lock:
            remaining = {uid: c for uid, c in self.prepared.items() if uid not in uids}
            if len(remaining) == len(self.prepared):
                return
            self.checkpoint.store(remaining)
            for uid in uids:
                cdi.remove_spec(self.settings.cdi_dir, self.settings.driver_name, uid)
            self.prepared = remaining


def _spec_exists(settings: DraSettings, uid: str) -> bool:
    return os.path.exists(cdi.spec_path(settings.cdi_dir, settings.driver_name, uid))


def _ref_of(pc: PreparedClaim) -> str:
    return f"{pc.namespace}/{pc.name}"


__all__ = ["ClaimResult", "PrepareBusy", "PrepareError", "Preparer"]
