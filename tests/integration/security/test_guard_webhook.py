"""The allocation guard webhook (``/validate``, serve/guard.py) decides exactly as the role's admission
policies do (issue 27 item 1: where the cluster cannot run ValidatingAdmissionPolicies, the webhook's
``failurePolicy: Fail`` path enforces the same rules for CREATE and UPDATE of pods, pods/status,
pods/ephemeralcontainers and bindings).

Differential: the policies the ``hami_rbac`` role renders, evaluated by the simulated API server's CEL
engine (cel-python), and ``AllocationGuard``, on the same requests: the same allow/deny and, for a denial,
the same message. The requests are the hand-made cases of test_admission_policy.py plus random ones
(identities, operations, subresources, allocation keys added/changed/removed, labels, HAMi resources,
nodeName, schedulerName). Then over HTTP: the scheduler serves /validate on its webhook listener."""

from __future__ import annotations

import copy
import json
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hami_agent.protocol import keys
from hami_agent.scheduler.serve.guard import AllocationGuard
from hami_agent.scheduler.serve.webhook import SCHEDULER_OWNED
from tests.sim.apiserver_admission import Admission, AdmissionRequest
from tests.sim.apiserver_auth import UserInfo
from tests.sim.apiserver_store import ApiError, Store, resource_for_kind
from tests.sim.fixtures import api_server  # noqa: F401
from tests.sim.role_manifests import render

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]

NS = "kube-system"
SCHED = f"system:serviceaccount:{NS}:hami-scheduler"
PLUGIN = f"system:serviceaccount:{NS}:hami-device-plugin-"
USERS = [SCHED, PLUGIN + "gpu-0", PLUGIN + "gpu-1", "alice", "system:node:gpu-0"]
PODS = resource_for_kind("pods")
KEYS = [*SCHEDULER_OWNED, "hami.io/cambricon-mlu-devices-allocated", "hami.io/other", "team"]
RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/mig-1g.10gb", "cpu"]


@pytest.fixture(scope="module")
def engine() -> Admission:
    store = Store()
    for doc in render("admission.yaml.j2", hami_rbac_namespace=NS):
        store.create(resource_for_kind(doc["kind"], doc.get("apiVersion")), "", doc, seed=True)
    return Admission(store)


GUARD = AllocationGuard(SCHED, PLUGIN, ("hami-scheduler",))


def pod(annotations=None, labels=None, node=None, sched="hami-scheduler", resources=None, init=None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "x",
                                  "resources": {"limits": {r: "1" for r in (resources or [])}}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "image": "x",
                                   "resources": {"requests": {r: "1" for r in init}}}]
    if sched is not None:
        spec["schedulerName"] = sched
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a", "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})}, "spec": spec}


def binding(annotations=None) -> dict:
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "p", "namespace": "team-a", "annotations": dict(annotations or {})},
            "target": {"kind": "Node", "name": "gpu-0"}}


def policy_decision(engine: Admission, user: str, op: str, sub: str, obj: dict, old: dict | None):
    kind = ("", "v1", "Binding") if sub == "binding" else ("", "v1", "Pod")
    req = AdmissionRequest(op, PODS, sub, "team-a", "p", UserInfo(user, ()), kind)
    try:
        engine.validate(req, copy.deepcopy(obj), copy.deepcopy(old))
    except ApiError as exc:
        return False, exc.message.split(" denied request: ", 1)[1]
    return True, ""


def guard_decision(user: str, op: str, sub: str, obj: dict, old: dict | None):
    kind = "Binding" if sub == "binding" else "Pod"
    req = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": kind},
           "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": op,
           "namespace": "team-a", "name": "p", "userInfo": {"username": user}, "object": obj}
    if sub:
        req["subResource"] = sub
    if old is not None:
        req["oldObject"] = old
    resp = GUARD.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
    r = resp["response"]
    assert r["uid"] == "u"
    if r["allowed"]:
        return True, ""
    assert r["status"]["code"] == 403 and r["status"]["reason"] == "Forbidden"
    return False, r["status"]["message"]


def same(engine, user, op, sub, obj, old):
    want = policy_decision(engine, user, op, sub, obj, old)
    got = guard_decision(user, op, sub, obj, old)
    assert got == want, (user, op, sub, obj, old)
    return got


SMALL = "GPU-a,NVIDIA,1000,10:;"
BIG = "GPU-b,NVIDIA,81920,100:;"
SCHEDULED = pod({keys.VGPU_NODE: "gpu-0", keys.DEVICES_TO_ALLOCATE: SMALL, keys.DEVICES_ALLOCATED: SMALL,
                 keys.BIND_PHASE: "allocating"}, {keys.VGPU_NODE: "gpu-0"}, node="gpu-0",
                resources=["nvidia.com/gpu"])


def _with(p: dict, annotations=None, labels=None) -> dict:
    q = copy.deepcopy(p)
    for k, v in (annotations or {}).items():
        if v is None:
            q["metadata"]["annotations"].pop(k, None)
        else:
            q["metadata"]["annotations"][k] = v
    for k, v in (labels or {}).items():
        if v is None:
            q["metadata"]["labels"].pop(k, None)
        else:
            q["metadata"]["labels"][k] = v
    return q


CASES = {
    # issue 27 item 1: the owner rewrites its own pod's devices after scheduling
    "owner rewrites to-allocate": ("alice", "UPDATE", "", _with(SCHEDULED, {keys.DEVICES_TO_ALLOCATE: BIG}),
                                   SCHEDULED, False),
    "forged create": ("alice", "CREATE", "", pod({keys.DEVICES_TO_ALLOCATE: BIG},
                                                 resources=["nvidia.com/gpu"]), None, False),
    "status write": ("alice", "UPDATE", "status", _with(SCHEDULED, {keys.BIND_PHASE: "success"}), SCHEDULED,
                     False),
    "ephemeral containers": ("alice", "UPDATE", "ephemeralcontainers",
                             _with(SCHEDULED, {keys.VGPU_NODE: "gpu-1"}), SCHEDULED, False),
    "binding with keys": ("alice", "CREATE", "binding", binding({keys.DEVICES_TO_ALLOCATE: BIG}), None,
                          False),
    "plain binding": ("alice", "CREATE", "binding", binding(), None, True),
    "label removed": ("alice", "UPDATE", "", _with(SCHEDULED, labels={keys.VGPU_NODE: None}), SCHEDULED,
                      False),
    "other edits": ("alice", "UPDATE", "", _with(SCHEDULED, {"team": "a"}, {"x": "y"}), SCHEDULED, True),
    "scheduler writes": (SCHED, "UPDATE", "", _with(SCHEDULED, {keys.BIND_TIME: "1"}), SCHEDULED, True),
    "own node's plugin": (PLUGIN + "gpu-0", "UPDATE", "", _with(SCHEDULED, {keys.BIND_PHASE: "success",
                                                                          keys.DEVICES_TO_ALLOCATE: ";"}),
                          SCHEDULED, True),
    "other node's plugin": (PLUGIN + "gpu-1", "UPDATE", "", _with(SCHEDULED, {keys.BIND_PHASE: "success"}),
                            SCHEDULED, False),
    "plugin, not its key": (PLUGIN + "gpu-0", "UPDATE", "", _with(SCHEDULED, {keys.DEVICES_ALLOCATED: BIG}),
                            SCHEDULED, False),
    # issue 27 item 3: rivals
    "rival, node set": ("alice", "CREATE", "", pod(node="gpu-0", sched="x", resources=["nvidia.com/gpu"]),
                        None, False),
    "rival, foreign scheduler": ("alice", "CREATE", "", pod(sched="volcano", init=["nvidia.com/gpumem"]),
                                 None, False),
    "rival, no scheduler name": ("alice", "CREATE", "", pod(sched=None, resources=["nvidia.com/gpucores"]),
                                 None, False),
    "static MIG with node": ("alice", "CREATE", "", pod(node="gpu-0", resources=["nvidia.com/mig-1g.10gb"]),
                             None, True),
    "scheduler places": (SCHED, "CREATE", "", pod(node="gpu-0", resources=["nvidia.com/gpu"]), None, True),
    "hami pod": ("alice", "CREATE", "", pod(resources=["nvidia.com/gpu"]), None, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_guard_decides_like_the_policies(engine, case):
    user, op, sub, obj, old, allowed = CASES[case]
    got = same(engine, user, op, sub, obj, old)
    assert got[0] is allowed, got


values = st.sampled_from(["", "x", SMALL, BIG, "gpu-0", "success"])
annotation_sets = st.dictionaries(st.sampled_from(KEYS), values, max_size=4)
label_sets = st.dictionaries(st.sampled_from([keys.VGPU_NODE, "app"]), st.sampled_from(["gpu-0", "gpu-1"]),
                             max_size=2)
pods = st.builds(pod, annotation_sets, label_sets, st.sampled_from([None, "gpu-0", "gpu-1"]),
                 st.sampled_from([None, "hami-scheduler", "default-scheduler", "volcano", ""]),
                 st.lists(st.sampled_from(RESOURCES), max_size=2),
                 st.lists(st.sampled_from(RESOURCES), max_size=1))


@settings(max_examples=250, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(user=st.sampled_from(USERS),
       op_sub=st.sampled_from([("CREATE", ""), ("UPDATE", ""), ("UPDATE", "status"),
                               ("UPDATE", "ephemeralcontainers"), ("CREATE", "binding")]),
       new=pods, old=pods, bind_ann=annotation_sets)
@example(user="alice", op_sub=("UPDATE", ""), new=_with(SCHEDULED, {keys.DEVICES_TO_ALLOCATE: BIG}),
         old=SCHEDULED, bind_ann={})
def test_random_requests_get_the_same_answer(engine, user, op_sub, new, old, bind_ann):
    op, sub = op_sub
    if sub == "binding":
        same(engine, user, op, sub, binding(bind_ann), None)
    else:
        same(engine, user, op, sub, new, old if op == "UPDATE" else None)


def test_the_scheduler_serves_it_on_the_webhook_listener(api_server):  # noqa: F811
    from hami_agent.k8s.client import KubeClient
    from hami_agent.scheduler.serve.app import SchedulerApp
    from hami_agent.scheduler.verbs.extender import SchedulerConfig

    app = SchedulerApp(KubeClient.from_kubeconfig(api_server.kubeconfig_path), SchedulerConfig(),
                       guard=GUARD).start()
    try:
        user, op, sub, obj, old, _ = CASES["owner rewrites to-allocate"]
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                              "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": op,
                              "namespace": "team-a", "name": "p", "userInfo": {"username": user},
                              "object": obj, "oldObject": old}}
        req = urllib.request.Request(app.url + "/validate", data=json.dumps(review).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            resp = json.loads(r.read())["response"]
        assert resp["uid"] == "r1" and resp["allowed"] is False
        assert resp["status"]["message"].startswith("rule hami-allocation-keys: alice may not set, change or "
                                                    "remove annotation hami.io/vgpu-devices-to-allocate")
    finally:
        app.stop()


# -- the guard's ValidatingWebhookConfiguration: what its matchConditions leave out, the guard allows
def _guard_configuration() -> dict:
    import yaml

    from tests.unit.roles.test_unit_templates import render, render_env, role_vars

    env = render_env()
    env.filters["to_json"] = json.dumps
    v = role_vars("hami_scheduler")
    text = env.from_string((ROOT / "roles" / "hami_scheduler" / "templates" / "guard-webhook.yaml.j2")
                           .read_text()).render(**v)
    assert render  # the same renderer the unit-template tests use
    return yaml.safe_load(text)


def test_the_webhook_configuration_fails_closed_and_skips_no_label():
    cfg = _guard_configuration()
    (hook,) = cfg["webhooks"]
    assert cfg["kind"] == "ValidatingWebhookConfiguration" and hook["failurePolicy"] == "Fail"
    assert hook["clientConfig"]["url"] == "https://control-1:9443/validate"
    assert [r["resources"] for r in hook["rules"]] == [["pods", "pods/status", "pods/ephemeralcontainers"],
                                                       ["pods/binding"]]
    assert [r["operations"] for r in hook["rules"]] == [["CREATE", "UPDATE"], ["CREATE"]]
    assert "objectSelector" not in hook and "namespaceSelector" not in hook  # nothing a tenant sets skips it


@pytest.fixture(scope="module")
def condition():
    import celpy

    (cond,) = _guard_configuration()["webhooks"][0]["matchConditions"]
    env = celpy.Environment()
    prog = env.program(env.compile(cond["expression"]))

    def evaluate(op: str, sub: str, obj: dict, old: dict | None) -> bool:
        request = {"operation": op, "resource": {"group": "", "version": "v1", "resource": "pods"},
                   "userInfo": {"username": "alice"}}
        if sub:
            request["subResource"] = sub
        return bool(prog.evaluate({"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                                   "request": celpy.json_to_cel(request)}))

    return evaluate


@settings(max_examples=250, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(user=st.sampled_from(USERS),
       op_sub=st.sampled_from([("CREATE", ""), ("UPDATE", ""), ("UPDATE", "status"),
                               ("UPDATE", "ephemeralcontainers"), ("CREATE", "binding")]),
       new=pods, old=pods, bind_ann=annotation_sets)
def test_the_match_conditions_never_hide_a_request_the_guard_refuses(condition, user, op_sub, new, old,
                                                                      bind_ann):
    op, sub = op_sub
    obj, prev = (binding(bind_ann), None) if sub == "binding" else (new, old if op == "UPDATE" else None)
    if not condition(op, sub, obj, prev):
        assert guard_decision(user, op, sub, obj, prev)[0] is True, (user, op, sub, obj, prev)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_match_conditions_send_every_hand_made_refusal(condition, case):
    user, op, sub, obj, old, allowed = CASES[case]
    if not allowed:
        assert condition(op, sub, obj, old)
