"""Pod and node annotations the scheduler reads (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``,
``pkg/util/types.go``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from hami_agent.protocol import gostr, keys
from hami_agent.protocol.errors import ProtocolError, quote

NODE_POLICY_BINPACK = "binpack"
NODE_POLICY_SPREAD = "spread"
NODE_POLICIES = (NODE_POLICY_BINPACK, NODE_POLICY_SPREAD)
GPU_POLICY_SPREAD = "spread"
GPU_POLICY_BINPACK = "binpack"
GPU_POLICY_TOPOLOGY_AWARE = "topology-aware"
GPU_POLICY_MUTEX = "mutex"
GPU_POLICY_NUMA = "numa"
GPU_POLICIES = (GPU_POLICY_SPREAD, GPU_POLICY_BINPACK, GPU_POLICY_TOPOLOGY_AWARE, GPU_POLICY_MUTEX,
                GPU_POLICY_NUMA)
DEFAULT_NODE_POLICY = NODE_POLICY_BINPACK
DEFAULT_GPU_POLICY = GPU_POLICY_SPREAD


def split_list(value: str | None) -> tuple[str, ...]:
    """Comma list with items trimmed and blanks dropped (an empty value means "no constraint")."""
    if not value:
        return ()
    return tuple(v.strip() for v in value.split(",") if v.strip())


# The three matching rules below take already-split lists so that a caller checking many devices
# (the scheduler's Fit) parses a pod's annotations once; check_type/check_uuid/mode_matches are the
# same rules reading the annotations directly.

def type_allowed(device_type: str, use: Iterable[str] = (), nouse: Iterable[str] = ()) -> bool:
    """use/nouse-gputype rule: case-insensitive substring match of any listed type in the device type."""
    if not use and not nouse:
        return True
    card = device_type.upper()
    if use and not any(u.upper() in card for u in use):
        return False
    return not any(n.upper() in card for n in nouse)


def uuid_allowed(uuid: str, use: Collection[str] = (), nouse: Collection[str] = ()) -> bool:
    """use/nouse-gpuuuid rule: exact UUID match (items already trimmed by :func:`split_list`)."""
    if use and uuid not in use:
        return False
    return not (nouse and uuid in nouse)


def mode_allowed(wanted: str | None, device_mode: str) -> bool:
    """vgpu-mode rule of HAMi's ``checkType`` (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``):
    ``wanted`` None (annotation absent) passes every device; otherwise the device passes when
    ``wanted`` contains its mode as a substring (Go ``strings.Contains``: an empty device mode passes,
    an empty annotation value passes no device with a mode)."""
    if wanted is None:
        return True
    return device_mode in wanted


def check_type(annotations: Mapping[str, str] | None, device_type: str) -> bool:
    """``nvidia.com/use-gputype`` / ``nouse-gputype``: case-insensitive substring match on the device
    type (e.g. ``A100`` matches ``NVIDIA-NVIDIA A100-SXM4-80GB``)."""
    annotations = annotations or {}
    return type_allowed(device_type, split_list(annotations.get(keys.USE_GPUTYPE, "")),
                        split_list(annotations.get(keys.NOUSE_GPUTYPE, "")))


def check_uuid(annotations: Mapping[str, str] | None, uuid: str) -> bool:
    """``nvidia.com/use-gpuuuid`` / ``nouse-gpuuuid``: exact (trimmed) UUID match."""
    annotations = annotations or {}
    return uuid_allowed(uuid, split_list(annotations.get(keys.USE_GPUUUID, "")),
                        split_list(annotations.get(keys.NOUSE_GPUUUID, "")))


def numa_bind(annotations: Mapping[str, str] | None) -> bool:
    """``nvidia.com/numa-bind``: a container's devices must share one NUMA node. True when the value is
    true for Go's ``strconv.ParseBool`` (``1``, ``t``, ``T``, ``TRUE``, ``true``, ``True``; nothing is
    trimmed), as HAMi's ``assertNuma`` (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``) reads it."""
    value = (annotations or {}).get(keys.NUMA_BIND)
    return isinstance(value, str) and gostr.parse_bool(value) is True


def mode_matches(annotations: Mapping[str, str] | None, device_mode: str) -> bool:
    """``nvidia.com/vgpu-mode``: :func:`mode_allowed` on the annotation (absent = any mode)."""
    return mode_allowed((annotations or {}).get(keys.VGPU_MODE), device_mode)


def node_scheduler_policy(annotations: Mapping[str, str] | None, default: str = DEFAULT_NODE_POLICY) -> str:
    """``hami.io/node-scheduler-policy``: ``binpack`` or ``spread``; overrides the flag default."""
    value = (annotations or {}).get(keys.NODE_SCHEDULER_POLICY, "").strip()
    if not value:
        return default
    if value not in NODE_POLICIES:
        raise ProtocolError(f"annotation {keys.NODE_SCHEDULER_POLICY}={quote(value)}: "
                            f"expected one of {', '.join(NODE_POLICIES)}")
    return value


def gpu_scheduler_policy(annotations: Mapping[str, str] | None,
                         default: str = DEFAULT_GPU_POLICY) -> tuple[str, ...]:
    """``hami.io/gpu-scheduler-policy``: one policy or a comma chain (e.g. ``binpack,numa``)."""
    value = (annotations or {}).get(keys.GPU_SCHEDULER_POLICY, "").strip() or default
    chain = tuple(p.strip() for p in value.split(","))
    for p in chain:
        if p not in GPU_POLICIES:
            raise ProtocolError(f"annotation {keys.GPU_SCHEDULER_POLICY}={quote(value)}: policy {p!r} "
                                f"is not one of {', '.join(GPU_POLICIES)}")
    return chain


@dataclass(frozen=True)
class ScoringWeights:
    """``hami.io/device-scoring-weights``; default 1,1,1."""

    slot: int = 1
    core: int = 1
    memory: int = 1

    def encode(self) -> str:
        return f"slot={self.slot},core={self.core},memory={self.memory}"


def parse_scoring_weights(value: str | None) -> ScoringWeights:
    """``hami.io/device-scoring-weights``: a port of HAMi's ``ParseDeviceScoringWeights``
    (Project-HAMi/HAMi ``pkg/util/device_scoring_weights.go``), same checks in the same order and the
    same error texts. ``None`` means the annotation is absent (default weights); an annotation that is
    present but empty is refused, as HAMi refuses it."""
    if value is None:
        return ScoringWeights()
    key_name = keys.DEVICE_SCORING_WEIGHTS

    def fail(what: str) -> ProtocolError:
        return ProtocolError(f"invalid {key_name} annotation {gostr.quote(value)}: {what}")

    parts = value.split(",")
    if len(parts) != 3:
        raise fail("expected slot, core, and memory weights")
    found: dict[str, int] = {}
    for part in parts:
        key_value = gostr.trim_space(part).split("=", 1)
        if len(key_value) != 2:
            raise fail("expected key=value entries")
        key = gostr.trim_space(key_value[0])
        if key in found:
            raise fail(f"duplicate {gostr.quote(key)} weight")
        weight = gostr.parse_int64(gostr.trim_space(key_value[1]))
        if weight is None:
            raise fail(f"{gostr.quote(key)} weight must be an integer")
        if weight < 0:
            raise fail(f"{gostr.quote(key)} weight must not be negative")
        if key not in ("slot", "core", "memory"):
            raise fail(f"unknown weight {gostr.quote(key)}")
        found[key] = weight
    if not any(found.values()):
        raise fail("at least one weight must be positive")
    return ScoringWeights(**found)


def parse_device_cordon(value: str | None) -> frozenset[str]:
    """``hami.io/device-cordon``: comma-separated GPU UUIDs excluded from new allocations."""
    return frozenset(split_list(value))
