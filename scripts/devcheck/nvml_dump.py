"""Raw NVML answers for the record: run as a CHILD process (``python nvml_dump.py [--lib PATH]``) that the
device check kills at its deadline. Prints one JSON document on stdout.

Read-only: only ``nvmlDeviceGet*``/``nvmlSystemGet*`` queries; nothing is set. Every call is wrapped, so
an answer the driver refuses is recorded as its error text (e.g. ``Not Supported``) instead of stopping the
dump. These are the answers needed to correct gpusim's ``h100-sxm`` profile after the first real run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from typing import Any

# NVML_GPU_INSTANCE_PROFILE_* indices (nvml.h): asked one by one until INVALID_ARGUMENT
GI_PROFILE_INDICES = range(0x12)
# read-only per-device queries, each asked with the device handle only
QUERIES = (
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetSerial", "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMinorNumber", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetArchitecture", "nvmlDeviceGetNumGpuCores", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetBrand", "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetCurrentClocksEventReasons",
)
# nvmlEventType* bits (nvml.h)
EVENT_TYPES = {
    "SingleBitEccError": 0x1, "DoubleBitEccError": 0x2, "PState": 0x4, "XidCriticalError": 0x8,
    "Clock": 0x10, "PowerSourceChange": 0x80, "MigConfigChange": 0x100, "SingleBitEccErrorStorm": 0x200,
    "DramRetirementEvent": 0x400, "DramRetirementFailure": 0x800, "NonFatalPoisonError": 0x1000,
    "FatalPoisonError": 0x2000, "GpuUnavailableError": 0x4000, "GpuRecoveryAction": 0x8000,
}


def _text(v: Any) -> Any:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _err(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # pynvml's __str__ may call NVML
        return repr(exc)


def _struct(obj: Any) -> Any:
    if hasattr(obj, "_fields_"):
        return {name: _struct(getattr(obj, name)) for name, *_ in obj._fields_}
    if isinstance(obj, (bytes, bytearray)):
        return _text(bytes(obj))
    if isinstance(obj, ctypes.Array):
        return [_struct(x) for x in obj]
    return obj


def ask(out: dict[str, Any], key: str, fn: Any, *args: Any) -> Any:
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 - record the refusal
        out[key] = {"error": _err(exc)}
        return None
    out[key] = _struct(value) if not isinstance(value, (list, tuple)) else [_struct(v) for v in value]
    if isinstance(out[key], bytes):
        out[key] = _text(out[key])
    return value


def dump(p: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"pynvml": getattr(p, "__version__", None)}
    ask(doc, "nvmlSystemGetDriverVersion", p.nvmlSystemGetDriverVersion)
    ask(doc, "nvmlSystemGetNVMLVersion", p.nvmlSystemGetNVMLVersion)
    ask(doc, "nvmlSystemGetCudaDriverVersion_v2", p.nvmlSystemGetCudaDriverVersion_v2)
    count = ask(doc, "nvmlDeviceGetCount", p.nvmlDeviceGetCount) or 0
    gpus = []
    for i in range(count):
        g: dict[str, Any] = {"index": i}
        gpus.append(g)
        h = ask(g, "nvmlDeviceGetHandleByIndex", lambda i=i: p.nvmlDeviceGetHandleByIndex(i))
        g.pop("nvmlDeviceGetHandleByIndex", None)
        if h is None:
            continue
        for name in QUERIES:
            fn = getattr(p, name, None) or getattr(p, name.rstrip("_v23").rstrip("_"), None)
            if fn is None:
                g[name] = {"error": "not in this pynvml"}
                continue
            ask(g, name, fn, h)
        ask(g, "nvmlDeviceGetMemoryInfo", p.nvmlDeviceGetMemoryInfo, h)
        try:
            ask(g, "nvmlDeviceGetMemoryInfo_v2", p.nvmlDeviceGetMemoryInfo, h, p.nvmlMemory_v2)
        except AttributeError:
            g["nvmlDeviceGetMemoryInfo_v2"] = {"error": "not in this pynvml"}
        ask(g, "nvmlDeviceGetComputeRunningProcesses", p.nvmlDeviceGetComputeRunningProcesses, h)
        ev = g.get("nvmlDeviceGetSupportedEventTypes")
        if isinstance(ev, int):
            g["supported_event_types"] = sorted(n for n, bit in EVENT_TYPES.items() if ev & bit)
        profiles = []
        for index in GI_PROFILE_INDICES:
            entry: dict[str, Any] = {"index": index}
            try:
                info = p.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except Exception as exc:  # noqa: BLE001
                entry["error"] = _err(exc)
                profiles.append(entry)
                if "InvalidArgument" in entry["error"] or "Invalid Argument" in entry["error"]:
                    break
                continue
            entry.update(_struct(info))
            profiles.append(entry)
        g["nvmlDeviceGetGpuInstanceProfileInfo"] = profiles
    doc["gpus"] = gpus
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nvml_dump")
    ap.add_argument("--lib", default=None, help="libnvidia-ml.so.1 to load (default: the system's)")
    args = ap.parse_args(argv)
    import pynvml

    if args.lib:
        pynvml.nvmlLib = ctypes.CDLL(args.lib)
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"error": f"nvmlInit: {_err(exc)}"}))
        return 1
    try:
        doc = dump(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    print(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
