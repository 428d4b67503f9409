"""Allocate hands out devices only for the pod the scheduler locked the node for (issue 14 finding 3,
issue 16 deliverable 2): a forged pod through the SIMULATED kubelet against the real plugin process on
gpusim, and the kubelet-side cases where the kubelet's device IDs and the scheduler's allocation differ."""

from __future__ import annotations

import copy
import subprocess
import sys
import time

import grpc
import pytest

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.protocol import keys
from tests.gpusim import gpusim_state as gs
from tests.integration.deviceplugin.conftest import NODE
from tests.unit.deviceplugin.fakes import (
    FakeSnapshot,
    FakeSource,
    ctr,
    full_gpus,
    gpu_uuid,
    hami_pod,
    lock_value,
    node_register,
)

pytestmark = pytest.mark.integration
GPU = "nvidia.com/gpu"


def wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def reject_like_the_kubelet(api, pod: dict, message: str) -> None:
    """What the kubelet does with a pod whose admission failed (tests/sim/kubelet.py writes no status)."""
    md = pod["metadata"]
    api.patch("pods", md["namespace"], md["name"],
              {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message}},
              subresource="status")


@pytest.mark.timeout(120)
def test_a_forged_pod_gets_nothing_and_a_scheduled_pod_then_gets_its_full_share(
        gpusim_factory, api_server, kubelet, sock_dir, tmp_path):
    node = gpusim_factory("a100-80gb-x8", driver=gs.FIXED_DRIVER)
    gpus = node.state()["gpus"]
    g0, mem = gpus[0]["uuid"], gpus[0]["memory_total_mib"]
    api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {}}})
    env = node.env()
    env["HOOK_PATH"] = str(tmp_path / "usr-local")
    log_path = tmp_path / "plugin.log"
    cmd = [sys.executable, "-m", "hami_agent", "device-plugin", "-v", "4", "--node-name", NODE,
           "--kubeconfig", api_server.kubeconfig_path, "--device-plugin-dir", sock_dir,
           "--metrics-bind", "none", "--device-split-count", "2", "--poll-interval", "0.1",
           "--vgpu-lock-dir", str(tmp_path / "vgpulock"), "--mig-apply-lock", str(tmp_path / "mig.lock")]
    with open(log_path, "w") as log_fh:
        proc = subprocess.Popen(cmd, env=env, stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        assert kubelet.wait_registered(GPU, 30, min_devices=2 * len(gpus)), log_path.read_text()
        assert wait(lambda: g0 in (api_server.get("nodes", None, NODE)["metadata"].get("annotations") or {})
                    .get(keys.NODE_REGISTER, ""), 15), log_path.read_text()[-3000:]

        # a tenant's pod that skipped the webhook and the scheduler: spec.nodeName and forged annotations
        # claiming a whole GPU, no node lock (tenants cannot write Node objects)
        forged = hami_pod("forged", NODE, [ctr("c", 1)], f"{g0},NVIDIA,{mem},100:;", ns="tenant")
        forged["metadata"]["annotations"][keys.BIND_TIME] = str(int(time.time()))
        api_server.create(forged)
        before = api_server.get("pods", "tenant", "forged")
        res = kubelet.admit(before, timeout=10)
        assert res is not None and not res.admitted, res
        assert "no binding pod found on node gpu-1: no node lock" in res.message
        assert res.allocations == {}  # no envs, no mounts: nothing handed out
        time.sleep(0.5)  # anything the plugin might still write would show now
        assert api_server.get("pods", "tenant", "forged") == before  # a refusal writes nothing
        assert api_server.requests_matching("PATCH", "/namespaces/tenant/pods/") == []
        reject_like_the_kubelet(api_server, before, res.message)

        # the scheduler places a real pod on the same GPU with the whole of it: capacity is intact
        real = hami_pod("real", NODE, [ctr("c", 1)], f"{g0},NVIDIA,{mem},100:;")
        real["metadata"]["annotations"][keys.BIND_TIME] = str(int(time.time()))
        lock = {"metadata": {"annotations": {keys.NODE_LOCK: lock_value("real")}}}
        api_server.patch("nodes", None, NODE, lock)  # the scheduler's /bind: lock, annotate, bind
        api_server.create(real)
        res = kubelet.admit(api_server.get("pods", "default", "real"), timeout=10)
        assert res is not None and res.admitted, (res, log_path.read_text()[-3000:])
        envs = res.allocations["c"][GPU]["envs"]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == g0
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{mem}m" and envs["CUDA_DEVICE_SM_LIMIT"] == "100"
        ann = api_server.get("pods", "default", "real")["metadata"]["annotations"]
        assert ann[keys.BIND_PHASE] == "success"
        node_ann = lambda: api_server.get("nodes", None, NODE)["metadata"]["annotations"]  # noqa: E731
        assert wait(lambda: keys.NODE_LOCK not in node_ann(), 5)
        assert api_server.get("pods", "tenant", "forged")["metadata"]["annotations"] == \
            before["metadata"]["annotations"]
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# ------------------------------------------------------------------ the kubelet's choice vs the allocation
def start(start_plugin, kubelet, pods: MemoryPodSource, n_gpus: int = 2):
    pods.node_annotations[keys.NODE_REGISTER] = node_register(n_gpus, count=2)
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(n_gpus))), pods=pods, device_split_count=2)
    assert kubelet.wait_registered(GPU, 5, min_devices=2 * n_gpus)
    return r


@pytest.mark.timeout(60)
def test_the_kubelet_overriding_the_hint_is_refused_and_recorded(start_plugin, kubelet, sock_dir):
    """A kubelet whose topology manager picks other devices than GetPreferredAllocation preferred (the
    real kubelet takes NUMA-aligned devices first): the scheduler's devices are not handed to a container
    the kubelet accounted on another GPU. Straight gRPC calls with the kubelet's call pattern."""
    pods = MemoryPodSource(NODE)
    r = start(start_plugin, kubelet, pods)
    u0, u1 = gpu_uuid(0), gpu_uuid(1)
    pods.add_pod(hami_pod("p", NODE, [ctr("c", 1)], f"{u1},NVIDIA,1000,10:;"))
    pods.node_annotations[keys.NODE_LOCK] = lock_value("p")
    with grpc.insecure_channel(f"unix://{sock_dir}/nvidia-gpu.sock") as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        available = [f"{u0}-0", f"{u0}-1", f"{u1}-0", f"{u1}-1"]
        pref = stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)]),
            timeout=5)
        assert list(pref.container_responses[0].deviceIDs) == [f"{u1}-0"]
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[f"{u0}-1"])]), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert "the kubelet chose" in err.value.details() and "refusing" in err.value.details()
    assert r.manager.allocator.writer.wait_idle(5)
    ann = pods.pods[("default", "p")]["metadata"]["annotations"]
    assert ann[keys.BIND_PHASE] == "failed" and ann[keys.DEVICES_TO_ALLOCATE] == f"{u1},NVIDIA,1000,10:;"
    assert keys.NODE_LOCK not in pods.node_annotations


class LockSeenLate(MemoryPodSource):
    """The node lock is invisible to the first ``hidden`` reads (an informer and an API read that
    lagged during GetPreferredAllocation), then visible."""

    hidden = 0

    def _node(self):
        node = super()._node()
        if self.hidden > 0:
            self.hidden -= 1
            node["metadata"]["annotations"].pop(keys.NODE_LOCK, None)
        return node


@pytest.mark.timeout(60)
def test_without_a_hint_the_kubelet_picks_freely_and_a_mismatch_is_refused(start_plugin, kubelet):
    """GetPreferredAllocation could not name the pod (no lock visible yet), so it answered a valid subset
    and the SIMULATED kubelet took it; Allocate then sees the owner, whose GPU is another one."""
    pods = LockSeenLate(NODE)
    r = start(start_plugin, kubelet, pods)
    u1 = gpu_uuid(1)
    pod = hami_pod("nohint", NODE, [ctr("c", 1)], f"{u1},NVIDIA,1000,10:;")
    pods.add_pod(pod)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("nohint")
    pods.hidden = 2  # GetPreferredAllocation: cached node, then the API read
    # the kubelet fills a request without a hint in (Go map) random order; the simulator's order is seeded:
    # this seed makes it take a replica of GPU 0 (if the simulator's draws change, pick another seed)
    kubelet.rng.seed(2)
    res = kubelet.admit(pod, timeout=10)
    assert res is not None and not res.admitted, "seeded kubelet took the GPU: pick another seed"
    # which replica the kubelet took is its own (seeded) choice; what matters is that it is not the
    # scheduler's GPU and that Allocate refused instead of handing out the annotated one
    assert "the kubelet chose" in res.message and f"the scheduler allocated ['{u1}']" in res.message
    assert r.manager.allocator.writer.wait_idle(5)
    assert pods.pods[("default", "nohint")]["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
    # with the lock visible from the start, the hint makes the kubelet pick the scheduler's GPU
    pod = hami_pod("hint", NODE, [ctr("c", 1)], f"{u1},NVIDIA,1000,10:;")
    pods.add_pod(pod)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("hint")
    pods.pods[("default", "nohint")]["status"]["phase"] = "Failed"  # rejected by the kubelet
    res = kubelet.admit(pod, timeout=10)
    assert res is not None and res.admitted, res
    assert res.allocations["c"][GPU]["devices"][0].startswith(u1)


@pytest.mark.timeout(60)
def test_a_pod_bound_without_the_lock_makes_the_admission_ambiguous(start_plugin, kubelet):
    """Issue 16 finding 4 on the plugin side: a pod whose bind answer was lost is bound to the node but
    no longer holds the lock, which the next pod took. Whichever of the two the kubelet admits first, it
    must not receive the other's devices and limits."""
    pods = MemoryPodSource(NODE)
    start(start_plugin, kubelet, pods)
    u0, u1 = gpu_uuid(0), gpu_uuid(1)
    lost = hami_pod("lost-bind", NODE, [ctr("c", 1)], f"{u0},NVIDIA,1000,10:;")
    holder = hami_pod("holder", NODE, [ctr("c", 1)], f"{u1},NVIDIA,30000,60:;")
    pods.add_pod(lost)
    pods.add_pod(holder)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("holder")
    snapshot = copy.deepcopy(pods.pods)
    res = kubelet.admit(lost, timeout=10)  # the kubelet admits the pod whose bind was lost first
    assert res is not None and not res.admitted
    assert "ambiguous admission" in res.message and "default/lost-bind" in res.message
    assert res.allocations == {} and pods.pods == snapshot and pods.patches == []
    lost["status"]["phase"] = "Failed"  # rejected by the kubelet
    res = kubelet.admit(holder, timeout=10)
    assert res is not None and res.admitted, res
    assert res.allocations["c"][GPU]["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "30000m"


@pytest.mark.timeout(60)
def test_a_rival_pod_is_refused_and_so_is_the_scheduled_pod_while_it_waits(start_plugin, kubelet):
    """Issue 27 item 3, the device plugin's side (unchanged: refuse, never over-commit). Admission now
    refuses to create such a rival, but one made before the policy, or on a cluster without it, still
    reaches the kubelet: a tenant pod with spec.nodeName set, a foreign schedulerName and nvidia.com/gpu: 1,
    no hami.io keys, next to a pod the scheduler bound and locked the node for. Whichever the kubelet
    admits, Allocate cannot tell them apart: both are refused and nothing is written. Once the rival is
    gone, the scheduled pod gets exactly its own share; the rival never gets a device."""
    pods = MemoryPodSource(NODE)
    start(start_plugin, kubelet, pods)
    u0 = gpu_uuid(0)
    holder = hami_pod("scheduled", NODE, [ctr("c", 1)], f"{u0},NVIDIA,8000,25:;")
    rival = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "rival", "namespace": "tenant", "uid": "uid-rival", "annotations": {}},
             "spec": {"nodeName": NODE, "schedulerName": "my-own-scheduler", "containers": [ctr("c", 1)]},
             "status": {"phase": "Pending"}}
    pods.add_pod(holder)
    pods.add_pod(rival)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("scheduled")
    snapshot = copy.deepcopy(pods.pods)
    for first in (rival, holder):  # the kubelet admits either one first
        res = kubelet.admit(first, timeout=10)
        assert res is not None and not res.admitted, res
        assert "ambiguous admission" in res.message and "tenant/rival" in res.message, res.message
        assert res.allocations == {}
    assert pods.pods == snapshot and pods.patches == []  # nothing written, no device promised
    rival["status"]["phase"] = "Failed"  # the kubelet rejected it (UnexpectedAdmissionError)
    res = kubelet.admit(holder, timeout=10)
    assert res is not None and res.admitted, res
    envs = res.allocations["c"][GPU]["envs"]
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m" and envs["CUDA_DEVICE_SM_LIMIT"] == "25"
