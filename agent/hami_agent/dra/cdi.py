"""CDI spec files for prepared claims (Container Device Interface, cncf-tags/container-device-interface
``SPEC.md``): the container runtime applies a device's ``containerEdits`` to every container the kubelet
passes its CDI ID to.

One spec file per claim, ``<cdi-dir>/<vendor>-<class>_<claim UID>.json`` with kind ``<driver>/claim``
(vendor = the driver name, class ``claim``), one CDI device per claim request named
``<claim UID>-<request>`` (``/`` of a subrequest becomes ``-``). Its edits are HAMi-core's environment and
mounts for the request's devices, built by the device plugin's Allocate code, so a claim and an Allocate
for the same memory and cores give a container the same limits.

Written atomically (temporary file, fsync, rename), mode 0644 (runtimes read it; it holds no secret).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

CDI_VERSION = "0.6.0"  # env and mounts; nothing newer is needed
CLASS = "claim"


@dataclass(frozen=True)
class CdiDevice:
    name: str  # CDI device name (unique within the kind)
    env: dict[str, str]
    mounts: tuple[tuple[str, str, bool], ...]  # (container path, host path, read-only)


def kind(driver: str) -> str:
    return f"{driver}/{CLASS}"


def device_name(claim_uid: str, request: str) -> str:
    return f"{claim_uid}-{re.sub(r'[^A-Za-z0-9_.:-]', '-', request)}"


def device_id(driver: str, name: str) -> str:
    """The fully qualified CDI device ID the kubelet passes to the runtime: ``<kind>=<name>``."""
    return f"{kind(driver)}={name}"


def spec_path(cdi_dir: str, driver: str, claim_uid: str) -> str:
    return os.path.join(cdi_dir, f"{driver}-{CLASS}_{claim_uid}.json")


def spec(driver: str, devices: list[CdiDevice]) -> dict[str, Any]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind(driver),
        "devices": [{
            "name": d.name,
            "containerEdits": {
                "env": [f"{k}={v}" for k, v in sorted(d.env.items())],
                "mounts": [{"hostPath": host, "containerPath": ctr,
                            "options": ["ro" if ro else "rw", "nosuid", "nodev", "bind"]}
                           for ctr, host, ro in d.mounts],
            },
        } for d in devices],
    }


def write_spec(cdi_dir: str, driver: str, claim_uid: str, devices: list[CdiDevice]) -> str:
    """Write (or replace) the claim's spec file atomically; returns its path."""
    os.makedirs(cdi_dir, exist_ok=True)
    path = spec_path(cdi_dir, driver, claim_uid)
    data = json.dumps(spec(driver, devices), indent=1, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=cdi_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def remove_spec(cdi_dir: str, driver: str, claim_uid: str) -> bool:
    """Remove the claim's spec file; False when there was none (unprepare is idempotent)."""
    try:
        os.unlink(spec_path(cdi_dir, driver, claim_uid))
        return True
    except FileNotFoundError:
        return False


def read_spec(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def resolve(cdi_dir: str, device_ids: list[str]) -> dict[str, Any]:
    """What a CDI-aware runtime injects for ``device_ids``: merged env (later wins) and mounts. Used by the
    simulated kubelet and the tests; unknown IDs raise ``KeyError`` (the runtime fails the container)."""
    env: dict[str, str] = {}
    mounts: list[dict[str, Any]] = []
    wanted = set(device_ids)
    found: set[str] = set()
    for entry in sorted(os.listdir(cdi_dir)) if os.path.isdir(cdi_dir) else []:
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        doc = read_spec(os.path.join(cdi_dir, entry))
        for dev in doc.get("devices") or []:
            ident = f"{doc.get('kind')}={dev.get('name')}"
            if ident not in wanted:
                continue
            found.add(ident)
            edits = dev.get("containerEdits") or {}
            for item in edits.get("env") or []:
                k, _, v = item.partition("=")
                env[k] = v
            mounts += edits.get("mounts") or []
    missing = wanted - found
    if missing:
        raise KeyError(f"unresolvable CDI devices {', '.join(sorted(missing))}")
    return {"env": env, "mounts": mounts}
