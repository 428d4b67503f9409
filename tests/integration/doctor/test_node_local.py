"""`doctor node --local` on a simulated GPU node (gpusim NVML + driver files) and shared regions."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.gpusim.fixtures import BIN_DIR
from tests.integration.doctor.helpers import REGISTER, codes, host_root_from_gpusim, node, run_doctor, verdict

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

BAD = "570.158.01"


def _local(capsys, api, root: Path, lib: Path | str, *extra: str, nvml_timeout: str = "20"):
    """A hang test passes a short ``nvml_timeout``; the others a long one, so that a slow worker start on a
    busy machine is never mistaken for a hang."""
    return run_doctor(capsys, "node", "ai-app-8-1-msxf", "--kubeconfig", api.kubeconfig_path, "--local",
                      "--host-root", str(root), "--nvml-lib", str(lib), "--nvml-timeout", nvml_timeout,
                      "--no-journal", *extra)


@pytest.fixture
def seed_node(api_server):
    api_server.create(node("ai-app-8-1-msxf", annotations={"hami.io/node-nvidia-register": REGISTER},
                           extra_alloc={"nvidia.com/mig-3g.48gb": "3"}))
    return api_server


def test_nvml_init_hang_on_known_bad_driver(seed_node, gpusim_factory, tmp_path, capsys, monkeypatch) -> None:
    """Seed 003's node: 570.158.01 with GPUs 0-2 in MIG and 3-7 full. The simulated NVML hangs in init
    exactly like the real one; doctor's probe times out, names the call, and reads the driver version
    from /sys because NVML cannot answer."""
    sim = gpusim_factory("h20-mig-mixed", driver=BAD)
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    monkeypatch.setenv("PATH", f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    rc, report = _local(capsys, seed_node, root, sim.lib_path, nvml_timeout="3")
    assert rc == 1
    assert codes(report)[0] == "NVML_INIT_HANG_KNOWN_BAD_DRIVER"
    v = verdict(report, "NVML_INIT_HANG_KNOWN_BAD_DRIVER")
    assert v["severity"] == "critical"
    evidence = " ".join(v["evidence"])
    assert "nvmlInit" in evidence and "did not return within 3s" in evidence
    assert f"{root}/sys/module/nvidia/version: {BAD}" in evidence
    assert "GPU instances exist on GPU minors [0, 1, 2]" in evidence
    assert "remediate_nvml_hang.yml -l ai-app-8-1-msxf" in v["fix"]
    assert "NVML_HANG" not in codes(report) and "KNOWN_BAD_DRIVER_WITH_MIG" not in codes(report)
    assert report["facts"]["mig.mixed"] is True


def test_known_bad_driver_with_mig_before_it_hangs(seed_node, gpusim_factory, tmp_path, capsys,
                                                   monkeypatch) -> None:
    sim = gpusim_factory("h20-mig-mixed", driver=BAD)
    sim.set_fault(known_bad_driver_hang=False)  # this time NVML happens to answer
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    monkeypatch.setenv("PATH", f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    rc, report = _local(capsys, seed_node, root, sim.lib_path)
    assert rc == 1
    assert report["facts"]["nvml.status"] == "ok"
    v = verdict(report, "KNOWN_BAD_DRIVER_WITH_MIG")
    assert v["severity"] == "error"
    assert any("MIG enabled (4 MIG devices)" in line for line in v["evidence"])
    assert "NVML_INIT_HANG_KNOWN_BAD_DRIVER" not in codes(report)


def test_fixed_driver_is_clean(seed_node, gpusim_factory, tmp_path, capsys, monkeypatch) -> None:
    sim = gpusim_factory("h20-mig-mixed")  # default profile driver, then the fixed build
    sim.set_driver("570.172.08")
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    (root / "usr/local/vgpu").mkdir(parents=True)
    (root / "usr/local/vgpu/libvgpu.so").write_bytes(b"\x7fELF")
    (root / "usr/local/vgpu/ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    monkeypatch.setenv("PATH", f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    rc, report = _local(capsys, seed_node, root, sim.lib_path)
    assert rc == 0, report["verdicts"]
    assert report["facts"]["driver.version"] == "570.172.08"
    assert report["facts"]["driver.known_bad"] is False


def test_nvml_hang_on_a_good_driver(seed_node, gpusim_factory, tmp_path, capsys, monkeypatch) -> None:
    sim = gpusim_factory("a100-80gb-x8", driver="570.172.08")
    sim.set_fault(hang_functions=["nvmlDeviceGetMemoryInfo"])
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    monkeypatch.setenv("PATH", f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    rc, report = _local(capsys, seed_node, root, sim.lib_path, nvml_timeout="3")
    assert rc == 1 and codes(report)[0] == "NVML_HANG"
    assert "nvmlDeviceGetMemoryInfo" in verdict(report, "NVML_HANG")["summary"]


def test_mps_control_binary_missing(seed_node, gpusim_factory, tmp_path, capsys, monkeypatch) -> None:
    """Seed 003 §5.2: the MPS control binary vanished after the driver upgrade. Binaries are looked up
    on $PATH under --host-root, so the simulated host's /usr/bin decides."""
    sim = gpusim_factory("h20-mig-mixed")
    sim.set_driver("570.172.08")
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    (root / "usr/bin").mkdir(parents=True)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    rc, report = _local(capsys, seed_node, root, sim.lib_path, "--expect-mps")
    assert rc == 1
    v = verdict(report, "MPS_CONTROL_BINARY_MISSING")
    assert v["severity"] == "error"
    assert "executable file not found in $PATH" in " ".join(v["evidence"])
    assert "remediate_mps_daemon.yml -l ai-app-8-1-msxf" in v["fix"]
    # with the (simulated) binary installed on the host the verdict disappears
    shutil.copy2(BIN_DIR / "nvidia-cuda-mps-control", root / "usr/bin" / "nvidia-cuda-mps-control")
    _rc, report = _local(capsys, seed_node, root, sim.lib_path, "--expect-mps")
    assert "MPS_CONTROL_BINARY_MISSING" not in codes(report)
    assert report["facts"]["host.mps_control.path"] == str(root / "usr/bin" / "nvidia-cuda-mps-control")


def test_mps_binary_missing_without_mps_is_only_info(seed_node, gpusim_factory, tmp_path, capsys,
                                                     monkeypatch) -> None:
    sim = gpusim_factory("h20-mig-mixed")
    sim.set_driver("570.172.08")
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    (root / "usr/local/vgpu").mkdir(parents=True)
    (root / "usr/local/vgpu/libvgpu.so").write_bytes(b"\x7fELF")
    (root / "usr/local/vgpu/ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, report = _local(capsys, seed_node, root, sim.lib_path)
    assert rc == 0
    assert verdict(report, "MPS_CONTROL_BINARY_MISSING")["severity"] == "info"


def test_libvgpu_missing_on_host(seed_node, gpusim_factory, tmp_path, capsys, monkeypatch) -> None:
    sim = gpusim_factory("h20-mig-mixed")
    sim.set_driver("570.172.08")
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    monkeypatch.setenv("PATH", f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    rc, report = _local(capsys, seed_node, root, sim.lib_path)
    assert rc == 1
    assert [v["code"] for v in report["verdicts"] if v["severity"] != "info"] == ["LIBVGPU_NOT_LOADED"]
    assert "libvgpu.so: missing" in " ".join(report["verdicts"][0]["evidence"])


def test_failing_journal_is_listed_not_a_verdict(seed_node, gpusim_factory, tmp_path, capsys,
                                                 monkeypatch) -> None:
    """journalctl is best effort: its failure shows under collectors, it does not make the node 'UNKNOWN'."""
    sim = gpusim_factory("h20-mig-mixed")
    sim.set_driver("570.172.08")
    root = host_root_from_gpusim(sim.state(), tmp_path / "host")
    (root / "usr/local/vgpu").mkdir(parents=True)
    (root / "usr/local/vgpu/libvgpu.so").write_bytes(b"\x7fELF")
    (root / "usr/local/vgpu/ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "journalctl").write_text("#!/bin/sh\necho 'No journal files were found.' >&2\nexit 1\n")
    (fake / "journalctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    rc, report = run_doctor(capsys, "node", "ai-app-8-1-msxf", "--kubeconfig", seed_node.kubeconfig_path,
                            "--local", "--host-root", str(root), "--nvml-lib", str(sim.lib_path),
                            "--nvml-timeout", "20")
    assert rc == 0, report["verdicts"]
    journal = [c for c in report["collectors"] if c["name"] == "kubelet_journal"]
    assert journal and journal[0]["ok"] is False and "exited 1" in journal[0]["error"]
