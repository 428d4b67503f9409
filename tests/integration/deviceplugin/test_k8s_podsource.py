"""Allocate against the test API server through the real Kubernetes client and informers."""

from __future__ import annotations

import time

import pytest

from hami_agent.deviceplugin.allocator import AllocationError, Allocator
from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.podsource import JSON_PATCH, K8sPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.informer import Informer
from hami_agent.protocol import keys
from tests.integration.deviceplugin.conftest import NODE
from tests.unit.deviceplugin.fakes import (
    FakeSnapshot,
    ctr,
    full_gpus,
    gpu_uuid,
    hami_pod,
    lock_value,
    node_register,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def k8s(api_server, tmp_path):
    meta = {"name": NODE, "annotations": {keys.NODE_REGISTER: node_register(2, count=2)}}
    api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": meta})
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=5)
    fast = client.with_options(timeout_s=0.3, attempts=1)
    pods = Informer(client, "pods", field_selector=f"spec.nodeName={NODE}").start()
    nodes = Informer(client, "nodes", field_selector=f"metadata.name={NODE}").start()
    assert pods.wait_synced(5) and nodes.wait_synced(5)
    s = PluginSettings(
        node_name=NODE,
        hook_path=str(tmp_path / "hook"),
        vgpu_lock_dir=str(tmp_path / "lock"),
        device_split_count=2,
        rpc_deadline_s=2.0,
        api_timeout_s=0.3,
    )
    plan = plan_resources(FakeSnapshot(gpus=full_gpus(2)), s)["nvidia.com/gpu"]
    alloc = Allocator(s, K8sPodSource(NODE, fast, pods, nodes))
    yield api_server, alloc, plan
    alloc.close()
    pods.stop()
    nodes.stop()


def lock(api, name):
    api.patch("nodes", None, NODE, {"metadata": {"annotations": {keys.NODE_LOCK: lock_value(name)}}})


def node_lock(api):
    return (api.get("nodes", None, NODE)["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)


def wait_cached(alloc, name):
    end = time.monotonic() + 5
    while alloc.pods.pod_informer.get("default", name) is None and time.monotonic() < end:
        time.sleep(0.02)


def test_allocate_patches_the_pod_conditionally_and_releases_the_lock(k8s):
    api, alloc, plan = k8s
    api.create(hami_pod("p1", NODE, [ctr("c", 1)], f"{gpu_uuid(1)},NVIDIA,2048,25:;"))
    lock(api, "p1")
    [resp] = alloc.allocate(plan, [[f"{gpu_uuid(1)}-1"]])  # may hit the API fallback if the watch lags
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(1)
    ann = api.get("pods", "default", "p1")["metadata"]["annotations"]
    assert ann[keys.BIND_PHASE] == "success" and ann[keys.DEVICES_TO_ALLOCATE] == ";"
    [patch] = api.requests_matching("PATCH", "/pods/p1$")
    assert patch.content_type == JSON_PATCH
    assert {"op": "test", "path": "/metadata/uid", "value": "uid-p1"} in patch.body
    assert alloc.writer.wait_idle(5) and node_lock(api) is None


def test_a_slow_api_server_fails_within_the_deadline_and_the_truth_is_recorded_later(k8s):
    api, alloc, plan = k8s
    api.create(hami_pod("p2", NODE, [ctr("c", 1)], f"{gpu_uuid(0)},NVIDIA,2048,25:;"))
    lock(api, "p2")
    wait_cached(alloc, "p2")
    api.inject_fault(None, method="PATCH", path_regex="/pods/p2$", delay_s=3.0, times=1)
    t0 = time.monotonic()
    with pytest.raises(AllocationError, match="patch pod error"):
        alloc.allocate(plan, [[f"{gpu_uuid(0)}-0"]])
    assert time.monotonic() - t0 < 2.9  # the 2 s deadline answered, not the server's 3 s (room for noise)
    # the failure record (not delayed) lands first; the success write, still sleeping in the server,
    # arrives at t0+3s and must then be refused by its own precondition (bind-phase=allocating)
    assert alloc.writer.wait_idle(15)
    time.sleep(max(0.0, t0 + 3.3 - time.monotonic()))
    ann = api.get("pods", "default", "p2")["metadata"]["annotations"]
    assert ann[keys.BIND_PHASE] == "failed"
    assert ann[keys.DEVICES_TO_ALLOCATE] == f"{gpu_uuid(0)},NVIDIA,2048,25:;"
    assert node_lock(api) is None


def test_a_pod_recreated_under_the_same_name_mid_rpc_is_never_written(k8s):
    api, alloc, plan = k8s
    api.create(hami_pod("p3", NODE, [ctr("c", 1)], f"{gpu_uuid(0)},NVIDIA,2048,25:;"))
    lock(api, "p3")
    wait_cached(alloc, "p3")
    api.inject_fault(None, method="PATCH", path_regex="/pods/p3$", delay_s=0.5, times=1)
    import threading

    def recreate():
        time.sleep(0.2)  # while the success write is delayed in the server
        api.delete("pods", "default", "p3")
        again = hami_pod("p3", NODE, [ctr("c", 1)], f"{gpu_uuid(1)},NVIDIA,100,5:;")
        again["metadata"]["uid"] = "uid-p3-again"
        api.create(again)

    t = threading.Thread(target=recreate)
    t.start()
    with pytest.raises(AllocationError, match="patch pod error"):
        alloc.allocate(plan, [[f"{gpu_uuid(0)}-0"]])
    t.join()
    assert alloc.writer.wait_idle(5)
    ann = api.get("pods", "default", "p3")["metadata"]["annotations"]
    assert api.get("pods", "default", "p3")["metadata"]["uid"] == "uid-p3-again"
    assert ann[keys.BIND_PHASE] == "allocating"
    assert ann[keys.DEVICES_TO_ALLOCATE] == f"{gpu_uuid(1)},NVIDIA,100,5:;"


def test_lock_release_is_one_conditional_request(k8s):
    """The release after Allocate is a single JSON patch that tests the lock's exact value (no GET of
    the node first: the next pod's /bind waits for this release), and it never removes another lock."""
    api, alloc, _plan = k8s
    src = alloc.pods
    lock(api, "p5")
    value = node_lock(api)
    api.requests.clear()
    assert src.release_lock_if(value, 1.0) is True
    assert node_lock(api) is None
    [req] = [r for r in api.requests if r.path == f"/api/v1/nodes/{NODE}"]
    assert (req.method, req.content_type) == ("PATCH", JSON_PATCH)
    assert req.body[0] == {"op": "test", "path": "/metadata/annotations/hami.io~1mutex.lock", "value": value}
    lock(api, "p6")  # the node is locked by the next pod now
    assert src.release_lock_if(value, 1.0) is False and node_lock(api) == lock_value("p6")
    api.patch("nodes", None, NODE, {"metadata": {"annotations": {keys.NODE_LOCK: None}}})
    assert src.release_lock_if(value, 1.0) is False  # no lock at all


def test_allocate_client_is_never_throttled(api_server, tmp_path):
    """The device plugin's background client has client-go's rate limit; Allocate's view has none, so a
    saturated limiter (a relist storm, say) never delays an Allocate write or the lock release."""
    import argparse

    from hami_agent.deviceplugin.cmd import build_clients

    client, fast = build_clients(argparse.Namespace(kubeconfig=api_server.kubeconfig_path), api_timeout_s=0.3,
                                 background_timeout_s=5)
    try:
        assert client.limiter is not None and (client.limiter.qps, client.limiter.burst) == (5.0, 10)
        assert fast.limiter is None and fast.retry.attempts == 1 and fast.timeout_s == 0.3
        api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        client.limiter.reserve(1e9)
        for _ in range(100):
            client.limiter.reserve(1e9)  # the background client now waits ~18 s for its next token (5/s)
        t0 = time.monotonic()
        src = K8sPodSource(NODE, fast, None)
        for i in range(10):
            api_server.patch("nodes", None, NODE, {"metadata": {"annotations": {keys.NODE_LOCK: f"v{i}"}}})
            assert src.release_lock_if(f"v{i}", 0.3)
        assert time.monotonic() - t0 < 6.0  # not the ~18 s the background client's limiter would make it wait
    finally:
        client.close()
