"""The invariant checker finds each kind of inconsistency (and nothing in a consistent cluster): built
from hand-made API objects, so a checker that cannot fail would fail here."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hami_agent.doctor.invariants import assert_invariants, check
from hami_agent.protocol import NodeDevice, encode_node_devices, keys
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def node(name: str = "n1", gpus: int = 1, mem: int = 8000, count: int = 2, lock: str | None = None) -> dict:
    devs = [NodeDevice(id=f"GPU-{name}-{i}", index=i, count=count, devmem=mem, devcore=100, type="NVIDIA-T4",
                       numa=0, mode="hami-core", health=True) for i in range(gpus)]
    ann = {keys.NODE_REGISTER: encode_node_devices(devs)}
    if lock:
        ann[keys.NODE_LOCK] = lock
    return {"metadata": {"name": name, "annotations": ann}}


def pod(name: str, devices: str, *, node_ann: str = "n1", bound: str | None = "n1", phase: str = "Running",
        bind_phase: str | None = "success", uid: str | None = None, init: int = 0) -> dict:
    ann = {keys.VGPU_NODE: node_ann, keys.DEVICES_ALLOCATED: devices, keys.VGPU_TIME: "1"}
    if bind_phase:
        ann[keys.BIND_PHASE] = bind_phase
    spec: dict = {"containers": [{"name": "main"}]}
    if init:
        spec["initContainers"] = [{"name": f"init{i}"} for i in range(init)]
    if bound:
        spec["nodeName"] = bound
    md = {"name": name, "namespace": "default", "uid": uid or f"uid-{name}", "annotations": ann}
    return {"metadata": md, "spec": spec, "status": {"phase": phase}}


def kinds(rep) -> dict[str, int]:
    return rep.by_kind()


def test_a_consistent_cluster_passes():
    pods = [pod("a", "GPU-n1-0,NVIDIA,4000,50:;"), pod("b", "GPU-n1-0,NVIDIA,4000,50:;")]
    rep = assert_invariants([node()], pods, now=NOW)
    assert rep.counts == {"pods": 2, "bound": 2, "reservations": 0, "gpus": 1}


def test_overcommits_of_memory_cores_slots_and_exclusive_sharing():
    rep = check([node()], [pod("a", "GPU-n1-0,NVIDIA,6000,60:;"), pod("b", "GPU-n1-0,NVIDIA,6000,60:;")],
                now=NOW)
    assert kinds(rep) == {"overcommit-memory": 1, "overcommit-cores": 1}
    rep = check([node(count=2)], [pod(x, "GPU-n1-0,NVIDIA,100,0:;") for x in "abc"], now=NOW)
    assert kinds(rep) == {"overcommit-slots": 1}
    shared = [pod("a", "GPU-n1-0,NVIDIA,100,100:;"), pod("b", "GPU-n1-0,NVIDIA,100,0:;")]
    assert kinds(check([node()], shared, now=NOW)) == {"exclusive-shared": 1}
    with pytest.raises(AssertionError, match="exclusive-shared n1/GPU-n1-0"):
        assert_invariants([node()], shared, now=NOW)


def test_pending_reservations_count_only_when_asked():
    pods = [pod("a", "GPU-n1-0,NVIDIA,6000,0:;"), pod("b", "GPU-n1-0,NVIDIA,6000,0:;", bound=None,
                                                      phase="Pending", bind_phase=None)]
    assert check([node()], pods, now=NOW).ok
    assert kinds(check([node()], pods, now=NOW, include_pending=True)) == {"overcommit-memory": 1}


def test_init_containers_count_as_the_scheduler_counts_them():
    # an init container (7000) and an app container (1000) on one GPU hold max(7000, 1000), not the sum
    p = pod("a", "GPU-n1-0,NVIDIA,7000,0:;GPU-n1-0,NVIDIA,1000,0:;", init=1)
    assert check([node()], [p], now=NOW).ok
    assert check([node()], [p, pod("c", "GPU-n1-0,NVIDIA,1000,0:;")], now=NOW).ok  # 7000 + 1000
    p2 = pod("b", "GPU-n1-0,NVIDIA,2000,0:;")
    assert kinds(check([node()], [p, p2], now=NOW)) == {"overcommit-memory": 1}
    p["status"]["initContainerStatuses"] = [{"state": {"terminated": {"exitCode": 0}}}]
    assert check([node()], [p, p2], now=NOW).ok  # finished init containers hold nothing


def test_bound_elsewhere_unknown_device_and_allocated_but_not_bound():
    rep = check([node(), node("n2")], [
        pod("a", "GPU-n1-0,NVIDIA,100,0:;", bound="n2"),
        pod("b", "GPU-n9-0,NVIDIA,100,0:;"),
        pod("c", "GPU-n1-0,NVIDIA,100,0:;", bound=None, phase="Pending"),
    ], now=NOW)
    assert kinds(rep) == {"bound-elsewhere": 1, "unknown-device": 1, "allocated-not-bound": 1}


def test_allocations_that_differ_from_the_annotation():
    a = pod("a", "GPU-n1-0,NVIDIA,1000,10:;")
    ok = {"uid-a": {"main": {"NVIDIA_VISIBLE_DEVICES": "GPU-n1-0", "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
                             "CUDA_DEVICE_SM_LIMIT": "10"}}}
    assert check([node()], [a], allocations=ok, now=NOW).ok
    swapped = {"uid-a": {"main": {"NVIDIA_VISIBLE_DEVICES": "GPU-n1-0",  # issue 16 finding 4's swap
                                  "CUDA_DEVICE_MEMORY_LIMIT_0": "30000m", "CUDA_DEVICE_SM_LIMIT": "60"}}}
    assert kinds(check([node()], [a], allocations=swapped, now=NOW)) == {"allocate-mismatch": 2}
    other = {"uid-a": {"main": {"NVIDIA_VISIBLE_DEVICES": "GPU-n1-1"}}}
    assert kinds(check([node(gpus=2)], [a], allocations=other, now=NOW)) == {"allocate-mismatch": 1}
    assert kinds(check([node()], [a], allocations={}, now=NOW)) == {"allocated-no-devices": 1}


@pytest.mark.parametrize(("owner_pod", "age_s", "want"), [
    (None, 10, "owner pod is gone"),
    (pod("o", "GPU-n1-0,NVIDIA,1,0:;", phase="Succeeded"), 10, "has finished"),
    (pod("o", "GPU-n1-0,NVIDIA,1,0:;", bound="n2", node_ann="n2"), 10, "bound to n2"),
    (pod("o", "GPU-n1-0,NVIDIA,1,0:;"), 10, "already allocated"),
    (pod("o", "GPU-n1-0,NVIDIA,1,0:;", bind_phase="allocating"), 400, "older than"),
])
def test_stale_locks(owner_pod, age_s, want):
    when = (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    rep = check([node(lock=f"{when},default,o"), node("n2")], [owner_pod] if owner_pod else [], now=NOW)
    assert kinds(rep).get("stale-lock") == 1 and want in str(rep.violations[-1]), rep.summary()


def test_locks_still_needed_are_not_stale():
    when = (NOW - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    allocating = pod("o", "GPU-n1-0,NVIDIA,1,0:;", bind_phase="allocating")
    pending = pod("o", "GPU-n1-0,NVIDIA,1,0:;", bound=None, phase="Pending", bind_phase="allocating")
    for owner in (allocating, pending):
        assert check([node(lock=f"{when},default,o")], [owner], now=NOW).ok


class FakeCache:
    def __init__(self, pods: dict) -> None:
        self.pods = pods


def test_cache_drift():
    a = pod("a", "GPU-n1-0,NVIDIA,1000,0:;")

    def usage(p: dict) -> PodUsage:
        return PodUsage(uid=p["metadata"]["uid"], namespace="default", name=p["metadata"]["name"], node="n1",
                        devices={"GPU-n1-0": DeviceAmount(slots=1, mem=1000)})

    assert check([node()], [a], cache=FakeCache({"uid-a": usage(a)}), cache_usage=usage, now=NOW).ok
    under = check([node()], [a], cache=FakeCache({}), cache_usage=usage, now=NOW)
    assert kinds(under) == {"cache-drift": 1}
    ghost = check([node()], [a], cache=FakeCache({"uid-a": usage(a), "uid-x": usage(a)}), cache_usage=usage,
                  now=NOW)
    assert kinds(ghost) == {"cache-drift": 1} and "no live pod" in ghost.summary()
