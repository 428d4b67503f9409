"""Parsing of the extender's request bodies (``k8s.io/kube-scheduler/extender/v1``): every field the
extender reads is type-checked here, and a malformed body raises ``BadRequest`` naming the field and
what it must be (HTTP 400). Nothing in a body is trusted beyond the pod's identity and the node names:
the pod's state comes from the API (``podstate``).

Total: ``parse_*`` accept any JSON value (also when ``scheduler.shapes`` in front of the HTTP routes is
bypassed: the HA forwarder's leader, tests, embedders) and answer a result or ``BadRequest``, never
another exception (tests/fuzz/test_fuzz_direct.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami_agent.protocol.names import all_subdomains, label_error, subdomain_error, uid_error
from hami_agent.scheduler.core.requests import pod_shape_error
from hami_agent.scheduler.state.nodenames import LAST_NODE_NAMES


class BadRequest(ValueError):
    """Malformed extender arguments; the message names the field (HTTP 400)."""


def field_ci(obj: dict, name: str) -> Any:
    """Go's encoding/json matches keys case-insensitively: kube-scheduler sends ``Pod``/``NodeNames``
    (the extender/v1 structs have no json tags) while hand-written clients send ``pod``/``nodenames``."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def _kind(v: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


@dataclass(frozen=True)
class FilterArgs:
    namespace: str
    name: str
    uid: str
    names: list[str]
    nodes: dict | None  # the full NodeList variant (nodeCacheCapable: false): decisions are simulated


@dataclass(frozen=True)
class BindArgs:
    namespace: str
    name: str
    uid: str
    node: str


def _identity(pod: object, where: str) -> tuple[str, str, str]:
    if not isinstance(pod, dict):
        raise BadRequest(f"{where}: missing or not an object (want the Pod being scheduled)")
    err = pod_shape_error(pod)
    if err:
        raise BadRequest(f"{where}.{err}")
    md = pod.get("metadata") or {}
    name, uid = md.get("name"), md.get("uid")
    ns = md.get("namespace") or "default"
    if not name:
        raise BadRequest(f"{where}.metadata.name: missing")
    if not uid:
        raise BadRequest(f"{where}.metadata.uid: missing (the extender matches the pod by namespace, name "
                         "and uid; kube-scheduler always sends it)")
    check_identity(ns, name, uid, f"{where}.metadata.namespace", f"{where}.metadata.name",
                   f"{where}.metadata.uid")
    return ns, name, uid


def check_identity(ns: object, name: object, uid: object, ns_field: str, name_field: str,
                   uid_field: str) -> None:
    """Refuse (``BadRequest`` naming the field) a namespace that is not a DNS-1123 label, a pod name that is
    not a DNS-1123 subdomain or a uid that is not printable ASCII: checked before the identity is used for
    anything (API paths, cache keys, logs, events)."""
    for field, err in ((ns_field, label_error(ns)), (name_field, subdomain_error(name)),
                       (uid_field, uid_error(uid))):
        if err:
            raise BadRequest(f"{field}: {err}")


def _bad_node_name(field: str, value: object) -> BadRequest:
    return BadRequest(f"{field}: not a node name: {subdomain_error(value)}")


def names_known_valid(names: list) -> bool:
    """``names`` equal the last list of node names found valid (``state.nodenames``)."""
    return LAST_NODE_NAMES.known_valid(names)


def _node_names(args: dict) -> tuple[list[str], dict | None]:
    raw = field_ci(args, "NodeNames")
    if raw is not None:
        if not isinstance(raw, list):
            raise BadRequest(f"ExtenderArgs.NodeNames: must be a list of node names, got {_kind(raw)}")
        if LAST_NODE_NAMES.known_valid(raw):
            return raw, None
        # kube-scheduler sends every node name on every call (5,000 at 5,000 nodes): check them with C
        # loops (str.join refuses any non-string; "in" finds an empty one; a third of a Python loop's
        # cost) and walk the list in Python only to name the bad element
        try:
            "".join(raw)
            bad = "" in raw
        except TypeError:
            bad = True
        if bad:
            for i, n in enumerate(raw):
                if not isinstance(n, str) or not n:
                    raise BadRequest(f"ExtenderArgs.NodeNames[{i}]: must be a non-empty node name string, "
                                     f"got {_kind(n)}")
        if not all_subdomains(raw):  # one pass in C; a Python walk only to name the bad one
            i, n = next((i, n) for i, n in enumerate(raw) if subdomain_error(n))
            raise _bad_node_name(f"ExtenderArgs.NodeNames[{i}]", n)
        LAST_NODE_NAMES.mark_valid(raw)
        return raw, None
    nodes = field_ci(args, "Nodes")
    if nodes is None:
        return [], None
    if not isinstance(nodes, dict):
        raise BadRequest(f"ExtenderArgs.Nodes: must be a NodeList object with items, got {_kind(nodes)}")
    items = field_ci(nodes, "items")  # Go matches NodeList's "items" tag case-insensitively too
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadRequest(f"ExtenderArgs.Nodes.items: must be a list of Node objects, got {_kind(items)}")
    out = []
    for i, n in enumerate(items):
        md = n.get("metadata") if isinstance(n, dict) else None
        nm = md.get("name") if isinstance(md, dict) else None
        if not isinstance(nm, str) or not nm:
            raise BadRequest(f"ExtenderArgs.Nodes.items[{i}].metadata.name: missing or not a string")
        if subdomain_error(nm):
            raise _bad_node_name(f"ExtenderArgs.Nodes.items[{i}].metadata.name", nm)
        out.append(nm)
    return out, nodes


def parse_filter_args(args: Any) -> FilterArgs:
    if not isinstance(args, dict):
        raise BadRequest(f"ExtenderArgs: body must be a JSON object, got {_kind(args)}")
    ns, name, uid = _identity(field_ci(args, "Pod"), "ExtenderArgs.Pod")
    names, nodes = _node_names(args)
    return FilterArgs(ns, name, uid, names, nodes)


def parse_prioritize_args(args: Any) -> list[str]:
    """The candidate node names of a /prioritize ``ExtenderArgs`` (HAMi scores in /filter: the answer is
    neutral, so the pod is not read)."""
    if not isinstance(args, dict):
        raise BadRequest(f"ExtenderArgs: body must be a JSON object, got {_kind(args)}")
    return _node_names(args)[0]


def parse_bind_args(args: Any) -> BindArgs:
    if not isinstance(args, dict):
        raise BadRequest(f"ExtenderBindingArgs: body must be a JSON object, got {_kind(args)}")
    vals = {}
    for f in ("PodName", "PodNamespace", "PodUID", "Node"):
        v = field_ci(args, f)
        if not isinstance(v, str) or not v:
            hint = " (the extender binds only the pod it filtered, matched by uid)" if f == "PodUID" else ""
            raise BadRequest(f"ExtenderBindingArgs.{f}: missing or not a string{hint}")
        vals[f] = v
    check_identity(vals["PodNamespace"], vals["PodName"], vals["PodUID"], "ExtenderBindingArgs.PodNamespace",
                   "ExtenderBindingArgs.PodName", "ExtenderBindingArgs.PodUID")
    if subdomain_error(vals["Node"]):
        raise _bad_node_name("ExtenderBindingArgs.Node", vals["Node"])
    return BindArgs(vals["PodNamespace"], vals["PodName"], vals["PodUID"], vals["Node"])
