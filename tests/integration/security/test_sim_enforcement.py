"""The simulated API server's authentication, RBAC and ValidatingAdmissionPolicy engine answer like a real
kube-apiserver: the wire format of 401/403/422 and the VAP semantics the role's policy relies on. These
guard the simulator itself, so that a policy or RBAC test cannot pass because the simulator is kinder."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from hami_agent.k8s.client import KubeClient, RetryPolicy
from hami_agent.k8s.errors import KubeError
from tests.sim.apiserver import ApiServer
from tests.sim.apiserver_auth import TokenTable, service_account_user, user

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC = f"{RBAC_GROUP}/v1"
MERGE = "application/merge-patch+json"
ADM = "admissionregistration.k8s.io/v1"


def call(api: ApiServer, token: str | None, method: str, path: str, body=None,
         content_type: str = "application/json") -> tuple[int, dict, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(api.url + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


@pytest.fixture
def secured():
    tokens = TokenTable()
    api = ApiServer(auth=tokens, rbac=True).start()
    try:
        yield api, tokens
    finally:
        api.close()


def test_no_or_unknown_token_is_401_and_the_default_stays_open():
    with ApiServer() as open_api:  # today's default for every other test: no auth, the admin
        assert call(open_api, None, "GET", "/api/v1/nodes")[0] == 200
        assert open_api.requests[-1].user == "kubernetes-admin"
    tokens = TokenTable()
    with ApiServer(auth=tokens) as api:
        for token in (None, "nope"):
            code, body, _ = call(api, token, "GET", "/api/v1/nodes")
            assert (code, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")
        tokens.revoke(t := tokens.add_user(user("carol")))
        assert call(api, t, "GET", "/api/v1/nodes")[0] == 401
        assert call(api, "simulated-token", "GET", "/api/v1/nodes")[0] == 200  # the admin kubeconfig


def test_anonymous_reads_only_the_public_info_endpoints(secured):
    """kube-apiserver's default (--anonymous-auth=true, system:public-info-viewer): a request without a
    token may GET /version (the sandbox's readiness probe); anything else without one is 401, and a bad
    token is 401 even on /version."""
    api, _tokens = secured
    code, body, _ = call(api, None, "GET", "/version")
    assert code == 200 and body["gitVersion"].startswith("v1."), body
    assert call(api, "nope", "GET", "/version")[0] == 401
    assert call(api, None, "GET", "/api")[0] == 401
    assert call(api, None, "GET", "/api/v1/nodes")[0] == 401
    assert call(api, None, "POST", "/version", body={})[0] == 401


def test_rbac_forbidden_message_is_the_real_one(secured):
    api, tokens = secured
    sa = tokens.add_service_account("kube-system", "x")
    code, body, _ = call(api, sa, "PATCH", "/api/v1/namespaces/default/pods/p", {}, MERGE)
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('pods "p" is forbidden: User "system:serviceaccount:kube-system:x" cannot '
                               'patch resource "pods" in API group "" in the namespace "default"')
    assert body["details"] == {"name": "p", "kind": "pods"}
    code, body, _ = call(api, sa, "GET", "/api/v1/nodes")
    assert body["message"] == ('nodes is forbidden: User "system:serviceaccount:kube-system:x" cannot list '
                               'resource "nodes" in API group "" at the cluster scope')
    code, body, _ = call(api, sa, "POST", "/api/v1/namespaces/default/pods/p/binding",
                         {"target": {"name": "n"}})
    assert 'cannot create resource "pods/binding" in API group ""' in body["message"]
    code, body, _ = call(api, sa, "GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l")
    assert body["message"].startswith('leases.coordination.k8s.io "l" is forbidden: ')
    assert call(api, sa, "GET", "/api/v1")[0] == 200  # discovery: every authenticated user


def test_resource_names_allow_get_and_a_name_field_selected_list_or_watch_only(secured):
    api, tokens = secured
    u = service_account_user("kube-system", "node-a")
    token = tokens.add_user(u)
    api.apply({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "own-node"},
               "rules": [{"apiGroups": [""], "resources": ["nodes"], "resourceNames": ["a"],
                          "verbs": ["get", "list", "watch", "patch"]}]},
              {"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": "own-node"},
               "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "own-node"},
               "subjects": [{"kind": "ServiceAccount", "name": "node-a", "namespace": "kube-system"}]})
    for n in ("a", "b"):
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    assert call(api, token, "GET", "/api/v1/nodes/a")[0] == 200
    assert call(api, token, "GET", "/api/v1/nodes/b")[0] == 403
    assert call(api, token, "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Da")[0] == 200
    assert call(api, token, "GET", "/api/v1/nodes")[0] == 403
    assert call(api, token, "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Db")[0] == 403
    assert call(api, token, "PATCH", "/api/v1/nodes/b", {}, MERGE)[0] == 403
    # the agent's client sees the 403 as an error naming the refusal
    client = KubeClient.from_kubeconfig(api.kubeconfig_for(token), timeout_s=5,
                                        retry=RetryPolicy(attempts=1))
    with pytest.raises(KubeError, match='cannot patch resource "nodes"'):
        client.patch_node_annotations("b", {"x": "y"})
    client.patch_node_annotations("a", {"x": "y"})
    client.close()
    # a binding to a missing role: the reason names it
    api.apply({"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": "dangling"},
               "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "gone"},
               "subjects": [{"kind": "ServiceAccount", "name": "node-a", "namespace": "kube-system"}]})
    body = call(api, token, "GET", "/api/v1/nodes/b")[1]
    assert body["message"].endswith(': RBAC: clusterroles.rbac.authorization.k8s.io "gone" not found')


def policy(validations: list[dict], failure: str = "Fail", **spec) -> dict:
    return {"apiVersion": ADM, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "p"},
            "spec": {"failurePolicy": failure, "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["configmaps"]}]}, "validations": validations, **spec}}


def binding(actions: list[str], **spec) -> dict:
    return {"apiVersion": ADM, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "b"},
            "spec": {"policyName": "p", "validationActions": actions, **spec}}


def cm(name: str, data: dict | None = None, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels or {}}, "data": data or {}}


CM = "/api/v1/namespaces/default/configmaps"


def test_vap_denial_defaults_to_invalid_422_with_the_failed_expression():
    with ApiServer() as api:
        api.apply(policy([{"expression": "object.data.size == '1'"}]), binding(["Deny"]))
        code, body, _ = call(api, None, "POST", CM, cm("big", {"size": "2"}))
        assert (code, body["reason"]) == (422, "Invalid")
        assert body["message"] == ("configmaps \"big\" is forbidden: ValidatingAdmissionPolicy 'p' with "
                                   "binding 'b' denied request: failed expression: object.data.size == '1'")
        assert api.get("ConfigMap", "default", "big") is None
        assert call(api, None, "POST", CM, cm("ok", {"size": "1"}))[0] == 201


def test_vap_message_expression_falls_back_to_message_and_reason_sets_the_code():
    with ApiServer() as api:
        api.apply(policy([{"expression": "false", "reason": "RequestEntityTooLarge", "message": "static",
                           "messageExpression": "object.data.nope"}]), binding(["Deny"]))
        code, body, _ = call(api, None, "POST", CM, cm("x"))
        assert (code, body["reason"]) == (413, "RequestEntityTooLarge")
        assert body["message"].endswith("denied request: static")


def test_vap_errors_follow_the_failure_policy_and_variables_fail_only_where_used():
    with ApiServer() as api:
        api.apply(policy([{"expression": "variables.bad == 'x'"}],
                         variables=[{"name": "bad", "expression": "object.data.missing"},
                                    {"name": "unused", "expression": "object.nothing.here"}]),
                  binding(["Deny"]))
        code, body, _ = call(api, None, "POST", CM, cm("e"))
        assert code == 422 and "expression 'variables.bad == 'x'' resulted in error" in body["message"]
        api.apply(policy([{"expression": "variables.bad == 'x'"}], failure="Ignore",
                         variables=[{"name": "bad", "expression": "object.data.missing"}]))
        assert call(api, None, "POST", CM, cm("e"))[0] == 201


def test_vap_warn_and_audit_actions_and_match_conditions():
    with ApiServer() as api:
        api.apply(policy([{"expression": "false", "message": "careful"}],
                         matchConditions=[{"name": "labelled",
                                           "expression": "'watch' in object.metadata.labels"}]),
                  binding(["Warn", "Audit"]))
        assert call(api, None, "POST", CM, cm("quiet"))[0] == 201  # matchCondition false: not evaluated
        code, _, headers = call(api, None, "POST", CM, cm("loud", labels={"watch": "1"}))
        assert code == 201
        assert "299 - \"Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': careful\"" in (
            headers.get("Warning", ""))
        rec = api.audit[-1]
        failures = json.loads(rec.annotations["validation.policy.admission.k8s.io/validation_failure"])
        assert failures[0]["message"] == "careful" and failures[0]["validationActions"] == ["Warn", "Audit"]


def test_vap_binding_match_resources_and_selectors_narrow_the_policy():
    with ApiServer() as api:
        api.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "prod", "labels": {"env": "prod"}}})
        api.apply(policy([{"expression": "false"}]),
                  binding(["Deny"], matchResources={"namespaceSelector": {"matchLabels": {"env": "prod"}}}))
        assert call(api, None, "POST", CM, cm("dev"))[0] == 201
        assert call(api, None, "POST", "/api/v1/namespaces/prod/configmaps", cm("p1"))[0] == 422
        api.delete("ValidatingAdmissionPolicyBinding", None, "b")
        assert call(api, None, "POST", "/api/v1/namespaces/prod/configmaps", cm("p2"))[0] == 201  # unbound


def test_reviews_need_system_auth_delegator(secured):
    """TokenReview/SubjectAccessReview are RBAC-checked creates; the role's optional binding grants them."""
    api, tokens = secured
    sched = tokens.add_service_account("kube-system", "hami-scheduler")
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "t"}}
    code, body, _ = call(api, sched, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)
    assert code == 403 and 'cannot create resource "tokenreviews" in API group "authentication.k8s.io"' in (
        body["message"])
    from tests.sim.role_manifests import render

    api.apply(*render("cluster.yaml.j2", hami_rbac_scheduler_token_review=True))
    code, body, _ = call(api, sched, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)
    assert code != 403, body  # authorized (answered by the reviews module, else 404 here)
