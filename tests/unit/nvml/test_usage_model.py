"""build_usage: the worker's usage data -> Usage (pure, no NVML)."""

from __future__ import annotations

import pytest

from hami_agent.nvml.usage import GpuUsage, ProcessUsage, build_usage

pytestmark = pytest.mark.unit


def test_gpus_and_processes_are_modelled() -> None:
    data = {
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100", "memory_used_bytes": 2048,
             "utilization": 37},
            {"index": 1, "uuid": "GPU-b", "name": "NVIDIA H20", "memory_used_bytes": None,
             "utilization": None},
        ],
        "processes": [
            {"gpu_uuid": "GPU-a", "pid": 10, "used_bytes": 1024},
            {"gpu_uuid": "GPU-b", "pid": 11, "used_bytes": None},
        ],
    }
    u = build_usage(data)
    assert u.gpus == (GpuUsage(0, "GPU-a", "NVIDIA H100", 2048, 37),
                      GpuUsage(1, "GPU-b", "NVIDIA H20", None, None))
    assert u.processes == (ProcessUsage("GPU-a", 10, 1024), ProcessUsage("GPU-b", 11, None))
    assert u.problems == ()


def test_gpu_without_identity_is_left_out_and_named() -> None:
    data = {
        "gpus": [
            {"index": 0, "error": "GPU is lost"},
            {"index": 1, "uuid": "GPU-b", "name": "NVIDIA H20", "memory_used_bytes": 5, "utilization": 0},
        ],
        "processes": [],
    }
    u = build_usage(data)
    assert [g.index for g in u.gpus] == [1]
    assert u.problems == ("GPU 0: GPU is lost; usage not listed",)
