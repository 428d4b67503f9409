"""Device inventory model: what NVML told us, as immutable values the RPC paths can share freely."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

Status = Literal["starting", "ok", "stuck", "error"]

# unhealthy_reason values (short codes, also shown by `hami-agent devices`)
REASON_STUCK = "nvml-stuck"
REASON_STUCK_UNKILLABLE = "nvml-stuck-unkillable"  # killed workers still alive: no new worker is started
REASON_LOST = "gpu-lost"
REASON_NVML_ERROR = "nvml-error"


def xid_reason(xid: int) -> str:
    return f"xid-{xid}"


@dataclass(frozen=True)
class MigDevice:
    index: int
    uuid: str
    profile: str  # nvidia-smi name, e.g. "3g.48gb"
    memory_mib: int
    gi_id: int
    ci_id: int


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str  # NVML name, e.g. "NVIDIA H20"
    type: str  # HAMi device type: name, prefixed "NVIDIA-" unless it starts with "NVIDIA"
    memory_mib: int | None  # None when NVML answers NOT_SUPPORTED (unified memory)
    numa: int | None  # None when unknown
    pci_bus_id: str  # NVML form, "00000000:0F:00.0"
    mig_capable: bool
    mig_enabled: bool
    mig_pending: bool
    mig_devices: tuple[MigDevice, ...] = ()
    healthy: bool = True
    unhealthy_reason: str | None = None

    def with_health(self, healthy: bool, reason: str | None) -> Gpu:
        return replace(self, healthy=healthy, unhealthy_reason=None if healthy else reason)


@dataclass(frozen=True)
class Snapshot:
    status: Status
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    error: str | None = None
    stuck_call: str | None = None
    taken_at: float = 0.0  # time.time() of the NVML answer this snapshot reflects
    generation: int = 0
    # GPU indices whose memory NVML could not report (NOT_SUPPORTED)
    memory_not_supported: tuple[int, ...] = field(default=())
    # GPUs NVML counts but that could not be listed (lost before we ever saw their UUID, ...)
    problems: tuple[str, ...] = field(default=())

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        return None

    def same_content(self, other: Snapshot) -> bool:
        """Equal apart from when it was taken and its generation number."""
        return replace(self, taken_at=0.0, generation=0) == replace(other, taken_at=0.0, generation=0)


def device_type(name: str) -> str:
    """HAMi's type normalisation: prefix ``NVIDIA-`` only when the name does not start with NVIDIA."""
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def mig_memory_gb(total_device_mib: int, mig_memory_mib: int) -> int:
    """Memory size in a MIG profile name the way nvidia-smi/go-nvlib derive it.

    The MIG memory is expressed as a fraction of the whole board, rounded UP to eighths (memory slices),
    times the board size in whole GiB (rounded up): 47488 MiB of a 97871 MiB H20 -> 4/8 * 96 = 48.
    """
    if total_device_mib <= 0 or mig_memory_mib <= 0:
        raise ValueError("memory sizes must be positive")
    fraction = math.ceil(mig_memory_mib / total_device_mib * 8) / 8
    total_gb = math.ceil(total_device_mib / 1024)
    return round(fraction * total_gb)


def mig_profile_name(slices: int, total_device_mib: int | None, mig_memory_mib: int,
                     nvml_name: str | None = None) -> str:
    """``<slices>g.<GB>gb``; the ``+me`` style suffixes only NVML's device name carries are kept."""
    suffix = ""
    named = None
    if nvml_name and " MIG " in nvml_name:
        named = nvml_name.rsplit(" MIG ", 1)[1].strip()
    if not total_device_mib:
        if named:
            return named
        return f"{slices}g.{math.ceil(mig_memory_mib / 1024)}gb"
    base = f"{slices}g.{mig_memory_gb(total_device_mib, mig_memory_mib)}gb"
    if named and named.startswith(base + "+"):
        suffix = named[len(base):]
    return base + suffix
