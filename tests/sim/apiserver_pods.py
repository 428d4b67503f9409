"""What kube-apiserver adds to a pod before anyone else sees it: defaulting and the default mutating
admission plugins, so a pod here is as large and as full as in a cluster (a client never sees the bare
~1 KB object a test writes; a real pod is 4-8 KB with managedFields, tests/sim/apiserver_managed.py).

* Defaulting (kubernetes ``pkg/apis/core/v1/defaults.go``): ``SetDefaults_Pod`` copies a container's
  limits into its missing requests (extended resources included); ``SetDefaults_PodSpec`` sets
  ``dnsPolicy``, ``restartPolicy``, ``terminationGracePeriodSeconds``, ``securityContext``,
  ``schedulerName``, ``enableServiceLinks``; ``SetDefaults_Container`` the termination message and the
  image pull policy; ``SetDefaults_ContainerPort`` the protocol.
* Admission (``plugin/pkg/admission``): ``serviceaccount`` (the ``default`` account and its projected token
  volume ``kube-api-access-<5>``, mounted in every container), ``defaulttolerationseconds`` (tolerate
  not-ready and unreachable for 300 s), ``priority`` (priority 0 and ``PreemptLowerPriority`` for a pod
  without a class; a class is not resolved here: tests set ``spec.priority`` themselves, which the real
  plugin refuses — docs/testing.md).
* ``podStrategy.PrepareForCreate`` (``pkg/registry/core/pod/strategy.go``): status is phase ``Pending`` and
  the QoS class (``pkg/apis/core/helper/qos``).

Only missing fields are filled: what a test sets stays as it set it.
"""

from __future__ import annotations

import secrets
from typing import Any

Obj = dict[str, Any]

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOLERATION_SECONDS = 300  # --default-not-ready-toleration-seconds, --default-unreachable-toleration-seconds
_COMPUTE = ("cpu", "memory")


def default_pod(pod: Obj) -> None:
    """Fill ``pod`` in place as kube-apiserver does on create (defaulting, then the mutating plugins)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return  # validation's business; nothing to default
    containers = [c for key in ("initContainers", "containers") for c in spec.get(key) or []
                  if isinstance(c, dict)]
    for c in containers:
        _default_container(c)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    _service_account(spec, containers)
    _default_tolerations(spec)
    if "priority" not in spec and not spec.get("priorityClassName"):
        spec["priority"] = 0
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")


def install(store: Any) -> None:
    """Register the pod write rules in ``store`` (``Store.strategies``)."""
    store.strategies["pods"] = pod_strategy


def pod_strategy(old: Obj | None, new: Obj, _subresource: str | None, seed: bool) -> None:
    """On create: the defaults and default admission plugins, and the status a create starts with (a test
    helper's seeded status is kept, with its QoS class)."""
    if old is not None:
        return
    default_pod(new)
    if seed:
        new.setdefault("status", {}).setdefault("qosClass", qos_class(new))
    else:
        new["status"] = {"phase": "Pending", "qosClass": qos_class(new)}


def qos_class(pod: Obj) -> str:
    """``GetPodQOS``: Guaranteed when every container limits cpu and memory and requests what it limits;
    BestEffort when none asks for either; Burstable otherwise."""
    spec = pod.get("spec") or {}
    containers = [c for key in ("initContainers", "containers") for c in spec.get(key) or []
                  if isinstance(c, dict)]
    any_compute, guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        if any(r in limits or r in requests for r in _COMPUTE):
            any_compute = True
        if not all(r in limits and requests.get(r, limits[r]) == limits[r] for r in _COMPUTE):
            guaranteed = False
    if not any_compute:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _default_container(c: Obj) -> None:
    res = c.get("resources")
    if res is None:
        c["resources"] = {}
    elif isinstance(res, dict) and isinstance(res.get("limits"), dict) and res["limits"]:
        requests = res.setdefault("requests", {})
        if isinstance(requests, dict):
            for name, qty in res["limits"].items():
                requests.setdefault(name, qty)
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if "imagePullPolicy" not in c:
        image = str(c.get("image") or "")
        tag = image.rpartition("/")[2].partition(":")[2] if "@" not in image else "digest"
        c["imagePullPolicy"] = "Always" if tag in ("", "latest") else "IfNotPresent"
    for port in c.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")


def _service_account(spec: Obj, containers: list[Obj]) -> None:
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    if spec.get("automountServiceAccountToken") is False:
        return
    if any(m.get("mountPath") == SERVICE_ACCOUNT_MOUNT for c in containers
           for m in c.get("volumeMounts") or [] if isinstance(m, dict)):
        return
    name = "kube-api-access-" + "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
    spec.setdefault("volumes", []).append({"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})
    for c in containers:
        c.setdefault("volumeMounts", []).append({"name": name, "readOnly": True,
                                                 "mountPath": SERVICE_ACCOUNT_MOUNT})


def _default_tolerations(spec: Obj) -> None:
    tolerations = spec.setdefault("tolerations", [])
    if not isinstance(tolerations, list):
        return
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if any(isinstance(t, dict) and t.get("effect") in ("NoExecute", None, "") and
               (t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"))
               for t in tolerations):
            continue
        tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                            "tolerationSeconds": TOLERATION_SECONDS})


__all__ = ["default_pod", "install", "pod_strategy", "qos_class"]
