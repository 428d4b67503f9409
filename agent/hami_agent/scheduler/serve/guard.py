"""The allocation guard as a validating webhook (``/validate``): the admission policies' rules where the
cluster cannot run them (issue 27 item 1).

The ``hami_rbac`` role ships the rules as ValidatingAdmissionPolicies (``hami-allocation-keys``,
``hami-scheduled-gpu-pods``; admissionregistration.k8s.io/v1, Kubernetes >= 1.30). A cluster that does not
serve them (older than 1.30, or the API disabled) gets the same two rules from this endpoint instead,
registered by a ValidatingWebhookConfiguration with ``failurePolicy: Fail`` (the ``hami_scheduler`` role's
``guard-webhook.yaml.j2``; applied by ``hami_rbac``'s ``admission`` entry point only when the policies cannot
be):

1. **allocation keys**: a pod CREATE or UPDATE (``pods``, ``pods/status``, ``pods/ephemeralcontainers``) or a
   ``pods/binding`` CREATE that sets, changes or removes a HAMi allocation annotation (``SCHEDULER_OWNED``, or
   any ``hami.io/<vendor>-devices-(to-)allocate(d)``) or the ``hami.io/vgpu-node`` label is refused unless
   the caller is the scheduler's ServiceAccount, or the device plugin of the node the pod is bound to
   (``<plugin prefix><oldObject.spec.nodeName>``) writing only its own keys;
2. **no rivals**: a pod CREATE that requests a HAMi resource with ``spec.nodeName`` set or a
   ``schedulerName`` other than HAMi's is refused unless the scheduler creates it.

Refusals are ``allowed: false`` with status 403 ``Forbidden`` and the policies' wording (the API server
answers ``admission webhook "allocation-guard.hami.io" denied the request: <message>``); an allowed write
of an allocation key carries the audit annotation ``writer`` (the policy's ``auditAnnotations``). A test
evaluates the role's policies (cel-python) and this code on the same requests and requires the same
decision (tests/integration/security/test_guard_webhook.py).

Unlike the policies, this is a network hop on the path of every matching pod write: with
``failurePolicy: Fail`` those writes fail while no replica answers. That is the price of enforcing the rule
on an old cluster; docs/security.md says where the policies are the better place."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from hami_agent.protocol import keys
from hami_agent.protocol.names import label_error, subdomain_error
from hami_agent.protocol.requests import hami_resource_names
from hami_agent.scheduler.serve.webhook import SCHEDULER_OWNED
from hami_agent.scheduler.verbs.args import BadRequest

logger = logging.getLogger(__name__)

ALLOCATION_POLICY = "hami-allocation-keys"
GPU_POD_POLICY = "hami-scheduled-gpu-pods"
LABEL_KEYS = (keys.VGPU_NODE,)
# what a node's device plugin writes on a pod bound to its node (= hami_rbac_device_plugin_pod_keys)
PLUGIN_KEYS = (keys.DEVICES_TO_ALLOCATE, keys.BIND_PHASE, keys.MIG_ALLOCATIONS)
DEFAULT_SCHEDULER_USER = "system:serviceaccount:kube-system:hami-scheduler"
DEFAULT_PLUGIN_PREFIX = "system:serviceaccount:kube-system:hami-device-plugin-"
POD_SUBRESOURCES = ("", "status", "ephemeralcontainers")


def _protected(key: str) -> bool:
    return key in SCHEDULER_OWNED or (key.startswith("hami.io/") and (
        key.endswith("-devices-to-allocate") or key.endswith("-devices-allocated")))


def _map(obj: Any, field: str, where: str) -> dict:
    """``obj.metadata.<field>`` as a dict of strings ({} when absent); BadRequest naming the field."""
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise BadRequest(f"{where}: want an object")
    md = obj.get("metadata")
    if md is None:
        return {}
    if not isinstance(md, dict):
        raise BadRequest(f"{where}.metadata: want an object")
    value = md.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise BadRequest(f"{where}.metadata.{field}: want a map of strings")
    return value


def _str(obj: Any, path: Iterable[str], where: str) -> str:
    cur = obj
    for part in path:
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if not isinstance(cur, str):
        raise BadRequest(f"{where}.{'.'.join(path)}: want a string")
    return cur


class AllocationGuard:
    def __init__(self, scheduler_user: str = DEFAULT_SCHEDULER_USER,
                 plugin_prefix: str = DEFAULT_PLUGIN_PREFIX,
                 scheduler_names: Iterable[str] = ("hami-scheduler",), names: Any = None) -> None:
        self.scheduler_user = scheduler_user
        self.plugin_prefix = plugin_prefix
        self.scheduler_names = tuple(scheduler_names)
        self.hami_resources = hami_resource_names(names)

    # -- AdmissionReview in, AdmissionReview out
    def review(self, body: Any) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
            raise BadRequest("AdmissionReview.request: missing or not an object")
        req = body["request"]
        uid = req.get("uid")
        if not isinstance(uid, str) or not uid:
            raise BadRequest("AdmissionReview.request.uid: missing")
        api_version = body.get("apiVersion") or "admission.k8s.io/v1"
        if not isinstance(api_version, str):
            raise BadRequest("AdmissionReview.apiVersion: must be a string such as \"admission.k8s.io/v1\"")
        resp = self.admit(req)
        resp["uid"] = uid
        return {"apiVersion": api_version, "kind": "AdmissionReview", "response": resp}

    def admit(self, req: dict) -> dict:
        where = "AdmissionReview.request"
        resource = _str(req, ("resource", "resource"), where)
        sub = _str(req, ("subResource",), where)
        op = _str(req, ("operation",), where)
        user = _str(req, ("userInfo", "username"), where)
        for field, check in (("namespace", label_error), ("name", subdomain_error)):
            value = _str(req, (field,), where)
            if value and check(value):
                raise BadRequest(f"{where}.{field}: {check(value)}")
        if resource != "pods" or op not in ("CREATE", "UPDATE"):
            return {"allowed": True}
        obj, old = req.get("object"), req.get("oldObject") if op == "UPDATE" else None
        if sub == "binding":
            if op != "CREATE":
                return {"allowed": True}
            old = None  # a Binding has no old pod: nobody but the scheduler may carry keys on it
        elif sub not in POD_SUBRESOURCES:
            return {"allowed": True}
        out = self._allocation_keys(obj, old, op, user, sub, where)
        if out["allowed"] and op == "CREATE" and sub == "":
            return self._rival(obj, user, where) if user != self.scheduler_user else out
        return out

    # -- rule 1
    def _allocation_keys(self, obj: Any, old: Any, op: str, user: str, sub: str, where: str) -> dict:
        new_ann = _map(obj, "annotations", f"{where}.object")
        old_ann = _map(old, "annotations", f"{where}.oldObject")
        new_lab = _map(obj, "labels", f"{where}.object")
        old_lab = _map(old, "labels", f"{where}.oldObject")
        changed = [k for k in new_ann if _protected(k) and (k not in old_ann or old_ann[k] != new_ann[k])]
        changed += [k for k in old_ann if _protected(k) and k not in new_ann]
        labels = [k for k in LABEL_KEYS if (k in new_lab) != (k in old_lab)
                  or (k in new_lab and new_lab[k] != old_lab[k])]
        if not changed and not labels:
            return {"allowed": True}
        node = _str(old, ("spec", "nodeName"), f"{where}.oldObject") if op == "UPDATE" and sub != "binding" \
            else ""
        plugin = bool(node) and user == self.plugin_prefix + node
        if user == self.scheduler_user or (plugin and not labels and all(k in PLUGIN_KEYS for k in changed)):
            return {"allowed": True,
                    "auditAnnotations": {"writer": f"{user} wrote {', '.join(changed + labels)}"}}
        what = ", ".join([f"annotation {k}" for k in changed] + [f"label {k}" for k in labels])
        return _deny(f"rule {ALLOCATION_POLICY}: {user} may not set, change or remove {what}; only the "
                     f"scheduler ({self.scheduler_user}) writes HAMi allocation keys, and the device plugin "
                     f"of the node a pod is bound to ({self.plugin_prefix}<node>) writes "
                     f"{', '.join(PLUGIN_KEYS)} there")

    # -- rule 2
    def _rival(self, obj: Any, user: str, where: str) -> dict:
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if not isinstance(spec, dict):
            return {"allowed": True}
        asks = False
        for kind in ("initContainers", "containers"):
            containers = spec.get(kind) or []
            if not isinstance(containers, list):
                raise BadRequest(f"{where}.object.spec.{kind}: want a list")
            for i, c in enumerate(containers):
                res = c.get("resources") if isinstance(c, dict) else None
                if res is None:
                    continue
                if not isinstance(res, dict):
                    raise BadRequest(f"{where}.object.spec.{kind}[{i}].resources: want an object")
                for section in ("limits", "requests"):
                    values = res.get(section) or {}
                    if not isinstance(values, dict):
                        raise BadRequest(f"{where}.object.spec.{kind}[{i}].resources.{section}: want an "
                                         "object")
                    asks = asks or any(n in values for n in self.hami_resources)
        if not asks:
            return {"allowed": True}
        node = _str(obj, ("spec", "nodeName"), f"{where}.object")
        sched = _str(obj, ("spec", "schedulerName"), f"{where}.object") or "default-scheduler"
        if not node and sched in self.scheduler_names:
            return {"allowed": True}
        why = f"with spec.nodeName {node} already set" if node else f"for scheduler {sched}"
        names = " or ".join(self.scheduler_names)
        return _deny(f"rule {GPU_POD_POLICY}: {user} may not create a pod that requests HAMi resources "
                     f"{why}; such a pod is placed by the HAMi scheduler (schedulerName {names}, no "
                     "spec.nodeName), else it competes with the pods HAMi placed on that node for their "
                     "devices")


def _deny(message: str) -> dict:
    return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": message}}


__all__ = ["AllocationGuard", "GPU_POD_POLICY", "PLUGIN_KEYS"]
