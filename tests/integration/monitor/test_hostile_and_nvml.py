"""The monitor against a hostile tenant's region files, and its NVML use: one long-lived worker, none at all
while the MIG apply lock file exists."""

import json
import os
import random
import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hami_agent.monitor.collector import RegionMonitor
from hami_agent.monitor.hostgpu import HostGpuSource
from hami_agent.nvml import NvmlClient, WorkerReaper
from tests.shrreg.helpers import MIB, Mk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GOOD = "7d0c0f3e-5555-4000-8000-000000000001"
BAD = "7d0c0f3e-5555-4000-8000-000000000002"
SPECIAL = "7d0c0f3e-5555-4000-8000-000000000003"


def monitor_once(root, *extra, timeout=120):
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "hami_agent", "monitor", "--once", "--dir", str(root), *extra],
                        capture_output=True, text=True, timeout=timeout, check=False)
    return cp, time.monotonic() - t0


def random_body_region(path):
    """A valid header (magic, version 1.2) and random bytes after it: what a tenant can write."""
    Mk(path, "v1.2").create()
    data = bytearray(path.read_bytes())
    rnd = random.Random(14)
    data[12:] = rnd.randbytes(len(data) - 12)
    path.write_bytes(bytes(data))


def test_corrupt_region_is_reported_and_does_not_delay_the_good_one(mkregion, tmp_path):
    """Issue 14 finding 5: one good + one random-body region took 62.8 s (54 s here) instead of 0.3 s."""
    root = tmp_path / "containers"
    good = Mk(root / f"{GOOD}_main" / "cudevshr.cache", "v1.2").create()
    good.slot(123, 456, 1, 512 * MIB)
    _, t_good = monitor_once(root, "--no-host-metrics", "--json")
    random_body_region(root / f"{BAD}_main" / "cudevshr.cache")
    cp, t_both = monitor_once(root, "--no-host-metrics", "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert [r["pod_uid"] for r in doc["regions"]] == [GOOD]
    bad = str(root / f"{BAD}_main" / "cudevshr.cache")
    assert doc["corrupt"] == [bad] and "region is corrupt" in doc["skipped"][bad]
    assert "skipping region" in cp.stderr and "(corrupt)" in cp.stderr  # logged (warning level)
    assert t_both < t_good + 5.0, (t_good, t_both)  # generous: the old code needed ~54 s more
    cp, _ = monitor_once(root, "--no-host-metrics")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(cp.stdout) for s in fam.samples}
    assert samples[("hami_shrreg_regions_skipped", (("reason", "corrupt"),))] == 1
    assert samples[("hami_shrreg_regions", ())] == 1


def test_fifo_and_symlink_regions_are_refused_at_once(mkregion, tmp_path):
    root = tmp_path / "containers"
    Mk(root / f"{GOOD}_main" / "cudevshr.cache", "v1.2").create()
    (root / f"{SPECIAL}_fifo").mkdir()
    os.mkfifo(root / f"{SPECIAL}_fifo" / "cudevshr.cache")  # open() would wait for a writer forever
    (root / f"{SPECIAL}_link").mkdir()
    os.symlink(root / f"{GOOD}_main" / "cudevshr.cache", root / f"{SPECIAL}_link" / "cudevshr.cache")
    cp, _ = monitor_once(root, "--no-host-metrics", "--json", timeout=60)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert [r["pod_uid"] for r in doc["regions"]] == [GOOD]  # the link does not duplicate GOOD's metrics
    assert sorted(os.path.basename(os.path.dirname(p)) for p in doc["refused"]) == [
        f"{SPECIAL}_fifo", f"{SPECIAL}_link"]


def _sampler(node, lock_path, reaper):
    client = NvmlClient(node.lib_path, call_timeout_s=5.0, reaper=reaper)
    return HostGpuSource(client, str(lock_path), timeout_s=5.0)


def test_monitor_honours_the_mig_apply_lock_and_reuses_one_worker(mkregion, tmp_path, gpusim_factory):
    node = gpusim_factory("a100-80gb-x8")
    lock = tmp_path / "hami-mig-apply.lock"
    root = tmp_path / "containers"
    root.mkdir()
    source = _sampler(node, lock, WorkerReaper(limit=2))
    mon = RegionMonitor(str(root), host_source=source)
    reg = CollectorRegistry()
    reg.register(mon)
    try:
        lock.write_text("")  # a MIG reconfiguration is running
        node.set_fault(init_hang=True)  # any NVML call now would hang: the monitor must not make one
        t0 = time.monotonic()
        mon.refresh()
        assert time.monotonic() - t0 < 3
        assert source.client.workers_started == 0 and source.client.worker_pid is None
        assert reg.get_sample_value("hami_monitor_nvml_paused") == 1
        assert reg.get_sample_value("hami_host_gpu_memory_used_bytes", {
            "node": "", "device_index": "0", "device_uuid": node.state()["gpus"][0]["uuid"],
            "device_type": "NVIDIA-" + node.state()["gpus"][0]["name"], "zone": "vGPU"}) is None

        node.clear_faults()
        lock.unlink()  # reconfiguration done
        for _ in range(4):
            mon.refresh()
        assert reg.get_sample_value("hami_monitor_nvml_paused") == 0
        assert source.client.workers_started == 1  # four samples, one worker process
        pid = source.client.worker_pid
        assert pid is not None and reg.get_sample_value("hami_host_gpu_memory_used_bytes", {
            "node": "", "device_index": "0", "device_uuid": node.state()["gpus"][0]["uuid"],
            "device_type": "NVIDIA-" + node.state()["gpus"][0]["name"], "zone": "vGPU"}) is not None

        lock.write_text("")  # the next reconfiguration: the worker is released (it exits)
        mon.refresh()
        assert source.client.worker_pid is None
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}")
    finally:
        source.close()


def test_monitor_cli_with_mig_lock_does_not_touch_a_hung_nvml(mkregion, tmp_path, gpusim_factory):
    node = gpusim_factory("a100-80gb-x8")
    node.set_fault(init_hang=True)
    lock = tmp_path / "mig.lock"
    lock.write_text("")
    root = tmp_path / "containers"
    Mk(root / f"{GOOD}_main" / "cudevshr.cache", "v1.2").create()
    cp, took = monitor_once(root, "--mig-apply-lock", lock, "--interval", "5")
    assert cp.returncode == 0, cp.stderr
    assert "MIG apply lock file detected" in cp.stderr
    assert "hami_monitor_nvml_paused 1.0" in cp.stdout and "HostGPUMemoryUsage{" not in cp.stdout
    assert took < 9  # no 10 s NVML deadline was waited for (the hung init was never called)
