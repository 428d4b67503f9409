"""Turn the worker's inventory into the model (one-shot: ``hami_agent.nvml.client.collect_inventory``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hami_agent.nvml.errors import NvmlError
from hami_agent.nvml.model import (
    REASON_LOST,
    REASON_NVML_ERROR,
    Gpu,
    MigDevice,
    Snapshot,
    device_type,
)

logger = logging.getLogger(__name__)

LIB_ENV = "HAMI_NVML_LIBRARY"


def resolve_lib_path(lib_path: str | os.PathLike[str] | None) -> str | None:
    """Explicit path, else ``$HAMI_NVML_LIBRARY``, else None (pynvml's default: the system's)."""
    if lib_path:
        return str(lib_path)
    return os.environ.get(LIB_ENV) or None


def check_lib_path(lib_path: str | None) -> None:
    if lib_path and not Path(lib_path).exists():
        raise NvmlError(f"nvml Init err: NVML library {lib_path} does not exist "
                        f"(check --nvml-lib / {LIB_ENV})", call="nvmlInit")


def build_snapshot(data: Mapping[str, Any], *, generation: int = 0, taken_at: float | None = None,
                   previous: Snapshot | None = None,
                   xid_marks: Mapping[str, str] | None = None) -> Snapshot:
    """Model of one worker inventory. ``xid_marks`` (uuid -> reason) are sticky XID verdicts;
    ``previous`` supplies identities of GPUs that are lost now (NVML cannot tell their UUID any more)."""
    xid_marks = xid_marks or {}
    prev_by_index = {g.index: g for g in previous.gpus} if previous else {}
    gpus: list[Gpu] = []
    not_supported: list[int] = []
    problems: list[str] = []
    for raw in data.get("gpus", []):
        index = int(raw["index"])
        if raw.get("lost") and "name" not in raw:
            known = prev_by_index.get(index)
            if known is None:
                problems.append(f"GPU {index} is lost (NVML: GPU is lost); its UUID is unknown, not listed")
                logger.error("%s", problems[-1])
                continue
            gpus.append(known.with_health(False, REASON_LOST))
            continue
        if "name" not in raw:
            known = prev_by_index.get(index)
            if known is not None:
                gpus.append(known.with_health(False, REASON_NVML_ERROR))
            else:
                problems.append(f"GPU {index}: {raw.get('error') or 'NVML gave no details'}; not listed")
            logger.error("GPU %d: %s", index, raw.get("error") or "NVML gave no details")
            continue
        if raw.get("memory_not_supported"):
            not_supported.append(index)
        migs = tuple(
            MigDevice(index=int(m["index"]), uuid=str(m["uuid"]), profile=str(m["profile"]),
                      memory_mib=int(m["memory_mib"]), gi_id=int(m["gi_id"]), ci_id=int(m["ci_id"]))
            for m in raw.get("mig_devices", [])
        )
        name = str(raw["name"])
        gpu = Gpu(index=index, uuid=str(raw["uuid"]), name=name, type=device_type(name),
                  memory_mib=raw.get("memory_mib"), numa=raw.get("numa"), pci_bus_id=str(raw["pci_bus_id"]),
                  mig_capable=bool(raw.get("mig_capable")), mig_enabled=bool(raw.get("mig_enabled")),
                  mig_pending=bool(raw.get("mig_pending")), mig_devices=migs)
        if raw.get("lost"):
            gpu = gpu.with_health(False, REASON_LOST)
        elif raw.get("error"):
            logger.error("GPU %d (%s): %s", index, gpu.uuid, raw["error"])
            gpu = gpu.with_health(False, REASON_NVML_ERROR)
        elif gpu.uuid in xid_marks:
            gpu = gpu.with_health(False, xid_marks[gpu.uuid])
        gpus.append(gpu)
    return Snapshot(
        status="ok", gpus=tuple(gpus), driver_version=data.get("driver_version"),
        cuda_driver_version=data.get("cuda_driver_version"),
        taken_at=time.time() if taken_at is None else taken_at, generation=generation,
        memory_not_supported=tuple(not_supported), problems=tuple(problems),
    )


def warn_memory_not_supported(snapshot: Snapshot, already: set[int] | None = None) -> None:
    """HAMi's warning for unified-memory GPUs, once per GPU per caller."""
    for index in snapshot.memory_not_supported:
        if already is not None:
            if index in already:
                continue
            already.add(index)
        logger.warning("GPU %d: GetMemoryInfo not supported (unified memory); set "
                       "preConfiguredDeviceMemory in the device config to advertise its memory", index)
