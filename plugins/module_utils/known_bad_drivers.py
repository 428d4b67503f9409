# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Known-bad NVIDIA driver builds, as data. PRIVATE to the hami.node collection.

Add an entry to ``KNOWN_BAD_DRIVERS`` to flag another build: ``nvidia_gpu_info`` reports it as
``known_bad_driver`` and the roles refuse to pin it. ``condition`` says when the bug bites (``any`` or
``mixed_mig``: at least one GPU in MIG mode and one not), so a node without that layout is only warned.
"""

from __future__ import annotations

_MIXED_MIG_HANG = {
    "reason": "NVML hang with mixed MIG + full GPUs (NVIDIA gpu-operator #1361); upgrade to 570.172.08",
    "reference": "https://github.com/NVIDIA/gpu-operator/issues/1361",
    "condition": "mixed_mig",
    "fixed_in": "570.172.08",
}

KNOWN_BAD_DRIVERS = {
    "570.124.06": _MIXED_MIG_HANG,
    "570.133.20": _MIXED_MIG_HANG,
    "570.148.08": _MIXED_MIG_HANG,
    "570.158.01": _MIXED_MIG_HANG,
}


def lookup(version):
    """Return ``{version, reason, reference, condition, fixed_in}`` for a known-bad build, else None."""
    if not version:
        return None
    entry = KNOWN_BAD_DRIVERS.get(str(version).strip())
    if entry is None:
        return None
    out = dict(entry)
    out["version"] = str(version).strip()
    return out


def triggered(entry, mig_modes):
    """True when the bad build's trigger condition holds for these per-GPU MIG modes (bools)."""
    if entry is None:
        return False
    if entry.get("condition") == "mixed_mig":
        modes = set(bool(m) for m in mig_modes)
        return modes == {True, False}
    return True
