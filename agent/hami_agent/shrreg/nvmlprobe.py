"""NVML per-process memory and per-GPU usage, read in a child process with a deadline.

``hami_agent.nvml`` models the inventory (no per-process usage), so the leak analysis and the
monitor's host metrics get their NVML numbers here. As everywhere in the agent, NVML is never called
in the caller's process: a child runs the calls and prints JSON; past the deadline it is killed and
*not waited for* (a process stuck in the driver may never die), and the caller gets NvmlProbeError.

Run as ``python -m hami_agent.shrreg.nvmlprobe [--lib PATH]`` (what ``probe()`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from hami_agent.shrreg.analysis import NvmlProcess

DEFAULT_TIMEOUT_S = 10.0


class NvmlProbeError(RuntimeError):
    """NVML could not be read; the message uses the seeds' wording (``nvml Init err: ...``)."""


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    name: str
    memory_used_bytes: int | None
    utilization: int | None


@dataclass(frozen=True)
class ProbeResult:
    gpus: list[GpuUsage]
    processes: list[NvmlProcess]


def probe(lib_path: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> ProbeResult:
    lib = lib_path or os.environ.get("HAMI_NVML_LIBRARY") or None
    cmd = [sys.executable, "-m", "hami_agent.shrreg.nvmlprobe"] + (["--lib", lib] if lib else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        try:
            proc.wait(0.5)  # reap if it died; a D-state child is abandoned, never waited on
        except subprocess.TimeoutExpired:
            pass
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise NvmlProbeError(
            f"nvml call timed out after {timeout_s:g}s (NVML hung; see seed 003): per-process usage "
            "unavailable"
        ) from exc
    if proc.returncode != 0:
        msg = (err or out).strip().splitlines()
        raise NvmlProbeError(msg[-1] if msg else f"nvml probe exited with {proc.returncode}")
    doc = json.loads(out)
    gpus = [GpuUsage(**g) for g in doc["gpus"]]
    procs = [
        NvmlProcess(gpu_uuid=p["gpu_uuid"], pid=p["pid"], used_bytes=p["used_bytes"])
        for p in doc["processes"]
    ]
    return ProbeResult(gpus=gpus, processes=procs)


def _child(lib: str | None) -> int:
    import ctypes

    import pynvml

    try:
        if lib:
            # pynvml skips its own dlopen when nvmlLib is already set
            pynvml.nvmlLib = ctypes.CDLL(lib)
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        print(f"nvml Init err: {exc}", file=sys.stderr)
        return 1
    gpus = []
    procs = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            try:
                mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
            except pynvml.NVMLError:
                mem = None  # NOT_SUPPORTED on unified-memory GPUs
            try:
                util = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except pynvml.NVMLError:
                util = None  # NOT_SUPPORTED while MIG is enabled
            gpus.append(
                {"index": i, "uuid": uuid, "name": name, "memory_used_bytes": mem, "utilization": util}
            )
            try:
                running = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            except pynvml.NVMLError:
                running = []
            for p in running:
                used = p.usedGpuMemory
                procs.append(
                    {"gpu_uuid": uuid, "pid": int(p.pid), "used_bytes": None if used is None else int(used)}
                )
    finally:
        pynvml.nvmlShutdown()
    json.dump({"gpus": gpus, "processes": procs}, sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nvmlprobe")
    ap.add_argument("--lib", default=None)
    return _child(ap.parse_args(argv).lib)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
