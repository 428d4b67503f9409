"""Pod side of the cache: a pod dict's allocation as collapsed per-GPU usage (reference §4.2)."""

from __future__ import annotations

import logging

from hami_agent import log
from hami_agent.protocol import ProtocolError, decode_pod_devices, keys
from hami_agent.scheduler.cache import collapse
from hami_agent.scheduler.model import PodUsage

logger = logging.getLogger(__name__)

TERMINATED = ("Succeeded", "Failed")


def pod_key(pod: dict) -> tuple[str, str, str]:
    md = pod.get("metadata") or {}
    ns, name = md.get("namespace", ""), md.get("name", "")
    return md.get("uid") or f"{ns}/{name}", ns, name


def is_terminated(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINATED


def init_done(pod: dict) -> bool:
    """All init containers exited 0: their usage no longer counts."""
    spec_inits = (pod.get("spec") or {}).get("initContainers") or []
    if not spec_inits:
        return False
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if len(statuses) < len(spec_inits):
        return False
    for s in statuses:
        term = (s.get("state") or {}).get("terminated")
        if not term or term.get("exitCode") != 0:
            return False
    return True


def pod_usage(pod: dict, mig: tuple[tuple[str, int], ...] = ()) -> PodUsage | None:
    """Usage of a pod carrying ``hami.io/vgpu-node``; None when it has none or is terminated."""
    md = pod.get("metadata") or {}
    ann = md.get("annotations") or {}
    node = ann.get(keys.VGPU_NODE)
    if not node or is_terminated(pod):
        return None
    uid, ns, name = pod_key(pod)
    raw = ann.get(keys.DEVICES_ALLOCATED, "")
    try:
        containers = decode_pod_devices(raw) if raw else []
    except ProtocolError as exc:
        logger.error("pod %s/%s: cannot decode %s: %s", ns, name, keys.DEVICES_ALLOCATED, exc)
        containers = []
    spec = pod.get("spec") or {}
    n_init = len(spec.get("initContainers") or [])
    n_all = n_init + len(spec.get("containers") or [])
    if containers and len(containers) != n_all:
        # HAMi v2.10 may drop the empty placeholders (reference §10): we cannot tell init from app
        # entries, so count everything as app usage (never under-counts).
        log.v(logger, 3, "pod %s/%s: %s has %d container entries for %d containers; counting all as app",
              ns, name, keys.DEVICES_ALLOCATED, len(containers), n_all)
        n_init = 0
    elif init_done(pod):
        containers = [[] if i < n_init else c for i, c in enumerate(containers)]
    return PodUsage(uid=uid, namespace=ns, name=name, node=node, devices=collapse(containers, n_init),
                    mig=mig)
