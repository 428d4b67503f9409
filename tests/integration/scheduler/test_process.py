"""``hami-agent scheduler`` as a process against the simulated API server, driven by the SIMULATED
kube-scheduler as a process too (the way the demo runs them); plus the webhook over HTTP and the
handshake rules end to end."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from hami_agent.protocol import keys
from tests.integration.scheduler.cluster import gpu_node, gpu_pod, stack
from tests.sim.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def wait_http(url: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_scheduler_and_simulator_processes(api_server, tmp_path):
    api_server.create(gpu_node("gpu-node-01", gpus=1, mem=8192))
    port, mport = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    sched = subprocess.Popen(
        [sys.executable, "-m", "hami_agent", "scheduler", "--kubeconfig", api_server.kubeconfig_path,
         "--bind-address", f"127.0.0.1:{port}", "--metrics-bind", f"127.0.0.1:{mport}", "-v", "4",
         "--register-interval", "1s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    sim = None
    try:
        assert wait_http(f"http://127.0.0.1:{port}/readyz"), "scheduler never became ready"
        sim = subprocess.Popen(
            [sys.executable, "-m", "tests.sim.kube_scheduler", "--kubeconfig", api_server.kubeconfig_path,
             "--extender", f"http://127.0.0.1:{port}", "--initial-backoff", "0.2", "--max-backoff", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        api_server.create(gpu_pod("fits", mem=4096))
        api_server.create(gpu_pod("too-big", mem=8192))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            p = api_server.get("Pod", "default", "fits")
            if p["spec"].get("nodeName"):
                break
            time.sleep(0.1)
        assert api_server.get("Pod", "default", "fits")["spec"]["nodeName"] == "gpu-node-01"
        time.sleep(1.0)
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as r:
            assert b"GPUDeviceMemoryLimit" in r.read()
    finally:
        sim_out = stop(sim) if sim is not None else ""
        out = stop(sched)
    assert sched.returncode == 0, out[-3000:]
    # the seed's -v=4 wording, with klog headers
    assert ("Node gpu-node-01 filtered out: CardInsufficientMemory, requested 8192Mi but available 4096Mi"
            in out)
    assert "] Filtering node gpu-node-01 for pod too-big" in out
    assert "0/1 nodes are available: 1 1/1 CardInsufficientMemory." in sim_out


def test_webhook_over_http(api_server):
    with stack(api_server, allocator=False) as (app, _sim):
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "request": {"uid": "u-1", "operation": "CREATE", "namespace": "default",
                                       "object": gpu_pod("w", scheduler="")}}).encode()
        req = urllib.request.Request(app.url + "/webhook", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            resp = json.loads(r.read())["response"]
        assert resp["allowed"] and resp["uid"] == "u-1"
        ops = json.loads(base64.b64decode(resp["patch"]))
        assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in ops


def test_node_without_gpus_allocatable_is_dropped_and_handshake_deleted(api_server):
    old = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 120))
    api_server.create(gpu_node("lost", gpus=1, allocatable=0,
                               annotations={keys.NODE_HANDSHAKE: f"Requesting_{old}"}))
    api_server.create(gpu_node("fresh", gpus=1))
    with stack(api_server, allocator=False) as (app, _sim):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "lost" in app.cache.nodes:
            time.sleep(0.05)
        assert "lost" not in app.cache.nodes and "fresh" in app.cache.nodes
        ann = api_server.get("Node", None, "lost")["metadata"]["annotations"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and keys.NODE_HANDSHAKE in ann:
            time.sleep(0.05)
            ann = api_server.get("Node", None, "lost")["metadata"]["annotations"]
        assert keys.NODE_HANDSHAKE not in ann
        # kubelet reports the GPUs again: the node comes back
        api_server.patch("Node", None, "lost", {"status": {"allocatable": {"nvidia.com/gpu": "10"}}},
                         subresource="status")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "lost" not in app.cache.nodes:
            time.sleep(0.05)
        assert "lost" in app.cache.nodes
