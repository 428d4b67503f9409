"""The sandbox's SIMULATED kubelet wrapper: node status and pod lifecycle through the test API server."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hami_agent.deviceplugin.api.api_pb2 import ContainerAllocateResponse
from hami_agent.k8s.client import KubeClient
from sandbox.node_sim import NodeSim
from tests.sim.apiserver import ApiServer
from tests.sim.kubelet import SimulatedKubelet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _wait(pred, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _phase(api: ApiServer, name: str) -> str | None:
    return (api.get("Pod", "default", name).get("status") or {}).get("phase")


def test_node_status_and_pod_lifecycle(tmp_path: Path) -> None:
    with ApiServer() as api:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-x"}})
        client = KubeClient.from_kubeconfig(api.kubeconfig_path, timeout_s=5)
        kubelet = SimulatedKubelet(str(tmp_path / "dp"), 4, open(tmp_path / "kubelet.log", "w"),
                                   node_name="gpu-x").start()
        results = tmp_path / "admissions.jsonl"
        sim = NodeSim(kubelet, client, "gpu-x", str(results))
        t = threading.Thread(target=sim.run, args=("nvidia.com/gpu", 0.1), daemon=True)
        t.start()
        try:
            # the kubelet reports Ready and its base capacity (no device plugin registered yet)
            assert _wait(lambda: (api.get("Node", None, "gpu-x").get("status") or {}).get("allocatable"))
            node = api.get("Node", None, "gpu-x")
            assert node["status"]["conditions"][0]["type"] == "Ready"
            assert "nvidia.com/gpu" not in node["status"]["allocatable"]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
                   "spec": {"nodeName": "gpu-x", "containers": [{"name": "c", "image": "x"}]}}
            api.create(pod)
            other = {**pod, "metadata": {"name": "elsewhere", "namespace": "default"},
                     "spec": {**pod["spec"], "nodeName": "gpu-y"}}
            api.create(other)
            assert _wait(lambda: _phase(api, "web") == "Running")
            rec = [json.loads(x) for x in results.read_text().splitlines()]
            assert [(r["pod"], r["admitted"], r["node"]) for r in rec] == [("default/web", True, "gpu-x")]
            # a pod of another node is none of this kubelet's business
            assert _phase(api, "elsewhere") in (None, "Pending")
            # a deleted pod's devices are released
            uid = api.get("Pod", "default", "web")["metadata"]["uid"]
            with kubelet.device_manager.cond:  # as if a device plugin had given it a GPU
                kubelet.device_manager.pod_devices.insert(uid, "c", "nvidia.com/gpu", {-1: ["GPU-1-0"]},
                                                          ContainerAllocateResponse())
            assert kubelet.holds(uid)
            api.delete("Pod", "default", "web")
            assert _wait(lambda: not kubelet.holds(uid))
        finally:
            sim.stop.set()
            t.join(5)
            kubelet.close()
            client.close()
