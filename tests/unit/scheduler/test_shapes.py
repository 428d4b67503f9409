"""Mistyped fields get a 400 naming the field (issue 14 finding 4: these were 500s with a Python
exception text), through the real HTTP path, and nothing is written."""

from __future__ import annotations

import copy
import http.client
import json

import pytest

from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.unit.scheduler.helpers import FakePodClient, dev, gpu_pod

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture(scope="module")
def srv():
    """The extender reads pod state from the API (``FakePodClient``), never from the body: pod ``p``,
    which every mistyped body names, exists there, so only the shape check stands between a bad body
    and a write."""
    cache = UsageCache()
    cache.set_node("n1", [dev(0, uuid="GPU-n1-0", mem=8192)])
    client = FakePodClient()
    client.add(gpu_pod("p", mem=100))
    ext = Extender(cache, SchedulerConfig(), client)
    ext.synced.set()
    s = ExtenderHTTPServer(ext, Webhook(SchedulerConfig())).start()
    s.client = client
    yield s
    s.stop()
    ext.healer.stop()


def writes(srv) -> int:
    return len(srv.client.patches) + len(srv.client.events)


def post(srv, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def pod_with(path: list, value):
    pod = gpu_pod("p", mem=100)
    obj = pod
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    return pod


FILTER_CASES = [
    (pod_with(["spec", "containers"], "main"), "ExtenderArgs.Pod.spec.containers: want a list, got a string"),
    (pod_with(["metadata", "annotations"], ["a"]), "ExtenderArgs.Pod.metadata.annotations: want an object"),
    (pod_with(["metadata", "annotations"], {"hami.io/x": 1}),
     "ExtenderArgs.Pod.metadata.annotations['hami.io/x']: want a string value"),
    (pod_with(["metadata", "labels"], "x"), "ExtenderArgs.Pod.metadata.labels: want an object"),
    (pod_with(["spec", "containers", 0, "resources"], []), "ExtenderArgs.Pod.spec.containers[0].resources"),
    (pod_with(["spec", "containers", 0, "resources", "limits"], {"nvidia.com/gpu": {"a": 1}}),
     "ExtenderArgs.Pod.spec.containers[0].resources.limits['nvidia.com/gpu']: want a quantity"),
    (pod_with(["spec", "containers", 0, "resources", "limits"], {"nvidia.com/gpu": True}),
     "resources.limits['nvidia.com/gpu']: want a quantity"),
    (pod_with(["spec", "containers", 0], "main"), "ExtenderArgs.Pod.spec.containers[0]: want an object"),
    (pod_with(["spec"], []), "ExtenderArgs.Pod.spec: want an object, got a list"),
    (pod_with(["metadata", "name"], 7), "ExtenderArgs.Pod.metadata.name: want a string, got a number"),
    (pod_with(["spec", "schedulerName"], ["x"]), "ExtenderArgs.Pod.spec.schedulerName: want a string"),
    (pod_with(["spec", "initContainers"], {"a": 1}), "ExtenderArgs.Pod.spec.initContainers: want a list"),
    (pod_with(["status"], "Running"), "ExtenderArgs.Pod.status: want an object"),
]


@pytest.mark.parametrize(("pod", "message"), FILTER_CASES)
def test_mistyped_pod_fields_are_400_naming_the_field(srv, pod, message):
    before = writes(srv)
    for verb in ("/filter", "/prioritize"):
        code, text = post(srv, verb, {"Pod": pod, "NodeNames": ["n1"]})
        assert code == 400 and message in json.loads(text)["error"], text
    assert writes(srv) == before


@pytest.mark.parametrize(("args", "message"), [
    ({"Pod": gpu_pod("p", mem=1), "NodeNames": [1, None]}, "ExtenderArgs.NodeNames[0]: want a node name"),
    ({"Pod": gpu_pod("p", mem=1), "NodeNames": "n1"}, "ExtenderArgs.NodeNames: want a list, got a string"),
    ({"Pod": gpu_pod("p", mem=1), "Nodes": "x"}, "ExtenderArgs.Nodes: want an object, got a string"),
    ({"Pod": gpu_pod("p", mem=1), "Nodes": {"items": [{"metadata": {"name": 3}}]}},
     "ExtenderArgs.Nodes.items[0].metadata.name"),
    ({"Pod": gpu_pod("p", mem=1), "Nodes": {"items": "x"}}, "ExtenderArgs.Nodes.items: want a list"),
    ({"Pod": "p", "NodeNames": []}, "ExtenderArgs.Pod: want an object, got a string"),
    ({"NodeNames": ["n1"]}, "ExtenderArgs.Pod: missing"),
    ([], "ExtenderArgs: want an object, got a list"),
])
def test_mistyped_extender_args_are_400(srv, args, message):
    code, text = post(srv, "/filter", args)
    assert code == 400 and message in json.loads(text)["error"], text


def test_case_insensitive_field_names_are_still_checked(srv):
    code, text = post(srv, "/filter", {"pod": gpu_pod("p", mem=1), "nodenames": [None]})
    assert code == 400 and "ExtenderArgs.NodeNames[0]" in text


@pytest.mark.parametrize(("args", "message"), [
    ({"PodName": 1, "PodNamespace": "d", "Node": "n1"}, "ExtenderBindingArgs.PodName: want a string"),
    ({"PodName": "p", "PodNamespace": ["d"], "Node": "n1"},
     "ExtenderBindingArgs.PodNamespace: want a string"),
    ({"PodName": "p", "PodNamespace": "d", "Node": {"n": 1}}, "ExtenderBindingArgs.Node: want a string"),
    ({"PodName": "p", "PodNamespace": "d", "PodUID": 5, "Node": "n1"}, "ExtenderBindingArgs.PodUID"),
    ("bind", "ExtenderBindingArgs: want an object, got a string"),
])
def test_mistyped_binding_args_are_400(srv, args, message):
    code, text = post(srv, "/bind", args)
    assert code == 400 and message in json.loads(text)["error"], text


def review(obj, **req):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "operation": "CREATE", "object": obj, **req}}


@pytest.mark.parametrize(("body", "message"), [
    ({"request": "x"}, "AdmissionReview.request: want an object, got a string"),
    ({}, "AdmissionReview.request: want an object, got null"),
    (review(gpu_pod("p"), uid=7), "AdmissionReview.request.uid: want a string"),
    (review(pod_with(["spec", "containers"], "c")), "AdmissionReview.request.object.spec.containers"),
    (review(pod_with(["metadata", "labels"], ["a"])), "AdmissionReview.request.object.metadata.labels"),
    (review(pod_with(["spec", "containers", 0, "securityContext"], {"privileged": "yes"})),
     "securityContext.privileged: want a boolean"),
    (review(gpu_pod("p"), userInfo="root"), "AdmissionReview.request.userInfo: want an object"),
])
def test_mistyped_admission_reviews_are_400(srv, body, message):
    code, text = post(srv, "/webhook", body)
    assert code == 400 and message in json.loads(text)["error"], text


def test_well_typed_requests_still_pass(srv):
    pod = srv.client.add(gpu_pod("ok", mem=100))
    before = writes(srv)
    code, text = post(srv, "/filter", {"Pod": pod, "NodeNames": ["n1"]})
    assert code == 200 and json.loads(text)["NodeNames"] == ["n1"]
    assert writes(srv) > before  # the decision was written: the same path a mistyped body never reaches
    pod = copy.deepcopy(gpu_pod("w", mem=100))
    code, text = post(srv, "/webhook", review(pod))
    assert code == 200 and json.loads(text)["response"]["allowed"] is True
