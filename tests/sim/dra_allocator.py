"""SIMULATED kube-scheduler DRA: the structured-parameters allocator (KEP-4381) with consumable capacity
(KEP-5075), device taints (KEP-5055), and the resourceclaim controller's part (templates -> claims,
reservations released when a pod goes).

This is not kube-scheduler. It follows what a DRA driver can observe of it (kubernetes
``pkg/scheduler/framework/plugins/dynamicresources``, ``staging/src/k8s.io/dynamic-resource-allocation/
structured`` and ``pkg/controller/resourceclaim``):

* a pod's ``spec.resourceClaims`` entry names a claim or a template; for a template the controller creates
  the claim (``<pod>-<name>-<random>``, owned by the pod, annotation
  ``resource.kubernetes.io/pod-claim-name``)
  and records it in ``pod.status.resourceClaimStatuses``;
* candidate devices come from ResourceSlices that apply to the node (``nodeName`` or ``allNodes``), only
  from pools whose slices all share the pool's highest ``generation`` and are complete
  (``resourceSliceCount``): devices of an incomplete pool are never allocated;
* a request (``exactly``, or the first ``firstAvailable`` subrequest that works) matches a device when
  every selector of its DeviceClass and of the request is true, evaluated by a real CEL engine
  (``tests/sim/dra_cel.py``); a CEL error aborts the pod's scheduling with that error;
* ``allocationMode``: ``ExactCount`` (``count`` devices) or ``All`` (every matching device of the node's
  pools, none of them unavailable); constraints ``matchAttribute`` / ``distinctAttribute``;
* a device is unavailable when another allocated claim holds it, unless it ``allowMultipleAllocations``:
  then every capacity is consumed per allocation -- the request's ``capacity.requests`` rounded up by the
  capacity's ``requestPolicy`` (``validRange`` min/step, ``validValues``), or the policy's default, or the
  whole capacity -- and the sum over all allocations must not exceed the capacity (``CmpRequestOverCapacity``
  in ``structured/internal/*/consumable_capacity.go``); such results carry ``shareID`` and
  ``consumedCapacity``;
* a device tainted ``NoSchedule`` or ``NoExecute`` is allocated only to a request that tolerates the taint
  (``resourceclaim.ToleratesTaint``); ``None`` is informational;
* the first node (by name) where every claim fits wins; the scheduler writes ``status.allocation``
  (results, the class and claim config, ``nodeSelector`` for the node) and ``status.reservedFor`` through
  ``/status``, adds the ``resource.kubernetes.io/delete-protection`` finalizer, then binds the pod;
  allocations it wrote are remembered until its informer shows them (kube-scheduler's assume cache);
* when a pod is deleted or finishes, it is removed from ``reservedFor``; a claim nobody reserves any more
  is deleted when the pod owned it (template) and deallocated otherwise.

Failures are reported as kube-scheduler does: ``0/N nodes are available: N cannot allocate all claims.``
Gaps (docs/testing.md): no scoring (first fit), no adminAccess, no partitionable devices / shared counters,
no binding conditions, no extended resources backed by DRA (KEP-5004), no DeviceTaintRules, no eviction
for NoExecute taints, a bounded depth-first search instead of the real allocator's full backtracking.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tests.sim.dra_cel import DEFAULT as CEL
from tests.sim.dra_cel import CelError, Quantity, SelectorCache, format_quantity

logger = logging.getLogger("tests.sim.dra_allocator")

Obj = dict[str, Any]
FINALIZER = "resource.kubernetes.io/delete-protection"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
MAX_STEPS = 20000  # search bound per node: a claim that needs more is "cannot allocate" (documented gap)
CANNOT_ALLOCATE = "cannot allocate all claims"
ASSUME_TTL_S = 5.0  # an assumed claim the informer never shows (deleted meanwhile) is dropped after this


class SchedulingError(RuntimeError):
    """The pod cannot be scheduled now, for a reason that is not per node (missing claim, CEL error)."""


@dataclass
class Candidate:
    driver: str
    pool: str
    node: str | None
    device: Obj

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device["name"])

    @property
    def multi(self) -> bool:
        return bool(self.device.get("allowMultipleAllocations"))


@dataclass
class Slot:
    """One device to find: for claim ``ci``, request ``request`` (``parent/sub`` for a subrequest)."""

    ci: int
    request: str
    spec: Obj  # the exact request or subrequest
    selectors: list[str]
    all_mode: bool = False


@dataclass
class Pick:
    slot: Slot
    cand: Candidate
    consumed: dict[str, Fraction] = field(default_factory=dict)


def _q(value: Any) -> Fraction:
    return Quantity.parse(value).value


def consumed_capacity(device: Obj, requests: dict[str, Any] | None) -> dict[str, Fraction] | None:
    """What one allocation consumes of every capacity of ``device`` (None: violates a request policy)."""
    caps = device.get("capacity") or {}
    requests = requests or {}
    if any(name not in caps for name in requests):
        return None  # "some requested capacity has not been defined"
    out: dict[str, Fraction] = {}
    for name, cap in caps.items():
        policy = cap.get("requestPolicy") or {}
        if name in requests:
            val = _q(requests[name])
            rng, values = policy.get("validRange"), policy.get("validValues")
            if rng and rng.get("min") is not None:
                lo = _q(rng["min"])
                if val < lo:
                    val = lo
                elif rng.get("step") is not None:
                    step = _q(rng["step"])
                    n = (val - lo) / step
                    val = lo + step * (int(n) + (1 if n.denominator != 1 else 0))
            elif values:
                val = next((_q(v) for v in values if val <= _q(v)), val)
        elif policy.get("default") is not None:
            val = _q(policy["default"])
        else:
            val = _q(cap.get("value"))
        if policy:
            default = _q(policy["default"]) if policy.get("default") is not None else None
            rng, values = policy.get("validRange"), policy.get("validValues")
            if val != default:
                if rng and rng.get("max") is not None and val > _q(rng["max"]):
                    return None
                if rng and rng.get("step") is not None and (val - _q(rng.get("min") or 0)) % _q(rng["step"]):
                    return None
                if values and all(val != _q(v) for v in values):
                    return None
        out[name] = val
    return out


def tolerates(taint: Obj, toleration: Obj) -> bool:
    """``resourceclaim.ToleratesTaint``."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def taint_blocks(device: Obj, tolerations: list[Obj]) -> bool:
    for taint in device.get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue  # None (and unknown effects): informational
        if not any(tolerates(taint, t) for t in tolerations):
            return True
    return False


def _attr(cand: Candidate, name: str) -> Any:
    domain, _, ident = name.rpartition("/")
    attrs = cand.device.get("attributes") or {}
    value = attrs.get(name) if name in attrs else (attrs.get(ident) if domain == cand.driver else None)
    return None if value is None else tuple(sorted(value.items()))


def node_selector(node: str) -> Obj:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeSelectorTerms": [term]}


def allocated_node(claim: Obj) -> str | None:
    sel = (((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {})
    for term in sel.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                return f["values"][0]
    return None


class DraAllocator:
    """The DRA part of the SIMULATED kube-scheduler (see module docstring)."""

    def __init__(self, client: Any, cel: SelectorCache = CEL) -> None:
        self.client = client
        self.cel = cel
        self.slices: Any = None
        self.claims: Any = None
        self.classes: Any = None
        self.pods: Any = None
        self._assumed: dict[str, tuple[float, Obj]] = {}  # claim uid -> (when, the claim as we wrote it)
        self._lock = threading.RLock()
        self.allocations = 0

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> DraAllocator:
        from hami_agent.k8s.informer import Informer

        self.slices = Informer(self.client, "resourceslices").start()
        self.claims = Informer(self.client, "resourceclaims").start()
        self.classes = Informer(self.client, "deviceclasses").start()
        self.pods = Informer(self.client, "pods", resync_s=0)
        self.pods.add_handler(on_update=lambda _o, p: self._pod_changed(p), on_delete=self._pod_gone)
        self.pods.start()
        for inf in (self.slices, self.claims, self.classes, self.pods):
            inf.wait_synced(10)
        return self

    def stop(self) -> None:
        for inf in (self.pods, self.claims, self.slices, self.classes):
            if inf is not None:
                inf.stop()

    @staticmethod
    def wants(pod: Obj) -> bool:
        return bool((pod.get("spec") or {}).get("resourceClaims"))

    # ------------------------------------------------------------------------------------ claims view
    def _all_claims(self) -> list[Obj]:
        now = time.monotonic()
        with self._lock:
            out = {c["metadata"]["uid"]: c for c in self.claims.list()}
            for uid, (when, claim) in list(self._assumed.items()):
                have = out.get(uid)
                if have is not None and int(have["metadata"]["resourceVersion"]) >= \
                        int(claim["metadata"]["resourceVersion"]):
                    del self._assumed[uid]  # the informer caught up
                elif have is None and now - when > ASSUME_TTL_S:
                    del self._assumed[uid]  # deleted meanwhile
                else:
                    out[uid] = claim
            return list(out.values())

    def _assume(self, claim: Obj) -> None:
        with self._lock:
            self._assumed[claim["metadata"]["uid"]] = (time.monotonic(), claim)

    def _in_use(self, skip_uids: set[str]) -> tuple[set[tuple], dict[tuple, dict[str, Fraction]]]:
        exclusive: set[tuple] = set()
        consumed: dict[tuple, dict[str, Fraction]] = {}
        for claim in self._all_claims():
            if claim["metadata"]["uid"] in skip_uids:
                continue
            for r in ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                      .get("results") or []):
                key = (r.get("driver"), r.get("pool"), r.get("device"))
                if r.get("shareID") or r.get("consumedCapacity") is not None:
                    acc = consumed.setdefault(key, {})
                    for name, q in (r.get("consumedCapacity") or {}).items():
                        acc[name] = acc.get(name, Fraction(0)) + _q(q)
                else:
                    exclusive.add(key)
        return exclusive, consumed

    # ------------------------------------------------------------------------------------ devices
    def _candidates(self, node: str) -> list[Candidate]:
        pools: dict[tuple[str, str], list[Obj]] = {}
        for s in self.slices.list():
            spec = s.get("spec") or {}
            local = spec.get("nodeName")
            if local not in (None, node) or (local is None and not spec.get("allNodes")):
                continue  # another node's pool (nodeSelector pools are not simulated)
            pools.setdefault((spec.get("driver"), (spec.get("pool") or {}).get("name")), []).append(s)
        out: list[Candidate] = []
        for (driver, pool), slices in sorted(pools.items()):
            top = max(int(s["spec"]["pool"].get("generation") or 0) for s in slices)
            current = [s for s in slices if int(s["spec"]["pool"].get("generation") or 0) == top]
            want = int(current[0]["spec"]["pool"].get("resourceSliceCount") or 1)
            if len(current) < want:
                continue  # incomplete pool: never allocated from
            for s in sorted(current, key=lambda o: o["metadata"]["name"]):
                for dev in s["spec"].get("devices") or []:
                    out.append(Candidate(driver, pool, s["spec"].get("nodeName"), dev))
        return out

    def _class(self, name: str) -> Obj:
        cls = self.classes.get("", name)
        if cls is None:
            raise SchedulingError(f"device class {name} does not exist")
        return cls

    def _slots(self, ci: int, claim: Obj) -> list[list[Slot]]:
        """Per request, the alternatives (one for ``exactly``, one per subrequest for ``firstAvailable``);
        each alternative is expanded to its slots when tried."""
        out = []
        for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            alts = []
            subs = [(req["name"], req["exactly"])] if req.get("exactly") else \
                [(f"{req['name']}/{s['name']}", s) for s in req.get("firstAvailable") or []]
            for rname, spec in subs:
                cls = self._class(spec.get("deviceClassName", ""))
                sels = [s["cel"]["expression"] for s in (cls.get("spec") or {}).get("selectors") or []]
                sels += [s["cel"]["expression"] for s in spec.get("selectors") or []]
                mode_all = (spec.get("allocationMode") or "ExactCount") == "All"
                alts.append(Slot(ci, rname, spec, sels, mode_all))
            out.append(alts)
        return out

    def _matches(self, slot: Slot, cand: Candidate) -> bool:
        for expr in slot.selectors:
            try:
                if not self.cel.matches(expr, cand.driver, cand.device):
                    return False
            except CelError as exc:
                raise SchedulingError(f"claim request {slot.request}: selector {expr!r}: {exc}") from None
        return True

    # ------------------------------------------------------------------------------------ allocation
    def allocate_on_node(self, node: str, claims: list[Obj]) -> list[list[Pick]] | None:
        """Picks per claim (same order as ``claims``) if all fit on ``node``, else None."""
        cands = self._candidates(node)
        exclusive, consumed = self._in_use({c["metadata"]["uid"] for c in claims})
        requests = [self._slots(ci, c) for ci, c in enumerate(claims)]
        flat: list[tuple[int, list[Slot]]] = [(ci, alts) for ci, reqs in enumerate(requests) for alts in reqs]
        picks: list[Pick] = []
        steps = [0]

        def fits(slot: Slot, cand: Candidate) -> dict[str, Fraction] | None:
            if cand.key in exclusive or any(p.cand.key == cand.key and not cand.multi for p in picks):
                return None
            if taint_blocks(cand.device, slot.spec.get("tolerations") or []):
                return None
            if not self._matches(slot, cand):
                return None
            if not cand.multi:
                if (slot.spec.get("capacity") or {}).get("requests"):
                    caps = cand.device.get("capacity") or {}
                    for name, want in slot.spec["capacity"]["requests"].items():
                        if name not in caps or _q(caps[name].get("value")) < _q(want):
                            return None
                return {}
            need = consumed_capacity(cand.device, (slot.spec.get("capacity") or {}).get("requests"))
            if need is None:
                return None
            used = dict(consumed.get(cand.key, {}))
            for p in picks:
                if p.cand.key == cand.key:
                    for k, v in p.consumed.items():
                        used[k] = used.get(k, Fraction(0)) + v
            for name, v in need.items():
                if used.get(name, Fraction(0)) + v > _q(cand.device["capacity"][name].get("value")):
                    return None
            return need

        def constraints_ok(ci: int) -> bool:
            claim = claims[ci]
            mine = [p for p in picks if p.slot.ci == ci]
            for c in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []:
                reqs = set(c.get("requests") or [])
                sel = [p for p in mine
                       if not reqs or p.slot.request.split("/")[0] in reqs or p.slot.request in reqs]
                if c.get("matchAttribute"):
                    vals = {_attr(p.cand, c["matchAttribute"]) for p in sel}
                    if None in vals or len(vals) > 1:
                        return False
                if c.get("distinctAttribute"):
                    vals = [_attr(p.cand, c["distinctAttribute"]) for p in sel]
                    if None in vals or len(set(vals)) != len(vals):
                        return False
            return True

        def place(i: int) -> bool:
            if i == len(flat):
                return True
            ci, alts = flat[i]
            for slot in alts:
                if slot.all_mode:
                    matching = [c for c in cands if self._matches(slot, c)]
                    chosen = []
                    for cand in matching:
                        need = fits(slot, cand)
                        if need is None:
                            break
                        chosen.append(Pick(slot, cand, need))
                        picks.append(chosen[-1])
                    if matching and len(chosen) == len(matching) and constraints_ok(ci) and place(i + 1):
                        return True
                    del picks[len(picks) - len(chosen):]
                    continue
                if self._place_count(slot, int(slot.spec.get("count") or 1), cands, picks, fits,
                                     lambda: constraints_ok(ci) and place(i + 1), steps):
                    return True
            return False

        return [[p for p in picks if p.slot.ci == ci] for ci in range(len(claims))] if place(0) else None

    def _place_count(self, slot: Slot, count: int, cands: list[Candidate], picks: list[Pick], fits: Any,
                     rest: Any, steps: list[int], start: int = 0) -> bool:
        if count == 0:
            return bool(rest())
        for idx in range(start, len(cands)):
            steps[0] += 1
            if steps[0] > MAX_STEPS:
                return False
            need = fits(slot, cands[idx])
            if need is None:
                continue
            picks.append(Pick(slot, cands[idx], need))
            if self._place_count(slot, count - 1, cands, picks, fits, rest, steps, idx + 1):
                return True
            picks.pop()
        return False

    def _allocation(self, node: str, claim: Obj, picks: list[Pick]) -> Obj:
        results = []
        for p in picks:
            r: Obj = {"request": p.slot.request, "driver": p.cand.driver, "pool": p.cand.pool,
                      "device": p.cand.device["name"]}
            if p.slot.spec.get("tolerations"):
                r["tolerations"] = copy.deepcopy(p.slot.spec["tolerations"])
            if p.cand.multi:
                r["shareID"] = str(uuid.uuid4())
                r["consumedCapacity"] = {k: format_quantity(v) for k, v in sorted(p.consumed.items())}
            results.append(r)
        config = []
        for req_alts in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            specs = [req_alts["exactly"]] if req_alts.get("exactly") else req_alts.get("firstAvailable") or []
            for spec in specs:
                cls = self.classes.get("", spec.get("deviceClassName", "")) or {}
                for c in (cls.get("spec") or {}).get("config") or []:
                    entry = {"source": "FromClass", "requests": [req_alts["name"]], **copy.deepcopy(c)}
                    if entry not in config:
                        config.append(entry)
        for c in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            config.append({"source": "FromClaim", **copy.deepcopy(c)})
        alloc: Obj = {"devices": {"results": results}}
        if config:
            alloc["devices"]["config"] = config
        if any(p.cand.node for p in picks):
            alloc["nodeSelector"] = node_selector(node)
        return alloc

    # ------------------------------------------------------------------------------------ scheduling
    def _ensure_claims(self, pod: Obj) -> list[Obj]:
        """The pod's claims (creating template claims as the resourceclaim controller would)."""
        md = pod["metadata"]
        ns = md.get("namespace", "default")
        out = []
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        for pc in (pod.get("spec") or {}).get("resourceClaims") or []:
            if pc.get("resourceClaimName"):
                name = pc["resourceClaimName"]
            else:
                have = next((s for s in statuses if s.get("name") == pc.get("name")), None)
                if have is None:
                    tmpl = self.client.get("resourceclaimtemplates", pc.get("resourceClaimTemplateName", ""),
                                           ns)
                    spec = tmpl.get("spec") or {}
                    meta = copy.deepcopy(spec.get("metadata") or {})
                    meta.update(generateName=f"{md['name']}-{pc['name']}-"[:58], namespace=ns)
                    meta.setdefault("annotations", {})[POD_CLAIM_ANNOTATION] = pc["name"]
                    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": md["name"],
                                                "uid": md["uid"], "controller": True,
                                                "blockOwnerDeletion": True}]
                    created = self.client.create("resourceclaims", {
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
                        "spec": copy.deepcopy(spec.get("spec") or {})})
                    statuses.append({"name": pc["name"], "resourceClaimName": created["metadata"]["name"]})
                    self.client.patch_pod_status(ns, md["name"], {"resourceClaimStatuses": statuses})
                    have = statuses[-1]
                name = have["resourceClaimName"]
            try:
                out.append(self.client.get("resourceclaims", name, ns))
            except Exception as exc:
                raise SchedulingError(f'resourceclaim "{name}" not found') from exc
        return out

    def schedule(self, sim: Any, pod: Obj, names: list[str]) -> bool:
        """One scheduling cycle of a pod with claims: allocate, reserve, bind (the KubeSchedulerSim hook)."""
        md = pod["metadata"]
        ns, name = md.get("namespace", "default"), md["name"]
        try:
            claims = self._ensure_claims(pod)
            feasible = list(names)
            for c in claims:
                node = allocated_node(c)
                if (c.get("status") or {}).get("allocation") and node:
                    feasible = [n for n in feasible if n == node]
            pending = [c for c in claims if not (c.get("status") or {}).get("allocation")]
            chosen, picks = None, None
            for node in feasible:
                picks = self.allocate_on_node(node, pending) if pending else []
                if picks is not None:
                    chosen = node
                    break
        except SchedulingError as exc:
            sim._record_failure(pod, str(exc))
            return False
        if chosen is None:
            reason = CANNOT_ALLOCATE
            sim._record_failure(pod, f"0/{len(names)} nodes are available: {len(names)} {reason}.")
            return False
        for claim, claim_picks in zip(pending, picks or [], strict=True):
            claim["status"] = {"allocation": self._allocation(chosen, claim, claim_picks)}
        for claim in claims:
            try:
                self._reserve(pod, claim)
            except Exception as exc:  # a conflict: someone changed the claim meanwhile; retry the pod
                sim._record_failure(pod, f"reserving resourceclaim {claim['metadata']['name']}: {exc}")
                return False
        sim.client.bind_pod(ns, name, chosen, uid=md.get("uid"))
        sim._bound(pod, chosen)
        return True

    def _reserve(self, pod: Obj, claim: Obj) -> None:
        md, cmd = pod["metadata"], claim["metadata"]
        if FINALIZER not in (cmd.get("finalizers") or []):
            self.client.patch("resourceclaims", cmd["name"],
                              {"metadata": {"finalizers": [*(cmd.get("finalizers") or []), FINALIZER],
                                            "resourceVersion": cmd["resourceVersion"]}}, cmd["namespace"])
        reserved = list((claim.get("status") or {}).get("reservedFor") or [])
        if not any(r.get("uid") == md["uid"] for r in reserved):
            reserved.append({"resource": "pods", "name": md["name"], "uid": md["uid"]})
        status = {**(claim.get("status") or {}), "reservedFor": reserved}
        updated = self.client.patch("resourceclaims", cmd["name"], {"status": status}, cmd["namespace"],
                                    subresource="status")
        if "allocation" in status:
            self.allocations += 1
        self._assume(updated)

    # ------------------------------------------------------------------------------------ controller
    def _pod_changed(self, pod: Obj) -> None:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self._pod_gone(pod)

    def _pod_gone(self, pod: Obj) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        for claim in self._all_claims():
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if not any(r.get("uid") == uid for r in reserved):
                continue
            cmd = claim["metadata"]
            rest = [r for r in reserved if r.get("uid") != uid]
            try:
                if rest:
                    self._assume(self.client.patch("resourceclaims", cmd["name"],
                                                   {"status": {"reservedFor": rest}}, cmd["namespace"],
                                                   subresource="status"))
                elif any(o.get("uid") == uid and o.get("controller")
                         for o in cmd.get("ownerReferences") or []):
                    self.client.delete("resourceclaims", cmd["name"], cmd["namespace"])
                    with self._lock:
                        self._assumed.pop(cmd["uid"], None)
                else:
                    self.client.patch("resourceclaims", cmd["name"], {"status": {"reservedFor": None,
                                                                                 "allocation": None}},
                                      cmd["namespace"], subresource="status")
                    self._assume(self.client.patch(
                        "resourceclaims", cmd["name"],
                        {"metadata": {"finalizers": [f for f in cmd.get("finalizers") or [] if f != FINALIZER]
                                      or None}}, cmd["namespace"]))
            except Exception as exc:  # the next event or resync retries
                logger.warning("releasing resourceclaim %s/%s of pod %s: %s", cmd.get("namespace"),
                               cmd.get("name"), uid, exc)
