"""collect_usage (and the shrreg probe adapter over it) against the simulated NVML library."""

from __future__ import annotations

import time

import pytest

from hami_agent.nvml import NvmlError, NvmlTimeout, ProcessUsage, collect_usage
from hami_agent.shrreg.nvmlprobe import NvmlProbeError, probe
from tests.gpusim.fixtures import GpusimNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MIB = 1024 * 1024


def test_usage_and_processes_on_full_gpus(gpusim_factory) -> None:
    node: GpusimNode = gpusim_factory("a100-80gb-x8")  # MIG off: utilization supported

    def edit(s: dict) -> None:
        s["gpus"][0].update(memory_used_mib=7100, utilization_gpu=63,
                            processes=[{"pid": 4242, "used_memory_mib": 5000, "name": "python"},
                                       {"pid": 4343, "used_memory_mib": 2100, "name": "python"}])
        s["gpus"][2].update(memory_used_mib=300, utilization_gpu=5,
                            processes=[{"pid": 5151, "used_memory_mib": 300, "name": "python"}])

    node.update(edit)
    st = node.state()
    u = collect_usage(timeout_s=20)
    assert [g.uuid for g in u.gpus] == [g["uuid"] for g in st["gpus"]]
    assert all(g.name == st["gpus"][g.index]["name"] for g in u.gpus)
    g0, g2 = u.gpus[0], u.gpus[2]
    assert (g0.memory_used_bytes, g0.utilization) == (7100 * MIB, 63)
    assert (g2.memory_used_bytes, g2.utilization) == (300 * MIB, 5)
    assert set(u.processes) == {
        ProcessUsage(st["gpus"][0]["uuid"], 4242, 5000 * MIB),
        ProcessUsage(st["gpus"][0]["uuid"], 4343, 2100 * MIB),
        ProcessUsage(st["gpus"][2]["uuid"], 5151, 300 * MIB),
    }
    assert u.problems == ()


def test_utilization_not_supported_on_mig_gpus_and_mig_processes_on_the_full_gpu(gpusim_node) -> None:
    # h20-mig-mixed: GPUs 0-2 have MIG enabled -> utilization NOT_SUPPORTED -> None, the others a number
    st = gpusim_node.state()
    gi = st["gpus"][0]["mig"]["devices"][1]["gi_id"]
    gpusim_node.update(lambda s: s["gpus"][0].__setitem__(
        "processes", [{"pid": 777, "used_memory_mib": 1000, "name": "python", "gi_id": gi, "ci_id": 0}]))
    u = collect_usage(timeout_s=20)
    assert len(u.gpus) == 8
    assert [g.utilization is None for g in u.gpus] == [True] * 3 + [False] * 5
    assert all(g.memory_used_bytes is not None for g in u.gpus)
    # listed per full-GPU handle, as the old probe did: the MIG process appears under the parent GPU's UUID
    assert u.processes == (ProcessUsage(st["gpus"][0]["uuid"], 777, 1000 * MIB),)


def test_memory_not_supported_is_none(gpusim_factory) -> None:
    gpusim_factory("gh200-unified")
    u = collect_usage(timeout_s=20)
    assert u.gpus and all(g.memory_used_bytes is None for g in u.gpus)


@pytest.mark.parametrize("hung", ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetUtilizationRates"])
def test_hung_usage_call_is_a_timeout_naming_the_call(gpusim_factory, hung: str) -> None:
    node = gpusim_factory("h100-80gb-x4")
    node.set_fault(hang_functions=[hung])
    t0 = time.monotonic()
    with pytest.raises(NvmlTimeout, match=f"nvml call {hung} did not return within 2s") as info:
        collect_usage(timeout_s=2.0)
    assert time.monotonic() - t0 < 4.0  # deadline + at most the 0.5 s stop grace, never a hang
    assert info.value.call == hung
    assert info.value.pid is not None


def test_init_error_keeps_the_seed_wording(gpusim_factory) -> None:
    node = gpusim_factory("h100-80gb-x4")
    node.update(lambda s: s.__setitem__("driver_loaded", False))
    with pytest.raises(NvmlError, match="nvml Init err: Driver Not Loaded") as info:
        collect_usage(timeout_s=20)
    assert info.value.call == "nvmlInit"


def test_lost_gpu_is_named_and_fails_the_probe(gpusim_factory) -> None:
    node = gpusim_factory("h100-80gb-x4")
    node.set_lost(1)
    u = collect_usage(timeout_s=20)
    assert [g.index for g in u.gpus] == [0, 2, 3]
    assert len(u.problems) == 1 and u.problems[0].startswith("GPU 1: ") and "lost" in u.problems[0].lower()
    # the leak analysis must not read the lost GPU's missing rows as "NVML shows no memory"
    with pytest.raises(NvmlProbeError, match="nvml usage incomplete: GPU 1: "):
        probe(timeout_s=20)
