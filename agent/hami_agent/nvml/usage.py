"""Per-GPU and per-process usage (memory used, utilization, compute processes), read by an NVML worker
(``NvmlClient.usage``): the same child process, per-call deadlines and error wording as the inventory.
Used by the leak analysis (``shrreg``) and the monitor's host metrics."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami_agent import log

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    name: str  # NVML name, e.g. "NVIDIA H20"
    memory_used_bytes: int | None  # None: GetMemoryInfo NOT_SUPPORTED (unified memory)
    utilization: int | None  # utilization.gpu percent; None: NOT_SUPPORTED (MIG enabled)


@dataclass(frozen=True)
class ProcessUsage:
    """One row of nvmlDeviceGetComputeRunningProcesses on a full-GPU handle (host PID)."""

    gpu_uuid: str
    pid: int
    used_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE (e.g. no permission, some MIG setups)


@dataclass(frozen=True)
class Usage:
    gpus: tuple[GpuUsage, ...]
    processes: tuple[ProcessUsage, ...]
    problems: tuple[str, ...] = ()  # GPUs left out, each with NVML's reason (e.g. "GPU is lost")


def build_usage(data: Mapping[str, Any]) -> Usage:
    """Model of the worker's ``usage`` data; a GPU NVML could not identify is left out and named."""
    gpus: list[GpuUsage] = []
    problems: list[str] = []
    for raw in data.get("gpus", []):
        index = int(raw["index"])
        if raw.get("error") or "uuid" not in raw:
            problems.append(f"GPU {index}: {raw.get('error') or 'NVML gave no details'}; usage not listed")
            log.v(logger, 3, "%s", problems[-1])  # callers report problems (raise or warn once)
            continue
        mem, util = raw.get("memory_used_bytes"), raw.get("utilization")
        gpus.append(GpuUsage(index=index, uuid=str(raw["uuid"]), name=str(raw["name"]),
                             memory_used_bytes=None if mem is None else int(mem),
                             utilization=None if util is None else int(util)))
    procs = tuple(
        ProcessUsage(gpu_uuid=str(p["gpu_uuid"]), pid=int(p["pid"]),
                     used_bytes=None if p.get("used_bytes") is None else int(p["used_bytes"]))
        for p in data.get("processes", [])
    )
    return Usage(gpus=tuple(gpus), processes=procs, problems=tuple(problems))
