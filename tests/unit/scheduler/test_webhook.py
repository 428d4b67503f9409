"""Mutating webhook (Project-HAMi/HAMi pkg/scheduler/webhook.go): AdmissionReview v1 in, JSONPatch out."""

from __future__ import annotations

import base64
import json

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.verbs.extender import BadRequest, SchedulerConfig

pytestmark = pytest.mark.unit


def review(pod, op="CREATE", ns="default"):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "rq-1", "operation": op, "namespace": ns, "object": pod}}


def pod(limits=None, sched=None, privileged=False, annotations=None, node_name=None, env=None, labels=None):
    c = {"name": "main", "image": "cuda"}
    if limits is not None:
        c["resources"] = {"limits": limits}
    if privileged:
        c["securityContext"] = {"privileged": True}
    if env is not None:
        c["env"] = env
    spec = {"containers": [c]}
    if sched:
        spec["schedulerName"] = sched
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": "p", "annotations": annotations or {}, "labels": labels or {}}, "spec": spec}


def apply(doc: dict, ops: list[dict]) -> dict:
    """Minimal RFC 6902 add/remove applier for the ops the webhook emits."""
    doc = json.loads(json.dumps(doc))
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if op["op"] == "add":
            target[parts[-1]] = op["value"]
        elif op["op"] == "remove":
            del target[parts[-1]]
    return doc


def mutate(wh, p, **kw):
    out = wh.review(review(p, **kw))
    assert out["kind"] == "AdmissionReview" and out["response"]["uid"] == "rq-1"
    resp = out["response"]
    ops = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
    if ops:
        assert resp["patchType"] == "JSONPatch"
    return resp, apply(p, ops)


WH = Webhook(SchedulerConfig())


def test_exclusive_default_and_scheduler_name():
    resp, new = mutate(WH, pod({"nvidia.com/gpu": "1"}, sched="default-scheduler"))
    assert resp["allowed"]
    assert new["spec"]["schedulerName"] == "hami-scheduler"
    assert new["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1",
                                                                   "nvidia.com/gpucores": "100"}


def test_memory_only_gets_gpu_count_and_no_exclusive_cores():
    _resp, new = mutate(WH, pod({"nvidia.com/gpumem": "3000"}))
    assert new["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpumem": "3000",
                                                                   "nvidia.com/gpu": "1"}
    assert new["spec"]["schedulerName"] == "hami-scheduler"


def test_priority_env_and_core_policy():
    wh = Webhook(SchedulerConfig(gpu_core_policy="force"))
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10", "nvidia.com/priority": "1"}
    _resp, new = mutate(wh, pod(limits, env=[{"name": "A", "value": "b"}]))
    env = {e["name"]: e["value"] for e in new["spec"]["containers"][0]["env"]}
    assert env == {"A": "b", "CUDA_TASK_PRIORITY": "1", "GPU_CORE_UTILIZATION_POLICY": "force"}


@pytest.mark.parametrize(("p", "message"), [
    (pod({"nvidia.com/gpu": "1"}, privileged=True), "container main is privileged"),
    (pod({"nvidia.com/gpu": "1"}, node_name="n1"), "pod has node assigned"),
    # a rival of the pods HAMi places (issue 27 item 3)
    (pod({"nvidia.com/gpu": "1"}, sched="other-scheduler"),
     "pod requests HAMi resources but schedulerName is other-scheduler: set schedulerName hami-scheduler "
     "(HAMi places pods that use its resources)"),
    (pod({"nvidia.com/gpumem": "100"}, sched="volcano", node_name="n1"),
     "pod requests HAMi resources but schedulerName is volcano: set schedulerName hami-scheduler "
     "(HAMi places pods that use its resources)"),
])
def test_denials(p, message):
    resp = WH.review(review(p))["response"]
    assert resp["allowed"] is False and resp["status"]["message"] == message


def test_quota_denial():
    wh = Webhook(SchedulerConfig(), quota=lambda ns: (1000, None))
    resp = wh.review(review(pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "600"})))["response"]
    assert resp["allowed"] is False and resp["status"]["message"] == "exceeding resource quota"


def test_user_set_allocation_annotations_are_stripped():
    ann = {keys.DEVICES_TO_ALLOCATE: "GPU-x,NVIDIA,1,1:;", keys.VGPU_NODE: "n9", "team": "a"}
    _resp, new = mutate(WH, pod({"nvidia.com/gpu": "1"}, annotations=ann))
    assert new["metadata"]["annotations"] == {"team": "a"}


def test_skipped_pods():
    for p, kw in ((pod({"cpu": "1"}, sched="other-scheduler"), {}),
                  (pod({"nvidia.com/gpu": "1"}, labels={"hami.io/webhook": "ignore"}), {}),
                  (pod({"cpu": "1"}), {}),
                  (pod({"nvidia.com/gpu": "1"}), {"op": "UPDATE"})):
        resp = WH.review(review(p, **kw))["response"]
        assert resp["allowed"] and "patch" not in resp
    wh = Webhook(SchedulerConfig(), namespace_labels=lambda ns: {"hami.io/webhook": "ignore"})
    assert "patch" not in wh.review(review(pod({"nvidia.com/gpu": "1"})))["response"]


def test_default_scheduler_kept_without_force_overwrite():
    wh = Webhook(SchedulerConfig(force_overwrite_default_scheduler=False))
    _resp, new = mutate(wh, pod({"nvidia.com/gpu": "1"}, sched="default-scheduler"))
    assert new["spec"]["schedulerName"] == "default-scheduler"


def test_overwrite_env_for_gpu_less_containers():
    wh = Webhook(SchedulerConfig(overwrite_env=True))
    p = pod({"nvidia.com/gpu": "1"})
    p["spec"]["containers"].append({"name": "side", "image": "busybox"})
    _resp, new = mutate(wh, p)
    assert new["spec"]["containers"][1]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


def test_malformed_review():
    with pytest.raises(BadRequest, match="AdmissionReview.request"):
        WH.review({"kind": "AdmissionReview"})
    with pytest.raises(BadRequest, match="request.uid"):
        WH.review({"request": {}})
