"""Request-shape validation in front of the extender and webhook handlers.

kube-scheduler and the API server send Go structs (``k8s.io/kube-scheduler/extender/v1``
``ExtenderArgs``/``ExtenderBindingArgs``, ``admission.k8s.io/v1`` ``AdmissionReview``) whose field types
are fixed; a body with another type in a field the handlers read (containers as a string, annotations
as a list, ``NodeNames: [1, null]``, ``Nodes: "x"``) did not come from them. It is refused here with a
400 that names the field and the type expected, so the handlers only ever see well-typed input.

Field names are matched case-insensitively, as Go's encoding/json does."""

from __future__ import annotations

from typing import Any

from hami_agent.httpserve import HTTPError
from hami_agent.scheduler.verbs.args import field_ci, names_known_valid


def _type(v: Any) -> str:
    if v is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(v), type(v).__name__)


def _bad(path: str, want: str, got: Any) -> HTTPError:
    return HTTPError(400, f"{path}: want {want}, got {_type(got)}")


def _obj(v: Any, path: str, required: bool = False) -> dict | None:
    if v is None and not required:
        return None
    if not isinstance(v, dict):
        raise _bad(path, "an object", v)
    return v


def _str(v: Any, path: str) -> None:
    if v is not None and not isinstance(v, str):
        raise _bad(path, "a string", v)


def _str_map(v: Any, path: str) -> None:
    if _obj(v, path) is None:
        return
    for k, val in v.items():
        if not isinstance(val, str):
            raise _bad(f"{path}[{k!r}]", "a string value (Kubernetes maps are string to string)", val)


def _list(v: Any, path: str) -> list | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise _bad(path, "a list", v)
    return v


def _quantities(v: Any, path: str) -> None:
    if _obj(v, path) is None:
        return
    for k, q in v.items():
        if isinstance(q, bool) or not isinstance(q, (str, int, float)):
            raise _bad(f"{path}[{k!r}]", "a quantity (a string such as \"4000\" or a number)", q)


def validate_pod(pod: Any, path: str) -> None:
    """The parts of a core/v1 Pod the scheduler and webhook read. ``metadata`` and ``spec`` are Go
    structs (never null on the wire: kube-scheduler and the API server always send objects), so a
    present null is refused like any other wrong type."""
    _obj(pod, path, required=True)
    for f in ("metadata", "spec"):
        if f in pod and pod[f] is None:
            raise _bad(f"{path}.{f}", "an object", None)
    meta = _obj(pod.get("metadata"), f"{path}.metadata")
    if meta is not None:
        for f in ("name", "namespace", "uid", "generateName", "resourceVersion"):
            _str(meta.get(f), f"{path}.metadata.{f}")
        _str_map(meta.get("annotations"), f"{path}.metadata.annotations")
        _str_map(meta.get("labels"), f"{path}.metadata.labels")
        _str(meta.get("deletionTimestamp"), f"{path}.metadata.deletionTimestamp")
    spec = _obj(pod.get("spec"), f"{path}.spec")
    if spec is not None:
        for f in ("schedulerName", "nodeName", "runtimeClassName", "priorityClassName"):
            _str(spec.get(f), f"{path}.spec.{f}")
        for kind in ("initContainers", "containers"):
            for i, c in enumerate(_list(spec.get(kind), f"{path}.spec.{kind}") or []):
                cpath = f"{path}.spec.{kind}[{i}]"
                _obj(c, cpath, required=True)
                _str(c.get("name"), f"{cpath}.name")
                res = _obj(c.get("resources"), f"{cpath}.resources")
                if res is not None:
                    _quantities(res.get("limits"), f"{cpath}.resources.limits")
                    _quantities(res.get("requests"), f"{cpath}.resources.requests")
                for j, e in enumerate(_list(c.get("env"), f"{cpath}.env") or []):
                    _obj(e, f"{cpath}.env[{j}]", required=True)
                    _str(e.get("name"), f"{cpath}.env[{j}].name")
                sc = _obj(c.get("securityContext"), f"{cpath}.securityContext")
                priv = sc.get("privileged") if sc is not None else None
                if priv is not None and not isinstance(priv, bool):
                    raise _bad(f"{cpath}.securityContext.privileged", "a boolean", priv)
    status = _obj(pod.get("status"), f"{path}.status")
    if status is not None:
        _str(status.get("phase"), f"{path}.status.phase")
        for kind in ("initContainerStatuses", "containerStatuses"):
            for i, cs in enumerate(_list(status.get(kind), f"{path}.status.{kind}") or []):
                _obj(cs, f"{path}.status.{kind}[{i}]", required=True)


def extender_args(body: Any) -> dict:
    """``ExtenderArgs`` (/filter, /prioritize): Pod, and NodeNames (nodeCacheCapable) or Nodes."""
    _obj(body, "ExtenderArgs", required=True)
    pod = field_ci(body, "Pod")
    if pod is None:
        raise HTTPError(400, "ExtenderArgs.Pod: missing; kube-scheduler sends the pod being scheduled")
    validate_pod(pod, "ExtenderArgs.Pod")
    names = _list(field_ci(body, "NodeNames"), "ExtenderArgs.NodeNames") or []
    try:
        # the list kube-scheduler sent last time (a comparison), or C speed for its 5,000 names; a Python
        # loop cost ~0.5 ms per /filter
        names_known_valid(names) or "".join(names)
    except TypeError:
        i, n = next((i, n) for i, n in enumerate(names) if not isinstance(n, str))
        raise _bad(f"ExtenderArgs.NodeNames[{i}]", "a node name (string)", n) from None
    nodes = _obj(field_ci(body, "Nodes"), "ExtenderArgs.Nodes")
    if nodes is not None:
        for i, n in enumerate(_list(field_ci(nodes, "items"), "ExtenderArgs.Nodes.items") or []):
            _obj(n, f"ExtenderArgs.Nodes.items[{i}]", required=True)
            meta = _obj(n.get("metadata"), f"ExtenderArgs.Nodes.items[{i}].metadata", required=True)
            if not isinstance(meta.get("name"), str):
                raise _bad(f"ExtenderArgs.Nodes.items[{i}].metadata.name", "a node name (string)",
                           meta.get("name"))
    return body


def preemption_args(body: Any) -> dict:
    """``ExtenderPreemptionArgs`` (/preempt): Pod, and NodeNameToMetaVictims (nodeCacheCapable: victims by
    UID) or NodeNameToVictims (whole pods), each node's ``{"Pods": [...], "NumPDBViolations": n}``."""
    _obj(body, "ExtenderPreemptionArgs", required=True)
    pod = field_ci(body, "Pod")
    if pod is None:
        raise HTTPError(400, "ExtenderPreemptionArgs.Pod: missing; kube-scheduler sends the preemptor")
    validate_pod(pod, "ExtenderPreemptionArgs.Pod")
    for field in ("NodeNameToMetaVictims", "NodeNameToVictims"):
        nodes = _obj(field_ci(body, field), f"ExtenderPreemptionArgs.{field}") or {}
        for node, v in nodes.items():
            path = f"ExtenderPreemptionArgs.{field}[{node!r}]"
            _obj(v, path, required=True)
            for i, p in enumerate(_list(field_ci(v, "Pods"), f"{path}.Pods") or []):
                _obj(p, f"{path}.Pods[{i}]", required=True)
            n = field_ci(v, "NumPDBViolations")
            if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
                raise _bad(f"{path}.NumPDBViolations", "a number", n)
    return body


def binding_args(body: Any) -> dict:
    """``ExtenderBindingArgs`` (/bind): PodName, PodNamespace, PodUID, Node."""
    _obj(body, "ExtenderBindingArgs", required=True)
    for f in ("PodName", "PodNamespace", "PodUID", "Node"):
        _str(field_ci(body, f), f"ExtenderBindingArgs.{f}")
    return body


def admission_review(body: Any) -> dict:
    """``AdmissionReview`` (admission.k8s.io/v1 or v1beta1) with a pod ``request``."""
    _obj(body, "AdmissionReview", required=True)
    req = _obj(body.get("request"), "AdmissionReview.request", required=True)
    for f in ("uid", "operation", "namespace", "name"):
        _str(req.get(f), f"AdmissionReview.request.{f}")
    if not isinstance(req.get("uid"), str):
        raise HTTPError(400, "AdmissionReview.request.uid: missing; the API server sends a request uid")
    _obj(req.get("userInfo"), "AdmissionReview.request.userInfo")
    kind = _obj(req.get("kind"), "AdmissionReview.request.kind")
    is_pod = kind is None or kind.get("kind") in (None, "Pod")
    for f in ("object", "oldObject"):
        obj = req.get(f)
        if obj is not None and is_pod:
            validate_pod(obj, f"AdmissionReview.request.{f}")
    return body
