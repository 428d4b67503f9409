"""The hami_rbac role's ValidatingAdmissionPolicy, as shipped, against forged allocations (issue 14,
finding 3): only the scheduler, and the device plugin of the pod's own node, write HAMi's allocation keys.

Every refusal is checked on the wire (status, reason, the real kube-apiserver message format) and for
"nothing written". The same requests succeed on a cluster without the policy (``cluster_without_policy``):
that is the hole the policy closes, and proof that these tests can fail."""

from __future__ import annotations

import json

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.serve.webhook import SCHEDULER_OWNED
from tests.integration.security.conftest import SA_NS, TENANT_NS
from tests.sim.apiserver_admission import FAILURE_ANNOTATION
from tests.sim.role_manifests import role_defaults

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POLICY = "hami-allocation-keys"
PLUGIN = f"system:serviceaccount:{SA_NS}:hami-device-plugin-"
MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
FORGED = {keys.VGPU_NODE: "gpu-0", keys.VGPU_TIME: "1700000000",
          keys.DEVICES_TO_ALLOCATE: "GPU-0000,NVIDIA,81920,100:;",
          keys.DEVICES_ALLOCATED: "GPU-0000,NVIDIA,81920,100:;",
          keys.BIND_PHASE: "allocating", keys.BIND_TIME: "1700000000"}


def pod(name: str, annotations: dict | None = None, labels: dict | None = None, node: str | None = None,
        gpu: bool = True, scheduler: str | None = "hami-scheduler") -> dict:
    limits = {"nvidia.com/gpu": "1"} if gpu else {}
    spec: dict = {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TENANT_NS, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})}, "spec": spec}


def pod_path(name: str = "", sub: str = "") -> str:
    return f"/api/v1/namespaces/{TENANT_NS}/pods" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def assert_refused(code: int, body: dict, name: str, *keys_named: str, who: str = "alice") -> None:
    assert code == 403, body
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["reason"] == "Forbidden"
    prefix = (f'pods "{name}" is forbidden: ValidatingAdmissionPolicy \'{POLICY}\' with binding '
              f"'{POLICY}' denied request: rule {POLICY}: {who} may not set, change or remove ")
    assert body["message"].startswith(prefix), body["message"]
    for k in keys_named:
        assert k in body["message"], (k, body["message"])
    assert f"system:serviceaccount:{SA_NS}:hami-scheduler" in body["message"]  # who may write them
    assert body["details"]["name"] == name and body["details"]["kind"] == "pods"
    assert body["details"]["causes"] == [{"message": body["message"].split(" is forbidden: ", 1)[1]}]


def scheduled(cluster, name: str = "p", node: str = "gpu-0") -> dict:
    """A pod as the scheduler leaves it: tenant-created, then annotated and bound by the scheduler."""
    code, body = cluster.call("tenant", "POST", pod_path(), pod(name))
    assert code == 201, body
    small = "GPU-a,NVIDIA,1000,10:;"
    ann = {keys.VGPU_NODE: node, keys.VGPU_TIME: "1700000000", keys.DEVICES_TO_ALLOCATE: small,
           keys.DEVICES_ALLOCATED: small, keys.BIND_PHASE: "allocating", keys.BIND_TIME: "1700000000"}
    code, body = cluster.call("scheduler", "PATCH", pod_path(name), {
        "metadata": {"annotations": ann, "labels": {keys.VGPU_NODE: node}}}, MERGE)
    assert code == 200, body
    code, body = cluster.call("scheduler", "POST", pod_path(name, "binding"), {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"kind": "Node", "name": node}})
    assert code == 201, body
    return cluster.api.get("Pod", TENANT_NS, name)


# -- the tenant --------------------------------------------------------------------------------------
def test_create_with_forged_allocation_is_refused_and_nothing_is_stored(cluster):
    code, body = cluster.call("tenant", "POST", pod_path(), pod("forged", FORGED, node="gpu-0"))
    assert_refused(code, body, "forged", *FORGED)
    assert cluster.api.get("Pod", TENANT_NS, "forged") is None


def test_the_same_create_succeeds_without_the_policy(cluster_without_policy):
    """The hole (issue 14 finding 3, Project-HAMi/HAMi#3076): RBAC alone lets a pod owner forge it."""
    forged = pod("forged", FORGED, node="gpu-0")
    code, body = cluster_without_policy.call("tenant", "POST", pod_path(), forged)
    assert code == 201, body
    assert cluster_without_policy.api.get("Pod", TENANT_NS, "forged")["metadata"]["annotations"] == FORGED


@pytest.mark.parametrize("key", SCHEDULER_OWNED)
def test_each_allocation_annotation_alone_is_refused_at_create(cluster, key):
    code, body = cluster.call("tenant", "POST", pod_path(), pod("one", {key: "x"}))
    assert_refused(code, body, "one", f"annotation {key}")


def test_the_vgpu_node_label_alone_is_refused_and_other_vendors_keys_too(cluster):
    code, body = cluster.call("tenant", "POST", pod_path(), pod("lbl", labels={keys.VGPU_NODE: "gpu-0"}))
    assert_refused(code, body, "lbl", f"label {keys.VGPU_NODE}")
    code, body = cluster.call("tenant", "POST", pod_path(),
                              pod("mlu", {"hami.io/cambricon-mlu-devices-allocated": "x"}))
    assert_refused(code, body, "mlu", "hami.io/cambricon-mlu-devices-allocated")


def test_a_non_gpu_pending_pod_posing_as_allocated_is_refused(cluster):
    """Finding 3's reverse case: a pod the webhook ignores (no GPU), labelled for gpu-0 with a forged
    devices-allocated, left Pending, would make the scheduler count phantom usage."""
    forged = pod("phantom", {keys.VGPU_NODE: "gpu-0", keys.DEVICES_ALLOCATED: "GPU-0000,NVIDIA,81920,100:;"},
                 labels={keys.VGPU_NODE: "gpu-0"}, gpu=False)
    code, body = cluster.call("tenant", "POST", pod_path(), forged)
    assert_refused(code, body, "phantom", f"annotation {keys.DEVICES_ALLOCATED}", f"label {keys.VGPU_NODE}")
    assert cluster.api.list("Pod", TENANT_NS) == []


def test_webhook_bypass_labels_grant_nothing(cluster):
    """hami.io/webhook=ignore and a foreign schedulerName skip the mutating webhook; the policy still runs."""
    bypass = pod("bypass", FORGED, labels={keys.WEBHOOK_IGNORE_LABEL: "ignore"}, node="gpu-0")
    bypass["spec"]["schedulerName"] = "my-own-scheduler"
    code, body = cluster.call("tenant", "POST", pod_path(), bypass)
    assert_refused(code, body, "bypass", keys.DEVICES_TO_ALLOCATE)
    plain = pod("plain", labels={keys.WEBHOOK_IGNORE_LABEL: "ignore"})
    assert cluster.call("tenant", "POST", pod_path(), plain)[0] == 201  # the label itself is harmless


@pytest.mark.parametrize("how", ["merge-patch", "json-patch", "put"])
def test_rewriting_a_scheduled_pods_devices_is_refused(cluster, how):
    before = scheduled(cluster)
    big = "GPU-b,NVIDIA,81920,100:;"
    if how == "merge-patch":
        code, body = cluster.call("tenant", "PATCH", pod_path("p"),
                                  {"metadata": {"annotations": {keys.DEVICES_TO_ALLOCATE: big}}}, MERGE)
    elif how == "json-patch":
        path = "/metadata/annotations/" + keys.DEVICES_TO_ALLOCATE.replace("/", "~1")
        code, body = cluster.call("tenant", "PATCH", pod_path("p"),
                                  [{"op": "replace", "path": path, "value": big}], JSONPATCH)
    else:
        obj = cluster.api.get("Pod", TENANT_NS, "p")
        obj["metadata"]["annotations"][keys.DEVICES_TO_ALLOCATE] = big
        code, body = cluster.call("tenant", "PUT", pod_path("p"), obj)
    assert_refused(code, body, "p", f"annotation {keys.DEVICES_TO_ALLOCATE}")
    after = cluster.api.get("Pod", TENANT_NS, "p")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_removing_an_allocation_key_is_refused(cluster):
    scheduled(cluster)
    code, body = cluster.call("tenant", "PATCH", pod_path("p"),
                              {"metadata": {"annotations": {keys.DEVICES_ALLOCATED: None},
                                            "labels": {keys.VGPU_NODE: None}}}, MERGE)
    assert_refused(code, body, "p", f"annotation {keys.DEVICES_ALLOCATED}", f"label {keys.VGPU_NODE}")


def test_the_tenants_other_edits_still_work(cluster):
    scheduled(cluster)
    code, body = cluster.call("tenant", "PATCH", pod_path("p"), {"metadata": {
        "labels": {"team": "a"}, "annotations": {"note": "mine", keys.USE_GPUTYPE: "A100"}}}, MERGE)
    assert code == 200, body
    obj = cluster.api.get("Pod", TENANT_NS, "p")
    code, body = cluster.call("tenant", "PUT", pod_path("p"), obj)  # a no-op replace keeps the keys
    assert code == 200, body


# -- the agent's identities -------------------------------------------------------------------------
def test_the_scheduler_may_write_set_and_clear(cluster):
    scheduled(cluster, "s")
    code, body = cluster.call("scheduler", "PATCH", pod_path("s"), {"metadata": {
        "annotations": {k: None for k in SCHEDULER_OWNED}, "labels": {keys.VGPU_NODE: None}}}, MERGE)
    assert code == 200, body


def test_the_device_plugin_of_the_pods_node_may_write_its_keys_only(cluster):
    scheduled(cluster, "q", node="gpu-0")
    done = {keys.DEVICES_TO_ALLOCATE: ";", keys.BIND_PHASE: "success"}
    code, body = cluster.call("plugin-gpu-0", "PATCH", pod_path("q"), {"metadata": {"annotations": done}},
                              MERGE)
    assert code == 200, body
    # a key the plugin never writes: refused even on its own node
    code, body = cluster.call("plugin-gpu-0", "PATCH", pod_path("q"),
                              {"metadata": {"annotations": {keys.DEVICES_ALLOCATED: "x"}}}, MERGE)
    assert_refused(code, body, "q", keys.DEVICES_ALLOCATED,
                   who=f"{PLUGIN}gpu-0")


def test_the_device_plugin_of_the_pods_node_may_record_dynamic_mig_runtime(cluster):
    # operatingmode mig: Allocate's success write adds the MIG UUID and GI/CI IDs to the scheduler's
    # reservation (HAMi annotateMigRuntimeInfo); only the pod's own node's plugin may
    scheduled(cluster, "m", node="gpu-0")
    runtime = {keys.MIG_ALLOCATIONS: '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0","profile":'
               '"1g.10gb","placement":{"start":6,"size":1},"migUUID":"MIG-1","gpuInstanceID":1,'
               '"computeInstanceID":0}]'}
    code, body = cluster.call("plugin-gpu-0", "PATCH", pod_path("m"), {"metadata": {"annotations": runtime}},
                              MERGE)
    assert code == 200, body
    other = {keys.MIG_ALLOCATIONS: runtime[keys.MIG_ALLOCATIONS].replace("MIG-1", "MIG-2")}
    code, body = cluster.call("plugin-gpu-1", "PATCH", pod_path("m"), {"metadata": {"annotations": other}},
                              MERGE)
    assert_refused(code, body, "m", keys.MIG_ALLOCATIONS, who=f"{PLUGIN}gpu-1")
    code, body = cluster.call("tenant", "PATCH", pod_path("m"), {"metadata": {"annotations": other}}, MERGE)
    assert code == 403, body


def test_the_device_plugin_of_another_node_is_refused(cluster):
    scheduled(cluster, "r", node="gpu-0")
    code, body = cluster.call("plugin-gpu-1", "PATCH", pod_path("r"),
                              {"metadata": {"annotations": {keys.BIND_PHASE: "success"}}}, MERGE)
    assert_refused(code, body, "r", keys.BIND_PHASE, who=f"{PLUGIN}gpu-1")
    assert cluster.api.get("Pod", TENANT_NS, "r")["metadata"]["annotations"][keys.BIND_PHASE] == "allocating"


def test_a_device_plugin_may_not_write_on_an_unbound_pod(cluster):
    assert cluster.call("tenant", "POST", pod_path(), pod("u"))[0] == 201
    code, body = cluster.call("plugin-gpu-0", "PATCH", pod_path("u"),
                              {"metadata": {"annotations": {keys.BIND_PHASE: "success"}}}, MERGE)
    assert_refused(code, body, "u", keys.BIND_PHASE, who=f"{PLUGIN}gpu-0")


# -- other doors: pods/binding, pods/status ----------------------------------------------------------
BINDER = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
          "metadata": {"name": "binder", "namespace": TENANT_NS},
          "rules": [{"apiGroups": [""], "resources": ["pods/binding", "pods/status"],
                     "verbs": ["create", "update", "patch"]}]}
BINDER_BINDING = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": {"name": "alice-binder", "namespace": TENANT_NS},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"},
                  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}


def test_a_binding_that_carries_allocation_keys_needs_the_scheduler(cluster):
    """pods/binding copies the Binding's annotations onto the pod: even a tenant that RBAC lets bind
    cannot smuggle allocation keys through it; a plain binding is fine."""
    cluster.api.apply(BINDER, BINDER_BINDING)
    assert cluster.call("tenant", "POST", pod_path(), pod("b"))[0] == 201
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "b",
                            "annotations": {keys.DEVICES_TO_ALLOCATE: FORGED[keys.DEVICES_TO_ALLOCATE]}},
               "target": {"kind": "Node", "name": "gpu-0"}}
    code, body = cluster.call("tenant", "POST", pod_path("b", "binding"), binding)
    assert_refused(code, body, "b", keys.DEVICES_TO_ALLOCATE)
    assert not cluster.api.get("Pod", TENANT_NS, "b")["spec"].get("nodeName")
    del binding["metadata"]["annotations"]
    assert cluster.call("tenant", "POST", pod_path("b", "binding"), binding)[0] == 201


def test_status_writes_cannot_change_allocation_keys(cluster):
    """pods/status may change metadata on a real server (the status strategy keeps only the spec)."""
    cluster.api.apply(BINDER, BINDER_BINDING)
    scheduled(cluster, "st")
    code, body = cluster.call("tenant", "PATCH", pod_path("st", "status"),
                              {"metadata": {"annotations": {keys.BIND_PHASE: "success"}}}, MERGE)
    assert_refused(code, body, "st", keys.BIND_PHASE)


# -- what an operator sees ---------------------------------------------------------------------------
def test_refusals_and_allowed_writes_are_in_the_audit_log(cluster):
    scheduled(cluster, "a")
    writes = [a for a in cluster.api.audit_for(f"system:serviceaccount:{SA_NS}:hami-scheduler")
              if a.annotations and f"{POLICY}/writer" in a.annotations]
    assert writes and keys.DEVICES_TO_ALLOCATE in writes[0].annotations[f"{POLICY}/writer"]
    cluster.call("tenant", "PATCH", pod_path("a"), {"metadata": {"annotations": {keys.BIND_PHASE: "x"}}},
                 MERGE)
    denied = [a for a in cluster.api.audit_for("alice") if a.code == 403]
    [failure] = json.loads(denied[-1].annotations[FAILURE_ANNOTATION])
    assert failure["policy"] == POLICY and failure["validationActions"] == ["Deny", "Audit"]
    assert keys.BIND_PHASE in failure["message"]


def test_the_policy_protects_every_key_the_scheduler_owns():
    """One list of keys: the role's default and the agent's SCHEDULER_OWNED must not drift apart."""
    defaults = role_defaults()
    assert set(defaults["hami_rbac_allocation_annotations"]) == set(SCHEDULER_OWNED)
    assert defaults["hami_rbac_allocation_labels"] == [keys.VGPU_NODE]
    assert set(defaults["hami_rbac_device_plugin_pod_keys"]) == {keys.DEVICES_TO_ALLOCATE, keys.BIND_PHASE,
                                                                 keys.MIG_ALLOCATIONS}


# -- no rival can exist (issue 27 item 3) ------------------------------------------------------------
GPU_POLICY = "hami-scheduled-gpu-pods"


def assert_rival_refused(code: int, body: dict, name: str, why: str, who: str = "alice") -> None:
    assert code == 403, body
    prefix = (f'pods "{name}" is forbidden: ValidatingAdmissionPolicy \'{GPU_POLICY}\' with binding '
              f"'{GPU_POLICY}' denied request: rule {GPU_POLICY}: {who} may not create a pod that requests "
              f"HAMi resources {why}")
    assert body["message"].startswith(prefix), body["message"]
    assert "placed by the HAMi scheduler (schedulerName hami-scheduler" in body["message"]


def test_the_issues_rival_is_refused_and_was_admitted_without_the_policy(cluster, cluster_without_policy):
    """A tenant pod with spec.nodeName, a foreign schedulerName and nvidia.com/gpu: 1 (no hami.io keys),
    created while a HAMi pod on that node waits between /bind and Allocate, made that pod fail with
    "ambiguous admission" (2 of 2 rounds). It cannot be created any more."""
    rival = pod("rival", node="gpu-0", scheduler="my-own-scheduler")
    code, body = cluster.call("tenant", "POST", pod_path(), rival)
    assert_rival_refused(code, body, "rival", "with spec.nodeName gpu-0 already set")
    assert cluster.api.get("Pod", TENANT_NS, "rival") is None
    assert cluster_without_policy.call("tenant", "POST", pod_path(), rival)[0] == 201  # the hole


@pytest.mark.parametrize("case", ["node set", "foreign scheduler", "default scheduler", "no scheduler name",
                                  "gpumem request only", "init container", "bypass label"])
def test_a_pod_requesting_hami_resources_is_created_only_for_the_hami_scheduler(cluster, case):
    p = pod("r", scheduler="hami-scheduler")
    why = "for scheduler default-scheduler"
    if case == "node set":
        p = pod("r", node="gpu-1")
        why = "with spec.nodeName gpu-1 already set"
    elif case == "foreign scheduler":
        p = pod("r", scheduler="volcano")
        why = "for scheduler volcano"
    elif case == "default scheduler":
        p = pod("r", scheduler="default-scheduler")
    elif case == "no scheduler name":
        p = pod("r", scheduler=None)
    elif case == "gpumem request only":
        p = pod("r", gpu=False, scheduler="other")
        p["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpumem": "1000"}}
        why = "for scheduler other"
    elif case == "init container":
        p = pod("r", gpu=False, node="gpu-0")
        p["spec"]["initContainers"] = [{"name": "i", "image": "x",
                                        "resources": {"limits": {"nvidia.com/gpucores": "10"}}}]
        why = "with spec.nodeName gpu-0 already set"
    elif case == "bypass label":  # hami.io/webhook=ignore skips the mutating webhook, never this rule
        p = pod("r", labels={keys.WEBHOOK_IGNORE_LABEL: "ignore"}, scheduler="default-scheduler")
    code, body = cluster.call("tenant", "POST", pod_path(), p)
    assert_rival_refused(code, body, "r", why)
    assert cluster.api.get("Pod", TENANT_NS, "r") is None


def test_pods_that_are_no_rivals_are_created(cluster):
    ok = [pod("hami-pod"),  # the HAMi scheduler places it
          pod("cpu-pod", gpu=False, node="gpu-0"),  # asks for no HAMi resource
          pod("cpu-pod-2", gpu=False, scheduler="volcano")]
    mig = pod("static-mig", gpu=False, node="gpu-0")  # the kubelet picks static MIG devices: no lock involved
    mig["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.48gb": "1"}}
    for p in ok + [mig]:
        code, body = cluster.call("tenant", "POST", pod_path(), p)
        assert code == 201, body


def test_the_scheduler_itself_is_exempt(cluster):
    """The rule names the scheduler as the one identity that may create such a pod (it creates none today)."""
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-editor"}
    sa = {"kind": "ServiceAccount", "name": "hami-scheduler", "namespace": SA_NS}
    cluster.api.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": "sched-pods", "namespace": TENANT_NS}, "roleRef": ref,
                       "subjects": [sa]})
    code, body = cluster.call("scheduler", "POST", pod_path(), pod("placed", node="gpu-0"))
    assert code == 201, body
