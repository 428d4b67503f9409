"""Pod side of the cache: which pods' allocations count, and a pod's allocation as collapsed per-GPU
usage (Project-HAMi/HAMi ``pkg/device/pods.go``).

A pod's allocation counts only when it is trustworthy:

* bound (``spec.nodeName`` set) to the node its ``hami.io/vgpu-node`` names — a pod bound elsewhere
  holds nothing on the annotated node (drift: ``hami_agent.doctor.invariants`` reports it);
* pending, when its ``schedulerName`` is ours: only then can the allocation be one of our in-flight
  decisions. A pending pod that names another scheduler (a tenant's forged ``hami.io/vgpu-node``
  label and ``devices-allocated``) would otherwise make an empty node refuse real pods;
* not finished (Succeeded/Failed). A terminating pod still counts: its containers may still run.

Pods come from the API server, which validates them, but the code never assumes a shape it has not
checked: a malformed pod counts nothing and is logged, it never raises into the informer.
"""

from __future__ import annotations

import functools
import logging

from hami_agent import log
from hami_agent.protocol import ContainerDevice, MigPlacement, ProtocolError, decode_pod_devices, keys
from hami_agent.protocol.mig import decode_mig_allocations
from hami_agent.protocol.timefmt import parse_rfc3339
from hami_agent.scheduler.core.model import DEFAULT_GRACE_S, PREEMPT_LOWER, PREEMPT_NEVER, PodUsage
from hami_agent.scheduler.core.requests import RequestError, RequestMemo, pod_request
from hami_agent.scheduler.state.cache import Signature, collapse

logger = logging.getLogger(__name__)

TERMINATED = ("Succeeded", "Failed")


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v: object) -> list:
    return v if isinstance(v, list) else []


def pod_key(pod: dict) -> tuple[str, str, str]:
    md = _dict(pod.get("metadata"))
    ns, name = str(md.get("namespace") or ""), str(md.get("name") or "")
    return str(md.get("uid") or f"{ns}/{name}"), ns, name


def annotations(pod: dict) -> dict:
    return _dict(_dict(pod.get("metadata")).get("annotations"))


def is_terminated(pod: dict) -> bool:
    return _dict(pod.get("status")).get("phase") in TERMINATED


def signature(pod: dict) -> Signature | None:
    """The scheduler-written annotations that identify one assignment, or None when the pod has none."""
    ann = annotations(pod)
    node = ann.get(keys.VGPU_NODE)
    if not node or not isinstance(node, str):
        return None
    return (node, str(ann.get(keys.DEVICES_ALLOCATED) or ""), str(ann.get(keys.VGPU_TIME) or ""))


def init_done(pod: dict) -> bool:
    """All init containers exited 0: their usage no longer counts."""
    spec_inits = _list(_dict(pod.get("spec")).get("initContainers"))
    if not spec_inits:
        return False
    statuses = _list(_dict(pod.get("status")).get("initContainerStatuses"))
    if len(statuses) < len(spec_inits):
        return False
    for s in statuses:
        term = _dict(_dict(_dict(s).get("state")).get("terminated"))
        if not term or term.get("exitCode") != 0:
            return False
    return True


def untrusted_reason(pod: dict, scheduler_name: str | None) -> str:
    """Why the pod's allocation must not count ("" when it counts). ``scheduler_name`` None: any."""
    sig = signature(pod)
    if sig is None:
        return f"no {keys.VGPU_NODE}"
    if is_terminated(pod):
        return "finished"
    spec = _dict(pod.get("spec"))
    bound = spec.get("nodeName")
    if bound:
        if bound != sig[0]:
            return f"bound to node {bound} but {keys.VGPU_NODE} is {sig[0]}"
        return ""
    if scheduler_name is not None and spec.get("schedulerName") != scheduler_name:
        return f"pending for scheduler {spec.get('schedulerName')!r}, not {scheduler_name!r}"
    return ""


def pod_usage(pod: dict, mig: tuple[tuple[str, int], ...] = (),
              scheduler_name: str | None = None) -> PodUsage | None:
    """Usage of a pod's allocation, or None when it has none or it does not count (see module doc)."""
    why = untrusted_reason(pod, scheduler_name)
    uid, ns, name = pod_key(pod)
    if why:
        if why.startswith(("bound", "pending")):
            log.v(logger, 3, "pod %s/%s: allocation not counted: %s", ns, name, why)
        return None
    ann = annotations(pod)
    node = ann[keys.VGPU_NODE]
    raw = ann.get(keys.DEVICES_ALLOCATED, "")
    try:
        if raw and not isinstance(raw, str):
            raise ProtocolError(f"expected a string, got {type(raw).__name__}")
        containers = _decoded_devices(raw) if raw else ()
    except ProtocolError as exc:
        logger.error("pod %s/%s: cannot decode %s: %s", ns, name, keys.DEVICES_ALLOCATED, exc)
        containers = []
    spec = _dict(pod.get("spec"))
    n_init = len(_list(spec.get("initContainers")))
    n_all = n_init + len(_list(spec.get("containers")))
    if containers and len(containers) != n_all:
        # HAMi v2.10 may drop the empty placeholders (since HAMi commit 9e75c87f, Project-HAMi/HAMi#1773): we
        # cannot tell init from app entries, so count everything as app usage (never under-counts).
        log.v(logger, 3, "pod %s/%s: %s has %d container entries for %d containers; counting all as app",
              ns, name, keys.DEVICES_ALLOCATED, len(containers), n_all)
        n_init = 0
    elif init_done(pod):
        containers = [[] if i < n_init else c for i, c in enumerate(containers)]
    return PodUsage(uid=uid, namespace=ns, name=name, node=node, devices=collapse(containers, n_init),
                    mig=mig, mig_alloc=mig_reservations_of(ann, ns, name), **preemption_fields(pod))


@functools.lru_cache(maxsize=4096)
def _decoded_devices(raw: str) -> tuple[tuple[ContainerDevice, ...], ...]:
    """``decode_pod_devices``, remembered by the text: a pod's allocation is read on each of its watch
    events and never changes (ProtocolError is raised, not remembered)."""
    return tuple(tuple(c) for c in decode_pod_devices(raw))


@functools.lru_cache(maxsize=4096)
def _rfc3339_epoch(value: str, what: str) -> float:
    """Seconds since the epoch of an RFC3339 time, remembered by the text (a pod's timestamps repeat
    on each of its events)."""
    return parse_rfc3339(value, what).timestamp()


def _epoch(value: object, what: str, ns: str, name: str) -> float:
    if not isinstance(value, str) or not value:
        return 0.0
    try:
        return _rfc3339_epoch(value, what)
    except ProtocolError as exc:
        log.v(logger, 3, "pod %s/%s: %s", ns, name, exc)
        return 0.0


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def preemption_fields(pod: dict) -> dict:
    """The fields of ``PodUsage`` preemption reads (issue 29), from the pod as the API returns it. The API
    server sets spec.priority from the PriorityClass at admission; a missing or malformed value reads as
    kube-scheduler reads it (0, PreemptLowerPriority, 30 s)."""
    md, spec, status = _dict(pod.get("metadata")), _dict(pod.get("spec")), _dict(pod.get("status"))
    _uid, ns, name = pod_key(pod)
    created = _epoch(md.get("creationTimestamp"), "metadata.creationTimestamp", ns, name)
    started = _epoch(status.get("startTime"), "status.startTime", ns, name) or created
    policy = spec.get("preemptionPolicy")
    return {"priority": _int(spec.get("priority"), 0),
            "preemption_policy": policy if policy in (PREEMPT_LOWER, PREEMPT_NEVER) else PREEMPT_LOWER,
            "created": created, "started": started,
            "grace_s": max(0, _int(spec.get("terminationGracePeriodSeconds"), DEFAULT_GRACE_S)),
            "terminating": bool(md.get("deletionTimestamp")), "bound": bool(spec.get("nodeName"))}


def mig_reservations_of(ann: dict, ns: str, name: str) -> dict[str, tuple[MigPlacement, ...]]:
    """Placements per GPU from ``hami.io/vgpu-mig-allocations`` (every entry counts, as in HAMi's
    ``getNodesUsage``). A malformed value reserves nothing and is logged; the pod's MIG GPUs then have no
    matching reservation, which marks them unhealthy (HAMi does the same)."""
    raw = ann.get(keys.MIG_ALLOCATIONS)
    if not raw:
        return {}
    try:
        allocs = decode_mig_allocations(raw)
    except ProtocolError as exc:
        logger.error("pod %s/%s: cannot decode %s: %s", ns, name, keys.MIG_ALLOCATIONS, exc)
        return {}
    out: dict[str, tuple[MigPlacement, ...]] = {}
    for a in allocs:
        out[a.gpu_uuid] = (*out.get(a.gpu_uuid, ()), a.placement)
    return out


def countable_usage(pod: dict, names: object = None, scheduler_name: str | None = None,
                    memo: RequestMemo | None = None) -> tuple[PodUsage | None, Signature | None]:
    """What the usage cache counts for ``pod`` and the signature of its assignment. An allocation on a
    pod that requests no GPU (or whose requests are invalid) counts nothing: no Allocate can have handed
    it a device, so it can only be forged or stale. ``memo``: the pod requests of the pods seen before
    (its ``names`` are used then)."""
    sig = signature(pod)
    if sig is None:
        return None, None
    try:
        preq = memo.request(pod_key(pod)[0], pod) if memo is not None else pod_request(pod, names)
    except RequestError as exc:
        _uid, ns, name = pod_key(pod)
        log.v(logger, 3, "pod %s/%s: allocation not counted: %s", ns, name, exc)
        return None, sig
    if preq.empty:
        _uid, ns, name = pod_key(pod)
        log.v(logger, 3, "pod %s/%s: allocation not counted: the pod requests no GPU", ns, name)
        return None, sig
    return pod_usage(pod, preq.mig, scheduler_name), sig
