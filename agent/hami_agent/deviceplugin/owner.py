"""Which pod is the kubelet admitting? The node lock's owner, and only if nothing else could be.

The kubelet's Allocate and GetPreferredAllocation carry device IDs but no pod (device plugin API
v1beta1, ``ContainerAllocateRequest``). The identity is the node lock ``hami.io/mutex.lock``
(``<RFC3339>,<ns>,<pod>``, HAMi's value): the scheduler extender writes it in ``/bind`` before it binds
the pod, and it stays until Allocate of that pod's last container ends; the kubelet admits pods one at a
time; tenants cannot write Node objects. So while the lock is held, the only pod of this node the HAMi
scheduler has bound and not yet allocated is its owner.

That holds only if no *other* pod on this node could be admitted for the same resource meanwhile: a pod
created with ``spec.nodeName`` (bypassing the scheduler), or a pod whose bind was reported lost while
the API applied it (its lock released, the next pod's taken). Such a pod would otherwise receive the
owner's devices and limits. So the owner is used only if no other not-yet-admitted pod on this node
requests the resource; otherwise Allocate refuses and writes nothing, because it cannot know which of
them the kubelet is admitting.

Resolution reads the caches first and the API (within the RPC's budget) only on a miss: no lock in the
cached node, or a cached owner that does not look like a pod being allocated (the informer may lag).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from hami_agent import log
from hami_agent.deviceplugin.budget import RpcBudget
from hami_agent.deviceplugin.errors import Refused
from hami_agent.deviceplugin.podsource import PodRef, PodSource
from hami_agent.protocol import keys
from hami_agent.protocol.devices import decode_pod_devices
from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.nodelock import NodeLockValue, parse_lock_value

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LockOwner:
    """The pod being admitted, pinned by uid; ``lock_value`` is the exact lock that names it."""

    ref: PodRef
    pod: dict
    lock_value: str
    node: dict  # the node object the lock was read from (cache or API): registered capacity


def annotations(obj: dict) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _lock(node: dict | None) -> tuple[str, NodeLockValue] | None:
    value = annotations(node or {}).get(keys.NODE_LOCK)
    if not value:
        return None
    try:
        parsed = parse_lock_value(value)
    except ProtocolError as exc:
        logger.warning("ignoring unparsable node lock %r: %s", value, exc)
        return None
    return (value, parsed) if parsed.has_owner else None


def requested(pod: dict, resource: str) -> bool:
    """True when any container of ``pod`` asks for ``resource`` (limits or requests > 0)."""
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        res = c.get("resources") or {}
        for section in ("limits", "requests"):
            qty = (res.get(section) or {}).get(resource)
            if qty is None:
                continue
            try:
                if int(str(qty)) > 0:
                    return True
            except ValueError:
                return True  # unparsable: the API server would have refused it; assume it asks
    return False


def has_work(pod: dict) -> bool:
    try:
        containers = decode_pod_devices(annotations(pod).get(keys.DEVICES_TO_ALLOCATE, "") or "")
    except ProtocolError:
        return True  # Allocate reports the decode error to the kubelet
    return any(keys.NVIDIA_DEVICE in d.type for c in containers for d in c)


def owner_problem(pod: dict, node_name: str) -> str | None:
    """Why ``pod`` cannot be the pod being allocated on ``node_name`` (None when it can)."""
    md = pod.get("metadata") or {}
    ann = annotations(pod)
    if md.get("deletionTimestamp"):
        return "it is being deleted"
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound != node_name:
        return f"it is bound to {bound or 'no node'}, not to this node"
    if ann.get(keys.VGPU_NODE) != node_name:
        return f"its {keys.VGPU_NODE} is {ann.get(keys.VGPU_NODE)!r}, not this node"
    phase = (pod.get("status") or {}).get("phase", "Pending")
    if phase != "Pending":
        return f"it is {phase}, not waiting for admission"
    if ann.get(keys.BIND_PHASE) != keys.BIND_PHASE_ALLOCATING:
        return f"its {keys.BIND_PHASE} is {ann.get(keys.BIND_PHASE)!r}, not '{keys.BIND_PHASE_ALLOCATING}'"
    if not has_work(pod):
        return f"it has nothing left in {keys.DEVICES_TO_ALLOCATE}"
    return None


def _ref(pod: dict) -> PodRef:
    md = pod.get("metadata") or {}
    return PodRef(md.get("namespace", "default"), md.get("name", ""), md.get("uid", ""))


def find_lock_owner(pods: PodSource, node_name: str, budget: RpcBudget,
                    view: Callable[[dict], dict]) -> LockOwner:
    """The pod named by this node's lock, if it is a pod being allocated here. ``view`` overlays the
    plugin's own writes that the caches may not show yet. Raises ``Refused`` (nothing to write),
    ``BudgetExhausted`` or ``PodSourceError`` (API lookups within the budget failed)."""
    def cached_pod(ns: str, name: str) -> dict | None:
        for p in pods.pods_on_node():
            md = p.get("metadata") or {}
            if md.get("name") == name and md.get("namespace", "default") == ns:
                return view(p)
        return None

    node = pods.cached_node()
    lock = _lock(node)
    if lock is not None:
        pod = cached_pod(lock[1].namespace, lock[1].name)
        if pod is not None and owner_problem(pod, node_name) is None:
            return LockOwner(_ref(pod), pod, lock[0], node or {})
    # a miss (no lock cached, owner not cached or not looking like it is being allocated): the caches
    # may lag behind the scheduler's bind, so read the truth within the budget
    node = pods.get_node(budget.call_timeout("get node"))
    lock = _lock(node)
    if lock is None:
        raise Refused(f"no binding pod found on node {node_name}: no node lock ({keys.NODE_LOCK}) names a "
                      "pod on this node, and only the pod the HAMi scheduler bound under that lock is "
                      "allocated; refusing (was the pod scheduled by another scheduler, or created with "
                      "spec.nodeName?)")
    value, held = lock
    pod = cached_pod(held.namespace, held.name)
    if pod is None or owner_problem(pod, node_name) is not None:
        fetched = pods.get_pod(held.namespace, held.name, budget.call_timeout("get pod"))
        pod = view(fetched) if fetched is not None else None
    who = f"{held.namespace}/{held.name}"
    if pod is None:
        raise Refused(f"no binding pod found on node {node_name}: the node lock names {who}, which does "
                      "not exist; refusing to allocate")
    problem = owner_problem(pod, node_name)
    if problem is not None:
        raise Refused(f"no binding pod found on node {node_name}: the node lock names {who}, but {problem}; "
                      "refusing to allocate")
    log.v(logger, 4, "node lock owner %s read from the API (cache miss)", who)
    return LockOwner(_ref(pod), pod, value, node)


def rivals(pods: Collection[dict], owner: LockOwner, resource: str, settled: Collection[str]) -> list[str]:
    """Other pods on this node that the kubelet could be admitting for ``resource`` instead of the lock
    owner: waiting for admission (Pending, not being deleted), asking for the resource, and neither
    allocated (``bind-phase=success``) nor already answered by this plugin (``settled`` uids)."""
    out = []
    for p in pods:
        md = p.get("metadata") or {}
        uid = md.get("uid", "")
        if uid == owner.ref.uid or uid in settled or md.get("deletionTimestamp"):
            continue
        if (p.get("status") or {}).get("phase", "Pending") != "Pending" or not requested(p, resource):
            continue
        if annotations(p).get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS:
            continue
        out.append(f"{md.get('namespace', 'default')}/{md.get('name', '')}")
    return sorted(out)
