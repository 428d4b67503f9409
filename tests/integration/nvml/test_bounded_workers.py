"""Issue 17 finding 1: NVML workers that SIGKILL cannot end must not pile up.

Two models of a hang SIGKILL cannot end (docs/nvml.md, "The D-state model"):
- the kill seam (every machine): the reaper's ``terminate`` is a no-op, so the worker hung in gpusim's
  real C hang really stays alive, as a driver-stuck thread would;
- a real D state (root + /dev/fuse): gpusim's hung call reads a FUSE file that never answers; the real
  SIGKILL leaves the worker in state D with SIGKILL pending until the test answers the read.
Both assert that at most K abandoned workers (K + 1 processes) ever exist, that the agent says
``nvml-stuck-unkillable`` instead of spawning more, and that it resumes when a stuck worker exits.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.diagnose import diagnose_node
from hami_agent.nvml import (
    NvmlClient,
    NvmlStuckUnkillable,
    NvmlSupervisor,
    NvmlTimeout,
    Snapshot,
    WorkerReaper,
)
from hami_agent.nvml.reaper import read_proc_info
from tests.gpusim import dstate
from tests.gpusim.fixtures import GpusimNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

K = 2


def worker_pids() -> list[int]:
    """NVML worker processes of this test process that have not exited (zombies excluded)."""
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[1] == me and fields[0] != "Z" and b"hami_agent.nvml.worker" in cmd:
            out.append(int(entry))
    return out


class Sampler:
    """Counts worker processes every 20 ms in the background: the maximum ever seen."""

    def __init__(self) -> None:
        self.max = 0
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = worker_pids()
            self.max = max(self.max, len(pids))
            self.seen.update(pids)
            self._stop.wait(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_until(pred: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        time.sleep(0.05)


@pytest.fixture
def unkillable() -> Iterator[WorkerReaper]:
    """A reaper whose kill does nothing: the hung worker stays alive, as in a D-state hang. The test
    plays the driver: killing a stuck worker for real means "its call finally returned"."""
    reaper = WorkerReaper(limit=K, terminate=lambda w: None)
    yield reaper
    for a in reaper.abandoned():
        if a.worker is not None:
            a.worker.kill()


@pytest.fixture
def supervisors() -> Iterator[list[NvmlSupervisor]]:
    made: list[NvmlSupervisor] = []
    yield made
    for sup in made:
        sup.stop(timeout=5)


def supervise(made: list[NvmlSupervisor], reaper: WorkerReaper, registry=None) -> NvmlSupervisor:
    sup = NvmlSupervisor(call_timeout_s=0.4, refresh_interval_s=0.2, backoff_initial_s=0.05,
                         backoff_max_s=0.2, reaper=reaper, registry=registry, watch_events=False)
    made.append(sup)
    sup.start()
    return sup


def wait_snapshot(sup: NvmlSupervisor, pred: Callable[[Snapshot], bool], timeout: float = 30) -> Snapshot:
    def matching() -> Snapshot | None:
        snap = sup.snapshot()
        return snap if pred(snap) else None

    return wait_until(matching, timeout, "snapshot")


def in_d_state(pid: int):
    info = read_proc_info(pid)
    return info if info.state == "D" else None


def test_unkillable_hang_bounds_the_workers_and_resumes(gpusim_node: GpusimNode, unkillable, supervisors):
    registry = CollectorRegistry()
    sup = supervise(supervisors, unkillable, registry)
    ok = wait_snapshot(sup, lambda s: s.status == "ok")
    gpusim_node.set_fault(hang_functions=["nvmlDeviceGetMigMode"])  # every inventory hangs from now on
    with Sampler() as sampler:
        snap = wait_snapshot(sup, lambda s: "nvml-stuck-unkillable" in (s.error or ""))
        stuck = unkillable.pids()
        assert len(stuck) == K
        # the kill was attempted and the processes really live on (nothing ends them: the driver model)
        time.sleep(1.0)
        for pid in stuck:
            info = read_proc_info(pid)
            assert info.state not in (None, "Z", "X"), info
        assert all(not g.healthy and g.unhealthy_reason == "nvml-stuck-unkillable" for g in snap.gpus)
        assert [g.uuid for g in snap.gpus] == [g.uuid for g in ok.gpus]
        # what the device plugin advertises to the kubelet from this snapshot: every device Unhealthy,
        # with the reason
        plan = plan_resources(snap, PluginSettings(mig_strategy="mixed"))
        devices = [d for p in plan.values() for d in p.devices]
        assert devices and all(not d.healthy and "nvml-stuck-unkillable" in (d.reason or "") for d in devices)
        assert registry.get_sample_value("hami_nvml_stuck_unkillable") == 1
        assert registry.get_sample_value("hami_nvml_abandoned_workers") == K
        assert len(worker_pids()) == K  # no new worker while blocked
        # a long hang, compressed: the driver releases one stuck call at a time, the agent starts one
        # worker, it hangs again, ... many cycles; the count never exceeds K (+1 live)
        started = set(sampler.seen)
        for _ in range(5):
            oldest = unkillable.abandoned()[0].worker
            os.kill(oldest.pid, signal.SIGKILL)  # "the driver returns": the stuck process exits
            wait_until(lambda old=oldest.pid: old not in unkillable.pids() and len(unkillable.pids()) == K,
                       30, "a new worker started, hung and was abandoned")
        assert len(sampler.seen - started) >= 5  # it really cycled: new worker processes each time
        # the fault is fixed and every stuck call returns: the agent resumes by itself
        gpusim_node.clear_faults()
        for a in unkillable.abandoned():
            os.kill(a.pid, signal.SIGKILL)
        snap = wait_snapshot(sup, lambda s: s.status == "ok")
        assert all(g.healthy for g in snap.gpus)
        assert registry.get_sample_value("hami_nvml_stuck_unkillable") == 0
    assert sampler.max <= K + 1, f"{sampler.max} NVML worker processes alive at once"


def test_client_refuses_to_spawn_past_the_limit_then_resumes(gpusim_node: GpusimNode, unkillable):
    gpusim_node.set_fault(hang_functions=["nvmlDeviceGetUtilizationRates"])
    client = NvmlClient(call_timeout_s=0.5, reaper=unkillable, backoff_initial_s=0.01, backoff_max_s=0.01)
    try:
        with Sampler() as sampler:
            for _ in range(K):
                with pytest.raises(NvmlTimeout, match="nvmlDeviceGetUtilizationRates"):
                    client.usage(timeout_s=5)
                time.sleep(0.02)  # past the (tiny) backoff
            assert len(unkillable.pids()) == K
            for _ in range(5):  # every further sample is refused at once, nothing is spawned
                t0 = time.monotonic()
                with pytest.raises(NvmlStuckUnkillable, match="nvml-stuck-unkillable") as info:
                    client.usage(timeout_s=5)
                assert time.monotonic() - t0 < 3
                assert all(f"pid {p}" in str(info.value) for p in unkillable.pids())
                time.sleep(0.02)
            assert client.workers_started == K
            gpusim_node.clear_faults()
            os.kill(unkillable.pids()[0], signal.SIGKILL)  # one stuck call returns
            wait_until(lambda: len(unkillable.pids()) < K, 10, "the stuck worker exited")
            usage = client.usage(timeout_s=10)
            assert len(usage.gpus) == 8 and client.workers_started == K + 1
            for _ in range(3):
                client.usage(timeout_s=10)
            assert client.workers_started == K + 1  # one long-lived worker, reused
        assert sampler.max <= K + 1
    finally:
        client.close()


@pytest.fixture
def hanging_file(tmp_path) -> Iterator[dstate.HangingFile]:
    why = dstate.available()
    if why:
        pytest.skip(f"no real D state on this machine ({why}); the kill-seam tests cover the logic")
    with dstate.HangingFile(tmp_path / "fuse") as hf:
        yield hf


def test_real_d_state_hang_survives_sigkill_and_is_bounded(gpusim_node: GpusimNode, hanging_file,
                                                             supervisors, tmp_path):
    reaper = WorkerReaper(limit=K)  # the real kill: SIGKILL
    registry = CollectorRegistry()
    sup = supervise(supervisors, reaper, registry)
    wait_snapshot(sup, lambda s: s.status == "ok")
    gpusim_node.set_fault(hang_functions=["nvmlDeviceGetMigMode"], hang_file=str(hanging_file.path))
    with Sampler() as sampler:
        snap = wait_snapshot(sup, lambda s: "nvml-stuck-unkillable" in (s.error or ""))
        assert all(g.unhealthy_reason == "nvml-stuck-unkillable" for g in snap.gpus)
        stuck = reaper.pids()
        assert len(stuck) == K
        for pid in stuck:  # SIGKILLed, yet alive in uninterruptible sleep: the kernel will not let go
            info = wait_until(lambda p=pid: in_d_state(p), 10, f"pid {pid} in D state")
            assert info.sigkill_pending, info
        time.sleep(1.5)
        assert sorted(worker_pids()) == sorted(stuck)  # nothing new was started
        assert registry.get_sample_value("hami_nvml_stuck_unkillable") == 1
        # doctor on this node names them from /proc, and does not add a stuck probe of its own
        report = diagnose_node(Context(node_name="gpu-1", nvml=True, shrreg_root=str(tmp_path / "none")),
                               local=True)
        found = {v.code: v for v in report.verdicts}
        assert "NVML_WORKER_UNKILLABLE" in found, [v.code for v in report.verdicts]
        for pid in stuck:
            assert f"pid {pid} state D" in found["NVML_WORKER_UNKILLABLE"].summary
        assert "not probed" in " ".join(found["NVML_HANG"].evidence)
        assert sorted(worker_pids()) == sorted(stuck)
        gpusim_node.clear_faults()
        hanging_file.release()  # the driver returns: the killed processes can finally exit
        snap = wait_snapshot(sup, lambda s: s.status == "ok")
        assert all(g.healthy for g in snap.gpus)
        wait_until(lambda: not reaper.pids(), 10, "stuck workers reaped")
    assert sampler.max <= K + 1
