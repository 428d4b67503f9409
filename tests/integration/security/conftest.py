"""A cluster where trust is enforced: the simulated API server with bearer-token authentication, RBAC from
the manifests the hami_rbac role renders, and the role's ValidatingAdmissionPolicy (tests/sim)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.sim.apiserver import ApiServer
from tests.sim.apiserver_auth import TokenTable, user
from tests.sim.role_manifests import rbac_manifests

NODES = ("gpu-0", "gpu-1")
TENANT_NS = "team-a"
SA_NS = "kube-system"
OPERATORS = "hami-operators"

# What a namespace "edit" user may do with pods (the aggregated edit ClusterRole's pod verbs,
# kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go), so the policy, not RBAC,
# is what refuses the tenant's forged keys.
TENANT_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
    "metadata": {"name": "pod-editor", "namespace": TENANT_NS},
    "rules": [{"apiGroups": [""], "resources": ["pods"],
               "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
}
TENANT_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
    "metadata": {"name": "alice-pods", "namespace": TENANT_NS},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-editor"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
}


@dataclass
class SecureCluster:
    api: ApiServer
    tokens: TokenTable
    who: dict[str, str] = field(default_factory=dict)  # identity name -> bearer token

    def token(self, name: str) -> str:
        return self.who[name]

    def kubeconfig(self, name: str) -> str:
        return self.api.kubeconfig_for(self.who[name], name)

    def call(self, name: str, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> tuple[int, dict]:
        """One raw HTTP request as identity ``name``: (status, JSON body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.who[name]}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


def secure_cluster(with_policy: bool = True) -> SecureCluster:
    tokens = TokenTable()
    api = ApiServer(auth=tokens, rbac=True).start()
    api.apply(*rbac_manifests(list(NODES), namespace=SA_NS, hami_rbac_doctor_groups=[OPERATORS],
                              hami_rbac_admission_policy=with_policy))
    api.apply(TENANT_ROLE, TENANT_BINDING)
    c = SecureCluster(api, tokens)
    c.who["admin"] = "simulated-token"
    c.who["scheduler"] = tokens.add_service_account(SA_NS, "hami-scheduler")
    for n in NODES:
        c.who[f"plugin-{n}"] = tokens.add_service_account(SA_NS, f"hami-device-plugin-{n}")
    c.who["tenant"] = tokens.add_user(user("alice", "team-a-devs"))
    c.who["operator"] = tokens.add_user(user("sre-bob", OPERATORS))
    for n in NODES:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"gpu": "on"}}})
    return c


@pytest.fixture
def cluster() -> Iterator[SecureCluster]:
    c = secure_cluster()
    try:
        yield c
    finally:
        c.api.close()


@pytest.fixture
def cluster_without_policy() -> Iterator[SecureCluster]:
    c = secure_cluster(with_policy=False)
    try:
        yield c
    finally:
        c.api.close()
