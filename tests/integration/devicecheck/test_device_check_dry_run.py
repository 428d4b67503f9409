"""Issue 30's dry run: ``scripts/device_check.py --nvml-lib <gpusim>`` exactly as it runs on a lent GPU
machine, on gpusim's ``h100-sxm`` node, so the prepared real-hardware check cannot rot between lent machines.

Every check whose logic runs on gpusim must pass here; only those that need real CUDA (a CUDA program under
HAMi-core's libvgpu.so, building libvgpu.so) answer not-supported-here. The report must be what a lent
machine's run hands back: device-check.json, device-check.md and evidence.tar.gz with the raw answers
(nvidia-smi -q -x, the NVML dump) needed to correct the gpusim profile. docs/hardware.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.gpusim.fixtures import gpusim_lib  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "device_check.py"
RUN_ON_GPUSIM = {"inventory", "nvml-events", "nvml-xid-table", "nvml-stuck", "device-plugin", "dra",
                 "monitor-workload", "hami-core-region", "doctor"}
NEED_CUDA = {"hami-core-build", "hami-core-limits"}


def _leftovers(marker: str) -> list[str]:
    """Processes whose command line or environment names this run's work folder (every process the dry run
    starts, NVML workers included, inherits GPUSIM_STATE=<work>/gpusim-state.json)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmd or marker in environ:
            out.append(f"{entry.name}: {cmd[:200]}")
    return out


def test_device_check_dry_run_on_gpusim(gpusim_lib, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    work = Path("/tmp") / f"hdc-test-{os.getpid()}"  # short: unix socket paths stay under 108 bytes
    env = {**os.environ, "PYTHONPATH": ""}  # the script puts agent/ and the repository on its own path
    env.pop("GPUSIM_STATE", None)
    env.pop("HAMI_NVML_LIBRARY", None)
    t0 = time.monotonic()
    argv = [sys.executable, str(SCRIPT), "--out", str(out), "--nvml-lib", str(gpusim_lib),
            "--deadline", "150", "--work", str(work)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    stdout, _ = proc.communicate(timeout=170)
    took = time.monotonic() - t0
    assert sorted(p.name for p in out.iterdir()) == ["device-check.json", "device-check.md",
                                                     "evidence.tar.gz"]
    doc = json.loads((out / "device-check.json").read_text())
    status = {c["name"]: c["status"] for c in doc["checks"]}
    assert {n for n, s in status.items() if s == "pass"} == RUN_ON_GPUSIM, (status, stdout[-4000:])
    assert {n for n, s in status.items() if s == "not-supported-here"} == NEED_CUDA, status
    assert proc.returncode == 0 and doc["meta"]["exit_code"] == 0, stdout[-4000:]
    assert doc["meta"]["mode"] == "dry-run (gpusim)" and not doc["meta"]["not_reached"]
    for c in doc["checks"]:
        assert c["evidence"] and c["duration_s"] >= 0, c
    by = {c["name"]: c for c in doc["checks"]}
    # what the evidence says is what was checked
    inventory = by["inventory"]["evidence"]
    assert "81559MiB" in inventory and "driver 580.65.06, CUDA 13.0" in inventory
    rows = {r["field"]: r["result"] for r in by["inventory"]["details"]["rows"]}
    for fld in ("uuid", "name", "memory_mib", "pci_bus_id", "mig_mode.current", "compute_capability",
                "driver_version", "cuda_version"):
        assert rows[fld] == "equal", (fld, rows)
    assert "NvmlTimeout in nvmlInit" in by["nvml-stuck"]["evidence"]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=81559m, then 4096m/30%" in by["device-plugin"]["evidence"]
    gpa = by["device-plugin"]["details"]["get_preferred_allocation_s"]
    assert gpa["calls"] == 300 and gpa["p99"] < gpa["p99_limit"] == 0.25  # real hardware: 50 ms
    assert "memory 81559Mi, cores 100" in by["dra"]["evidence"]
    assert "default/hami-core-share used 3072 MiB of 4096 MiB" in by["hami-core-region"]["evidence"]
    assert "no false verdict" in by["doctor"]["evidence"]
    md = (out / "device-check.md").read_text()
    assert "| inventory | **pass** |" in md and "| hami-core-limits | **not-supported-here** |" in md
    with tarfile.open(out / "evidence.tar.gz") as tf:
        names = set(tf.getnames())
        dump = json.loads(tf.extractfile("evidence/nvml-dump.json").read())
    assert {"evidence/nvidia-smi-q.xml", "evidence/nvml-dump.json", "evidence/hami-agent-devices.json",
            "evidence/logs/device-plugin.log", "evidence/allocate-share.json"} <= names, sorted(names)
    assert dump["gpus"][0]["nvmlDeviceGetName"] == "NVIDIA H100 80GB HBM3"
    assert took < 60, f"the dry run took {took:.0f}s (make test's fast form must stay well under a minute)"
    # nothing it started outlives it
    assert not _leftovers(str(work)), _leftovers(str(work))
    subprocess.run(["rm", "-rf", str(work)], check=False, timeout=30)
