"""NVML per-process memory and per-GPU usage for the leak analysis and the monitor's host metrics.

A thin adapter over ``hami_agent.nvml.collect_usage``: NVML is read by the agent's one supervised NVML
worker (a child process with per-call deadlines; a hung call is killed and abandoned, never waited for),
so this module has no child-process code of its own. Errors carry the nvml layer's wording
(``nvml Init err: ...``, ``nvml call <fn> did not return within <N>s (NVML is hung ...)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hami_agent.nvml.client import collect_usage
from hami_agent.nvml.errors import NvmlError
from hami_agent.nvml.usage import GpuUsage
from hami_agent.shrreg.analysis import NvmlProcess

DEFAULT_TIMEOUT_S = 10.0

# Kept as names for callers: the probe raises the nvml layer's errors (NvmlTimeout is a subclass).
NvmlProbeError = NvmlError

__all__ = ["DEFAULT_TIMEOUT_S", "GpuUsage", "NvmlProbeError", "ProbeResult", "probe"]


@dataclass(frozen=True)
class ProbeResult:
    gpus: list[GpuUsage]
    processes: list[NvmlProcess]


def probe(lib_path: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> ProbeResult:
    """Usage of every GPU and its compute processes (library: ``lib_path``, else ``$HAMI_NVML_LIBRARY``).

    All or nothing: a GPU NVML could not identify (e.g. lost) fails the probe, because the leak analysis
    would read its missing process rows as "NVML shows no memory" (a false internal leak)."""
    usage = collect_usage(lib_path, timeout_s=timeout_s)
    if usage.problems:
        raise NvmlProbeError("nvml usage incomplete: " + "; ".join(usage.problems))
    return ProbeResult(
        gpus=list(usage.gpus),
        processes=[NvmlProcess(gpu_uuid=p.gpu_uuid, pid=p.pid, used_bytes=p.used_bytes)
                   for p in usage.processes],
    )
