"""Known-bad NVIDIA driver builds as typed records for the doctor.

The list itself lives in one place, ``plugins/module_utils/known_bad_drivers.py`` (the agent imports it
as ``hami_agent.known_bad_drivers``); this module only gives it dataclass types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hami_agent import known_bad_drivers as _source


@dataclass(frozen=True)
class BadDriver:
    version: str
    reason: str
    reference: str
    condition: str  # "any", or "mixed_mig": at least one GPU in MIG mode and one not
    fixed_in: str


KNOWN_BAD_DRIVERS: dict[str, BadDriver] = {
    v: BadDriver(version=v, reason=e["reason"], reference=e["reference"], condition=e["condition"],
                 fixed_in=e["fixed_in"])
    for v, e in _source.KNOWN_BAD_DRIVERS.items()
}


def lookup(version: str | None) -> BadDriver | None:
    if not version:
        return None
    return KNOWN_BAD_DRIVERS.get(str(version).strip())


def triggered(entry: BadDriver | None, mig_modes: Iterable[bool]) -> bool:
    """True when the bad build's trigger holds for these per-GPU MIG-enabled flags."""
    if entry is None:
        return False
    return _source.triggered({"condition": entry.condition}, mig_modes)


def sorted_versions() -> list[str]:
    return list(_source.sorted_versions())


def describe_versions(conjunction: str = "and") -> str:
    return _source.describe_versions(conjunction)
