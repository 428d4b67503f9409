"""Known-bad NVIDIA driver builds, as data (reference kubelet-nvidia.md §3.1).

The Ansible collection keeps the same list in ``plugins/module_utils/known_bad_drivers.py``; the agent must
not import ``plugins/``, so the list lives here too and a unit test asserts that both agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GPU_OPERATOR_1361 = "https://github.com/NVIDIA/gpu-operator/issues/1361"


@dataclass(frozen=True)
class BadDriver:
    version: str
    reason: str
    reference: str
    condition: str  # "any", or "mixed_mig": at least one GPU in MIG mode and one not
    fixed_in: str


_MIXED_MIG_HANG = dict(
    reason="NVML hang with mixed MIG + full GPUs (NVIDIA gpu-operator #1361); upgrade to 570.172.08",
    reference=GPU_OPERATOR_1361,
    condition="mixed_mig",
    fixed_in="570.172.08",
)

KNOWN_BAD_DRIVERS: dict[str, BadDriver] = {
    v: BadDriver(version=v, **_MIXED_MIG_HANG)  # type: ignore[arg-type]
    for v in ("570.124.06", "570.133.20", "570.148.08", "570.158.01")
}


def lookup(version: str | None) -> BadDriver | None:
    if not version:
        return None
    return KNOWN_BAD_DRIVERS.get(str(version).strip())


def triggered(entry: BadDriver | None, mig_modes: Iterable[bool]) -> bool:
    """True when the bad build's trigger holds for these per-GPU MIG-enabled flags."""
    if entry is None:
        return False
    if entry.condition == "mixed_mig":
        return set(bool(m) for m in mig_modes) == {True, False}
    return True
