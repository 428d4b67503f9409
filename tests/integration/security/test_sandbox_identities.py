"""The sandbox's identity hook without podman: ``sandbox.apiserver_main --identities`` as a process writes
one kubeconfig per component, enforces the role's RBAC and policy, and leaves ``audit.jsonl`` on SIGTERM
(what tests/e2e/test_sandbox_demo.py reads after the demo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hami_agent.k8s.client import KubeClient, RetryPolicy
from hami_agent.k8s.errors import KubeError
from tests.sim.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[3]


def test_apiserver_main_with_identities(tmp_path: Path) -> None:
    port, ids = free_port(), tmp_path / "identities"
    admin = tmp_path / "kubeconfig"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sandbox.apiserver_main", "--port", str(port),
                             "--kubeconfig", str(admin), "--identities", str(ids), "--nodes", "gpu-a,gpu-b"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (ids / "plugin-gpu-b.kubeconfig").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {p.name for p in ids.iterdir()} >= {"scheduler.kubeconfig", "operator.kubeconfig",
                                                    "plugin-gpu-a.kubeconfig", "plugin-gpu-b.kubeconfig"}
        with pytest.raises(urllib.error.HTTPError) as no_token:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/nodes", timeout=5)
        assert no_token.value.code == 401
        kadmin = KubeClient.from_kubeconfig(str(admin), timeout_s=5)
        for n in ("gpu-a", "gpu-b"):
            kadmin.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
        plugin = KubeClient.from_kubeconfig(str(ids / "plugin-gpu-a.kubeconfig"), timeout_s=5,
                                            retry=RetryPolicy(attempts=1))
        plugin.patch_node_annotations("gpu-a", {"x": "1"})
        with pytest.raises(KubeError, match="forbidden"):
            plugin.patch_node_annotations("gpu-b", {"x": "1"})
        kadmin.close()
        plugin.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    records = [json.loads(line) for line in (ids / "audit.jsonl").read_text().splitlines()]
    mine = [(r["verb"], r["resource"], r["name"], r["code"]) for r in records
            if r["user"] == "system:serviceaccount:kube-system:hami-device-plugin-gpu-a"]
    assert mine == [("patch", "nodes", "gpu-a", 200), ("patch", "nodes", "gpu-b", 403)]
