"""NvmlSupervisor against the simulated NVML: hang isolation, recovery, XID health, metrics."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from hami_agent.nvml import NvmlSupervisor, Snapshot, XidPolicy
from hami_agent.nvml.loaded import LoadedDriver
from tests.gpusim.fixtures import GpusimNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FIXED = "570.172.08"
BAD = "570.158.01"


def wait_for(sup: NvmlSupervisor, pred: Callable[[Snapshot], bool], timeout: float = 15.0) -> Snapshot:
    deadline = time.monotonic() + timeout
    snap = sup.snapshot()
    while not pred(snap):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"condition not reached within {timeout}s; last snapshot: {snap}")
        snap = sup.wait_for_change(snap.generation, min(left, 0.5))
    return snap


def max_snapshot_latency(sup: NvmlSupervisor, n: int = 200) -> float:
    worst = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        sup.snapshot()
        worst = max(worst, time.perf_counter() - t0)
    return worst


@pytest.fixture
def supervisors() -> Iterator[list[NvmlSupervisor]]:
    made: list[NvmlSupervisor] = []
    yield made
    for sup in made:
        sup.stop(timeout=5)


def make(supervisors: list[NvmlSupervisor], **kw) -> NvmlSupervisor:
    kw.setdefault("call_timeout_s", 1.5)
    kw.setdefault("refresh_interval_s", 0.3)
    kw.setdefault("backoff_initial_s", 0.2)
    kw.setdefault("backoff_max_s", 1.0)
    sup = NvmlSupervisor(**kw)
    supervisors.append(sup)
    sup.start()
    return sup


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_starts_and_serves_inventory(gpusim_node: GpusimNode, supervisors) -> None:
    sup = make(supervisors)
    assert sup.snapshot().status in ("starting", "ok")
    snap = wait_for(sup, lambda s: s.status == "ok")
    assert len(snap.gpus) == 8 and sum(len(g.mig_devices) for g in snap.gpus) == 12
    assert snap.generation >= 1 and snap.taken_at > 0
    gen = snap.generation
    time.sleep(1.0)  # several refreshes with no change must not bump the generation
    assert sup.snapshot().generation == gen
    assert "nvmlInit" in sup.call_durations()


def test_init_hang_marks_stuck_and_recovers_after_driver_fix(gpusim_factory, supervisors) -> None:
    node = gpusim_factory("h20-mig-mixed")  # the seed's driver: nvmlInit hangs
    registry = CollectorRegistry()
    t0 = time.monotonic()
    sup = make(supervisors, registry=registry)
    snap = wait_for(sup, lambda s: s.status == "stuck")
    assert time.monotonic() - t0 < 1.5 + 12  # deadline + interpreter start, never unbounded
    assert snap.stuck_call == "nvmlInit"
    assert "nvml call nvmlInit did not return within 1.5s" in (snap.error or "")
    assert snap.gpus == ()  # never saw a GPU
    assert max_snapshot_latency(sup) < 0.01
    assert registry.get_sample_value("hami_nvml_stuck") == 1.0

    node.set_driver(FIXED)
    snap = wait_for(sup, lambda s: s.status == "ok", timeout=20)
    assert len(snap.gpus) == 8 and all(g.healthy for g in snap.gpus)
    assert registry.get_sample_value("hami_nvml_stuck") == 0.0
    assert registry.get_sample_value("hami_nvml_worker_restarts_total") >= 1
    assert registry.get_sample_value("hami_nvml_call_duration_seconds_count", {"function": "nvmlInit"}) >= 1


def test_mid_run_hang_keeps_last_gpus_unhealthy_then_recovers(gpusim_node: GpusimNode, supervisors) -> None:
    sup = make(supervisors)
    ok = wait_for(sup, lambda s: s.status == "ok")
    gpusim_node.set_fault(hang_after_calls=40)  # the running worker is far past 40 calls: next call hangs
    snap = wait_for(sup, lambda s: s.status == "stuck")
    assert [g.uuid for g in snap.gpus] == [g.uuid for g in ok.gpus]
    assert all(not g.healthy and g.unhealthy_reason == "nvml-stuck" for g in snap.gpus)
    assert snap.stuck_call
    assert max_snapshot_latency(sup) < 0.01
    # new workers keep hanging after 40 calls (an inventory needs ~140): still stuck, bounded
    time.sleep(2.5)
    assert sup.snapshot().status == "stuck"
    assert sup.restarts >= 1
    gpusim_node.clear_faults()
    snap = wait_for(sup, lambda s: s.status == "ok", timeout=20)
    assert all(g.healthy for g in snap.gpus)


def test_stuck_worker_is_killed_and_reaped(gpusim_node: GpusimNode, supervisors) -> None:
    sup = make(supervisors)
    wait_for(sup, lambda s: s.status == "ok")
    worker = sup._worker
    assert worker is not None and worker.pid is not None
    pid = worker.pid
    gpusim_node.set_fault(hang_functions=["nvmlDeviceGetMigMode"])
    wait_for(sup, lambda s: s.status == "stuck")
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        sup.zombies  # noqa: B018 - property reaps finished workers (WNOHANG)
        time.sleep(0.1)
    assert not alive(pid)


def test_critical_xid_marks_gpu_unhealthy_and_ignored_xid_does_not(gpusim_node: GpusimNode,
                                                                    supervisors) -> None:
    sup = make(supervisors)
    wait_for(sup, lambda s: s.status == "ok")
    gpusim_node.add_xid(3, 13)  # application error: ignored
    gpusim_node.add_xid(5, 79)  # GPU fell off the bus: critical
    snap = wait_for(sup, lambda s: not s.gpus[5].healthy)
    assert snap.gpus[5].unhealthy_reason == "xid-79"
    time.sleep(0.5)
    snap = sup.snapshot()
    assert snap.gpus[3].healthy
    assert [g.index for g in snap.gpus if not g.healthy] == [5]
    time.sleep(1.0)  # later refreshes keep the verdict (NVIDIA semantics: XIDs are sticky)
    assert not sup.snapshot().gpus[5].healthy


def test_healthchecks_disabled(gpusim_node: GpusimNode, supervisors) -> None:
    sup = make(supervisors, xid_policy=XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "all"}))
    wait_for(sup, lambda s: s.status == "ok")
    gpusim_node.add_xid(5, 79)
    time.sleep(1.5)
    assert all(g.healthy for g in sup.snapshot().gpus)


def test_gpu_lost_after_being_seen(gpusim_node: GpusimNode, supervisors) -> None:
    sup = make(supervisors, watch_events=False)
    wait_for(sup, lambda s: s.status == "ok")
    gpusim_node.set_lost(2)
    snap = wait_for(sup, lambda s: not s.gpus[2].healthy)
    assert snap.gpus[2].unhealthy_reason == "gpu-lost"
    assert snap.gpus[2].uuid == "GPU-b0c5b618-67d0-f464-9905-e1fd41226305"
    assert snap.status == "ok" and sum(not g.healthy for g in snap.gpus) == 1
    gpusim_node.set_lost(2, False)
    snap = wait_for(sup, lambda s: s.gpus[2].healthy)


def test_driver_not_loaded_is_error_with_backoff(gpusim_node: GpusimNode, supervisors) -> None:
    gpusim_node.update(lambda s: s.__setitem__("driver_loaded", False))
    sup = make(supervisors)
    snap = wait_for(sup, lambda s: s.status == "error")
    assert (snap.error or "").startswith("nvml Init err: Driver Not Loaded")
    gpusim_node.update(lambda s: s.__setitem__("driver_loaded", True))
    wait_for(sup, lambda s: s.status == "ok", timeout=20)


def test_stop_ends_the_worker(gpusim_node: GpusimNode) -> None:
    sup = NvmlSupervisor(call_timeout_s=2, refresh_interval_s=0.5)
    sup.start()
    wait_for(sup, lambda s: s.status == "ok")
    assert sup._worker is not None
    pid = sup._worker.pid
    assert pid is not None
    t0 = time.monotonic()
    sup.stop(timeout=5)
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.05)
    assert not alive(pid)
    # wait_for_change returns at once after stop
    t0 = time.monotonic()
    sup.wait_for_change(sup.snapshot().generation, 30)
    assert time.monotonic() - t0 < 5  # not the 30 s asked for (room for a shared machine)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        NvmlSupervisor(call_timeout_s=0)


def test_worker_does_not_outlive_a_crashed_agent(gpusim_node: GpusimNode) -> None:
    import subprocess
    import sys

    code = (
        "import os, time\n"
        "from hami_agent.nvml import NvmlSupervisor\n"
        "sup = NvmlSupervisor(call_timeout_s=5, refresh_interval_s=0.5)\n"
        "sup.start()\n"
        "snap = sup.wait_for_change(0, 20)\n"
        "print(snap.status, sup._worker.pid, flush=True)\n"
        "os._exit(0)\n"  # no cleanup at all, like a crash
    )
    proc = subprocess.run([sys.executable, "-c", code], env=gpusim_node.env(), capture_output=True,
                          text=True, timeout=40, check=False)
    status, pid = proc.stdout.split()
    assert status == "ok"
    deadline = time.monotonic() + 10
    while alive(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(int(pid))


def test_a_changed_kernel_module_ends_the_backoff(gpusim_node: GpusimNode, supervisors, tmp_path) -> None:
    """A driver fixed under a failing NVML is tried at once, not at the end of a backoff of up to 60 s
    (a remediation's gate waited for it)."""
    version = tmp_path / "version"
    version.write_text(BAD + "\n")
    gpusim_node.update(lambda s: s.__setitem__("driver_loaded", False))
    sup = make(supervisors, backoff_initial_s=30.0, backoff_max_s=60.0,
               driver=LoadedDriver(str(version), poll_s=0.05))
    wait_for(sup, lambda s: s.status == "error")
    gpusim_node.update(lambda s: s.__setitem__("driver_loaded", True))
    time.sleep(1.0)
    assert sup.snapshot().status == "error", "the module file did not change: the 30 s backoff holds"
    version.write_text(FIXED + "\n")
    wait_for(sup, lambda s: s.status == "ok", timeout=10)
