"""Evidence from the Kubernetes API: the pod (spec, annotations, events) and its node (HAMi annotations
decoded, handshake age, lock owner and age, allocatable vs capacity, cordon)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hami_agent.doctor import logscan
from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.model import Facts
from hami_agent.protocol import (
    ProtocolError,
    container_requests,
    decode_node_devices,
    decode_pod_devices,
    keys,
    parse_device_cordon,
    parse_handshake,
    parse_lock_value,
    pod_devices_remaining,
)
from hami_agent.protocol.reasons import (
    ALL_REASONS,
    DEVICE_TYPE_NOT_FOUND,
    NODE_UNREGISTERED,
)
from hami_agent.protocol.requests import pod_requests_gpu

GPU = keys.RESOURCE_COUNT
_REASON_WORD = re.compile(r"\b(" + "|".join(sorted(ALL_REASONS, key=len, reverse=True)) + r")\b")
_LEGACY_REASONS = {NODE_UNREGISTERED: "NodeUnregistered", DEVICE_TYPE_NOT_FOUND: "DeviceTypeNotFound"}
# Events about a pod that come from the kubelet (seed 003: a stalled kubelet posts none)
KUBELET_SOURCES = ("kubelet",)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _age_s(ctx: Context, when: datetime | None) -> float | None:
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return (ctx.now - when).total_seconds()


def _int_quantity(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def reasons_in(message: str) -> list[str]:
    """HAMi reason words in an event or condition message: ``1/1 CardInsufficientMemory``,
    ``1 nodes CardInsufficientMemory(gpu-1)``, ``Bindingfailed: CardInsufficientMemory on node ...``."""
    found = [m.group(1) for m in _REASON_WORD.finditer(message)]
    found += [word for text, word in _LEGACY_REASONS.items() if text in message]
    out: list[str] = []
    for r in found:
        if r not in out:
            out.append(r)
    return out


# ------------------------------------------------------------------------------------- cluster view
@dataclass
class ClusterView:
    """What ``doctor cluster`` reads from the API: three paginated lists (nodes, pods, pod events),
    whatever the size of the cluster. The per-node and per-pod collectors read this instead of making
    calls of their own (a GET per node, a list of each node's pods and of each pod's events made the number
    of calls grow with the cluster: 3,000+ calls at 1,000 nodes)."""

    nodes: dict[str, dict] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict] = field(default_factory=dict)
    pods_by_node: dict[str, list[dict]] = field(default_factory=dict)
    events_by_pod: dict[tuple[str, str], list[dict]] = field(default_factory=dict)
    lists: int = 0

    def pending_pods(self) -> list[dict]:
        out = [p for p in self.pods.values() if (p.get("status") or {}).get("phase", "Pending") == "Pending"]
        return sorted(out, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "",
                                          (p.get("metadata") or {}).get("namespace") or "",
                                          (p.get("metadata") or {}).get("name") or ""))


def list_cluster(client: Any) -> ClusterView:
    view = ClusterView()
    nodes, _ = client.list("nodes")
    pods, _ = client.list("pods")
    events, _ = client.list("events", field_selector="involvedObject.kind=Pod")
    view.lists = 3
    view.nodes = {(n.get("metadata") or {}).get("name", ""): n for n in nodes}
    by_node: dict[str, list[dict]] = defaultdict(list)
    for p in pods:
        md = p.get("metadata") or {}
        view.pods[(md.get("namespace") or "default", md.get("name") or "")] = p
        node = (p.get("spec") or {}).get("nodeName")
        if node:
            by_node[node].append(p)
    view.pods_by_node = dict(by_node)
    by_pod: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for e in events:
        io = e.get("involvedObject") or {}
        by_pod[(io.get("namespace") or "default", io.get("name") or "")].append(e)
    view.events_by_pod = dict(by_pod)
    return view


# ------------------------------------------------------------------------------------ admission guard
GUARD_POLICIES = ("hami-allocation-keys", "hami-scheduled-gpu-pods")
GUARD_WEBHOOK = "allocation-guard.hami.io"


def collect_admission_guard(ctx: Context, facts: Facts) -> None:
    """Is the allocation guard installed (docs/security.md "Safe as installed")? The bindings of the
    admission policies, or, on a cluster that does not serve ValidatingAdmissionPolicy (404), the guard
    webhook. Two lists; a refusal (403) leaves the question open."""
    from hami_agent.k8s import NotFoundError

    if ctx.client is None:
        raise RuntimeError(ctx.kube_error or "no Kubernetes client")
    try:
        bindings, _ = ctx.client.list("validatingadmissionpolicybindings")
        served = True
    except NotFoundError:  # Kubernetes older than 1.30, or the API disabled
        bindings, served = [], False
    bound = sorted({(b.get("spec") or {}).get("policyName", "") for b in bindings} & set(GUARD_POLICIES))
    configs, _ = ctx.client.list("validatingwebhookconfigurations")
    hooks = [(c.get("metadata") or {}).get("name", "") for c in configs
             if any(w.get("name") == GUARD_WEBHOOK and (w.get("failurePolicy") or "Fail") == "Fail"
                    for w in c.get("webhooks") or [])]
    missing = [p for p in GUARD_POLICIES if p not in bound]
    facts.set("admission.vap_served", served,
              "the API server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy" if served else
              "the API server does not serve ValidatingAdmissionPolicy (404): Kubernetes older than 1.30")
    facts.set("admission.policies_bound", bound,
              f"ValidatingAdmissionPolicyBindings of the guard: {', '.join(bound) or 'none'}"
              + (f" (missing: {', '.join(missing)})" if missing and served else ""))
    facts.set("admission.guard_webhook", hooks,
              f"guard webhook ({GUARD_WEBHOOK}, failurePolicy Fail): {', '.join(hooks) or 'not registered'}")
    facts.set("admission.missing", [] if hooks or not missing else missing)
    facts.set("admission.missing_names", ", ".join(missing) or "none")


# ----------------------------------------------------------------------------------------------- pod
def _get_pod(ctx: Context, ns: str, name: str) -> dict:
    """The pod from the cluster view (doctor cluster) or the API; ``NotFoundError`` when it is gone."""
    from hami_agent.k8s import NotFoundError

    if ctx.view is not None:
        pod = ctx.view.pods.get((ns, name))
        if pod is None:
            raise NotFoundError(404, "NotFound", f'pods "{name}" not found', "get", "pod", f"{ns}/{name}")
        return pod
    return ctx.client.get_pod(ns, name)


def collect_pod(ctx: Context, facts: Facts) -> None:
    if ctx.client is None:
        raise RuntimeError(ctx.kube_error or "no Kubernetes client")
    ns, name = ctx.pod_ns or "default", ctx.pod_name or ""
    ref = f"{ns}/{name}"
    facts.set("pod.ref", ref)
    from hami_agent.k8s import NotFoundError

    try:
        pod = _get_pod(ctx, ns, name)
    except NotFoundError as exc:
        facts.set("pod.found", False, f"get pod {ref}: {exc}")
        return
    facts.set("pod.found", True)
    pod_facts(ctx, pod, facts)
    if ctx.view is not None:
        events = list(ctx.view.events_by_pod.get((ns, name), ()))
    else:
        events, _rv = ctx.client.list("events", ns, field_selector=f"involvedObject.name={name}")
    uid = (pod.get("metadata") or {}).get("uid")
    events = [e for e in events if not uid or (e.get("involvedObject") or {}).get("uid") in (None, "", uid)]
    event_facts(events, facts)


def pod_facts(ctx: Context, pod: dict, facts: Facts) -> None:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ann = meta.get("annotations") or {}
    ref = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    facts.set("pod.ref", ref)
    facts.set("pod.uid", meta.get("uid", ""))
    phase = status.get("phase", "")
    facts.set("pod.phase", phase, f"pod {ref} phase={phase or '?'}")
    facts.set("pod.node_name", spec.get("nodeName") or None,
              f"pod {ref} spec.nodeName={spec.get('nodeName') or '(not bound)'}")
    sched = spec.get("schedulerName") or "default-scheduler"
    facts.set("pod.scheduler_name", sched, f"pod {ref} spec.schedulerName={sched}")
    facts.set("pod.expected_scheduler", ctx.scheduler_name)
    facts.set("pod.terminating", bool(meta.get("deletionTimestamp")))
    facts.set("pod.age_s", _age_s(ctx, _parse_time(meta.get("creationTimestamp"))))
    requests = [r for r in container_requests(pod, ctx.config) if r.nums > 0]
    summary = [f"{'init ' if r.init else ''}container {r.container}: {r.nums} x {r.type}"
               f"{f', gpumem {r.memreq}MiB' if r.memreq else ''}"
               f"{f', gpucores {r.coresreq}' if r.coresreq else ''}" for r in requests]
    facts.set("pod.hami_requests", summary, *(f"pod {ref} requests {s}" for s in summary))
    facts.set("pod.requests_hami", bool(requests),
              *([] if requests else [f"pod {ref} requests no {GPU} (no HAMi-managed resource)"]))
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            text = f"pod {ref} condition PodScheduled={cond.get('status')} reason={cond.get('reason', '')}"
            if cond.get("message"):
                text += f" message={cond['message']!r}"
            facts.set("pod.scheduled_condition", cond.get("status"), text)
            facts.set("pod.condition_reasons", reasons_in(cond.get("message") or ""))
    # HAMi annotations (reference hami.md §2)
    vnode = ann.get(keys.VGPU_NODE)
    facts.set("pod.vgpu_node", vnode, *( [f"pod {ref} {keys.VGPU_NODE}={vnode}"] if vnode else []))
    phase_ann = ann.get(keys.BIND_PHASE)
    facts.set("pod.bind_phase", phase_ann,
              *([f"pod {ref} {keys.BIND_PHASE}={phase_ann}"] if phase_ann else []))
    bind_time = _int_quantity(ann.get(keys.BIND_TIME))
    if bind_time is not None:
        age = ctx.now.timestamp() - bind_time
        facts.set("pod.bind_age_s", age, f"pod {ref} {keys.BIND_TIME}={bind_time} ({age:.0f}s ago)")
    to_alloc = ann.get(keys.DEVICES_TO_ALLOCATE)
    if to_alloc is not None:
        try:
            remaining = pod_devices_remaining(decode_pod_devices(to_alloc))
            facts.set("pod.to_allocate_remaining", remaining,
                      f"pod {ref} {keys.DEVICES_TO_ALLOCATE}={to_alloc!r}")
        except ProtocolError as exc:
            facts.set("pod.to_allocate_error", str(exc), f"pod {ref} {keys.DEVICES_TO_ALLOCATE}: {exc}")
    allocated = ann.get(keys.DEVICES_ALLOCATED)
    if allocated is not None:
        facts.set("pod.allocated", allocated, f"pod {ref} {keys.DEVICES_ALLOCATED}={allocated!r}")
    disabled = []
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        for env in c.get("env") or []:
            if env.get("name") == "CUDA_DISABLE_CONTROL" and str(env.get("value", "")).lower() == "true":
                disabled.append(c.get("name", "?"))
    facts.set("pod.control_disabled", disabled,
              *(f"pod {ref} container {c} sets CUDA_DISABLE_CONTROL=true: HAMi skips the "
                f"/etc/ld.so.preload mount, libvgpu.so is not loaded" for c in disabled))


def event_facts(events: list[dict], facts: Facts) -> None:
    def when(e: dict) -> str:
        return e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or ""

    events = sorted(events, key=when)
    lines = []
    by_reason: dict[str, list[str]] = {}
    hami_reasons: list[str] = []
    kubelet_events = 0
    for e in events:
        src = (e.get("source") or {}).get("component") or e.get("reportingComponent") or ""
        msg = e.get("message") or ""
        line = f"event {e.get('type', '')} {e.get('reason', '')} from {src or '?'}: {msg}"
        lines.append(line)
        by_reason.setdefault(e.get("reason", ""), []).append(line)
        if src in KUBELET_SOURCES:
            kubelet_events += 1
        if e.get("reason") in ("FilteringFailed", "FailedScheduling", "BindingFailed"):
            for r in reasons_in(msg):
                if r not in hami_reasons:
                    hami_reasons.append(r)
    facts.set("events.count", len(events), *lines)
    facts.set("events.kubelet", kubelet_events)
    for reason, key in (("FilteringFailed", "filtering_failed"), ("FilteringSucceed", "filtering_succeed"),
                        ("BindingFailed", "binding_failed"), ("BindingSucceed", "binding_succeed"),
                        ("Scheduled", "scheduled"), ("FailedScheduling", "failed_scheduling")):
        got = by_reason.get(reason, [])
        facts.set(f"events.{key}", len(got), *got)
    allocate = [ln for ln in lines if "UnexpectedAdmissionError" in ln or "Allocate failed" in ln]
    facts.set("events.allocate_errors", len(allocate), *allocate)
    mismatch = [ln for ln in lines if "device number not matched" in ln]
    facts.set("events.device_number_mismatch", len(mismatch), *mismatch)
    for key, pattern in logscan.ALLOCATE_REFUSAL_PATTERNS.items():  # the plugin's refusal, as the kubelet
        refused = [ln for ln in allocate if re.search(pattern, ln)]  # reported it
        facts.set(f"events.{key}", len(refused), *refused)
    reason_lines = [ln for ln in lines if any(r in ln for r in hami_reasons)]
    facts.set("events.hami_reasons", hami_reasons, *reason_lines)


# ---------------------------------------------------------------------------------------------- node
def collect_node(ctx: Context, facts: Facts) -> None:
    if ctx.client is None:
        raise RuntimeError(ctx.kube_error or "no Kubernetes client")
    if not ctx.node_name:
        raise RuntimeError("no node name: the pod is not bound and has no hami.io/vgpu-node annotation")
    from hami_agent.k8s import NotFoundError

    try:
        if ctx.view is not None:
            node = ctx.view.nodes.get(ctx.node_name)
            if node is None:
                raise NotFoundError(404, "NotFound", f'nodes "{ctx.node_name}" not found', "get", "node",
                                    ctx.node_name)
        else:
            node = ctx.client.get_node(ctx.node_name)
    except NotFoundError as exc:
        facts.set("node.found", False, f"get node {ctx.node_name}: {exc}")
        return
    facts.set("node.found", True)
    node_facts(ctx, node, facts)
    lock_owner_facts(ctx, facts)
    allocating_pods_facts(ctx, facts)


def node_facts(ctx: Context, node: dict, facts: Facts) -> None:  # noqa: PLR0914
    meta = node.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = node.get("status") or {}
    name = meta.get("name", "")
    facts.set("node.name", name)
    facts.set("node.unschedulable", bool((node.get("spec") or {}).get("unschedulable")))
    # register annotation (§1.1)
    raw = ann.get(keys.NODE_REGISTER)
    facts.set("node.register.present", bool(raw),
              f"node {name} {keys.NODE_REGISTER}: " + ("present" if raw else "absent or empty"))
    devices: list[dict] = []
    if raw:
        try:
            decoded = decode_node_devices(raw)
            devices = [{"id": d.id, "index": d.index, "count": d.count, "devmem": d.devmem,
                        "devcore": d.devcore, "type": d.type, "mode": d.mode or keys.MODE_HAMI_CORE,
                        "health": d.health} for d in decoded]
            facts.set("node.register.devices", devices,
                      *(f"node {name} registers {d['id']} index={d['index']} type={d['type']} "
                        f"devmem={d['devmem']}MiB count={d['count']} mode={d['mode']} health={d['health']}"
                        for d in devices))
        except ProtocolError as exc:
            shown = raw if len(raw) <= 200 else raw[:200] + "..."
            facts.set("node.register.error", str(exc),
                      f"node {name} {keys.NODE_REGISTER}={shown!r}", f"decode error: {exc}")
    facts.set("node.register.count", len(devices))
    unhealthy = [d["id"] for d in devices if not d["health"]]
    facts.set("node.register.unhealthy", unhealthy,
              *(f"node {name} registers {u} with health=false" for u in unhealthy))
    facts.set("node.modes", sorted({d["mode"] for d in devices}))
    # handshake (§1.2)
    hs_raw = ann.get(keys.NODE_HANDSHAKE)
    try:
        hs = parse_handshake(hs_raw)
        facts.set("node.handshake.kind", hs.kind, f"node {name} {keys.NODE_HANDSHAKE}={hs_raw!r}")
        if hs.when is not None:
            facts.set("node.handshake.age_s", _age_s(ctx, hs.when),
                      f"handshake written {_age_s(ctx, hs.when):.0f}s ago (scheduler time taken as UTC)")
    except ProtocolError as exc:
        facts.set("node.handshake.kind", "unparsable", f"node {name} {keys.NODE_HANDSHAKE}={hs_raw!r}: {exc}")
    # allocatable vs capacity
    alloc = status.get("allocatable") or {}
    cap = status.get("capacity") or {}
    a_gpu, c_gpu = _int_quantity(alloc.get(GPU)), _int_quantity(cap.get(GPU))
    facts.set("node.allocatable_gpu", a_gpu, f"node {name} allocatable {GPU}={alloc.get(GPU, '(none)')}, "
                                             f"capacity {cap.get(GPU, '(none)')}")
    facts.set("node.capacity_gpu", c_gpu)
    mig = {k: _int_quantity(v) or 0 for k, v in alloc.items() if k.startswith(keys.MIG_RESOURCE_PREFIX)}
    facts.set("node.mig_allocatable", mig, *(f"node {name} allocatable {k}={v}" for k, v in mig.items()))
    cordon = sorted(parse_device_cordon(ann.get(keys.DEVICE_CORDON)))
    facts.set("node.cordon", cordon,
              *([f"node {name} {keys.DEVICE_CORDON}={','.join(cordon)}"] if cordon else []))
    # node lock (§1.4)
    lock_raw = ann.get(keys.NODE_LOCK)
    facts.set("node.lock.present", bool(lock_raw))
    if lock_raw:
        line = f"node {name} {keys.NODE_LOCK}={lock_raw!r}"
        try:
            lock = parse_lock_value(lock_raw)
            age = _age_s(ctx, lock.when)
            owner = f"{lock.namespace}/{lock.name}" if lock.has_owner else ""
            facts.set("node.lock.owner", owner or None, line)
            facts.set("node.lock.age_s", age, f"lock taken {age:.0f}s ago (expiry {ctx.lock_expiry_s:.0f}s)")
            facts.set("node.lock.expired", bool(age is not None and age > ctx.lock_expiry_s))
        except ProtocolError as exc:
            facts.set("node.lock.error", str(exc), line, f"unparsable lock: {exc}")


def lock_owner_facts(ctx: Context, facts: Facts) -> None:
    owner = facts.get("node.lock.owner")
    if not isinstance(owner, str) or not owner:
        return
    from hami_agent.k8s import NotFoundError

    ns, _, name = owner.partition("/")
    try:
        pod = _get_pod(ctx, ns, name)
    except NotFoundError:
        facts.set("node.lock.owner_state", "NotFound", f"lock owner pod {owner} does not exist")
        return
    phase = (pod.get("status") or {}).get("phase", "")
    bind = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.BIND_PHASE, "")
    state = bind if bind in (keys.BIND_PHASE_SUCCESS, keys.BIND_PHASE_FAILED) else phase
    facts.set("node.lock.owner_state", state,
              f"lock owner pod {owner}: phase={phase or '?'} {keys.BIND_PHASE}={bind or '(none)'}")


def allocating_pods_facts(ctx: Context, facts: Facts) -> None:
    """Pods bound to this node that have waited for the device plugin's Allocate longer than
    ``pending_after_s`` (bind-phase still ``allocating``): the kubelet never admitted them. And Pending GPU
    pods bound here that the HAMi scheduler did not place (no ``hami.io/vgpu-node`` naming this node):
    created with ``spec.nodeName`` or by another scheduler, they make the plugin refuse (no lock owner, or
    an ambiguous admission)."""
    if ctx.view is not None:
        pods = list(ctx.view.pods_by_node.get(ctx.node_name or "", ()))
    else:
        pods = ctx.client.list_pods(field_selector=f"spec.nodeName={ctx.node_name}")
    stuck = []
    bypassed = []
    for pod in pods:
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if ((pod.get("status") or {}).get("phase", "Pending") == "Pending"
                and ann.get(keys.VGPU_NODE) != ctx.node_name and pod_requests_gpu(pod, ctx.config)):
            m = pod.get("metadata") or {}
            sched = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
            bypassed.append(f"pod {m.get('namespace')}/{m.get('name')} is bound to {ctx.node_name} and asks "
                            f"for GPUs but the HAMi scheduler did not place it (schedulerName {sched}, no "
                            f"{keys.VGPU_NODE}={ctx.node_name})")
        if ann.get(keys.BIND_PHASE) != keys.BIND_PHASE_ALLOCATING:
            continue
        bt = _int_quantity(ann.get(keys.BIND_TIME))
        if bt is None:
            continue
        age = ctx.now.timestamp() - bt
        if age > ctx.pending_after_s and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            m = pod.get("metadata") or {}
            stuck.append(f"pod {m.get('namespace')}/{m.get('name')} (uid {m.get('uid', '?')}) bound "
                         f"{age:.0f}s ago, {keys.BIND_PHASE}=allocating, still Pending")
    facts.set("node.allocating_pods", len(stuck), *stuck)
    facts.set("node.unscheduled_gpu_pods", len(bypassed), *bypassed)
    facts.set("node.pods_on_node", len(pods))
