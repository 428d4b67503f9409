"""Mutating admission webhook (``/webhook``, AdmissionReview v1, JSONPatch response; Project-HAMi/HAMi
``pkg/scheduler/webhook.go``).

For pods with HAMi resources: set ``schedulerName``, add ``nvidia.com/gpu`` when only memory/cores are
given, the exclusive default (``gpucores: 100``), ``CUDA_TASK_PRIORITY`` and
``GPU_CORE_UTILIZATION_POLICY`` envs; deny privileged GPU containers, pods with ``nodeName`` preset or
another scheduler's ``schedulerName`` (rivals of the pods HAMi places, issue 27 item 3), and pods over the
namespace quota; strip scheduler-owned ``hami.io/*`` annotations a user set.

The webhook is not a security control: tenants can skip it (``hami.io/webhook=ignore``, their own
``schedulerName``) and it never sees an UPDATE. What keeps allocation keys honest is the admission rule
the ``hami_rbac`` role ships (a ValidatingAdmissionPolicy, docs/security.md), which refuses any write of
``SCHEDULER_OWNED`` by anyone but the scheduler and the device plugin of the pod's node.

Total on any JSON: ``review``/``admit`` check the shape of every field they read first (the same checks
``shapes`` runs in front of the HTTP route, so a direct caller gets them too) and answer ``BadRequest``
naming the field, never another exception."""

from __future__ import annotations

import base64
import copy
import json
import logging
from typing import Any

from hami_agent.httpserve import HTTPError
from hami_agent.protocol import keys
from hami_agent.protocol.names import label_error, subdomain_error
from hami_agent.protocol.requests import has_hami_resources, resource_int, webhook_resource_defaults
from hami_agent.scheduler.serve import shapes
from hami_agent.scheduler.verbs.extender import BadRequest, SchedulerConfig

logger = logging.getLogger(__name__)

# Annotations only the scheduler / device plugin may write on a pod. The hami_rbac role's admission policy
# protects the same list (hami_rbac_allocation_annotations; a test keeps the two equal).
SCHEDULER_OWNED = (keys.VGPU_NODE, keys.VGPU_TIME, keys.DEVICES_TO_ALLOCATE, keys.DEVICES_ALLOCATED,
                   keys.MIG_ALLOCATIONS, keys.BIND_PHASE, keys.BIND_TIME, keys.PREEMPTION_HOLD)
DEFAULT_SCHEDULER = "default-scheduler"


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


class Webhook:
    def __init__(self, config: SchedulerConfig, quota: Any = None, namespace_labels: Any = None) -> None:
        """``quota(ns) -> (mem_left|None, cores_left|None) | None``;
        ``namespace_labels(ns) -> dict`` (both optional: without an API client they are skipped)."""
        self.config = config
        self.quota = quota
        self.namespace_labels = namespace_labels

    def review(self, body: Any) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
            raise BadRequest("AdmissionReview.request: missing or not an object")
        req = body["request"]
        uid = req.get("uid")
        if not isinstance(uid, str):
            raise BadRequest("AdmissionReview.request.uid: missing")
        api_version = body.get("apiVersion")
        if api_version is None:
            api_version = "admission.k8s.io/v1"
        elif not isinstance(api_version, str):
            raise BadRequest("AdmissionReview.apiVersion: must be a string such as \"admission.k8s.io/v1\"")
        resp = self.admit(req)
        resp["uid"] = uid
        return {"apiVersion": api_version, "kind": "AdmissionReview", "response": resp}

    def admit(self, req: Any) -> dict:
        _check_request(req)
        _check_names(req)
        pod = req.get("object")
        kind = (req.get("kind") or {}).get("kind")  # the webhook is registered for pods only
        creating = req.get("operation", "CREATE") == "CREATE"
        if not creating or not isinstance(pod, dict) or kind not in (None, "Pod"):
            return {"allowed": True}
        ns = req.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default"
        names = self.config.names
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(keys.WEBHOOK_IGNORE_LABEL) == "ignore":
            return {"allowed": True}
        if self.namespace_labels is not None:
            try:
                if (self.namespace_labels(ns) or {}).get(keys.WEBHOOK_IGNORE_LABEL) == "ignore":
                    return {"allowed": True}
            except Exception as exc:
                logger.warning("webhook: reading namespace %s labels failed: %s", ns, exc)
        spec = pod.get("spec") or {}
        sched = spec.get("schedulerName") or ""
        if sched and sched not in (DEFAULT_SCHEDULER, self.config.scheduler_name):
            # another scheduler's pod is not ours to mutate, but one that asks for a HAMi resource would reach
            # a node as a rival of the pod HAMi locked it for (issue 27 item 3; the admission rule
            # hami-scheduled-gpu-pods refuses it whatever the labels)
            for kind in ("initContainers", "containers"):
                for c in spec.get(kind) or []:
                    if has_hami_resources(c, names):
                        return _deny(f"pod requests HAMi resources but schedulerName is {sched}: set "
                                     f"schedulerName {self.config.scheduler_name} (HAMi places pods that use "
                                     "its resources)")
            return {"allowed": True}
        new = copy.deepcopy(pod)
        nspec = new.setdefault("spec", {})
        gpu_containers = 0
        for kind in ("initContainers", "containers"):
            for c in nspec.get(kind) or []:
                add = webhook_resource_defaults(c, names)
                if add:  # a present null (resources/limits: null) is an empty object, as in Go
                    res = c["resources"] = c.get("resources") or {}
                    res["limits"] = {**(res.get("limits") or {}), **add}
                if not has_hami_resources(c, names):
                    if self.config.overwrite_env:
                        self._set_env(c, "NVIDIA_VISIBLE_DEVICES", "none")
                    continue
                gpu_containers += 1
                sc = c.get("securityContext") or {}
                if sc.get("privileged"):
                    return _deny(f"container {c.get('name')} is privileged")
                prio = resource_int(c, names.resource_priority_name)
                if prio is not None:
                    self._set_env(c, "CUDA_TASK_PRIORITY", str(prio))
                if self.config.gpu_core_policy not in ("", "default"):
                    self._set_env(c, "GPU_CORE_UTILIZATION_POLICY", self.config.gpu_core_policy)
        if gpu_containers == 0:
            return {"allowed": True}
        if spec.get("nodeName"):
            return _deny("pod has node assigned")
        if not self._quota_ok(new, ns):
            return _deny("exceeding resource quota")
        if sched == "" or (sched == DEFAULT_SCHEDULER and self.config.force_overwrite_default_scheduler):
            nspec["schedulerName"] = self.config.scheduler_name
        if self.config.runtime_class_name and not spec.get("runtimeClassName"):
            nspec["runtimeClassName"] = self.config.runtime_class_name
        ops = self._diff(pod, new)
        out: dict[str, Any] = {"allowed": True}
        if ops:
            out["patchType"] = "JSONPatch"
            out["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        return out

    @staticmethod
    def _set_env(c: dict, name: str, value: str) -> None:
        env = c["env"] = c.get("env") or []
        for e in env:
            if e.get("name") == name:
                e["value"] = value
                e.pop("valueFrom", None)
                return
        env.append({"name": name, "value": value})

    def _quota_ok(self, pod: dict, ns: str) -> bool:
        if self.quota is None:
            return True
        try:
            left = self.quota(ns)
        except Exception as exc:
            logger.warning("webhook: quota lookup for %s failed: %s", ns, exc)
            return True
        if left is None:
            return True
        mem_left, cores_left = left
        mem = cores = 0
        names = self.config.names
        for c in (pod.get("spec") or {}).get("containers") or []:
            n = resource_int(c, names.resource_count_name) or 0
            mem += n * (resource_int(c, names.resource_memory_name) or 0) * names.memory_factor
            cores += n * (resource_int(c, names.resource_core_name) or 0)
        return (mem_left is None or mem <= mem_left) and (cores_left is None or cores <= cores_left)

    @staticmethod
    def _diff(old: dict, new: dict) -> list[dict]:
        ops: list[dict] = []
        ann = (old.get("metadata") or {}).get("annotations") or {}
        for k in SCHEDULER_OWNED:
            if k in ann:  # the scheduler's to write; a user value would fake an allocation
                ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(k)}"})
        ospec, nspec = old.get("spec") or {}, new.get("spec") or {}
        for field in ("schedulerName", "runtimeClassName"):
            if nspec.get(field) != ospec.get(field):
                ops.append({"op": "add", "path": f"/spec/{field}", "value": nspec[field]})
        for kind in ("initContainers", "containers"):
            for i, (oc, nc) in enumerate(zip(ospec.get(kind) or [], nspec.get(kind) or [], strict=True)):
                if oc.get("resources") != nc.get("resources"):
                    ops.append({"op": "add", "path": f"/spec/{kind}/{i}/resources", "value": nc["resources"]})
                if oc.get("env") != nc.get("env"):
                    ops.append({"op": "add", "path": f"/spec/{kind}/{i}/env", "value": nc["env"]})
        return ops


def _check_request(req: Any) -> None:
    """Refuse, naming the field, a request whose fields the webhook reads have the wrong type (the
    ``shapes`` checks: a null or non-object spec/metadata, containers/env that are not lists of objects,
    non-string names, labels, annotations or quantities)."""
    if not isinstance(req, dict):
        raise BadRequest("AdmissionReview.request: missing or not an object")
    # the request uid is review()'s business (admit() is also called with a bare request)
    try:
        shapes.admission_review({"request": {**req, "uid": req.get("uid") if isinstance(req.get("uid"), str)
                                             else ""}})
    except HTTPError as exc:
        raise BadRequest(exc.message) from None


def _check_names(req: dict) -> None:
    """The namespace and pod name a review carries, checked before any use (the namespace's labels and
    quota are read from the API by it). Mutating admission runs before the API server validates the
    object, so a name may be empty (``generateName``) but, when given, must be one the server accepts."""
    obj = req.get("object") if isinstance(req.get("object"), dict) else {}
    md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    for field, value, check in (("AdmissionReview.request.namespace", req.get("namespace"), label_error),
                                ("AdmissionReview.request.name", req.get("name"), subdomain_error),
                                ("AdmissionReview.request.object.metadata.namespace", md.get("namespace"),
                                 label_error),
                                ("AdmissionReview.request.object.metadata.name", md.get("name"),
                                 subdomain_error)):
        if value in (None, ""):
            continue
        err = check(value)
        if err:
            raise BadRequest(f"{field}: {err}")


def _deny(message: str) -> dict:
    return {"allowed": False, "status": {"code": 400, "reason": "BadRequest", "message": message}}


def quota_left_fn(extender: Any):
    """Adapter: the extender's quota cache as the webhook's ``quota(ns)`` callable."""
    def quota(ns: str):
        b = extender._quota_budget(ns)
        return None if b is None else (b.mem_left, b.cores_left)
    return quota


__all__ = ["SCHEDULER_OWNED", "Webhook", "quota_left_fn"]
