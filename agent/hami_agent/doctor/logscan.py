"""Grep-style scans of component logs for the error lines the seeds name (data tables, one regex each).

Each table maps a short key to a regex; ``scan`` returns, per key, the matching lines (capped), which
become facts ``<prefix>.<key>`` whose evidence lines are the log lines themselves. ``Scanner`` takes one
line at a time, so a log of any size is scanned in bounded memory (counts, and at most
``MAX_LINES_PER_KEY`` lines per key).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from hami_agent.doctor.model import Facts

MAX_LINES_PER_KEY = 5

# The device plugin's Allocate refusals (deviceplugin/owner.py, allocator.py, capacity.py; a refusal writes
# nothing). The same text is in the plugin's log, in the kubelet's ("Allocate failed due to rpc error: code
# = Unknown desc = <message>, which is unexpected") and in the pod's UnexpectedAdmissionError event.
ALLOCATE_REFUSAL_PATTERNS: dict[str, str] = {
    "refused_no_lock": r"no binding pod found on node \S+: no node lock",
    "refused_lock_other": r"no binding pod found on node \S+: the node lock names",
    "refused_ambiguous": r"ambiguous admission on node",
    "refused_overcommit": (r"refusing to over-commit GPU|is not registered in hami\.io/node-nvidia-register "
                           r"of node|refusing an allocation the scheduler did not make"),
    "refused_kubelet_choice": r"the kubelet chose .* but the scheduler allocated",
}

# Device plugin log (seed 000 §1.3, §4.4, §7; seed 003 §5.2; our NvmlTimeout wording).
PLUGIN_PATTERNS: dict[str, str] = {
    "nvml_init_err": r"nvml Init err",
    "nvml_device_count_err": r"nvml GetDeviceCount err",
    "nvml_hung": r"did not return within [0-9.]+s \(NVML is hung|NVML worker is stuck|nvml.* (hung|stuck)",
    "patch_node_error": r"patch node error",
    "get_node_error": r"get node error",
    "device_number_mismatch": r"device number not matched",
    "unknown_device": r"invalid allocation request .*unknown device",
    # ours: the API did not answer within the RPC's budget; HAMi's plugin: its GetPendingPod found no pod
    "pending_pod_missing": r"failed to get pending pod|no binding pod found on node",
    "decode_pod_devices": r"failed to decode pod devices",
    "grpc_crash": r"GRPC server has repeatedly crashed",
    "registered_ok": r"Successfully registered annotation",
    "mps_binary_missing": r"\"?nvidia-cuda-mps-control\"?: executable file not found",
    "memory_not_supported": r"GetMemoryInfo not supported",
    **ALLOCATE_REFUSAL_PATTERNS,
}

# Kubelet log lines besides the stall detector's (seed 000 §4.4: Allocate errors reach the kubelet).
KUBELET_PATTERNS: dict[str, str] = {
    "allocate_failed": r"Allocate failed due to|UnexpectedAdmissionError",
    "device_number_mismatch": r"device number not matched",
    "plugin_registered": r"Registered endpoint|Got registration request from device plugin",
    **ALLOCATE_REFUSAL_PATTERNS,
}

# HAMi-core lines in a container's log (seed 002; reference hami-core.md §7).
HAMI_CORE_PATTERNS: dict[str, str] = {
    "oom": r"Device \d+ OOM|cuMemoryAllocate failed|CUDA_ERROR_OUT_OF_MEMORY|out of memory",
    "lock_timeout": r"Lock shrreg timeout|Fail to lock shrreg|Cannot acquire lock after 5 minutes",
    "dead_owner": r"Owner \d+ is dead|Owner proc dead",
    "set_task_pid_failed": r"SET_TASK_PID FAILED",
    "version_mismatch": r"is different from the file's version number|[Vv]ersion mismatch",
    "cuinit_failed": r"cuInit failed",
    "limit_inconsistency": r"Limit inconsistency detected",
    "initialized": r"\[HAMI-core (Msg|Info)[^]]*\]: (Initializing|Initialized)",
}

_COMPILED: dict[str, re.Pattern[str]] = {}


def _rx(pattern: str) -> re.Pattern[str]:
    if pattern not in _COMPILED:
        _COMPILED[pattern] = re.compile(pattern)
    return _COMPILED[pattern]


@dataclass
class ScanResult:
    source: str
    lines_total: int = 0
    matches: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


class Scanner:
    """Incremental ``scan``: ``feed`` each line, read ``result``."""

    def __init__(self, patterns: dict[str, str], source: str) -> None:
        self.result = ScanResult(source)
        self._compiled = {k: _rx(p) for k, p in patterns.items()}

    def feed(self, raw: str) -> None:
        out = self.result
        out.lines_total += 1
        for key, rx in self._compiled.items():
            if rx.search(raw):
                out.counts[key] = out.counts.get(key, 0) + 1
                kept = out.matches.setdefault(key, [])
                if len(kept) < MAX_LINES_PER_KEY:
                    kept.append(f"{out.source}:{out.lines_total}: {raw.rstrip()[:2000]}")


def scan(lines: Iterable[str], patterns: dict[str, str], source: str) -> ScanResult:
    scanner = Scanner(patterns, source)
    for raw in lines:
        scanner.feed(raw)
    return scanner.result


def to_facts(result: ScanResult, prefix: str, patterns: dict[str, str], facts: Facts) -> None:
    """``<prefix>.<key>`` = number of matching lines (0 when none), with the lines as evidence."""
    facts.set(f"{prefix}.source", result.source)
    facts.set(f"{prefix}.lines", result.lines_total)
    for key in patterns:
        count = result.counts.get(key, 0)
        lines = result.matches.get(key, [])
        if count > len(lines):
            lines = [*lines, f"... {count - len(lines)} more matching lines in {result.source}"]
        facts.set(f"{prefix}.{key}", count, *lines)
