"""module_utils._nvidia_smi / _driver / known_bad_drivers against recorded and realistic outputs."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from ansible_collections.hami.node.plugins.module_utils import _driver, _nvidia_smi, known_bad_drivers

from tests.unit.plugins import gpusim_states

pytestmark = pytest.mark.unit

# Seed 003 as pasted (whitespace collapsed by the blog's formatting).
SEED_003_L = """GPU 0: NVIDIA H20 (UUID: GPU-2f815c32-768d-d782-1073-db01d7b90215)
MIG 3g.48gb Device 0: (UUID: MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030)
MIG 1g.24gb Device 1: (UUID: MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67)
MIG 1g.12gb Device 2: (UUID: MIG-ac6829e7-b466-50e4-917c-b77aee4c5016)
MIG 1g.12gb Device 3: (UUID: MIG-4e18003f-f745-5d17-b03f-203b7cbb671b)
GPU 1: NVIDIA H20 (UUID: GPU-bafcf1f7-1006-01e5-85e2-684fee364617)
GPU 3: NVIDIA H20 (UUID: GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6)
"""

# Realistic A100 outputs, written from nvidia-smi's documented layouts (MIG user guide examples).
A100_L = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 1g.5gb      Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-ac1a44d5-1e6a-4ac1-6a4d-4e5d0e8a9f3c)
"""

A100_QUERY = """index, uuid, name, memory.total [MiB], memory.used [MiB], driver_version, pci.bus_id, \
mig.mode.current, mig.mode.pending, compute_mode, persistence_mode, serial
0, GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77, NVIDIA A100-SXM4-40GB, 40960, 11, 535.183.01, 00000000:07:00.0, \
Enabled, Enabled, Default, Enabled, 1321120012345
1, GPU-ac1a44d5-1e6a-4ac1-6a4d-4e5d0e8a9f3c, NVIDIA A100-SXM4-40GB, 40960, 0, 535.183.01, 00000000:0F:00.0, \
Disabled, Enabled, Exclusive_Process, Disabled, [N/A]
"""

T4_QUERY = (
    "0, GPU-aaaa, Tesla T4, 15360, 0, 535.183.01, 00000000:3B:00.0, [N/A], [N/A], Default, Disabled, 0323\n"
)

A100_LGI = """+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.5gb          19        7          0:1     |
+-------------------------------------------------------+
|   0  MIG 3g.20gb          9        2          4:4     |
+-------------------------------------------------------+
"""

A100_LCI = """+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
|   0      2       MIG 3g.20gb          2         0          0:3     |
+--------------------------------------------------------------------+
"""

A100_LGIP = """+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.5gb        19     6/7        4.75       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.20gb        9     1/2        19.62      No     42     2     0   |
|                                                             3     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.40gb        0     0/1        39.50      No     98     5     0   |
|                                                             7     1     1   |
+-----------------------------------------------------------------------------+
"""

SUMMARY_HEADER = (
    """| NVIDIA-SMI 570.158.01             Driver Version: 570.158.01     CUDA Version: 12.8     |"""
)


def test_parse_list_seed_003_collapsed_whitespace():
    gpus = _nvidia_smi.parse_list(SEED_003_L)
    assert [g["index"] for g in gpus] == [0, 1, 3]
    assert [d["profile"] for d in gpus[0]["mig_devices"]] == ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]
    assert gpus[0]["mig_devices"][3]["uuid"] == "MIG-4e18003f-f745-5d17-b03f-203b7cbb671b"
    assert gpus[1]["mig_devices"] == []


def test_parse_list_real_layout():
    gpus = _nvidia_smi.parse_list(A100_L)
    assert gpus[0]["name"] == "NVIDIA A100-SXM4-40GB"
    assert [(d["profile"], d["index"]) for d in gpus[0]["mig_devices"]] == [("3g.20gb", 0), ("1g.5gb", 1)]


def test_parse_csv_with_header_units_and_na():
    rows = _nvidia_smi.parse_csv(A100_QUERY, _nvidia_smi.QUERY_FIELDS)
    gpus = _nvidia_smi.gpus_from_query(rows)
    assert len(gpus) == 2
    assert gpus[0]["memory_total_mib"] == 40960 and gpus[0]["mig_enabled"] and gpus[0]["mig_capable"]
    assert gpus[1]["mig_enabled"] is False and gpus[1]["mig_pending"] is True
    assert gpus[1]["compute_mode"] == "Exclusive_Process" and gpus[1]["serial"] is None
    t4 = _nvidia_smi.gpus_from_query(_nvidia_smi.parse_csv(T4_QUERY, _nvidia_smi.QUERY_FIELDS))[0]
    assert t4["mig_capable"] is False and t4["mig_enabled"] is False


def test_parse_csv_rejects_wrong_field_count():
    with pytest.raises(ValueError, match="expected 12"):
        _nvidia_smi.parse_csv("0, GPU-x\n", _nvidia_smi.QUERY_FIELDS)


def test_parse_mig_tables():
    assert _nvidia_smi.parse_lgi(A100_LGI) == [
        {"gpu": 0, "profile": "1g.5gb", "profile_id": 19, "gi_id": 7, "start": 0, "size": 1},
        {"gpu": 0, "profile": "3g.20gb", "profile_id": 9, "gi_id": 2, "start": 4, "size": 4},
    ]
    assert _nvidia_smi.parse_lci(A100_LCI) == [
        {"gpu": 0, "gi_id": 2, "profile": "3g.20gb", "profile_id": 2, "ci_id": 0}
    ]
    lgip = _nvidia_smi.parse_lgip(A100_LGIP)
    assert [(p["name"], p["profile_id"], p["free"], p["total"]) for p in lgip] == [
        ("1g.5gb", 19, 6, 7),
        ("3g.20gb", 9, 1, 2),
        ("7g.40gb", 0, 0, 1),
    ]
    assert _nvidia_smi.parse_lgi("No GPU instances found: Not Found\n") == []


def test_versions_from_summary_and_q():
    assert _nvidia_smi.parse_q_versions(SUMMARY_HEADER) == {
        "driver_version": "570.158.01",
        "cuda_version": "12.8",
    }
    q = "Driver Version".ljust(42) + ": 535.183.01\n" + "CUDA Version".ljust(42) + ": 12.2\n"
    assert _nvidia_smi.parse_q_versions(q) == {"driver_version": "535.183.01", "cuda_version": "12.2"}


def test_recorded_stub_outputs_parse(tmp_path):
    """Outputs recorded live from gpusim's nvidia-smi go through the same parsers."""
    state = gpusim_states.write(tmp_path / "state.json", gpusim_states.h20_state())
    env = gpusim_states.gpusim_env(state)
    smi = str(gpusim_states.GPUSIM_BIN / "nvidia-smi")

    def run(*args):
        return subprocess.run([smi, *args], env=env, capture_output=True, text=True, check=False)

    run("-i", "0", "-mig", "1")
    run("-r", "-i", "0")
    run("mig", "-cgi", "3g.48gb,1g.24gb,1g.12gb,1g.12gb", "-C", "-i", "0")
    listing = _nvidia_smi.parse_list(run("-L").stdout)
    assert [d["profile"] for d in listing[0]["mig_devices"]] == ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]
    lgi = _nvidia_smi.parse_lgi(run("mig", "-lgi").stdout)
    assert sorted(g["profile"] for g in lgi) == ["1g.12gb", "1g.12gb", "1g.24gb", "3g.48gb"]
    assert len(_nvidia_smi.parse_lci(run("mig", "-lci").stdout)) == 4
    lgip = {p["name"]: p for p in _nvidia_smi.parse_lgip(run("mig", "-lgip", "-i", "0").stdout)}
    assert lgip["1g.12gb"]["total"] == 7 and lgip["7g.96gb"]["free"] == 0
    rows = _nvidia_smi.parse_csv(
        run("--query-gpu=" + ",".join(_nvidia_smi.QUERY_FIELDS), "--format=csv").stdout,
        _nvidia_smi.QUERY_FIELDS,
    )
    gpus = _nvidia_smi.gpus_from_query(rows)
    assert [g["mig_enabled"] for g in gpus] == [True, False, False, False]
    assert gpus[0]["memory_total_mib"] == 97871


@pytest.mark.timeout(20)
def test_run_bounded_times_out_and_does_not_hang(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    start = time.monotonic()
    with pytest.raises(_nvidia_smi.SmiTimeout, match="NVML hang suspected"):
        _nvidia_smi.run_bounded([sys.executable, str(script)], 0.5)
    assert time.monotonic() - start < 5


def test_run_bounded_uses_c_locale():
    res = _nvidia_smi.run_bounded([sys.executable, "-c", "import os; print(os.environ['LC_ALL'])"], 10)
    assert res.rc == 0 and res.out.strip() == "C"


def test_driver_not_loaded_detection():
    res = _nvidia_smi.SmiResult(
        ["nvidia-smi"],
        9,
        "NVIDIA-SMI has failed because it couldn't communicate with "
        "the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
        "",
    )
    assert res.driver_not_loaded


def test_dpkg_and_versions(tmp_path):
    text = (
        "libnvidia-compute-570-server\t570.172.08-0ubuntu0.22.04.1\tii \n"
        "nvidia-compute-utils-570-server\t570.172.08-0ubuntu0.22.04.1\tii \n"
        "nvidia-driver-535\t535.183.01-0ubuntu1\trc \n"
        "nvidia-utils-570-server\t\tun \n"
    )
    pkgs = _driver.parse_dpkg_query(text)
    assert set(pkgs) == {"libnvidia-compute-570-server", "nvidia-compute-utils-570-server"}
    assert _driver.installed_from_packages(pkgs) == ("570.172.08", "libnvidia-compute-570-server")
    assert _driver.upstream_version("1:570.86.15-1") == "570.86.15"
    assert _driver.branch_of("570.158.01") == "570"
    (tmp_path / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "module" / "nvidia" / "version").write_text("570.158.01\n")
    assert _driver.loaded_version(str(tmp_path)) == "570.158.01"
    assert _driver.loaded_version(str(tmp_path / "nothing")) is None


def test_known_bad_driver_data():
    # the R570 regression of NVIDIA gpu-operator #1361, which seed 003 hit
    versions = known_bad_drivers.sorted_versions()
    assert len(versions) == 4
    assert versions[0] == "570.124.06"  # where the regression starts
    assert "570.158.01" in versions  # seed 003's driver
    for version in versions:
        entry = known_bad_drivers.lookup(version)
        assert entry["reason"] == (
            "NVML hang with mixed MIG + full GPUs (NVIDIA gpu-operator #1361); upgrade to 570.172.08"
        )
        assert entry["version"] == version
    assert known_bad_drivers.lookup("570.172.08") is None
    entry = known_bad_drivers.lookup("570.158.01")
    assert known_bad_drivers.triggered(entry, [True, False]) is True
    assert known_bad_drivers.triggered(entry, [True, True]) is False
    assert known_bad_drivers.triggered(entry, [False]) is False
