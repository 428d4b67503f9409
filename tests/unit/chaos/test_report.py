"""Each count of the chaos soak's JSON line can fail: fed a record of the failure it names, it counts it
(and does not count the harmless neighbour case)."""

from __future__ import annotations

import pytest

from benchmarks.chaos.api import SuccessWrite, success_write
from benchmarks.chaos.kubelet import Admission, Rpc
from benchmarks.chaos.report import (
    double_ids,
    json_line,
    late_writes,
    lost,
    scan_tracebacks,
    stalls,
    state_counts,
    verdict,
)
from hami_agent.protocol import ContainerDevice, NodeDevice, encode_node_devices, encode_pod_devices, keys

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]
GPU = "nvidia.com/gpu"
PHASE = "/metadata/annotations/hami.io~1bind-phase"
ZERO = dict.fromkeys(("late_writes", "over_commits", "double_allocations", "lost_allocations",
                      "leaked_node_locks", "crashes", "other_violations", "unclean_stops", "harness_errors",
                      "unanswered_rpcs"), 0)


def adm(pod: str, uid: str, admitted: bool, answered: float = 10.0, devices=(), node: str = "n1",
        envs: dict | None = None) -> Admission:
    alloc = {"main": {GPU: {"devices": list(devices), "envs": envs or {}}}} if admitted else {}
    msg = "" if admitted else "Allocate failed due to x"
    return Admission(node, pod, uid, admitted, msg, 0.1, answered, alloc)


def pod(name: str, uid: str, ann: dict | None = None, node: str = "n1") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": dict(ann or {})},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": {"phase": "Running"}}


def test_success_writes_are_recognised_in_json_and_merge_patches():
    path = "/api/v1/namespaces/ns/pods/p"
    ops = [{"op": "test", "path": "/metadata/uid", "value": "u1"},
           {"op": "add", "path": PHASE, "value": "success"}]
    assert success_write("PATCH", path, ops) == ("ns", "p", "u1")
    assert success_write("PATCH", path, [{"op": "add", "path": PHASE, "value": "failed"}]) is None
    assert success_write("PATCH", path, {"metadata": {"annotations": {keys.BIND_PHASE: "success"}}}) == \
        ("ns", "p", None)
    assert success_write("PATCH", path + "/status", ops) is None
    assert success_write("GET", path, None) is None


def test_a_success_that_reaches_the_api_after_the_kubelets_error_is_a_late_write():
    rejected = adm("ns/p", "u1", False, answered=10.0)
    early = SuccessWrite(9.9, "ns", "p", "u1", "PATCH")
    late = SuccessWrite(10.2, "ns", "p", "u1", "PATCH")
    other_pod = SuccessWrite(11.0, "ns", "p", "u-new", "PATCH")  # same name, re-created pod
    merge = SuccessWrite(10.5, "ns", "p", None, "PATCH")  # a merge patch names the pod, not its uid
    assert late_writes([rejected], [early, other_pod]) == []
    found = late_writes([rejected], [early, late])
    assert len(found) == 1 and "0.200s after the kubelet's error" in found[0]
    assert len(late_writes([rejected], [merge])) == 1
    assert late_writes([adm("ns/p", "u1", True)], [late]) == []  # an admitted pod's success is no late write


def test_a_success_state_on_a_rejected_pod_fails_as_another_violation():
    dev = NodeDevice(id="GPU-1", index=0, count=2, devmem=1000, devcore=100, type="NVIDIA-X", numa=0,
                     mode="hami-core", health=True)
    node = {"metadata": {"name": "n1", "annotations": {keys.NODE_REGISTER: encode_node_devices([dev])}}}
    alloc = encode_pod_devices([[ContainerDevice("GPU-1", "NVIDIA", 800, 10)]])
    p = pod("p", "u1", {keys.VGPU_NODE: "n1", keys.DEVICES_ALLOCATED: alloc, keys.BIND_PHASE: "success"})
    p["status"]["phase"] = "Failed"
    counts, _ = state_counts([node], [p], [adm("ns/p", "u1", False)], [], [], stall_limit_s=7, now=1.0)
    assert counts["other_violations"] == 1 and counts["violations"] == {"allocated-no-devices": 1}
    assert verdict({**ZERO, **counts, "max_nvml_processes": 0, "max_abandoned_workers": 0}, k=2) == \
        ["other_violations=1"]


def test_stalls_slow_and_unanswered_rpcs():
    rpcs = [Rpc("n1", "allocate", "ns/fast", 0.0, 0.5), Rpc("n1", "allocate", "ns/slow", 0.0, 9.0),
            Rpc("n2", "get_preferred_allocation", "ns/hung", 1.0, None),
            Rpc("n2", "allocate", "ns/inflight", 99.0, None)]
    slow, unanswered = stalls(rpcs, limit_s=7.0, end=100.0)
    assert sorted(s.split(":")[0] for s in slow) == ["n1 ns/slow", "n2 ns/hung"]
    assert [u.split(":")[0] for u in unanswered] == ["n2 ns/hung"]  # 1 s in flight is no stall yet


def test_one_device_id_in_two_live_pods_is_a_double_allocation():
    a = adm("ns/a", "ua", True, devices=["GPU-1-0"])
    b = adm("ns/b", "ub", True, devices=["GPU-1-0"])
    c = adm("ns/c", "uc", True, devices=["GPU-1-0"], node="n2")  # same ID on another node: fine
    assert len(double_ids([a, b, c])) == 1
    assert double_ids([a, c]) == []


def test_an_admitted_pod_the_api_does_not_record_is_a_lost_allocation():
    a = adm("ns/p", "u1", True)
    ok = {"u1": pod("p", "u1", {keys.BIND_PHASE: "success", keys.VGPU_NODE: "n1"})}
    assert lost([a], ok) == []
    assert len(lost([a], {"u1": pod("p", "u1", {keys.BIND_PHASE: "failed", keys.VGPU_NODE: "n1"})})) == 1
    assert len(lost([a], {"u1": pod("p", "u1", {keys.BIND_PHASE: "success", keys.VGPU_NODE: "n2"})})) == 1


def test_state_counts_maps_the_checkers_violations():
    dev = NodeDevice(id="GPU-1", index=0, count=2, devmem=1000, devcore=100, type="NVIDIA-X", numa=0,
                     mode="hami-core", health=True)
    node = {"metadata": {"name": "n1", "annotations": {keys.NODE_REGISTER: encode_node_devices([dev])}}}
    alloc = encode_pod_devices([[ContainerDevice("GPU-1", "NVIDIA", 800, 10)]])
    pods = [pod(f"p{i}", f"u{i}", {keys.VGPU_NODE: "n1", keys.DEVICES_ALLOCATED: alloc,
                                   keys.BIND_PHASE: "success"}) for i in range(2)]
    admissions = [adm(f"ns/p{i}", f"u{i}", True, devices=[f"GPU-1-{i}"],
                      envs={"NVIDIA_VISIBLE_DEVICES": "GPU-1", "CUDA_DEVICE_MEMORY_LIMIT_0": "800m"})
                  for i in range(2)]
    counts, details = state_counts([node], pods, admissions, [], [], stall_limit_s=7, now=1.0)
    assert counts["over_commits"] == 1 and counts["violations"] == {"overcommit-memory": 1}
    assert counts["pods_admitted"] == 2 and counts["double_allocations"] == 0
    # a container handed another GPU than its annotation says: allocate-mismatch -> double allocation
    admissions[1].allocations["main"][GPU]["envs"]["NVIDIA_VISIBLE_DEVICES"] = "GPU-2"
    counts, details = state_counts([node], pods, admissions, [], [], stall_limit_s=7, now=1.0)
    assert counts["double_allocations"] == 1, details


def test_tracebacks_in_logs_are_found(tmp_path):
    log = tmp_path / "a.log"
    log.write_text('I1 ok\nTraceback (most recent call last):\n  File "x", line 1\nValueError: boom\nI2\n')
    (tmp_path / "b.log").write_text("W1 no traceback here\n")
    tb = scan_tracebacks([log, tmp_path / "b.log", tmp_path / "missing.log"])
    assert tb.count == 1 and tb.samples[0].endswith("ValueError: boom")


def test_verdict_and_the_json_lines_order():
    counts = dict(ZERO)
    counts.update(seconds=60, seed=1, pods_admitted=5, admission_stalls=1, max_nvml_processes=3,
                  max_abandoned_workers=2, extra="x")
    assert verdict(counts, k=2) == []  # a slow-but-answered RPC is reported, not failed
    assert verdict({**counts, "max_nvml_processes": 4}, k=2) == ["max_nvml_processes=4 > K+1=3"]
    assert verdict({**counts, "leaked_node_locks": 1}, k=2) == ["leaked_node_locks=1"]
    assert list(json_line(counts))[:12] == ["seconds", "seed", "pods_admitted", "admission_stalls",
                                            "late_writes", "over_commits", "double_allocations",
                                            "lost_allocations", "leaked_node_locks", "max_nvml_processes",
                                            "max_abandoned_workers", "crashes"]
