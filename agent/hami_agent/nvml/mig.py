"""Dynamic MIG through NVML: profile discovery, GPU/compute instance create, list and destroy.

Two halves, one file so the wire format stays in one place:

* ``MigOps`` runs **inside the NVML worker** (``worker.serve`` ops ``mig_profiles``, ``mig_instances``,
  ``mig_create``, ``mig_destroy``); every NVML call is announced, so the parent enforces its deadline.
  The calls are HAMi's (Project-HAMi/HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/migmgr.go``
  ``EnsureAllocation``/``destroyMigInstance``, ``register.go`` ``discoverMigProfiles``), with two
  differences: a profile is looked up by its exact name (HAMi maps ``1g.20gb`` to the 1-slice profile of
  ``1g.10gb``), and an instance is never destroyed while a process runs on it.
* ``MigNvml`` is the parent's client: one long-lived ``NvmlClient`` worker, every request with a deadline;
  a request past it raises ``NvmlTimeout`` (the worker is killed and abandoned, never waited for).
  NVML refusals come back as ``MigNvmlError`` with the NVML return code.

MIG mode itself is never changed here: enabling it can need a GPU reset, which belongs to the
``nvidia_mig`` role (it drains first); HAMi's plugin turns it on by itself.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from hami_agent.nvml.errors import NvmlError

# NVML's GPU-instance profile indices (NVML_GPU_INSTANCE_PROFILE_*: nvml.h; the same in pynvml).
GI_PROFILE_INDICES = range(0x12)
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23


class MigNvmlError(NvmlError):
    """NVML refused a MIG operation (the call answered: the worker is fine). ``code``: NVML return code."""


class MigInUse(MigNvmlError):
    """The instance has processes on it: not destroyed."""


@dataclass(frozen=True)
class LiveInstance:
    """A GPU instance as NVML lists it, with its compute instance / MIG device when it has one."""

    gpu_uuid: str
    gi_id: int
    profile: str
    start: int
    size: int
    ci_id: int | None = None
    mig_uuid: str | None = None
    processes: int = 0

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.gpu_uuid, self.profile, self.start, self.size)


# --------------------------------------------------------------------------------------- worker side
class MigOps:
    """The worker's MIG requests. ``nv``: the worker's announcing ``Nvml`` wrapper."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.p = nv.pynvml

    # ---------------------------------------------------------------------------------- helpers
    def _handle(self, gpu_uuid: str) -> Any:
        return self.nv.call("nvmlDeviceGetHandleByUUID", self.p.nvmlDeviceGetHandleByUUID, gpu_uuid)

    def _profile_infos(self, h: Any) -> list[tuple[int, Any, str]]:
        """(profile index, info, name) of every GI profile the GPU supports."""
        p, nv = self.p, self.nv
        out = []
        for index in GI_PROFILE_INDICES:
            try:
                info = nv.call("nvmlDeviceGetGpuInstanceProfileInfoV",
                               p.nvmlDeviceGetGpuInstanceProfileInfo, h, index)
                name = _text(info.name)
                name = name[4:] if name.startswith("MIG ") else name
            except p.NVMLError_NotSupported:
                continue
            except p.NVMLError_InvalidArgument:
                break  # past the driver's last profile index
            out.append((index, info, name))
        return out

    def _placements(self, h: Any, profile_id: int) -> list[tuple[int, int]]:
        p, nv = self.p, self.nv
        count = ctypes.c_uint(0)
        nv.call("nvmlDeviceGetGpuInstancePossiblePlacements_v2", p.nvmlDeviceGetGpuInstancePossiblePlacements,
                h, profile_id, None, ctypes.byref(count))
        arr = (p.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        nv.call("nvmlDeviceGetGpuInstancePossiblePlacements_v2", p.nvmlDeviceGetGpuInstancePossiblePlacements,
                h, profile_id, arr, ctypes.byref(count))
        return [(arr[i].start, arr[i].size) for i in range(count.value)]

    def _mig_devices(self, h: Any) -> list[dict[str, Any]]:
        """MIG devices (uuid, GI/CI IDs, process count) of a GPU."""
        p, nv = self.p, self.nv
        out = []
        n = nv.call("nvmlDeviceGetMaxMigDeviceCount", p.nvmlDeviceGetMaxMigDeviceCount, h)
        for i in range(n):
            try:
                m = nv.call("nvmlDeviceGetMigDeviceHandleByIndex", p.nvmlDeviceGetMigDeviceHandleByIndex,
                            h, i)
            except (p.NVMLError_NotFound, p.NVMLError_InvalidArgument):
                continue
            try:
                procs = nv.call("nvmlDeviceGetComputeRunningProcesses_v3",
                                p.nvmlDeviceGetComputeRunningProcesses, m)
                busy = len(procs)
            except p.NVMLError:
                busy = -1  # unknown: treated as busy, never destroyed (HAMi's deviceHasProcesses)
            out.append({"uuid": _text(nv.call("nvmlDeviceGetUUID", p.nvmlDeviceGetUUID, m)),
                        "gi": nv.call("nvmlDeviceGetGpuInstanceId", p.nvmlDeviceGetGpuInstanceId, m),
                        "ci": nv.call("nvmlDeviceGetComputeInstanceId", p.nvmlDeviceGetComputeInstanceId, m),
                        "processes": busy})
        return out

    # --------------------------------------------------------------------------------------- ops
    def profiles(self, gpu_uuid: str) -> dict[str, Any]:
        """Every GI profile of the GPU with its placements (the parent applies the allowlist). ``core``
        is HAMi's: the profile's SMs x 100 / the largest profile's SMs, rounded up."""
        h = self._handle(gpu_uuid)
        infos = self._profile_infos(h)
        full = max((info.multiprocessorCount for _i, info, _n in infos), default=0)
        out = []
        for _index, info, name in infos:
            out.append({"name": name, "id": info.id, "memory_mb": int(info.memorySizeMB),
                        "slices": info.sliceCount, "instances": info.instanceCount,
                        "core": math.ceil(info.multiprocessorCount * 100 / full) if full else 0,
                        "placements": self._placements(h, info.id)})
        return {"profiles": out}

    def instances(self, gpu_uuid: str) -> dict[str, Any]:
        """GPU instances with their placement, and the MIG device (CI) of each, with its process count."""
        p, nv = self.p, self.nv
        h = self._handle(gpu_uuid)
        devices = {d["gi"]: d for d in self._mig_devices(h)}
        out = []
        for _index, info, name in self._profile_infos(h):
            arr = (p.c_nvmlGpuInstance_t * max(info.instanceCount, 1))()
            count = ctypes.c_uint(0)
            nv.call("nvmlDeviceGetGpuInstances", p.nvmlDeviceGetGpuInstances, h, info.id, arr,
                    ctypes.byref(count))
            for i in range(count.value):
                gi = nv.call("nvmlGpuInstanceGetInfo", p.nvmlGpuInstanceGetInfo, arr[i])
                dev = devices.get(gi.id) or {}
                out.append({"gi": gi.id, "profile": name, "start": gi.placement.start,
                            "size": gi.placement.size, "ci": dev.get("ci"), "uuid": dev.get("uuid"),
                            "processes": dev.get("processes", 0)})
        return {"instances": out}

    def create(self, gpu_uuid: str, profile: str, start: int, size: int) -> dict[str, Any]:
        """HAMi's ``EnsureAllocation`` minus the mode change: GI at exactly this placement, one CI over
        all of it, the MIG UUID. A GI whose CI cannot be made is destroyed again."""
        p, nv = self.p, self.nv
        h = self._handle(gpu_uuid)
        match = [(i, info) for i, info, name in self._profile_infos(h) if name == profile]
        if not match:
            raise MigNvmlError(f"GPU {gpu_uuid} has no MIG profile {profile!r}", call="mig_create")
        _index, info = match[0]
        if (start, size) not in self._placements(h, info.id):
            raise MigNvmlError(f"scheduler selected invalid placement {{start:{start} size:{size}}} for "
                               f"profile {profile}", call="mig_create")
        placement = p.c_nvmlGpuInstancePlacement_t(start, size)
        gi = nv.call("nvmlDeviceCreateGpuInstanceWithPlacement", p.nvmlDeviceCreateGpuInstanceWithPlacement,
                     h, info.id, ctypes.byref(placement))
        try:
            gi_id = nv.call("nvmlGpuInstanceGetInfo", p.nvmlGpuInstanceGetInfo, gi).id
            ci_info = nv.call("nvmlGpuInstanceGetComputeInstanceProfileInfoV",
                              p.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi,
                              _ci_profile_index(info.sliceCount),
                              p.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            ci = nv.call("nvmlGpuInstanceCreateComputeInstance", p.nvmlGpuInstanceCreateComputeInstance, gi,
                         ci_info.id)
        except p.NVMLError:
            nv.call("nvmlGpuInstanceDestroy", p.nvmlGpuInstanceDestroy, gi)
            raise
        ci_id = nv.call("nvmlComputeInstanceGetInfo_v2", p.nvmlComputeInstanceGetInfo, ci).id
        uuid = next((d["uuid"] for d in self._mig_devices(h) if d["gi"] == gi_id), None)
        if uuid is None:
            raise MigNvmlError(f"no MIG device found for GI {gi_id}", call="mig_create")
        return {"gi": gi_id, "ci": ci_id, "uuid": uuid}

    def destroy(self, gpu_uuid: str, gi_id: int, ci_id: int | None,
                expect_uuid: str | None) -> dict[str, Any]:
        """Destroy the CI and GI. Already gone: ``{"gone": true}``. Refused (``MigInUse``) while a process
        runs on the MIG device, or when the GI now carries another MIG device than ``expect_uuid`` (the ID
        was reused by a newer instance)."""
        p, nv = self.p, self.nv
        h = self._handle(gpu_uuid)
        dev = next((d for d in self._mig_devices(h) if d["gi"] == gi_id), None)
        if dev is not None:
            if expect_uuid and dev["uuid"] != expect_uuid:
                raise MigInUse(f"GI {gi_id} on {gpu_uuid} now holds {dev['uuid']}, not {expect_uuid}: not "
                               "destroyed", call="mig_destroy", code=NVML_ERROR_IN_USE)
            if dev["processes"] != 0:
                raise MigInUse(f"MIG device {dev['uuid']} has running processes: not destroyed",
                               call="mig_destroy", code=NVML_ERROR_IN_USE)
        try:
            gi = nv.call("nvmlDeviceGetGpuInstanceById", p.nvmlDeviceGetGpuInstanceById, h, gi_id)
        except p.NVMLError_NotFound:
            return {"gone": True}
        if dev is not None:
            ci = nv.call("nvmlGpuInstanceGetComputeInstanceById", p.nvmlGpuInstanceGetComputeInstanceById,
                         gi, dev["ci"] if ci_id is None else ci_id)
            nv.call("nvmlComputeInstanceDestroy", p.nvmlComputeInstanceDestroy, ci)
        nv.call("nvmlGpuInstanceDestroy", p.nvmlGpuInstanceDestroy, gi)
        return {"gone": False}

    def run(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """One request; NVML refusals are answers (``error`` + ``code``), not worker failures."""
        p = self.p
        try:
            if op == "mig_profiles":
                return self.profiles(str(args["gpu"]))
            if op == "mig_instances":
                return self.instances(str(args["gpu"]))
            if op == "mig_create":
                return self.create(str(args["gpu"]), str(args["profile"]), int(args["start"]),
                                   int(args["size"]))
            if op == "mig_destroy":
                return self.destroy(str(args["gpu"]), int(args["gi"]),
                                    None if args.get("ci") is None else int(args["ci"]), args.get("uuid"))
        except MigNvmlError as exc:
            return {"error": str(exc), "code": exc.code}
        except p.NVMLError as exc:
            return {"error": _err(exc), "code": getattr(exc, "value", None)}
        except (KeyError, TypeError, ValueError) as exc:
            return {"error": f"bad {op} request: {exc}", "code": None}
        return {"error": f"unknown op {op!r}", "code": None}


def _ci_profile_index(gi_slices: int) -> int:
    """NVML_COMPUTE_INSTANCE_PROFILE_* of the CI spanning a GI of ``gi_slices`` (HAMi's
    ``profileNameToCIProfileID``)."""
    return {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}[gi_slices]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _err(exc: Exception) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml's __str__ calls NVML itself
        return repr(exc)


MIG_OPS = ("mig_profiles", "mig_instances", "mig_create", "mig_destroy")


# --------------------------------------------------------------------------------------- parent side
@dataclass(frozen=True)
class DiscoveredProfile:
    name: str
    id: int
    memory_mb: int
    slices: int
    instances: int
    core: int
    placements: tuple[tuple[int, int], ...]


class MigNvml:
    """The device plugin's MIG calls, each in the long-lived NVML worker under a deadline."""

    def __init__(self, client: Any) -> None:
        """``client``: an ``NvmlClient`` (its own worker: a hung create never touches the inventory)."""
        self.client = client

    def _call(self, op: str, timeout_s: float, **args: Any) -> dict[str, Any]:
        data = self.client.request(op, timeout_s, args=args)
        if "error" in data:
            code = data.get("code")
            cls = MigInUse if code == NVML_ERROR_IN_USE else MigNvmlError
            raise cls(str(data["error"]), call=op, code=code)
        return data

    def profiles(self, gpu_uuid: str, timeout_s: float) -> list[DiscoveredProfile]:
        data = self._call("mig_profiles", timeout_s, gpu=gpu_uuid)
        return [DiscoveredProfile(p["name"], int(p["id"]), int(p["memory_mb"]), int(p["slices"]),
                                  int(p["instances"]), int(p["core"]),
                                  tuple((int(a), int(b)) for a, b in p["placements"]))
                for p in data["profiles"]]

    def instances(self, gpu_uuid: str, timeout_s: float) -> list[LiveInstance]:
        data = self._call("mig_instances", timeout_s, gpu=gpu_uuid)
        return [LiveInstance(gpu_uuid, int(i["gi"]), str(i["profile"]), int(i["start"]), int(i["size"]),
                             None if i.get("ci") is None else int(i["ci"]), i.get("uuid"),
                             int(i.get("processes") or 0))
                for i in data["instances"]]

    def create(self, gpu_uuid: str, profile: str, start: int, size: int, timeout_s: float) -> dict[str, Any]:
        return self._call("mig_create", timeout_s, gpu=gpu_uuid, profile=profile, start=start, size=size)

    def destroy(self, inst: LiveInstance, timeout_s: float) -> bool:
        """True when destroyed now, False when it was already gone."""
        data = self._call("mig_destroy", timeout_s, gpu=inst.gpu_uuid, gi=inst.gi_id, ci=inst.ci_id,
                          uuid=inst.mig_uuid)
        return not data.get("gone")
