"""From NVML snapshots to published devices: attributes, capacities, MIG, partitions, health, and slices the
simulated API server's ResourceSlice validation accepts."""

import pytest

from hami_agent.config import DraPartition
from hami_agent.deviceplugin.health import HealthTracker
from hami_agent.dra.devices import (
    architecture,
    build_devices,
    cuda_version,
    semver_of,
    slice_device,
    taint_value,
)
from hami_agent.dra.driver import apply_health
from hami_agent.nvml.model import Gpu, MigDevice, Snapshot
from tests.sim.apiserver_resource import slice_strategy
from tests.sim.apiserver_store import ApiError

pytestmark = pytest.mark.unit

ALL = DraPartition(all=True)


def gpu(i, name="NVIDIA A100-SXM4-80GB", mem=81920, mig=(), healthy=True, reason=None, numa=0):
    return Gpu(
        index=i,
        uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
        name=name,
        type=name,
        memory_mib=mem,
        numa=numa,
        pci_bus_id=f"00000000:{i + 7:02X}:00.0",
        mig_capable=bool(mig),
        mig_enabled=bool(mig),
        mig_pending=False,
        mig_devices=tuple(mig),
        healthy=healthy,
        unhealthy_reason=reason,
    )


def snap(*gpus, status="ok", gen=1):
    return Snapshot(
        status=status,
        gpus=tuple(gpus),
        driver_version="570.172.08",
        cuda_driver_version=12080,
        generation=gen,
    )


def test_full_gpus_are_shared_with_consumable_memory_and_cores():
    devs = build_devices(snap(gpu(0), gpu(1)), ALL)
    assert [d.name for d in devs] == ["gpu-0", "gpu-1"]
    d = devs[0]
    assert d.shared and d.memory_mib == 81920 and d.cores == 100
    attrs = d.attributes
    assert attrs["uuid"] == {"string": d.uuid}
    assert attrs["driverVersion"] == {"version": "570.172.8"}  # 570.172.08 is not semver: leading zero
    assert attrs["cudaDriverVersion"] == {"version": "12.8.0"}
    assert attrs["architecture"] == {"string": "Ampere"} and attrs["cudaComputeCapability"] == {
        "version": "8.0.0"
    }
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}
    entry = slice_device(d, "gpu.hami.io")
    assert entry["allowMultipleAllocations"] is True
    assert entry["capacity"]["memory"] == {
        "value": "81920Mi",
        "requestPolicy": {
            "default": "81920Mi",
            "validRange": {"min": "1Mi", "max": "81920Mi", "step": "1Mi"},
        },
    }
    assert entry["capacity"]["cores"]["requestPolicy"]["default"] == "100"
    assert "taints" not in entry


def test_memory_scaling_and_unified_memory():
    assert build_devices(snap(gpu(0)), ALL, memory_scaling=1.5)[0].memory_mib == 122880
    notes: list[str] = []
    assert build_devices(snap(gpu(0, mem=None)), ALL, notes=notes) == []
    assert "preConfiguredDeviceMemory" in notes[0]
    assert build_devices(snap(gpu(0, mem=None)), ALL, pre_configured_memory_mib=96000)[0].memory_mib == 96000


def test_mig_instances_are_exclusive_devices_and_the_parent_is_not_published():
    migs = (
        MigDevice(0, "MIG-aaaa", "3g.48gb", 47488, 2, 0),
        MigDevice(1, "MIG-bbbb", "1g.24gb", 23552, 5, 0),
    )
    devs = build_devices(snap(gpu(0, name="NVIDIA H20", mem=97871, mig=migs), gpu(1, name="NVIDIA H20")), ALL)
    assert [d.name for d in devs] == ["gpu-0-mig-2-0", "gpu-0-mig-5-0", "gpu-1"]
    mig = devs[1]
    assert not mig.shared and mig.kind == "mig" and mig.uuid == "MIG-bbbb"
    assert mig.attributes["profile"] == {"string": "1g.24gb"}
    assert mig.attributes["parentUUID"] == {"string": gpu(0).uuid}
    entry = slice_device(mig, "gpu.hami.io")
    assert "allowMultipleAllocations" not in entry and entry["capacity"] == {"memory": {"value": "23552Mi"}}
    assert mig.attributes["architecture"] == {"string": "Hopper"}


def test_partition_decides_which_gpus_are_published():
    s = snap(gpu(0), gpu(1), gpu(2))
    assert [d.name for d in build_devices(s, DraPartition(indexes=(1, 2)))] == ["gpu-1", "gpu-2"]
    assert [d.name for d in build_devices(s, DraPartition(uuids=(gpu(0).uuid,)))] == ["gpu-0"]
    assert build_devices(s, DraPartition()) == []


def test_unhealthy_and_stuck_become_taints():
    devs = build_devices(snap(gpu(0, healthy=False, reason="xid-79"), gpu(1)), ALL)
    assert slice_device(devs[0], "gpu.hami.io")["taints"] == [
        {"key": "gpu.hami.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]
    assert slice_device(devs[0], "gpu.hami.io", "NoExecute")["taints"][0]["effect"] == "NoExecute"
    stuck = build_devices(snap(gpu(0), status="stuck"), ALL)
    assert not stuck[0].healthy and stuck[0].reason == "nvml-stuck"
    paused = slice_device(build_devices(snap(gpu(0)), ALL)[0], "gpu.hami.io", paused=True)
    assert paused["taints"] == [
        {"key": "gpu.hami.io/reconfiguring", "value": "mig-apply-lock", "effect": "NoSchedule"}
    ]


def test_recovery_needs_a_fresh_probe_and_the_quiet_period():
    now = [100.0]
    tracker = HealthTracker(30.0, clock=lambda: now[0])
    bad = apply_health(tracker, build_devices(snap(gpu(0, healthy=False, reason="gpu-lost")), ALL), 1, True)
    assert not bad[0].healthy
    now[0] += 10
    early = apply_health(tracker, build_devices(snap(gpu(0)), ALL), 2, True)
    assert not early[0].healthy and early[0].reason.startswith("recovering")
    now[0] += 25
    assert apply_health(tracker, build_devices(snap(gpu(0)), ALL), 3, True)[0].healthy


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H20", ("Hopper", "9.0")),
        ("NVIDIA H200", ("Hopper", "9.0")),
        ("NVIDIA A10", ("Ampere", "8.6")),
        ("NVIDIA A100-SXM4-80GB", ("Ampere", "8.0")),
        ("NVIDIA L40S", ("Ada Lovelace", "8.9")),
        ("NVIDIA GH200 480GB", ("Hopper", "9.0")),
        ("Tesla T4", ("Turing", "7.5")),
        ("NVIDIA RTX A6000", None),
    ],
)
def test_architecture_from_product_name(name, expected):
    assert architecture(name) == expected


def test_versions_and_taint_values():
    assert semver_of("550.54") == "550.54.0" and semver_of("570.172.08") == "570.172.8"
    assert semver_of("abc") is None and cuda_version(12040) == "12.4.0" and cuda_version(None) is None
    assert taint_value("nvml-stuck nvmlInit: did not return!") == "nvml-stuck-nvmlInit-did-not-return"
    assert len(taint_value("x" * 100)) == 63 and taint_value("") == "unhealthy"


def test_slices_pass_the_api_servers_validation():
    migs = (MigDevice(0, "MIG-aaaa", "3g.48gb", 47488, 2, 0),)
    devs = build_devices(
        snap(gpu(0, mig=migs, name="NVIDIA H20", mem=97871), gpu(1, healthy=False, reason="xid-79")), ALL
    )
    obj = {
        "metadata": {"name": "n-gpu.hami.io-0"},
        "spec": {
            "driver": "gpu.hami.io",
            "nodeName": "n",
            "pool": {"name": "n", "generation": 0, "resourceSliceCount": 1},
            "devices": [slice_device(d, "gpu.hami.io") for d in devs],
        },
    }
    slice_strategy(None, obj, None, False)  # raises ApiError on anything the real server would refuse
    bad = {
        **obj,
        "spec": {
            **obj["spec"],
            "devices": [
                dict(
                    slice_device(devs[1], "gpu.hami.io"),
                    attributes={"driverVersion": {"version": "570.172.08"}},
                )
            ],
        },
    }
    with pytest.raises(ApiError, match="must be a string compatible with semver.org spec 2.0.0"):
        slice_strategy(None, bad, None, False)
