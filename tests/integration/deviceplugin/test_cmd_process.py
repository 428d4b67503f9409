"""``hami-agent device-plugin`` as a process: gpusim (SIMULATED NVML) + SIMULATED kubelet + test API
server. Checks the seed 000 start-up lines, registration, Allocate through the real Kubernetes client,
/healthz, /metrics, pause/resume on SIGUSR1 and graceful SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from hami_agent.protocol import decode_node_devices, keys
from tests.gpusim import gpusim_state as gs
from tests.integration.deviceplugin.conftest import NODE
from tests.sim.ports import free_port
from tests.unit.deviceplugin.fakes import ctr, hami_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
GPU = "nvidia.com/gpu"


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_device_plugin_process_end_to_end(gpusim_factory, api_server, kubelet, sock_dir, tmp_path):  # noqa: PLR0915
    node = gpusim_factory("h20-mig-mixed", driver=gs.FIXED_DRIVER)
    full = [g["uuid"] for g in node.state()["gpus"] if not g["mig"]["current"]]
    api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {}}})
    port = free_port()
    log_path = tmp_path / "plugin.log"
    env = node.env()
    env["HOOK_PATH"] = str(tmp_path / "usr-local")
    cmd = [
        sys.executable,
        "-m",
        "hami_agent",
        "device-plugin",
        "-v",
        "4",
        "--node-name",
        NODE,
        "--kubeconfig",
        api_server.kubeconfig_path,
        "--device-plugin-dir",
        sock_dir,
        "--metrics-bind",
        f"127.0.0.1:{port}",
        "--mig-strategy",
        "mixed",
        "--device-split-count",
        "4",
        "--vgpu-lock-dir",
        str(tmp_path / "vgpulock"),
        "--mig-apply-lock",
        str(tmp_path / "mig.lock"),
        "--nvml-refresh-interval",
        "1",
        "--poll-interval",
        "0.1",
    ]
    with open(log_path, "w") as log_fh:
        proc = subprocess.Popen(cmd, env=env, stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        assert kubelet.wait_registered(GPU, 30, min_devices=4 * len(full)), log_path.read_text()
        assert kubelet.wait_registered("nvidia.com/mig-1g.12gb", 5, min_devices=6)
        for line in (
            "Initializing metrics for scheduler",
            "reading config=",
            "Starting GRPC server for 'nvidia.com/gpu'",
            f"Starting to serve 'nvidia.com/gpu' on {sock_dir}/nvidia-gpu.sock",
            "Registered device plugin for 'nvidia.com/gpu' with Kubelet",
        ):
            assert wait(lambda line=line: line in log_path.read_text(), 5), line
        # node registration loop (H3) publishes the full GPUs
        assert wait(
            lambda: (
                full[0]
                in (api_server.get("nodes", None, NODE)["metadata"].get("annotations") or {}).get(
                    keys.NODE_REGISTER, ""
                )
            ),
            15,
        ), log_path.read_text()[-3000:]
        # ... with as many sharing slots per GPU as the kubelet got replicas (--device-split-count 4)
        registered = decode_node_devices(api_server.get("nodes", None, NODE)["metadata"]["annotations"][
            keys.NODE_REGISTER])
        assert {d.count for d in registered} == {4}, registered

        # a pod as HAMi's scheduler leaves it: annotations + node lock
        pod = hami_pod("vllm-0", NODE, [ctr("vllm", 1)], f"{full[2]},NVIDIA,20000,50:;")
        api_server.create(pod)
        api_server.patch(
            "nodes",
            None,
            NODE,
            {"metadata": {"annotations": {keys.NODE_LOCK: "2026-11-21T12:00:00Z,default,vllm-0"}}},
        )
        res = kubelet.admit(api_server.get("pods", "default", "vllm-0"), timeout=10)
        assert res is not None and res.admitted, (res, log_path.read_text()[-3000:])
        envs = res.allocations["vllm"][GPU]["envs"]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == full[2] and envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"
        ann = api_server.get("pods", "default", "vllm-0")["metadata"]["annotations"]
        assert ann[keys.BIND_PHASE] == "success" and ann[keys.DEVICES_TO_ALLOCATE] == ";"
        # released by the plugin's background writer, right after the answer
        node_ann = lambda: api_server.get("nodes", None, NODE)["metadata"].get("annotations") or {}  # noqa: E731
        assert wait(lambda: keys.NODE_LOCK not in node_ann(), 5)
        assert os.path.isdir(tmp_path / "usr-local" / "vgpu" / "containers" / "uid-vllm-0_vllm")

        status, body = http_get(f"http://127.0.0.1:{port}/healthz")
        assert (status, body.strip()) == (200, "ok")
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert 'hami_device_plugin_allocations_total{resource="nvidia.com/gpu",result="success"} 1.0' in body
        assert (
            'hami_device_plugin_rpc_duration_seconds_count{method="Allocate",resource="nvidia.com/gpu"}'
            in body
        )
        assert "hami_nvml_call_duration_seconds" in body  # the supervisor's own metrics, re-exported
        assert 'hami_device_plugin_devices{health="Healthy",resource="nvidia.com/gpu"} 20.0' in body

        # SIGUSR1: pause for a MIG reconfiguration (sockets gone, NVML released), SIGUSR1 again: resume
        before = kubelet.registrations.count(GPU)
        proc.send_signal(signal.SIGUSR1)
        assert wait(lambda: not os.path.exists(f"{sock_dir}/nvidia-gpu.sock"), 5)
        assert wait(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[1].startswith("paused"), 5)
        proc.send_signal(signal.SIGUSR1)
        assert kubelet.wait_registered(GPU, 15, min_devices=4 * len(full), after=before)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert not os.path.exists(f"{sock_dir}/nvidia-gpu.sock")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
