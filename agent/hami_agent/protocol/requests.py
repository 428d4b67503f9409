"""Per-container GPU requests from a pod dict (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``
``GenerateResourceRequests``) and the webhook's resource
defaults (§3.2). Pods are plain dicts in the API's JSON form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hami_agent.protocol import keys
from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.quantity import quantity_as_int64

# gpumem-percentage sentinel meaning "not given"
PERCENTAGE_UNSET = 101
INT32_MAX = 2**31 - 1


class RequestSettings(Protocol):
    """What request parsing needs from the config (``hami_agent.config.NvidiaConfig`` provides it)."""

    resource_count_name: str
    resource_memory_name: str
    resource_memory_percentage_name: str
    resource_core_name: str
    resource_priority_name: str
    default_memory: int
    default_cores: int
    default_gpu_num: int
    memory_factor: int


@dataclass(frozen=True)
class RequestConfig:
    """Stand-alone defaults (HAMi chart values) for callers without an AgentConfig."""

    resource_count_name: str = keys.RESOURCE_COUNT
    resource_memory_name: str = keys.RESOURCE_MEMORY
    resource_memory_percentage_name: str = keys.RESOURCE_MEMORY_PERCENTAGE
    resource_core_name: str = keys.RESOURCE_CORES
    resource_priority_name: str = keys.RESOURCE_PRIORITY
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1


@dataclass(frozen=True)
class ContainerRequest:
    """HAMi's ``ContainerDeviceRequest`` for one container plus where it came from.

    ``nums == 0`` means the container asks for no GPU (or its request is invalid: see ``error``).
    ``memreq`` is MiB after ``memoryFactor``; ``mem_percentage_req`` is 101 when unset.
    ``coresreq`` is already clamped to 0..100.
    """

    container: str
    init: bool
    nums: int = 0
    type: str = keys.NVIDIA_DEVICE
    memreq: int = 0
    mem_percentage_req: int = PERCENTAGE_UNSET
    coresreq: int = 0
    priority: int | None = None
    error: str | None = None

    def memory_for(self, total_mem: int) -> int:
        """Memory this request takes on a device with ``total_mem`` MiB (Fit's rule)."""
        return memory_for_request(self.memreq, self.mem_percentage_req, total_mem)


def memory_for_request(memreq: int, mem_percentage_req: int, total_mem: int) -> int:
    """HAMi Fit's memory rule (§3.1): ``memreq`` MiB when > 0, else ``total_mem * pct // 100`` when a
    percentage is set (not 101), else 0."""
    if memreq > 0:
        return memreq
    if mem_percentage_req != PERCENTAGE_UNSET:
        return total_mem * mem_percentage_req // 100
    return 0


def _settings(cfg: Any) -> RequestSettings:
    if cfg is None:
        return RequestConfig()
    # Accept an AgentConfig (has .nvidia) as well as the nvidia section itself.
    return getattr(cfg, "nvidia", cfg)


def resource_value(container: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """``(found, raw value)`` of resource ``name``: limits first, then requests (HAMi's lookup order)."""
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if name in values:
            return True, values[name]
    return False, None


def resource_int(container: Mapping[str, Any], name: str) -> int | None:
    """Integer value of resource ``name`` (limits first), or None when it is absent or not an integer
    quantity (HAMi: ``Quantity.AsInt64`` with ok=false)."""
    found, raw = resource_value(container, name)
    if not found:
        return None
    try:
        return quantity_as_int64(raw, f"resource {name}")
    except ProtocolError:
        return None


def hami_resource_names(cfg: Any = None) -> tuple[str, ...]:
    """The five HAMi-managed resource names of ``cfg`` (count, memory, memory %, cores, priority)."""
    s = _settings(cfg)
    return (s.resource_count_name, s.resource_memory_name, s.resource_memory_percentage_name,
            s.resource_core_name, s.resource_priority_name)


def has_hami_resources(container: Mapping[str, Any], cfg: Any = None) -> bool:
    """True when the container names any HAMi resource in its limits or requests (the webhook's test
    for "a GPU container", whatever the values)."""
    names = hami_resource_names(cfg)
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if any(n in values for n in names):
            return True
    return False


def mig_requests(pod: Mapping[str, Any], cfg: Any = None) -> dict[str, int]:
    """Static MIG instances a pod asks for (mixed strategy ``nvidia.com/mig-<profile>``), summed over
    the app containers: ``{profile: count}``; zero counts are left out. Limits win over requests.
    Raises ProtocolError naming the container and resource when a count is not a non-negative integer."""
    names = set(hami_resource_names(cfg))
    out: dict[str, int] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}  # limits win
        for k, v in merged.items():
            profile = keys.mig_profile_from_resource(k)
            if profile is None or k in names:
                continue
            cname = c.get("name", "?")
            n = quantity_as_int64(v, f"container {cname!r} resource {k}")
            if n is None or n < 0:
                raise ProtocolError(f"container {cname!r} resource {k}={v!r} must be a non-negative integer")
            if n > 0:
                out[profile] = out.get(profile, 0) + n
    return out


def _int_resource(container: Mapping[str, Any], name: str, cname: str) -> tuple[bool, int | None, str | None]:
    found, raw = resource_value(container, name)
    if not found:
        return False, None, None
    try:
        value = quantity_as_int64(raw, f"container {cname!r} resource {name}")
    except ProtocolError as exc:
        return True, None, str(exc)
    if value is None:
        return True, None, f"container {cname!r} resource {name}={raw!r} is not an integer"
    return True, value, None


def container_request(container: Mapping[str, Any], cfg: Any = None, init: bool = False) -> ContainerRequest:
    """The GPU request of one container dict."""
    s = _settings(cfg)
    cname = str(container.get("name", ""))
    found, nums, err = _int_resource(container, s.resource_count_name, cname)
    if not found:
        return ContainerRequest(container=cname, init=init)
    if nums is None or nums < 0 or nums > INT32_MAX:
        return ContainerRequest(container=cname, init=init,
                                error=err or f"container {cname!r} resource {s.resource_count_name}="
                                f"{nums} must be a non-negative int32")
    base = ContainerRequest(container=cname, init=init)
    memreq = 0
    found, mem, err = _int_resource(container, s.resource_memory_name, cname)
    if found:
        factor = max(1, int(s.memory_factor or 1))
        if mem is None or mem < 0 or mem * factor > INT32_MAX:
            # HAMi: non-integer, negative or int32-overflowing memory makes the request invalid.
            return ContainerRequest(container=cname, init=init,
                                    error=err or f"container {cname!r} resource {s.resource_memory_name}="
                                    f"{mem} must be a non-negative int32 (MiB)")
        memreq = mem * factor
    pct = PERCENTAGE_UNSET
    found, p, err = _int_resource(container, s.resource_memory_percentage_name, cname)
    if found and p is not None and p > 0:
        pct = min(p, 100)  # >100 clamped, <=0 ignored
    if pct == PERCENTAGE_UNSET and memreq == 0:
        if s.default_memory:
            memreq = int(s.default_memory)
        else:
            pct = 100  # whole card
    cores = int(s.default_cores)
    found, c, err = _int_resource(container, s.resource_core_name, cname)
    if found and c is not None:
        cores = c
    cores = max(0, min(cores, 100))
    priority = None
    found, pr, err = _int_resource(container, s.resource_priority_name, cname)
    if found and pr is not None:
        priority = pr
    return ContainerRequest(container=cname, init=init, nums=nums, type=base.type, memreq=memreq,
                            mem_percentage_req=pct, coresreq=cores, priority=priority)


def container_requests(pod: Mapping[str, Any], cfg: Any = None) -> list[ContainerRequest]:
    """One ContainerRequest per container, init containers first, in spec order (the same order as
    the pod device string). ``cfg``: an AgentConfig, its ``nvidia`` section, or None for defaults."""
    spec = pod.get("spec") or {}
    out = [container_request(c, cfg, init=True) for c in spec.get("initContainers") or []]
    out += [container_request(c, cfg, init=False) for c in spec.get("containers") or []]
    return out


def pod_requests_gpu(pod: Mapping[str, Any], cfg: Any = None) -> bool:
    """True when any container asks for at least one GPU."""
    return any(r.nums > 0 for r in container_requests(pod, cfg))


def webhook_resource_defaults(container: Mapping[str, Any], cfg: Any = None) -> dict[str, str]:
    """Limits the mutating webhook adds to one container (§3.2): ``defaultGPUNum`` when memory/cores
    are given without a count, and ``gpucores: 100`` (exclusive default, v2.7+) when a count is present,
    cores are absent, and no memory or a 100% percentage is asked for. Returns {} when nothing to add."""
    s = _settings(cfg)
    has_count = resource_value(container, s.resource_count_name)[0]
    has_mem, _ = resource_value(container, s.resource_memory_name)
    has_pct, pct_raw = resource_value(container, s.resource_memory_percentage_name)
    has_cores = resource_value(container, s.resource_core_name)[0]
    add: dict[str, str] = {}
    if not has_count and (has_mem or has_pct or has_cores):
        add[s.resource_count_name] = str(int(s.default_gpu_num))
        has_count = True
    if has_count and not has_cores:
        pct_100 = False
        if has_pct:
            try:
                pct_100 = quantity_as_int64(pct_raw) == 100
            except ProtocolError:
                pct_100 = False
        if pct_100 or (not has_mem and not has_pct):
            add[s.resource_core_name] = "100"
    return add
