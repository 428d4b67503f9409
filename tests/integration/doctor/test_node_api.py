"""`doctor node` against the simulated API server: node-annotation verdicts provoked for real."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hami_agent.k8s import KubeClient, lock_node
from hami_agent.protocol import format_requesting
from tests.integration.doctor.helpers import REGISTER, codes, gpu_pod, node, run_doctor, verdict

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _ann(handshake: str) -> dict[str, str]:
    return {"hami.io/node-nvidia-register": REGISTER, "hami.io/node-handshake": handshake}


def _ago_min(minutes: float) -> datetime:
    return datetime.now(timezone.utc) - timedelta(minutes=minutes)


def _doctor_node(capsys, api, name="gpu-1", *extra):
    return run_doctor(capsys, "node", name, "--kubeconfig", api.kubeconfig_path, "--no-local", *extra)


def test_healthy_node_has_no_problem(api_server, capsys) -> None:
    hs = format_requesting(datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=20))
    api_server.create(node(annotations=_ann(hs)))
    rc, report = _doctor_node(capsys, api_server)
    assert rc == 0, report["verdicts"]
    assert report["problem_found"] is False
    assert report["facts"]["node.register.count"] == 1


def test_handshake_expired(api_server, capsys) -> None:
    """The scheduler wrote Requesting_ 10 minutes ago and the kubelet reports 0 GPUs: HAMi's
    CheckHealth would drop this node."""
    hs = format_requesting(datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(minutes=10))
    api_server.create(node(annotations=_ann(hs),
                           gpus=0))
    rc, report = _doctor_node(capsys, api_server)
    assert rc == 1
    v = verdict(report, "HANDSHAKE_EXPIRED")
    assert any(hs in line for line in v["evidence"])
    assert "reregister_devices.yml -l gpu-1" in v["fix"]
    assert "NO_GPU_ALLOCATABLE" not in codes(report)  # the more specific verdict explains it


def test_fresh_requesting_with_zero_allocatable_is_not_expired(api_server, capsys) -> None:
    hs = format_requesting(datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=5))
    api_server.create(node(annotations=_ann(hs),
                           gpus=0))
    _rc, report = _doctor_node(capsys, api_server)
    assert "HANDSHAKE_EXPIRED" not in codes(report)
    assert "NO_GPU_ALLOCATABLE" in codes(report)


def test_node_not_registered(api_server, capsys) -> None:
    api_server.create(node(annotations={}, gpus=0))
    rc, report = _doctor_node(capsys, api_server)
    assert rc == 1
    assert codes(report)[0] == "NODE_NOT_REGISTERED"
    assert "hami.io/node-nvidia-register: absent or empty" in " ".join(verdict(report, "NODE_NOT_REGISTERED")
                                                                       ["evidence"])


def test_register_annotation_malformed(api_server, capsys) -> None:
    api_server.create(node(annotations={"hami.io/node-nvidia-register": "GPU-abc,10,not-a-number"}))
    rc, report = _doctor_node(capsys, api_server)
    assert rc == 1
    v = verdict(report, "REGISTER_ANNOTATION_MALFORMED")
    assert "GPU-abc,10,not-a-number" in " ".join(v["evidence"])


def test_stale_node_lock_owner_gone(api_server, capsys) -> None:
    """A real lock taken by the node-lock code for a pod that was deleted afterwards."""
    api_server.create(node(annotations={"hami.io/node-nvidia-register": REGISTER}))
    api_server.create(gpu_pod("trainer", node_name="gpu-1"))
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
    lock_node(client, "gpu-1", "default", "trainer", now=lambda: _ago_min(2))
    api_server.delete("pods", "default", "trainer")
    rc, report = _doctor_node(capsys, api_server)
    assert rc == 1
    v = verdict(report, "STALE_NODE_LOCK")
    assert "lock owner pod default/trainer does not exist" in v["evidence"]
    assert "remediate_node_lock.yml -l gpu-1" in v["fix"]


def test_node_lock_expired(api_server, capsys) -> None:
    api_server.create(node(annotations={"hami.io/node-nvidia-register": REGISTER}))
    api_server.create(gpu_pod("trainer", node_name="gpu-1"))
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
    lock_node(client, "gpu-1", "default", "trainer", now=lambda: _ago_min(10))
    rc, report = _doctor_node(capsys, api_server)
    assert rc == 1 and "STALE_NODE_LOCK" in codes(report)
    assert report["facts"]["node.lock.expired"] is True


def test_fresh_lock_of_a_pending_pod_is_fine(api_server, capsys) -> None:
    api_server.create(node(annotations={"hami.io/node-nvidia-register": REGISTER}))
    api_server.create(gpu_pod("trainer", node_name="gpu-1",
                              annotations={"hami.io/bind-phase": "allocating"}))
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
    lock_node(client, "gpu-1", "default", "trainer")
    _rc, report = _doctor_node(capsys, api_server)
    assert "STALE_NODE_LOCK" not in codes(report)


def test_node_not_found(api_server, capsys) -> None:
    rc, report = _doctor_node(capsys, api_server, "nope")
    assert rc == 1 and codes(report) == ["NODE_NOT_FOUND"]


def test_api_unreachable_is_unknown_with_the_error(api_server, capsys) -> None:
    api_server.stop()
    rc, report = _doctor_node(capsys, api_server, "gpu-1", "--api-timeout", "1")
    assert rc == 1 and codes(report) == ["UNKNOWN"]
    assert any("node collector failed" in line for line in report["verdicts"][0]["evidence"])


def test_plugin_metrics_report_a_stuck_nvml_worker(api_server, capsys) -> None:
    """The device plugin's own /metrics (PluginMetrics served by its OpsServer) says NVML is stuck."""
    from hami_agent.deviceplugin.httpserver import OpsServer
    from hami_agent.deviceplugin.metrics import PluginMetrics

    api_server.create(node(annotations={"hami.io/node-nvidia-register": REGISTER}))
    metrics = PluginMetrics()
    metrics.nvml_stuck.set(1)
    metrics.nvml_status.labels(status="stuck").set(1)
    ops = OpsServer("127.0.0.1:0", metrics.registry, lambda: (False, "nvml worker stuck in nvmlInit")).start()
    try:
        rc, report = _doctor_node(capsys, api_server, "gpu-1", "--plugin-url", f"http://127.0.0.1:{ops.port}")
    finally:
        ops.stop()
    assert rc == 1
    # the driver version is unknown from the API alone: NVML_HANG, not the known-bad verdict
    assert codes(report)[0] == "NVML_HANG"
    assert "DEVICE_PLUGIN_UNHEALTHY" in codes(report)
    evidence = verdict(report, "NVML_HANG")["evidence"]
    assert any("hami_device_plugin_nvml_stuck = 1" in line for line in evidence)


def test_cluster_applies_the_local_plugin_endpoint_to_the_local_node_only(api_server, capsys) -> None:
    """Regression (sandbox demo): `doctor cluster --node-name A --plugin-url <A's plugin>` reported A's
    NVML hang on every GPU node."""
    from hami_agent.deviceplugin.httpserver import OpsServer
    from hami_agent.deviceplugin.metrics import PluginMetrics

    hs = format_requesting(datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=20))
    for name in ("gpu-1", "gpu-2"):
        api_server.create(node(name=name, annotations=_ann(hs)))
    metrics = PluginMetrics()
    metrics.nvml_stuck.set(1)
    ops = OpsServer("127.0.0.1:0", metrics.registry, lambda: (False, "nvml worker stuck")).start()
    try:
        rc, report = run_doctor(capsys, "cluster", "--kubeconfig", api_server.kubeconfig_path,
                                "--node-name", "gpu-1", "--no-journal", "--no-nvml",
                                "--plugin-url", f"http://127.0.0.1:{ops.port}")
    finally:
        ops.stop()
    assert rc == 1
    hangs = [v for v in report["verdicts"] if v["code"] == "NVML_HANG"]
    assert [v["subject"] for v in hangs] == ["node gpu-1"]
