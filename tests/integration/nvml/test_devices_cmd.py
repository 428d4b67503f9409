"""``hami-agent devices`` end to end (real CLI process, real pynvml, simulated NVML library)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.gpusim.fixtures import GpusimNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SEED_UUIDS = {
    "GPU-2f815c32-768d-d782-1073-db01d7b90215": ["MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030",
                                                 "MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67",
                                                 "MIG-ac6829e7-b466-50e4-917c-b77aee4c5016",
                                                 "MIG-4e18003f-f745-5d17-b03f-203b7cbb671b"],
    "GPU-bafcf1f7-1006-01e5-85e2-684fee364617": ["MIG-f28b28ea-2a63-569d-8e74-0068dd6efb1c",
                                                 "MIG-9244fc71-c9b9-5a4c-8588-8b991d1df2a1",
                                                 "MIG-70b0f862-2a3b-5056-89f6-4e1bc03f0913",
                                                 "MIG-a93cbeea-c3ce-5933-9512-35fde18fe2fd"],
    "GPU-b0c5b618-67d0-f464-9905-e1fd41226305": ["MIG-de57fa99-1a2b-5462-9a2e-71d72261a6c2",
                                                 "MIG-e25ff671-e5b4-55ca-ae65-7d82bdc026f7",
                                                 "MIG-9429d092-1945-524b-8a22-474247772105",
                                                 "MIG-e99237a2-b951-5f96-af7b-d0c5ecedb6f4"],
    "GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6": [],
    "GPU-39862681-62c1-28f7-0244-5563c070a260": [],
    "GPU-f055d080-1808-96f1-1c87-70fad19d9040": [],
    "GPU-4650fca3-dbba-f168-d6bd-338a4ba8f044": [],
    "GPU-9648f14e-6ab2-46f0-221f-777f7652630b": [],
}


def devices(node: GpusimNode, *args: str, env_overrides: dict[str, str] | None = None,
            timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    env = node.env()
    env.update(env_overrides or {})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hami_agent", "devices", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc, time.monotonic() - t0


def test_json_lists_the_seed_node(gpusim_node: GpusimNode) -> None:
    proc, _ = devices(gpusim_node, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "ok" and doc["driver_version"] == "570.172.08"
    got = {g["uuid"]: [m["uuid"] for m in g["mig_devices"]] for g in doc["gpus"]}
    assert got == SEED_UUIDS
    assert sum(len(v) for v in got.values()) == 12
    assert {g["type"] for g in doc["gpus"]} == {"NVIDIA H20"}


def test_table(gpusim_node: GpusimNode) -> None:
    proc, _ = devices(gpusim_node)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("driver 570.172.08  CUDA 12.8  8 GPUs, 12 MIG devices")
    assert lines[1].split() == ["IDX", "UUID", "TYPE", "MEMORY", "NUMA", "MIG", "HEALTH"]
    assert "GPU-2f815c32-768d-d782-1073-db01d7b90215  NVIDIA H20  97871MiB  0     enabled" in proc.stdout
    mig_rows = [line.split() for line in lines if line.startswith("  ")]
    assert len(mig_rows) == 12
    assert mig_rows[0] == ["0/0", "MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030", "3g.48gb", "47488MiB",
                           "gi=2", "ci=0"]


def test_seed_driver_exits_1_within_timeout_naming_nvmlinit(gpusim_factory) -> None:
    node = gpusim_factory("h20-mig-mixed")  # 570.158.01
    proc, took = devices(node, "--timeout", "2")
    assert proc.returncode == 1
    assert took < 2 + 8
    assert "nvml call nvmlInit did not return within 2s" in proc.stderr
    assert "570.172.08" in proc.stderr  # the remedy
    proc, _ = devices(node, "--timeout", "2", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["status"] == "stuck" and doc["stuck_call"] == "nvmlInit"


@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_bad_timeout_is_usage_error(gpusim_node: GpusimNode, value: str) -> None:
    proc, _ = devices(gpusim_node, "--timeout", value)
    assert proc.returncode == 2
    assert "--timeout" in proc.stderr


def test_missing_library(gpusim_node: GpusimNode, tmp_path) -> None:
    proc, _ = devices(gpusim_node, "--nvml-lib", str(tmp_path / "libnvidia-ml.so.1"))
    assert proc.returncode == 1
    assert f"nvml Init err: NVML library {tmp_path / 'libnvidia-ml.so.1'} does not exist" in proc.stderr
    proc, _ = devices(gpusim_node, env_overrides={"HAMI_NVML_LIBRARY": str(tmp_path / "x.so")})
    assert proc.returncode == 1 and "x.so does not exist" in proc.stderr


def test_corrupt_and_missing_state(gpusim_node: GpusimNode, tmp_path) -> None:
    gpusim_node.state_path.write_text('{"schema": 1,')
    proc, _ = devices(gpusim_node)
    assert proc.returncode == 1
    assert f"gpusim: state file {gpusim_node.state_path} is not valid JSON" in proc.stderr
    assert "nvml Init err: Unknown Error" in proc.stderr
    proc, _ = devices(gpusim_node, env_overrides={"GPUSIM_STATE": str(tmp_path / "none.json")})
    assert proc.returncode == 1
    assert "gpusim: cannot read state file" in proc.stderr


def test_unhealthy_gpu_exits_1(gpusim_node: GpusimNode) -> None:
    gpusim_node.set_lost(7)
    proc, _ = devices(gpusim_node)
    assert proc.returncode == 1
    assert "problem: GPU 7 is lost" in proc.stdout


def test_demo_passes() -> None:
    proc = subprocess.run([sys.executable, "-m", "hami_agent.demo"], capture_output=True, text=True,
                          timeout=80, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS  devices on the fixed driver" in proc.stdout
    assert "PASS  bounded NVML hang on the bad driver" in proc.stdout
