import pytest

from hami_agent.deviceplugin.devices import (
    KIND_MIG,
    KIND_SHARED,
    PlanError,
    endpoint_for,
    physical_id,
    plan_resources,
)
from hami_agent.deviceplugin.settings import PluginSettings, SettingsError
from tests.unit.deviceplugin.fakes import FakeGpu, FakeMig, FakeSnapshot, full_gpus, gpu_uuid, h20_mig_mixed

pytestmark = pytest.mark.unit


def settings(**kw):
    return PluginSettings(node_name="n1", **kw)


def test_full_gpus_become_replicas_named_uuid_dash_i():
    plans = plan_resources(FakeSnapshot(gpus=full_gpus(2)), settings(device_split_count=3))
    assert list(plans) == ["nvidia.com/gpu"]
    plan = plans["nvidia.com/gpu"]
    assert plan.endpoint == "nvidia-gpu.sock" and plan.kind == KIND_SHARED
    assert [d.id for d in plan.devices] == [f"{gpu_uuid(g)}-{i}" for g in range(2) for i in range(3)]
    assert all(d.healthy for d in plan.devices)
    assert all(len(d.id) <= 63 for d in plan.devices)


def test_mixed_strategy_one_resource_per_mig_profile_seed_003_node():
    plans = plan_resources(FakeSnapshot(gpus=h20_mig_mixed()), settings(mig_strategy="mixed"))
    counts = {name: len(p.devices) for name, p in plans.items()}
    assert counts == {
        "nvidia.com/gpu": 50,
        "nvidia.com/mig-1g.12gb": 6,
        "nvidia.com/mig-1g.24gb": 3,
        "nvidia.com/mig-3g.48gb": 3,
    }
    assert plans["nvidia.com/mig-3g.48gb"].endpoint == "nvidia-mig-3g.48gb.sock"
    assert plans["nvidia.com/mig-3g.48gb"].kind == KIND_MIG
    assert all(d.id.startswith("MIG-") for d in plans["nvidia.com/mig-1g.12gb"].devices)


def test_none_strategy_hides_mig_gpus_and_single_strategy_requires_uniform_nodes():
    plans = plan_resources(FakeSnapshot(gpus=h20_mig_mixed()), settings(mig_strategy="none"))
    assert list(plans) == ["nvidia.com/gpu"] and len(plans["nvidia.com/gpu"].devices) == 50
    with pytest.raises(PlanError, match="use --mig-strategy mixed"):
        plan_resources(FakeSnapshot(gpus=h20_mig_mixed()), settings(mig_strategy="single"))


def test_single_strategy_advertises_mig_devices_as_gpu_when_one_profile():
    gpus = tuple(
        FakeGpu(
            i,
            gpu_uuid(i),
            mig_enabled=True,
            mig_devices=(FakeMig(0, f"MIG-{i}a", "1g.12gb"), FakeMig(1, f"MIG-{i}b", "1g.12gb")),
        )
        for i in range(2)
    )
    plan = plan_resources(FakeSnapshot(gpus=gpus), settings(mig_strategy="single"))["nvidia.com/gpu"]
    assert plan.kind == KIND_MIG and [d.id for d in plan.devices] == ["MIG-0a", "MIG-0b", "MIG-1a", "MIG-1b"]
    two_types = (
        FakeGpu(
            0,
            gpu_uuid(0),
            mig_enabled=True,
            mig_devices=(FakeMig(0, "MIG-a", "1g.12gb"), FakeMig(1, "MIG-b", "3g.48gb")),
        ),
    )
    with pytest.raises(PlanError, match="more than one MIG device type"):
        plan_resources(FakeSnapshot(gpus=two_types), settings(mig_strategy="single"))


def test_mps_mode_refuses_mig():
    with pytest.raises(SettingsError, match="MPS sharing is not supported on MIG devices"):
        settings(mode="mps", mig_strategy="mixed").validate()


def test_stuck_nvml_marks_every_device_unhealthy_and_unhealthy_gpu_only_its_replicas():
    snap = FakeSnapshot(status="stuck", stuck_call="nvmlInit_v2", gpus=full_gpus(2))
    plan = plan_resources(snap, settings(device_split_count=2))["nvidia.com/gpu"]
    assert not any(d.healthy for d in plan.devices)
    assert "nvmlInit_v2" in plan.devices[0].reason
    gpus = (FakeGpu(0, gpu_uuid(0)), FakeGpu(1, gpu_uuid(1), healthy=False, unhealthy_reason="xid 79"))
    plan = plan_resources(FakeSnapshot(gpus=gpus), settings(device_split_count=2))["nvidia.com/gpu"]
    assert [d.healthy for d in plan.devices] == [True, True, False, False]


def test_filter_devices_and_empty_inventory_still_plans_main_resource():
    plan = plan_resources(
        FakeSnapshot(gpus=full_gpus(3)),
        settings(device_split_count=1, filter_uuids=(gpu_uuid(0),), filter_indexes=(2,)),
    )
    assert [d.physical_uuid for d in plan["nvidia.com/gpu"].devices] == [gpu_uuid(1)]
    empty = plan_resources(FakeSnapshot(status="starting"), settings())
    assert list(empty) == ["nvidia.com/gpu"] and empty["nvidia.com/gpu"].devices == ()


def test_physical_id_and_endpoint_names():
    assert physical_id(f"{gpu_uuid(1)}-7") == gpu_uuid(1)
    assert physical_id(f"{gpu_uuid(1)}::3") == gpu_uuid(1)
    assert (
        physical_id("MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030") == "MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030"
    )
    assert endpoint_for("nvidia.com/gpu") == "nvidia-gpu.sock"
    assert endpoint_for("nvidia.com/mig-1g.10gb.me") == "nvidia-mig-1g.10gb.me.sock"


def test_settings_validation_names_the_flag():
    with pytest.raises(SettingsError, match="--api-timeout"):
        settings(rpc_deadline_s=1.0, api_timeout_s=1.0).validate()
    with pytest.raises(SettingsError, match="deviceSplitCount"):
        settings(device_split_count=0).validate()
