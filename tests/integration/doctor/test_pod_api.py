"""`doctor pod` against the simulated API server: scheduling verdicts from real pods and events."""

from __future__ import annotations

import time

import pytest

from hami_agent.doctor.kubectl import main as kubectl_main
from hami_agent.k8s import KubeClient
from hami_agent.scheduler.verbs.events import filtering_failed_messages
from tests.integration.doctor.helpers import REGISTER, codes, event, gpu_pod, node, run_doctor, verdict

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _doctor_pod(capsys, api, ref="default/p1", *extra):
    return run_doctor(capsys, "pod", ref, "--kubeconfig", api.kubeconfig_path, "--no-local", *extra)


@pytest.mark.parametrize("message", [
    "1/1 CardInsufficientMemory",
    filtering_failed_messages({"gpu-1": "1/1 CardInsufficientMemory"})[0],  # our scheduler's own wording
])
def test_card_insufficient_memory(api_server, capsys, message: str) -> None:
    api_server.create(node(annotations={"hami.io/node-nvidia-register": REGISTER}))
    pod = api_server.create(gpu_pod("p1", gpumem=200000))
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
    client.create_event(pod, "Warning", "FilteringFailed", message, "hami-scheduler")
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1
    assert codes(report)[0] == "CARD_INSUFFICIENT_MEMORY"
    v = verdict(report, "CARD_INSUFFICIENT_MEMORY")
    assert any("FilteringFailed" in line and "CardInsufficientMemory" in line for line in v["evidence"])
    assert any("gpumem 200000MiB" in line for line in v["evidence"])


def test_wrong_scheduler_name(api_server, capsys) -> None:
    api_server.create(gpu_pod("p1", scheduler="default-scheduler"))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1 and codes(report) == ["WRONG_SCHEDULER_NAME"]
    assert "schedulerName: hami-scheduler" in report["verdicts"][0]["fix"]


def test_no_scheduler_events(api_server, capsys) -> None:
    api_server.create(gpu_pod("p1"))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1 and codes(report) == ["NO_SCHEDULER_EVENTS"]


def test_young_pod_without_events_is_not_yet_a_problem(api_server, capsys) -> None:
    api_server.create(gpu_pod("p1", age_s=5))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 0 and codes(report) == []


def test_scheduler_endpoint_down(api_server, capsys) -> None:
    api_server.create(gpu_pod("p1"))
    rc, report = _doctor_pod(capsys, api_server, "default/p1", "--scheduler-url", "http://127.0.0.1:9",
                             "--http-timeout", "1")
    assert rc == 1 and codes(report)[0] == "SCHEDULER_NOT_RUNNING"


def test_scheduler_endpoint_up(api_server, capsys) -> None:
    from prometheus_client import CollectorRegistry

    from hami_agent.deviceplugin.httpserver import OpsServer

    ops = OpsServer("127.0.0.1:0", CollectorRegistry(), lambda: (True, "ok")).start()
    try:
        api_server.create(gpu_pod("p1"))
        _rc, report = _doctor_pod(capsys, api_server, "default/p1", "--scheduler-url",
                                  f"http://127.0.0.1:{ops.port}")
    finally:
        ops.stop()
    assert "SCHEDULER_NOT_RUNNING" not in codes(report)
    assert report["facts"]["scheduler.healthz.ok"] is True
    assert codes(report) == ["NO_SCHEDULER_EVENTS"]


def test_binding_failed(api_server, capsys) -> None:
    pod = api_server.create(gpu_pod("p1", annotations={"hami.io/bind-phase": "failed"}))
    api_server.create(event(pod, "BindingFailed", "node gpu-1 has been locked within 5m0s: node lock "
                                                  "contention"))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1 and "BINDING_FAILED" in codes(report)
    assert any("node lock contention" in line for line in verdict(report, "BINDING_FAILED")["evidence"])


def test_filter_ok_but_pending(api_server, capsys) -> None:
    pod = api_server.create(gpu_pod("p1"))
    api_server.create(event(pod, "FilteringSucceed", "find fit node(gpu-1), 0 nodes not fit, 1 nodes "
                                                     "fit(gpu-1:3.00)",
                            type_="Normal"))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1 and codes(report) == ["FILTER_OK_BUT_PENDING"]


def test_pod_stuck_after_scheduling_seed003_symptom(api_server, capsys) -> None:
    """Seed 003 §3.1.1: bound, only a Scheduled event, no kubelet event; the node shows the same."""
    api_server.create(node(annotations={"hami.io/node-nvidia-register": REGISTER}))
    bind_time = str(int(time.time()) - 600)
    pod = api_server.create(gpu_pod("p1", node_name="gpu-1", annotations={
        "hami.io/bind-phase": "allocating", "hami.io/bind-time": bind_time, "hami.io/vgpu-node": "gpu-1"}))
    api_server.create(event(pod, "Scheduled", "Successfully assigned default/p1 to gpu-1", type_="Normal",
                            component="default-scheduler"))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1 and codes(report) == ["POD_STUCK_AFTER_SCHEDULING"]
    assert "pod default/p1" in report["verdicts"][0]["subject"]
    # once the kubelet admitted it (the plugin's Allocate set bind-phase=success, the kubelet pulls the
    # image), the verdict is gone
    api_server.patch("pods", "default", "p1",
                     {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}})
    api_server.create(event(pod, "Pulling", "Pulling image cuda", type_="Normal", component="kubelet"))
    _rc, report = _doctor_pod(capsys, api_server)
    assert "POD_STUCK_AFTER_SCHEDULING" not in codes(report)


def test_control_disabled_is_a_warning(api_server, capsys) -> None:
    api_server.create(gpu_pod("p1", phase="Running", node_name="gpu-1",
                              env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1
    v = verdict(report, "LIBVGPU_NOT_LOADED")
    assert v["severity"] == "warning" and "CUDA_DISABLE_CONTROL=true" in " ".join(v["evidence"])


def test_unknown_pending_reason_is_unknown_with_evidence(api_server, capsys) -> None:
    """A Pending GPU pod whose only event is a non-HAMi reason: no tree matches, so UNKNOWN, not a guess."""
    pod = api_server.create(gpu_pod("p1"))
    api_server.create(event(pod, "FailedScheduling", "0/3 nodes are available: 3 node(s) had untolerated "
                                                     "taint "
                                                     "{dedicated: infra}.", component="default-scheduler"))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 1 and codes(report) == ["UNKNOWN"]
    evidence = " ".join(report["verdicts"][0]["evidence"])
    assert "untolerated taint" in evidence and "Pending" in evidence


def test_running_pod_is_fine(api_server, capsys) -> None:
    api_server.create(node(annotations={"hami.io/node-nvidia-register": REGISTER}))
    api_server.create(gpu_pod("p1", phase="Running", node_name="gpu-1"))
    rc, report = _doctor_pod(capsys, api_server)
    assert rc == 0 and codes(report) == []


def test_pod_not_found(api_server, capsys) -> None:
    rc, report = _doctor_pod(capsys, api_server, "default/ghost")
    assert rc == 1 and codes(report) == ["POD_NOT_FOUND"]


def test_kubectl_hami_doctor_pod(api_server, capsys) -> None:
    api_server.create(gpu_pod("p1", scheduler="default-scheduler", age_s=900))
    rc = kubectl_main(["doctor", "pod", "p1", "-n", "default", "--kubeconfig", api_server.kubeconfig_path,
                       "--no-local", "--query", "verdicts[].code"])
    assert rc == 1 and capsys.readouterr().out.split() == ["[", '"WRONG_SCHEDULER_NAME"', "]"]


def test_cluster_ranks_findings(api_server, capsys) -> None:
    api_server.create(node("gpu-1", annotations={"hami.io/node-nvidia-register": "garbage"}))
    api_server.create(node("gpu-2", annotations={"hami.io/node-nvidia-register": REGISTER}))
    api_server.create(node("cpu-1", annotations={}, gpus=0))
    api_server.create(gpu_pod("p1", scheduler="default-scheduler"))
    rc, report = run_doctor(capsys, "cluster", "--kubeconfig", api_server.kubeconfig_path, "--no-local")
    assert rc == 1
    got = [(v["code"], v["subject"]) for v in report["verdicts"]]
    assert ("REGISTER_ANNOTATION_MALFORMED", "node gpu-1") in got
    assert ("WRONG_SCHEDULER_NAME", "pod default/p1") in got
    assert sorted(c["target"] for c in report["children"]) == ["default/p1", "gpu-1", "gpu-2"]


def test_custom_resource_names_from_config(api_server, capsys, tmp_path) -> None:
    """With HAMi's device config (--config), a pod asking for a renamed resource is a HAMi pod."""
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text("nvidia:\n  resourceCountName: example.com/vgpu\n")
    pod = gpu_pod("p1", gpumem=None)
    pod["spec"]["containers"][0]["resources"]["limits"] = {"example.com/vgpu": "1"}
    api_server.create(pod)
    _rc, report = _doctor_pod(capsys, api_server)
    assert report["facts"]["pod.requests_hami"] is False
    assert codes(report) == ["UNKNOWN", "NO_HAMI_RESOURCES"]  # warning ranks before info
    rc, report = run_doctor(capsys, "--config", str(cfg), "pod", "default/p1", "--kubeconfig",
                            api_server.kubeconfig_path, "--no-local")
    assert rc == 1 and report["facts"]["pod.requests_hami"] is True
    assert codes(report) == ["NO_SCHEDULER_EVENTS"]
