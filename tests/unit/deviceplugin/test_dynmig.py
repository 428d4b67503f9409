"""Dynamic MIG lifecycle rules (``deviceplugin/dynmig.py``) against a fake NVML: what is destroyed, when,
and what never is."""

from __future__ import annotations

import pytest

from hami_agent.deviceplugin.dynmig import DynamicMig, MigAllocateError
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.nvml.errors import NvmlTimeout
from hami_agent.nvml.mig import DiscoveredProfile, LiveInstance, MigInUse
from hami_agent.protocol import MigPlacement, keys
from hami_agent.protocol.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations

pytestmark = pytest.mark.unit
GPU = "GPU-0a0a0a0a-aaaa-bbbb-cccc-000000000000"  # the real form: replica IDs are <uuid>-<n>
NODE = "gpu-1"


class FakeMigNvml:
    """Instances in a dict; ``hang_create`` makes the next create time out after making the GI."""

    def __init__(self) -> None:
        self.live: dict[int, LiveInstance] = {}
        self.hang_create = False
        self.destroy_calls: list[int] = []
        self.next_gi = 1

    def profiles(self, gpu, timeout_s):
        return [DiscoveredProfile("1g.10gb", 19, 9728, 1, 7, 15, tuple((s, 1) for s in range(7))),
                DiscoveredProfile("3g.40gb", 9, 40192, 3, 2, 43, ((0, 4), (4, 4)))]

    def instances(self, gpu, timeout_s):
        return list(self.live.values())

    def create(self, gpu, profile, start, size, timeout_s):
        gi = self.next_gi
        self.next_gi += 1
        inst = LiveInstance(gpu, gi, profile, start, size, 0, f"MIG-{gi}")
        self.live[gi] = inst
        if self.hang_create:
            self.live[gi] = LiveInstance(gpu, gi, profile, start, size)  # the GI, no CI yet
            raise NvmlTimeout("nvmlDeviceCreateGpuInstanceWithPlacement", timeout_s, 4242)
        return {"gi": gi, "ci": 0, "uuid": inst.mig_uuid}

    def destroy(self, inst, timeout_s):
        self.destroy_calls.append(inst.gi_id)
        cur = self.live.get(inst.gi_id)
        if cur is None:
            return False
        if cur.processes:
            raise MigInUse("busy", call="mig_destroy", code=19)
        del self.live[inst.gi_id]
        return True


class Gpu:
    uuid, name, mig_enabled = GPU, "NVIDIA A100-SXM4-80GB", True


def _pod(name: str, allocs: list[MigAllocation], phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                         "annotations": {keys.MIG_ALLOCATIONS: encode_mig_allocations(allocs)}},
            "spec": {"nodeName": NODE}, "status": {"phase": phase}}


def _alloc(start: int, profile: str = "1g.10gb", size: int = 1, runtime: LiveInstance | None = None):
    if runtime is None:
        return MigAllocation(0, 0, GPU, profile, MigPlacement(start, size))
    return MigAllocation(0, 0, GPU, profile, MigPlacement(start, size), runtime.mig_uuid, runtime.gi_id, 0)


@pytest.fixture
def env():
    nvml, pods = FakeMigNvml(), MemoryPodSource(NODE)
    mig = DynamicMig(nvml, pods, lambda model: ["1g.10gb", "3g.40gb"])
    assert mig.discover([Gpu()]) == {}
    return mig, nvml, pods


def test_profiles_follow_the_allowlist(env):
    mig, _nvml, _pods = env
    assert [p.name for p in mig.profiles(GPU)] == ["1g.10gb", "3g.40gb"]
    other = DynamicMig(FakeMigNvml(), MemoryPodSource(NODE), lambda model: [])
    assert "migProfileAllowlist" in other.discover([Gpu()])[GPU] and other.gpus() == []


def test_instance_of_a_running_pod_is_kept_and_of_a_gone_pod_destroyed(env):
    mig, nvml, pods = env
    created: list = []
    inst = mig.ensure(_alloc(6), 5.0, created)
    assert created == [inst] and mig.ensure(_alloc(6), 5.0, []) == inst  # idempotent for the same key
    pods.add_pod(_pod("p", [_alloc(6, runtime=inst)]))
    mig.reconcile()
    assert list(nvml.live) == [inst.gi_id]
    pods.pods.clear()  # the pod is deleted
    st = mig.reconcile()
    assert st.destroyed == 1 and nvml.live == {}


def test_busy_instances_are_never_destroyed(env):
    mig, nvml, pods = env
    inst = mig.ensure(_alloc(6), 5.0, [])
    nvml.live[inst.gi_id] = LiveInstance(GPU, inst.gi_id, "1g.10gb", 6, 1, 0, inst.mig_uuid, processes=1)
    st = mig.reconcile()  # no pod reserves it, but a process runs on it
    assert st.busy and inst.gi_id in nvml.live and nvml.destroy_calls == []


def test_orphans_are_destroyed_only_at_the_second_unused_sighting(env):
    mig, nvml, pods = env
    nvml.live[9] = LiveInstance(GPU, 9, "3g.40gb", 4, 4, 0, "MIG-stranger")
    st = mig.reconcile()
    assert st.orphans and 9 in nvml.live  # reported, not destroyed yet
    pods.add_pod(_pod("q", [_alloc(4, "3g.40gb", 4)]))  # a pending pod reserves that placement now
    mig.reconcile()
    assert 9 in nvml.live  # adopted for that pod, never destroyed
    pods.pods.clear()
    mig.reconcile()
    assert 9 not in nvml.live  # owned, and nobody reserves it any more


def test_nothing_is_destroyed_without_a_complete_pod_cache(env):
    mig, nvml, pods = env
    mig.ensure(_alloc(6), 5.0, [])
    pods.pods_synced = lambda: False  # type: ignore[attr-defined]
    st = mig.reconcile()
    assert "not synced" in st.skipped and len(nvml.live) == 1


def test_an_undecodable_reservation_stops_all_destruction(env):
    mig, nvml, pods = env
    mig.ensure(_alloc(6), 5.0, [])
    bad = _pod("bad", [])
    bad["metadata"]["annotations"][keys.MIG_ALLOCATIONS] = "[{not json"
    pods.add_pod(bad)
    st = mig.reconcile()
    assert keys.MIG_ALLOCATIONS in st.skipped and len(nvml.live) == 1


def test_instances_of_a_failed_admission_are_given_back(env):
    mig, nvml, pods = env
    created: list = []
    mig.ensure(_alloc(6), 5.0, created)
    pods.add_pod(_pod("p", [_alloc(6)], phase="Pending"))  # still reserves it: the kubelet fails it later
    mig.abandon(created, "Allocate failed")
    mig.reconcile()
    assert nvml.live == {}


def test_a_hung_create_dooms_its_placement(env):
    mig, nvml, pods = env
    nvml.hang_create = True
    pods.add_pod(_pod("p", [_alloc(6)], phase="Pending"))
    with pytest.raises(MigAllocateError, match="did not return within"):
        mig.ensure(_alloc(6), 1.0, [])
    assert len(nvml.live) == 1  # the driver made the GI anyway
    mig.reconcile()
    assert nvml.live == {}


def test_failed_destroys_back_off(env):
    mig, nvml, pods = env
    times = iter([100.0, 101.0, 106.0])
    mig._clock = lambda: next(times)  # noqa: SLF001
    inst = mig.ensure(_alloc(6), 5.0, [])
    nvml.live[inst.gi_id] = LiveInstance(GPU, inst.gi_id, "1g.10gb", 6, 1, 0, inst.mig_uuid)

    def refuse(i, t):
        nvml.destroy_calls.append(i.gi_id)
        raise NvmlTimeout("nvmlGpuInstanceDestroy", t)
    nvml.destroy = refuse  # type: ignore[method-assign]
    mig.reconcile()  # t=100: fails, next try not before 105
    mig.reconcile()  # t=101: skipped
    mig.reconcile()  # t=106: tried again
    assert nvml.destroy_calls == [inst.gi_id, inst.gi_id]


# ------------------------------------------------------------------------- Allocate in operatingmode mig
def _mig_env(tmp_path):
    from hami_agent.deviceplugin.allocator import Allocator
    from hami_agent.deviceplugin.devices import plan_resources
    from hami_agent.deviceplugin.settings import PluginSettings
    from tests.unit.deviceplugin.fakes import FakeGpu, FakeSnapshot, node_register

    settings = PluginSettings(node_name=NODE, mode="mig", device_split_count=4,
                              hook_path=str(tmp_path / "usr-local"), vgpu_lock_dir=str(tmp_path / "lock"))
    nvml, pods = FakeMigNvml(), MemoryPodSource(NODE)
    pods.node_annotations[keys.NODE_REGISTER] = node_register([GPU], count=7, devmem=81920)
    mig = DynamicMig(nvml, pods, lambda model: ["1g.10gb", "3g.40gb"])
    mig.discover([Gpu()])
    plan = plan_resources(FakeSnapshot(gpus=(FakeGpu(0, GPU, name=Gpu.name, mig_enabled=True),)),
                          settings)["nvidia.com/gpu"]
    return Allocator(settings, pods, mig=mig), pods, nvml, plan


def _scheduled_mig_pod(pods, name="m"):
    from tests.unit.deviceplugin.fakes import ctr, hami_pod, lock_value

    pod = hami_pod(name, NODE, [ctr("c", 1)], f"{GPU},NVIDIA,9728,15:;")
    pod["metadata"]["annotations"][keys.MIG_ALLOCATIONS] = encode_mig_allocations([_alloc(6)])
    pods.add_pod(pod)
    pods.node_annotations[keys.NODE_LOCK] = lock_value(name)
    return pod


def test_allocate_creates_the_reserved_instance_and_records_it_in_the_success_write(tmp_path):
    # HAMi GetContainerDeviceStrArray + annotateMigRuntimeInfo (plugin/util.go, server.go): the MIG UUID
    # is the container's device; here its identity lands in the same conditional write as bind-phase
    alloc, pods, nvml, plan = _mig_env(tmp_path)
    try:
        _scheduled_mig_pod(pods)
        [resp] = alloc.allocate(plan, [[f"{GPU}-0"]])
        (inst,) = nvml.live.values()
        assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": inst.mig_uuid} and resp.mounts == []
        [(_ns, _name, changes)] = pods.patches
        assert changes[keys.BIND_PHASE] == "success"
        (rec,) = decode_mig_allocations(changes[keys.MIG_ALLOCATIONS])
        assert (rec.mig_uuid, rec.gpu_instance_id, rec.compute_instance_id) == (inst.mig_uuid, inst.gi_id, 0)
    finally:
        alloc.close()


def test_an_allocate_whose_success_write_may_have_landed_gives_everything_back(tmp_path):
    # the write timed out (outcome unknown): the kubelet gets an error, the failure record restores
    # to-allocate and the reservation without runtime identity, and the instance is destroyed
    from hami_agent.deviceplugin.errors import AllocationError

    alloc, pods, nvml, plan = _mig_env(tmp_path)
    try:
        pod = _scheduled_mig_pod(pods)
        before = dict(pod["metadata"]["annotations"])
        pods.fail_writes = TimeoutError("timed out after 1s")
        with pytest.raises(AllocationError, match="timed out"):
            alloc.allocate(plan, [[f"{GPU}-0"]])
        pods.fail_writes = None
        assert alloc.writer.wait_idle(10)
        ann = pods.pods[("default", "m")]["metadata"]["annotations"]
        assert ann[keys.BIND_PHASE] == "failed"
        assert ann[keys.MIG_ALLOCATIONS] == before[keys.MIG_ALLOCATIONS]
        assert ann[keys.DEVICES_TO_ALLOCATE] == before[keys.DEVICES_TO_ALLOCATE]
        alloc.mig.reconcile()
        assert nvml.live == {}
    finally:
        alloc.close()


def test_an_idle_instance_at_the_reserved_placement_is_adopted_not_refused(env):
    # a previous process created it and died before its success write: the placement is taken, so the
    # create answers INSUFFICIENT_RESOURCES; the reservation's Allocate takes the instance over
    from hami_agent.nvml.mig import MigNvmlError

    mig, nvml, pods = env
    nvml.live[5] = LiveInstance(GPU, 5, "1g.10gb", 6, 1, 0, "MIG-left-over")

    def taken(*_a, **_k):
        raise MigNvmlError("Insufficient resources for request", call="mig_create", code=23)
    nvml.create = taken  # type: ignore[method-assign]
    pods.add_pod(_pod("p", [_alloc(6)], phase="Pending"))
    assert mig.ensure(_alloc(6), 5.0, []).mig_uuid == "MIG-left-over"
    pods.pods.clear()
    pods.add_pod(_pod("q", [_alloc(6, runtime=LiveInstance(GPU, 5, "1g.10gb", 6, 1, 0, "MIG-left-over"))]))
    other = DynamicMig(nvml, pods, lambda model: ["1g.10gb"])
    other.discover([Gpu()])
    with pytest.raises(MigAllocateError, match="Insufficient"):  # recorded by a running pod: not taken
        other.ensure(_alloc(6), 5.0, [])
