"""Test doubles for the device plugin: an inventory snapshot source (no NVML) and pod builders.

The snapshot classes mirror the attributes of ``hami_agent.nvml.model`` (``Snapshot``, ``Gpu``,
``MigDevice``); the device plugin reads them duck-typed, so these stand in for a real supervisor.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

from hami_agent.protocol import keys
from hami_agent.protocol.devices import NodeDevice, encode_node_devices


@dataclass(frozen=True)
class FakeMig:
    index: int
    uuid: str
    profile: str
    memory_mib: int = 11776
    gi_id: int = 1
    ci_id: int = 0


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    name: str = "NVIDIA H20"
    type: str = "NVIDIA-NVIDIA H20"
    memory_mib: int | None = 97871
    numa: int | None = 0
    pci_bus_id: str = "00000000:18:00.0"
    mig_capable: bool = True
    mig_enabled: bool = False
    mig_pending: bool = False
    mig_devices: tuple[FakeMig, ...] = ()
    healthy: bool = True
    unhealthy_reason: str | None = None


@dataclass(frozen=True)
class FakeSnapshot:
    status: str = "ok"
    gpus: tuple[FakeGpu, ...] = ()
    driver_version: str | None = "570.172.08"
    cuda_driver_version: int | None = 12080
    error: str | None = None
    stuck_call: str | None = None
    taken_at: float = field(default_factory=time.time)
    generation: int = 1


class FakeSource:
    """Behaves like ``NvmlSupervisor``: ``snapshot()`` never blocks, ``wait_for_change`` waits."""

    def __init__(self, snapshot: FakeSnapshot) -> None:
        self._cond = threading.Condition()
        self._snap = snapshot
        self._woken = False
        self.started = 0
        self.stopped = 0

    def start(self) -> None:
        self.started += 1

    def stop(self) -> None:
        self.stopped += 1

    def snapshot(self) -> FakeSnapshot:
        with self._cond:
            return self._snap

    def set(self, **changes) -> FakeSnapshot:
        with self._cond:
            self._snap = replace(
                self._snap, generation=self._snap.generation + 1, taken_at=time.time(), **changes
            )
            self._cond.notify_all()
            return self._snap

    def wait_for_change(self, generation: int, timeout: float) -> FakeSnapshot:
        with self._cond:
            if self._snap.generation == generation and not self._woken:
                self._cond.wait(timeout)
            self._woken = False
            return self._snap

    def wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"


def full_gpus(n: int, **kw) -> tuple[FakeGpu, ...]:
    return tuple(FakeGpu(index=i, uuid=gpu_uuid(i), numa=i // 4, **kw) for i in range(n))


def h20_mig_mixed() -> tuple[FakeGpu, ...]:
    """Seed 003's node layout: GPUs 0-2 in MIG (3g.48gb + 1g.24gb + 2x1g.12gb), 3-7 full."""
    gpus = []
    for i in range(8):
        if i < 3:
            migs = (
                FakeMig(0, f"MIG-{i}0000000-0000-0000-0000-000000000000", "3g.48gb", 47488, 2),
                FakeMig(1, f"MIG-{i}1000000-0000-0000-0000-000000000000", "1g.24gb", 23552, 3),
                FakeMig(2, f"MIG-{i}2000000-0000-0000-0000-000000000000", "1g.12gb", 11776, 9),
                FakeMig(3, f"MIG-{i}3000000-0000-0000-0000-000000000000", "1g.12gb", 11776, 10),
            )
            gpus.append(FakeGpu(i, gpu_uuid(i), mig_enabled=True, mig_devices=migs))
        else:
            gpus.append(FakeGpu(i, gpu_uuid(i), numa=1))
    return tuple(gpus)


def hami_pod(
    name: str,
    node: str,
    containers: list[dict],
    devices: str,
    *,
    init: list[dict] | None = None,
    bind_time: int = 1700000000,
    phase: str = "allocating",
    ns: str = "default",
) -> dict:
    """A pod as HAMi's scheduler leaves it after /bind (annotations of Project-HAMi/HAMi
    pkg/util/types.go)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "annotations": {
                keys.VGPU_NODE: node,
                keys.VGPU_TIME: str(bind_time),
                keys.DEVICES_TO_ALLOCATE: devices,
                keys.DEVICES_ALLOCATED: devices,
                keys.BIND_PHASE: phase,
                keys.BIND_TIME: str(bind_time),
            },
            "labels": {keys.VGPU_NODE: node},
        },
        "spec": {"nodeName": node, "containers": containers, "initContainers": init or []},
        "status": {"phase": "Pending"},
    }


def ctr(
    name: str, gpus: int = 0, env: dict[str, str] | None = None, resource: str = "nvidia.com/gpu"
) -> dict:
    c: dict = {"name": name, "image": "busybox"}
    if gpus:
        c["resources"] = {"limits": {resource: str(gpus)}}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return c


def node_register(n: int | list[str], count: int = 10, devmem: int = 97871, devcore: int = 100) -> str:
    """``hami.io/node-nvidia-register`` for GPUs ``gpu_uuid(0..n-1)`` (or the given UUIDs), as the
    plugin's registration loop writes it (the capacity Allocate checks against)."""
    uuids = n if isinstance(n, list) else [gpu_uuid(i) for i in range(n)]
    return encode_node_devices([
        NodeDevice(id=u, index=i, count=count, devmem=devmem, devcore=devcore, type="NVIDIA-H20",
                   numa=0, mode=keys.MODE_HAMI_CORE, health=True)
        for i, u in enumerate(uuids)])


def lock_value(name: str, ns: str = "default", when: str = "2026-11-21T12:00:00Z") -> str:
    """``hami.io/mutex.lock`` naming ``ns/name``, as the scheduler's /bind writes it."""
    return f"{when},{ns},{name}"
