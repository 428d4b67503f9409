"""Per-container device requests from a pod dict (HAMi ``nvidia.GenerateResourceRequests``, ref §3.1).

A thin scheduler-local implementation: the extender needs the request as a hashable value (it keys the
fit memo on it), so it builds its own frozen ``ContainerDeviceRequest`` rather than a wire object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hami_agent.scheduler.model import NVIDIA, ContainerDeviceRequest, PodRequest

MIG_PREFIX = "nvidia.com/mig-"
INT32_MAX = 2**31 - 1

_QTY = re.compile(r"^([+]?[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_MULT = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


class RequestError(ValueError):
    """A HAMi resource value that cannot be used; the message names the container and field."""


@dataclass(frozen=True)
class ResourceNames:
    """Resource names and defaults of the ``nvidia:`` device config section (reference §5)."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    priority: str = "nvidia.com/priority"
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1

    def all(self) -> tuple[str, ...]:
        return (self.count, self.memory, self.memory_percentage, self.cores, self.priority)


def parse_quantity(value: object) -> int:
    """Integer value of a Kubernetes quantity (``20k`` = 20000, ``1Gi``); non-integers raise ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return value
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError(f"not an integer quantity: {value!r}")
    return int(m.group(1)) * _MULT[m.group(2)]


def _resource(container: dict, name: str) -> object | None:
    res = container.get("resources") or {}
    for part in ("limits", "requests"):  # limits first, like HAMi
        v = (res.get(part) or {}).get(name)
        if v is not None:
            return v
    return None


def _proto_config(names: ResourceNames):
    from hami_agent.protocol.requests import RequestConfig

    return RequestConfig(resource_count_name=names.count, resource_memory_name=names.memory,
                         resource_memory_percentage_name=names.memory_percentage,
                         resource_core_name=names.cores, resource_priority_name=names.priority,
                         default_memory=names.default_memory, default_cores=names.default_cores,
                         default_gpu_num=names.default_gpu_num, memory_factor=names.memory_factor)


def pod_request(pod: dict, names: ResourceNames) -> PodRequest:
    """Requests of every container, init containers first (HAMi ``Resourcereqs``)."""
    from hami_agent.protocol.requests import container_requests

    spec = pod.get("spec") or {}
    inits = spec.get("initContainers") or []
    apps = spec.get("containers") or []
    reqs: list[ContainerDeviceRequest | None] = []
    # The protocol parser does HAMi's resolution; we keep only the fields that change the fit, in a
    # hashable form (the fit memo is keyed on it, so container names must not be part of it).
    for r in container_requests(pod, _proto_config(names)):
        if r.error:
            raise RequestError(r.error)
        reqs.append(None if r.nums <= 0 else ContainerDeviceRequest(
            nums=r.nums, type=r.type or NVIDIA, memreq=r.memreq, mem_percentage=r.mem_percentage_req,
            coresreq=r.coresreq))
    mig: dict[str, int] = {}
    for c in apps:
        res = c.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}  # limits win
        for k, v in merged.items():
            if k.startswith(MIG_PREFIX) and k not in names.all():
                try:
                    n = parse_quantity(v)
                except ValueError as exc:
                    cname = c.get("name", "?")
                    raise RequestError(f"container {cname}: {k}={v!r} is not an integer") from exc
                if n > 0:
                    profile = k[len(MIG_PREFIX):]
                    mig[profile] = mig.get(profile, 0) + n
    return PodRequest(containers=tuple(reqs), n_init=len(inits), mig=tuple(sorted(mig.items())))


def has_hami_resources(pod: dict, names: ResourceNames) -> bool:
    spec = pod.get("spec") or {}
    for c in (*(spec.get("initContainers") or []), *(spec.get("containers") or [])):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            keys = (res.get(part) or {}).keys()
            if any(k in names.all() for k in keys):
                return True
    return False
