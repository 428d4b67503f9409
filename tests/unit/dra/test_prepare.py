"""NodePrepareResources / NodeUnprepareResources decisions, CDI edits, the commit rule and the checkpoint."""

import json
import os
import uuid
from pathlib import Path

import pytest

from hami_agent.config import DraPartition
from hami_agent.deviceplugin.allocator import Allocator
from hami_agent.deviceplugin.budget import LateCommit, RpcBudget
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.dra import cdi
from hami_agent.dra.checkpoint import Checkpoint
from hami_agent.dra.claims import ClaimRef, MemoryClaimSource
from hami_agent.dra.devices import build_devices
from hami_agent.dra.prepare import Preparer
from hami_agent.dra.settings import DraSettings
from hami_agent.nvml.model import Gpu, MigDevice, Snapshot
from hami_agent.protocol.devices import ContainerDevice

pytestmark = pytest.mark.unit

NODE, DRIVER = "gpu-1", "gpu.hami.io"


def _gpu(i, mig=()):
    return Gpu(
        index=i,
        uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-80GB",
        type="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        numa=0,
        pci_bus_id=f"00000000:{i + 7:02X}:00.0",
        mig_capable=bool(mig),
        mig_enabled=bool(mig),
        mig_pending=False,
        mig_devices=tuple(mig),
    )


@pytest.fixture
def env(tmp_path):
    settings = DraSettings(
        node_name=NODE,
        partition=DraPartition(all=True),
        cdi_dir=str(tmp_path / "cdi"),
        state_dir=str(tmp_path / "state"),
        hook_path=str(tmp_path / "hook"),
        vgpu_lock_dir=str(tmp_path / "lock"),
        lib_cuda_log_level="1",
    )
    migs = (MigDevice(0, "MIG-1111", "1g.10gb", 9856, 7, 0),)
    devices = {
        d.name: d
        for d in build_devices(
            Snapshot(status="ok", gpus=(_gpu(0), _gpu(1), _gpu(2, migs))), settings.partition
        )
    }
    claims = MemoryClaimSource()
    prep = Preparer(settings, claims, lambda: devices, Checkpoint(settings.checkpoint_path))
    return settings, claims, prep, tmp_path


def claim(claims, name, results, pool=NODE, allocated=True):
    uid = str(uuid.uuid4())
    obj = {
        "metadata": {"name": name, "namespace": "team-a", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    if allocated:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": dev, **extra}
                        for dev, extra in results
                    ]
                }
            }
        }
    claims.put(obj)
    return ClaimRef("team-a", name, uid)


def shared(memory=None, cores=None):
    used = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    return {"shareID": str(uuid.uuid4()), "consumedCapacity": used}


def budget():
    return RpcBudget("NodePrepareResources", 5.0)


def test_a_shared_gpu_claim_gets_hami_core_limits_from_its_consumed_capacity(env):
    settings, claims, prep, _ = env
    ref = claim(claims, "c1", [("gpu-0", shared("20Gi", "30"))])
    res = prep.prepare([ref], budget())[ref.uid]
    assert res.error == ""
    [d] = res.devices
    assert (d.device, d.memory_mib, d.cores, d.cdi_ids) == (
        "gpu-0",
        20480,
        30,
        (f"{DRIVER}/claim={ref.uid}-gpu",),
    )
    edits = cdi.resolve(settings.cdi_dir, list(d.cdi_ids))
    assert edits["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"
    assert edits["env"]["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert edits["env"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-00000000-0000-0000-0000-000000000000"
    spec = json.loads(Path(cdi.spec_path(settings.cdi_dir, DRIVER, ref.uid)).read_text())
    assert spec["kind"] == f"{DRIVER}/claim" and spec["cdiVersion"] == "0.6.0"


def test_the_same_memory_and_cores_give_the_same_edits_as_the_device_plugins_allocate(env):
    settings, claims, prep, tmp_path = env
    ref = claim(claims, "c1", [("gpu-1", shared("30Gi", "50"))])
    [d] = prep.prepare([ref], budget())[ref.uid].devices
    dra = cdi.resolve(settings.cdi_dir, list(d.cdi_ids))
    plugin = PluginSettings(
        node_name=NODE,
        hook_path=settings.hook_path,
        vgpu_lock_dir=settings.vgpu_lock_dir,
        lib_cuda_log_level="1",
    )
    alloc = Allocator(plugin, MemoryPodSource(NODE))
    try:
        pod = {"metadata": {"uid": "pod-uid"}}
        resp = alloc._hami_core_response(
            pod,
            {"name": "main"},
            [ContainerDevice("GPU-00000001-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB", 30720, 50)],
        )
    finally:
        alloc.close()

    def norm_env(e):  # the shared-region file name is random per container in both paths
        return {k: v for k, v in e.items() if k != "CUDA_DEVICE_MEMORY_SHARED_CACHE"}

    assert norm_env(dra["env"]) == norm_env(resp.envs)
    cache = os.path.join(settings.hook_path, "vgpu", "containers")
    assert [
        (m["containerPath"], m["hostPath"].replace(f"{ref.uid}_gpu", "X"), "ro" in m["options"])
        for m in dra["mounts"]
    ] == [(m.container_path, m.host_path.replace("pod-uid_main", "X"), m.read_only) for m in resp.mounts]
    assert os.path.isdir(os.path.join(cache, f"{ref.uid}_gpu"))  # HAMi-core's per-claim cache dir, 0777


def test_prepare_is_idempotent_and_counts_a_claim_once(env):
    settings, claims, prep, _ = env
    a = claim(claims, "a", [("gpu-0", shared("60Gi", "60"))])
    first = prep.prepare([a], budget())[a.uid]
    spec = Path(cdi.spec_path(settings.cdi_dir, DRIVER, a.uid)).read_bytes()
    again = prep.prepare([a, a], budget())[a.uid]
    assert again == first and Path(cdi.spec_path(settings.cdi_dir, DRIVER, a.uid)).read_bytes() == spec
    b = claim(claims, "b", [("gpu-0", shared("20Gi", "40"))])  # 60+20 <= 80 GiB: fits once, not twice
    assert prep.prepare([b], budget())[b.uid].error == ""
    # a lost spec file is written again, byte for byte, on the next prepare
    os.unlink(cdi.spec_path(settings.cdi_dir, DRIVER, a.uid))
    prep.prepare([a], budget())
    assert Path(cdi.spec_path(settings.cdi_dir, DRIVER, a.uid)).read_bytes() == spec


def test_over_commit_and_exclusive_mig_are_refused_and_write_nothing(env):
    settings, claims, prep, _ = env
    a = claim(claims, "a", [("gpu-0", shared("60Gi", "60"))])
    prep.prepare([a], budget())
    b = claim(claims, "b", [("gpu-0", shared("30Gi", "10"))])
    res = prep.prepare([b], budget())[b.uid]
    assert "refusing to over-commit GPU gpu-0" in res.error and "61440MiB/60% already prepared" in res.error
    assert not os.path.exists(cdi.spec_path(settings.cdi_dir, DRIVER, b.uid))
    assert b.uid not in Checkpoint(settings.checkpoint_path).load()
    m1 = claim(claims, "m1", [("gpu-2-mig-7-0", {})])
    m2 = claim(claims, "m2", [("gpu-2-mig-7-0", {})])
    out = prep.prepare([m1, m2], budget())  # the same MIG instance twice in one call
    assert out[m1.uid].error == "" and "exclusive and already prepared" in out[m2.uid].error
    edits = cdi.resolve(settings.cdi_dir, list(out[m1.uid].devices[0].cdi_ids))
    assert edits == {"env": {"NVIDIA_VISIBLE_DEVICES": "MIG-1111"}, "mounts": []}


@pytest.mark.parametrize(
    ("results", "pool", "allocated", "message"),
    [
        ([("gpu-0", shared("1Gi", "1"))], "gpu-9", True, "allocated to another node"),
        ([("gpu-0", shared("1Gi", "1"))], NODE, False, "is not allocated"),
        ([("gpu-7", shared("1Gi", "1"))], NODE, True, "device gpu-7 is not published by node gpu-1"),
        ([("gpu-0", shared("90Gi", "1"))], NODE, True, "consumed memory 90Gi of device gpu-0 is outside"),
        ([("gpu-0", shared("1Gi", "101"))], NODE, True, "consumed cores 101 of device gpu-0 are outside"),
        ([("gpu-0", shared("lots", "1"))], NODE, True, "not a Kubernetes quantity"),
    ],
)
def test_claims_we_must_not_prepare(env, results, pool, allocated, message):
    _settings, claims, prep, _ = env
    ref = claim(claims, "bad", results, pool=pool, allocated=allocated)
    assert message in prep.prepare([ref], budget())[ref.uid].error


def test_a_claim_without_consumed_capacity_gets_the_whole_gpu(env):
    settings, claims, prep, _ = env
    ref = claim(claims, "whole", [("gpu-1", {})])
    [d] = prep.prepare([ref], budget())[ref.uid].devices
    assert (d.memory_mib, d.cores) == (81920, 100)
    other = claim(claims, "other", [("gpu-1", shared("1Mi", "1"))])
    assert "over-commit" in prep.prepare([other], budget())[other.uid].error


def test_unknown_and_other_claims_are_errors_per_claim(env):
    _settings, claims, prep, _ = env
    good = claim(claims, "good", [("gpu-0", shared("1Gi", "1"))])
    gone = ClaimRef("team-a", "gone", "no-such-uid")
    out = prep.prepare([good, gone], budget())
    assert out[good.uid].error == "" and "not found" in out[gone.uid].error


def test_nothing_is_written_once_the_kubelet_was_answered(env):
    settings, claims, prep, _ = env
    ref = claim(claims, "late", [("gpu-0", shared("1Gi", "1"))])
    b = budget()
    b.answer_error()  # the deadline fired before the body got to its commit
    res = prep.prepare([ref], b)[ref.uid]
    assert "success write not started" in res.error
    assert not os.path.exists(cdi.spec_path(settings.cdi_dir, DRIVER, ref.uid))
    assert ref.uid not in prep.prepared and not os.path.exists(settings.checkpoint_path)


def test_a_write_that_loses_the_race_with_the_deadline_is_rolled_back(env, monkeypatch):
    settings, claims, prep, _ = env
    ref = claim(claims, "race", [("gpu-0", shared("1Gi", "1"))])
    b = budget()
    real = cdi.write_spec

    def slow_write(*args, **kw):
        path = real(*args, **kw)
        b.answer_error()  # the runner answered DEADLINE_EXCEEDED while we were writing
        return path

    monkeypatch.setattr(cdi, "write_spec", slow_write)
    with pytest.raises(LateCommit):
        prep.prepare([ref], b)
    assert not os.path.exists(cdi.spec_path(settings.cdi_dir, DRIVER, ref.uid))
    assert ref.uid not in Checkpoint(settings.checkpoint_path).load() and ref.uid not in prep.prepared


def test_unprepare_is_idempotent_and_the_checkpoint_survives_restarts(env):
    settings, claims, prep, _ = env
    a = claim(claims, "a", [("gpu-0", shared("10Gi", "10"))])
    b = claim(claims, "b", [("gpu-0", shared("10Gi", "10"))])
    prep.prepare([a, b], budget())
    again = Preparer(settings, claims, prep.devices, Checkpoint(settings.checkpoint_path))  # driver restart
    assert set(again.prepared) == {a.uid, b.uid}
    assert again.consumed()["gpu-0"] == (20480, 20, 2)
    assert again.unprepare([a, ClaimRef("x", "never", "never-prepared")], budget()) == {
        a.uid: "",
        "never-prepared": "",
    }
    assert again.unprepare([a], budget()) == {a.uid: ""}
    assert not os.path.exists(cdi.spec_path(settings.cdi_dir, DRIVER, a.uid))
    assert set(Checkpoint(settings.checkpoint_path).load()) == {b.uid}


def test_a_corrupt_checkpoint_is_moved_aside(env):
    settings, claims, prep, _ = env
    a = claim(claims, "a", [("gpu-0", shared("10Gi", "10"))])
    prep.prepare([a], budget())
    doc = json.loads(Path(settings.checkpoint_path).read_text())
    doc["claims"][a.uid]["devices"][0]["memory_mib"] = 1  # changed behind our back: checksum mismatch
    Path(settings.checkpoint_path).write_text(json.dumps(doc))
    cp = Checkpoint(settings.checkpoint_path)
    assert cp.load() == {} and "checksum mismatch" in (cp.error or "")
    assert os.path.exists(settings.checkpoint_path + ".corrupt") and not os.path.exists(
        settings.checkpoint_path
    )
