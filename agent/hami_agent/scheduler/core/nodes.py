"""A node as the decision sees it (``NodeState``: its devices and their usage), its devices from the register
annotation, and HAMi's handshake rules (§1.2)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime

from hami_agent import log
from hami_agent.protocol import (
    MigProfile,
    ProtocolError,
    decode_node_devices,
    format_requesting,
    is_requesting,
    keys,
    parse_device_cordon,
    parse_handshake,
)
from hami_agent.protocol.handshake import HANDSHAKE_TIMEOUT, KIND_REQUESTING
from hami_agent.protocol.quantity import quantity_int
from hami_agent.protocol.score import decode_pair_scores
from hami_agent.scheduler.core.fit import NodeExtras
from hami_agent.scheduler.core.model import DeviceUsage, PodUsage
from hami_agent.scheduler.core.prefit import NodeSummary

logger = logging.getLogger(__name__)

DELETE = object()  # handshake patch sentinel: delete the annotation


@dataclass
class NodeState:
    name: str
    devices: list[DeviceUsage]
    extras: NodeExtras = field(default_factory=NodeExtras)
    mig_capacity: dict[str, int] = field(default_factory=dict)
    mig_used: dict[str, int] = field(default_factory=dict)
    score: float = 0.0
    by_id: dict[str, DeviceUsage] = field(default_factory=dict)
    summary: NodeSummary | None = None  # prefit's, computed on demand; None again after every change
    # core/fitclass.py device_profile of each device (the usage cache sets them on every change; none on a
    # node with a MIG-mode GPU)
    profiles: tuple[str, ...] = ()
    state_key: str | None = None  # core/fitclass.py state_key, cached by the usage cache until a change

    def __post_init__(self) -> None:
        self.by_id = {d.id: d for d in self.devices}

    def copy(self) -> NodeState:
        """A what-if copy: its devices and MIG counts can change without touching this one."""
        return NodeState(self.name, [d.clone() for d in self.devices], self.extras, dict(self.mig_capacity),
                         dict(self.mig_used))


def apply_pod(st: NodeState, pod: PodUsage, sign: int) -> int:
    """Add (``sign`` +1) or take away (-1) a pod's usage on its node's state (the usage cache and the
    preemption dry run share it). Returns how many of its devices the node does not have (counted only
    when adding)."""
    unknown = 0
    for uuid, a in pod.devices.items():
        d = st.by_id.get(uuid)
        if d is None:
            if sign > 0:
                unknown += 1
                log.v(logger, 3, "pod %s/%s: allocation on unknown device %s of node %s ignored",
                      pod.namespace, pod.name, uuid, st.name)
            continue
        d.used += sign * max(a.slots, 1)
        d.usedmem += sign * a.mem
        d.usedcores += sign * a.cores
    for profile, n in pod.mig:
        st.mig_used[profile] = st.mig_used.get(profile, 0) + sign * n
    if pod.mig_alloc or any(d.mode == keys.MODE_MIG for uuid in pod.devices
                            if (d := st.by_id.get(uuid)) is not None):
        _apply_mig(st, pod, sign)
    return unknown


def _apply_mig(st: NodeState, pod: PodUsage, sign: int) -> None:
    """Dynamic MIG reservations of a pod, with HAMi's consistency rules (``getNodesUsage`` in
    Project-HAMi/HAMi ``pkg/scheduler/scheduler.go``): the placements a pod reserves occupy its MIG
    GPU; a MIG GPU the pod uses without a reservation (the instance it expects is missing), a
    reservation on a GPU that is not in MIG mode, or one on a GPU the node does not have, make the
    GPU(s) unhealthy until that pod is gone."""
    faults: set[str] = set()
    for uuid in pod.devices:
        d = st.by_id.get(uuid)
        if d is None:
            continue
        has = bool(pod.mig_alloc.get(uuid))
        if d.mode == keys.MODE_MIG and not has:
            faults.add(uuid)
            if sign > 0:
                logger.error("MIG Pod lacks a matching profile/placement reservation: pod %s/%s gpu %s",
                             pod.namespace, pod.name, uuid)
        elif d.mode == keys.MODE_HAMI_CORE and has:
            faults.add(uuid)
            if sign > 0:
                logger.error("found a mig task running on a hami-core GPU: pod %s/%s gpu %s",
                             pod.namespace, pod.name, uuid)
    for uuid, placements in pod.mig_alloc.items():
        d = st.by_id.get(uuid)
        if d is None:
            faults.update(x.id for x in st.devices if x.mode == keys.MODE_MIG)
            if sign > 0:
                logger.error("unconsumed MIG reservations reference an unknown device: pod %s/%s gpu %s",
                             pod.namespace, pod.name, uuid)
            continue
        if d.mode != keys.MODE_MIG:
            faults.add(uuid)
            continue
        if sign > 0:
            d.mig_used = (*d.mig_used, *placements)
        else:
            left = list(d.mig_used)
            for pl in placements:
                if pl in left:
                    left.remove(pl)
            d.mig_used = tuple(left)
    for uuid in faults:
        st.by_id[uuid].mig_faults += sign


def annotations(obj: dict) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def node_devices(node: dict) -> list[DeviceUsage] | None:
    """Devices of the register annotation; None when absent or malformed (logged)."""
    name = (node.get("metadata") or {}).get("name", "?")
    raw = annotations(node).get(keys.NODE_REGISTER)
    if not raw:
        return None
    try:
        devs = decode_node_devices(raw)
    except ProtocolError as exc:
        logger.error("node %s: cannot decode %s: %s", name, keys.NODE_REGISTER, exc)
        return None
    out = []
    for d in devs:
        out.append(DeviceUsage(id=d.id, index=d.index, type=d.type, count=d.count, totalmem=d.devmem,
                               totalcore=d.devcore, numa=d.numa, health=d.health, mode=d.mode or "",
                               mig_profiles=_usable_profiles(d.mig_profiles)))
    return out


def _usable_profiles(profiles: tuple[MigProfile, ...]) -> tuple[MigProfile, ...]:
    """Placements that occupy no memory slice (size <= 0) or start before slice 0 are dropped: they
    would "fit" next to anything, and HAMi's Fit, which re-examines a MIG GPU until no placement is
    left, would never finish on them."""
    out = []
    for p in profiles:
        ok = tuple(pl for pl in p.placements if pl.size > 0 and pl.start >= 0)
        out.append(p if len(ok) == len(p.placements) else replace(p, placements=ok))
    return tuple(out)


def mig_capacity(devices: list[DeviceUsage]) -> dict[str, int]:
    """Static MIG instances per profile from the register annotation: for mig-mode GPUs, each
    published profile contributes its number of placements (the plugin publishes existing instances)."""
    cap: dict[str, int] = {}
    for d in devices:
        if d.mode != keys.MODE_MIG:
            continue
        for p in d.mig_profiles:
            cap[p.name] = cap.get(p.name, 0) + len(p.placements)
    return cap


def node_extras(node: dict) -> NodeExtras:
    a = annotations(node)
    pairs: dict[str, dict[str, int]] = {}
    raw = a.get(keys.NODE_SCORE)
    if raw:
        try:
            pairs = decode_pair_scores(raw)
        except ProtocolError as exc:  # as HAMi: a score list that does not decode is not used at all
            log.v(logger, 3, "node %s: ignoring malformed %s: %s",
                  (node.get("metadata") or {}).get("name"), keys.NODE_SCORE, exc)
    return NodeExtras(cordoned=parse_device_cordon(a.get(keys.DEVICE_CORDON)), pair_scores=pairs)


def allocatable_gpus(node: dict, resource: str = keys.RESOURCE_COUNT) -> int:
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if raw is None:
        return 0
    try:
        return quantity_int(raw, f"allocatable {resource}")
    except ProtocolError:
        return 0


@dataclass
class HandshakeVerdict:
    healthy: bool
    patch: object | None = None  # str to write, DELETE, or None
    reason: str = ""


@dataclass
class HandshakeTracker:
    """Per-node memory of HAMi's NVIDIA ``CheckHealth`` wrapper: last allocatable count."""

    resource: str = keys.RESOURCE_COUNT
    last_alloc: dict[str, int] = field(default_factory=dict)

    def check(self, node: dict, now: datetime) -> HandshakeVerdict:
        name = (node.get("metadata") or {}).get("name", "?")
        alloc = allocatable_gpus(node, self.resource)
        prev = self.last_alloc.get(name)
        self.last_alloc[name] = alloc
        if prev is not None and prev > 0 and alloc == 0:
            return HandshakeVerdict(False, DELETE, f"allocatable {self.resource} dropped from {prev} to 0")
        value = annotations(node).get(keys.NODE_HANDSHAKE)
        if not is_requesting(value):
            return HandshakeVerdict(True, format_requesting(now))
        try:
            hs = parse_handshake(value)
        except ProtocolError:
            return HandshakeVerdict(True)  # unparsable counts as healthy (HAMi)
        if hs.kind != KIND_REQUESTING or hs.when is None:
            return HandshakeVerdict(True)
        if now < hs.when + HANDSHAKE_TIMEOUT:
            return HandshakeVerdict(True)
        if alloc > 0:
            return HandshakeVerdict(True)
        return HandshakeVerdict(False, DELETE, f"allocatable {self.resource} is 0 more than "
                                f"{int(HANDSHAKE_TIMEOUT.total_seconds())}s after {value}")

    def forget(self, name: str) -> None:
        self.last_alloc.pop(name, None)
