"""``hami.io/vgpu-mig-allocations`` (dynamic MIG, HAMi v2.10: Project-HAMi/HAMi
``pkg/device/nvidia/mig_allocations.go``): a JSON list of ``{containerIndex, deviceIndex, gpuUUID,
profile, placement:{start,size}}`` written by the scheduler; the device plugin adds ``migUUID``,
``gpuInstanceID`` and ``computeInstanceID`` once the instance exists. Validation follows HAMi's
``DecodeMigAllocations``: an entry without GPU, profile or a placement size is incomplete, the three
runtime fields come together or not at all, and a (container, device) pair appears once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hami_agent.protocol.devices import MigPlacement, go_json
from hami_agent.protocol.errors import ProtocolError, quote

_RUNTIME_KEYS = ("migUUID", "gpuInstanceID", "computeInstanceID")


@dataclass(frozen=True)
class MigAllocation:
    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str | None = None  # runtime fields: all set or all None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def has_runtime(self) -> bool:
        return self.mig_uuid is not None


def _to_json(a: MigAllocation) -> dict[str, Any]:
    out: dict[str, Any] = {"containerIndex": a.container_index, "deviceIndex": a.device_index,
                           "gpuUUID": a.gpu_uuid, "profile": a.profile,
                           "placement": {"start": a.placement.start, "size": a.placement.size}}
    if a.has_runtime:
        out.update(migUUID=a.mig_uuid, gpuInstanceID=a.gpu_instance_id,
                   computeInstanceID=a.compute_instance_id)
    return out


def _validate(allocs: Sequence[MigAllocation]) -> None:
    seen: set[tuple[int, int]] = set()
    for i, a in enumerate(allocs):
        if not a.gpu_uuid or not a.profile or a.placement.size == 0:
            raise ProtocolError(f"MIG allocation {i} is incomplete: gpuUUID, profile and a placement size "
                                f"are required, got {a!r}")
        runtime = (a.mig_uuid, a.gpu_instance_id, a.compute_instance_id)
        if any(v is None for v in runtime) and any(v is not None for v in runtime):
            raise ProtocolError(f"mig allocation {a.container_index}/{a.device_index}: migUUID, "
                                "gpuInstanceID and computeInstanceID must be all present or all absent, "
                                f"got {runtime!r}")
        key = (a.container_index, a.device_index)
        if key in seen:
            raise ProtocolError(f"mig allocations: (containerIndex, deviceIndex) {key!r} appears twice")
        seen.add(key)


def encode_mig_allocations(allocs: Sequence[MigAllocation]) -> str:
    _validate(allocs)
    return go_json([_to_json(a) for a in allocs])


_UINT32_MAX = 2**32 - 1  # placement and instance IDs are uint32 in HAMi's structs


def _int(obj: dict[str, Any], key: str, where: str, required: bool = True,
         hi: int = 2**63 - 1) -> int | None:
    if key not in obj or obj[key] is None:
        if required:
            raise ProtocolError(f"{where}: missing {key!r} in {quote(obj)}")
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        raise ProtocolError(f"{where}: {key!r} must be an integer between 0 and {hi}, got {quote(v)}")
    return v


def _str(obj: dict[str, Any], key: str, where: str, required: bool = True) -> str | None:
    if key not in obj or obj[key] is None:
        if required:
            raise ProtocolError(f"{where}: missing {key!r} in {quote(obj)}")
        return None
    v = obj[key]
    if not isinstance(v, str) or (required and not v):
        raise ProtocolError(f"{where}: {key!r} must be a non-empty string, got {quote(v)}")
    return v


def decode_mig_allocations(value: str) -> list[MigAllocation]:
    if not isinstance(value, str):
        raise ProtocolError(f"mig allocations: expected a string, got {quote(value)}")
    try:
        data = json.loads(value) if value.strip() else None
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"mig allocations: invalid JSON ({exc}) in {quote(value)}") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise ProtocolError(f"mig allocations: expected a JSON list, got {quote(data)}")
    out = []
    for i, obj in enumerate(data):
        where = f"mig allocations[{i}]"
        if not isinstance(obj, dict):
            raise ProtocolError(f"{where}: must be a JSON object, got {quote(obj)}")
        pl = obj.get("placement")
        if not isinstance(pl, dict):
            raise ProtocolError(f"{where}: 'placement' must be {{start, size}}, got {quote(pl)}")
        out.append(MigAllocation(
            container_index=_int(obj, "containerIndex", where) or 0,
            device_index=_int(obj, "deviceIndex", where) or 0,
            gpu_uuid=_str(obj, "gpuUUID", where) or "",
            profile=_str(obj, "profile", where) or "",
            placement=MigPlacement(start=_int(pl, "start", where + ".placement", hi=_UINT32_MAX) or 0,
                                   size=_int(pl, "size", where + ".placement", hi=_UINT32_MAX) or 0),
            mig_uuid=_str(obj, "migUUID", where, required=False) or None,  # "" = not set (HAMi)
            gpu_instance_id=_int(obj, "gpuInstanceID", where, required=False, hi=_UINT32_MAX),
            compute_instance_id=_int(obj, "computeInstanceID", where, required=False, hi=_UINT32_MAX),
        ))
    _validate(out)
    return out
