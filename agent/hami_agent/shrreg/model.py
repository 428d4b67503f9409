"""Decoded shared-region data (immutable snapshots; nothing here touches the file)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STATUS_NAMES = {0: "EXITED", 1: "ACTIVE", 2: "SUSPENDED"}
SEM_PSHARED_PRIVATE = 128  # glibc stores 128 in `private` for sem_init(pshared=1)


@dataclass(frozen=True)
class SemState:
    """A glibc ``sem_t`` (64-bit atomics layout): value, waiters and the pshared marker."""

    value: int
    nwaiters: int
    private: int

    @property
    def pshared(self) -> bool:
        return self.private == SEM_PSHARED_PRIVATE

    @property
    def initialised(self) -> bool:
        """sem_init(pshared=1) was called on these bytes (an all-zero sem_t never was)."""
        return self.pshared

    @property
    def locked(self) -> bool:
        return self.value == 0


@dataclass(frozen=True)
class DeviceMemory:
    context_size: int
    module_size: int
    data_size: int
    offset: int
    total: int


@dataclass(frozen=True)
class DeviceUtil:
    dec_util: int
    enc_util: int
    sm_util: int


@dataclass(frozen=True)
class ProcSlot:
    index: int
    pid: int  # PID in the container's PID namespace
    hostpid: int  # host PID found via NVML (0 = unknown, "SET_TASK_PID FAILED")
    used: tuple[DeviceMemory, ...]
    monitorused: tuple[int, ...]
    device_util: tuple[DeviceUtil, ...]
    status: int  # 1 running, 2 suspended, 0 exited
    seqlock: int | None  # v1.2/transient only; odd = a writer is inside an update

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"UNKNOWN({self.status})")

    @property
    def write_in_progress(self) -> bool:
        return self.seqlock is not None and self.seqlock % 2 == 1


@dataclass(frozen=True)
class Region:
    path: str
    file_size: int
    layout: str
    major: int | None
    minor: int | None
    initialized_flag: int
    sm_init_flag: int
    owner_pid: int
    sem: SemState
    sem_postinit: SemState | None
    device_num: int  # raw value from the file
    uuids: tuple[str, ...]  # 16 entries, "" where unset
    limit: tuple[int, ...]  # bytes, 0 = unlimited
    sm_limit: tuple[int, ...]  # percent, 100 (or 0) = unlimited
    proc_num: int  # raw value from the file
    procs: tuple[ProcSlot, ...]  # slots [0, clamp(proc_num)) in file order
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int | None
    warnings: tuple[str, ...] = field(default=())
    # header values no real region can have (proc_num/device_num out of range): its slots are not decoded,
    # its numbers mean nothing; the monitor skips it and reports it as corrupt
    corrupt: bool = False

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}" if self.major is not None else "none (v0b)"

    @property
    def locked(self) -> bool:
        return self.sem.locked

    def device_indices(self) -> list[int]:
        """Devices in use by this container: i < device_num with a UUID written (as HAMi's monitor)."""
        n = max(0, min(self.device_num, len(self.uuids)))
        return [i for i in range(n) if self.uuids[i]]

    def used_bytes(self, dev: int, *, skip_exited: bool = False) -> int:
        """Sum of ``used[dev].total`` over slots: what HAMi-core's OOM check adds up.

        ``skip_exited`` mirrors HAMi's vGPU monitor, which ignores status==0 slots.
        """
        return sum(p.used[dev].total for p in self.procs if not (skip_exited and p.status == 0))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["version"] = self.version
        d["locked"] = self.locked
        d["devices"] = self.device_indices()
        for slot, raw in zip(self.procs, d["procs"], strict=True):
            raw["status_name"] = slot.status_name
        return d
