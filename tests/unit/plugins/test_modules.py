"""Module-level tests in the community.general style: main() in-process with patch_module_args.

The modules call gpusim's nvidia-smi / nvidia-cuda-mps-control stubs (simulated tools) through PATH.
"""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.hami.node.plugins.modules import (
    kubelet_config,
    nvidia_gpu_info,
    nvidia_mig,
    nvidia_mps,
)

from tests.unit.plugins import gpusim_states
from tests.unit.plugins.moduletest import run_module

pytestmark = pytest.mark.unit


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A simulated H20 node: state file + stubs on PATH + fake sysfs."""
    state = gpusim_states.write(tmp_path / "state.json", gpusim_states.h20_state())
    monkeypatch.setenv("GPUSIM_STATE", str(state))
    monkeypatch.setenv("PATH", "%s:%s" % (gpusim_states.GPUSIM_BIN, os.environ["PATH"]))
    sysfs = tmp_path / "sys"
    (sysfs / "module" / "nvidia").mkdir(parents=True)
    (sysfs / "module" / "nvidia" / "version").write_text("570.172.08\n")
    monkeypatch.setenv("HAMI_SYSFS_ROOT", str(sysfs))
    return state


def set_mig(state, enabled_gpus, driver=None):
    data = gpusim_states.read(state)
    for g in data["gpus"]:
        g["mig"]["current"] = g["mig"]["pending"] = 1 if g["index"] in enabled_gpus else 0
    if driver:
        data["driver_version"] = data["module_version"] = driver
    gpusim_states.write(state, data)


def test_gpu_info_healthy_node(node, monkeypatch):
    res = run_module(nvidia_gpu_info.main, {"packages": False, "timeout": 10}, monkeypatch)
    assert res["changed"] is False and res["driver_loaded"] and res["gpu_count"] == 4
    assert res["driver_version"] == "570.172.08" and res["cuda_version"] == "12.8"
    assert res["known_bad_driver"] is None and not res["reboot_required"]
    assert res["mps_control_present"] is True
    assert res["ansible_facts"]["nvidia"]["gpus"][0]["uuid"] == gpusim_states.SEED_003_UUIDS[0]


@pytest.mark.timeout(30)
def test_gpu_info_seed_003_hang_is_reported_not_hung(node, monkeypatch, tmp_path):
    # Driver 570.158.01 + GPU 0 in MIG, others not: the stub hangs like NVML does.
    set_mig(node, {0}, driver="570.158.01")
    (tmp_path / "sys" / "module" / "nvidia" / "version").write_text("570.158.01\n")
    res = run_module(nvidia_gpu_info.main, {"packages": False, "timeout": 1}, monkeypatch)
    assert res["nvml_hang_suspected"] is True and "NVML hang suspected" in res["hang_message"]
    assert res["known_bad_driver"]["version"] == "570.158.01"
    assert "gpu-operator #1361" in res["known_bad_driver"]["reason"]
    res = run_module(
        nvidia_gpu_info.main, {"packages": False, "timeout": 1, "fail_on_hang": True}, monkeypatch
    )
    assert res["failed"] and "570.172.08" in res["msg"]


def test_gpu_info_known_bad_without_trigger_and_mismatch(node, monkeypatch, tmp_path):
    set_mig(node, set(), driver="570.158.01")
    (tmp_path / "sys" / "module" / "nvidia" / "version").write_text("570.148.08\n")
    data = gpusim_states.read(node)
    data["gpus"][1]["mig"]["pending"] = 1
    gpusim_states.write(node, data)
    res = run_module(nvidia_gpu_info.main, {"packages": False}, monkeypatch)
    assert (
        res["known_bad_driver"]["version"] == "570.148.08" and res["known_bad_driver"]["triggered"] is False
    )
    assert res["reboot_required"] and any(
        "GPU 1 MIG mode is pending enable" in r for r in res["reboot_reasons"]
    )


def test_gpu_info_without_driver_degrades(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("HAMI_SYSFS_ROOT", str(tmp_path))
    res = run_module(nvidia_gpu_info.main, {"packages": False}, monkeypatch)
    assert res["driver_loaded"] is False and res["nvidia_smi_found"] is False and res["gpus"] == []


def test_gpu_info_driver_not_loaded(node, monkeypatch):
    data = gpusim_states.read(node)
    data["driver_loaded"] = False
    gpusim_states.write(node, data)
    res = run_module(nvidia_gpu_info.main, {"packages": False}, monkeypatch)
    assert res["gpus"] == [] and "couldn't communicate with the NVIDIA driver" in res["smi_error"]


def test_mig_check_mode_changes_nothing(node, monkeypatch):
    before = node.read_text()
    args = {"gpus": [{"index": 0, "profiles": ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]}]}
    res = run_module(nvidia_mig.main, args, monkeypatch, check_mode=True, diff=True)
    assert res["changed"] and res["actions"] == [
        "GPU 0: enable MIG mode",
        "GPU 0: reset",
        "GPU 0: create 3g.48gb,1g.24gb,1g.12gb,1g.12gb",
    ]
    assert res["diff"]["before"]["gpu0"] == {"mig_enabled": False, "mig_devices": {}}
    assert res["diff"]["after"]["gpu0"]["mig_devices"] == {"1g.12gb": 2, "1g.24gb": 1, "3g.48gb": 1}
    assert node.read_text() == before


def test_mig_rejects_profile_of_other_model(node, monkeypatch):
    res = run_module(nvidia_mig.main, {"gpus": [{"index": 1, "profiles": ["1g.10gb"]}]}, monkeypatch)
    assert res["failed"] and "valid profiles: 1g.12gb" in res["msg"]


def test_mig_busy_gpu_reset_leaves_mode_pending(node, monkeypatch):
    data = gpusim_states.read(node)
    data["gpus"][2]["mig"]["pending"] = 1  # someone already asked for MIG
    data["gpus"][2]["processes"] = [{"pid": 4242, "used_memory_mib": 1024, "name": "python"}]
    gpusim_states.write(node, data)
    res = run_module(nvidia_mig.main, {"gpus": [{"index": 2, "profiles": ["7g.96gb"]}]}, monkeypatch)
    assert res["reboot_required"] and res["pending_gpus"] == [2]
    assert gpusim_states.read(node)["gpus"][2]["mig"]["current"] == 0


def test_mps_missing_binary_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    sysfs = tmp_path / "sys" / "module" / "nvidia"
    sysfs.mkdir(parents=True)
    (sysfs / "version").write_text("570.172.08\n")
    res = run_module(
        nvidia_mps.main, {"sysfs_root": str(tmp_path / "sys"), "pipe_dir": str(tmp_path / "p")}, monkeypatch
    )
    assert res["failed"]
    assert "executable file not found in $PATH" in res["msg"]
    assert "apt-get install nvidia-compute-utils-570" in res["msg"]
    stopped = run_module(nvidia_mps.main, {"state": "stopped", "pipe_dir": str(tmp_path / "p")}, monkeypatch)
    assert stopped["changed"] is False and stopped["running"] is False


def test_mps_check_mode_does_not_start(node, monkeypatch, tmp_path):
    args = {
        "pipe_dir": str(tmp_path / "pipe"),
        "log_dir": str(tmp_path / "log"),
        "default_active_thread_percentage": 50,
    }
    res = run_module(nvidia_mps.main, args, monkeypatch, check_mode=True, diff=True)
    assert res["changed"] and "start MPS control daemon" in res["actions"]
    assert res["diff"]["before"]["running"] is False and res["diff"]["after"]["running"] is True
    assert not (tmp_path / "pipe").exists() and not gpusim_states.read(node)["mps"]["running"]


def test_kubelet_config_check_mode_and_diff(tmp_path, monkeypatch):
    cfg = tmp_path / "kubelet-config.yaml"
    cfg.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n# keep me\nmaxPods: 110\n"
    )
    env = tmp_path / "kubelet.env"
    env.write_text('KUBE_LOG_LEVEL="--v=2"\n')
    args = {"path": str(cfg), "verbosity": 4, "flag_files": [str(env)]}
    res = run_module(kubelet_config.main, args, monkeypatch, check_mode=True, diff=True)
    assert res["changed"] and res["restart_required"]
    assert "logging:\n  verbosity: 4" in res["diff"][0]["after"] and "# keep me" in res["diff"][0]["after"]
    assert res["flag_overrides"][0]["flag"] == "--v=2" and res["flag_overrides"][0]["managed"] is False
    assert "logging:" not in cfg.read_text()
    res = run_module(kubelet_config.main, dict(args, flag_policy="manage"), monkeypatch)
    assert res["changed"] and env.read_text() == 'KUBE_LOG_LEVEL="--v=4"\n'
    assert "# keep me" in cfg.read_text()
    again = run_module(kubelet_config.main, dict(args, flag_policy="manage"), monkeypatch)
    assert again["changed"] is False and again["restart_required"] is False


def test_kubelet_config_refuses_other_kinds(tmp_path, monkeypatch):
    cfg = tmp_path / "x.yaml"
    cfg.write_text("apiVersion: v1\nkind: ConfigMap\n")
    res = run_module(
        kubelet_config.main, {"path": str(cfg), "settings": {"maxPods": 1}, "flag_files": []}, monkeypatch
    )
    assert res["failed"] and "expected kind KubeletConfiguration" in res["msg"]
    res = run_module(
        kubelet_config.main, {"path": str(tmp_path / "missing.yaml"), "flag_files": []}, monkeypatch
    )
    assert res["failed"] and "create=true" in res["msg"]


def test_kubelet_dropin_is_json(tmp_path, monkeypatch):
    path = tmp_path / "50-hami.conf"
    res = run_module(
        kubelet_config.main,
        {"path": str(path), "dropin": True, "settings": {"maxPods": 64}, "flag_files": []},
        monkeypatch,
    )
    assert res["changed"]
    assert json.loads(path.read_text()) == {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "maxPods": 64,
    }
    again = run_module(
        kubelet_config.main,
        {"path": str(path), "dropin": True, "settings": {"maxPods": 64}, "flag_files": []},
        monkeypatch,
    )
    assert again["changed"] is False


def test_mig_refuses_seed_003_layout_on_known_bad_driver(node, monkeypatch):
    """Splitting GPUs 0-2 while 3 stays whole on 570.158.01 is exactly seed 003's NVML hang: refuse."""
    set_mig(node, set(), driver="570.158.01")
    before = node.read_text()
    layout = [{"index": i, "profiles": ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]} for i in range(3)]
    res = run_module(nvidia_mig.main, {"gpus": layout}, monkeypatch)
    assert res["failed"] and "known bad" in res["msg"] and "570.172.08" in res["msg"]
    assert node.read_text() == before
    # All GPUs in MIG is not the trigger: allowed.
    every = layout + [{"index": 3, "profiles": ["7g.96gb"]}]
    assert run_module(nvidia_mig.main, {"gpus": every}, monkeypatch, check_mode=True)["changed"] is True
    forced = run_module(
        nvidia_mig.main, {"gpus": layout, "allow_known_bad_driver": True}, monkeypatch, check_mode=True
    )
    assert forced["changed"] is True and "failed" not in forced


def test_gpu_info_installed_vs_loaded_from_dpkg(node, monkeypatch, tmp_path):
    """A driver upgrade installed but not loaded yet (the state seed 003's fix leaves until reboot)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    dpkg = fake / "dpkg-query"
    dpkg.write_text(
        "#!/bin/sh\n"
        "printf 'libnvidia-compute-570-server\\t570.172.08-0ubuntu0.22.04.1\\tii \\n'\n"
        "printf 'nvidia-compute-utils-570-server\\t570.172.08-0ubuntu0.22.04.1\\tii \\n'\n"
        "exit 1\n"  # real dpkg-query exits 1 when one pattern matched nothing
    )
    dpkg.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake, os.environ["PATH"]))
    (tmp_path / "sys" / "module" / "nvidia" / "version").write_text("570.158.01\n")
    res = run_module(nvidia_gpu_info.main, {}, monkeypatch)
    assert res["driver_version_installed"] == "570.172.08"
    assert res["driver_package"] == "libnvidia-compute-570-server"
    assert res["version_mismatch"] and res["reboot_required"]
    assert "loaded driver 570.158.01 differs from installed 570.172.08" in res["reboot_reasons"][0]
    assert res["packages"]["nvidia-compute-utils-570-server"] == "570.172.08-0ubuntu0.22.04.1"
