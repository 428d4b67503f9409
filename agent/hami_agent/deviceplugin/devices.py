"""From an NVML snapshot to what the kubelet sees: resources, sockets and device IDs.

Pure functions over the inventory model of ``hami_agent.nvml`` (duck-typed: any object with the
``Snapshot``/``Gpu``/``MigDevice`` attributes works, which keeps tests free of NVML).

- full GPUs -> ``<resource_name>`` (``nvidia.com/gpu``) as ``deviceSplitCount`` replicas ``<UUID>-<i>``;
- MIG, ``mixed`` strategy -> one resource per profile ``nvidia.com/mig-<profile>`` (``+`` -> ``.``) on
  socket ``nvidia-mig-<profile>.sock``, device IDs = MIG UUIDs;
- MIG, ``single`` strategy -> MIG devices advertised as ``nvidia.com/gpu`` (one profile on the node);
- MIG, ``none`` -> MIG-enabled GPUs are not advertised (their full-GPU form has no usable compute).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hami_agent.deviceplugin.settings import MODE_MIG, MODE_MPS, PluginSettings

KIND_SHARED = "shared"  # replicas of a full GPU (hami-core or MPS mode)
KIND_MIG = "mig"        # one statically partitioned MIG device per ID
MAX_DEVICE_ID_LEN = 63


class PlanError(ValueError):
    """The inventory cannot be advertised under the configured strategy (message names the fix)."""


@dataclass(frozen=True)
class PluginDevice:
    """One kubelet device ID."""

    id: str
    physical_uuid: str  # GPU UUID for replicas, MIG UUID for MIG devices
    gpu_index: int
    healthy: bool
    numa: int | None
    reason: str | None = None


@dataclass(frozen=True)
class ResourcePlan:
    """One kubelet resource served on its own socket."""

    resource_name: str
    endpoint: str  # socket file name inside the device-plugin dir
    kind: str
    devices: tuple[PluginDevice, ...]

    def by_id(self) -> dict[str, PluginDevice]:
        return {d.id: d for d in self.devices}


def endpoint_for(resource_name: str) -> str:
    """``nvidia.com/gpu`` -> ``nvidia-gpu.sock``,
    ``nvidia.com/mig-3g.48gb`` -> ``nvidia-mig-3g.48gb.sock``."""
    return f"nvidia-{resource_name.split('/', 1)[-1]}.sock"


def mig_resource_for(profile: str) -> str:
    return "nvidia.com/mig-" + profile.replace("+", ".")


def replica_id(uuid: str, i: int) -> str:
    return f"{uuid}-{i}"


def physical_id(device_id: str) -> str:
    """Physical UUID behind a kubelet device ID (HAMi's rule): upstream annotated IDs ``<uuid>::<n>``, or
    ``<GPU-uuid>-<n>`` (exactly 6 dashes and a numeric suffix). MIG UUIDs are returned unchanged."""
    if "::" in device_id:
        return device_id.split("::", 1)[0]
    head, _, tail = device_id.rpartition("-")
    if device_id.count("-") == 6 and tail.isdigit():
        return head
    return device_id


def _numa(gpu: Any) -> int | None:
    numa = getattr(gpu, "numa", None)
    return numa if isinstance(numa, int) and numa >= 0 else None


def _filtered(gpus: Iterable[Any], settings: PluginSettings, notes: list[str]) -> list[Any]:
    out = []
    for gpu in gpus:
        if gpu.uuid in settings.filter_uuids or gpu.index in settings.filter_indexes:
            notes.append(f"GPU {gpu.index} ({gpu.uuid}) is excluded by filterdevices")
            continue
        out.append(gpu)
    return out


def plan_resources(snapshot: Any, settings: PluginSettings,
                   notes: list[str] | None = None) -> dict[str, ResourcePlan]:
    """Resources to serve for ``snapshot``. The main resource is always present (possibly empty), so
    the kubelet learns the plugin exists even before NVML has answered. Why GPUs were left out is
    appended to ``notes`` (the caller logs each note once; this runs every poll tick)."""
    notes = notes if notes is not None else []
    status = getattr(snapshot, "status", "ok")
    degraded = status in ("stuck", "error")
    degraded_reason = None
    if degraded:
        degraded_reason = f"nvml {status}: " + str(getattr(snapshot, "error", None)
                                                  or getattr(snapshot, "stuck_call", None) or "no answer")
    gpus = _filtered(getattr(snapshot, "gpus", ()) or (), settings, notes)
    main: list[PluginDevice] = []
    mig_by_resource: dict[str, list[PluginDevice]] = {}
    single_profiles: set[str] = set()
    full_gpus = [g for g in gpus if not g.mig_enabled]
    mig_gpus = [g for g in gpus if g.mig_enabled]

    if settings.mode == MODE_MIG:
        # dynamic MIG: a MIG-enabled GPU is shared as replicas like a full GPU, each pod's instance is
        # created at Allocate. GPUs with MIG disabled are not served (HAMi would switch MIG on itself).
        for gpu in full_gpus:
            notes.append(f"GPU {gpu.index} ({gpu.uuid}) has MIG disabled: not served in operatingmode mig "
                         "(enable MIG with the nvidia_mig role)")
        full_gpus, mig_gpus = mig_gpus, []
    if mig_gpus and settings.mig_strategy == "single" and full_gpus:
        raise PlanError(
            "mig-strategy single needs every GPU in the same MIG mode, but GPUs "
            f"{[g.index for g in mig_gpus]} have MIG enabled and {[g.index for g in full_gpus]} do not; "
            "use --mig-strategy mixed")
    for gpu in full_gpus:
        healthy = bool(gpu.healthy) and not degraded
        reason = degraded_reason if degraded else getattr(gpu, "unhealthy_reason", None)
        for i in range(settings.device_split_count):
            main.append(PluginDevice(replica_id(gpu.uuid, i), gpu.uuid, gpu.index, healthy, _numa(gpu),
                                     None if healthy else reason))
    for gpu in mig_gpus:
        if settings.mig_strategy == "none":
            notes.append(f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but --mig-strategy=none: "
                         "not advertised")
            continue
        if settings.mode == MODE_MPS:
            notes.append(f"MPS sharing is not supported on MIG devices: GPU {gpu.index} ({gpu.uuid}) "
                         "not advertised")
            continue
        for mig in getattr(gpu, "mig_devices", ()) or ():
            healthy = bool(gpu.healthy) and not degraded
            reason = degraded_reason if degraded else getattr(gpu, "unhealthy_reason", None)
            dev = PluginDevice(mig.uuid, mig.uuid, gpu.index, healthy, _numa(gpu),
                               None if healthy else reason)
            if settings.mig_strategy == "single":
                single_profiles.add(mig.profile)
                main.append(dev)
            else:
                mig_by_resource.setdefault(mig_resource_for(mig.profile), []).append(dev)
    if len(single_profiles) > 1:
        raise PlanError("mig-strategy single: more than one MIG device type present on node "
                        f"({', '.join(sorted(single_profiles))}); use --mig-strategy mixed")
    for d in main:
        if len(d.id) > MAX_DEVICE_ID_LEN:
            raise PlanError(f"device ID {d.id!r} is longer than {MAX_DEVICE_ID_LEN} characters")
    main_kind = KIND_MIG if single_profiles else KIND_SHARED
    name = settings.resource_name
    plans = {name: ResourcePlan(name, endpoint_for(name), main_kind, tuple(main))}
    for name, devs in sorted(mig_by_resource.items()):
        plans[name] = ResourcePlan(name, endpoint_for(name), KIND_MIG, tuple(devs))
    return plans


def degrade(plan: ResourcePlan, reason: str) -> ResourcePlan:
    """Same devices, all Unhealthy (used when NVML stops answering and the snapshot has no GPUs)."""
    return ResourcePlan(plan.resource_name, plan.endpoint, plan.kind,
                        tuple(PluginDevice(d.id, d.physical_uuid, d.gpu_index, False, d.numa, reason)
                              for d in plan.devices))
