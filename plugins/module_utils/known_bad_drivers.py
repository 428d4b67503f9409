# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Known-bad NVIDIA driver builds: THE one list of the project (modules, roles, agent and doctor).

Readers: the modules ``nvidia_gpu_info`` / ``nvidia_mig`` import it as module_utils (shipped to the node
with them); the roles use it through the filter ``hami.node.known_bad_driver`` (controller side); the agent
imports it as ``hami_agent.known_bad_drivers``, a symlink to this file that packs into the agent's wheel.
So it stays plain data plus a few functions, with no Ansible or agent imports.
``tests/unit/test_known_bad_drivers_single_source.py`` fails if a second copy of the list appears.

Add an entry to flag another build. ``condition`` says when the bug bites (``any``, or ``mixed_mig``: at
least one GPU in MIG mode and one not), so a node without that layout is only warned.

Source of the R570 entries: NVIDIA GPU Operator docs, troubleshooting "Pods stuck in Pending state in
mixed MIG + full GPU environments" and the v25.3.1/v25.3.2 release-note known issues (NVIDIA/cloud-native-docs
``gpu-operator/troubleshooting.rst``, ``release-notes.rst``): a regression in NVML from 570.124.06 on; NVIDIA
recommends 570.172.08; issue NVIDIA/gpu-operator#1361, also NVIDIA/go-nvml#152.
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


def lookup_extra(version, extra):
    """``lookup``, then the site's own builds ``extra`` ([{version, reason}]); ValueError on a bad item."""
    entry = lookup(version)
    if entry is not None:
        return entry
    for item in extra or []:
        if not isinstance(item, dict) or "version" not in item:
            raise ValueError("each item of 'extra' needs a 'version' (and a 'reason'), got %r" % (item,))
        if version and str(item["version"]).strip() == str(version).strip():
            return {
                "version": str(item["version"]),
                "reason": str(item.get("reason", "")),
                "reference": "",
                "condition": "any",
                "fixed_in": "",
            }
    return None


def triggered(entry, mig_modes):
    """True when the bad build's trigger condition holds for these per-GPU MIG modes (bools)."""
    if entry is None:
        return False
    if entry.get("condition") == "mixed_mig":
        modes = set(bool(m) for m in mig_modes)
        return modes == {True, False}
    return True


def sorted_versions():
    """The listed versions, oldest first."""
    return sorted(KNOWN_BAD_DRIVERS, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))


def describe_versions(conjunction="and"):
    """The listed versions in prose, e.g. ``570.124.06, 570.133.20 and 570.158.01``."""
    versions = sorted_versions()
    if len(versions) < 2:
        return "".join(versions)
    return "%s %s %s" % (", ".join(versions[:-1]), conjunction, versions[-1])
