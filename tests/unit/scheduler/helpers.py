"""Builders shared by the scheduler unit tests."""

from __future__ import annotations

from hami_agent.scheduler.model import ContainerDeviceRequest, DeviceUsage, PodRequest


def dev(i: int, *, mem: int = 8000, cores: int = 100, count: int = 10, used: int = 0, usedmem: int = 0,
        usedcores: int = 0, numa: int = 0, health: bool = True, type_: str = "NVIDIA-A100",
        mode: str = "hami-core", uuid: str | None = None) -> DeviceUsage:
    return DeviceUsage(id=uuid or f"GPU-{i}", index=i, type=type_, count=count, totalmem=mem,
                       totalcore=cores, numa=numa, health=health, mode=mode, used=used, usedmem=usedmem,
                       usedcores=usedcores)


def req(nums: int = 1, mem: int = 0, pct: int = 101, cores: int = 0) -> ContainerDeviceRequest:
    return ContainerDeviceRequest(nums=nums, memreq=mem, mem_percentage=pct, coresreq=cores)


def preq(*containers: ContainerDeviceRequest | None, n_init: int = 0) -> PodRequest:
    return PodRequest(containers=tuple(containers), n_init=n_init)


def gpu_pod(name: str = "p", *, uid: str | None = None, ns: str = "default", gpus: int = 1,
            mem: int | None = None, cores: int | None = None, annotations: dict | None = None,
            init: list[dict] | None = None, pct: int | None = None) -> dict:
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    if pct is not None:
        limits["nvidia.com/gpumem-percentage"] = str(pct)
    spec: dict = {"schedulerName": "hami-scheduler",
                  "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
                         "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": "Pending"}}
