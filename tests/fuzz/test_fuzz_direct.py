"""The extender's and the webhook's own parsing, called directly (no HTTP, so no ``scheduler.shapes`` in
front): the HA forwarder's leader, tests and embedders call ``Extender.filter``/``bind`` and
``Webhook.review`` this way. Whatever JSON comes in, the answer is a result or ``BadRequest`` naming the
field, never another exception (which the HTTP layer would turn into a 500).

Regression examples: the fuzz suite over HTTP found ``"spec": null`` reaching the webhook's
``setdefault()`` (500); the shape layer refuses it now, but the webhook itself raised AttributeError on it
and on the other cases below, and ``prioritize`` raised on ``Nodes.items[0].metadata: 1``."""

from __future__ import annotations

import base64
import copy
import json

import pytest
from hypothesis import HealthCheck, example, given, settings

from hami_agent.scheduler.serve.server import prioritize
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.verbs.extender import BadRequest, Extender, SchedulerConfig
from tests.fuzz.strategies import json_value, mutate, mutated

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "fuzz", "namespace": "default", "uid": "uid-fuzz",
                    "labels": {"app": "x"}, "annotations": {"hami.io/vgpu-node": "forged"}},
       "spec": {"schedulerName": "hami-scheduler",
                "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "containers": [{"name": "main", "image": "cuda",
                                "env": [{"name": "A", "value": "1"}],
                                "securityContext": {"privileged": False},
                                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000",
                                                         "nvidia.com/priority": "1"},
                                              "requests": {"nvidia.com/gpucores": "10"}}}]}}
FILTER = {"Pod": POD, "NodeNames": ["gpu-0", "gpu-1"]}
FILTER_NODES = {"Pod": POD, "Nodes": {"items": [{"metadata": {"name": "gpu-0"}}]}}
BIND = {"PodName": "fuzz", "PodNamespace": "default", "PodUID": "uid-fuzz", "Node": "gpu-0"}
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                      "operation": "CREATE", "namespace": "default", "userInfo": {"username": "alice"},
                      "object": POD}}


def _with(template: dict, path: tuple, value) -> dict:
    return mutate(template, path, "replace", value)


OBJ = ("request", "object")
MAIN = (*OBJ, "spec", "containers", 0)


@pytest.fixture(scope="module")
def extender():
    ext = Extender(UsageCache(), SchedulerConfig())  # no API client: parsing is what is under test
    ext.synced.set()
    yield ext
    ext.healer.stop()


@pytest.fixture(scope="module")
def webhook():
    return Webhook(SchedulerConfig(), quota=lambda ns: (10**9, 10**6), namespace_labels=lambda ns: {})


def assert_names_a_field(exc: BadRequest, *roots: str) -> None:
    assert str(exc).startswith(roots), f"BadRequest does not name the field: {exc}"


# ------------------------------------------------------------------------------------------- webhook
# Each raised AttributeError in the webhook before it checked its input itself.
BAD_REVIEWS = {
    "spec null": (_with(REVIEW, (*OBJ, "spec"), None), "AdmissionReview.request.object.spec"),
    "metadata a number": (_with(REVIEW, (*OBJ, "metadata"), 1), "AdmissionReview.request.object.metadata"),
    "labels a list": (_with(REVIEW, (*OBJ, "metadata", "labels"), ["a"]),
                      "AdmissionReview.request.object.metadata.labels"),
    "containers a string": (_with(REVIEW, (*OBJ, "spec", "containers"), "x"),
                            "AdmissionReview.request.object.spec.containers"),
    "env a string": (_with(REVIEW, (*MAIN, "env"), "abc"),
                     "AdmissionReview.request.object.spec.containers[0].env"),
    "env item a number": (_with(REVIEW, (*MAIN, "env"), [1]),
                          "AdmissionReview.request.object.spec.containers[0].env[0]"),
    "securityContext a string": (_with(REVIEW, (*MAIN, "securityContext"), "yes"),
                                 "AdmissionReview.request.object.spec.containers[0].securityContext"),
    "limits a list": (_with(REVIEW, (*MAIN, "resources", "limits"), ["nvidia.com/gpu"]),
                      "AdmissionReview.request.object.spec.containers[0].resources.limits"),
    "apiVersion an object": (_with(REVIEW, ("apiVersion",), {}), "AdmissionReview.apiVersion"),
}


@pytest.mark.parametrize("case", sorted(BAD_REVIEWS))
def test_webhook_refuses_mistyped_fields_naming_them(webhook, case):
    body, field = BAD_REVIEWS[case]
    with pytest.raises(BadRequest) as info:
        webhook.review(body)
    assert str(info.value).startswith(field), str(info.value)


def _patch(answer: dict) -> list[dict]:
    return json.loads(base64.b64decode(answer["response"]["patch"]))


def test_webhook_takes_null_limits_and_env_as_empty(webhook):
    """A present null is Go's empty value: the defaults are added instead of raising on ``None``."""
    body = _with(REVIEW, (*MAIN, "resources"), {"limits": None, "requests": {"nvidia.com/gpumem": "1000"}})
    body = _with(body, (*MAIN, "env"), None)
    body = _with(body, (*OBJ, "spec", "initContainers"), None)
    body["request"]["object"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/priority"] = "1"
    answer = webhook.review(body)
    assert answer["response"]["allowed"] is True
    ops = {op["path"]: op for op in _patch(answer)}
    assert ops["/spec/containers/0/resources"]["value"]["limits"] == {"nvidia.com/gpu": "1"}
    assert ops["/spec/containers/0/env"]["value"] == [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]


def test_webhook_leaves_objects_that_are_not_pods_alone(webhook):
    body = copy.deepcopy(REVIEW)
    body["request"]["kind"]["kind"] = "Deployment"
    assert webhook.review(body)["response"] == {"allowed": True, "uid": "r-1"}


@FUZZ
@given(body=mutated(REVIEW) | json_value)
@example(body=BAD_REVIEWS["spec null"][0])
def test_webhook_is_total(webhook, body):
    try:
        answer = webhook.review(body)
    except BadRequest as exc:
        assert_names_a_field(exc, "AdmissionReview")
        return
    resp = answer["response"]
    assert answer["kind"] == "AdmissionReview" and isinstance(resp["allowed"], bool)
    assert resp["uid"] == body["request"]["uid"]
    if "patch" in resp:
        assert all(op["path"].startswith(("/spec/", "/metadata/annotations/")) for op in _patch(answer))


# ------------------------------------------------------------------------------------------ extender
@FUZZ
@given(body=mutated(FILTER) | mutated(FILTER_NODES) | json_value)
def test_filter_is_total(extender, body):
    try:
        result = extender.filter(body)
    except BadRequest as exc:
        assert_names_a_field(exc, "ExtenderArgs")
        return
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@FUZZ
@given(body=mutated(BIND) | json_value)
def test_bind_is_total(extender, body):
    try:
        result = extender.bind(body)
    except BadRequest as exc:
        assert_names_a_field(exc, "ExtenderBindingArgs")
        return
    assert isinstance(result.get("Error"), str)


@FUZZ
@given(body=mutated(FILTER) | mutated(FILTER_NODES) | json_value)
@example(body=_with(FILTER_NODES, ("Nodes", "items", 0, "metadata"), 1))  # AttributeError before
@example(body=_with(FILTER, ("NodeNames",), "gpu-0"))  # was iterated as characters
def test_prioritize_is_total(body):
    try:
        result = prioritize(body)
    except BadRequest as exc:
        assert_names_a_field(exc, "ExtenderArgs")
        return
    assert all(isinstance(h["Host"], str) and h["Host"] and h["Score"] == 0 for h in result)


def test_prioritize_and_filter_read_node_lists_alike(extender):
    """``Nodes.Items`` matches like ``items`` (Go's case-insensitive fields), in both verbs."""
    body = {"Pod": POD, "Nodes": {"Items": [{"metadata": {"name": "gpu-0"}}]}}
    assert prioritize(body) == [{"Host": "gpu-0", "Score": 0}]
    with pytest.raises(BadRequest, match=r"ExtenderArgs.Nodes.items\[0\].metadata.name"):
        extender.filter({"Pod": POD, "Nodes": {"Items": [{"metadata": {"name": 7}}]}})


@pytest.mark.parametrize("names", ["gpu-0", [1], [""]])
def test_prioritize_refuses_mistyped_node_names(names):
    with pytest.raises(BadRequest, match=r"ExtenderArgs.NodeNames"):
        prioritize({"Pod": POD, "NodeNames": names})
