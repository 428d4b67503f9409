"""The SIMULATED kubelet as a process (how the demo runs it): admits pods from a file, prints JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.unit.deviceplugin.fakes import FakeSnapshot, FakeSource, ctr, h20_mig_mixed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_kubelet_process_admits_pods_from_a_file(sock_dir, start_plugin, tmp_path):
    pods = [
        {
            "metadata": {"name": "mig-pod", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [ctr("infer", 1, resource="nvidia.com/mig-3g.48gb")]},
        },
        {
            "metadata": {"name": "plain", "namespace": "default", "uid": "u2"},
            "spec": {"containers": [ctr("web")]},
        },
    ]
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps(pods))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.sim.kubelet",
            "--root",
            sock_dir,
            "-v",
            "4",
            "--pods",
            str(pods_file),
            "--wait-resources",
            "nvidia.com/mig-3g.48gb",
            "--exit-after-pods",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    start_plugin(FakeSource(FakeSnapshot(gpus=h20_mig_mixed())), mig_strategy="mixed")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["pod"] for r in results] == ["default/mig-pod", "default/plain"]
    assert all(r["admitted"] for r in results), [r["message"] for r in results]
    envs = results[0]["allocations"]["infer"]["nvidia.com/mig-3g.48gb"]["envs"]
    assert envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert (
        '"Making allocation request for device plugin"' in err
        and 'resourceName="nvidia.com/mig-3g.48gb"' in err
    )


def test_kubelet_process_admits_pods_bound_on_the_api_server(sock_dir, start_plugin, api_server, tmp_path):
    results_file = tmp_path / "results.jsonl"
    start_plugin(FakeSource(FakeSnapshot(gpus=h20_mig_mixed())), mig_strategy="mixed")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.sim.kubelet",
            "--root",
            sock_dir,
            "-v",
            "2",
            "--kubeconfig",
            api_server.kubeconfig_path,
            "--wait-resources",
            "nvidia.com/mig-1g.12gb",
            "--node-name",
            "gpu-1",
            "--results",
            str(results_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        api_server.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bound", "namespace": "default", "uid": "u9"},
                "spec": {
                    "nodeName": "gpu-1",
                    "containers": [ctr("infer", 1, resource="nvidia.com/mig-1g.12gb")],
                },
                "status": {"phase": "Pending"},
            }
        )
        end = time.monotonic() + 20
        while time.monotonic() < end and not (results_file.exists() and results_file.read_text().strip()):
            time.sleep(0.1)
        [line] = results_file.read_text().splitlines()
        result = json.loads(line)
        assert result["pod"] == "default/bound" and result["admitted"], result
        envs = result["allocations"]["infer"]["nvidia.com/mig-1g.12gb"]["envs"]
        assert envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert proc.returncode == 0
