"""Small gpusim state files for module tests (schema: tests/gpusim/README.md).

Self-contained so the module tests do not depend on the profile files; the UUIDs of the H20 node are the
ones seed 003 prints.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

H20_CATALOG = [
    {"name": "1g.12gb", "profile_id": 19, "memory_mib": 11264, "max_instances": 7, "sm_count": 8},
    {"name": "1g.12gb+me", "profile_id": 20, "memory_mib": 11264, "max_instances": 1, "sm_count": 8},
    {"name": "1g.24gb", "profile_id": 15, "memory_mib": 23552, "max_instances": 4, "sm_count": 8},
    {"name": "2g.24gb", "profile_id": 14, "memory_mib": 23552, "max_instances": 3, "sm_count": 16},
    {"name": "3g.48gb", "profile_id": 9, "memory_mib": 47616, "max_instances": 2, "sm_count": 26},
    {"name": "4g.48gb", "profile_id": 5, "memory_mib": 47616, "max_instances": 1, "sm_count": 32},
    {"name": "7g.96gb", "profile_id": 0, "memory_mib": 95232, "max_instances": 1, "sm_count": 60},
]

SEED_003_UUIDS = [
    "GPU-2f815c32-768d-d782-1073-db01d7b90215",
    "GPU-bafcf1f7-1006-01e5-85e2-684fee364617",
    "GPU-b0c5b618-67d0-f464-9905-e1fd41226305",
    "GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6",
]


def _gpu(index: int, uuid: str) -> dict:
    return {
        "index": index,
        "uuid": uuid,
        "name": "NVIDIA H20",
        "serial": "16502240000%02d" % index,
        "pci_bus_id": "00000000:%02X:00.0" % (0x0F + 0x25 * index),
        "pci_device_id": "0x233010DE",
        "numa_node": 0,
        "memory_total_mib": 97871,
        "memory_used_mib": 0,
        "memory_info_supported": True,
        "persistence_mode": True,
        "compute_mode": "Default",
        "mig": {"capable": True, "current": 0, "pending": 0, "gpu_instances": [], "devices": []},
        "processes": [],
    }


def h20_state(gpus: int = 4, driver: str = "570.172.08") -> dict:
    """A 4x H20 node, MIG disabled everywhere, driver outside the known-bad list."""
    return {
        "schema": 1,
        "profile": "test-h20",
        "driver_version": driver,
        "cuda_driver_version": 12080,
        "driver_loaded": True,
        "module_version": driver,
        "faults": {
            "init_hang": False,
            "known_bad_driver_hang": True,
            "hang_after_calls": None,
            "hang_functions": [],
            "mps_binary_missing": False,
        },
        "gpus": [_gpu(i, SEED_003_UUIDS[i]) for i in range(gpus)],
        "mig_profiles": {"NVIDIA H20": copy.deepcopy(H20_CATALOG)},
        "mps": {
            "running": False,
            "pipe_dir": "/tmp/nvidia-mps",
            "log_dir": "/var/log/nvidia-mps",
            "default_active_thread_percentage": None,
            "pinned_mem_limits": {},
        },
    }


def write(path: Path, state: dict) -> Path:
    path.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    return path


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


REPO = Path(__file__).resolve().parents[3]
GPUSIM_BIN = REPO / "tests" / "gpusim" / "bin"


def gpusim_env(state: Path, extra_path: bool = True) -> dict:
    env = dict(os.environ)
    env["GPUSIM_STATE"] = str(state)
    env["LC_ALL"] = "C"
    if extra_path:
        env["PATH"] = "%s:%s" % (GPUSIM_BIN, env.get("PATH", ""))
    return env
