"""Worker inventory -> model (pure), including lost GPUs and sticky XID verdicts."""

from __future__ import annotations

import pytest

from hami_agent.nvml.inventory import build_snapshot

pytestmark = pytest.mark.unit


def raw_gpu(index: int, **kw) -> dict:
    g = {"index": index, "uuid": f"GPU-{index}", "name": "Tesla T4",
         "pci_bus_id": f"00000000:{index:02X}:00.0", "memory_mib": 15360, "numa": None,
         "mig_capable": False, "mig_enabled": False, "mig_pending": False, "mig_devices": []}
    g.update(kw)
    return g


def test_fields_and_type() -> None:
    snap = build_snapshot({"driver_version": "550.90.07", "cuda_driver_version": 12040,
                           "gpus": [raw_gpu(0), raw_gpu(1, numa=1)]}, generation=3, taken_at=5.0)
    assert snap.status == "ok" and snap.generation == 3 and snap.taken_at == 5.0
    assert [g.type for g in snap.gpus] == ["NVIDIA-Tesla T4"] * 2
    assert [g.numa for g in snap.gpus] == [None, 1]
    assert snap.driver_version == "550.90.07" and snap.cuda_driver_version == 12040


def test_mig_devices() -> None:
    mig = {"index": 2, "uuid": "MIG-x", "profile": "1g.12gb", "memory_mib": 11776, "gi_id": 9,
           "ci_id": 0}
    snap = build_snapshot({"gpus": [raw_gpu(0, mig_capable=True, mig_enabled=True, mig_devices=[mig])]})
    (m,) = snap.gpus[0].mig_devices
    got = (m.index, m.uuid, m.profile, m.memory_mib, m.gi_id, m.ci_id)
    assert got == (2, "MIG-x", "1g.12gb", 11776, 9, 0)


def test_lost_gpu_keeps_identity_from_previous_snapshot() -> None:
    before = build_snapshot({"gpus": [raw_gpu(0), raw_gpu(1)]})
    after = build_snapshot({"gpus": [raw_gpu(0), {"index": 1, "lost": True}]}, previous=before)
    assert after.gpus[1].uuid == "GPU-1"
    assert (after.gpus[1].healthy, after.gpus[1].unhealthy_reason) == (False, "gpu-lost")
    assert after.problems == ()


def test_lost_gpu_never_seen_is_a_problem_not_a_device() -> None:
    snap = build_snapshot({"gpus": [raw_gpu(0), {"index": 1, "lost": True}]})
    assert [g.index for g in snap.gpus] == [0]
    assert snap.problems == ("GPU 1 is lost (NVML: GPU is lost); its UUID is unknown, not listed",)


def test_per_gpu_nvml_error() -> None:
    snap = build_snapshot({"gpus": [raw_gpu(0, error="Unknown Error")]})
    assert (snap.gpus[0].healthy, snap.gpus[0].unhealthy_reason) == (False, "nvml-error")
    snap = build_snapshot({"gpus": [{"index": 0, "error": "Unknown Error"}]})
    assert snap.gpus == () and "GPU 0: Unknown Error" in snap.problems[0]


def test_sticky_xid_marks_and_memory_not_supported() -> None:
    snap = build_snapshot({"gpus": [raw_gpu(0, memory_mib=None, memory_not_supported=True), raw_gpu(1)]},
                          xid_marks={"GPU-1": "xid-79"})
    assert snap.gpus[0].memory_mib is None and snap.memory_not_supported == (0,)
    assert (snap.gpus[1].healthy, snap.gpus[1].unhealthy_reason) == (False, "xid-79")
