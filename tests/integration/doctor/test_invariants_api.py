"""``hami-agent doctor invariants`` against the SIMULATED API server: two list calls whatever the number
of pods (nodes, pods in all namespaces; nothing per pod or per node), the findings of a broken cluster,
exit 0 on a consistent one, and a clear error when the API cannot be read."""

from __future__ import annotations

import json
import logging

import pytest

from hami_agent.cli import main as agent_main
from hami_agent.protocol import NodeDevice, encode_node_devices, keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def gpu_node(name: str, lock: str | None = None) -> dict:
    dev = NodeDevice(id=f"GPU-{name}", index=0, count=20, devmem=16000, devcore=100, type="NVIDIA-T4", numa=0,
                     mode="hami-core", health=True)
    ann = {keys.NODE_REGISTER: encode_node_devices([dev])}
    if lock:
        ann[keys.NODE_LOCK] = lock
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": ann}}


def allocated_pod(name: str, ns: str, node: str, mem: int) -> dict:
    devices = f"GPU-{node},NVIDIA,{mem},1:;"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns,
                         "annotations": {keys.VGPU_NODE: node, keys.DEVICES_ALLOCATED: devices,
                                         keys.DEVICES_TO_ALLOCATE: ";", keys.BIND_PHASE: "success"}},
            "spec": {"nodeName": node, "schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def doctor(capsys, api, *argv: str) -> tuple[int, dict, str]:
    root = logging.getLogger("hami_agent")
    saved = (list(root.handlers), root.level, root.propagate)
    try:
        rc = agent_main(["doctor", "invariants", "--kubeconfig", api.kubeconfig_path, "--json", *argv])
    finally:
        root.handlers[:], root.level, root.propagate = saved
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if out.out else {}), out.err


def test_findings_from_two_list_calls_whatever_the_cluster_size(api_server, capsys):
    nodes = [f"gpu-{i}" for i in range(20)]
    for i, n in enumerate(nodes):
        api_server.create(gpu_node(n, lock="2020-01-01T00:00:00Z,team-a,gone" if i == 3 else None))
    for i in range(300):  # 15 per node, 1,000 MiB each: fits 16,000 MiB
        api_server.create(allocated_pod(f"p{i}", f"team-{'ab'[i % 2]}", nodes[i % 20], 1000))
    # node gpu-7: one more pod of 2,000 MiB makes 17,000 MiB of 16,000
    api_server.create(allocated_pod("big", "team-a", "gpu-7", 2000))
    api_server.requests.clear()
    rc, rep, err = doctor(capsys, api_server)
    calls = [(r.method, r.path) for r in list(api_server.requests)]
    assert calls == [("GET", "/api/v1/nodes"), ("GET", "/api/v1/pods")], calls
    assert rc == 1, err
    assert rep["source"] == "API" and rep["counts"]["pods"] == 301 and rep["counts"]["gpus"] == 20
    assert rep["by_kind"] == {"overcommit-memory": 1, "stale-lock": 1}
    over = next(v for v in rep["violations"] if v["kind"] == "overcommit-memory")
    assert over["subject"] == "gpu-7/GPU-gpu-7" and "17000 MiB promised of 16000 MiB" in over["detail"]
    lock = next(v for v in rep["violations"] if v["kind"] == "stale-lock")
    assert lock["subject"] == "gpu-3" and lock["runbook"] == "docs/runbooks/invariants/stale-lock.md"


def test_consistent_cluster_exits_0(api_server, capsys):
    api_server.create(gpu_node("gpu-0"))
    api_server.create(allocated_pod("p", "default", "gpu-0", 1000))
    rc, rep, _ = doctor(capsys, api_server)
    assert rc == 0 and rep["ok"] is True and rep["violations"] == []


def test_api_down_is_a_clear_error_not_a_verdict(api_server, capsys):
    api_server.stop()
    rc, rep, err = doctor(capsys, api_server, "--api-timeout", "2")
    assert rc == 1 and rep == {}
    assert err.startswith("hami-agent doctor invariants: cannot list nodes and pods:")
    assert "Traceback" not in err
