"""hami.node.nvidia_driver_facts: the nvidia_driver role's one reading, every branch with fakes.

dpkg-query and nvidia-smi are shell fakes on PATH; the NVML probe is the source the module runs, so a fake
probe is a few lines of Python (the role passes its files/nvml_probe.py). A hung probe sleeps past the
deadline: the module must answer anyway, with the role's hang text.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.hami.node.plugins.modules import nvidia_driver_facts

from tests.unit.plugins.moduletest import run_module

pytestmark = pytest.mark.unit

ROLE_PROBE = Path(__file__).resolve().parents[3] / "roles" / "nvidia_driver" / "files" / "nvml_probe.py"
PKGS = ["nvidia-driver-570", "nvidia-utils-570", "libnvidia-compute-570", "nvidia-compute-utils-570"]
PROBE_OK = 'print(\'{"ok": true, "driver_version": "570.172.08", "device_count": 4}\')'
PROBE_ERR = (
    "import sys\n"
    'print(\'{"ok": false, "error": "nvml Init err: Driver/library version mismatch (18)"}\')\n'
    "sys.exit(1)\n"
)
PROBE_HANG = "import time\ntime.sleep(60)\n"


def _script(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A fake node: dpkg-query knows the driver packages (utils held), nvidia-smi answers, module loaded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(
        bin_dir,
        "dpkg-query",
        # what dpkg-query --show prints: one line per known package, exit 1 when one is unknown
        "printf 'nvidia-driver-570\\t570.172.08-0ubuntu1\\tii \\tinstall\\n'\n"
        "printf 'nvidia-utils-570\\t570.172.08-0ubuntu1\\thi \\thold\\n'\n"
        "printf 'libnvidia-compute-570\\t\\tun \\tunknown\\n'\n"
        "echo 'dpkg-query: no packages found matching nvidia-compute-utils-570' >&2\n"
        "exit 1\n",
    )
    _script(bin_dir, "nvidia-smi", "printf '570.172.08\\n570.172.08\\n'\n")
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bin_dir)
    version_file = tmp_path / "version"
    version_file.write_text("570.172.08\n")
    mps = tmp_path / "nvidia-cuda-mps-control"
    mps.write_text("")
    return {"bin": bin_dir, "version_file": version_file, "mps": mps}


def _args(node, **extra):
    args = {
        "packages": PKGS,
        "module_version_file": str(node["version_file"]),
        "mps_control_path": str(node["mps"]),
        "nvml_probe": PROBE_OK,
        "nvidia_smi": True,
        "timeout": 10,
    }
    args.update(extra)
    return args


def test_healthy_node_in_one_call(node, monkeypatch):
    res = run_module(nvidia_driver_facts.main, _args(node), monkeypatch)
    assert res["changed"] is False
    assert res["packages"] == {
        "nvidia-driver-570": "570.172.08-0ubuntu1",
        "nvidia-utils-570": "570.172.08-0ubuntu1",
    }
    assert res["selections"] == {
        "nvidia-driver-570": "install",
        "nvidia-utils-570": "hold",
        "libnvidia-compute-570": "unknown",
    }
    assert res["installed_version"] == "570.172.08" and res["loaded_version"] == "570.172.08"
    assert res["known_bad_installed"] is False and res["known_bad_loaded"] is False
    assert res["mps_control_exists"] is True
    assert res["nvml"] == {
        "ok": True,
        "hung": False,
        "rc": 0,
        "driver_version": "570.172.08",
        "device_count": 4,
        "error": "",
    }
    assert res["nvidia_smi"]["rc"] == 0 and res["nvidia_smi"]["stdout_lines"] == ["570.172.08", "570.172.08"]


def test_check_mode_reads_the_same(node, monkeypatch):
    res = run_module(nvidia_driver_facts.main, _args(node), monkeypatch, check_mode=True)
    assert res["changed"] is False and res["nvml"]["ok"] is True and res["installed_version"] == "570.172.08"


@pytest.mark.timeout(30)
def test_hung_nvml_is_reported_with_the_roles_text(node, monkeypatch):
    # seed 003: NVML never answers; nvidia-smi hangs with it. One deadline for both (they run side by side).
    _script(node["bin"], "nvidia-smi", "sleep 60\n")
    res = run_module(nvidia_driver_facts.main, _args(node, nvml_probe=PROBE_HANG, timeout=1), monkeypatch)
    assert res["nvml"]["hung"] is True and res["nvml"]["ok"] is False and res["nvml"]["rc"] == 124
    assert res["nvml"]["error"] == "nvml Init hang: NVML did not answer within 1s"
    assert res["nvml"]["driver_version"] is None and res["nvml"]["device_count"] is None
    assert res["nvidia_smi"]["rc"] == 124
    # the rest of the reading is there all the same
    assert res["installed_version"] == "570.172.08" and res["loaded_version"] == "570.172.08"


def test_fractional_timeout_is_printed_as_given(node, monkeypatch):
    res = run_module(nvidia_driver_facts.main, _args(node, nvml_probe=PROBE_HANG, timeout=0.5), monkeypatch)
    assert res["nvml"]["error"] == "nvml Init hang: NVML did not answer within 0.5s"


def test_nvml_error_keeps_the_probes_message(node, monkeypatch):
    res = run_module(nvidia_driver_facts.main, _args(node, nvml_probe=PROBE_ERR), monkeypatch)
    assert res["nvml"]["ok"] is False and res["nvml"]["hung"] is False and res["nvml"]["rc"] == 1
    assert res["nvml"]["error"] == "nvml Init err: Driver/library version mismatch (18)"


def test_probe_without_json_reports_its_stderr(node, monkeypatch):
    res = run_module(
        nvidia_driver_facts.main,
        _args(node, nvml_probe="import sys\nsys.exit('no ctypes here')\n"),
        monkeypatch,
    )
    assert res["nvml"]["rc"] == 1 and res["nvml"]["error"] == "no ctypes here"


def test_the_roles_probe_without_nvml_library(node, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(node["bin"]))  # no libnvidia-ml.so.1 anywhere we point
    res = run_module(nvidia_driver_facts.main, _args(node, nvml_probe=ROLE_PROBE.read_text()), monkeypatch)
    if res["nvml"]["rc"] == 0:
        pytest.skip("this machine has a real libnvidia-ml.so.1")
    assert res["nvml"]["rc"] == 2 and res["nvml"]["error"].startswith("libnvidia-ml.so.1 not found")


def test_missing_package_module_file_and_binary(node, monkeypatch, tmp_path):
    _script(
        node["bin"],
        "dpkg-query",
        "echo 'dpkg-query: no packages found matching nvidia-driver-570' >&2\nexit 1\n",
    )
    res = run_module(
        nvidia_driver_facts.main,
        _args(
            node, module_version_file=str(tmp_path / "absent"), mps_control_path=str(tmp_path / "absent-mps")
        ),
        monkeypatch,
    )
    assert res["packages"] == {} and res["selections"] == {}
    assert res["installed_version"] == "" and res["loaded_version"] == ""
    assert res["known_bad_installed"] is False and res["known_bad_loaded"] is False
    assert res["mps_control_exists"] is False


def test_without_dpkg_query_nothing_is_installed(node, monkeypatch):
    (node["bin"] / "dpkg-query").unlink()
    monkeypatch.setenv("PATH", str(node["bin"]))
    res = run_module(nvidia_driver_facts.main, _args(node), monkeypatch)
    assert res["packages"] == {} and res["installed_version"] == ""


def test_nvidia_smi_failing_and_missing(node, monkeypatch):
    _script(
        node["bin"],
        "nvidia-smi",
        # \047: the apostrophe of "couldn't", inside the shell's single quotes
        "printf 'NVIDIA-SMI has failed because it couldn\\047t communicate with the NVIDIA driver.\\n'\n"
        "exit 9\n",
    )
    res = run_module(nvidia_driver_facts.main, _args(node), monkeypatch)
    assert res["nvidia_smi"]["rc"] == 9 and "couldn't communicate" in res["nvidia_smi"]["stdout"]
    (node["bin"] / "nvidia-smi").unlink()
    monkeypatch.setenv("PATH", str(node["bin"]))
    res = run_module(nvidia_driver_facts.main, _args(node), monkeypatch)
    assert res["nvidia_smi"]["rc"] == 127 and res["nvidia_smi"]["stdout_lines"] == []
    assert "not found" in res["nvidia_smi"]["stderr"]


def test_plan_reading_probes_nothing(node, monkeypatch):
    args = _args(node, nvidia_smi=False)
    del args["nvml_probe"]
    res = run_module(nvidia_driver_facts.main, args, monkeypatch)
    assert res["nvml"] is None and res["nvidia_smi"] is None and res["installed_version"] == "570.172.08"


def test_known_bad_from_the_list_and_the_sites_own(node, monkeypatch):
    node["version_file"].write_text("570.158.01\n")  # on the collection's list (gpu-operator #1361)
    res = run_module(
        nvidia_driver_facts.main,
        _args(
            node, known_bad_extra=[{"version": "570.172.08", "reason": "site: breaks our CUDA 12.8 images"}]
        ),
        monkeypatch,
    )
    assert res["known_bad_loaded"] is True and res["known_bad_installed"] is True


def test_malformed_known_bad_extra_names_the_setting(node, monkeypatch):
    res = run_module(
        nvidia_driver_facts.main, _args(node, known_bad_extra=[{"reason": "no version"}]), monkeypatch
    )
    assert res["failed"] and "nvidia_driver_known_bad_versions" in res["msg"] and "'version'" in res["msg"]


def test_main_package_picks_the_installed_version(node, monkeypatch):
    res = run_module(nvidia_driver_facts.main, _args(node, main_package="libnvidia-compute-570"), monkeypatch)
    assert res["installed_version"] == ""  # dpkg knows it, but it is not installed ("un")


def test_timeout_must_be_positive(node, monkeypatch):
    res = run_module(nvidia_driver_facts.main, _args(node, timeout=0), monkeypatch)
    assert res["failed"] and "nvidia_driver_verify_timeout" in res["msg"]


def test_signal_exit_reads_like_timeouts():
    assert nvidia_driver_facts.nvml_result(137, "", "", timeout=30)["hung"] is True
    assert nvidia_driver_facts.nvml_result(137, "", "", timeout=30)["error"].endswith("within 30s")
