# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Node maintenance for GPU rollouts: cordon, evict under PodDisruptionBudgets, verify, uncordon, park.
PRIVATE to hami.node (used by the k8s_node_maintenance module).

Why not kubernetes.core.k8s_drain: it stops at the first 429 a PodDisruptionBudget answers, cannot evict
only the GPU pods (the GPU Operator's upgrade controller's default), and does not remember whether it or
an operator cordoned the node. The engine below talks to the API through a small adapter (``api``), so its
decisions are unit-tested without a cluster.

Rules (docs/rollouts.md):
* decide, then write: every pod is classified before the cordon; a refusal (unmanaged pods without
  ``force``, emptyDir data without ``delete_emptydir_data``) writes nothing;
* the cordon is written together with ``hami.io/maintenance-cordoned-by: hami.node`` in one patch carrying
  the node's resourceVersion, so a re-run after a crash knows the cordon is ours; a node an operator had
  cordoned is never uncordoned by us;
* evictions go through the Eviction API (``policy/v1``), so budgets hold; a 429 is retried with
  exponential backoff (honouring the server's ``retryAfterSeconds``) until one deadline for the whole
  drain, which also bounds the wait for the evicted pods to be gone;
* a failed gate leaves the node cordoned with ``hami.io/maintenance-failed-gate`` and
  ``hami.io/maintenance-runbook`` and a Warning event that names both.
"""

from __future__ import annotations

import datetime
import random

from ansible_collections.hami.node.plugins.module_utils._k8s import ApiError, decode_json  # noqa: F401

CORDONED_BY = "hami.io/maintenance-cordoned-by"
REASON = "hami.io/maintenance-reason"
STARTED = "hami.io/maintenance-started"
FAILED_GATE = "hami.io/maintenance-failed-gate"
RUNBOOK = "hami.io/maintenance-runbook"
OWNER = "hami.node"
OUR_ANNOTATIONS = (CORDONED_BY, REASON, STARTED, FAILED_GATE, RUNBOOK)
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MAX_ANNOTATION_TEXT = 512
PATCH_ATTEMPTS = 5


class MaintenanceError(Exception):
    """A refusal or failure; ``msg`` names the cause and the fix."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.msg = msg
        self.result = result


def now_rfc3339(now=None):
    when = datetime.datetime.fromtimestamp(now, datetime.timezone.utc) if now is not None else (
        datetime.datetime.now(datetime.timezone.utc))
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj):
    return obj.get("metadata") or {}


def pod_key(pod):
    md = _meta(pod)
    return "%s/%s" % (md.get("namespace", ""), md.get("name", ""))


def uses_gpu(pod, prefixes):
    """True when a container or init container requests or limits a resource named with a prefix."""
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            for name in (res.get(part) or {}):
                if any(name.startswith(p) for p in prefixes):
                    return True
    return False


def controller_of(pod):
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def classify(pods, mode, gpu_prefixes):
    """Sort the node's pods into (to_evict, skipped) where skipped maps pod key -> why.

    mode ``gpu``: pods that use a GPU resource; ``all``: every pod (kubectl drain). Never evicted:
    finished pods (they hold nothing), DaemonSet pods (their controller puts them straight back; kubectl's
    --ignore-daemonsets) and mirror pods of static manifests (the API cannot evict them)."""
    evict, skipped = [], {}
    for pod in pods:
        key = pod_key(pod)
        phase = (pod.get("status") or {}).get("phase")
        ctl = controller_of(pod)
        if phase in ("Succeeded", "Failed"):
            skipped[key] = "finished (%s)" % phase
        elif MIRROR_ANNOTATION in (_meta(pod).get("annotations") or {}):
            skipped[key] = "mirror pod of a static manifest"
        elif ctl is not None and ctl.get("kind") == "DaemonSet":
            skipped[key] = "DaemonSet pod"
        elif mode == "gpu" and not uses_gpu(pod, gpu_prefixes):
            skipped[key] = "uses no GPU"
        else:
            evict.append(pod)
    return evict, skipped


def refusals(pods, force, delete_emptydir_data):
    """What kubectl drain would refuse, as messages naming the pods and the fix."""
    out = []
    unmanaged = [pod_key(p) for p in pods
                 if controller_of(p) is None and not _meta(p).get("deletionTimestamp")]
    if unmanaged and not force:
        out.append(
            "pods not managed by a controller would be lost for good: %s (delete them yourself, or set "
            "force=true; in a playbook node_maintenance_force=true)" % ", ".join(sorted(unmanaged)))
    local = [pod_key(p) for p in pods
             if any("emptyDir" in (v or {}) for v in (p.get("spec") or {}).get("volumes") or [])]
    if local and not delete_emptydir_data:
        out.append(
            "pods with emptyDir data would lose it: %s (set delete_emptydir_data=true; "
            "in a playbook node_maintenance_delete_emptydir_data=true)" % ", ".join(sorted(local)))
    return out


def cordon_state(node):
    """(unschedulable, cordoned_by): cordoned_by is ``hami.node``, ``operator`` or None."""
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    ann = _meta(node).get("annotations") or {}
    if not unschedulable:
        return False, None
    return True, OWNER if ann.get(CORDONED_BY) == OWNER else "operator"


def summarize(node):
    ann = _meta(node).get("annotations") or {}
    unschedulable, by = cordon_state(node)
    conds = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") == "True" for c in conds if c.get("type") == "Ready"), False)
    return {
        "name": _meta(node).get("name"),
        "unschedulable": unschedulable,
        "cordoned_by": by,
        "ready": ready,
        "maintenance": {k: ann[k] for k in OUR_ANNOTATIONS if k in ann},
        "resource_version": _meta(node).get("resourceVersion"),
    }


def _clip(text):
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_ANNOTATION_TEXT else text[: MAX_ANNOTATION_TEXT - 3] + "..."


class Maintenance:
    """One node's maintenance steps. ``api`` must provide get_node(name), patch_node(name, patch),
    list_pods(node), evict(namespace, name, delete_options), create_node_event(node, type, reason, msg);
    ``clock()`` returns seconds (monotonic) and ``sleep(s)`` waits."""

    def __init__(self, api, node_name, clock, sleep, check_mode=False, log=None):
        self.api = api
        self.name = node_name
        self.clock = clock
        self.sleep = sleep
        self.check_mode = check_mode
        self.actions = []
        self.log = log or (lambda _msg: None)

    # -- node writes: a merge patch carrying the resourceVersion; a conflict re-reads and decides again
    def _patch(self, decide):
        """``decide(node) -> patch or None``; returns (node, changed)."""
        for _attempt in range(PATCH_ATTEMPTS):
            node = self.api.get_node(self.name)
            patch = decide(node)
            if not patch:
                return node, False
            if self.check_mode:
                return node, True
            patch.setdefault("metadata", {})["resourceVersion"] = _meta(node).get("resourceVersion")
            try:
                return self.api.patch_node(self.name, patch), True
            except ApiError as exc:
                if exc.status != 409:
                    raise
        raise MaintenanceError(
            "node %s kept changing while we patched it (%d resourceVersion conflicts); re-run the play"
            % (self.name, PATCH_ATTEMPTS))

    def cordon(self, reason):
        """Cordon unless already cordoned. Returns (cordoned_by, changed)."""
        result = {}

        def decide(node):
            unschedulable, by = cordon_state(node)
            result["by"] = by
            if unschedulable:
                return None
            result["by"] = OWNER
            return {"spec": {"unschedulable": True},
                    "metadata": {"annotations": {CORDONED_BY: OWNER, REASON: _clip(reason),
                                                 STARTED: now_rfc3339()}}}

        _node, changed = self._patch(decide)
        if changed:
            self.actions.append("cordon %s (%s)" % (self.name, _clip(reason)))
        elif result.get("by") == OWNER:
            self.actions.append("%s is still cordoned by hami.node from an earlier run" % self.name)
        else:
            self.actions.append("%s was already cordoned by an operator: it stays cordoned afterwards"
                                % self.name)
        return result.get("by"), changed

    def uncordon(self):
        """Uncordon only a cordon of ours; always clear our annotations. Returns (uncordoned, changed)."""
        result = {"uncordoned": False}

        def decide(node):
            unschedulable, by = cordon_state(node)
            ann = _meta(node).get("annotations") or {}
            patch = {}
            ours = {k: None for k in OUR_ANNOTATIONS if k in ann}
            if by == OWNER:
                patch["spec"] = {"unschedulable": None}
                result["uncordoned"] = True
            if ours:
                patch["metadata"] = {"annotations": ours}
            result["left"] = by if by != OWNER else None
            return patch or None

        _node, changed = self._patch(decide)
        if result["uncordoned"]:
            self.actions.append("uncordon %s" % self.name)
        elif result.get("left") == "operator":
            self.actions.append("%s stays cordoned: an operator cordoned it" % self.name)
        return result["uncordoned"], changed

    def park(self, gate, runbook, message):
        """A failed gate: keep the node cordoned and say why, on the node and in an event."""
        text = _clip("gate %s failed: %s" % (gate, message))

        def decide(node):
            unschedulable, _by = cordon_state(node)
            ann = _meta(node).get("annotations") or {}
            want = {FAILED_GATE: gate, RUNBOOK: runbook}
            patch = {}
            if any(ann.get(k) != v for k, v in want.items()):
                patch["metadata"] = {"annotations": dict(want)}
            if not unschedulable:
                # somebody uncordoned it meanwhile: a node that failed a gate must not take pods
                patch["spec"] = {"unschedulable": True}
                patch.setdefault("metadata", {}).setdefault("annotations", {}).update(
                    {CORDONED_BY: OWNER, REASON: text, STARTED: now_rfc3339()})
            return patch or None

        _node, changed = self._patch(decide)
        if not self.check_mode:
            self.api.create_node_event(
                self.name, "Warning", "HamiMaintenanceGateFailed",
                _clip("%s; the node stays cordoned; runbook: %s" % (text, runbook)))
        self.actions.append("park %s: %s (runbook %s)" % (self.name, text, runbook))
        return changed

    def verify(self, expect_gpus, resource, timeout_s, decode_register, interval_s=2.0):
        """Poll the node until every API-side gate passes or ``timeout_s`` runs out; the last reading's
        {gate: (ok, detail)}."""
        deadline = self.clock() + timeout_s
        while True:
            gates = check_gates(self.api.get_node(self.name), expect_gpus, resource, decode_register)
            if all(ok for ok, _detail in gates.values()) or self.clock() + interval_s > deadline:
                return gates
            self.sleep(interval_s)

    # -- drain
    def plan_drain(self, mode, gpu_prefixes, force, delete_emptydir_data):
        pods = self.api.list_pods(self.name)
        evict, skipped = classify(pods, mode, gpu_prefixes)
        problems = refusals(evict, force, delete_emptydir_data)
        return evict, skipped, problems

    def drain(self, reason, mode, gpu_prefixes, force, delete_emptydir_data, timeout_s,
              grace_period=None, backoff_initial_s=1.0, backoff_max_s=30.0):
        """Cordon (unless cordoned), evict the selected pods through the Eviction API, wait until they
        are gone. Returns a result dict; raises MaintenanceError with the node still cordoned."""
        deadline = self.clock() + timeout_s
        evict, skipped, problems = self.plan_drain(mode, gpu_prefixes, force, delete_emptydir_data)
        if problems:
            raise MaintenanceError(
                "refusing to drain %s, nothing was changed: %s" % (self.name, "; ".join(problems)),
                skipped=skipped)
        by, cordoned = self.cordon(reason)
        result = {"cordoned_by": by, "cordoned": cordoned, "evicted": [], "skipped": skipped,
                  "budget_refusals": 0, "budget_wait_s": 0.0}
        if self.check_mode:
            result["evicted"] = [pod_key(p) for p in evict]
            self.actions.extend("evict %s" % k for k in result["evicted"])
            return result
        # pods scheduled between the plan and the cordon: classify again, now that no new pod can land
        evict, skipped, problems = self.plan_drain(mode, gpu_prefixes, force, delete_emptydir_data)
        result["skipped"] = skipped
        if problems:
            if cordoned:
                self.uncordon()  # nothing evicted yet: put the node back as it was
            raise MaintenanceError(
                "refusing to drain %s: %s; the cordon was taken back" % (self.name, "; ".join(problems)),
                **result)
        self._evict_all(evict, result, deadline, grace_period, backoff_initial_s, backoff_max_s)
        self._wait_gone(evict, result, deadline)
        return result

    def _evict_all(self, pods, result, deadline, grace_period, backoff_initial_s, backoff_max_s):
        pending = {pod_key(p): p for p in pods if not _meta(p).get("deletionTimestamp")}
        result["evicted"].extend(pod_key(p) for p in pods if _meta(p).get("deletionTimestamp"))
        delay = backoff_initial_s
        last_refusal = {}
        options = {"gracePeriodSeconds": grace_period} if grace_period is not None else None
        while pending:
            retry_after = 0.0
            for key in sorted(pending):
                pod = pending[key]
                md = _meta(pod)
                try:
                    self.api.evict(md.get("namespace", ""), md.get("name", ""), options)
                except ApiError as exc:
                    if exc.status == 404:
                        pending.pop(key)  # gone already
                        continue
                    if exc.status == 429:
                        result["budget_refusals"] += 1
                        last_refusal[key] = "; ".join(exc.causes()) or exc.message
                        retry_after = max(retry_after, exc.retry_after())
                        self.log("eviction of %s refused (429): %s" % (key, last_refusal[key]))
                        continue
                    if exc.status in (401, 403):
                        raise MaintenanceError(
                            "eviction of %s forbidden (%s): the kubeconfig needs create on pods/eviction; "
                            "the node stays cordoned" % (key, exc.message), **result) from None
                    if exc.status >= 500 and "more than one PodDisruptionBudget" not in exc.message:
                        last_refusal[key] = "%s %s" % (exc.status, exc.message)
                        continue  # a server hiccup: try again with the others after the backoff
                    raise MaintenanceError(
                        "eviction of %s failed: %s %s; the node stays cordoned" % (key, exc.status,
                                                                                  exc.message),
                        **result) from None
                pending.pop(key)
                result["evicted"].append(key)
                self.actions.append("evict %s" % key)
            if not pending:
                break
            wait = min(max(delay, retry_after), backoff_max_s)
            wait *= 1 + random.uniform(0, 0.1)  # jitter: many controllers retrying in step hammer the server
            if self.clock() + wait > deadline:
                causes = "; ".join("%s: %s" % (k, last_refusal.get(k, "?")) for k in sorted(pending))
                raise MaintenanceError(
                    "timed out evicting pods from %s: %s still refused: %s. The node stays cordoned: give "
                    "the workload room (scale it up, relax its PodDisruptionBudget) or raise the timeout, "
                    "then re-run" % (self.name, ", ".join(sorted(pending)), causes),
                    **result)
            self.sleep(wait)
            result["budget_wait_s"] += wait
            delay = min(delay * 2, backoff_max_s)

    def _wait_gone(self, pods, result, deadline):
        uids = {_meta(p).get("uid"): pod_key(p) for p in pods}
        delay = 0.5
        while True:
            left = sorted(uids[_meta(p).get("uid")] for p in self.api.list_pods(self.name)
                          if _meta(p).get("uid") in uids)
            if not left:
                return
            if self.clock() + delay > deadline:
                raise MaintenanceError(
                    "timed out waiting for evicted pods to leave %s: %s still there (a pod stays "
                    "Terminating until its kubelet confirms; check the node's kubelet). The node stays "
                    "cordoned" % (self.name, ", ".join(left)), **result)
            self.sleep(delay)
            delay = min(delay * 2, 5.0)


def registered_gpus(node, decode_register):
    """{uuid: healthy} from the node's hami.io/node-nvidia-register (None when it cannot be decoded)."""
    value = (_meta(node).get("annotations") or {}).get("hami.io/node-nvidia-register")
    if not value:
        return {}
    try:
        return {d["id"]: bool(d.get("health")) for d in decode_register(value)}
    except ValueError:
        return None


def check_gates(node, expect_gpus, resource, decode_register):
    """The API-side gates on one reading of the node: {gate: (ok, detail)}.

    node_ready: the Ready condition is True. device_plugin: the kubelet advertises ``resource`` and, when
    ``expect_gpus`` is a list, HAMi's register annotation lists each of them healthy."""
    s = summarize(node)
    gates = {"node_ready": (s["ready"], "Ready condition %s" % ("True" if s["ready"] else "not True"))}
    alloc = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
    try:
        count = int(str(alloc))
    except ValueError:
        count = 0
    if count <= 0:
        gates["device_plugin"] = (False, "allocatable %s is %s: the device plugin has not registered"
                                  % (resource, alloc))
    elif expect_gpus is None:
        gates["device_plugin"] = (True, "allocatable %s=%d" % (resource, count))
    else:
        reg = registered_gpus(node, decode_register)
        if reg is None:
            gates["device_plugin"] = (False, "hami.io/node-nvidia-register cannot be decoded")
        else:
            missing = sorted(u for u in expect_gpus if u not in reg)
            sick = sorted(u for u in expect_gpus if u in reg and not reg[u])
            ok = not missing and not sick
            detail = "allocatable %s=%d; registered %d of %d expected GPUs healthy" % (
                resource, count, len(expect_gpus) - len(missing) - len(sick), len(expect_gpus))
            if missing:
                detail += "; missing %s" % ", ".join(missing)
            if sick:
                detail += "; unhealthy %s" % ", ".join(sick)
            gates["device_plugin"] = (ok, detail)
    return gates
