"""Invariant checker: is the cluster's GPU allocation state consistent? From the API server's objects
alone (nodes and pods as dicts), optionally with what Allocate handed out (as the kubelet saw it) and the
scheduler's usage cache, it finds:

==========================  ===========================================================================
``overcommit-memory``       a GPU whose bound pods were promised more memory than it has
``overcommit-cores``        ... more cores (``gpucores``) than its ``devcore``
``overcommit-slots``        ... more pods than its split ``count`` (registered in ``node-nvidia-register``)
``exclusive-shared``        a GPU given to a pod with 100 cores (exclusive) and to another pod as well
``unknown-device``          an allocation on a device the node did not register
``bound-elsewhere``         a pod bound to a node other than its ``hami.io/vgpu-node``
``allocated-not-bound``     ``bind-phase=success`` on a pod that is not bound (it never got devices)
``allocated-no-devices``    ``bind-phase=success`` but Allocate's record has no devices for the pod
``allocate-mismatch``       devices or limits handed out by Allocate that differ from the annotation
``stale-lock``              a node lock held by a pod that no longer needs it (gone, finished, bound
                            elsewhere, already allocated) or older than the lock expiry
``cache-drift``             the scheduler cache counts a pod differently from its annotations
``undecodable-allocation``  a pod's ``hami.io/vgpu-devices-allocated`` (or ``vgpu-node``) does not decode
==========================  ===========================================================================

Over-commits are counted over pods *bound* to the node their annotation names and not finished: those
hold devices. Pending pods with an assignment are reservations; they are listed in the report's
``counts["reservations"]`` and, with ``include_pending=True``, counted as well.

It lives in the product (not only in tests) because it is the check an operator wants after an incident
("is anything over-committed right now?"): ``hami-agent doctor invariants`` runs it over a live cluster
(two list calls) or a ``kubectl get nodes,pods -A -o json`` dump; the tests and the chaos soak run the
same code. Use :func:`check` for a report and :func:`assert_invariants` in tests. ``KIND_DOCS`` says what
each kind means and how to fix it (``docs/runbooks/invariants/<kind>.md`` is rendered from it).

Objects are read defensively (a dump file may hold anything): a field of an unexpected type counts as
absent, an annotation that does not decode is reported, nothing raises.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from hami_agent.protocol import ProtocolError, decode_node_devices, decode_pod_devices, keys
from hami_agent.protocol.nodelock import DEFAULT_LOCK_EXPIRY, parse_lock_value
from hami_agent.scheduler.state.podinfo import init_done

TERMINATED = ("Succeeded", "Failed")
EXCLUSIVE_CORES = 100


@dataclass(frozen=True)
class Violation:
    kind: str
    subject: str  # "node/uuid", "ns/pod" or "node"
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.detail}"


@dataclass
class InvariantReport:
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # what was checked: pods, bound, gpus, ...

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for v in self.violations:
            out[v.kind] += 1
        return dict(out)

    def summary(self, limit: int = 20) -> str:
        head = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        if self.ok:
            return f"invariants hold ({head})"
        lines = [f"{len(self.violations)} invariant violations {self.by_kind()} ({head}):"]
        lines += [f"  {v}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more")
        return "\n".join(lines)

    def add(self, kind: str, subject: str, detail: str) -> None:
        self.violations.append(Violation(kind, subject, detail))


def _md(obj: Mapping) -> Mapping:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _ann(obj: Mapping) -> Mapping:
    a = _md(obj).get("annotations")
    return a if isinstance(a, Mapping) else {}


def _spec(obj: Mapping) -> Mapping:
    s = obj.get("spec")
    return s if isinstance(s, Mapping) else {}


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _key(pod: Mapping) -> str:
    return f"{_md(pod).get('namespace', '')}/{_md(pod).get('name', '')}"


def _finished(pod: Mapping) -> bool:
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in TERMINATED


def _containers(pod: Mapping) -> list[str]:
    spec = _spec(pod)
    names = []
    for part in ("initContainers", "containers"):
        ctrs = spec.get(part)
        for c in ctrs if isinstance(ctrs, list) else []:
            names.append(c.get("name", "") if isinstance(c, Mapping) else "")
    return names


def check(nodes: Iterable[Mapping], pods: Iterable[Mapping], *,
          allocations: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
          cache: Any = None, cache_usage: Any = None, now: datetime | None = None,
          lock_expiry: timedelta = DEFAULT_LOCK_EXPIRY, include_pending: bool = False) -> InvariantReport:
    """Check the invariants.

    ``allocations``: what Allocate handed out, ``{pod uid: {container name: envs}}`` (the kubelet
    simulator's admission results, or a node's ``kubectl exec env`` in a live cluster).
    ``cache``: the scheduler's ``UsageCache`` (its ``pods``) with ``cache_usage(pod) -> PodUsage | None``,
    the scheduler's rule for what a pod should count (``scheduler.podinfo.countable_usage``).
    ``now``: for lock expiry (default: the current UTC time)."""
    rep = InvariantReport()
    devices: dict[str, dict[str, Any]] = {}  # node -> uuid -> NodeDevice
    nodes = [n for n in nodes if isinstance(n, Mapping)]
    pods = [p for p in pods if isinstance(p, Mapping)]
    for n in nodes:
        raw = _str(_ann(n).get(keys.NODE_REGISTER))
        try:
            devices[_str(_md(n).get("name"))] = {d.id: d for d in decode_node_devices(raw)} if raw else {}
        except ProtocolError:
            devices[_str(_md(n).get("name"))] = {}
    by_key = {_key(p): p for p in pods}
    used_mem: dict[tuple[str, str], int] = defaultdict(int)
    used_cores: dict[tuple[str, str], int] = defaultdict(int)
    used_slots: dict[tuple[str, str], int] = defaultdict(int)
    holders: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)  # (node,uuid) -> (pod, cores)
    n_bound = n_reserved = 0
    for p in pods:
        ann, spec, key = _ann(p), _spec(p), _key(p)
        node = _str(ann.get(keys.VGPU_NODE))
        bound = _str(spec.get("nodeName"))
        phase = ann.get(keys.BIND_PHASE)
        if phase == keys.BIND_PHASE_SUCCESS and not bound:
            rep.add("allocated-not-bound", key, f"{keys.BIND_PHASE}=success but the pod is not bound")
        if not node or _finished(p):
            continue
        if bound and bound != node:
            rep.add("bound-elsewhere", key, f"bound to {bound} but {keys.VGPU_NODE} is {node}")
            continue
        if not bound:
            n_reserved += 1
            if not include_pending:
                continue
        else:
            n_bound += 1
        try:
            ctrs = decode_pod_devices(_str(ann.get(keys.DEVICES_ALLOCATED)))
        except ProtocolError as exc:
            rep.add("undecodable-allocation", key, f"undecodable {keys.DEVICES_ALLOCATED}: {exc}")
            continue
        inits = _spec(p).get("initContainers")
        n_init = len(inits) if isinstance(inits, list) else 0
        if init_done(p):  # finished init containers hold nothing any more (the scheduler's rule too)
            ctrs = [[] if i < n_init else c for i, c in enumerate(ctrs)]
        for uuid, mem, cores, slots in _collapse_for_check(ctrs, n_init):
            if uuid not in devices.get(node, {}):
                rep.add("unknown-device", key, f"{uuid} is not a registered GPU of node {node}")
                continue
            used_mem[(node, uuid)] += mem
            used_cores[(node, uuid)] += cores
            used_slots[(node, uuid)] += slots
            holders[(node, uuid)].append((key, cores))
    for node, devs in devices.items():
        for uuid, d in devs.items():
            k = (node, uuid)
            subject = f"{node}/{uuid}"
            if used_mem[k] > d.devmem:
                rep.add("overcommit-memory", subject, f"{used_mem[k]} MiB promised of {d.devmem} MiB "
                        f"({', '.join(h for h, _ in holders[k])})")
            if used_cores[k] > d.devcore:
                rep.add("overcommit-cores", subject, f"{used_cores[k]} cores promised of {d.devcore}")
            if used_slots[k] > d.count:
                rep.add("overcommit-slots", subject, f"{used_slots[k]} slots used of {d.count}")
            if len(holders[k]) > 1 and any(c >= EXCLUSIVE_CORES for _h, c in holders[k]):
                rep.add("exclusive-shared", subject, "an exclusive (100-core) pod shares its GPU with "
                        f"{', '.join(h for h, _ in holders[k])}")
    _check_allocations(rep, pods, allocations)
    _check_locks(rep, nodes, by_key, now or datetime.now(timezone.utc), lock_expiry)
    if cache is not None and cache_usage is not None:
        _check_cache(rep, pods, cache, cache_usage)
    rep.counts.update(pods=len(pods), bound=n_bound, reservations=n_reserved,
                      gpus=sum(len(d) for d in devices.values()))
    return rep


def _collapse_for_check(ctrs: list, n_init: int) -> list[tuple[str, int, int, int]]:
    """Per GPU of one pod (uuid, memory, cores, slots): memory/cores = max(max over init containers, sum
    over app containers), slots = app containers on it (1 when only init containers use it) — HAMi's
    accounting (Project-HAMi/HAMi pkg/device/pods.go, pkg/device/initContainer.go): init containers run before
    the app containers, never with them.
    Written out here rather than imported from the scheduler so the check does not trust the code it
    checks."""
    init: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}
    for i, c in enumerate(ctrs):
        for d in c:
            if i < n_init:
                m = init.setdefault(d.uuid, [0, 0, 1])
                m[0], m[1] = max(m[0], d.usedmem), max(m[1], d.usedcores)
            else:
                m = app.setdefault(d.uuid, [0, 0, 0])
                m[0] += d.usedmem
                m[1] += d.usedcores
                m[2] += 1
    out = []
    for uuid in init.keys() | app.keys():
        i, a = init.get(uuid, [0, 0, 0]), app.get(uuid, [0, 0, 0])
        out.append((uuid, max(i[0], a[0]), max(i[1], a[1]), a[2] or 1))
    return out


def _check_allocations(rep: InvariantReport, pods: list[Mapping],
                       allocations: Mapping[str, Mapping[str, Mapping[str, str]]] | None) -> None:
    if allocations is None:
        return
    for p in pods:
        uid, key, ann = _str(_md(p).get("uid")), _key(p), _ann(p)
        got = allocations.get(uid)
        if ann.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS and not got:
            rep.add("allocated-no-devices", key, f"{keys.BIND_PHASE}=success but Allocate handed it nothing")
        if not got:
            continue
        try:
            want = decode_pod_devices(_str(ann.get(keys.DEVICES_ALLOCATED)))
        except ProtocolError:
            want = []
        names = _containers(p)
        for cname, envs in got.items():
            idx = names.index(cname) if cname in names else -1
            expect = want[idx] if 0 <= idx < len(want) else []
            handed = [u for u in (envs.get("NVIDIA_VISIBLE_DEVICES") or "").split(",") if u]
            if sorted(handed) != sorted(d.uuid for d in expect):
                rep.add("allocate-mismatch", f"{key}/{cname}",
                        f"Allocate handed {handed} but the annotation says {[d.uuid for d in expect]}")
                continue
            for i, d in enumerate(expect):
                lim = envs.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}")
                if lim is not None and lim != f"{d.usedmem}m":
                    rep.add("allocate-mismatch", f"{key}/{cname}",
                            f"device {i} memory limit {lim}, annotation {d.usedmem}m")
            sm = envs.get("CUDA_DEVICE_SM_LIMIT")
            if sm is not None and expect and sm != str(expect[0].usedcores):
                rep.add("allocate-mismatch", f"{key}/{cname}",
                        f"SM limit {sm}, annotation {expect[0].usedcores}")


def _check_locks(rep: InvariantReport, nodes: Iterable[Mapping], by_key: Mapping[str, Mapping], now: datetime,
                 expiry: timedelta) -> None:
    for n in nodes:
        name = _str(_md(n).get("name"))
        raw = _str(_ann(n).get(keys.NODE_LOCK))
        if not raw:
            continue
        try:
            lock = parse_lock_value(raw)
        except ProtocolError as exc:
            rep.add("stale-lock", name, f"unparsable lock {raw!r}: {exc}")
            continue
        if lock.expired(now, expiry):
            rep.add("stale-lock", name, f"lock {raw!r} is older than {expiry}")
            continue
        if not lock.has_owner:
            continue
        owner = by_key.get(f"{lock.namespace}/{lock.name}")
        why = ""
        if owner is None:
            why = "owner pod is gone"
        elif _finished(owner):
            why = "owner pod has finished"
        else:
            bound = _spec(owner).get("nodeName")
            phase = _ann(owner).get(keys.BIND_PHASE)
            if bound and bound != name:
                why = f"owner pod is bound to {bound}"
            elif bound == name and phase in (keys.BIND_PHASE_SUCCESS, keys.BIND_PHASE_FAILED):
                why = f"owner pod is already allocated ({keys.BIND_PHASE}={phase})"
        if why:
            rep.add("stale-lock", name, f"lock {raw!r}: {why}")


def _check_cache(rep: InvariantReport, pods: list[Mapping], cache: Any, cache_usage: Any) -> None:
    cached = dict(getattr(cache, "pods", cache))
    for p in pods:
        uid = _str(_md(p).get("uid"))
        want = cache_usage(p)
        have = cached.pop(uid, None)
        w = None if want is None else (want.node, want.devices)
        h = None if have is None else (have.node, have.devices)
        if w != h:
            rep.add("cache-drift", _key(p), f"cache counts {h}, the annotations say {w}")
    for uid, have in cached.items():
        rep.add("cache-drift", f"{have.namespace}/{have.name}", f"cache counts {have.node} {have.devices} "
                f"for uid {uid}, which no live pod has")


def assert_invariants(nodes: Iterable[Mapping], pods: Iterable[Mapping], **kw: Any) -> InvariantReport:
    """:func:`check`, raising ``AssertionError`` with the report's summary when anything is violated."""
    rep = check(nodes, pods, **kw)
    if not rep.ok:
        raise AssertionError(rep.summary())
    return rep


__all__ = ["InvariantReport", "Violation", "assert_invariants", "check"]
