"""The simulated libnvidia-ml.so.1 through NVIDIA's real pynvml, each check in its own process
(pynvml keeps one library per process, and hang checks must be able to abandon the process)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.gpusim import gpusim_state as gs
from tests.gpusim.fixtures import GpusimNode, make_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SEED_GPUS = [
    "GPU-2f815c32-768d-d782-1073-db01d7b90215", "GPU-bafcf1f7-1006-01e5-85e2-684fee364617",
    "GPU-b0c5b618-67d0-f464-9905-e1fd41226305", "GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6",
    "GPU-39862681-62c1-28f7-0244-5563c070a260", "GPU-f055d080-1808-96f1-1c87-70fad19d9040",
    "GPU-4650fca3-dbba-f168-d6bd-338a4ba8f044", "GPU-9648f14e-6ab2-46f0-221f-777f7652630b",
]
SEED_MIGS = {
    0: [("3g.48gb", "MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030"),
        ("1g.24gb", "MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67"),
        ("1g.12gb", "MIG-ac6829e7-b466-50e4-917c-b77aee4c5016"),
        ("1g.12gb", "MIG-4e18003f-f745-5d17-b03f-203b7cbb671b")],
    1: [("3g.48gb", "MIG-f28b28ea-2a63-569d-8e74-0068dd6efb1c"),
        ("1g.24gb", "MIG-9244fc71-c9b9-5a4c-8588-8b991d1df2a1"),
        ("1g.12gb", "MIG-70b0f862-2a3b-5056-89f6-4e1bc03f0913"),
        ("1g.12gb", "MIG-a93cbeea-c3ce-5933-9512-35fde18fe2fd")],
    2: [("3g.48gb", "MIG-de57fa99-1a2b-5462-9a2e-71d72261a6c2"),
        ("1g.24gb", "MIG-e25ff671-e5b4-55ca-ae65-7d82bdc026f7"),
        ("1g.12gb", "MIG-9429d092-1945-524b-8a22-474247772105"),
        ("1g.12gb", "MIG-e99237a2-b951-5f96-af7b-d0c5ecedb6f4")],
}

PRELUDE = """
import ctypes, json, os, sys, time
import pynvml as n
n.nvmlLib = ctypes.CDLL(os.environ["HAMI_NVML_LIBRARY"])
def out(x):
    print(json.dumps(x)); sys.stdout.flush()
def err(f, *a):
    try:
        f(*a)
    except n.NVMLError as e:
        return type(e).__name__
    return None
"""


def run_py(node: GpusimNode, code: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=node.env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def result(node: GpusimNode, code: str, timeout: float = 20.0) -> object:
    proc = run_py(node, code, timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def hangs(node: GpusimNode, code: str, within: float = 1.5) -> bool:
    """True when the code is still blocked after ``within`` seconds (the process is then killed)."""
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=node.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.wait(timeout=within)
        return False
    except subprocess.TimeoutExpired:
        return True
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_seed_node_inventory_through_pynvml(gpusim_node: GpusimNode) -> None:
    data = result(gpusim_node, """
        n.nvmlInit()
        gpus = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            cur, pend = n.nvmlDeviceGetMigMode(h)
            migs = []
            if cur:
                for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except n.NVMLError_NotFound:
                        continue
                    a = n.nvmlDeviceGetAttributes_v2(m)
                    parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
                    migs.append([n.nvmlDeviceGetName(m), n.nvmlDeviceGetUUID(m),
                                 n.nvmlDeviceGetMemoryInfo(m).total // 2**20, n.nvmlDeviceGetGpuInstanceId(m),
                                 n.nvmlDeviceGetComputeInstanceId(m), a.gpuInstanceSliceCount,
                                 n.nvmlDeviceIsMigDeviceHandle(m).value, n.nvmlDeviceGetUUID(parent)])
            pci = n.nvmlDeviceGetPciInfo_v3(h)
            gpus.append({"name": n.nvmlDeviceGetName(h), "uuid": n.nvmlDeviceGetUUID(h),
                         "mem": n.nvmlDeviceGetMemoryInfo(h).total // 2**20,
                         "mem2": n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).total // 2**20,
                         "bus": pci.busId, "legacy": pci.busIdLegacy, "devid": pci.pciDeviceId,
                         "mig": [cur, pend], "migs": migs, "minor": n.nvmlDeviceGetMinorNumber(h),
                         "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)),
                         "numa": n.nvmlDeviceGetNumaNodeId(h)})
        out({"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion_v2(),
             "nvml": n.nvmlSystemGetNVMLVersion(), "gpus": gpus})
        n.nvmlShutdown()
    """)
    assert data["driver"] == "570.172.08"
    assert data["cuda"] == 12080
    assert data["nvml"] == "12.570.172.08"
    gpus = data["gpus"]
    assert [g["uuid"] for g in gpus] == SEED_GPUS
    assert all(g["name"] == "NVIDIA H20" and g["mem"] == g["mem2"] == 97871 for g in gpus)
    assert [g["bus"] for g in gpus][:2] == ["00000000:0F:00.0", "00000000:34:00.0"]
    assert gpus[0]["legacy"] == "0000:0F:00.0"
    assert gpus[0]["devid"] == 0x232910DE
    assert [g["mig"] for g in gpus] == [[1, 1]] * 3 + [[0, 0]] * 5
    assert [g["numa"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["minor"] for g in gpus] == list(range(8))
    assert gpus[0]["cc"] == [9, 0]
    for i in range(3):
        got = [(m[0], m[1]) for m in gpus[i]["migs"]]
        assert got == [(f"NVIDIA H20 MIG {p}", u) for p, u in SEED_MIGS[i]]
        assert [m[2] for m in gpus[i]["migs"]] == [47488, 23552, 11776, 11776]
        assert [m[5] for m in gpus[i]["migs"]] == [3, 1, 1, 1]
        assert all(m[6] == 1 and m[7] == SEED_GPUS[i] for m in gpus[i]["migs"])
        assert len({m[3] for m in gpus[i]["migs"]}) == 4  # distinct GPU instances
    assert all(g["migs"] == [] for g in gpus[3:])


def test_handles_by_uuid_and_pci_bus_id(gpusim_node: GpusimNode) -> None:
    data = result(gpusim_node, """
        n.nvmlInit()
        m = n.nvmlDeviceGetHandleByUUID("MIG-e99237a2-b951-5f96-af7b-d0c5ecedb6f4")
        g = n.nvmlDeviceGetHandleByPciBusId("0000:5a:00.0")
        g2 = n.nvmlDeviceGetHandleByPciBusId("00000000:5A:00.0")
        out([n.nvmlDeviceGetName(m), n.nvmlDeviceGetUUID(g), n.nvmlDeviceGetUUID(g2),
             err(n.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000"),
             err(n.nvmlDeviceGetHandleByIndex, 8)])
    """)
    assert data == ["NVIDIA H20 MIG 1g.12gb", SEED_GPUS[3], SEED_GPUS[3], "NVMLError_NotFound",
                    "NVMLError_InvalidArgument"]


def test_calls_before_init_are_uninitialized(gpusim_node: GpusimNode) -> None:
    data = result(gpusim_node, """
        n._LoadNvmlLibrary()
        a = err(n.nvmlDeviceGetCount)
        n.nvmlInit(); n.nvmlShutdown()
        out([a, err(n.nvmlDeviceGetCount)])
    """)
    assert data == ["NVMLError_Uninitialized", "NVMLError_Uninitialized"]


def test_telemetry_and_processes(gpusim_node: GpusimNode) -> None:
    gpusim_node.update(lambda s: s["gpus"][5].__setitem__(
        "processes", [{"pid": 4242, "used_memory_mib": 1024, "name": "python"},
                      {"pid": 4343, "used_memory_mib": 2048, "name": "python"}]))
    data = result(gpusim_node, """
        n.nvmlInit()
        mig_gpu, full = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(5)
        procs = n.nvmlDeviceGetComputeRunningProcesses(full)
        u = n.nvmlDeviceGetUtilizationRates(full)
        out([err(n.nvmlDeviceGetUtilizationRates, mig_gpu), [u.gpu, u.memory],
             n.nvmlDeviceGetTemperature(full, 0), n.nvmlDeviceGetPowerUsage(full),
             n.nvmlDeviceGetPowerManagementLimit(full), n.nvmlDeviceGetComputeMode(full),
             n.nvmlDeviceGetPersistenceMode(full), [[p.pid, p.usedGpuMemory // 2**20] for p in procs],
             n.nvmlDeviceGetComputeRunningProcesses(mig_gpu), n.nvmlDeviceGetNumGpuCores(full),
             n.nvmlDeviceGetArchitecture(full), n.nvmlDeviceGetSerial(full)])
    """)
    assert data[0] == "NVMLError_NotSupported"  # nvidia-smi shows N/A for MIG-enabled GPUs
    assert data[1] == [0, 0]
    assert data[2] == 28 and data[3] == 73000 and data[4] == 500000
    assert data[5] == 0 and data[6] == 0
    assert data[7] == [[4242, 1024], [4343, 2048]]
    assert data[8] == []
    assert data[9] == 78 * 128
    assert data[10] == 9
    assert data[11] == "1650224000005"


def test_known_bad_driver_with_mixed_mig_hangs_init(gpusim_factory) -> None:
    node = gpusim_factory("h20-mig-mixed")  # profile default: the seed's 570.158.01
    assert node.state()["driver_version"] == "570.158.01"
    assert hangs(node, "n.nvmlInit(); out('returned')")


@pytest.mark.parametrize("profile", ["a100-80gb-x8", "h100-80gb-x4"])
def test_known_bad_driver_without_mixed_mig_does_not_hang(gpusim_factory, profile: str) -> None:
    # The regression needs MIG slices AND full GPUs on one node: all-full or all-MIG nodes are fine.
    node = gpusim_factory(profile, driver="570.158.01")
    assert result(node, "n.nvmlInit(); out(n.nvmlDeviceGetCount())") == len(node.state()["gpus"])


def test_auto_hang_can_be_switched_off(gpusim_factory) -> None:
    node = gpusim_factory("h20-mig-mixed")
    node.set_fault(known_bad_driver_hang=False)
    assert result(node, "n.nvmlInit(); out(n.nvmlSystemGetDriverVersion())") == "570.158.01"


def test_explicit_init_hang(gpusim_node: GpusimNode) -> None:
    gpusim_node.set_fault(init_hang=True)
    assert hangs(gpusim_node, "n.nvmlInit(); out('returned')")
    gpusim_node.set_fault(init_hang=False)
    assert result(gpusim_node, "n.nvmlInit(); out('ok')") == "ok"


def test_hang_after_calls_blocks_the_next_call(gpusim_node: GpusimNode) -> None:
    gpusim_node.set_fault(hang_after_calls=2)
    code = """
        n.nvmlInit(); n.nvmlDeviceGetCount()
        print("two calls done", flush=True)
        n.nvmlDeviceGetCount()
        out('returned')
    """
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=gpusim_node.env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "two calls done"
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_hang_functions_match_versioned_names(gpusim_node: GpusimNode) -> None:
    gpusim_node.set_fault(hang_functions=["nvmlDeviceGetMemoryInfo"])
    ok = result(gpusim_node, "n.nvmlInit(); out(n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(0)))")
    assert ok == "NVIDIA H20"
    assert hangs(gpusim_node, """
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
        n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2); out('returned')
    """)


def test_driver_not_loaded_and_version_mismatch(gpusim_node: GpusimNode) -> None:
    gpusim_node.update(lambda s: s.__setitem__("driver_loaded", False))
    assert result(gpusim_node, "out(err(n.nvmlInit))") == "NVMLError_DriverNotLoaded"
    gpusim_node.update(lambda s: s.update(driver_loaded=True, module_version="570.86.15"))
    assert result(gpusim_node, "out(err(n.nvmlInit))") == "NVMLError_LibRmVersionMismatch"


def test_gpu_lost(gpusim_node: GpusimNode) -> None:
    gpusim_node.set_lost(1)
    data = result(gpusim_node, """
        n.nvmlInit()
        ok = n.nvmlDeviceGetHandleByIndex(2)
        out([err(n.nvmlDeviceGetHandleByIndex, 1), n.nvmlDeviceGetUUID(ok),
             err(n.nvmlDeviceGetHandleByUUID, "MIG-f28b28ea-2a63-569d-8e74-0068dd6efb1c")])
    """)
    assert data == ["NVMLError_GpuIsLost", SEED_GPUS[2], "NVMLError_GpuIsLost"]


def test_memory_info_not_supported_on_unified_memory(gpusim_factory) -> None:
    node = gpusim_factory("gh200-unified")
    data = result(node, """
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
        out([err(n.nvmlDeviceGetMemoryInfo, h), err(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2),
             n.nvmlDeviceGetName(h)])
    """)
    assert data == ["NVMLError_NotSupported", "NVMLError_NotSupported", "NVIDIA GH200 480GB"]


def test_memory_v2_checks_struct_version(gpusim_node: GpusimNode) -> None:
    data = result(gpusim_node, """
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(3)
        out(err(n.nvmlDeviceGetMemoryInfo, h, 0x01000028))
    """)
    assert data == "NVMLError_ArgumentVersionMismatch"


def test_xid_events_in_seq_order_once_per_process(gpusim_node: GpusimNode) -> None:
    gpusim_node.add_xid(4, 79)
    gpusim_node.add_xid(3, 13)  # ignorable XIDs are delivered too: the consumer filters
    gpusim_node.add_xid(6, 48)  # GPU 6 will not be registered
    code = """
        n.nvmlInit()
        es = n.nvmlEventSetCreate()
        for i in (3, 4, 5):
            n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(i), n.nvmlEventTypeXidCriticalError, es)
        got = []
        for _ in range(2):
            d = n.nvmlEventSetWait_v2(es, 1000)
            got.append([n.nvmlDeviceGetIndex(d.device), d.eventData, d.eventType, d.gpuInstanceId])
        t = time.monotonic()
        e = err(n.nvmlEventSetWait, es, 300)
        waited = time.monotonic() - t
        n.nvmlEventSetFree(es)
        out({"got": got, "after": e, "waited": waited})
    """
    data = result(gpusim_node, code)
    assert data["got"] == [[4, 79, 8, 0xFFFFFFFF], [3, 13, 8, 0xFFFFFFFF]]
    assert data["after"] == "NVMLError_Timeout"
    assert 0.25 <= data["waited"] < 2.0
    # a new process receives them again (delivery is per process)
    assert [e[1] for e in result(gpusim_node, code)["got"]] == [79, 13]


def _xid_written_while_waiting(node: GpusimNode, gpu: int, xid: int, wait_ms: int,
                               env: dict[str, str] | None = None,
                               before: Callable[[], None] | None = None, **xid_kw: object) -> list:
    """A process registers GPU ``gpu`` and waits up to ``wait_ms``; the XID is written once it waits (after
    ``before``, if given). Returns what its wait answered: [uuid, xid]."""
    code = f"""
        n.nvmlInit()
        es = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex({gpu}), n.nvmlEventTypeXidCriticalError, es)
        print("ready", flush=True)
        d = n.nvmlEventSetWait_v2(es, {wait_ms})
        out([n.nvmlDeviceGetUUID(d.device), d.eventData])
    """
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                            env={**node.env(), **(env or {})}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # inside the wait, past its first look
        if before is not None:
            before()
        node.add_xid(gpu, xid, **xid_kw)
        out, _ = proc.communicate(timeout=15)
        return json.loads(out.strip())
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_xid_added_while_waiting_is_delivered(gpusim_node: GpusimNode) -> None:
    assert _xid_written_while_waiting(gpusim_node, 7, 94, 10000, gi_id=None) == [SEED_GPUS[7], 94]


def test_a_waiting_process_is_woken_by_the_state_write_not_by_polling(gpusim_node: GpusimNode) -> None:
    """The event wait sleeps until the state file's directory changes, as the real driver sleeps until it
    has an event: it has no periodic re-read, so only the watch can deliver the XID before the 30 s wait
    ends (the helper gives the process 15 s)."""
    got = _xid_written_while_waiting(gpusim_node, 2, 79, 30000)
    assert got == [SEED_GPUS[2], 79]


def test_a_wait_re_arms_when_its_state_directory_is_replaced(gpusim_lib: Path, tmp_path: Path) -> None:
    """A directory moved away and made anew under a waiting process (the watch on the old one is dead)
    wakes the wait, which watches the new one: the XID written there is delivered, not slept through."""
    d = tmp_path / "node"
    d.mkdir()
    node = make_node(d, "h20-mig-mixed", driver=gs.FIXED_DRIVER, lib_path=gpusim_lib)

    def replace_directory() -> None:
        d.rename(tmp_path / "node.old")
        d.mkdir()
        shutil.copy(tmp_path / "node.old" / node.state_path.name, node.state_path)
        time.sleep(0.3)

    got = _xid_written_while_waiting(node, 2, 79, 30000, before=replace_directory)
    assert got == [SEED_GPUS[2], 79]


def test_state_changes_are_seen_by_a_running_process(gpusim_node: GpusimNode) -> None:
    code = """
        n.nvmlInit()
        print(n.nvmlSystemGetDriverVersion(), flush=True)
        sys.stdin.readline()
        out(n.nvmlSystemGetDriverVersion())
    """
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=gpusim_node.env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "570.172.08"
        gpusim_node.update(lambda s: s.update(driver_version="580.65.06", module_version="580.65.06"))
        out, _ = proc.communicate("go\n", timeout=10)
        assert json.loads(out.strip()) == "580.65.06"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_set_mig_mode_writes_pending_to_the_state_file(gpusim_node: GpusimNode) -> None:
    data = result(gpusim_node, """
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(5)
        status = n.nvmlDeviceSetMigMode(h, 1)
        out([status, n.nvmlDeviceGetMigMode(h)])
    """)
    assert data == [0, [0, 1]]
    state = gpusim_node.state()
    assert state["gpus"][5]["mig"]["pending"] == 1
    assert state["gpus"][5]["mig"]["current"] == 0
    assert state["gpus"][0]["mig"]["devices"][0]["uuid"] == SEED_MIGS[0][0][1]  # rest intact
    assert not list(gpusim_node.state_path.parent.glob("*.tmp"))


def test_missing_state_file_is_reported(gpusim_node: GpusimNode, tmp_path) -> None:
    env = gpusim_node.env()
    env["GPUSIM_STATE"] = str(tmp_path / "nope.json")
    proc = subprocess.run([sys.executable, "-c", PRELUDE + "out(err(n.nvmlInit))"], env=env,
                          capture_output=True, text=True, timeout=20, check=False)
    assert json.loads(proc.stdout) == "NVMLError_Unknown"
    assert f"gpusim: cannot read state file {tmp_path / 'nope.json'}" in proc.stderr


def test_corrupt_state_file_is_reported(gpusim_node: GpusimNode) -> None:
    gpusim_node.state_path.write_text('{"schema": 1, "gpus": [}')
    proc = run_py(gpusim_node, "out(err(n.nvmlInit))")
    assert json.loads(proc.stdout) == "NVMLError_Unknown"
    assert "is not valid JSON (line 1 col 24" in proc.stderr


def test_invalid_state_names_the_field(gpusim_node: GpusimNode) -> None:
    gpusim_node.state_path.write_text(json.dumps({"schema": 1, "driver_version": "570.172.08",
                                                  "gpus": [{"index": 0, "uuid": "GPU-x", "name": "X"}]}))
    proc = run_py(gpusim_node, "out(err(n.nvmlInit))")
    assert "needs string fields uuid, name and pci_bus_id" in proc.stderr


def test_exports_every_symbol_the_agent_uses(gpusim_lib) -> None:
    needed = {
        "nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
        "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetName",
        "nvmlDeviceGetUUID", "nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetMigMode", "nvmlDeviceSetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetAttributes_v2", "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetNumGpuCores", "nvmlEventSetCreate",
        "nvmlEventSetFree", "nvmlDeviceRegisterEvents", "nvmlDeviceGetSupportedEventTypes",
        "nvmlEventSetWait_v2", "nvmlDeviceGetIndex", "nvmlDeviceGetNumaNodeId",
    }
    out = subprocess.run(["nm", "-D", "--defined-only", str(gpusim_lib)], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert needed <= exported, needed - exported
    assert all(s.startswith("nvml") for s in exported)  # -fvisibility=hidden: nothing else leaks


def test_make_is_idempotent(gpusim_lib) -> None:
    before = os.stat(gpusim_lib).st_mtime_ns
    t0 = time.monotonic()
    proc = subprocess.run(["make", "-C", str(gpusim_lib.parent.parent)], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "Nothing to be done" in proc.stdout
    assert os.stat(gpusim_lib).st_mtime_ns == before
    assert time.monotonic() - t0 < 5
    assert os.readlink(gpusim_lib.parent / "libnvidia-ml.so") == "libnvidia-ml.so.1"


def test_state_module_mirrors_the_library_hang_rule() -> None:
    state = gs.load_profile("h20-mig-mixed")
    assert gs.init_would_hang(state)
    gs.set_driver_version(state, gs.FIXED_DRIVER)
    assert not gs.init_would_hang(state)
