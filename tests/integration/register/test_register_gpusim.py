"""Registration from the real NVML supervisor (pynvml in a child process) against the simulated GPU node
(tests/gpusim) and the simulated API server: seed 003's H20 node and a unified-memory GH200."""

from __future__ import annotations

import time

import pytest

from hami_agent.config import build_config
from hami_agent.deviceplugin.node_register import NodeRegistrar
from hami_agent.k8s.client import KubeClient, RetryPolicy
from hami_agent.nvml import NvmlSupervisor
from hami_agent.protocol import decode_node_devices, keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
NODE = "gpu-1"


def ok_snapshot(sup, timeout=30.0):
    deadline = time.monotonic() + timeout
    snap = sup.snapshot()
    while snap.status != "ok" and time.monotonic() < deadline:
        snap = sup.wait_for_change(snap.generation, timeout=1.0)
    assert snap.status == "ok", snap
    return snap


def register(api_server, node, config):
    api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=2.0,
                                        retry=RetryPolicy(attempts=2, base_s=0.05, cap_s=0.2))
    sup = NvmlSupervisor(lib_path=str(node.lib_path), call_timeout_s=10.0, refresh_interval_s=30.0,
                         watch_events=False)
    sup.start()
    try:
        ok_snapshot(sup)
        r = NodeRegistrar(client, NODE, sup, config)
        assert r.register_once(), r.last_error
    finally:
        sup.stop()
        client.close()
    value = api_server.get("Node", None, NODE)["metadata"]["annotations"][keys.NODE_REGISTER]
    return decode_node_devices(value), r


def test_seed_003_node_registers_only_full_gpus(api_server, gpusim_node, tmp_path):
    cfg = build_config([{"agent": {"migApplyLockPath": str(tmp_path / "mig.lock")}}], NODE)
    devices, r = register(api_server, gpusim_node, cfg)
    state = gpusim_node.state()
    full = [g for g in state["gpus"] if not g["mig"]["current"]]
    assert [d.index for d in devices] == [g["index"] for g in full] == [3, 4, 5, 6, 7]
    for d, g in zip(devices, full, strict=True):
        assert (d.id, d.devmem, d.type, d.count, d.devcore, d.mode, d.health) == (
            g["uuid"], g["memory_total_mib"], "NVIDIA H20", 10, 100, "hami-core", True)
        assert d.numa == max(0, g["numa_node"])
    assert sorted(s.index for s in r.skipped) == [0, 1, 2]


def test_unified_memory_gpu_needs_preconfigured_memory(api_server, gpusim_factory, tmp_path):
    node = gpusim_factory("gh200-unified")
    cfg = build_config([{"nvidia": {"preConfiguredDeviceMemory": 96000},
                         "agent": {"migApplyLockPath": str(tmp_path / "mig.lock")}}], NODE)
    devices, _ = register(api_server, node, cfg)
    assert devices and all(d.devmem == 96000 for d in devices)
