"""Inventory model: HAMi type normalisation and nvidia-smi MIG profile naming."""

from __future__ import annotations

import pytest

from hami_agent.nvml.model import (
    Gpu,
    MigDevice,
    Snapshot,
    device_type,
    mig_memory_gb,
    mig_profile_name,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA H20", "NVIDIA H20"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
    ("Tesla V100-PCIE-32GB", "NVIDIA-Tesla V100-PCIE-32GB"),
    ("A100", "NVIDIA-A100"),
    ("nvidia lowercase", "NVIDIA-nvidia lowercase"),  # HAMi's prefix test is case-sensitive
])
def test_device_type(name: str, expected: str) -> None:
    assert device_type(name) == expected


@pytest.mark.parametrize(("total", "mig", "gb"), [
    (97871, 47488, 48),   # H20 3g.48gb
    (97871, 23552, 24),   # H20 1g.24gb
    (97871, 11776, 12),   # H20 1g.12gb
    (97871, 95232, 96),   # H20 7g.96gb
    (81920, 9728, 10),    # A100-80GB 1g.10gb
    (81920, 40192, 40),   # A100-80GB 3g.40gb
    (40960, 4864, 5),     # A100-40GB 1g.5gb
    (40960, 19968, 20),   # A100-40GB 3g.20gb
    (81559, 80896, 80),   # H100 80GB 7g.80gb
])
def test_mig_memory_gb(total: int, mig: int, gb: int) -> None:
    assert mig_memory_gb(total, mig) == gb


def test_mig_memory_gb_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        mig_memory_gb(0, 100)


def test_mig_profile_name_keeps_media_extension_suffix() -> None:
    assert mig_profile_name(1, 97871, 11776, "NVIDIA H20 MIG 1g.12gb+me") == "1g.12gb+me"
    assert mig_profile_name(3, 97871, 47488, "NVIDIA H20 MIG 3g.48gb") == "3g.48gb"
    # a name that disagrees with the numbers does not override them
    assert mig_profile_name(3, 97871, 47488, "NVIDIA H20 MIG 2g.24gb+me") == "3g.48gb"


def test_mig_profile_name_without_board_memory() -> None:
    # unified-memory boards (memory NOT_SUPPORTED): trust NVML's device name, else approximate
    assert mig_profile_name(1, None, 11264, "NVIDIA GH200 480GB MIG 1g.12gb") == "1g.12gb"
    assert mig_profile_name(1, None, 11264, None) == "1g.11gb"


def _gpu(**kw) -> Gpu:
    base = dict(index=0, uuid="GPU-a", name="NVIDIA H20", type="NVIDIA H20", memory_mib=97871, numa=0,
                pci_bus_id="00000000:0F:00.0", mig_capable=True, mig_enabled=False, mig_pending=False)
    base.update(kw)
    return Gpu(**base)


def test_with_health_sets_and_clears_reason() -> None:
    bad = _gpu().with_health(False, "xid-79")
    assert (bad.healthy, bad.unhealthy_reason) == (False, "xid-79")
    good = bad.with_health(True, "ignored")
    assert (good.healthy, good.unhealthy_reason) == (True, None)


def test_snapshot_same_content_ignores_time_and_generation() -> None:
    mig = MigDevice(index=0, uuid="MIG-x", profile="1g.12gb", memory_mib=11776, gi_id=9, ci_id=0)
    a = Snapshot(status="ok", gpus=(_gpu(mig_devices=(mig,)),), taken_at=1.0, generation=1)
    b = Snapshot(status="ok", gpus=(_gpu(mig_devices=(mig,)),), taken_at=2.0, generation=7)
    assert a.same_content(b)
    assert not a.same_content(Snapshot(status="stuck", gpus=a.gpus))
    assert a.gpu_by_uuid("GPU-a") == a.gpus[0] and a.gpu_by_uuid("GPU-b") is None
