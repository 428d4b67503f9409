"""From an NVML snapshot to the devices the DRA driver publishes (and prepares).

Pure functions over the inventory model of ``hami_agent.nvml`` (duck-typed, as in
``deviceplugin/devices.py``), so the kubelet path and the tests need no NVML:

* a full GPU (MIG disabled) is one device ``gpu-<index>`` that many claims may share
  (``allowMultipleAllocations``, KEP-5075 consumable capacity): capacity ``memory`` (MiB steps; scaled by
  ``deviceMemoryScaling`` like the register annotation) and ``cores`` (percent, 1-100), each with a request
  policy whose default is the whole capacity, so a claim that asks for nothing gets the GPU to itself;
* a statically partitioned MIG instance is its own exclusive device ``gpu-<index>-mig-<gi>-<ci>`` (the
  parent GPU is then not published: its full-GPU form has no usable compute);
* attributes: ``type`` (gpu/mig), ``uuid``, ``index``, ``productName``, ``architecture``,
  ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``, ``numaNode``, ``profile`` and
  ``parentUUID`` (MIG), the standard ``resource.kubernetes.io/pciBusID`` and
  ``resource.kubernetes.io/pcieRoot`` (kubernetes ``staging/src/k8s.io/dynamic-resource-allocation/
  deviceattribute``).

``architecture`` and ``cudaComputeCapability`` come from the product name (``ARCHITECTURES``): the NVML
worker does not ask ``nvmlDeviceGetArchitecture``/``nvmlDeviceGetCudaComputeCapability``; an unknown
product has neither attribute rather than a guessed one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hami_agent.config import DraPartition

KIND_GPU = "gpu"
KIND_MIG = "mig"
CORES = 100  # HAMi's devcore of a whole GPU (percent)
TAINT_UNHEALTHY = "unhealthy"  # key "<driver>/unhealthy", value: the reason
TAINT_PAUSED = "reconfiguring"  # key "<driver>/reconfiguring": MIG apply lock held

# product-name substring -> (architecture, CUDA compute capability); NVIDIA's published table
# ("CUDA GPUs - Compute Capability", developer.nvidia.com). Longest match wins.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "V100": ("Volta", "7.0"), "T4": ("Turing", "7.5"),
    "A100": ("Ampere", "8.0"), "A800": ("Ampere", "8.0"), "A30": ("Ampere", "8.0"),
    "A10": ("Ampere", "8.6"), "A16": ("Ampere", "8.6"), "A40": ("Ampere", "8.6"), "A2": ("Ampere", "8.6"),
    "L4": ("Ada Lovelace", "8.9"), "L20": ("Ada Lovelace", "8.9"), "L40": ("Ada Lovelace", "8.9"),
    "H100": ("Hopper", "9.0"), "H800": ("Hopper", "9.0"), "H200": ("Hopper", "9.0"), "H20": ("Hopper", "9.0"),
    "GH200": ("Hopper", "9.0"),
    "B200": ("Blackwell", "10.0"), "B100": ("Blackwell", "10.0"), "GB200": ("Blackwell", "10.0"),
    "B300": ("Blackwell", "10.3"), "GB300": ("Blackwell", "10.3"),
}


@dataclass(frozen=True)
class DraDevice:
    """One published device (everything prepare needs comes from here, never from NVML)."""

    name: str
    kind: str
    uuid: str  # GPU UUID, or MIG UUID
    gpu_index: int
    parent_uuid: str
    product: str  # HAMi device type, e.g. "NVIDIA H20" (the register annotation's type)
    memory_mib: int  # published capacity (scaled for shared GPUs)
    cores: int  # published capacity (0 for MIG: not a consumable)
    healthy: bool = True
    reason: str | None = None
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False, hash=False)

    @property
    def shared(self) -> bool:
        return self.kind == KIND_GPU


def semver_of(version: str | None) -> str | None:
    """A driver version as semver: ``570.172.08`` -> ``570.172.8``, ``550.54`` -> ``550.54.0``."""
    if not version:
        return None
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts)


def cuda_version(cuda_driver_version: int | None) -> str | None:
    """NVML's ``12080`` -> ``12.8.0``."""
    if not isinstance(cuda_driver_version, int) or cuda_driver_version <= 0:
        return None
    return f"{cuda_driver_version // 1000}.{cuda_driver_version % 1000 // 10}.0"


def architecture(product: str) -> tuple[str, str] | None:
    words = re.split(r"[\s\-_]+", product.upper())
    best: tuple[str, str] | None = None
    best_len = 0
    for key, value in ARCHITECTURES.items():
        if any(w == key or (w.startswith(key) and not w[len(key):len(key) + 1].isdigit()) for w in words):
            if len(key) > best_len:
                best, best_len = value, len(key)
    return best


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's ``00000000:0F:00.0`` -> sysfs ``0000:0f:00.0``."""
    domain, _, rest = pci_bus_id.partition(":")
    return f"{int(domain or '0', 16):04x}:{rest.lower()}"


def pcie_root(pci_bus_id: str, sysfs_root: str | None = None) -> str | None:
    """``pci<domain>:<bus>`` of the root complex, resolved through ``/sys/bus/pci/devices/<bdf>`` as the
    upstream helper does (``deviceattribute/pci_linux.go``); None where sysfs does not know the device."""
    root = sysfs_root or os.environ.get("HAMI_SYSFS_ROOT", "/sys")
    try:
        target = os.path.realpath(os.path.join(root, "bus", "pci", "devices", sysfs_bus_id(pci_bus_id)))
    except (OSError, ValueError):
        return None
    devices = os.path.join(os.path.realpath(root), "devices") + os.sep
    if not target.startswith(devices):
        return None
    first = target[len(devices):].split(os.sep, 1)[0]
    return first if first.startswith("pci") else None


def _attr(value: Any, kind: str) -> dict[str, Any]:
    return {kind: value}


def _common_attributes(gpu: Any, snapshot: Any, kind: str) -> dict[str, dict[str, Any]]:
    product = getattr(gpu, "name", "") or getattr(gpu, "type", "")
    attrs = {"type": _attr(kind, "string"), "productName": _attr(product[:64], "string"),
             "index": _attr(int(gpu.index), "int")}
    arch = architecture(product)
    if arch is not None:
        attrs["architecture"] = _attr(arch[0], "string")
        attrs["cudaComputeCapability"] = _attr(semver_of(arch[1]), "version")
    drv = semver_of(getattr(snapshot, "driver_version", None))
    if drv:
        attrs["driverVersion"] = _attr(drv, "version")
    cuda = cuda_version(getattr(snapshot, "cuda_driver_version", None))
    if cuda:
        attrs["cudaDriverVersion"] = _attr(cuda, "version")
    numa = getattr(gpu, "numa", None)
    if isinstance(numa, int) and numa >= 0:
        attrs["numaNode"] = _attr(numa, "int")
    bus = getattr(gpu, "pci_bus_id", "")
    if bus:
        attrs["resource.kubernetes.io/pciBusID"] = _attr(sysfs_bus_id(bus), "string")
        root = pcie_root(bus)
        if root:
            attrs["resource.kubernetes.io/pcieRoot"] = _attr(root, "string")
    return attrs


def build_devices(snapshot: Any, partition: DraPartition, *, memory_scaling: float = 1.0,
                  pre_configured_memory_mib: int = 0, notes: list[str] | None = None) -> list[DraDevice]:
    """The devices of ``snapshot`` that ``partition`` gives to the DRA driver, with NVML's health.
    Why a GPU was left out is appended to ``notes``."""
    notes = notes if notes is not None else []
    status = getattr(snapshot, "status", "ok")
    degraded = status in ("stuck", "error")
    why = (f"nvml-{status}" if degraded else None)
    out: list[DraDevice] = []
    for gpu in getattr(snapshot, "gpus", ()) or ():
        if not partition.manages(gpu.uuid, gpu.index):
            continue
        healthy = bool(getattr(gpu, "healthy", True)) and not degraded
        reason = why if degraded else None
        if not healthy and not degraded:
            reason = getattr(gpu, "unhealthy_reason", None) or "unhealthy"
        product = getattr(gpu, "type", "") or getattr(gpu, "name", "")
        if getattr(gpu, "mig_enabled", False):
            for mig in getattr(gpu, "mig_devices", ()) or ():
                attrs = _common_attributes(gpu, snapshot, KIND_MIG)
                attrs.update(uuid=_attr(mig.uuid, "string"), parentUUID=_attr(gpu.uuid, "string"),
                             profile=_attr(mig.profile, "string"))
                out.append(DraDevice(f"gpu-{gpu.index}-mig-{mig.gi_id}-{mig.ci_id}", KIND_MIG, mig.uuid,
                                     gpu.index, gpu.uuid, product, int(mig.memory_mib), 0, healthy, reason,
                                     attrs))
            if not getattr(gpu, "mig_devices", ()):
                notes.append(f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but no MIG instance: nothing to "
                             "publish")
            continue
        mem = getattr(gpu, "memory_mib", None)
        if mem is None:
            if pre_configured_memory_mib <= 0:
                notes.append(f"GPU {gpu.index} ({gpu.uuid}): NVML cannot report its memory (unified memory); "
                             "set preConfiguredDeviceMemory in the device config to publish it")
                continue
            mem = pre_configured_memory_mib
        attrs = _common_attributes(gpu, snapshot, KIND_GPU)
        attrs["uuid"] = _attr(gpu.uuid, "string")
        out.append(DraDevice(f"gpu-{gpu.index}", KIND_GPU, gpu.uuid, gpu.index, gpu.uuid, product,
                             int(mem * memory_scaling), CORES, healthy, reason, attrs))
    return out


def degrade(devices: Iterable[DraDevice], reason: str) -> list[DraDevice]:
    """Same devices, all unhealthy (NVML stopped answering and the snapshot has no GPUs)."""
    from dataclasses import replace

    return [replace(d, healthy=False, reason=reason) for d in devices]


def taint_value(reason: str | None) -> str:
    """A label value (at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both ends) naming the reason."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason or "unhealthy")[:63].strip("-_.")
    return text or "unhealthy"


def slice_device(dev: DraDevice, driver: str, unhealthy_effect: str = "NoSchedule",
                 paused: bool = False) -> dict[str, Any]:
    """The ResourceSlice ``spec.devices[]`` entry of ``dev`` (resource.k8s.io/v1)."""
    out: dict[str, Any] = {"name": dev.name, "attributes": dict(dev.attributes)}
    mem = f"{dev.memory_mib}Mi"
    if dev.shared:
        out["allowMultipleAllocations"] = True
        out["capacity"] = {
            "memory": {"value": mem, "requestPolicy": {
                "default": mem, "validRange": {"min": "1Mi", "max": mem, "step": "1Mi"}}},
            "cores": {"value": str(dev.cores), "requestPolicy": {
                "default": str(dev.cores), "validRange": {"min": "1", "max": str(dev.cores), "step": "1"}}},
        }
    else:
        out["capacity"] = {"memory": {"value": mem}}
    taints = []
    if not dev.healthy:
        taints.append({"key": f"{driver}/{TAINT_UNHEALTHY}", "value": taint_value(dev.reason),
                       "effect": unhealthy_effect})
    if paused:
        taints.append({"key": f"{driver}/{TAINT_PAUSED}", "value": "mig-apply-lock", "effect": "NoSchedule"})
    if taints:
        out["taints"] = taints
    return out
