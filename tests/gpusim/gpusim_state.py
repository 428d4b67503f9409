"""gpusim state file helpers (stdlib only: the nvidia-smi stub and containers import this too).

The state file (schema in ``README.md``) is the one source of truth of a simulated GPU node. The C
library ``libnvidia-ml.so.1`` re-reads it when it changes; writers here replace it atomically
(temp file + ``os.replace``) so no reader ever sees a half-written file.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
DEFAULT_STATE_PATH = "/etc/gpusim/state.json"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

# Drivers NVIDIA lists for the NVML init hang on nodes with MIG slices and full GPUs
# (gpu-operator troubleshooting "Pods stuck in Pending state in mixed MIG + full GPU environments").
KNOWN_BAD_DRIVERS = ("570.124.06", "570.133.20", "570.148.08", "570.158.01")
FIXED_DRIVER = "570.172.08"

# XIDs NVIDIA's and HAMi's health checks ignore (application-class errors).
IGNORED_XIDS = (13, 31, 43, 45, 68, 109)


class StateError(ValueError):
    """The state file or a profile is missing or malformed; the message names the file and the fix."""


def state_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The state file to use: explicit path, else ``$GPUSIM_STATE``, else the default."""
    if path:
        return Path(path)
    return Path(os.environ.get("GPUSIM_STATE") or DEFAULT_STATE_PATH)


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def load_profile(name: str) -> dict[str, Any]:
    """Return a fresh copy of profile ``name`` (a full state document)."""
    path = PROFILES_DIR / f"{name}.json"
    if not path.is_file():
        raise StateError(
            f"unknown gpusim profile {name!r}: choose one of {', '.join(list_profiles())}"
        )
    return _parse(path.read_text(encoding="utf-8"), path)


def read_state(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    p = state_path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StateError(
            f"gpusim state file {p} does not exist: create it with "
            f"`gpusim init --profile NAME --state {p}`"
        ) from None
    except OSError as exc:
        raise StateError(f"cannot read gpusim state file {p}: {exc.strerror}") from None
    return _parse(text, p)


def _parse(text: str, path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateError(f"gpusim state file {path} is not valid JSON: {exc}") from None
    validate(doc, str(path))
    return doc


def validate(doc: Any, where: str = "state") -> None:
    """Check the parts every reader relies on; raise StateError naming the field."""
    if not isinstance(doc, dict):
        raise StateError(f"{where}: top level must be a JSON object")
    if doc.get("schema") != SCHEMA_VERSION:
        raise StateError(f"{where}: field 'schema' must be {SCHEMA_VERSION}, got {doc.get('schema')!r}")
    if not isinstance(doc.get("driver_version"), str):
        raise StateError(f"{where}: field 'driver_version' must be a string like '570.172.08'")
    gpus = doc.get("gpus")
    if not isinstance(gpus, list):
        raise StateError(f"{where}: field 'gpus' must be a list")
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise StateError(f"{where}: gpus[{i}] must be an object")
        for key in ("index", "uuid", "name", "pci_bus_id"):
            if key not in gpu:
                raise StateError(f"{where}: gpus[{i}] lacks field '{key}'")
        if gpu["index"] != i:
            raise StateError(f"{where}: gpus[{i}].index is {gpu['index']}, must equal its position {i}")


def write_state(path: str | os.PathLike[str] | None, state: dict[str, Any]) -> Path:
    """Atomically replace the state file (readers see the old or the new file, never a mix)."""
    validate(state, "new state")
    p = state_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state.", suffix=".tmp", dir=str(p.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p


def update_state(
    path: str | os.PathLike[str] | None, fn: Callable[[dict[str, Any]], Any]
) -> dict[str, Any]:
    """Read-modify-write under an advisory lock (``<state>.lock``) so concurrent tools don't lose
    each other's changes. ``fn`` edits the dict in place or returns a replacement dict (any other
    return value is ignored)."""
    p = state_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(str(p) + ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            state = read_state(p)
            result = fn(state)
            new = result if isinstance(result, dict) else state
            write_state(p, new)
            return new
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


# ---- helpers shared by the CLI, the nvidia-smi stub and tests ----

def mig_enabled(gpu: dict[str, Any]) -> bool:
    return int((gpu.get("mig") or {}).get("current", 0) or 0) == 1


def is_mixed_mig(state: dict[str, Any]) -> bool:
    """At least one GPU in MIG mode and at least one full GPU (the seed-003 trigger)."""
    flags = [mig_enabled(g) for g in state.get("gpus", [])]
    return any(flags) and not all(flags)


def init_would_hang(state: dict[str, Any]) -> bool:
    """Mirror of the C library's rule: explicit init hang, or known-bad driver with mixed MIG."""
    faults = state.get("faults") or {}
    if faults.get("init_hang"):
        return True
    return bool(
        faults.get("known_bad_driver_hang", True)
        and state.get("driver_version") in KNOWN_BAD_DRIVERS
        and is_mixed_mig(state)
    )


def set_driver_version(state: dict[str, Any], version: str, cuda: int | None = None) -> None:
    """Install driver ``version``: NVML, module and driver versions all move together."""
    state["driver_version"] = version
    state["module_version"] = version
    major = version.split(".", 1)[0]
    state["nvml_version"] = f"{12 if int(major) < 580 else 13}.{version}"
    if cuda is not None:
        state["cuda_driver_version"] = cuda


def add_xid(state: dict[str, Any], gpu_index: int, xid: int, *, when: int | None = None,
            gi_id: int | None = None, ci_id: int | None = None) -> int:
    """Append an XID event to GPU ``gpu_index``; returns its sequence number (global, increasing)."""
    import time

    gpus = state.get("gpus", [])
    if not 0 <= gpu_index < len(gpus):
        raise StateError(f"no GPU with index {gpu_index} (node has {len(gpus)})")
    seq = 1 + max(
        (int(e.get("seq", 0)) for g in gpus for e in (g.get("xid_events") or [])), default=0
    )
    event: dict[str, Any] = {"seq": seq, "xid": int(xid), "time": int(when or time.time())}
    if gi_id is not None:
        event["gi_id"] = gi_id
        event["ci_id"] = 0 if ci_id is None else ci_id
    gpus[gpu_index].setdefault("xid_events", []).append(event)
    return seq


def copy_state(state: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(state)


def personalize(state: dict[str, Any], node: str) -> dict[str, Any]:
    """Give a state made from a profile the identity of one node: each GPU's UUID and each listed MIG
    device's UUID derived from ``node`` and the profile's (stable per node, distinct across nodes).

    A profile is one machine's: without this, every node made from it would report the same GPU UUIDs,
    which no fleet does (a UUID is unique per board, and HAMi's annotations, metrics and GPU pins name GPUs
    by it). MIG devices created later derive their UUIDs from their GPU's, so they follow."""
    for g in state["gpus"]:
        g["uuid"] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"gpusim/{node}/{g['uuid']}"))
        for m in (g.get("mig") or {}).get("devices") or []:
            m["uuid"] = "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"gpusim/{node}/{m['uuid']}"))
    return state
