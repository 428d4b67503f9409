"""Eviction, PodDisruptionBudgets and graceful pod deletion for the simulated API server.

What a node drain depends on, modelled on the real code paths (kubernetes/kubernetes):

* ``POST .../pods/<name>/eviction`` (policy/v1 ``Eviction``): ``pkg/registry/core/pod/storage/eviction.go``
  ``EvictionREST.Create``. A terminal, Pending or already terminating pod is deleted without looking at
  budgets (``canIgnorePDB``); more than one matching budget is an error; an unready pod is deleted without
  spending the budget while the budget is met (``IfHealthyBudget``, or always with ``AlwaysAllow``);
  otherwise ``checkAndDecrement``: a budget whose status is older than its spec
  (``status.observedGeneration < metadata.generation``) or that allows no disruption answers **429
  TooManyRequests** ``Cannot evict pod as it would violate the pod's disruption budget.`` with a
  ``DisruptionBudget`` cause, exactly as the real server words it; a granted eviction decrements
  ``status.disruptionsAllowed`` and records the pod in ``status.disruptedPods`` before the pod is deleted.
* the disruption controller (``pkg/controller/disruption/disruption.go``): asynchronously, in its own
  thread, like kube-controller-manager, it recomputes every budget's ``expectedPods``, ``desiredHealthy``
  (``minAvailable`` int or percent, ``maxUnavailable`` int or percent, percentages rounded up and counted
  against the scale of the pods' ReplicaSets), ``currentHealthy`` (Ready pods that are not terminating and
  not in ``disruptedPods``), ``disruptionsAllowed`` and the ``DisruptionAllowed`` condition, and writes the
  status with a resourceVersion precondition (a conflicting eviction wins, the controller retries).
* graceful deletion (``pkg/registry/core/pod/strategy.go`` ``CheckGracefulDelete``), when
  ``graceful_deletion`` is on: deleting a pod that is bound to a node and not terminal only sets
  ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds`` (``DeleteOptions.gracePeriodSeconds``,
  else the pod's ``terminationGracePeriodSeconds``, default 30); the pod is removed when its kubelet
  deletes it again with grace period 0 (the sandbox's kubelet simulator does), or -- only with
  ``finalize_expired`` -- when the grace period has run out (a stand-in for a kubelet in tests without one).
  Unbound and terminal pods, and grace period 0, are removed at once.
* ``metadata.generation`` on budgets and ReplicaSets: 1 on create, +1 on every spec change.

Gaps (docs/testing.md): only ReplicaSet owners are found for percentage budgets (no Deployment,
StatefulSet or scale subresource finders); no dry-run; no ``NotDeleted`` events; budgets are validated
only for the fields listed in ``validate_pdb``.
"""

from __future__ import annotations

import copy
import datetime
import math
import threading
import time
from typing import Any

from tests.sim.apiserver_store import (
    ApiError,
    HistoryEntry,
    Obj,
    ResourceType,
    Store,
    bad_request,
    now_rfc3339,
    resource_for_kind,
)

PODS = resource_for_kind("pods")
PDBS = resource_for_kind("poddisruptionbudgets")
REPLICASETS = resource_for_kind("replicasets")
GENERATION_KINDS = ("poddisruptionbudgets", "replicasets")

# eviction.go: createTooManyRequestsError / checkAndDecrement
BUDGET_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_PDBS_MESSAGE = ("This pod has more than one PodDisruptionBudget, which the eviction subresource "
                         "does not support.")
DELETION_TIMEOUT_S = 120.0  # disruption.go DeletionTimeout: an evicted pod must be gone within this
DEFAULT_GRACE_S = 30  # v1.DefaultTerminationGracePeriodSeconds
UTC = datetime.timezone.utc


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


# --- small helpers (pure) ----------------------------------------------------------------------------

def pod_ready(pod: Obj) -> bool:
    """podutil.IsPodReady: the Ready condition is True."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def pod_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def terminating(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def selector_matches(selector: Any, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector (matchLabels + matchExpressions). A nil or empty selector matches nothing
    here: that is what both the eviction handler and the disruption controller do for budgets."""
    if not isinstance(selector, dict):
        return False
    match_labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match_labels and not exprs:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in exprs:
        key, op, values = e.get("key"), e.get("operator"), set(e.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def scaled_value(value: Any, total: int, field_path: str) -> int:
    """intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)."""
    if isinstance(value, bool):
        raise ValueError(f"{field_path}: must be an integer or a percentage")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.endswith("%"):
        try:
            pct = int(value[:-1])
        except ValueError:
            pct = -1
        if pct >= 0:
            return math.ceil(pct * total / 100)
    raise ValueError(f"{field_path}: invalid value {value!r}: must be an integer or a percentage")


def validate_pdb(pdb: Obj) -> None:
    """The checks of ValidatePodDisruptionBudgetSpec that a client can trip over -> 422 Invalid."""
    name = (pdb.get("metadata") or {}).get("name", "")
    spec = pdb.get("spec") or {}
    errors = []
    if "minAvailable" in spec and "maxUnavailable" in spec and spec["minAvailable"] is not None \
            and spec["maxUnavailable"] is not None:
        errors.append("spec: Invalid value: minAvailable and maxUnavailable cannot be both set")
    for key in ("minAvailable", "maxUnavailable"):
        value = spec.get(key)
        if value is None:
            continue
        try:
            n = scaled_value(value, 100, f"spec.{key}")
        except ValueError as exc:
            errors.append(str(exc))
            continue
        if n < 0:
            errors.append(f"spec.{key}: Invalid value: {value!r}: must be greater than or equal to 0")
        if isinstance(value, str) and n > 100:
            errors.append(f"spec.{key}: Invalid value: {value!r}: must not be greater than 100%")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy not in (None, "IfHealthyBudget", "AlwaysAllow"):
        errors.append(f'spec.unhealthyPodEvictionPolicy: Unsupported value: "{policy}": supported values: '
                      '"AlwaysAllow", "IfHealthyBudget"')
    if errors:
        raise ApiError(422, "Invalid",
                       f'PodDisruptionBudget.policy "{name}" is invalid: ' + ", ".join(errors),
                       {"name": name, "group": "policy", "kind": "PodDisruptionBudget",
                        "causes": [{"reason": "FieldValueInvalid", "message": e} for e in errors]})


def too_many_requests(pdb_name: str, cause: str, retry_after: int) -> ApiError:
    """errors.NewTooManyRequests + a DisruptionBudget cause, as eviction.go builds it."""
    details: dict[str, Any] = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after > 0:
        details["retryAfterSeconds"] = retry_after
    return ApiError(429, "TooManyRequests", BUDGET_MESSAGE, details,
                    retry_after=retry_after if retry_after > 0 else None)


def disruption_condition(allowed: int, generation: int, previous: list[Obj]) -> list[Obj]:
    """pdbhelper.UpdateDisruptionAllowedCondition."""
    status, reason = ("True", "SufficientPods") if allowed > 0 else ("False", "InsufficientPods")
    old = next((c for c in previous if c.get("type") == "DisruptionAllowed"), None)
    if old and old.get("status") == status and old.get("reason") == reason:
        return previous
    cond = {"type": "DisruptionAllowed", "status": status, "reason": reason, "message": "",
            "observedGeneration": generation, "lastTransitionTime": now_rfc3339()}
    return [c for c in previous if c.get("type") != "DisruptionAllowed"] + [cond]


# --- the policy engine -------------------------------------------------------------------------------

class Policy:
    """Eviction handler, graceful deletion and the disruption controller over one ``Store``."""

    def __init__(self, store: Store, *, graceful_deletion: bool = False, finalize_expired: bool = False,
                 controller_delay_s: float = 0.05) -> None:
        self.store = store
        self.graceful_deletion = graceful_deletion
        self.finalize_expired = finalize_expired
        self.controller_delay_s = controller_delay_s
        self._local = threading.local()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        store.on_write.append(self._on_write)
        store.on_change.append(self._on_change)

    # -- store hooks (called under the store lock)
    def _on_write(self, rt: ResourceType, old: Obj | None, new: Obj, subresource: str | None) -> None:
        meta = new["metadata"]
        if rt.plural in GENERATION_KINDS and subresource != "status":
            if rt.plural == "poddisruptionbudgets":
                validate_pdb(new)
            if old is None:
                meta["generation"] = 1
            else:
                gen = int(old["metadata"].get("generation") or 1)
                meta["generation"] = gen + 1 if new.get("spec") != old.get("spec") else gen
        if old is not None and rt.plural == "pods" and not getattr(self._local, "deleting", False):
            # only a DELETE sets these: a client can neither take a deletion back nor start one by a write
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
                else:
                    meta.pop(key, None)

    def _on_change(self, entry: HistoryEntry) -> None:
        if entry.plural in ("pods", "poddisruptionbudgets", "replicasets"):
            self._wake.set()

    # -- lifecycle of the controller thread (kube-controller-manager's part)
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sim-disruption-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            # 1 s tick: disruptedPods entries and grace periods expire with time, not with events
            self._wake.wait(1.0)
            if self._stop.is_set():
                return
            self._wake.clear()
            if self.controller_delay_s:
                time.sleep(self.controller_delay_s)
            try:
                self.sync_all()
                if self.finalize_expired:
                    self.finalize_expired_pods()
            except Exception:  # noqa: BLE001 - a controller never dies; it retries on the next tick
                self._wake.set()
                time.sleep(0.2)

    # -- graceful deletion
    def delete_pod(self, ns: str, name: str, options: Obj | None) -> Obj:
        opts = options if isinstance(options, dict) else {}
        pre = opts.get("preconditions") or {}
        pod = self.store.get(PODS, ns, name)
        if pre.get("uid") and pre["uid"] != pod["metadata"].get("uid"):
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on pods "{name}": Precondition failed: UID in '
                           f"precondition: {pre['uid']}, UID in object meta: {pod['metadata'].get('uid')}",
                           {"name": name, "kind": "pods"})
        grace = opts.get("gracePeriodSeconds")
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        try:
            grace = max(0, int(grace))
        except (TypeError, ValueError):
            raise bad_request(f"gracePeriodSeconds: invalid value {grace!r}") from None
        immediate = (not self.graceful_deletion or grace == 0 or pod_terminal(pod)
                     or not (pod.get("spec") or {}).get("nodeName"))
        if immediate:
            return self.store.delete(PODS, ns, name, pre.get("resourceVersion"))
        current = pod["metadata"].get("deletionGracePeriodSeconds")
        if current is not None and int(current) <= grace:
            return pod  # already terminating with a grace period at least as short: nothing changes
        deadline = _rfc3339(time.time() + grace)

        def build(old: Obj) -> Obj:
            if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on pods "{name}": the object has been '
                               "modified; please apply your changes to the latest version and try again",
                               {"name": name, "kind": "pods"})
            return {**old, "metadata": {**old["metadata"], "deletionTimestamp": deadline,
                                        "deletionGracePeriodSeconds": grace}}

        self._local.deleting = True
        try:
            return self.store._write(PODS, ns, name, build, None)
        finally:
            self._local.deleting = False

    def finalize_expired_pods(self, now: float | None = None) -> list[str]:
        """Stand-in for kubelets: remove terminating pods whose grace period has run out."""
        now = time.time() if now is None else now
        gone = []
        items, _rv = self.store.list(PODS, None)
        for pod in items:
            due = _parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
            if due is not None and due <= now:
                md = pod["metadata"]
                try:
                    self.store.delete(PODS, md.get("namespace", ""), md["name"])
                    gone.append(f"{md.get('namespace')}/{md['name']}")
                except ApiError:
                    pass
        return gone

    # -- eviction (eviction.go EvictionREST.Create)
    def evict(self, ns: str, name: str, body: Any) -> Obj:
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise bad_request(f"not a Eviction object: {type(body).__name__}")
        if (body.get("metadata") or {}).get("name") != name:
            raise bad_request("name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") if isinstance(body.get("deleteOptions"), dict) else {}
        user_rv = (options.get("preconditions") or {}).get("resourceVersion")
        pod = self.store.get(PODS, ns, name)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if phase in ("Succeeded", "Failed", "Pending") or terminating(pod):
            # canIgnorePDB: the disruption has happened already (or never will)
            opts = copy.deepcopy(options)
            if not user_rv and phase not in ("Succeeded", "Failed") and not terminating(pod):
                opts.setdefault("preconditions", {})["resourceVersion"] = pod["metadata"]["resourceVersion"]
            self.delete_pod(ns, name, opts)
            return _success()
        pdbs = self._pdbs_for(pod)
        if len(pdbs) > 1:
            raise ApiError(500, "InternalError", MULTIPLE_PDBS_MESSAGE)
        opts = copy.deepcopy(options)
        if pdbs:
            pdb = pdbs[0]
            st = pdb.get("status") or {}
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
            unready_ok = not pod_ready(pod) and (
                policy == "AlwaysAllow"
                or (int(st.get("currentHealthy", 0)) >= int(st.get("desiredHealthy", 0))
                    and int(st.get("desiredHealthy", 0)) > 0))
            if unready_ok:
                # deleted outside the budget; the precondition makes sure it has not become Ready meanwhile
                if not user_rv:
                    rv = pod["metadata"]["resourceVersion"]
                    opts.setdefault("preconditions", {})["resourceVersion"] = rv
                try:
                    self.delete_pod(ns, name, opts)
                except ApiError as exc:
                    if exc.code == 409 and not user_rv:
                        raise too_many_requests(
                            pdb["metadata"]["name"],
                            f"The disruption budget {pdb['metadata']['name']} is still being processed by "
                            "the server.", 10) from None
                    raise
                return _success()
            self._check_and_decrement(ns, name, pdb["metadata"]["name"])
        self.delete_pod(ns, name, opts)
        return _success()

    def _pdbs_for(self, pod: Obj) -> list[Obj]:
        md = pod.get("metadata") or {}
        items, _rv = self.store.list(PDBS, md.get("namespace"))
        labels = md.get("labels") or {}
        return [p for p in items if selector_matches((p.get("spec") or {}).get("selector"), labels)]

    def _check_and_decrement(self, ns: str, pod_name: str, pdb_name: str) -> None:
        """checkAndDecrement, with eviction.go's retry on a resourceVersion conflict."""
        for _attempt in range(20):
            pdb = self.store.get(PDBS, ns, pdb_name)
            st = copy.deepcopy(pdb.get("status") or {})
            gen = int(pdb["metadata"].get("generation") or 1)
            if int(st.get("observedGeneration", 0)) < gen:
                raise too_many_requests(
                    pdb_name, f"The disruption budget {pdb_name} is still being processed by the server.", 10)
            allowed = int(st.get("disruptionsAllowed", 0))
            if allowed < 0:
                raise ApiError(403, "Forbidden",
                               f'poddisruptionbudget.policy "{pdb_name}" is forbidden: pdb disruptions '
                               "allowed is negative")
            if allowed == 0:
                raise too_many_requests(
                    pdb_name,
                    f"The disruption budget {pdb_name} needs {int(st.get('desiredHealthy', 0))} healthy pods "
                    f"and has {int(st.get('currentHealthy', 0))} currently", 0)
            st["disruptionsAllowed"] = allowed - 1
            if st["disruptionsAllowed"] == 0:
                st["conditions"] = disruption_condition(0, gen, st.get("conditions") or [])
            st.setdefault("disruptedPods", {})[pod_name] = now_rfc3339()
            new = {**pdb, "status": st}
            try:
                self.store.update(PDBS, ns, pdb_name, new, "status")
                return
            except ApiError as exc:
                if exc.code != 409:
                    raise
                time.sleep(0.01)
        raise ApiError(504, "Timeout", f'couldn\'t update PodDisruptionBudget "{pdb_name}" due to conflicts',
                       {"retryAfterSeconds": 10})

    # -- the disruption controller
    def sync_all(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        items, _rv = self.store.list(PDBS, None)
        for pdb in items:
            md = pdb["metadata"]
            for _attempt in range(5):
                try:
                    self.sync_pdb(md.get("namespace", ""), md["name"], now)
                    break
                except ApiError as exc:
                    if exc.code == 404:
                        break
                    if exc.code != 409:
                        raise

    def compute_status(self, pdb: Obj, now: float) -> tuple[Obj, str | None]:
        """(status, error) as the controller's trySync would write it (failSafe on an error)."""
        md = pdb["metadata"]
        ns = md.get("namespace", "")
        spec = pdb.get("spec") or {}
        st = pdb.get("status") or {}
        gen = int(md.get("generation") or 1)
        pods_all, _rv = self.store.list(PODS, ns)
        pods = [p for p in pods_all if selector_matches(spec.get("selector"),
                                                        (p.get("metadata") or {}).get("labels") or {})]
        try:
            expected, desired = self._expected_and_desired(spec, pods)
        except ValueError as exc:
            failed = copy.deepcopy(st)
            failed["disruptionsAllowed"] = 0
            conds = [c for c in failed.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
            conds.append({"type": "DisruptionAllowed", "status": "False", "reason": "SyncFailed",
                          "message": str(exc), "observedGeneration": int(st.get("observedGeneration", 0)),
                          "lastTransitionTime": now_rfc3339()})
            failed["conditions"] = conds
            return failed, str(exc)
        disrupted = {}
        for pod in pods:
            pname = pod["metadata"]["name"]
            when = _parse_time((st.get("disruptedPods") or {}).get(pname))
            if when is None or terminating(pod):
                continue
            if when + DELETION_TIMEOUT_S >= now:
                disrupted[pname] = st["disruptedPods"][pname]
        healthy = sum(1 for p in pods if not terminating(p) and p["metadata"]["name"] not in disrupted
                      and pod_ready(p))
        allowed = healthy - desired
        if expected <= 0 or allowed <= 0:
            allowed = 0
        status = {"observedGeneration": gen, "disruptionsAllowed": allowed, "currentHealthy": healthy,
                  "desiredHealthy": desired, "expectedPods": expected}
        if disrupted:
            status["disruptedPods"] = disrupted
        status["conditions"] = disruption_condition(allowed, gen, list(st.get("conditions") or []))
        return status, None

    def sync_pdb(self, ns: str, name: str, now: float | None = None) -> Obj:
        now = time.time() if now is None else now
        pdb = self.store.get(PDBS, ns, name)
        status, _err = self.compute_status(pdb, now)
        if status == pdb.get("status"):
            return pdb
        # UpdateStatus with the resourceVersion read: an eviction that decremented meanwhile wins (409)
        return self.store.update(PDBS, ns, name, {**pdb, "status": status}, "status")

    def _expected_and_desired(self, spec: Obj, pods: list[Obj]) -> tuple[int, int]:
        """getExpectedPodCount: an integer minAvailable counts the pods; percentages and maxUnavailable
        count the scale of the pods' controllers (ReplicaSets here)."""
        if spec.get("maxUnavailable") is not None:
            expected = self._expected_scale(pods)
            desired = max(0, expected - scaled_value(spec["maxUnavailable"], expected, "spec.maxUnavailable"))
            return expected, desired
        min_available = spec.get("minAvailable")
        if isinstance(min_available, int) and not isinstance(min_available, bool):
            return len(pods), min_available
        if min_available is not None:
            expected = self._expected_scale(pods)
            return expected, scaled_value(min_available, expected, "spec.minAvailable")
        return len(pods), 0

    def _expected_scale(self, pods: list[Obj]) -> int:
        scales: dict[str, int] = {}
        for pod in pods:
            md = pod["metadata"]
            ref = next((r for r in md.get("ownerReferences") or [] if r.get("controller")), None)
            if ref is None:
                continue  # an unmanaged pod is tolerated (and not counted), as in the current controller
            if ref.get("uid") in scales:
                continue
            rs = None
            if ref.get("kind") == "ReplicaSet" and str(ref.get("apiVersion", "")).startswith("apps/"):
                try:
                    rs = self.store.get(REPLICASETS, md.get("namespace", ""), ref.get("name", ""))
                except ApiError:
                    rs = None
            if rs is None or rs["metadata"].get("uid") != ref.get("uid"):
                raise ValueError(f'found no controllers for pod "{md["name"]}"')
            scales[ref["uid"]] = int((rs.get("spec") or {}).get("replicas", 1))
        return sum(scales.values())


def _success() -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def route_eviction(policy: Policy, method: str, ns: str, name: str, body: Any) -> tuple[int, Obj]:
    """The ``pods/eviction`` subresource: POST only (a create)."""
    if method != "POST":
        raise ApiError(405, "MethodNotAllowed", "only POST is supported on pods/eviction")
    return 201, policy.evict(ns, name, body)
