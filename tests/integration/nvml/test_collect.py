"""collect_inventory: the one-shot worker against the simulated NVML."""

from __future__ import annotations

import logging
import time

import pytest

from hami_agent.nvml import NvmlError, NvmlTimeout, collect_inventory
from tests.gpusim.fixtures import GpusimNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SEED_GPU0_MIGS = ["MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030", "MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67",
                  "MIG-ac6829e7-b466-50e4-917c-b77aee4c5016", "MIG-4e18003f-f745-5d17-b03f-203b7cbb671b"]


class Capture(logging.Handler):
    """Collects records of one logger directly (the hami_agent tree may not propagate to caplog)."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []
        self.logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())

    def __enter__(self) -> Capture:
        self.logger.addHandler(self)
        self._level = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level)


def test_seed_node_on_fixed_driver(gpusim_node: GpusimNode) -> None:
    snap = collect_inventory(timeout_s=20)
    assert snap.status == "ok"
    assert snap.driver_version == "570.172.08" and snap.cuda_driver_version == 12080
    assert len(snap.gpus) == 8
    assert sum(len(g.mig_devices) for g in snap.gpus) == 12
    g0 = snap.gpus[0]
    assert g0.uuid == "GPU-2f815c32-768d-d782-1073-db01d7b90215"
    assert g0.name == "NVIDIA H20" and g0.type == "NVIDIA H20"
    assert g0.memory_mib == 97871 and g0.pci_bus_id == "00000000:0F:00.0"
    assert (g0.mig_capable, g0.mig_enabled, g0.mig_pending) == (True, True, True)
    assert [m.uuid for m in g0.mig_devices] == SEED_GPU0_MIGS
    assert [m.profile for m in g0.mig_devices] == ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]
    assert [m.memory_mib for m in g0.mig_devices] == [47488, 23552, 11776, 11776]
    assert [(m.gi_id, m.ci_id) for m in g0.mig_devices] == [(2, 0), (3, 0), (9, 0), (10, 0)]
    # no sysfs for simulated GPUs: NUMA comes from NVML's numa node id
    assert [g.numa for g in snap.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(g.healthy for g in snap.gpus)
    assert [g.mig_enabled for g in snap.gpus] == [True] * 3 + [False] * 5


def test_a100_and_h100_profiles(gpusim_factory) -> None:
    gpusim_factory("a100-80gb-x8")
    snap = collect_inventory(timeout_s=20)
    assert [g.type for g in snap.gpus] == ["NVIDIA A100-SXM4-80GB"] * 8
    assert {g.memory_mib for g in snap.gpus} == {81920}
    gpusim_factory("h100-80gb-x4")
    snap = collect_inventory(timeout_s=20)
    assert [[m.profile for m in g.mig_devices] for g in snap.gpus] == [
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]] * 4


def test_explicit_lib_path_wins_over_env(gpusim_node: GpusimNode, monkeypatch) -> None:
    monkeypatch.setenv("HAMI_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
    snap = collect_inventory(lib_path=gpusim_node.lib_path, timeout_s=20)
    assert len(snap.gpus) == 8


def test_unified_memory_gpu_has_no_memory_and_warns(gpusim_factory) -> None:
    gpusim_factory("gh200-unified")
    with Capture("hami_agent.nvml.inventory") as cap:
        snap = collect_inventory(timeout_s=20)
    assert snap.gpus[0].memory_mib is None
    assert snap.memory_not_supported == (0,)
    assert any("GetMemoryInfo not supported" in r and "preConfiguredDeviceMemory" in r for r in cap.records)


def test_init_hang_on_seed_driver_times_out_naming_nvmlinit(gpusim_factory) -> None:
    gpusim_factory("h20-mig-mixed")  # 570.158.01 + mixed MIG
    t0 = time.monotonic()
    with pytest.raises(NvmlTimeout) as info:
        collect_inventory(timeout_s=2.0)
    took = time.monotonic() - t0
    assert info.value.call == "nvmlInit"
    assert "nvml call nvmlInit did not return within 2s" in str(info.value)
    assert 2.0 <= took < 6.0


def test_mid_inventory_hang_names_the_call(gpusim_node: GpusimNode) -> None:
    gpusim_node.set_fault(hang_functions=["nvmlDeviceGetMigMode"])
    with pytest.raises(NvmlTimeout) as info:
        collect_inventory(timeout_s=2.0)
    assert info.value.call == "nvmlDeviceGetMigMode"


def test_driver_not_loaded_is_nvml_init_err(gpusim_node: GpusimNode) -> None:
    gpusim_node.update(lambda s: s.__setitem__("driver_loaded", False))
    with pytest.raises(NvmlError, match="^nvml Init err: Driver Not Loaded") as info:
        collect_inventory(timeout_s=20)
    assert info.value.call == "nvmlInit" and info.value.code == 9


def test_missing_library_is_a_clear_error(gpusim_node: GpusimNode, tmp_path) -> None:
    with pytest.raises(NvmlError, match=r"nvml Init err: NVML library .*nope.so does not exist"):
        collect_inventory(lib_path=tmp_path / "nope.so", timeout_s=20)


def test_not_a_library_is_a_clear_error(gpusim_node: GpusimNode, tmp_path) -> None:
    fake = tmp_path / "libnvidia-ml.so.1"
    fake.write_text("not an ELF file")
    with pytest.raises(NvmlError, match="nvml Init err: cannot load NVML library"):
        collect_inventory(lib_path=fake, timeout_s=20)


def test_corrupt_state_surfaces_as_init_error(gpusim_node: GpusimNode, capfd) -> None:
    gpusim_node.state_path.write_text("{ nope")
    with pytest.raises(NvmlError, match="nvml Init err: Unknown Error"):
        collect_inventory(timeout_s=20)
    assert "gpusim: state file" in capfd.readouterr().err


def test_lost_gpu_in_one_shot(gpusim_node: GpusimNode) -> None:
    gpusim_node.set_lost(6)
    snap = collect_inventory(timeout_s=20)
    # never seen before, so NVML cannot even say which GPU it was: it is left out, others are fine
    assert [g.index for g in snap.gpus] == [0, 1, 2, 3, 4, 5, 7]
    assert snap.problems == ("GPU 6 is lost (NVML: GPU is lost); its UUID is unknown, not listed",)


def test_bad_timeout_value() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        collect_inventory(timeout_s=0)


def test_numa_prefers_sysfs_like_hami(gpusim_node: GpusimNode, tmp_path, monkeypatch) -> None:
    devs = tmp_path / "bus/pci/devices"
    (devs / "0000:0f:00.0").mkdir(parents=True)
    (devs / "0000:0f:00.0/numa_node").write_text("1\n")  # NVML state says 0: sysfs wins
    (devs / "0000:34:00.0").mkdir(parents=True)
    (devs / "0000:34:00.0/numa_node").write_text("-1\n")  # no NUMA affinity: unknown, no NVML fallback
    monkeypatch.setenv("HAMI_SYSFS_ROOT", str(tmp_path))
    snap = collect_inventory(timeout_s=20)
    assert [g.numa for g in snap.gpus][:3] == [1, None, 0]


def test_mig_profiles_without_device_attributes(gpusim_node: GpusimNode) -> None:
    # older drivers lack nvmlDeviceGetAttributes: memory comes from the MIG handle, slices from its name
    gpusim_node.set_fault(unsupported_functions=["nvmlDeviceGetAttributes"])
    snap = collect_inventory(timeout_s=20)
    assert [(m.profile, m.memory_mib) for m in snap.gpus[1].mig_devices] == [
        ("3g.48gb", 47488), ("1g.24gb", 23552), ("1g.12gb", 11776), ("1g.12gb", 11776)]


def test_a_changed_kernel_module_ends_the_clients_backoff(gpusim_node: GpusimNode, tmp_path) -> None:
    from hami_agent.nvml import NvmlClient
    from hami_agent.nvml.loaded import LoadedDriver

    version = tmp_path / "version"
    gpusim_node.update(lambda s: s.__setitem__("driver_loaded", False))
    client = NvmlClient(call_timeout_s=5, backoff_initial_s=30.0, driver=LoadedDriver(str(version)))
    try:
        with pytest.raises(NvmlError, match="Driver Not Loaded"):
            client.inventory()
        gpusim_node.update(lambda s: s.__setitem__("driver_loaded", True))
        with pytest.raises(NvmlError, match="backing off"):  # no module file yet: the backoff holds
            client.inventory()
        started = client.workers_started
        version.write_text("570.172.08\n")  # the module is loaded: try now
        assert client.inventory().status == "ok"
        assert client.workers_started == started + 1
    finally:
        client.close()
