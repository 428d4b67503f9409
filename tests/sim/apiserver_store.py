"""In-memory object store behind the simulated Kubernetes API server (``tests/sim/apiserver.py``).

It models what the agent relies on from a real kube-apiserver + etcd:

* one global, monotonically increasing ``resourceVersion`` (etcd's revision);
* optimistic concurrency: an update or patch that carries a stale ``metadata.resourceVersion`` is
  rejected with 409 Conflict, with the real server's message;
* no-op writes do not bump the resourceVersion and produce no watch event (like the real server);
* a bounded event history (the watch cache window): a watch resuming from a revision older than the
  window gets 410 Gone / ``Expired``;
* label and field selectors, including the real watch cache's rule that an object moving into or out of
  a selector is delivered as ADDED / DELETED;
* status subresources: the main resource ignores ``status`` changes, ``/status`` changes only ``status``.

Objects are never mutated in place: every write builds a new dict, so readers may serialize a reference
they got under the lock after releasing it.
"""

from __future__ import annotations

import bisect
import copy
import datetime
import json
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    group: str  # "" = core
    version: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    field_labels: tuple[str, ...] = ("metadata.name", "metadata.namespace")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("namespaces", "Namespace", "", "v1", False, ("status",),
                 ("metadata.name", "status.phase")),
    ResourceType("nodes", "Node", "", "v1", False, ("status",),
                 ("metadata.name", "spec.unschedulable")),
    ResourceType("pods", "Pod", "", "v1", True, ("status", "binding", "eviction"),
                 ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
                  "spec.schedulerName", "spec.serviceAccountName", "status.phase", "status.podIP",
                  "status.nominatedNodeName")),
    ResourceType("events", "Event", "", "v1", True, (),
                 ("metadata.name", "metadata.namespace", "involvedObject.kind",
                  "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                  "involvedObject.apiVersion", "involvedObject.resourceVersion",
                  "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type")),
    ResourceType("resourcequotas", "ResourceQuota", "", "v1", True, ("status",)),
    ResourceType("configmaps", "ConfigMap", "", "v1", True),
    ResourceType("leases", "Lease", "coordination.k8s.io", "v1", True),
    # identities, RBAC and admission policies (stored like any object; enforced by apiserver_rbac.py and
    # apiserver_admission.py when the server is started with auth/rbac)
    ResourceType("serviceaccounts", "ServiceAccount", "", "v1", True),
    ResourceType("secrets", "Secret", "", "v1", True, (), ("metadata.name", "metadata.namespace", "type")),
    ResourceType("clusterroles", "ClusterRole", "rbac.authorization.k8s.io", "v1", False),
    ResourceType("clusterrolebindings", "ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", False),
    ResourceType("roles", "Role", "rbac.authorization.k8s.io", "v1", True),
    ResourceType("rolebindings", "RoleBinding", "rbac.authorization.k8s.io", "v1", True),
    ResourceType("validatingadmissionpolicies", "ValidatingAdmissionPolicy", "admissionregistration.k8s.io",
                 "v1", False, ("status",)),
    ResourceType("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
                 "admissionregistration.k8s.io", "v1", False),
    # admission webhook registrations: stored only (the simulator calls no webhook)
    ResourceType("validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
                 "admissionregistration.k8s.io", "v1", False),
    ResourceType("mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
                 "admissionregistration.k8s.io", "v1", False),
    # eviction, PodDisruptionBudgets and the ReplicaSets a budget's percentage counts: apiserver_policy.py
    ResourceType("poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1", True, ("status",)),
    ResourceType("replicasets", "ReplicaSet", "apps", "v1", True, ("status",)),
    # Dynamic Resource Allocation (resource.k8s.io/v1); their write rules: tests/sim/apiserver_resource.py
    ResourceType("deviceclasses", "DeviceClass", "resource.k8s.io", "v1", False),
    ResourceType("resourceslices", "ResourceSlice", "resource.k8s.io", "v1", False, (),
                 ("metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name")),
    ResourceType("resourceclaims", "ResourceClaim", "resource.k8s.io", "v1", True, ("status",)),
    ResourceType("resourceclaimtemplates", "ResourceClaimTemplate", "resource.k8s.io", "v1", True),
)

# A resource's own write rules (kube-apiserver's registry strategy: PrepareForCreate/PrepareForUpdate and
# validation). ``strategy(old, new, subresource, seed)`` may change ``new`` in place and raises ApiError to
# refuse; ``old`` is None on create. Registered per plural in ``Store.strategies``.
Strategy = Callable[[Any, Any, Any, bool], None]

# ``admit(old, new)``: validating admission of a write, called with the final object before it is stored
# (``old`` is None on create); raises ApiError to refuse. Nothing is written when it raises.
Admit = Callable[[Obj | None, Obj], None]

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def find_resource(group: str, version: str, plural: str) -> ResourceType | None:
    for rt in RESOURCES:
        if rt.group == group and rt.version == version and rt.plural == plural:
            return rt
    return None


def resource_for_kind(kind_or_plural: str, api_version: str | None = None) -> ResourceType:
    """Resolve "Pod", "pod", "pods" (optionally with apiVersion) to its ResourceType."""
    k = kind_or_plural.lower()
    for rt in RESOURCES:
        if k in (rt.plural, rt.kind.lower()) and (api_version is None or api_version == rt.api_version):
            return rt
    raise KeyError(f"simulated API server does not serve {kind_or_plural!r} ({api_version})")


class ApiError(Exception):
    """An error the server answers with a ``kind: Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.plural} "{name}" not found',
                    {"name": name, "kind": rt.plural})


def conflict(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {rt.plural}{"." + rt.group if rt.group else ""} '
                    f'"{name}": the object has been modified; please apply your changes to the latest '
                    f"version and try again",
                    {"name": name, "kind": rt.plural})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- selectors -------------------------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")

Predicate = Callable[[Obj], bool]


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside ``( )`` (set-based requirements contain commas)."""
    terms, depth, cur = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur))
    return [t for t in terms if t.strip()]


def parse_label_selector(selector: str | None) -> Predicate:
    if not selector:
        return lambda _o: True
    preds: list[Predicate] = []
    for term in _split_terms(selector):
        m = _SET_TERM.match(term)
        if m:
            key, op = m.group(1), m.group(2)
            values = {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                preds.append(lambda o, k=key, vs=values: _labels(o).get(k) in vs)
            else:
                preds.append(lambda o, k=key, vs=values: _labels(o).get(k) not in vs)
            continue
        m = _EQ_TERM.match(term)
        if m:
            key, op, value = m.groups()
            if op == "!=":
                preds.append(lambda o, k=key, v=value: _labels(o).get(k) != v)
            else:
                preds.append(lambda o, k=key, v=value: _labels(o).get(k) == v)
            continue
        m = _EXISTS_TERM.match(term)
        if m:
            neg, key = m.groups()
            if neg:
                preds.append(lambda o, k=key: k not in _labels(o))
            else:
                preds.append(lambda o, k=key: k in _labels(o))
            continue
        raise bad_request(f"unable to parse requirement: {term.strip()!r}: invalid label selector")
    return lambda o: all(p(o) for p in preds)


def _labels(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if isinstance(cur, dict):  # events' "source" selects source.component
        return str(cur.get("component", ""))
    return str(cur)


def parse_field_selector(selector: str | None, rt: ResourceType) -> Predicate:
    if not selector:
        return lambda _o: True
    preds: list[Predicate] = []
    for term in _split_terms(selector):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid field selector: {term.strip()!r}")
        path, op, value = m.groups()
        if path not in rt.field_labels:
            raise bad_request(f'field label not supported: {path}')
        if op == "!=":
            preds.append(lambda o, p=path, v=value: field_value(o, p) != v)
        else:
            preds.append(lambda o, p=path, v=value: field_value(o, p) == v)
    return lambda o: all(p(o) for p in preds)


# --- patches ---------------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; builds new dicts along patched paths, never mutates ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # strategic-merge directives: not modelled (documented gap)
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Obj, ops: list[Any]) -> Obj:
    """RFC 6902 subset (add, remove, replace, test) — enough for what clients send."""
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {op!r}")
        parts = _pointer(op["path"])
        if not parts:
            raise bad_request("JSON patch on the document root is not supported")
        parent: Any = doc
        for p in parts[:-1]:
            try:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            except (KeyError, IndexError, ValueError):
                raise ApiError(422, "Invalid", f"doc is missing path: {op['path']!r}") from None
        last = parts[-1]
        kind = op["op"]
        try:
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if last == "-" else int(last), op.get("value"))
                else:
                    parent[last] = op.get("value")
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(last)] = op.get("value")
                else:
                    if last not in parent:
                        raise KeyError(last)
                    parent[last] = op.get("value")
            elif kind == "remove":
                if isinstance(parent, list):
                    del parent[int(last)]
                else:
                    del parent[last]
            elif kind == "test":
                cur = parent[int(last)] if isinstance(parent, list) else parent[last]
                if cur != op.get("value"):
                    raise ApiError(422, "Invalid", f"testing value {op['path']} failed")
            else:
                raise bad_request(f"unsupported JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"doc is missing path: {op['path']!r}") from None
    return doc


# --- the store -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HistoryEntry:
    rv: int
    plural: str
    type: str  # ADDED / MODIFIED / DELETED
    old: Obj | None
    new: Obj
    # the watch event's bytes by event type, encoded once for every watcher, as kube-apiserver's watch cache
    # does (``cachingObject``, staging/src/k8s.io/apiserver/pkg/storage/cacher/caching_object.go)
    encoded: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False, hash=False)

    def event_line(self, type_: str) -> bytes:
        line = self.encoded.get(type_)
        if line is None:  # two watchers may both encode it first: the same bytes, one kept
            line = self.encoded[type_] = watch_event_line(type_, self.new)
        return line


def watch_event_line(type_: str, obj: Obj) -> bytes:
    """One watch event as the stream carries it: a JSON object and a newline."""
    return json.dumps({"type": type_, "object": obj}).encode() + b"\n"


@dataclass
class Store:
    history_limit: int = 1000
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    _rv: int = 1
    _history: list[HistoryEntry] = field(default_factory=list)
    _history_rvs: list[int] = field(default_factory=list)
    _compacted_rv: int = 0  # watches resuming from an RV below this get 410 Expired
    _counts: dict[str, int] = field(default_factory=dict)  # objects per plural (cheap "any bindings?")
    on_record: Callable[[HistoryEntry], None] | None = None
    # Hooks for behaviour modelled in other modules (apiserver_policy.py), called under the store lock:
    # on_write(rt, old, new, subresource) may adjust ``new`` (a fresh copy) or raise ApiError before a
    # create/update is stored; on_change(entry) sees every recorded change.
    on_write: list[Callable[[ResourceType, Obj | None, Obj, str | None], None]] = field(default_factory=list)
    on_change: list[Callable[[HistoryEntry], None]] = field(default_factory=list)
    strategies: dict[str, Strategy] = field(default_factory=dict)  # plural -> write rules
    # paginated lists whose continue pages may follow (apiserver_lists.py), under the store lock
    list_snapshots: OrderedDict[tuple, Any] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        for ns in DEFAULT_NAMESPACES:
            self.create(resource_for_kind("namespaces"), "", {"metadata": {"name": ns}}, seed=True)

    # -- helpers
    @property
    def condition(self) -> threading.Condition:
        return self._cond

    def current_rv(self) -> int:
        with self._cond:
            return self._rv

    @staticmethod
    def _key(rt: ResourceType, ns: str, name: str) -> tuple[str, str, str]:
        return (rt.plural, ns if rt.namespaced else "", name)

    def _record(self, rt: ResourceType, type_: str, old: Obj | None, new: Obj) -> None:
        entry = HistoryEntry(self._rv, rt.plural, type_, old, new)
        if self.on_record is not None:
            self.on_record(entry)  # watch fan-out (apiserver_watch.py), under the store lock
        self._history.append(entry)
        self._history_rvs.append(self._rv)
        if len(self._history) > self.history_limit:
            drop = len(self._history) - self.history_limit
            self._compacted_rv = self._history_rvs[drop - 1]
            del self._history[:drop]
            del self._history_rvs[:drop]
        for hook in self.on_change:
            hook(self._history[-1])
        self._cond.notify_all()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def compact(self) -> int:
        """Drop all history (like an etcd compaction): older watch RVs now get 410 Expired."""
        with self._cond:
            self._compacted_rv = self._rv
            self._history.clear()
            self._history_rvs.clear()
            return self._rv

    # -- reads
    def count(self, rt: ResourceType) -> int:
        """How many objects of this resource exist (O(1))."""
        with self._cond:
            return self._counts.get(rt.plural, 0)

    def get(self, rt: ResourceType, ns: str, name: str) -> Obj:
        with self._cond:
            obj = self._objects.get(self._key(rt, ns, name))
        if obj is None:
            raise not_found(rt, name)
        return obj

    def list(self, rt: ResourceType, ns: str | None, label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[Obj], int]:
        lp = parse_label_selector(label_selector)
        fp = parse_field_selector(field_selector, rt)
        with self._cond:
            items = [o for (plural, ons, _n), o in self._objects.items()
                     if plural == rt.plural and (not ns or ons == ns) and lp(o) and fp(o)]
            rv = self._rv
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items, rv

    # -- writes
    def create(self, rt: ResourceType, ns: str, obj: Obj, seed: bool = False,
               admit: Admit | None = None) -> Obj:
        """Create ``obj``. ``seed=True`` (test helpers) keeps a given status; HTTP creates reset it."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata: must be an object")
        if meta.get("resourceVersion") and not seed:
            raise bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            else:
                raise ApiError(422, "Invalid", f"{rt.kind} \"\" is invalid: metadata.name: Required value: "
                               "name or generateName is required")
        name = meta["name"]
        if rt.namespaced:
            ns = ns or meta.get("namespace") or "default"
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request("the namespace of the provided object does not match the namespace "
                                  "sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
            ns = ""
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if rt.plural == "pods" and not seed:
            obj["status"] = {"phase": "Pending"}
        elif rt.plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        if rt.plural == "namespaces":
            obj.setdefault("status", {"phase": "Active"})
        if rt.plural in self.strategies:
            self.strategies[rt.plural](None, obj, None, seed)
        if admit is not None:
            # outside the lock (CEL is slow); the object does not depend on the store's state
            admit(None, obj)
        with self._cond:
            key = self._key(rt, ns, name)
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{rt.plural} "{name}" already exists',
                               {"name": name, "kind": rt.plural})
            if rt.namespaced and ("namespaces", "", ns) not in self._objects:
                # A documented simplification: namespaces spring into existence on first use.
                self._create_locked(resource_for_kind("namespaces"), "", {"metadata": {"name": ns}})
            for hook in self.on_write:
                hook(rt, None, obj, None)
            return self._create_locked(rt, ns, obj)

    def _create_locked(self, rt: ResourceType, ns: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        obj.setdefault("apiVersion", rt.api_version)
        obj.setdefault("kind", rt.kind)
        meta["resourceVersion"] = self._next_rv()
        self._objects[self._key(rt, ns, meta["name"])] = obj
        self._counts[rt.plural] = self._counts.get(rt.plural, 0) + 1
        self._record(rt, "ADDED", None, obj)
        return obj

    def _write(self, rt: ResourceType, ns: str, name: str, build: Callable[[Obj], Obj],  # noqa: PLR0917
               subresource: str | None, admit: Admit | None = None) -> Obj:
        """Apply ``build(old) -> new`` with the real server's update rules. With ``admit``, the new object
        is built and admitted outside the lock and stored only if the object did not change meanwhile
        (else built and admitted again), like kube-apiserver's GuaranteedUpdate loop."""
        key = self._key(rt, ns, name)
        while True:
            with self._cond:
                old = self._objects.get(key)
                if old is None:
                    raise not_found(rt, name)
                if admit is None:
                    new = self._prepare(rt, name, old, build, subresource)
                    return self._commit(rt, key, old, new, subresource)
            new = self._prepare(rt, name, old, build, subresource)
            admit(old, new)  # sees no-op writes too, as on the real server
            with self._cond:
                if self._objects.get(key) is old:
                    return self._commit(rt, key, old, new, subresource)

    def _prepare(self, rt: ResourceType, name: str, old: Obj, build: Callable[[Obj], Obj],
                 subresource: str | None) -> Obj:
        new = build(old)
        if not isinstance(new, dict):
            raise bad_request("the patched object must be a JSON object")
        new_meta = new.get("metadata")
        if not isinstance(new_meta, dict):
            raise bad_request("metadata: must be an object")
        want_rv = new_meta.get("resourceVersion")
        if want_rv and str(want_rv) != old["metadata"]["resourceVersion"]:
            raise conflict(rt, name)
        if subresource == "status" and rt.plural == "pods":
            # The real pod status strategy (pkg/registry/core/pod/strategy.go, podStatusStrategy) resets
            # only spec, deletionTimestamp and ownerReferences: labels and annotations CAN change here.
            new = {**new, "spec": old.get("spec")} if "spec" in old else {k: v for k, v in new.items()
                                                                           if k != "spec"}
            meta = dict(new.get("metadata") or {})
            for fixed in ("deletionTimestamp", "ownerReferences"):
                if fixed in old["metadata"]:
                    meta[fixed] = old["metadata"][fixed]
                else:
                    meta.pop(fixed, None)
            new["metadata"] = meta
        elif subresource == "status":
            # /status writes change status only (nodes, namespaces, resourcequotas here).
            merged = dict(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        elif rt.has_status:
            # The main resource ignores status changes (they go through /status).
            new = dict(new)
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        new_meta = dict(new.get("metadata") or {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion"):
            if fixed in old["metadata"]:
                new_meta[fixed] = old["metadata"][fixed]
            else:
                new_meta.pop(fixed, None)
        new["metadata"] = new_meta
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        if rt.plural in self.strategies:
            new = copy.deepcopy(new)  # the strategy may change it; ``old`` must stay untouched
            self.strategies[rt.plural](old, new, subresource, False)
        return new

    def _commit(self, rt: ResourceType, key: tuple[str, str, str], old: Obj, new: Obj,  # noqa: PLR0917
                subresource: str | None) -> Obj:
        """Store ``new`` (caller holds the lock), after the policy hooks (apiserver_policy.py) saw it."""
        for hook in self.on_write:
            hook(rt, old, new, subresource)
        if new == old:
            return old  # no-op: no new resourceVersion, no event (like the real server)
        new = copy.deepcopy(new)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._objects[key] = new
        self._record(rt, "MODIFIED", old, new)
        return new

    def update(self, rt: ResourceType, ns: str, name: str, obj: Obj, subresource: str | None = None,  # noqa: PLR0917
               admit: Admit | None = None) -> Obj:
        meta = obj.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL "
                              f"({name})")
        return self._write(rt, ns, name, lambda _old: copy.deepcopy(obj), subresource, admit)

    def patch(self, rt: ResourceType, ns: str, name: str, content_type: str, body: Any,  # noqa: PLR0917
              subresource: str | None = None, admit: Admit | None = None) -> Obj:
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise bad_request("a merge patch must be a JSON object")
            return self._write(rt, ns, name, lambda old: merge_patch(old, body), subresource, admit)
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise bad_request("a JSON patch must be a JSON array")
            return self._write(rt, ns, name, lambda old: json_patch(old, body), subresource, admit)
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media types include: "
                       f"application/json-patch+json, application/merge-patch+json, "
                       f"application/strategic-merge-patch+json (got {content_type!r})")

    def delete(self, rt: ResourceType, ns: str, name: str, preconditions_rv: str | None = None) -> Obj:
        """Immediate deletion (no graceful termination or finalizers; documented gap)."""
        with self._cond:
            key = self._key(rt, ns, name)
            old = self._objects.get(key)
            if old is None:
                raise not_found(rt, name)
            if preconditions_rv and preconditions_rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt, name)
            del self._objects[key]
            self._counts[rt.plural] -= 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = self._next_rv()
            self._record(rt, "DELETED", old, gone)
            return gone

    def bind(self, ns: str, name: str, binding: Obj) -> None:
        rt = resource_for_kind("pods")
        target = binding.get("target") or {}
        node = target.get("name")
        if not node:
            raise ApiError(422, "Invalid", f'Binding "{name}" is invalid: target.name: Required value')
        if target.get("kind") not in (None, "", "Node"):
            raise ApiError(422, "Invalid",
                           f'Binding "{name}" is invalid: target.kind: must be empty or "Node"')

        want_uid = (binding.get("metadata") or {}).get("uid")

        def build(old: Obj) -> Obj:
            if want_uid and want_uid != old["metadata"].get("uid"):
                have = old["metadata"].get("uid")
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on pods/binding "{name}": Precondition '
                               f"failed: UID in precondition: {want_uid}, UID in object meta: {have}")
            if (old.get("spec") or {}).get("nodeName"):
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                               f'already assigned to node "{old["spec"]["nodeName"]}"',
                               {"name": name, "kind": "pods/binding"})
            if old["metadata"].get("deletionTimestamp"):
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                               f"being deleted, cannot be assigned to a host")
            new = copy.deepcopy(old)
            new.setdefault("spec", {})["nodeName"] = node
            extra = (binding.get("metadata") or {}).get("annotations") or {}
            if extra:
                new["metadata"].setdefault("annotations", {}).update(extra)
            return new

        new = self._write(rt, ns, name, build, None)
        # The real binding REST handler also records the PodScheduled condition (a status write).
        status = copy.deepcopy(new.get("status") or {})
        conds = [c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()})
        status["conditions"] = conds
        self._write(rt, ns, name, lambda old: {**old, "status": status}, "status")

    # -- watch support
    def expired(self, rv: int) -> bool:
        with self._cond:
            return rv < self._compacted_rv

    def oldest_rv(self) -> int:
        with self._cond:
            return self._compacted_rv

    def entries_after(self, rv: int) -> list[HistoryEntry]:
        """History entries newer than ``rv`` (caller holds ``condition``)."""
        i = bisect.bisect_right(self._history_rvs, rv)
        return self._history[i:]
