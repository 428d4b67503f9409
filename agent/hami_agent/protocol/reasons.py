"""Scheduler failure reasons (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``, ``pkg/scheduler/score.go``):
constants with HAMi's exact spelling and the ``"<n>/<m> <Reason>"`` strings joined with ``", "``."""

from __future__ import annotations

import re
from collections.abc import Mapping

from hami_agent.protocol.errors import ProtocolError, quote

CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UUID_MISMATCH = "CardUuidMismatch"  # HAMi's Go constant is named CardUUIDMismatch
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
CARD_NOT_HEALTH = "CardNotHealth"
CARD_CORDONED = "CardCordoned"
NUMA_NOT_FIT = "NumaNotFit"
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"  # returned bare, without the n/m prefix
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
NODE_UNFIT_POD = "NodeUnfitPod"  # log message only
NODE_FIT_POD = "NodeFitPod"  # log message only
RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
MODE_NOT_FIT = "ModeNotFit"

ALL_REASONS: tuple[str, ...] = (
    CARD_TYPE_MISMATCH, CARD_UUID_MISMATCH, CARD_TIME_SLICING_EXHAUSTED, CARD_COMPUTE_UNITS_EXHAUSTED,
    CARD_INSUFFICIENT_MEMORY, CARD_INSUFFICIENT_CORE, CARD_NOT_HEALTH, CARD_CORDONED, NUMA_NOT_FIT,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, CARD_NOT_FOUND_CUSTOM_FILTER_RULE, CARD_MIG_TOPOLOGY_INFEASIBLE,
    NODE_INSUFFICIENT_DEVICE, ALLOCATED_CARDS_INSUFFICIENT_REQUEST, NODE_UNFIT_POD, NODE_FIT_POD,
    RESOURCE_QUOTA_NOT_FIT, MODE_NOT_FIT,
)

# Other failure strings used by the scheduler
DEVICE_TYPE_NOT_FOUND = "Device type not found"
NODE_UNREGISTERED = "node unregistered"
NODE_USAGE_UNAVAILABLE = "node usage unavailable"

_ENTRY_RE = re.compile(r"^(\d{1,18})/(\d{1,18}) (\S+)$")


def gen_reason(reasons: Mapping[str, int], total: int) -> str:
    """``{"CardTypeMismatch": 1, "CardInsufficientMemory": 1}, 2`` →
    ``"1/2 CardInsufficientMemory, 1/2 CardTypeMismatch"``. Entries sort as whole strings, so
    ``10/12 ...`` precedes ``2/12 ...`` exactly as in HAMi."""
    for reason in reasons:
        if not reason or " " in reason or "," in reason:
            raise ProtocolError(f"reason {reason!r} must be one word")
    return ", ".join(sorted(f"{n}/{total} {reason}" for reason, n in reasons.items()))


def parse_reason_with_total(text: str) -> tuple[dict[str, int], int | None]:
    """Inverse of :func:`gen_reason`, also returning the shared total (None for an empty string)."""
    if not isinstance(text, str):
        raise ProtocolError(f"reason: expected a string, got {quote(text)}")
    out: dict[str, int] = {}
    total: int | None = None
    if not text.strip():
        return out, total
    for entry in text.split(", "):
        m = _ENTRY_RE.match(entry.strip())
        if not m:
            raise ProtocolError(f"reason: entry {quote(entry)} is not '<n>/<m> <Reason>'")
        n, m_total, reason = int(m.group(1)), int(m.group(2)), m.group(3)
        if total is not None and m_total != total:
            raise ProtocolError(f"reason: entry {quote(entry)} has total {m_total}, others have {total}")
        total = m_total
        out[reason] = out.get(reason, 0) + n
    return out, total


def parse_reason(text: str) -> dict[str, int]:
    """``"1/2 CardInsufficientMemory, 1/2 CardTypeMismatch"`` → ``{"CardInsufficientMemory": 1, ...}``."""
    return parse_reason_with_total(text)[0]
