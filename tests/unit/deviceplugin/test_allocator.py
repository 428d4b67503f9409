"""Allocate / GetPreferredAllocation logic against HAMi's semantics (reference/hami.md §6.2-6.4)."""

import copy
import os
import stat

import pytest

from hami_agent.deviceplugin.allocator import AllocationError, Allocator, PreferredRequest
from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.protocol import keys
from tests.unit.deviceplugin.fakes import FakeSnapshot, ctr, full_gpus, gpu_uuid, h20_mig_mixed, hami_pod

pytestmark = pytest.mark.unit

NODE = "gpu-1"
U0, U1, U2 = gpu_uuid(0), gpu_uuid(1), gpu_uuid(2)


@pytest.fixture
def env(tmp_path):
    s = PluginSettings(
        node_name=NODE,
        hook_path=str(tmp_path / "usr-local"),
        vgpu_lock_dir=str(tmp_path / "lock"),
        device_split_count=4,
        plugin_version="9.9.9",
    )
    src = MemoryPodSource(NODE)
    plan = plan_resources(FakeSnapshot(gpus=full_gpus(4)), s)["nvidia.com/gpu"]
    return s, src, Allocator(s, src), plan


def rid(uuid, i=0):
    return f"{uuid}-{i}"


def vgpu(s):
    return os.path.join(s.hook_path, "vgpu")


def test_single_container_envs_mounts_and_bookkeeping(env):
    s, src, alloc, plan = env
    src.add_pod(hami_pod("p1", NODE, [ctr("main", 1)], f"{U1},NVIDIA,3000,50:;"))
    src.node_annotations[keys.NODE_LOCK] = "2026-11-21T12:00:00Z,default,p1"
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
    ann = src.pods[("default", "p1")]["metadata"]["annotations"]
    assert ann[keys.DEVICES_TO_ALLOCATE] == ";"
    assert ann[keys.BIND_PHASE] == "success"
    assert ann[keys.DEVICES_ALLOCATED] == f"{U1},NVIDIA,3000,50:;"  # never modified
    assert keys.NODE_LOCK not in src.node_annotations and src.released == [("default", "p1")]


def test_multi_gpu_container_and_optional_envs(env, tmp_path):
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


class StaleSource(MemoryPodSource):
    """Serves the pods as first seen, like an informer that has not caught up with our patches."""

    def pods_on_node(self):
        if not hasattr(self, "_frozen"):
            self._frozen = super().pods_on_node()
        return copy.deepcopy(self._frozen)


def test_init_container_first_then_app_container_even_with_a_stale_cache(env):
    s, _, _, plan = env
    src = StaleSource(NODE)
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
    [first] = alloc.allocate(plan, [[rid(U0)]])
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == U0
    assert any(m.host_path.endswith("uid-p3_init") for m in first.mounts)
    ann = src.pods[("default", "p3")]["metadata"]["annotations"]
    assert (
        ann[keys.DEVICES_TO_ALLOCATE] == f";;{U1},NVIDIA,5000,70:;" and ann[keys.BIND_PHASE] == "allocating"
    )
    [second] = alloc.allocate(plan, [[rid(U1, 3)]])
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == U1 and second.envs["CUDA_DEVICE_SM_LIMIT"] == "70"
    assert any(m.host_path.endswith("uid-p3_app") for m in second.mounts)
    assert ann[keys.DEVICES_TO_ALLOCATE] == ";;;" and ann[keys.BIND_PHASE] == "success"


def test_device_number_not_matched_marks_the_pod_failed_and_releases_the_lock(env):
    s, src, alloc, plan = env
    src.add_pod(hami_pod("p4", NODE, [ctr("c", 2)], f"{U0},NVIDIA,1000,10:;"))
    src.node_annotations[keys.NODE_LOCK] = "2026-11-21T12:00:00Z,default,p4"
    with pytest.raises(AllocationError, match="^device number not matched"):
        alloc.allocate(plan, [[rid(U0), rid(U1)]])
    assert src.pods[("default", "p4")]["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
    assert keys.NODE_LOCK not in src.node_annotations


def test_unknown_device_and_missing_pod_errors_use_the_seed_words(env):
    s, src, alloc, plan = env
    with pytest.raises(
        AllocationError, match=r"invalid allocation request for 'nvidia.com/gpu': unknown device: X-1"
    ):
        alloc.allocate(plan, [["X-1"]])
    with pytest.raises(AllocationError, match=f"no binding pod found on node {NODE}"):
        alloc.allocate(plan, [[rid(U0)]])
    src.add_pod(hami_pod("bad", NODE, [ctr("c", 1)], "GPU-x,NVIDIA,notanumber,1:;"))
    with pytest.raises(AllocationError, match="failed to decode pod devices"):
        alloc.allocate(plan, [[rid(U0)]])


def test_annotated_gpu_must_be_on_this_node(env):
    _, src, alloc, plan = env
    src.add_pod(hami_pod("p5", NODE, [ctr("c", 1)], "GPU-not-here,NVIDIA,1000,10:;"))
    with pytest.raises(AllocationError, match="GPU-not-here .* is not a 'nvidia.com/gpu' device of node"):
        alloc.allocate(plan, [[rid(U0)]])


def test_pod_selection_prefers_the_lock_owner_then_the_oldest_bind(env):
    _, src, alloc, _ = env
    src.add_pod(hami_pod("old", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1,1:;", bind_time=100))
    src.add_pod(hami_pod("new", NODE, [ctr("c", 1)], f"{U1},NVIDIA,1,1:;", bind_time=200))
    src.add_pod(hami_pod("other-node", "gpu-2", [ctr("c", 1)], f"{U2},NVIDIA,1,1:;", bind_time=1))
    src.add_pod(hami_pod("failed", NODE, [ctr("c", 1)], f"{U2},NVIDIA,1,1:;", bind_time=2, phase="failed"))
    assert alloc.find_pending_pod()["metadata"]["name"] == "old"
    src.node_annotations[keys.NODE_LOCK] = "2026-11-21T12:00:00Z,default,new"
    assert alloc.find_pending_pod()["metadata"]["name"] == "new"


def test_api_fallback_when_the_cache_has_not_seen_the_pod(env):
    s, _, _, plan = env

    class Lagging(MemoryPodSource):
        def pods_on_node(self):
            return []

    src = Lagging(NODE)
    src.add_pod(hami_pod("late", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1,1:;"))
    src.node_annotations[keys.NODE_LOCK] = "2026-11-21T12:00:00Z,default,late"
    [resp] = Allocator(s, src).allocate(plan, [[rid(U0)]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == U0


def test_preferred_allocation_maps_annotated_uuids_to_replicas(env):
    _, src, alloc, plan = env
    src.add_pod(hami_pod("p6", NODE, [ctr("c", 2)], f"{U2},NVIDIA,1,1:{U0},NVIDIA,1,1:;"))
    available = tuple(d.id for d in plan.devices)
    [ids] = alloc.preferred(plan, [PreferredRequest(available, (), 2)])
    assert ids == [rid(U2), rid(U0)]
    # must_include wins and is kept; the rest still follows the scheduler
    [ids] = alloc.preferred(plan, [PreferredRequest(available, (rid(U1, 3),), 2)])
    assert rid(U1, 3) in ids and len(ids) == 2 and ids[1] in (rid(U2), rid(U0))


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
    [resp] = alloc.allocate(plan, [[rid(U2)]])
    assert resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(100 // s.device_split_count)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in resp.envs


def test_mig_resources_need_no_pod(env):
    s, src, _, _ = env
    s.mig_strategy = "mixed"
    plans = plan_resources(FakeSnapshot(gpus=h20_mig_mixed()), s)
    mig = plans["nvidia.com/mig-3g.48gb"]
    ids = [mig.devices[0].id]
    [resp] = Allocator(s, src).allocate(mig, [ids])
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": ids[0]} and resp.mounts == []
    assert src.patches == []


def test_write_failure_is_an_error_not_a_hang(env):
    _, src, alloc, plan = env
    src.add_pod(hami_pod("w", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1,1:;"))
    src.fail_writes = TimeoutError("timed out after 1s")
    with pytest.raises(AllocationError, match="patch pod error: timed out after 1s"):
        alloc.allocate(plan, [[rid(U0)]])
