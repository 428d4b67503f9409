"""gpusim's GPU/compute instance calls through the real pynvml, in a child process (a hang must not take
the test with it): NVIDIA's placement rules and return codes for A100, H100 and H20 profiles (NVIDIA MIG
user guide, "Supported MIG Profiles"; return codes: nvml.h doc comments), and what nvidia-smi then shows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.gpusim import gpusim_state as gs

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import ctypes, json, sys
    import pynvml as p
    p.nvmlLib = ctypes.CDLL(sys.argv[1])
    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(0)
    ids = {}
    for i in range(p.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = p.nvmlDeviceGetGpuInstanceProfileInfo(h, i)
        except p.NVMLError:
            continue
        name = info.name.decode() if isinstance(info.name, bytes) else info.name
        ids[name[4:]] = (info.id, info.sliceCount)
    gis = []
    def create(name, start, size):
        pid, slices = ids[name]
        try:
            placement = p.c_nvmlGpuInstancePlacement_t(start, size)
            gi = p.nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, ctypes.byref(placement))
        except p.NVMLError as e:
            return e.value
        gis.append(gi)
        ci_profile = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[slices]
        ci_info = p.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, 0)
        p.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        return 0
    out = {"ids": ids, "steps": []}
    for name, start, size in json.loads(sys.argv[2]):
        out["steps"].append(create(name, start, size))
    def code(fn, *a):
        try:
            fn(*a)
            return 0
        except p.NVMLError as e:
            return e.value
    if gis:
        out["destroy_gi_with_ci"] = code(p.nvmlGpuInstanceDestroy, gis[0])
        ci = p.nvmlGpuInstanceGetComputeInstanceById(gis[0], 0)
        out["destroy_busy_ci"] = code(p.nvmlComputeInstanceDestroy, ci) if len(sys.argv) > 3 else None
    print(json.dumps(out))
""")


def run(node, plan, busy=False):
    args = [sys.executable, "-c", SCRIPT, str(node.lib_path), json.dumps(plan)] + (["busy"] if busy else [])
    out = subprocess.run(args, env=node.env(), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def mig_node(factory, profile):
    node = factory(profile, driver=gs.FIXED_DRIVER)

    def edit(state):
        state["gpus"] = state["gpus"][:1]
        state["gpus"][0]["mig"].update(current=1, pending=1, gpu_instances=[], devices=[])
    node.update(edit)
    return node


OK, INVALID, IN_USE, INSUFFICIENT = 0, 2, 19, 23


@pytest.mark.parametrize("profile, plan, want", [
    # A100 80GB: 1g.10gb at every slice 0..6; 3g.40gb at 0 or 4 only; 7g.80gb needs the whole GPU
    ("a100-80gb-x8", [("1g.10gb", 6, 1), ("3g.40gb", 4, 4), ("3g.40gb", 0, 4), ("3g.40gb", 0, 4),
                      ("1g.10gb", 7, 1), ("7g.80gb", 0, 8)], [OK, INSUFFICIENT, OK, INSUFFICIENT, INVALID,
                                                              INSUFFICIENT]),
    # H100 80GB: 2g.20gb at 0/2/4 (not 6); 1g.10gb+me at most once
    ("h100-80gb-x4", [("2g.20gb", 6, 2), ("2g.20gb", 4, 2), ("1g.10gb+me", 0, 1), ("1g.10gb+me", 1, 1),
                      ("4g.40gb", 0, 4)], [INVALID, OK, OK, INSUFFICIENT, INSUFFICIENT]),
    # H20: 4g.48gb only at 0; 1g.24gb at even starts
    ("h20-mig-mixed", [("4g.48gb", 4, 4), ("4g.48gb", 0, 4), ("1g.24gb", 5, 2), ("1g.24gb", 4, 2),
                       ("1g.24gb", 6, 2)], [INVALID, OK, INVALID, OK, OK]),
])
def test_placement_rules_and_return_codes(gpusim_factory, profile, plan, want):
    node = mig_node(gpusim_factory, profile)
    out = run(node, plan)
    assert out["steps"] == want
    assert out["destroy_gi_with_ci"] == IN_USE  # documented: a GI with compute instances is in use
    made = [step for step, code in zip(plan, want, strict=True) if code == OK]
    mig = node.state()["gpus"][0]["mig"]
    assert sorted((g["profile"], g["placement"]["start"]) for g in mig["gpu_instances"]) == \
        sorted((n, s) for n, s, _z in made)
    assert len(mig["devices"]) == len(made)  # one MIG device (CI) per GI


def test_instances_with_processes_are_in_use_and_nvidia_smi_agrees(gpusim_factory):
    node = mig_node(gpusim_factory, "a100-80gb-x8")
    node.update(lambda s: s["gpus"][0].setdefault("processes", []).append(
        {"pid": 7, "used_memory_mib": 10, "gi_id": 1, "ci_id": 0}))
    out = run(node, [("1g.10gb", 3, 1)], busy=True)
    assert out["steps"] == [OK] and out["destroy_busy_ci"] == IN_USE
    smi = subprocess.run(["nvidia-smi", "mig", "-i", "0", "-lgi"], env=node.env(), capture_output=True,
                         text=True, timeout=30, check=False)
    assert "MIG 1g.10gb" in smi.stdout and "3:1" in smi.stdout
