"""Malformed extender requests and malformed pods never crash the extender (issue 14 finding 4): the body
gets a 400 naming the field and what it must be; a malformed pod read from the API gets an Error result
naming the field; nothing is reserved or written."""

from __future__ import annotations

import copy
import json

import pytest

from hami_agent.scheduler.core.requests import RequestError, pod_request
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.podinfo import countable_usage, pod_usage
from hami_agent.scheduler.verbs.args import BadRequest, parse_bind_args, parse_filter_args
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.unit.scheduler.helpers import FakePodClient, dev, gpu_pod
from tests.unit.scheduler.test_extender_http import post

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _with(path: str, value) -> dict:
    """A GPU pod with the field at dotted ``path`` (list indexes as numbers) replaced by ``value``."""
    pod = gpu_pod("p", mem=1000)
    cur = pod
    parts = path.split(".")
    for part in parts[:-1]:
        cur = cur[int(part)] if part.isdigit() else cur[part]
    last = parts[-1]
    if last.isdigit():
        cur[int(last)] = value
    else:
        cur[last] = value
    return pod


BAD_PODS = [
    ("spec.containers", "main", "spec.containers: must be a list of containers, got a string"),
    ("spec.containers.0", "x", "spec.containers[0]: must be a container object, got a string"),
    ("spec.containers.0.resources", [], "spec.containers[0].resources: must be an object"),
    ("spec.containers.0.resources.limits", ["nvidia.com/gpu"],
     "spec.containers[0].resources.limits: must be an object mapping resource names to quantities"),
    ("spec.containers.0.resources.requests", "1", "spec.containers[0].resources.requests: must be an object"),
    ("spec.initContainers", {"name": "i"}, "spec.initContainers: must be a list of containers"),
    ("metadata.annotations", ["a"], "metadata.annotations: must be an object"),
    ("metadata.annotations", {"hami.io/x": 1}, "metadata.annotations['hami.io/x']: must be a string"),
    ("metadata.labels", "x", "metadata.labels: must be an object"),
    ("metadata", [], "metadata: must be an object"),
    ("spec", "x", "spec: must be an object"),
    ("spec.schedulerName", 7, "spec.schedulerName: must be a string"),
    ("metadata.uid", 5, "metadata.uid: must be a string"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD_PODS)
def test_malformed_pod_in_the_body_is_a_400_naming_the_field(path, value, message):
    with pytest.raises(BadRequest) as ei:
        parse_filter_args({"Pod": _with(path, value), "NodeNames": ["n1"]})
    assert str(ei.value).startswith("ExtenderArgs.Pod." + message.split(":")[0]), str(ei.value)
    assert message in str(ei.value)


@pytest.mark.parametrize(("args", "field", "want"), [
    ({"NodeNames": [1, None]}, "ExtenderArgs.NodeNames[0]",
     "must be a non-empty node name string, got a number"),
    ({"NodeNames": ["n1", None]}, "ExtenderArgs.NodeNames[1]", "got null"),
    ({"NodeNames": ["n1", ""]}, "ExtenderArgs.NodeNames[1]", "non-empty"),
    ({"NodeNames": "n1"}, "ExtenderArgs.NodeNames", "must be a list of node names, got a string"),
    ({"Nodes": "x"}, "ExtenderArgs.Nodes", "must be a NodeList object with items, got a string"),
    ({"Nodes": {"items": "x"}}, "ExtenderArgs.Nodes.items", "must be a list of Node objects"),
    ({"Nodes": {"items": [{"metadata": []}]}}, "ExtenderArgs.Nodes.items[0].metadata.name", "missing"),
    ({"Nodes": {"items": [7]}}, "ExtenderArgs.Nodes.items[0].metadata.name", "missing"),
])
def test_malformed_node_lists_are_a_400_naming_the_field(args, field, want):
    with pytest.raises(BadRequest) as ei:
        parse_filter_args({"Pod": gpu_pod("p"), **args})
    assert str(ei.value).startswith(field + ":") and want in str(ei.value)


def test_identity_is_required_and_typed():
    pod = gpu_pod("p")
    del pod["metadata"]["uid"]
    with pytest.raises(BadRequest, match=r"^ExtenderArgs.Pod.metadata.uid: missing"):
        parse_filter_args({"Pod": pod, "NodeNames": []})
    with pytest.raises(BadRequest, match=r"^ExtenderArgs: body must be a JSON object, got a list"):
        parse_filter_args([1])
    with pytest.raises(BadRequest, match=r"^ExtenderArgs.Pod: missing or not an object"):
        parse_filter_args({"Pod": "p"})
    with pytest.raises(BadRequest, match=r"^ExtenderBindingArgs.PodUID: missing or not a string"):
        parse_bind_args({"PodName": "p", "PodNamespace": "default", "Node": "n1"})
    with pytest.raises(BadRequest, match=r"^ExtenderBindingArgs.Node: missing or not a string"):
        parse_bind_args({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": 3})
    b = parse_bind_args({"podname": "p", "podnamespace": "ns", "poduid": "u", "node": "n"})  # Go: any case
    assert (b.namespace, b.name, b.uid, b.node) == ("ns", "p", "u", "n")


@pytest.mark.parametrize("value", ["lots", [1], {"a": 1}, None, True, "1.5"])
def test_quantities_that_do_not_parse_name_container_and_resource(value):
    pod = _with("spec.containers.0.resources.limits", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": value})
    with pytest.raises(RequestError) as ei:
        pod_request(pod)
    msg = str(ei.value)
    assert msg.startswith("spec.containers[0].resources: ") and "nvidia.com/gpumem" in msg, msg


@pytest.mark.parametrize(("path", "value", "_msg"), BAD_PODS)
def test_malformed_pods_from_the_api_never_raise_in_the_cache(path, value, _msg):
    pod = _with(path, value)
    pod["metadata"] = pod["metadata"] if isinstance(pod.get("metadata"), dict) else {}
    if isinstance(pod["metadata"].get("annotations"), dict):
        pod["metadata"]["annotations"]["hami.io/vgpu-node"] = "n1"
    pod_usage(pod)  # must not raise
    countable_usage(pod)


@pytest.fixture
def served():
    cache = UsageCache()
    cache.set_node("n1", [dev(0, uuid="GPU-n1-0")])
    client = FakePodClient()
    ext = Extender(cache, SchedulerConfig(), client)
    ext.synced.set()
    srv = ExtenderHTTPServer(ext, None).start()
    yield client, ext, srv, cache
    srv.stop()
    ext.healer.stop()


@pytest.mark.parametrize(("path", "value", "message"), BAD_PODS[:8])
def test_over_http_malformed_body_gets_400_and_nothing_happens(served, path, value, message):
    client, _ext, srv, cache = served
    code, body = post(srv, "/filter", {"Pod": _with(path, value), "NodeNames": ["n1"]})
    assert code == 400, body
    assert message.split(":")[0] in json.loads(body)["error"]
    assert client.patches == [] and cache.pods == {}


def test_malformed_pod_from_the_api_is_an_error_result_naming_the_field(served):
    client, _ext, srv, cache = served
    good = gpu_pod("p", mem=1000)
    stored = copy.deepcopy(good)
    stored["spec"]["containers"][0]["resources"]["limits"] = ["nvidia.com/gpu"]
    client.add(stored)  # what the "API" holds is malformed; the body is fine
    code, body = post(srv, "/filter", {"Pod": good, "NodeNames": ["n1"]})
    res = json.loads(body)
    assert code == 200 and res["NodeNames"] is None
    assert res["Error"].startswith("pod default/p: spec.containers[0].resources.limits: must be an object")
    assert client.patches == [] and cache.pods == {}
