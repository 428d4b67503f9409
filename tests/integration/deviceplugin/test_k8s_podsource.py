"""Allocate against the test API server through the real Kubernetes client and informers."""

from __future__ import annotations

import time

import pytest

from hami_agent.deviceplugin.allocator import AllocationError, Allocator
from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.podsource import K8sPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.informer import Informer
from hami_agent.protocol import keys
from tests.integration.deviceplugin.conftest import NODE
from tests.unit.deviceplugin.fakes import FakeSnapshot, ctr, full_gpus, gpu_uuid, hami_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def k8s(api_server, tmp_path):
    api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {}}})
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
    yield api_server, Allocator(s, K8sPodSource(NODE, fast, pods, nodes)), plan
    pods.stop()
    nodes.stop()


def lock(api, owner):
    api.patch(
        "nodes", None, NODE, {"metadata": {"annotations": {keys.NODE_LOCK: f"2026-11-21T12:00:00Z,{owner}"}}}
    )


def test_allocate_patches_the_pod_and_releases_the_lock(k8s):
    api, alloc, plan = k8s
    api.create(hami_pod("p1", NODE, [ctr("c", 1)], f"{gpu_uuid(1)},NVIDIA,2048,25:;"))
    lock(api, "default,p1")
    [resp] = alloc.allocate(plan, [[f"{gpu_uuid(1)}-1"]])  # may hit the API fallback if the watch lags
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(1)
    ann = api.get("pods", "default", "p1")["metadata"]["annotations"]
    assert ann[keys.BIND_PHASE] == "success" and ann[keys.DEVICES_TO_ALLOCATE] == ";"
    assert keys.NODE_LOCK not in api.get("nodes", None, NODE)["metadata"]["annotations"]


def test_a_hanging_api_server_costs_one_short_timeout_not_a_hang(k8s):
    api, alloc, plan = k8s
    api.create(hami_pod("p2", NODE, [ctr("c", 1)], f"{gpu_uuid(0)},NVIDIA,2048,25:;"))
    lock(api, "default,p2")
    end = time.monotonic() + 5
    while alloc.pods.pod_informer.get("default", "p2") is None and time.monotonic() < end:
        time.sleep(0.02)
    api.inject_fault(None, method="PATCH", path_regex="/pods/p2", delay_s=3.0, times=1)
    t0 = time.monotonic()
    with pytest.raises(AllocationError, match="patch pod error"):
        alloc.allocate(plan, [[f"{gpu_uuid(0)}-0"]])
    assert time.monotonic() - t0 < 1.5  # 0.3 s for the patch + the failure bookkeeping
    # the failure path still marked the pod failed and released the lock (the fault hit one request)
    end = time.monotonic() + 5
    while (
        time.monotonic() < end
        and api.get("pods", "default", "p2")["metadata"]["annotations"].get(keys.BIND_PHASE) != "failed"
    ):
        time.sleep(0.05)
    assert api.get("pods", "default", "p2")["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
    assert keys.NODE_LOCK not in api.get("nodes", None, NODE)["metadata"]["annotations"]
