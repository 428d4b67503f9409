"""Node register annotation (``hami.io/node-nvidia-register``) and pod device strings.

Formats: Project-HAMi/HAMi ``pkg/device/devices.go`` (node devices, JSON since v2.8 and the legacy 7/9-field
text; pod devices) (pod device strings ``uuid,NVIDIA,mem,cores:`` per device, ``;`` per container).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_agent.protocol.errors import ProtocolError, quote
from hami_agent.protocol.keys import MODE_HAMI_CORE

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
UINT_MAX = 2**64 - 1

# Characters that would break the colon/comma/semicolon text encodings.
_TEXT_SEPARATORS = (",", ":", ";")


@dataclass(frozen=True)
class MigPlacement:
    """A legal GPU-instance placement of a MIG profile: memory slices [start, start+size)."""

    start: int
    size: int


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile published in the register annotation (dynamic MIG, §6.7).

    ``instance_count`` is not part of the wire format (HAMi does not serialize it); it is carried so the
    registrar can compute ``count`` and is ignored by equality.
    """

    name: str
    memory_mb: int = 0
    core: int = 0
    slice_count: int = 0
    placements: tuple[MigPlacement, ...] = ()
    instance_count: int = field(default=0, compare=False)


@dataclass(frozen=True)
class NodeDevice:
    """One physical GPU as advertised to the scheduler (HAMi's ``DeviceInfo``).

    Defaults are what a decoder yields for keys that omitempty left out.
    """

    id: str
    index: int = 0
    count: int = 0
    devmem: int = 0
    devcore: int = 0
    type: str = ""
    numa: int = 0
    mode: str = ""
    health: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()


@dataclass(frozen=True)
class ContainerDevice:
    """One device of one container in a pod device string: ``uuid,type,usedmem,usedcores``."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int


# --------------------------------------------------------------------------------------------------------
# Go-compatible JSON helpers
# --------------------------------------------------------------------------------------------------------

# Go's encoding/json escapes these inside strings (HTML safety); do the same so the annotation is
# byte-identical to what HAMi writes and the registrar's change detection does not flap.
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_GO_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")


def go_json(value: Any) -> str:
    """Serialize like Go's ``json.Marshal``: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return _GO_ESCAPE_RE.sub(lambda m: _GO_ESCAPES[m.group(0)], text)


def _lookup(obj: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """Go's json.Unmarshal field matching: exact key first, then case-insensitive.

    Matters because some HAMi builds wrote Go field names (``ID``, ``Devmem``...) instead of tags."""
    if key in obj:
        return True, obj[key]
    lowered = key.lower()
    for k, v in obj.items():
        if k.lower() == lowered:
            return True, v
    return False, None


def _json_int(obj: Mapping[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    found, value = _lookup(obj, key)
    if not found or value is None:
        return 0
    # bool is an int subclass in Python; Go would refuse it for a number field.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{where}: field {key!r} must be an integer, got {quote(value)}")
    if not lo <= value <= hi:
        raise ProtocolError(f"{where}: field {key!r} value {value} is out of range [{lo}, {hi}]")
    return value


def _json_str(obj: Mapping[str, Any], key: str, where: str) -> str:
    found, value = _lookup(obj, key)
    if not found or value is None:
        return ""
    if not isinstance(value, str):
        raise ProtocolError(f"{where}: field {key!r} must be a string, got {quote(value)}")
    return value


def _json_bool(obj: Mapping[str, Any], key: str, where: str) -> bool:
    found, value = _lookup(obj, key)
    if not found or value is None:
        return False
    if not isinstance(value, bool):
        raise ProtocolError(f"{where}: field {key!r} must be true or false, got {quote(value)}")
    return value


def _json_list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    found, value = _lookup(obj, key)
    if not found or value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(f"{where}: field {key!r} must be a list, got {quote(value)}")
    return value


# --------------------------------------------------------------------------------------------------------
# node devices: JSON (current) and legacy text
# --------------------------------------------------------------------------------------------------------

def _mig_profile_to_json(p: MigProfile) -> dict[str, Any]:
    return {
        "name": p.name,
        "memoryMB": p.memory_mb,
        "core": p.core,
        "sliceCount": p.slice_count,
        "placements": [{"start": pl.start, "size": pl.size} for pl in p.placements],
    }


def node_device_to_json(d: NodeDevice) -> dict[str, Any]:
    """The JSON object of one device, in HAMi's field order, omitting zero values (omitempty)."""
    out: dict[str, Any] = {}
    if d.id:
        out["id"] = d.id
    if d.index:
        out["index"] = d.index
    if d.count:
        out["count"] = d.count
    if d.devmem:
        out["devmem"] = d.devmem
    if d.devcore:
        out["devcore"] = d.devcore
    if d.type:
        out["type"] = d.type
    if d.numa:
        out["numa"] = d.numa
    if d.mode:
        out["mode"] = d.mode
    if d.mig_profiles:
        out["migProfiles"] = [_mig_profile_to_json(p) for p in d.mig_profiles]
    if d.health:
        out["health"] = True
    return out


def _check_node_device(d: NodeDevice) -> None:
    if d.index < 0 or d.index > UINT_MAX:
        raise ProtocolError(f"device {d.id!r}: index {d.index} is out of range (uint)")
    for name in ("count", "devmem", "devcore"):
        value = getattr(d, name)
        if not INT32_MIN <= value <= INT32_MAX:
            raise ProtocolError(f"device {d.id!r}: {name} {value} does not fit int32")


def encode_node_devices(devices: Sequence[NodeDevice]) -> str:
    """Encode the register annotation as HAMi v2.8+ does: a compact JSON list with omitempty."""
    for d in devices:
        _check_node_device(d)
    return go_json([node_device_to_json(d) for d in devices])


def _mig_profile_from_json(obj: Any, where: str) -> MigProfile:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{where}: a MIG profile must be a JSON object, got {quote(obj)}")
    placements = []
    for j, pl in enumerate(_json_list(obj, "placements", where)):
        pwhere = f"{where} placement {j}"
        if not isinstance(pl, dict):
            raise ProtocolError(f"{pwhere}: must be a JSON object, got {quote(pl)}")
        placements.append(MigPlacement(start=_json_int(pl, "start", pwhere, INT32_MIN, INT32_MAX),
                                       size=_json_int(pl, "size", pwhere, INT32_MIN, INT32_MAX)))
    return MigProfile(
        name=_json_str(obj, "name", where),
        memory_mb=_json_int(obj, "memoryMB", where, INT32_MIN, 2**63 - 1),
        core=_json_int(obj, "core", where, INT32_MIN, INT32_MAX),
        slice_count=_json_int(obj, "sliceCount", where, INT32_MIN, INT32_MAX),
        placements=tuple(placements),
    )


def node_device_from_json(obj: Any, where: str = "device") -> NodeDevice:
    """Decode one JSON device object; missing keys take their zero value (omitempty)."""
    if not isinstance(obj, dict):
        raise ProtocolError(f"{where}: must be a JSON object, got {quote(obj)}")
    profiles = tuple(
        _mig_profile_from_json(p, f"{where} migProfiles[{j}]")
        for j, p in enumerate(_json_list(obj, "migProfiles", where))
    )
    return NodeDevice(
        id=_json_str(obj, "id", where),
        index=_json_int(obj, "index", where, 0, UINT_MAX),
        count=_json_int(obj, "count", where, INT32_MIN, INT32_MAX),
        devmem=_json_int(obj, "devmem", where, INT32_MIN, INT32_MAX),
        devcore=_json_int(obj, "devcore", where, INT32_MIN, INT32_MAX),
        type=_json_str(obj, "type", where),
        numa=_json_int(obj, "numa", where, -(2**63), 2**63 - 1),
        mode=_json_str(obj, "mode", where),
        health=_json_bool(obj, "health", where),
        mig_profiles=profiles,
    )


def _decode_node_devices_json(value: str) -> list[NodeDevice]:
    try:
        data = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"node devices: invalid JSON ({exc}) in {quote(value)}") from None
    if data is None:  # Go marshals a nil slice as null
        return []
    if not isinstance(data, list):
        raise ProtocolError(f"node devices: expected a JSON list, got {quote(data)}")
    return [node_device_from_json(obj, f"node devices[{i}]") for i, obj in enumerate(data)]


_GO_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
             "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


def go_atoi(text: str, what: str, lo: int = -(2**63), hi: int = 2**63 - 1) -> int:
    """Go's ``strconv.Atoi``: optional sign, decimal digits only; range-checked."""
    if not _GO_INT_RE.match(text):
        raise ProtocolError(f"{what}: {text!r} is not an integer")
    if len(text) > 40:  # also keeps int() clear of Python's 4300-digit conversion limit
        raise ProtocolError(f"{what}: {text[:40]!r}... is out of range [{lo}, {hi}]")
    value = int(text)
    if not lo <= value <= hi:
        raise ProtocolError(f"{what}: {text!r} is out of range [{lo}, {hi}]")
    return value


def go_parse_bool(text: str, what: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    try:
        return _GO_BOOLS[text]
    except KeyError:
        raise ProtocolError(f"{what}: {text!r} is not a boolean") from None


def _decode_node_devices_legacy(value: str) -> list[NodeDevice]:
    if ":" not in value:
        raise ProtocolError(f"node devices: neither JSON nor legacy text (no ':'): {quote(value)}")
    devices = []
    for seg in value.split(":"):
        if not seg:
            continue
        items = seg.split(",")
        if len(items) not in (7, 9):
            raise ProtocolError(
                f"node devices: legacy record must have 7 or 9 comma-separated fields, "
                f"got {len(items)} in {quote(seg)}")
        where = f"node device {items[0]!r}"
        index, mode = 0, MODE_HAMI_CORE
        if len(items) == 9:
            index = go_atoi(items[7], f"{where} index", 0, UINT_MAX)
            mode = items[8]
        devices.append(NodeDevice(
            id=items[0],
            index=index,
            count=go_atoi(items[1], f"{where} count", INT32_MIN, INT32_MAX),
            devmem=go_atoi(items[2], f"{where} devmem", INT32_MIN, INT32_MAX),
            devcore=go_atoi(items[3], f"{where} devcore", INT32_MIN, INT32_MAX),
            type=items[4],
            numa=go_atoi(items[5], f"{where} numa"),
            health=go_parse_bool(items[6], f"{where} health"),
            mode=mode,
        ))
    return devices


def decode_node_devices(value: str) -> list[NodeDevice]:
    """Decode the register annotation: JSON (v2.8+) or the legacy 7/9-field colon text (v2.7-)."""
    if not isinstance(value, str):
        raise ProtocolError(f"node devices: expected a string, got {quote(value)}")
    stripped = value.strip()
    if not stripped:
        raise ProtocolError("node devices: the annotation value is empty")
    if stripped[0] in "[{\"" or stripped == "null":  # JSON (a non-list JSON value is reported as such)
        try:
            return _decode_node_devices_json(stripped)
        except ProtocolError as json_error:
            # a legacy record whose UUID happens to start with '[' or '{': accept it as legacy text,
            # otherwise report the JSON problem (the likelier intent)
            try:
                return _decode_node_devices_legacy(value)
            except ProtocolError:
                raise json_error from None
    return _decode_node_devices_legacy(value)


def _check_text_field(value: str, what: str) -> None:
    for sep in _TEXT_SEPARATORS:
        if sep in value:
            raise ProtocolError(f"{what} {value!r} contains the separator {sep!r}")


def encode_node_devices_legacy(devices: Sequence[NodeDevice]) -> str:
    """Legacy 9-field text (``UUID,count,devmem,devcore,type,numa,health,index,mode:``) for schedulers
    older than v2.8. MIG profiles cannot be expressed in it and are dropped."""
    parts = []
    for d in devices:
        _check_node_device(d)
        _check_text_field(d.id, "device id")
        _check_text_field(d.type, f"device {d.id!r} type")
        _check_text_field(d.mode, f"device {d.id!r} mode")
        parts.append("%s,%d,%d,%d,%s,%d,%s,%d,%s:" % (
            d.id, d.count, d.devmem, d.devcore, d.type, d.numa, "true" if d.health else "false",
            d.index, d.mode))
    return "".join(parts)


# --------------------------------------------------------------------------------------------------------
# pod device strings
# --------------------------------------------------------------------------------------------------------

def encode_container_devices(devices: Iterable[ContainerDevice]) -> str:
    """One container's devices: ``uuid,type,usedmem,usedcores:`` each (HAMi's EncodeContainerDevices)."""
    out = []
    for d in devices:
        _check_text_field(d.uuid, "device uuid")
        _check_text_field(d.type, f"device {d.uuid!r} type")
        for name in ("usedmem", "usedcores"):
            v = getattr(d, name)
            if isinstance(v, bool) or not isinstance(v, int) or not INT32_MIN <= v <= INT32_MAX:
                raise ProtocolError(f"device {d.uuid!r}: {name} {v!r} must be an int32")
        out.append(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}:")
    return "".join(out)


def encode_pod_devices(containers: Sequence[Sequence[ContainerDevice]]) -> str:
    """Encode a pod's allocation: one ``;``-terminated entry per container, init containers first,
    containers without devices kept as empty entries so indices line up with the pod spec."""
    return "".join(encode_container_devices(c) + ";" for c in containers)


def _decode_container_devices(text: str, cidx: int) -> list[ContainerDevice]:
    devices = []
    for rec in text.split(":"):
        if not rec:
            continue
        items = rec.split(",")
        if len(items) < 4:
            raise ProtocolError(
                f"pod devices: container {cidx}: device record needs 4 fields "
                f"(uuid,type,usedmem,usedcores), got {len(items)} in {quote(rec)}")
        where = f"pod devices: container {cidx} device {items[0]!r}"
        devices.append(ContainerDevice(
            uuid=items[0],
            type=items[1],
            usedmem=go_atoi(items[2], f"{where} usedmem", INT32_MIN, INT32_MAX),
            usedcores=go_atoi(items[3], f"{where} usedcores", INT32_MIN, INT32_MAX),
        ))
    return devices


def decode_pod_devices(value: str) -> list[list[ContainerDevice]]:
    """Decode a pod device string. Empty container entries are kept (they keep indices aligned);
    only the empty piece after the final ``;`` is dropped. ``""`` → ``[]``, ``";"`` → ``[[]]``."""
    if not isinstance(value, str):
        raise ProtocolError(f"pod devices: expected a string, got {quote(value)}")
    if not value:
        return []
    pieces = value.split(";")
    if len(pieces) > 1 and pieces[-1] == "":
        pieces.pop()
    return [_decode_container_devices(p, i) for i, p in enumerate(pieces)]


def pod_devices_remaining(containers: Sequence[Sequence[ContainerDevice]],
                          device_type: str = "NVIDIA") -> bool:
    """True while any container still has a device of ``device_type`` (HAMi checks whether the
    to-allocate string still contains the vendor's common word)."""
    return any(d.type == device_type or device_type in d.type for c in containers for d in c)
