"""The real-hardware check's pure helpers (scripts/devcheck): the parts the gpusim dry run cannot reach,
because they only matter on a lent GPU machine (real nvidia-smi's topo table, Allocate's mounts under a
mount namespace, the region a real HAMi-core writes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))

from devcheck import checks_nvml, checks_workload  # noqa: E402

pytestmark = pytest.mark.unit
MIB = 1 << 20

ALLOC = {
    "envs": {"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/h/vgpu/abc.cache", "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
             "CUDA_DEVICE_SM_LIMIT": "30", "NVIDIA_VISIBLE_DEVICES": "GPU-1"},
    "mounts": [
        {"containerPath": "/h/vgpu/libvgpu.so", "hostPath": "/h/vgpu/libvgpu.so", "readOnly": True},
        {"containerPath": "/h/vgpu", "hostPath": "/h/vgpu/containers/uid_c", "readOnly": False},
        {"containerPath": "/tmp/vgpulock", "hostPath": "/w/vgpulock", "readOnly": False},
        {"containerPath": "/etc/ld.so.preload", "hostPath": "/h/vgpu/ld.so.preload", "readOnly": True},
    ],
}


def test_host_path_follows_the_deepest_mount():
    assert checks_workload._host_path(ALLOC, "/h/vgpu/abc.cache") == "/h/vgpu/containers/uid_c/abc.cache"
    assert checks_workload._host_path(ALLOC, "/h/vgpu/libvgpu.so") == "/h/vgpu/libvgpu.so"
    assert checks_workload._host_path(ALLOC, "/tmp/vgpulock/x") == "/w/vgpulock/x"
    assert checks_workload._host_path(ALLOC, "/elsewhere") == "/elsewhere"


def test_namespace_script_stages_host_paths_before_mounting_over_them(tmp_path):
    host = tmp_path / "h"
    (host / "vgpu" / "containers" / "uid_c").mkdir(parents=True)
    (host / "vgpu" / "libvgpu.so").write_text("lib")
    lock = tmp_path / "lock"
    lock.mkdir()
    alloc = {"envs": {}, "mounts": [
        {"containerPath": str(host / "vgpu" / "libvgpu.so"), "hostPath": str(host / "vgpu" / "libvgpu.so"),
         "readOnly": True},
        {"containerPath": str(host / "vgpu"), "hostPath": str(host / "vgpu" / "containers" / "uid_c"),
         "readOnly": False},
        {"containerPath": str(tmp_path / "ctr-lock"), "hostPath": str(lock), "readOnly": False},
    ]}
    created: list[Path] = []
    argv, skipped = checks_workload._namespace_script(alloc, ["probe", "3072"], created, tmp_path / "stage",
                                                      preload=str(host / "vgpu" / "libvgpu.so"))
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = argv[-1].splitlines()
    binds = [ln for ln in script if ln.startswith("mount --bind")]
    # every host path is captured into the stage first, then the container paths, shallowest first
    assert all(str(tmp_path / "stage") in b.split()[3] for b in binds[:3])
    targets = [b.split()[3] for b in binds[3:]]
    assert targets == [str(tmp_path / "ctr-lock"), str(host / "vgpu"), str(host / "vgpu" / "libvgpu.so")]
    # LD_PRELOAD only for the program (the mount commands must not load libvgpu.so)
    assert script[-2].startswith("export LD_PRELOAD=") and script[-1] == "exec probe 3072"
    assert created == [tmp_path / "ctr-lock"] and skipped == ""


def test_topo_numa_reads_the_numa_affinity_column(monkeypatch):
    topo = ("\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tSYS\t0-63,128-191\t0\t\tN/A\n"
            "NIC0\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n")
    monkeypatch.setattr(checks_nvml, "smi", lambda ctx, *a, timeout=30: (0, topo, ""))
    assert checks_nvml._topo_numa(None) == {0: "0"}
    assert checks_nvml._norm_numa("N/A") is None and checks_nvml._norm_numa("-1") is None
    assert checks_nvml._norm_numa("1") == 1


def _region(pid: int, used: int, limit: int = 4096 * MIB, sm: int = 30, uuid: str = "GPU-1",
             findings: list | None = None) -> dict:
    return {"error": None, "findings": findings or [], "region": {
        "devices": [0], "limit": [limit] * 16, "sm_limit": [sm] * 16, "uuids": [uuid] + [""] * 15,
        "procs": [{"pid": pid, "used": [{"total": used}] + [{"total": 0}] * 15}],
        "liveness": {str(pid): "alive"}}}


def test_region_matches_allocate_and_the_probe():
    ok = _region(42, 3200 * MIB)
    assert checks_workload._check_region(ok, 4096, 30, 42, 3072 * MIB, "GPU-1") == []
    assert checks_workload._check_region(_region(42, 3200 * MIB, sm=100), 4096, 30, 42, 3072 * MIB, "GPU-1") \
        == ["region SM limit 100 != 30"]
    bad = checks_workload._check_region(_region(7, 10, uuid="GPU-2", findings=[
        {"code": "ZOMBIE_TASK", "severity": "error"}]), 4096, 30, 42, 3072 * MIB, "GPU-1")
    assert any("GPU-2" in p for p in bad) and any("pid 42" in p for p in bad)
    assert any("ZOMBIE_TASK" in p for p in bad)
    broken = checks_workload._check_region({"error": "bad magic"}, 4096, 30, 42, 1, None)
    assert broken[0].endswith("bad magic")


def test_metric_values_match_labels():
    text = ('hami_host_gpu_utilization_ratio{device_index="0",device_uuid="GPU-1",node="n"} 37.0\n'
            'hami_host_gpu_utilization_ratio{device_index="1",device_uuid="GPU-2",node="n"} 0.0\n')
    util = checks_workload.metric_values(text, "hami_host_gpu_utilization_ratio", device_uuid="GPU-1")
    assert util == [37.0]
    assert checks_workload.metric_values(text, "hami_host_gpu_memory_used_bytes") == []
