"""The extender decides only for pods it may decide for (issue 14 findings 2 and 3, deliverable 3), over
real HTTP against the simulated API server: the pod's state comes from the API (namespace, name and
uid), never from the request body; bound, terminating, foreign and replaced pods are refused and nothing
is written; /bind binds only what this extender's /filter decided."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.protocol import decode_pod_devices, keys
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.cluster import check_cluster, gpu_node, gpu_pod
from tests.sim.kube_scheduler import ExtenderClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@contextlib.contextmanager
def extender(api, config: SchedulerConfig | None = None,
             **kw) -> Iterator[tuple[SchedulerApp, ExtenderClient]]:
    """The scheduler app alone (no simulated kube-scheduler): the test is the caller."""
    client = KubeClient.from_kubeconfig(api.kubeconfig_path, timeout_s=kw.pop("timeout_s", 10.0))
    app = SchedulerApp(client, config or SchedulerConfig(), register_interval_s=0.2, **kw).start()
    assert app.extender.synced.wait(10), "scheduler caches did not sync"
    ext = ExtenderClient(app.url, timeout_s=30)
    try:
        yield app, ext
    finally:
        ext.close()
        app.stop()


def create(api, pod: dict) -> dict:
    """Create like a client would (the server assigns uid and resourceVersion) and return it."""
    return api.create(pod)


def wait_for(fn, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    return fn()


def filter_(ext: ExtenderClient, pod: dict, nodes=("gpu-1",)) -> dict:
    return ext.post("filter", {"Pod": pod, "NodeNames": list(nodes)})


def bind(ext: ExtenderClient, pod: dict, node: str = "gpu-1") -> dict:
    md = pod["metadata"]
    return ext.post("bind", {"PodName": md["name"], "PodNamespace": md.get("namespace", "default"),
                             "PodUID": md["uid"], "Node": node})


def pod_writes(api, name: str) -> list:
    return [r for r in api.requests if r.method in ("PATCH", "POST", "PUT") and f"/pods/{name}" in r.path]


def decision_writes(api, since: int) -> list:
    """Writes a decision makes (pods, bindings, node locks) among the requests after index ``since``;
    the register loop's handshake patches are not decisions."""
    return [r for r in list(api.requests)[since:] if r.method != "GET" and (
        "/pods/" in r.path or keys.NODE_LOCK in str(r.body))]


def running(name: str, node: str, devices: str, mem: int) -> dict:
    pod = gpu_pod(name, mem=mem, annotations={keys.VGPU_NODE: node, keys.DEVICES_ALLOCATED: devices,
                                              keys.DEVICES_TO_ALLOCATE: ";", keys.VGPU_TIME: "1",
                                              keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS})
    pod["metadata"]["labels"] = {keys.VGPU_NODE: node}
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def test_running_pod_posted_to_filter_keeps_its_allocation(api_server):
    # Regression (issue 14 finding 2): POSTing a running pod with a modified spec to /filter made
    # _clear_stale_assignment strip its hami.io/* allocation: it dropped out of the usage cache and its
    # GPU memory was handed out again.
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    victim = create(api_server, running("victim", "gpu-1", "GPU-gpu-1-0,NVIDIA,8000,100:;", 8000))
    with extender(api_server) as (app, ext):
        assert wait_for(lambda: victim["metadata"]["uid"] in app.cache.pods)
        forged = copy.deepcopy(victim)
        forged["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "99999"  # never fits
        forged["spec"].pop("nodeName")
        forged["status"] = {"phase": "Pending"}
        before = len(api_server.requests)
        res = filter_(ext, forged)
        assert res["NodeNames"] is None and "already bound to node gpu-1" in res["Error"]
        assert "nothing written" in res["Error"]
        assert decision_writes(api_server, before) == []
        ann = api_server.get("Pod", "default", "victim")["metadata"]["annotations"]
        assert ann[keys.DEVICES_ALLOCATED] == "GPU-gpu-1-0,NVIDIA,8000,100:;"
        # the GPU is still taken: a real pod does not fit
        p = create(api_server, gpu_pod("next", mem=1000))
        assert filter_(ext, p)["FailedNodes"] == {"gpu-1": "1/1 CardInsufficientMemory"}
        check_cluster(api_server, [app])


@pytest.mark.parametrize("case", ["other-scheduler", "terminating", "replaced", "gone", "bound"])
def test_filter_refuses_pods_it_may_not_decide_for(api_server, case):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    pod = gpu_pod("p", mem=1000)
    if case == "other-scheduler":
        pod["spec"]["schedulerName"] = "default-scheduler"
    elif case == "terminating":
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    elif case == "bound":
        pod["spec"]["nodeName"] = "gpu-1"
    stored = create(api_server, pod) if case != "gone" else None
    body = copy.deepcopy(stored) if stored else dict(pod, metadata={**pod["metadata"], "uid": "u-gone"})
    if case == "replaced":
        body["metadata"]["uid"] = "uid-of-a-deleted-pod"
    for key in ("nodeName",):
        body["spec"].pop(key, None)
    body["spec"]["schedulerName"] = "hami-scheduler"  # the body may say anything: it is not trusted
    body["metadata"].pop("deletionTimestamp", None)
    want = {"other-scheduler": "has schedulerName 'default-scheduler'", "terminating": "is terminating",
            "replaced": "not uid-of-a-deleted-pod", "gone": "not found", "bound": "already bound"}[case]
    with extender(api_server) as (app, ext):
        before = len(api_server.requests)
        res = filter_(ext, body)
        assert want in res["Error"] and res["NodeNames"] is None
        assert decision_writes(api_server, before) == []
        assert app.cache.pods == {}
        res = bind(ext, body)
        assert want in res["Error"]
        assert decision_writes(api_server, before) == []
        check_cluster(api_server, [app])


def test_filter_reads_the_pod_from_the_api_not_from_the_body(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    real = create(api_server, gpu_pod("p", mem=6000))
    body = copy.deepcopy(real)
    body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "100"  # lies
    with extender(api_server) as (app, ext):
        assert filter_(ext, body)["NodeNames"] == ["gpu-1"]
        # the assignment is written behind the answer (writebehind.py)
        ann = wait_for(lambda: api_server.get("Pod", "default", "p")["metadata"].get("annotations"))
        assert decode_pod_devices(ann[keys.DEVICES_ALLOCATED])[0][0].usedmem == 6000
        check_cluster(api_server, [app])


def test_bind_only_what_this_extender_decided(api_server):
    # Regression (issue 14 finding 2): /bind bound any pending pod to a node of the caller's choice.
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    api_server.create(gpu_node("gpu-2", gpus=1, mem=8000))
    p = create(api_server, gpu_pod("p", mem=1000))
    with extender(api_server) as (app, ext):
        res = bind(ext, p)  # never filtered
        assert "has no /filter decision of this extender" in res["Error"]
        assert "nothing written" in res["Error"]
        assert pod_writes(api_server, "p") == []
        assert keys.NODE_LOCK not in (api_server.get("Node", None, "gpu-1")["metadata"].get("annotations"))
        (chosen,) = filter_(ext, p, ("gpu-1", "gpu-2"))["NodeNames"]
        other = {"gpu-1": "gpu-2", "gpu-2": "gpu-1"}[chosen]
        assert wait_for(lambda: keys.VGPU_NODE in (api_server.get("Pod", "default", "p")["metadata"]
                                                   .get("annotations") or {}))  # written behind /filter
        n_writes = len(pod_writes(api_server, "p"))
        assert f"decided node {chosen} for it, not {other}" in bind(ext, p, other)["Error"]
        wrong_uid = copy.deepcopy(p)
        wrong_uid["metadata"]["uid"] = "someone-else"
        assert "not someone-else" in bind(ext, wrong_uid, chosen)["Error"]
        assert len(pod_writes(api_server, "p")) == n_writes
        assert bind(ext, p, chosen)["Error"] == ""
        got = api_server.get("Pod", "default", "p")
        assert got["spec"]["nodeName"] == chosen
        assert got["metadata"]["annotations"][keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING
        assert "already bound" in bind(ext, p, chosen)["Error"]
        check_cluster(api_server, [app])


def test_forged_pending_pod_of_another_scheduler_holds_no_capacity(api_server):
    # Issue 14 finding 3, reverse case (defence in depth behind the admission policy): a non-GPU pod
    # labelled hami.io/vgpu-node=gpu-1 with a forged allocation of the whole GPU, left Pending, made an
    # empty node refuse real pods (CardInsufficientMemory).
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    forged = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "forged", "namespace": "default", "labels": {keys.VGPU_NODE: "gpu-1"},
                           "annotations": {keys.VGPU_NODE: "gpu-1", keys.VGPU_TIME: "1",
                                           keys.DEVICES_ALLOCATED: "GPU-gpu-1-0,NVIDIA,8000,100:;"}},
              "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c", "image": "x"}]},
              "status": {"phase": "Pending"}}
    api_server.create(forged)
    real = create(api_server, gpu_pod("real", mem=4000))
    with extender(api_server) as (app, ext):
        assert filter_(ext, real)["NodeNames"] == ["gpu-1"]
        check_cluster(api_server, [app])
