"""Defence in depth for Allocate: never hand out more than a GPU can give.

The primary control against forged allocations is the admission policy that keeps tenants from
writing ``hami.io/*`` allocation annotations (see docs/security.md); the scheduler then never places
more on a GPU than it registered. This check catches what still slips through (a policy not installed,
an annotation rewritten by someone allowed to): before Allocate consumes a pod's allocation it adds the
pod's ``hami.io/vgpu-devices-allocated`` to what the other allocated pods on this node hold and compares
the sum with the node's registered capacity (``hami.io/node-nvidia-register``, what the scheduler
allocates against): memory, cores, slots, and the scheduler's exclusivity rules.

Usage is counted with the scheduler's rule (``hami_agent.scheduler.state.podinfo`` and ``cache.collapse``,
which this package may not import; they follow HAMi's scheduler): per GPU, max(init containers, sum of
app containers); init containers stop counting once all of them exited 0.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from hami_agent.deviceplugin.errors import AllocationError
from hami_agent.protocol import keys
from hami_agent.protocol.devices import ContainerDevice, NodeDevice, decode_node_devices, decode_pod_devices
from hami_agent.protocol.errors import ProtocolError

TERMINATED = ("Succeeded", "Failed")


@dataclass
class GpuUse:
    mem: int = 0
    cores: int = 0
    slots: int = 0

    def __str__(self) -> str:
        return f"{self.mem} MiB, {self.cores}% cores, {self.slots} slot(s)"


def _ann(pod: dict) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def _init_done(pod: dict, n_init: int) -> bool:
    if not n_init:
        return False
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if len(statuses) < n_init:
        return False
    return all(((s.get("state") or {}).get("terminated") or {}).get("exitCode") == 0 for s in statuses)


# Each Allocate checks against the node's register annotation and every other allocated pod's devices:
# the same texts each time, decoded once (the decoded devices are frozen; a bad text raises every time,
# exceptions are not cached). Issue 31: decoding them was a fifth of an Allocate's CPU.
@functools.lru_cache(maxsize=4)
def _node_devices(raw: str) -> tuple[NodeDevice, ...]:
    return tuple(decode_node_devices(raw))


@functools.lru_cache(maxsize=1024)  # a node's allocated pods (at most split count x GPUs, 10 x 8 here)
def _pod_devices(raw: str) -> tuple[tuple[ContainerDevice, ...], ...]:
    return tuple(tuple(c) for c in decode_pod_devices(raw))


def pod_gpu_use(pod: dict) -> dict[str, GpuUse]:
    """Per GPU UUID, what ``hami.io/vgpu-devices-allocated`` holds. Raises ``ProtocolError``."""
    containers: list | tuple = _pod_devices(_ann(pod).get(keys.DEVICES_ALLOCATED, "") or "")
    spec = pod.get("spec") or {}
    n_init = len(spec.get("initContainers") or [])
    if len(containers) != n_init + len(spec.get("containers") or []):
        n_init = 0  # entries cannot be matched to containers: count all as app usage (never under-counts)
    elif _init_done(pod, n_init):
        containers = [[] if i < n_init else c for i, c in enumerate(containers)]
    init: dict[str, GpuUse] = {}
    app: dict[str, GpuUse] = {}
    for i, devices in enumerate(containers):
        for d in devices:
            if keys.NVIDIA_DEVICE not in d.type:
                continue
            if i < n_init:
                u = init.setdefault(d.uuid, GpuUse(slots=1))
                u.mem, u.cores = max(u.mem, d.usedmem), max(u.cores, d.usedcores)
            else:
                u = app.setdefault(d.uuid, GpuUse())
                u.mem, u.cores, u.slots = u.mem + d.usedmem, u.cores + d.usedcores, u.slots + 1
    out = {}
    for uuid in init.keys() | app.keys():
        i, a = init.get(uuid, GpuUse()), app.get(uuid, GpuUse())
        out[uuid] = GpuUse(max(i.mem, a.mem), max(i.cores, a.cores), a.slots or 1)
    return out


def registered_devices(node: dict | None, node_name: str) -> dict[str, NodeDevice]:
    raw = _ann(node or {}).get(keys.NODE_REGISTER)
    if not raw:
        raise AllocationError(f"node {node_name} has no {keys.NODE_REGISTER} annotation: cannot check the "
                              "allocation against the node's capacity (is the node registration loop "
                              "running? see the plugin log)")
    try:
        return {d.id: d for d in _node_devices(raw)}
    except ProtocolError as exc:
        raise AllocationError(f"node {node_name}: cannot decode {keys.NODE_REGISTER}: {exc}") from exc


def held_by_others(pods: Iterable[dict], node_name: str, exclude_uid: str) -> dict[str, GpuUse]:
    """What the other allocated pods on the node hold: not terminated, placed on this node by the
    scheduler, and allocated (``bind-phase=success``). A pod whose allocation cannot be decoded is
    skipped here (the scheduler skips it too) and logged by the caller's own decode."""
    total: dict[str, GpuUse] = {}
    for p in pods:
        md = p.get("metadata") or {}
        ann = _ann(p)
        allocated_here = (ann.get(keys.VGPU_NODE) == node_name
                          and ann.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS)
        if md.get("uid") == exclude_uid or (p.get("status") or {}).get("phase") in TERMINATED \
                or not allocated_here:
            continue
        try:
            use = pod_gpu_use(p)
        except ProtocolError:
            continue
        for uuid, u in use.items():
            t = total.setdefault(uuid, GpuUse())
            t.mem, t.cores, t.slots = t.mem + u.mem, t.cores + u.cores, t.slots + u.slots
    return total


def check_capacity(pod: dict, registered: dict[str, NodeDevice], others: dict[str, GpuUse],
                   node_name: str) -> None:
    """Raise ``AllocationError`` when ``pod``'s allocation plus ``others`` exceeds a registered GPU."""
    md = pod.get("metadata") or {}
    who = f"{md.get('namespace', 'default')}/{md.get('name', '')}"
    try:
        mine = pod_gpu_use(pod)
    except ProtocolError as exc:
        raise AllocationError(f"failed to decode pod devices: pod {who}: {keys.DEVICES_ALLOCATED}: {exc}") \
            from exc
    for uuid, u in sorted(mine.items()):
        cap = registered.get(uuid)
        if cap is None:
            raise AllocationError(f"pod {who}: GPU {uuid} is not registered in {keys.NODE_REGISTER} of node "
                                  f"{node_name}: refusing to allocate it")
        o = others.get(uuid, GpuUse())
        problem = None
        if cap.devcore == 100 and u.cores == 100 and o.slots > 0:
            problem = "exclusive use (100% cores) of a GPU that other pods already share"
        elif cap.devcore and o.cores >= cap.devcore and u.cores == 0:
            problem = "a share of a GPU whose cores are all taken (another pod uses it exclusively)"
        elif o.slots + u.slots > cap.count:
            problem = f"{o.slots + u.slots} sharing slots, the GPU has {cap.count}"
        elif o.mem + u.mem > cap.devmem:
            problem = f"{o.mem + u.mem} MiB of memory, the GPU has {cap.devmem} MiB"
        elif o.cores + u.cores > cap.devcore:
            problem = f"{o.cores + u.cores}% of its cores, the GPU has {cap.devcore}%"
        if problem:
            raise AllocationError(
                f"refusing to over-commit GPU {uuid} on node {node_name}: pod {who} would bring it to "
                f"{problem} (pod: {u}; other allocated pods: {o}). The scheduler never places this; was "
                f"{keys.DEVICES_ALLOCATED} written by someone else?")
