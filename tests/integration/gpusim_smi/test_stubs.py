"""gpusim's simulated nvidia-smi and nvidia-cuda-mps-control: formats, state changes, faults."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.unit.plugins import gpusim_states

pytestmark = pytest.mark.integration

BIN = gpusim_states.GPUSIM_BIN
SEED_003_L = """\
GPU 0: NVIDIA H20 (UUID: GPU-2f815c32-768d-d782-1073-db01d7b90215)
MIG 3g.48gb Device 0: (UUID: MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030)
MIG 1g.24gb Device 1: (UUID: MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67)
MIG 1g.12gb Device 2: (UUID: MIG-ac6829e7-b466-50e4-917c-b77aee4c5016)
MIG 1g.12gb Device 3: (UUID: MIG-4e18003f-f745-5d17-b03f-203b7cbb671b)
GPU 1: NVIDIA H20 (UUID: GPU-bafcf1f7-1006-01e5-85e2-684fee364617)
MIG 3g.48gb Device 0: (UUID: MIG-f28b28ea-2a63-569d-8e74-0068dd6efb1c)
MIG 1g.24gb Device 1: (UUID: MIG-9244fc71-c9b9-5a4c-8588-8b991d1df2a1)
MIG 1g.12gb Device 2: (UUID: MIG-70b0f862-2a3b-5056-89f6-4e1bc03f0913)
MIG 1g.12gb Device 3: (UUID: MIG-a93cbeea-c3ce-5933-9512-35fde18fe2fd)
GPU 2: NVIDIA H20 (UUID: GPU-b0c5b618-67d0-f464-9905-e1fd41226305)
MIG 3g.48gb Device 0: (UUID: MIG-de57fa99-1a2b-5462-9a2e-71d72261a6c2)
MIG 1g.24gb Device 1: (UUID: MIG-e25ff671-e5b4-55ca-ae65-7d82bdc026f7)
MIG 1g.12gb Device 2: (UUID: MIG-9429d092-1945-524b-8a22-474247772105)
MIG 1g.12gb Device 3: (UUID: MIG-e99237a2-b951-5f96-af7b-d0c5ecedb6f4)
GPU 3: NVIDIA H20 (UUID: GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6)
GPU 4: NVIDIA H20 (UUID: GPU-39862681-62c1-28f7-0244-5563c070a260)
GPU 5: NVIDIA H20 (UUID: GPU-f055d080-1808-96f1-1c87-70fad19d9040)
GPU 6: NVIDIA H20 (UUID: GPU-4650fca3-dbba-f168-d6bd-338a4ba8f044)
GPU 7: NVIDIA H20 (UUID: GPU-9648f14e-6ab2-46f0-221f-777f7652630b)
"""  # `nvidia-smi -L` as seed 003 prints it (whitespace collapsed)


def smi(state: Path, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "nvidia-smi"), *args],
        env=gpusim_states.gpusim_env(state),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def mps(state: Path, *args: str, stdin: str | None = None, env_extra: dict | None = None):
    env = gpusim_states.gpusim_env(state)
    env.update(env_extra or {})
    return subprocess.run(
        [str(BIN / "nvidia-cuda-mps-control"), *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@pytest.fixture
def h20(tmp_path):
    return gpusim_states.write(tmp_path / "state.json", gpusim_states.h20_state())


@pytest.fixture
def seed_node(tmp_path):
    """The profile of seed 003's node (helper H1's h20-mig-mixed), with a fixed driver so NVML answers."""
    state = tmp_path / "seed.json"
    env = gpusim_states.gpusim_env(state)
    subprocess.run(
        [str(BIN / "gpusim"), "init", "--profile", "h20-mig-mixed", "--state", str(state)],
        env=env,
        check=True,
        capture_output=True,
        timeout=30,
    )
    data = gpusim_states.read(state)
    data["driver_version"] = data["module_version"] = "570.172.08"
    gpusim_states.write(state, data)
    return state


def test_list_matches_seed_003(seed_node):
    out = smi(seed_node, "-L")
    assert out.returncode == 0
    assert (
        out.stdout.splitlines()[1]
        == "  MIG 3g.48gb     Device  0: (UUID: MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030)"
    )
    ours = [re.sub(r"\s+", " ", line).strip() for line in out.stdout.splitlines()]
    assert ours == SEED_003_L.splitlines()


@pytest.mark.timeout(30)
def test_seed_003_driver_hangs_like_nvml(tmp_path):
    state = tmp_path / "seed.json"
    subprocess.run(
        [str(BIN / "gpusim"), "init", "--profile", "h20-mig-mixed", "--state", str(state)],
        env=gpusim_states.gpusim_env(state),
        check=True,
        capture_output=True,
        timeout=30,
    )
    with pytest.raises(subprocess.TimeoutExpired):
        smi(state, "-L", timeout=1.5)


@pytest.mark.timeout(30)
def test_explicit_init_hang_and_driver_not_loaded(h20):
    data = gpusim_states.read(h20)
    data["faults"]["init_hang"] = True
    gpusim_states.write(h20, data)
    with pytest.raises(subprocess.TimeoutExpired):
        smi(h20, "-q", timeout=1.5)
    data["faults"]["init_hang"] = False
    data["driver_loaded"] = False
    gpusim_states.write(h20, data)
    out = smi(h20, "-L")
    assert out.returncode == 9
    assert out.stdout.startswith(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )


def test_query_gpu_csv_formats(h20):
    out = smi(h20, "--query-gpu=index,name,memory.total,mig.mode.current,compute_mode", "--format=csv")
    lines = out.stdout.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], mig.mode.current, compute_mode"
    assert lines[1] == "0, NVIDIA H20, 97871 MiB, Disabled, Default"
    out = smi(h20, "--query-gpu=memory.total,persistence_mode", "--format=csv,noheader,nounits", "-i", "2")
    assert out.stdout == "97871, Enabled\n"
    bad = smi(h20, "--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_mig_mode_pending_then_reset(h20):
    out = smi(h20, "-i", "1", "-mig", "1")
    assert out.returncode == 0
    assert "Warning: MIG mode is in pending enable state for GPU 00000000:34:00.0" in out.stdout
    q = smi(h20, "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader", "-i", "1")
    assert q.stdout == "Disabled, Enabled\n"
    # A GPU with a process cannot be reset.
    data = gpusim_states.read(h20)
    data["gpus"][1]["processes"] = [{"pid": 4242, "used_memory_mib": 100, "name": "python"}]
    gpusim_states.write(h20, data)
    refused = smi(h20, "-r", "-i", "1")
    assert refused.returncode == 255
    assert "The following GPUs could not be reset:" in refused.stdout
    assert "GPU 00000000:34:00.0: In use by another client" in refused.stdout
    mode = smi(h20, "-i", "1", "-mig", "0")
    assert mode.returncode == 255 and "In use by another client" in mode.stdout
    data["gpus"][1]["processes"] = []
    gpusim_states.write(h20, data)
    ok = smi(h20, "-r", "-i", "1")
    assert ok.returncode == 0 and "GPU 00000000:34:00.0 was successfully reset." in ok.stdout
    q = smi(h20, "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader", "-i", "1")
    assert q.stdout == "Enabled, Enabled\n"


def test_create_and_destroy_instances(h20):
    smi(h20, "-i", "0", "-mig", "1")
    smi(h20, "-r")
    out = smi(h20, "mig", "-cgi", "9,1g.24gb,1g.12gb,1g.12gb", "-C", "-i", "0")
    assert out.returncode == 0, out.stdout
    assert "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 3g.48gb (ID  9)" in out.stdout
    mig = gpusim_states.read(h20)["gpus"][0]["mig"]
    parent = gpusim_states.SEED_003_UUIDS[0]
    first = mig["devices"][0]
    assert first["uuid"] == "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_OID, "%s/gi%d" % (parent, first["gi_id"])))
    assert first["memory_mib"] == 47616 and [d["index"] for d in mig["devices"]] == [0, 1, 2, 3]
    full = smi(h20, "mig", "-cgi", "1g.12gb", "-C", "-i", "0")
    assert full.returncode != 0 and "Insufficient Resources" in full.stdout
    busy = smi(h20, "mig", "-dgi", "-i", "0")
    assert busy.returncode == 255 and "In use by another client" in busy.stdout
    assert smi(h20, "mig", "-dci", "-i", "0").returncode == 0
    assert smi(h20, "mig", "-dgi", "-i", "0").returncode == 0
    empty = smi(h20, "mig", "-lgi", "-i", "0")
    assert empty.returncode == 6 and "No GPU instances found" in empty.stdout
    assert smi(h20, "mig", "-lgi", "-i", "1").stdout == "No MIG-enabled devices found.\n"


def test_compute_and_persistence_mode(h20):
    out = smi(h20, "-i", "0", "-c", "EXCLUSIVE_PROCESS")
    assert "Set compute mode to EXCLUSIVE_PROCESS for GPU 00000000:0F:00.0." in out.stdout
    assert gpusim_states.read(h20)["gpus"][0]["compute_mode"] == "Exclusive_Process"
    smi(h20, "-i", "0", "-c", "0")
    assert gpusim_states.read(h20)["gpus"][0]["compute_mode"] == "Default"
    out = smi(h20, "-i", "3", "-pm", "0")
    assert "Disabled persistence mode for GPU" in out.stdout
    assert gpusim_states.read(h20)["gpus"][3]["persistence_mode"] is False


def test_q_and_summary_carry_versions(h20):
    q = smi(h20, "-q", "-i", "0").stdout
    assert re.search(r"^Driver Version\s+: 570\.172\.08$", q, re.M)
    assert re.search(r"^CUDA Version\s+: 12\.8$", q, re.M)
    assert re.search(r"^    GPU UUID\s+: GPU-2f815c32", q, re.M)
    assert "CUDA Version: 12.8" in smi(h20).stdout


def test_q_x_is_the_real_xml_layout(seed_node):
    """``-q -x`` (issue 30's device check compares the agent with it): nvidia_smi_log, per-GPU elements under
    the real tool's names; MIG devices of a MIG GPU; no field gpusim does not model."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(smi(seed_node, "-q", "-x").stdout)
    assert root.tag == "nvidia_smi_log" and root.findtext("driver_version") == "570.172.08"
    assert root.findtext("cuda_version") == "12.8" and root.findtext("attached_gpus") == "8"
    gpus = root.findall("gpu")
    assert gpus[0].get("id") == "00000000:0F:00.0" == gpus[0].findtext("pci/pci_bus_id")
    assert gpus[0].findtext("uuid") == "GPU-2f815c32-768d-d782-1073-db01d7b90215"
    assert gpus[0].findtext("product_name") == "NVIDIA H20"
    assert gpus[0].findtext("fb_memory_usage/total") == "97871 MiB"
    assert (gpus[0].findtext("mig_mode/current_mig"), gpus[3].findtext("mig_mode/current_mig")) == (
        "Enabled", "Disabled")
    assert len(gpus[0].findall("mig_devices/mig_device")) == 4
    assert gpus[3].findtext("mig_devices") == "None"
    one = ET.fromstring(smi(seed_node, "-q", "-x", "-i", "3").stdout)
    assert len(one.findall("gpu")) == 1


@pytest.mark.timeout(60)
def test_mps_control_daemon_lifecycle(h20, tmp_path):
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}
    assert mps(h20, stdin="get_server_list\n", env_extra=env).returncode == 1  # no daemon yet
    assert mps(h20, "-d", env_extra=env).returncode == 0
    pid = int((tmp_path / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    try:
        os.kill(pid, 0)
        assert gpusim_states.read(h20)["mps"]["running"] is True
        assert mps(h20, "-d", env_extra=env).returncode == 1  # one daemon per pipe dir
        out = mps(
            h20,
            stdin="set_default_active_thread_percentage 25\nget_default_active_thread_percentage\n",
            env_extra=env,
        )
        assert out.stdout.splitlines() == ["25.0", "25.0"]
        mps(h20, stdin="set_default_device_pinned_mem_limit 0 24G\n", env_extra=env)
        assert mps(h20, stdin="get_default_device_pinned_mem_limit 0\n", env_extra=env).stdout == "24G\n"
    finally:
        assert mps(h20, stdin="quit\n", env_extra=env).returncode == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("MPS stub daemon did not exit after quit")
    state = gpusim_states.read(h20)["mps"]
    assert state["running"] is False and state["default_active_thread_percentage"] is None


def test_mps_binary_missing_fault(h20):
    data = gpusim_states.read(h20)
    data["faults"]["mps_binary_missing"] = True
    gpusim_states.write(h20, data)
    out = mps(h20, "-d")
    assert out.returncode == 127 and "nvidia-cuda-mps-control: command not found" in out.stderr
    assert json.loads(h20.read_text())["mps"]["running"] is False
