"""Issue 29 item 3, step 2: the extender's pod records carry what preemption reads (priority,
``preemptionPolicy``, start and creation time, grace period, terminating), read as kube-scheduler reads them,
and a pod that starts terminating updates its record while its usage still counts."""

from __future__ import annotations

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.core.model import DeviceUsage
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.podinfo import pod_usage, preemption_fields

pytestmark = pytest.mark.unit


def running_pod(**spec_extra) -> dict:
    return {"metadata": {"uid": "u1", "namespace": "ns", "name": "p",
                         "creationTimestamp": "2026-01-02T03:04:05Z",
                         "annotations": {keys.VGPU_NODE: "n1",
                                         keys.DEVICES_ALLOCATED: "GPU-a,NVIDIA,4000,0:;"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}], **spec_extra},
            "status": {"phase": "Running", "startTime": "2026-01-02T03:04:15Z"}}


def test_defaults_are_kube_schedulers():
    u = pod_usage(running_pod())
    assert (u.priority, u.preemption_policy, u.grace_s) == (0, "PreemptLowerPriority", 30)
    assert not u.terminating
    assert u.started - u.created == 10  # status.startTime; creationTimestamp kept apart


def test_fields_read_from_the_pod():
    p = running_pod(priority=2000001000, preemptionPolicy="Never", terminationGracePeriodSeconds=5)
    p["metadata"]["deletionTimestamp"] = "2026-01-02T03:05:00Z"
    u = pod_usage(p)
    assert (u.priority, u.preemption_policy, u.grace_s, u.terminating) == (2000001000, "Never", 5, True)


def test_malformed_values_read_as_the_defaults():
    p = running_pod(priority="high", preemptionPolicy="Sometimes", terminationGracePeriodSeconds=-3)
    p["metadata"]["creationTimestamp"] = "yesterday"
    del p["status"]["startTime"]
    f = preemption_fields(p)
    assert (f["priority"], f["preemption_policy"], f["grace_s"], f["started"], f["created"]) == (
        0, "PreemptLowerPriority", 0, 0.0, 0.0)
    p["metadata"]["creationTimestamp"] = "2026-01-02T03:04:05Z"
    f = preemption_fields(p)
    assert f["started"] == f["created"] > 0  # no startTime yet: the creation time (util.GetPodStartTime)


def test_a_terminating_pod_updates_its_record_and_still_counts():
    cache = UsageCache()
    cache.set_node("n1", [DeviceUsage("GPU-a", 0, "NVIDIA-T4", 10, 16000, 100)])
    cache.observe("u1", pod_usage(running_pod()), None)
    p = running_pod()
    p["metadata"]["deletionTimestamp"] = "2026-01-02T03:05:00Z"
    cache.observe("u1", pod_usage(p), None)
    assert cache.pods["u1"].terminating
    assert cache.nodes["n1"].by_id["GPU-a"].usedmem == 4000  # its containers may still run
