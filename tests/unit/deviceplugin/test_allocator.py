"""Allocate / GetPreferredAllocation: HAMi's envs and bookkeeping for the node lock's owner, and the
rules HAMi does not have (lock identity, no write on a refusal, kubelet choice, capacity)."""

import copy
import os
import stat

import pytest

from hami_agent.deviceplugin.allocator import AllocationError, Allocator, PreferredRequest, Refused
from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.protocol import keys
from tests.unit.deviceplugin.fakes import (
    FakeSnapshot,
    ctr,
    full_gpus,
    gpu_uuid,
    h20_mig_mixed,
    hami_pod,
    lock_value,
    node_register,
)

pytestmark = pytest.mark.unit

NODE = "gpu-1"
U0, U1, U2 = gpu_uuid(0), gpu_uuid(1), gpu_uuid(2)


def source(cls=MemoryPodSource) -> MemoryPodSource:
    src = cls(NODE)
    src.node_annotations[keys.NODE_REGISTER] = node_register(4, count=4)
    return src


@pytest.fixture
def env(tmp_path):
    s = PluginSettings(
        node_name=NODE,
        hook_path=str(tmp_path / "usr-local"),
        vgpu_lock_dir=str(tmp_path / "lock"),
        device_split_count=4,
        plugin_version="9.9.9",
    )
    src = source()
    plan = plan_resources(FakeSnapshot(gpus=full_gpus(4)), s)["nvidia.com/gpu"]
    alloc = Allocator(s, src)
    yield s, src, alloc, plan
    alloc.close()


def rid(uuid, i=0):
    return f"{uuid}-{i}"


def vgpu(s):
    return os.path.join(s.hook_path, "vgpu")


def locked(src, name):
    src.node_annotations[keys.NODE_LOCK] = lock_value(name)


def ann(src, name):
    return src.pods[("default", name)]["metadata"]["annotations"]


def test_single_container_envs_mounts_and_bookkeeping(env):
    s, src, alloc, plan = env
    src.add_pod(hami_pod("p1", NODE, [ctr("main", 1)], f"{U1},NVIDIA,3000,50:;"))
    locked(src, "p1")
    [resp] = alloc.allocate(plan, [[rid(U1, 2)]])
    cache = resp.envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    assert cache.startswith(vgpu(s) + "/") and cache.endswith(".cache")
    assert resp.envs == {
        "NVIDIA_VISIBLE_DEVICES": U1,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "50",
    }
    cache_dir = os.path.join(vgpu(s), "containers", "uid-p1_main")
    assert [(m.container_path, m.host_path, m.read_only) for m in resp.mounts] == [
        (f"{vgpu(s)}/libvgpu.so", f"{vgpu(s)}/libvgpu.so", True),
        (vgpu(s), cache_dir, False),
        ("/tmp/vgpulock", s.vgpu_lock_dir, False),
        ("/etc/ld.so.preload", f"{vgpu(s)}/ld.so.preload", True),
    ]
    for d in (cache_dir, s.vgpu_lock_dir):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o777
    a = ann(src, "p1")
    assert a[keys.DEVICES_TO_ALLOCATE] == ";" and a[keys.BIND_PHASE] == "success"
    assert a[keys.DEVICES_ALLOCATED] == f"{U1},NVIDIA,3000,50:;"  # never modified
    # the lock is released off the RPC path, by the background writer
    assert alloc.writer.wait_idle(5)
    assert keys.NODE_LOCK not in src.node_annotations and src.released == [lock_value("p1")]


def test_multi_gpu_container_and_optional_envs(env):
    s, src, _, plan = env
    s.device_memory_scaling = 2.0
    s.lib_cuda_log_level = "3"
    s.disable_core_limit = True
    alloc = Allocator(s, src)
    os.makedirs(vgpu(s))
    for name in ("libvgpu.so.9.9.9", "license"):
        open(os.path.join(vgpu(s), name), "w").close()
    src.add_pod(
        hami_pod(
            "p2",
            NODE,
            [ctr("train", 2, env={"CUDA_DISABLE_CONTROL": "true"})],
            f"{U0},NVIDIA,2000,30:{U2},NVIDIA,4000,60:;",
        )
    )
    locked(src, "p2")
    [resp] = alloc.allocate(plan, [[rid(U0), rid(U2)]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{U0},{U2}"
    assert (
        resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
        and resp.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4000m"
    )
    assert resp.envs["CUDA_DEVICE_SM_LIMIT"] == "30"  # device 0's cores
    assert resp.envs["CUDA_OVERSUBSCRIBE"] == "true" and resp.envs["LIBCUDA_LOG_LEVEL"] == "3"
    assert resp.envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    paths = {m.container_path: m.host_path for m in resp.mounts}
    assert paths[f"{vgpu(s)}/libvgpu.so"] == f"{vgpu(s)}/libvgpu.so.9.9.9"
    assert "/etc/ld.so.preload" not in paths  # CUDA_DISABLE_CONTROL=true
    assert paths["/tmp/license"] == f"{vgpu(s)}/license"
    assert paths["/usr/bin/vgpuvalidator"] == f"{vgpu(s)}/vgpuvalidator"
    alloc.close()


class StaleSource(MemoryPodSource):
    """Serves the pods as first seen, like an informer that has not caught up with our patches."""

    def pods_on_node(self):
        if not hasattr(self, "_frozen"):
            self._frozen = super().pods_on_node()
        return copy.deepcopy(self._frozen)


def test_init_container_first_then_app_container_even_with_a_stale_cache(env):
    s, _, _, plan = env
    src = source(StaleSource)
    alloc = Allocator(s, src)
    src.add_pod(
        hami_pod(
            "p3",
            NODE,
            [ctr("sidecar"), ctr("app", 1)],
            f"{U0},NVIDIA,1000,10:;;{U1},NVIDIA,5000,70:;",
            init=[ctr("init", 1)],
        )
    )
    locked(src, "p3")
    [first] = alloc.allocate(plan, [[rid(U0)]])
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == U0
    assert any(m.host_path.endswith("uid-p3_init") for m in first.mounts)
    a = ann(src, "p3")
    assert a[keys.DEVICES_TO_ALLOCATE] == f";;{U1},NVIDIA,5000,70:;" and a[keys.BIND_PHASE] == "allocating"
    assert keys.NODE_LOCK in src.node_annotations  # held until the pod's last container
    [second] = alloc.allocate(plan, [[rid(U1, 3)]])
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == U1 and second.envs["CUDA_DEVICE_SM_LIMIT"] == "70"
    assert any(m.host_path.endswith("uid-p3_app") for m in second.mounts)
    assert a[keys.DEVICES_TO_ALLOCATE] == ";;;" and a[keys.BIND_PHASE] == "success"
    alloc.close()


def test_app_container_may_reuse_its_init_containers_device(env):
    """The kubelet hands an app container the devices of the pod's own init containers without asking
    GetPreferredAllocation (devicesToReuse): a different GPU than annotated, yet the same pod's."""
    _, src, alloc, plan = env
    src.add_pod(
        hami_pod("reuse", NODE, [ctr("app", 1)], f"{U0},NVIDIA,1000,10:;{U1},NVIDIA,5000,70:;",
                 init=[ctr("init", 1)])
    )
    locked(src, "reuse")
    alloc.allocate(plan, [[rid(U0, 2)]])
    [app] = alloc.allocate(plan, [[rid(U0, 2)]])  # the init container's replica again
    assert app.envs["NVIDIA_VISIBLE_DEVICES"] == U1  # the scheduler's GPU for the app container
    assert ann(src, "reuse")[keys.BIND_PHASE] == "success"


def test_a_kubelet_choice_that_is_not_the_scheduler_allocation_is_refused(env):
    """The kubelet asked for a replica of another GPU than the scheduler allocated (it ignored the
    GetPreferredAllocation hint, or had none): refuse, record the failure, release the lock."""
    _, src, alloc, plan = env
    src.add_pod(hami_pod("pick", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1000,10:;"))
    locked(src, "pick")
    with pytest.raises(AllocationError, match=r"the kubelet chose .*GPU-00000002.* the scheduler allocated"):
        alloc.allocate(plan, [[rid(U2, 1)]])
    assert alloc.writer.wait_idle(5)
    a = ann(src, "pick")
    assert a[keys.BIND_PHASE] == "failed" and a[keys.DEVICES_TO_ALLOCATE] == f"{U0},NVIDIA,1000,10:;"
    assert keys.NODE_LOCK not in src.node_annotations


def test_device_number_not_matched_marks_the_pod_failed_and_releases_the_lock(env):
    _, src, alloc, plan = env
    src.add_pod(hami_pod("p4", NODE, [ctr("c", 2)], f"{U0},NVIDIA,1000,10:;"))
    locked(src, "p4")
    with pytest.raises(AllocationError, match="^device number not matched"):
        alloc.allocate(plan, [[rid(U0), rid(U1)]])
    assert alloc.writer.wait_idle(5)
    assert ann(src, "p4")[keys.BIND_PHASE] == "failed"
    assert keys.NODE_LOCK not in src.node_annotations


def test_unknown_device_and_missing_lock_errors_use_the_seed_words(env):
    _, src, alloc, plan = env
    with pytest.raises(
        AllocationError, match=r"invalid allocation request for 'nvidia.com/gpu': unknown device: X-1"
    ):
        alloc.allocate(plan, [["X-1"]])
    with pytest.raises(Refused, match=f"^no binding pod found on node {NODE}: no node lock"):
        alloc.allocate(plan, [[rid(U0)]])
    src.add_pod(hami_pod("bad", NODE, [ctr("c", 1)], "GPU-x,NVIDIA,notanumber,1:;"))
    locked(src, "bad")
    with pytest.raises(AllocationError, match="failed to decode pod devices"):
        alloc.allocate(plan, [[rid(U0)]])


def test_a_forged_pod_without_the_node_lock_gets_nothing_and_is_not_written(env):
    """Issue 14 finding 3: a pod with spec.nodeName and self-written hami.io annotations (it skipped the
    webhook and the scheduler) used to be served as "the oldest binding pod on the node"."""
    _, src, alloc, plan = env
    forged = hami_pod("forged", NODE, [ctr("c", 1)], f"{U0},NVIDIA,97871,100:;")
    src.add_pod(forged)
    before = copy.deepcopy(forged)
    with pytest.raises(Refused, match="no node lock .* names a pod on this node"):
        alloc.allocate(plan, [[rid(U0)]])
    [hint] = alloc.preferred(plan, [PreferredRequest((rid(U2), rid(U0)), (), 1)])
    assert hint == [rid(U2)]  # no hint taken from the forged annotations
    assert alloc.writer.wait_idle(5)
    assert src.patches == [] and src.released == []
    assert src.pods[("default", "forged")] == before


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"phase": "success"}, "bind-phase is 'success'"),
        ({"node": "gpu-2"}, "bound to gpu-2"),
        ({"terminating": True}, "being deleted"),
        ({"vgpu_node": "gpu-9"}, "vgpu-node is 'gpu-9'"),
        ({"name": "someone-else"}, "which does not exist"),
    ],
)
def test_a_lock_owner_that_is_not_being_allocated_here_is_refused_without_writes(env, change, why):
    _, src, alloc, plan = env
    pod = hami_pod("owner", change.get("node", NODE), [ctr("c", 1)], f"{U0},NVIDIA,1000,10:;",
                   phase=change.get("phase", "allocating"))
    if change.get("terminating"):
        pod["metadata"]["deletionTimestamp"] = "2026-11-21T12:00:00Z"
    if "vgpu_node" in change:
        pod["metadata"]["annotations"][keys.VGPU_NODE] = change["vgpu_node"]
    src.add_pod(pod)
    locked(src, change.get("name", "owner"))
    with pytest.raises(Refused, match=why):
        alloc.allocate(plan, [[rid(U0)]])
    assert alloc.writer.wait_idle(5)
    assert src.patches == [] and keys.NODE_LOCK in src.node_annotations


def test_another_pod_waiting_for_gpus_makes_the_admission_ambiguous(env):
    """A pod created with spec.nodeName (no scheduler, no lock) while a scheduled pod holds the lock: the
    kubelet may be admitting either, and the lock owner's devices must not go to the other one."""
    _, src, alloc, plan = env
    src.add_pod(hami_pod("owner", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1000,10:;"))
    locked(src, "owner")
    bypass = {"metadata": {"name": "bypass", "namespace": "t", "uid": "uid-bypass"},
              "spec": {"nodeName": NODE, "containers": [ctr("c", 1)]}, "status": {"phase": "Pending"}}
    src.add_pod(bypass)
    with pytest.raises(Refused, match=r"ambiguous admission .* names default/owner, but t/bypass"):
        alloc.allocate(plan, [[rid(U0)]])
    assert src.patches == []
    # the kubelet rejects the bypassing pod (phase Failed): the owner is unambiguous again
    bypass["status"]["phase"] = "Failed"
    [resp] = alloc.allocate(plan, [[rid(U0)]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == U0


def test_a_rewritten_devices_to_allocate_is_refused(env):
    """The UPDATE variant of issue 14 finding 3: the pod owner rewrote devices-to-allocate after the
    scheduler wrote both annotations."""
    _, src, alloc, plan = env
    pod = hami_pod("upd", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1000,10:;")
    pod["metadata"]["annotations"][keys.DEVICES_TO_ALLOCATE] = f"{U1},NVIDIA,97871,100:;"
    src.add_pod(pod)
    locked(src, "upd")
    with pytest.raises(AllocationError, match="differs from the scheduler's hami.io/vgpu-devices-allocated"):
        alloc.allocate(plan, [[rid(U1)]])


def test_an_allocation_beyond_the_registered_capacity_is_refused(env):
    _, src, alloc, plan = env
    held = hami_pod("held", NODE, [ctr("c", 1)], f"{U0},NVIDIA,60000,50:;", phase="success")
    held["status"]["phase"] = "Running"
    src.add_pod(held)
    src.add_pod(hami_pod("big", NODE, [ctr("c", 1)], f"{U0},NVIDIA,40000,40:;"))
    locked(src, "big")
    with pytest.raises(AllocationError, match=rf"refusing to over-commit GPU {U0} .* 100000 MiB of memory"):
        alloc.allocate(plan, [[rid(U0)]])
    assert alloc.writer.wait_idle(5)
    assert ann(src, "big")[keys.BIND_PHASE] == "failed"
    # exclusive use of a shared GPU
    src.add_pod(hami_pod("excl", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1000,100:;"))
    locked(src, "excl")
    with pytest.raises(AllocationError, match="exclusive use"):
        alloc.allocate(plan, [[rid(U0, 1)]])
    # once the holder is gone (terminated pods do not count) the same allocation fits
    held["status"]["phase"] = "Succeeded"
    src.add_pod(hami_pod("fits", NODE, [ctr("c", 1)], f"{U0},NVIDIA,40000,40:;"))
    locked(src, "fits")
    [resp] = alloc.allocate(plan, [[rid(U0, 2)]])
    assert resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40000m"


def test_capacity_needs_the_node_registration(env):
    _, src, alloc, plan = env
    del src.node_annotations[keys.NODE_REGISTER]
    src.add_pod(hami_pod("p", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1000,10:;"))
    locked(src, "p")
    with pytest.raises(AllocationError, match="has no hami.io/node-nvidia-register annotation"):
        alloc.allocate(plan, [[rid(U0)]])


def test_api_fallback_when_the_cache_has_not_seen_the_lock_or_the_pod(env):
    s, _, _, plan = env

    class Lagging(MemoryPodSource):
        def pods_on_node(self):
            return []

        def cached_node(self):
            return None

    src = source(Lagging)
    src.add_pod(hami_pod("late", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1,1:;"))
    locked(src, "late")
    alloc = Allocator(s, src)
    [resp] = alloc.allocate(plan, [[rid(U0)]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == U0
    assert src.api_calls >= 3  # GET node, GET pod, the conditional patch
    alloc.close()


def test_preferred_allocation_maps_the_lock_owners_uuids_to_replicas(env):
    _, src, alloc, plan = env
    src.add_pod(hami_pod("p6", NODE, [ctr("c", 2)], f"{U2},NVIDIA,1,1:{U0},NVIDIA,1,1:;"))
    locked(src, "p6")
    available = tuple(d.id for d in plan.devices)
    [ids] = alloc.preferred(plan, [PreferredRequest(available, (), 2)])
    assert ids == [rid(U2), rid(U0)]
    # must_include wins and is kept; the rest still follows the scheduler
    [ids] = alloc.preferred(plan, [PreferredRequest(available, (rid(U1, 3),), 2)])
    assert rid(U1, 3) in ids and len(ids) == 2 and ids[1] in (rid(U2), rid(U0))
    assert src.patches == []  # GetPreferredAllocation never writes


def test_preferred_allocation_without_a_pod_answers_a_valid_subset(env):
    _, _, alloc, plan = env
    u3 = gpu_uuid(3)
    available = (rid(u3, 1), rid(U0, 2), rid(U1, 0))
    [ids] = alloc.preferred(plan, [PreferredRequest(available, (rid(U1, 0),), 2)])
    assert ids == [rid(U1, 0), rid(u3, 1)]


def test_mps_mode_envs_and_mounts(env):
    s, src, _, plan = env
    s.mode = "mps"
    s.mps_root = "/run/nvidia/mps"
    alloc = Allocator(s, src)
    src.add_pod(hami_pod("m1", NODE, [ctr("c", 2)], f"{U0},NVIDIA,4096,25:{U1},NVIDIA,2048,25:;"))
    locked(src, "m1")
    [resp] = alloc.allocate(plan, [[rid(U0), rid(U1)]])
    assert resp.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{U0},{U1}",
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=2048M",
    }
    assert [(m.container_path, m.host_path) for m in resp.mounts] == [
        ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
        ("/dev/shm", "/run/nvidia/mps/shm"),
    ]
    src.add_pod(hami_pod("m2", NODE, [ctr("c", 1)], f"{U2},NVIDIA,0,0:;"))
    locked(src, "m2")
    [resp] = alloc.allocate(plan, [[rid(U2)]])
    assert resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(100 // s.device_split_count)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in resp.envs
    alloc.close()


def test_mig_resources_need_no_pod(env):
    s, src, _, _ = env
    s.mig_strategy = "mixed"
    plans = plan_resources(FakeSnapshot(gpus=h20_mig_mixed()), s)
    mig = plans["nvidia.com/mig-3g.48gb"]
    ids = [mig.devices[0].id]
    alloc = Allocator(s, src)
    [resp] = alloc.allocate(mig, [ids])
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": ids[0]} and resp.mounts == []
    assert src.patches == []
    alloc.close()


def test_a_write_with_an_unknown_outcome_is_recorded_as_failed_once_the_api_answers(env):
    """The success write timed out (it may have landed): the kubelet gets an error, and the background
    writer records bind-phase=failed with the allocation restored and releases the lock, retrying
    until the API answers again."""
    _, src, alloc, plan = env
    src.add_pod(hami_pod("w", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1,1:;"))
    locked(src, "w")
    src.fail_writes = TimeoutError("timed out after 1s")
    with pytest.raises(AllocationError, match="patch pod error: timed out after 1s"):
        alloc.allocate(plan, [[rid(U0)]])
    assert not alloc.writer.wait_idle(0.3)  # still retrying while the API fails
    src.fail_writes = None
    assert alloc.writer.wait_idle(10)
    a = ann(src, "w")
    assert a[keys.BIND_PHASE] == "failed" and a[keys.DEVICES_TO_ALLOCATE] == f"{U0},NVIDIA,1,1:;"
    assert keys.NODE_LOCK not in src.node_annotations
