# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""HAMi node annotations: the small decoding the hami_node module needs. PRIVATE to hami.node.

Re-implemented here on purpose (not imported from the hami-agent package): module code runs on hosts
where the agent is not installed. Formats: Project-HAMi/HAMi pkg/device/devices.go (register JSON or legacy
text, handshake `Requesting_<YYYY-MM-DD HH:MM:SS>` / legacy `Reported <go time>` / `Deleted_<t>`, node lock
`<RFC3339>,<ns>,<pod>`, device cordon = comma-separated UUIDs).
"""

from __future__ import annotations

import datetime
import json
import re

NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_LOCK = "hami.io/mutex.lock"
DEVICE_CORDON = "hami.io/device-cordon"
NODE_SCORE = "hami.io/node-nvidia-score"
HAMI_PREFIX = "hami.io/"
LOCK_EXPIRY_S = 300

UTC = datetime.timezone.utc


class DecodeError(ValueError):
    pass


def decode_register(value):
    """Register annotation -> list of device dicts (JSON v2.8+, or legacy `a,b,...:` text)."""
    value = (value or "").strip()
    if not value:
        return []
    if value.startswith("["):
        try:
            items = json.loads(value)
        except ValueError as exc:
            raise DecodeError("node register annotation is not valid JSON: %s" % exc) from exc
        out = []
        for item in items:
            # Every field is omitempty upstream: default what is missing.
            out.append(
                {
                    "id": item.get("id", ""),
                    "index": int(item.get("index", 0) or 0),
                    "count": int(item.get("count", 0) or 0),
                    "devmem": int(item.get("devmem", 0) or 0),
                    "devcore": int(item.get("devcore", 0) or 0),
                    "type": item.get("type", ""),
                    "numa": int(item.get("numa", 0) or 0),
                    "mode": item.get("mode") or "hami-core",
                    "health": bool(item.get("health", False)),
                    "mig_profiles": [
                        p.get("name") for p in item.get("migProfiles") or [] if isinstance(p, dict)
                    ],
                }
            )
        return out
    if ":" not in value:
        raise DecodeError("node register annotation %r is neither JSON nor legacy text (no ':')" % value[:80])
    out = []
    for seg in value.split(":"):
        if not seg.strip():
            continue
        f = seg.split(",")
        if len(f) not in (7, 9):
            raise DecodeError("legacy register record %r has %d fields, expected 7 or 9" % (seg, len(f)))
        try:
            out.append(
                {
                    "id": f[0],
                    "count": int(f[1]),
                    "devmem": int(f[2]),
                    "devcore": int(f[3]),
                    "type": f[4],
                    "numa": int(f[5]),
                    "health": f[6].strip().lower() == "true",
                    "index": int(f[7]) if len(f) == 9 else 0,
                    "mode": f[8] if len(f) == 9 else "hami-core",
                    "mig_profiles": [],
                }
            )
        except ValueError as exc:
            raise DecodeError("legacy register record %r: %s" % (seg, exc)) from exc
    return out


def _parse_naive(text, fmt):
    return datetime.datetime.strptime(text, fmt).replace(tzinfo=UTC)


def decode_handshake(value, now):
    """-> {state, time, age_s} ; state in requesting|reported|deleted|unknown|absent."""
    if value is None:
        return {"state": "absent", "time": None, "age_s": None}
    m = re.match(r"^(Requesting|Deleted)_(.+)$", value)
    when = None
    if m:
        state = m.group(1).lower()
        for fmt in ("%Y-%m-%d %H:%M:%S", "%Y.%m.%d %H:%M:%S"):
            try:
                when = _parse_naive(m.group(2).strip(), fmt)
                break
            except ValueError:
                continue
    elif value.startswith("Reported"):
        state = "reported"
        mm = re.match(r"^Reported\s+(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.\d+)?\s*([+-]\d{4})?", value)
        if mm:
            when = _parse_naive(mm.group(1), "%Y-%m-%d %H:%M:%S")
            if mm.group(2):
                sign = 1 if mm.group(2)[0] == "+" else -1
                off = datetime.timedelta(hours=int(mm.group(2)[1:3]), minutes=int(mm.group(2)[3:5]))
                when = when - sign * off
    else:
        state = "unknown"
    age = (now - when).total_seconds() if when else None
    return {"state": state, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else None, "age_s": age}


def _parse_rfc3339(text):
    text = text.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    # Drop sub-second digits beyond what fromisoformat (3.10) accepts.
    text = re.sub(r"\.(\d{6})\d+", r".\1", text)
    return datetime.datetime.fromisoformat(text)


def decode_lock(value, now, expiry_s=LOCK_EXPIRY_S):
    """-> None, or {time, namespace, pod, age_s, stale}. Legacy value = bare RFC3339 timestamp."""
    if value is None:
        return None
    parts = value.split(",")
    try:
        when = _parse_rfc3339(parts[0])
    except ValueError as exc:
        raise DecodeError("node lock %r: bad timestamp (%s)" % (value, exc)) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    age = (now - when).total_seconds()
    return {
        "time": parts[0],
        "namespace": parts[1] if len(parts) >= 3 else None,
        "pod": parts[2] if len(parts) >= 3 else None,
        "age_s": age,
        "stale": age > expiry_s,
    }


def decode_cordon(value):
    return [u.strip() for u in (value or "").split(",") if u.strip()]


def encode_cordon(uuids):
    return ",".join(uuids) if uuids else None


def summarize(node, now, expiry_s=LOCK_EXPIRY_S):
    """Everything the seeds' runbooks look at on a node, decoded."""
    meta = node.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = node.get("status") or {}
    out = {
        "name": meta.get("name"),
        "resource_version": meta.get("resourceVersion"),
        "annotations": {k: v for k, v in ann.items() if k.startswith(HAMI_PREFIX)},
        "devices": [],
        "register_error": None,
        "handshake": decode_handshake(ann.get(NODE_HANDSHAKE), now),
        "lock": None,
        "lock_error": None,
        "cordoned_devices": decode_cordon(ann.get(DEVICE_CORDON)),
        "allocatable_gpus": (status.get("allocatable") or {}).get("nvidia.com/gpu"),
        "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
    }
    try:
        out["devices"] = decode_register(ann.get(NODE_REGISTER))
    except DecodeError as exc:
        out["register_error"] = str(exc)
    try:
        out["lock"] = decode_lock(ann.get(NODE_LOCK), now, expiry_s)
    except DecodeError as exc:
        out["lock_error"] = str(exc)
    return out
