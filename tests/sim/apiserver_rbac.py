"""RBAC authorization for the simulated API server (opt-in: ``ApiServer(auth=..., rbac=True)``).

The rules are the objects stored in the simulator (ClusterRole, ClusterRoleBinding, Role, RoleBinding),
e.g. the manifests the ``hami_rbac`` role renders, evaluated the way kube-apiserver's RBAC authorizer does
(kubernetes/kubernetes ``plugin/pkg/auth/authorizer/rbac/rbac.go`` and
``pkg/apis/rbac/v1/evaluation_helpers.go``):

* a request is described by its *attributes* (``RequestInfoFactory.NewRequestInfo`` in
  ``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``): verb (``get``, ``list``, ``watch``
  for ``?watch=1``, ``create``, ``update``, ``patch``, ``delete``, ``deletecollection``), API group,
  resource, subresource, namespace, name; a list or watch with ``fieldSelector=metadata.name=<n>`` has the
  name ``<n>`` (which is how ``resourceNames`` can allow an informer on a single object);
* a rule matches when its apiGroups, resources (``pods``, ``pods/binding``, ``*``, ``*/status``), verbs and
  ``resourceNames`` (empty = any) all match; ClusterRoleBindings apply everywhere, RoleBindings only in
  their namespace; subjects are users, groups and ServiceAccounts (``system:serviceaccount:<ns>:<name>``);
* ``system:masters`` is always allowed; ``GET /version``, ``/healthz``, ``/livez``, ``/readyz`` for
  everyone, the anonymous user included (``system:public-info-viewer``); discovery paths (``/api``,
  ``/apis``, ``/version``) are allowed for every authenticated user (the bootstrap ``system:discovery``
  binding);
* a refusal is 403 ``Forbidden`` with the real message
  (``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go`` ``forbiddenMessage``):
  ``pods "p" is forbidden: User "u" cannot patch resource "pods" in API group "" in the namespace "ns"``.

Not modelled (docs/testing.md): ClusterRole ``aggregationRule``, ``nonResourceURLs`` rules (non-resource
paths other than discovery are refused), the Node authorizer, impersonation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.sim.apiserver_auth import MASTERS, SERVICE_ACCOUNT_PREFIX, UserInfo
from tests.sim.apiserver_store import ApiError, Obj, Store, resource_for_kind

DISCOVERY_PATHS = re.compile(r"^/(api|apis|version)(/[^/]+(/[^/]+)?)?/?$")
# the bootstrap ClusterRole system:public-info-viewer, bound to system:authenticated and
# system:unauthenticated (kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go)
PUBLIC_INFO_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/version", "/version/"})

# Bootstrap ClusterRoles that manifests bind to by name (the real server creates them at start-up:
# plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go). Only the few our roles may reference.
BOOTSTRAP_CLUSTER_ROLES: tuple[Obj, ...] = (
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "system:auth-delegator"},
     "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
               {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                "verbs": ["create"]}]},
)


@dataclass(frozen=True)
class RequestAttributes:
    """What the authorizer sees of a request (a resource request unless ``resource`` is empty)."""

    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def resource_request(self) -> bool:
        return bool(self.resource)

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def key(self) -> tuple[str, str, str, str, str, str]:
        """(verb, group, resource, subresource, namespace, name): what RBAC-granted-equals-used compares."""
        return (self.verb, self.group, self.resource, self.subresource, self.namespace, self.name)


def name_from_field_selector(selector: str | None) -> str:
    """``fields.Selector.RequiresExactMatch("metadata.name")``: the name a list/watch is limited to."""
    for term in (selector or "").split(","):
        m = re.match(r"^\s*metadata\.name\s*(==|=)\s*(\S+)\s*$", term)
        if m:
            return m.group(2)
    return ""


def request_attributes(method: str, path: str, query: dict[str, str], *, group: str = "", version: str = "",
                       resource: str = "", namespace: str = "", name: str | None = None,
                       subresource: str | None = None) -> RequestAttributes:
    """The verb the way RequestInfoFactory derives it from the HTTP method and the path's shape."""
    if not resource:
        return RequestAttributes(verb=method.lower(), path=path)
    if method == "GET":
        if name:
            verb = "get"
        else:
            verb = "watch" if query.get("watch") in ("1", "true") else "list"
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = method.lower()
    if verb in ("list", "watch") and not name:
        name = name_from_field_selector(query.get("fieldSelector"))
    return RequestAttributes(verb, group, version, resource, subresource or "", namespace, name or "", path)


REVIEW_PATHS = {
    "/apis/authentication.k8s.io/v1/tokenreviews": ("authentication.k8s.io", "tokenreviews"),
    "/apis/authorization.k8s.io/v1/subjectaccessreviews": ("authorization.k8s.io", "subjectaccessreviews"),
}


def review_attributes(method: str, path: str) -> RequestAttributes | None:
    """TokenReview / SubjectAccessReview requests (answered by tests/sim/apiserver_reviews.py): RBAC checks
    them like any create (the bootstrap role system:auth-delegator grants both)."""
    hit = REVIEW_PATHS.get(path.rstrip("/"))
    if hit is None:
        return None
    verb = "create" if method == "POST" else method.lower()
    return RequestAttributes(verb, hit[0], "v1", hit[1], path=path)


def _matches(values: list[Any] | None, want: str) -> bool:
    vals = values or []
    return "*" in vals or want in vals


def rule_allows(rule: Obj, attrs: RequestAttributes) -> bool:
    if not _matches(rule.get("verbs"), attrs.verb) or not _matches(rule.get("apiGroups"), attrs.group):
        return False
    if not _resource_matches(rule.get("resources") or [], attrs):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _resource_matches(resources: list[str], attrs: RequestAttributes) -> bool:
    # ResourceMatches in evaluation_helpers.go: "*", an exact "resource[/subresource]", or "*/subresource"
    for r in resources:
        if r in ("*", attrs.combined_resource):
            return True
        if attrs.subresource and r == f"*/{attrs.subresource}":
            return True
    return False


def subject_matches(subject: Obj, user: UserInfo, binding_ns: str) -> bool:
    kind = subject.get("kind")
    name = subject.get("name", "")
    if kind == "User":
        return user.username == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return bool(ns) and user.username == f"{SERVICE_ACCOUNT_PREFIX}{ns}:{name}"
    return False


class RbacAuthorizer:
    """Answers (allowed, reason) from the RBAC objects in the store, read on every request (so a test
    may change them while components run, like a live cluster)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def authorize(self, user: UserInfo, attrs: RequestAttributes) -> tuple[bool, str]:
        if MASTERS in user.groups:
            return True, ""
        if not attrs.resource_request:
            if attrs.path in PUBLIC_INFO_PATHS and attrs.verb == "get":
                return True, ""
            return bool(DISCOVERY_PATHS.match(attrs.path)) and user.username != "system:anonymous", ""
        errors: list[str] = []
        for role_rules in self._rules_for(user, attrs.namespace, errors):
            if any(rule_allows(r, attrs) for r in role_rules):
                return True, ""
        return False, ("RBAC: " + ", ".join(errors)) if errors else ""

    def _rules_for(self, user: UserInfo, namespace: str, errors: list[str]):
        crb = resource_for_kind("clusterrolebindings")
        for b in self.store.list(crb, None)[0]:
            if any(subject_matches(s, user, "") for s in b.get("subjects") or []):
                rules = self._role_rules(b.get("roleRef") or {}, "", errors)
                if rules is not None:
                    yield rules
        if not namespace:
            return
        rb = resource_for_kind("rolebindings")
        for b in self.store.list(rb, namespace)[0]:
            if any(subject_matches(s, user, namespace) for s in b.get("subjects") or []):
                rules = self._role_rules(b.get("roleRef") or {}, namespace, errors)
                if rules is not None:
                    yield rules

    def _role_rules(self, ref: Obj, namespace: str, errors: list[str]) -> list[Obj] | None:
        kind, name = ref.get("kind"), ref.get("name", "")
        if kind == "ClusterRole":
            rt, ns = resource_for_kind("clusterroles"), ""
        elif kind == "Role" and namespace:
            rt, ns = resource_for_kind("roles"), namespace
        else:
            errors.append(f"invalid roleRef {ref!r}")
            return None
        try:
            return list(self.store.get(rt, ns, name).get("rules") or [])
        except ApiError:
            errors.append(f'{rt.plural}.rbac.authorization.k8s.io "{name}" not found')
            return None


def granted_pairs(docs: list[Obj], user: UserInfo) -> set[tuple[str, str, str]]:
    """(verb, group, resource[/subresource]) the ClusterRoleBindings and RoleBindings in ``docs`` grant
    ``user`` (names and namespaces are left to enforcement): the "granted" side of granted-equals-used."""
    roles = {("ClusterRole", "", d["metadata"]["name"]): d for d in docs if d.get("kind") == "ClusterRole"}
    roles.update({("Role", d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs
                  if d.get("kind") == "Role"})
    out: set[tuple[str, str, str]] = set()
    for b in docs:
        if b.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        ns = (b.get("metadata") or {}).get("namespace", "") if b.get("kind") == "RoleBinding" else ""
        if not any(subject_matches(s, user, ns) for s in b.get("subjects") or []):
            continue
        ref = b.get("roleRef") or {}
        key = (ref.get("kind", "ClusterRole"), ns if ref.get("kind") == "Role" else "", ref.get("name", ""))
        for rule in (roles.get(key) or {}).get("rules") or []:
            for verb in rule.get("verbs") or []:
                for group in rule.get("apiGroups") or []:
                    for res in rule.get("resources") or []:
                        out.add((verb, group, res))
    return out


def used_pairs(records: Any) -> set[tuple[str, str, str]]:
    """(verb, group, resource[/subresource]) of audit records (``ApiServer.audit``) of resource requests."""
    return {(r.attrs.verb, r.attrs.group, r.attrs.combined_resource) for r in records
            if r.attrs is not None and r.attrs.resource_request}


def forbidden(user: UserInfo, attrs: RequestAttributes, reason: str = "") -> ApiError:
    """403 exactly as kube-apiserver words it (responsewriters.Forbidden + apierrors.NewForbidden)."""
    if not attrs.resource_request:
        msg = f'User "{user.username}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        msg = (f'User "{user.username}" cannot {attrs.verb} resource "{attrs.combined_resource}" '
               f'in API group "{attrs.group}" {scope}')
    if reason:
        msg = f"{msg}: {reason}"
    gr = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    if not gr:
        full = f"forbidden: {msg}"
    elif attrs.name:
        full = f'{gr} "{attrs.name}" is forbidden: {msg}'
    else:
        full = f"{gr} is forbidden: {msg}"
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.group:
        details["group"] = attrs.group
    return ApiError(403, "Forbidden", full, details)


def unauthorized() -> ApiError:
    """401 for a missing or unknown bearer token (the real server's body)."""
    return ApiError(401, "Unauthorized", "Unauthorized")


__all__ = ["BOOTSTRAP_CLUSTER_ROLES", "RbacAuthorizer", "RequestAttributes", "forbidden", "granted_pairs",
           "name_from_field_selector", "request_attributes", "review_attributes", "rule_allows",
           "subject_matches", "unauthorized", "used_pairs"]
