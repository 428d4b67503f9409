# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""MIG layout model: desired-state parsing (mig-parted v1 or per-GPU list), current state, plan.

PRIVATE to the hami.node collection. Pure functions (no I/O) so they are unit-tested directly.
"""

from __future__ import annotations

import re

PROFILE_RE = re.compile(r"^(?:\d+c\.)?\d+g\.\d+gb(?:\+me|\+me\.all|\+gfx|-me)?$")
SPEC_KEYS = {"devices", "mig-enabled", "mig-devices", "device-filter"}

# GPU-instance profiles per model (NVIDIA MIG user guide "Supported MIG Profiles"; reference
# kubelet-nvidia.md §5.4): name -> max instances. Used to validate a layout before MIG is enabled, when
# `nvidia-smi mig -lgip` cannot list profiles yet. Extend here for new models.
_A100_40 = {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}
_H100_80 = {
    "1g.10gb": 7,
    "1g.10gb+me": 1,
    "1g.20gb": 4,
    "2g.20gb": 3,
    "3g.40gb": 2,
    "4g.40gb": 1,
    "7g.80gb": 1,
}
_H20_96 = {
    "1g.12gb": 7,
    "1g.12gb+me": 1,
    "1g.24gb": 4,
    "2g.24gb": 3,
    "3g.48gb": 2,
    "4g.48gb": 1,
    "7g.96gb": 1,
}
_H100_NVL = {
    "1g.12gb": 7,
    "1g.12gb+me": 1,
    "1g.24gb": 4,
    "2g.24gb": 3,
    "3g.47gb": 2,
    "4g.47gb": 1,
    "7g.94gb": 1,
}
_H200_141 = {
    "1g.18gb": 7,
    "1g.18gb+me": 1,
    "1g.35gb": 4,
    "2g.35gb": 3,
    "3g.71gb": 2,
    "4g.71gb": 1,
    "7g.141gb": 1,
}


def builtin_catalog(name, memory_mib):
    """Known GI profiles (name -> max instances) for a GPU model, or None when the model is unknown."""
    n = (name or "").upper()
    mem = memory_mib or 0
    if "H200" in n or ("H20" in n and mem > 120000):
        return dict(_H200_141)
    if "GH200" in n or "H20" in n:
        return dict(_H20_96)
    if "H100" in n and "NVL" in n:
        return dict(_H100_NVL)
    if "H100" in n or ("A100" in n and mem > 60000) or "H800" in n or "A800" in n:
        return dict(_H100_80)
    if "A100" in n:
        return dict(_A100_40)
    return None


class MigConfigError(ValueError):
    pass


def _check_profiles(where, devices):
    if not isinstance(devices, dict):
        raise MigConfigError(
            "%s: mig-devices must be a mapping of profile -> count, got %r" % (where, devices)
        )
    for prof, count in devices.items():
        if not PROFILE_RE.match(str(prof)):
            raise MigConfigError(
                "%s: %r is not a MIG profile name (form [<C>c.]<G>g.<N>gb[+me])" % (where, prof)
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise MigConfigError("%s: count for %s must be an integer >= 0, got %r" % (where, prof, count))


def parse_mig_parted(config, name):
    """Validate a mig-parted `version: v1` document and return the selected config's spec list."""
    if not isinstance(config, dict):
        raise MigConfigError("config must be a mig-parted document (mapping with version and mig-configs)")
    if config.get("version") != "v1":
        raise MigConfigError(
            "config: unknown version %r; mig-parted configs use version: v1" % config.get("version")
        )
    configs = config.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigConfigError("config: mig-configs must be a non-empty mapping of name -> list of specs")
    if name not in configs:
        raise MigConfigError(
            "config_name %r not found in mig-configs; available: %s" % (name, ", ".join(sorted(configs)))
        )
    specs = configs[name]
    if not isinstance(specs, list) or not specs:
        raise MigConfigError("mig-configs.%s must be a non-empty list of specs" % name)
    out = []
    for i, spec in enumerate(specs):
        where = "mig-configs.%s[%d]" % (name, i)
        if not isinstance(spec, dict):
            raise MigConfigError("%s must be a mapping" % where)
        unknown = set(spec) - SPEC_KEYS
        if unknown:
            raise MigConfigError(
                "%s: unknown keys %s (allowed: %s)" % (where, sorted(unknown), sorted(SPEC_KEYS))
            )
        if "devices" not in spec or "mig-enabled" not in spec:
            raise MigConfigError("%s: 'devices' and 'mig-enabled' are required" % where)
        devices = spec["devices"]
        if devices != "all" and not (isinstance(devices, list) and all(isinstance(d, int) for d in devices)):
            raise MigConfigError(
                "%s: devices must be 'all' or a list of GPU indices, got %r" % (where, devices)
            )
        enabled = spec["mig-enabled"]
        if not isinstance(enabled, bool):
            raise MigConfigError("%s: mig-enabled must be true or false" % where)
        mig_devices = spec.get("mig-devices")
        if enabled and mig_devices is None:
            raise MigConfigError(
                "%s: mig-devices is required when mig-enabled is true ({} = mode only)" % where
            )
        if not enabled and mig_devices:
            raise MigConfigError("%s: mig-devices must be empty when mig-enabled is false" % where)
        mig_devices = mig_devices or {}
        _check_profiles(where, mig_devices)
        filt = spec.get("device-filter")
        if isinstance(filt, str):
            filt = [filt]
        out.append(
            {
                "devices": devices,
                "enabled": enabled,
                "mig_devices": {k: v for k, v in mig_devices.items() if v},
                "device_filter": [f.lower() for f in filt] if filt else None,
            }
        )
    return out


def parse_gpu_list(gpus):
    """The simple form: [{index: 0, profiles: [3g.48gb, 1g.24gb]}, {index: 3, mig_enabled: false}]."""
    out = []
    seen = set()
    for i, item in enumerate(gpus):
        where = "gpus[%d]" % i
        idx = item.get("index")
        if idx in seen:
            raise MigConfigError("%s: GPU %s listed twice" % (where, idx))
        seen.add(idx)
        profiles = item.get("profiles") or []
        enabled = item.get("mig_enabled")
        if enabled is None:
            enabled = True
        if not enabled and profiles:
            raise MigConfigError("%s: profiles given but mig_enabled is false" % where)
        counts = {}
        for p in profiles:
            counts[p] = counts.get(p, 0) + 1
        _check_profiles(where, counts)
        out.append({"devices": [idx], "enabled": bool(enabled), "mig_devices": counts, "device_filter": None})
    return out


def desired_per_gpu(specs, gpus):
    """Resolve specs against the GPUs present -> {index: {enabled, mig_devices}}. Later specs win."""
    by_index = {g["index"]: g for g in gpus}
    want = {}
    for spec in specs:
        if spec["devices"] == "all":
            targets = sorted(by_index)
            explicit = False
        else:
            targets = spec["devices"]
            explicit = True
        for idx in targets:
            gpu = by_index.get(idx)
            if gpu is None:
                raise MigConfigError(
                    "GPU index %s does not exist on this node (GPUs: %s)" % (idx, sorted(by_index))
                )
            if (
                spec["device_filter"]
                and (gpu.get("pci_device_id") or "").lower() not in spec["device_filter"]
            ):
                continue
            if not gpu.get("mig_capable"):
                if spec["enabled"] and explicit:
                    raise MigConfigError("GPU %s (%s) does not support MIG" % (idx, gpu.get("name")))
                if spec["enabled"]:
                    continue  # devices: all skips GPUs that cannot do MIG, as mig-parted does
            want[idx] = {"enabled": spec["enabled"], "mig_devices": dict(spec["mig_devices"])}
    return want


def validate_profiles(want, gpus, lgip_by_gpu):
    """Check each desired profile against the GPU's profiles (-lgip when available, else built-in)."""
    by_index = {g["index"]: g for g in gpus}
    for idx, w in sorted(want.items()):
        if not w["enabled"] or not w["mig_devices"]:
            continue
        gpu = by_index[idx]
        known = lgip_by_gpu.get(idx) or builtin_catalog(gpu.get("name"), gpu.get("memory_total_mib"))
        if known is None:
            continue  # unknown model and MIG not enabled yet: nvidia-smi validates on create
        for prof, count in sorted(w["mig_devices"].items()):
            if prof not in known:
                raise MigConfigError(
                    "GPU %s (%s) has no MIG profile %s; valid profiles: %s"
                    % (idx, gpu.get("name"), prof, ", ".join(sorted(known, key=_profile_sort_key)))
                )
            if count > known[prof]:
                raise MigConfigError(
                    "GPU %s (%s): %d x %s requested, at most %d fit"
                    % (idx, gpu.get("name"), count, prof, known[prof])
                )


def _profile_sort_key(name):
    m = re.match(r"(?:\d+c\.)?(\d+)g\.(\d+)gb(.*)", name)
    if not m:
        return (99, 0, name)
    return (int(m.group(1)), int(m.group(2)), m.group(3))


def creation_order(mig_devices):
    """Largest first: big GPU instances need aligned placements, small ones fill the gaps."""
    flat = []
    for prof, count in mig_devices.items():
        flat.extend([prof] * count)
    return sorted(flat, key=_profile_sort_key, reverse=True)


def current_per_gpu(gpus, lgi, lci):
    """-> {index: {enabled, pending, capable, mig_devices: {profile: count}, orphan_gis: [gi ids w/o CI]}}"""
    cur = {}
    for g in gpus:
        cur[g["index"]] = {
            "enabled": bool(g.get("mig_enabled")),
            "pending": bool(g.get("mig_pending")),
            "capable": bool(g.get("mig_capable")),
            "mig_devices": {},
            "orphan_gis": [],
        }
    with_ci = {(c["gpu"], c["gi_id"]) for c in lci}
    for gi in lgi:
        entry = cur.get(gi["gpu"])
        if entry is None:
            continue
        entry["mig_devices"][gi["profile"]] = entry["mig_devices"].get(gi["profile"], 0) + 1
        if (gi["gpu"], gi["gi_id"]) not in with_ci:
            entry["orphan_gis"].append(gi["gi_id"])
    return cur


def plan(want, cur):
    """Per-GPU steps to reach `want` from `cur`.

    Returns a list of dicts {gpu, steps: [...]} where steps are 'clear', 'set_mode', 'reset', 'create'.
    A GPU already as wanted gets no entry (idempotence).
    """
    out = []
    for idx in sorted(want):
        w, c = want[idx], cur[idx]
        steps = []
        if w["enabled"] != c["enabled"]:
            if c["enabled"] and (c["mig_devices"] or c["orphan_gis"]):
                steps.append("clear")
            if c["pending"] != w["enabled"]:
                steps.append("set_mode")
            steps.append("reset")
            if w["enabled"] and w["mig_devices"]:
                steps.append("create")
        elif w["enabled"]:
            if c["mig_devices"] != w["mig_devices"] or c["orphan_gis"]:
                if c["mig_devices"] or c["orphan_gis"]:
                    steps.append("clear")
                if w["mig_devices"]:
                    steps.append("create")
            if c["pending"] != c["enabled"]:
                # A pending disable left behind by someone else: cancel it.
                steps.insert(0, "set_mode")
        elif c["pending"] != c["enabled"]:
            steps.append("set_mode")  # cancel a pending enable
        if steps:
            out.append({"gpu": idx, "steps": steps})
    return out


def view(state):
    """Diff-friendly view of {index: {enabled, mig_devices}}."""
    return {
        "gpu%d" % idx: {"mig_enabled": s["enabled"], "mig_devices": dict(sorted(s["mig_devices"].items()))}
        for idx, s in sorted(state.items())
    }
