"""Node register/handshake rules (HAMi pkg/device/devices.go CheckHealth) and pod usage from annotations
(pkg/device/pods.go)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from hami_agent.protocol import NodeDevice, encode_node_devices, keys
from hami_agent.scheduler.core.model import DeviceAmount
from hami_agent.scheduler.core.nodes import DELETE, HandshakeTracker, node_devices, node_extras
from hami_agent.scheduler.state.podinfo import pod_usage

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 21, 10, 0, 0)


def node(handshake=None, alloc="10", register=True, extra=None):
    ann = {}
    if register:
        ann[keys.NODE_REGISTER] = encode_node_devices([NodeDevice(id="GPU-a", count=10, devmem=8192,
                                                                  devcore=100, type="NVIDIA-T4", health=True,
                                                                  mode="hami-core")])
    if handshake is not None:
        ann[keys.NODE_HANDSHAKE] = handshake
    ann.update(extra or {})
    return {"metadata": {"name": "n1", "annotations": ann},
            "status": {"allocatable": {"nvidia.com/gpu": alloc}}}


def test_register_annotation_decoded_and_bad_one_rejected():
    devs = node_devices(node())
    assert [(d.id, d.count, d.totalmem, d.totalcore, d.type) for d in devs] == [("GPU-a", 10, 8192, 100,
                                                                                  "NVIDIA-T4")]
    assert node_devices(node(register=False)) is None
    bad = node(extra={keys.NODE_REGISTER: "not json and no colon"})
    assert node_devices(bad) is None


def test_cordon_and_pair_scores():
    n = node(extra={keys.DEVICE_CORDON: "GPU-a, GPU-b",
                    keys.NODE_SCORE: '[{"uuid":"GPU-a","score":{"GPU-b":100}}]'})
    ex = node_extras(n)
    assert ex.cordoned == frozenset({"GPU-a", "GPU-b"})
    assert ex.pair_scores == {"GPU-a": {"GPU-b": 100}}


@pytest.mark.parametrize(("handshake", "alloc", "now", "healthy", "patch"), [
    (None, "10", NOW, True, "Requesting_2026-11-21 10:00:00"),
    ("Reported 2024-01-23 04:30:04.43 +0000 UTC m=+1104711.77", "10", NOW, True,
     "Requesting_2026-11-21 10:00:00"),
    ("Requesting_2026-11-21 10:00:00", "0", NOW + timedelta(seconds=59), True, None),
    ("Requesting_2026-11-21 10:00:00", "10", NOW + timedelta(seconds=61), True, None),
    ("Requesting_2026-11-21 10:00:00", "0", NOW + timedelta(seconds=61), False, DELETE),
    ("Requesting_garbage", "0", NOW + timedelta(seconds=61), True, None),
])
def test_handshake_rules(handshake, alloc, now, healthy, patch):
    v = HandshakeTracker().check(node(handshake, alloc), now)
    assert v.healthy is healthy
    assert v.patch == patch


def test_allocatable_dropping_to_zero_is_node_loss():
    t = HandshakeTracker()
    assert t.check(node("Requesting_2026-11-21 10:00:00", "10"), NOW).healthy
    v = t.check(node("Requesting_2026-11-21 10:00:00", "0"), NOW + timedelta(seconds=5))
    assert not v.healthy and v.patch is DELETE and "dropped from 10 to 0" in v.reason


def gpu_pod_with(allocated, init=0, apps=1, phase="Running", init_statuses=None):
    spec = {"containers": [{"name": f"c{i}"} for i in range(apps)]}
    if init:
        spec["initContainers"] = [{"name": f"i{i}"} for i in range(init)]
    status = {"phase": phase}
    if init_statuses is not None:
        status["initContainerStatuses"] = init_statuses
    return {"metadata": {"uid": "u1", "namespace": "ns", "name": "p",
                         "annotations": {keys.VGPU_NODE: "n1", keys.DEVICES_ALLOCATED: allocated}},
            "spec": spec, "status": status}


def test_pod_usage_collapses_init_containers():
    p = gpu_pod_with(";GPU-a,NVIDIA,3000,50:;GPU-a,NVIDIA,4000,60:;", init=1, apps=2)
    # empty init entry kept; two app containers on the same GPU add up
    assert pod_usage(p).devices == {"GPU-a": DeviceAmount(slots=2, mem=7000, cores=110)}
    p = gpu_pod_with("GPU-a,NVIDIA,6000,50:;GPU-a,NVIDIA,1000,10:;", init=1, apps=1)
    assert pod_usage(p).devices["GPU-a"] == DeviceAmount(slots=1, mem=6000, cores=50)


def test_finished_init_containers_stop_counting():
    done = [{"state": {"terminated": {"exitCode": 0}}}]
    p = gpu_pod_with("GPU-a,NVIDIA,6000,50:;GPU-a,NVIDIA,1000,10:;", init=1, apps=1, init_statuses=done)
    assert pod_usage(p).devices["GPU-a"] == DeviceAmount(slots=1, mem=1000, cores=10)


def test_terminated_and_unassigned_pods_have_no_usage():
    assert pod_usage(gpu_pod_with("GPU-a,NVIDIA,1,1:;", phase="Succeeded")) is None
    p = gpu_pod_with("GPU-a,NVIDIA,1,1:;")
    del p["metadata"]["annotations"][keys.VGPU_NODE]
    assert pod_usage(p) is None


def test_v210_string_without_placeholders_counts_everything_as_app():
    # HAMi v2.10 drops empty placeholders (since HAMi commit 9e75c87f, Project-HAMi/HAMi#1773): 1 entry for 2
    # containers
    p = gpu_pod_with("GPU-a,NVIDIA,1024,20:;", init=1, apps=1)
    assert pod_usage(p).devices["GPU-a"] == DeviceAmount(slots=1, mem=1024, cores=20)
