"""--extender-auth=token end to end against the SIMULATED API server with authentication and RBAC on:
the scheduler's own service account (bound to system:auth-delegator) reviews a caller's token; a
caller with the RBAC grant is served, a tenant is refused, a scheduler without system:auth-delegator
cannot review and answers 503. Needs the simulator's identity model and RBAC authorizer
(tests/sim/apiserver_auth.py, apiserver_rbac.py); skipped where they are not present."""

from __future__ import annotations

import http.client
import inspect
import json

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.scheduler.serve.auth import AuthConfig
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from tests.sim.apiserver import ApiServer
from tests.unit.scheduler.helpers import gpu_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

auth_mod = pytest.importorskip("tests.sim.apiserver_auth")
if "auth" not in inspect.signature(ApiServer).parameters:
    pytest.skip("the API server simulator has no authentication in this tree", allow_module_level=True)

FILTER = json.dumps({"Pod": gpu_pod("p1", mem=100), "NodeNames": ["n1"]}).encode()


def binding(name: str, role: str, sa: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "kube-system"}]}


class Recorder:
    def __init__(self, client):
        self.client = client
        self.calls = []

    def filter(self, args):
        self.calls.append("filter")
        return {"NodeNames": ["n1"], "Error": ""}

    def bind(self, args):
        self.calls.append("bind")
        return {"Error": ""}


def post(port, token):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/filter", FILTER, {"Authorization": f"Bearer {token}"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("delegator", [True, False])
def test_token_mode_with_authentication_and_rbac(delegator):
    tokens = auth_mod.TokenTable()
    sched = tokens.add_service_account("kube-system", "hami-scheduler")
    proxy = tokens.add_service_account("kube-system", "extender-proxy")
    tenant = tokens.add_user(auth_mod.user("alice", "tenants"))
    with ApiServer(auth=tokens, rbac=True) as api:
        if delegator:
            api.create(binding("hami-scheduler-auth-delegator", "system:auth-delegator", "hami-scheduler"))
        api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": "hami-extender-caller"},
                    "rules": [{"apiGroups": ["hami.io"], "resources": ["schedulerextenders/filter"],
                               "resourceNames": ["hami-scheduler"], "verbs": ["create"]}]})
        api.create(binding("hami-extender-caller", "hami-extender-caller", "extender-proxy"))
        client = KubeClient.from_kubeconfig(api.kubeconfig_for(sched), timeout_s=5)
        ext = Recorder(client)
        srv = ExtenderHTTPServer(ext, None, auth=AuthConfig("token")).start()
        try:
            code, text = post(srv.port, proxy)
            if delegator:
                assert code == 200, text
                code, text = post(srv.port, tenant)
                assert code == 403 and "may not create schedulerextenders/filter" in text
                code, text = post(srv.port, "forged")
                assert code == 401
                assert ext.calls == ["filter"]
            else:  # the scheduler may not create TokenReviews: it cannot vouch for anyone
                assert code == 503 and "TokenReview failed" in text
                assert ext.calls == []
        finally:
            srv.stop()
